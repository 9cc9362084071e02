//! Blocking acquire (`LEASE.ACQUIRE ... BLOCK`): clients blocked with
//! RedisModule_BlockClient in a per-key FIFO queue (crate::lease::waitq),
//! served one at a time when the lease becomes free: inside RELEASE, by a
//! timer at the holder's deadline (expiry), and by a 0 ms timer after a
//! lease key leaves the keyspace (DEL, UNLINK, RENAME, active expiry,
//! FLUSHDB). RedisModule_BlockClientOnKeys is not used: on Redis 7.0 it does
//! not wake clients when a key is deleted.

use std::os::raw::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use redis_module::raw;

use crate::lease::decide;
use crate::lease::waitq::{Slot, WaitRegistry, Waiter};
use crate::lease::{Lease, LeaseError};

use super::commands::{create, notify, replicate_delete};
use super::entry::{Args, guard};
use super::key::{LeaseKey, Mode};
use super::reply::{self, Reply};
use super::state::{self, STATS};

type Ctx = *mut raw::RedisModuleCtx;
/// A blocked client's handle, as an address (the registry is `Sync`).
type Handle = usize;

static REGISTRY: Mutex<Option<WaitRegistry<Handle, raw::RedisModuleTimerID>>> = Mutex::new(None);
/// `REGISTRY`'s total, readable without the lock: the hot paths (acquire on
/// a free key, release) skip the registry when nobody waits anywhere.
static TOTAL: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on the registry. Never call into the server while inside `f`:
/// server calls can re-enter this module (the type's unlink callback).
fn reg<R>(f: impl FnOnce(&mut WaitRegistry<Handle, raw::RedisModuleTimerID>) -> R) -> R {
    let mut guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let r = guard.get_or_insert_with(WaitRegistry::default);
    let out = f(r);
    TOTAL.store(r.total(), Relaxed);
    out
}

/// Clients waiting on every key.
pub fn total() -> usize {
    TOTAL.load(Relaxed)
}

/// The queue of the key argument `i` of this command, when any client
/// waits anywhere (`None` otherwise: nothing to look up).
pub fn slot_if_waiting(ctx: Ctx, a: &Args, i: usize) -> Option<Slot> {
    (total() > 0).then(|| (selected_db(ctx), a.bytes(i).to_vec()))
}

/// Clients waiting on `slot`.
pub fn waiting(slot: &Slot) -> usize {
    reg(|r| r.len(slot))
}

/// The database the command runs in.
pub fn selected_db(ctx: Ctx) -> i32 {
    // SAFETY: reads the context of the running command.
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) }
}

/// What a served waiter is answered.
struct Granted {
    outcome: Result<u64, LeaseError>,
    slot: Slot,
    owner: Box<[u8]>,
    replied: bool,
}

/// May this call block? Not inside MULTI/EXEC, scripts, or wherever the
/// server denies blocking (BLPOP's rule).
pub fn may_block(ctx: Ctx) -> bool {
    let f = state::ctx_flags(ctx);
    f & (raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}

/// Blocks the calling client until it gets the lease of `slot` or
/// `timeout_ms` passes (0: forever). `recheck_at` is when the current
/// lease's key will have expired, to re-check the key then.
pub fn block(
    ctx: Ctx,
    slot: Slot,
    owner: &[u8],
    ttl_ms: i64,
    timeout_ms: i64,
    recheck_at: i64,
) -> Reply {
    // SAFETY: ctx is the running command's context; the callbacks match the
    // signatures BlockClient expects.
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx,
            Some(reply_cb),
            Some(timeout_cb),
            Some(free_cb),
            timeout_ms,
        )
    };
    if bc.is_null() {
        return Reply::Null;
    }
    // SAFETY: bc was just returned by BlockClient.
    unsafe {
        if let Some(set_disconnect) = raw::RedisModule_SetDisconnectCallback {
            set_disconnect(bc, Some(disconnect_cb));
        }
    }
    reg(|r| r.push(slot.clone(), bc as Handle, owner, ttl_ms));
    arm(&slot, recheck_at);
    Reply::Sent
}

/// (Re)schedules the re-check of `slot` at `at_ms`, replacing its timer.
fn arm(slot: &Slot, at_ms: i64) {
    let ctx = state::detached();
    if ctx.is_null() || waiting(slot) == 0 {
        return;
    }
    let delay = (at_ms - state::now_ms()).max(0);
    let data = Box::into_raw(Box::new(slot.clone())) as *mut c_void;
    // SAFETY: CreateTimer on the main thread with the module's detached
    // context; `data` is freed by the timer callback or by `stop`.
    let id = unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(timer_cb), data) };
    if let Some(old) = reg(|r| r.set_timer(slot, Some(id))) {
        stop(old);
    }
}

