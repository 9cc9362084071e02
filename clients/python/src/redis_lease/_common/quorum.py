"""Quorum leases (design.md S9): the proposal of step 1 and when it alone
holds the lease (one round trip), the decisions of step 3 (the commit of one
token to a majority, leaving out a master whose clock runs ahead), when each
step is decided (a majority, not the slowest master), and the decision of a
quorum fence. The same decisions as the Rust helper's
(clients/rust/src/protocol/quorum.rs)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

from redis import exceptions

from .errors import LeaseExpiring, StaleToken, check_stale


# --- Quorum leases (design.md S9): the decisions of step 3 and the fence.


class Outlier(NamedTuple):
    """A master left out of a quorum acquisition because its clock runs far
    ahead: in step 3, the others refused its token as too far ahead of their
    clocks (the ``FLOOR`` bound), and the token committed is the highest that
    a majority accepts instead; or, when a majority answered the proposal of
    step 1 exactly (one round trip), its token came back more than 1 s of
    clock above it. Its clock is wrong. Reported through the package's
    logger and the quorum client's ``on_outlier``."""

    #: The master's index in the client's list.
    master: int
    #: Its address (``host:port``, or a Unix socket's path).
    addr: str
    #: The token it granted, which the others refused (or which is far
    #: above the proposal that a majority answered).
    token: int
    #: The token tried next in its place: the highest that the masters
    #: which refused it granted (or the proposal).
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


class _NotIn:
    def __repr__(self) -> str:
        return "NOT_IN"


#: A master's reply that is not in yet (a step's replies in so far).
NOT_IN: Any = _NotIn()


class Failed:
    """A step that no majority can make: release everywhere, try again."""


FAILED = Failed()

#: Tokens count 1024 per ms of wall clock (design.md S2).
PER_MS = 1024
MAX_TOKEN = 2**53 - 1
#: How far above the masters' clocks (as learned) a proposal goes.
HEADROOM_MS = 20
#: The furthest a proposal goes above them to stay above this client's
#: previous one: well inside the FLOOR bound (max(grace, 1000) ms).
MAX_AHEAD_MS = 250


