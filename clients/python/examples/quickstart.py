"""The example in clients/python/README.md (tests/test_sync.py runs it and checks
that the README shows this code): python examples/quickstart.py [redis-url]"""

import sys

import redis

from redis_lease import LeaseClient, LeaseLost, StaleToken


def run(url: str = "redis://localhost:6379/0") -> None:
    client = LeaseClient(redis.Redis.from_url(url))
    lock, data = "{acct:7}:lock", "{acct:7}"  # one hash tag: one cluster slot

    # Wait up to 5 s for the lease; the watchdog renews it every 10 s; the
    # with block releases it, also when the block raises.
    with client.lease(lock, ttl_ms=30000, block_ms=5000) as lease:
        print("token", lease.token)
        # Fenced write: the token check and the HSET are one atomic step.
        lease.fence("HSET", data, "balance", 90)
        for _ in range(3):
            if lease.lost.is_set():  # stop: the lease is not ours any more
                raise LeaseLost(lease.lost.reason)
            try:
                lease.fence("HINCRBY", data, "steps", 1)
            except StaleToken:  # refused by the server: nothing was written
                raise LeaseLost(lease.lost.reason) from None


if __name__ == "__main__":
    run(*sys.argv[1:])
