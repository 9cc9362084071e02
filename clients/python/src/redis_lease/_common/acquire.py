"""The acquire plan: retries of a lost reply, and a new lease's deadline."""

from __future__ import annotations

import time
from typing import Any, Optional, Tuple

from redis import exceptions

from .errors import lost_reply
from .schedule import renew_every


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
