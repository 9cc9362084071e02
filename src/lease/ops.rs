//! What each command does to a key, as values: given what the key holds,
//! the request and the server's state, the answer, the effects to commit
//! (in order, each with the event it is: what it counts and notifies, and
//! for a batch of ended holders whether the drain must take out more), and
//! what the key's waiters need next. The binding reads the key, asks here,
//! commits the effects through its one commit path and does what `then`
//! says; the model test drives the same functions.
//!
//! The hand-off to waiters (`serve`) cannot be one list of effects decided
//! up front: each grant changes the key the next step decides on. So it
//! runs here, against a `Key` and a `Queue` the caller provides (the
//! binding's key writer and wait registry, or the model's maps), step by
//! step:
//!
//! 1. a batch of ended holders leaves (one `LEASE.PRUNE`, committed);
//! 2. nothing more during a grace period (re-check at its end), while the
//!    server is out of memory (waiters keep waiting), or within the
//!    millisecond of an early expiry;
//! 3. `Queue::grant_next` picks the next step on the key as it is now: a
//!    grant to the oldest waiter (a new lease or one more holder, with a
//!    new token, taking the place of an ended holder of a full `LIMIT`
//!    first), the same token for a retry of an owner just served, an error
//!    for a waiter that cannot be served, or a stop;
//! 4. the step's effect is committed through `Key::commit` (stored,
//!    replicated and counted like any acquisition, before the next step
//!    reads the key) and its waiter answered through `Queue::answer`;
//! 5. back to 3, at most once per waiter; what is left says when to look
//!    again (`Served`).

use super::clock::TokenClock;
use super::decide::{self, Acquire, Decision, Held};
use super::effect::{Effect, Facts};
use super::error::{LeaseError, printable};
use super::exclusive::Lease;
use super::guard::hash_tag;
use super::holders::{Ended, Holders};
use super::mode::{HoldersMode, Mode};
use super::record::RecordRef;
use super::waitq::{Step, Waiter};

/// How many ended holders one command takes out before it decides; a
/// timer takes out the rest (the binding's drain), `DRAIN_PER_TICK` at a
/// time, so that no call's work or effect grows with the number of holders
/// that ended.
pub const PRUNE_PER_CALL: usize = 64;
pub const DRAIN_PER_TICK: usize = 1024;

/// What a committed effect is, for the counters and keyspace events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A new lease or holder (`acquired`, `lease.acquire`).
    Acquire,
    /// A holder's retry: same token, new deadline (`reacquired`,
    /// `lease.renew`).
    Reacquire,
    /// A holder's retry whose `FLOOR` raised its token (`reacquired`, and
    /// `lease.acquire`: a new token).
    ReacquireRaised,
    /// A renewal (`renewed`, `lease.renew`) that found `left_ms` of its
    /// holding left and asked for a holding of `ttl_ms` (what it tells the
    /// distributions, known when it is decided).
    Renew { left_ms: i64, ttl_ms: i64 },
    /// A release by its holder, decided at `at_ms` (`released`,
    /// `lease.release`).
    Release { at_ms: i64 },
    /// A hand-off given back because its waiter vanished (`lease.release`).
    Revoke,
    /// Holders whose time ended, taken out (`expired`, `lease.expire`);
    /// `drain`: more ended holders stay, for the drain to take out (a
    /// timer, `DRAIN_PER_TICK` at a time).
    Expire { holders: u32, drain: bool },
    /// A record whose lease ended while its key had no expiry, removed
    /// (`expired`; the key's own expiry would have sent no event either).
    Lingered(u32),
    /// A key's expiry set back to its lease's deadline (nothing).
    Align,
    /// The key guards its hash tag from now on (`lease.guard`).
    Guard,
    /// The key stopped guarding (`lease.unguard`).
    Unguard,
    /// An effect from the master link or the AOF (counted by nobody: the
    /// master counted it).
    Replayed,
}

/// An effect and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit<'a> {
    pub effect: Effect<'a>,
    pub event: Event,
}

/// A commit that owns the owner and the label it names (to commit an
/// effect read from the very record it changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedCommit {
    effect: Effect<'static>,
    owner: Box<[u8]>,
    label: Option<Box<[u8]>>,
    event: Event,
}

impl Commit<'_> {
    pub fn to_owned(&self) -> OwnedCommit {
        OwnedCommit {
            effect: self.effect.with_bytes(&[], None),
            owner: self.effect.owner().unwrap_or_default().into(),
            label: self.effect.label().map(Into::into),
            event: self.event,
        }
    }
}

impl OwnedCommit {
    pub fn as_commit(&self) -> Commit<'_> {
        Commit {
            effect: self.effect.with_bytes(&self.owner, self.label.as_deref()),
            event: self.event,
        }
    }
}

