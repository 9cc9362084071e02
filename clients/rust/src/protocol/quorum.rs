//! Quorum leases (design.md S9): the commands of an acquisition's steps
//! (with its label), the decisions of step 3 (the commit of one token to a
//! majority, leaving out a master whose clock runs ahead) and of a quorum
//! fence.

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
    /// Step 1: `LEASE.ACQUIRE key owner ttl-ms [LABEL text]`.
    pub(crate) fn first(&self) -> redis::Cmd {
        self.step(None)
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

/// A master left out of a quorum acquisition's commit (step 3) because the
/// others refused its token as too far ahead of their clocks (the `FLOOR`
/// bound): its clock is wrong. The token committed is the highest that a
/// majority accepts instead. Reported through `QuorumClient::on_outlier`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlier {
    /// The master's index in the client's list.
    pub master: usize,
    /// Its address (`host:port`, or a Unix socket's path).
    pub addr: String,
    /// The token it granted, which the others refused.
    pub token: u64,
    /// The token tried next in its place: the highest that the masters
    /// which refused it granted.
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

    /// Skips the commit: held with the highest token on every master that
    /// granted (only for the tests that show why step 3 exists).
    pub(crate) fn skipped(self) -> Committed {
        Committed::Held {
            token: self.token,
            on: self.on,
        }
    }

    fn granted(&self, master: usize) -> u64 {
        self.grants
            .iter()
            .find(|&&(i, _)| i == master)
            .map_or(0, |&(_, t)| t)
    }

    /// The round's replies, in the order of [`on`](Self::on); `addr` names
    /// a master for the report.
    pub(crate) fn settle(
        self,
        replies: Vec<redis::RedisResult<Option<u64>>>,
        addr: impl Fn(usize) -> String,
    ) -> Committed {
        let mut committed = Vec::new();
        let mut refused = Vec::new();
        for (&i, r) in self.on.iter().zip(replies) {
            match r {
                Ok(Some(t)) if t == self.token => committed.push(i),
                Err(e) if floor_refused(&e) => refused.push(i),
                _ => {}
            }
        }
        if committed.len() >= self.quorum {
            return Committed::Held {
                token: self.token,
                on: committed,
            };
        }
        let Some(instead) = refused.iter().map(|&i| self.granted(i)).max() else {
            return Committed::Failed;
        };
        if refused.len() < self.quorum {
            return Committed::Failed;
        }
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
        Committed::Again(
            Commit {
                on: refused,
                token: instead,
                ..self
            },
            outliers,
        )
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
