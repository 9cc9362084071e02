"""Quorum leases over independent masters with one fencing token (design.md
S9): :class:`QuorumClient` (threads) and :class:`AsyncQuorumClient`
(asyncio), the same algorithm as the Rust helper's.

N masters that do not replicate to each other, ``q = N // 2 + 1``. An
acquisition sends ``LEASE.ACQUIRE ... FLOOR P`` to every master at once
(step 1, ``P`` a proposed token): the lease is held with ``P`` when ``q``
answer exactly ``P`` while its validity (ttl minus the drift, counted from
the first send) lasts, in one round trip. Otherwise, when at least ``q``
granted, it commits the highest token ``T`` back to them with
``LEASE.ACQUIRE ... FLOOR T`` (step 3): held when ``q`` answer exactly
``T``. Each master's token clock then works as a ballot, so tokens of
successive holdings strictly increase although the masters' clocks differ.
Every step is decided as soon as a majority decides it, not by the slowest
master. Renewals go to every master; the lease stays held while a majority
renews. Each master must run its grace period after a restart
(``lease.grace-ms``, design.md S7).

::

    client = QuorumClient([redis.Redis(port=p) for p in (7001, 7002, 7003)])
    with client.lease("job", 10000, block_ms=2000) as lease:
        lease.fence("SET", "out", "v")       # on every master that committed it
        store.write(data, token=lease.token)  # any store that keeps the highest token
"""

from __future__ import annotations

import asyncio
import logging
import random
import select
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import redis
import redis.asyncio as aredis

from . import _sync, aio
from ._compat import read_response
from ._common import (
    DEFAULT_LABEL,
    EXACT,
    NOT_IN,
    Commit,
    Failed,
    Held,
    Label,
    LeaseBusy,
    LeaseLost,
    Loss,
    Outlier,
    Proposer,
    check_ttl,
    fast_outliers,
    fence_args,
    fenced_reply,
    first_outcome,
    floor_refused,
    fresh_after_fork,
    label_args,
    label_bytes,
    linger,
    lost_during,
    new_owner,
    release_outcome,
    renew_every,
    retry_pause,
)

__all__ = ["QuorumClient", "QuorumLease", "AsyncQuorumClient", "AsyncQuorumLease", "Outlier", "drift"]

#: Where the outliers are reported (a warning each): ``redis_lease.quorum``.
log = logging.getLogger(__name__)


def drift(ttl_ms: int) -> float:
    """The clock drift allowed for a ttl, seconds: 1% of it plus 2 ms."""
    return ttl_ms / 100000 + 0.002


def _quorum(n: int) -> int:
    return n // 2 + 1


def _node_timeout(io_timeout: float, ttl_ms: int) -> float:
    """How long one master may take to answer one step."""
    return min(io_timeout, ttl_ms / 3000)


def _backoff(ttl_ms: int) -> float:
    """A random pause before another try: up to a tenth of the ttl (1 to 50
    ms), so that contenders fall out of step."""
    return max(random.random() * min(max(ttl_ms / 10000, 0.001), 0.05), 0.0002)


def _acquire_args(key: Any, owner: str, ttl_ms: int, floor: Optional[int], label: Tuple[Any, ...] = ()) -> Tuple[Any, ...]:
    args: Tuple[Any, ...] = ("LEASE.ACQUIRE", key, owner, ttl_ms) + label
    return args if floor is None else args + ("FLOOR", floor)


def _floor_args(key: Any, owner: str, ttl_ms: int, floor: int, label: Tuple[Any, ...] = ()) -> Callable[[int], Tuple[Any, ...]]:
    """The step-3 commit of ``floor``, the same on every master (with the
    label of step 1: a retry with ``LABEL`` keeps it)."""
    args = _acquire_args(key, owner, ttl_ms, floor, label)
    return lambda _: args


def _wall_ms(offset_ms: int) -> int:
    """This machine's wall clock, ms, moved by ``offset_ms`` (0 but in the
    tests that play a client whose clock is wrong)."""
    return time.time_ns() // 1_000_000 + offset_ms


