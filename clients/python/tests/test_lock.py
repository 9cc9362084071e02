"""redis_lease.Lock against real servers, tested the way redis-py tests its
own Lock (tests/test_lock.py there): every documented behaviour of that
class, then what the lease module adds (the fencing token, FIFO waiting
without polling, the loss signal, a renewed lease for ``timeout=None``)."""

from __future__ import annotations

import threading
from typing import Any, Dict
import time

import pytest
from redis.exceptions import LockError, LockNotOwnedError

import redis_lease.lock as lock_module
from conftest import lease_info
from redis_lease import Lock, StaleToken


def ttl_of(r, name) -> int:
    info = lease_info(r, name)
    return -2 if info is None else int(info["ttl"])


def test_lock(server):
    r = server.client()
    lock = Lock(r, "foo")
    assert lock.acquire(blocking=False)
    assert lock.locked() and lock.owned()
    assert ttl_of(r, "foo") > 0, "timeout=None: a lease renewed while held"
    lock.release()
    assert not lock.locked()


def test_lock_token(server):
    r = server.client()
    lock = Lock(r, "foo")
    assert lock.acquire(blocking=False, token="abc")
    # The token given is the owner id: the raw command releases with it.
    assert r.execute_command("LEASE.RELEASE", "foo", "abc") == 1
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_locked(server):
    r = server.client()
    lock = Lock(r, "foo")
    assert not lock.locked()
    lock.acquire(blocking=False)
    assert lock.locked()
    lock.release()
    assert not lock.locked()


def test_owned(server):
    r = server.client()
    lock = Lock(r, "foo")
    assert not lock.owned()
    lock.acquire(blocking=False)
    assert lock.owned()
    other = Lock(r, "foo")
    assert not other.owned()
    lock.release()
    assert not lock.owned()


def test_competing_locks(server):
    r = server.client()
    lock1, lock2 = Lock(r, "foo"), Lock(r, "foo")
    assert lock1.acquire(blocking=False)
    assert not lock2.acquire(blocking=False)
    lock1.release()
    assert lock2.acquire(blocking=False)
    assert not lock1.acquire(blocking=False)
    lock2.release()


def test_timeout(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert 8000 < ttl_of(r, "foo") <= 10000
    lock.release()


def test_float_timeout(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=9.5)
    assert lock.acquire(blocking=False)
    assert 8000 < ttl_of(r, "foo") <= 9500
    lock.release()


def test_a_timeout_expires_unless_extended(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=0.3)
    assert lock.acquire(blocking=False)
    time.sleep(0.5)
    assert not lock.locked(), "no watchdog with a timeout, as redis-py"


def test_blocking(server):
    r = server.client()
    lock1 = Lock(r, "foo")
    assert lock1.acquire(blocking=False)
    lock2 = Lock(r, "foo", blocking=False)
    assert not lock2.acquire()
    assert not Lock(r, "foo").acquire(blocking=False)
    lock1.release()


def test_blocking_timeout(server):
    r = server.client()
    lock1 = Lock(r, "foo")
    assert lock1.acquire(blocking=False)
    # As redis-py's: the answer is back by blocking_timeout (the wait on the
    # server ends a margin before it: a tenth, 10 to 50 ms), not much sooner.
    for bt in (0.2, 1.0):
        lock2 = Lock(r, "foo", blocking_timeout=bt)
        start = time.monotonic()
        assert not lock2.acquire()
        assert bt - 0.06 <= time.monotonic() - start <= bt + 0.1
        start = time.monotonic()
        assert not Lock(r, "foo").acquire(blocking_timeout=bt)
        assert bt - 0.06 <= time.monotonic() - start <= bt + 0.1
    lock1.release()


def test_context_manager(server):
    r = server.client()
    with Lock(r, "foo", blocking_timeout=0.2) as lock:
        assert lock.locked()
    assert not Lock(r, "foo").locked()


def test_context_manager_raises_when_locked_not_acquired(server):
    r = server.client()
    holder = Lock(r, "foo")
    holder.acquire()
    with pytest.raises(LockError):
        with Lock(r, "foo", blocking_timeout=0.1):
            pass
    holder.release()


def test_context_manager_not_raise_on_release_lock_error(server):
    r = server.client()
    with Lock(r, "foo", timeout=0.1, raise_on_release_error=False):
        time.sleep(0.3)  # expired inside the block: suppressed on exit
    with pytest.raises(LockNotOwnedError):
        with Lock(r, "foo", timeout=0.1):
            time.sleep(0.3)


def test_releasing_unlocked_lock_raises_error(server):
    lock = Lock(server.client(), "foo")
    with pytest.raises(LockError):
        lock.release()


def test_releasing_lock_no_longer_owned_raises_error(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=0.2)
    lock.acquire(blocking=False)
    time.sleep(0.4)
    other = Lock(r, "foo")
    assert other.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError):
        lock.release()
    # and that didn't release the other's lock
    assert other.owned()
    other.release()


