//! Blocking acquire (`LEASE.ACQUIRE ... BLOCK`): clients blocked with
//! RedisModule_BlockClient in a per-key FIFO queue (crate::lease::waitq),
//! served one at a time when the lease becomes free: inside RELEASE, by a
//! timer at the holder's deadline (expiry), and by a 0 ms timer after a
//! lease key leaves the keyspace or its expiry changes (DEL, UNLINK,
//! RENAME, expiry, FLUSHDB, SWAPDB, PEXPIRE). RedisModule_BlockClientOnKeys
//! is not used: on Redis 7.0 it does not wake clients when a key is deleted.
//!
//! The module owns the `BLOCK` timeouts (clients are blocked with timeout 0
//! and answered null by one timer at the earliest timeout), so every waiter
//! gets exactly one reply even when it is served in the millisecond its
//! timeout passes (Redis 7.0 loses that reply otherwise).
//!
//! A hand-off that a timer starts is a write no client command started: it
//! goes through the effects layer's gates, and a closed gate leaves the
//! waiters queued and tries again later, or redirects them (`-ASK`,
//! `-MOVED`) when the key's slot has left this node.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::lease::clock::TokenClock;
use crate::lease::decide::Held;
use crate::lease::multikey;
use crate::lease::ops::{self, Env, Recheck, Served, Snapshot, Then};
use crate::lease::waitq::{Ask, BLOCK_MARGIN_MS, Slot, Step, WaitRegistry, Waiter};
use crate::lease::{LeaseError, Mode};

use super::commit::{Closed, KeyWriter, Reader};
use super::counters::{self, STATS};
use super::ffi::blocked::{self, Handle};
use super::ffi::ctx::{Ctx, Str};
use super::ffi::filter::Need;
use super::ffi::reply::{self, Reply};
use super::ffi::server::{self, TimerId, now_ms};
use super::ffi::waker;
use super::timers::{self, TimerJob};
use super::{early, grace, tokens};

struct Waiters {
    reg: WaitRegistry<Handle, TimerId>,
    /// The timer at the earliest BLOCK timeout, and when it fires.
    timeout_timer: Option<(TimerId, i64)>,
    /// The `LEASE.MACQUIRE` waiters (by id) whose multi-key timer is
    /// started and has not fired yet: one timer a waiter, however many of
    /// its keys are served meanwhile (each would otherwise start its own,
    /// and each of those look at every key: O(k^2)).
    multikey_pending: HashSet<u64>,
}

static WAITERS: Mutex<Option<Waiters>> = Mutex::new(None);
/// The registry's total, readable without the lock: the hot paths (acquire
/// on a free key, release) skip the registry when nobody waits anywhere.
static TOTAL: AtomicUsize = AtomicUsize::new(0);
/// The waiters' need of the command filter (on while someone waits).
static FILTER_NEED: Need = Need::new();

/// Runs `f` on the registry. Never call into the server while inside `f`:
/// server calls can re-enter this module (the type's unlink callback).
fn with<R>(f: impl FnOnce(&mut Waiters) -> R) -> R {
    let mut guard = WAITERS.lock().unwrap_or_else(|e| e.into_inner());
    let w = guard.get_or_insert_with(|| Waiters {
        reg: WaitRegistry::default(),
        timeout_timer: None,
        multikey_pending: HashSet::new(),
    });
    let out = f(w);
    let (before, after) = (TOTAL.load(Relaxed), w.reg.total());
    TOTAL.store(after, Relaxed);
    drop(guard);
    // The command filter that sees expiry commands on waited-for keys runs
    // only while someone waits: it costs every command of the server.
    if (before == 0) != (after == 0) {
        FILTER_NEED.set(after > 0);
    }
    out
}

fn reg<R>(f: impl FnOnce(&mut WaitRegistry<Handle, TimerId>) -> R) -> R {
    with(|w| f(&mut w.reg))
}

/// Clients waiting on every key.
pub fn total() -> usize {
    TOTAL.load(Relaxed)
}

/// The queue of key `name` in the context's database, when any client
/// waits anywhere (`None` otherwise: nothing to look up).
#[inline(always)]
pub fn slot_if_waiting(ctx: Ctx, name: Str) -> Option<Slot> {
    if total() == 0 {
        return None;
    }
    Some(slot_of(ctx, name))
}

#[inline(never)]
fn slot_of(ctx: Ctx, name: Str) -> Slot {
    (ctx.selected_db(), name.bytes().to_vec())
}

