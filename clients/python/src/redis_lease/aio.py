"""The asyncio helpers, for :class:`redis.asyncio.Redis` and
:class:`redis.asyncio.cluster.RedisCluster`: the same rules as the sync ones.

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
from typing import Any, Awaitable, Callable, Optional, Tuple, Type, TypeVar, Union

import redis.asyncio as aredis
from redis import exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._common import (
    SHORT_S,
    AlreadyHeld,
    LeaseBusy,
    LeaseGrace,
    LeaseLost,
    Loss,
    ReleasePlan,
    acquire_args,
    check_stale,
    check_ttl,
    connection_kwargs,
    grace_of,
    lost_during,
    lost_reply,
    mode_args,
    new_owner,
    release_plan,
    renew_every,
    retry_pause,
    still_held,
)

__all__ = ["AsyncLeaseClient", "AsyncLease", "AsyncLossSignal"]

Conn = Any  # a redis.asyncio.connection.Connection
T = TypeVar("T")


class _Target:
    def __init__(self, client: Union[aredis.Redis, RedisCluster], io_timeout: float) -> None:
        self.client = client
        self.io_timeout = io_timeout

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
    """Is an idle connection of ours still open (nothing readable on it)?"""
    try:
        return not await conn.can_read()
    except Exception:
        return False


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


class AsyncLease:
    """A held lease (async): ``token``, ``lost``, ``fence()``, ``renew()``,
    ``release()``; an async context manager that releases on exit."""

    def __init__(
        self,
        client: "AsyncLeaseClient",
        key: Any,
        owner: str,
        token: int,
        ttl_ms: int,
        deadline: float,
        conn: Conn,
    ) -> None:
        self.key = key
        self.token: int = token
        self.ttl_ms = ttl_ms
        self.lost = AsyncLossSignal(deadline)
        self._owner = owner
        self._client = client
        self._conn: Optional[Conn] = conn
        self._lock = asyncio.Lock()
        self._released = False
        self._task: Optional["asyncio.Task[None]"] = None
        if client.watchdog:
            # The task holds no reference to the lease: a lease dropped
            # without release() is garbage-collected, which cancels it.
            self._task = asyncio.ensure_future(_watchdog(self.lost, client, key, owner, ttl_ms))
            loop = asyncio.get_running_loop()
            weakref.finalize(self, _cancel_soon, loop, self._task)

    def __repr__(self) -> str:
        return f"<AsyncLease key={self.key!r} token={self.token} lost={self.lost.reason}>"

    async def _holder_call(
        self, args: Tuple[Any, ...], timeout: float, connect_timeout: Optional[float] = None
    ) -> Any:
        async with self._lock:
            if self._conn is not None and not await _usable(self._conn):
                # Closed by the server while idle: a new connection is safe,
                # as in the sync Lease.
                conn, self._conn = self._conn, None
                await _close(conn)
            if self._conn is None:
                self._conn = await self._client._target.connect(
                    self.key, connect_timeout or self._client.io_timeout
                )
            try:
                return await _call(self._conn, args, timeout)
            except exceptions.ResponseError as e:
                raise check_stale(e) from None
            except BaseException as e:
                if lost_reply(e) or isinstance(e, asyncio.CancelledError):
                    conn, self._conn = self._conn, None
                    await _close(conn)
                raise

    async def fence(self, *command: Any) -> Any:
        """``LEASE.FENCE key token command...``: the command's reply, or
        :class:`StaleToken` when the token is not current (nothing run)."""
        return await self._holder_call(self.fence_args(*command), self._client.io_timeout)

    def fence_args(self, *command: Any) -> Tuple[Any, ...]:
        """The fenced form of ``command`` for ``execute_command``."""
        return ("LEASE.FENCE", self.key, self.token) + command

    async def renew(self) -> bool:
        """Renews now. True: renewed. False: not ours (``lost`` is set)."""
        sent = time.monotonic()
        timeout = min(max(self.lost.deadline - sent, 0.001), self._client.io_timeout)
        args = ("LEASE.RENEW", self.key, self._owner, self.ttl_ms)
        if await self._holder_call(args, timeout) == 1:
            return self.lost._extend(sent, self.ttl_ms)
        self.lost._lose(Loss.REFUSED)
        return False

    async def release(self) -> bool:
        """Gives the lease back and stops the watchdog. True: it was ours. A
        lost reply is retried with the same owner. Once the lease is known
        lost it waits little, as the sync :meth:`Lease.release`."""
        if self._released:
            return False
        self._released = True
        if self._task is not None:
            self._task.cancel()
        plan = release_plan(self.lost.reason)
        self.lost._lose(Loss.RELEASED)
        attempt = 0
        args = ("LEASE.RELEASE", self.key, self._owner)
        try:
            if plan is ReleasePlan.NONE:
                return False
            if plan is ReleasePlan.SHORT:
                try:
                    return bool(await self._holder_call(args, SHORT_S, SHORT_S) == 1)
                except Exception as e:
                    if lost_reply(e):
                        return False
                    raise
            while True:
                try:
                    return bool(await self._holder_call(args, self._client.io_timeout) == 1)
                except Exception as e:
                    if not lost_reply(e) or attempt >= self._client.retries:
                        raise
                    attempt += 1
        finally:
            conn, self._conn = self._conn, None
            await _close(conn)

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
        lost = lost_during(self.lost.reason)
        try:
            await self.release()
        except Exception:
            if exc is None:
                raise
        if exc is None and lost is not None:
            raise LeaseLost(lost)


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: "asyncio.Task[None]") -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)


async def _watchdog(lost: AsyncLossSignal, client: "AsyncLeaseClient", key: Any, owner: str, ttl_ms: int) -> None:
    """As the sync watchdog; cancelled by release()."""
    next_at = lost.deadline - ttl_ms / 1000 + renew_every(ttl_ms)
    conn: Optional[Conn] = None
    args = ("LEASE.RENEW", key, owner, ttl_ms)
    try:
        while not lost.is_set():
            now = time.monotonic()
            if now < next_at:
                await asyncio.sleep(min(next_at, lost.deadline) - now)
                continue
            timeout = min(max(lost.deadline - now, 0.001), client.io_timeout)
            try:
                if conn is None:
                    conn = await client._target.connect(key, timeout)
                reply = await _call(conn, args, timeout)
            except Exception as e:
                if lost_reply(e):
                    await _close(conn)
                    conn = None
                elif isinstance(e, (exceptions.MovedError, exceptions.AskError)):
                    await client._target.refresh()
                    await _close(conn)
                    conn = None
                next_at = time.monotonic() + retry_pause(ttl_ms)
                continue
            if reply == 1:
                if not lost._extend(now, ttl_ms):
                    return
                next_at = now + renew_every(ttl_ms)
            else:
                lost._lose(Loss.REFUSED)
                return
    finally:
        await _close(conn)


class _LeaseContext:
    """``async with client.lease(...) as lease``: acquires on entry, releases
    on exit. Also awaitable: ``lease = await client.lease(...)``."""

    def __init__(self, client: "AsyncLeaseClient", key: Any, ttl_ms: int, block_ms: Optional[int], mode: Any):
        self._args = (client, key, ttl_ms, block_ms)
        self._mode = mode
        self._lease: Optional[AsyncLease] = None

    async def _get(self) -> AsyncLease:
        client, key, ttl_ms, block_ms = self._args
        lease = await client.acquire(key, ttl_ms, block_ms, **self._mode)
        if lease is None:
            raise LeaseBusy(f"{key!r} is held by another owner")
        return lease

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._get().__await__()

    async def __aenter__(self) -> AsyncLease:
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
    :class:`redis_lease.LeaseClient`."""

    def __init__(
        self,
        client: Union[aredis.Redis, RedisCluster],
        *,
        io_timeout: float = 5.0,
        block_margin: float = 2.0,
        retries: int = 3,
        watchdog: bool = True,
    ) -> None:
        self._target = _Target(client, io_timeout)
        self._held: "weakref.WeakValueDictionary[Any, AsyncLease]" = weakref.WeakValueDictionary()
        self.io_timeout = io_timeout
        self.block_margin = block_margin
        self.retries = retries
        self.watchdog = watchdog

    async def acquire(
        self,
        key: Any,
        ttl_ms: int,
        block_ms: Optional[int] = None,
        *,
        shared: bool = False,
        limit: Optional[int] = None,
    ) -> Optional[AsyncLease]:
        """As :meth:`redis_lease.LeaseClient.acquire`."""
        check_ttl(ttl_ms, block_ms)
        mode = mode_args(shared, limit)
        mine = self._held.get(key)
        if still_held(mine):
            raise AlreadyHeld(key)
        owner = new_owner()
        wait_until = None if not block_ms else time.monotonic() + block_ms / 1000
        attempt = 0
        redirects = 0
        while True:
            args, timeout = acquire_args(
                key, owner, ttl_ms, block_ms, wait_until, self.io_timeout, self.block_margin, mode
            )
            conn = None
            try:
                conn = await self._target.connect(key, self.io_timeout)
                sent = time.monotonic()
                token = await _call(conn, args, timeout)
            except (exceptions.MovedError, exceptions.AskError, exceptions.TryAgainError):
                await _close(conn)
                redirects += 1
                if redirects > 5:
                    raise
                await self._target.refresh()
                continue
            except Exception as e:
                await _close(conn)
                if lost_reply(e) and attempt < self.retries:
                    attempt += 1
                    await asyncio.sleep(0.02 * attempt)
                    continue
                raise
            except BaseException:
                await _close(conn)
                raise
            if token is None:
                try:
                    grace = await _grace(conn, self.io_timeout)
                finally:
                    await _close(conn)
                if grace is not None:
                    raise LeaseGrace(key, *grace)
                return None
            lease = await self._start(key, owner, int(token), ttl_ms, sent, conn)
            self._held[key] = lease
            return lease

    async def _start(
        self, key: Any, owner: str, token: int, ttl_ms: int, sent: float, conn: Conn
    ) -> AsyncLease:
        deadline = sent + ttl_ms / 1000
        refused = False
        if time.monotonic() - sent >= renew_every(ttl_ms):
            renewed = time.monotonic()
            try:
                reply = await _call(conn, ("LEASE.RENEW", key, owner, ttl_ms), self.io_timeout)
                if reply == 1:
                    deadline = renewed + ttl_ms / 1000
                else:
                    refused = True
            except Exception:
                pass
        lease = AsyncLease(self, key, owner, token, ttl_ms, deadline, conn)
        if refused:
            lease.lost._lose(Loss.REFUSED)
        return lease

    def lease(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, **mode: Any
    ) -> _LeaseContext:
        """``async with client.lease(key, ttl_ms, block_ms) as lease:``
        acquires (raising :class:`LeaseBusy` when it cannot) and releases on
        exit, also when the block raises or is cancelled."""
        return _LeaseContext(self, key, ttl_ms, block_ms, mode)

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
