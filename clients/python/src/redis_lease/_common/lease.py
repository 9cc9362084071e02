"""The lease both the sync and the asyncio helpers hold: its state, loss
signal and deadline, without I/O."""

from __future__ import annotations

import weakref
import time
from typing import Any, List, Optional, Tuple


from .commands import fence_args, mrelease_args, mrenew_args
from .errors import Loss, lost_during
from .release import ReleasePlan, release_attempts, release_plan
from .schedule import renew_every


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

    def fence_args(self, *command: Any, min_ttl_ms: Optional[int] = None) -> Tuple[Any, ...]:
        """The fenced form of ``command`` (``LEASE.FENCE key token [MINTTL
        ms] command...``), for ``execute_command`` on a client or pipeline of
        your own."""
        return fence_args(self.key, self.token, command, min_ttl_ms)

    def _renew_args(self) -> Tuple[Any, ...]:
        return ("LEASE.RENEW", self.key, self._owner, self.ttl_ms)

    def _release_args(self) -> Tuple[Any, ...]:
        return ("LEASE.RELEASE", self.key, self._owner)

    def _leftover_args(self) -> List[Tuple[Any, ...]]:
        """After a multi-key lease was found not all ours: one
        ``LEASE.RELEASE`` per key (none for a single lease)."""
        return []

    def _renewal(self) -> Optional[Tuple[Tuple[Any, ...], float, float]]:
        """A renewal now: its command, when it is sent, and its read timeout
        (until the deadline, at most the io timeout). None once the loss
        signal is set: no renewal can succeed then, so none is sent (it
        would only keep the key from others)."""
        if self.lost.is_set():
            return None
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

    def fence_args(self, key: Any, *command: Any, min_ttl_ms: Optional[int] = None) -> Tuple[Any, ...]:  # type: ignore[override]  # its key comes first: not a drop-in for a Lease's
        """The fenced form of ``command`` on ``key``, one of the lease's keys
        (``LEASE.FENCE key token [MINTTL ms] command...``); ``ValueError``
        for a key that is not one of them."""
        if key not in self.keys:
            raise ValueError(f"{key!r} is not one of the lease's keys; nothing was sent")
        return fence_args(key, self.token, command, min_ttl_ms)

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
