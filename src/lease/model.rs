//! A randomized model test of the pure core. Random sequences of acquire
//! (exclusive, `LIMIT 2`, `LIMIT 3` and `SHARED`, with and without BLOCK),
//! renew, release, fence, info, guard and unguard (design.md S12) and the
//! passing of time (expiries, hand-offs, BLOCK timeouts) run against two
//! things:
//!
//! - the core as the module drives it: the decisions of `ops` (acquire,
//!   renew, release, guard, unguard, the hand-off `ops::serve`), their
//!   effects applied
//!   with `Effect::apply` (the guards' set following what each change
//!   says came or went), `WaitRegistry` for the waiters and BLOCK
//!   timeouts, `TokenClock` for the tokens, and

//! - a plain reference model written here from the contract (design.md S1, S2,
//!   S8), with vectors and linear scans,
//!
//! and every answer must agree. Each sequence has its own seed, printed on
//! failure; `LEASE_MODEL_SEED=<seed>` replays one sequence.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::clock::TokenClock;
use super::decide::{self, Held};
use super::error::LeaseError;
use super::guard::hash_tag;
use super::mode::{HoldersMode, Mode};
use super::ops::{self, AcquireRequest, Commits, Env, Key, Outcome, Served, Snapshot, Then};
use super::record::{Record, RecordRef};
use super::testkit::{Late, MapKey, SlotQueue};
use super::waitq::WaitRegistry;

const KEYS: usize = 4;
/// Ended holders a call takes out, one per sequence (the module's is
/// `ops::PRUNE_PER_CALL`; the small ones keep ended holders stored while
/// decisions run, so that a full `LIMIT` record makes room for a newcomer).
const PRUNE_BATCHES: [usize; 3] = [0, 1, ops::PRUNE_PER_CALL];
const OWNERS: [&[u8]; 5] = [b"o1", b"o2", b"o3", b"o4", b"o5"];
/// The keys' names, for guards: keys 0 and 2 share a hash tag (one guard
/// between them), key 1 (mostly `LIMIT 3`) has none, key 3 its own.
const NAMES: [&[u8]; KEYS] = [b"a{t}", b"b", b"c{t}", b"{u}d"];

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: usize,
        owner: usize,
        mode: Mode,
        ttl: i64,
        /// `Some(0)` waits forever.
        block: Option<i64>,
    },
    Renew {
        key: usize,
        owner: usize,
        ttl: i64,
    },
    Release {
        key: usize,
        owner: usize,
    },
    /// A fence check with one of the last tokens issued on the key (`pick`),
    /// or that token minus `off`, with `MINTTL` when `min_ttl` is given.
    Fence {
        key: usize,
        pick: usize,
        off: u64,
        min_ttl: Option<i64>,
    },
    Info {
        key: usize,
    },
    /// `LEASE.GUARD` of the key.
    Guard {
        key: usize,
    },
    /// `LEASE.UNGUARD` of the key.
    Unguard {
        key: usize,
    },
    /// Time passes, one millisecond at a time.
    Advance {
        ms: i64,
    },
}

/// LEASE.INFO as compared: mode and limit (none for exclusive), token, ttl,
/// waiters, and (token, ttl) per holder (counting and shared only).
type InfoAnswer = (
    Option<(&'static str, u32)>,
    u64,
    i64,
    usize,
    Vec<(u64, i64)>,
);

/// What a call answers; a blocked acquire answers later, by its id.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Token(Option<u64>),
    Error(String),
    Blocked(u32),
    Int(i64),
    /// `Some(Ok(shared))` when the token is valid, `Some(Err(left))` when
    /// it is but has less than `MINTTL` left, `None` when it is stale.
    Fence(Option<Result<bool, i64>>),
    /// LEASE.INFO's holding (if held), and its `guard` field.
    Info(Option<InfoAnswer>, bool),
    Ok,
    None,
}

/// Each key leans to one way of use, so that holders pile up, with the
/// other modes mixed in (contention and refusals).
fn random_mode(rng: &mut StdRng, key: usize) -> Mode {
    let r = rng.random_range(0..100);
    let any = |r: i32| match r % 4 {
        0 => Mode::Exclusive,
        1 => Mode::Limit(2),
        2 => Mode::Limit(3),
        _ => Mode::Shared,
    };
    match key {
        0 if r < 85 => Mode::Exclusive,
        1 if r < 85 => Mode::Limit(3),
        // A read/write lock: readers and writers.
        2 if r < 55 => Mode::Shared,
        2 if r < 95 => Mode::Exclusive,
        _ => any(r),
    }
}

