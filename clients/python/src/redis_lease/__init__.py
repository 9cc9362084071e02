"""Client helpers for the redis-lease module, for redis-py (sync and asyncio).

- :class:`LeaseClient` (sync) and :class:`redis_lease.aio.AsyncLeaseClient`
  take leases with a fresh random owner id, retry a lost acquire reply with
  the same owner (so no grant is orphaned), and give every lease a watchdog
  that renews it at a third of its ttl.
- ``with client.lease(key, ttl_ms, block_ms=...) as lease:`` acquires and
  releases on exit; ``lease.token``, ``lease.fence(*command)``,
  ``lease.renew()``, and ``lease.lost``, an Event-like signal set the moment
  the lease is lost: when a renewal answers 0, or when its client-side
  deadline (ttl after the last successful acquire or renewal was *sent*)
  passes.
- ``client.acquire_many(keys, ttl_ms)`` / ``with client.lease_many(keys,
  ttl_ms) as lease:`` take several keys at once, all or none, under one
  fencing token (design.md S10): a :class:`MultiLease`, renewed with one
  ``LEASE.MRENEW``; ``lease.fence(key, *command)`` on any of its keys.
- :class:`QuorumClient` (and ``redis_lease.quorum.AsyncQuorumClient``):
  one lease on a majority of independent masters with one fencing token
  (design.md S9).
- ``client.guard(key)`` (design.md S12): the lease key ``key`` guards its
  hash tag, whose other keys are then written only through a lease on
  ``key`` (``lease.fence(...)``); any other write is refused with
  :class:`Fenced`. ``client.unguard(key)`` ends it.
- Every acquire sends a label (``LABEL``, design.md S11): by default
  ``<host> pid <pid> <program>``; ``label=`` on a client, a call or a lock
  sets another, ``label=None`` sends none. ``client.waiters(key)`` lists
  the clients waiting for a key (:class:`Waiter` records).

What the helpers do for you (owner ids, lost-reply retries, bounded waits,
the watchdog and its client-side deadline, release on every way out, ...)
is listed once, the same in every language, in the project's
docs/helpers.md, "What the helpers do for you".
"""

from ._common import (
    DEFAULT_LABEL,
    FOREVER,
    AlreadyHeld,
    Fenced,
    LeaseBusy,
    LeaseError,
    LeaseExpiring,
    LeaseGrace,
    LeaseLost,
    Loss,
    SharedWrite,
    StaleToken,
    Waiter,
    default_label,
    new_owner,
)
from ._sync import Lease, LeaseClient, LossSignal, MultiLease
from .lock import Lock
from .quorum import Outlier, QuorumClient, QuorumLease
from .switch import use_lease_locks

__all__ = [
    "DEFAULT_LABEL",
    "FOREVER",
    "AlreadyHeld",
    "Fenced",
    "Lease",
    "LeaseBusy",
    "LeaseClient",
    "LeaseError",
    "LeaseExpiring",
    "LeaseGrace",
    "LeaseLost",
    "Lock",
    "Loss",
    "LossSignal",
    "MultiLease",
    "Outlier",
    "QuorumClient",
    "QuorumLease",
    "SharedWrite",
    "StaleToken",
    "Waiter",
    "default_label",
    "new_owner",
    "use_lease_locks",
]