/// The effects of one call, in order (at most two: a batch of ended
/// holders, then the change the call asked for).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Commits<'a> {
    first: Option<Commit<'a>>,
    second: Option<Commit<'a>>,
}

impl<'a> Commits<'a> {
    #[inline(always)]
    fn push(&mut self, effect: Effect<'a>, event: Event) {
        let c = Some(Commit { effect, event });
        if self.first.is_none() {
            self.first = c;
        } else {
            assert!(self.second.is_none(), "at most two effects a call");
            self.second = c;
        }
    }

    #[inline(always)]
    pub fn iter(&self) -> impl Iterator<Item = Commit<'a>> + '_ {
        self.iter_ref().copied()
    }

    /// The effects, in order, borrowed.
    #[inline(always)]
    pub fn iter_ref(&self) -> impl Iterator<Item = &Commit<'a>> + '_ {
        self.first.iter().chain(self.second.iter())
    }
}

/// A refusal the binding counts when it is answered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Contended,
    GraceRefused,
    RenewFailed,
    ReleaseFailed,
}

/// What the waiters of the call's keys need after it: one vocabulary for
/// single- and multi-key calls. `W` is what a wait re-checks: the key's
/// time (`i64`) for a single-key call, a `Recheck` per key for a
/// multi-key one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then<W = i64> {
    Nothing,
    /// The caller waits (`BLOCK`), or a multi-key waiter keeps waiting:
    /// its key is re-checked at this time, or its keys at these.
    Wait(W),
    /// A deadline moved to `at` (every key's, for a multi-key call): the
    /// waiters are re-checked once it has passed.
    RecheckAt(i64),
    /// A holder's deadline moved: re-check at the key's next end, as it is
    /// once the effects are committed.
    Rearm,
    /// A holding left (or holders ended): serve the waiters now.
    Serve,
}

/// A key a waiting caller must look at again: its index among the call's
/// keys, when, and whether to the microsecond (the waker) or on a module
/// timer alone (a grace period's end: no moment to meet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recheck {
    pub key: usize,
    pub at_ms: i64,
    pub precise: bool,
}

/// The effects of a multi-key call, each with the index of its key.
pub type PerKey<'a> = Vec<(usize, Commit<'a>)>;

/// What a call does: its answer, its effects (`Commits` for one key,
/// `PerKey` for several), what the waiters need, and what is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome<C, W = i64> {
    /// The answer: a token (acquire), an integer (renew, release,
    /// unguard), `OK` (guard), or null (or, with `Then::Wait`, no answer
    /// yet).
    pub answer: Answer,
    pub commits: C,
    pub then: Then<W>,
    /// Counted when the answer goes out now.
    pub count: Option<Count>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Token(u64),
    Null,
    Int(i64),
    /// `OK` (`LEASE.GUARD`).
    Ok,
}

impl<C: Default, W> Outcome<C, W> {
    /// An answer with no effect, nothing to follow and nothing counted.
    #[inline]
    pub fn new(answer: Answer) -> Self {
        Outcome {
            answer,
            commits: C::default(),
            then: Then::Nothing,
            count: None,
        }
    }
}

/// The server's state as a command (or one serve of a key's waiters)
/// decides on it, read once by the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The decision's time (one time for a whole transaction or script).
    pub now_ms: i64,
    /// When the running grace period (design.md S7) would end, if one runs.
    pub grace_ends_at: Option<i64>,
    /// The server is over `maxmemory`: nothing is granted to a waiter
    /// (design.md S4: a hand-off is a new lease, refused under OOM like a
    /// client's acquire). Read only while clients wait (a server call).
    pub out_of_memory: bool,
    /// Ended holders a call takes out before it decides (`PRUNE_PER_CALL`).
    pub prune_per_call: usize,
}

/// The server's side of a decision on one key: the snapshot, the token
/// clock, and what the server knows of the key beyond its record.
pub struct Env<'c> {
    pub server: Snapshot,
    pub clock: &'c mut TokenClock,
    /// Clients wait on this key (a newcomer does not overtake them).
    pub waiters_ahead: bool,
    /// The server expired this key within its lease's deadline millisecond
    /// (Redis 8.2): until then the lease counts as held.
    pub ended_early: Option<i64>,
}

/// `LEASE.ACQUIRE key owner ttl-ms [LIMIT n | SHARED] [BLOCK timeout-ms]`.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: i64,
    pub mode: Mode,
    /// `FLOOR token` (0: none; exclusive only, checked by the parser and
    /// `decide::check_floor`): the token is at least this.
    pub floor: u64,
    /// `BLOCK` was given and the call may block here (not in MULTI or a
    /// script).
    pub may_wait: bool,
    /// `LABEL text` (design.md S11); none keeps a retry's label.
    pub label: Option<&'a [u8]>,
}

