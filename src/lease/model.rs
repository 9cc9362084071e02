//! A randomized model test of the pure core. Random sequences of acquire
//! (exclusive, `LIMIT 2`, `LIMIT 3` and `SHARED`, with and without BLOCK),
//! renew, release, fence, info and the passing of time (expiries,
//! hand-offs, BLOCK timeouts) run against two things:
//!
//! - the core as the module composes it (`decide` for exclusive leases,
//!   `multi` for counting and shared ones, `TokenClock`,
//!   `WaitRegistry::grant_next`/`take_timed_out`, lazy pruning of ended
//!   holders), and
//! - a plain reference model written here from the contract (SPEC S1, S2,
//!   S8), with vectors and linear scans,
//!
//! and every answer must agree. Each sequence has its own seed, printed on
//! failure; `LEASE_MODEL_SEED=<seed>` replays one sequence.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::clock::TokenClock;
use super::decide::{self, Acquire};
use super::decide::{Decision, Held};
use super::exclusive::Lease;
use super::holders::{Holder, Multi};
use super::mode::{Mode, MultiMode};
use super::record::{Record, RecordRef};
use super::waitq::{Step, WaitRegistry};

const KEYS: usize = 4;
/// Ended holders the commands take out at a time (the module's is larger;
/// a small one here keeps ended holders stored while decisions run).
const PRUNE_BATCH: usize = 1;
const OWNERS: [&[u8]; 5] = [b"o1", b"o2", b"o3", b"o4", b"o5"];

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
    /// or that token minus `off`.
    Fence {
        key: usize,
        pick: usize,
        off: u64,
    },
    Info {
        key: usize,
    },
    /// Time passes, one millisecond at a time.
    Advance {
        ms: i64,
    },
}

/// LEASE.INFO as compared: mode and limit (none for exclusive), token, ttl,
/// waiters, and (token, ttl) per holder (multi only).
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
    /// `Some(shared)` when the token is valid.
    Fence(Option<bool>),
    Info(Option<InfoAnswer>),
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
        },
        75..=81 => Op::Info { key },
        _ => Op::Advance {
            ms: rng.random_range(1..=8),
        },
    }
}

/// The answers each system gives to the blocked acquires, by id, in the
/// order they came: a token, or an error's text.
type Late = Vec<(u32, Result<u64, String>)>;

/// The token a fence op checks: one of the last four tokens issued on the
/// key (the same in both systems: their clocks agree), or 1.
fn fence_token(issued: &[u64], pick: usize, off: u64) -> u64 {
    if issued.is_empty() {
        return 1;
    }
    let back = pick % issued.len().min(4);
    issued[issued.len() - 1 - back].saturating_sub(off).max(1)
}

/// The core, composed as the module composes it (src/module/commands.rs
/// and waiters.rs).
struct Core {
    now: i64,
    keys: HashMap<usize, Record>,
    clock: TokenClock,
    reg: WaitRegistry<u32, ()>,
    next_id: u32,
    late: Late,
    /// Every token issued per key, to check they strictly increase.
    issued: HashMap<usize, Vec<u64>>,
}

impl Core {
    fn new(now: i64) -> Self {
        Core {
            now,
            keys: HashMap::new(),
            clock: TokenClock::new(),
            reg: WaitRegistry::default(),
            next_id: 1,
            late: Vec::new(),
            issued: HashMap::new(),
        }
    }

    fn slot(key: usize) -> (i32, Vec<u8>) {
        (0, vec![b'a' + key as u8])
    }

    fn note_issued(&mut self, key: usize, token: u64) {
        let all = self.issued.entry(key).or_default();
        let prev = all.last().copied().unwrap_or(0);
        assert!(token > prev, "token {token} on key {key} after {prev}");
        all.push(token);
    }

