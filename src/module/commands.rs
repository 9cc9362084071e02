//! The LEASE.* command handlers: parse (crate::lease::args), read the key,
//! decide (crate::lease::decide for exclusive leases, crate::lease::multi
//! for counting and shared ones), then change it through the effects layer
//! and serve waiters.

use crate::lease::args::{
    self, check_owner, parse_acquire_options, parse_hold_mode, parse_token, parse_ttl,
};
use crate::lease::decide::{self, Acquire, Decision};
use crate::lease::{Holder, Lease, LeaseError, Mode, RecordRef};

use super::ctx::{Args, Ctx};
use super::effects::{self, APPLY, CLOCK, DROP, HOLD, PRUNE, Reader, VERSION, Writer};
use super::reply::{Field, Reply};
use super::state::{self, STATS};
use super::waiters;
use super::{compat, datatype};

/// Where the commands that carry an owner id have it. The id is a
/// credential: the entry points redact it from SLOWLOG and MONITOR once the
/// handler is done (after replication took its copy: on Valkey 8.1 the
/// redaction replaces the argument itself).
pub const OWNER_ARG: usize = 2;

/// The exclusive lease stored in a record, if that is what it is.
fn exclusive(record: Option<RecordRef<'_>>) -> Option<&Lease> {
    match record {
        Some(RecordRef::Exclusive(l)) => Some(l),
        _ => None,
    }
}

/// LEASE.ACQUIRE key owner ttl-ms [LIMIT n | SHARED] [BLOCK timeout-ms]
pub fn acquire(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 4 {
        return Err(LeaseError::Arity("lease.acquire"));
    }
    compat::check()?;
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), state::max_ttl_ms())?;
    let opts = if a.len() > 4 {
        parse_acquire_options(&a.rest(4))?
    } else {
        args::AcquireOptions::default()
    };
    let name = a.str(1);
    let mut w = Writer::open(ctx, name);
    let now = state::now_ms();
    // A free lease (or a free place of a counting or shared lease) with
    // clients queued goes to the oldest of them first: a newcomer never
    // overtakes a waiter.
    if let Some(slot) = waiters::slot_if_waiting(ctx, name)
        && match w.record()? {
            Some(RecordRef::Multi(_)) => true,
            current => decide::live(exclusive(current), now).is_none(),
        }
        && waiters::waiting(&slot) > 0
    {
        waiters::serve(&slot, &mut w);
    }
    // The key's expiry matters only to a wait (when to re-check).
    let expire = if opts.block_ms.is_some() {
        w.expire_at()
    } else {
        None
    };
    let record = w.record()?;
    if opts.mode != Mode::Exclusive || matches!(record, Some(RecordRef::Multi(_))) {
        return acquire_multi(ctx, a, &mut w, owner, ttl, opts, now);
    }
    let current = exclusive(record);
    // A key the server expired within its lease's last millisecond (Redis
    // 8.2): the lease counts as held until that millisecond has passed.
    if current.is_none()
        && datatype::any_ended_early()
        && let Some(end) = datatype::ended_early(ctx.selected_db(), name.bytes())
    {
        return Ok(contended(ctx, a, owner, opts, ttl, end + 1));
    }
    let recheck_at = current.map_or(now, |l| decide::ends_at(l, expire) + 1);
    // During a grace period (SPEC S7) nothing new is created: the caller is
    // answered as if another owner held the key (someone may), or waits.
    let grace_end = state::grace_ends_at(now).filter(|_| decide::live(current, now).is_none());
    if let Some(end) = grace_end {
        return Ok(grace_refusal(ctx, a, owner, opts, ttl, end));
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
        Acquire::Contended => Ok(contended(ctx, a, owner, opts, ttl, recheck_at)),
    }
}

/// A refused acquire: null, or with BLOCK a wait re-checked at `recheck_at`.
fn contended(
    ctx: Ctx,
    a: &Args,
    owner: &[u8],
    opts: args::AcquireOptions,
    ttl: i64,
    recheck_at: i64,
) -> Reply {
    match opts.block_ms {
        Some(timeout) if waiters::may_block(ctx) => {
            let slot = (ctx.selected_db(), a.bytes(1).to_vec());
            waiters::block(ctx, slot, owner, opts.mode, ttl, timeout, recheck_at)
        }
        _ => {
            STATS.contended.incr();
            Reply::Null
        }
    }
}

