"""The asyncio helpers, for :class:`redis.asyncio.Redis` and
:class:`redis.asyncio.cluster.RedisCluster`: the same rules as the sync ones,
decided in ``_common.py``; this file only does the asyncio I/O.

::

    client = AsyncLeaseClient(redis.asyncio.Redis())
    async with client.lease("lock", 30000, block_ms=5000) as lease:
        await lease.fence("HSET", "data", "k", "v")
        if lease.lost.is_set(): ...
        await lease.lost.wait()  # completes the moment the lease is lost
"""

from __future__ import annotations

import asyncio
import time
import weakref
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, Generic, List, Optional, Tuple, Type, TypeVar, Union

import redis.asyncio as aredis
from redis import exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

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
    mrenew_args,
    needs_fresh_renewal,
    mode_args,
    new_owner,
    parse_waiters,
    release_failed,
    still_held,
    unguard_args,
    unguarded,
    waiters_args,
)

__all__ = ["AsyncLeaseClient", "AsyncLease", "AsyncLossSignal", "AsyncMultiLease", "Lock"]

Conn = Any  # a redis.asyncio.connection.Connection
T = TypeVar("T")


class _Target:
    def __init__(self, client: Union[aredis.Redis, RedisCluster], io_timeout: float) -> None:
        self.client = client
        self.io_timeout = io_timeout
        self.cluster = isinstance(client, RedisCluster)

    def node(self, key: Any) -> Any:
        """Which node serves ``key`` (None: the one server), once the
        cluster's slots are known: the pool's key."""
        if self.cluster:
            client: RedisCluster = self.client  # type: ignore[assignment]
            if not client.nodes_manager.slots_cache:
                return None
            node = client.get_node_from_key(key)
            return None if node is None else node.name
        return None

    async def connect(self, key: Any, timeout: float) -> Conn:
        """A new connection within ``timeout``; every later wait on it is
        bounded by ``io_timeout`` (and by ``timeout`` when shorter)."""
        if isinstance(self.client, RedisCluster):
            try:
                await asyncio.wait_for(self.client.initialize(), timeout)
            except asyncio.TimeoutError:
                raise exceptions.TimeoutError("the cluster's slots did not come in time") from None
            node = self.client.get_node_from_key(key)
            if node is None:
                raise exceptions.SlotNotCoveredError(f"no node serves the slot of {key!r}")
            cls: Any = node.connection_class
            kwargs: Any = node.connection_kwargs
        else:
            pool = self.client.connection_pool
            cls, kwargs = pool.connection_class, pool.connection_kwargs
        no_retry = Retry(NoBackoff(), 0)
        conn: Conn = cls(**connection_kwargs(kwargs, min(self.io_timeout, timeout), no_retry))
        try:
            await asyncio.wait_for(conn.connect(), timeout)
        except asyncio.TimeoutError:
            await _close(conn)
            raise exceptions.TimeoutError("connecting timed out") from None
        except BaseException:
            await _close(conn)
            raise
        return conn

    async def refresh(self) -> None:
        if isinstance(self.client, RedisCluster):
            await self.client.nodes_manager.initialize()


async def _call(conn: Conn, args: Tuple[Any, ...], timeout: Optional[float]) -> Any:
    """Sends ``args``, reads the reply within ``timeout`` seconds (``None``:
    no limit); closes the connection when the reply does not come."""
    async def go() -> Any:
        await conn.send_command(*args)
        # The connection's socket timeout bounds a read by default; this
        # call's own bound is the wait_for below (none for ``BLOCK 0``).
        return await conn.read_response(timeout=_FOREVER_S)

    try:
        if timeout is None:
            return await go()
        if timeout == conn.socket_timeout:
            # The connection's own timeout bounds the send and the read
            # (redis-py closes it when one runs out): no task per call.
            await conn.send_command(*args)
            return await conn.read_response()
        return await asyncio.wait_for(go(), max(timeout, 0.001))
    except asyncio.TimeoutError:
        await _close(conn)
        raise exceptions.TimeoutError("no reply in time") from None


#: A read timeout longer than any wait (redis-py reads with the socket
#: timeout unless given one).
_FOREVER_S = 1e8