fn random_op(rng: &mut StdRng) -> Op {
    let key = rng.random_range(0..KEYS);
    let owner = rng.random_range(0..OWNERS.len());
    let ttl = rng.random_range(1..=20);
    match rng.random_range(0..100) {
        0..=39 => Op::Acquire {
            key,
            owner,
            mode: random_mode(rng, key),
            ttl,
            block: match rng.random_range(0..3) {
                0 => None,
                1 => Some(0),
                _ => Some(rng.random_range(1..=30)),
            },
        },
        40..=52 => Op::Renew { key, owner, ttl },
        53..=66 => Op::Release { key, owner },
        67..=74 => Op::Fence {
            key,
            pick: rng.random_range(0..4),
            off: rng.random_range(0..2),
            min_ttl: match rng.random_range(0..3) {
                0 => None,
                _ => Some(rng.random_range(0..=20)),
            },
        },
        75..=81 => Op::Info { key },
        82..=85 => Op::Guard { key },
        86..=87 => Op::Unguard { key },
        _ => Op::Advance {
            ms: rng.random_range(1..=8),
        },
    }
}

/// The token a fence op checks: one of the last four tokens issued on the
/// key (the same in both systems: their clocks agree), or 1.
fn fence_token(issued: &[u64], pick: usize, off: u64) -> u64 {
    if issued.is_empty() {
        return 1;
    }
    let back = pick % issued.len().min(4);
    issued[issued.len() - 1 - back].saturating_sub(off).max(1)
}

/// The core as the module drives it (src/module/commands.rs and
/// waiters.rs): the same `ops` decisions and `ops::serve` hand-off, with
/// the effects applied to records in a map, as `commit.rs` applies them to
/// keys.
struct Core {
    now: i64,
    prune_per_call: usize,
    keys: HashMap<usize, Record>,
    clock: TokenClock,
    reg: WaitRegistry<u32, i64>,
    next_id: u32,
    late: Late,
    /// Every token issued per key, to check they strictly increase.
    issued: HashMap<usize, Vec<u64>>,
    /// The keys that guard their hash tag (`module::guards`' set).
    guards: Vec<usize>,
}

impl Core {
    fn new(now: i64, prune_per_call: usize) -> Self {
        Core {
            now,
            prune_per_call,
            keys: HashMap::new(),
            clock: TokenClock::new(),
            reg: WaitRegistry::default(),
            next_id: 1,
            late: Vec::new(),
            issued: HashMap::new(),
            guards: Vec::new(),
        }
    }

    fn slot(key: usize) -> (i32, Vec<u8>) {
        (0, vec![b'a' + key as u8])
    }

    fn waiting(&self, key: usize) -> usize {
        self.reg.len(&Self::slot(key))
    }

