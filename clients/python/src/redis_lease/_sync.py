"""The sync helpers: :class:`LeaseClient`, :class:`Lease`, :class:`LossSignal`
and the watchdog thread."""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Optional, Tuple, Type, Union

import redis
from redis import exceptions
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ._common import (
    SHORT_S,
    AlreadyHeld,
    LeaseBusy,
    LeaseGrace,
    LeaseLost,
    Loss,
    ReleasePlan,
    acquire_args,
    check_stale,
    check_ttl,
    connection_kwargs,
    grace_of,
    lost_during,
    lost_reply,
    mode_args,
    new_owner,
    release_plan,
    renew_every,
    retry_pause,
    still_held,
)

Conn = Any  # a redis.connection.Connection (or a subclass: SSL, unix socket)


class _Target:
    """Makes connections to the node that serves a key: the one server, or the
    master of the key's slot in a cluster."""

    def __init__(self, client: Union[redis.Redis, RedisCluster], io_timeout: float) -> None:
        self.client = client
        self.io_timeout = io_timeout

    def connect(self, key: Any, timeout: Optional[float] = None) -> Conn:
        """A new connection, every wait on it bounded by ``io_timeout`` (or
        by ``timeout``, connect included, when given)."""
        if isinstance(self.client, RedisCluster):
            node = self.client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            pool = self.client.get_redis_connection(node).connection_pool
        else:
            pool = self.client.connection_pool
        kwargs = connection_kwargs(pool.connection_kwargs, self.io_timeout, Retry(NoBackoff(), 0))
        if timeout is not None:
            kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = timeout
        conn = pool.connection_class(**kwargs)
        conn.connect()
        return conn

    def refresh(self) -> None:
        """The cluster answered MOVED/ASK: learn the slots again."""
        if isinstance(self.client, RedisCluster):
            self.client.nodes_manager.initialize()


def _call(conn: Conn, args: Tuple[Any, ...], timeout: Optional[float]) -> Any:
    """Sends ``args`` and reads the reply, waiting at most ``timeout``
    seconds (``None``: no limit). The connection is closed on an I/O error
    or a timeout."""
    conn.send_command(*args)
    return conn.read_response(timeout=None if timeout is None else max(timeout, 0.001))


def _usable(conn: Conn) -> bool:
    """Is an idle connection of ours still open? With no reply due, anything
    readable on it is the server's close (or garbage): not usable."""
    try:
        return not conn.can_read(timeout=0)
    except Exception:
        return False


class LossSignal:
    """The loss signal of a lease, like a :class:`threading.Event` that is set
    once and stays set: at the lease's client-side deadline (checked wherever
    the signal is read, so it never waits for the watchdog), when a renewal
    answers 0, or when the lease is released.

    ``is_set()`` never blocks; ``wait(timeout)`` returns True once it is set,
    False when ``timeout`` ran out; ``reason`` says why (a :class:`Loss`).
    """

    def __init__(self, deadline: float) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._deadline = deadline
        self._reason: Optional[Loss] = None

    def _check(self) -> None:
        with self._lock:
            if self._reason is None and time.monotonic() >= self._deadline:
                self._reason = Loss.EXPIRED
                self._event.set()

    def is_set(self) -> bool:
        """True once the lease is lost (or released). Never blocks."""
        self._check()
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lease is lost, at most ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            now = time.monotonic()
            wake = self._deadline - now
            if end is not None:
                if now >= end:
                    return False
                wake = min(wake, end - now)
            self._event.wait(max(wake, 0.001))
        return True

    @property
    def reason(self) -> Optional[Loss]:
        """Why the lease is lost; None while it is held."""
        self._check()
        return self._reason

    @property
    def deadline(self) -> float:
        """The client-side deadline (``time.monotonic()`` seconds)."""
        return self._deadline

    def _extend(self, sent: float, ttl_ms: int) -> bool:
        """A renewal sent at ``sent`` succeeded. False once lost."""
        with self._lock:
            if self._reason is None and time.monotonic() >= self._deadline:
                self._reason = Loss.EXPIRED
                self._event.set()
            if self._reason is not None:
                return False
            self._deadline = max(self._deadline, sent + ttl_ms / 1000)
            return True

    def _lose(self, reason: Loss) -> None:
        self._check()
        with self._lock:
            if self._reason is None:
                self._reason = reason
            self._event.set()


