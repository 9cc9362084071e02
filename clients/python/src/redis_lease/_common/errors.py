"""The errors the helpers raise, the loss reasons, and what a reply means
(a lost reply, a grace refusal, a stale token)."""

from __future__ import annotations

import enum
import re
import socket
from typing import Any, Optional, Tuple

import redis
from redis import exceptions


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


class LeaseExpiring(LeaseError, exceptions.ResponseError):
    """``LEASE.FENCE ... MINTTL ms`` answered ``EXPIRING``: the token is
    current, but the lease (for a counting or shared lease, this holder's
    holding) had ``left_ms`` left, less than the ``min_ttl_ms`` asked for, so
    the fenced command was not run. The lease is still held: renew it and try
    again, or stop. Not a :class:`StaleToken`: the lease was not lost."""

    def __init__(self, message: str, left_ms: int, min_ttl_ms: int) -> None:
        super().__init__(message)
        self.left_ms = left_ms
        self.min_ttl_ms = min_ttl_ms


_EXPIRING = re.compile(r"^EXPIRING lease has (\d+) ms left, less than MINTTL (\d+)")


class SharedWrite(LeaseError, exceptions.ResponseError):
    """A ``shared=True`` holder's token fenced a write command: refused by the
    server, nothing run. Readers fence reads only; take the lease exclusively
    to write."""


class Fenced(LeaseError, exceptions.ResponseError):
    """A write to a guarded key was refused: ``FENCED write to '<key>'
    refused: its hash tag is guarded by '<guard>' ...`` (design.md S12).
    ``guard``, a lease key, guards the hash tag of ``key``
    (:meth:`redis_lease.LeaseClient.guard`): every other key of its
    database with that tag can be written only through ``LEASE.FENCE guard
    token ...`` with the token of the lease held on ``guard`` now, which is
    what ``lease.fence(...)`` of a lease on ``guard`` sends. Nothing ran,
    nothing changed. Reads are never refused.

    The helpers raise it for their own calls (a fence through a lease on
    another key of the tag, say); :meth:`Fenced.of` reads it out of the
    ``ResponseError`` of a call of your own (a plain write, a pipeline, a
    ``MULTI``). ``key`` and ``guard`` are the names as the server prints
    them: printable ASCII (any other byte as ``?``), cut at 64 bytes with
    ``...``."""

    def __init__(self, message: str, key: str, guard: str) -> None:
        super().__init__(message)
        #: A key the refused command writes, whose hash tag is guarded.
        self.key = key
        #: The key that guards its hash tag: write through a lease on it.
        self.guard = guard

    @classmethod
    def of(cls, e: BaseException) -> Optional["Fenced"]:
        """``e`` as a :class:`Fenced` when it is (or carries, as the error of
        a pipeline's command does) a ``FENCED`` refusal; None otherwise::

            try:
                r.hset("{acct:7}", "balance", 10)
            except redis.ResponseError as e:
                fenced = Fenced.of(e)  # .key "{acct:7}", .guard "{acct:7}:lock"
        """
        if isinstance(e, Fenced):
            return e
        if not isinstance(e, exceptions.ResponseError):
            return None
        m = _FENCED.search(str(e))
        if m is None:
            return None
        return cls(str(e), m.group(1), m.group(2))


# The refusal names the guard twice: the second time settles where the key
# ends, should a key hold the words that follow it.
_FENCED = re.compile(
    r"FENCED write to '(.*)' refused: its hash tag is guarded by '(.*)'; write it through LEASE\.FENCE \2 <token>",
    re.S,
)


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


def lost_reply(e: BaseException) -> bool:
    """May the command have run without us hearing the answer? (I/O error,
    closed connection, timeout.)"""
    return isinstance(
        e, (exceptions.ConnectionError, exceptions.TimeoutError, socket.timeout, OSError)
    )


def check_stale(e: exceptions.ResponseError) -> BaseException:
    """``STALE ...`` as :class:`StaleToken`, ``EXPIRING ...`` as
    :class:`LeaseExpiring`, a reader's fenced write as :class:`SharedWrite`,
    a write to a guarded key (``FENCED ...``) as :class:`Fenced`, anything
    else unchanged."""
    if str(e).startswith("STALE"):
        return StaleToken(str(e))
    expiring = _EXPIRING.match(str(e))
    if expiring:
        return LeaseExpiring(str(e), int(expiring.group(1)), int(expiring.group(2)))
    if "a SHARED holder's token cannot fence a write command" in str(e):
        return SharedWrite(str(e))
    if str(e).startswith("FENCED"):
        return Fenced.of(e) or e
    return e