async def _grace(conn: Conn, timeout: float) -> Optional[Tuple[int, str]]:
    """As the sync helper's: the grace period after a null acquire."""
    try:
        return grace_of(await _call(conn, ("INFO", "lease"), timeout))
    except Exception:
        return None


async def _close(conn: Optional[Conn]) -> None:
    if conn is not None:
        try:
            await conn.disconnect()
        except Exception:
            pass


async def _usable(conn: Conn) -> bool:
    """Is an idle connection of ours still open (nothing readable on it)?
    (``can_read`` from redis-py 8.0; before, ``can_read_destructive``: what
    it reads would be garbage anyway, and the connection is closed.)"""
    try:
        can_read = getattr(conn, "can_read", None) or conn.can_read_destructive
        return not await can_read()
    except Exception:
        return False


async def _pipeline(conn: Conn, commands: List[Tuple[Any, ...]], timeout: float) -> List[Any]:
    """Sends ``commands`` in one write and reads every reply within
    ``timeout`` seconds: each reply, or the error reply as an exception."""

    async def go() -> List[Any]:
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: List[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response(timeout=_FOREVER_S))
            except exceptions.ResponseError as e:
                replies.append(e)
        return replies

    try:
        return await asyncio.wait_for(go(), max(timeout, 0.001))
    except asyncio.TimeoutError:
        await _close(conn)
        raise exceptions.TimeoutError("no reply in time") from None


#: What a forked child keeps of its parent's asyncio objects (idle
#: connections, with the child's copy of their socket closed, and the
#: watchdog task): never collected in the child, since collecting them would
#: run their cleanup through the parent's event loop, whose epoll instance
#: the child shares with the parent.
_inherited: List[Any] = []


def _orphan(conn: Conn) -> None:
    """In a forked child: closes the child's copy of a parent's connection
    (its socket only, no shutdown, nothing through the event loop), and
    keeps the object."""
    try:
        writer = getattr(conn, "_writer", None)
        sock = None if writer is None else writer.get_extra_info("socket")
        sock = getattr(sock, "_sock", sock)  # asyncio's TransportSocket wraps it
        if sock is not None:
            sock.close()
    except Exception:
        pass
    _inherited.append(conn)


class _Pool:
    """The idle connections of one client, per node, as the sync one: every
    lease's calls take one and give it back, so a thousand leases need as
    many connections as calls run at once."""

    def __init__(self, target: _Target) -> None:
        self._target = target
        self._idle: Dict[Any, List[Conn]] = {}
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: none of the parent's idle connections."""
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                _orphan(conn)

    async def take(self, key: Any, timeout: float) -> Tuple[Any, Conn]:
        """``(node, connection)`` for a call on ``key``: an idle one still
        open (one closed by the server while idle is replaced: nothing sent
        on it would reach the server), else a new one within ``timeout``."""
        while True:
            node = self._target.node(key)
            idle = self._idle.get(node)
            if not idle:
                conn = await self._target.connect(key, timeout)
                return self._target.node(key), conn
            conn = idle.pop()
            if await _usable(conn):
                return node, conn
            await _close(conn)

    async def give(self, node: Any, conn: Conn) -> None:
        idle = self._idle.setdefault(node, [])
        if len(idle) < POOL_IDLE:
            idle.append(conn)
        else:
            await _close(conn)

    async def call(self, key: Any, args: Tuple[Any, ...], timeout: float, connect_timeout: float) -> Any:
        """Runs ``args`` on a pooled connection; one whose reply was lost (or
        whose call was cancelled) is closed, never reused."""
        node, conn = await self.take(key, connect_timeout)
        try:
            reply = await _call(conn, args, timeout)
        except exceptions.ResponseError as e:
            await self.give(node, conn)
            raise check_stale(e) from None
        except BaseException:
            await _close(conn)
            raise
        await self.give(node, conn)
        return reply

    async def close(self) -> None:
        conns = [c for idle in self._idle.values() for c in idle]
        self._idle.clear()
        for conn in conns:
            await _close(conn)


#: How long a watchdog task with no lease left waits for a new one before it
#: ends (rather than a task started anew at every acquire).
WATCHDOG_LINGER_S = 10.0
IDLE_NAP_S = 0.5


