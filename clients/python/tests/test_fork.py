"""Issue 41: the helpers in forked workers. A client made and used in the
parent, then shared by children forked with multiprocessing's ``fork``
context (as ``gunicorn --preload`` or celery's prefork do): in each child
it must behave as a fresh helper (its own connections, owners, watchdog,
background threads), sync and asyncio, for the drop-ins
(``use_lease_locks``), ``LeaseClient`` and ``QuorumClient``.

- Contention: four children take one name in turn through the parent's
  client while the parent holds another lock; a server-side counter
  (``INCR`` on entry, ``DECR`` on exit, on a connection each child opens
  itself) sees every overlap. redis-py's own Lock in the same shape is the
  control.
- Renewal: a child forked while the parent holds a watchdog-renewed lock
  holds its own lock past the server's ``lease.max-ttl-ms``.

Every child is bounded in time (its loop by a count and a deadline, its
process by a join timeout, then killed): a child that hangs is reported
as a stall. One server kind (the first; three masters for the quorum), with
``lease.max-ttl-ms`` 1000."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import redis
import redis.asyncio as aredis

from conftest import KINDS, Server, lease_info, wait_until
from redis_lease import LeaseClient, QuorumClient, use_lease_locks
from redis_lease.aio import AsyncLeaseClient
from redis_lease.quorum import AsyncQuorumClient

MAX_TTL_MS = 1000
WORKERS = 4
ROUNDS = 25
#: A child's whole loop ends by then, whatever happened.
WORK_S = 12.0
#: Longer than any wait of a healthy round (a few ms): a stall.
STALL_S = 3.0
#: How long a child holds its lock in the renewal tests: 2.5 server ttls.
HOLD_S = 2.5
JOIN_S = 25.0

CTX = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def servers() -> Iterator[List[Server]]:
    """Three servers of the first kind with ``lease.max-ttl-ms`` 1000: one
    for the single-server helpers, all three as the quorum's masters."""
    started: List[Server] = []
    try:
        for _ in range(3):
            started.append(Server(KINDS[0], ["max-ttl-ms", str(MAX_TTL_MS)]))
        yield started
    finally:
        for s in started:
            s.close()


def _plain(s: Server) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=10)


def _fork_children(target: Callable[[Any, int], None], n: int) -> Tuple[Any, List[Any]]:
    """Forks ``n`` children running ``target(queue, i)``, each to put one
    report (a dict) on the queue."""
    queue: Any = CTX.Queue()
    children = [CTX.Process(target=target, args=(queue, i), daemon=True) for i in range(n)]
    for c in children:
        c.start()
    return queue, children


def _collect(queue: Any, children: List[Any]) -> List[Dict[str, Any]]:
    """The children's reports; a child with none within ``JOIN_S`` is
    killed and reported as stalled."""
    reports: List[Dict[str, Any]] = []
    end = time.monotonic() + JOIN_S
    for _ in children:
        try:
            reports.append(queue.get(timeout=max(end - time.monotonic(), 0.1)))
        except Exception:
            break
    for c in children:
        c.join(timeout=max(end - time.monotonic(), 0.1))
        if c.is_alive():
            c.kill()
            c.join(timeout=5)
    while len(reports) < len(children):
        reports.append({"stalled": True})
    return reports


def _run_children(target: Callable[[Any, int], None], n: int) -> List[Dict[str, Any]]:
    return _collect(*_fork_children(target, n))


async def _run_children_from_loop(target: Callable[[Any, int], None], n: int) -> List[Dict[str, Any]]:
    """Forks on the running loop's thread; waits in another thread, so that
    the parent's loop (its watchdog) keeps running meanwhile."""
    queue, children = _fork_children(target, n)
    return await asyncio.get_running_loop().run_in_executor(None, _collect, queue, children)


def _report(done: int, errors: List[str], overlaps: int, waits: List[float]) -> Dict[str, Any]:
    return {"done": done, "errors": errors[:5], "overlaps": overlaps, "max_wait": max(waits, default=0.0)}


