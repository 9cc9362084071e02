//! The effects layer: the one place that changes lease keys. Each change
//! opens the key, stores, signals the key as modified (only when it really
//! changed: the module sets NO_IMPLICIT_SIGNAL_MODIFIED, so a call that
//! changes nothing leaves `WATCH` alone), replicates the effect, notifies
//! keyspace subscribers and counts.
//!
//! Two ways in:
//! - `Writer::open`, for a client's command: the server applied its write
//!   checks before the command ran.
//! - `Writer::open_gated`, for a write the module starts by itself (timers,
//!   revokes, expiry fixes): it passes `gate::check` first, the same checks
//!   a client's write would face.

mod gate;
mod key;

use std::ffi::CStr;

use redis_module::raw;

use crate::lease::{Lease, LeaseError};

use super::ctx::{Ctx, Str};
use super::state::{self, STATS};

pub use gate::{Closed, GATE};
use key::{LeaseKey, Mode};

/// The internal effect command used by replication and the AOF.
pub const APPLY: &str = "LEASE.APPLY";
/// `APPLY` as a C string, for RedisModule_Replicate and EmitAOF.
pub const APPLY_CMD: &CStr = c"LEASE.APPLY";
/// The internal command that carries the token clock (`last`) into the
/// replication stream and the AOF.
pub const CLOCK: &str = "LEASE.CLOCK";

/// A lease key opened to read.
pub struct Reader {
    key: LeaseKey,
}

impl Reader {
    pub fn open(ctx: Ctx, name: Str) -> Reader {
        Reader {
            key: LeaseKey::open(ctx, name, Mode::Read),
        }
    }

    /// The stored record (live or not), `None` when empty, or WRONGTYPE.
    pub fn lease(&mut self) -> Result<Option<&Lease>, LeaseError> {
        self.key.get().map(|l| l.map(|l| &*l))
    }

    /// The key's absolute expiry, if it has one.
    pub fn expire_at(&self) -> Option<i64> {
        self.key.expire_at()
    }
}

/// A lease key opened to change it.
pub struct Writer {
    ctx: Ctx,
    name: Str,
    key: LeaseKey,
}

impl Writer {
    /// Opens `name` for a client's command.
    pub fn open(ctx: Ctx, name: Str) -> Writer {
        Writer {
            ctx,
            name,
            key: LeaseKey::open(ctx, name, Mode::Write),
        }
    }

    /// Opens `name` for a write the module starts by itself, if the gates
    /// let it.
    pub fn open_gated(ctx: Ctx, name: Str) -> Result<Writer, Closed> {
        gate::check(ctx, name)?;
        Ok(Writer::open(ctx, name))
    }

    /// The stored record (live or not), `None` when empty, or WRONGTYPE.
    pub fn lease(&mut self) -> Result<Option<&Lease>, LeaseError> {
        self.key.get().map(|l| l.map(|l| &*l))
    }

    /// The key's absolute expiry, if it has one.
    pub fn expire_at(&self) -> Option<i64> {
        self.key.expire_at()
    }

