//! The LEASE.* command handlers: parse (crate::lease::args), read the key,
//! decide (crate::lease::decide), then apply, replicate, notify and count.

use std::ffi::CString;

use redis_module::raw;

use crate::lease::args::{self, check_owner, parse_acquire_options, parse_token, parse_ttl};
use crate::lease::decide::{self, Acquire};
use crate::lease::{Lease, LeaseError};

use super::entry::Args;
use super::key::{LeaseKey, Mode};
use super::registry::APPLY;
use super::reply::Reply;
use super::state::{self, STATS};
use super::waiters;

type Ctx = *mut raw::RedisModuleCtx;

/// Sends `event` for `key` to keyspace-notification subscribers (class `d`,
/// module events).
pub fn notify(ctx: Ctx, event: &'static std::ffi::CStr, key: *mut raw::RedisModuleString) {
    // SAFETY: ctx and key belong to the running command.
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx,
            raw::REDISMODULE_NOTIFY_MODULE,
            event.as_ptr(),
            key,
        );
    }
}

/// Replicates the full state of a lease as an effect: replicas and the AOF
/// get the exact token and absolute deadline, never a clock-dependent command.
pub fn replicate_state(ctx: Ctx, key: *mut raw::RedisModuleString, lease: &Lease) {
    let cmd = CString::new(APPLY).expect("no NUL");
    // SAFETY: format "sbll" matches a RedisModuleString, a buffer with its
    // length and two long longs.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx,
            cmd.as_ptr(),
            c"sbll".as_ptr(),
            key,
            lease.owner.as_ptr(),
            lease.owner.len(),
            lease.token as i64,
            lease.deadline_ms,
        );
    }
}

/// Replicates the deletion of a lease key.
pub fn replicate_delete(ctx: Ctx, key: *mut raw::RedisModuleString) {
    // SAFETY: format "s" matches one RedisModuleString.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(ctx, c"DEL".as_ptr(), c"s".as_ptr(), key);
    }
}

/// Stores a new lease in `key` (named `name`): replicated as an effect,
/// notified and counted like every acquisition. Returns its token.
pub fn create(ctx: Ctx, key: &LeaseKey, name: *mut raw::RedisModuleString, lease: Lease) -> u64 {
    let token = lease.token;
    replicate_state(ctx, name, &lease);
    key.set(lease);
    STATS.acquired.incr();
    notify(ctx, c"lease.acquire", name);
    token
}

/// Moves the deadline of the lease held in `key` (a renewal or an
/// idempotent re-acquire): record, key TTL, replication, notification.
fn extend(
    ctx: Ctx,
    key: &mut LeaseKey,
    name: *mut raw::RedisModuleString,
    deadline_ms: i64,
) -> Result<(), LeaseError> {
    let lease = key
        .get()?
        .ok_or_else(|| LeaseError::Internal("the lease to extend is gone".into()))?;
    lease.deadline_ms = deadline_ms;
    replicate_state(ctx, name, lease);
    key.set_deadline(deadline_ms);
    notify(ctx, c"lease.renew", name);
    Ok(())
}

/// LEASE.ACQUIRE key owner ttl-ms [BLOCK timeout-ms]
pub fn acquire(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 4 {
        return Err(LeaseError::Arity("lease.acquire"));
    }
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), state::max_ttl_ms())?;
    let opts = parse_acquire_options(&a.rest(4))?;
    let name = a.handle(1);
    let slot = (waiters::selected_db(ctx), a.bytes(1).to_vec());
    let mut key = LeaseKey::open(ctx, name, Mode::Write);
    let now = state::now_ms();
    // A free lease with clients queued goes to the oldest of them first: a
    // newcomer never overtakes a waiter.
    if decide::live(key.get()?.as_deref(), now).is_none() && waiters::waiting(&slot) > 0 {
        waiters::serve(ctx, &slot, name, &key);
    }
    let current = key.get()?;
    let decision =
        state::with_clock(|clock| decide::acquire(current.as_deref(), owner, ttl, now, clock))?;
    match decision {
        Acquire::Created(lease) => Ok(Reply::Int(create(ctx, &key, name, lease) as i64)),
        Acquire::Reacquired { token, deadline_ms } => {
            extend(ctx, &mut key, name, deadline_ms)?;
            STATS.reacquired.incr();
            Ok(Reply::Int(token as i64))
        }
        Acquire::Contended => match opts.block_ms {
            Some(timeout) if waiters::may_block(ctx) => {
                // Re-check just after the holder's key expires.
                let recheck_at = current.map_or(now, |l| l.deadline_ms + 1);
                Ok(waiters::block(ctx, slot, owner, ttl, timeout, recheck_at))
            }
            _ => {
                STATS.contended.incr();
                Ok(Reply::Null)
            }
        },
    }
}