/// An acquire refused by the grace period: null, or with BLOCK a wait
/// until the period ends at `end`.
fn grace_refusal(
    ctx: Ctx,
    a: &Args,
    owner: &[u8],
    opts: args::AcquireOptions,
    ttl: i64,
    end: i64,
) -> Reply {
    match opts.block_ms {
        Some(timeout) if waiters::may_block(ctx) => {
            let slot = (ctx.selected_db(), a.bytes(1).to_vec());
            waiters::block(ctx, slot, owner, opts.mode, ttl, timeout, end)
        }
        _ => {
            STATS.grace_refused.incr();
            Reply::Null
        }
    }
}

/// LEASE.ACQUIRE with `LIMIT n` or `SHARED`, or on a key held that way
/// (SPEC S8): the decision (`multi::acquire`) first, so that an error
/// changes nothing; then holders past their deadline leave (each one a
/// `LEASE.DROP`), and one effect.
fn acquire_multi(
    ctx: Ctx,
    a: &Args,
    w: &mut Writer,
    owner: &[u8],
    ttl: i64,
    opts: args::AcquireOptions,
    now: i64,
) -> Result<Reply, LeaseError> {
    let name = a.str(1);
    let ahead = waiters::waiting_on(ctx, name) > 0;
    let decision = decide::acquire_mode(w.held(now)?, opts.mode, owner, ahead, now)?;
    w.prune(now);
    let expire = w.expire_at();
    let held = w.held(now)?;
    let ended_early = (held.is_free() && datatype::any_ended_early())
        .then(|| datatype::ended_early(ctx.selected_db(), name.bytes()))
        .flatten();
    if let Some(end) = ended_early {
        return Ok(contended(ctx, a, owner, opts, ttl, end + 1));
    }
    let recheck_at = held.next_end(expire, now).map_or(now, |end| end + 1);
    let free = held.is_free();
    let is_multi = matches!(held, decide::Held::Multi(_));
    if let Some(end) = state::grace_ends_at(now).filter(|_| free || decision == Decision::New) {
        return Ok(grace_refusal(ctx, a, owner, opts, ttl, end));
    }
    let deadline_ms = now + ttl;
    match decision {
        Decision::New => {
            let token = state::with_clock(|c| c.issue(now)).ok_or(LeaseError::TokensExhausted)?;
            let owner_box: Box<[u8]> = owner.into();
            let token = match opts.mode.multi() {
                None => w.create(Lease::new(&owner_box, token, deadline_ms), Some(a.str(2))),
                Some(mode) => w.add_holder(
                    mode,
                    Holder {
                        owner: owner_box,
                        token,
                        deadline_ms,
                    },
                    Some(a.str(2)),
                    now,
                ),
            };
            Ok(Reply::Int(token as i64))
        }
        Decision::Reacquired { token } => {
            if is_multi {
                w.extend_holder(owner, deadline_ms, Some(a.str(2)))?;
            } else {
                w.extend(deadline_ms, Some(a.str(2)))?;
            }
            STATS.reacquired.incr();
            rearm(ctx, a, w, now)?;
            Ok(Reply::Int(token as i64))
        }
        Decision::Contended => Ok(contended(ctx, a, owner, opts, ttl, recheck_at)),
    }
}

/// A holder's deadline moved: the key's waiters are re-checked at the
/// next end of a holding, not at the old one.
fn rearm(ctx: Ctx, a: &Args, w: &mut Writer, now: i64) -> Result<(), LeaseError> {
    let expire = w.expire_at();
    if let Some(end) = w.held(now)?.next_end(expire, now) {
        waiters::lease_ends_at(ctx, a.str(1), end);
    }
    Ok(())
}

/// Serves the waiters of the key after a holding left (released or
/// ended), if anyone waits on it.
fn serve_waiters(ctx: Ctx, a: &Args, w: &mut Writer) {
    if let Some(slot) = waiters::slot_if_waiting(ctx, a.str(1)) {
        waiters::serve(&slot, w);
    }
}

