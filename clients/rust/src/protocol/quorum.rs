//! Quorum leases (design.md S9): the commands of an acquisition's steps
//! (with its label), the proposal of step 1 and when it alone holds the
//! lease (one round trip), the decisions of step 3 (the commit of one token
//! to a majority, leaving out a master whose clock runs ahead), when each
//! step is decided (a majority, not the slowest master), and the decision
//! of a quorum fence.

use std::time::Duration;

use super::*;
use crate::Error;

// --- Quorum leases (design.md S9): the decisions of step 3 and the fence.

/// The `LEASE.ACQUIRE` of every step of one quorum acquisition: step 1
/// ([`first`](Self::first)) and each round of step 3
/// ([`commit`](Self::commit), `FLOOR T`), on every master and on every try
/// of one call, all with the same owner and the same `LABEL` (none when
/// `label` is `None`): a commit round that finds the key free again (its
/// step-1 holding expired meanwhile) takes it labelled too.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steps<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) label: Option<&'a str>,
}

impl Steps<'_> {
    /// Step 1: `LEASE.ACQUIRE key owner ttl-ms FLOOR P [LABEL text]` with
    /// the proposal `P` ([`Proposer`]); `None`: without `FLOOR`, for a
    /// master that refused `P` as too far ahead of its clock
    /// ([`floor_refused`]), sent to it at once in the same step.
    pub(crate) fn first(&self, proposal: Option<u64>) -> redis::Cmd {
        self.step(proposal)
    }

    /// A round of step 3: `LEASE.ACQUIRE key owner ttl-ms FLOOR token
    /// [LABEL text]`.
    pub(crate) fn commit(&self, token: u64) -> redis::Cmd {
        self.step(Some(token))
    }

    fn step(&self, floor: Option<u64>) -> redis::Cmd {
        let mut cmd = redis::cmd("LEASE.ACQUIRE");
        cmd.arg(self.key).arg(self.owner).arg(millis(self.ttl));
        if let Some(t) = floor {
            cmd.arg("FLOOR").arg(t);
        }
        label_arg(&mut cmd, self.label);
        cmd
    }
}

/// A master left out of a quorum acquisition because its clock runs far
/// ahead: in step 3, the others refused its token as too far ahead of their
/// clocks (the `FLOOR` bound), and the token committed is the highest that
/// a majority accepts instead; or, when a majority answered the proposal
/// of step 1 exactly (one round trip), its token came back more than 1 s
/// of clock above it. Its clock is wrong. Reported through
/// `QuorumClient::on_outlier`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlier {
    /// The master's index in the client's list.
    pub master: usize,
    /// Its address (`host:port`, or a Unix socket's path).
    pub addr: String,
    /// The token it granted, which the others refused (or which is far
    /// above the proposal that a majority answered).
    pub token: u64,
    /// The token tried next in its place: the highest that the masters
    /// which refused it granted (or the proposal).
    pub instead: u64,
    /// How far ahead its token is of that one, in wall clock (a token
    /// counts 1024 per ms): about how far its clock runs ahead.
    pub ahead: Duration,
}

/// Is `e` a master's refusal of a `FLOOR` token as too far ahead of its
/// clock? Read from the error alone (it names `FLOOR` and says how far
/// ahead), never from the bound's value, which is the server's to choose.
pub(crate) fn floor_refused(e: &redis::RedisError) -> bool {
    let text = e.detail().unwrap_or_default();
    e.code() == Some("ERR") && text.contains("FLOOR") && text.contains("ahead")
}

/// Tokens count 1024 per ms of wall clock (design.md S2).
const PER_MS: u64 = 1024;
/// The highest token (2^53 - 1).
const MAX_TOKEN: u64 = (1 << 53) - 1;
/// How far above the masters' clocks (as learned) a proposal goes: enough
/// for a reply's transit and a ms tick, little enough that the masters'
/// tokens stay near their clocks.
pub(crate) const PROPOSAL_HEADROOM_MS: i64 = 20;
/// The furthest a proposal goes above the masters' clocks (as learned) to
/// stay above this client's previous one: well inside the `FLOOR` bound
/// (`max(grace, 1000)` ms ahead of each master's clock).
pub(crate) const PROPOSAL_MAX_AHEAD_MS: i64 = 250;

