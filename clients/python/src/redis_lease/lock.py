"""A drop-in for redis-py's :class:`redis.lock.Lock` on the lease module.

Change one import::

    from redis_lease import Lock          # instead of: from redis.lock import Lock

    lock = Lock(r, "resource", timeout=10, blocking_timeout=5)
    with lock:
        lock.fence("SET", "out", "v")     # new: refused once the lock is not ours
        lock.token                        # new: the fencing token

Everything redis-py's ``Lock`` documents behaves the same (its arguments,
``acquire``, ``release``, ``extend``, ``reacquire``, ``locked``, ``owned``,
the context manager and the exceptions ``LockError`` and
``LockNotOwnedError``), with three gains: a server-checked fencing token,
FIFO waiting without polling (``BLOCK``; ``sleep`` is accepted and unused),
and the loss signal (``lock.lost``). ``timeout=None`` (no expiry in
redis-py) is a lease of :data:`NO_TIMEOUT_TTL_MS` renewed by a watchdog for
as long as it is held, so a holder that dies frees it within that time
instead of never.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Optional, Type, Union

from redis.exceptions import LockError, LockNotOwnedError

from ._common import FOREVER, LeaseGrace, Loss
from ._sync import Lease, LeaseClient, LossSignal

Number = Union[int, float]

#: The lease behind a lock made with ``timeout=None``: renewed by the
#: watchdog while held; after a crash the lock frees itself this long after
#: the last renewal.
NO_TIMEOUT_TTL_MS = 30_000


def _ms(seconds: Number) -> int:
    return max(int(seconds * 1000), 1)


class Lock:
    """``Lock(redis, name, timeout=None, sleep=0.1, blocking=True,
    blocking_timeout=None, thread_local=True, raise_on_release_error=True)``:
    redis-py's ``Lock`` on ``LEASE.*`` commands. ``redis`` is a
    :class:`redis.Redis` (or a ``RedisCluster``)."""

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
    ) -> None:
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local: Any = threading.local() if self.thread_local else SimpleNamespace()
        self.local.lease = None

    # -- what redis-py's Lock has -------------------------------------------

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

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

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """True once the lock is ours; False when it could not be taken
        (``blocking=False``, or ``blocking_timeout`` seconds passed). The wait
        is the server's ``BLOCK`` (first come, first served), not a loop of
        ``sleep``. ``token`` is the owner id to use (random by default)."""
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if not blocking:
            block_ms: Optional[int] = None
        elif blocking_timeout is None:
            block_ms = FOREVER
        else:
            # At least 1 ms: BLOCK 0 would wait for ever.
            block_ms = max(int(blocking_timeout * 1000), 1) if blocking_timeout > 0 else None
        ttl_ms = NO_TIMEOUT_TTL_MS if not self.timeout else _ms(self.timeout)
        # A client of its own per acquisition: another thread (or this one,
        # as with redis-py) waiting on the same Lock waits as a rival.
        client = LeaseClient(self.redis, watchdog=not self.timeout)
        owner = None
        if token is not None:
            owner = token.decode() if isinstance(token, bytes) else str(token)
        end = None if blocking_timeout is None else time.monotonic() + blocking_timeout
        # Bounded: a grace period ends, and each round waits for it or for
        # the rest of blocking_timeout.
        for _ in range(1000):
            try:
                lease = client.acquire(self.name, ttl_ms, block_ms, _owner=owner)
                break
            except LeaseGrace as grace:
                # The server's grace period (after a failover): not acquired
                # yet. Without blocking, as redis-py: False. Blocking: wait
                # it out, within blocking_timeout.
                left = None if end is None else end - time.monotonic()
                if not blocking or (left is not None and left <= 0):
                    return False
                pause = grace.remaining_ms / 1000
                time.sleep(pause if left is None else min(pause, left))
                if block_ms not in (None, FOREVER) and end is not None:
                    block_ms = max(int((end - time.monotonic()) * 1000), 1)
        else:
            return False
        if lease is None:
            return False
        self.local.lease = lease
        return True

    def locked(self) -> bool:
        """Is the lock held by anyone?"""
        return self.redis.execute_command("LEASE.INFO", self.name) is not None

    def owned(self) -> bool:
        """Is the lock held by this Lock (this thread's acquisition, with
        ``thread_local``)? Asked of the server."""
        lease = self._lease
        if lease is None or lease._released:
            return False
        return _info_token(self.redis.execute_command("LEASE.INFO", self.name)) == lease.token

    def release(self) -> None:
        """Gives the lock back. ``LockError`` when it is not held by this
        Lock; ``LockNotOwnedError`` when it was lost meanwhile."""
        lease = self._lease
        if lease is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self.name)
        self.local.lease = None
        if not lease.release():
            raise LockNotOwnedError("Cannot release a lock that's no longer owned", lock_name=self.name)

    def do_release(self, expected_token: Any) -> None:  # redis-py's hook
        self.release()

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Adds ``additional_time`` seconds to the time left (or, with
        ``replace_ttl``, makes it the time left)."""
        lease = self._held("extend")
        if replace_ttl:
            ms = _ms(additional_time)
        else:
            left = _info_ttl(self.redis.execute_command("LEASE.INFO", self.name))
            ms = max(left, 0) + _ms(additional_time)
        return self._renew(lease, ms, "extend")

    def reacquire(self) -> bool:
        """Resets the time left to ``timeout``."""
        lease = self._held("reacquire")
        return self._renew(lease, _ms(self.timeout or 0), "reacquire")

    # -- the gains -------------------------------------------------------------

    @property
    def token(self) -> Optional[int]:
        """The fencing token of this Lock's acquisition (None when not held)."""
        lease = self._lease
        return None if lease is None else lease.token

    @property
    def lost(self) -> Optional[LossSignal]:
        """The loss signal of this acquisition (None when not held)."""
        lease = self._lease
        return None if lease is None else lease.lost

    def fence(self, *command: Any) -> Any:
        """Runs ``command`` only while this acquisition's token is current
        (``LEASE.FENCE``); ``StaleToken`` otherwise, nothing run."""
        lease = self._lease
        if lease is None:
            raise LockError("Cannot fence with an unlocked lock", lock_name=self.name)
        return lease.fence(*command)

    # -- helpers ---------------------------------------------------------------

    @property
    def _lease(self) -> Optional[Lease]:
        """This thread's acquisition (with ``thread_local``), or the Lock's."""
        return getattr(self.local, "lease", None)

    def _held(self, what: str) -> Lease:
        lease = self._lease
        if lease is None:
            raise LockError(f"Cannot {what} an unlocked lock", lock_name=self.name)
        if not self.timeout:
            raise LockError(f"Cannot {what} a lock with no timeout", lock_name=self.name)
        return lease

    def _renew(self, lease: Lease, ms: int, what: str) -> bool:
        sent = time.monotonic()
        if lease._call(("LEASE.RENEW", self.name, lease._owner, ms), lease._client.io_timeout) != 1:
            lease.lost._lose(Loss.REFUSED)
            raise LockNotOwnedError(f"Cannot {what} a lock that's no longer owned", lock_name=self.name)
        lease.lost._extend(sent, ms)
        return True


def _fields(info: Any) -> dict[str, Any]:
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