/// LEASE.RENEW key owner ttl-ms
pub fn renew(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 4 {
        return Err(LeaseError::Arity("lease.renew"));
    }
    compat::check()?;
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), state::max_ttl_ms())?;
    let name = a.str(1);
    let mut w = Writer::open(ctx, name);
    let now = state::now_ms();
    let renewed = match w.record()? {
        Some(RecordRef::Multi(_)) => {
            if w.prune(now) > 0 {
                serve_waiters(ctx, a, &mut w);
            }
            match w.record()? {
                Some(RecordRef::Multi(m)) => decide::renew_holder(m, owner, ttl, now),
                _ => None,
            }
            .map(|deadline| w.extend_holder(owner, deadline, Some(a.str(2))))
            .transpose()?
            .is_some()
        }
        current => match decide::renew(exclusive(current), owner, ttl, now) {
            Some(deadline_ms) => {
                w.extend(deadline_ms, Some(a.str(2)))?;
                STATS.renewed.incr();
                waiters::lease_ends_at(ctx, name, deadline_ms);
                return Ok(Reply::Int(1));
            }
            None => false,
        },
    };
    if renewed {
        STATS.renewed.incr();
        rearm(ctx, a, &mut w, now)?;
        Ok(Reply::Int(1))
    } else {
        STATS.renew_failed.incr();
        Ok(Reply::Int(0))
    }
}

/// LEASE.RELEASE key owner
///
/// An exclusive lease's release is replicated verbatim: on a replica and in
/// AOF replay (where the clock must not decide) it deletes the lease when
/// `owner` holds it, live or not, as the master did. A holding of a
/// counting or shared lease is replicated as `LEASE.DROP key owner`.
pub fn release(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.release"));
    }
    let owner = check_owner(a.bytes(2))?;
    let name = a.str(1);
    let mut w = Writer::open(ctx, name);
    if ctx.is_effect() {
        if compat::ignoring_effects() {
            return Ok(Reply::Int(0));
        }
        w.record()?;
        return Ok(Reply::Int(w.release_effect(owner) as i64));
    }
    compat::check()?;
    let now = state::now_ms();
    match w.record()? {
        Some(RecordRef::Multi(_)) => {
            let pruned = w.prune(now);
            let mine = matches!(w.record()?, Some(RecordRef::Multi(m)) if decide::release_holder(m, owner, now));
            let released = mine && w.release_holder(owner, Some(a.str(2)));
            if !released {
                STATS.release_failed.incr();
            }
            if released || pruned > 0 {
                serve_waiters(ctx, a, &mut w);
            }
            Ok(Reply::Int(released as i64))
        }
        current => {
            if decide::release(exclusive(current), owner, now) {
                w.release();
                serve_waiters(ctx, a, &mut w);
                Ok(Reply::Int(1))
            } else {
                STATS.release_failed.incr();
                Ok(Reply::Int(0))
            }
        }
    }
}