/// The proposals of step 1 (design.md S9, one round trip in the common
/// case), one per client, shared by its clones.
///
/// `P = (now_ms + offset_ms + 20) * 1024 + r`, `r` random in 1 ..= 255
/// (apart from the clock tokens a master issues, which end in 10 zero
/// bits), or this client's previous proposal + 1 when that is higher and
/// at most 250 ms ahead: a new proposal is above this client's earlier ones
/// also within one ms. `offset_ms` is learned from step 1's replies: how
/// far above this client's clock a majority of the masters' clock tokens
/// came back (the `q`-th smallest of: each master that answered a clock
/// token `t` (not `P`), `t / 1024 - sent_ms`; every other master, the
/// offset as it was). It starts at 0: with clocks that agree it stays near
/// 0, `P` is a few ms ahead of every clock, and a majority answers exactly
/// `P`. A minority whose clocks run ahead (an outlier) does not move it; a
/// majority whose clocks run ahead of this client's costs one acquire's
/// second step, then `P` follows them. A master that refuses `P` as too far
/// ahead of its clock gets step 1 without `FLOOR` at once (its clock token
/// is then learned like any other).
#[derive(Debug, Default)]
pub(crate) struct Proposer {
    offset_ms: i64,
    last: u64,
}

impl Proposer {
    /// The next proposal, at `now_ms` of this client's wall clock, with
    /// `random` for its low bits.
    pub(crate) fn propose(&mut self, now_ms: i64, random: u64) -> u64 {
        let at = |ahead_ms: i64| (now_ms + self.offset_ms + ahead_ms).max(1) as u64 * PER_MS;
        let from_clock = at(PROPOSAL_HEADROOM_MS) + 1 + random % 255;
        let next = self.last + 1;
        let p = match next > from_clock && next <= at(PROPOSAL_MAX_AHEAD_MS) {
            true => next,
            false => from_clock,
        };
        self.last = p.min(MAX_TOKEN);
        self.last
    }

    /// What step 1 (sent at `sent_ms` with proposal `p`) teaches: the
    /// masters' replies in so far (`None`: none yet).
    pub(crate) fn learn(&mut self, sent_ms: i64, p: u64, replies: &[Option<StepReply>]) {
        if replies.is_empty() {
            return;
        }
        let mut samples: Vec<i64> = replies
            .iter()
            .map(|r| match r {
                Some(Ok(Some(t))) if *t != p && t % PER_MS == 0 => (t / PER_MS) as i64 - sent_ms,
                _ => self.offset_ms,
            })
            .collect();
        samples.sort_unstable();
        self.offset_ms = samples[majority(replies.len()) - 1];
    }

    /// The offset learned, ms (for the tests of the learning).
    #[cfg(test)]
    pub(crate) fn offset_ms(&self) -> i64 {
        self.offset_ms
    }
}

/// A master's reply to a `LEASE.ACQUIRE` step: its token, or null (held by
/// another owner), or the error (a timeout, a refusal).
pub(crate) type StepReply = redis::RedisResult<Option<u64>>;

fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// How step 1 decides (the two others only for the tests that show why the
/// one round trip needs an exact majority, and why step 3 exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Held with `P` when a majority answered exactly `P`; else step 3.
    Exact,
    /// Unsafe: held with `P` when a majority granted any token of at least
    /// `P` (a majority of different tokens, in one round trip).
    AtLeast,
    /// Unsafe: no step 3; held with the highest token granted, on every
    /// master that granted, once every master answered.
    WithoutCommit,
}

/// What step 1 decided.
#[derive(Debug)]
pub(crate) enum First {
    /// Held with `token` (the proposal) on the masters `on`, in one round
    /// trip.
    Held { token: u64, on: Vec<usize> },
    /// Step 3 decides, from the grants in so far.
    Commit(Commit),
    /// No majority granted: release everywhere and try again later.
    Failed,
}