/// Clients waiting on `slot`.
pub fn waiting(slot: &Slot) -> usize {
    reg(|r| r.len(slot))
}

/// `f` of the waiters of key `name` in the context's database, oldest
/// first, at most `count` (`LEASE.WAITERS`).
pub fn list<R>(ctx: Ctx, name: Str, count: usize, f: impl FnOnce(Vec<&Waiter<Handle>>) -> R) -> R {
    let slot = slot_of(ctx, name);
    reg(|r| f(r.list(&slot, count)))
}

/// Clients waiting on key `name` of the context's database.
pub fn waiting_on(ctx: Ctx, name: Str) -> usize {
    slot_if_waiting(ctx, name).map_or(0, |slot| waiting(&slot))
}

/// What a waiter is answered.
pub enum Answer {
    Token(u64),
    Null,
    Error(LeaseError),
}

/// The private data of an unblocked waiter, until its reply is sent.
pub struct Unblocked {
    answer: Answer,
    /// Every key it waited for (one, or a `LEASE.MACQUIRE`'s).
    slots: Vec<Slot>,
    owner: Box<[u8]>,
    replied: bool,
}

/// Blocks the calling client until it gets the lease of `slot` in `mode`
/// or `timeout_ms` passes (0: forever). `recheck_at` is when the current
/// holder's time will have ended, to re-check the key then.
/// What a blocked acquire waits for.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub owner: &'a [u8],
    pub mode: Mode,
    pub ttl_ms: i64,
    /// Its `BLOCK` timeout (0: none).
    pub timeout_ms: i64,
    /// Its `FLOOR` (0: none).
    pub floor: u64,
    /// Its `LABEL`.
    pub label: Option<&'a [u8]>,
}

/// What a client that blocks now with `want` asks the queue for; it is
/// timed out `BLOCK_MARGIN_MS` after its BLOCK timeout.
fn ask<'a>(ctx: Ctx, want: &Want<'a>) -> Ask<'a> {
    let now = now_ms();
    Ask {
        owner: want.owner,
        mode: want.mode,
        ttl_ms: want.ttl_ms,
        timeout_at: (want.timeout_ms > 0).then(|| now + want.timeout_ms + BLOCK_MARGIN_MS),
        floor: want.floor,
        label: want.label,
        client: ctx.client_id(),
        arrived_ms: now,
    }
}

pub fn block(ctx: Ctx, slot: Slot, want: Want<'_>, recheck_at: i64) -> Reply {
    let ask = ask(ctx, &want);
    let Some(bc) = blocked::block(ctx) else {
        return Reply::Null;
    };
    reg(|r| r.push_ask(slot.clone(), bc, ask));
    arm(&slot, recheck_at);
    arm_timeouts();
    Reply::Sent
}

/// (Re)schedules the re-check of `slot` at `at_ms`, replacing its timer.
/// The last `waker::LEAD_MS` before the moment go to the waker thread, to
/// the microsecond; a module timer for a later moment is set that much
/// early, and hands the rest over when it fires (`on_recheck` re-arms).
fn arm(slot: &Slot, at_ms: i64) {
    arm_with(slot, at_ms, true);
}

/// (Re)schedules the re-check of `slot` at `at_ms` on a module timer alone
/// (a retry after a closed gate: no moment to meet).
fn arm_plain(slot: &Slot, at_ms: i64) {
    arm_with(slot, at_ms, false);
}

fn arm_with(slot: &Slot, at_ms: i64, precise: bool) {
    if waiting(slot) == 0 {
        return;
    }
    let precise = precise && waker::available();
    let lead = at_ms - now_ms();
    if precise && lead > 0 && lead <= waker::LEAD_MS && waker::wake_at(at_ms, slot) {
        if let Some(old) = reg(|r| r.set_timer(slot, None)) {
            timers::stop(old);
        }
        return;
    }
    let delay = if precise && lead > waker::LEAD_MS {
        lead - waker::LEAD_MS
    } else {
        lead
    };
    let Some(id) = timers::start(delay, TimerJob::Recheck(slot.clone())) else {
        return;
    };
    if let Some(old) = reg(|r| r.set_timer(slot, Some(id))) {
        timers::stop(old);
    }
}

/// The waker thread says a re-check of `slot` is due: it runs now, from a
/// 0 ms timer (with a context of its own).
pub fn on_wake(slot: Slot) {
    arm(&slot, now_ms());
}

