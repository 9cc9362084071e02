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

use crate::lease::decide::Held;
use crate::lease::{Holder, Lease, LeaseError, Multi, MultiMode, RecordMut, RecordRef};

use super::ctx::{Ctx, Str};
use super::state::{self, STATS};

pub use gate::{Closed, GATE, node_accepts_writes};
use key::{LeaseKey, Mode};

/// The internal effect command used by replication and the AOF.
pub const APPLY: &str = "LEASE.APPLY";
/// `APPLY` as a C string, for RedisModule_Replicate and EmitAOF.
pub const APPLY_CMD: &CStr = c"LEASE.APPLY";
/// The internal command that carries the token clock (`last`) into the
/// replication stream and the AOF.
pub const CLOCK: &str = "LEASE.CLOCK";
/// The internal effect that adds or updates one holder of a counting or
/// shared lease: `LEASE.HOLD key owner token deadline-ms LIMIT n|SHARED`.
pub const HOLD: &str = "LEASE.HOLD";
pub const HOLD_CMD: &CStr = c"LEASE.HOLD";
/// The internal effect that removes one holder (the key goes with the
/// last): `LEASE.DROP key owner`.
pub const DROP: &str = "LEASE.DROP";
const DROP_CMD: &CStr = c"LEASE.DROP";
/// The internal effect that removes the holders a master's prune took out,
/// named by the last of them in deadline order: `LEASE.PRUNE key
/// deadline-ms token`.
pub const PRUNE: &str = "LEASE.PRUNE";
const PRUNE_CMD: &CStr = c"LEASE.PRUNE";

/// The internal effect that says which effect and record versions the
/// node that wrote the stream speaks: `LEASE.VERSION effects records`.
pub const VERSION: &str = "LEASE.VERSION";

/// How many ended holders one command takes out before it decides, and
/// how many one tick of the drain timer takes out.
const PRUNE_PER_CALL: usize = 64;
pub const PRUNE_PER_TICK: usize = 1024;
/// How soon the drain timer takes the next batch out.
const DRAIN_EVERY_MS: i64 = 1;

/// A lease key opened to read.
pub struct Reader {
    key: LeaseKey,
}

impl Reader {
    #[inline]
    pub fn open(ctx: Ctx, name: Str) -> Reader {
        Reader {
            key: LeaseKey::open(ctx, name, Mode::Read),
        }
    }

    /// The stored record (live or not), `None` when empty, or WRONGTYPE.
    pub fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError> {
        self.key.get().map(|r| r.map(as_ref))
    }

    /// The key's absolute expiry, if it has one.
    pub fn expire_at(&self) -> Option<i64> {
        self.key.expire_at()
    }
}

