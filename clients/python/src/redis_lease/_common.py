"""What the sync and the asyncio helpers share: errors, loss reasons, owner ids,
command arguments and timing rules."""

from __future__ import annotations

import collections
import enum
import weakref
import math
import secrets
import socket
import time
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Tuple, Union

import redis
from redis import exceptions
from redis.crc import key_slot

#: ``block_ms=FOREVER`` waits until the lease is ours (``BLOCK 0``).
FOREVER = 0


class Loss(str, enum.Enum):
    """Why a lease is no longer held."""

    #: A renewal answered 0: the server says the lease is not ours.
    REFUSED = "refused"
    #: The client-side deadline passed with no successful renewal.
    EXPIRED = "expired"
    #: The holder released it.
    RELEASED = "released"


class LeaseError(redis.RedisError):
    """Base class of this package's errors."""


class LeaseBusy(LeaseError):
    """``client.lease(...)`` could not take the lease: another owner holds it
    (and the ``block_ms`` wait, if any, ran out)."""


class LeaseGrace(LeaseBusy):
    """The server refused the lease because it is in a grace period (after a
    failover or a start on possibly lost data, design.md S7), not because
    another owner holds it: no new lease on that server for
    ``remaining_ms`` more (``reason``: ``promoted``, ``restart`` or
    ``no-data``). Leases already held keep working. Read from the server's
    ``INFO lease`` right after the refusal."""

    def __init__(self, key: Any, remaining_ms: int, reason: str) -> None:
        super().__init__(
            f"{key!r}: the server is in a grace period ({reason}): "
            f"no new lease for {remaining_ms} ms more"
        )
        self.remaining_ms = remaining_ms
        self.reason = reason


def grace_of(info: Any) -> Optional[Tuple[int, str]]:
    """``(remaining_ms, reason)`` of a running grace period, from an ``INFO
    lease`` reply (bytes or str); None when none runs."""
    if isinstance(info, bytes):
        info = info.decode(errors="replace")
    fields = dict(
        line.split(":", 1) for line in str(info).splitlines() if ":" in line
    )
    try:
        remaining = int(fields.get("lease_grace_remaining_ms", "0"))
    except ValueError:
        return None
    if remaining <= 0:
        return None
    return remaining, fields.get("lease_grace_reason", "unknown").strip()


class StaleToken(LeaseError, exceptions.ResponseError):
    """``LEASE.FENCE`` answered ``STALE``: the token is not the one of the lease
    held now, and the fenced command was not run."""


class SharedWrite(LeaseError, exceptions.ResponseError):
    """A ``shared=True`` holder's token fenced a write command: refused by the
    server, nothing run. Readers fence reads only; take the lease exclusively
    to write."""


class AlreadyHeld(LeaseError):
    """This client already holds a lease on this key (not released, not
    lost): a second acquire would wait on itself (with ``block_ms``) or be
    refused. Use the lease you hold, or release it first. Raised at once,
    nothing sent."""

    def __init__(self, key: Any) -> None:
        super().__init__(f"{key!r} is already held by this client: use that lease or release it first")


def still_held(lease: Any) -> bool:
    """Is ``lease`` (a sync or an asyncio one, or None) neither released nor
    lost? A second acquire of its key by the same client is then
    :class:`AlreadyHeld`."""
    return lease is not None and not lease._released and not lease.lost.is_set()


def lost_during(reason: Optional[Loss]) -> Optional[Loss]:
    """The loss to report when a block ends normally: a lease that was
    refused or expired during the work (not one the work released)."""
    return reason if reason in (Loss.REFUSED, Loss.EXPIRED) else None


class LeaseLost(LeaseError):
    """The lease is lost; raise it from work that saw ``lease.lost`` set."""

    def __init__(self, loss: Optional[Loss]) -> None:
        super().__init__(f"lease lost: {loss.value if loss else 'unknown'}")
        self.loss = loss


