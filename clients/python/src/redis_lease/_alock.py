"""The asyncio drop-in for :class:`redis.asyncio.lock.Lock`, exported as
:class:`redis_lease.aio.Lock`. The same rules as the sync
:class:`redis_lease.Lock` (see ``lock.py``), with asyncio I/O."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from types import SimpleNamespace, TracebackType
from typing import Any, Awaitable, Dict, Optional, Tuple, Type, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from ._common import DEFAULT_LABEL, Label, LeaseGrace, Loss, acquire_args, label_args, label_bytes, renew_every
from ._compat import lock_error
from .aio import AsyncLease, AsyncLeaseClient, AsyncLossSignal
from .lock import (
    Number,
    _Hold,
    _info_token,
    _info_ttl,
    _forget,
    _Local,
    block_ms_of,
    default_token,
    encode_token,
    extend_ms,
    lease_ms,
    max_ttl_of,
    stop_of,
    wrong_type,
)

logger = logging.getLogger(__name__)


def _lock_client(redis: Any) -> AsyncLeaseClient:
    client: Optional[AsyncLeaseClient] = redis.__dict__.get("_redis_lease_lock_client")
    if client is None:
        client = redis.__dict__["_redis_lease_lock_client"] = AsyncLeaseClient(redis, watchdog=False)
    return client


def _check_async(redis: Any) -> None:
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    if not isinstance(redis, (aredis.Redis, AsyncCluster)):
        raise TypeError(
            "redis_lease.aio.Lock takes a redis.asyncio client (Redis or RedisCluster); "
            "for a sync client use redis_lease.Lock"
        )


class Lock:
    """``Lock(redis, name, timeout=None, sleep=0.1, blocking=True,
    blocking_timeout=None, thread_local=True, raise_on_release_error=True,
    *, label=DEFAULT_LABEL)``:
    redis-py's :class:`redis.asyncio.lock.Lock` on ``LEASE.*`` commands, for
    a :class:`redis.asyncio.Redis` or :class:`redis.asyncio.cluster.RedisCluster`.
    What differs on purpose from redis-py is what differs for the sync
    :class:`redis_lease.Lock`."""

    lua_release = None
    lua_extend = None
    lua_reacquire = None

    def __init__(
        self,
        redis: Any,
        name: Any,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        label: Label = DEFAULT_LABEL,
    ) -> None:
        _check_async(redis)
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        label_bytes(label)  # TypeError now, not at the first acquire
        #: The label of this lock's acquires (``LABEL``): a text, None for
        #: none, or DEFAULT_LABEL, this process's default label.
        self.label: Label = label
        self.local: Any = _Local() if self.thread_local else SimpleNamespace(token=None)
        self._client = _lock_client(redis)
        self._holds: Dict[bytes, _Hold] = {}
        self._pause: Optional[float] = None

    def register_scripts(self) -> None:
        """redis-py's hook: no scripts here (the commands are native)."""

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise lock_error(LockError, "Unable to acquire lock within the time specified", self.name)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
        *,
        sleep: Optional[Number] = None,
    ) -> bool:
        """As :meth:`redis_lease.Lock.acquire` (``sleep`` keyword-only, as in
        redis-py 8.2's asyncio Lock; before 8.2, redis-py's took none)."""
        if sleep is None:
            sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        owner = default_token() if token is None else encode_token(self.redis, token)
        stop = stop_of(blocking_timeout)
        for _ in range(1_000_000):
            if await self.do_acquire(owner, block_ms_of(blocking, stop)):
                self.local.token = owner
                return True
            pause = self._pause
            if not blocking or pause is None:
                return False
            now = time.monotonic()
            if stop is not None:
                if pause == sleep and now + pause > stop:
                    return False
                pause = min(pause, stop - now)
                if pause <= 0:
                    return False
            await asyncio.sleep(pause)
        return False

    async def do_acquire(self, token: bytes, block_ms: Optional[int] = None) -> bool:
        self._pause = None
        client = self._client
        for _ in range(3):
            ttl, length = lease_ms(self.timeout, client._shared.max_ttl_ms)
            try:
                lease = await self._once(token, ttl, block_ms)
            except LeaseGrace as grace:
                self._pause = grace.remaining_ms / 1000
                return False
            except ResponseError as e:
                if wrong_type(e):
                    self._pause = self.sleep
                    return False
                cap = max_ttl_of(e)
                if cap is None:
                    raise
                old = client._shared.max_ttl_ms
                client._shared.max_ttl_ms = cap if old is None else min(old, cap)
                continue
            if lease is None:
                return False
            self._held(token, lease, ttl, length)
            return True
        raise lock_error(LockError, "the server refused every lease length", self.name)

    async def _once(self, owner: bytes, ttl: int, block_ms: Optional[int]) -> Optional[AsyncLease]:
        client, key = self._client, self.name
        labelled = label_args(label_bytes(self.label))
        return await client._acquire(
            key,
            key,
            block_ms,
            lambda wait_until: acquire_args(
                key, owner, ttl, block_ms, wait_until, client.io_timeout, client.block_margin, (), labelled  # type: ignore[arg-type]
            ),
            lambda t, sent, conn: client._start(key, owner, t, ttl, sent, conn),  # type: ignore[arg-type]
            (),
        )

    def _held(self, owner: bytes, lease: AsyncLease, ttl: int, length: Optional[int]) -> None:
        sent = lease.lost.deadline - ttl / 1000
        until = None if length is None else sent + length / 1000
        if length is None or length > ttl:
            self._watch(lease, until)
        if len(self._holds) >= 8:
            for o in [o for o, h in self._holds.items() if h.lease.lost.is_set()]:
                del self._holds[o]
        self._holds[owner] = _Hold(lease, until)

    def _watch(self, lease: AsyncLease, until: Optional[float], ttl: Optional[int] = None) -> None:
        client = self._client
        length = ttl or lease.ttl_ms
        first = lease.lost.deadline - length / 1000 + renew_every(length)
        lease._watched = client._watch(lease.key, lease._owner, length, first, lease.lost, None, until)
        weakref.finalize(lease, client._schedule.gone.append, lease._watched)

    async def locked(self) -> bool:
        """Is the lock held by anyone (a key of another type counts)? A
        free guard is not held (as the sync one's)."""
        try:
            return _info_token(await self._call(("LEASE.INFO", self.name))) is not None
        except ResponseError as e:
            if wrong_type(e):
                return True
            raise

    async def owned(self) -> bool:
        """Is the lock held by this Lock? Asked of the server."""
        owner = self.local.token
        hold = None if owner is None else self._holds.get(owner)
        if hold is None or hold.lease._released:
            return False
        try:
            info = await self._call(("LEASE.INFO", self.name))
        except ResponseError as e:
            if wrong_type(e):
                return False
            raise
        return bool(_info_token(info) == hold.lease.token)

    async def release(self) -> None:
        """Gives the lock back: ``LockError`` when not held by this Lock,
        ``LockNotOwnedError`` when it was lost meanwhile."""
        owner = self.local.token
        if owner is None:
            raise lock_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        try:
            await self.do_release(owner)
        except LockNotOwnedError:
            _forget(self.local, owner)
            raise
        _forget(self.local, owner)

    async def do_release(self, expected_token: Any) -> None:
        owner = encode_token(self.redis, expected_token)
        hold = self._holds.pop(owner, None)
        try:
            if hold is not None:
                ok = await hold.lease.release()
            else:
                ok = await self._call(("LEASE.RELEASE", self.name, owner)) == 1
        except ResponseError as e:
            if not wrong_type(e):
                raise
            ok = False
        if not ok:
            raise lock_error(LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Awaitable[bool]:
        """As :meth:`redis_lease.Lock.extend` (awaitable)."""
        if self.local.token is None:
            raise lock_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a lock with no timeout", self.name)
        return self.do_extend(additional_time, replace_ttl)

    async def do_extend(self, additional_time: Number, replace_ttl: bool) -> bool:
        owner = self.local.token
        hold = self._holds.get(owner)
        if hold is not None and hold.until is None:
            raise lock_error(LockNotOwnedError, "Cannot extend a lock with no expiry", self.name)
        now = time.monotonic()
        if replace_ttl:
            left = extend_ms(additional_time)
        elif hold is not None and hold.lease._watched is not None:
            left = math.floor((max(hold.until or now, now) - now) * 1000) + extend_ms(additional_time)
        else:
            left = _info_ttl(await self._info_or_none()) + extend_ms(additional_time)
        if left <= 0:
            return True
        return await self._move_end(owner, now + left / 1000, "extend", left)

    def reacquire(self) -> Awaitable[bool]:
        """Resets the time left to ``timeout`` (awaitable)."""
        if self.local.token is None:
            raise lock_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        return self.do_reacquire()

    async def do_reacquire(self) -> bool:
        owner = self.local.token
        hold = self._holds.get(owner)
        left = extend_ms(self.timeout or 0)
        if left <= 0 or (hold is not None and hold.until is None):
            return True
        return await self._move_end(owner, time.monotonic() + left / 1000, "reacquire", left)

    @property
    def token(self) -> Optional[int]:
        """The fencing token of this acquisition (None when not held)."""
        lease = self._lease
        return None if lease is None else lease.token

    @property
    def lost(self) -> Optional[AsyncLossSignal]:
        lease = self._lease
        return None if lease is None else lease.lost

    async def fence(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:
        lease = self._lease
        if lease is None:
            raise lock_error(LockError, "Cannot fence with an unlocked lock", self.name)
        return await lease.fence(*command, min_ttl_ms=min_ttl_ms)

    @property
    def _lease(self) -> Optional[AsyncLease]:
        owner = self.local.token
        hold = None if owner is None else self._holds.get(owner)
        return None if hold is None else hold.lease

    async def _call(self, args: Tuple[Any, ...]) -> Any:
        client = self._client
        return await client._pool.call(self.name, args, client.io_timeout, client.io_timeout)

    async def _info_or_none(self) -> Any:
        try:
            return await self._call(("LEASE.INFO", self.name))
        except ResponseError as e:
            if wrong_type(e):
                return None
            raise

    async def _move_end(self, owner: Any, until: float, what: str, left_ms: Optional[int] = None) -> bool:
        hold = self._holds.get(owner)
        lease: Optional[AsyncLease] = None if hold is None else hold.lease
        shared = self._client._shared
        reply: Any = 0
        now = time.monotonic()
        left = ttl = 1
        for _ in range(3):
            now = time.monotonic()
            left = left_ms if left_ms is not None else max(math.ceil((until - now) * 1000), 1)
            length = shared.max_ttl_ms
            ttl = left if length is None else min(left, length)
            try:
                reply = await self._call(("LEASE.RENEW", self.name, owner, ttl))
            except ResponseError as e:
                cap = max_ttl_of(e)
                if cap is not None:
                    shared.max_ttl_ms = cap if shared.max_ttl_ms is None else min(shared.max_ttl_ms, cap)
                    continue
                if not wrong_type(e):
                    raise
                reply = 0
            break
        if reply != 1:
            if lease is not None:
                lease.lost._lose(Loss.REFUSED)
            raise lock_error(LockNotOwnedError, f"Cannot {what} a lock that's no longer owned", self.name)
        if lease is not None and hold is not None:
            lease.lost._deadline = now + ttl / 1000
            hold.until = until
            next_at = now + renew_every(lease.ttl_ms)
            if lease._watched is not None:
                self._client._set_until(lease._watched, until, next_at)
            elif left > ttl:
                self._watch(lease, until, ttl)
        return True