class _Shared:
    """What every :class:`AsyncLeaseClient` (and asyncio
    :class:`redis_lease.aio.Lock`) made from one redis-py asyncio client with
    one ``io_timeout`` shares: the pool, the watchdog's schedule and task.
    Kept on the redis-py client object itself."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.pool = _Pool(target)
        self.schedule = Schedule()
        self.wake = asyncio.Event()
        self.task: Optional["asyncio.Task[None]"] = None
        self.max_ttl_ms: Optional[int] = None
        #: The running watchdog's own connections, per node.
        self.watchdog_conns: Dict[Any, Conn] = {}
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: no lease to renew, no watchdog task (the
        next lease starts one on the child's loop), none of the parent's
        connections. The pool resets itself."""
        self.schedule.forget_all()
        if self.task is not None:
            _inherited.append(self.task)
            self.task = None
        conns, self.watchdog_conns = self.watchdog_conns, {}
        for conn in conns.values():
            _orphan(conn)


def _shared(client: Any, io_timeout: float) -> _Shared:
    per_timeout: Dict[float, _Shared] = client.__dict__.setdefault("_redis_lease_shared", {})
    shared = per_timeout.get(io_timeout)
    if shared is None:
        shared = per_timeout[io_timeout] = _Shared(_Target(client, io_timeout))
    return shared


class AsyncLossSignal:
    """The loss signal of a lease, like an :class:`asyncio.Event` that is set
    once and stays set: ``is_set()`` (never waits, and turns true at the
    deadline by itself), ``await wait()`` (completes the moment the lease is
    lost, at the deadline at the latest), ``reason``."""

    def __init__(self, deadline: float) -> None:
        self._event = asyncio.Event()
        self._deadline = deadline
        self._reason: Optional[Loss] = None

    def _check(self) -> None:
        if self._reason is None and time.monotonic() >= self._deadline:
            self._reason = Loss.EXPIRED
            self._event.set()

    def is_set(self) -> bool:
        self._check()
        return self._event.is_set()

    async def wait(self) -> bool:
        """Completes when the lease is lost; returns True (as
        :meth:`asyncio.Event.wait`). Bound it with ``asyncio.wait_for``."""
        while not self.is_set():
            try:
                await asyncio.wait_for(
                    self._event.wait(), max(self._deadline - time.monotonic(), 0.001)
                )
            except asyncio.TimeoutError:
                pass
        return True

    @property
    def reason(self) -> Optional[Loss]:
        self._check()
        return self._reason

    @property
    def deadline(self) -> float:
        return self._deadline

    def _extend(self, sent: float, ttl_ms: int) -> bool:
        self._check()
        if self._reason is not None:
            return False
        self._deadline = max(self._deadline, sent + ttl_ms / 1000)
        return True

    def _lose(self, reason: Loss) -> None:
        self._check()
        if self._reason is None:
            self._reason = reason
        self._event.set()