/// Step 1's outcome from the replies in so far of the masters `on` (in
/// their order; `None`: not in yet) to the proposal `p`, or `None` while
/// undecided: held as soon as a majority answered exactly `p`; step 3 as
/// soon as that cannot happen and a majority granted; failed as soon as a
/// majority cannot grant.
pub(crate) fn first_outcome(
    rule: Rule,
    p: u64,
    on: &[usize],
    replies: &[Option<StepReply>],
    quorum: usize,
) -> Option<First> {
    let votes = |ok: &dyn Fn(u64) -> bool| -> Vec<usize> {
        on.iter()
            .zip(replies)
            .filter_map(|(&i, r)| match r {
                Some(Ok(Some(t))) if ok(*t) => Some(i),
                _ => None,
            })
            .collect()
    };
    let pending = replies.iter().filter(|r| r.is_none()).count();
    let grants: Vec<(usize, u64)> = on
        .iter()
        .zip(replies)
        .filter_map(|(&i, r)| match r {
            Some(Ok(Some(t))) => Some((i, *t)),
            _ => None,
        })
        .collect();
    let exact = match rule {
        Rule::Exact => votes(&|t| t == p),
        Rule::AtLeast => votes(&|t| t >= p),
        Rule::WithoutCommit if pending > 0 => return None,
        Rule::WithoutCommit => {
            return Some(match Commit::new(grants, quorum) {
                Some(c) => First::Held {
                    token: c.token,
                    on: c.on,
                },
                None => First::Failed,
            });
        }
    };
    if exact.len() >= quorum {
        return Some(First::Held {
            token: p,
            on: exact,
        });
    }
    if exact.len() + pending >= quorum {
        return None;
    }
    if grants.len() + pending < quorum {
        return Some(First::Failed);
    }
    Commit::new(grants, quorum).map(First::Commit)
}

/// The masters whose step-1 token (in `replies`, in the order of `on`)
/// came back more than 1 s of clock above the proposal `p` that a majority
/// answered exactly: their clocks run at least that far ahead of the
/// majority's (1 s is the least `FLOOR` bound, design.md S9), the outliers
/// of a holding taken in one round trip.
pub(crate) fn fast_outliers(
    p: u64,
    on: &[usize],
    replies: &[Option<StepReply>],
    addr: impl Fn(usize) -> String,
) -> Vec<Outlier> {
    on.iter()
        .zip(replies)
        .filter_map(|(&i, r)| match r {
            Some(Ok(Some(t))) if *t > p + 1000 * PER_MS => Some(Outlier {
                master: i,
                addr: addr(i),
                token: *t,
                instead: p,
                ahead: Duration::from_millis((t - p) / PER_MS),
            }),
            _ => None,
        })
        .collect()
}

/// How long a decided step still waits for the masters not in yet, so
/// that those which answer about as fast as the majority count too (in
/// `committed`, for the fence): as long again as the step took so far, at
/// least 25 ms, never past the step's own deadline. A slow or silent master
/// no longer sets the pace.
pub(crate) fn linger(took: Duration) -> Duration {
    took.max(Duration::from_millis(25))
}

/// A release's outcome from the replies in so far (`None`: not in yet) of
/// `n` masters: `Some(true)` a majority released, `Some(false)` too many
/// did not (or did not answer), `None` undecided.
pub(crate) fn release_outcome<E>(replies: &[Option<Result<i64, E>>], n: usize) -> Option<bool> {
    let released = replies.iter().filter(|r| matches!(r, Some(Ok(1)))).count();
    let not = replies
        .iter()
        .filter(|r| r.is_some() && !matches!(r, Some(Ok(1))))
        .count();
    if released >= majority(n) {
        Some(true)
    } else if not > n - majority(n) {
        Some(false)
    } else {
        None
    }
}

/// Step 3 of a quorum acquisition, one round at a time: `LEASE.ACQUIRE
/// ... FLOOR token` to the masters `on`. The first round sends the highest
/// token granted in step 1 to every master that granted. When fewer than a
/// majority answer it exactly but a majority refused it as too far ahead of
/// their clocks, the next round leaves out the masters that granted it
/// (outliers) and sends, to the masters that refused, the highest token
/// they granted; each round leaves at least one master out, so there are
/// at most N. Any two majorities still share a master, so tokens of
/// successive holdings still increase.
#[derive(Debug, Clone)]
pub(crate) struct Commit {
    /// (master, token) of every master that granted in step 1.
    grants: Vec<(usize, u64)>,
    on: Vec<usize>,
    token: u64,
    quorum: usize,
}

