"""The sync helpers against real servers (every kind in conftest.KINDS)."""

from __future__ import annotations

import importlib.util
import pathlib
import threading
from typing import Any, Dict, Tuple
import time

import pytest
import redis

import redis_lease._sync

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
from redis_lease import (
    FOREVER,
    AlreadyHeld,
    LeaseBusy,
    LeaseClient,
    LeaseExpiring,
    LeaseGrace,
    LeaseLost,
    Loss,
    SharedWrite,
    StaleToken,
)

HERE = pathlib.Path(__file__).resolve().parent


def test_watchdog_keeps_the_lease_over_several_ttls(server):
    r = server.client()
    lease = LeaseClient(server.client()).acquire("job", 300)
    assert lease is not None
    start = time.monotonic()
    for _ in range(40):
        if time.monotonic() - start >= 1.8:
            break
        assert not lease.lost.is_set(), f"lost after {time.monotonic() - start:.3f}s"
        assert token_of(r, "job") == lease.token
        assert r.execute_command("LEASE.ACQUIRE", "job", "other", 1000) is None
        time.sleep(0.05)
    assert time.monotonic() - start >= 1.8, "the loop ended early"
    assert info_int(r, "renewed") >= 10, "about three renewals per ttl"
    assert lease.release()
    assert token_of(r, "job") is None


def test_loss_is_signalled_before_anyone_else_can_get_the_lease(server):
    ttl = 0.4
    lease = LeaseClient(server.client()).acquire("job", int(ttl * 1000))
    assert lease is not None
    deadline = lease.lost.deadline
    noticed = {}

    def notice():
        noticed["set"] = lease.lost.wait(10)
        noticed["at"] = time.monotonic()

    watcher = threading.Thread(target=notice)
    watcher.start()
    rival = competitor(server, "job", 10)
    frozen = Frozen(server)
    thawed = {}

    def thaw():
        # Stopped for the ttl and 300 ms more, whatever the client does.
        time.sleep(ttl + 0.3)
        frozen.thaw()
        thawed["at"] = time.monotonic()

    t = threading.Thread(target=thaw)
    t.start()
    watcher.join(15)
    t.join(15)
    rival.join(15)
    assert noticed["set"] and lease.lost.reason == Loss.EXPIRED
    assert rival.result is not None, "the competitor gets the lease after SIGCONT"
    assert noticed["at"] < thawed["at"], "signalled only after the server ran again"
    assert noticed["at"] < rival.result, "the competitor got the lease first"
    assert deadline <= noticed["at"] < deadline + 0.25  # at once: well before the thaw (deadline + 0.3)
    # The old holder's fenced writes are refused and write nothing.
    with pytest.raises(StaleToken):
        lease.fence("SET", "data", "stale")
    r = server.client()
    assert r.exists("data") == 0
    assert lease.release() is False
    assert token_of(r, "job") is not None, "the competitor still holds it"


def test_fence_with_min_ttl_ms_raises_lease_expiring_runs_nothing_and_keeps_the_lease(server):
    r = server.client()
    lease = LeaseClient(server.client()).acquire("job", 2000)
    with pytest.raises(LeaseExpiring) as refused:
        lease.fence("HSET", "data", "v", 1, min_ttl_ms=60_000)
    assert 0 <= refused.value.left_ms <= 2000 and refused.value.min_ttl_ms == 60_000
    assert not isinstance(refused.value, StaleToken), "the lease was not lost"
    assert r.exists("data") == 0, "nothing ran"
    with pytest.raises(LeaseExpiring):
        lease.fence(min_ttl_ms=60_000)  # a check only
    assert lease.fence("HSET", "data", "v", 1, min_ttl_ms=100) == 1
    assert lease.fence(min_ttl_ms=0) == b"OK"
    assert not lease.lost.is_set()
    # The raw form, on a connection of one's own.
    with pytest.raises(redis.ResponseError, match="^EXPIRING lease has"):
        r.execute_command(*lease.fence_args("HSET", "data", "v", 2, min_ttl_ms=60_000))
    bads: Tuple[Any, ...] = (-1, 1.5, "500", True)
    for bad in bads:
        with pytest.raises(ValueError, match="min_ttl_ms"):
            lease.fence("SET", "data", "x", min_ttl_ms=bad)
    assert r.hget("data", "v") == b"1"
    # A multi-key lease, on each of its keys.
    many = LeaseClient(server.client()).acquire_many(["{m}a", "{m}b"], 2000)
    with pytest.raises(LeaseExpiring):
        many.fence("{m}b", "SET", "{m}x", 1, min_ttl_ms=60_000)
    assert many.fence("{m}a", "SET", "{m}x", 2, min_ttl_ms=100) == b"OK"
    assert r.get("{m}x") == b"2"
    assert lease.release() and many.release()