    fn record(&self, key: usize) -> Option<RecordRef<'_>> {
        self.keys.get(&key).map(|r| r.as_ref())
    }

    fn map_key(&mut self, key: usize) -> MapKey<'_> {
        MapKey {
            key,
            keys: &mut self.keys,
            issued: &mut self.issued,
            guards: &mut self.guards,
        }
    }

    /// The server's state a decision reads (`waiters::snapshot`).
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            now_ms: self.now,
            grace_ends_at: None,
            out_of_memory: false,
            prune_per_call: self.prune_per_call,
        }
    }

    /// `waiters::serve`.
    fn serve(&mut self, key: usize) {
        let env = Env {
            server: self.snapshot(),
            clock: &mut self.clock,
            waiters_ahead: false,
            ended_early: None,
        };
        let mut k = MapKey {
            key,
            keys: &mut self.keys,
            issued: &mut self.issued,
            guards: &mut self.guards,
        };
        let mut q = SlotQueue {
            slot: Self::slot(key),
            reg: &mut self.reg,
            late: &mut self.late,
        };
        if let Served::RecheckAt(at) = ops::serve(&mut k, &mut q, env) {
            self.arm(key, at);
        }
    }

    /// `waiters::arm`: the key's re-check timer (one per queue, kept in
    /// the registry), set only while clients wait.
    fn arm(&mut self, key: usize, at_ms: i64) {
        if self.waiting(key) > 0 {
            self.reg.set_timer(&Self::slot(key), Some(at_ms));
        }
    }

    /// `waiters::on_recheck`: the key's timer fired.
    fn on_recheck(&mut self, key: usize) {
        match ops::recheck(self.record(key), None, self.now) {
            Then::RecheckAt(end) => self.arm(key, end + 1),
            _ => self.serve(key),
        }
        self.reg.forget_if_empty(&Self::slot(key));
    }

    /// The key's next end of a holding, after a holder's deadline moved.
    fn rearm(&mut self, key: usize) {
        if let Some(end) = Held::of(self.record(key), self.now).next_end(None, self.now) {
            self.arm(key, end + 1);
        }
    }

    /// `commands::finish`: commits the effects, then what the waiters
    /// need: a wait, a re-check timer, or a hand-off now.
    fn finish(
        &mut self,
        key: usize,
        out: Outcome<Commits<'_>>,
        wait: Option<(usize, Mode, i64, i64)>,
    ) -> Answer {
        let mut k = self.map_key(key);
        for c in out.commits.iter() {
            k.commit(c);
        }
        match out.then {
            Then::Wait(recheck_at) => {
                let (owner, mode, ttl, timeout) = wait.expect("only a BLOCK waits");
                let id = self.next_id;
                self.next_id += 1;
                let at = (timeout > 0).then(|| self.now + timeout);
                self.reg
                    .push(Self::slot(key), id, OWNERS[owner], mode, ttl, at);
                self.arm(key, recheck_at);
                return Answer::Blocked(id);
            }
            Then::RecheckAt(at) => self.arm(key, at + 1),
            Then::Rearm => self.rearm(key),
            Then::Serve if self.waiting(key) > 0 => self.serve(key),
            Then::Serve | Then::Nothing => {}
        }
        match out.answer {
            ops::Answer::Token(t) => Answer::Token(Some(t)),
            ops::Answer::Null => Answer::Token(None),
            ops::Answer::Int(n) => Answer::Int(n),
            ops::Answer::Ok => Answer::Ok,
        }
    }

    fn acquire(
        &mut self,
        key: usize,
        owner: usize,
        mode: Mode,
        ttl: i64,
        block: Option<i64>,
    ) -> Answer {
        if self.waiting(key) > 0 && ops::serve_first(self.record(key), self.now) {
            self.serve(key);
        }
        let req = AcquireRequest {
            owner: OWNERS[owner],
            ttl_ms: ttl,
            mode,
            floor: 0,
            may_wait: block.is_some(),
            label: None,
        };
        let env = Env {
            server: self.snapshot(),
            clock: &mut self.clock,
            waiters_ahead: self.reg.len(&Self::slot(key)) > 0,
            ended_early: None,
        };
        let record = self.keys.get(&key).map(|r| r.as_ref());
        match ops::acquire(record, || None, req, env) {
            Ok(out) => self.finish(key, out, block.map(|t| (owner, mode, ttl, t))),
            Err(e) => Answer::Error(e.to_string()),
        }
    }

    fn apply(&mut self, op: &Op) -> Answer {
        match *op {
            Op::Acquire {
                key,
                owner,
                mode,
                ttl,
                block,
            } => self.acquire(key, owner, mode, ttl, block),
            Op::Renew { key, owner, ttl } => {
                let out = ops::renew(
                    self.record(key),
                    OWNERS[owner],
                    ttl,
                    self.now,
                    self.prune_per_call,
                );
                self.finish(key, out, None)
            }
            Op::Release { key, owner } => {
                let out = ops::release(
                    self.record(key),
                    OWNERS[owner],
                    self.now,
                    self.prune_per_call,
                );
                self.finish(key, out, None)
            }
            Op::Fence {
                key,
                pick,
                off,
                min_ttl,
            } => {
                let token = fence_token(self.issued.get(&key).map_or(&[], |v| v), pick, off);
                Answer::Fence(
                    match decide::fence_record(self.record(key), token, min_ttl, self.now, None) {
                        Ok(f) => Some(Ok(f.shared)),
                        Err(LeaseError::Expiring { left_ms, .. }) => Some(Err(left_ms)),
                        Err(_) => None,
                    },
                )
            }
            Op::Info { key } => {
                let waiters = self.waiting(key);
                let guard = self.record(key).is_some_and(RecordRef::is_guard);
                let held = match self.record(key) {
                    Some(RecordRef::Holders(m)) => {
                        decide::holders_info(m, self.now, None).map(|v| {
                            (
                                Some((v.mode.name(), v.mode.limit())),
                                v.token,
                                v.ttl_ms,
                                waiters,
                                v.holders.iter().map(|h| (h.token, h.ttl_ms)).collect(),
                            )
                        })
                    }
                    Some(RecordRef::Exclusive(l)) => decide::info(Some(l), self.now, None)
                        .map(|v| (None, v.token, v.ttl_ms, waiters, vec![])),
                    None => None,
                };
                Answer::Info(held, guard)
            }
            Op::Guard { key } => {
                // The server's own expiry: a lease key whose every holding
                // ended is gone when a command opens it (its TTL is its
                // latest deadline; a guard's key has none). The map keeps
                // ended records, as a key whose expiry was removed would.
                if let Some(r) = self.record(key)
                    && !r.is_guard()
                    && Held::of(Some(r), self.now).is_free()
                {
                    self.keys.remove(&key);
                }
                let tag = hash_tag(NAMES[key]);
                let tag_guard = self
                    .guards
                    .iter()
                    .find(|&&g| tag.is_some() && hash_tag(NAMES[g]) == tag)
                    .map(|&g| NAMES[g]);
                let record = self.keys.get(&key).map(|r| r.as_ref());
                match ops::guard(NAMES[key], tag_guard, || Ok(record)) {
                    Ok(out) => self.finish(key, out, None),
                    Err(e) => Answer::Error(e.to_string()),
                }
            }
            Op::Unguard { key } => {
                let out = ops::unguard(self.record(key));
                self.finish(key, out, None)
            }
            Op::Advance { ms } => {
                for _ in 0..ms {
                    self.now += 1;
                    // `waiters::on_timeouts`, then the re-check timers due.
                    for (slot, w) in self.reg.take_timed_out(self.now) {
                        self.late.push((w.handle, Err("null".into())));
                        self.reg.forget_if_empty(&slot);
                        let key = usize::from(slot.1[0] - b'a');
                        self.arm(key, self.now);
                    }
                    for key in 0..KEYS {
                        let slot = Self::slot(key);
                        match self.reg.set_timer(&slot, None) {
                            Some(at) if at <= self.now => self.on_recheck(key),
                            Some(at) => {
                                self.reg.set_timer(&slot, Some(at));
                            }
                            None => {}
                        }
                    }
                }
                Answer::None
            }
        }
    }
}