def new_owner() -> str:
    """A fresh owner id: 16 random bytes as 32 hex digits."""
    return secrets.token_hex(16)


def lost_reply(e: BaseException) -> bool:
    """May the command have run without us hearing the answer? (I/O error,
    closed connection, timeout.)"""
    return isinstance(
        e, (exceptions.ConnectionError, exceptions.TimeoutError, socket.timeout, OSError)
    )


def check_stale(e: exceptions.ResponseError) -> BaseException:
    """``STALE ...`` as :class:`StaleToken`, anything else unchanged."""
    if str(e).startswith("STALE"):
        return StaleToken(str(e))
    if "a SHARED holder's token cannot fence a write command" in str(e):
        return SharedWrite(str(e))
    return e


def mode_args(shared: bool, limit: Optional[int]) -> Tuple[Any, ...]:
    """``SHARED`` or ``LIMIT n`` (or nothing: exclusive) for an acquire."""
    if shared and limit is not None:
        raise ValueError("a lease is shared or limited, not both")
    if limit is not None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError("limit must be a positive integer")
        return ("LIMIT", limit)
    return ("SHARED",) if shared else ()


def acquire_args(
    key: Any,
    owner: str,
    ttl_ms: int,
    block_ms: Optional[int],
    wait_until: Optional[float],
    io_timeout: float,
    block_margin: float,
    mode: Tuple[Any, ...] = (),
) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """The ``LEASE.ACQUIRE`` of one attempt and its read timeout in seconds
    (``None``: no limit). ``wait_until``: monotonic end of a ``block_ms > 0``
    wait."""
    args: Tuple[Any, ...] = ("LEASE.ACQUIRE", key, owner, int(ttl_ms)) + mode
    return with_block(args, block_ms, wait_until, io_timeout, block_margin)


def macquire_args(
    keys: Tuple[Any, ...],
    owner: str,
    ttl_ms: int,
    block_ms: Optional[int],
    wait_until: Optional[float],
    io_timeout: float,
    block_margin: float,
) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """The ``LEASE.MACQUIRE numkeys key ... owner ttl-ms [BLOCK ms]`` of one
    attempt and its read timeout, as :func:`acquire_args`."""
    args: Tuple[Any, ...] = ("LEASE.MACQUIRE", len(keys)) + keys + (owner, int(ttl_ms))
    return with_block(args, block_ms, wait_until, io_timeout, block_margin)


def with_block(
    args: Tuple[Any, ...],
    block_ms: Optional[int],
    wait_until: Optional[float],
    io_timeout: float,
    block_margin: float,
) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """``args`` of an acquire with its ``BLOCK`` option (last on the line),
    and the read timeout of its reply."""
    if block_ms is None:
        return args, io_timeout
    if block_ms == FOREVER:
        return args + ("BLOCK", 0), None
    assert wait_until is not None
    # Rounded up: a wait asked a few microseconds later is never shorter.
    left = math.ceil((wait_until - time.monotonic()) * 1000)
    if left <= 0:
        # Nothing left of the wait (a retry at its end): ask once without
        # BLOCK, never BLOCK 0, which would wait forever.
        return args, io_timeout
    return args + ("BLOCK", left), left / 1000 + block_margin


def renew_every(ttl_ms: int) -> float:
    """The renewal interval in seconds: a third of the ttl."""
    return max(ttl_ms / 3000, 0.001)


def retry_pause(ttl_ms: int) -> float:
    """The pause before a failed (not refused) renewal is tried again."""
    return min(max(ttl_ms / 20000, 0.005), 0.25)


def many_keys(keys: Any) -> Tuple[Any, ...]:
    """The keys of a multi-key lease as a tuple: at least one, none twice
    (``ValueError`` otherwise; nothing is sent). A single ``str`` or
    ``bytes`` is not a list of keys."""
    if isinstance(keys, (str, bytes)):
        raise ValueError("keys must be a list of keys, not one key")
    out = tuple(keys)
    if not out:
        raise ValueError("a multi-key lease needs at least one key")
    seen = set()
    for k in out:
        if k in seen:
            raise ValueError(f"{k!r} is given twice")
        seen.add(k)
    return out


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    return (key if isinstance(key, str) else str(key)).encode()


