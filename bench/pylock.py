"""The Python drop-ins' cycle speed (issue 31 point 5): one acquire + release
cycle, one client, one server, every variant in the same run, against
redis-py's Lock it replaces and the raw commands on one redis-py connection.

    python bench/pylock.py [--server redis-server] [--module target/release/libredis_lease.so]

Starts its own server (Redis 7.0 by default: ``redis-server`` on PATH) on a
free port with the module loaded, runs each variant PYLOCK_N cycles
(default 5000) in PYLOCK_ROUNDS interleaved rounds (default 5), and prints
a Markdown table: the best round's cycles/s of each, its ratio to redis-py's
Lock (of its kind: sync or asyncio) and to the raw commands of its kind, and
the connections the server saw opened during the variant's rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from typing import Awaitable, Callable, Dict, Tuple

import redis
import redis.asyncio as aredis
from redis.asyncio.lock import Lock as AsyncRedisLock
from redis.lock import Lock as RedisLock

import redis_lease
from redis_lease import LeaseClient
from redis_lease.aio import AsyncLeaseClient
from redis_lease.aio import Lock as AsyncLeaseLock

ROOT = pathlib.Path(__file__).resolve().parents[1]
N = int(os.environ.get("PYLOCK_N", 5000))
ROUNDS = int(os.environ.get("PYLOCK_ROUNDS", 5))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(binary: str, module: str) -> Tuple[subprocess.Popen[bytes], int, str]:
    d = tempfile.mkdtemp(prefix="pylock-bench-")
    module = os.path.abspath(module)
    if not os.path.exists(module):
        raise SystemExit(f"missing {module}: build it first (cargo build --release)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "",
         "--appendonly", "no", "--loadmodule", module, "grace-ms", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    r = redis.Redis(port=port, socket_timeout=5)
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit(f"{binary} exited at start (code {proc.returncode})")
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    version = r.info("server")["redis_version"]
    return proc, port, str(version)


def sync_variants(r: redis.Redis) -> Dict[str, Callable[[], None]]:
    rl = RedisLock(r, "b:redis", timeout=10)
    ll = redis_lease.Lock(r, "b:lock", timeout=10)
    client = LeaseClient(r)
    conn = redis.Redis(connection_pool=redis.ConnectionPool(port=r.connection_pool.connection_kwargs["port"], max_connections=1))

    def redis_py() -> None:
        rl.acquire(blocking=False)
        rl.release()

    def lease_lock() -> None:
        ll.acquire(blocking=False)
        ll.release()

    def lease_client() -> None:
        with client.lease("b:client", 10000):
            pass

    def raw() -> None:
        conn.execute_command("LEASE.ACQUIRE", "b:raw", "owner-of-the-raw-bench", 10000)
        conn.execute_command("LEASE.RELEASE", "b:raw", "owner-of-the-raw-bench")

    return {
        "redis-py Lock (sync)": redis_py,
        "redis_lease.Lock": lease_lock,
        "LeaseClient.lease": lease_client,
        "raw LEASE.ACQUIRE + LEASE.RELEASE (sync)": raw,
    }


def async_variants(r: aredis.Redis, port: int) -> Dict[str, Callable[[], Awaitable[None]]]:
    rl = AsyncRedisLock(r, "a:redis", timeout=10)
    ll = AsyncLeaseLock(r, "a:lock", timeout=10)
    client = AsyncLeaseClient(r)
    conn = aredis.Redis(connection_pool=aredis.ConnectionPool(port=port, max_connections=1))

    async def redis_py() -> None:
        await rl.acquire(blocking=False)
        await rl.release()

    async def lease_lock() -> None:
        await ll.acquire(blocking=False)
        await ll.release()

    async def lease_client() -> None:
        async with client.lease("a:client", 10000):
            pass

    async def raw() -> None:
        await conn.execute_command("LEASE.ACQUIRE", "a:raw", "owner-of-the-raw-bench", 10000)
        await conn.execute_command("LEASE.RELEASE", "a:raw", "owner-of-the-raw-bench")

    return {
        "redis-py Lock (asyncio)": redis_py,
        "redis_lease.aio.Lock": lease_lock,
        "AsyncLeaseClient.lease": lease_client,
        "raw LEASE.ACQUIRE + LEASE.RELEASE (asyncio)": raw,
    }


def connections(r: redis.Redis) -> int:
    return int(r.info("stats")["total_connections_received"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.environ.get("REDIS7_SERVER", "redis-server"))
    ap.add_argument("--module", default=str(ROOT / "target/release/libredis_lease.so"))
    args = ap.parse_args()
    proc, port, version = start_server(args.server, args.module)
    try:
        admin = redis.Redis(port=port)
        best: Dict[str, float] = {}
        conns: Dict[str, int] = {}
        r = redis.Redis(port=port)
        sync = sync_variants(r)

        async def run_async() -> None:
            ar = aredis.Redis(port=port)
            variants = async_variants(ar, port)
            for _ in range(ROUNDS):
                for name, f in variants.items():
                    for _ in range(50):
                        await f()
                    c0 = connections(admin)
                    t0 = time.perf_counter()
                    for _ in range(N):
                        await f()
                    took = time.perf_counter() - t0
                    best[name] = max(best.get(name, 0.0), N / took)
                    conns[name] = conns.get(name, 0) + connections(admin) - c0

        for _ in range(ROUNDS):
            for name, f in sync.items():
                for _ in range(50):
                    f()
                c0 = connections(admin)
                t0 = time.perf_counter()
                for _ in range(N):
                    f()
                took = time.perf_counter() - t0
                best[name] = max(best.get(name, 0.0), N / took)
                conns[name] = conns.get(name, 0) + connections(admin) - c0
        asyncio.run(run_async())
    finally:
        proc.kill()
        proc.wait()

    print("# Python drop-ins: acquire + release cycle speed (issue 31 point 5)")
    print()
    print(f"Command: `PYLOCK_N={N} PYLOCK_ROUNDS={ROUNDS} python bench/pylock.py` (part of `make bench`), "
          f"module {args.module}, one server started by the script. Client and server share the "
          "machine's cores with whatever else runs: compare ratios within one run only.")
    print()
    print(f"Redis {version}, redis-py {redis.__version__}, Python {sys.version.split()[0]}, "
          f"{N} cycles x {ROUNDS} rounds, best round; nproc {os.cpu_count()}")
    print()
    print("| variant | cycles/s | / redis-py Lock | / raw commands | connections opened |")
    print("|---|---:|---:|---:|---:|")
    for kind, peer, raw in (
        ("sync", "redis-py Lock (sync)", "raw LEASE.ACQUIRE + LEASE.RELEASE (sync)"),
        ("asyncio", "redis-py Lock (asyncio)", "raw LEASE.ACQUIRE + LEASE.RELEASE (asyncio)"),
    ):
        for name in best:
            if ("(asyncio)" in name or "aio" in name or "Async" in name) != (kind == "asyncio"):
                continue
            print(f"| {name} | {best[name]:,.0f} | {best[name] / best[peer]:.2f}x | "
                  f"{best[name] / best[raw]:.2f}x | {conns[name]} |")


if __name__ == "__main__":
    main()