def test_extend_lock(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert 8000 < ttl_of(r, "foo") <= 10000
    assert lock.extend(10)
    assert 16000 < ttl_of(r, "foo") <= 20000
    lock.release()


def test_extend_lock_replace_ttl(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert lock.extend(10, replace_ttl=True)
    assert 8000 < ttl_of(r, "foo") <= 10000
    lock.release()


def test_extend_lock_float(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=10.5)
    assert lock.acquire(blocking=False)
    assert lock.extend(10.5)
    assert 16000 < ttl_of(r, "foo") <= 21000
    lock.release()


def test_extending_unlocked_lock_raises_error(server):
    lock = Lock(server.client(), "foo", timeout=10)
    with pytest.raises(LockError):
        lock.extend(10)


def test_extending_lock_with_no_timeout_raises_error(server):
    lock = Lock(server.client(), "foo")
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError):
        lock.extend(10)
    lock.release()


def test_extending_lock_no_longer_owned_raises_error(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=0.2)
    assert lock.acquire(blocking=False)
    time.sleep(0.4)
    assert Lock(r, "foo").acquire(blocking=False)
    with pytest.raises(LockNotOwnedError):
        lock.extend(10)


def test_reacquire_lock(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert r.pexpire("foo", 5000)
    assert ttl_of(r, "foo") <= 5000
    assert lock.reacquire()
    assert 8000 < ttl_of(r, "foo") <= 10000
    lock.release()


def test_reacquiring_unlocked_lock_raises_error(server):
    lock = Lock(server.client(), "foo", timeout=10)
    with pytest.raises(LockError):
        lock.reacquire()


def test_reacquiring_lock_with_no_timeout_raises_error(server):
    lock = Lock(server.client(), "foo")
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError):
        lock.reacquire()
    lock.release()


def test_reacquiring_lock_no_longer_owned_raises_error(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=0.2)
    assert lock.acquire(blocking=False)
    time.sleep(0.4)
    assert Lock(r, "foo").acquire(blocking=False)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()


def test_thread_local_holds_one_acquisition_per_thread(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=5)
    assert lock.acquire(blocking=False)
    seen: Dict[str, Any] = {}

    def other_thread():
        seen["owned"] = lock.owned()
        try:
            lock.release()
        except LockError as e:
            seen["release"] = type(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(5)
    assert seen == {"owned": False, "release": LockError}
    assert lock.owned()
    lock.release()


def test_without_thread_local_another_thread_releases(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=5, thread_local=False)
    assert lock.acquire(blocking=False)
    t = threading.Thread(target=lock.release)
    t.start()
    t.join(5)
    assert not lock.locked()


# -- what the lease module adds -------------------------------------------


def test_fencing_token(server):
    r = server.client()
    lock = Lock(r, "foo", timeout=0.3)
    assert lock.token is None
    with pytest.raises(LockError):
        lock.fence("SET", "out", "never")
    assert lock.acquire(blocking=False)
    first = lock.token
    assert isinstance(first, int) and lock.fence("SET", "out", "1") == b"OK"
    time.sleep(0.5)  # expired: the next holder's token is larger
    other = Lock(r, "foo")
    assert other.acquire(blocking=False) and other.token > first
    with pytest.raises(StaleToken):
        lock.fence("SET", "out", "stale")
    assert r.get("out") == b"1"
    other.release()


def test_a_waiter_is_handed_the_lock_at_the_release_not_by_polling(server):
    r = server.client()
    holder = Lock(r, "foo")
    holder.acquire()
    got: Dict[str, Any] = {}

    def wait():
        got["ok"] = Lock(r, "foo", sleep=10).acquire()  # a sleep that would show
        got["at"] = time.monotonic()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    released = time.monotonic()
    holder.release()
    t.join(5)
    assert got["ok"] and got["at"] - released < 0.5


def test_no_timeout_is_a_renewed_lease(server, monkeypatch):
    monkeypatch.setattr(lock_module, "NO_TIMEOUT_TTL_MS", 600)
    r = server.client()
    lock = Lock(r, "foo")
    assert lock.acquire(blocking=False)
    time.sleep(1.5)  # over two ttls: the watchdog renews it
    assert lock.owned() and not lock.lost.is_set()
    lock.release()


def test_a_grace_period_is_waited_out_or_is_not_acquired(server):
    r = server.client()
    r.execute_command("CONFIG", "SET", "lease.grace-ms", "600")
    r.execute_command("REPLICAOF", "127.0.0.1", "1")
    r.execute_command("REPLICAOF", "NO", "ONE")
    assert not Lock(r, "foo").acquire(blocking=False), "as a held lock: False"
    start = time.monotonic()
    lock = Lock(r, "foo", blocking_timeout=5)
    assert lock.acquire(), "blocking: waits the grace out"
    assert time.monotonic() - start < 3
    lock.release()


def test_the_readme_switch_examples_run_as_programs(server):
    """The switch's examples in README.md, pasted into a program as they
    are and run (only the server's port put into ``redis.Redis()``)."""
    import pathlib
    import subprocess
    import sys

    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### Switching from redis-py's Lock", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:3]]
    r = server.client()
    for code, out in zip(blocks, (b"v", b"w")):
        program = code.replace("Redis()", f"Redis(port={server.port})")
        assert program != code, "the example makes its client with redis.Redis()"
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        assert r.get("out") == out
        assert lease_info(r, "resource") is None, "released at the end of the with block"
