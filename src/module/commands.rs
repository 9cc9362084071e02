//! The LEASE.* command handlers: parse (crate::lease::args), read the key,
//! decide (crate::lease::decide), then apply, replicate, notify and count.

use redis_module::raw;

use crate::lease::args::{self, check_owner, parse_acquire_options, parse_token, parse_ttl};
use crate::lease::decide::{self, Acquire};
use crate::lease::{Lease, LeaseError};

use super::entry::Args;
use super::key::{LeaseKey, Mode};
use super::registry::{APPLY, APPLY_CMD};
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
/// `owner_arg` is the owner as a command argument, when there is one (no
/// copy is made of it).
pub fn replicate_state(
    ctx: Ctx,
    key: *mut raw::RedisModuleString,
    owner_arg: Option<*mut raw::RedisModuleString>,
    lease: &Lease,
) {
    let cmd = APPLY_CMD;
    debug_assert_eq!(cmd.to_bytes(), APPLY.as_bytes());
    let (token, deadline) = (lease.token as i64, lease.deadline_ms);
    // SAFETY: the formats match the arguments: "ssll" two
    // RedisModuleStrings and two long longs; "sbll" a RedisModuleString, a
    // buffer with its length, two long longs.
    unsafe {
        let replicate = raw::RedisModule_Replicate.unwrap();
        match owner_arg {
            Some(owner) => replicate(
                ctx,
                cmd.as_ptr(),
                c"ssll".as_ptr(),
                key,
                owner,
                token,
                deadline,
            ),
            None => replicate(
                ctx,
                cmd.as_ptr(),
                c"sbll".as_ptr(),
                key,
                lease.owner.as_ptr(),
                lease.owner.len(),
                token,
                deadline,
            ),
        };
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
pub fn create(
    ctx: Ctx,
    key: &LeaseKey,
    name: *mut raw::RedisModuleString,
    owner_arg: Option<*mut raw::RedisModuleString>,
    lease: Lease,
) -> u64 {
    let token = lease.token;
    replicate_state(ctx, name, owner_arg, &lease);
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
    owner_arg: *mut raw::RedisModuleString,
    deadline_ms: i64,
) -> Result<(), LeaseError> {
    let lease = key
        .get()?
        .ok_or_else(|| LeaseError::Internal("the lease to extend is gone".into()))?;
    lease.deadline_ms = deadline_ms;
    replicate_state(ctx, name, Some(owner_arg), lease);
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
    let mut key = LeaseKey::open(ctx, name, Mode::Write);
    let now = state::now_ms();
    // A free lease with clients queued goes to the oldest of them first: a
    // newcomer never overtakes a waiter.
    if let Some(slot) = waiters::slot_if_waiting(ctx, a, 1)
        && decide::live(key.get()?.as_deref(), now).is_none()
        && waiters::waiting(&slot) > 0
    {
        waiters::serve(ctx, &slot, name, &key);
    }
    let current = key.get()?;
    let decision =
        state::with_clock(|clock| decide::acquire(current.as_deref(), owner, ttl, now, clock))?;
    match decision {
        Acquire::Created(lease) => Ok(Reply::Int(
            create(ctx, &key, name, Some(a.handle(2)), lease) as i64,
        )),
        Acquire::Reacquired { token, deadline_ms } => {
            extend(ctx, &mut key, name, a.handle(2), deadline_ms)?;
            STATS.reacquired.incr();
            Ok(Reply::Int(token as i64))
        }
        Acquire::Contended => match opts.block_ms {
            Some(timeout) if waiters::may_block(ctx) => {
                // Re-check just after the holder's key expires.
                let recheck_at = current.map_or(now, |l| l.deadline_ms + 1);
                let slot = (waiters::selected_db(ctx), a.bytes(1).to_vec());
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
            extend(ctx, &mut key, name, a.handle(2), deadline_ms)?;
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
///
/// Replicated verbatim: on a replica and in AOF replay (where the clock must
/// not decide) it deletes the lease when `owner` holds it, live or not, as
/// the master did.
pub fn release(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.release"));
    }
    let owner = check_owner(a.bytes(2))?;
    let name = a.handle(1);
    let mut key = LeaseKey::open(ctx, name, Mode::Write);
    if is_effect(ctx) {
        return Ok(Reply::Int(
            if decide::release_effect(key.get()?.as_deref(), owner) {
                key.delete();
                replicate_verbatim(ctx);
                1
            } else {
                0
            },
        ));
    }
    if decide::release(key.get()?.as_deref(), owner, state::now_ms()) {
        key.delete();
        replicate_verbatim(ctx);
        STATS.released.incr();
        notify(ctx, c"lease.release", name);
        if let Some(slot) = waiters::slot_if_waiting(ctx, a, 1) {
            waiters::serve(ctx, &slot, name, &key);
        }
        Ok(Reply::Int(1))
    } else {
        STATS.release_failed.incr();
        Ok(Reply::Int(0))
    }
}

/// Is this call an effect to apply (from the master link or the AOF)
/// rather than a client's request?
fn is_effect(ctx: Ctx) -> bool {
    state::ctx_flags(ctx)
        & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING)
        != 0
}

fn replicate_verbatim(ctx: Ctx) {
    // SAFETY: ctx is the running command's context.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx) };
}

/// LEASE.FENCE key token [command [arg ...]]
pub fn fence(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    // SAFETY: reads the context of the running call.
    if unsafe { raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx) } != 0 {
        super::fence::report_keys(ctx, a);
        return Ok(Reply::Sent);
    }
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
    if !is_effect(ctx) {
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
    replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