fn stop(timer: raw::RedisModuleTimerID) {
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: StopTimer hands back the data of a pending timer, which is a
    // Box<Slot> made in `arm`.
    unsafe {
        if raw::RedisModule_StopTimer.unwrap()(state::detached(), timer, &mut data)
            == raw::REDISMODULE_OK as c_int
            && !data.is_null()
        {
            drop(Box::from_raw(data as *mut Slot));
        }
    }
}

/// Drops the queue of `slot` when nobody waits there any more.
fn tidy(slot: &Slot) {
    if let Some(timer) = reg(|r| r.forget_if_empty(slot)) {
        stop(timer);
    }
}

unsafe extern "C" fn timer_cb(ctx: Ctx, data: *mut c_void) {
    guard("the waiter timer", (), || {
        // SAFETY: data is the Box<Slot> made in `arm`; this timer fired, so
        // it was not stopped and nobody else frees it.
        let slot = *unsafe { Box::from_raw(data as *mut Slot) };
        reg(|r| r.set_timer(&slot, None));
        recheck(ctx, &slot);
    })
}

/// Looks at the key of `slot` and serves its oldest waiter if the lease is
/// free, or re-arms the timer at the holder's deadline.
fn recheck(ctx: Ctx, slot: &Slot) {
    if state::ctx_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 {
        return; // the master serves waiters and replicates the result
    }
    let opened = with_key(ctx, slot, |key, name| match key.get() {
        Err(e) => fail_all(slot, e),
        Ok(current) => match decide::live(current.as_deref(), state::now_ms()) {
            // The key expires once the clock passes its deadline.
            Some(held) => arm(slot, held.deadline_ms + 1),
            None => serve(ctx, slot, name, key),
        },
    });
    if opened.is_none() {
        fail_all(slot, LeaseError::Internal("database is gone".into()));
    }
    tidy(slot);
}

/// Opens the key of `slot` for writing in a timer's context (selecting its
/// database) and runs `f` on it with its name; `None` if the database
/// cannot be selected.
fn with_key<R>(
    ctx: Ctx,
    slot: &Slot,
    f: impl FnOnce(&mut LeaseKey, *mut raw::RedisModuleString) -> R,
) -> Option<R> {
    // SAFETY: SelectDb, then a key name created on this context and freed
    // after the key (which borrows it) is closed.
    unsafe {
        if raw::RedisModule_SelectDb.unwrap()(ctx, slot.0) != raw::REDISMODULE_OK as c_int {
            return None;
        }
        let name =
            raw::RedisModule_CreateString.unwrap()(ctx, slot.1.as_ptr().cast(), slot.1.len());
        let out = {
            let mut key = LeaseKey::open(ctx, name, Mode::Write);
            f(&mut key, name)
        };
        raw::RedisModule_FreeString.unwrap()(ctx, name);
        Some(out)
    }
}

/// Answers every waiter of `slot` with `err` (the key now holds another type).
fn fail_all(slot: &Slot, err: LeaseError) {
    for w in reg(|r| r.drain(slot)) {
        unblock(&w, slot, Err(err.clone()));
    }
}

fn unblock(w: &Waiter<Handle>, slot: &Slot, outcome: Result<u64, LeaseError>) {
    let granted = Box::new(Granted {
        outcome,
        slot: slot.clone(),
        owner: w.owner.clone(),
        replied: false,
    });
    // SAFETY: w.handle is a blocked client still waiting (it leaves the
    // registry on timeout and disconnect); the server passes the privdata to
    // reply_cb and then free_cb, which frees it.
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(
            w.handle as *mut raw::RedisModuleBlockedClient,
            Box::into_raw(granted).cast(),
        );
    }
}

/// Hands the free lease on `key` (named `name`) to the oldest waiter of
/// `slot`, if any: a new lease with a new token, stored, replicated and
/// notified like any acquisition.
pub fn serve(ctx: Ctx, slot: &Slot, name: *mut raw::RedisModuleString, key: &LeaseKey) {
    let Some(w) = reg(|r| r.pop_oldest(slot)) else {
        return;
    };
    let now = state::now_ms();
    let Some(token) = state::with_clock(|c| c.issue(now)) else {
        unblock(&w, slot, Err(LeaseError::TokensExhausted));
        return;
    };
    let lease = Lease {
        owner: w.owner.clone(),
        token,
        deadline_ms: now + w.ttl_ms,
    };
    let deadline = lease.deadline_ms;
    create(ctx, key, name, None, lease);
    unblock(&w, slot, Ok(token));
    arm(slot, deadline + 1);
}

