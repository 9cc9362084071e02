"""Labels (``LABEL``) and the waiters' list (``LEASE.WAITERS``), design.md
S11, through every acquire path of the helpers, against real servers (every
kind in conftest.KINDS)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Any, List, Optional

import redis
import redis.asyncio as aredis

from conftest import KINDS, LossyProxy, Server, aclose, info_int, lease_info, wait_until
from redis_lease import (
    DEFAULT_LABEL,
    FOREVER,
    LeaseClient,
    Lock,
    QuorumClient,
    Waiter,
    default_label,
    use_lease_locks,
)
from redis_lease._common.label import program_name
from redis_lease.aio import AsyncLeaseClient
from redis_lease.aio import Lock as AsyncLock
from redis_lease.quorum import AsyncQuorumClient

import pytest


def label_of(r: redis.Redis, key: str) -> Optional[bytes]:
    info = lease_info(r, key)
    assert info is not None, f"{key} is not held"
    label: Optional[bytes] = info["label"]
    return label


def holder_labels(r: redis.Redis, key: str) -> List[Optional[bytes]]:
    """The label of each holder of a counting or shared lease, by token."""
    info = lease_info(r, key)
    assert info is not None
    out = []
    for h in info["holders"]:
        if not isinstance(h, dict):
            h = dict(zip(h[::2], h[1::2]))
        h = {(k.decode() if isinstance(k, bytes) else k): v for k, v in h.items()}
        out.append(h["label"])
    return out


def test_the_default_label_names_the_host_the_pid_and_the_program(server):
    r = server.client()
    expected = f"{socket.gethostname()} pid {os.getpid()} {program_name()}".encode()
    assert default_label() == expected
    assert default_label() is default_label(), "computed once per process"
    client = LeaseClient(server.client())
    with client.lease("job", 10000) as lease:
        assert label_of(r, "job") == expected
        info = lease_info(r, "job")
        assert info is not None
        since = int(info["since"])
        assert abs(since - time.time() * 1000) < 60_000, "since is unix time in ms"
        assert lease.renew()
        info = lease_info(r, "job")
        assert info is not None and int(info["since"]) == since, "a renewal keeps since"


def test_a_label_per_client_per_call_or_none(server):
    r = server.client()
    off = LeaseClient(server.client(), label=None)
    with off.lease("a", 10000):
        assert label_of(r, "a") is None
    with off.lease("a", 10000, label="this call"):
        assert label_of(r, "a") == b"this call"
    mine = LeaseClient(server.client(), label="worker-7 job 991")
    with mine.lease("b", 10000):
        assert label_of(r, "b") == b"worker-7 job 991"
    with mine.lease("b", 10000, label=None):
        assert label_of(r, "b") is None, "None on the call turns the client's off"
    with mine.lease("b", 10000, label=False):
        assert label_of(r, "b") is None
    with mine.lease("b", 10000, label=""):
        assert label_of(r, "b") is None, "an empty label is none (the server refuses an empty one)"
    with mine.lease("b", 10000, label=b"\xff\x00binary"):
        assert label_of(r, "b") == b"\xff\x00binary", "bytes are sent as they are"
    mine.label = DEFAULT_LABEL
    with mine.lease("b", 10000):
        assert label_of(r, "b") == default_label()
    # Longer than 256 bytes: cut on a character boundary.
    with mine.lease("c", 10000, label="é" * 200):
        assert label_of(r, "c") == ("é" * 128).encode()
    with mine.lease("c", 10000, label="x" + "é" * 200):
        assert label_of(r, "c") == ("x" + "é" * 127).encode(), "255 bytes: the cut character is dropped"
    with pytest.raises(TypeError):
        mine.acquire("d", 10000, label=12)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LeaseClient(server.client(), label=True)
    assert lease_info(r, "d") is None, "nothing sent"


def test_labels_on_shared_and_limit_holders_and_on_every_key_of_a_multi_key_lease(server):
    r = server.client()
    client = LeaseClient(server.client(), label="pool")
    one = client.acquire("sem", 10000, limit=2, label="permit 1")
    two = LeaseClient(server.client()).acquire("sem", 10000, limit=2, label=None)
    assert one is not None and two is not None
    assert holder_labels(r, "sem") == [b"permit 1", None]
    reader = client.acquire("rw", 10000, shared=True)
    assert reader is not None
    assert holder_labels(r, "rw") == [b"pool"]
    with client.lease_many(["{m}:1", "{m}:2", "{m}:3"], 10000, label="transfer 12") as lease:
        assert lease.token
        for k in ("{m}:1", "{m}:2", "{m}:3"):
            assert label_of(r, k) == b"transfer 12"
    with client.lease_many(["{m}:1", "{m}:2"], 10000):
        assert label_of(r, "{m}:2") == b"pool"
    assert client.run_many(["{m}:1"], 10000, lambda _: label_of(r, "{m}:1"), label=None) is None
    assert client.run("x", 10000, lambda _: label_of(r, "x"), label="run") == b"run"
    for held in (one, two, reader):
        assert held.release()


def test_a_lost_reply_is_retried_with_the_same_label(server):
    r = server.client()
    proxy = LossyProxy(server.port)
    try:
        client = LeaseClient(redis.Redis(host="127.0.0.1", port=proxy.port), label="retried")
        proxy.arm()
        lease = client.acquire("job", 10000, block_ms=1000)
        assert lease is not None
        assert proxy.dropped == 1, "the first reply was lost"
        assert info_int(r, "reacquired") == 1, "the retry took the same lease again"
        assert label_of(r, "job") == b"retried"
        assert lease.release()
    finally:
        proxy.close()


def waiting(client: LeaseClient, key: str, n: int) -> List[Waiter]:
    found: List[Waiter] = []

    def enough() -> bool:
        found[:] = client.waiters(key)
        return len(found) >= n

    assert wait_until(5, enough), f"{len(found)} waiters, not {n}"
    return found


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_waiters_list_shows_each_waiters_label_mode_and_time(server, protocol):
    if protocol == 3 and int(redis.__version__.split(".")[0]) < 5:
        pytest.skip("RESP3: redis-py 5.0 on")
    r = server.client()
    # redis-py before 5.0 takes no protocol= (RESP2 only).
    client = LeaseClient(server.client(**({"protocol": 3} if protocol == 3 else {})), label="lister")
    assert client.waiters("job") == [], "a free key has no waiters"
    for holder in ("holder", "other holder"):
        assert r.execute_command("LEASE.ACQUIRE", "job", holder, 10000, "LIMIT", 2) is not None
    got: List[Any] = []

    def first() -> None:
        lease = LeaseClient(server.client(), label="first waiter").acquire("job", 10000, block_ms=FOREVER, limit=2)
        got.append(lease)
        if lease is not None:
            lease.release()

    def second() -> None:
        lease = LeaseClient(server.client(), label=None).acquire("job", 10000, block_ms=8000, limit=2)
        got.append(lease)
        if lease is not None:
            lease.release()

    threads = [threading.Thread(target=first, daemon=True)]
    threads[0].start()
    waiting(client, "job", 1)
    threads.append(threading.Thread(target=second, daemon=True))
    threads[1].start()
    ws = waiting(client, "job", 2)
    assert [w.label for w in ws] == ["first waiter", None], "oldest first"
    assert [w.mode for w in ws] == ["limit", "limit"]
    assert [w.limit for w in ws] == [2, 2]
    assert [w.keys for w in ws] == [1, 1]
    assert ws[0].timeout_ms is None, "BLOCK 0 waits forever"
    assert ws[1].timeout_ms is not None and 0 < ws[1].timeout_ms <= 8000
    assert all(w.waited_ms >= 0 and w.client > 0 for w in ws)
    assert {w.client for w in ws} <= {int(c["id"]) for c in r.client_list()}
    only = client.waiters("job", count=1)
    assert [w.label for w in only] == ["first waiter"], "COUNT 1: the oldest"
    with pytest.raises(ValueError):
        client.waiters("job", count=0)
    with pytest.raises(ValueError):
        client.waiters("job", count=1001)
    # A place freed: the first waiter is served, then the second.
    assert r.execute_command("LEASE.RELEASE", "job", "holder") == 1
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert len(got) == 2 and all(lease is not None for lease in got), "both served, in turn"
    assert client.waiters("job") == []


def test_a_multi_key_waiter_and_its_label(server):
    r = server.client()
    client = LeaseClient(server.client())
    assert r.execute_command("LEASE.ACQUIRE", "{t}:2", "holder", 10000) is not None
    done: List[Any] = []
    t = threading.Thread(
        target=lambda: done.append(client.acquire_many(["{t}:1", "{t}:2"], 10000, block_ms=5000, label="mover")),
        daemon=True,
    )
    t.start()
    (w,) = waiting(client, "{t}:2", 1)
    assert (w.mode, w.keys, w.label) == ("keys", 2, "mover")
    assert r.execute_command("LEASE.RELEASE", "{t}:2", "holder") == 1
    t.join(10)
    assert not t.is_alive() and done[0] is not None
    assert label_of(r, "{t}:1") == b"mover" and label_of(r, "{t}:2") == b"mover", "the waiter's label is its holding's"
    assert done[0].release()


def test_the_drop_in_locks_keep_redis_pys_signature_and_take_a_label(server):
    r = server.client()
    lock = Lock(server.client(), "res", 10, 0.1, True, None, True, True)
    with lock:
        assert label_of(r, "res") == default_label()
    with Lock(server.client(), "res", timeout=10, label="nightly report"):
        assert label_of(r, "res") == b"nightly report"
    with Lock(server.client(), "res", timeout=10, label=None):
        assert label_of(r, "res") is None
    switched = use_lease_locks(server.client())
    with switched.lock("res", timeout=10, label="switched"):
        assert label_of(r, "res") == b"switched"
    with switched.lock("res", timeout=10):
        assert label_of(r, "res") == default_label()
    with pytest.raises(TypeError):
        Lock(server.client(), "res", 10, 0.1, True, None, True, True, "positional")  # type: ignore[call-arg]

    async def main() -> None:
        a = aredis.Redis(host="127.0.0.1", port=server.port)
        async with AsyncLock(a, "res", timeout=10, label="async lock"):
            assert label_of(r, "res") == b"async lock"
        async with use_lease_locks(a).lock("res", timeout=10, label=None):  # type: ignore[call-arg]
            assert label_of(r, "res") is None
        async with AsyncLock(a, "res", timeout=10):
            assert label_of(r, "res") == default_label()
        await aclose(a)

    asyncio.run(main())


def test_the_asyncio_client_labels_and_lists_waiters(server):
    r = server.client()

    async def main() -> None:
        client = AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=server.port), label="async worker")
        async with client.lease("job", 10000):
            assert label_of(r, "job") == b"async worker"
        async with client.lease("job", 10000, label=None):
            assert label_of(r, "job") is None
        async with client.lease_many(["{k}1", "{k}2"], 10000, label="many"):
            assert label_of(r, "{k}2") == b"many"
        assert await client.run_many(["{k}1"], 10000, lambda _: asyncio.sleep(0, label_of(r, "{k}1"))) == b"async worker"
        holder = await client.acquire("job", 10000)
        assert holder is not None
        other = AsyncLeaseClient(aredis.Redis(host="127.0.0.1", port=server.port), label=None)
        waiter = asyncio.ensure_future(other.acquire("job", 10000, block_ms=5000, shared=True, label="reader"))
        found: List[Waiter] = []
        for _ in range(500):
            found = await client.waiters("job", count=5)
            if found:
                break
            await asyncio.sleep(0.01)
        assert [(w.label, w.mode) for w in found] == [("reader", "shared")]
        assert found[0].timeout_ms is not None
        assert await holder.release()
        lease = await asyncio.wait_for(waiter, 10)
        assert lease is not None
        assert holder_labels(r, "job") == [b"reader"]
        assert await lease.release()
        assert await client.waiters("job") == []
        await client.close()
        await other.close()

    asyncio.run(main())


@pytest.fixture(params=KINDS[:1])
def masters(request):
    servers = [Server(request.param) for _ in range(3)]
    yield servers
    for s in servers:
        s.close()


def test_quorum_acquires_carry_the_label_on_every_master(masters):
    client = QuorumClient([redis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.5, label="quorum job")
    with client.lease("job", 5000, block_ms=1000):
        for m in masters:
            assert label_of(m.client(), "job") == b"quorum job"
    with client.lease("job", 5000, block_ms=1000, label=None):
        for m in masters:
            assert label_of(m.client(), "job") is None
    client.close()

    async def main() -> None:
        aclient = AsyncQuorumClient([aredis.Redis(host="127.0.0.1", port=m.port) for m in masters], io_timeout=0.5)
        async with aclient.lease("job", 5000, block_ms=1000):
            for m in masters:
                assert label_of(m.client(), "job") == default_label()
        async with aclient.lease("job", 5000, block_ms=1000, label="async quorum"):
            for m in masters:
                assert label_of(m.client(), "job") == b"async quorum"
        await aclient.close()

    asyncio.run(main())