    fn signal(&self) {
        // SAFETY: ctx and name are live (their contracts).
        unsafe { raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx.raw(), self.name.raw()) };
    }

    fn notify(&self, event: &'static CStr) {
        notify(self.ctx, event, self.name);
    }

    /// Stores a new lease: replicated as an effect, notified and counted
    /// like every acquisition. `owner_arg` is the owner as a command
    /// argument, when there is one (replicated without a copy). Returns
    /// its token.
    pub fn create(&mut self, lease: Lease, owner_arg: Option<Str>) -> u64 {
        let token = lease.token;
        replicate_state(self.ctx, self.name, owner_arg, &lease);
        self.key.set(lease);
        self.signal();
        STATS.acquired.incr();
        self.notify(c"lease.acquire");
        token
    }

    /// Moves the deadline of the held lease (a renewal or an idempotent
    /// re-acquire): record, key expiry, replication, notification.
    pub fn extend(&mut self, deadline_ms: i64, owner_arg: Option<Str>) -> Result<(), LeaseError> {
        let (ctx, name) = (self.ctx, self.name);
        let lease = self
            .key
            .get()?
            .ok_or_else(|| LeaseError::Internal("the lease to extend is gone".into()))?;
        lease.deadline_ms = deadline_ms;
        replicate_state(ctx, name, owner_arg, lease);
        self.key.set_expire(deadline_ms);
        self.signal();
        self.notify(c"lease.renew");
        Ok(())
    }

    /// Deletes a lease handed to a waiter that disconnected before it learnt
    /// its token (nobody holds it): replicated as a DEL, notified as a
    /// release, counted as nothing.
    pub fn revoke(&mut self) {
        self.key.delete();
        replicate_del(self.ctx, self.name);
        self.signal();
        self.notify(c"lease.release");
    }

    /// Deletes the held lease at its holder's request: replicas and the AOF
    /// get the client's `LEASE.RELEASE` itself (applied by owner alone
    /// there).
    pub fn release(&mut self) {
        self.key.delete();
        replicate_verbatim(self.ctx);
        self.signal();
        STATS.released.incr();
        self.notify(c"lease.release");
    }

    /// Deletes a record whose lease has ended but whose key lingered (no
    /// expiry): counted as an expiry.
    pub fn delete_ended(&mut self) {
        self.key.delete();
        replicate_del(self.ctx, self.name);
        self.signal();
        STATS.expired.incr();
    }

    /// Sets the key's expiry to its lease's deadline (after a `RESTORE k 0`,
    /// `PERSIST` or a longer `EXPIRE` left it outliving the lease).
    pub fn align_expiry(&mut self) -> Result<(), LeaseError> {
        let (ctx, name) = (self.ctx, self.name);
        let Some(lease) = self.key.get()? else {
            return Ok(());
        };
        replicate_state(ctx, name, None, lease);
        let deadline = lease.deadline_ms;
        self.key.set_expire(deadline);
        self.signal();
        Ok(())
    }

    /// Applies `LEASE.APPLY` from the master or the AOF: the full state.
    pub fn apply(&mut self, lease: Lease) {
        if self.key.get().is_err() {
            self.key.delete();
        }
        state::observe_token(lease.token);
        self.key.set(lease);
        replicate_verbatim(self.ctx);
        self.signal();
    }

    /// Applies `LEASE.RELEASE` from the master or the AOF: the master
    /// decided, so the owner alone counts.
    pub fn release_effect(&mut self) {
        self.key.delete();
        replicate_verbatim(self.ctx);
        self.signal();
    }
}

/// Sends `event` for `key` to keyspace-notification subscribers (class `d`,
/// module events).
fn notify(ctx: Ctx, event: &'static CStr, key: Str) {
    // SAFETY: ctx and key are live (their contracts).
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx.raw(),
            raw::REDISMODULE_NOTIFY_MODULE,
            event.as_ptr(),
            key.raw(),
        );
    }
}

/// Replicates the full state of a lease as an effect: replicas and the AOF
/// get the exact token and absolute deadline, never a clock-dependent command.
fn replicate_state(ctx: Ctx, key: Str, owner_arg: Option<Str>, lease: &Lease) {
    let (token, deadline) = (lease.token as i64, lease.deadline_ms);
    // SAFETY: the formats match the arguments: "ssll" two
    // RedisModuleStrings and two long longs; "sbll" a RedisModuleString, a
    // buffer with its length, two long longs.
    unsafe {
        let replicate = raw::RedisModule_Replicate.unwrap();
        match owner_arg {
            Some(owner) => replicate(
                ctx.raw(),
                APPLY_CMD.as_ptr(),
                c"ssll".as_ptr(),
                key.raw(),
                owner.raw(),
                token,
                deadline,
            ),
            None => replicate(
                ctx.raw(),
                APPLY_CMD.as_ptr(),
                c"sbll".as_ptr(),
                key.raw(),
                lease.owner.as_ptr(),
                lease.owner.len(),
                token,
                deadline,
            ),
        };
    }
}

fn replicate_del(ctx: Ctx, key: Str) {
    // SAFETY: format "s" matches one RedisModuleString.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(ctx.raw(), c"DEL".as_ptr(), c"s".as_ptr(), key.raw());
    }
}

/// Replicates the running command as it was called.
pub fn replicate_verbatim(ctx: Ctx) {
    // SAFETY: ctx is the running command's context.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx.raw()) };
}

/// Writes `LEASE.CLOCK <last>` into the replication stream and the AOF, so
/// an AOF rewritten without the RDB preamble (which keeps one APPLY per live
/// key and no aux data) still carries the token clock: called from a timer
/// right after the server forks (outside any command), once an AOF rewrite
/// has opened its new incremental file. Refused while writes are paused (propagating then
/// aborts Valkey); the caller tries again later.
pub fn emit_clock(ctx: Ctx) -> Result<(), Closed> {
    // SAFETY: a function-pointer read filled in by RedisModule_Init.
    if let Some(avoid) = unsafe { raw::RedisModule_AvoidReplicaTraffic }
        && unsafe { avoid() } != 0
    {
        return Err(Closed::Paused);
    }
    let last = state::last_token();
    if last == 0 {
        return Ok(());
    }
    // SAFETY: format "l": one long long.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.raw(),
            c"LEASE.CLOCK".as_ptr(),
            c"l".as_ptr(),
            last as i64,
        );
    }
    Ok(())
}
