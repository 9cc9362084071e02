"""The watchdog's schedule: when each renewal is due, which go out together
in one pipeline, and what each reply does to its lease."""

from __future__ import annotations

import collections
import math
import time
from typing import Any, Deque, Dict, List, Optional, Tuple, Union


from .commands import mrenew_args
from .errors import Loss


def renew_every(ttl_ms: int) -> float:
    """The renewal interval in seconds: a third of the ttl."""
    return max(ttl_ms / 3000, 0.001)


def retry_pause(ttl_ms: int) -> float:
    """The pause before a failed (not refused) renewal is tried again."""
    return min(max(ttl_ms / 20000, 0.005), 0.25)


def renew_window(ttl_ms: int) -> float:
    """A renewal due within this many seconds of a batch goes with it (early,
    which is harmless), so leases fall into step and share round trips."""
    return ttl_ms / 12000


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

    def forget_all(self) -> None:
        """A forked child starts with no lease to renew (its parent's are
        its parent's). Ids go on from where they were: a lease copied from
        the parent, collected in the child, names an id no new lease has."""
        self._leases.clear()
        self.gone.clear()
        self._looks_at = None
        self.renewals = self.round_trips = 0

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