def test_a_refused_renewal_signals_the_loss_and_the_fence_refuses(server):
    r = server.client()
    lease = LeaseClient(server.client()).acquire("job", 600)
    lease.fence("HSET", "data", "v", 1)
    r.delete("job")
    assert r.execute_command("LEASE.ACQUIRE", "job", "thief", 10000) is not None
    start = time.monotonic()
    assert lease.lost.wait(3)
    assert lease.lost.reason == Loss.REFUSED
    assert time.monotonic() - start < 0.6, "noticed at the next renewal, before the deadline"
    with pytest.raises(StaleToken):
        lease.fence("HSET", "data", "v", 2)
    assert r.hget("data", "v") == b"1"
    assert lease.renew() is False


def test_a_lost_acquire_reply_is_retried_with_the_same_owner(server):
    r = server.client()
    proxy = LossyProxy(server.port)
    try:
        import redis

        client = LeaseClient(redis.Redis(host="127.0.0.1", port=proxy.port))
        proxy.arm()
        lease = client.acquire("job", 10000)
        assert lease is not None
        assert proxy.dropped == 1, "the first reply was lost"
        # The lost call took the lease; the retry re-acquired it.
        assert info_int(r, "acquired") == 1
        assert info_int(r, "reacquired") == 1
        assert token_of(r, "job") == lease.token
        assert lease.release(), "the retry's owner is the holder"
        assert token_of(r, "job") is None, "no orphan left"
    finally:
        proxy.close()


def test_a_lost_reply_of_a_blocking_acquire_is_retried_with_the_same_owner(server):
    import redis

    r = server.client()
    proxy = LossyProxy(server.port)
    try:
        client = LeaseClient(redis.Redis(host="127.0.0.1", port=proxy.port))
        assert r.execute_command("LEASE.ACQUIRE", "job", "holder", 10000) is not None
        proxy.arm()
        got: Dict[str, Any] = {}
        t = threading.Thread(target=lambda: got.update(lease=client.acquire("job", 10000, 10000)))
        t.start()
        assert wait_until(5, lambda: waiters(r, "job") == 1)
        r.execute_command("LEASE.RELEASE", "job", "holder")
        t.join(15)
        lease = got["lease"]
        assert lease is not None and proxy.dropped == 1
        assert info_int(r, "acquired") == 2, "holder, then one hand-off"
        assert info_int(r, "reacquired") == 1, "the retry"
        assert token_of(r, "job") == lease.token
    finally:
        proxy.close()


def test_client_kill_of_a_blocked_acquire_is_retried(server):
    r = server.client()
    assert r.execute_command("LEASE.ACQUIRE", "job", "holder", 10000) is not None
    client = LeaseClient(server.client())
    got: Dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(lease=client.acquire("job", 10000, 10000)))
    t.start()
    first = blocked_acquirer(r)
    r.client_kill_filter(_id=first)
    assert wait_until(5, lambda: blocked_acquirer(r) != first), "the retry waits again"
    r.execute_command("LEASE.RELEASE", "job", "holder")
    t.join(15)
    lease = got["lease"]
    assert lease is not None
    assert token_of(r, "job") == lease.token
    assert info_int(r, "acquired") == 2, "the killed call never held it"
    assert lease.release()


def test_the_lease_is_released_when_the_work_raises(server):
    r = server.client()
    client = LeaseClient(server.client())
    with pytest.raises(ZeroDivisionError):
        with client.lease("job", 10000) as lease:
            lease.fence("SET", "x", 1)
            raise ZeroDivisionError
    assert token_of(r, "job") is None
    with pytest.raises(KeyError):
        client.run("job", 10000, lambda lease: {"present": 1}["missing"])
    assert token_of(r, "job") is None
    assert client.run("job", 10000, lambda lease: lease.token) > 0
    assert info_int(r, "released") == 3