def _timed_out(replies: List[Any]) -> List[Any]:
    """A step's replies once it is over: a master not in counts as timed out."""
    return [redis.TimeoutError("no reply within the step") if r is NOT_IN else r for r in replies]


def _readable(fds: List[int], timeout: float) -> List[int]:
    """Those of ``fds`` with something to read within ``timeout`` seconds
    (``poll``: no limit on the descriptors' numbers, as ``select`` has)."""
    if not hasattr(select, "poll"):
        return list(select.select(fds, [], [], timeout)[0])
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    return [fd for fd, _ in poller.poll(max(int(timeout * 1000), 1))]


def _round_decided(commit: Commit) -> Callable[[List[Any]], bool]:
    """Is a commit round decided by the replies in so far?"""
    return lambda replies: commit.decide(replies, str) is not None


class _Steps:
    """What a sync and an asyncio quorum client share to take a lease: the
    proposals, and how step 1 decides (``EXACT`` but in the tests that show
    why)."""

    quorum: int
    _addrs: List[str]
    _proposer: Proposer
    _proposer_lock: threading.Lock
    _rule: str
    _clock_offset_ms: int
    on_outlier: Optional[Callable[[Outlier], None]]

    def _init_steps(self) -> None:
        self._proposer = Proposer()
        self._proposer_lock = threading.Lock()
        self._rule = EXACT
        self._clock_offset_ms = 0

    def _propose(self) -> Tuple[int, int]:
        """(sent_ms, P): this client's wall clock now and its proposal."""
        sent_ms = _wall_ms(self._clock_offset_ms)
        with self._proposer_lock:
            return sent_ms, self._proposer.propose(sent_ms, random.getrandbits(16))

    def _first_decided(self, p: int, on: List[int]) -> Callable[[List[Any]], bool]:
        return lambda replies: first_outcome(self._rule, p, on, replies, self.quorum) is not None

    def _first(self, sent_ms: int, p: int, on: List[int], replies: List[Any]) -> Any:
        """What step 1 decided, once it is over (learning from it)."""
        with self._proposer_lock:
            self._proposer.learn(sent_ms, p, replies)
        replies = _timed_out(replies)
        first = first_outcome(self._rule, p, on, replies, self.quorum)
        if isinstance(first, Held):
            _report(fast_outliers(p, on, replies, self._addrs.__getitem__), self.on_outlier)
        return first

    def _round(self, commit: Commit, replies: List[Any]) -> Any:
        """What a commit round decided, once it is over: the masters that
        committed, or the next round (the outliers reported), or None."""
        decided = commit.decide(_timed_out(replies), self._addrs.__getitem__)
        if isinstance(decided, tuple):
            _report(decided[1], self.on_outlier)
            return decided[0]
        return None if decided is None or isinstance(decided, Failed) else decided


def _renew_decided(replies: Sequence[Any], n: int) -> bool:
    """Is a renewal decided by the replies in so far (None: not yet in)? A
    majority renewed, or too many refused: no need to wait for the rest."""
    return _renew_outcome(replies, n) is not None


def _renew_outcome(replies: Sequence[Any], n: int) -> Optional[bool]:
    """True: a majority renewed. False: too many refused (the loss). None:
    not enough answers, try again soon."""
    if sum(1 for r in replies if r == 1) >= _quorum(n):
        return True
    if sum(1 for r in replies if isinstance(r, int) and r == 0) > n - _quorum(n):
        return False
    return None


