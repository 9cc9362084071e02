//! The LEASE.* command handlers: parse (crate::lease::args), read the key,
//! decide (crate::lease::decide), then change it through the effects layer
//! and serve waiters.

use crate::lease::args::{self, check_owner, parse_acquire_options, parse_token, parse_ttl};
use crate::lease::decide::{self, Acquire};
use crate::lease::{Lease, LeaseError};

use super::ctx::{Args, Ctx};
use super::effects::{self, APPLY, CLOCK, Reader, Writer};
use super::reply::Reply;
use super::state::{self, STATS};
use super::waiters;

/// Where the commands that carry an owner id have it. The id is a
/// credential: the entry points redact it from SLOWLOG and MONITOR once the
/// handler is done (after replication took its copy: on Valkey 8.1 the
/// redaction replaces the argument itself).
pub const OWNER_ARG: usize = 2;

/// LEASE.ACQUIRE key owner ttl-ms [BLOCK timeout-ms]
pub fn acquire(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 4 {
        return Err(LeaseError::Arity("lease.acquire"));
    }
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), state::max_ttl_ms())?;
    let opts = parse_acquire_options(&a.rest(4))?;
    let name = a.str(1);
    let mut w = Writer::open(ctx, name);
    let now = state::now_ms();
    // A free lease with clients queued goes to the oldest of them first: a
    // newcomer never overtakes a waiter.
    if let Some(slot) = waiters::slot_if_waiting(ctx, name)
        && decide::live(w.lease()?, now).is_none()
        && waiters::waiting(&slot) > 0
    {
        waiters::serve(&slot, &mut w);
    }
    let current = w.lease()?;
    // During a grace period (SPEC S7) nothing new is created: the caller is
    // answered as if another owner held the key (someone may), or waits.
    let grace_end = state::grace_ends_at(now).filter(|_| decide::live(current, now).is_none());
    if let Some(end) = grace_end {
        return match opts.block_ms {
            Some(timeout) if waiters::may_block(ctx) => {
                let slot = (ctx.selected_db(), a.bytes(1).to_vec());
                Ok(waiters::block(ctx, slot, owner, ttl, timeout, end))
            }
            _ => {
                STATS.grace_refused.incr();
                Ok(Reply::Null)
            }
        };
    }
    let decision = state::with_clock(|clock| decide::acquire(current, owner, ttl, now, clock))?;
    match decision {
        Acquire::Created(lease) => Ok(Reply::Int(w.create(lease, Some(a.str(2))) as i64)),
        Acquire::Reacquired { token, deadline_ms } => {
            w.extend(deadline_ms, Some(a.str(2)))?;
            STATS.reacquired.incr();
            waiters::lease_ends_at(ctx, name, deadline_ms);
            Ok(Reply::Int(token as i64))
        }
        Acquire::Contended => match opts.block_ms {
            Some(timeout) if waiters::may_block(ctx) => {
                // Re-check just after the holder's lease ends (its key's
                // expiry, when a PEXPIRE made that earlier).
                let expire = w.expire_at();
                let recheck_at = w.lease()?.map_or(now, |l| decide::ends_at(l, expire) + 1);
                let slot = (ctx.selected_db(), a.bytes(1).to_vec());
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
    let name = a.str(1);
    let mut w = Writer::open(ctx, name);
    let now = state::now_ms();
    match decide::renew(w.lease()?, owner, ttl, now) {
        Some(deadline_ms) => {
            w.extend(deadline_ms, Some(a.str(2)))?;
            STATS.renewed.incr();
            waiters::lease_ends_at(ctx, name, deadline_ms);
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
    let name = a.str(1);
    let mut w = Writer::open(ctx, name);
    if ctx.is_effect() {
        return Ok(Reply::Int(if decide::release_effect(w.lease()?, owner) {
            w.release_effect();
            1
        } else {
            0
        }));
    }
    if decide::release(w.lease()?, owner, state::now_ms()) {
        w.release();
        if let Some(slot) = waiters::slot_if_waiting(ctx, name) {
            waiters::serve(&slot, &mut w);
        }
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
    let mut key = Reader::open(ctx, a.str(1));
    match decide::fence(key.lease()?, token, state::now_ms()) {
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
    let mut key = Reader::open(ctx, a.str(1));
    let expire = key.expire_at();
    Ok(match decide::info(key.lease()?, state::now_ms(), expire) {
        Some(view) => Reply::IntMap(vec![
            ("token", view.token as i64),
            ("ttl", view.ttl_ms),
            ("waiters", waiters::waiting_on(ctx, a.str(1)) as i64),
        ]),
        None => Reply::Null,
    })
}

/// LEASE.APPLY key owner token deadline-ms (internal): sets the full state
/// of a lease, as replicated by the master and written to the AOF.
pub fn apply(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(APPLY));
    }
    if a.len() != 5 {
        return Err(LeaseError::Arity("lease.apply"));
    }
    let owner = check_owner(a.bytes(2))?;
    let token = parse_token(a.bytes(3))?;
    let deadline_ms = args::parse_unix_ms(a.bytes(4), "deadline-ms")?;
    Writer::open(ctx, a.str(1)).apply(Lease {
        owner: owner.into(),
        token,
        deadline_ms,
    });
    Ok(Reply::Ok)
}

/// LEASE.CLOCK last (internal): raises the token clock, as written into
/// the replication stream and the AOF after every fork (see
/// `effects::emit_clock`).
pub fn clock(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(CLOCK));
    }
    if a.len() != 2 {
        return Err(LeaseError::Arity("lease.clock"));
    }
    state::observe_token(parse_token(a.bytes(1))?);
    effects::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}

/// LEASE.GATE key (internal): changes nothing. Flagged `write`, so that
/// calling it in script mode asks the server whether a write to `key` would
/// be accepted now (see `effects::gate`).
pub fn gate(_ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 2 {
        return Err(LeaseError::Arity("lease.gate"));
    }
    Ok(Reply::Ok)
}
