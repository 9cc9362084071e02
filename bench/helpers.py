"""Part F for the Python helpers: the rows of bench/src/helpers.rs's table
(same knobs, same measurements), for the sync LeaseClient and the asyncio
AsyncLeaseClient. Run by bench/run.sh as ``python bench/helpers.py <port>``
with the package of clients/python importable; prints Markdown rows and
appends ``name value`` lines to HANDOFF_KV when it is set.

One client holds HELPER_LEASES leases of ttl HELPER_TTL_MS, acquired one after
the other, for HELPER_HOLD_MS. Connections: the process's connections on the
server. Renewals/s: the server's lease_renewed; round trips/s: the client's
watchdog_stats. Client CPU: the process (time.process_time) over the window.
Refusal noticed: HELPER_REFUSED keys deleted on the server, the time until
their signals are set. Deadline late by: after CLIENT PAUSE, how long past
its deadline each other signal is seen set (one pass over all signals takes a
few ms in Python, which bounds the resolution).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, Callable, List, Tuple

import redis
import redis.asyncio as aredis

from redis_lease import LeaseClient
from redis_lease.aio import AsyncLeaseClient


def knob(name: str, default: int, minimum: int) -> int:
    value = int(os.environ.get(name, default))
    if value < minimum:
        raise SystemExit(f"{name}={value}: below its minimum {minimum}")
    return value


LEASES = knob("HELPER_LEASES", 10000, 1)
TTL_MS = knob("HELPER_TTL_MS", 3000, 30)
HOLD_MS = knob("HELPER_HOLD_MS", 6000, 100)
REFUSED = knob("HELPER_REFUSED", 100, 1)
KEYS = [f"hl:{i:06d}" for i in range(LEASES)]


def renewed(r: redis.Redis) -> int:
    return int(r.info("lease")["lease_renewed"])


def start(r: redis.Redis, stats: Callable[[], dict]) -> Tuple[float, int, int, float]:
    """The readings at the start of the counted window."""
    return time.process_time(), renewed(r), stats()["round_trips"], time.monotonic()


def end(r: redis.Redis, stats: Callable[[], dict], began: Tuple[float, int, int, float]) -> dict:
    """Renewals, round trips and CPU per second since ``began``."""
    cpu0, ren0, trips0, t0 = began
    took = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    renewals = renewed(r) - ren0
    return {
        "connections": r.info("clients")["connected_clients"] - 1,
        "renewals_per_s": renewals / took,
        "round_trips_per_s": (stats()["round_trips"] - trips0) / took,
        "cpu_pct": 100 * cpu / took,
        "cpu_us_per_renewal": 1e6 * cpu / max(renewals, 1),
    }


async def refusals(r: redis.Redis, leases: List[Any]) -> Tuple[float, float]:
    """Deletes REFUSED keys; p50 and max ms until their signals are set (polled
    on the event loop, which the asyncio watchdog needs running)."""
    picked = [j * len(leases) // REFUSED for j in range(REFUSED)]
    pipe = r.pipeline(transaction=False)
    for i in picked:
        pipe.delete(KEYS[i])
    pipe.execute()
    deleted = time.monotonic()
    seen = {}
    while len(seen) < len(picked) and time.monotonic() - deleted < 2 * TTL_MS / 1000:
        for i in picked:
            if i not in seen and leases[i].lost.is_set():
                seen[i] = (time.monotonic() - deleted) * 1000
        await asyncio.sleep(0.001)
    ms = sorted(seen.get(i, float("inf")) for i in picked)
    return ms[(len(ms) + 1) // 2 - 1], ms[-1]


async def expiries(r: redis.Redis, leases: List[Any]) -> float:
    """Pauses the server past every deadline: the largest lateness, ms."""
    pause = TTL_MS + 1000
    r.execute_command("CLIENT", "PAUSE", pause, "ALL")
    paused = time.monotonic()
    late = 0.0
    open_ = [lease for lease in leases if not lease.lost.is_set()]
    while open_ and time.monotonic() - paused < pause / 1000:
        now = time.monotonic()
        still = []
        for lease in open_:
            if lease.lost.is_set():
                late = max(late, (now - lease.lost.deadline) * 1000)
            else:
                still.append(lease)
        open_ = still
        await asyncio.sleep(0.001)
    await asyncio.sleep(max(pause / 1000 - (time.monotonic() - paused), 0))
    return late if not open_ else float("inf")


def sync_run(port: int) -> dict:
    r = redis.Redis(port=port)
    r.flushall()
    client = LeaseClient(redis.Redis(port=port))
    began = time.monotonic()
    leases = [client.acquire(key, TTL_MS) for key in KEYS]
    assert all(leases), "a free key was busy"
    out = {"acquire_s": time.monotonic() - began}
    began = start(r, client.watchdog_stats)
    time.sleep(HOLD_MS / 1000)
    out.update(end(r, client.watchdog_stats, began))
    out["refused_ms"] = asyncio.run(refusals(r, leases))
    out["expired_late_ms"] = asyncio.run(expiries(r, leases))
    for lease in leases:
        lease.release()
    client.close()
    return out


def async_run(port: int) -> dict:
    r = redis.Redis(port=port)
    r.flushall()

    async def main() -> dict:
        client = AsyncLeaseClient(aredis.Redis(port=port))
        began = time.monotonic()
        leases = [await client.acquire(key, TTL_MS) for key in KEYS]
        assert all(leases), "a free key was busy"
        out = {"acquire_s": time.monotonic() - began}
        # The loop must run for the watchdog: the window and the polls await.
        began = start(r, client.watchdog_stats)
        await asyncio.sleep(HOLD_MS / 1000)
        out.update(end(r, client.watchdog_stats, began))
        out["refused_ms"] = await refusals(r, leases)
        out["expired_late_ms"] = await expiries(r, leases)
        for lease in leases:
            await lease.release()
        await client.close()
        return out

    return asyncio.run(main())


def row(name: str, m: dict) -> None:
    per_trip = m["renewals_per_s"] / max(m["round_trips_per_s"], 1e-9)
    print(
        f"| {name} | {m['connections']} | {m['acquire_s']:.2f} | {m['renewals_per_s']:.0f} "
        f"| {m['round_trips_per_s']:.2f} | {per_trip:.0f} | {m['cpu_pct']:.1f} "
        f"| {m['cpu_us_per_renewal']:.2f} | {m['refused_ms'][0]:.1f} / {m['refused_ms'][1]:.1f} "
        f"| {m['expired_late_ms']:.1f} |",
        flush=True,
    )
    kv = os.environ.get("HANDOFF_KV")
    if kv:
        tag = name.split()[1].lower()
        with open(kv, "a") as f:
            f.write(f"helpers_python_{tag}_connections {m['connections']}\n")
            f.write(f"helpers_python_{tag}_round_trips_per_s {m['round_trips_per_s']:.2f}\n")
            f.write(f"helpers_python_{tag}_cpu_pct {m['cpu_pct']:.1f}\n")
            f.write(f"helpers_python_{tag}_refused_max_ms {m['refused_ms'][1]:.1f}\n")


def main() -> None:
    port = int(sys.argv[1])
    row("Python sync", sync_run(port))
    row("Python asyncio", async_run(port))


if __name__ == "__main__":
    main()