/// Keeps one timer at the earliest BLOCK timeout of any waiter. Called when
/// a waiter arrives (the only way the earliest timeout gets earlier); when a
/// waiter leaves early, the timer may fire with nothing due, and moves on.
fn arm_timeouts() {
    let (next, current) = with(|w| (w.reg.next_timeout(), w.timeout_timer));
    if next == current.map(|(_, at)| at) {
        return;
    }
    if let Some((id, _)) = current {
        timers::stop(id);
    }
    let timer =
        next.and_then(|at| timers::start(at - now_ms(), TimerJob::Timeouts).map(|id| (id, at)));
    with(|w| w.timeout_timer = timer);
}

/// The timeout timer fired: answers null to every waiter whose timeout has
/// passed.
pub fn on_timeouts() {
    with(|w| w.timeout_timer = None);
    let now = now_ms();
    let due = reg(|r| r.take_timed_out(now));
    let mut left: Vec<Slot> = Vec::new();
    for (slot, w) in due {
        STATS.wait_timeouts.incr();
        unblock(&w, &slot, Answer::Null);
        for slot in w.slots(&slot) {
            tidy(&slot);
            if !left.contains(&slot) {
                left.push(slot);
            }
        }
    }
    // A waiter that left may have kept the ones behind it waiting (a
    // reader behind a writer on a key readers hold): re-check now.
    for slot in &left {
        arm(slot, now);
    }
    arm_timeouts();
}

/// Drops the queue of `slot` when nobody waits there any more.
fn tidy(slot: &Slot) {
    if let Some(timer) = reg(|r| r.forget_if_empty(slot)) {
        timers::stop(timer);
    }
}

/// A re-check timer fired: looks at the key of `slot` and serves its
/// waiters, or re-arms the timer at the next end of a holding
/// (`ops::recheck`).
pub fn on_recheck(ctx: Ctx, slot: Slot) {
    reg(|r| r.set_timer(&slot, None));
    if !ctx.select_db(slot.0) {
        fail_all(&slot, LeaseError::Internal("database is gone".into()));
        tidy(&slot);
        return;
    }
    let name = ctx.string(&slot.1);
    let now = now_ms();
    let found = {
        let mut r = Reader::open(ctx, name.as_str());
        let expire = r.expire_at();
        r.record().map(|record| ops::recheck(record, expire, now))
    };
    match found {
        Err(e) => fail_all(&slot, e),
        Ok(Then::RecheckAt(end)) => arm(&slot, end + 1),
        Ok(_) => match KeyWriter::for_module(ctx, name.as_str()) {
            Ok(mut w) => serve(&slot, &mut w, snapshot(ctx)),
            Err(closed) => gate_closed(&slot, closed, now),
        },
    }
    tidy(&slot);
}

/// What a closed gate does to the waiters of `slot`.
fn gate_closed(slot: &Slot, closed: Closed, now: i64) {
    match (closed.retry_in_ms(), closed) {
        (Some(ms), _) => arm_plain(slot, now + ms),
        (None, Closed::Moved(to)) => fail_all(slot, LeaseError::Redirect(to)),
        (None, _) => {}
    }
}

/// Answers every waiter of `slot` with `err` (the key now holds another
/// type, or its slot moved).
fn fail_all(slot: &Slot, err: LeaseError) {
    for w in reg(|r| r.drain(slot)) {
        unblock(&w, slot, Answer::Error(err.clone()));
        // A LEASE.MACQUIRE waiter left its other queues too.
        for other in w.slots(slot).iter().filter(|s| *s != slot) {
            tidy(other);
            arm(other, now_ms());
        }
    }
}

fn unblock(w: &Waiter<Handle>, slot: &Slot, answer: Answer) {
    // A wait served or timed out (an error ends no wait that counts).
    if !matches!(answer, Answer::Error(_)) {
        counters::record_waited(now_ms() - w.arrived_ms);
    }
    blocked::unblock(
        w.handle,
        Box::new(Unblocked {
            answer,
            slots: w.slots(slot),
            owner: w.owner.clone(),
            replied: false,
        }),
    );
}

/// The queue of one key, as the core's hand-off sees it
/// (`lease::ops::serve`): the registry is locked for each step only, never
/// across a server call (server calls can re-enter this module).
struct SlotQueue<'s> {
    slot: &'s Slot,
}