class Lease:
    """A held lease: the guard of one acquisition, and a context manager that
    releases it on exit (also when the block raises).

    ``token`` is its fencing token; ``lost`` its :class:`LossSignal`. It has a
    connection of its own for :meth:`fence`, :meth:`renew` and
    :meth:`release`; its watchdog thread has another.
    """

    def __init__(
        self,
        client: "LeaseClient",
        key: Any,
        owner: str,
        token: int,
        ttl_ms: int,
        deadline: float,
        conn: Conn,
    ) -> None:
        self.key = key
        self.token: int = token
        self.ttl_ms = ttl_ms
        self.lost = LossSignal(deadline)
        self._owner = owner
        self._client = client
        self._conn: Optional[Conn] = conn
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._released = False
        if client.watchdog:
            # The thread holds no reference to the lease: a lease dropped
            # without release() (no with block) is garbage-collected, which
            # stops its watchdog, and the lease then ends at its ttl.
            threading.Thread(
                target=_watchdog,
                args=(self.lost, self._stop, client, key, owner, ttl_ms),
                name="lease-watchdog",
                daemon=True,
            ).start()
            weakref.finalize(self, self._stop.set)

    def __repr__(self) -> str:  # never the owner: it is the holder's credential
        return f"<Lease key={self.key!r} token={self.token} lost={self.lost.reason}>"

    def _holder_call(
        self, args: Tuple[Any, ...], timeout: float, connect_timeout: Optional[float] = None
    ) -> Any:
        with self._lock:
            if self._conn is not None and not _usable(self._conn):
                # Closed by the server while idle (a restart, CLIENT KILL,
                # its idle timeout): nothing sent on it would reach the
                # server, so a new connection is safe, for a fence too.
                self._drop_conn()
            if self._conn is None:
                self._conn = self._client._target.connect(self.key, connect_timeout)
            try:
                return _call(self._conn, args, timeout)
            except exceptions.ResponseError as e:
                raise check_stale(e) from None
            except BaseException as e:
                if lost_reply(e):
                    self._drop_conn()
                raise

    def _drop_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.disconnect()
            except Exception:
                pass
            self._conn = None

    def fence(self, *command: Any) -> Any:
        """Runs ``command`` through the fence (``LEASE.FENCE key token
        command...``): only while this lease's token is current, in the same
        atomic step. Returns the command's reply; raises :class:`StaleToken`
        (nothing run) when the token is not current. It is sent even after
        the loss signal: the server decides."""
        return self._holder_call(self.fence_args(*command), self._client.io_timeout)

    def fence_args(self, *command: Any) -> Tuple[Any, ...]:
        """The fenced form of ``command``, for ``execute_command`` on a client
        or pipeline of your own."""
        return ("LEASE.FENCE", self.key, self.token) + command

    def renew(self) -> bool:
        """Renews now (the watchdog does it anyway). True: renewed, the
        deadline moves to ttl from now. False: the lease is not ours (the
        loss signal is set)."""
        sent = time.monotonic()
        timeout = min(max(self.lost.deadline - sent, 0.001), self._client.io_timeout)
        if self._holder_call(("LEASE.RENEW", self.key, self._owner, self.ttl_ms), timeout) == 1:
            return self.lost._extend(sent, self.ttl_ms)
        self.lost._lose(Loss.REFUSED)
        return False

    def release(self) -> bool:
        """Gives the lease back and stops the watchdog. True: it was ours.
        False: it was lost before (or released already). A lost reply is
        retried with the same owner. Once the lease is known lost it waits
        little: after a refused renewal nothing is sent; after the deadline
        passed one attempt, bounded by a quarter of a second, no retry."""
        if self._released:
            return False
        self._released = True
        self._stop.set()
        plan = release_plan(self.lost.reason)
        self.lost._lose(Loss.RELEASED)
        attempt = 0
        args = ("LEASE.RELEASE", self.key, self._owner)
        try:
            if plan is ReleasePlan.NONE:
                return False
            if plan is ReleasePlan.SHORT:
                try:
                    return bool(self._holder_call(args, SHORT_S, SHORT_S) == 1)
                except Exception as e:
                    if lost_reply(e):
                        return False
                    raise
            while True:
                try:
                    return bool(self._holder_call(args, self._client.io_timeout) == 1)
                except Exception as e:
                    if not lost_reply(e) or attempt >= self._client.retries:
                        raise
                    attempt += 1
        finally:
            with self._lock:
                self._drop_conn()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Releases; a block that ended normally after the lease was lost
        (refused or expired) raises :class:`LeaseLost`: its work may have
        overlapped the next holder's."""
        lost = lost_during(self.lost.reason)
        try:
            self.release()
        except Exception:
            if exc is None:
                raise
            # The block's own error matters more; the lease ends at its ttl.
        if exc is None and lost is not None:
            raise LeaseLost(lost)


