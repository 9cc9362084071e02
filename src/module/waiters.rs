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

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use redis_module::raw;

use crate::lease::decide::Held;
use crate::lease::waitq::{Slot, Step, WaitRegistry, Waiter};
use crate::lease::{Holder, Lease, LeaseError, Mode, RecordRef};

use super::ctx::{Ctx, Str};
use super::effects::{Closed, Reader, Writer};
use super::reply::{self, Reply};
use super::state::{self, STATS, TimerJob};
use super::waker;

/// A blocked client's handle, as an address (the registry is `Sync`).
type Handle = usize;
type TimerId = raw::RedisModuleTimerID;

/// How soon a closed gate is tried again: writes paused, other refusals.
const RETRY_PAUSED_MS: i64 = 10;
const RETRY_REFUSED_MS: i64 = 50;

struct Waiters {
    reg: WaitRegistry<Handle, TimerId>,
    /// The timer at the earliest BLOCK timeout, and when it fires.
    timeout_timer: Option<(TimerId, i64)>,
}

static WAITERS: Mutex<Option<Waiters>> = Mutex::new(None);
/// The registry's total, readable without the lock: the hot paths (acquire
/// on a free key, release) skip the registry when nobody waits anywhere.
static TOTAL: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on the registry. Never call into the server while inside `f`:
/// server calls can re-enter this module (the type's unlink callback).
fn with<R>(f: impl FnOnce(&mut Waiters) -> R) -> R {
    let mut guard = WAITERS.lock().unwrap_or_else(|e| e.into_inner());
    let w = guard.get_or_insert_with(|| Waiters {
        reg: WaitRegistry::default(),
        timeout_timer: None,
    });
    let out = f(w);
    let (before, after) = (TOTAL.load(Relaxed), w.reg.total());
    TOTAL.store(after, Relaxed);
    drop(guard);
    // The command filter that sees expiry commands on waited-for keys runs
    // only while someone waits: it costs every command of the server.
    if (before == 0) != (after == 0) {
        state::set_command_filter(after > 0);
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
pub fn slot_if_waiting(ctx: Ctx, name: Str) -> Option<Slot> {
    (total() > 0).then(|| (ctx.selected_db(), name.bytes().to_vec()))
}

/// Clients waiting on `slot`.
pub fn waiting(slot: &Slot) -> usize {
    reg(|r| r.len(slot))
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
    slot: Slot,
    owner: Box<[u8]>,
    replied: bool,
}

/// May this call block? Not inside MULTI/EXEC, scripts, or wherever the
/// server denies blocking (BLPOP's rule).
pub fn may_block(ctx: Ctx) -> bool {
    ctx.flags()
        & (raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}

/// Blocks the calling client until it gets the lease of `slot` in `mode`
/// or `timeout_ms` passes (0: forever). `recheck_at` is when the current
/// holder's time will have ended, to re-check the key then.
pub fn block(
    ctx: Ctx,
    slot: Slot,
    owner: &[u8],
    mode: Mode,
    ttl_ms: i64,
    timeout_ms: i64,
    recheck_at: i64,
) -> Reply {
    let hooks = state::hooks();
    // SAFETY: ctx is the running command's context; the callbacks match the
    // signatures BlockClient expects. Timeout 0: the module times out its
    // waiters itself.
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.raw(),
            hooks.reply,
            hooks.timeout,
            hooks.free_privdata,
            0,
        )
    };
    if bc.is_null() {
        return Reply::Null;
    }
    // SAFETY: bc was just returned by BlockClient.
    unsafe {
        if let Some(set_disconnect) = raw::RedisModule_SetDisconnectCallback {
            set_disconnect(bc, hooks.disconnect);
        }
    }
    let timeout_at = (timeout_ms > 0).then(|| state::now_ms() + timeout_ms);
    reg(|r| r.push(slot.clone(), bc as Handle, owner, mode, ttl_ms, timeout_at));
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
    let lead = at_ms - state::now_ms();
    if precise && lead > 0 && lead <= waker::LEAD_MS && waker::wake_at(at_ms, slot) {
        if let Some(old) = reg(|r| r.set_timer(slot, None)) {
            state::stop_timer(old);
        }
        return;
    }
    let delay = if precise && lead > waker::LEAD_MS {
        lead - waker::LEAD_MS
    } else {
        lead
    };
    let Some(id) = state::start_timer(delay, TimerJob::Recheck(slot.clone())) else {
        return;
    };
    if let Some(old) = reg(|r| r.set_timer(slot, Some(id))) {
        state::stop_timer(old);
    }
}

/// The waker thread says a re-check of `slot` is due: it runs now, from a
/// 0 ms timer (with a context of its own).
pub fn on_wake(slot: Slot) {
    arm(&slot, state::now_ms());
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
        state::stop_timer(id);
    }
    let timer = next.and_then(|at| {
        state::start_timer(at - state::now_ms(), TimerJob::Timeouts).map(|id| (id, at))
    });
    with(|w| w.timeout_timer = timer);
}

