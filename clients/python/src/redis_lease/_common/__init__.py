"""What the sync and the asyncio helpers share, without I/O, one file a job:
`errors`, `commands`, `connection`, `acquire`, `release`, `schedule`,
`lease` (the lease both hold), `label` (labels and waiters), `quorum`
and `fork` (what a forked child resets). The I/O layers import it as one module."""

from .errors import AlreadyHeld, FOREVER, Fenced, LeaseBusy, LeaseError, LeaseExpiring, LeaseGrace, LeaseLost, Loss, SharedWrite, StaleToken, check_stale, grace_of, lost_during, lost_reply, still_held
from .commands import _key_bytes, acquire_args, check_ttl, fence_args, checked_keys, guard_args, guarded, unguard_args, unguarded, macquire_args, many_keys, mode_args, mrelease_args, mrenew_args, new_owner, one_slot, with_block
from .connection import POOL_IDLE, connection_kwargs
from .release import ReleasePlan, SHORT_S, release_attempts, release_failed, release_plan
from .acquire import Attempts, deadline_after, needs_fresh_renewal
from .schedule import Batch, Schedule, renew_every, renew_window, retry_pause
from .lease import LeaseCore, MultiLeaseCore
from .label import DEFAULT_LABEL, MAX_LABEL, Label, Waiter, default_label, label_args, label_bytes, parse_waiters, truncate, waiters_args
from .quorum import Commit, Outlier, _is_int, fenced_reply, floor_refused
from .fork import fresh_after_fork

__all__ = [
    "AlreadyHeld",
    "FOREVER",
    "Fenced",
    "LeaseBusy",
    "LeaseError",
    "LeaseExpiring",
    "LeaseGrace",
    "LeaseLost",
    "Loss",
    "SharedWrite",
    "StaleToken",
    "check_stale",
    "grace_of",
    "lost_during",
    "lost_reply",
    "still_held",
    "_key_bytes",
    "acquire_args",
    "check_ttl",
    "fence_args",
    "checked_keys",
    "guard_args",
    "guarded",
    "unguard_args",
    "unguarded",
    "macquire_args",
    "many_keys",
    "mode_args",
    "mrelease_args",
    "mrenew_args",
    "new_owner",
    "one_slot",
    "with_block",
    "POOL_IDLE",
    "connection_kwargs",
    "ReleasePlan",
    "SHORT_S",
    "release_attempts",
    "release_failed",
    "release_plan",
    "Attempts",
    "deadline_after",
    "needs_fresh_renewal",
    "Batch",
    "Schedule",
    "renew_every",
    "renew_window",
    "retry_pause",
    "LeaseCore",
    "DEFAULT_LABEL",
    "MAX_LABEL",
    "Label",
    "Waiter",
    "default_label",
    "label_args",
    "label_bytes",
    "parse_waiters",
    "truncate",
    "waiters_args",
    "MultiLeaseCore",
    "Commit",
    "Outlier",
    "_is_int",
    "fenced_reply",
    "floor_refused",
    "fresh_after_fork",
]