def _watchdog(
    lost: LossSignal, stop: threading.Event, client: "LeaseClient", key: Any, owner: str, ttl_ms: int
) -> None:
    """Renews a third of the ttl after each success, sooner after a failure,
    until the holder is done (``stop``) or the lease is lost. Each renewal
    waits for its reply at most until the deadline."""
    next_at = lost.deadline - ttl_ms / 1000 + renew_every(ttl_ms)
    conn: Optional[Conn] = None
    args = ("LEASE.RENEW", key, owner, ttl_ms)
    try:
        while not stop.is_set() and not lost.is_set():
            now = time.monotonic()
            if now < next_at:
                stop.wait(min(next_at, lost.deadline) - now)
                continue
            timeout = min(max(lost.deadline - now, 0.001), client.io_timeout)
            try:
                if conn is None:
                    conn = client._target.connect(key)
                reply = _call(conn, args, timeout)
            except Exception as e:
                if lost_reply(e) and conn is not None:
                    conn.disconnect()
                    conn = None
                elif isinstance(e, (exceptions.MovedError, exceptions.AskError)):
                    client._target.refresh()
                    conn = None
                next_at = time.monotonic() + retry_pause(ttl_ms)
                continue
            if reply == 1:
                if not lost._extend(now, ttl_ms):
                    return
                next_at = now + renew_every(ttl_ms)
            else:
                lost._lose(Loss.REFUSED)
                return
    finally:
        if conn is not None:
            conn.disconnect()


