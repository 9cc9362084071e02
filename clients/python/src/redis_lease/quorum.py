"""Quorum leases over independent masters with one fencing token (design.md
S9): :class:`QuorumClient` (threads) and :class:`AsyncQuorumClient`
(asyncio), the same algorithm as the Rust helper's.

N masters that do not replicate to each other, ``q = N // 2 + 1``. An
acquisition sends ``LEASE.ACQUIRE`` to every master at once (step 1) and,
when at least ``q`` granted, commits the highest token ``T`` back to them
with ``LEASE.ACQUIRE ... FLOOR T`` (step 3): the lease is held when ``q``
answer exactly ``T`` while its validity (ttl minus the drift, counted from
the first send) lasts. Each master's token clock then works as a ballot, so
tokens of successive holdings strictly increase although the masters'
clocks differ. Renewals go to every master; the lease stays held while a
majority renews. Each master must run its grace period after a restart
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
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type

import redis
import redis.asyncio as aredis

from . import _sync, aio
from ._compat import read_response
from ._common import (
    DEFAULT_LABEL,
    Commit,
    Label,
    LeaseBusy,
    LeaseLost,
    Loss,
    Outlier,
    check_ttl,
    fence_args,
    fenced_reply,
    fresh_after_fork,
    label_args,
    label_bytes,
    lost_during,
    new_owner,
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


def _granted(replies: Sequence[Any]) -> List[Tuple[int, int]]:
    """(master, token) of every master that granted."""
    return [(i, int(r)) for i, r in enumerate(replies) if isinstance(r, int) and not isinstance(r, bool)]


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


class QuorumClient:
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
        self.io_timeout = io_timeout
        self.watchdog = watchdog
        self.on_outlier = on_outlier
        label_bytes(label)  # TypeError now, not at the first acquire
        self.label: Label = label
        self.quorum = _quorum(len(self._pools))
        self._commit = True
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

    def _each(self, on: Sequence[int], args: Callable[[int], Tuple[Any, ...]], timeout: float) -> List[Any]:
        """``args(i)`` on every master ``i`` of ``on`` at once: each reply, or
        the exception it raised."""

        # Sent on the idle connections first, on this thread; the masters
        # with none connect all at once on the executor, so that masters
        # which accept no connection cost one timeout in all, not one each;
        # then every reply is read on this thread.
        end = time.monotonic() + timeout

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

        pending: List[Any] = []
        for i in on:
            node, conn = self._pools[i].idle(None)
            pending.append(send(i, node, conn) if conn is not None else self._executor.submit(send, i, node, None))
        sent = [p.result() if isinstance(p, Future) else p for p in pending]
        replies: List[Any] = []
        for i, node, conn in sent:
            if isinstance(conn, BaseException):
                replies.append(conn)
                continue
            try:
                reply = read_response(conn, max(end - time.monotonic(), 0.001))
            except redis.ResponseError as e:
                self._pools[i].give(node, conn)
                replies.append(e)
                continue
            except Exception as e:
                _sync._close(conn)
                replies.append(e)
                continue
            self._pools[i].give(node, conn)
            replies.append(reply)
        return replies

    def _each_until(
        self,
        on: Sequence[int],
        args: Callable[[int], Tuple[Any, ...]],
        timeout: float,
        enough: Callable[[List[Any]], bool],
    ) -> List[Any]:
        """As ``_each``, but returns as soon as ``enough`` says so of the
        replies in so far (None for those not in: a renewal that a majority
        answered does not wait for a slow master)."""

        def one(i: int) -> Any:
            try:
                return self._pools[i].call(None, args(i), timeout, timeout)
            except Exception as e:
                return e

        futures = {self._executor.submit(one, i): n for n, i in enumerate(on)}
        replies: List[Any] = [None] * len(on)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                replies[futures[f]] = f.result()
            if enough(replies):
                break
        return replies

    def _all(self) -> List[int]:
        return list(range(len(self._pools)))

    def _release_everywhere(self, key: Any, owner: str, timeout: float) -> int:
        replies = self._each(self._all(), lambda _: ("LEASE.RELEASE", key, owner), timeout)
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
        commit = Commit.first(_granted(self._each(self._all(), lambda _: _acquire_args(key, owner, ttl_ms, None, label), timeout)), self.quorum)
        if commit is None:
            return None
        committed: Optional[List[int]] = commit.on
        # At most one round per master: each leaves one out.
        while self._commit:
            token = commit.token
            settled = commit.settle(self._each(commit.on, _floor_args(key, owner, ttl_ms, token, label), timeout), self._addrs.__getitem__)
            if not isinstance(settled, tuple):
                committed = settled
                break
            commit, outliers = settled
            _report(outliers, self.on_outlier)
        if committed is None or time.monotonic() >= valid_until:
            return None
        return QuorumLease(self, key, owner, commit.token, ttl_ms, valid_until, committed)

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


class AsyncQuorumClient:
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
        self.io_timeout = io_timeout
        self.watchdog = watchdog
        self.on_outlier = on_outlier
        label_bytes(label)  # TypeError now, not at the first acquire
        self.label: Label = label
        self.quorum = _quorum(len(self._pools))
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (the pools reset themselves): none of the
        parent's tasks, which stay referenced, as its connections do."""
        aio._inherited.extend(self._stragglers)
        self._stragglers = set()

    async def _each(self, on: Sequence[int], args: Callable[[int], Tuple[Any, ...]], timeout: float) -> List[Any]:
        return await self._each_until(on, args, timeout, lambda _: False)

    async def _each_until(
        self,
        on: Sequence[int],
        args: Callable[[int], Tuple[Any, ...]],
        timeout: float,
        enough: Callable[[List[Any]], bool],
    ) -> List[Any]:
        """As the sync client's: returns once ``enough`` says so. The calls
        still out finish on their own (bounded by ``timeout``): a renewal
        reaches every master that answers, not only the first majority."""

        async def one(n: int, i: int) -> Tuple[int, Any]:
            try:
                return n, await self._pools[i].call(None, args(i), timeout, timeout)
            except Exception as e:
                return n, e

        tasks = {asyncio.ensure_future(one(n, i)) for n, i in enumerate(on)}
        replies: List[Any] = [None] * len(on)
        while tasks:
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                n, reply = t.result()
                replies[n] = reply
            if enough(replies):
                break
        # Kept until they end, so that they are not collected half-way.
        self._stragglers |= tasks
        for t in tasks:
            t.add_done_callback(self._stragglers.discard)
        return replies

    def _all(self) -> List[int]:
        return list(range(len(self._pools)))

    async def _release_everywhere(self, key: Any, owner: str, timeout: float) -> int:
        replies = await self._each(self._all(), lambda _: ("LEASE.RELEASE", key, owner), timeout)
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
        replies = await self._each(self._all(), lambda _: _acquire_args(key, owner, ttl_ms, None, label), timeout)
        commit = Commit.first(_granted(replies), self.quorum)
        if commit is None:
            return None
        # At most one round per master: each leaves one out.
        while True:
            token = commit.token
            replies = await self._each(commit.on, _floor_args(key, owner, ttl_ms, token, label), timeout)
            settled = commit.settle(replies, self._addrs.__getitem__)
            if not isinstance(settled, tuple):
                break
            commit, outliers = settled
            _report(outliers, self.on_outlier)
        if settled is None or time.monotonic() >= valid_until:
            return None
        return AsyncQuorumLease(self, key, owner, commit.token, ttl_ms, valid_until, settled)

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
