"""The asyncio helpers against real servers (every kind in conftest.KINDS).
Each test runs its own event loop (asyncio.run): no pytest plugin needed."""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from conftest import (
    Frozen,
    LossyProxy,
    blocked_acquirer,
    calls,
    competitor,
    info_int,
    lease_clients,
    token_of,
    wait_until,
    waiters,
)
from redis_lease import AlreadyHeld, LeaseBusy, LeaseExpiring, LeaseGrace, LeaseLost, Loss, SharedWrite, StaleToken
from redis_lease.aio import AsyncLeaseClient

HERE = pathlib.Path(__file__).resolve().parent


def aclient(server, **kw) -> AsyncLeaseClient:
    return AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=server.port), **kw)


def test_a_renewal_after_the_loss_answers_false_and_sends_nothing(server):
    # As the sync lease: lost, a renewal is not sent.
    r = server.client()

    async def main():
        lease = await aclient(server, watchdog=False).acquire("job", 300)
        assert await asyncio.wait_for(lease.lost.wait(), 5)
        assert lease.lost.reason == Loss.EXPIRED
        sent = calls(r, "lease.renew")
        assert await lease.renew() is False
        assert calls(r, "lease.renew") == sent

    asyncio.run(main())


def test_a_renewal_with_no_reply_before_the_deadline_answers_false(server):
    async def main():
        lease = await aclient(server, watchdog=False).acquire("job", 500)
        frozen = Frozen(server)
        try:
            assert await lease.renew() is False
            assert lease.lost.reason == Loss.EXPIRED
        finally:
            frozen.thaw()

    asyncio.run(main())


def test_watchdog_keeps_the_lease_over_several_ttls(server):
    r = server.client()

    async def main():
        lease = await aclient(server).acquire("job", 300)
        start = time.monotonic()
        for _ in range(40):
            if time.monotonic() - start >= 1.8:
                break
            assert not lease.lost.is_set()
            # Off the event loop: the watchdog renews while the check runs.
            assert await asyncio.to_thread(token_of, r, "job") == lease.token
            await asyncio.sleep(0.05)
        assert time.monotonic() - start >= 1.8
        assert await lease.release()

    asyncio.run(main())
    assert info_int(r, "renewed") >= 10
    assert token_of(r, "job") is None


def test_loss_is_signalled_before_anyone_else_can_get_the_lease(server):
    ttl = 0.4
    thawed = {}

    async def main():
        lease = await aclient(server).acquire("job", int(ttl * 1000))
        deadline = lease.lost.deadline
        rival = competitor(server, "job", 10)
        frozen = Frozen(server)

        def thaw():
            time.sleep(ttl + 0.3)
            frozen.thaw()
            thawed["at"] = time.monotonic()

        t = threading.Thread(target=thaw)
        t.start()
        # The watchdog's renewal hangs on the stopped server; the signal
        # must not wait for it.
        assert await asyncio.wait_for(lease.lost.wait(), 10)
        lost_at = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, t.join, 15)
        await asyncio.get_running_loop().run_in_executor(None, rival.join, 15)
        assert lease.lost.reason == Loss.EXPIRED
        assert deadline <= lost_at < deadline + 0.25  # at once: well before the thaw (deadline + 0.3)
        assert lost_at < thawed["at"], "signalled only after the server ran again"
        assert rival.result is not None and lost_at < rival.result
        with pytest.raises(StaleToken):
            await lease.fence("SET", "data", "stale")
        assert await lease.release() is False

    asyncio.run(main())
    assert server.client().exists("data") == 0


def test_fence_with_min_ttl_ms_raises_lease_expiring_runs_nothing_and_keeps_the_lease(server):
    r = server.client()

    async def main():
        lease = await aclient(server).acquire("job", 2000)
        with pytest.raises(LeaseExpiring) as refused:
            await lease.fence("HSET", "data", "v", 1, min_ttl_ms=60_000)
        assert 0 <= refused.value.left_ms <= 2000 and refused.value.min_ttl_ms == 60_000
        assert await lease.fence("HSET", "data", "v", 2, min_ttl_ms=100) == 1
        assert not lease.lost.is_set()
        many = await aclient(server).acquire_many(["{m}a", "{m}b"], 2000)
        with pytest.raises(LeaseExpiring):
            await many.fence("{m}a", "SET", "{m}x", 1, min_ttl_ms=60_000)
        assert await lease.release() and await many.release()

    asyncio.run(main())
    assert r.hget("data", "v") == b"2"
    assert r.exists("{m}x") == 0


