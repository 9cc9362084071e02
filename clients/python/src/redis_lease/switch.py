"""The switch of a client's ``r.lock(...)`` call sites: an import and the
client wrapped where it is made (``r = use_lease_locks(redis.Redis(...))``)."""

from __future__ import annotations

from typing import Any, Optional, TypeVar

C = TypeVar("C")

#: ``raise_on_release_error`` not given: not passed on (an explicit
#: ``lock_class`` of redis-py before 6.0 does not take it).
_UNSET: Any = object()


def use_lease_locks(client: C) -> C:
    """Makes ``client.lock(...)`` return the lease module's Lock instead of
    redis-py's, for this client object only, and returns the client::

        r = use_lease_locks(redis.Redis(...))            # or RedisCluster
        with r.lock("resource", timeout=10): ...         # a redis_lease.Lock

        ar = use_lease_locks(redis.asyncio.Redis(...))   # or its RedisCluster
        async with ar.lock("resource", timeout=10): ...  # a redis_lease.aio.Lock

    ``lock()`` keeps redis-py's signature and passes the lease Lock's own
    keyword options on (``label=...``); an explicit ``lock_class=`` is used
    as given. Nothing else of the client changes, and no other client
    (nothing global) is touched. Calling it twice is harmless."""
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    from .aio import Lock as AsyncLock
    from .lock import Lock

    default: Any = AsyncLock if isinstance(client, (aredis.Redis, AsyncCluster)) else Lock

    def lock(
        name: Any,
        timeout: Optional[float] = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        lock_class: Any = None,
        thread_local: bool = True,
        raise_on_release_error: bool = _UNSET,
        **lease: Any,
    ) -> Any:
        if raise_on_release_error is not _UNSET:
            lease["raise_on_release_error"] = raise_on_release_error
        return (lock_class or default)(
            client,
            name,
            timeout=timeout,
            sleep=sleep,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            **lease,
        )

    lock.__doc__ = "redis-py's ``lock()``, returning the lease module's Lock (see use_lease_locks)."
    client.lock = lock  # type: ignore[attr-defined]
    return client