/// The timeout timer fired: answers null to every waiter whose timeout has
/// passed.
pub fn on_timeouts() {
    with(|w| w.timeout_timer = None);
    let due = reg(|r| r.take_timed_out(state::now_ms()));
    for (slot, w) in due {
        STATS.wait_timeouts.incr();
        unblock(&w, &slot, Answer::Null);
        tidy(&slot);
    }
    arm_timeouts();
}

/// Drops the queue of `slot` when nobody waits there any more.
fn tidy(slot: &Slot) {
    if let Some(timer) = reg(|r| r.forget_if_empty(slot)) {
        state::stop_timer(timer);
    }
}

/// What a re-check timer finds on a key.
enum Found {
    /// Held until then (nothing can be served before).
    HeldUntil(i64),
    /// Something may be served: ended holders leave, waiters are served.
    Serve,
}

/// A re-check timer fired: looks at the key of `slot` and serves its
/// waiters if the lease is free (or a place of a counting or shared lease
/// may be), or re-arms the timer at the next end of a holding.
pub fn on_recheck(ctx: Ctx, slot: Slot) {
    reg(|r| r.set_timer(&slot, None));
    if !ctx.select_db(slot.0) {
        fail_all(&slot, LeaseError::Internal("database is gone".into()));
        tidy(&slot);
        return;
    }
    let name = ctx.string(&slot.1);
    let now = state::now_ms();
    let found = {
        let mut r = Reader::open(ctx, name.as_str());
        let expire = r.expire_at();
        r.record().map(|record| match record {
            // A full LIMIT key whose holders are all within their time.
            Some(RecordRef::Multi(m)) if !m.has_room(now) => Held::Multi(m)
                .next_end(expire, now)
                .map_or(Found::Serve, Found::HeldUntil),
            Some(RecordRef::Multi(_)) => Found::Serve,
            record => Held::of(record, now)
                .next_end(expire, now)
                .map_or(Found::Serve, Found::HeldUntil),
        })
    };
    match found {
        Err(e) => fail_all(&slot, e),
        // The key expires once the clock passes its deadline.
        Ok(Found::HeldUntil(end)) => arm(&slot, end + 1),
        Ok(Found::Serve) => match Writer::open_gated(ctx, name.as_str()) {
            Ok(mut w) => serve(&slot, &mut w),
            Err(closed) => gate_closed(&slot, closed, now),
        },
    }
    tidy(&slot);
}

/// What a closed gate does to the waiters of `slot`.
fn gate_closed(slot: &Slot, closed: Closed, now: i64) {
    match closed {
        Closed::Paused => arm_plain(slot, now + RETRY_PAUSED_MS),
        Closed::Refused => arm_plain(slot, now + RETRY_REFUSED_MS),
        Closed::Moved(to) => fail_all(slot, LeaseError::Redirect(to)),
    }
}

/// Answers every waiter of `slot` with `err` (the key now holds another
/// type, or its slot moved).
fn fail_all(slot: &Slot, err: LeaseError) {
    for w in reg(|r| r.drain(slot)) {
        unblock(&w, slot, Answer::Error(err.clone()));
    }
}

fn unblock(w: &Waiter<Handle>, slot: &Slot, answer: Answer) {
    let data = Box::new(Unblocked {
        answer,
        slot: slot.clone(),
        owner: w.owner.clone(),
        replied: false,
    });
    // SAFETY: w.handle is a blocked client still waiting (it leaves the
    // registry when answered, timed out or disconnected); the server passes
    // the privdata to the reply callback and then the free callback.
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(
            w.handle as *mut raw::RedisModuleBlockedClient,
            Box::into_raw(data).cast(),
        );
    }
}

/// Serves the waiters of `slot` on the key `w` has open, oldest first:
/// holders past their deadline leave (a bounded batch, see
/// `Writer::prune`), then each step
/// of `WaitRegistry::grant_next` is stored, replicated and notified like
/// any acquisition (a new lease, or one more holder of a counting or shared
/// lease, with a new token), until the oldest waiter must wait. Waiters
/// with the same owner (a client's retries) get the same token, as a
/// re-acquire would.
pub fn serve(slot: &Slot, w: &mut Writer) {
    let now = state::now_ms();
    w.prune(now);
    // No new lease during a grace period (SPEC S7): the queue waits for its
    // end, when every queue is re-checked.
    if let Some(end) = state::grace_ends_at(now) {
        arm(slot, end);
        return;
    }
    // A key the server expired within its lease's last millisecond (Redis
    // 8.2): nothing is handed over before that millisecond has passed.
    if w.held(now).is_ok_and(|h| h.is_free())
        && let Some(end) = super::datatype::ended_early(slot.0, &slot.1)
    {
        arm(slot, end + 1);
        return;
    }
    // Each step answers at least one waiter, so this ends after at most
    // as many steps as there are waiters.
    for _ in 0..=waiting(slot) {
        let Ok(held) = w.held(now) else { break };
        let Some(step) = state::with_clock(|clock| reg(|r| r.grant_next(slot, held, now, clock)))
        else {
            break;
        };
        apply_step(slot, w, step, now);
    }
    let expire = w.expire_at();
    if let Ok(held) = w.held(now)
        && let Some(end) = held.next_end(expire, now)
    {
        arm(slot, end + 1);
    }
}