/// The reference model: the contract, written plainly.
#[derive(Default)]
struct KeyState {
    /// How it is held (`None`: free).
    kind: Option<Mode>,
    /// (owner, token, deadline), in the order they came.
    holders: Vec<(usize, u64, i64)>,
    /// Waiters: (id, owner, mode, ttl, timeout_at or 0), oldest first.
    queue: Vec<(u32, usize, Mode, i64, i64)>,
    /// The key guards its hash tag (design.md S12): held exclusively or
    /// free, it stays until unguarded.
    guard: bool,
}

struct Model {
    now: i64,
    keys: Vec<KeyState>,
    last: u64,
    next_id: u32,
    late: Late,
    issued: HashMap<usize, Vec<u64>>,
}

/// How a mode reads in the contract's error texts.
fn mode_text(m: Mode) -> String {
    match m {
        Mode::Exclusive => "an exclusive lease".into(),
        Mode::Limit(n) => format!("LIMIT {n}"),
        Mode::Shared => "SHARED".into(),
    }
}

fn mismatch(held: Mode, asked: Mode) -> String {
    format!(
        "ERR the key is held with {}, this acquire asks for {}",
        mode_text(held),
        mode_text(asked)
    )
}

fn other_mode(held: Mode, asked: Mode) -> String {
    if matches!(held, Mode::Limit(_)) || matches!(asked, Mode::Limit(_)) {
        return mismatch(held, asked);
    }
    format!(
        "ERR this owner holds the key with {} and asks for {}: release it first",
        mode_text(held),
        mode_text(asked)
    )
}

enum RefDecision {
    New,
    Re(u64),
    Wait,
}

impl Model {
    fn new(now: i64) -> Self {
        Model {
            now,
            keys: (0..KEYS).map(|_| KeyState::default()).collect(),
            last: 0,
            next_id: 1,
            late: Vec::new(),
            issued: HashMap::new(),
        }
    }