class LeaseClient:
    """Takes leases on the server of a :class:`redis.Redis`, or on the master of
    the lease key's slot of a :class:`redis.cluster.RedisCluster`.

    - ``io_timeout``: seconds to wait for a reply that does not block (renew,
      release, fence, acquire without ``block_ms``). Default 5.
    - ``block_margin``: how much longer than its ``BLOCK`` a blocking acquire
      waits for its reply before it counts it as lost. Default 2.
    - ``retries``: how often a lost acquire (or release) reply is retried, on
      a new connection, with the same owner. Default 3.
    - ``watchdog``: renew in the background. Default True.
    """

    def __init__(
        self,
        client: Union[redis.Redis, RedisCluster],
        *,
        io_timeout: float = 5.0,
        block_margin: float = 2.0,
        retries: int = 3,
        watchdog: bool = True,
    ) -> None:
        self._target = _Target(client, io_timeout)
        self._held: "weakref.WeakValueDictionary[Any, Lease]" = weakref.WeakValueDictionary()
        self._held_lock = threading.Lock()
        self.io_timeout = io_timeout
        self.block_margin = block_margin
        self.retries = retries
        self.watchdog = watchdog

    def acquire(
        self,
        key: Any,
        ttl_ms: int,
        block_ms: Optional[int] = None,
        *,
        shared: bool = False,
        limit: Optional[int] = None,
        _owner: Optional[str] = None,
    ) -> Optional[Lease]:
        """Takes the lease on ``key`` for ``ttl_ms`` with a fresh random owner.

        ``shared=True`` takes a reader's place (any number of readers, no
        writer meanwhile; its token fences reads only, a fenced write raises
        :class:`SharedWrite`); ``limit=n`` one of ``n`` places (a semaphore
        with expiring permits). Default: exclusive.

        ``block_ms``: ``None`` does not wait; ``n > 0`` waits up to ``n`` ms;
        ``FOREVER`` (0) waits until the lease is ours (no read timeout).
        Returns the :class:`Lease`, or None when another owner holds it. Raises
        :class:`LeaseGrace` (a :class:`LeaseBusy`) when the server refused it
        for its grace period, with the time that remains (read from the
        server's ``INFO lease`` after the null reply).

        A lost reply (I/O error, timeout) is retried on a new connection with
        the same owner: if the lost call took the lease, the retry gets the
        same token. A retry waits only for what is left of ``block_ms``.
        """
        check_ttl(ttl_ms, block_ms)
        mode = mode_args(shared, limit)
        with self._held_lock:
            mine = self._held.get(key)
            if still_held(mine):
                raise AlreadyHeld(key)
        owner = _owner or new_owner()
        wait_until = None if not block_ms else time.monotonic() + block_ms / 1000
        attempt = 0
        redirects = 0
        while True:
            args, timeout = acquire_args(
                key, owner, ttl_ms, block_ms, wait_until, self.io_timeout, self.block_margin, mode
            )
            conn = None
            try:
                conn = self._target.connect(key)
                sent = time.monotonic()
                token = _call(conn, args, timeout)
            except (exceptions.MovedError, exceptions.AskError, exceptions.TryAgainError):
                _close(conn)
                redirects += 1
                if redirects > 5:
                    raise
                self._target.refresh()
                continue
            except Exception as e:
                _close(conn)
                if lost_reply(e) and attempt < self.retries:
                    attempt += 1
                    time.sleep(0.02 * attempt)
                    continue
                raise
            if token is None:
                try:
                    grace = _grace(conn, self.io_timeout)
                finally:
                    _close(conn)
                if grace is not None:
                    raise LeaseGrace(key, *grace)
                return None
            lease = self._start(key, owner, int(token), ttl_ms, sent, conn)
            with self._held_lock:
                self._held[key] = lease
            return lease

    def _start(self, key: Any, owner: str, token: int, ttl_ms: int, sent: float, conn: Conn) -> Lease:
        # The deadline counts from when the acquire was sent. After a long
        # wait (a blocking acquire is granted long after it was sent), renew
        # at once and count from the renewal: its 1 says the lease is ours
        # now, with the same token.
        deadline = sent + ttl_ms / 1000
        refused = False
        if time.monotonic() - sent >= renew_every(ttl_ms):
            renewed = time.monotonic()
            try:
                if _call(conn, ("LEASE.RENEW", key, owner, ttl_ms), self.io_timeout) == 1:
                    deadline = renewed + ttl_ms / 1000
                else:
                    refused = True
            except Exception:
                pass
        lease = Lease(self, key, owner, token, ttl_ms, deadline, conn)
        if refused:
            lease.lost._lose(Loss.REFUSED)
        return lease

    def lease(
        self, key: Any, ttl_ms: int, block_ms: Optional[int] = None, **mode: Any
    ) -> "_LeaseContext":
        """For ``with``: acquires on entry (raising :class:`LeaseBusy` when the
        lease was not obtained, :class:`LeaseGrace` for a grace period) and
        releases on exit; a block that ends normally after the lease was lost
        raises :class:`LeaseLost`::

            with client.lease("lock", 30000, block_ms=5000) as lease:
                lease.fence("HSET", "data", "k", "v")
        """
        return _LeaseContext(self, key, ttl_ms, block_ms, mode)

    def run(
        self,
        key: Any,
        ttl_ms: int,
        work: Callable[[Lease], Any],
        block_ms: Optional[int] = None,
        **mode: Any,
    ) -> Any:
        """Runs ``work(lease)`` holding the lease and releases it however
        ``work`` ends; returns what ``work`` returns. ``work`` polls
        ``lease.lost.is_set()`` to know when to stop. Raises
        :class:`LeaseBusy` when the lease was not obtained."""
        with self.lease(key, ttl_ms, block_ms, **mode) as lease:
            return work(lease)


class _LeaseContext:
    """``with client.lease(...) as lease``: acquires on entry, releases on
    exit (as the asyncio one)."""

    def __init__(self, client: "LeaseClient", key: Any, ttl_ms: int, block_ms: Optional[int], mode: Any) -> None:
        self._args = (client, key, ttl_ms, block_ms)
        self._mode = mode
        self._lease: Optional[Lease] = None

    def __enter__(self) -> Lease:
        client, key, ttl_ms, block_ms = self._args
        lease = client.acquire(key, ttl_ms, block_ms, **self._mode)
        if lease is None:
            raise LeaseBusy(f"{key!r} is held by another owner")
        self._lease = lease
        return lease

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._lease is not None
        self._lease.__exit__(exc_type, exc, tb)


def _grace(conn: Conn, timeout: float) -> Optional[Tuple[int, str]]:
    """After a null acquire: the grace period the server runs, if any (a
    server that cannot say counts as none)."""
    try:
        return grace_of(_call(conn, ("INFO", "lease"), timeout))
    except Exception:
        return None


def _close(conn: Optional[Conn]) -> None:
    if conn is not None:
        try:
            conn.disconnect()
        except Exception:
            pass
