"""The sync helpers: :class:`LeaseClient`, :class:`Lease`, :class:`LossSignal`
and the client's watchdog thread. What to send and what a reply means is
decided in ``_common.py``; this file only does the blocking I/O."""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, Type, TypeVar, Union

import redis
from redis import exceptions
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ._common import (
    POOL_IDLE,
    SHORT_S,
    AlreadyHeld,
    Attempts,
    Batch,
    LeaseBusy,
    LeaseGrace,
    LeaseCore,
    LeaseLost,
    Loss,
    MultiLeaseCore,
    Schedule,
    DEFAULT_LABEL,
    Label,
    Waiter,
    acquire_args,
    check_stale,
    check_ttl,
    checked_keys,
    connection_kwargs,
    deadline_after,
    fresh_after_fork,
    grace_of,
    guard_args,
    guarded,
    label_args,
    label_bytes,
    macquire_args,
    mode_args,
    mrenew_args,
    needs_fresh_renewal,
    new_owner,
    parse_waiters,
    release_failed,
    still_held,
    unguard_args,
    unguarded,
    waiters_args,
)
from ._compat import read_response

Conn = Any  # a redis.connection.Connection (or a subclass: SSL, unix socket)


class _Target:
    """Makes connections to the node that serves a key: the one server, or the
    master of the key's slot in a cluster."""

    def __init__(self, client: Union[redis.Redis, RedisCluster], io_timeout: float) -> None:
        self.client = client
        self.io_timeout = io_timeout
        self.cluster = isinstance(client, RedisCluster)

    def node(self, key: Any) -> Any:
        """Which node serves ``key`` (None: the one server): the pool's key."""
        if self.cluster:
            assert isinstance(self.client, RedisCluster)
            return self.client.get_node_from_key(key).name  # type: ignore[no-untyped-call]
        return None

    def connect(self, key: Any, timeout: Optional[float] = None) -> Conn:
        """A new connection, every wait on it bounded by ``io_timeout`` (or
        by ``timeout``, connect included, when given)."""
        if isinstance(self.client, RedisCluster):
            node = self.client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            pool = self.client.get_redis_connection(node).connection_pool
        else:
            pool = self.client.connection_pool
        kwargs = connection_kwargs(pool.connection_kwargs, self.io_timeout, Retry(NoBackoff(), 0))
        if timeout is not None:
            kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = timeout
        conn = pool.connection_class(**kwargs)
        conn.connect()
        return conn

    def refresh(self) -> None:
        """The cluster answered MOVED/ASK: learn the slots again."""
        if isinstance(self.client, RedisCluster):
            self.client.nodes_manager.initialize()


def _call(conn: Conn, args: Tuple[Any, ...], timeout: Optional[float]) -> Any:
    """Sends ``args`` and reads the reply, waiting at most ``timeout``
    seconds (``None``: no limit). The connection is closed on an I/O error
    or a timeout."""
    conn.send_command(*args)
    if timeout is not None and timeout == conn.socket_timeout:
        # The socket's own timeout: nothing to set (and set back) per read.
        return conn.read_response()
    return read_response(conn, None if timeout is None else max(timeout, 0.001))


def _pipeline(conn: Conn, commands: List[Tuple[Any, ...]], timeout: float) -> List[Any]:
    """Sends ``commands`` in one write and reads every reply, all within
    ``timeout`` seconds: each reply, or the error reply as an exception."""
    end = time.monotonic() + timeout
    conn.send_packed_command(conn.pack_commands(commands))
    replies: List[Any] = []
    for _ in commands:
        try:
            replies.append(read_response(conn, max(end - time.monotonic(), 0.001)))
        except exceptions.ResponseError as e:
            replies.append(e)
    return replies


def _usable(conn: Conn) -> bool:
    """Is an idle connection of ours still open? With no reply due, anything
    readable on it is the server's close (or garbage): not usable. One
    ``poll`` of its socket (redis-py's ``can_read`` costs several system
    calls)."""
    try:
        sock = getattr(conn, "_sock", None)
        buffer = getattr(getattr(conn, "_parser", None), "_buffer", None)
        if sock is None or buffer is None or not hasattr(buffer, "unread_bytes"):
            return not conn.can_read(timeout=0)
        if buffer.unread_bytes():
            return False
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except Exception:
        return False