def test_busy_blocking_and_forever(server):
    r = server.client()
    client = LeaseClient(server.client())
    a = LeaseClient(server.client()).acquire("job", 10000)  # another client holds it
    assert client.acquire("job", 10000) is None
    with pytest.raises(LeaseBusy):
        with client.lease("job", 10000):
            pass
    start = time.monotonic()
    assert client.acquire("job", 10000, block_ms=300) is None
    assert time.monotonic() - start >= 0.3
    got: Dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(lease=client.acquire("job", 10000, FOREVER)))
    t.start()
    assert wait_until(5, lambda: waiters(r, "job") == 1)
    first = a.token
    with a:
        pass  # the with block releases
    t.join(15)
    assert got["lease"].token > first
    assert got["lease"].release()


def test_a_long_wait_starts_with_a_fresh_deadline(server):
    r = server.client()
    assert r.execute_command("LEASE.ACQUIRE", "job", "holder", 400) is not None
    sent = time.monotonic()
    lease = LeaseClient(server.client()).acquire("job", 300, block_ms=5000)
    assert time.monotonic() - sent >= 0.35
    assert not lease.lost.is_set()
    assert lease.lost.deadline > sent + 0.3, "renewed after the wait"
    time.sleep(0.6)
    assert not lease.lost.is_set(), lease.lost.reason
    assert token_of(r, "job") == lease.token


def test_without_the_watchdog_the_deadline_still_signals(server):
    # 1 s: the renewal right after the acquire must find the lease held on a
    # loaded machine too.
    lease = LeaseClient(server.client(), watchdog=False).acquire("job", 1000)
    assert lease.renew()
    assert lease.lost.wait(5) and lease.lost.reason == Loss.EXPIRED
    assert lease.renew() is False


def test_a_renewal_after_the_loss_answers_false_and_sends_nothing(server):
    # Lost, a renewal cannot succeed: it is not sent (it would only keep the
    # key from others), so it cannot time out either.
    r = server.client()
    lease = LeaseClient(server.client(), watchdog=False).acquire("job", 300)
    assert lease.lost.wait(5) and lease.lost.reason == Loss.EXPIRED
    sent = calls(r, "lease.renew")
    assert lease.renew() is False
    assert calls(r, "lease.renew") == sent


def test_a_renewal_with_no_reply_before_the_deadline_answers_false(server):
    lease = LeaseClient(server.client(), watchdog=False).acquire("job", 500)
    frozen = Frozen(server)
    try:
        assert lease.renew() is False
        assert lease.lost.reason == Loss.EXPIRED
    finally:
        frozen.thaw()


def test_the_readme_example_runs(server):
    spec = importlib.util.spec_from_file_location("quickstart", HERE.parent / "examples/quickstart.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.run(server.url())
    r = server.client()
    assert r.hget("{acct:7}", "balance") == b"90"
    assert r.hget("{acct:7}", "steps") == b"3"
    assert token_of(r, "{acct:7}:lock") is None


@pytest.mark.parametrize("name", ["quickstart.py", "quickstart_async.py"])
def test_the_readme_shows_the_examples_that_run(name):
    readme = (HERE.parent / "README.md").read_text()
    source = (HERE.parent / "examples" / name).read_text()
    body = source.split('"""', 2)[2].lstrip("\n")
    assert body in readme, f"README.md does not show examples/{name} as it is"


def test_a_lease_dropped_without_release_stops_renewing(server):
    import gc

    r = server.client()
    lease = LeaseClient(server.client()).acquire("job", 300)
    assert token_of(r, "job") == lease.token
    del lease
    gc.collect()
    # No one renews it any more: it ends at its ttl.
    assert wait_until(3, lambda: token_of(r, "job") is None)


def test_a_frozen_server_bounds_every_wait(server):
    # SIGSTOPped: the kernel still accepts the TCP connection, the server
    # never answers (not even redis-py's connect handshake). Every wait of
    # the helper is bounded: about io_timeout x (retries + 1), plus pauses.
    client = LeaseClient(
        redis.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5),
        io_timeout=0.5,
    )
    frozen = Frozen(server)
    began = time.monotonic()
    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        client.acquire("job", 5000)
    took = time.monotonic() - began
    frozen.thaw()
    assert took < 0.5 * 4 + 1.0, f"acquire on a frozen server took {took:.1f} s"


