"""redis-py's own Lock tests against the drop-ins, over redis-py versions
(``make py-redispy``)::

    python3 matrix.py --module libredis_lease.so --envs .tools/redispy 4.6.0 8.2.0 ...

For each version (``env.sh`` made ``ENVS/VERSION/venv`` and unpacked its
sdist in ``ENVS/VERSION/sdist``): one redis-server with the module on a free
port, then pytest on the sdist's ``tests/test_lock.py`` and
``tests/test_asyncio/test_lock.py`` with ``plugin.py`` (the tests' ``Lock``
is the drop-in), and again with redis-py's Lock (``REDISPY_LOCK=redis-py``,
the control) on the same server. Two versions at a time. Prints one line
per version and run with pytest's counts; exits 1 when a drop-in run failed
(or errored, or ran nothing). Standard library only."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = {"sync": "tests/test_lock.py", "asyncio": "tests/test_asyncio/test_lock.py"}
COUNT = re.compile(r"(\d+) (passed|failed|deselected|skipped|errors?|xfailed|xpassed)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Server:
    """redis-server with the module (grace off, as in the package's tests)."""

    def __init__(self, binary: str, module: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="lease-redispy-")
        for _ in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                 "--save", "", "--appendonly", "no", "--loadmodule", module, "grace-ms", "0"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            for _ in range(200):  # 10 s
                if self.proc.poll() is not None or ping(self.port):
                    break
                time.sleep(0.05)
            if self.proc.poll() is None and ping(self.port):
                return
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError(f"{binary} with {module} did not start")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def pytest(env_dir: str, port: int, which: str, kind: str) -> Tuple[Dict[str, int], str]:
    """One pytest run: its counts and its output."""
    sdist = os.path.join(env_dir, "sdist")
    cmd = [
        os.path.join(env_dir, "venv/bin/python"), "-m", "pytest", "-q", "-p", "plugin",
        "-p", "no:cacheprovider", "-p", "no:warnings", "-o", "asyncio_mode=auto", "-o", "addopts=",
        "--timeout=60", f"--redis-url=redis://127.0.0.1:{port}/0", FILES[kind],
    ]
    env = dict(os.environ, REDISPY_LOCK=which, PYTHONPATH=HERE, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(cmd, cwd=sdist, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=600).stdout
    # pytest's closing line: "3 failed, 27 passed, 2 deselected in 9.1s".
    last = [line for line in out.splitlines() if COUNT.search(line) and re.search(r" in [\d.]+s", line)][-1:]
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in COUNT.findall(last[0] if last else "")}
    return counts, out


def version(envs: str, v: str, module: str, binary: str, control: bool, log_dir: str) -> List[Tuple[str, Dict[str, int]]]:
    env_dir = os.path.join(envs, v)
    server = Server(binary, module)
    rows = []
    try:
        for which in ("lease", "redis-py") if control else ("lease",):
            for kind in FILES:
                counts, out = pytest(env_dir, server.port, which, kind)
                with open(os.path.join(log_dir, f"redispy-{v}-{which}-{kind}.log"), "w") as f:
                    f.write(out)
                rows.append((f"{v:6} {which:8} {kind:7}", counts))
    finally:
        server.close()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--module", required=True)
    p.add_argument("--envs", required=True, help="the directory of env.sh's environments")
    p.add_argument("--server", default=os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "redis-server")
    p.add_argument("--no-control", action="store_true", help="only the drop-ins, not redis-py's Lock")
    p.add_argument("--no-deselect", action="store_true", help="run plugin.DESELECT's tests too")
    p.add_argument("--logs", default="target/redispy")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("versions", nargs="+")
    a = p.parse_args(argv)
    os.makedirs(a.logs, exist_ok=True)
    module = os.path.abspath(a.module)
    if a.no_deselect:
        os.environ["REDISPY_DESELECT"] = "0"
    failed, passed, bad_total = False, 0, 0
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        runs = [pool.submit(version, os.path.abspath(a.envs), v, module, a.server, not a.no_control, a.logs)
                for v in a.versions]
        print(f"{'redis-py':6} {'Lock':8} {'tests':7} passed deselected failed (logs: {a.logs})")
        for run in runs:
            for label, c in run.result():
                bad = c.get("failed", 0) + c.get("error", 0)
                print(f"{label} {c.get('passed', 0):6} {c.get('deselected', 0):10} {bad:6}"
                      + (f"  skipped {c['skipped']}" if c.get("skipped") else ""))
                if "lease" in label:
                    passed, bad_total = passed + c.get("passed", 0), bad_total + bad
                    failed = failed or bool(bad) or not c.get("passed")
    print(f"redispy: {passed} passed, {bad_total} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