/// What a round of step 3 decided.
#[derive(Debug)]
pub(crate) enum Committed {
    /// Held with `token`, committed on the masters `on` (a majority).
    Held { token: u64, on: Vec<usize> },
    /// Another round, without the outliers (reported).
    Again(Commit, Vec<Outlier>),
    /// No majority: release everywhere and try again later.
    Failed,
}

impl Commit {
    /// The first round, from step 1's grants; `None` when fewer than
    /// `quorum` masters granted.
    pub(crate) fn new(grants: Vec<(usize, u64)>, quorum: usize) -> Option<Commit> {
        let token = grants.iter().map(|&(_, t)| t).max()?;
        let on = grants.iter().map(|&(i, _)| i).collect();
        (grants.len() >= quorum).then_some(Commit {
            grants,
            on,
            token,
            quorum,
        })
    }

    /// The token this round commits.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// The masters this round goes to.
    pub(crate) fn on(&self) -> &[usize] {
        &self.on
    }

    fn granted(&self, master: usize) -> u64 {
        self.grants
            .iter()
            .find(|&&(i, _)| i == master)
            .map_or(0, |&(_, t)| t)
    }

    /// The round's outcome from the replies in so far, in the order of
    /// [`on`](Self::on) (`None`: not in yet), or `None` while undecided:
    /// held as soon as a majority answered exactly the token, another round
    /// as soon as a majority refused it as too far ahead, failed as soon as
    /// neither can happen. `addr` names a master for the report.
    pub(crate) fn decide(
        &self,
        replies: &[Option<StepReply>],
        addr: impl Fn(usize) -> String,
    ) -> Option<Committed> {
        let mut committed = Vec::new();
        let mut refused = Vec::new();
        for (&i, r) in self.on.iter().zip(replies) {
            match r {
                Some(Ok(Some(t))) if *t == self.token => committed.push(i),
                Some(Err(e)) if floor_refused(e) => refused.push(i),
                _ => {}
            }
        }
        let pending = replies.iter().filter(|r| r.is_none()).count();
        if committed.len() >= self.quorum {
            return Some(Committed::Held {
                token: self.token,
                on: committed,
            });
        }
        if refused.len() < self.quorum {
            let open = committed.len().max(refused.len()) + pending >= self.quorum;
            return (!open).then_some(Committed::Failed);
        }
        let instead = refused.iter().map(|&i| self.granted(i)).max()?;
        let outliers = self
            .on
            .iter()
            .filter(|&&i| self.granted(i) == self.token)
            .map(|&i| Outlier {
                master: i,
                addr: addr(i),
                token: self.token,
                instead,
                ahead: Duration::from_millis((self.token - instead) / 1024),
            })
            .collect();
        Some(Committed::Again(
            Commit {
                grants: self.grants.clone(),
                on: refused,
                token: instead,
                quorum: self.quorum,
            },
            outliers,
        ))
    }
}

/// A quorum fence's outcome from the replies of the masters that committed
/// the token, in their order: the first reply of a master where the token
/// was current (the command's value, or the error the server returned for
/// the command) once at least `quorum` such replies came; else, when the
/// token was current on a majority but `MINTTL` refused it on some
/// (`EXPIRING`), the first of those as [`Error::Expiring`]; else
/// [`Error::Stale`] (refused as stale, or no answer, on too many).
pub(crate) fn fence_outcome(
    replies: Vec<redis::RedisResult<redis::Value>>,
    quorum: usize,
) -> Result<redis::Value, Error> {
    let refused = |e: &redis::RedisError, code: &str| e.code() == Some(code);
    let (expiring, others): (Vec<_>, Vec<_>) = replies
        .into_iter()
        .partition(|r| r.as_ref().is_err_and(|e| refused(e, "EXPIRING")));
    let ran: Vec<_> = others
        .into_iter()
        .filter(|r| match r {
            Ok(_) => true,
            Err(e) => e.code().is_some() && !refused(e, "STALE") && !lost_reply(e),
        })
        .collect();
    if ran.len() < quorum {
        let current = ran.len() + expiring.len();
        return match expiring.into_iter().next() {
            Some(Err(e)) if current >= quorum => Err(Error::from(e)),
            _ => Err(Error::Stale),
        };
    }
    ran.into_iter()
        .next()
        .expect("a majority ran it")
        .map_err(Error::from)
}