def one_slot(keys: Tuple[Any, ...]) -> None:
    """On a cluster: every key in one slot (a multi-key lease lives on one
    node), ``ValueError`` otherwise, before anything is sent. The server's
    own check answers ``CROSSSLOT``; this one does not depend on it."""
    slot = key_slot(_key_bytes(keys[0]))
    for k in keys[1:]:
        if key_slot(_key_bytes(k)) != slot:
            raise ValueError(
                f"{keys[0]!r} and {k!r} hash to different cluster slots (CROSSSLOT): give the keys one hash tag"
            )


def check_ttl(ttl_ms: int, block_ms: Optional[int]) -> None:
    if not isinstance(ttl_ms, int) or ttl_ms < 1:
        raise ValueError("ttl_ms must be a positive integer (milliseconds)")
    if block_ms is not None and (not isinstance(block_ms, int) or block_ms < 0):
        raise ValueError("block_ms must be None (no wait), 0 (FOREVER) or a positive integer")


def checked_keys(keys: Any, ttl_ms: int, block_ms: Optional[int], on_cluster: bool) -> Tuple[Any, ...]:
    """The keys of a multi-key acquire, checked before anything is sent:
    :func:`many_keys`, then the ttl and the wait (:func:`check_ttl`), then,
    on a cluster, one slot (:func:`one_slot`)."""
    out = many_keys(keys)
    check_ttl(ttl_ms, block_ms)
    if on_cluster:
        one_slot(out)
    return out


def connection_kwargs(kwargs: Dict[str, Any], io_timeout: float, no_retry: Any) -> Dict[str, Any]:
    """A pool's connection arguments for a connection of our own: every wait
    on it is bounded. Its socket timeout is ``io_timeout`` (the handshake
    redis-py sends on connect, HELLO, AUTH, SELECT, CLIENT SETINFO, and every
    send; each read passes its own timeout), and so is its connect timeout
    unless the client set one. redis-py's own retries (``no_retry``: a
    ``Retry`` with none, of the sync or the asyncio kind) are off: the helpers
    retry themselves, with the same owner and within their own bounds."""
    out = dict(kwargs)
    out["retry"] = no_retry
    out["socket_timeout"] = io_timeout
    if out.get("socket_connect_timeout") is None:
        out["socket_connect_timeout"] = io_timeout
    return out


class ReleasePlan(enum.Enum):
    """How a release is sent, given what the holder knows of its lease."""

    #: Held (or not known lost): sent, and a lost reply retried.
    FULL = "full"
    #: The deadline passed with no successful renewal: the server may still
    #: hold it (a paused server), so one attempt, bounded by
    #: :data:`SHORT_S`, no retry.
    SHORT = "short"
    #: A renewal was refused: the server said it is not ours; nothing sent.
    NONE = "none"


#: The bound of the one release attempt after the deadline passed (seconds).
SHORT_S = 0.25


def release_plan(loss: Optional[Loss]) -> ReleasePlan:
    """The release of a lease whose loss signal says ``loss`` (before the
    release set it)."""
    if loss == Loss.REFUSED:
        return ReleasePlan.NONE
    if loss == Loss.EXPIRED:
        return ReleasePlan.SHORT
    return ReleasePlan.FULL


def release_attempts(plan: ReleasePlan, io_timeout: float, retries: int) -> List[Tuple[float, Optional[float]]]:
    """The attempts of a release under ``plan``: ``(read timeout, connect
    timeout or None for the default)`` each. Known lost after a refusal:
    none. Past its deadline: one short one. Else one plus ``retries`` (a lost
    reply is sent again with the same owner; a second release answers 0)."""
    if plan is ReleasePlan.NONE:
        return []
    if plan is ReleasePlan.SHORT:
        return [(SHORT_S, SHORT_S)]
    return [(io_timeout, None)] * (retries + 1)