class AsyncLease(LeaseCore):
    """A held lease (async): ``token``, ``lost``, ``fence()``, ``renew()``,
    ``release()``; an async context manager that releases on exit. Its calls
    go over the client's pool; the client's watchdog task renews it."""

    def __init__(
        self, client: "AsyncLeaseClient", key: Any, owner: str, token: int, ttl_ms: int, deadline: float
    ) -> None:
        super().__init__(client, key, owner, token, ttl_ms, AsyncLossSignal(deadline))

    async def _call(self, args: Tuple[Any, ...], timeout: float, connect_timeout: Optional[float] = None) -> Any:
        """``args`` on a connection of the client's pool."""
        client = self._client
        return await client._pool.call(self.key, args, timeout, connect_timeout or client.io_timeout)

    async def fence(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:
        """``LEASE.FENCE key token [MINTTL ms] command...``: the command's
        reply, :class:`StaleToken` when the token is not current, or
        :class:`LeaseExpiring` when the lease has less than ``min_ttl_ms``
        left (nothing run in either case)."""
        return await self._call(self.fence_args(*command, min_ttl_ms=min_ttl_ms), self._client.io_timeout)

    async def renew(self) -> bool:
        """Renews now. True: renewed. False: not ours (``lost`` is set), as
        the sync :meth:`Lease.renew`."""
        renewal = self._renewal()
        if renewal is None:
            return False
        args, sent, timeout = renewal
        try:
            reply = await self._call(args, timeout)
        except exceptions.TimeoutError:
            if self.lost.is_set():
                return False
            raise
        return self._renewed(reply, sent)

    async def release(self) -> bool:
        """Gives the lease back and stops its renewals. True: it was ours. A
        lost reply is retried with the same owner. Once the lease is known
        lost it waits little, as the sync :meth:`Lease.release`."""
        first = not self._released
        plan, attempts, args = self._release_plan()
        for n, (timeout, connect_timeout) in enumerate(attempts):
            try:
                reply = await self._call(args, timeout, connect_timeout)
            except Exception as e:
                answer = release_failed(e, n, len(attempts), plan)
                if answer is not None:
                    return answer
                continue
            if reply == self._count:
                return True
            break
        if first:
            await self._release_leftovers()
        return False

    async def _release_leftovers(self) -> None:
        """A multi-key lease not all ours: the keys still ours, released one
        by one, each one short attempt (nothing for a single lease)."""
        for args in self._leftover_args():
            try:
                await self._call(args, SHORT_S, SHORT_S)
            except Exception:
                pass

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """As the sync :meth:`Lease.__exit__`: releases, and raises
        :class:`LeaseLost` when a block that ended normally lost the lease."""
        lost = self._exit_loss()
        try:
            await self.release()
        except Exception:
            if exc is None:
                raise
        if exc is None and lost is not None:
            raise LeaseLost(lost)


AL = TypeVar("AL", bound="AsyncLease")


class _LeaseContext(Generic[AL]):
    """``async with client.lease(...)`` or ``async with
    client.lease_many(...)``: acquires on entry (:class:`LeaseBusy`, saying
    ``busy``, when the lease was not obtained), releases on exit. Also
    awaitable: ``lease = await client.lease(...)``."""

    def __init__(self, acquire: Callable[[], Awaitable[Optional[AL]]], busy: str) -> None:
        self._acquire = acquire
        self._busy = busy
        self._lease: Optional[AL] = None

    async def _get(self) -> AL:
        lease = await self._acquire()
        if lease is None:
            raise LeaseBusy(self._busy)
        return lease

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._get().__await__()

    async def __aenter__(self) -> AL:
        self._lease = await self._get()
        return self._lease

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


class AsyncLeaseClient:
    """Takes leases from asyncio code; the options are those of
    :class:`redis_lease.LeaseClient`. All its leases share its connections (a
    pool per node) and one watchdog task, which renews them in batches: one
    pipeline per node each round."""

    def __init__(
        self,
        client: Union[aredis.Redis, RedisCluster],
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
        self._held: "weakref.WeakValueDictionary[Any, AsyncLease]" = weakref.WeakValueDictionary()
        self._schedule = self._shared.schedule
        self.io_timeout = io_timeout
        self.block_margin = block_margin
        self.retries = retries
        self.watchdog = watchdog
        label_bytes(label)  # TypeError now, not at the first acquire
        #: As :attr:`redis_lease.LeaseClient.label`.
        self.label: Label = label
        fresh_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: no lease held (the parent's are the
        parent's)."""
        self._held = weakref.WeakValueDictionary()

    async def close(self) -> None:
        """Closes the idle connections (leases still held keep working)."""
        await self._pool.close()

    def watchdog_stats(self) -> Dict[str, int]:
        """As :meth:`redis_lease.LeaseClient.watchdog_stats`."""
        return self._schedule.stats()

    async def waiters(self, key: Any, count: Optional[int] = None) -> List[Waiter]:
        """As :meth:`redis_lease.LeaseClient.waiters`: the clients waiting
        for ``key``, oldest first, at most ``count``."""
        args = waiters_args(key, count)
        return parse_waiters(await self._pool.call(key, args, self.io_timeout, self.io_timeout))

    async def guard(self, key: Any) -> None:
        """As :meth:`redis_lease.LeaseClient.guard`: ``key`` guards its hash
        tag (``LEASE.GUARD``); the tag's other keys are written only
        through a lease on ``key`` from now on (else :class:`Fenced`)."""
        guarded(await self._pool.call(key, guard_args(key), self.io_timeout, self.io_timeout))

    async def unguard(self, key: Any) -> bool:
        """As :meth:`redis_lease.LeaseClient.unguard`: ``key`` stops guarding
        its hash tag (``LEASE.UNGUARD``); True when it guarded."""
        return unguarded(await self._pool.call(key, unguard_args(key), self.io_timeout, self.io_timeout))

    def _label_args(self, label: Label) -> Tuple[Any, ...]:
        return label_args(label_bytes(self.label if label is DEFAULT_LABEL else label))

    def _forget(self, lease_id: int) -> None:
        self._schedule.remove(lease_id)

    def _watch(
        self,
        key: Any,
        owner: Any,
        ttl_ms: int,
        first: float,
        signal: AsyncLossSignal,
        keys: Optional[Tuple[Any, ...]] = None,
        until: Optional[float] = None,
    ) -> int:
        """Renews a lease (every key of ``keys`` for a multi-key one) from
        ``first`` on (until ``until``, when given); starts the watchdog task
        (on the running loop) when none runs."""
        lease_id, wake = self._schedule.add(key, owner, ttl_ms, first, signal, keys, until)
        self._started(wake)
        return lease_id

    def _set_until(self, lease_id: int, until: Optional[float], next_at: float) -> None:
        """A watched lease was just renewed by hand: its end and next renewal."""
        self._started(self._schedule.set_until(lease_id, until, next_at))

    def _started(self, wake: bool) -> None:
        shared = self._shared
        if shared.task is None or shared.task.done():
            shared.wake = asyncio.Event()
            shared.task = asyncio.ensure_future(self._run_watchdog())
        elif wake:
            shared.wake.set()

    async def _run_watchdog(self) -> None:
        """Sends each batch the schedule makes, one pipeline per node, and
        hands the replies back, until no lease is left."""
        conns: Dict[Any, Conn] = {}
        idle_since: Optional[float] = None
        shared = self._shared
        shared.watchdog_conns = conns
        try:
            while True:
                now = time.monotonic()
                step = self._schedule.next(now, self.io_timeout)
                if step is None:
                    # No lease left: wait a while for a new one rather than
                    # start a task for each.
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= WATCHDOG_LINGER_S:
                        return
                    # In short naps: a lease whose first renewal is due
                    # after the nap needs no wake-up.
                    self._schedule.idle_until(now + IDLE_NAP_S)
                    step = now + IDLE_NAP_S
                else:
                    idle_since = None
                if not isinstance(step, Batch):
                    shared.wake.clear()
                    try:
                        await asyncio.wait_for(shared.wake.wait(), max(step - now, 0.001))
                    except asyncio.TimeoutError:
                        pass
                    continue
                replies, pipelines = await self._send(step, conns)
                self._schedule.settle(step, replies, pipelines)
        finally:
            for conn in conns.values():
                await _close(conn)

    async def _send(self, batch: Batch, conns: Dict[Any, Conn]) -> Tuple[List[Any], int]:
        """The renewals of ``batch``, one pipeline per node (all nodes at
        once), on the watchdog's own connections."""
        by_node: Dict[Any, List[int]] = {}
        for n, key in enumerate(batch.keys):
            by_node.setdefault(self._target.node(key), []).append(n)
        replies: List[Any] = [None] * len(batch.ids)
        end = batch.sent + batch.timeout

        async def one(node: Any, indexes: List[int]) -> None:
            conn = conns.get(node)
            try:
                if conn is None:
                    conn = conns[node] = await self._target.connect(
                        batch.keys[indexes[0]], max(end - time.monotonic(), 0.001)
                    )
                got = await _pipeline(conn, [batch.args[n] for n in indexes], max(end - time.monotonic(), 0.001))
            except Exception:
                await _close(conns.pop(node, None))
                return
            for n, reply in zip(indexes, got):
                replies[n] = reply
            if any(isinstance(r, (exceptions.MovedError, exceptions.AskError)) for r in got):
                await self._target.refresh()

        await asyncio.gather(*(one(node, idx) for node, idx in by_node.items()))
        return replies, len(by_node)

    async def acquire(
        self,
        key: Any,
        ttl_ms: int,
        block_ms: Optional[int] = None,
        *,
        shared: bool = False,
        limit: Optional[int] = None,
        label: Label = DEFAULT_LABEL,
    ) -> Optional[AsyncLease]:
        """As :meth:`redis_lease.LeaseClient.acquire`."""
        check_ttl(ttl_ms, block_ms)
        mode = mode_args(shared, limit)
        labelled = self._label_args(label)
        self._check_held((key,))
        owner = new_owner()
        return await self._acquire(
            key,
            key,
            block_ms,
            lambda wait_until: acquire_args(
                key, owner, ttl_ms, block_ms, wait_until, self.io_timeout, self.block_margin, mode, labelled
            ),
            lambda token, sent, conn: self._start(key, owner, token, ttl_ms, sent, conn),
            (key,),
        )

    async def acquire_many(
        self, keys: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> Optional["AsyncMultiLease"]:
        """As :meth:`redis_lease.LeaseClient.acquire_many`: every key of
        ``keys`` or none, under one token."""
        keys = checked_keys(keys, ttl_ms, block_ms, isinstance(self._target.client, RedisCluster))
        labelled = self._label_args(label)
        self._check_held(keys)
        owner = new_owner()
        lease = await self._acquire(
            keys[0],
            keys,
            block_ms,
            lambda wait_until: macquire_args(
                keys, owner, ttl_ms, block_ms, wait_until, self.io_timeout, self.block_margin, labelled
            ),
            lambda token, sent, conn: self._start_many(keys, owner, token, ttl_ms, sent, conn),
            keys,
        )
        assert lease is None or isinstance(lease, AsyncMultiLease)
        return lease

    def _check_held(self, keys: Tuple[Any, ...]) -> None:
        for key in keys:
            if still_held(self._held.get(key)):
                raise AlreadyHeld(key)

    async def _acquire(
        self,
        route: Any,
        what: Any,
        block_ms: Optional[int],
        attempt: Callable[[Optional[float]], Tuple[Tuple[Any, ...], Optional[float]]],
        start: Callable[[int, float, Conn], Awaitable[AsyncLease]],
        keys: Tuple[Any, ...],
    ) -> Optional[AsyncLease]:
        """As the sync client's ``_acquire``."""
        wait_until = None if not block_ms else time.monotonic() + block_ms / 1000
        attempts = Attempts(self.retries)
        while True:
            args, timeout = attempt(wait_until)
            conn = node = None
            try:
                node, conn = await self._pool.take(route, self.io_timeout)
                sent = time.monotonic()
                token = await _call(conn, args, timeout)
            except Exception as e:
                if conn is not None and _answered(e):
                    # An error reply (WRONGTYPE, a ttl out of range): the
                    # connection is fine.
                    await self._pool.give(node, conn)
                    assert isinstance(e, exceptions.ResponseError)
                    raise check_stale(e) from None
                await _close(conn)
                step = attempts.after(e)
                if step is None:
                    raise
                pause, refresh = step
                if refresh:
                    await self._target.refresh()
                await asyncio.sleep(pause)
                continue
            except BaseException:
                await _close(conn)
                raise
            try:
                if token is None:
                    grace = await _grace(conn, self.io_timeout)
                    if grace is not None:
                        raise LeaseGrace(what, *grace)
                    return None
                lease = await start(int(token), sent, conn)
            finally:
                await self._pool.give(node, conn)
            for key in keys:
                self._held[key] = lease
            return lease

    async def _start(
        self, key: Any, owner: str, token: int, ttl_ms: int, sent: float, conn: Conn
    ) -> AsyncLease:
        renewed = reply = None
        if needs_fresh_renewal(sent, ttl_ms):
            renewed = time.monotonic()
            try:
                reply = await _call(conn, ("LEASE.RENEW", key, owner, ttl_ms), self.io_timeout)
            except Exception:
                pass
        deadline, refused = deadline_after(sent, ttl_ms, renewed, reply)
        lease = AsyncLease(self, key, owner, token, ttl_ms, deadline)
        if refused:
            lease.lost._lose(Loss.REFUSED)
        return lease

    async def _start_many(
        self, keys: Tuple[Any, ...], owner: str, token: int, ttl_ms: int, sent: float, conn: Conn
    ) -> "AsyncMultiLease":
        renewed = reply = None
        if needs_fresh_renewal(sent, ttl_ms):
            renewed = time.monotonic()
            try:
                reply = await _call(conn, mrenew_args(keys, owner, ttl_ms), self.io_timeout)
            except Exception:
                pass
        deadline, refused = deadline_after(sent, ttl_ms, renewed, reply, len(keys))
        lease = AsyncMultiLease(self, keys, owner, token, ttl_ms, deadline)
        if refused:
            lease.lost._lose(Loss.REFUSED)
        return lease

    def lease(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, **mode: Any
    ) -> "_LeaseContext[AsyncLease]":
        """``async with client.lease(key, ttl_ms, block_ms) as lease:``
        acquires (raising :class:`LeaseBusy` when it cannot) and releases on
        exit, also when the block raises or is cancelled."""
        return _LeaseContext(
            lambda: self.acquire(key, ttl_ms, block_ms, **mode), f"{key!r} is held by another owner"
        )

    async def run(
        self,
        key: Any,
        ttl_ms: int,
        work: Callable[[AsyncLease], Awaitable[T]],
        block_ms: Optional[int] = None,
        **mode: Any,
    ) -> T:
        """Awaits ``work(lease)`` holding the lease, releases it however
        ``work`` ends, and returns its result."""
        async with self.lease(key, ttl_ms, block_ms, **mode) as lease:
            return await work(lease)

    def lease_many(
        self, keys: Any, ttl_ms: int, block_ms: Optional[int] = None, *, label: Label = DEFAULT_LABEL
    ) -> "_LeaseContext[AsyncMultiLease]":
        """``async with client.lease_many(keys, ttl_ms, block_ms) as lease:``
        holds every key of ``keys`` at once (:meth:`acquire_many`), raising
        :class:`LeaseBusy` when they were not obtained, and releases them on
        exit (also awaitable)."""
        return _LeaseContext(
            lambda: self.acquire_many(keys, ttl_ms, block_ms, label=label),
            f"{tuple(keys)!r}: some key is held by another owner",
        )

    async def run_many(
        self,
        keys: Any,
        ttl_ms: int,
        work: Callable[["AsyncMultiLease"], Awaitable[T]],
        block_ms: Optional[int] = None,
        *,
        label: Label = DEFAULT_LABEL,
    ) -> T:
        """Awaits ``work(lease)`` holding every key of ``keys``, releases them
        however ``work`` ends, and returns its result."""
        async with self.lease_many(keys, ttl_ms, block_ms, label=label) as lease:
            return await work(lease)


class AsyncMultiLease(MultiLeaseCore, AsyncLease):
    """A lease on several keys taken together (asyncio), as
    :class:`redis_lease.MultiLease`: ``keys``, ``token``, ``lost``,
    ``await fence(key, *command)``, ``await renew()``, ``await release()``;
    an async context manager that releases every key on exit."""

    def __init__(
        self, client: "AsyncLeaseClient", keys: Tuple[Any, ...], owner: str, token: int, ttl_ms: int, deadline: float
    ) -> None:
        MultiLeaseCore.__init__(self, client, keys, owner, token, ttl_ms, AsyncLossSignal(deadline))

    async def fence(self, key: Any, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:  # type: ignore[override]  # its key comes first: not a drop-in for a Lease's
        """``LEASE.FENCE key token [MINTTL ms] command...`` on ``key``, one
        of the lease's keys: the command's reply, :class:`StaleToken` or
        :class:`LeaseExpiring` when refused (nothing run), ``ValueError``
        (nothing sent) for a key not of the lease."""
        return await self._call(self.fence_args(key, *command, min_ttl_ms=min_ttl_ms), self._client.io_timeout)

    async def __aenter__(self) -> "AsyncMultiLease":
        return self


def _answered(e: BaseException) -> bool:
    """An error reply to a call that reached the server, other than a
    cluster redirection: the connection stays usable."""
    return isinstance(e, exceptions.ResponseError) and not isinstance(
        e, (exceptions.MovedError, exceptions.AskError, exceptions.TryAgainError)
    )


# The drop-in for redis.asyncio.lock.Lock: ``from redis_lease.aio import Lock``.
from ._alock import Lock  # noqa: E402