def test_leaving_the_block_after_a_loss_is_quick(server):
    # The server freezes while the lease is held: the loss is signalled at
    # the deadline, and leaving the block makes one short release attempt
    # (the lease is known lost), not io_timeout x (retries + 1).
    client = LeaseClient(server.client(), io_timeout=2.0)
    frozen = None
    with pytest.raises(LeaseLost):  # the loss is reported at the end
        with client.lease("job", 400) as lease:
            frozen = Frozen(server)
            assert lease.lost.wait(5) and lease.lost.reason == Loss.EXPIRED
            began = time.monotonic()
    took = time.monotonic() - began
    frozen.thaw()
    assert took < 1.0, f"leaving the block took {took:.1f} s"
    # A refused renewal: nothing is sent at all.
    r = server.client()
    lease = client.acquire("job2", 5000)  # type: ignore[assignment]
    r.delete("job2")
    assert lease.renew() is False and lease.lost.reason == Loss.REFUSED
    began = time.monotonic()
    assert lease.release() is False
    assert time.monotonic() - began < 0.1


def test_a_fence_after_the_server_dropped_the_connection_is_sent_on_a_new_one(server):
    # The server closes every client connection (as a restart does): the
    # watchdog reconnects and keeps the lease; the lease's own idle
    # connection is closed too, and the next fence must not fail on it (it
    # was never sent, so a new connection is safe).
    r = server.client()
    client = LeaseClient(server.client())
    with client.lease("job", 600) as lease:
        lease.fence("SET", "data", "before")
        before = info_int(r, "renewed")
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        assert wait_until(3, lambda: info_int(r, "renewed") > before), "the watchdog renews again"
        assert lease.fence("SET", "data", "after") == b"OK"
        assert not lease.lost.is_set()
    assert r.get("data") == b"after"


def start_grace(r, ms: int) -> None:
    """A promotion starts a grace period of ``ms``: a replica of a port
    nobody listens on, then a master again."""
    r.execute_command("CONFIG", "SET", "lease.grace-ms", str(ms))
    r.execute_command("REPLICAOF", "127.0.0.1", "1")
    r.execute_command("REPLICAOF", "NO", "ONE")
    assert r.info("lease")["lease_grace_remaining_ms"] > 0


def test_a_grace_refusal_says_so_and_how_long_remains(server):
    r = server.client()
    client = LeaseClient(server.client())
    held = client.acquire("held", 10000)
    start_grace(r, 3000)
    with pytest.raises(LeaseGrace) as e:
        client.acquire("job", 1000)
    assert 0 < e.value.remaining_ms <= 3000 and e.value.reason == "promoted"
    assert "grace period" in str(e.value)
    with pytest.raises(LeaseBusy):  # lease() raises it too, a LeaseBusy
        with client.lease("job", 1000):
            pass
    # A lease held before keeps working; contention is still None.
    assert held.renew() and held.fence("SET", "x", "1") == b"OK"
    r.execute_command("CONFIG", "SET", "lease.grace-ms", "0")
    other = LeaseClient(server.client())
    assert other.acquire("held", 1000) is None, "held by another owner: None, not LeaseGrace"
    held.release()


def test_a_loss_during_the_block_is_raised_at_its_end(server):
    r = server.client()
    client = LeaseClient(server.client())
    with pytest.raises(LeaseLost) as e:
        with client.lease("job", 600) as lease:
            r.delete("job")  # taken away: the next renewal is refused
            assert lease.lost.wait(3)
    assert e.value.loss == Loss.REFUSED
    # The work's own error wins.
    with pytest.raises(KeyError):
        with client.lease("job", 600) as lease:
            r.delete("job")
            assert lease.lost.wait(3)
            raise KeyError("work")
    # A block that released the lease itself, or kept it, ends quietly.
    with client.lease("job", 600) as lease:
        lease.release()
    with client.lease("job", 600):
        pass
    # lease() acquires on entry, not before.
    ctx = client.lease("job", 600)
    assert token_of(r, "job") is None
    with ctx as lease:
        assert token_of(r, "job") == lease.token