/// LEASE.RENEW key owner ttl-ms
pub fn renew(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 4 {
        return Err(LeaseError::Arity("lease.renew"));
    }
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), state::max_ttl_ms())?;
    let name = a.handle(1);
    let mut key = LeaseKey::open(ctx, name, Mode::Write);
    let now = state::now_ms();
    match decide::renew(key.get()?.as_deref(), owner, ttl, now) {
        Some(deadline_ms) => {
            extend(ctx, &mut key, name, deadline_ms)?;
            STATS.renewed.incr();
            Ok(Reply::Int(1))
        }
        None => {
            STATS.renew_failed.incr();
            Ok(Reply::Int(0))
        }
    }
}

/// LEASE.RELEASE key owner
pub fn release(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.release"));
    }
    let owner = check_owner(a.bytes(2))?;
    let name = a.handle(1);
    let mut key = LeaseKey::open(ctx, name, Mode::Write);
    if decide::release(key.get()?.as_deref(), owner, state::now_ms()) {
        key.delete();
        replicate_delete(ctx, name);
        STATS.released.incr();
        notify(ctx, c"lease.release", name);
        let slot = (waiters::selected_db(ctx), a.bytes(1).to_vec());
        waiters::serve(ctx, &slot, name, &key);
        Ok(Reply::Int(1))
    } else {
        STATS.release_failed.incr();
        Ok(Reply::Int(0))
    }
}

/// LEASE.FENCE key token [command [arg ...]]
pub fn fence(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 3 {
        return Err(LeaseError::Arity("lease.fence"));
    }
    let token = parse_token(a.bytes(2))?;
    if a.len() > 3 {
        return super::fence::fence_with_command(ctx, a, token);
    }
    let mut key = LeaseKey::open(ctx, a.handle(1), Mode::Read);
    match decide::fence(key.get()?.as_deref(), token, state::now_ms()) {
        Ok(()) => {
            STATS.fence_ok.incr();
            Ok(Reply::Ok)
        }
        Err(e) => {
            STATS.fence_stale.incr();
            Err(e)
        }
    }
}

/// LEASE.INFO key
pub fn info(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 2 {
        return Err(LeaseError::Arity("lease.info"));
    }
    let mut key = LeaseKey::open(ctx, a.handle(1), Mode::Read);
    Ok(match decide::info(key.get()?.as_deref(), state::now_ms()) {
        Some(view) => Reply::IntMap(vec![
            ("token", view.token as i64),
            ("ttl", view.ttl_ms),
            ("waiters", waiters::waiting_here(ctx, a) as i64),
        ]),
        None => Reply::Null,
    })
}

/// LEASE.APPLY key owner token deadline-ms (internal): sets the full state
/// of a lease, as replicated by the master and written to the AOF.
pub fn apply(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    // SAFETY: GetContextFlags only reads the context of the running command.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    if flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) == 0 {
        return Err(LeaseError::InternalOnly(APPLY));
    }
    if a.len() != 5 {
        return Err(LeaseError::Arity("lease.apply"));
    }
    let owner = check_owner(a.bytes(2))?;
    let token = parse_token(a.bytes(3))?;
    let deadline_ms = args::parse_unix_ms(a.bytes(4), "deadline-ms")?;
    let mut key = LeaseKey::open(ctx, a.handle(1), Mode::Write);
    if key.get().is_err() {
        key.delete();
    }
    state::observe_token(token);
    key.set(Lease {
        owner: owner.into(),
        token,
        deadline_ms,
    });
    // SAFETY: ctx is the running command's context.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx) };
    Ok(Reply::Ok)
}