/// A refused acquire: null (counted as `count`), or a wait re-checked at
/// `recheck_at`.
fn refused<'a>(req: &AcquireRequest<'a>, recheck_at: i64, count: Count) -> Outcome<Commits<'a>> {
    let mut out = Outcome::<Commits>::new(Answer::Null);
    if req.may_wait {
        out.then = Then::Wait(recheck_at);
    } else {
        out.count = Some(count);
    }
    out
}

/// The exclusive lease stored in a record, if that is what it is.
fn exclusive(record: Option<RecordRef<'_>>) -> Option<&Lease> {
    match record {
        Some(RecordRef::Exclusive(l)) => Some(l),
        _ => None,
    }
}

/// Must the key's waiters be served before a newcomer's acquire is decided
/// (the lease is free, or a counting or shared lease may have a place)?
#[inline]
pub fn serve_first(record: Option<RecordRef<'_>>, now_ms: i64) -> bool {
    match record {
        Some(RecordRef::Holders(_)) => true,
        current => decide::live(exclusive(current), now_ms).is_none(),
    }
}

/// Takes out at least `min` and at most `max(min, per_call)` ended holders
/// of `m` (the earliest first), as one `LEASE.PRUNE`.
fn prune<'a>(
    m: &Holders,
    now_ms: i64,
    min: usize,
    per_call: usize,
    commits: &mut Commits<'a>,
) -> usize {
    match m.ended_batch(now_ms, per_call.max(min)) {
        Some(b) => {
            commits.push(prune_effect(&b), expired(&b));
            b.n
        }
        None => 0,
    }
}

fn prune_effect<'a>(b: &Ended) -> Effect<'a> {
    Effect::Prune {
        deadline_ms: b.deadline_ms,
        token: b.token,
    }
}

fn expired(b: &Ended) -> Event {
    Event::Expire {
        holders: b.n as u32,
        drain: b.more,
    }
}

/// `LEASE.ACQUIRE`: `key_expire` reads the key's expiry (asked only when
/// the caller may wait: when to re-check).
#[inline(always)]
pub fn acquire<'a>(
    record: Option<RecordRef<'_>>,
    key_expire: impl FnOnce() -> Option<i64>,
    req: AcquireRequest<'a>,
    env: Env<'_>,
) -> Result<Outcome<Commits<'a>>, LeaseError> {
    let now = env.server.now_ms;
    let expire = if req.may_wait { key_expire() } else { None };
    if req.mode != Mode::Exclusive || matches!(record, Some(RecordRef::Holders(_))) {
        return acquire_holder(record, expire, req, env);
    }
    let current = exclusive(record);
    if current.is_none()
        && let Some(end) = env.ended_early
    {
        return Ok(refused(&req, end + 1, Count::Contended));
    }
    let recheck_at = current.map_or(now, |l| decide::ends_at(l, expire) + 1);
    // During a grace period nothing new is created: the caller is answered
    // as if another owner held the key (someone may), or waits.
    if let Some(end) = env
        .server
        .grace_ends_at
        .filter(|_| decide::live(current, now).is_none())
    {
        return Ok(refused(&req, end, Count::GraceRefused));
    }
    // A free key that clients still wait for (the oldest is a LEASE.MACQUIRE
    // waiter whose other keys are taken): a newcomer does not overtake.
    if env.waiters_ahead && decide::live(current, now).is_none() {
        return Ok(refused(&req, recheck_at, Count::Contended));
    }
    Ok(
        match decide::acquire(current, req.owner, req.ttl_ms, req.floor, now, env.clock)? {
            Acquire::Created { token, deadline_ms } => {
                let mut out = Outcome::<Commits>::new(Answer::Token(token));
                out.commits.push(
                    Effect::Apply {
                        owner: req.owner,
                        token,
                        deadline_ms,
                        facts: Facts::new(now, req.label),
                    },
                    Event::Acquire,
                );
                out
            }
            Acquire::Reacquired {
                token,
                deadline_ms,
                raised,
            } => {
                let mut out = Outcome::<Commits>::new(Answer::Token(token));
                let since_ms = current.map_or(now, |l| l.since_ms());
                out.commits.push(
                    Effect::Apply {
                        owner: req.owner,
                        token,
                        deadline_ms,
                        facts: Facts::new(since_ms, req.label),
                    },
                    // A FLOOR that raised the token is notified as an
                    // acquire (a new token), counted as a re-acquire.
                    if raised {
                        Event::ReacquireRaised
                    } else {
                        Event::Reacquire
                    },
                );
                out.then = Then::RecheckAt(deadline_ms);
                out
            }
            Acquire::Contended => refused(&req, recheck_at, Count::Contended),
        },
    )
}