/// LEASE.FENCE key token [command [arg ...]]
pub fn fence(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 3 {
        return Err(LeaseError::Arity("lease.fence"));
    }
    compat::check()?;
    let token = parse_token(a.bytes(2))?;
    if a.len() > 3 {
        return super::fence::fence_with_command(ctx, a, token);
    }
    let mut key = Reader::open(ctx, a.str(1));
    match decide::fence_record(key.record()?, token, state::now_ms()) {
        Ok(_) => {
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
    compat::check()?;
    let mut key = Reader::open(ctx, a.str(1));
    let expire = key.expire_at();
    let now = state::now_ms();
    Ok(match key.record()? {
        Some(RecordRef::Multi(m)) => match decide::holders_info(m, now, expire) {
            Some(view) => Reply::Fields(vec![
                ("mode", Field::Str(view.mode.name())),
                ("limit", Field::Int(view.mode.limit() as i64)),
                ("token", Field::Int(view.token as i64)),
                ("ttl", Field::Int(view.ttl_ms)),
                (
                    "waiters",
                    Field::Int(waiters::waiting_on(ctx, a.str(1)) as i64),
                ),
                (
                    "holders",
                    Field::Maps(
                        view.holders
                            .into_iter()
                            .map(|(token, ttl)| [("token", token as i64), ("ttl", ttl)])
                            .collect(),
                    ),
                ),
            ]),
            None => Reply::Null,
        },
        current => match decide::info(exclusive(current), now, expire) {
            Some(view) => Reply::IntMap(vec![
                ("token", view.token as i64),
                ("ttl", view.ttl_ms),
                ("waiters", waiters::waiting_on(ctx, a.str(1)) as i64),
            ]),
            None => Reply::Null,
        },
    })
}

/// LEASE.APPLY key owner token deadline-ms (internal): sets the full state
/// of an exclusive lease, as replicated by the master and written to the
/// AOF.
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
    if !compat::ignoring_effects() {
        Writer::open(ctx, a.str(1)).apply(Lease::new(owner, token, deadline_ms));
    }
    Ok(Reply::Ok)
}

/// LEASE.HOLD key owner token deadline-ms LIMIT n|SHARED (internal): adds
/// or updates one holder of a counting or shared lease, with its exact
/// token and deadline, as replicated by the master and written to the AOF.
pub fn hold(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(HOLD));
    }
    if a.len() != 6 && a.len() != 7 {
        return Err(LeaseError::Arity("lease.hold"));
    }
    let owner = check_owner(a.bytes(2))?;
    let token = parse_token(a.bytes(3))?;
    let deadline_ms = args::parse_unix_ms(a.bytes(4), "deadline-ms")?;
    let mode = parse_hold_mode(&a.rest(5))?;
    if compat::ignoring_effects() {
        return Ok(Reply::Ok);
    }
    Writer::open(ctx, a.str(1)).hold_effect(
        mode,
        Holder {
            owner: owner.into(),
            token,
            deadline_ms,
        },
    );
    Ok(Reply::Ok)
}

/// LEASE.DROP key owner (internal): removes one holder of a counting or
/// shared lease (the key goes with the last), as the master decided.
pub fn drop(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(DROP));
    }
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.drop"));
    }
    let owner = check_owner(a.bytes(2))?;
    if compat::ignoring_effects() {
        return Ok(Reply::Int(0));
    }
    let mut w = Writer::open(ctx, a.str(1));
    w.record()?;
    Ok(Reply::Int(w.drop_effect(owner) as i64))
}

/// LEASE.PRUNE key deadline-ms token (internal): removes the holders of a
/// counting or shared lease that the master's prune took out: every holder
/// at or before (deadline-ms, token) in deadline order.
pub fn prune(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(PRUNE));
    }
    if a.len() != 4 {
        return Err(LeaseError::Arity("lease.prune"));
    }
    let deadline_ms = args::parse_unix_ms(a.bytes(2), "deadline-ms")?;
    let token = parse_token(a.bytes(3))?;
    if !compat::ignoring_effects() {
        Writer::open(ctx, a.str(1)).prune_effect(deadline_ms, token);
    }
    Ok(Reply::Ok)
}

/// LEASE.VERSION effects records (internal): the versions the master (or
/// the node that wrote the AOF) speaks; a newer one than this build's
/// makes this node keep no lease state (see `compat.rs`).
pub fn version(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(VERSION));
    }
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.version"));
    }
    let number = |i: usize, what| {
        args::parse_i64(a.bytes(i))
            .and_then(|v| u32::try_from(v).ok())
            .ok_or(LeaseError::NotInteger(what))
    };
    compat::announced(ctx, number(1, "effects")?, number(2, "records")?);
    effects::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}

/// LEASE.CLOCK last (internal): raises the token clock, as written into
/// the replication stream and the AOF after every fork (see
/// `effects::announce`).
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

/// LEASE.GATE [key] (internal): changes nothing. Flagged `write`, so that
/// calling it in script mode asks the server whether a write to `key` (or,
/// without one, any write) would be accepted now (see `effects::gate`).
pub fn gate(_ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() > 2 {
        return Err(LeaseError::Arity("lease.gate"));
    }
    Ok(Reply::Ok)
}