def _check(reports: List[Dict[str, Any]], what: str) -> None:
    assert not [r for r in reports if r.get("stalled")], f"{what}: a child hung: {reports}"
    assert sum(r["overlaps"] for r in reports) == 0, f"{what}: two holders at once: {reports}"
    assert not [e for r in reports for e in r["errors"]], f"{what}: spurious errors: {reports}"
    assert all(r["done"] == ROUNDS for r in reports), f"{what}: rounds missing: {reports}"
    assert max(r["max_wait"] for r in reports) < STALL_S, f"{what}: a wait stalled: {reports}"


def _touch(held: Any) -> None:
    """One call through a held lock on the connections it finds idle: a
    fenced ``PING`` (redis-py's Lock, which has no fence: ``owned()``)."""
    if hasattr(held, "fence"):
        held.fence("PING")
    else:
        assert held.owned()


async def _touch_async(held: Any) -> None:
    if hasattr(held, "fence"):
        await held.fence("PING")
    else:
        assert await held.owned()


# -- contention: no two forked workers inside at once ------------------------

SYNC_KINDS = ["redis-py", "lease-lock", "lease-client", "quorum"]


def _sync_makers(kind: str, servers: List[Server]) -> Callable[[str, bool], Any]:
    """``make(name, parent)``: a context manager holding ``name`` through
    one client object made here, in the parent (``parent``: the parent's
    own lock, held across the fork)."""
    if kind in ("redis-py", "lease-lock"):
        r = _plain(servers[0])
        if kind == "lease-lock":
            use_lease_locks(r)
        return lambda name, parent: r.lock(name, timeout=None if parent else 5, blocking_timeout=4)
    if kind == "lease-client":
        client = LeaseClient(_plain(servers[0]))
        return lambda name, parent: client.lease(name, MAX_TTL_MS, block_ms=4000)
    quorum = QuorumClient([_plain(s) for s in servers])
    return lambda name, parent: quorum.lease(name, MAX_TTL_MS, block_ms=4000)


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_forked_workers_sharing_a_used_client_never_hold_at_once(servers: List[Server], kind: str) -> None:
    name, counter = f"fork:{kind}:same", f"fork:{kind}:inside"
    make = _sync_makers(kind, servers)
    with make(f"fork:{kind}:warm", False):  # the client is used in the parent
        pass
    parent = make(f"fork:{kind}:parent", True)
    held = parent.__enter__()  # and holds a lock (watchdog-renewed) across the fork
    port = servers[0].port

    def worker(queue: Any, i: int) -> None:
        detector = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)  # the child's own
        errors: List[str] = []
        waits: List[float] = []
        overlaps = done = 0
        end = time.monotonic() + WORK_S
        for _ in range(ROUNDS):
            if time.monotonic() > end:
                break
            t0 = time.monotonic()
            try:
                with make(name, False):
                    waits.append(time.monotonic() - t0)
                    try:
                        if detector.incr(counter) != 1:
                            overlaps += 1
                        time.sleep(0.002)
                    finally:
                        detector.decr(counter)
                done += 1
            except Exception as e:
                errors.append(repr(e))
                waits.append(time.monotonic() - t0)
            time.sleep(0.003)
        queue.put(_report(done, errors, overlaps, waits))

    try:
        reports = _run_children(worker, WORKERS)
        # The parent's client still works, promptly: the children left it
        # alone (its idle connections first: a call through its lock).
        t0 = time.monotonic()
        _touch(held)
        assert time.monotonic() - t0 < STALL_S, f"{kind}: the parent's client stalled after the fork"
        for _ in range(3):
            t0 = time.monotonic()
            with make(name, False):
                pass
            assert time.monotonic() - t0 < STALL_S, f"{kind}: the parent's client stalled after the fork"
    finally:
        parent.__exit__(None, None, None)  # still ours
    _check(reports, kind)


ASYNC_KINDS = ["redis-py-asyncio", "lease-lock-asyncio", "lease-client-asyncio", "quorum-asyncio"]