def release_failed(e: BaseException, attempt: int, attempts: int, plan: ReleasePlan) -> Optional[bool]:
    """Release attempt ``attempt`` (of ``attempts``) failed with ``e``: None to
    try the next one, False for a lease known lost whose one short attempt got
    no answer (it ends at its ttl); anything else re-raises ``e``."""
    if lost_reply(e):
        if attempt + 1 < attempts:
            return None
        if plan is ReleasePlan.SHORT:
            return False
    raise e


class Attempts:
    """The retry plan of one acquire: a lost reply is sent again with the same
    owner (``retries`` times, pausing a little longer each time), a cluster
    redirection after the slots are learnt again (five times)."""

    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.lost = 0
        self.redirects = 0

    def after(self, e: BaseException) -> Optional[Tuple[float, bool]]:
        """``(pause in seconds, refresh the slots first)`` before the next
        try, or None: give up with ``e``."""
        if isinstance(e, (exceptions.MovedError, exceptions.AskError, exceptions.TryAgainError)):
            self.redirects += 1
            return None if self.redirects > 5 else (0.0, True)
        if lost_reply(e) and self.lost < self.retries:
            self.lost += 1
            return 0.02 * self.lost, False
        return None


def deadline_after(
    sent: float, ttl_ms: int, renewed: Optional[float], reply: Any, count: int = 1
) -> Tuple[float, bool]:
    """A new lease's deadline and whether it is refused: ttl after the acquire
    was sent, or after the renewal sent at ``renewed`` right after a long wait
    (``reply`` its answer, ``count`` when it renewed every key: 1, or the
    number of keys of a multi-key lease; None: it got none)."""
    if renewed is None or reply is None:
        return sent + ttl_ms / 1000, False
    if reply == count:
        return renewed + ttl_ms / 1000, False
    return sent + ttl_ms / 1000, True


def needs_fresh_renewal(sent: float, ttl_ms: int) -> bool:
    """After a blocking acquire granted long after it was sent, the deadline
    counted from the send is near: renew at once and count from that."""
    return time.monotonic() - sent >= renew_every(ttl_ms)


def renew_window(ttl_ms: int) -> float:
    """A renewal due within this many seconds of a batch goes with it (early,
    which is harmless), so leases fall into step and share round trips."""
    return ttl_ms / 12000


def mrenew_args(keys: Tuple[Any, ...], owner: str, ttl_ms: int) -> Tuple[Any, ...]:
    """``LEASE.MRENEW numkeys key ... owner ttl-ms``."""
    return ("LEASE.MRENEW", len(keys)) + keys + (owner, ttl_ms)


def mrelease_args(keys: Tuple[Any, ...], owner: str) -> Tuple[Any, ...]:
    """``LEASE.MRELEASE numkeys key ... owner``."""
    return ("LEASE.MRELEASE", len(keys)) + keys + (owner,)


#: At most this many idle connections stay open per node and client.
POOL_IDLE = 8


class Batch:
    """The renewals of one watchdog round: sent as one pipeline per node."""

    def __init__(self, sent: float) -> None:
        self.ids: List[int] = []
        self.keys: List[Any] = []
        self.args: List[Tuple[Any, ...]] = []
        #: When it was sent: each success counts its ttl from here.
        self.sent = sent
        #: How long to wait for the replies: until the latest deadline of the
        #: batch, at most the io timeout.
        self.timeout = 0.001
        #: The ttl each renewal asks for (shorter than the lease's for the
        #: last renewal of a lease watched ``until`` an end).
        self.ttls: List[int] = []