impl ops::Queue<Handle> for SlotQueue<'_> {
    fn grant_next(
        &mut self,
        held: Held,
        now_ms: i64,
        clock: &mut TokenClock,
    ) -> Option<Step<Handle>> {
        reg(|r| r.grant_next(self.slot, held, now_ms, clock))
    }

    fn waiting(&self) -> usize {
        waiting(self.slot)
    }

    fn answer(&mut self, waiter: Waiter<Handle>, answer: Result<u64, LeaseError>) {
        let answer = match answer {
            Ok(token) => Answer::Token(token),
            Err(e) => Answer::Error(e),
        };
        unblock(&waiter, self.slot, answer);
    }
}

/// The server's state a command (or a timer's job) decides on, read once
/// (`ops::Snapshot`): the decision's time, the grace period, and, while
/// clients wait anywhere, whether the server is out of memory (a server
/// call, made only when a waiter may be served).
#[inline(always)]
pub fn snapshot(ctx: Ctx) -> Snapshot {
    let now_ms = server::decision_ms(ctx);
    Snapshot {
        now_ms,
        grace_ends_at: grace::ends_at(now_ms),
        out_of_memory: total() > 0 && ctx.out_of_memory(),
        prune_per_call: ops::PRUNE_PER_CALL,
    }
}

/// If the server expired the key of `slot` within its lease's deadline
/// millisecond (Redis 8.2), the deadline; one load when it did not.
#[inline(always)]
pub fn ended_early(slot: &Slot) -> Option<i64> {
    early::any_ended_early()
        .then(|| early::ended_early(slot.0, &slot.1))
        .flatten()
}

/// Serves the waiters of `slot` on the key `w` has open, oldest first (the
/// core's `ops::serve`: a batch of ended holders leaves, then each step is
/// committed like any acquisition, until the oldest waiter must wait), then
/// re-checks the key at the next end of a holding. `server`: the snapshot
/// of the command (or job) that serves.
pub fn serve(slot: &Slot, w: &mut KeyWriter, server: Snapshot) {
    let served = tokens::with_clock(|clock| {
        let env = Env {
            server,
            clock,
            waiters_ahead: false,
            ended_early: ended_early(slot),
        };
        ops::serve(w, &mut SlotQueue { slot }, env)
    });
    match served {
        Served::RecheckAt(at) => arm(slot, at),
        Served::NoMemory => return gate_closed(slot, Closed::Refused, server.now_ms),
        Served::Idle => {}
    }
    multikey_soon(slot);
}

/// When the oldest waiter of `slot` is a `LEASE.MACQUIRE` waiter, a 0 ms
/// timer tries to serve it (`on_multikey`: all its keys at once, if it is the
/// oldest on each and each is free). One timer a waiter at a time: serving
/// its k keys starts one, not k.
fn multikey_soon(slot: &Slot) {
    let start = with(|w| {
        w.reg
            .head_multikey_id(slot)
            .filter(|id| w.multikey_pending.insert(*id))
    });
    if let Some(id) = start
        && timers::start(0, TimerJob::MultiKey(slot.clone(), id)).is_none()
    {
        with(|w| w.multikey_pending.remove(&id));
    }
}

/// Blocks the calling client until it can take every key of `slots` at
/// once (`LEASE.MACQUIRE ... BLOCK`) or its timeout passes. It queues on
/// each key, in arrival order; `rechecks`: when to look at its keys again
/// (`multikey::acquire` says).
pub fn block_multikey(ctx: Ctx, slots: Vec<Slot>, want: Want<'_>, rechecks: &[Recheck]) -> Reply {
    let ask = ask(ctx, &want);
    let Some(bc) = blocked::block(ctx) else {
        return Reply::Null;
    };
    reg(|r| r.push_multikey(slots.clone(), bc, ask));
    arm_rechecks(&slots, rechecks);
    arm_timeouts();
    Reply::Sent
}

fn arm_rechecks(slots: &[Slot], rechecks: &[Recheck]) {
    for r in rechecks {
        arm_with(&slots[r.key], r.at_ms, r.precise);
    }
}