unsafe extern "C" fn reply_cb(
    ctx: Ctx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("the waiter reply", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: the privdata is the Box<Granted> given to UnblockClient.
        let granted =
            unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) } as *mut Granted;
        if let Some(g) = unsafe { granted.as_mut() } {
            g.replied = true;
            reply::send(ctx, g.outcome.clone().map(|t| Reply::Int(t as i64)));
        } else {
            reply::send(ctx, Ok(Reply::Null));
        }
        raw::REDISMODULE_OK as c_int
    })
}

unsafe extern "C" fn timeout_cb(
    ctx: Ctx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("the waiter timeout", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: reads the blocked client handle of this callback's context.
        let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) } as Handle;
        if let Some((slot, _)) = reg(|r| r.remove(&bc)) {
            STATS.wait_timeouts.incr();
            tidy(&slot);
            release_handle(bc);
        }
        reply::send(ctx, Ok(Reply::Null));
        raw::REDISMODULE_OK as c_int
    })
}

/// Gives a waiter's handle back to the server. A client blocked with
/// RedisModule_BlockClient that times out or disconnects is freed only when
/// the module unblocks it (with no answer: the timeout callback replied, or
/// nobody is listening); without this, each such wait leaks the handle and
/// its reply buffer.
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

unsafe extern "C" fn disconnect_cb(_ctx: Ctx, bc: *mut raw::RedisModuleBlockedClient) {
    guard("the waiter disconnect", (), || {
        if let Some((slot, _)) = reg(|r| r.remove(&(bc as Handle))) {
            tidy(&slot);
            release_handle(bc as Handle);
        }
    })
}

/// Frees a served waiter's answer. A waiter that disconnected between being
/// served and getting its reply never learnt its token: its lease is given
/// back (deleted and handed to the next waiter) by a 0 ms timer.
unsafe extern "C" fn free_cb(_ctx: Ctx, privdata: *mut c_void) {
    guard("the waiter free", (), || {
        if privdata.is_null() {
            return;
        }
        // SAFETY: privdata is the Box<Granted> given to UnblockClient.
        let g = unsafe { Box::from_raw(privdata as *mut Granted) };
        if let (false, Ok(token)) = (g.replied, &g.outcome) {
            let revoke = Box::new((g.slot.clone(), g.owner.clone(), *token));
            // SAFETY: CreateTimer with the detached context; revoke_cb frees the box.
            unsafe {
                raw::RedisModule_CreateTimer.unwrap()(
                    state::detached(),
                    0,
                    Some(revoke_cb),
                    Box::into_raw(revoke).cast(),
                );
            }
        }
    })
}

unsafe extern "C" fn revoke_cb(ctx: Ctx, data: *mut c_void) {
    guard("the waiter revoke", (), || {
        // SAFETY: data is the box made in free_cb.
        let (slot, owner, token) = *unsafe { Box::from_raw(data as *mut (Slot, Box<[u8]>, u64)) };
        with_key(ctx, &slot, |key, name| {
            if matches!(key.get(), Ok(Some(l)) if l.token == token && l.is_held_by(&owner)) {
                key.delete();
                replicate_delete(ctx, name);
                notify(ctx, c"lease.release", name);
                serve(ctx, &slot, name, key);
            }
        });
        tidy(&slot);
    })
}

/// A lease key named `key` left the keyspace in some database (DEL, UNLINK,
/// RENAME, expiry, overwrite): re-check its queues right after the command.
pub fn key_removed(key: &[u8]) {
    if total() == 0 {
        return; // nobody waits anywhere (queues without waiters are dropped)
    }
    for slot in reg(|r| r.slots_named(key)) {
        arm(&slot, 0);
    }
}

unsafe extern "C" fn flush_cb(
    _ctx: Ctx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the flush event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            for slot in reg(|r| r.slots()) {
                arm(&slot, 0);
            }
        }
    })
}

/// Subscribes to FLUSHALL/FLUSHDB, which free keys without unlinking them.
pub fn subscribe_events(ctx: &redis_module::Context) {
    // SAFETY: called during OnLoad; the event struct is the one the API
    // defines for FlushDB.
    unsafe {
        if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
            subscribe(
                ctx.ctx,
                raw::RedisModuleEvent {
                    id: raw::REDISMODULE_EVENT_FLUSHDB,
                    dataver: 1,
                },
                Some(flush_cb),
            );
        }
    }
}

/// Helper for LEASE.INFO: waiters on the key of this command.
pub fn waiting_here(ctx: Ctx, a: &Args) -> usize {
    slot_if_waiting(ctx, a, 1).map_or(0, |slot| waiting(&slot))
}