class Schedule:
    """The watchdog's plan for every lease of a client: when each renewal is
    due, which go out together, what each reply does to its lease. One per
    client, whatever the number of leases; the sync and the asyncio watchdog
    only send its batches and hand the replies to :meth:`settle`.

    A signal here is a :class:`LossSignal` or an :class:`AsyncLossSignal`
    (``is_set()``, ``deadline``, ``_extend()``, ``_lose()``)."""

    def __init__(self) -> None:
        self._leases: Dict[int, List[Any]] = {}
        self._next_id = 0
        #: Ids of leases collected by the garbage collector: a finalizer only
        #: appends here (no lock, safe at any moment), ``next`` forgets them.
        self.gone: Deque[int] = collections.deque()
        #: When the watchdog looks again (None: it is not running): a lease
        #: added whose first renewal is due later needs no wake-up, so adding
        #: many leases does not make the watchdog scan them all each time.
        self._looks_at: Optional[float] = None
        self.renewals = 0
        self.round_trips = 0

    def add(
        self,
        key: Any,
        owner: Any,
        ttl_ms: int,
        first: float,
        signal: Any,
        keys: Optional[Tuple[Any, ...]] = None,
        until: Optional[float] = None,
    ) -> Tuple[int, bool]:
        """Watches a lease from ``first`` on: its id, and whether the watchdog
        must be woken (it would look too late). With ``keys`` (a multi-key
        lease; ``key`` is the first, which says the node), one ``LEASE.MRENEW``
        renews them all and answers their number. With ``until`` (a monotonic
        time), renewals stop there: the last one asks only for the time left,
        so the lease ends at ``until`` (a lock's ``timeout`` longer than the
        server's ``lease.max-ttl-ms``)."""
        self._next_id += 1
        if keys is None:
            args: Tuple[Any, ...] = ("LEASE.RENEW", key, owner, ttl_ms)
            count = 1
        else:
            args, count = mrenew_args(keys, owner, ttl_ms), len(keys)
        self._leases[self._next_id] = [key, ttl_ms, first, args, signal, count, until]
        return self._next_id, self._looks_at is None or first < self._looks_at

    def set_until(self, lease_id: int, until: Optional[float], next_at: float) -> bool:
        """Moves the end of a lease watched ``until`` an end (None: no end),
        just renewed: its next renewal is at ``next_at``. True: the watchdog
        must be woken (it would look too late)."""
        entry = self._leases.get(lease_id)
        if entry is None:
            return False
        entry[6], entry[2] = until, next_at
        return self._looks_at is None or next_at < self._looks_at

    def idle_until(self, when: float) -> None:
        """The watchdog, with no lease left, waits for new ones until
        ``when``: a lease added whose first renewal is due later needs no
        wake-up."""
        self._looks_at = when

    def remove(self, lease_id: int) -> None:
        self._leases.pop(lease_id, None)

    def __len__(self) -> int:
        return len(self._leases)

    def next(self, now: float, io_timeout: float) -> Union[Batch, float, None]:
        """Forgets the leases lost, released or collected; then the batch of
        every renewal due within its window (when one is due), else the
        monotonic time to look again, or None when no lease is left."""
        while self.gone:
            self._leases.pop(self.gone.popleft(), None)
        for lease_id in [i for i, e in self._leases.items() if e[4].is_set()]:
            del self._leases[lease_id]
        if not self._leases:
            self._looks_at = None
            return None
        first: float = min(e[2] for e in self._leases.values())
        # After a batch the watchdog looks again at once (settle, then next).
        self._looks_at = max(first, now)
        if first > now:
            return first
        batch = Batch(now)
        ended = []
        for lease_id, (key, ttl_ms, next_at, args, signal, _, until) in self._leases.items():
            if next_at <= now + renew_window(ttl_ms):
                ttl = ttl_ms
                if until is not None:
                    ttl = min(ttl_ms, math.ceil((until - now) * 1000))
                    if ttl < 1:
                        ended.append(lease_id)  # ends at ``until`` by itself
                        continue
                    args = args[:-1] + (ttl,)
                batch.ids.append(lease_id)
                batch.keys.append(key)
                batch.args.append(args)
                batch.ttls.append(ttl)
                batch.timeout = max(batch.timeout, min(signal.deadline - now, io_timeout))
        for lease_id in ended:
            del self._leases[lease_id]
        if not batch.ids:
            return self.next(now, io_timeout)
        return batch

    def settle(self, batch: Batch, replies: List[Any], pipelines: int = 1) -> None:
        """The replies to ``batch`` in its order (an exception, or None, for
        one that failed or never came). A renewal of every key (1, or the
        number of keys of a multi-key lease) moves the lease's deadline and
        next renewal to a third of the ttl after the batch was sent; another
        integer (0) is the loss; anything else is tried again soon."""
        self.round_trips += pipelines
        self.renewals += len(batch.ids)
        for n, lease_id in enumerate(batch.ids):
            entry = self._leases.get(lease_id)
            if entry is None:
                continue
            reply = replies[n] if n < len(replies) else None
            ttl_ms, signal, count = entry[1], entry[4], entry[5]
            sent_ttl = batch.ttls[n] if n < len(batch.ttls) else ttl_ms
            if isinstance(reply, int) and not isinstance(reply, bool) and reply == count:
                if not signal._extend(batch.sent, sent_ttl):
                    del self._leases[lease_id]
                elif sent_ttl < ttl_ms and entry[6] is not None:
                    # The last renewal of a lease watched until an end: it
                    # ends there unless set_until moves the end meanwhile.
                    entry[2] = entry[6]
                else:
                    entry[2] = batch.sent + renew_every(ttl_ms)
            elif isinstance(reply, int) and not isinstance(reply, bool):
                signal._lose(Loss.REFUSED)
                del self._leases[lease_id]
            else:
                entry[2] = time.monotonic() + retry_pause(ttl_ms)

    def stats(self) -> Dict[str, int]:
        return {"leases": len(self._leases), "renewals": self.renewals, "round_trips": self.round_trips}


