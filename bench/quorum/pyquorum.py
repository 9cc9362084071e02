"""Part G's Python rows (bench/quorum.sh): full lock cycles on the masters
given as ports (acquire on a majority, one write on the first master,
release), one after the other for QUORUM_MS, for the quorum helpers
(redis_lease.QuorumClient and AsyncQuorumClient: a fencing token, one round
trip when a majority answers the proposal) and pottery's Redlock (no token);
one JSON line per row."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import redis
import redis.asyncio as aredis

from redis_lease import QuorumClient
from redis_lease.quorum import AsyncQuorumClient

MS = int(os.environ.get("QUORUM_MS", "3000"))


def run(name, acquire, write, release):
    lat, cycles, failed = [], 0, 0
    end = time.monotonic() + MS / 1000
    t0 = time.monotonic()
    i = 0
    while time.monotonic() < end:
        i += 1
        a = time.perf_counter()
        held = acquire()
        if not held:
            failed += 1
            continue
        lat.append((time.perf_counter() - a) * 1e6)
        write(held, i)
        release(held)
        cycles += 1
    secs = time.monotonic() - t0
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, max(int(-(-p * len(lat) // 100)) - 1, 0))] if lat else float("nan")
    print(json.dumps({"name": name, "cycles_per_s": cycles / secs, "p50_us": pct(50), "p99_us": pct(99), "failed": failed}), flush=True)


def main():
    ports = [int(p) for p in sys.argv[1:]]
    first = redis.Redis(port=ports[0])
    # The helpers' write: on the first master that committed the token.
    firsts = [redis.Redis(port=p) for p in ports]
    client = QuorumClient([redis.Redis(port=p) for p in ports], watchdog=False)
    run(
        "redis_lease.QuorumClient (Python sync, with a token)",
        lambda: client.acquire("qjob", 10000),
        lambda lease, i: firsts[lease.committed[0]].execute_command("LEASE.FENCE", "qjob", lease.token, "SET", "qdata", i),
        lambda lease: lease.release(),
    )
    client.close()
    asyncio.run(run_async(ports))
    from pottery import Redlock

    masters = {redis.Redis(port=p) for p in ports}

    def acquire():
        lock = Redlock(key="qjob", masters=masters, auto_release_time=10)
        return lock if lock.acquire(blocking=False) else None

    run("pottery 3.0.1 Redlock (Python, no token)", acquire, lambda lock, i: first.set("qdata", i), lambda lock: lock.release())


async def run_async(ports):
    """The asyncio helper's row: the same cycle on one event loop."""
    # The write goes to the first master that committed the token (a step is
    # decided by the first majority: master 0 is not always in it).
    firsts = [aredis.Redis(port=p) for p in ports]
    client = AsyncQuorumClient([aredis.Redis(port=p) for p in ports], watchdog=False)
    lat, cycles, failed = [], 0, 0
    end = time.monotonic() + MS / 1000
    t0 = time.monotonic()
    i = 0
    while time.monotonic() < end:
        i += 1
        a = time.perf_counter()
        lease = await client.acquire("qjob", 10000)
        if lease is None:
            failed += 1
            continue
        lat.append((time.perf_counter() - a) * 1e6)
        await firsts[lease.committed[0]].execute_command("LEASE.FENCE", "qjob", lease.token, "SET", "qdata", i)
        await lease.release()
        cycles += 1
    secs = time.monotonic() - t0
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, max(int(-(-p * len(lat) // 100)) - 1, 0))] if lat else float("nan")
    name = "redis_lease.AsyncQuorumClient (Python asyncio, with a token)"
    print(json.dumps({"name": name, "cycles_per_s": cycles / secs, "p50_us": pct(50), "p99_us": pct(99), "failed": failed}), flush=True)
    await client.close()
    for f in firsts:
        await f.aclose()


if __name__ == "__main__":
    main()
