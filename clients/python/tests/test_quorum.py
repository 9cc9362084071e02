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

from conftest import KINDS, Frozen, Server, token_of, wait_until
from redis_lease import LeaseBusy, Loss, QuorumClient, StaleToken
from redis_lease.quorum import AsyncQuorumClient


@pytest.fixture(params=KINDS)
def masters(request):
    servers = [Server(request.param) for _ in range(5)]
    yield servers
    for s in servers:
        s.close()


def clients(masters):
    return [redis.Redis(host="127.0.0.1", port=m.port) for m in masters]


def test_one_token_committed_on_a_majority_renewed_fenced_and_released(masters):
    client = QuorumClient(clients(masters), io_timeout=0.2)
    # Master 4 is down (stopped): a majority of four still grants.
    frozen = Frozen(masters[4])
    with client.lease("job", 300, block_ms=1000) as lease:
        assert sorted(lease.committed) == [0, 1, 2, 3]
        time.sleep(1.2)  # four ttls: the watchdog renews on a majority
        assert not lease.lost.is_set(), lease.lost.reason
        for m in masters[:4]:
            assert token_of(m.client(), "job") == lease.token
        lease.fence("SET", "data", "v1")
        for m in masters[:4]:
            assert m.client().get("data") == b"v1"
        # A rival is refused while it is held.
        assert QuorumClient(clients(masters), io_timeout=0.2).acquire("job", 300) is None
    frozen.thaw()
    for m in masters[:4]:
        assert token_of(m.client(), "job") is None, "released everywhere"


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
            assert len(lease.committed) == 5
            await asyncio.sleep(1.2)
            assert not lease.lost.is_set(), lease.lost.reason
            await lease.fence("SET", "data", "async")
            with pytest.raises(LeaseBusy):
                async with client.lease("job", 300):
                    pass
        for m in masters:
            assert token_of(m.client(), "job") is None
            assert m.client().get("data") == b"async"
        lease = await client.acquire("job", 300)
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
    for m in masters:
        assert m.client().get("report:done") == b"1"
        assert token_of(m.client(), "job") is None