class LeaseCore:
    """What a sync and an asyncio lease share (their I/O aside): the token,
    the loss signal, its place in the client's watchdog schedule, the
    commands it sends and the start of its release.

    A multi-key lease (:class:`MultiLeaseCore`) is the same with ``keys``:
    its commands are the ``LEASE.M*`` ones, whose answer when every key
    acted is their number; ``key`` is its first key, the one its calls are
    routed by."""

    #: What a renewal or a release that acted on every key answers.
    _count = 1

    def __init__(
        self,
        client: Any,
        key: Any,
        owner: str,
        token: int,
        ttl_ms: int,
        lost: Any,
        keys: Optional[Tuple[Any, ...]] = None,
    ) -> None:
        self.key = key
        self.token: int = token
        self.ttl_ms = ttl_ms
        self.lost = lost
        self._owner = owner
        self._client = client
        self._released = False
        self._watched: Optional[int] = None
        if client.watchdog:
            first = lost.deadline - ttl_ms / 1000 + renew_every(ttl_ms)
            self._watched = client._watch(key, owner, ttl_ms, first, lost, keys)
            # The schedule holds the signal, not the lease: a lease dropped
            # without release() (no with block) is garbage-collected, which
            # ends its renewals, and the lease then ends at its ttl.
            weakref.finalize(self, client._schedule.gone.append, self._watched)

    def __repr__(self) -> str:  # never the owner: it is the holder's credential
        return f"<{type(self).__name__} key={self.key!r} token={self.token} lost={self.lost.reason}>"

    def fence_args(self, *command: Any) -> Tuple[Any, ...]:
        """The fenced form of ``command`` (``LEASE.FENCE key token
        command...``), for ``execute_command`` on a client or pipeline of
        your own."""
        return ("LEASE.FENCE", self.key, self.token) + command

    def _renew_args(self) -> Tuple[Any, ...]:
        return ("LEASE.RENEW", self.key, self._owner, self.ttl_ms)

    def _release_args(self) -> Tuple[Any, ...]:
        return ("LEASE.RELEASE", self.key, self._owner)

    def _leftover_args(self) -> List[Tuple[Any, ...]]:
        """After a multi-key lease was found not all ours: one
        ``LEASE.RELEASE`` per key (none for a single lease)."""
        return []

    def _renewal(self) -> Tuple[Tuple[Any, ...], float, float]:
        """A renewal now: its command, when it is sent, and its read timeout
        (until the deadline, at most the io timeout)."""
        sent = time.monotonic()
        timeout = min(max(self.lost.deadline - sent, 0.001), self._client.io_timeout)
        return self._renew_args(), sent, timeout

    def _renewed(self, reply: Any, sent: float) -> bool:
        """What a renewal's reply means: True renewed, False lost (the signal
        is set)."""
        if reply == self._count:
            return bool(self.lost._extend(sent, self.ttl_ms))
        self.lost._lose(Loss.REFUSED)
        return False

    def _release_plan(self) -> Tuple[ReleasePlan, List[Tuple[float, Optional[float]]], Tuple[Any, ...]]:
        """Starts the release: no more renewals, the signal reads released
        (unless lost before), and how the ``LEASE.RELEASE`` goes: its plan,
        its attempts (none when already released) and its command."""
        plan = release_plan(self.lost.reason)
        attempts: List[Tuple[float, Optional[float]]] = []
        if not self._released:
            self._released = True
            self.lost._lose(Loss.RELEASED)
            if self._watched is not None:
                self._client._forget(self._watched)
            attempts = release_attempts(plan, self._client.io_timeout, self._client.retries)
        return plan, attempts, self._release_args()

    def _exit_loss(self) -> Optional[Loss]:
        """The loss to raise when a block ends normally (read before its
        release)."""
        return lost_during(self.lost.reason)