def test_a_second_acquire_of_a_key_this_client_holds_fails_at_once(server):
    client = LeaseClient(server.client())
    lease = client.acquire("job", 5000)
    began = time.monotonic()
    with pytest.raises(AlreadyHeld):
        client.acquire("job", 5000, block_ms=FOREVER)  # would wait on itself
    assert time.monotonic() - began < 0.1
    other = LeaseClient(server.client())
    assert other.acquire("job", 5000) is None, "another client: contention"
    lease.release()
    again = client.acquire("job", 5000)  # released: free to take again
    assert again is not None
    again.release()


def test_shared_and_limit_modes(server):
    r = server.client()
    readers = [LeaseClient(server.client()) for _ in range(3)]
    held = [c.acquire("doc", 600, shared=True) for c in readers]
    assert all(h is not None for h in held), "readers share it"
    writer = LeaseClient(server.client())
    assert writer.acquire("doc", 600) is None, "no writer while readers hold it"
    # A reader fences reads; its fenced write is refused clearly.
    r.set("docdata", "v")
    assert held[0].fence("GET", "docdata") == b"v"
    with pytest.raises(SharedWrite):
        held[0].fence("SET", "docdata", "x")
    assert r.get("docdata") == b"v"
    # The watchdog renews every reader over several ttls.
    time.sleep(1.5)
    assert not any(h.lost.is_set() for h in held)
    for h in held:
        assert h.release()
    # LIMIT 2: two permits, a third waits for one to come back.
    sem = [LeaseClient(server.client()) for _ in range(3)]
    p1 = sem[0].acquire("pool", 600, limit=2)
    p2 = sem[1].acquire("pool", 600, limit=2)
    assert p1 is not None and p2 is not None and p1.token != p2.token
    assert sem[2].acquire("pool", 600, limit=2) is None
    threading.Timer(0.3, p1.release).start()
    with sem[2].lease("pool", 600, block_ms=5000, limit=2) as p3:
        assert p3.token > p2.token, "p1's place, handed over"
    with pytest.raises(ValueError):
        sem[2].acquire("pool", 600, shared=True, limit=2)
    p2.release()


def test_many_leases_share_connections_and_batched_renewals(server, monkeypatch):
    # 300 leases of one client: their calls share the client's pool, one
    # watchdog thread renews them all in pipelines, and a loss still shows
    # within a third of the ttl.
    r = server.client()
    def watchdogs():
        return {t for t in threading.enumerate() if t.name == "lease-watchdog"}

    before = watchdogs()
    # An idle watchdog waits this long for a new lease before it ends.
    monkeypatch.setattr(redis_lease._sync, "WATCHDOG_LINGER_S", 0.5)
    client = LeaseClient(server.client())
    ttl = 900
    leases = [client.acquire(f"job:{i}", ttl) for i in range(300)]
    time.sleep(ttl * 3 / 1000)
    assert not any(lease.lost.is_set() for lease in leases), "every lease is still held"
    for i in range(0, 300, 37):
        assert token_of(r, f"job:{i}") == leases[i].token
    stats = client.watchdog_stats()
    assert stats["leases"] == 300
    assert stats["renewals"] >= 300 * 6, stats
    assert stats["round_trips"] * 50 <= stats["renewals"], f"batched: {stats}"
    assert lease_clients(r) == 2, "one pooled connection and the watchdog's"
    (dog,) = watchdogs() - before  # one watchdog thread
    r.delete("job:7")
    began = time.monotonic()
    assert leases[7].lost.wait(ttl / 1000) and leases[7].lost.reason == Loss.REFUSED
    assert time.monotonic() - began <= ttl / 3000 + 0.15
    assert sum(lease.lost.is_set() for lease in leases) == 1
    for lease in leases:
        lease.release()
    assert info_int(r, "released") == 299
    assert wait_until(2, lambda: client.watchdog_stats()["leases"] == 0)
    dog.join(2)
    assert not dog.is_alive(), "the watchdog ends a while after its last lease"
