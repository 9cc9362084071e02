"""A drop-in for redis-py's :class:`redis.lock.Lock` on the lease module (the
asyncio one, for :class:`redis.asyncio.lock.Lock`, is
:class:`redis_lease.aio.Lock`).

Change one import::

    from redis_lease import Lock          # instead of: from redis.lock import Lock

    lock = Lock(r, "resource", timeout=10, blocking_timeout=5)
    with lock:
        lock.fence("SET", "out", "v")     # new: refused once the lock is not ours
        lock.token                        # new: the fencing token

or switch every ``r.lock(...)`` call site of a client at once with
:func:`redis_lease.use_lease_locks`.

Everything redis-py's ``Lock`` documents behaves the same (its arguments,
``acquire``, ``release``, ``extend``, ``reacquire``, ``locked``, ``owned``,
``local.token``, the context manager and the exceptions ``LockError`` and
``LockNotOwnedError``), with these differences on purpose:

- A lock held by another lease is waited for on the server (``BLOCK``: first
  come, first served, handed over at the release), not by polling: ``sleep``
  only paces the polling of a name held by a key of another type (a
  redis-py ``Lock`` of an old process during a rolling switch: it counts as
  held by someone else, in every method).
- Any ``timeout``: the server lease is at most the server's
  ``lease.max-ttl-ms`` long, and renewed until ``timeout`` after the acquire
  (``extend`` and ``reacquire`` move that end). A live holder keeps the lock
  for ``timeout``, as in redis-py; one that dies frees it within one lease.
- ``timeout=None`` (no expiry in redis-py) is a lease of
  :data:`NO_TIMEOUT_TTL_MS` renewed for as long as the lock is held, so a
  holder that dies frees it within that time instead of never.
- ``owned()`` knows the acquisitions of this ``Lock`` object (any thread's,
  also one handed over through ``local.token``); for an owner id taken
  elsewhere it answers False.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
import weakref
from types import SimpleNamespace, TracebackType
from typing import Any, Dict, Optional, Tuple, Type, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from ._common import DEFAULT_LABEL, FOREVER, Label, LeaseGrace, Loss, acquire_args, label_args, label_bytes, renew_every
from ._compat import lock_error
from ._sync import Lease, LeaseClient, LossSignal

Number = Union[int, float]
logger = logging.getLogger(__name__)

#: The lease behind a lock made with ``timeout=None``: renewed by the
#: watchdog while held; after a crash the lock frees itself this long after
#: the last renewal (or sooner: never longer than ``lease.max-ttl-ms``).
NO_TIMEOUT_TTL_MS = 30_000

_OUT_OF_RANGE = re.compile(r"ttl-ms is out of range \(must be 1\.\.(\d+)\)")


def _ms(seconds: Number) -> int:
    return max(int(seconds * 1000), 1)


def wrong_type(e: BaseException) -> bool:
    """A ``WRONGTYPE`` reply: the name is held by a key of another type (a
    redis-py lock's string, say), which counts as held by someone else."""
    return isinstance(e, ResponseError) and str(e).startswith("WRONGTYPE")


def max_ttl_of(e: BaseException) -> Optional[int]:
    """The server's ``lease.max-ttl-ms`` from the refusal of a longer ttl."""
    m = _OUT_OF_RANGE.search(str(e)) if isinstance(e, ResponseError) else None
    return int(m.group(1)) if m else None


def encode_token(redis: Any, token: Union[str, bytes, Any]) -> bytes:
    """A token given by the caller as redis-py encodes it (the owner id)."""
    if isinstance(token, bytes):
        return token
    for get in ("get_encoder", "connection_pool.get_encoder"):
        obj: Any = redis
        try:
            for part in get.split("."):
                obj = getattr(obj, part)
            out = obj().encode(token)
            if isinstance(out, bytes):
                return out
        except Exception:
            continue
    return str(token).encode()


def stop_of(blocking_timeout: Optional[Number]) -> Optional[float]:
    """When an acquire stops waiting (monotonic; None: never): as redis-py's
    Lock, never past ``blocking_timeout``, so the wait on the server ends a
    margin before it for its reply to be back by then (a tenth of it, at
    least 10 ms and at most 50 ms)."""
    if blocking_timeout is None:
        return None
    margin = min(max(blocking_timeout * 0.1, 0.01), 0.05)
    return time.monotonic() + blocking_timeout - margin


def block_ms_of(blocking: bool, stop: Optional[float]) -> Optional[int]:
    """The ``BLOCK`` of one acquire: none without blocking or with nothing
    left before ``stop``, for ever without a stop, else what is left."""
    if not blocking:
        return None
    if stop is None:
        return FOREVER
    left = math.floor((stop - time.monotonic()) * 1000)
    return left if left > 0 else None


def default_token() -> bytes:
    """A new owner id where the caller gives none: a random UUID (version
    4) as 32 hex digits, as redis-py's Lock makes its token."""
    return uuid.uuid4().hex.encode()


def extend_ms(additional_time: Number) -> int:
    """``extend``'s time in ms, truncated as redis-py does."""
    return int(additional_time * 1000)


def lease_ms(timeout: Optional[Number], cap: Optional[int]) -> Tuple[int, Optional[int]]:
    """``(server lease ms, lock length ms or None for no timeout)``: the
    lease is the lock's length, at most the server's ``cap`` when known."""
    if not timeout:
        return (NO_TIMEOUT_TTL_MS if cap is None else min(NO_TIMEOUT_TTL_MS, cap)), None
    ms = _ms(timeout)
    return (ms if cap is None else min(ms, cap)), ms


class _Local(threading.local):
    #: redis-py's owner token of this thread's acquisition (bytes).
    token: Optional[bytes] = None


class _Hold:
    """One acquisition of a Lock: its lease and the lock's end (monotonic;
    None: no timeout)."""

    __slots__ = ("lease", "until")

    def __init__(self, lease: Any, until: Optional[float]) -> None:
        self.lease = lease
        self.until = until


def _lock_client(redis: Any) -> LeaseClient:
    """The LeaseClient every Lock of ``redis`` uses (no watchdog of its own:
    a Lock registers what it needs): it shares the pool and the watchdog of
    every LeaseClient of ``redis``."""
    client: Optional[LeaseClient] = redis.__dict__.get("_redis_lease_lock_client")
    if client is None:
        client = redis.__dict__["_redis_lease_lock_client"] = LeaseClient(redis, watchdog=False)
    return client


def _check_sync(redis: Any) -> None:
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    if isinstance(redis, (aredis.Redis, AsyncCluster)):
        raise TypeError(
            "redis_lease.Lock takes a sync client (redis.Redis or RedisCluster); "
            "for redis.asyncio use redis_lease.aio.Lock"
        )


class Lock:
    """``Lock(redis, name, timeout=None, sleep=0.1, blocking=True,
    blocking_timeout=None, thread_local=True, raise_on_release_error=True,
    *, label=DEFAULT_LABEL)``:
    redis-py's ``Lock`` on ``LEASE.*`` commands. ``redis`` is a
    :class:`redis.Redis` or a :class:`redis.cluster.RedisCluster`."""

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
        _check_sync(redis)
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
        #: Every acquisition not released yet, by owner id (all threads).
        self._holds: Dict[bytes, _Hold] = {}
        self._holds_lock = threading.Lock()

    def register_scripts(self) -> None:
        """redis-py's hook: no scripts here (the commands are native)."""

    # -- what redis-py's Lock has -------------------------------------------

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise lock_error(LockError, "Unable to acquire lock within the time specified", self.name)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """True once the lock is ours; False when it could not be taken
        (``blocking=False``, or ``blocking_timeout`` seconds passed). The wait
        for a lock held by another lease is the server's ``BLOCK`` (first come,
        first served); a name held by a key of another type is tried again
        every ``sleep`` seconds, as redis-py does. ``token`` is the owner id
        to use (random by default); ``local.token`` holds it."""
        if sleep is None:
            sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        owner = default_token() if token is None else encode_token(self.redis, token)
        stop = stop_of(blocking_timeout)
        # Bounded: each round waits (the server's BLOCK, a sleep or a grace).
        for _ in range(1_000_000):
            block_ms = block_ms_of(blocking, stop)
            if self.do_acquire(owner, block_ms):
                self.local.token = owner
                return True
            pause = self._pause
            if not blocking or pause is None:
                return False
            now = time.monotonic()
            if stop is not None:
                if pause == sleep and now + pause > stop:
                    return False  # redis-py's rule for its sleep
                pause = min(pause, stop - now)
                if pause <= 0:
                    return False
            time.sleep(pause)
        return False

    def do_acquire(self, token: bytes, block_ms: Optional[int] = None) -> bool:
        """One ``LEASE.ACQUIRE`` (waiting ``block_ms``): True when taken.
        Else ``_pause`` says how long to wait before the next try (None:
        the server's wait ran out)."""
        self._pause: Optional[float] = None
        client = self._client
        for _ in range(3):
            ttl, length = lease_ms(self.timeout, client._shared.max_ttl_ms)
            try:
                lease = self._once(token, ttl, block_ms)
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
                # Not waited (no blocking): held. Waited: the wait ran out.
                self._pause = None
                return False
            self._held(token, lease, ttl, length)
            return True
        raise lock_error(LockError, "the server refused every lease length", self.name)

    def _once(self, owner: bytes, ttl: int, block_ms: Optional[int]) -> Optional[Lease]:
        """One acquire, through the client's loop (a lost reply retried with
        the same owner)."""
        client, key = self._client, self.name
        labelled = label_args(label_bytes(self.label))
        return client._acquire(
            key,
            key,
            block_ms,
            lambda wait_until: acquire_args(
                key, owner, ttl, block_ms, wait_until, client.io_timeout, client.block_margin, (), labelled  # type: ignore[arg-type]
            ),
            lambda t, sent, conn: client._start(key, owner, t, ttl, sent, conn),  # type: ignore[arg-type]
            (),
        )

    def _held(self, owner: bytes, lease: Lease, ttl: int, length: Optional[int]) -> None:
        """Keeps a new acquisition; watched when the lock outlasts its lease."""
        sent = lease.lost.deadline - ttl / 1000
        until = None if length is None else sent + length / 1000
        if length is None or length > ttl:
            self._watch(lease, until)
        with self._holds_lock:
            if len(self._holds) >= 8:
                for o in [o for o, h in self._holds.items() if h.lease.lost.is_set()]:
                    del self._holds[o]
            self._holds[owner] = _Hold(lease, until)

    def _watch(self, lease: Lease, until: Optional[float], ttl: Optional[int] = None) -> None:
        """Renews ``lease`` (``ttl`` each time, its own by default) until
        ``until`` (None: for as long as it is held)."""
        client = self._client
        length = ttl or lease.ttl_ms
        first = lease.lost.deadline - length / 1000 + renew_every(length)
        lease._watched = client._watch(lease.key, lease._owner, length, first, lease.lost, None, until)
        weakref.finalize(lease, client._schedule.gone.append, lease._watched)

    def locked(self) -> bool:
        """Is the lock held by anyone (a key of another type counts)? A
        guard nobody holds (design.md S12) is not held: its ``LEASE.INFO``
        has no token."""
        try:
            return _info_token(self._call(("LEASE.INFO", self.name))) is not None
        except ResponseError as e:
            if wrong_type(e):
                return True
            raise

    def owned(self) -> bool:
        """Is the lock held by this Lock (this thread's acquisition, with
        ``thread_local``)? Asked of the server."""
        owner = self.local.token
        if owner is None:
            return False
        hold = self._holds.get(owner)
        if hold is None or hold.lease._released:
            return False
        try:
            info = self._call(("LEASE.INFO", self.name))
        except ResponseError as e:
            if wrong_type(e):
                return False
            raise
        return bool(_info_token(info) == hold.lease.token)

    def release(self) -> None:
        """Gives the lock back. ``LockError`` when it is not held by this
        Lock; ``LockNotOwnedError`` when it was lost meanwhile."""
        owner = self.local.token
        if owner is None:
            raise lock_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        try:
            self.do_release(owner)
        except LockNotOwnedError:
            _forget(self.local, owner)
            raise
        _forget(self.local, owner)

    def do_release(self, expected_token: Any) -> None:
        owner = encode_token(self.redis, expected_token)
        with self._holds_lock:
            hold = self._holds.pop(owner, None)
        try:
            if hold is not None:
                ok = hold.lease.release()
            else:
                ok = self._call(("LEASE.RELEASE", self.name, owner)) == 1
        except ResponseError as e:
            if not wrong_type(e):
                raise
            ok = False
        if not ok:
            raise lock_error(LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Adds ``additional_time`` seconds to the time left (or, with
        ``replace_ttl``, makes it the time left): any length, renewed past
        the server's ``lease.max-ttl-ms``."""
        if self.local.token is None:
            raise lock_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a lock with no timeout", self.name)
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> bool:
        owner = self.local.token
        hold = self._holds.get(owner)
        if hold is not None and hold.until is None:
            # As redis-py's on a lock with no expiry (timeout 0).
            raise lock_error(LockNotOwnedError, "Cannot extend a lock with no expiry", self.name)
        now = time.monotonic()
        if replace_ttl:
            left = extend_ms(additional_time)
        elif hold is not None and hold.lease._watched is not None:
            # Past one server lease: the lock's end is the client's.
            left = math.floor((max(hold.until or now, now) - now) * 1000) + extend_ms(additional_time)
        else:
            # One server lease: what it has left, as redis-py adds to PTTL.
            left = _info_ttl(self._info_or_none()) + extend_ms(additional_time)
        if left <= 0:
            return True  # redis-py 8.2: a time left <= 0 leaves the expiry as it is
        return self._move_end(owner, now + left / 1000, "extend", left)

    def reacquire(self) -> bool:
        """Resets the time left to ``timeout``."""
        if self.local.token is None:
            raise lock_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        return self.do_reacquire()

    def do_reacquire(self) -> bool:
        owner = self.local.token
        hold = self._holds.get(owner)
        left = extend_ms(self.timeout or 0)
        if left <= 0 or (hold is not None and hold.until is None):
            return True  # no expiry to reset (timeout 0), as redis-py's
        return self._move_end(owner, time.monotonic() + left / 1000, "reacquire", left)

    # -- the gains -------------------------------------------------------------

    @property
    def token(self) -> Optional[int]:
        """The fencing token of this thread's acquisition (None when not
        held). redis-py's owner token is ``local.token``."""
        lease = self._lease
        return None if lease is None else lease.token

    @property
    def lost(self) -> Optional[LossSignal]:
        """The loss signal of this acquisition (None when not held)."""
        lease = self._lease
        return None if lease is None else lease.lost

    def fence(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Any:
        """Runs ``command`` only while this acquisition's token is current
        (``LEASE.FENCE``); ``StaleToken`` otherwise, nothing run. With
        ``min_ttl_ms``, also ``LeaseExpiring`` (nothing run) when the lease
        has less than that many milliseconds left."""
        lease = self._lease
        if lease is None:
            raise lock_error(LockError, "Cannot fence with an unlocked lock", self.name)
        return lease.fence(*command, min_ttl_ms=min_ttl_ms)

    # -- helpers ---------------------------------------------------------------

    @property
    def _lease(self) -> Optional[Lease]:
        owner = self.local.token
        hold = None if owner is None else self._holds.get(owner)
        return None if hold is None else hold.lease

    def _call(self, args: Tuple[Any, ...]) -> Any:
        client = self._client
        return client._pool.call(self.name, args, client.io_timeout)

    def _info_or_none(self) -> Any:
        try:
            return self._call(("LEASE.INFO", self.name))
        except ResponseError as e:
            if wrong_type(e):
                return None
            raise

    def _move_end(self, owner: Any, until: float, what: str, left_ms: Optional[int] = None) -> bool:
        """Renews the lease so that the lock ends at ``until`` (``left_ms``
        from now, when given): a lease of the time left, at most the
        acquisition's lease length (or the server's), renewed by the
        watchdog until then."""
        hold = self._holds.get(owner)
        lease: Optional[Lease] = None if hold is None else hold.lease
        shared = self._client._shared
        for _ in range(3):
            now = time.monotonic()
            left = left_ms if left_ms is not None else max(math.ceil((until - now) * 1000), 1)
            length = shared.max_ttl_ms
            ttl = left if length is None else min(left, length)
            try:
                reply = self._call(("LEASE.RENEW", self.name, owner, ttl))
            except ResponseError as e:
                cap = max_ttl_of(e)
                if cap is not None:
                    shared.max_ttl_ms = cap if shared.max_ttl_ms is None else min(shared.max_ttl_ms, cap)
                    continue
                if not wrong_type(e):
                    raise
                reply = 0
            break
        else:
            reply = 0
        if reply != 1:
            if lease is not None:
                lease.lost._lose(Loss.REFUSED)
            raise lock_error(LockNotOwnedError, f"Cannot {what} a lock that's no longer owned", self.name)
        if lease is not None and hold is not None:
            with lease.lost._lock:
                lease.lost._deadline = now + ttl / 1000
            hold.until = until
            next_at = now + renew_every(lease.ttl_ms)
            if lease._watched is not None:
                self._client._set_until(lease._watched, until, next_at)
            elif left > ttl:
                self._watch(lease, until, ttl)
        return True


def _forget(local: Any, owner: bytes) -> None:
    """Clears ``local.token`` after a release, unless another acquirer
    stored its own meanwhile (``thread_local=False`` shares it), as
    redis-py 8.2's Lock."""
    if local.token == owner:
        local.token = None


def _fields(info: Any) -> Dict[str, Any]:
    if info is None:
        return {}
    if not isinstance(info, dict):
        info = dict(zip(info[::2], info[1::2]))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}


def _info_token(info: Any) -> Optional[int]:
    token = _fields(info).get("token")
    return None if token is None else int(token)


def _info_ttl(info: Any) -> int:
    ttl = _fields(info).get("ttl")
    return 0 if ttl is None else int(ttl)