/// `LEASE.ACQUIRE` with `LIMIT n` or `SHARED`, or on a key held that way
/// (design.md S8): the decision first, so that an error changes nothing; then a
/// batch of ended holders leaves, and one effect.
fn acquire_holder<'a>(
    record: Option<RecordRef<'_>>,
    expire: Option<i64>,
    req: AcquireRequest<'a>,
    env: Env<'_>,
) -> Result<Outcome<Commits<'a>>, LeaseError> {
    let now = env.server.now_ms;
    let held = Held::of(record, now);
    let decision = decide::acquire_mode(held, req.mode, req.owner, env.waiters_ahead, now)?;
    let mut commits = Commits::default();
    let stored = match record {
        Some(RecordRef::Holders(m)) => Some(m),
        _ => None,
    };
    // A stored LIMIT n record keeps at most n holders: a new holder of a
    // full one takes the place of an ended one.
    let room = match (stored, req.mode.holders()) {
        (Some(m), Some(mode @ HoldersMode::Limit(n))) if m.mode() == mode => {
            (m.len() + 1).saturating_sub(n as usize)
        }
        _ => 0,
    };
    let min = if decision == Decision::New { room } else { 0 };
    if let Some(m) = stored {
        prune(m, now, min, env.server.prune_per_call, &mut commits);
    }
    if held.is_free()
        && let Some(end) = env.ended_early
    {
        return Ok(refused(&req, end + 1, Count::Contended));
    }
    let recheck_at = held.next_end(expire, now).map_or(now, |end| end + 1);
    if let Some(end) = env
        .server
        .grace_ends_at
        .filter(|_| held.is_free() || decision == Decision::New)
    {
        return Ok(refused(&req, end, Count::GraceRefused));
    }
    let deadline_ms = now + req.ttl_ms;
    let mut out = match decision {
        Decision::New => {
            let token = env.clock.issue(now).ok_or(LeaseError::TokensExhausted)?;
            let mut out = Outcome::<Commits>::new(Answer::Token(token));
            let facts = Facts::new(now, req.label);
            let effect = match req.mode.holders() {
                None => Effect::Apply {
                    owner: req.owner,
                    token,
                    deadline_ms,
                    facts,
                },
                Some(mode) => Effect::Hold {
                    mode,
                    owner: req.owner,
                    token,
                    deadline_ms,
                    facts,
                },
            };
            commits.push(effect, Event::Acquire);
            out.commits = commits;
            out
        }
        Decision::Reacquired { token } => {
            let mut out = Outcome::<Commits>::new(Answer::Token(token));
            let mode = stored.map_or(HoldersMode::Shared, |m| m.mode());
            let since_ms = stored
                .and_then(|m| m.holder(req.owner))
                .map_or(now, |h| h.since_ms);
            commits.push(
                Effect::Hold {
                    mode,
                    owner: req.owner,
                    token,
                    deadline_ms,
                    facts: Facts::new(since_ms, req.label),
                },
                Event::Reacquire,
            );
            out.commits = commits;
            out.then = Then::Rearm;
            out
        }
        Decision::Contended => {
            let mut out = refused(&req, recheck_at, Count::Contended);
            out.commits = commits;
            out
        }
    };
    // A batch that left freed places: waiters first (a wait re-checks the
    // key anyway).
    if out.then == Then::Nothing
        && out
            .commits
            .iter()
            .any(|c| matches!(c.event, Event::Expire { .. }))
    {
        out.then = Then::Rearm;
    }
    Ok(out)
}