def test_a_refused_renewal_signals_the_loss_and_the_fence_refuses(server):
    r = server.client()

    async def main():
        lease = await aclient(server).acquire("job", 600)
        await lease.fence("HSET", "data", "v", 1)
        r.delete("job")
        assert r.execute_command("LEASE.ACQUIRE", "job", "thief", 10000) is not None
        start = time.monotonic()
        await asyncio.wait_for(lease.lost.wait(), 3)
        assert lease.lost.reason == Loss.REFUSED
        assert time.monotonic() - start < 0.6
        with pytest.raises(StaleToken):
            await lease.fence("HSET", "data", "v", 2)
        assert await lease.renew() is False

    asyncio.run(main())
    assert r.hget("data", "v") == b"1"


def test_a_lost_acquire_reply_is_retried_with_the_same_owner(server):
    r = server.client()
    proxy = LossyProxy(server.port)

    async def main():
        client = AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=proxy.port))
        proxy.arm()
        lease = await client.acquire("job", 10000)
        assert lease is not None and proxy.dropped == 1
        assert info_int(r, "acquired") == 1
        assert info_int(r, "reacquired") == 1
        assert token_of(r, "job") == lease.token
        assert await lease.release()

    try:
        asyncio.run(main())
    finally:
        proxy.close()
    assert token_of(r, "job") is None


def test_client_kill_of_a_blocked_acquire_is_retried(server):
    r = server.client()
    assert r.execute_command("LEASE.ACQUIRE", "job", "holder", 10000) is not None

    async def main():
        task = asyncio.ensure_future(aclient(server).acquire("job", 10000, 10000))
        loop = asyncio.get_running_loop()
        first = await loop.run_in_executor(None, blocked_acquirer, r)
        r.client_kill_filter(_id=first)
        ok = await loop.run_in_executor(None, wait_until, 5, lambda: blocked_acquirer(r) != first)
        assert ok, "the retry waits again"
        r.execute_command("LEASE.RELEASE", "job", "holder")
        lease = await asyncio.wait_for(task, 15)
        assert lease is not None and token_of(r, "job") == lease.token
        assert info_int(r, "acquired") == 2
        assert await lease.release()

    asyncio.run(main())


def test_the_lease_is_released_when_the_work_raises_or_is_cancelled(server):
    r = server.client()

    async def main():
        client = aclient(server)
        with pytest.raises(ZeroDivisionError):
            async with client.lease("job", 10000) as lease:
                await lease.fence("SET", "x", 1)
                raise ZeroDivisionError
        assert token_of(r, "job") is None

        async def work(lease):
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await client.run("job", 10000, work)
        assert token_of(r, "job") is None

        async def forever():
            async with client.lease("job", 10000):
                await asyncio.sleep(60)

        task = asyncio.ensure_future(forever())
        await asyncio.sleep(0.2)
        assert token_of(r, "job") is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert token_of(r, "job") is None, "released on cancellation"

    asyncio.run(main())
    assert info_int(r, "released") == 3


def test_busy_and_blocking(server):
    r = server.client()

    async def main():
        client = aclient(server)
        a = await aclient(server).acquire("job", 10000)  # another client holds it
        assert await client.acquire("job", 10000) is None
        with pytest.raises(LeaseBusy):
            async with client.lease("job", 10000):
                pass
        start = time.monotonic()
        assert await client.acquire("job", 10000, block_ms=300) is None
        assert time.monotonic() - start >= 0.3
        b = asyncio.ensure_future(client.acquire("job", 10000, 0))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, wait_until, 5, lambda: waiters(r, "job") == 1)
        assert await a.release()
        got = await asyncio.wait_for(b, 10)
        assert got.token > a.token
        assert await got.release()

    asyncio.run(main())


def test_the_readme_example_runs(server):
    spec = importlib.util.spec_from_file_location(
        "quickstart_async", HERE.parent / "examples/quickstart_async.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    asyncio.run(example.run(server.url()))
    r = server.client()
    assert r.hget("{acct:7}", "steps") == b"3"
    assert token_of(r, "{acct:7}:lock") is None


def test_a_lease_dropped_without_release_stops_renewing(server):
    import gc

    r = server.client()

    async def main():
        lease = await aclient(server).acquire("job", 300)
        assert token_of(r, "job") == lease.token
        del lease
        gc.collect()
        loop = asyncio.get_running_loop()
        gone = await loop.run_in_executor(None, wait_until, 3, lambda: token_of(r, "job") is None)
        assert gone, "the watchdog still renews a lease nobody holds"

    asyncio.run(main())


def test_a_frozen_server_bounds_every_wait(server):
    async def main():
        client = AsyncLeaseClient(
            aredis.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5),
            io_timeout=0.5,
        )
        frozen = Frozen(server)
        began = time.monotonic()
        with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
            await client.acquire("job", 5000)
        took = time.monotonic() - began
        frozen.thaw()
        assert took < 0.5 * 4 + 1.0, f"acquire on a frozen server took {took:.1f} s"

    asyncio.run(main())