fn as_ref(r: RecordMut<'_>) -> RecordRef<'_> {
    match r {
        RecordMut::Exclusive(l) => RecordRef::Exclusive(l),
        RecordMut::Multi(m) => RecordRef::Multi(m),
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
    #[inline]
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
    pub fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError> {
        self.key.get().map(|r| r.map(as_ref))
    }

    /// The key's state at `now_ms` (for a decision), or WRONGTYPE.
    pub fn held(&mut self, now_ms: i64) -> Result<Held<'_>, LeaseError> {
        Ok(Held::of(self.record()?, now_ms))
    }

    /// The stored multi-holder record, if that is what the key holds.
    fn multi(&mut self) -> Option<&mut Multi> {
        match self.key.get() {
            Ok(Some(RecordMut::Multi(m))) => Some(m),
            _ => None,
        }
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
    pub fn create(&mut self, lease: Box<Lease>, owner_arg: Option<Str>) -> u64 {
        let token = lease.token;
        self.count_replaced();
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
        let Some(RecordMut::Exclusive(lease)) = self.key.get()? else {
            return Err(LeaseError::Internal("the lease to extend is gone".into()));
        };
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
    /// expiry): counted as an expiry, one per holder.
    pub fn delete_ended(&mut self) {
        let holders = self.record().ok().flatten().map_or(1, |r| r.holders());
        self.key.delete();
        replicate_del(self.ctx, self.name);
        self.signal();
        STATS.expired.add(holders as u64);
    }

    /// Sets the key's expiry to its lease's deadline, the latest holder's
    /// for a multi record (after a `RESTORE k 0`, `PERSIST` or a longer
    /// `EXPIRE` left it outliving the lease). An exclusive lease is
    /// replicated as its `LEASE.APPLY`; a multi record as `PEXPIREAT`
    /// (its holders are on the replica already; their count must not
    /// matter).
    pub fn align_expiry(&mut self) -> Result<(), LeaseError> {
        let (ctx, name) = (self.ctx, self.name);
        let deadline = match self.key.get()? {
            None => return Ok(()),
            Some(RecordMut::Exclusive(lease)) => {
                replicate_state(ctx, name, None, lease);
                lease.deadline_ms
            }
            Some(RecordMut::Multi(m)) => {
                let Some(latest) = m.latest_deadline() else {
                    return Ok(());
                };
                replicate_pexpireat(ctx, name, latest);
                latest
            }
        };
        self.key.set_expire(deadline);
        self.signal();
        Ok(())
    }

    // --- Counting and shared leases (one effect per holder) ---------------

    /// Adds a new holder in `mode`: to the key's record when it is held in
    /// that mode, else as the first holder of a new record (the key was
    /// free, or held only by an ended lease). Replicated as its
    /// `LEASE.HOLD`, notified and counted like every acquisition. Returns
    /// its token.
    pub fn add_holder(
        &mut self,
        mode: MultiMode,
        holder: Holder,
        owner_arg: Option<Str>,
        now_ms: i64,
    ) -> u64 {
        self.make_room(now_ms);
        let token = holder.token;
        replicate_hold(self.ctx, self.name, owner_arg, mode, &holder);
        let latest = match self.multi() {
            Some(m) if m.mode() == mode => {
                m.put(holder);
                m.latest_deadline()
            }
            _ => {
                self.count_replaced();
                self.key.set_multi(Multi::with(mode, holder));
                None
            }
        };
        if let Some(latest) = latest {
            self.key.set_expire(latest);
        }
        self.signal();
        STATS.acquired.incr();
        self.notify(c"lease.acquire");
        token
    }

    /// Moves the deadline of `owner`'s holding (a renewal or a re-acquire);
    /// the key's expiry follows the latest deadline.
    pub fn extend_holder(
        &mut self,
        owner: &[u8],
        deadline_ms: i64,
        owner_arg: Option<Str>,
    ) -> Result<(), LeaseError> {
        let (ctx, name) = (self.ctx, self.name);
        let gone = || LeaseError::Internal("the holding to extend is gone".into());
        let m = self.multi().ok_or_else(gone)?;
        if !m.set_deadline(owner, deadline_ms) {
            return Err(gone());
        }
        let mode = m.mode();
        let latest = m.latest_deadline().ok_or_else(gone)?;
        let h = m.holder(owner).ok_or_else(gone)?;
        replicate_hold(ctx, name, owner_arg, mode, h);
        self.key.set_expire(latest);
        self.signal();
        self.notify(c"lease.renew");
        Ok(())
    }

    /// Takes `owner`'s holding out (the key goes with the last holder) and
    /// replicates `LEASE.DROP`; true when there was one.
    fn drop_holder(&mut self, owner: &[u8], owner_arg: Option<Str>) -> bool {
        let (ctx, name) = (self.ctx, self.name);
        let Some(m) = self.multi() else {
            return false;
        };
        if m.remove(owner).is_none() {
            return false;
        }
        let latest = m.latest_deadline();
        replicate_drop(ctx, name, owner_arg, owner);
        match latest {
            Some(latest) => self.key.set_expire(latest),
            None => self.key.delete(),
        }
        self.signal();
        true
    }

    /// `owner` gives its holding back (LEASE.RELEASE).
    pub fn release_holder(&mut self, owner: &[u8], owner_arg: Option<Str>) -> bool {
        let dropped = self.drop_holder(owner, owner_arg);
        if dropped {
            STATS.released.incr();
            self.notify(c"lease.release");
        }
        dropped
    }

    /// Gives back a holding handed to a waiter that disconnected before it
    /// learnt its token: notified as a release, counted as nothing.
    pub fn revoke_holder(&mut self, owner: &[u8]) {
        if self.drop_holder(owner, None) {
            self.notify(c"lease.release");
        }
    }

    /// Removes holders whose deadline has passed at `now_ms`, at most
    /// `PRUNE_PER_CALL` of them, earliest first (the key goes with the
    /// last holder). What a command does before it decides on a counting or
    /// shared lease; the rest leave in batches from a timer (`drain`), so
    /// that no one call's work or effect grows with the number of holders
    /// that ended. Returns how many left.
    pub fn prune(&mut self, now_ms: i64) -> usize {
        self.prune_up_to(now_ms, PRUNE_PER_CALL)
    }

    /// Removes at most `max` holders whose deadline has passed at `now_ms`:
    /// one `LEASE.PRUNE` effect that names the last of them (its size does
    /// not depend on how many), each counted in `expired` and notified as
    /// `lease.expire`. When more have ended, a timer takes them out later.
    /// Only a master prunes (its write commands and gated timers); a
    /// replica applies the effect.
    pub fn prune_up_to(&mut self, now_ms: i64, max: usize) -> usize {
        let (ctx, name) = (self.ctx, self.name);
        let Some(m) = self.multi() else {
            return 0;
        };
        if !m.has_ended(now_ms) {
            return 0;
        }
        let ended = m.take_ended(now_ms, max);
        let (Some(last), latest, more) = (ended.last(), m.latest_deadline(), m.has_ended(now_ms))
        else {
            return 0;
        };
        replicate_prune(ctx, name, last.deadline_ms, last.token);
        if latest.is_none() {
            self.key.delete();
        }
        self.signal();
        STATS.expired.add(ended.len() as u64);
        for _ in &ended {
            self.notify(c"lease.expire");
        }
        if more {
            state::start_drain(ctx.selected_db(), name.bytes(), DRAIN_EVERY_MS);
        }
        ended.len()
    }

    /// A new lease or record replaces a multi record whose holders have all
    /// ended but are not all taken out yet: they count as expired.
    fn count_replaced(&mut self) {
        if let Some(m) = self.multi() {
            STATS.expired.add(m.len() as u64);
        }
    }

    /// Makes room for one more holder of a full `LIMIT n` record, whose
    /// places are free only because holders ended (the decision counts live
    /// holders): a stored record keeps at most `n` holders.
    fn make_room(&mut self, now_ms: i64) {
        let over = match self.multi() {
            Some(m) => match m.mode() {
                MultiMode::Limit(n) => (m.len() + 1).saturating_sub(n as usize),
                MultiMode::Shared => 0,
            },
            None => 0,
        };
        if over > 0 {
            self.prune_up_to(now_ms, over);
        }
    }

    /// Applies `LEASE.PRUNE` from the master or the AOF: removes the
    /// holders the master's prune removed, named by the last of them.
    pub fn prune_effect(&mut self, deadline_ms: i64, token: u64) {
        let latest = match self.key.get() {
            Ok(Some(RecordMut::Multi(m))) => {
                if m.take_through(deadline_ms, token) == 0 {
                    None
                } else {
                    Some(m.latest_deadline())
                }
            }
            _ => None,
        };
        replicate_verbatim(self.ctx);
        if let Some(latest) = latest {
            if latest.is_none() {
                self.key.delete();
            }
            self.signal();
        }
    }

    /// Applies `LEASE.HOLD` from the master or the AOF: one holder's exact
    /// state. A key of another type, an exclusive lease or a record of
    /// another mode is replaced (the master's state wins).
    pub fn hold_effect(&mut self, mode: MultiMode, holder: Holder) {
        state::observe_token(holder.token);
        match self.key.get() {
            Ok(Some(RecordMut::Multi(m))) if m.mode() == mode => {
                m.put(holder);
                if let Some(latest) = m.latest_deadline() {
                    self.key.set_expire(latest);
                }
            }
            Ok(_) => self.key.set_multi(Multi::with(mode, holder)),
            Err(_) => {
                self.key.delete();
                self.key.set_multi(Multi::with(mode, holder));
            }
        }
        replicate_verbatim(self.ctx);
        self.signal();
    }

    /// Applies `LEASE.DROP` from the master or the AOF: removes `owner`'s
    /// holding whatever the clock says (the master decided).
    pub fn drop_effect(&mut self, owner: &[u8]) -> bool {
        let done = match self.key.get() {
            Ok(Some(RecordMut::Multi(m))) => match m.remove(owner) {
                Some(_) => {
                    match m.latest_deadline() {
                        Some(latest) => self.key.set_expire(latest),
                        None => self.key.delete(),
                    }
                    true
                }
                None => false,
            },
            Ok(Some(RecordMut::Exclusive(l))) if l.is_held_by(owner) => {
                self.key.delete();
                true
            }
            _ => false,
        };
        replicate_verbatim(self.ctx);
        if done {
            self.signal();
        }
        done
    }

    /// Deletes the key on this node alone (a replica that cannot follow its
    /// master's effects keeps no partial state, see `compat.rs`): not
    /// replicated, not counted.
    pub fn forget(&mut self) {
        self.key.delete();
        self.signal();
    }

    /// Applies `LEASE.APPLY` from the master or the AOF: the full state.
    pub fn apply(&mut self, lease: Box<Lease>) {
        if self.key.get().is_err() {
            self.key.delete();
        }
        state::observe_token(lease.token);
        self.key.set(lease);
        replicate_verbatim(self.ctx);
        self.signal();
    }

    /// Applies `LEASE.RELEASE` from the master or the AOF: the master
    /// decided, so the owner alone counts. True when `owner` held the key
    /// (an exclusive lease, or a holding of a multi record).
    pub fn release_effect(&mut self, owner: &[u8]) -> bool {
        match self.key.get() {
            Ok(Some(RecordMut::Exclusive(l))) if l.is_held_by(owner) => {
                self.key.delete();
                replicate_verbatim(self.ctx);
                self.signal();
                true
            }
            Ok(Some(RecordMut::Multi(_))) => self.drop_effect(owner),
            _ => false,
        }
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

/// `n` in decimal, written into `buf`: the numbers an effect carries are
/// passed to RedisModule_Replicate as buffers ("b"), which the server keeps
/// in one allocation each, where a "l" costs it two (the string, then the
/// object around it).
fn decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    // Digits by pairs, from a table of "00" to "99".
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut v = n.unsigned_abs();
    let mut i = buf.len();
    // Four digits per division while there are more than four.
    while v >= 10_000 {
        let four = (v % 10_000) as usize;
        v /= 10_000;
        let (hi, lo) = (four / 100 * 2, four % 100 * 2);
        i -= 4;
        buf[i..i + 2].copy_from_slice(&PAIRS[hi..hi + 2]);
        buf[i + 2..i + 4].copy_from_slice(&PAIRS[lo..lo + 2]);
    }
    // At most four digits are left: at most one more pair before the last.
    if v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        let pair = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    if n < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

/// Replicates the full state of a lease as an effect: replicas and the AOF
/// get the exact token and absolute deadline, never a clock-dependent command.
fn replicate_state(ctx: Ctx, key: Str, owner_arg: Option<Str>, lease: &Lease) {
    let (mut tb, mut db) = ([0u8; 20], [0u8; 20]);
    let token = decimal(lease.token as i64, &mut tb);
    let deadline = decimal(lease.deadline_ms, &mut db);
    // SAFETY: the formats match the arguments: "ssbb" two
    // RedisModuleStrings and two buffers with their lengths; "sbbb" one
    // RedisModuleString and three buffers.
    unsafe {
        let replicate = raw::RedisModule_Replicate.unwrap();
        match owner_arg {
            Some(owner) => replicate(
                ctx.raw(),
                APPLY_CMD.as_ptr(),
                c"ssbb".as_ptr(),
                key.raw(),
                owner.raw(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
            ),
            None => replicate(
                ctx.raw(),
                APPLY_CMD.as_ptr(),
                c"sbbb".as_ptr(),
                key.raw(),
                lease.owner.as_ptr(),
                lease.owner.len(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
            ),
        };
    }
}

/// Replicates one holder of a counting or shared lease:
/// `LEASE.HOLD key owner token deadline-ms LIMIT n` or `... SHARED`. Its
/// size does not depend on how many holders the key has.
fn replicate_hold(ctx: Ctx, key: Str, owner_arg: Option<Str>, mode: MultiMode, h: &Holder) {
    let (mut tb, mut db) = ([0u8; 20], [0u8; 20]);
    let token = decimal(h.token as i64, &mut tb);
    let deadline = decimal(h.deadline_ms, &mut db);
    let (ctx, cmd, key) = (ctx.raw(), HOLD_CMD.as_ptr(), key.raw());
    // SAFETY: each format matches its arguments: "s" a RedisModuleString,
    // "b" a buffer and its length, "l" a long long, "c" a C string.
    unsafe {
        let replicate = raw::RedisModule_Replicate.unwrap();
        match (owner_arg, mode) {
            (Some(o), MultiMode::Limit(n)) => replicate(
                ctx,
                cmd,
                c"ssbbcl".as_ptr(),
                key,
                o.raw(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
                c"LIMIT".as_ptr(),
                n as i64,
            ),
            (Some(o), MultiMode::Shared) => replicate(
                ctx,
                cmd,
                c"ssbbc".as_ptr(),
                key,
                o.raw(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
                c"SHARED".as_ptr(),
            ),
            (None, MultiMode::Limit(n)) => replicate(
                ctx,
                cmd,
                c"sbbbcl".as_ptr(),
                key,
                h.owner.as_ptr(),
                h.owner.len(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
                c"LIMIT".as_ptr(),
                n as i64,
            ),
            (None, MultiMode::Shared) => replicate(
                ctx,
                cmd,
                c"sbbbc".as_ptr(),
                key,
                h.owner.as_ptr(),
                h.owner.len(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
                c"SHARED".as_ptr(),
            ),
        };
    }
}

/// Replicates the removal of the ended holders up to and including the one
/// with `deadline_ms` and `token`: `LEASE.PRUNE key deadline-ms token`.
fn replicate_prune(ctx: Ctx, key: Str, deadline_ms: i64, token: u64) {
    let (mut db, mut tb) = ([0u8; 20], [0u8; 20]);
    let deadline = decimal(deadline_ms, &mut db);
    let token = decimal(token as i64, &mut tb);
    // SAFETY: "sbb": one RedisModuleString and two buffers with their
    // lengths.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.raw(),
            PRUNE_CMD.as_ptr(),
            c"sbb".as_ptr(),
            key.raw(),
            deadline.as_ptr(),
            deadline.len(),
            token.as_ptr(),
            token.len(),
        );
    }
}

/// Replicates the removal of one holder: `LEASE.DROP key owner`.
fn replicate_drop(ctx: Ctx, key: Str, owner_arg: Option<Str>, owner: &[u8]) {
    // SAFETY: "ss" two RedisModuleStrings; "sb" one and a buffer with its
    // length.
    unsafe {
        let replicate = raw::RedisModule_Replicate.unwrap();
        match owner_arg {
            Some(o) => replicate(
                ctx.raw(),
                DROP_CMD.as_ptr(),
                c"ss".as_ptr(),
                key.raw(),
                o.raw(),
            ),
            None => replicate(
                ctx.raw(),
                DROP_CMD.as_ptr(),
                c"sb".as_ptr(),
                key.raw(),
                owner.as_ptr(),
                owner.len(),
            ),
        };
    }
}

fn replicate_pexpireat(ctx: Ctx, key: Str, at_ms: i64) {
    // SAFETY: format "sl": one RedisModuleString and a long long.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.raw(),
            c"PEXPIREAT".as_ptr(),
            c"sl".as_ptr(),
            key.raw(),
            at_ms,
        );
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

/// What a timer writes into the replication stream and the AOF, outside any
/// command, one command per timer (the server wraps several in MULTI).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Announce {
    /// `LEASE.VERSION <effects> <records>`: which versions wrote what
    /// follows (see `compat.rs`).
    Version,
    /// `LEASE.CLOCK <last>`: the token clock, so that an AOF rewritten
    /// without the RDB preamble (which keeps one APPLY per live key and no
    /// aux data) still carries it.
    Clock,
}

/// Writes `what` into the replication stream and the AOF: from a timer
/// right after the server forks (once an AOF rewrite has opened its new
/// incremental file), and when a replica comes online. Refused while writes
/// are paused (propagating then aborts Valkey); the caller tries again
/// later.
pub fn announce(ctx: Ctx, what: Announce) -> Result<(), Closed> {
    // SAFETY: a function-pointer read filled in by RedisModule_Init.
    if let Some(avoid) = unsafe { raw::RedisModule_AvoidReplicaTraffic }
        && unsafe { avoid() } != 0
    {
        return Err(Closed::Paused);
    }
    if what == Announce::Version {
        // SAFETY: format "ll": two long longs.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                ctx.raw(),
                c"LEASE.VERSION".as_ptr(),
                c"ll".as_ptr(),
                crate::lease::versions::EFFECTS as i64,
                crate::lease::versions::RECORDS as i64,
            );
        }
        return Ok(());
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

#[cfg(test)]
mod tests {
    use super::decimal;

    #[test]
    fn decimal_writes_what_display_does() {
        let mut buf = [0u8; 20];
        for n in [
            0,
            7,
            10,
            99,
            1_839_225_399_109_632,
            i64::MAX,
            -1,
            -10,
            i64::MIN,
        ] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
        // Every length, every sign, from a seeded generator.
        let mut x: i64 = 1;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            for n in [x, x >> 20, x >> 40, x >> 54, x % 1000, x % 100_000] {
                assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
            }
        }
    }
}
