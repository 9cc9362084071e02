"""Issue 31: the drop-ins for both of redis-py's Lock classes against real
servers (every kind in conftest.KINDS; the cluster on the first): redis-py's
documented behaviours in the asyncio Lock and ``local.token``, the one-line
switch of ``r.lock(...)`` call sites, a rolling switch with redis-py's Lock
holding the name, timeouts past ``lease.max-ttl-ms``, and connections per
cycle. The sync Lock's other redis-py behaviours: test_lock.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.lock import Lock as AsyncRedisLock
from redis.cluster import RedisCluster
from redis.exceptions import LockError, LockNotOwnedError
from redis.lock import Lock as RedisLock

import redis_lease
from conftest import ClusterNodes, Server, aclose, lease_info, wait_until
from redis_lease import LeaseClient, Lock, use_lease_locks
from redis_lease.aio import AsyncLeaseClient
from redis_lease.aio import Lock as AsyncLock

SHORT_MAX_TTL_MS = 2000


def ttl_of(r: redis.Redis, name: str) -> int:
    info = lease_info(r, name)
    return -2 if info is None else int(info["ttl"])


def areds(server: Server) -> aredis.Redis:
    return aredis.Redis(host="127.0.0.1", port=server.port)


def connections(r: redis.Redis) -> int:
    return int(r.info("stats")["total_connections_received"])


@pytest.fixture
def short(request: Any) -> Iterator[Server]:
    """The first kind, with ``lease.max-ttl-ms`` 2000."""
    from conftest import KINDS

    s = Server(KINDS[0], ["max-ttl-ms", str(SHORT_MAX_TTL_MS)])
    yield s
    s.close()


# -- the asyncio Lock: redis-py's documented behaviours ---------------------


def test_async_lock_behaves_as_redis_py_asyncio_lock(server: Server) -> None:
    r = server.client()

    async def main() -> None:
        ar = areds(server)
        lock = AsyncLock(ar, "foo", timeout=10)
        assert not await lock.locked() and not await lock.owned()
        assert await lock.acquire(blocking=False)
        assert await lock.locked() and await lock.owned()
        assert isinstance(lock.local.token, bytes)
        assert 8000 < ttl_of(r, "foo") <= 10000
        other = AsyncLock(ar, "foo", timeout=10)
        assert not await other.owned()
        assert not await other.acquire(blocking=False)
        t0 = time.monotonic()
        assert not await other.acquire(blocking_timeout=0.2)
        assert 0.15 < time.monotonic() - t0 < 2
        # extend adds, replace_ttl sets, reacquire resets to timeout.
        assert await lock.extend(10)
        assert 16000 < ttl_of(r, "foo") <= 20000
        assert await lock.extend(5, replace_ttl=True)
        assert 3000 < ttl_of(r, "foo") <= 5000
        assert await lock.reacquire()
        assert 8000 < ttl_of(r, "foo") <= 10000
        await lock.release()
        assert not await lock.locked()
        with pytest.raises(LockError):
            await lock.release()
        with pytest.raises(LockError):
            await lock.extend(1)
        with pytest.raises(LockError):
            await lock.reacquire()
        # The context manager; LockError when it cannot be taken.
        async with AsyncLock(ar, "foo", timeout=10) as held:
            assert await held.owned()
            with pytest.raises(LockError):
                async with AsyncLock(ar, "foo", blocking=False):
                    pass
        # No longer owned: LockNotOwnedError, or a warning with
        # raise_on_release_error=False.
        lost = AsyncLock(ar, "foo", timeout=10)
        assert await lost.acquire(token="mine")
        assert lost.local.token == b"mine"
        assert r.execute_command("LEASE.RELEASE", "foo", "mine") == 1
        with pytest.raises(LockNotOwnedError):
            await lost.extend(1)
        assert await lost.acquire(token="mine")
        r.execute_command("LEASE.RELEASE", "foo", "mine")
        with pytest.raises(LockNotOwnedError):
            await lost.reacquire()
        assert await lost.acquire(token="mine")
        r.execute_command("LEASE.RELEASE", "foo", "mine")
        with pytest.raises(LockNotOwnedError):
            await lost.release()
        quiet = AsyncLock(ar, "foo", timeout=10, raise_on_release_error=False)
        async with quiet:
            r.execute_command("LEASE.RELEASE", "foo", quiet.local.token)
        # No timeout: extend and reacquire refuse, the lease is renewed.
        forever = AsyncLock(ar, "bar")
        assert await forever.acquire()
        with pytest.raises(LockError):
            await forever.extend(1)
        with pytest.raises(LockError):
            await forever.reacquire()
        await forever.release()
        await aclose(ar)

    asyncio.run(main())


def test_async_lock_waits_on_the_server_and_hands_over_at_release(server: Server) -> None:
    async def main() -> None:
        ar = areds(server)
        holder = AsyncLock(ar, "q", timeout=10)
        assert await holder.acquire()
        waiter = AsyncLock(ar, "q", timeout=10, blocking_timeout=5)
        got = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0.2)
        assert not got.done()
        t0 = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(got, 5)
        assert time.monotonic() - t0 < 0.5, "handed over at the release, not by polling"
        assert waiter.token is not None and await waiter.fence("SET", "out", "1")
        await waiter.release()
        await aclose(ar)

    asyncio.run(main())


def test_the_wrong_lock_for_the_client_is_a_type_error(server: Server) -> None:
    with pytest.raises(TypeError, match="redis_lease.aio.Lock"):
        Lock(areds(server), "foo")
    with pytest.raises(TypeError, match="redis_lease.Lock"):
        AsyncLock(server.client(), "foo")


# -- local.token and token= (sync and asyncio) ------------------------------


def test_local_token_hands_a_lock_to_another_thread(server: Server) -> None:
    r = server.client()
    lock = Lock(r, "foo", timeout=10)
    assert lock.acquire(token="abc")
    assert lock.local.token == b"abc"
    token = lock.local.token
    errors = []

    def other() -> None:
        try:
            assert lock.local.token is None, "thread_local: another thread holds nothing"
            assert not lock.owned()
            lock.local.token = token
            assert lock.owned()
            assert lock.extend(5)
            lock.release()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert not errors, errors
    assert not lock.locked()
    # An owner id known only by value (another Lock object) releases too.
    a, b = Lock(r, "foo", timeout=10), Lock(r, "foo", timeout=10)
    assert a.acquire(token=b"xyz")
    b.local.token = b"xyz"
    b.release()
    assert not a.locked()


# -- the one-line switch of r.lock(...) --------------------------------------


def test_use_lease_locks_switches_r_lock_call_sites(server: Server) -> None:
    r = use_lease_locks(server.client())
    lock = r.lock("foo", timeout=10, blocking_timeout=1)
    assert isinstance(lock, Lock)
    with r.lock("foo", timeout=10) as held:
        assert held.token is not None and lease_info(r, "foo") is not None
        assert not r.lock("foo", blocking=False).acquire()
    # lock_class as given; other clients untouched.
    assert isinstance(r.lock("foo", lock_class=RedisLock), RedisLock)
    assert isinstance(server.client().lock("foo"), RedisLock)

    async def main() -> None:
        ar = use_lease_locks(areds(server))
        alock = ar.lock("foo", timeout=10)
        assert isinstance(alock, AsyncLock)
        async with ar.lock("foo", timeout=10) as held:
            assert await held.owned()
        assert isinstance(ar.lock("foo", lock_class=AsyncRedisLock), AsyncRedisLock)
        await aclose(ar)

    asyncio.run(main())


# -- a rolling switch: redis-py's Lock holds the name -----------------------


def test_a_name_held_by_redis_py_lock_is_held_by_someone_else(server: Server) -> None:
    r = server.client()
    old = RedisLock(r, "shared", timeout=10)
    assert old.acquire()
    new = Lock(r, "shared", timeout=10, sleep=0.05)
    assert new.locked() and not new.owned()
    assert not new.acquire(blocking=False)
    t0 = time.monotonic()
    assert not new.acquire(blocking_timeout=0.3)
    assert 0.2 < time.monotonic() - t0 < 1.5
    with pytest.raises(LockError):
        with Lock(r, "shared", timeout=10, blocking_timeout=0.2):
            pass
    new.local.token = b"not-ours"
    with pytest.raises(LockNotOwnedError):
        new.extend(1)
    new.local.token = b"not-ours"
    with pytest.raises(LockNotOwnedError):
        new.reacquire()
    new.local.token = b"not-ours"
    with pytest.raises(LockNotOwnedError):
        new.release()
    # A blocked new process takes it once the old one releases (polling
    # every ``sleep``: the server cannot queue on a key of another type).
    got = []
    new = Lock(r, "shared", timeout=10, sleep=0.05, thread_local=False)
    t = threading.Thread(target=lambda: got.append(new.acquire(blocking_timeout=5)))
    t.start()
    time.sleep(0.2)
    old.release()
    t.join()
    assert got == [True] and new.owned()
    # And the old Lock waits for the new one: they exclude each other.
    assert not RedisLock(r, "shared", timeout=10).acquire(blocking=False)
    new.release()
    assert RedisLock(r, "shared", timeout=10).acquire(blocking=False)

    async def main() -> None:
        ar = areds(server)
        anew = AsyncLock(ar, "shared", timeout=10, sleep=0.05)
        assert await anew.locked() and not await anew.owned()
        assert not await anew.acquire(blocking=False)
        assert not await anew.acquire(blocking_timeout=0.2)
        anew.local.token = b"not-ours"
        with pytest.raises(LockNotOwnedError):
            await anew.extend(1)
        anew.local.token = b"not-ours"
        with pytest.raises(LockNotOwnedError):
            await anew.reacquire()
        anew.local.token = b"not-ours"
        with pytest.raises(LockNotOwnedError):
            await anew.release()
        await aclose(ar)

    asyncio.run(main())


# -- timeouts past lease.max-ttl-ms ------------------------------------------

HOLDER = """
import sys, time, redis, redis_lease
r = redis.Redis(port=int(sys.argv[1]))
lock = redis_lease.Lock(r, "long", timeout=300)
assert lock.acquire()
print("held", flush=True)
time.sleep(600)
"""

AHOLDER = """
import asyncio, sys, redis.asyncio as aredis
from redis_lease.aio import Lock
async def main():
    lock = Lock(aredis.Redis(port=int(sys.argv[1])), "along", timeout=300)
    assert await lock.acquire()
    print("held", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def _killed_holder_frees_within_the_short_lease(short: Server, code: str, name: str) -> None:
    r = short.client()
    p = subprocess.Popen([sys.executable, "-c", code, str(short.port)], stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"held"
        time.sleep(SHORT_MAX_TTL_MS / 1000 * 1.5)
        assert lease_info(r, name) is not None, "a live holder keeps it past lease.max-ttl-ms"
        p.kill()
        p.wait()
        t0 = time.monotonic()
        assert wait_until(SHORT_MAX_TTL_MS / 1000 + 1, lambda: lease_info(r, name) is None)
        assert time.monotonic() - t0 <= SHORT_MAX_TTL_MS / 1000 + 0.5
    finally:
        p.kill()
        p.wait()


def test_a_long_timeout_is_held_past_the_max_ttl_and_freed_when_the_holder_dies(short: Server) -> None:
    r = short.client()
    lock = Lock(r, "t", timeout=300)
    assert lock.acquire()
    assert ttl_of(r, "t") <= SHORT_MAX_TTL_MS
    time.sleep(SHORT_MAX_TTL_MS / 1000 * 1.6)
    assert lock.owned() and lock.lost is not None and not lock.lost.is_set()
    assert lock.extend(400) and lock.reacquire() and lock.extend(120, replace_ttl=True)
    assert ttl_of(r, "t") <= SHORT_MAX_TTL_MS
    lock.release()
    assert not lock.locked()
    # The end is kept: a timeout of 3 s on a 2 s server lease ends at 3 s.
    three = Lock(r, "t3", timeout=3)
    assert three.acquire()
    time.sleep(2.5)
    assert three.owned()
    assert wait_until(1.5, lambda: not three.locked())
    with pytest.raises(LockNotOwnedError):
        three.release()
    # timeout=None: a lease of at most the server's max, renewed.
    forever = Lock(r, "none")
    assert forever.acquire()
    time.sleep(SHORT_MAX_TTL_MS / 1000 * 1.6)
    assert forever.owned()
    forever.release()
    _killed_holder_frees_within_the_short_lease(short, HOLDER, "long")


def test_an_async_long_timeout_is_held_past_the_max_ttl_and_freed_when_the_holder_dies(short: Server) -> None:
    r = short.client()

    async def main() -> None:
        ar = areds(short)
        lock = AsyncLock(ar, "t", timeout=300)
        assert await lock.acquire()
        assert ttl_of(r, "t") <= SHORT_MAX_TTL_MS
        await asyncio.sleep(SHORT_MAX_TTL_MS / 1000 * 1.6)
        assert await lock.owned()
        assert await lock.extend(400) and await lock.reacquire()
        assert await lock.extend(120, replace_ttl=True)
        await lock.release()
        assert not await lock.locked()
        await aclose(ar)

    asyncio.run(main())
    _killed_holder_frees_within_the_short_lease(short, AHOLDER, "along")


# -- one pool per redis-py client ---------------------------------------------


def test_locks_and_clients_of_one_redis_client_share_one_pool(server: Server) -> None:
    r = server.client()
    admin = server.client()
    admin.ping()
    client = LeaseClient(r)
    lock = Lock(r, "c", timeout=10)
    assert lock.acquire()
    lock.release()
    before = connections(admin)
    for _ in range(50):
        assert lock.acquire()
        lock.release()
        with client.lease("d", 10000):
            pass
        with Lock(r, "e", timeout=10):
            pass
    assert connections(admin) - before == 0, "150 cycles on the one idle connection"
    assert LeaseClient(r)._pool is client._pool is lock._client._pool

    async def main() -> None:
        ar = areds(server)
        alock = AsyncLock(ar, "c", timeout=10)
        aclient = AsyncLeaseClient(ar)
        assert await alock.acquire()
        await alock.release()
        before = connections(admin)
        for _ in range(50):
            assert await alock.acquire()
            await alock.release()
            async with aclient.lease("d", 10000):
                pass
        assert connections(admin) - before == 0
        assert aclient._pool is alock._client._pool
        await aclose(ar)

    asyncio.run(main())


# -- cluster clients of both kinds -------------------------------------------


def test_the_drop_ins_on_a_cluster(cluster: ClusterNodes) -> None:
    rc = use_lease_locks(RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port))
    names = [f"lock:{i}" for i in range(6)]  # spread over the masters
    for name in names:
        with rc.lock(name, timeout=10, blocking_timeout=1) as lock:
            assert lock.owned() and lock.token is not None
            assert not Lock(rc, name, blocking=False).acquire()
            assert lock.extend(5)
        assert not lock.locked()
    old = RedisLock(rc, names[0], timeout=10)
    assert old.acquire()
    assert not Lock(rc, names[0], blocking_timeout=0.2, sleep=0.05).acquire()
    old.release()

    async def main() -> None:
        arc = use_lease_locks(AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port))
        for name in names:
            async with arc.lock(name, timeout=10, blocking_timeout=1) as lock:
                assert await lock.owned()
                assert not await AsyncLock(arc, name, blocking=False).acquire()
                assert await lock.extend(5)
            assert not await lock.locked()
        await aclose(arc)

    asyncio.run(main())


def test_the_package_exports_the_switch() -> None:
    assert redis_lease.use_lease_locks is use_lease_locks
    assert redis_lease.aio.Lock is AsyncLock