/// `LEASE.RENEW key owner ttl-ms`; `prune_per_call` as in `Snapshot`.
#[inline(always)]
pub fn renew<'a>(
    record: Option<RecordRef<'_>>,
    owner: &'a [u8],
    ttl_ms: i64,
    now_ms: i64,
    prune_per_call: usize,
) -> Outcome<Commits<'a>> {
    match record {
        Some(RecordRef::Holders(m)) => {
            let mut commits = Commits::default();
            let pruned = prune(m, now_ms, 0, prune_per_call, &mut commits);
            let renewed = decide::renew_holder(m, owner, ttl_ms, now_ms);
            let mut out = Outcome::<Commits>::new(Answer::Int(renewed.is_some() as i64));
            if let (Some(deadline_ms), Some(h)) = (renewed, m.holder(owner)) {
                commits.push(
                    Effect::Hold {
                        mode: m.mode(),
                        owner,
                        token: h.token,
                        deadline_ms,
                        facts: Facts::new(h.since_ms, None),
                    },
                    Event::Renew {
                        left_ms: h.deadline_ms - now_ms,
                        ttl_ms: deadline_ms - now_ms,
                    },
                );
                out.then = Then::Rearm;
            } else {
                out.count = Some(Count::RenewFailed);
            }
            if pruned > 0 {
                out.then = Then::Serve;
            }
            out.commits = commits;
            out
        }
        current => match (
            exclusive(current),
            decide::renew(exclusive(current), owner, ttl_ms, now_ms),
        ) {
            (Some(l), Some(deadline_ms)) => {
                let mut out = Outcome::<Commits>::new(Answer::Int(1));
                out.commits.push(
                    Effect::Apply {
                        owner,
                        token: l.token,
                        deadline_ms,
                        facts: Facts::new(l.since_ms(), None),
                    },
                    Event::Renew {
                        left_ms: l.deadline_ms - now_ms,
                        ttl_ms: deadline_ms - now_ms,
                    },
                );
                out.then = Then::RecheckAt(deadline_ms);
                out
            }
            _ => {
                let mut out = Outcome::<Commits>::new(Answer::Int(0));
                out.count = Some(Count::RenewFailed);
                out
            }
        },
    }
}

/// `LEASE.RELEASE key owner` from a client (a replica and the AOF apply
/// the `Effect::Release` they receive, by owner alone); `prune_per_call` as
/// in `Snapshot`.
#[inline(always)]
pub fn release<'a>(
    record: Option<RecordRef<'_>>,
    owner: &'a [u8],
    now_ms: i64,
    prune_per_call: usize,
) -> Outcome<Commits<'a>> {
    match record {
        Some(RecordRef::Holders(m)) => {
            let mut commits = Commits::default();
            let pruned = prune(m, now_ms, 0, prune_per_call, &mut commits);
            let released = decide::release_holder(m, owner, now_ms);
            let mut out = Outcome::<Commits>::new(Answer::Int(released as i64));
            if released {
                commits.push(Effect::Drop { owner }, Event::Release { at_ms: now_ms });
            } else {
                out.count = Some(Count::ReleaseFailed);
            }
            if released || pruned > 0 {
                out.then = Then::Serve;
            }
            out.commits = commits;
            out
        }
        current => {
            if decide::release(exclusive(current), owner, now_ms) {
                let mut out = Outcome::<Commits>::new(Answer::Int(1));
                out.commits
                    .push(Effect::Release { owner }, Event::Release { at_ms: now_ms });
                out.then = Then::Serve;
                out
            } else {
                let mut out = Outcome::<Commits>::new(Answer::Int(0));
                out.count = Some(Count::ReleaseFailed);
                out
            }
        }
    }
}

/// `LEASE.GUARD key` (design.md S12): the key `name` guards its hash tag
/// from now on. `tag_guard`: the key that guards `name`'s hash tag in its
/// database, if one does. `record` reads the key (or answers WRONGTYPE),
/// asked once the name passed its checks, so that a name without a hash
/// tag or of a tag guarded by another key is refused before the key is
/// read. A guard asked again answers `OK` and changes nothing; a counting
/// or shared lease cannot guard.
pub fn guard<'r>(
    name: &[u8],
    tag_guard: Option<&[u8]>,
    record: impl FnOnce() -> Result<Option<RecordRef<'r>>, LeaseError>,
) -> Result<Outcome<Commits<'static>>, LeaseError> {
    let Some(tag) = hash_tag(name) else {
        return Err(LeaseError::NoHashTag);
    };
    if let Some(other) = tag_guard.filter(|g| *g != name) {
        return Err(LeaseError::AlreadyGuarded {
            tag: printable(tag),
            guard: printable(other),
        });
    }
    let mut out = Outcome::<Commits>::new(Answer::Ok);
    match record()? {
        Some(RecordRef::Holders(_)) => return Err(LeaseError::GuardHolders),
        Some(RecordRef::Exclusive(l)) if l.is_guard() => {}
        _ => out.commits.push(Effect::Guard, Event::Guard),
    }
    Ok(out)
}