/// The multi-key timer of `slot` fired: if its oldest waiter is a
/// `LEASE.MACQUIRE` waiter, oldest on every key it waits for, and every
/// one of those keys is free, it takes them all (`lease::multikey`, as the
/// command would decide with nobody ahead); otherwise it keeps waiting, and
/// the keys' own ends, releases and timers bring it back here.
pub fn on_multikey(ctx: Ctx, slot: Slot, id: u64) {
    with(|w| w.multikey_pending.remove(&id));
    let Some(waiter) = reg(|r| r.multikey_head(&slot)) else {
        return;
    };
    let slots = waiter.slots(&slot);
    if !ctx.select_db(slot.0) {
        fail_all(&slot, LeaseError::Internal("database is gone".into()));
        tidy(&slot);
        return;
    }
    let names: Vec<_> = slots.iter().map(|s| ctx.string(&s.1)).collect();
    let now = now_ms();
    // A timer's job: the wall clock, not a command's cached time.
    let server = Snapshot {
        now_ms: now,
        grace_ends_at: grace::ends_at(now),
        out_of_memory: ctx.out_of_memory(),
        prune_per_call: ops::PRUNE_PER_CALL,
    };
    // A look first, past no gate (`multikey::key_view`, as the command
    // decides): while one key is still taken by others, the waiter keeps
    // waiting, and no key is opened for writing. The keys' ends, releases
    // and timers bring it back here.
    let fired = slots.iter().position(|s| *s == slot).unwrap_or(0);
    let early_of = ended_early;
    let mut views = Vec::with_capacity(slots.len());
    for (s, n) in slots.iter().zip(&names) {
        let mut r = Reader::open(ctx, n.as_str());
        views.push(match r.record() {
            Ok(record) => multikey::key_view(record, &waiter.owner, false, now, None, early_of(s)),
            // Another type: not taken by a lease; the write gate below
            // reads it again and answers WRONGTYPE. One view per key, so
            // that a re-check names the right key.
            Err(_) => multikey::key_view(None, &waiter.owner, false, now, None, None),
        });
    }
    if let Some(rechecks) = multikey::still_taken(&views) {
        return arm_rechecks(&slots, &rechecks);
    }
    if server.out_of_memory {
        // No new lease without memory: tried again shortly.
        return gate_closed(&slot, Closed::Refused, now);
    }
    let mut ws = Vec::with_capacity(names.len());
    for n in &names {
        match KeyWriter::for_module(ctx, n.as_str()) {
            Ok(w) => ws.push(w),
            Err(closed) => return gate_closed(&slot, closed, now),
        }
    }
    let mut views = Vec::with_capacity(ws.len());
    let mut wrong = None;
    for (w, s) in ws.iter_mut().zip(&slots) {
        match w.record() {
            Ok(record) => views.push(multikey::key_view(
                record,
                &waiter.owner,
                false,
                now,
                None,
                early_of(s),
            )),
            // A key of another type now: this waiter is answered WRONGTYPE
            // (as its command would be), the others of its keys stay.
            Err(e) => {
                wrong = Some(e);
                break;
            }
        }
    }
    let keys: Vec<&[u8]> = slots.iter().map(|s| s.1.as_slice()).collect();
    let decided = match wrong {
        Some(e) => Err(e),
        None => tokens::with_clock(|clock| {
            multikey::acquire(
                &keys,
                &views,
                &waiter.owner,
                waiter.label.as_deref(),
                waiter.ttl_ms,
                Env {
                    server,
                    clock,
                    waiters_ahead: false,
                    ended_early: None,
                },
                multikey::Caller::Waiter { fired },
            )
        }),
    };
    let answer = match decided {
        Ok(out) => match (out.answer, out.then) {
            (ops::Answer::Token(token), _) => {
                for (i, c) in &out.commits {
                    ws[*i].commit(c);
                }
                Answer::Token(token)
            }
            // Still taken somewhere (or a grace period): it keeps waiting.
            (_, Then::Wait(rechecks)) => return arm_rechecks(&slots, &rechecks),
            _ => return,
        },
        Err(e) => Answer::Error(e),
    };
    if let Some(w) = reg(|r| r.take_id(&slot, waiter.id)) {
        unblock(&w, &slot, answer);
    }
    for s in &slots {
        tidy(s);
        // The next waiter of each key: a retry of its owner is answered at
        // once; after an error, the key may be free for it.
        arm(s, now);
        multikey_soon(s);
    }
}

/// The lease on `name` got a new end (renewal, re-acquire): its waiters are
/// re-checked then, not at the old deadline.
/// (Nobody waits anywhere, as on most renewals: one load, no call.)
#[inline]
pub fn lease_ends_at(ctx: Ctx, name: Str, end_ms: i64) {
    if total() > 0 {
        rearm_at(ctx, name, end_ms);
    }
}

