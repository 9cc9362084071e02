"""The helpers on a real cluster (3 masters; Redis 7.0, see conftest.cluster):
every lease call goes to the master of the lease key's slot and to no other
node; fenced writes land there; the watchdog renews there. Multi-key leases
too (their keys in one slot). Sync and asyncio."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from conftest import lease_info
from redis_lease import LeaseClient
from redis_lease.aio import AsyncLeaseClient

CMDS = ["lease.acquire", "lease.fence", "lease.renew", "lease.release"]


def node_of_slot(cluster, slot):
    for n in cluster.nodes:
        for start, end, *_ in n.client().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(m for m in cluster.nodes if m.port == int(_[0][1]))
    raise AssertionError(f"no node for slot {slot}")


def tags_on_every_master(cluster):
    """Three hash tags, each served by another master."""
    r = cluster.nodes[0].client()
    found: Dict[Any, Any] = {}
    for i in range(1000):
        if len(found) == 3:
            break
        tag = f"acct{i}"
        node = node_of_slot(cluster, int(r.execute_command("CLUSTER", "KEYSLOT", tag)))
        found.setdefault(node.port, (tag, node))
    assert len(found) == 3
    return list(found.values())


def calls(node, cmd):
    """Calls of ``cmd`` on ``node``, rejected ones (a MOVED) included."""
    stats = node.client().info("commandstats")
    for name, v in stats.items():
        if name.lower() == f"cmdstat_{cmd}":
            return int(v.get("calls", 0)) + int(v.get("rejected_calls", 0)) + int(v.get("failed_calls", 0))
    return 0


def reset(cluster):
    for n in cluster.nodes:
        n.client().config_resetstat()


def assert_routed(cluster, owner, tag):
    for n in cluster.nodes:
        for cmd in CMDS:
            seen = calls(n, cmd)
            if n.port == owner.port:
                assert seen >= 1, f"{cmd} for {tag} never reached its master"
            else:
                assert seen == 0, f"{cmd} for {tag} reached another node ({n.port})"


def test_lease_calls_are_routed_by_the_lease_key_slot(cluster):
    tags = tags_on_every_master(cluster)
    # The check sees a call sent to the wrong node (answered MOVED).
    tag, owner = tags[0]
    other = tags[1][1]
    try:
        other.client().execute_command("LEASE.ACQUIRE", f"{{{tag}}}:lock", "me", 1000)
        raise AssertionError("expected MOVED")
    except Exception as e:
        assert "MOVED" in str(e) or type(e).__name__ == "MovedError", e
    assert calls(other, "lease.acquire") == 1

    client = LeaseClient(RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port))
    for i, (tag, owner) in enumerate(tags):
        reset(cluster)
        lock = f"{{{tag}}}:lock"
        with client.lease(lock, 300) as lease:
            lease.fence("HSET", f"{{{tag}}}", "by", "sync")
            # Four ttls on the first master (the watchdog renews there),
            # one on the others.
            time.sleep(1.2 if i == 0 else 0.3)
            assert not lease.lost.is_set(), lease.lost.reason
            direct = owner.client()
            assert int(lease_info(direct, lock)["token"]) == lease.token
            assert direct.hget(f"{{{tag}}}", "by") == b"sync"
        assert lease_info(owner.client(), lock) is None
        assert_routed(cluster, owner, tag)

    async def main():
        aclient = AsyncLeaseClient(AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port))
        for i, (tag, owner) in enumerate(tags):
            reset(cluster)
            lock = f"{{{tag}}}:lock"
            async with aclient.lease(lock, 300) as lease:
                await lease.fence("HSET", f"{{{tag}}}", "by", "async")
                await asyncio.sleep(1.2 if i == 0 else 0.3)
                assert not lease.lost.is_set(), lease.lost.reason
                assert int(lease_info(owner.client(), lock)["token"]) == lease.token
            assert owner.client().hget(f"{{{tag}}}", "by") == b"async"
            assert_routed(cluster, owner, tag)

    asyncio.run(main())


def test_one_watchdog_renews_leases_on_every_master_at_once(cluster):
    # Leases on every master held together: each watchdog round sends one
    # pipeline per node (at once, for asyncio), and every lease stays held
    # on its own master.
    locks = [f"{{job{i}}}:lock" for i in range(30)]
    masters = {int(cluster.nodes[0].client().execute_command("CLUSTER", "KEYSLOT", lock)) for lock in locks}
    assert len({node_of_slot(cluster, slot).port for slot in masters}) == 3, "keys on every master"

    def token(lock):
        slot = int(cluster.nodes[0].client().execute_command("CLUSTER", "KEYSLOT", lock))
        info = lease_info(node_of_slot(cluster, slot).client(), lock)
        return None if info is None else int(info["token"])

    client = LeaseClient(RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port))
    leases = [client.acquire(lock, 600) for lock in locks]
    time.sleep(1.8)
    for lock, lease in zip(locks, leases):
        assert not lease.lost.is_set(), lock
        assert token(lock) == lease.token
    stats = client.watchdog_stats()
    assert stats["renewals"] >= 30 * 6 and stats["round_trips"] * 5 <= stats["renewals"], stats
    for lease in leases:
        assert lease.release()
    assert all(token(lock) is None for lock in locks)

    async def main():
        aclient = AsyncLeaseClient(AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port))
        leases = [await aclient.acquire(lock, 600) for lock in locks]
        await asyncio.sleep(1.8)
        # The checks read the masters with blocking calls: off the event
        # loop, so that the watchdog keeps renewing while they run.
        tokens = await asyncio.to_thread(lambda: [token(lock) for lock in locks])
        for lock, lease, held in zip(locks, leases, tokens):
            assert not lease.lost.is_set(), lock
            assert held == lease.token
        stats = aclient.watchdog_stats()
        assert stats["renewals"] >= 30 * 6 and stats["round_trips"] * 5 <= stats["renewals"], stats
        for lease in leases:
            assert await lease.release()

    asyncio.run(main())
    assert all(token(lock) is None for lock in locks)


def test_multi_key_leases_go_to_the_master_of_their_slot(cluster):
    # LEASE.MACQUIRE, MRENEW and MRELEASE start with the key count: the
    # helpers connect to the node of the first key. A master other than the
    # seed node, so that a call sent to the seed would show there.
    seed = cluster.nodes[0]
    tag, owner = next((t, n) for t, n in tags_on_every_master(cluster) if n.port != seed.port)
    keys = [f"{{{tag}}}:a", f"{{{tag}}}:b"]
    data = f"{{{tag}}}"
    cmds = ["lease.macquire", "lease.mrenew", "lease.mrelease", "lease.fence"]

    def check(what):
        for n in cluster.nodes:
            for cmd in cmds:
                seen = calls(n, cmd)
                if n.port == owner.port:
                    assert seen >= 1, f"{what}: {cmd} never reached the keys' master"
                else:
                    assert seen == 0, f"{what}: {cmd} reached another node ({n.port})"

    reset(cluster)
    client = LeaseClient(RedisCluster(host="127.0.0.1", port=seed.port))
    with client.lease_many(keys, 300) as lease:
        single = client.acquire(f"{{{tag}}}:solo", 300)
        for key in keys:
            lease.fence(key, "HINCRBY", data, "sync", 1)
        time.sleep(1.2)
        assert not lease.lost.is_set() and not single.lost.is_set(), lease.lost.reason
        for key in keys:
            assert int(lease_info(owner.client(), key)["token"]) == lease.token
        # Keys of two slots: refused before anything is sent.
        other = next(t for t, n in tags_on_every_master(cluster) if t != tag)
        try:
            client.acquire_many([f"{{{tag}}}:x", f"{{{other}}}:x"], 300)
            raise AssertionError("expected ValueError")
        except ValueError as e:
            assert "CROSSSLOT" in str(e)
        single.release()
    assert owner.client().hget(data, "sync") == b"2"
    assert all(lease_info(owner.client(), k) is None for k in keys)
    check("sync")

    async def main():
        aclient = AsyncLeaseClient(AsyncRedisCluster(host="127.0.0.1", port=seed.port))
        async with aclient.lease_many(keys, 300) as lease:
            single = await aclient.acquire(f"{{{tag}}}:solo", 300)
            for key in keys:
                await lease.fence(key, "HINCRBY", data, "async", 1)
            await asyncio.sleep(1.2)
            assert not lease.lost.is_set() and not single.lost.is_set(), lease.lost.reason
            for key in keys:
                assert int(lease_info(owner.client(), key)["token"]) == lease.token
            await single.release()

    reset(cluster)
    asyncio.run(main())
    assert owner.client().hget(data, "async") == b"2"
    assert all(lease_info(owner.client(), k) is None for k in keys)
    check("async")