def _async_makers(kind: str, servers: List[Server]) -> Tuple[Callable[[str], Any], List[aredis.Redis]]:
    """``(make, clients)``: ``make(name)`` is an async context manager
    holding ``name`` through one client object made here, in the parent, on
    the redis-py ``clients``."""
    clients = [aredis.Redis(host="127.0.0.1", port=s.port, socket_timeout=10) for s in servers]
    if kind in ("redis-py-asyncio", "lease-lock-asyncio"):
        ar = clients[0]
        if kind == "lease-lock-asyncio":
            use_lease_locks(ar)
        return (lambda name: ar.lock(name, timeout=5, blocking_timeout=4)), clients[:1]
    if kind == "lease-client-asyncio":
        client = AsyncLeaseClient(clients[0])
        return (lambda name: client.lease(name, MAX_TTL_MS, block_ms=4000)), clients[:1]
    quorum = AsyncQuorumClient(clients)
    return (lambda name: quorum.lease(name, MAX_TTL_MS, block_ms=4000)), clients


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_forked_asyncio_workers_sharing_a_used_client_never_hold_at_once(servers: List[Server], kind: str) -> None:
    """The parent uses the client on its event loop and forks from that
    loop while it holds a lock there; each child runs a loop of its own.
    Before the fork the parent closes redis-py's own connections
    (``aclose()``: they belong to its loop, and redis-py's asyncio client
    does not survive a fork with them open); the helpers' stay as they are."""
    name, counter = f"fork:{kind}:same", f"fork:{kind}:inside"
    make, clients = _async_makers(kind, servers)
    port = servers[0].port

    def worker(queue: Any, i: int) -> None:
        async def work() -> Dict[str, Any]:
            detector = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)  # the child's own
            errors: List[str] = []
            waits: List[float] = []
            overlaps = done = 0
            end = time.monotonic() + WORK_S
            for _ in range(ROUNDS):
                if time.monotonic() > end:
                    break
                t0 = time.monotonic()
                try:
                    async with make(name):
                        waits.append(time.monotonic() - t0)
                        try:
                            if detector.incr(counter) != 1:
                                overlaps += 1
                            await asyncio.sleep(0.002)
                        finally:
                            detector.decr(counter)
                    done += 1
                except Exception as e:
                    errors.append(repr(e))
                    waits.append(time.monotonic() - t0)
                await asyncio.sleep(0.003)
            return _report(done, errors, overlaps, waits)

        try:
            queue.put(asyncio.run(asyncio.wait_for(work(), WORK_S + 5)))
        except BaseException as e:  # noqa: B036 - reported, the child ends
            queue.put(_report(0, [repr(e)], 0, []))

    async def parent() -> List[Dict[str, Any]]:
        async with make(f"fork:{kind}:warm"):
            pass
        async with make(f"fork:{kind}:parent") as held:
            for c in clients:
                await c.aclose()
            reports = await _run_children_from_loop(worker, WORKERS)
            # The parent's client still works, promptly: the children left
            # its connections alone, and its event loop's registrations
            # (its idle connections first: a call through its lock).
            await asyncio.wait_for(_touch_async(held), STALL_S)
            for _ in range(3):
                await asyncio.wait_for(once(), STALL_S)
            return reports

    async def once() -> None:
        async with make(name):
            pass

    _check(asyncio.run(parent()), kind)


# -- renewal: a child's own lock outlives the server's max ttl ---------------

RENEW_KINDS = ["lease-lock", "lease-client", "quorum", "lease-lock-asyncio", "lease-client-asyncio", "quorum-asyncio"]


def _held_past_max_ttl(
    busy: bool, token: Optional[int], lost: bool, info_tokens: List[Optional[int]]
) -> Dict[str, Any]:
    return {"parent_busy": busy, "token": token, "lost": lost, "server": info_tokens}


