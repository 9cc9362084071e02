"""The asyncio example in clients/python/README.md (tests/test_async.py runs it
and checks that the README shows this code)."""

import asyncio
import sys

import redis.asyncio as aredis

from redis_lease import LeaseLost
from redis_lease.aio import AsyncLeaseClient


async def run(url: str = "redis://localhost:6379/0") -> None:
    client = AsyncLeaseClient(aredis.Redis.from_url(url))
    lock, data = "{acct:7}:lock", "{acct:7}"  # one hash tag: one cluster slot

    async with client.lease(lock, ttl_ms=30000, block_ms=5000) as lease:
        for _ in range(3):
            step = asyncio.ensure_future(lease.fence("HINCRBY", data, "steps", 1))
            lost = asyncio.ensure_future(lease.lost.wait())
            done, _ = await asyncio.wait({step, lost}, return_when=asyncio.FIRST_COMPLETED)
            lost.cancel()
            if step not in done:  # the lease was lost first: stop at once
                step.cancel()
                raise LeaseLost(lease.lost.reason)
            step.result()


if __name__ == "__main__":
    asyncio.run(run(*sys.argv[1:]))