class Proposer:
    """The proposals of step 1 (design.md S9, one round trip in the common
    case), one per client: ``P = (now_ms + offset_ms + 20) * 1024 + r``,
    ``r`` random in 1..255, or the previous proposal + 1 when that is higher
    and at most 250 ms ahead. ``offset_ms`` is learned from step 1's replies:
    the ``q``-th smallest of, for each master that answered a clock token
    ``t`` (ten zero low bits, not ``P``), ``t // 1024 - sent_ms``, and for
    every other master the offset as it was (docs/guarantees.md)."""

    def __init__(self) -> None:
        self.offset_ms = 0
        self._last = 0

    def propose(self, now_ms: int, random_bits: int) -> int:
        def at(ahead_ms: int) -> int:
            return max(now_ms + self.offset_ms + ahead_ms, 1) * PER_MS

        from_clock = at(HEADROOM_MS) + 1 + random_bits % 255
        nxt = self._last + 1
        p = nxt if from_clock < nxt <= at(MAX_AHEAD_MS) else from_clock
        self._last = min(p, MAX_TOKEN)
        return self._last

    def learn(self, sent_ms: int, p: int, replies: List[Any]) -> None:
        if not replies:
            return
        samples = sorted(
            r // PER_MS - sent_ms if _is_int(r) and r != p and r % PER_MS == 0 else self.offset_ms for r in replies
        )
        self.offset_ms = samples[len(replies) // 2]


class Held(NamedTuple):
    """Held with ``token`` on the masters ``on``."""

    token: int
    on: List[int]


#: How step 1 decides: exactly (the helpers), or, only for the tests that
#: show why, on a majority of any tokens of at least P (unsafe), or without
#: step 3 (unsafe: the highest token granted, once every master answered).
EXACT, AT_LEAST, WITHOUT_COMMIT = "exact", "at least", "without commit"


def first_outcome(rule: str, p: int, on: List[int], replies: List[Any], quorum: int) -> Union[None, Held, "Commit", Failed]:
    """Step 1's outcome from the replies in so far (``NOT_IN``: not yet) of
    the masters ``on`` to the proposal ``p``, None while undecided: held as
    soon as a majority answered exactly ``p``; step 3 (a :class:`Commit`) as
    soon as that cannot happen and a majority granted; failed as soon as a
    majority cannot grant."""
    pending = sum(1 for r in replies if r is NOT_IN)
    grants = [(i, r) for i, r in zip(on, replies) if _is_int(r)]
    if rule == WITHOUT_COMMIT:
        if pending:
            return None
        commit = Commit.first(grants, quorum)
        return FAILED if commit is None else Held(commit.token, commit.on)
    votes = [i for i, t in grants if (t == p if rule == EXACT else t >= p)]
    if len(votes) >= quorum:
        return Held(p, votes)
    if len(votes) + pending >= quorum:
        return None
    if len(grants) + pending < quorum:
        return FAILED
    commit = Commit.first(grants, quorum)
    return FAILED if commit is None else commit


def fast_outliers(p: int, on: List[int], replies: List[Any], addr: Callable[[int], str]) -> List[Outlier]:
    """The masters whose step-1 token came back more than 1 s of clock above
    the proposal ``p`` that a majority answered exactly (1 s: the least
    FLOOR bound): the outliers of a holding taken in one round trip."""
    return [
        Outlier(i, addr(i), r, p, (r - p) // PER_MS) for i, r in zip(on, replies) if _is_int(r) and r > p + 1000 * PER_MS
    ]


def linger(took: float) -> float:
    """How long a decided step still waits for the masters not in yet (so
    that those about as fast as the majority count too): as long again as
    it took so far, at least 25 ms, never past the step's own deadline."""
    return max(took, 0.025)


def release_outcome(replies: List[Any], n: int) -> Optional[bool]:
    """A release's outcome from the replies in so far: True a majority
    released, False too many did not (or did not answer), None undecided."""
    quorum = n // 2 + 1
    if sum(1 for r in replies if _is_int(r) and r == 1) >= quorum:
        return True
    if sum(1 for r in replies if r is not NOT_IN and not (_is_int(r) and r == 1)) > n - quorum:
        return False
    return None


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
        """The round's replies (in the order of ``on``), every one in: the
        masters that committed ``token`` (a majority: held), or the next
        round and the outliers it leaves out, or None (no majority: release
        and retry)."""
        decided = self.decide(replies, addr)
        return None if decided is None or isinstance(decided, Failed) else decided

    def decide(self, replies: List[Any], addr: Callable[[int], str]) -> Union[List[int], Tuple["Commit", List[Outlier]], Failed, None]:
        """The round's outcome from the replies in so far (``NOT_IN``: not
        yet), None while undecided: held as soon as a majority answered the
        token exactly, another round as soon as a majority refused it as too
        far ahead, :data:`FAILED` as soon as neither can happen."""
        committed = [i for i, r in zip(self.on, replies) if _is_int(r) and r == self.token]
        pending = sum(1 for r in replies if r is NOT_IN)
        if len(committed) >= self._quorum:
            return committed
        refused = [i for i, r in zip(self.on, replies) if floor_refused(r)]
        if len(refused) < self._quorum:
            return None if max(len(committed), len(refused)) + pending >= self._quorum else FAILED
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
    raised) once at least ``quorum`` such replies came; else, when the token
    was current on a majority but ``MINTTL`` refused it on some, the first
    of those as :class:`LeaseExpiring`; else :class:`StaleToken` (refused
    as stale, or no answer, on too many)."""
    seen = [check_stale(r) if isinstance(r, exceptions.ResponseError) else r for r in replies]
    expiring = [r for r in seen if isinstance(r, LeaseExpiring)]
    ran = [
        r
        for r in seen
        if not isinstance(r, BaseException)
        or (isinstance(r, exceptions.ResponseError) and not isinstance(r, (StaleToken, LeaseExpiring)))
    ]
    if len(ran) < quorum:
        if expiring and len(ran) + len(expiring) >= quorum:
            raise expiring[0]
        raise StaleToken("STALE the quorum token is not current on a majority; the command ran on fewer")
    if isinstance(ran[0], BaseException):
        raise ran[0]
    return ran[0]