/// `LEASE.UNGUARD key`: 1 when the key guarded its hash tag and stops
/// (a free guard goes, a held one expires with its lease again), else 0.
pub fn unguard(record: Option<RecordRef<'_>>) -> Outcome<Commits<'static>> {
    if !record.is_some_and(RecordRef::is_guard) {
        return Outcome::new(Answer::Int(0));
    }
    let mut out = Outcome::<Commits>::new(Answer::Int(1));
    out.commits.push(Effect::Unguard, Event::Unguard);
    out
}

/// A lease handed to a waiter that disconnected before it learnt its token
/// (nobody holds it): given back, if it is still there as it was handed.
pub fn revoke<'a>(
    record: Option<RecordRef<'_>>,
    owner: &'a [u8],
    token: u64,
) -> Option<Commit<'a>> {
    let effect = match record? {
        // A guard's key stays, free (design.md S12).
        RecordRef::Exclusive(l) if l.token == token && l.is_held_by(owner) && l.is_guard() => {
            Effect::Release { owner }
        }
        RecordRef::Exclusive(l) if l.token == token && l.is_held_by(owner) => Effect::Delete,
        RecordRef::Holders(m) if m.holder(owner).is_some_and(|h| h.token == token) => {
            Effect::Drop { owner }
        }
        _ => return None,
    };
    Some(Commit {
        effect,
        event: Event::Revoke,
    })
}

/// One batch of the drain of a counting or shared lease: at most
/// `DRAIN_PER_TICK` ended holders, the earliest first.
pub fn drain<'a>(record: Option<RecordRef<'_>>, now_ms: i64) -> Option<Commit<'a>> {
    let Some(RecordRef::Holders(m)) = record else {
        return None;
    };
    let b = m.ended_batch(now_ms, DRAIN_PER_TICK)?;
    Some(Commit {
        effect: prune_effect(&b),
        event: expired(&b),
    })
}

/// A key that outlives its lease (after a `RESTORE k 0`, `PERSIST` or a
/// longer `EXPIRE`): its expiry set back to the lease's deadline (the
/// latest holder's), or the key deleted when the lease has already ended.
/// `None` when the expiry matches.
pub fn align<'a>(
    record: Option<RecordRef<'a>>,
    key_expire: Option<i64>,
    now_ms: i64,
) -> Option<Commit<'a>> {
    let (live, holders, to) = match record? {
        // A guard's key has no expiry (design.md S12): one it was restored
        // with is taken away.
        RecordRef::Exclusive(l) if l.is_guard() => {
            return key_expire.map(|_| Commit {
                effect: Effect::Guard,
                event: Event::Align,
            });
        }
        RecordRef::Exclusive(l) => (
            l.is_live(now_ms),
            1,
            decide::expiry_to_align(l, key_expire).map(|_| Effect::Apply {
                owner: l.owner(),
                token: l.token,
                deadline_ms: l.deadline_ms,
                facts: Facts::new(l.since_ms(), None),
            }),
        ),
        RecordRef::Holders(m) => (
            m.is_live(now_ms),
            m.len(),
            decide::holders_expiry_to_align(m, key_expire).map(|at_ms| Effect::ExpireAt { at_ms }),
        ),
    };
    let effect = to?;
    Some(if live {
        Commit {
            effect,
            event: Event::Align,
        }
    } else {
        Commit {
            effect: Effect::Delete,
            event: Event::Lingered(holders as u32),
        }
    })
}

/// A key's re-check timer fired at `now_ms`: serve its waiters
/// (`Then::Serve`: the key is free, or has a free place), or re-check
/// once the next end of a holding has passed (`Then::RecheckAt(end)`: a
/// full `LIMIT` key whose holders are all within their time, or a live
/// exclusive lease).
pub fn recheck(record: Option<RecordRef<'_>>, key_expire: Option<i64>, now_ms: i64) -> Then {
    let end = match record {
        Some(RecordRef::Holders(m)) if !m.has_room(now_ms) => {
            Held::Holders(m).next_end(key_expire, now_ms)
        }
        Some(RecordRef::Holders(_)) => None,
        record => Held::of(record, now_ms).next_end(key_expire, now_ms),
    };
    end.map_or(Then::Serve, Then::RecheckAt)
}

/// A key, as the hand-off to waiters sees it.
pub trait Key {
    /// The record it holds (live or not), or WRONGTYPE.
    fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError>;
    /// Its absolute expiry, if it has one.
    fn expire_at(&mut self) -> Option<i64>;
    /// Commits one effect (store, signal, replicate, notify, count).
    fn commit(&mut self, commit: Commit<'_>);
    /// Counts an event that changes nothing more (a client's retry
    /// answered with the token its owner was just granted).
    fn count(&mut self, event: Event);
}

/// A key's queue of waiters, as the hand-off sees it.
pub trait Queue<H> {
    /// The next step of serving the queue on a key in state `held`
    /// (`WaitRegistry::grant_next`).
    fn grant_next(&mut self, held: Held, now_ms: i64, clock: &mut TokenClock) -> Option<Step<H>>;
    /// Waiters queued.
    fn waiting(&self) -> usize;
    /// Answers a waiter: its token, or an error.
    fn answer(&mut self, waiter: Waiter<H>, answer: Result<u64, LeaseError>);
}

/// What serving a queue leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Re-check the key at this time (the next end of a holding, or the end
    /// of the grace or of an early expiry's millisecond).
    RecheckAt(i64),
    /// Nothing to re-check (the key is free or nobody waits).
    Idle,
    /// The server is out of memory: no new lease now, the waiters keep
    /// waiting and the key is tried again shortly (design.md S4: a hand-off
    /// is a new lease, refused under OOM like a client's acquire).
    NoMemory,
}