    fn held(&self, key: usize) -> Held<'_> {
        Held::of(self.keys.get(&key).map(|r| r.as_ref()), self.now)
    }

    /// The effects layer's `prune`: drops at most `PRUNE_BATCH` holders of
    /// a multi record whose deadline has passed (the key goes with the last
    /// one); the rest stay, and count for nothing in any decision.
    fn prune(&mut self, key: usize) {
        self.prune_up_to(key, PRUNE_BATCH);
    }

    fn prune_up_to(&mut self, key: usize, max: usize) {
        if let Some(Record::Multi(m)) = self.keys.get_mut(&key) {
            m.take_ended(self.now, max);
            if m.is_empty() {
                self.keys.remove(&key);
            }
        }
    }

    /// Stores a new holder in `mode` (the effects layer's `create` for an
    /// exclusive lease, `add_holder` for a multi record).
    fn store_new(&mut self, key: usize, mode: Mode, owner: &[u8], token: u64, deadline_ms: i64) {
        self.note_issued(key, token);
        let owner: Box<[u8]> = owner.into();
        let holder = Holder {
            owner: owner.clone(),
            token,
            deadline_ms,
        };
        match (mode.multi(), self.keys.get_mut(&key)) {
            (None, _) => {
                self.keys.insert(
                    key,
                    Record::Exclusive(Lease::new(&owner, token, deadline_ms)),
                );
            }
            (Some(mm), Some(Record::Multi(m))) if m.mode() == mm => {
                // The effects layer's `make_room`: a full LIMIT record gives
                // up an ended holder before it takes a new one.
                if let MultiMode::Limit(n) = mm {
                    let over = (m.len() + 1).saturating_sub(n as usize);
                    m.take_ended(self.now, over);
                    assert!(m.len() < n as usize, "no room on key {key}");
                }
                m.put(holder);
            }
            (Some(mm), _) => {
                self.keys
                    .insert(key, Record::Multi(Multi::with(mm, holder)));
            }
        }
    }

    fn extend(&mut self, key: usize, owner: &[u8], deadline_ms: i64) {
        match self.keys.get_mut(&key) {
            Some(Record::Exclusive(l)) => l.deadline_ms = deadline_ms,
            Some(Record::Multi(m)) => assert!(m.set_deadline(owner, deadline_ms)),
            None => panic!("nothing to extend on key {key}"),
        }
    }

    /// The module's `waiters::serve`: prune, then one step at a time.
    fn serve(&mut self, key: usize) {
        self.prune(key);
        for _ in 0..100 {
            let held = Held::of(self.keys.get(&key).map(|r| r.as_ref()), self.now);
            let Some(step) = self
                .reg
                .grant_next(&Self::slot(key), held, self.now, &mut self.clock)
            else {
                return;
            };
            match step {
                Step::Grant {
                    mode,
                    owner,
                    token,
                    deadline_ms,
                    waiters,
                    refused,
                } => {
                    self.store_new(key, mode, &owner, token, deadline_ms);
                    self.late
                        .extend(waiters.iter().map(|w| (w.handle, Ok(token))));
                    self.late.extend(
                        refused
                            .into_iter()
                            .map(|(w, e)| (w.handle, Err(e.to_string()))),
                    );
                }
                Step::Reacquired {
                    owner,
                    token,
                    deadline_ms,
                    waiters,
                    refused,
                } => {
                    self.extend(key, &owner, deadline_ms);
                    self.late
                        .extend(waiters.iter().map(|w| (w.handle, Ok(token))));
                    self.late.extend(
                        refused
                            .into_iter()
                            .map(|(w, e)| (w.handle, Err(e.to_string()))),
                    );
                }
                Step::Refused { waiter, error } => {
                    self.late.push((waiter.handle, Err(error.to_string())));
                }
            }
        }
        panic!("serve did not settle");
    }

    fn waiting(&self, key: usize) -> usize {
        self.reg.len(&Self::slot(key))
    }

    fn block_or_null(
        &mut self,
        key: usize,
        owner: usize,
        mode: Mode,
        ttl: i64,
        block: Option<i64>,
    ) -> Answer {
        match block {
            Some(timeout) => {
                let id = self.next_id;
                self.next_id += 1;
                let at = (timeout > 0).then(|| self.now + timeout);
                self.reg
                    .push(Self::slot(key), id, OWNERS[owner], mode, ttl, at);
                Answer::Blocked(id)
            }
            None => Answer::Token(None),
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
        let serve_first = self.waiting(key) > 0
            && match self.keys.get(&key) {
                Some(Record::Exclusive(l)) => !l.is_live(self.now),
                _ => true,
            };
        if serve_first {
            self.serve(key);
        }
        let exclusive_path =
            mode == Mode::Exclusive && !matches!(self.keys.get(&key), Some(Record::Multi(_)));
        if exclusive_path {
            let current = match self.keys.get(&key) {
                Some(Record::Exclusive(l)) => Some(&**l),
                _ => None,
            };
            let d = decide::acquire(current, OWNERS[owner], ttl, self.now, &mut self.clock)
                .expect("tokens left");
            return match d {
                Acquire::Created(lease) => {
                    let t = lease.token;
                    self.note_issued(key, t);
                    self.keys.insert(key, Record::Exclusive(lease));
                    Answer::Token(Some(t))
                }
                Acquire::Reacquired { token, deadline_ms } => {
                    self.extend(key, OWNERS[owner], deadline_ms);
                    Answer::Token(Some(token))
                }
                Acquire::Contended => self.block_or_null(key, owner, mode, ttl, block),
            };
        }
        self.prune(key);
        let ahead = self.waiting(key) > 0;
        match decide::acquire_mode(self.held(key), mode, OWNERS[owner], ahead, self.now) {
            Err(e) => Answer::Error(e.to_string()),
            Ok(Decision::New) => {
                let t = self.clock.issue(self.now).expect("tokens left");
                self.store_new(key, mode, OWNERS[owner], t, self.now + ttl);
                Answer::Token(Some(t))
            }
            Ok(Decision::Reacquired { token }) => {
                self.extend(key, OWNERS[owner], self.now + ttl);
                Answer::Token(Some(token))
            }
            Ok(Decision::Contended) => self.block_or_null(key, owner, mode, ttl, block),
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
                let o = OWNERS[owner];
                let deadline = match self.keys.get(&key) {
                    Some(Record::Exclusive(l)) => decide::renew(Some(l), o, ttl, self.now),
                    Some(Record::Multi(_)) => {
                        self.prune(key);
                        if self.waiting(key) > 0 {
                            self.serve(key);
                        }
                        match self.keys.get(&key) {
                            Some(Record::Multi(m)) => decide::renew_holder(m, o, ttl, self.now),
                            _ => None,
                        }
                    }
                    None => None,
                };
                match deadline {
                    Some(d) => {
                        self.extend(key, o, d);
                        Answer::Int(1)
                    }
                    None => Answer::Int(0),
                }
            }
            Op::Release { key, owner } => {
                let o = OWNERS[owner];
                let released = match self.keys.get_mut(&key) {
                    Some(Record::Exclusive(l)) => {
                        let yes = decide::release(Some(l), o, self.now);
                        if yes {
                            self.keys.remove(&key);
                        }
                        yes
                    }
                    Some(Record::Multi(_)) => {
                        self.prune(key);
                        match self.keys.get_mut(&key) {
                            Some(Record::Multi(m)) if decide::release_holder(m, o, self.now) => {
                                m.remove(o);
                                if m.is_empty() {
                                    self.keys.remove(&key);
                                }
                                true
                            }
                            _ => false,
                        }
                    }
                    None => false,
                };
                if released || self.waiting(key) > 0 {
                    self.serve(key);
                }
                Answer::Int(released as i64)
            }
            Op::Fence { key, pick, off } => {
                let token = fence_token(self.issued.get(&key).map_or(&[], |v| v), pick, off);
                let record = self.keys.get(&key).map(|r| r.as_ref());
                Answer::Fence(
                    decide::fence_record(record, token, self.now)
                        .ok()
                        .map(|f| f.shared),
                )
            }
            Op::Info { key } => {
                let waiters = self.waiting(key);
                Answer::Info(match self.keys.get(&key).map(|r| r.as_ref()) {
                    Some(RecordRef::Multi(m)) => decide::holders_info(m, self.now, None).map(|v| {
                        (
                            Some((v.mode.name(), v.mode.limit())),
                            v.token,
                            v.ttl_ms,
                            waiters,
                            v.holders,
                        )
                    }),
                    Some(RecordRef::Exclusive(l)) => decide::info(Some(l), self.now, None)
                        .map(|v| (None, v.token, v.ttl_ms, waiters, vec![])),
                    None => None,
                })
            }
            Op::Advance { ms } => {
                for _ in 0..ms {
                    self.now += 1;
                    for (_, w) in self.reg.take_timed_out(self.now) {
                        self.late.push((w.handle, Err("null".into())));
                    }
                    // The re-check timers: only keys with waiters.
                    for key in 0..KEYS {
                        if self.waiting(key) > 0 {
                            self.serve(key);
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
            Op::Fence { key, pick, off } => {
                let token = fence_token(self.issued.get(&key).map_or(&[], |v| v), pick, off);
                let now = self.now;
                let k = &self.keys[key];
                let valid = k.holders.iter().any(|&(_, t, d)| t == token && now <= d);
                Answer::Fence(valid.then_some(k.kind == Some(Mode::Shared)))
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
                Answer::Info(match (k.kind, live.last()) {
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
                })
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
    let (mut core, mut model) = (Core::new(start), Model::new(start));
    let mut ops = Vec::new();
    for step in 0..steps {
        let op = random_op(&mut rng);
        ops.push(op.clone());
        let (a, b) = (core.apply(&op), model.apply(&op));
        let context = || {
            let tail: Vec<String> = ops
                .iter()
                .rev()
                .take(16)
                .rev()
                .map(|o| format!("{o:?}"))
                .collect();
            format!(
                "model test failed: seed {seed} (replay with LEASE_MODEL_SEED={seed}), step {step}\nlast ops:\n  {}",
                tail.join("\n  ")
            )
        };
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
/// each multi mode, readers and writers taking turns, refusals, hand-offs.
#[test]
fn the_model_reaches_the_interesting_states() {
    let (mut most_limit, mut most_shared, mut errors, mut handoffs) = (0, 0, 0, 0);
    for seed in 0..50u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut core = Core::new(1_800_000_000_000);
        for _ in 0..500 {
            let op = random_op(&mut rng);
            if matches!(core.apply(&op), Answer::Error(_)) {
                errors += 1;
            }
            for r in core.keys.values() {
                if let Record::Multi(m) = r {
                    let live = m.holders().filter(|h| h.is_live(core.now)).count();
                    match m.mode() {
                        MultiMode::Limit(_) => most_limit = most_limit.max(live),
                        MultiMode::Shared => most_shared = most_shared.max(live),
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
}