#[inline(never)]
fn rearm_at(ctx: Ctx, name: Str, end_ms: i64) {
    let slot = slot_of(ctx, name);
    if waiting(&slot) > 0 {
        arm(&slot, end_ms + 1);
    }
}

/// The reply callback of an unblocked waiter.
pub fn on_reply(ctx: Ctx, data: Option<&mut Unblocked>) {
    match data {
        Some(u) => {
            u.replied = true;
            let answer = match &u.answer {
                Answer::Token(t) => Ok(Reply::Int(*t as i64)),
                Answer::Null => Ok(Reply::Null),
                Answer::Error(e) => Err(e.clone()),
            };
            reply::send(ctx, answer);
        }
        None => reply::send(ctx, Ok(Reply::Null)),
    }
}

/// The server timed the waiter out: only `CLIENT UNBLOCK` does (the module
/// blocks with timeout 0 and times out its waiters itself).
pub fn on_server_timeout(ctx: Ctx, bc: Handle) {
    if reg(|r| r.remove(&bc)).is_some_and(|(slot, w)| {
        counters::record_waited(now_ms() - w.arrived_ms);
        for slot in w.slots(&slot) {
            tidy(&slot);
            // As after a timeout: the ones behind it may be served now.
            arm(&slot, now_ms());
        }
        true
    }) {
        STATS.wait_timeouts.incr();
        blocked::release(bc);
    }
    reply::send(ctx, Ok(Reply::Null));
}

/// A waiter's client disconnected.
pub fn on_disconnect(bc: Handle) {
    if let Some((slot, w)) = reg(|r| r.remove(&bc)) {
        blocked::release(bc);
        for slot in w.slots(&slot) {
            tidy(&slot);
            // As after a timeout: the ones behind it may be served now.
            arm(&slot, now_ms());
        }
    }
}

/// Frees a waiter's answer. A waiter that disconnected between being served
/// and getting its reply never learnt its token: its lease is given back
/// (deleted and handed to the next waiter) by a 0 ms timer.
pub fn on_free(data: Unblocked) {
    if let (false, Answer::Token(token)) = (data.replied, &data.answer) {
        for slot in data.slots {
            timers::start(0, TimerJob::Revoke(slot, data.owner.clone(), *token));
        }
    }
}

/// The revoke timer fired: deletes the lease nobody learnt of, if it is
/// still there, and serves the next waiter.
pub fn on_revoke(ctx: Ctx, slot: Slot, owner: Box<[u8]>, token: u64) {
    if !ctx.select_db(slot.0) {
        return;
    }
    let name = ctx.string(&slot.1);
    let still_there = Reader::open(ctx, name.as_str())
        .record()
        .ok()
        .and_then(|r| ops::revoke(r, &owner, token))
        .is_some();
    if !still_there {
        tidy(&slot);
        return;
    }
    match KeyWriter::for_module(ctx, name.as_str()) {
        Ok(mut w) => {
            if let Some(c) = w.record().ok().and_then(|r| ops::revoke(r, &owner, token)) {
                w.commit(&c);
            }
            serve(&slot, &mut w, snapshot(ctx));
        }
        Err(closed) => {
            if let Some(ms) = closed.retry_in_ms() {
                timers::start(ms, TimerJob::Revoke(slot.clone(), owner, token));
            }
        }
    }
    tidy(&slot);
}

/// A lease key named `key` left the keyspace in some database (DEL, UNLINK,
/// RENAME, expiry, overwrite), or its expiry changed: re-check its queues
/// right after the command.
pub fn key_changed(key: &[u8]) {
    if total() == 0 {
        return; // nobody waits anywhere (queues without waiters are dropped)
    }
    for slot in reg(|r| r.slots_named(key)) {
        arm(&slot, 0);
    }
}

/// Re-checks every queue right away (FLUSHALL/FLUSHDB freed keys without
/// unlinking them; a grace period ended).
pub fn recheck_all() {
    for slot in reg(|r| r.slots()) {
        arm(&slot, 0);
    }
}

/// SWAPDB exchanged two databases: re-check their queues.
pub fn on_swapdb(a: i32, b: i32) {
    for slot in reg(|r| r.slots()) {
        if slot.0 == a || slot.0 == b {
            arm(&slot, 0);
        }
    }
}