/// Serves the waiters of one key, oldest first: a batch of ended holders
/// leaves, then each step of `Queue::grant_next` is committed like any
/// acquisition (a new lease or one more holder, with a new token; waiters
/// with the same owner, a client's retries, get the same token), until the
/// oldest waiter must wait. Nothing is granted during a grace period,
/// while the server is out of memory, or before an early expiry's
/// millisecond has passed.
pub fn serve<H>(key: &mut impl Key, queue: &mut impl Queue<H>, env: Env<'_>) -> Served {
    let now = env.server.now_ms;
    let clock = env.clock;
    let mut batch = Commits::default();
    if let Ok(Some(RecordRef::Holders(m))) = key.record() {
        prune(m, now, 0, env.server.prune_per_call, &mut batch);
    }
    for c in batch.iter() {
        key.commit(c);
    }
    if let Some(end) = env.server.grace_ends_at {
        return Served::RecheckAt(end);
    }
    if env.server.out_of_memory && queue.waiting() > 0 {
        return Served::NoMemory;
    }
    if key.record().is_ok_and(|r| Held::of(r, now).is_free())
        && let Some(end) = env.ended_early
    {
        return Served::RecheckAt(end + 1);
    }
    // Each step answers at least one waiter, so this ends after at most
    // as many steps as there are waiters.
    for _ in 0..=queue.waiting() {
        let Ok(record) = key.record() else { break };
        let held = Held::of(record, now);
        // A full LIMIT record whose places are free only because holders
        // ended (some or all of them) takes the place of one of them first.
        let room = match record {
            Some(RecordRef::Holders(m)) => match m.mode() {
                HoldersMode::Limit(n) if m.len() >= n as usize && m.has_ended(now) => {
                    m.ended_batch(now, m.len() + 1 - n as usize)
                }
                _ => None,
            },
            _ => None,
        };
        let Some(step) = queue.grant_next(held, now, clock) else {
            break;
        };
        if let (Some(b), Step::Grant { .. }) = (room, &step) {
            key.commit(Commit {
                effect: prune_effect(&b),
                event: expired(&b),
            });
        }
        apply_step(key, queue, step, now);
    }
    let expire = key.expire_at();
    match key.record() {
        Ok(record) => match Held::of(record, now).next_end(expire, now) {
            Some(end) => Served::RecheckAt(end + 1),
            None => Served::Idle,
        },
        Err(_) => Served::Idle,
    }
}