class MultiLeaseCore(LeaseCore):
    """The multi-key lease of design.md S10 (``LEASE.MACQUIRE``): every key
    held by one owner with one token, renewed (``LEASE.MRENEW``), lost and
    released (``LEASE.MRELEASE``) together."""

    def __init__(
        self, client: Any, keys: Tuple[Any, ...], owner: str, token: int, ttl_ms: int, lost: Any
    ) -> None:
        #: The keys, in the order given.
        self.keys: Tuple[Any, ...] = keys
        self._count = len(keys)
        # LeaseCore by name: in a sync or asyncio multi-key lease the next
        # class of the MRO is Lease (or AsyncLease), whose __init__ differs.
        LeaseCore.__init__(self, client, keys[0], owner, token, ttl_ms, lost, keys)

    def __repr__(self) -> str:  # never the owner
        return f"<{type(self).__name__} keys={self.keys!r} token={self.token} lost={self.lost.reason}>"

    def fence_args(self, key: Any, *command: Any) -> Tuple[Any, ...]:
        """The fenced form of ``command`` on ``key``, one of the lease's keys
        (``LEASE.FENCE key token command...``); ``ValueError`` for a key
        that is not one of them."""
        if key not in self.keys:
            raise ValueError(f"{key!r} is not one of the lease's keys; nothing was sent")
        return ("LEASE.FENCE", key, self.token) + command

    def _renew_args(self) -> Tuple[Any, ...]:
        return mrenew_args(self.keys, self._owner, self.ttl_ms)

    def _release_args(self) -> Tuple[Any, ...]:
        return mrelease_args(self.keys, self._owner)

    def _leftover_args(self) -> List[Tuple[Any, ...]]:
        """The keys still ours after a refused renewal (or an
        ``LEASE.MRELEASE`` that answered 0, which frees nothing) are released
        one by one, so that they are free at once instead of at their ttl; a
        key another owner holds answers 0 and is left alone."""
        return [("LEASE.RELEASE", k, self._owner) for k in self.keys]


# --- Quorum leases (design.md S9): the decisions of step 3 and the fence.