    fn token(&mut self, key: usize) -> u64 {
        self.last = (self.last + 1).max(self.now as u64 * 1024);
        self.issued.entry(key).or_default().push(self.last);
        self.last
    }

    /// Holders whose deadline passed are gone; a key without holders is free.
    fn expire(&mut self, key: usize) {
        let now = self.now;
        let k = &mut self.keys[key];
        k.holders.retain(|&(_, _, d)| now <= d);
        if k.holders.is_empty() {
            k.kind = None;
        }
    }

    fn decide(
        &self,
        key: usize,
        mode: Mode,
        owner: usize,
        ahead: bool,
    ) -> Result<RefDecision, String> {
        let k = &self.keys[key];
        if k.guard && mode != Mode::Exclusive {
            return Err(LeaseError::GuardHolders.to_string());
        }
        let mine = k.holders.iter().find(|h| h.0 == owner).map(|h| h.1);
        let wait_or_new = |room: bool| {
            if ahead || !room {
                RefDecision::Wait
            } else {
                RefDecision::New
            }
        };
        Ok(match (k.kind, mode) {
            (None, _) => wait_or_new(true),
            (Some(Mode::Exclusive), Mode::Limit(_)) => return Err(mismatch(Mode::Exclusive, mode)),
            (Some(Mode::Exclusive), Mode::Exclusive) => match mine {
                Some(t) => RefDecision::Re(t),
                None => RefDecision::Wait,
            },
            (Some(Mode::Exclusive), Mode::Shared) => match mine {
                Some(_) => return Err(other_mode(Mode::Exclusive, Mode::Shared)),
                None => RefDecision::Wait,
            },
            (Some(Mode::Limit(n)), asked) => {
                if asked != Mode::Limit(n) {
                    return Err(mismatch(Mode::Limit(n), asked));
                }
                match mine {
                    Some(t) => RefDecision::Re(t),
                    None => wait_or_new(k.holders.len() < n as usize),
                }
            }
            (Some(Mode::Shared), Mode::Limit(_)) => return Err(mismatch(Mode::Shared, mode)),
            (Some(Mode::Shared), Mode::Shared) => match mine {
                Some(t) => RefDecision::Re(t),
                None => wait_or_new(true),
            },
            (Some(Mode::Shared), Mode::Exclusive) => match mine {
                Some(_) => return Err(other_mode(Mode::Shared, Mode::Exclusive)),
                None => RefDecision::Wait,
            },
        })
    }

    fn hold(&mut self, key: usize, mode: Mode, owner: usize, token: u64, deadline: i64) {
        let k = &mut self.keys[key];
        k.kind = Some(mode);
        match k.holders.iter_mut().find(|h| h.0 == owner) {
            Some(h) => h.2 = deadline,
            None => k.holders.push((owner, token, deadline)),
        }
    }