/// Commits one step of serving a queue and answers its waiters.
fn apply_step<H>(key: &mut impl Key, queue: &mut impl Queue<H>, step: Step<H>, now_ms: i64) {
    match step {
        Step::Grant {
            mode,
            owner,
            token,
            deadline_ms,
            label,
            waiters,
            refused,
        } => {
            let facts = Facts::new(now_ms, label.as_deref());
            let effect = match mode.holders() {
                None => Effect::Apply {
                    owner: &owner,
                    token,
                    deadline_ms,
                    facts,
                },
                Some(mode) => Effect::Hold {
                    mode,
                    owner: &owner,
                    token,
                    deadline_ms,
                    facts,
                },
            };
            key.commit(Commit {
                effect,
                event: Event::Acquire,
            });
            for (i, waiter) in waiters.into_iter().enumerate() {
                if i > 0 {
                    // The later waiters of the same owner are its retries.
                    key.count(Event::Reacquire);
                }
                queue.answer(waiter, Ok(token));
            }
            for (waiter, e) in refused {
                queue.answer(waiter, Err(e));
            }
        }
        Step::Reacquired {
            owner,
            token,
            raised,
            deadline_ms,
            label,
            waiters,
            refused,
        } => {
            let label = label.as_deref();
            let effect = match key.record() {
                Ok(Some(RecordRef::Holders(m))) => Some(Effect::Hold {
                    mode: m.mode(),
                    owner: &owner,
                    token,
                    deadline_ms,
                    facts: Facts::new(m.holder(&owner).map_or(now_ms, |h| h.since_ms), label),
                }),
                Ok(Some(RecordRef::Exclusive(l))) => Some(Effect::Apply {
                    owner: &owner,
                    token,
                    deadline_ms,
                    facts: Facts::new(l.since_ms(), label),
                }),
                _ => None,
            };
            let answer = match effect {
                Some(effect) => {
                    key.commit(Commit {
                        effect,
                        event: match raised {
                            true => Event::ReacquireRaised,
                            false => Event::Reacquire,
                        },
                    });
                    Ok(token)
                }
                None => Err(LeaseError::Internal("the holding to extend is gone".into())),
            };
            for (i, waiter) in waiters.into_iter().enumerate() {
                if i > 0 && answer.is_ok() {
                    key.count(Event::Reacquire);
                }
                queue.answer(waiter, answer.clone());
            }
            for (waiter, e) in refused {
                queue.answer(waiter, Err(e));
            }
        }
        Step::Refused { waiter, error } => queue.answer(waiter, Err(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal's event carries what it tells the distributions, known
    /// when it is decided: the holding's time left, and the time asked for.
    #[test]
    fn a_renewal_carries_its_margin() {
        let held = Lease::plain(b"o", 7 << 10, 1_000);
        let out = renew(Some(RecordRef::Exclusive(&held)), b"o", 500, 600, 0);
        let c: Vec<Commit<'_>> = out.commits.iter().collect();
        assert_eq!(
            c.iter().map(|c| c.event).collect::<Vec<_>>(),
            [Event::Renew {
                left_ms: 400,
                ttl_ms: 500
            }]
        );
    }

    /// LEASE.GUARD and LEASE.UNGUARD decided here: the name's errors first
    /// (the key is not read), then WRONGTYPE, then a holders record; a
    /// guard asked again changes nothing.
    #[test]
    fn guard_and_unguard_decide_in_the_core() {
        let unread = || -> Result<Option<RecordRef<'static>>, LeaseError> {
            panic!("the key is read only once the name passed")
        };
        assert_eq!(guard(b"plain", None, unread), Err(LeaseError::NoHashTag));
        assert_eq!(
            guard(b"a{t}", Some(b"b{t}"), unread),
            Err(LeaseError::AlreadyGuarded {
                tag: "t".into(),
                guard: "b{t}".into()
            })
        );
        let wrong = || Err(LeaseError::WrongType);
        assert_eq!(guard(b"a{t}", None, wrong), Err(LeaseError::WrongType));
        let out = guard(b"a{t}", None, || Ok(None)).expect("a guard");
        assert_eq!(out.answer, Answer::Ok);
        let c: Vec<Commit<'_>> = out.commits.iter().collect();
        assert_eq!(
            c,
            [Commit {
                effect: Effect::Guard,
                event: Event::Guard
            }]
        );
        let held = Lease::plain(b"o", 7 << 10, 1_000);
        let out = guard(b"a{t}", Some(b"a{t}"), || {
            Ok(Some(RecordRef::Exclusive(&held)))
        })
        .expect("a held lease may guard");
        assert_eq!(out.commits.iter().count(), 1);
        let free = Lease::free_guard(5);
        let out = guard(b"a{t}", Some(b"a{t}"), || {
            Ok(Some(RecordRef::Exclusive(&free)))
        })
        .expect("a guard again");
        assert_eq!((out.answer, out.commits.iter().count()), (Answer::Ok, 0));
        let holders = Holders::with(
            HoldersMode::Shared,
            super::super::holders::Holder {
                owner: b"r".as_slice().into(),
                token: 9,
                deadline_ms: 1_000,
                since_ms: 0,
                label: None,
            },
        );
        assert_eq!(
            guard(b"a{t}", None, || Ok(Some(RecordRef::Holders(&holders)))),
            Err(LeaseError::GuardHolders)
        );
        let out = unguard(Some(RecordRef::Exclusive(&free)));
        assert_eq!(out.answer, Answer::Int(1));
        assert_eq!(
            out.commits.iter().map(|c| c.event).collect::<Vec<_>>(),
            [Event::Unguard]
        );
        for record in [None, Some(RecordRef::Exclusive(&held))] {
            let out = unguard(record);
            assert_eq!(
                (out.answer, out.commits.iter().count()),
                (Answer::Int(0), 0)
            );
        }
    }

    /// A guard's key has no expiry: one it was restored with is taken away
    /// by asking the guard again (which persists the key); none, nothing.
    #[test]
    fn align_takes_a_guards_expiry_away() {
        let free = Lease::free_guard(5);
        let c = align(Some(RecordRef::Exclusive(&free)), Some(1_000), 500).expect("a commit");
        assert!(matches!(c.effect, Effect::Guard) && matches!(c.event, Event::Align));
        assert!(align(Some(RecordRef::Exclusive(&free)), None, 500).is_none());
    }
}
