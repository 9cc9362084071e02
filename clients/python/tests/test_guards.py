"""Guarded keys (design.md S12) through the helpers, against real servers
(every kind in conftest.KINDS; quorums of three masters; the cluster on the
first kind): ``guard``/``unguard`` of the sync and asyncio clients and the
server's refusals; a write through every fenced path the package offers
(a lease's fence, with ``min_ttl_ms``, ``fence_args`` on a client or a
``MULTI`` of your own, a multi-key lease's, a quorum lease's, the drop-in
Locks') lands on guarded data; the same write without the fence is refused
with :class:`Fenced` and changes nothing; a stale token is refused."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Iterator, List, Optional, Set

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import LockError, ResponseError

from conftest import KINDS, ClusterNodes, Server, aclose, lease_info, wait_until
from redis_lease import (
    Fenced,
    LeaseClient,
    LeaseExpiring,
    Lock,
    QuorumClient,
    StaleToken,
    use_lease_locks,
)
from redis_lease.aio import AsyncLeaseClient
from redis_lease.aio import Lock as AsyncLock
from redis_lease.quorum import AsyncQuorumClient

GUARD = "{acct:7}:lock"  # guards the tag {acct:7}
DATA = "{acct:7}"  # a key of that tag


def sync_client(server: Server, **kw: Any) -> LeaseClient:
    return LeaseClient(server.client(), **kw)


def async_client(server: Server, **kw: Any) -> AsyncLeaseClient:
    return AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=server.port), **kw)


def areds(server: Server) -> aredis.Redis:
    return aredis.Redis(host="127.0.0.1", port=server.port)


def fenced(e: BaseException) -> Fenced:
    """The typed refusal in a ResponseError of a plain redis-py call."""
    out = Fenced.of(e)
    assert out is not None, f"not a FENCED refusal: {e!r}"
    return out


def refused_plain(r: redis.Redis, *command: Any) -> Fenced:
    """``command`` sent without the fence: refused with FENCED."""
    with pytest.raises(ResponseError) as refused:
        r.execute_command(*command)
    return fenced(refused.value)


async def arefused_plain(ar: aredis.Redis, *command: Any) -> Fenced:
    with pytest.raises(ResponseError) as refused:
        await ar.execute_command(*command)
    return fenced(refused.value)


def free_guard(info: Optional[Dict[str, Any]]) -> bool:
    """A guard nobody holds: LEASE.INFO's map with null token, ttl, since and
    label, and guard 1."""
    return info is not None and info["guard"] == 1 and all(info[f] is None for f in ("token", "ttl", "since", "label"))


# -- guard and unguard ------------------------------------------------------


def test_guard_and_unguard_round_trip_and_a_guard_refuses_writes_outside_its_fence(server):
    r = server.client()
    client = sync_client(server)
    r.set(DATA, "before")
    client.guard(GUARD)
    client.guard(GUARD)  # guarding again changes nothing
    info = lease_info(r, GUARD)
    assert free_guard(info) and info is not None and info["waiters"] == 0, info

    refusal = refused_plain(r, "SET", DATA, "after")
    assert (refusal.key, refusal.guard) == (DATA, GUARD)
    assert str(refusal).startswith(f"FENCED write to '{DATA}' refused")
    assert isinstance(refusal, ResponseError)
    assert r.get(DATA) == b"before", "reads pass, the write changed nothing"
    assert refused_plain(r, "DEL", DATA).key == DATA
    assert r.exists(DATA) == 1
    r.set("{acct:8}", "other tag")  # another tag is not guarded
    # Names as the server prints them: cut at 64 bytes, other bytes as '?'.
    long = DATA + ":" + "x" * 100
    cut = refused_plain(r, "SET", long, "v")
    assert cut.key == long[:64] + "..." and cut.guard == GUARD
    assert refused_plain(r, "SET", DATA + ":caf\u00e9 'quoted'", "v").key == DATA + ":caf?? 'quoted'"

    assert client.unguard(GUARD) is True
    assert client.unguard(GUARD) is False, "it guards no more"
    assert client.unguard("{never}:lock") is False
    r.set(DATA, "after")
    assert r.get(DATA) == b"after"


def test_the_servers_refusals_of_a_guard_are_its_response_errors(server):
    r = server.client()
    client = sync_client(server)
    with pytest.raises(ResponseError, match="a guard needs a key with a hash tag") as refused:
        client.guard("no-tag")
    assert Fenced.of(refused.value) is None and not isinstance(refused.value, Fenced)

    client.guard(GUARD)
    with pytest.raises(ResponseError, match=r"hash tag \{acct:7\} is already guarded by '\{acct:7\}:lock'"):
        client.guard("{acct:7}:other")

    exclusive = "holds only exclusive leases"
    with pytest.raises(ResponseError, match=exclusive):
        client.acquire(GUARD, 10000, limit=2)
    with pytest.raises(ResponseError, match=exclusive):
        client.acquire(GUARD, 10000, shared=True)
    permit = client.acquire("{sem}:lock", 10000, limit=2)
    assert permit is not None
    with pytest.raises(ResponseError, match=exclusive):
        client.guard("{sem}:lock")
    assert permit.release()

    r.set("{s}:string", "v")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        client.guard("{s}:string")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        client.unguard("{s}:string")
    # None of the refusals took the guard away, nor made another.
    assert lease_info(r, "{acct:7}:other") is None
    assert free_guard(lease_info(r, GUARD))
    r.set("{sem}", "writable")


def test_the_asyncio_client_guards_and_unguards_in_the_same_way(server):
    async def main() -> None:
        ar = areds(server)
        client = async_client(server)
        await ar.set(DATA, "before")
        await client.guard(GUARD)
        await client.guard(GUARD)  # again: nothing changes
        assert (await arefused_plain(ar, "SET", DATA, "after")).guard == GUARD
        with pytest.raises(ResponseError, match="already guarded"):
            await client.guard("{acct:7}:other")
        with pytest.raises(ResponseError, match="a guard needs a key with a hash tag"):
            await client.guard("no-tag")
        with pytest.raises(ResponseError, match="holds only exclusive leases"):
            await client.acquire(GUARD, 10000, shared=True)
        assert await client.unguard(GUARD) is True
        assert await client.unguard(GUARD) is False
        await ar.set(DATA, "after")
        await aclose(ar)

    asyncio.run(main())
    assert server.client().get(DATA) == b"after"


# -- the fenced paths on guarded data (sync) ----------------------------------


def test_every_fence_of_a_lease_on_the_guard_writes_guarded_data(server):
    r = server.client()
    client = sync_client(server)
    client.guard(GUARD)
    with client.lease(GUARD, 10000) as lease:
        info = lease_info(r, GUARD)
        assert info is not None and int(info["token"]) == lease.token and info["guard"] == 1
        assert lease.fence("HSET", DATA, "balance", 90) == 1
        assert lease.fence("HINCRBY", DATA, "balance", 5, min_ttl_ms=1000) == 95
        with pytest.raises(LeaseExpiring):
            lease.fence("HINCRBY", DATA, "balance", 1000, min_ttl_ms=60_000)
        # fence_args on a client of your own, and in a MULTI of your own.
        assert r.execute_command(*lease.fence_args("HSET", DATA, "by", "own client")) == 1
        assert r.execute_command(*lease.fence_args("HINCRBY", DATA, "balance", 1, min_ttl_ms=1000)) == 96
        p = r.pipeline(transaction=True)
        p.execute_command(*lease.fence_args("HINCRBY", DATA, "balance", 1))
        p.hset(DATA, "balance", 0)  # not fenced: refused in EXEC's reply
        replies = p.execute(raise_on_error=False)
        assert replies[0] == 97
        assert fenced(replies[1]).key == DATA
        p = r.pipeline(transaction=False)
        p.hset(DATA, "balance", 0)
        with pytest.raises(ResponseError) as raised:  # redis-py names the command first
            p.execute()
        assert not str(raised.value).startswith("FENCED") and fenced(raised.value).key == DATA
        assert r.hget(DATA, "balance") == b"97"

        # The same write without the fence: refused, typed, nothing changed.
        assert refused_plain(r, "HSET", DATA, "balance", 0).guard == GUARD
        assert refused_plain(r, "HSET", "{acct:7}:new", "f", 1).key == "{acct:7}:new"
        # Through a lease on another key of the tag: Fenced from the helper.
        with client.lease("{acct:7}:other", 10000) as other:
            with pytest.raises(Fenced) as refused:
                other.fence("HSET", DATA, "balance", 0)
            assert (refused.value.key, refused.value.guard) == (DATA, GUARD)
            assert isinstance(refused.value, ResponseError)
            assert other.fence("HGET", DATA, "balance") == b"97", "a read through it passes"
        assert r.hget(DATA, "balance") == b"97" and r.exists("{acct:7}:new") == 0
    assert free_guard(lease_info(r, GUARD)), "the guard stays, free, after the release"
    assert refused_plain(r, "HSET", DATA, "balance", 0).guard == GUARD


def test_a_stale_token_is_refused_on_guarded_data(server):
    r = server.client()
    client = sync_client(server)
    client.guard(GUARD)
    first = client.acquire(GUARD, 10000)
    assert first is not None
    assert first.fence("SET", DATA, "v1") == b"OK"
    assert first.release()
    with pytest.raises(StaleToken):
        first.fence("SET", DATA, "released")

    # A lease that expires (no watchdog): its token is stale once it ended.
    short = sync_client(server, watchdog=False).acquire(GUARD, 200)
    assert short is not None and short.token > first.token
    assert short.fence("SET", DATA, "v2") == b"OK"
    assert short.lost.wait(3)
    assert wait_until(3, lambda: free_guard(lease_info(r, GUARD)))
    with pytest.raises(StaleToken):
        short.fence("SET", DATA, "expired")
    with pytest.raises(StaleToken):
        short.fence("SET", DATA, "expired", min_ttl_ms=0)

    # The next holder's token is the current one; the old ones stay stale.
    with client.lease(GUARD, 10000) as nxt:
        assert nxt.token > short.token
        with pytest.raises(StaleToken):
            short.fence("SET", DATA, "stale")
        with pytest.raises(ResponseError, match="^STALE"):  # a client of your own: its error
            r.execute_command(*first.fence_args("SET", DATA, "stale"))
        assert nxt.fence("GET", DATA) == b"v2"
    assert r.get(DATA) == b"v2"


def test_a_multi_key_lease_writes_guarded_data_through_its_guard_key(server):
    r = server.client()
    client = sync_client(server)
    guard, other = "{bank}:lock", "{bank}:7:lock"
    client.guard(guard)
    lease = client.acquire_many([guard, other], 10000)
    assert lease is not None
    assert lease.fence(guard, "HINCRBY", "{bank}:7", "balance", -30) == -30
    assert lease.fence(guard, "HINCRBY", "{bank}:9", "balance", 30, min_ttl_ms=1000) == 30
    with pytest.raises(LeaseExpiring):
        lease.fence(guard, "HINCRBY", "{bank}:9", "balance", 1, min_ttl_ms=60_000)
    assert r.execute_command(*lease.fence_args(guard, "HSET", "{bank}:log", "last", "transfer")) == 1
    # Through its key that does not guard: the same token, but refused.
    with pytest.raises(Fenced) as refused:
        lease.fence(other, "HINCRBY", "{bank}:7", "balance", 1)
    assert (refused.value.key, refused.value.guard) == ("{bank}:7", guard)
    assert refused_plain(r, "HINCRBY", "{bank}:7", "balance", 1).guard == guard
    assert lease.release()
    with pytest.raises(StaleToken):
        lease.fence(guard, "HINCRBY", "{bank}:7", "balance", 1)
    assert r.hget("{bank}:7", "balance") == b"-30" and r.hget("{bank}:9", "balance") == b"30"
    assert free_guard(lease_info(r, guard)) and lease_info(r, other) is None


# -- the fenced paths on guarded data (asyncio) ---------------------------------


def test_the_asyncio_fences_write_guarded_data_and_a_stale_token_is_refused(server):
    async def main() -> None:
        ar = areds(server)
        client = async_client(server)
        await client.guard(GUARD)
        await client.guard("{bank}:lock")
        async with client.lease(GUARD, 10000) as lease:
            assert await lease.fence("HSET", DATA, "balance", 90) == 1
            assert await lease.fence("HINCRBY", DATA, "balance", 5, min_ttl_ms=1000) == 95
            with pytest.raises(LeaseExpiring):
                await lease.fence("HINCRBY", DATA, "balance", 1000, min_ttl_ms=60_000)
            assert await ar.execute_command(*lease.fence_args("HINCRBY", DATA, "balance", 1)) == 96
            assert (await arefused_plain(ar, "HSET", DATA, "balance", 0)).key == DATA
            other = await client.acquire("{acct:7}:other", 10000)
            assert other is not None
            with pytest.raises(Fenced) as refused:
                await other.fence("HSET", DATA, "balance", 0)
            assert refused.value.guard == GUARD
            assert await other.release()
        with pytest.raises(StaleToken):
            await lease.fence("HSET", DATA, "balance", 0)

        # A lease that expires (no watchdog): stale once it ended.
        short = await async_client(server, watchdog=False).acquire(GUARD, 200)
        assert short is not None and short.token > lease.token
        assert await short.fence("HINCRBY", DATA, "balance", 1) == 97
        await asyncio.wait_for(short.lost.wait(), 3)
        for _ in range(300):  # about 3 s at most
            if free_guard(_fields(await ar.execute_command("LEASE.INFO", GUARD))):
                break
            await asyncio.sleep(0.01)
        assert free_guard(_fields(await ar.execute_command("LEASE.INFO", GUARD)))
        with pytest.raises(StaleToken):
            await short.fence("HINCRBY", DATA, "balance", 1)

        many = await client.acquire_many(["{bank}:lock", "{bank}:7:lock"], 10000)
        assert many is not None
        assert await many.fence("{bank}:lock", "HINCRBY", "{bank}:7", "balance", -30) == -30
        assert await many.fence("{bank}:lock", "HINCRBY", "{bank}:9", "balance", 30, min_ttl_ms=1000) == 30
        with pytest.raises(Fenced):
            await many.fence("{bank}:7:lock", "HINCRBY", "{bank}:7", "balance", 1)
        assert await many.release()
        with pytest.raises(StaleToken):
            await many.fence("{bank}:lock", "HINCRBY", "{bank}:7", "balance", 1)
        assert free_guard(_fields(await ar.execute_command("LEASE.INFO", "{bank}:lock")))
        await aclose(ar)

    asyncio.run(main())
    r = server.client()
    assert r.hget(DATA, "balance") == b"97"
    assert r.hget("{bank}:7", "balance") == b"-30" and r.hget("{bank}:9", "balance") == b"30"


def _fields(info: Any) -> Optional[Dict[str, Any]]:
    if info is None:
        return None
    if not isinstance(info, dict):
        info = dict(zip(info[::2], info[1::2]))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}


# -- the drop-in Locks ----------------------------------------------------------


def test_the_drop_in_locks_work_as_before_on_unguarded_keys(server):
    r = server.client()
    sync_client(server).guard(GUARD)  # a guard of another tag changes nothing here
    lock = Lock(server.client(), "resource", timeout=10, blocking_timeout=2)
    with lock:
        assert lock.locked() and lock.owned()
        assert lock.fence("SET", "out", "sync") == b"OK"
        assert lock.extend(5)
        assert not Lock(server.client(), "resource", blocking=False).acquire()
    assert not lock.locked()
    r.set("out2", "plain writes pass")
    switched = use_lease_locks(server.client())
    with switched.lock("resource", timeout=10) as held:
        assert isinstance(held, Lock) and held.fence("INCR", "n") == 1

    async def main() -> None:
        alock = AsyncLock(areds(server), "resource", timeout=10, blocking_timeout=2)
        async with alock:
            assert await alock.locked() and await alock.owned()
            assert await alock.fence("SET", "out", "async") == b"OK"
            assert await alock.extend(5)
        assert not await alock.locked()

    asyncio.run(main())
    assert r.get("out") == b"async" and r.get("n") == b"1"


def test_the_drop_in_locks_fence_guarded_data_when_named_after_the_guard(server):
    r = server.client()
    sync_client(server).guard(GUARD)
    lock = Lock(server.client(), GUARD, timeout=10, blocking_timeout=2)
    with lock:
        assert lock.locked() and lock.owned()
        assert lock.fence("HSET", DATA, "by", "lock") == 1
        assert lock.fence("HINCRBY", DATA, "n", 1, min_ttl_ms=1000) == 1
        assert refused_plain(r, "HSET", DATA, "by", "plain").guard == GUARD
        assert not Lock(server.client(), GUARD, blocking=False).acquire()
    assert free_guard(lease_info(r, GUARD))
    assert not lock.locked(), "a free guard is not a held lock"
    with pytest.raises(LockError):
        lock.fence("HSET", DATA, "by", "released")
    again = Lock(server.client(), GUARD, timeout=10)
    assert again.acquire(blocking=False)
    assert again.fence("HINCRBY", DATA, "n", 1) == 2
    again.release()

    async def main() -> None:
        alock = AsyncLock(areds(server), GUARD, timeout=10, blocking_timeout=2)
        async with alock:
            assert await alock.locked() and await alock.owned()
            assert await alock.fence("HSET", DATA, "by", "async lock") == 0
            other = await AsyncLeaseClient(areds(server)).acquire("{acct:7}:x", 10000)
            assert other is not None
            with pytest.raises(Fenced):
                await other.fence("HSET", DATA, "by", "other lease")
            assert await other.release()
        assert not await alock.locked()
        with pytest.raises(LockError):
            await alock.fence("HSET", DATA, "by", "released")

    asyncio.run(main())
    assert r.hget(DATA, "by") == b"async lock" and r.hget(DATA, "n") == b"2"


# -- quorum leases ----------------------------------------------------------------


@pytest.fixture(params=KINDS)
def masters(request: Any) -> Iterator[List[Server]]:
    servers = [Server(request.param) for _ in range(3)]
    yield servers
    for s in servers:
        s.close()


def test_a_quorum_lease_on_the_guard_fences_guarded_data_on_the_masters_that_committed_it(masters):
    # A step decides at a majority: a master that answers after the linger
    # (a loaded machine) is not among the committed ones, and the fence
    # writes where the token was committed.
    key, data = "{job}:lock", "{job}:out"
    for m in masters:
        LeaseClient(m.client()).guard(key)
    client = QuorumClient([m.client() for m in masters], io_timeout=1)
    with client.lease(key, 10000) as lease:
        committed = set(lease.committed)
        assert len(committed) >= 2, committed
        assert lease.fence("SET", data, "v1") == b"OK"
        assert lease.fence("INCR", "{job}:n", min_ttl_ms=1000) == 1
        for i, m in enumerate(masters):
            if i in committed:
                assert m.client().get(data) == b"v1"
            assert refused_plain(m.client(), "SET", data, "plain").guard == key
    with pytest.raises(StaleToken):
        lease.fence("SET", data, "stale")
    for i, m in enumerate(masters):
        if i in committed:
            assert m.client().get(data) == b"v1"
        assert free_guard(lease_info(m.client(), key))

    async def main() -> Set[int]:
        aclient = AsyncQuorumClient([aredis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=1)
        async with aclient.lease(key, 10000) as alease:
            assert len(alease.committed) >= 2, alease.committed
            assert alease.token > lease.token
            assert await alease.fence("SET", data, "v2") == b"OK"
            assert await alease.fence("INCR", "{job}:n", min_ttl_ms=1000) in (1, 2)
        with pytest.raises(StaleToken):
            await alease.fence("SET", data, "stale")
        await aclient.close()
        return set(alease.committed)

    again = asyncio.run(main())
    for i, m in enumerate(masters):
        if i in again:
            assert m.client().get(data) == b"v2"
        if i in again and i in committed:
            assert m.client().get("{job}:n") == b"2"


# -- a cluster --------------------------------------------------------------------


def test_guards_on_a_cluster_go_to_the_master_of_the_keys_slot(cluster: ClusterNodes):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    client = LeaseClient(rc)
    tags = [f"t{i}" for i in range(6)]  # their slots spread over the masters
    for tag in tags:
        client.guard(f"{{{tag}}}:lock")
    for tag in tags:
        guard, data = f"{{{tag}}}:lock", f"{{{tag}}}"
        with client.lease(guard, 10000) as lease:
            assert lease.fence("SET", data, "sync") == b"OK"
            with pytest.raises(ResponseError) as refused:
                rc.set(data, "plain")
            assert fenced(refused.value).guard == guard
        assert rc.get(data) == b"sync"

    async def main() -> None:
        arc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        aclient = AsyncLeaseClient(arc)
        for tag in tags:
            guard, data = f"{{{tag}}}:lock", f"{{{tag}}}"
            async with aclient.lease(guard, 10000) as lease:
                assert await lease.fence("SET", data, "async") == b"OK"
            with pytest.raises(ResponseError) as refused:
                await arc.set(data, "plain")
            assert fenced(refused.value).key == data
            assert await aclient.unguard(guard) is True
            await arc.set(data, "unguarded")
        await aclose(arc)

    asyncio.run(main())
    for tag in tags:
        assert rc.get(f"{{{tag}}}") == b"unguarded"
        assert client.unguard(f"{{{tag}}}:lock") is False
