"""Multi-key leases (``acquire_many``, ``lease_many``, ``run_many``;
design.md S10) of the sync and asyncio helpers against real servers (every
kind in conftest.KINDS): all or nothing, one token on every key, fenced
writes on each key, one ``LEASE.MRENEW`` per renewal, the loss of every key
when one is taken, ``BLOCK`` until every key is free, release on exit, a
lost reply retried with the same owner, a grace refusal."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict
import time

import pytest
import redis.asyncio as aredis

from conftest import LossyProxy, calls, info_int, token_of, wait_until, waiters
from redis_lease import AlreadyHeld, LeaseBusy, LeaseClient, LeaseGrace, LeaseLost, Loss, MultiLease, StaleToken
from redis_lease.aio import AsyncLeaseClient, AsyncMultiLease

KEYS = ["{acct}:1", "{acct}:2", "{acct}:3"]


def tokens(r):
    return [token_of(r, k) for k in KEYS]


def aclient(server, **kw) -> AsyncLeaseClient:
    return AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=server.port), **kw)


def test_all_or_nothing_with_one_token_fencing_every_key(server):
    r = server.client()
    client = LeaseClient(server.client())
    # One key held by another owner: nothing is taken.
    assert r.execute_command("LEASE.ACQUIRE", KEYS[1], "other", 10000) is not None
    assert client.acquire_many(KEYS, 10000) is None
    assert token_of(r, KEYS[0]) is None and token_of(r, KEYS[2]) is None, "nothing held in part"
    assert info_int(r, "acquired") == 1
    r.execute_command("LEASE.RELEASE", KEYS[1], "other")
    lease = client.acquire_many(KEYS, 10000)
    assert isinstance(lease, MultiLease)
    assert lease.keys == tuple(KEYS)
    assert tokens(r) == [lease.token] * 3
    for i, key in enumerate(KEYS):
        assert lease.fence(key, "HSET", "{acct}", f"f{i}", i) == 1
    assert r.hget("{acct}", "f2") == b"2"
    with pytest.raises(ValueError):  # not one of its keys: nothing sent
        lease.fence("{acct}:9", "HSET", "{acct}", "x", 1)
    with pytest.raises(ValueError):
        lease.fence_args("{acct}:9", "GET", "x")
    assert lease.fence_args(KEYS[0], "GET", "x") == ("LEASE.FENCE", KEYS[0], lease.token, "GET", "x")
    assert not r.hexists("{acct}", "x")
    with pytest.raises(AlreadyHeld):
        client.acquire(KEYS[2], 10000, block_ms=0)
    with pytest.raises(AlreadyHeld):
        client.acquire_many(["{acct}:0", KEYS[0]], 10000)
    for bad in ([], ["{acct}:7", "{acct}:7"], "{acct}:7"):
        with pytest.raises(ValueError):
            LeaseClient(server.client()).acquire_many(bad, 10000)
    with pytest.raises(ValueError):
        LeaseClient(server.client()).acquire_many(["{acct}:7"], 0)
    assert calls(r, "lease.macquire") == 2, "nothing sent for the bad ones"
    assert "owner" not in repr(lease) and lease._owner not in repr(lease)
    assert lease.renew()
    assert lease.release()
    assert tokens(r) == [None] * 3
    assert info_int(r, "released") == 1 + 3
    assert client.acquire(KEYS[2], 10000).token > lease.token


def test_the_watchdog_renews_every_key_with_one_mrenew(server):
    r = server.client()
    client = LeaseClient(server.client())
    multi = client.acquire_many(KEYS, 300)
    single = client.acquire("{acct}:solo", 300)
    start = time.monotonic()
    for _ in range(40):
        if time.monotonic() - start >= 1.8:
            break
        assert not multi.lost.is_set(), f"lost after {time.monotonic() - start:.3f}s"
        assert tokens(r) == [multi.token] * 3
        assert r.execute_command("LEASE.ACQUIRE", KEYS[1], "other", 1000) is None
        time.sleep(0.05)
    assert time.monotonic() - start >= 1.8, "the loop ended early"
    assert not single.lost.is_set()
    assert single.release() and multi.release()
    assert tokens(r) == [None] * 3
    time.sleep(0.05)  # a round in flight settles
    # One LEASE.MRENEW per renewal of the three keys (the server counts three
    # renewed keys), in the same pipelines as the single lease's.
    mrenew, renew = calls(r, "lease.mrenew"), calls(r, "lease.renew")
    assert mrenew >= 12 and renew >= 12, (mrenew, renew)
    assert info_int(r, "renewed") == 3 * mrenew + renew
    stats = client.watchdog_stats()
    assert stats["renewals"] == mrenew + renew
    assert stats["round_trips"] * 2 <= stats["renewals"] + 1, stats


def test_one_key_taken_is_the_loss_of_every_key(server):
    r = server.client()
    lease = LeaseClient(server.client()).acquire_many(KEYS, 600)
    lease.fence(KEYS[0], "HSET", "{acct}", "v", 1)
    r.delete(KEYS[1])
    assert r.execute_command("LEASE.ACQUIRE", KEYS[1], "thief", 10000) is not None
    start = time.monotonic()
    assert lease.lost.wait(3) and lease.lost.reason == Loss.REFUSED
    assert time.monotonic() - start < 0.6, "noticed at the next renewal, before the deadline"
    with pytest.raises(StaleToken):
        lease.fence(KEYS[1], "HSET", "{acct}", "v", 2)
    assert r.hget("{acct}", "v") == b"1"
    assert lease.renew() is False
    # The release frees the keys still ours at once, and leaves the thief's.
    began = time.monotonic()
    assert lease.release() is False
    assert time.monotonic() - began < 0.5
    assert token_of(r, KEYS[0]) is None and token_of(r, KEYS[2]) is None
    assert token_of(r, KEYS[1]) is not None, "the thief still holds its key"


def test_block_waits_until_every_key_is_free(server):
    r = server.client()
    client = LeaseClient(server.client())
    r.execute_command("LEASE.ACQUIRE", KEYS[0], "a", 10000)
    r.execute_command("LEASE.ACQUIRE", KEYS[2], "b", 10000)
    began = time.monotonic()
    assert client.acquire_many(KEYS, 10000, block_ms=300) is None
    assert time.monotonic() - began >= 0.3
    got: Dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: got.setdefault("lease", client.acquire_many(KEYS, 10000, block_ms=5000)))
    waiter.start()
    assert wait_until(3, lambda: waiters(r, KEYS[0]) == 1 and waiters(r, KEYS[2]) == 1)
    r.execute_command("LEASE.RELEASE", KEYS[0], "a")
    time.sleep(0.1)
    assert waiter.is_alive(), "still waiting for the last key"
    assert token_of(r, KEYS[0]) is None and token_of(r, KEYS[1]) is None, "nothing held in part"
    r.execute_command("LEASE.RELEASE", KEYS[2], "b")
    waiter.join(5)
    lease = got["lease"]
    assert lease is not None and tokens(r) == [lease.token] * 3
    assert lease.release()
    # A wait longer than a third of the ttl starts with a fresh deadline.
    r.execute_command("LEASE.ACQUIRE", KEYS[1], "holder", 400)
    sent = time.monotonic()
    lease = client.acquire_many(KEYS, 300, block_ms=3000)
    assert time.monotonic() - sent >= 0.35
    assert lease.lost.deadline > sent + 0.3, "renewed after the wait"
    time.sleep(0.6)
    assert not lease.lost.is_set(), lease.lost.reason
    assert tokens(r) == [lease.token] * 3
    lease.release()


def test_lease_many_releases_on_exit(server):
    r = server.client()
    client = LeaseClient(server.client())
    # A transfer between two accounts, fenced with the one token.
    r.hset("{bank}:a", "balance", 100)
    accounts = ["{bank}:a:lock", "{bank}:b:lock"]
    with client.lease_many(accounts, 10000, block_ms=1000) as lease:
        lease.fence(accounts[0], "HINCRBY", "{bank}:a", "balance", -30)
        lease.fence(accounts[1], "HINCRBY", "{bank}:b", "balance", 30)
    assert r.hget("{bank}:a", "balance") == b"70" and r.hget("{bank}:b", "balance") == b"30"
    assert all(token_of(r, k) is None for k in accounts)
    with pytest.raises(ZeroDivisionError):
        with client.lease_many(KEYS, 10000):
            raise ZeroDivisionError
    assert tokens(r) == [None] * 3, "released when the block raises"
    assert client.run_many(KEYS, 10000, lambda lease: lease.token) > 0
    assert tokens(r) == [None] * 3
    r.execute_command("LEASE.ACQUIRE", KEYS[2], "other", 10000)
    with pytest.raises(LeaseBusy):
        with client.lease_many(KEYS, 10000):
            pass
    r.execute_command("LEASE.RELEASE", KEYS[2], "other")
    with pytest.raises(LeaseLost) as e:
        with client.lease_many(KEYS, 600) as lease:
            r.delete(KEYS[0])
            assert lease.lost.wait(3)
    assert e.value.loss == Loss.REFUSED
    assert tokens(r) == [None] * 3, "the keys still held were released too"


def test_a_lost_macquire_reply_is_retried_with_the_same_owner(server):
    r = server.client()
    proxy = LossyProxy(server.port)
    try:
        import redis

        client = LeaseClient(redis.Redis(host="127.0.0.1", port=proxy.port))
        proxy.arm()
        lease = client.acquire_many(KEYS, 10000)
        assert proxy.dropped == 1, "the first reply was lost"
        assert info_int(r, "acquired") == 3 and info_int(r, "reacquired") == 3
        assert tokens(r) == [lease.token] * 3
        assert lease.release(), "the retry's owner is the holder"
        assert tokens(r) == [None] * 3
    finally:
        proxy.close()


def test_a_grace_refusal_of_a_multi_key_acquire_says_so(server):
    r = server.client()
    client = LeaseClient(server.client())
    r.execute_command("CONFIG", "SET", "lease.grace-ms", "3000")
    r.execute_command("REPLICAOF", "127.0.0.1", "1")
    r.execute_command("REPLICAOF", "NO", "ONE")
    with pytest.raises(LeaseGrace) as e:
        client.acquire_many(KEYS, 1000)
    assert 0 < e.value.remaining_ms <= 3000 and e.value.reason == "promoted"
    r.execute_command("CONFIG", "SET", "lease.grace-ms", "0")
    r.execute_command("LEASE.ACQUIRE", KEYS[0], "other", 10000)
    assert client.acquire_many(KEYS, 1000) is None, "contention is None"


def test_async_multi_key_leases(server):
    r = server.client()

    async def main():
        client = aclient(server)
        r.execute_command("LEASE.ACQUIRE", KEYS[1], "other", 10000)
        assert await client.acquire_many(KEYS, 10000) is None
        assert token_of(r, KEYS[0]) is None
        r.execute_command("LEASE.RELEASE", KEYS[1], "other")
        # One token on every key, a fence on each, the watchdog with MRENEW.
        lease = await client.acquire_many(KEYS, 300)
        assert isinstance(lease, AsyncMultiLease) and tokens(r) == [lease.token] * 3
        for i, key in enumerate(KEYS):
            assert await lease.fence(key, "HSET", "{acct}", f"f{i}", i) == 1
        with pytest.raises(ValueError):
            await lease.fence("{acct}:9", "GET", "x")
        with pytest.raises(AlreadyHeld):
            await client.acquire(KEYS[0], 1000)
        before = calls(r, "lease.mrenew")
        await asyncio.sleep(1.2)
        assert not lease.lost.is_set() and tokens(r) == [lease.token] * 3
        assert calls(r, "lease.mrenew") - before >= 8
        # One key taken: the loss of all; the release frees the rest.
        r.delete(KEYS[2])
        r.execute_command("LEASE.ACQUIRE", KEYS[2], "thief", 10000)
        await asyncio.wait_for(lease.lost.wait(), 3)
        assert lease.lost.reason == Loss.REFUSED
        with pytest.raises(StaleToken):
            await lease.fence(KEYS[2], "SET", "{acct}:v", 1)
        assert await lease.release() is False
        assert token_of(r, KEYS[0]) is None and token_of(r, KEYS[1]) is None
        assert token_of(r, KEYS[2]) is not None
        r.execute_command("LEASE.RELEASE", KEYS[2], "thief")
        # BLOCK until every key is free.
        r.execute_command("LEASE.ACQUIRE", KEYS[0], "a", 10000)
        waiter = asyncio.ensure_future(client.acquire_many(KEYS, 10000, block_ms=5000))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, wait_until, 3, lambda: waiters(r, KEYS[0]) == 1)
        assert not waiter.done()
        r.execute_command("LEASE.RELEASE", KEYS[0], "a")
        lease = await asyncio.wait_for(waiter, 5)
        assert tokens(r) == [lease.token] * 3
        assert await lease.release()
        # async with: a transfer, released on exit, also when it raises.
        r.hset("{bank}:a", "balance", 100)
        accounts = ["{bank}:a:lock", "{bank}:b:lock"]
        async with client.lease_many(accounts, 10000, block_ms=1000) as lease:
            await lease.fence(accounts[0], "HINCRBY", "{bank}:a", "balance", -30)
            await lease.fence(accounts[1], "HINCRBY", "{bank}:b", "balance", 30)
        assert all(token_of(r, k) is None for k in accounts)
        with pytest.raises(ZeroDivisionError):
            async with client.lease_many(KEYS, 10000):
                raise ZeroDivisionError
        assert tokens(r) == [None] * 3

        async def work(lease):
            return lease.token

        assert await client.run_many(KEYS, 10000, work) > 0
        assert tokens(r) == [None] * 3
        lease = await client.lease_many(KEYS, 10000)  # awaitable too
        assert await lease.release()

    asyncio.run(main())
    assert r.hget("{bank}:a", "balance") == b"70" and r.hget("{bank}:b", "balance") == b"30"


def test_async_a_lost_macquire_reply_is_retried_with_the_same_owner(server):
    r = server.client()
    proxy = LossyProxy(server.port)

    async def main():
        client = AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=proxy.port))
        proxy.arm()
        lease = await client.acquire_many(KEYS, 10000)
        assert proxy.dropped == 1
        assert info_int(r, "acquired") == 3 and info_int(r, "reacquired") == 3
        assert tokens(r) == [lease.token] * 3
        assert await lease.release()

    try:
        asyncio.run(main())
    finally:
        proxy.close()
    assert tokens(r) == [None] * 3


def test_the_readme_multi_key_example_runs_as_written(server, capsys):
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Multi-key leases", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    r = server.client()
    r.hset("{bank}:7", "balance", 100)
    exec(compile(code, "README.md", "exec"), {"r": server.client()})
    assert capsys.readouterr().out.startswith("token ")
    assert r.hget("{bank}:7", "balance") == b"70" and r.hget("{bank}:9", "balance") == b"30"
    assert token_of(r, "{bank}:7:lock") is None and token_of(r, "{bank}:9:lock") is None
