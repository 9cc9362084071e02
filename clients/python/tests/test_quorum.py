"""The quorum helpers (redis_lease.quorum, design.md S9) against five real
masters of one kind, no replication between them: the token is committed
on a majority, the watchdog renews on a majority and signals the loss when
a majority refuses, the fence writes on the masters that committed the
token, a minority down changes nothing, and contenders never hold at once.
The history test with faults and its controls are the Rust helper's
(clients/rust/tests/quorum.rs); both run the same algorithm."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from conftest import KINDS, Frozen, Server, Silent, token_of, wait_until
from redis_lease import LeaseBusy, LeaseExpiring, Loss, Outlier, QuorumClient, StaleToken
from redis_lease.quorum import AsyncQuorumClient


@pytest.fixture(params=KINDS)
def masters(request):
    servers = [Server(request.param) for _ in range(5)]
    yield servers
    for s in servers:
        s.close()


def committed_within(committed, answering):
    """A lease's ``committed``: a majority of the masters ``answering``, in
    order. Each step is decided by the first majority to answer; a master
    that answers much later (on a loaded machine) is not in ``committed``,
    though it holds the lease too."""
    n = max(len(answering), max(answering) + 1)
    assert len(committed) > n // 2 and set(committed) <= set(answering) and committed == sorted(committed), (committed, answering)


def one_round_trip_each(acquires):
    """One LEASE.ACQUIRE per master per acquire: no step 3 (one acquire of
    the run let through: on a machine so loaded that a master handles a
    request more than 20 ms after the client read its clock, it answers
    above the proposal)."""
    assert all(a >= CYCLES for a in acquires) and sum(a - CYCLES for a in acquires) <= 5, acquires


def clients(masters):
    return [redis.Redis(host="127.0.0.1", port=m.port) for m in masters]


def test_one_token_committed_on_a_majority_renewed_fenced_and_released(masters):
    client = QuorumClient(clients(masters), io_timeout=0.2)
    # Master 4 is down (stopped): a majority of four still grants.
    frozen = Frozen(masters[4])
    with client.lease("job", 300, block_ms=1000) as lease:
        committed_within(lease.committed, [0, 1, 2, 3])
        time.sleep(1.2)  # four ttls: the watchdog renews on a majority
        assert not lease.lost.is_set(), lease.lost.reason
        for m in masters[:4]:
            assert token_of(m.client(), "job") == lease.token
        lease.fence("SET", "data", "v1")
        for i in lease.committed:
            assert masters[i].client().get("data") == b"v1"
        # A rival is refused while it is held.
        assert QuorumClient(clients(masters), io_timeout=0.2).acquire("job", 300) is None
    frozen.thaw()
    # The release returns once a majority released; the rest follow.
    assert wait_until(2, lambda: all(token_of(m.client(), "job") is None for m in masters[:4])), "released everywhere"


def test_a_quorum_fence_with_min_ttl_ms_longer_than_the_lease_runs_nowhere_and_is_lease_expiring(masters):
    client = QuorumClient(clients(masters), io_timeout=0.5)
    with client.lease("job", 2000) as lease:
        with pytest.raises(LeaseExpiring):
            lease.fence("SET", "data", "v1", min_ttl_ms=60_000)
        assert all(m.client().exists("data") == 0 for m in masters)
        lease.fence("SET", "data", "v2", min_ttl_ms=100)
        assert all(masters[i].client().get("data") == b"v2" for i in lease.committed)


def test_a_majority_that_refuses_is_the_loss_and_the_fence_stops(masters):
    client = QuorumClient(clients(masters), io_timeout=0.2)
    lease = client.acquire("job", 300)
    for m in masters[:2]:
        m.client().delete("job")
    time.sleep(0.3)
    assert not lease.lost.is_set(), "three of five still hold it"
    masters[2].client().delete("job")
    assert lease.lost.wait(1) and lease.lost.reason == Loss.REFUSED
    with pytest.raises(StaleToken):
        lease.fence("SET", "data", "v2")
    assert not lease.release(), "not held on a majority"


def test_a_frozen_majority_ends_the_validity_on_time(masters):
    client = QuorumClient(clients(masters), io_timeout=0.2)
    lease = client.acquire("job", 300)
    deadline = lease.lost.deadline
    frozen = [Frozen(m) for m in masters[:3]]
    assert lease.lost.wait(1) and lease.lost.reason == Loss.EXPIRED
    assert deadline <= time.monotonic() < deadline + 0.1
    for f in frozen:
        f.thaw()


def test_tokens_of_successive_holdings_increase_and_holders_never_overlap(masters):
    records = []
    lock = threading.Lock()

    def worker(n):
        client = QuorumClient(clients(masters), io_timeout=0.2, watchdog=False)
        end = time.monotonic() + 2.0
        for _ in range(1000):
            if time.monotonic() > end:
                break
            lease = client.acquire("job", 300, block_ms=300)
            if lease is None:
                continue
            got = time.monotonic()
            until = lease.lost.deadline
            time.sleep(0.005)
            done = min(time.monotonic(), until)  # its last use: before the release goes out
            lease.release()
            with lock:
                records.append((got, done, lease.token, n))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    records.sort()
    assert len(records) >= 10, records
    for a, b in zip(records, records[1:]):
        assert b[2] > a[2], f"tokens go backwards: {a} then {b}"
        assert b[0] >= a[1] or a[3] == b[3], f"two holders: {a} and {b}"


def test_asyncio_quorum_lease(masters):
    async def main():
        client = AsyncQuorumClient([aredis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.2)
        async with client.lease("job", 300, block_ms=1000) as lease:
            committed_within(lease.committed, [0, 1, 2, 3, 4])
            await asyncio.sleep(1.2)
            assert not lease.lost.is_set(), lease.lost.reason
            await lease.fence("SET", "data", "async")
            with pytest.raises(LeaseBusy):
                async with client.lease("job", 300):
                    pass
        # The fence ran where the token was committed; the release returned
        # once a majority released, the rest follow.
        for i in lease.committed:
            assert masters[i].client().get("data") == b"async"
        assert wait_until(2, lambda: all(token_of(m.client(), "job") is None for m in masters)), "released everywhere"
        again = await client.acquire("job", 300)
        assert again is not None
        lease = again
        for m in masters[:3]:
            m.client().delete("job")
        await asyncio.wait_for(lease.lost.wait(), 1)
        assert lease.lost.reason == Loss.REFUSED
        await client.close()

    asyncio.run(main())


def test_the_readme_quorum_example_runs_as_written(masters, capsys):
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = readme.split("## Quorum leases", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "README.md", "exec"), {"ports": [m.port for m in masters]})
    assert capsys.readouterr().out.startswith("token ")
    # The fence ran on the masters that committed the token: a majority (on
    # a loaded machine a master that answered late is not among them).
    done = [m.client().get("report:done") for m in masters]
    assert done.count(b"1") >= 3 and set(done) <= {b"1", None}, done
    for m in masters:
        assert token_of(m.client(), "job") is None


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


class SomeSilent:
    """``n`` masters: real servers of ``kind``, and at the positions
    ``silent`` masters that accept no connection."""

    def __init__(self, kind, n, silent):
        self.servers = []
        self.ports = []
        for i in range(n):
            m = Silent() if i in silent else Server(kind)
            self.servers.append(m)
            self.ports.append(m.port)

    def close(self):
        for m in self.servers:
            m.close()


# The ttl of the silent-master tests, and its step timeout (a third of it:
# the default io_timeout is longer). A step timeout per silent master, the
# failure these tests catch, takes at least two steps with two silent; one
# step plus a loaded machine's connects stays below that.
SILENT_TTL_MS = 900
STEP = 0.3
ONE_STEP_AT_MOST = STEP * 2


def test_three_of_seven_masters_silent_still_give_a_lease(kind):
    ms = SomeSilent(kind, 7, {1, 3, 5})
    try:
        client = QuorumClient([redis.Redis(port=p) for p in ms.ports], watchdog=False)
        lease = client.acquire("job", SILENT_TTL_MS, block_ms=3000)
        assert lease is not None, "four masters answer: a majority"
        committed_within(lease.committed, [0, 2, 4, 6])
        assert lease.release()
        client.close()
    finally:
        ms.close()


def test_two_silent_masters_cost_one_step_timeout_per_acquire_and_release(kind):
    ms = SomeSilent(kind, 5, {0, 3})
    try:
        client = QuorumClient([redis.Redis(port=p) for p in ms.ports], watchdog=False)
        for _ in range(2):
            t = time.monotonic()
            lease = client.acquire("job", SILENT_TTL_MS)
            took_acquire = time.monotonic() - t
            assert lease is not None, "three of five"
            t = time.monotonic()
            assert lease.release()
            took_release = time.monotonic() - t
            print(f"2 of 5 silent ({kind}): acquire {took_acquire:.3f} s, release {took_release:.3f} s")
            assert took_acquire < ONE_STEP_AT_MOST, f"acquire took {took_acquire:.3f} s: one step timeout, not one per silent master"
            assert took_release < ONE_STEP_AT_MOST, f"release took {took_release:.3f} s: one step timeout, not one per silent master"
        client.close()
    finally:
        ms.close()


def test_the_asyncio_client_with_silent_masters_takes_one_step_timeout(kind):
    async def main(ports, n_silent):
        client = AsyncQuorumClient([aredis.Redis(port=p) for p in ports], watchdog=False)
        for _ in range(2):
            t = time.monotonic()
            lease = await client.acquire("job", SILENT_TTL_MS, block_ms=3000)
            took_acquire = time.monotonic() - t
            assert lease is not None, f"a majority answers ({n_silent} of {len(ports)} silent)"
            t = time.monotonic()
            assert await lease.release()
            took_release = time.monotonic() - t
            assert took_acquire < ONE_STEP_AT_MOST and took_release < ONE_STEP_AT_MOST, (took_acquire, took_release)
        await client.close()

    for n, silent in ((7, {1, 3, 5}), (5, {0, 3})):
        ms = SomeSilent(kind, n, silent)
        try:
            asyncio.run(main(ms.ports, len(silent)))
        finally:
            ms.close()


DAY_MS = 86_400_000


@pytest.fixture
def one_far_ahead(kind):
    """Five masters, master 0's clock 400 days ahead: beyond the FLOOR bound
    of the others (365 days once, the grace length now)."""
    servers = [Server(kind, clock_shift_ms=400 * DAY_MS if i == 0 else None) for i in range(5)]
    yield servers
    for s in servers:
        s.close()


def check_left_out(masters, lease, seen):
    """Committed without master 0, below its token, and master 0 reported
    once with its address and about 400 days ahead."""
    committed_within(lease.committed, [1, 2, 3, 4])
    assert len(seen) == 1, seen
    o = seen[0]
    assert isinstance(o, Outlier)
    assert (o.master, o.addr) == (0, f"127.0.0.1:{masters[0].port}")
    assert lease.token < o.token and o.instead == lease.token
    assert 399 <= o.ahead_ms // DAY_MS <= 400, o


def test_a_master_whose_clock_is_far_ahead_is_left_out_and_reported(one_far_ahead, caplog):
    masters = one_far_ahead
    seen: list[Outlier] = []
    client = QuorumClient(
        [redis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.2, watchdog=False, on_outlier=seen.append
    )
    last = 0
    with caplog.at_level("WARNING", logger="redis_lease.quorum"):
        for n in range(3):
            lease = client.acquire("job", 2000, block_ms=1000)
            assert lease is not None, "a majority without the outlier"
            check_left_out(masters, lease, seen)
            assert lease.token > last, "tokens of successive holdings increase"
            last = lease.token
            lease.fence("SET", "data", n)
            assert lease.release()
            seen.clear()
    warnings = [r.getMessage() for r in caplog.records if r.name == "redis_lease.quorum"]
    assert len(warnings) == 3 and f"127.0.0.1:{masters[0].port}" in warnings[0], warnings
    client.close()


def test_the_asyncio_client_leaves_out_and_reports_a_master_whose_clock_is_far_ahead(one_far_ahead):
    masters = one_far_ahead

    async def main():
        seen: list[Outlier] = []
        client = AsyncQuorumClient(
            [aredis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.2, watchdog=False, on_outlier=seen.append
        )
        last = 0
        for _ in range(3):
            lease = await client.acquire("job", 2000, block_ms=1000)
            assert lease is not None, "a majority without the outlier"
            check_left_out(masters, lease, seen)
            assert lease.token > last, "tokens of successive holdings increase"
            last = lease.token
            assert await lease.release()
            seen.clear()
        await client.close()

    asyncio.run(main())


def test_a_fenced_command_that_fails_raises_its_own_error(kind):
    servers = [Server(kind) for _ in range(3)]
    try:
        for s in servers:
            s.client().set("data", "not a number")
        client = QuorumClient([redis.Redis(host="127.0.0.1", port=s.port) for s in servers], watchdog=False)
        with client.lease("job", 5000) as lease:
            with pytest.raises(redis.ResponseError, match="not an integer") as e:
                lease.fence("INCR", "data")
            assert not isinstance(e.value, StaleToken)
            assert lease.fence("APPEND", "data", "!") == 13, "the token is current: a command that works runs"
        client.close()

        async def main():
            client = AsyncQuorumClient([aredis.Redis(host="127.0.0.1", port=s.port) for s in servers], watchdog=False)
            async with client.lease("job", 5000) as lease:
                with pytest.raises(redis.ResponseError, match="not an integer") as e:
                    await lease.fence("INCR", "data")
                assert not isinstance(e.value, StaleToken)
                assert await lease.fence("APPEND", "data", "!") == 14
            await client.close()

        asyncio.run(main())
    finally:
        for s in servers:
            s.close()


# --- Round trips (design.md S9, one round trip in the common case), counted
# on the masters with INFO commandstats.

CYCLES = 20


def calls(masters, command):
    """``calls`` of ``command`` in each master's INFO commandstats (0: none)."""
    out = []
    for m in masters:
        stats = {k.lower(): v for k, v in m.client().info("commandstats").items()}
        out.append(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)))
    return out


