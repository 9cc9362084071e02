"""A pytest plugin that runs redis-py's own Lock tests (``tests/test_lock.py``
and ``tests/test_asyncio/test_lock.py`` of a redis-py sdist) against the
drop-ins, with only the import changed: the test modules' ``Lock`` (from
``redis.lock`` / ``redis.asyncio.lock``) becomes ``redis_lease.Lock`` /
``redis_lease.aio.Lock``. Loaded with ``-p plugin`` by ``matrix.py``.

``REDISPY_LOCK=redis-py`` keeps redis-py's Lock (the control run on the same
server); the same tests are deselected in both runs, so the counts compare.
``REDISPY_DESELECT=0`` runs the deselected tests too (``matrix.py
--no-deselect``).

The deselected tests (``DESELECT``, each with why) look at how redis-py's
Lock stores its key (a string holding the owner token, read with ``GET``;
``TTL``/``PTTL`` -1 for no expiry), which the module stores as a lease, or
at how redis-py's Lock polls (a fake clock patched into ``redis.lock``).
Every other test is kept, also those that write the key (``SET`` over it
is a key of another type: held by someone else; ``PEXPIRE`` and ``PTTL``
work on a lease key). What a deselected test checks beyond the storage is
checked on the lease by the package's own tests, named with it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import pytest

# Test names (``Class::test``, without parameters), sync and asyncio alike,
# in every redis-py version that has them; each with why, and where the
# package's own tests check the same behaviour on the lease.
DESELECT: Dict[str, str] = {
    # GET of the key == lock.local.token, TTL -1, GET None after release:
    # redis-py's string. Here: test_lock.py test_lock (locked/owned, a lease
    # renewed while held), test_compat.py test_default_token_is_a_uuid4.
    "TestLock::test_lock": "GET/TTL of the key: redis-py's string",
    # The same with acquire(token="test"). Here: test_lock.py test_lock_token
    # (the owner id given is the lease's owner: LEASE.RELEASE with it).
    "TestLock::test_lock_token": "GET/TTL of the key: redis-py's string",
    "TestLock::test_lock_token_thread_local_false": "GET/TTL of the key: redis-py's string",
    # GET of the key inside the with block. Here: test_lock.py
    # test_context_manager (locked inside, free after).
    "TestLock::test_context_manager": "GET of the key: redis-py's string",
    # redis-py 8.2: the extend/reacquire edge cases below are checked as
    # redis-py does (the error or True), then GET of the key == token and
    # PTTL -1: the string. Here: test_compat.py
    # test_extend_and_reacquire_edge_cases_as_redis_py_8 (sync and asyncio:
    # the same answers, and the lease's time left through LEASE.INFO).
    "TestLock::test_extend_lock_zero_additional_time_replace_ttl_raises_error": "GET/PTTL of the key",
    "TestLock::test_extend_lock_zero_timeout_replace_ttl_keeps_existing_ttl": "GET/PTTL of the key",
    "TestLock::test_extend_lock_negative_timeout_replace_ttl_keeps_existing_ttl": "GET/PTTL of the key",
    "TestLock::test_extend_lock_negative_additional_time_without_replace_keeps_existing_ttl": "GET/PTTL of the key",
    "TestLock::test_extend_lock_zero_timeout_without_replace_raises_error": "GET/PTTL of the key",
    "TestLock::test_reacquire_lock_zero_timeout_keeps_lock": "GET/PTTL of the key",
    # redis-py 8: its polling, under a fake clock patched into redis.lock
    # (mod_time): the sleeps it made, and that it waited blocking_timeout on
    # that clock. The drop-in waits on the server (BLOCK), not by polling, so
    # the fake clock never moves. The same tests of 4.6-7.x measure the real
    # clock and are kept (the wait ends by blocking_timeout, after more than
    # blocking_timeout less sleep); here: test_lock.py test_blocking_timeout.
    "TestLock::test_blocking_timeout": "redis-py's polling, fake clock (8.x)",
    "TestLock::test_context_manager_blocking_timeout": "redis-py's polling, fake clock (8.x)",
    "TestLock::test_acquire_sleep_overrides_constructor_sleep": "redis-py's polling, fake clock (8.x)",
    "TestLock::test_blocking_timeout_sleep_overrides_constructor_sleep": "redis-py's polling, fake clock (8.x)",
}

# Deselected only where the test takes the fake clock (8.x); the tests of
# these names in 4.6-7.x measure the real clock and are kept.
FAKE_CLOCK_ONLY = {
    "TestLock::test_blocking_timeout",
    "TestLock::test_context_manager_blocking_timeout",
}


def _name(item: Any) -> str:
    """``Class::test`` of an item, without its parameters."""
    parts = item.nodeid.split("::")
    return "::".join(parts[1:]).split("[")[0]


def _swap(module: Any) -> None:
    """The only change to redis-py's tests: their ``Lock`` is the drop-in."""
    import redis.asyncio.lock
    import redis.lock

    import redis_lease
    import redis_lease.aio

    if getattr(module, "Lock", None) is redis.lock.Lock:
        module.Lock = redis_lease.Lock
    elif getattr(module, "Lock", None) is redis.asyncio.lock.Lock:
        module.Lock = redis_lease.aio.Lock


def pytest_collection_modifyitems(config: Any, items: List[Any]) -> None:
    lease = os.environ.get("REDISPY_LOCK", "lease") == "lease"
    deselect = os.environ.get("REDISPY_DESELECT", "1") != "0"
    keep, drop = [], []
    for item in items:
        name = _name(item)
        fake_clock = "fake_lock_time" in getattr(item, "fixturenames", ())
        if deselect and name in DESELECT and (name not in FAKE_CLOCK_ONLY or fake_clock):
            drop.append(item)
            continue
        keep.append(item)
        if lease:
            _swap(item.module)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if lease:
        import redis_lease
        import redis_lease.aio

        for module in {item.module for item in keep}:
            if getattr(module, "Lock", None) not in (redis_lease.Lock, redis_lease.aio.Lock):
                raise pytest.UsageError(f"{module.__name__} has no Lock of redis-py's to swap: the drop-in is not tested")


@pytest.hookimpl(trylast=True)
def pytest_report_header(config: Any) -> str:
    import redis

    which = os.environ.get("REDISPY_LOCK", "lease")
    return f"redis-py {redis.__version__}, Lock: {'redis_lease' if which == 'lease' else 'redis-py'}"