/// Stores one step of serving a queue and answers its waiters.
fn apply_step(slot: &Slot, w: &mut Writer, step: Step<Handle>, now: i64) {
    match step {
        Step::Grant {
            mode,
            owner,
            token,
            deadline_ms,
            waiters,
            refused,
        } => {
            match mode.multi() {
                None => {
                    w.create(Lease::new(&owner, token, deadline_ms), None);
                }
                Some(m) => {
                    w.add_holder(
                        m,
                        Holder {
                            owner,
                            token,
                            deadline_ms,
                        },
                        None,
                        now,
                    );
                }
            }
            for (i, waiter) in waiters.iter().enumerate() {
                if i > 0 {
                    STATS.reacquired.incr();
                }
                unblock(waiter, slot, Answer::Token(token));
            }
            for (waiter, e) in refused {
                unblock(&waiter, slot, Answer::Error(e));
            }
        }
        Step::Reacquired {
            owner,
            token,
            deadline_ms,
            waiters,
            refused,
        } => {
            let moved = match w.record() {
                Ok(Some(RecordRef::Multi(_))) => w.extend_holder(&owner, deadline_ms, None),
                _ => w.extend(deadline_ms, None),
            };
            for waiter in &waiters {
                let answer = match &moved {
                    Ok(()) => {
                        STATS.reacquired.incr();
                        Answer::Token(token)
                    }
                    Err(e) => Answer::Error(e.clone()),
                };
                unblock(waiter, slot, answer);
            }
            for (waiter, e) in refused {
                unblock(&waiter, slot, Answer::Error(e));
            }
        }
        Step::Refused { waiter, error } => unblock(&waiter, slot, Answer::Error(error)),
    }
}

/// The lease on `name` got a new end (renewal, re-acquire): its waiters are
/// re-checked then, not at the old deadline.
pub fn lease_ends_at(ctx: Ctx, name: Str, end_ms: i64) {
    if let Some(slot) = slot_if_waiting(ctx, name)
        && waiting(&slot) > 0
    {
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
    if reg(|r| r.remove(&bc)).is_some_and(|(slot, _)| {
        tidy(&slot);
        true
    }) {
        STATS.wait_timeouts.incr();
        release_handle(bc);
    }
    reply::send(ctx, Ok(Reply::Null));
}

/// Gives a waiter's handle back to the server. A client blocked with
/// RedisModule_BlockClient that is unblocked by `CLIENT UNBLOCK` or
/// disconnects is freed only when the module unblocks it (with no answer:
/// the timeout callback replied, or nobody is listening); without this,
/// each such wait leaks the handle and its reply buffer.
fn release_handle(bc: Handle) {
    // SAFETY: bc was just taken out of the registry, so it was never
    // unblocked before, and the server has not freed it yet.
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(
            bc as *mut raw::RedisModuleBlockedClient,
            std::ptr::null_mut(),
        );
    }
}

/// A waiter's client disconnected.
pub fn on_disconnect(bc: Handle) {
    if let Some((slot, _)) = reg(|r| r.remove(&bc)) {
        tidy(&slot);
        release_handle(bc);
    }
}

/// Frees a waiter's answer. A waiter that disconnected between being served
/// and getting its reply never learnt its token: its lease is given back
/// (deleted and handed to the next waiter) by a 0 ms timer.
pub fn on_free(data: Unblocked) {
    if let (false, Answer::Token(token)) = (data.replied, &data.answer) {
        state::start_timer(
            0,
            TimerJob::Revoke(data.slot.clone(), data.owner.clone(), *token),
        );
    }
}

/// The revoke timer fired: deletes the lease nobody learnt of, if it is
/// still there, and serves the next waiter.
pub fn on_revoke(ctx: Ctx, slot: Slot, owner: Box<[u8]>, token: u64) {
    if !ctx.select_db(slot.0) {
        return;
    }
    let name = ctx.string(&slot.1);
    let still_there = match Reader::open(ctx, name.as_str()).record() {
        Ok(Some(RecordRef::Exclusive(l))) if l.token == token && l.is_held_by(&owner) => {
            Some(false)
        }
        Ok(Some(RecordRef::Multi(m))) if m.holder(&owner).is_some_and(|h| h.token == token) => {
            Some(true)
        }
        _ => None,
    };
    let Some(multi) = still_there else {
        tidy(&slot);
        return;
    };
    match Writer::open_gated(ctx, name.as_str()) {
        Ok(mut w) => {
            if multi {
                w.revoke_holder(&owner);
            } else {
                w.revoke();
            }
            serve(&slot, &mut w);
        }
        Err(Closed::Moved(_)) => {}
        Err(closed) => {
            let retry = if closed == Closed::Paused {
                RETRY_PAUSED_MS
            } else {
                RETRY_REFUSED_MS
            };
            state::start_timer(retry, TimerJob::Revoke(slot.clone(), owner, token));
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