def _addr(client: Any) -> str:
    """A master's address: ``host:port``, or a Unix socket's path."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _report(outliers: List[Outlier], on_outlier: Optional[Callable[[Outlier], None]]) -> None:
    """Each master left out of a commit: a warning on :data:`log`, and
    ``on_outlier`` when given."""
    for o in outliers:
        log.warning(
            "quorum master %d (%s) left out: its token is %d ms of clock ahead of what the others accept; its clock is wrong",
            o.master, o.addr, o.ahead_ms,
        )
        if on_outlier is not None:
            on_outlier(o)


class QuorumClient(_Steps):
    """Takes quorum leases on the masters of ``clients`` (redis.Redis, one per
    master; three or five in practice).

    - ``io_timeout``: how long one master may take to answer one step (at
      most a third of the ttl). Default 5.
    - ``watchdog``: renew in the background. Default True.
    - ``on_outlier``: called with an :class:`Outlier` for each master that an
      acquisition leaves out because the others refused its token as too far
      ahead of their clocks (each is also a warning on the
      ``redis_lease.quorum`` logger). Runs on the acquiring thread.
    - ``label``: the label of its acquires on every master (``LABEL``), as
      :class:`redis_lease.LeaseClient`'s: by default ``<host> pid <pid>
      <program>``; None for none. ``acquire``/``lease`` take ``label=`` too.
    """

    def __init__(
        self,
        clients: Sequence[redis.Redis],
        *,
        io_timeout: float = 5.0,
        watchdog: bool = True,
        on_outlier: Optional[Callable[[Outlier], None]] = None,
        label: Label = DEFAULT_LABEL,
    ) -> None:
        self._pools = [_sync._Pool(_sync._Target(c, io_timeout)) for c in clients]
        self._addrs = [_addr(c) for c in clients]
        self._executor = self._new_executor()
        self._late: Dict[int, List[Any]] = {}
        self._late_lock = threading.Lock()
        self.io_timeout = io_timeout
        self.watchdog = watchdog
        self.on_outlier = on_outlier
        label_bytes(label)  # TypeError now, not at the first acquire
        self.label: Label = label
        self.quorum = _quorum(len(self._pools))
        self._init_steps()
        fresh_after_fork(self)

    def _new_executor(self) -> ThreadPoolExecutor:
        # Room for a step's connects while a renewal's slow calls finish.
        return ThreadPoolExecutor(max_workers=2 * len(self._pools), thread_name_prefix="quorum")

    def _after_fork(self) -> None:
        """In a forked child (the pools reset themselves): an executor of
        its own, since the parent's threads do not exist here (the parent's
        executor would count them as idle and run nothing). A lease copied
        from the parent is the parent's: its watchdog thread is not here."""
        self._executor = self._new_executor()
        self._late = {}
        self._late_lock = threading.Lock()

    def _each(self, on: Sequence[int], args: Callable[[int], Tuple[Any, ...]], timeout: float) -> List[Any]:
        """``args(i)`` on every master ``i`` of ``on`` at once: each reply, or
        the exception it raised (a timeout for a master not in in time)."""
        return _timed_out(self._each_until(on, args, timeout, lambda _: False))

    def _each_until(
        self,
        on: Sequence[int],
        args: Callable[[int], Tuple[Any, ...]],
        timeout: float,
        decided: Callable[[List[Any]], bool],
        retry: Optional[Callable[[int], Tuple[Any, ...]]] = None,
    ) -> List[Any]:
        """``args(i)`` on every master ``i`` of ``on`` at once, each reply
        read as it comes (``retry(i)``, when given, sent at once to a master
        that refused the first as a FLOOR too far ahead of its clock): the
        replies in (``NOT_IN``: not in), once every master answered, or
        ``timeout`` passed, or ``decided`` says so of the replies in and the
        linger after it passed. The replies still out are read on the
        executor (their connections go back to the pool)."""

        # Sent on the idle connections first, on this thread; the masters
        # with none connect all at once on the executor, so that masters
        # which accept no connection cost one timeout in all, not one each;
        # then the replies are read on this thread as they come.
        start = time.monotonic()
        end = start + timeout

        def send(i: int, node: Any, conn: Optional[_sync.Conn]) -> Tuple[int, Any, Any]:
            try:
                if conn is None:
                    conn = self._pools[i].connect(None, timeout)
                conn.send_command(*args(i))
                return i, node, conn
            except Exception as e:
                if conn is not None:
                    _sync._close(conn)
                return i, None, e

        # A master with calls that outlived their step (decided without
        # them) gets this one on the executor after them: a release never
        # overtakes the acquire it releases.
        connecting: Dict[int, Any] = {}
        calling: Dict[int, Any] = {}
        for n, i in enumerate(on):
            before = self._late_calls(i)
            if before:
                calling[n] = self._executor.submit(self._call_after, before, i, args(i), retry(i) if retry else None, end)
                continue
            node, conn = self._pools[i].idle(None)
            connecting[n] = send(i, node, conn) if conn is not None else self._executor.submit(send, i, node, None)
        replies: List[Any] = [NOT_IN] * len(on)
        pending: Dict[int, Tuple[int, Any, Any]] = {}
        deadline = end
        settled = False
        while pending or connecting or calling:
            for n, f in list(calling.items()):
                if f.done():
                    replies[n] = f.result()
                    del calling[n]
            # The masters sent to (a connect on the executor done) are read
            # from as their replies come.
            for n, p in list(connecting.items()):
                if isinstance(p, Future) and not p.done():
                    continue
                del connecting[n]
                i, node, conn = p.result() if isinstance(p, Future) else p
                if isinstance(conn, BaseException):
                    replies[n] = conn
                else:
                    pending[n] = (i, node, conn)
            if not settled and decided(replies):
                settled = True
                deadline = min(deadline, time.monotonic() + linger(time.monotonic() - start))
            left = deadline - time.monotonic()
            if left <= 0 or not (pending or connecting or calling):
                break
            socks = {conn._sock.fileno(): n for n, (_, _, conn) in pending.items()}
            # While a master connects, look at it again every 2 ms.
            for fd in _readable(list(socks), min(left, 0.002) if connecting or calling else left):
                n = socks[fd]
                i, node, conn = pending.pop(n)
                reply = self._read(i, node, conn, end)
                if retry is not None and floor_refused(reply):
                    try:
                        reply = self._pools[i].call(None, retry(i), max(end - time.monotonic(), 0.001), timeout)
                    except Exception as e:
                        reply = e
                replies[n] = reply
        # The calls still out finish on the executor (their connections go
        # back to the pool); the next call to their master waits for them.
        late: List[Tuple[int, Any]] = [(on[n], f) for n, f in calling.items()]
        for i, node, conn in pending.values():
            try:
                late.append((i, self._executor.submit(self._read, i, node, conn, end)))
            except RuntimeError:  # closed
                _sync._close(conn)
        for n, p in connecting.items():
            late.append((on[n], self._executor.submit(self._read_sent, p, end)))
        with self._late_lock:
            for i, f in late:
                self._late.setdefault(i, []).append(f)
        return replies

    def _late_calls(self, i: int) -> List[Any]:
        """The calls to master ``i`` that outlived their step and are not
        over yet."""
        with self._late_lock:
            calls = [f for f in self._late.pop(i, []) if not f.done()]
        return calls

    def _call_after(self, before: List[Any], i: int, args: Tuple[Any, ...], retry: Optional[Tuple[Any, ...]], end: float) -> Any:
        """On the executor: ``args`` on master ``i`` once the calls
        ``before`` are over (each bounded by its own step), by ``end``."""
        wait(before, timeout=max(end - time.monotonic(), 0))
        for command in (args, retry):
            if command is None:
                break
            left = max(end - time.monotonic(), 0.001)
            try:
                reply = self._pools[i].call(None, command, left, left)
            except Exception as e:
                reply = e
            if not floor_refused(reply):
                break
        return reply

    def _read_sent(self, sent: "Future[Tuple[int, Any, Any]]", end: float) -> Any:
        """On the executor: the reply of a call whose connect ended after
        its step was over."""
        i, node, conn = sent.result()
        return conn if isinstance(conn, BaseException) else self._read(i, node, conn, end)

    def _read(self, i: int, node: Any, conn: Any, end: float) -> Any:
        """The reply on ``conn`` (master ``i``) by ``end``, or the exception;
        the connection goes back to the pool unless the reply was lost."""
        try:
            reply = read_response(conn, max(end - time.monotonic(), 0.001))
        except redis.ResponseError as e:
            self._pools[i].give(node, conn)
            return e
        except Exception as e:
            _sync._close(conn)
            return e
        self._pools[i].give(node, conn)
        return reply

    def _all(self) -> List[int]:
        return list(range(len(self._pools)))

    def _release_everywhere(self, key: Any, owner: str, timeout: float) -> int:
        """``LEASE.RELEASE`` everywhere, done once a majority decided it:
        how many released, of those in."""
        n = len(self._pools)
        replies = self._each_until(
            self._all(), lambda _: ("LEASE.RELEASE", key, owner), timeout, lambda r: release_outcome(r, n) is not None
        )
        return sum(1 for r in replies if r == 1)

    def acquire(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> Optional["QuorumLease"]:
        """Takes the lease on ``key`` on a majority, with one token. None when
        no majority came within ``block_ms`` (None: one try; 0: until it
        does), trying again after a random back-off. One owner for every
        try: an ambiguous outcome (a timeout) is safe to retry."""
        check_ttl(ttl_ms, block_ms)
        labelled = label_args(label_bytes(self.label if label is DEFAULT_LABEL else label))
        owner = new_owner()
        until = None if block_ms == 0 else time.monotonic() + (block_ms or 0) / 1000
        while True:
            lease = self._attempt(key, owner, ttl_ms, labelled)
            if lease is not None:
                return lease
            self._release_everywhere(key, owner, _node_timeout(self.io_timeout, ttl_ms))
            pause = _backoff(ttl_ms)
            if until is not None and time.monotonic() + pause >= until:
                return None
            time.sleep(pause)

    def _attempt(self, key: Any, owner: str, ttl_ms: int, label: Tuple[Any, ...]) -> Optional["QuorumLease"]:
        timeout = _node_timeout(self.io_timeout, ttl_ms)
        t0 = time.monotonic()
        valid_until = t0 + ttl_ms / 1000 - drift(ttl_ms)
        everywhere = self._all()
        sent_ms, p = self._propose()
        replies = self._each_until(
            everywhere,
            lambda _: _acquire_args(key, owner, ttl_ms, p, label),
            timeout,
            self._first_decided(p, everywhere),
            retry=lambda _: _acquire_args(key, owner, ttl_ms, None, label),
        )
        first = self._first(sent_ms, p, everywhere, replies)
        if isinstance(first, Held):
            token, committed = first
        elif isinstance(first, Commit):
            commit = first
            # At most one round per master: each leaves one out.
            while True:
                token = commit.token
                args = _floor_args(key, owner, ttl_ms, token, label)
                settled = self._round(commit, self._each_until(commit.on, args, timeout, _round_decided(commit)))
                if not isinstance(settled, Commit):
                    break
                commit = settled
            if settled is None:
                return None
            committed = settled
        else:
            return None
        if time.monotonic() >= valid_until:
            return None
        return QuorumLease(self, key, owner, token, ttl_ms, valid_until, committed)

    def lease(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> "QuorumLease":
        """For ``with``: acquires now (:class:`LeaseBusy` when no majority
        came); the block releases it on exit and raises :class:`LeaseLost`
        when it ended normally after the lease was lost."""
        lease = self.acquire(key, ttl_ms, block_ms, label=label)
        if lease is None:
            raise LeaseBusy(f"{key!r}: no majority of the masters granted the lease")
        return lease

    def close(self) -> None:
        self._executor.shutdown(wait=False)
        for pool in self._pools:
            pool.close()


class _QuorumCore:
    """What a sync and an asyncio quorum lease share (their I/O aside)."""

    def __init__(self, client: Any, key: Any, owner: str, token: int, ttl_ms: int, committed: List[int], lost: Any) -> None:
        self.key = key
        self.token = token
        self.ttl_ms = ttl_ms
        self.committed = committed
        self.lost = lost
        self._client = client
        self._owner = owner
        self._released = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} key={self.key!r} token={self.token} lost={self.lost.reason}>"

    def _renewal(self) -> Tuple[Tuple[Any, ...], float, int]:
        """A renewal round now: its command, its per-master timeout, and how
        many masters there are."""
        c = self._client
        return ("LEASE.RENEW", self.key, self._owner, self.ttl_ms), _node_timeout(c.io_timeout, self.ttl_ms), len(c._pools)

    def _settle(self, replies: Sequence[Any], sent: float) -> Optional[bool]:
        """What a round sent at ``sent`` did: True renewed (the validity moves
        to ``ttl - drift`` from ``sent``), False the loss, None undecided."""
        outcome = _renew_outcome(replies, len(self._client._pools))
        if outcome is True:
            return bool(self.lost._extend(sent, self.ttl_ms - drift(self.ttl_ms) * 1000))
        if outcome is False:
            self.lost._lose(Loss.REFUSED)
        return outcome

    def _first_wait(self) -> float:
        """Until a third of the ttl after the acquisition's first send (its
        validity counts from there)."""
        t0: float = self.lost.deadline - self.ttl_ms / 1000 + drift(self.ttl_ms)
        return max(t0 + renew_every(self.ttl_ms) - time.monotonic(), 0.001)

    def _next_wait(self, outcome: Optional[bool]) -> float:
        return renew_every(self.ttl_ms) if outcome else retry_pause(self.ttl_ms)

    def _fence_args(self, command: Tuple[Any, ...], min_ttl_ms: Optional[int] = None) -> Tuple[Any, ...]:
        return fence_args(self.key, self.token, command, min_ttl_ms)

    def _start_release(self) -> bool:
        """False when released already; else marks it released (the signal
        reads released unless lost before)."""
        if self._released:
            return False
        self._released = True
        self.lost._lose(Loss.RELEASED)
        return True


class QuorumLease(_QuorumCore):
    """A quorum lease: one ``token`` committed on a majority (``committed``:
    the masters' indexes); ``lost`` its loss signal; a context manager."""

    def __init__(
        self, client: QuorumClient, key: Any, owner: str, token: int, ttl_ms: int, valid_until: float, committed: List[int]
    ) -> None:
        super().__init__(client, key, owner, token, ttl_ms, committed, _sync.LossSignal(valid_until))
        if client.watchdog:
            threading.Thread(target=self._watchdog, name="quorum-watchdog", daemon=True).start()

    def renew(self) -> bool:
        """Renews on every master now: True when a majority renewed."""
        return self._renew_round() is True

    def _renew_round(self) -> Optional[bool]:
        args, timeout, n = self._renewal()
        sent = time.monotonic()
        return self._settle(self._client._each_until(self._client._all(), lambda _: args, timeout, lambda r: _renew_decided(r, n)), sent)

    def _watchdog(self) -> None:
        wait = self._first_wait()
        while not self.lost.wait(wait):
            outcome = self._renew_round()
            if outcome is False:
                return
            wait = self._next_wait(outcome)

    def fence(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:
        """``LEASE.FENCE key token [MINTTL ms] command...`` on every master
        that committed the token: the first reply of a master that ran it,
        or :class:`StaleToken` when the token was current on fewer than a
        majority; a command that failed where it ran raises the server's
        error for it (docs/helpers.md). With ``min_ttl_ms``, a master where
        the lease has less left runs nothing, and :class:`LeaseExpiring` is
        raised when the token was current on a majority but too few of them
        had the time."""
        c = self._client
        args = self._fence_args(command, min_ttl_ms)
        return fenced_reply(c._each(self.committed, lambda _: args, c.io_timeout), c.quorum)

    def release(self) -> bool:
        """Gives the lease back on every master: True when a majority
        released it."""
        if not self._start_release():
            return False
        c = self._client
        released: int = c._release_everywhere(self.key, self._owner, _node_timeout(c.io_timeout, self.ttl_ms))
        quorum: int = c.quorum
        return released >= quorum

    def __enter__(self) -> "QuorumLease":
        return self

    def __exit__(self, t: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        lost = lost_during(self.lost.reason)
        self.release()
        if exc is None and lost is not None:
            raise LeaseLost(lost)


class AsyncQuorumClient(_Steps):
    """:class:`QuorumClient` for asyncio, on ``redis.asyncio.Redis`` clients."""

    def __init__(
        self,
        clients: Sequence[aredis.Redis],
        *,
        io_timeout: float = 5.0,
        watchdog: bool = True,
        on_outlier: Optional[Callable[[Outlier], None]] = None,
        label: Label = DEFAULT_LABEL,
    ) -> None:
        self._pools = [aio._Pool(aio._Target(c, io_timeout)) for c in clients]
        self._addrs = [_addr(c) for c in clients]
        self._stragglers: "set[asyncio.Task[Any]]" = set()
        self._late: "Dict[int, set[asyncio.Task[Any]]]" = {}
        self.io_timeout = io_timeout
        self.watchdog = watchdog
        self.on_outlier = on_outlier
        label_bytes(label)  # TypeError now, not at the first acquire
        self.label: Label = label
        self.quorum = _quorum(len(self._pools))
        self._init_steps()
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (the pools reset themselves): none of the
        parent's tasks, which stay referenced, as its connections do."""
        aio._inherited.extend(self._stragglers)
        self._stragglers = set()
        self._late = {}

    async def _each(self, on: Sequence[int], args: Callable[[int], Tuple[Any, ...]], timeout: float) -> List[Any]:
        return _timed_out(await self._each_until(on, args, timeout, lambda _: False))

    async def _each_until(
        self,
        on: Sequence[int],
        args: Callable[[int], Tuple[Any, ...]],
        timeout: float,
        decided: Callable[[List[Any]], bool],
        retry: Optional[Callable[[int], Tuple[Any, ...]]] = None,
    ) -> List[Any]:
        """As the sync client's, a task per master: returns once every
        master answered, or ``timeout`` passed, or ``decided`` says so and
        the linger after it passed (``NOT_IN``: not in). The calls still out
        finish on their own (bounded by ``timeout``): a release reaches
        every master that answers, not only the first majority."""
        start = time.monotonic()

        async def one(n: int, i: int) -> Tuple[int, Any]:
            # After the calls to this master that outlived their step: a
            # release never overtakes the acquire it releases.
            loop = asyncio.get_running_loop()
            before = {t for t in self._late.pop(i, set()) if not t.done() and t.get_loop() is loop}
            if before:
                await asyncio.wait(before)
            try:
                reply = await self._pools[i].call(None, args(i), timeout, timeout)
            except Exception as e:
                reply = e
            if retry is not None and floor_refused(reply):
                left = max(start + timeout - time.monotonic(), 0.001)
                try:
                    reply = await self._pools[i].call(None, retry(i), left, left)
                except Exception as e:
                    reply = e
            return n, reply

        master = {asyncio.ensure_future(one(n, i)): i for n, i in enumerate(on)}
        tasks = set(master)
        replies: List[Any] = [NOT_IN] * len(on)
        deadline = start + timeout + 0.005
        settled = False
        while tasks:
            if not settled and decided(replies):
                settled = True
                deadline = min(deadline, time.monotonic() + linger(time.monotonic() - start))
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done, tasks = await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            for t in done:
                n, reply = t.result()
                replies[n] = reply
        # Kept until they end, so that they are not collected half-way.
        self._stragglers |= tasks
        for t in tasks:
            t.add_done_callback(self._stragglers.discard)
            self._late.setdefault(master[t], set()).add(t)
        return replies

    def _all(self) -> List[int]:
        return list(range(len(self._pools)))

    async def _release_everywhere(self, key: Any, owner: str, timeout: float) -> int:
        n = len(self._pools)
        replies = await self._each_until(
            self._all(), lambda _: ("LEASE.RELEASE", key, owner), timeout, lambda r: release_outcome(r, n) is not None
        )
        return sum(1 for r in replies if r == 1)

    async def acquire(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> Optional["AsyncQuorumLease"]:
        """As :meth:`QuorumClient.acquire`."""
        check_ttl(ttl_ms, block_ms)
        labelled = label_args(label_bytes(self.label if label is DEFAULT_LABEL else label))
        owner = new_owner()
        until = None if block_ms == 0 else time.monotonic() + (block_ms or 0) / 1000
        while True:
            lease = await self._attempt(key, owner, ttl_ms, labelled)
            if lease is not None:
                return lease
            await self._release_everywhere(key, owner, _node_timeout(self.io_timeout, ttl_ms))
            pause = _backoff(ttl_ms)
            if until is not None and time.monotonic() + pause >= until:
                return None
            await asyncio.sleep(pause)

    async def _attempt(self, key: Any, owner: str, ttl_ms: int, label: Tuple[Any, ...]) -> Optional["AsyncQuorumLease"]:
        timeout = _node_timeout(self.io_timeout, ttl_ms)
        t0 = time.monotonic()
        valid_until = t0 + ttl_ms / 1000 - drift(ttl_ms)
        everywhere = self._all()
        sent_ms, p = self._propose()
        replies = await self._each_until(
            everywhere,
            lambda _: _acquire_args(key, owner, ttl_ms, p, label),
            timeout,
            self._first_decided(p, everywhere),
            retry=lambda _: _acquire_args(key, owner, ttl_ms, None, label),
        )
        first = self._first(sent_ms, p, everywhere, replies)
        if isinstance(first, Held):
            token, committed = first
        elif isinstance(first, Commit):
            commit = first
            # At most one round per master: each leaves one out.
            while True:
                token = commit.token
                args = _floor_args(key, owner, ttl_ms, token, label)
                replies = await self._each_until(commit.on, args, timeout, _round_decided(commit))
                settled = self._round(commit, replies)
                if not isinstance(settled, Commit):
                    break
                commit = settled
            if settled is None:
                return None
            committed = settled
        else:
            return None
        if time.monotonic() >= valid_until:
            return None
        return AsyncQuorumLease(self, key, owner, token, ttl_ms, valid_until, committed)

    def lease(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> "_AsyncQuorumContext":
        """``async with client.lease(...) as lease:`` as the sync one."""
        return _AsyncQuorumContext(self, key, ttl_ms, block_ms, label)

    async def close(self) -> None:
        for pool in self._pools:
            await pool.close()


class AsyncQuorumLease(_QuorumCore):
    """:class:`QuorumLease` for asyncio (awaitable ``fence``, ``renew``,
    ``release``; ``lost`` an :class:`redis_lease.aio.AsyncLossSignal`)."""

    def __init__(
        self, client: AsyncQuorumClient, key: Any, owner: str, token: int, ttl_ms: int, valid_until: float, committed: List[int]
    ) -> None:
        super().__init__(client, key, owner, token, ttl_ms, committed, aio.AsyncLossSignal(valid_until))
        self._task: Optional["asyncio.Task[None]"] = None
        if client.watchdog:
            self._task = asyncio.ensure_future(self._watchdog())

    async def renew(self) -> bool:
        return await self._renew_round() is True

    async def _renew_round(self) -> Optional[bool]:
        args, timeout, n = self._renewal()
        sent = time.monotonic()
        c = self._client
        return self._settle(await c._each_until(c._all(), lambda _: args, timeout, lambda r: _renew_decided(r, n)), sent)

    async def _watchdog(self) -> None:
        wait = self._first_wait()
        while True:
            try:
                await asyncio.wait_for(self.lost.wait(), wait)
                return
            except asyncio.TimeoutError:
                pass
            outcome = await self._renew_round()
            if outcome is False:
                return
            wait = self._next_wait(outcome)

    async def fence(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:
        c = self._client
        args = self._fence_args(command, min_ttl_ms)
        return fenced_reply(await c._each(self.committed, lambda _: args, c.io_timeout), c.quorum)

    async def release(self) -> bool:
        if not self._start_release():
            return False
        if self._task is not None:
            self._task.cancel()
        c = self._client
        released: int = await c._release_everywhere(self.key, self._owner, _node_timeout(c.io_timeout, self.ttl_ms))
        quorum: int = c.quorum
        return released >= quorum


class _AsyncQuorumContext:
    def __init__(self, client: AsyncQuorumClient, key: Any, ttl_ms: int, block_ms: Optional[int], label: Label) -> None:
        self._args = (client, key, ttl_ms, block_ms, label)
        self._lease: Optional[AsyncQuorumLease] = None

    async def __aenter__(self) -> AsyncQuorumLease:
        client, key, ttl_ms, block_ms, label = self._args
        lease = await client.acquire(key, ttl_ms, block_ms, label=label)
        if lease is None:
            raise LeaseBusy(f"{key!r}: no majority of the masters granted the lease")
        self._lease = lease
        return lease

    async def __aexit__(self, t: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        assert self._lease is not None
        lost = lost_during(self._lease.lost.reason)
        await self._lease.release()
        if exc is None and lost is not None:
            raise LeaseLost(lost)
