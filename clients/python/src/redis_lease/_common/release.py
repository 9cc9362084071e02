"""The release plan: how a release is sent given what the holder knows of
its lease, and what a failed attempt leads to."""

from __future__ import annotations

import enum
from typing import List, Optional, Tuple


from .errors import Loss, lost_reply


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
