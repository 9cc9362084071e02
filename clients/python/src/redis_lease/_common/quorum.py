"""Quorum leases (design.md S9): the decisions of step 3 (the commit of one
token to a majority, leaving out a master whose clock runs ahead) and of a
quorum fence."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

from redis import exceptions

from .errors import LeaseExpiring, StaleToken, check_stale


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