def test_leaving_the_block_after_a_loss_is_quick(server):
    async def main():
        client = aclient(server, io_timeout=2.0)
        with pytest.raises(LeaseLost):  # the loss is reported at the end
            async with client.lease("job", 400) as lease:
                frozen = Frozen(server)
                await asyncio.wait_for(lease.lost.wait(), 5)
                assert lease.lost.reason == Loss.EXPIRED
                began = time.monotonic()
        took = time.monotonic() - began
        frozen.thaw()
        assert took < 1.0, f"leaving the block took {took:.1f} s"

    asyncio.run(main())


def test_a_fence_after_the_server_dropped_the_connection_is_sent_on_a_new_one(server):
    async def main():
        r = server.client()
        async with aclient(server).lease("job", 600) as lease:
            await lease.fence("SET", "data", "before")
            before = info_int(r, "renewed")
            r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            for _ in range(150):  # at most 3 s
                if info_int(r, "renewed") > before:
                    break
                await asyncio.sleep(0.02)
            assert info_int(r, "renewed") > before, "the watchdog renews again"
            assert await lease.fence("SET", "data", "after") == b"OK"
            assert not lease.lost.is_set()
        assert server.client().get("data") == b"after"

    asyncio.run(main())


def test_a_grace_refusal_says_so_and_how_long_remains(server):
    r = server.client()
    r.execute_command("CONFIG", "SET", "lease.grace-ms", "3000")
    r.execute_command("REPLICAOF", "127.0.0.1", "1")
    r.execute_command("REPLICAOF", "NO", "ONE")

    async def main():
        with pytest.raises(LeaseGrace) as e:
            await aclient(server).acquire("job", 1000)
        assert 0 < e.value.remaining_ms <= 3000 and e.value.reason == "promoted"

    asyncio.run(main())


def test_a_loss_during_the_block_is_raised_at_its_end(server):
    r = server.client()

    async def main():
        client = aclient(server)
        with pytest.raises(LeaseLost) as e:
            async with client.lease("job", 600) as lease:
                r.delete("job")
                await asyncio.wait_for(lease.lost.wait(), 3)
        assert e.value.loss == Loss.REFUSED
        async with client.lease("job", 600):
            pass

    asyncio.run(main())


def test_a_second_acquire_of_a_key_this_client_holds_fails_at_once(server):
    async def main():
        client = aclient(server)
        lease = await client.acquire("job", 5000)
        with pytest.raises(AlreadyHeld):
            await client.acquire("job", 5000, block_ms=0)
        assert await aclient(server).acquire("job", 5000) is None
        await lease.release()
        again = await client.acquire("job", 5000)
        assert again is not None
        await again.release()

    asyncio.run(main())


def test_shared_and_limit_modes(server):
    r = server.client()
    r.set("docdata", "v")

    async def main():
        a = await aclient(server).acquire("doc", 600, shared=True)
        b = await aclient(server).acquire("doc", 600, shared=True)
        assert a is not None and b is not None
        assert await aclient(server).acquire("doc", 600) is None
        assert await a.fence("GET", "docdata") == b"v"
        with pytest.raises(SharedWrite):
            await a.fence("SET", "docdata", "x")
        await asyncio.sleep(1.0)
        assert not a.lost.is_set() and not b.lost.is_set(), "renewed"
        await a.release()
        await b.release()
        async with aclient(server).lease("pool", 600, limit=2) as p:
            assert p.token > 0

    asyncio.run(main())


def test_many_leases_share_connections_and_batched_renewals(server):
    # As in test_sync.py: 300 leases of one client share its pool and one
    # watchdog task that pipelines.
    r = server.client()
    ttl = 900

    async def main():
        client = aclient(server)
        leases = [await client.acquire(f"job:{i}", ttl) for i in range(300)]
        await asyncio.sleep(ttl * 3 / 1000)
        assert not any(lease.lost.is_set() for lease in leases), "every lease is still held"
        for i in range(0, 300, 37):
            assert token_of(r, f"job:{i}") == leases[i].token
        stats = client.watchdog_stats()
        assert stats["leases"] == 300
        assert stats["renewals"] >= 300 * 6, stats
        assert stats["round_trips"] * 50 <= stats["renewals"], f"batched: {stats}"
        assert lease_clients(r) == 2, "one pooled connection and the watchdog's"
        r.delete("job:7")
        began = time.monotonic()
        await asyncio.wait_for(leases[7].lost.wait(), ttl / 1000)
        assert leases[7].lost.reason == Loss.REFUSED
        assert time.monotonic() - began <= ttl / 3000 + 0.15
        assert sum(lease.lost.is_set() for lease in leases) == 1
        for lease in leases:
            await lease.release()
        assert client.watchdog_stats()["leases"] == 0
        await client.close()

    asyncio.run(main())
    assert info_int(r, "released") == 299
