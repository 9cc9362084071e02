"""The protocol core the sync and asyncio helpers share (``_common.py``),
without a server: the watchdog's schedule and the retry plans."""

from __future__ import annotations

import time
from typing import Optional

import pytest
from redis import exceptions

from redis_lease import LeaseExpiring, Loss, Outlier, StaleToken
from redis_lease._common import (
    AT_LEAST,
    EXACT,
    FAILED,
    NOT_IN,
    WITHOUT_COMMIT,
    Attempts,
    Batch,
    Commit,
    Held,
    Proposer,
    ReleasePlan,
    Schedule,
    check_stale,
    fence_args,
    fenced_reply,
    first_outcome,
    release_attempts,
    release_failed,
    release_outcome,
)


class Probe:
    """A loss signal as the schedule sees one."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.reason: Optional[Loss] = None

    def is_set(self) -> bool:
        return self.reason is not None

    def _extend(self, sent: float, ttl_ms: int) -> bool:
        self.deadline = sent + ttl_ms / 1000
        return self.reason is None

    def _lose(self, reason: Loss) -> None:
        self.reason = reason


def test_renewals_due_together_share_one_batch():
    t0 = time.monotonic()
    s = Schedule()
    probes = [Probe(t0 + 1.2) for _ in range(3)]
    for i, at in enumerate([0.4, 0.45, 0.7]):
        s.add(f"k{i}", "o", 1200, t0 + at, probes[i])
    assert s.next(t0, 5.0) == pytest.approx(t0 + 0.4)
    # The watchdog sleeps until +0.4 s: a lease due later wakes nothing, one
    # due sooner does.
    late, wake = s.add("late", "o", 1200, t0 + 0.9, Probe(t0 + 1.2))
    assert not wake
    s.remove(late)
    soon, wake = s.add("soon", "o", 1200, t0 + 0.3, Probe(t0 + 1.2))
    assert wake
    s.remove(soon)
    batch = s.next(t0 + 0.4, 5.0)
    assert isinstance(batch, Batch) and batch.keys == ["k0", "k1"], "the one due 50 ms later goes along"
    assert 0.7 < batch.timeout <= 0.8 + 1e-9
    s.settle(batch, [1, 1])
    assert s.stats() == {"leases": 3, "renewals": 2, "round_trips": 1}
    batch = s.next(t0 + 0.71, 5.0)
    assert isinstance(batch, Batch)
    assert sorted(batch.keys) == ["k0", "k1", "k2"], "in step from here on"
    # A 0 is the loss and ends the watch; an error or no reply comes back soon.
    replies = [0, exceptions.ResponseError("WRONGTYPE")]
    s.settle(batch, replies, pipelines=2)
    assert sum(p.reason == Loss.REFUSED for p in probes) == 1
    assert len(s) == 2 and s.round_trips == 3
    again = s.next(time.monotonic() + 0.3, 5.0)
    assert isinstance(again, Batch) and len(again.ids) == 2


def test_lost_released_and_collected_leases_leave_the_schedule():
    now = time.monotonic()
    s = Schedule()
    a, wake = s.add("a", "o", 300, now, Probe(now + 0.3))
    assert wake, "a watchdog that is not running is started"
    lost = Probe(now + 0.3)
    s.add("b", "o", 300, now, lost)
    gone, _ = s.add("c", "o", 300, now, Probe(now + 0.3))
    lost._lose(Loss.REFUSED)
    s.gone.append(gone)  # what a collected lease's finalizer does
    batch = s.next(now, 5.0)
    assert isinstance(batch, Batch)
    assert batch.keys == ["a"]
    s.remove(a)
    s.settle(batch, [1])
    assert s.next(now, 5.0) is None


def test_the_retry_plans():
    assert release_attempts(ReleasePlan.NONE, 5.0, 3) == []
    assert release_attempts(ReleasePlan.SHORT, 5.0, 3) == [(0.25, 0.25)]
    assert len(release_attempts(ReleasePlan.FULL, 5.0, 3)) == 4
    lost = exceptions.TimeoutError("no reply")
    assert release_failed(lost, 0, 4, ReleasePlan.FULL) is None
    with pytest.raises(exceptions.TimeoutError):
        release_failed(lost, 3, 4, ReleasePlan.FULL)
    assert release_failed(lost, 0, 1, ReleasePlan.SHORT) is False
    with pytest.raises(exceptions.ResponseError):
        release_failed(exceptions.ResponseError("ERR"), 0, 4, ReleasePlan.FULL)
    plan = Attempts(2)
    assert plan.after(lost) == (0.02, False)
    assert plan.after(lost) == (0.04, False)
    assert plan.after(lost) is None
    assert Attempts(0).after(exceptions.MovedError("1 127.0.0.1:7000")) == (0.0, True)
    assert Attempts(3).after(exceptions.ResponseError("ERR")) is None


FAR = exceptions.ResponseError(
    "FLOOR token is more than the grace length (1000 ms, at least 1000) ahead of this server's clock (at most 5 now)"
)


def test_a_token_refused_as_too_far_ahead_is_left_out_and_the_next_committed():
    ms = 1024
    commit = Commit.first([(0, 900_000 * ms), (1, 100 * ms), (3, 300 * ms), (4, 200 * ms)], 3)
    assert commit is not None and (commit.token, commit.on) == (900_000 * ms, [0, 1, 3, 4])
    settled = commit.settle([900_000 * ms, FAR, FAR, FAR], lambda i: f"m{i}")
    assert isinstance(settled, tuple)
    nxt, outliers = settled
    assert outliers == [Outlier(0, "m0", 900_000 * ms, 300 * ms, 899_700)]
    assert (nxt.token, nxt.on) == (300 * ms, [1, 3, 4])
    assert nxt.settle([300 * ms] * 3, str) == [1, 3, 4], "a majority without master 0: held"
    # A minority refusing does not matter; too few refusing: no lease; other
    # errors are no refusal of the token.
    two_of_three = lambda: Commit.first([(0, 9), (1, 5), (2, 7)], 2)  # noqa: E731
    assert two_of_three().settle([9, 9, FAR], str) == [0, 1]
    assert two_of_three().settle([9, FAR, TimeoutError()], str) is None
    other = exceptions.ResponseError("FLOOR is for exclusive leases: it cannot be given with LIMIT or SHARED")
    assert two_of_three().settle([9, other, other], str) is None
    assert Commit.first([(0, 9)], 2) is None, "no majority granted"


def test_step_1_holds_on_an_exact_majority_of_the_proposal_as_soon_as_it_is_in():
    on = [0, 1, 2, 3, 4]
    timeout = exceptions.TimeoutError()
    # Three exact answers decide it; the two others are not waited for.
    assert first_outcome(EXACT, 500, on, [500, NOT_IN, 500, NOT_IN, 500], 3) == Held(500, [0, 2, 4])
    assert first_outcome(EXACT, 500, on, [500, NOT_IN, 500, NOT_IN, 900], 3) is None
    # Exactness cannot come any more: step 3 with the grants in so far.
    commit = first_outcome(EXACT, 500, on, [500, 700, 900, 800, NOT_IN], 3)
    assert isinstance(commit, Commit) and (commit.token, commit.on) == (900, [0, 1, 2, 3])
    assert first_outcome(EXACT, 500, on, [None, timeout, NOT_IN, None, 500], 3) is FAILED
    # A majority of different tokens: step 3 (the unsafe rule of the Rust
    # history test's control would hold with the proposal).
    different = [600, 700, 800, None, None]
    assert isinstance(first_outcome(EXACT, 500, on, different, 3), Commit)
    assert first_outcome(AT_LEAST, 500, on, different, 3) == Held(500, [0, 1, 2])
    assert first_outcome(WITHOUT_COMMIT, 500, on, [500, 500, 500, NOT_IN, 9000], 3) is None
    assert first_outcome(WITHOUT_COMMIT, 500, on, [500, 500, 500, timeout, 9000], 3) == Held(9000, [0, 1, 2, 4])


def test_a_commit_round_and_a_release_are_decided_by_a_majority():
    commit = Commit.first([(0, 9), (1, 5), (2, 7), (3, 8), (4, 6)], 3)
    assert commit is not None
    assert commit.decide([9, NOT_IN, 9, 9, NOT_IN], str) == [0, 2, 3]
    assert commit.decide([9, NOT_IN, 9, NOT_IN, NOT_IN], str) is None
    timeout = exceptions.TimeoutError()
    assert commit.decide([9, timeout, timeout, timeout, NOT_IN], str) is FAILED
    again = commit.decide([9, FAR, FAR, FAR, NOT_IN], str)
    assert isinstance(again, tuple) and (again[0].token, again[0].on) == (8, [1, 2, 3])
    assert release_outcome([1, NOT_IN, 1, 1, NOT_IN], 5) is True
    assert release_outcome([1, NOT_IN, 0, timeout, 0], 5) is False
    assert release_outcome([1, NOT_IN, 0, 1, NOT_IN], 5) is None


def test_proposals_follow_the_majoritys_clocks_and_stay_above_the_previous_one():
    ms = 1024
    p = Proposer()
    now = 1_000_000
    a = p.propose(now, 7)
    assert a == (now + 20) * ms + 8, "20 ms ahead, low bits 1 to 255"
    b = p.propose(now, 0)
    assert b == a + 1, "within the same ms: above the previous proposal"
    p.learn(now, b, [b, (now + 5000) * ms, (now + 5001) * ms, (now + 5002) * ms, b])
    assert p.offset_ms == 5000
    assert p.propose(now + 1, 0) > (now + 5002) * ms
    # One master 400 days ahead (an outlier) does not move it.
    p = Proposer()
    c = p.propose(now, 0)
    p.learn(now, c, [(now + 400 * 86_400_000) * ms, c, c, c, NOT_IN])
    assert p.offset_ms == 0
    # A majority behind (step 1 without FLOOR after refusing the proposal).
    p.learn(now, c, [(now - 3000) * ms] * 3 + [c, NOT_IN])
    assert p.offset_ms == -3000


def test_an_expiring_reply_is_lease_expiring_with_the_time_left_and_the_minimum():
    e = check_stale(exceptions.ResponseError("EXPIRING lease has 120 ms left, less than MINTTL 500"))
    assert isinstance(e, LeaseExpiring) and isinstance(e, exceptions.ResponseError)
    assert (e.left_ms, e.min_ttl_ms) == (120, 500)
    assert not isinstance(e, StaleToken)
    assert fence_args("k", 7, ("SET", "x", 1)) == ("LEASE.FENCE", "k", 7, "SET", "x", 1)
    assert fence_args("k", 7, (), 500) == ("LEASE.FENCE", "k", 7, "MINTTL", 500)
    assert fence_args("k", 7, ("GET", "x"), 0) == ("LEASE.FENCE", "k", 7, "MINTTL", 0, "GET", "x")


def test_a_quorum_fence_is_lease_expiring_when_minttl_refused_it_where_the_token_was_current():
    expiring = exceptions.ResponseError("EXPIRING lease has 120 ms left, less than MINTTL 500")
    stale = exceptions.ResponseError("STALE fencing token is not the token of the lease held on this key")
    with pytest.raises(LeaseExpiring) as refused:
        fenced_reply([expiring, expiring, stale], 2)
    assert refused.value.left_ms == 120
    assert fenced_reply([1, expiring, 2], 2) == 1
    with pytest.raises(LeaseExpiring):
        fenced_reply([1, expiring, stale], 2)
    with pytest.raises(StaleToken):
        fenced_reply([expiring, stale, stale], 2)


def test_a_quorum_fence_raises_the_commands_error_and_stale_only_when_stale():
    failed = exceptions.ResponseError("value is not an integer or out of range")
    stale = exceptions.ResponseError("STALE fencing token is not the token of the lease held on this key")
    lost = exceptions.TimeoutError("Timeout reading from socket")
    assert fenced_reply([1, 2, lost], 2) == 1
    with pytest.raises(exceptions.ResponseError, match="not an integer"):
        fenced_reply([failed, failed, failed], 2)
    with pytest.raises(exceptions.ResponseError, match="not an integer"):
        fenced_reply([lost, failed, 3], 2)
    with pytest.raises(StaleToken):
        fenced_reply([stale, StaleToken("STALE x"), 3], 2)
    with pytest.raises(StaleToken):
        fenced_reply([failed, lost, lost], 2)


def test_labels_are_cut_to_256_bytes_on_a_character_boundary() -> None:
    from redis_lease._common import DEFAULT_LABEL, acquire_args, default_label, label_args, label_bytes, macquire_args, truncate

    assert truncate(b"x" * 300) == b"x" * 256
    for pad in range(4):
        cut = truncate(b"x" * pad + "€".encode() * 100)
        assert len(cut) <= 256 and len(cut) > 252
        cut.decode()  # never a broken character
    assert label_bytes("é" * 200) == ("é" * 128).encode()
    assert label_bytes(None) is None and label_bytes(False) is None and label_bytes("") is None
    assert label_bytes(DEFAULT_LABEL) == default_label()
    assert label_bytes(DEFAULT_LABEL, b"client's") == b"client's"
    with pytest.raises(TypeError):
        label_bytes(True)
    assert label_args(None) == ()
    # The label goes before BLOCK (and on every attempt, the same).
    args, _ = acquire_args("k", "o", 1000, 500, time.monotonic() + 0.5, 5.0, 2.0, ("SHARED",), ("LABEL", b"l"))
    assert args[:8] == ("LEASE.ACQUIRE", "k", "o", 1000, "SHARED", "LABEL", b"l", "BLOCK")
    args, _ = macquire_args(("a", "b"), "o", 1000, None, None, 5.0, 2.0, ("LABEL", b"l"))
    assert args == ("LEASE.MACQUIRE", 2, "a", "b", "o", 1000, "LABEL", b"l")


def test_the_waiters_reply_in_resp2_and_resp3() -> None:
    from redis_lease import Waiter
    from redis_lease._common import parse_waiters, waiters_args

    flat = [b"client", 7, b"label", b"w \xff", b"mode", b"keys", b"limit", 0, b"keys", 2, b"waited", 15, b"timeout", -1]
    resp3 = {"client": 8, "label": None, "mode": "limit", "limit": 3, "keys": 1, "waited": 0, "timeout": 250}
    assert parse_waiters([flat, resp3]) == [
        Waiter(client=7, label="w \\xff", mode="keys", limit=0, keys=2, waited_ms=15, timeout_ms=None),
        Waiter(client=8, label=None, mode="limit", limit=3, keys=1, waited_ms=0, timeout_ms=250),
    ]
    assert parse_waiters([]) == [] and parse_waiters(None) == []
    assert waiters_args("k", None) == ("LEASE.WAITERS", "k")
    assert waiters_args("k", 1000) == ("LEASE.WAITERS", "k", "COUNT", 1000)
    for bad in (0, 1001, True, 2.5):
        with pytest.raises(ValueError):
            waiters_args("k", bad)  # type: ignore[arg-type]


def test_a_forked_child_computes_its_own_default_label() -> None:
    import os

    from redis_lease import default_label

    parent = default_label()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its label and leave at once
        os.write(w, default_label())
        os._exit(0)
    os.close(w)
    child = os.read(r, 512)
    os.close(r)
    os.waitpid(pid, 0)
    assert f" pid {pid} ".encode() in child and child != parent