def reset_stats(masters):
    for m in masters:
        m.client().config_resetstat()


def test_with_agreeing_clocks_an_acquire_and_a_release_are_one_round_trip_each(masters):
    client = QuorumClient(clients(masters), io_timeout=0.2, watchdog=False)
    reset_stats(masters)
    last = 0
    for _ in range(CYCLES):
        lease = client.acquire("job", 2000)
        assert lease is not None
        assert lease.token > last, "tokens of successive holdings increase"
        last = lease.token
        assert lease.release()
    # The releases not in when the release returned still arrive.
    assert wait_until(2, lambda: calls(masters, "lease.release") == [CYCLES] * 5)
    acquires = calls(masters, "lease.acquire")
    print(f"{CYCLES} cycles: LEASE.ACQUIRE per master {acquires}")
    one_round_trip_each(acquires)
    client.close()


def test_the_asyncio_client_acquires_and_releases_in_one_round_trip_each(masters):
    async def main():
        client = AsyncQuorumClient([aredis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.2, watchdog=False)
        last = 0
        for _ in range(CYCLES):
            lease = await client.acquire("job", 2000)
            assert lease is not None and lease.token > last
            last = lease.token
            assert await lease.release()
        await asyncio.sleep(0.05)  # the releases still out
        await client.close()

    reset_stats(masters)
    asyncio.run(main())
    assert wait_until(2, lambda: calls(masters, "lease.release") == [CYCLES] * 5)
    one_round_trip_each(calls(masters, "lease.acquire"))


def test_a_client_whose_clock_runs_behind_pays_step_3_once_then_proposes_above_the_masters_clocks(masters):
    client = QuorumClient(clients(masters), io_timeout=0.2, watchdog=False)
    client._clock_offset_ms = -5000  # plays a client whose clock is 5 s slow
    reset_stats(masters)
    lease = client.acquire("job", 2000)
    # Step 3 goes to the masters whose grant was in when step 1 was decided
    # (a majority; on a loaded machine not always all five).
    assert lease is not None and len(lease.committed) >= 3, lease.committed
    assert lease.release()
    # Every master's release comes after its acquire: all in once all are.
    assert wait_until(2, lambda: calls(masters, "lease.release") == [1] * 5)
    want = [1 + (i in lease.committed) for i in range(5)]
    assert calls(masters, "lease.acquire") == want, "step 1 everywhere, then step 3 where committed"
    reset_stats(masters)
    for _ in range(CYCLES):
        lease = client.acquire("job", 2000)
        assert lease is not None and lease.release()
    one_round_trip_each(calls(masters, "lease.acquire"))
    client.close()


def test_a_master_whose_clock_is_far_ahead_costs_no_round_trip(one_far_ahead):
    masters = one_far_ahead
    seen: list[Outlier] = []
    client = QuorumClient(clients(masters), io_timeout=0.2, watchdog=False, on_outlier=seen.append)
    reset_stats(masters)

    async def main():
        aclient = AsyncQuorumClient([aredis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.2, watchdog=False)
        for _ in range(CYCLES):
            lease = await aclient.acquire("job", 2000)
            assert lease is not None
            committed_within(lease.committed, [1, 2, 3, 4])
            assert await lease.release()
        await aclient.close()

    for _ in range(CYCLES):
        lease = client.acquire("job", 2000)
        assert lease is not None
        committed_within(lease.committed, [1, 2, 3, 4])
        assert lease.release()
    asyncio.run(main())
    acquires = calls(masters, "lease.acquire")
    assert all(a >= 2 * CYCLES for a in acquires) and sum(a - 2 * CYCLES for a in acquires) <= 10, acquires
    # Reported when its answer is in while the step is decided (every time
    # but on a machine so loaded that it answers 25 ms after the others).
    assert CYCLES // 2 <= len(seen) <= CYCLES and all(o.master == 0 for o in seen), seen
    client.close()