class Outlier(NamedTuple):
    """A master left out of a quorum acquisition's commit (step 3) because
    the others refused its token as too far ahead of their clocks (the
    ``FLOOR`` bound): its clock is wrong. The token committed is the highest
    that a majority accepts instead. Reported through the package's logger
    and the quorum client's ``on_outlier``."""

    #: The master's index in the client's list.
    master: int
    #: Its address (``host:port``, or a Unix socket's path).
    addr: str
    #: The token it granted, which the others refused.
    token: int
    #: The token tried next in its place: the highest that the masters
    #: which refused it granted.
    instead: int
    #: How far ahead its token is of that one, in ms of wall clock (a token
    #: counts 1024 per ms): about how far its clock runs ahead.
    ahead_ms: int


def floor_refused(reply: Any) -> bool:
    """Is ``reply`` a master's refusal of a ``FLOOR`` token as too far ahead
    of its clock? Read from the error alone (it names ``FLOOR`` and says how
    far ahead), never from the bound's value, which is the server's to
    choose."""
    text = str(reply)
    return isinstance(reply, exceptions.ResponseError) and "FLOOR" in text and "ahead" in text


class Commit:
    """Step 3 of a quorum acquisition, one round at a time: ``LEASE.ACQUIRE
    ... FLOOR token`` to the masters ``on``. The first round sends the
    highest token granted in step 1 to every master that granted. When
    fewer than a majority answer it exactly but a majority refused it as too
    far ahead of their clocks, the next round leaves out the masters that
    granted it (outliers) and sends, to the masters that refused, the
    highest token they granted; each round leaves at least one master out,
    so there are at most N. Any two majorities still share a master, so
    tokens of successive holdings still increase."""

    def __init__(self, grants: Dict[int, int], on: List[int], token: int, quorum: int) -> None:
        self._grants = grants
        self.on = on
        self.token = token
        self._quorum = quorum

    @staticmethod
    def first(grants: List[Tuple[int, int]], quorum: int) -> Optional["Commit"]:
        """The first round, from step 1's ``(master, token)`` grants; None
        when fewer than ``quorum`` masters granted."""
        if len(grants) < quorum or not grants:
            return None
        return Commit(dict(grants), [i for i, _ in grants], max(t for _, t in grants), quorum)

    def settle(self, replies: List[Any], addr: Callable[[int], str]) -> Union[List[int], Tuple["Commit", List[Outlier]], None]:
        """The round's replies (in the order of ``on``): the masters that
        committed ``token`` (a majority: held), or the next round and the
        outliers it leaves out, or None (no majority: release and retry)."""
        committed = [i for i, r in zip(self.on, replies) if _is_int(r) and r == self.token]
        if len(committed) >= self._quorum:
            return committed
        refused = [i for i, r in zip(self.on, replies) if floor_refused(r)]
        if len(refused) < self._quorum:
            return None
        instead = max(self._grants[i] for i in refused)
        outliers = [
            Outlier(i, addr(i), self.token, instead, (self.token - instead) // 1024)
            for i in self.on
            if self._grants[i] == self.token
        ]
        return Commit(self._grants, refused, instead, self._quorum), outliers


def _is_int(reply: Any) -> bool:
    return isinstance(reply, int) and not isinstance(reply, bool)


def fenced_reply(replies: List[Any], quorum: int) -> Any:
    """A quorum fence's outcome from the replies of the masters that
    committed the token, in their order (an exception for a call that
    failed): the first reply of a master where the token was current (the
    command's value, or the error the server returned for the command,
    raised) once at least ``quorum`` such replies came; else
    :class:`StaleToken` (refused as stale, or no answer, on too many)."""
    ran = [
        r
        for r in replies
        if not isinstance(r, BaseException)
        or (isinstance(r, exceptions.ResponseError) and not isinstance(check_stale(r), StaleToken))
    ]
    if len(ran) < quorum:
        raise StaleToken("STALE the quorum token is not current on a majority; the command ran on fewer")
    if isinstance(ran[0], BaseException):
        raise ran[0]
    return ran[0]