@pytest.mark.parametrize("kind", RENEW_KINDS)
def test_a_child_forked_while_the_parent_holds_a_renewed_lock_gets_its_own_renewed(
    servers: List[Server], kind: str
) -> None:
    mine, theirs = f"renew:{kind}:child", f"renew:{kind}:parent"
    plain = [_plain(s) for s in servers]
    masters = plain if kind.startswith("quorum") else plain[:1]

    def on_server(name: str) -> List[Optional[int]]:
        out: List[Optional[int]] = []
        for m in masters:
            info = lease_info(m, name)
            out.append(None if info is None else int(info["token"]))
        return out

    if not kind.endswith("asyncio"):
        if kind == "lease-lock":
            r = use_lease_locks(_plain(servers[0]))
            parent_lock = r.lock(theirs, timeout=None)
            assert parent_lock.acquire()

            def busy() -> bool:
                return not r.lock(theirs, timeout=None).acquire(blocking=False)

            def take() -> Any:
                lock = r.lock(mine, timeout=None)
                assert lock.acquire(blocking_timeout=2)
                return lock

            def state(held: Any) -> Any:
                return held.token, held.lost.is_set()

            def give(held: Any) -> None:
                held.release()
        else:
            client: Any = LeaseClient(_plain(servers[0])) if kind == "lease-client" else QuorumClient(plain)
            parent_lease = client.acquire(theirs, MAX_TTL_MS, block_ms=2000)

            def busy() -> bool:
                return client.acquire(theirs, MAX_TTL_MS) is None

            def take() -> Any:
                return client.acquire(mine, MAX_TTL_MS, block_ms=2000)

            def state(held: Any) -> Any:
                return held.token, held.lost.is_set()

            def give(held: Any) -> None:
                held.release()

        def child(queue: Any, i: int) -> None:
            try:
                held = take()
                time.sleep(HOLD_S)
                token, lost = state(held)
                parent_busy = busy()  # the parent's, held by another owner
                queue.put(_held_past_max_ttl(parent_busy, token, lost, on_server(mine)))
                give(held)
            except BaseException as e:  # noqa: B036 - reported, the child ends
                queue.put({"error": repr(e)})

        time.sleep(0.5)  # the parent's watchdog runs, its threads wait for work
        reports = _run_children(child, 1)
        if kind == "lease-lock":
            assert parent_lock.token is not None and not parent_lock.lost.is_set()
            parent_lock.release()
        else:
            assert not parent_lease.lost.is_set()
            assert parent_lease.release()
    else:

        def ared(s: Server) -> aredis.Redis:
            return aredis.Redis(host="127.0.0.1", port=s.port, socket_timeout=10)

        if kind == "lease-lock-asyncio":
            ar = use_lease_locks(ared(servers[0]))

            async def abusy() -> bool:
                return not await ar.lock(theirs, timeout=None).acquire(blocking=False)

            async def atake() -> Any:
                lock = ar.lock(mine, timeout=None)
                assert await lock.acquire(blocking_timeout=2)
                return lock

            async def parent_take() -> Any:
                lock = ar.lock(theirs, timeout=None)
                assert await lock.acquire()
                return lock
        else:
            aclient: Any = (
                AsyncLeaseClient(ared(servers[0]))
                if kind == "lease-client-asyncio"
                else AsyncQuorumClient([ared(s) for s in servers])
            )

            async def abusy() -> bool:
                return await aclient.acquire(theirs, MAX_TTL_MS) is None

            async def atake() -> Any:
                return await aclient.acquire(mine, MAX_TTL_MS, block_ms=2000)

            async def parent_take() -> Any:
                return await aclient.acquire(theirs, MAX_TTL_MS, block_ms=2000)

        def achild(queue: Any, i: int) -> None:
            async def hold() -> Dict[str, Any]:
                held = await atake()
                await asyncio.sleep(HOLD_S)
                lost = held.lost.is_set()
                parent_busy = await abusy()  # the parent's, held by another owner
                out = _held_past_max_ttl(parent_busy, held.token, lost, on_server(mine))
                await held.release()
                return out

            try:
                queue.put(asyncio.run(asyncio.wait_for(hold(), HOLD_S + 10)))
            except BaseException as e:  # noqa: B036 - reported, the child ends
                queue.put({"error": repr(e)})

        async def parent() -> List[Dict[str, Any]]:
            held = await parent_take()
            await asyncio.sleep(0.5)  # its watchdog runs
            got = await _run_children_from_loop(achild, 1)
            assert not held.lost.is_set()
            await held.release()
            return got

        reports = asyncio.run(parent())
    (report,) = reports
    assert not report.get("stalled"), f"{kind}: the child hung"
    assert "error" not in report, f"{kind}: {report['error']}"
    assert report["parent_busy"], f"{kind}: the parent's lock was not busy for the child: {report}"
    assert report["token"] is not None and not report["lost"], f"{kind}: the child's lock was lost: {report}"
    holding = sum(1 for t in report["server"] if t == report["token"])
    assert holding >= len(masters) // 2 + 1, f"{kind}: not held on the server: {report}"
    assert wait_until(2, lambda: on_server(mine) == [None] * len(masters))