    /// Serves the queue from its head, in strict order.
    fn serve(&mut self, key: usize) {
        self.expire(key);
        // A held guard's waiters are looked at when its holding ends (a
        // LIMIT or SHARED waiter queued before the key guarded is refused
        // then, not when the guard comes).
        if self.keys[key].guard && self.keys[key].kind.is_some() {
            return;
        }
        loop {
            let Some(&(id, owner, mode, _, _)) = self.keys[key].queue.first() else {
                return;
            };
            let token = match self.decide(key, mode, owner, false) {
                Err(e) => {
                    self.keys[key].queue.remove(0);
                    self.late.push((id, Err(e)));
                    continue;
                }
                Ok(RefDecision::Wait) => return,
                Ok(RefDecision::New) => self.token(key),
                Ok(RefDecision::Re(t)) => t,
            };
            let q = &mut self.keys[key].queue;
            let same: Vec<_> = q.iter().copied().filter(|w| w.1 == owner).collect();
            q.retain(|w| w.1 != owner);
            let (ok, bad): (Vec<_>, Vec<_>) = same.into_iter().partition(|w| w.2 == mode);
            let deadline = self.now + ok.last().map_or(0, |w| w.3);
            self.hold(key, mode, owner, token, deadline);
            for w in ok {
                self.late.push((w.0, Ok(token)));
            }
            for w in bad {
                self.late.push((w.0, Err(other_mode(mode, w.2))));
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Answer {
        match *op {
            Op::Acquire {
                key,
                owner,
                mode,
                ttl,
                block,
            } => {
                self.serve(key);
                let ahead = !self.keys[key].queue.is_empty();
                match self.decide(key, mode, owner, ahead) {
                    Err(e) => Answer::Error(e),
                    Ok(RefDecision::New) => {
                        let t = self.token(key);
                        self.hold(key, mode, owner, t, self.now + ttl);
                        Answer::Token(Some(t))
                    }
                    Ok(RefDecision::Re(t)) => {
                        self.hold(key, mode, owner, t, self.now + ttl);
                        Answer::Token(Some(t))
                    }
                    Ok(RefDecision::Wait) => match block {
                        Some(timeout) => {
                            let id = self.next_id;
                            self.next_id += 1;
                            let at = if timeout > 0 { self.now + timeout } else { 0 };
                            self.keys[key].queue.push((id, owner, mode, ttl, at));
                            Answer::Blocked(id)
                        }
                        None => Answer::Token(None),
                    },
                }
            }
            Op::Renew { key, owner, ttl } => {
                self.serve(key);
                let now = self.now;
                match self.keys[key].holders.iter_mut().find(|h| h.0 == owner) {
                    Some(h) => {
                        h.2 = now + ttl;
                        Answer::Int(1)
                    }
                    None => Answer::Int(0),
                }
            }
            Op::Release { key, owner } => {
                self.serve(key);
                let k = &mut self.keys[key];
                let before = k.holders.len();
                k.holders.retain(|h| h.0 != owner);
                let released = k.holders.len() < before;
                if k.holders.is_empty() {
                    k.kind = None;
                }
                self.serve(key);
                Answer::Int(released as i64)
            }
            Op::Fence {
                key,
                pick,
                off,
                min_ttl,
            } => {
                let token = fence_token(self.issued.get(&key).map_or(&[], |v| v), pick, off);
                let now = self.now;
                let k = &self.keys[key];
                let valid = k.holders.iter().find(|&&(_, t, d)| t == token && now <= d);
                Answer::Fence(valid.map(|&(_, _, d)| match min_ttl {
                    Some(min) if d - now < min => Err(d - now),
                    _ => Ok(k.kind == Some(Mode::Shared)),
                }))
            }
            Op::Info { key } => {
                let now = self.now;
                let k = &self.keys[key];
                let mut live: Vec<(u64, i64)> = k
                    .holders
                    .iter()
                    .filter(|h| now <= h.2)
                    .map(|h| (h.1, h.2 - now))
                    .collect();
                live.sort();
                let waiters = k.queue.len();
                Answer::Info(
                    match (k.kind, live.last()) {
                        (Some(kind), Some(&(newest, _))) => {
                            let ttl = live.iter().map(|h| h.1).max().unwrap();
                            let mode = match kind {
                                Mode::Exclusive => None,
                                Mode::Limit(n) => Some(("limit", n)),
                                Mode::Shared => Some(("shared", 0)),
                            };
                            let holders = if mode.is_some() { live.clone() } else { vec![] };
                            Some((mode, newest, ttl, waiters, holders))
                        }
                        _ => None,
                    },
                    k.guard,
                )
            }
            Op::Guard { key } => {
                let Some(tag) = hash_tag(NAMES[key]) else {
                    return Answer::Error(LeaseError::NoHashTag.to_string());
                };
                let other = (0..KEYS)
                    .find(|&g| g != key && self.keys[g].guard && hash_tag(NAMES[g]) == Some(tag));
                if let Some(g) = other {
                    let e = LeaseError::AlreadyGuarded {
                        tag: String::from_utf8_lossy(tag).into_owned(),
                        guard: String::from_utf8_lossy(NAMES[g]).into_owned(),
                    };
                    return Answer::Error(e.to_string());
                }
                self.expire(key);
                let k = &mut self.keys[key];
                if matches!(k.kind, Some(Mode::Limit(_) | Mode::Shared)) {
                    return Answer::Error(LeaseError::GuardHolders.to_string());
                }
                k.guard = true;
                Answer::Ok
            }
            Op::Unguard { key } => {
                let k = &mut self.keys[key];
                let was = k.guard;
                k.guard = false;
                Answer::Int(was as i64)
            }
            Op::Advance { ms } => {
                for _ in 0..ms {
                    self.now += 1;
                    // BLOCK timeouts first, then hand-offs, oldest timeout first.
                    let mut due: Vec<(i64, u32)> = Vec::new();
                    let now = self.now;
                    for k in &mut self.keys {
                        k.queue.retain(|&(id, _, _, _, at)| {
                            if at != 0 && at <= now {
                                due.push((at, id));
                                false
                            } else {
                                true
                            }
                        });
                    }
                    due.sort();
                    for (_, id) in due {
                        self.late.push((id, Err("null".into())));
                    }
                    for key in 0..KEYS {
                        self.serve(key);
                    }
                }
                Answer::None
            }
        }
    }
}

fn run(seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = 1_800_000_000_000 + rng.random_range(0..1000);
    let prune = PRUNE_BATCHES[(seed % 3) as usize];
    let (mut core, mut model) = (Core::new(start, prune), Model::new(start));
    let mut ops = Vec::new();
    for step in 0..steps {
        let op = random_op(&mut rng);
        ops.push(op.clone());
        let context = |ops: &[Op]| {
            let tail: Vec<String> = ops
                .iter()
                .rev()
                .take(40)
                .rev()
                .map(|o| format!("{o:?}"))
                .collect();
            format!(
                "model test failed: seed {seed} (replay with LEASE_MODEL_SEED={seed}), step {step}\nlast ops:\n  {}",
                tail.join("\n  ")
            )
        };
        // The core's own checks (tokens rise, a LIMIT n key keeps at most n
        // holders) panic; the seed goes with them.
        let a = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.apply(&op))) {
            Ok(a) => a,
            Err(e) => {
                let what = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{what}\n{}", context(&ops));
            }
        };
        let b = model.apply(&op);
        let context = || context(&ops);
        assert_eq!(a, b, "{}", context());
        assert_eq!(core.late, model.late, "late answers differ\n{}", context());
        assert_eq!(
            core.clock.last(),
            model.last,
            "token clocks differ\n{}",
            context()
        );
        assert_eq!(
            core.issued,
            model.issued,
            "tokens issued differ\n{}",
            context()
        );
    }
}

#[test]
fn the_core_agrees_with_the_reference_model() {
    if let Some(seed) = std::env::var("LEASE_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run(seed, 2000);
        return;
    }
    // A fresh base seed each run (printed in every failure), plus fixed ones.
    let base: u64 = rand::random();
    for i in 0..200u64 {
        run(base.wrapping_add(i), 300);
    }
    for seed in [1, 2, 3, 42, 2026] {
        run(seed, 2000);
    }
}

/// The model exercises what it is meant to: several holders at once in
/// each counting and shared mode, readers and writers taking turns,
/// refusals, hand-offs, guards that come, go and are held.
#[test]
fn the_model_reaches_the_interesting_states() {
    let (mut most_limit, mut most_shared, mut errors, mut handoffs) = (0, 0, 0, 0);
    let (mut guarded, mut unguarded, mut held_guards) = (0, 0, 0);
    for seed in 0..50u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut core = Core::new(1_800_000_000_000, PRUNE_BATCHES[(seed % 3) as usize]);
        for _ in 0..500 {
            let op = random_op(&mut rng);
            match (&op, core.apply(&op)) {
                (_, Answer::Error(_)) => errors += 1,
                (Op::Guard { .. }, Answer::Ok) => guarded += 1,
                (Op::Unguard { .. }, Answer::Int(1)) => unguarded += 1,
                _ => {}
            }
            held_guards += core
                .keys
                .values()
                .filter(
                    |r| matches!(r, Record::Exclusive(l) if l.is_guard() && l.is_live(core.now)),
                )
                .count();
            for r in core.keys.values() {
                if let Record::Holders(m) = r {
                    let live = m.holders().filter(|h| h.is_live(core.now)).count();
                    match m.mode() {
                        HoldersMode::Limit(_) => most_limit = most_limit.max(live),
                        HoldersMode::Shared => most_shared = most_shared.max(live),
                    }
                }
            }
        }
        handoffs += core.late.iter().filter(|l| l.1.is_ok()).count();
    }
    assert!(most_limit >= 3, "LIMIT keys reached {most_limit} holders");
    assert!(
        most_shared >= 3,
        "SHARED keys reached {most_shared} holders"
    );
    assert!(errors > 50, "{errors} refusals");
    assert!(handoffs > 100, "{handoffs} hand-offs");
    assert!(
        guarded > 50 && unguarded > 20 && held_guards > 100,
        "{guarded} guards, {unguarded} unguarded, {held_guards} steps of a held guard"
    );
}