class _Pool:
    """The idle connections of one client, per node: every lease's calls
    (acquire, renew, fence, release) take one and give it back, so a
    thousand leases need as many connections as calls run at once."""

    def __init__(self, target: _Target) -> None:
        self._target = target
        self._idle: Dict[Any, List[Conn]] = {}
        self._lock = threading.Lock()
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: none of the parent's idle connections (their
        copies here are closed; redis-py sends no shutdown from another
        process, so the parent's stay open), a new lock."""
        self._lock = threading.Lock()
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                _close(conn)

    def take(self, key: Any, timeout: Optional[float] = None) -> Tuple[Any, Conn]:
        """``(node, connection)`` for a call on ``key``: an idle one still
        open (one the server closed while idle is replaced: nothing sent on
        it would reach the server, so a new one is safe, for a fence too),
        else a new one."""
        node, conn = self.idle(key)
        return node, conn if conn is not None else self.connect(key, timeout)

    def idle(self, key: Any) -> Tuple[Any, Optional[Conn]]:
        """``(node, an idle connection still open)`` for a call on ``key``, or
        ``(node, None)`` when there is none."""
        node = self._target.node(key)
        while True:
            with self._lock:
                idle = self._idle.get(node)
                conn = idle.pop() if idle else None
            if conn is None or _usable(conn):
                return node, conn
            _close(conn)

    def connect(self, key: Any, timeout: Optional[float] = None) -> Conn:
        """A new connection for a call on ``key`` (``timeout`` bounds every
        wait on it, connect included)."""
        return self._target.connect(key, timeout)

    def give(self, node: Any, conn: Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(node, [])
            if len(idle) < POOL_IDLE:
                idle.append(conn)
                return
        _close(conn)

    def call(self, key: Any, args: Tuple[Any, ...], timeout: float, connect_timeout: Optional[float] = None) -> Any:
        """Runs ``args`` on a pooled connection. A connection whose reply was
        lost (or that an interrupt left mid-call) is closed, never reused."""
        node, conn = self.take(key, connect_timeout)
        try:
            reply = _call(conn, args, timeout)
        except exceptions.ResponseError as e:
            self.give(node, conn)
            raise check_stale(e) from None
        except BaseException:
            _close(conn)
            raise
        self.give(node, conn)
        return reply

    def close(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            _close(conn)


#: How long a watchdog with no lease left waits for a new one before it ends
#: (a thread a lease would otherwise start anew at every acquire).
WATCHDOG_LINGER_S = 10.0
IDLE_NAP_S = 0.5

_SHARED_LOCK = threading.Lock()


class _Shared:
    """What every :class:`LeaseClient` (and :class:`redis_lease.Lock`) made
    from one redis-py client with one ``io_timeout`` shares: the pool of
    connections, the watchdog's schedule and its thread. Kept on the redis-py
    client object itself, so it goes with it."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.pool = _Pool(target)
        self.schedule = Schedule()
        self.wake = threading.Condition()
        self.running = False
        #: The server's ``lease.max-ttl-ms`` once an acquire over it was
        #: refused (the lowest of the nodes'): the locks' lease length.
        self.max_ttl_ms: Optional[int] = None
        #: The running watchdog's own connections, per node.
        self.watchdog_conns: Dict[Any, Conn] = {}
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: no lease to renew (the parent's watchdog
        renews the parent's), no watchdog thread (the next lease starts
        one), none of the parent's connections. The pool resets itself."""
        self.schedule.forget_all()
        self.wake = threading.Condition()
        self.running = False
        conns, self.watchdog_conns = self.watchdog_conns, {}
        for conn in conns.values():
            _close(conn)


def _new_shared_lock() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    # Another thread of the parent may have held it at the fork.
    os.register_at_fork(after_in_child=_new_shared_lock)


def _shared(client: Any, io_timeout: float) -> _Shared:
    with _SHARED_LOCK:
        per_timeout: Dict[float, _Shared] = client.__dict__.setdefault("_redis_lease_shared", {})
        shared = per_timeout.get(io_timeout)
        if shared is None:
            shared = per_timeout[io_timeout] = _Shared(_Target(client, io_timeout))
        return shared


class LossSignal:
    """The loss signal of a lease, like a :class:`threading.Event` that is set
    once and stays set: at the lease's client-side deadline (checked wherever
    the signal is read, so it never waits for the watchdog), when a renewal
    answers 0, or when the lease is released.

    ``is_set()`` never blocks; ``wait(timeout)`` returns True once it is set,
    False when ``timeout`` ran out; ``reason`` says why (a :class:`Loss`).
    """

    def __init__(self, deadline: float) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._deadline = deadline
        self._reason: Optional[Loss] = None

    def _check(self) -> None:
        with self._lock:
            if self._reason is None and time.monotonic() >= self._deadline:
                self._reason = Loss.EXPIRED
                self._event.set()

    def is_set(self) -> bool:
        """True once the lease is lost (or released). Never blocks."""
        self._check()
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lease is lost, at most ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            now = time.monotonic()
            wake = self._deadline - now
            if end is not None:
                if now >= end:
                    return False
                wake = min(wake, end - now)
            self._event.wait(max(wake, 0.001))
        return True

    @property
    def reason(self) -> Optional[Loss]:
        """Why the lease is lost; None while it is held."""
        self._check()
        return self._reason

    @property
    def deadline(self) -> float:
        """The client-side deadline (``time.monotonic()`` seconds)."""
        return self._deadline

    def _extend(self, sent: float, ttl_ms: int) -> bool:
        """A renewal sent at ``sent`` succeeded. False once lost."""
        with self._lock:
            if self._reason is None and time.monotonic() >= self._deadline:
                self._reason = Loss.EXPIRED
                self._event.set()
            if self._reason is not None:
                return False
            self._deadline = max(self._deadline, sent + ttl_ms / 1000)
            return True

    def _lose(self, reason: Loss) -> None:
        self._check()
        with self._lock:
            if self._reason is None:
                self._reason = reason
            self._event.set()


class Lease(LeaseCore):
    """A held lease: the guard of one acquisition, and a context manager that
    releases it on exit (also when the block raises).

    ``token`` is its fencing token; ``lost`` its :class:`LossSignal`. Its
    calls (:meth:`fence`, :meth:`renew`, :meth:`release`) go over the
    client's pool of connections; the client's watchdog renews it.
    """

    def __init__(
        self, client: "LeaseClient", key: Any, owner: str, token: int, ttl_ms: int, deadline: float
    ) -> None:
        super().__init__(client, key, owner, token, ttl_ms, LossSignal(deadline))

    def _call(self, args: Tuple[Any, ...], timeout: float, connect_timeout: Optional[float] = None) -> Any:
        """``args`` on a connection of the client's pool."""
        return self._client._pool.call(self.key, args, timeout, connect_timeout)

    def fence(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:
        """Runs ``command`` through the fence (``LEASE.FENCE key token
        command...``): only while this lease's token is current, in the same
        atomic step. Returns the command's reply; raises :class:`StaleToken`
        (nothing run) when the token is not current. It is sent even after
        the loss signal: the server decides. A command that writes a key
        whose hash tag another key guards raises :class:`Fenced` (nothing
        run): fence it through a lease on that guard.

        ``min_ttl_ms``: also refuse unless the lease has at least that many
        milliseconds left when the server decides (``MINTTL``):
        :class:`LeaseExpiring` (nothing run, the lease still held). Ask for
        the time the work that follows needs under the lease. With no
        ``command`` it only checks."""
        return self._call(self.fence_args(*command, min_ttl_ms=min_ttl_ms), self._client.io_timeout)

    def renew(self) -> bool:
        """Renews now (the watchdog does it anyway). True: renewed, the
        deadline moves to ttl from now. False: the lease is not ours (the
        loss signal is set): the renewal was refused, the lease was lost
        before (nothing is sent), or its deadline passed before the reply."""
        renewal = self._renewal()
        if renewal is None:
            return False
        args, sent, timeout = renewal
        try:
            reply = self._call(args, timeout)
        except exceptions.TimeoutError:
            if self.lost.is_set():
                return False
            raise
        return self._renewed(reply, sent)

    def release(self) -> bool:
        """Gives the lease back and stops its renewals. True: it was ours.
        False: it was lost before (or released already). A lost reply is
        retried with the same owner. Once the lease is known lost it waits
        little: after a refused renewal nothing is sent; after the deadline
        passed one attempt, bounded by a quarter of a second, no retry."""
        first = not self._released
        plan, attempts, args = self._release_plan()
        for n, (timeout, connect_timeout) in enumerate(attempts):
            try:
                reply = self._call(args, timeout, connect_timeout)
            except Exception as e:
                answer = release_failed(e, n, len(attempts), plan)
                if answer is not None:
                    return answer
                continue
            if reply == self._count:
                return True
            break
        if first:
            self._release_leftovers()
        return False

    def _release_leftovers(self) -> None:
        """A multi-key lease not all ours: the keys still ours, released one
        by one, each one short attempt (nothing for a single lease)."""
        for args in self._leftover_args():
            try:
                self._call(args, SHORT_S, SHORT_S)
            except Exception:
                pass

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Releases; a block that ended normally after the lease was lost
        (refused or expired) raises :class:`LeaseLost`: its work may have
        overlapped the next holder's."""
        lost = self._exit_loss()
        try:
            self.release()
        except Exception:
            if exc is None:
                raise
            # The block's own error matters more; the lease ends at its ttl.
        if exc is None and lost is not None:
            raise LeaseLost(lost)


class LeaseClient:
    """Takes leases on the server of a :class:`redis.Redis`, or on the master of
    the lease key's slot of a :class:`redis.cluster.RedisCluster`.

    - ``io_timeout``: seconds to wait for a reply that does not block (renew,
      release, fence, acquire without ``block_ms``). Default 5.
    - ``block_margin``: how much longer than its ``BLOCK`` a blocking acquire
      waits for its reply before it counts it as lost. Default 2.
    - ``retries``: how often a lost acquire (or release) reply is retried, on
      a new connection, with the same owner. Default 3.
    - ``watchdog``: renew in the background. Default True.

    All its leases share its connections (a pool per node: as many as calls
    run at once, at most 8 kept idle) and one watchdog thread, which renews
    them in batches: one pipeline per node each round. Every
    ``LeaseClient`` and :class:`redis_lease.Lock` made from one redis-py
    client (with one ``io_timeout``) shares that pool and that watchdog.
    """

    def __init__(
        self,
        client: Union[redis.Redis, RedisCluster],
        *,
        io_timeout: float = 5.0,
        block_margin: float = 2.0,
        retries: int = 3,
        watchdog: bool = True,
        label: Label = DEFAULT_LABEL,
    ) -> None:
        self._shared = _shared(client, io_timeout)
        self._target = self._shared.target
        self._pool = self._shared.pool
        self._held: "weakref.WeakValueDictionary[Any, Lease]" = weakref.WeakValueDictionary()
        self._held_lock = threading.Lock()
        self._schedule = self._shared.schedule
        self._wake = self._shared.wake
        self.io_timeout = io_timeout
        self.block_margin = block_margin
        self.retries = retries
        self.watchdog = watchdog
        label_bytes(label)  # TypeError now, not at the first acquire
        #: The label of this client's acquires (``LABEL``, design.md S11):
        #: :data:`DEFAULT_LABEL` (``<host> pid <pid> <program>``, computed
        #: once per process), a text, or None for none.
        self.label: Label = label
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (after its shared state, made before it):
        no lease held, new locks. A lease copied from the parent is the
        parent's: nothing renews it here."""
        self._wake = self._shared.wake
        self._held = weakref.WeakValueDictionary()
        self._held_lock = threading.Lock()

    def close(self) -> None:
        """Closes the idle connections (leases still held keep working: their
        calls open new ones)."""
        self._pool.close()

    def watchdog_stats(self) -> Dict[str, int]:
        """What the watchdog did so far: ``leases`` it renews now,
        ``renewals`` sent, and the ``round_trips`` (pipelines) that carried
        them."""
        with self._wake:
            return self._schedule.stats()

    def waiters(self, key: Any, count: Optional[int] = None) -> List[Waiter]:
        """The clients waiting for ``key`` with ``BLOCK``, oldest first
        (``LEASE.WAITERS key [COUNT count]``): at most ``count`` (1 to 1000;
        None: the server's default, 10). Each is a :class:`Waiter` with its
        client id, label, mode, time waited and time left. Empty when nobody
        waits. It reads the key's master (waiters live there)."""
        return parse_waiters(self._pool.call(key, waiters_args(key, count), self.io_timeout))

    def guard(self, key: Any) -> None:
        """``LEASE.GUARD key``, an admin call (design.md S12): from now on
        ``key``, a lease key with a hash tag (``{acct:7}:lock``), guards
        that tag. Every other key of its database with the tag
        (``{acct:7}``, ``{acct:7}:log``) can then be written only through
        ``LEASE.FENCE key token ...`` with the token of the lease held on
        ``key``, which is what ``lease.fence(...)`` of a lease on ``key``
        sends; any other write is refused with :class:`Fenced`, and
        changes nothing. Reads pass. The key stays, free, when its lease
        ends; it holds exclusive leases only (no ``shared``/``limit``).
        Guarding a key that guards already does nothing.

        The server's refusals raise its ``ResponseError``: a key with no
        hash tag, a tag another key guards, a key held with ``LIMIT`` or
        ``SHARED``, ``WRONGTYPE``. Sent once: it is idempotent, so call it
        again after a lost reply. On a cluster it goes to the key's
        master."""
        guarded(self._pool.call(key, guard_args(key), self.io_timeout))

    def unguard(self, key: Any) -> bool:
        """``LEASE.UNGUARD key``: ``key`` stops guarding its hash tag, whose
        keys can be written by anyone again. True when it guarded, False
        when it did not (the call changes nothing then). Its lease, if one
        is held, is not touched."""
        return unguarded(self._pool.call(key, unguard_args(key), self.io_timeout))

    def _label_args(self, label: Label) -> Tuple[Any, ...]:
        """``LABEL text`` of one acquire (nothing when it has none): the
        call's ``label``, or this client's."""
        return label_args(label_bytes(self.label if label is DEFAULT_LABEL else label))

    def _watch(
        self,
        key: Any,
        owner: Any,
        ttl_ms: int,
        first: float,
        signal: LossSignal,
        keys: Optional[Tuple[Any, ...]] = None,
        until: Optional[float] = None,
    ) -> int:
        """Renews a lease (every key of ``keys`` for a multi-key one) from
        ``first`` on (until ``until``, when given); starts the watchdog
        thread when none runs."""
        with self._wake:
            lease_id, wake = self._schedule.add(key, owner, ttl_ms, first, signal, keys, until)
            self._started(wake)
            return lease_id

    def _set_until(self, lease_id: int, until: Optional[float], next_at: float) -> None:
        """A watched lease was just renewed by hand: its end and next renewal."""
        with self._wake:
            self._started(self._schedule.set_until(lease_id, until, next_at))

    def _started(self, wake: bool) -> None:
        shared = self._shared
        if not shared.running:
            shared.running = True
            threading.Thread(target=self._run_watchdog, name="lease-watchdog", daemon=True).start()
        elif wake:
            self._wake.notify()

    def _forget(self, lease_id: int) -> None:
        with self._wake:
            self._schedule.remove(lease_id)

    def _run_watchdog(self) -> None:
        """Sends each batch the schedule makes, one pipeline per node, and
        hands the replies back, until no lease is left."""
        conns: Dict[Any, Conn] = {}
        self._shared.watchdog_conns = conns
        idle_since: Optional[float] = None
        try:
            while True:
                with self._wake:
                    while True:
                        now = time.monotonic()
                        step = self._schedule.next(now, self.io_timeout)
                        if isinstance(step, Batch):
                            break
                        if step is None:
                            # No lease left: wait a while for a new one
                            # rather than start a thread for each.
                            if idle_since is None:
                                idle_since = now
                            elif now - idle_since >= WATCHDOG_LINGER_S:
                                self._shared.running = False
                                return
                            # In short naps: a lease whose first renewal
                            # is due after the nap needs no wake-up.
                            self._schedule.idle_until(now + IDLE_NAP_S)
                            self._wake.wait(IDLE_NAP_S)
                            continue
                        idle_since = None
                        self._wake.wait(step - now)
                replies, pipelines = self._send(step, conns)
                with self._wake:
                    self._schedule.settle(step, replies, pipelines)
        finally:
            for conn in conns.values():
                _close(conn)

    def _send(self, batch: Batch, conns: Dict[Any, Conn]) -> Tuple[List[Any], int]:
        """The renewals of ``batch``, one pipeline per node, on the watchdog's
        own connections: each reply in the batch's order (None: none came)."""
        by_node: Dict[Any, List[int]] = {}
        for n, key in enumerate(batch.keys):
            try:
                by_node.setdefault(self._target.node(key), []).append(n)
            except Exception:
                pass  # no node serves its slot now: tried again soon
        replies: List[Any] = [None] * len(batch.ids)
        end = batch.sent + batch.timeout
        for node, indexes in by_node.items():
            conn = conns.get(node)
            try:
                if conn is None:
                    conn = conns[node] = self._target.connect(batch.keys[indexes[0]])
                got = _pipeline(conn, [batch.args[n] for n in indexes], max(end - time.monotonic(), 0.001))
            except Exception:
                _close(conns.pop(node, None))
                continue
            for n, reply in zip(indexes, got):
                replies[n] = reply
            if any(isinstance(r, (exceptions.MovedError, exceptions.AskError)) for r in got):
                self._target.refresh()
        return replies, len(by_node)

    def acquire(
        self,
        key: Any,
        ttl_ms: int,
        block_ms: Optional[int] = None,
        *,
        shared: bool = False,
        limit: Optional[int] = None,
        label: Label = DEFAULT_LABEL,
        _owner: Optional[str] = None,
    ) -> Optional[Lease]:
        """Takes the lease on ``key`` for ``ttl_ms`` with a fresh random owner.

        ``shared=True`` takes a reader's place (any number of readers, no
        writer meanwhile; its token fences reads only, a fenced write raises
        :class:`SharedWrite`); ``limit=n`` one of ``n`` places (a semaphore
        with expiring permits). Default: exclusive.

        ``block_ms``: ``None`` does not wait; ``n > 0`` waits up to ``n`` ms;
        ``FOREVER`` (0) waits until the lease is ours (no read timeout).
        Returns the :class:`Lease`, or None when another owner holds it. Raises
        :class:`LeaseGrace` (a :class:`LeaseBusy`) when the server refused it
        for its grace period, with the time that remains (read from the
        server's ``INFO lease`` after the null reply).

        A lost reply (I/O error, timeout) is retried on a new connection with
        the same owner: if the lost call took the lease, the retry gets the
        same token. A retry waits only for what is left of ``block_ms``.

        ``label``: the holder's label shown by ``LEASE.INFO`` and
        ``LEASE.WAITERS`` (a ``str`` or ``bytes``, cut to 256 bytes; None: no
        label); by default the client's. Sent unchanged on every retry.
        """
        check_ttl(ttl_ms, block_ms)
        mode = mode_args(shared, limit)
        labelled = self._label_args(label)
        self._check_held((key,))
        owner = _owner or new_owner()
        return self._acquire(
            key,
            key,
            block_ms,
            lambda wait_until: acquire_args(
                key, owner, ttl_ms, block_ms, wait_until, self.io_timeout, self.block_margin, mode, labelled
            ),
            lambda token, sent, conn: self._start(key, owner, token, ttl_ms, sent, conn),
            (key,),
        )

    def acquire_many(
        self, keys: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> Optional["MultiLease"]:
        """Takes every key of ``keys`` or none, in one atomic step
        (``LEASE.MACQUIRE numkeys key ... owner ttl-ms [BLOCK ms]``, design.md
        S10), with a fresh random owner: all get one fencing token and the
        same deadline. Exclusive (no ``shared``/``limit``).

        Returns the :class:`MultiLease`, or None when some key is held by
        another owner (or waited for) and nothing was taken; with
        ``block_ms``, after waiting until every key could be taken at once.
        Raises ``ValueError`` for no key, a key twice, or (on a cluster)
        keys of different slots (give them one hash tag), and
        :class:`AlreadyHeld` when this client holds one of the keys: nothing
        sent. :class:`LeaseGrace`, the retry of a lost reply with the same
        owner and the read timeouts are those of :meth:`acquire`.
        """
        keys = checked_keys(keys, ttl_ms, block_ms, isinstance(self._target.client, RedisCluster))
        labelled = self._label_args(label)
        self._check_held(keys)
        owner = new_owner()
        lease = self._acquire(
            keys[0],
            keys,
            block_ms,
            lambda wait_until: macquire_args(
                keys, owner, ttl_ms, block_ms, wait_until, self.io_timeout, self.block_margin, labelled
            ),
            lambda token, sent, conn: self._start_many(keys, owner, token, ttl_ms, sent, conn),
            keys,
        )
        assert lease is None or isinstance(lease, MultiLease)
        return lease

    def _check_held(self, keys: Tuple[Any, ...]) -> None:
        """:class:`AlreadyHeld` when this client holds a lease on one of
        ``keys`` (neither released nor lost)."""
        with self._held_lock:
            for key in keys:
                if still_held(self._held.get(key)):
                    raise AlreadyHeld(key)

    def _acquire(
        self,
        route: Any,
        what: Any,
        block_ms: Optional[int],
        attempt: Callable[[Optional[float]], Tuple[Tuple[Any, ...], Optional[float]]],
        start: Callable[[int, float, Conn], Lease],
        keys: Tuple[Any, ...],
    ) -> Optional[Lease]:
        """The acquire loop of one key or of several together: ``attempt``
        makes each try's command (from the end of the wait), sent to the
        node of ``route``; ``start`` makes the lease of a token; ``keys`` are
        registered as held by it."""
        wait_until = None if not block_ms else time.monotonic() + block_ms / 1000
        attempts = Attempts(self.retries)
        while True:
            args, timeout = attempt(wait_until)
            conn = node = None
            try:
                node, conn = self._pool.take(route)
                sent = time.monotonic()
                token = _call(conn, args, timeout)
            except Exception as e:
                if conn is not None and _answered(e):
                    # An error reply (WRONGTYPE, a ttl out of range): the
                    # connection is fine.
                    self._pool.give(node, conn)
                    assert isinstance(e, exceptions.ResponseError)
                    raise check_stale(e) from None
                _close(conn)
                step = attempts.after(e)
                if step is None:
                    raise
                pause, refresh = step
                if refresh:
                    self._target.refresh()
                time.sleep(pause)
                continue
            except BaseException:
                _close(conn)
                raise
            try:
                if token is None:
                    grace = _grace(conn, self.io_timeout)
                    if grace is not None:
                        raise LeaseGrace(what, *grace)
                    return None
                lease = start(int(token), sent, conn)
            finally:
                self._pool.give(node, conn)
            with self._held_lock:
                for key in keys:
                    self._held[key] = lease
            return lease

    def _start(self, key: Any, owner: str, token: int, ttl_ms: int, sent: float, conn: Conn) -> Lease:
        renewed = reply = None
        if needs_fresh_renewal(sent, ttl_ms):
            renewed = time.monotonic()
            try:
                reply = _call(conn, ("LEASE.RENEW", key, owner, ttl_ms), self.io_timeout)
            except Exception:
                pass
        deadline, refused = deadline_after(sent, ttl_ms, renewed, reply)
        lease = Lease(self, key, owner, token, ttl_ms, deadline)
        if refused:
            lease.lost._lose(Loss.REFUSED)
        return lease

    def _start_many(
        self, keys: Tuple[Any, ...], owner: str, token: int, ttl_ms: int, sent: float, conn: Conn
    ) -> "MultiLease":
        renewed = reply = None
        if needs_fresh_renewal(sent, ttl_ms):
            renewed = time.monotonic()
            try:
                reply = _call(conn, mrenew_args(keys, owner, ttl_ms), self.io_timeout)
            except Exception:
                pass
        deadline, refused = deadline_after(sent, ttl_ms, renewed, reply, len(keys))
        lease = MultiLease(self, keys, owner, token, ttl_ms, deadline)
        if refused:
            lease.lost._lose(Loss.REFUSED)
        return lease

    def lease(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, **mode: Any
    ) -> "_LeaseContext[Lease]":
        """For ``with``: acquires on entry (raising :class:`LeaseBusy` when the
        lease was not obtained, :class:`LeaseGrace` for a grace period) and
        releases on exit; a block that ends normally after the lease was lost
        raises :class:`LeaseLost`::

            with client.lease("lock", 30000, block_ms=5000) as lease:
                lease.fence("HSET", "data", "k", "v")
        """
        return _LeaseContext(
            lambda: self.acquire(key, ttl_ms, block_ms, **mode), f"{key!r} is held by another owner"
        )

    def lease_many(
        self, keys: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> "_LeaseContext[MultiLease]":
        """For ``with``, as :meth:`lease`, holding every key of ``keys`` at
        once (:meth:`acquire_many`): :class:`LeaseBusy` when they were not
        obtained, released on exit::

            with client.lease_many(["{acct}:7", "{acct}:9"], 30000, block_ms=5000) as lease:
                lease.fence("{acct}:7", "HINCRBY", "{acct}:7:data", "balance", -10)
                lease.fence("{acct}:9", "HINCRBY", "{acct}:9:data", "balance", 10)
        """
        return _LeaseContext(
            lambda: self.acquire_many(keys, ttl_ms, block_ms, label=label),
            f"{tuple(keys)!r}: some key is held by another owner",
        )

    def run_many(
        self,
        keys: Any,
        ttl_ms: int,
        work: Callable[["MultiLease"], Any],
        block_ms: Optional[int] = None,
        *,
        label: Label = DEFAULT_LABEL,
    ) -> Any:
        """Runs ``work(lease)`` holding every key of ``keys`` and releases
        them however ``work`` ends, as :meth:`run`."""
        with self.lease_many(keys, ttl_ms, block_ms, label=label) as lease:
            return work(lease)

    def run(
        self,
        key: Any,
        ttl_ms: int,
        work: Callable[[Lease], Any],
        block_ms: Optional[int] = None,
        **mode: Any,
    ) -> Any:
        """Runs ``work(lease)`` holding the lease and releases it however
        ``work`` ends; returns what ``work`` returns. ``work`` polls
        ``lease.lost.is_set()`` to know when to stop. Raises
        :class:`LeaseBusy` when the lease was not obtained."""
        with self.lease(key, ttl_ms, block_ms, **mode) as lease:
            return work(lease)


L = TypeVar("L", bound="Lease")


class _LeaseContext(Generic[L]):
    """``with client.lease(...)`` or ``with client.lease_many(...)``:
    acquires on entry (:class:`LeaseBusy`, saying ``busy``, when the lease
    was not obtained), releases on exit (as the asyncio one)."""

    def __init__(self, acquire: Callable[[], Optional[L]], busy: str) -> None:
        self._acquire = acquire
        self._busy = busy
        self._lease: Optional[L] = None

    def __enter__(self) -> L:
        lease = self._acquire()
        if lease is None:
            raise LeaseBusy(self._busy)
        self._lease = lease
        return lease

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._lease is not None
        self._lease.__exit__(exc_type, exc, tb)


class MultiLease(MultiLeaseCore, Lease):
    """A lease on several keys taken together (:meth:`LeaseClient.acquire_many`):
    every key held by one owner with one fencing token ``token``, renewed
    together (one ``LEASE.MRENEW`` per watchdog round), lost together, given
    back together (``LEASE.MRELEASE``). ``keys``, ``lost``, :meth:`renew`,
    :meth:`release` and the context manager are those of :class:`Lease`;
    :meth:`fence` names the key.

    The loss signal is set when a renewal is refused (the server renews
    nothing unless the owner still holds every key with the one token: one
    key deleted or taken is the loss of all) or at the client-side
    deadline. Each key is an ordinary exclusive lease on the server: the
    token fences writes on any of them.
    """

    def __init__(
        self, client: "LeaseClient", keys: Tuple[Any, ...], owner: str, token: int, ttl_ms: int, deadline: float
    ) -> None:
        MultiLeaseCore.__init__(self, client, keys, owner, token, ttl_ms, LossSignal(deadline))

    def fence(self, key: Any, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:  # type: ignore[override]  # its key comes first: not a drop-in for a Lease's
        """Runs ``command`` through the fence on ``key``, one of the lease's
        keys (``LEASE.FENCE key token command...``): the command's reply, or
        :class:`StaleToken` (nothing run) when the token is not the current
        one of ``key``; ``ValueError`` (nothing sent) when ``key`` is not one
        of the lease's keys. On a cluster the call goes to the keys' node:
        keep the command's own keys in their slot. ``min_ttl_ms`` as in
        :meth:`Lease.fence` (:class:`LeaseExpiring`)."""
        return self._call(self.fence_args(key, *command, min_ttl_ms=min_ttl_ms), self._client.io_timeout)

    def __enter__(self) -> "MultiLease":
        return self


def _grace(conn: Conn, timeout: float) -> Optional[Tuple[int, str]]:
    """After a null acquire: the grace period the server runs, if any (a
    server that cannot say counts as none)."""
    try:
        return grace_of(_call(conn, ("INFO", "lease"), timeout))
    except Exception:
        return None


def _close(conn: Optional[Conn]) -> None:
    if conn is not None:
        try:
            conn.disconnect()
        except Exception:
            pass


def _answered(e: BaseException) -> bool:
    """An error reply to a call that reached the server, other than a
    cluster redirection: the connection stays usable."""
    return isinstance(e, exceptions.ResponseError) and not isinstance(
        e, (exceptions.MovedError, exceptions.AskError, exceptions.TryAgainError)
    )
