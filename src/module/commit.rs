//! The one place that changes lease keys: every effect (`lease::effect`),
//! on the master, on a replica and while loading the AOF, is committed
//! here: applied to the key's record, stored, signalled as modified (only
//! when it changed: the module sets NO_IMPLICIT_SIGNAL_MODIFIED, so a call
//! that changes nothing leaves `WATCH` alone), replicated, notified and
//! counted.
//!
//! Three ways in:
//! - `KeyWriter::for_command`, for a client's command: the server applied
//!   its write checks before the command ran;
//! - `KeyWriter::for_module`, for a write the module starts by itself
//!   (timers, revokes, expiry fixes, drains): it passes the gates first, the
//!   same checks a client's write would face (writes paused, a replica,
//!   `min-replicas-to-write` not met, a persistence error, the cluster down,
//!   the key's slot served elsewhere);
//! - `KeyWriter::for_effect`, for an effect from the master link or the
//!   AOF: the same application, replicated verbatim, never counted.

use std::ffi::CStr;

use crate::lease::cluster::redirect;
use crate::lease::decide::Held;
use crate::lease::distribution;
use crate::lease::effect::{Announce, Digits, Effect, Stored};
use crate::lease::fence::key_slot;
use crate::lease::ops::{self, Commit, Event};
use crate::lease::{LeaseError, RecordMut, RecordRef};

use super::counters::{self, STATS};
use super::ffi::call::{self, Refusal};
use super::ffi::ctx::{Ctx, Str};
use super::ffi::key::{LeaseKey, Mode};
use super::ffi::replicate::{self, ClientArg};
use super::ffi::server;
use super::tokens;
use super::{guards, timers};

/// How soon the drain timer takes the next batch out.
const DRAIN_EVERY_MS: i64 = 1;

/// Why a module-started write may not happen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Writes are paused: try again shortly.
    Paused,
    /// The server refuses writes for now (replica, min-replicas, MISCONF,
    /// cluster down, out of memory for a new lease): try again later.
    Refused,
    /// The key's slot is served by another node: the redirection to send.
    Moved(String),
}

impl Closed {
    /// The one retry policy of a module-started write the gate held back:
    /// how soon to try again (`None`: never here, the key lives elsewhere).
    pub fn retry_in_ms(&self) -> Option<i64> {
        match self {
            Closed::Paused => Some(10),
            Closed::Refused => Some(50),
            Closed::Moved(_) => None,
        }
    }
}

/// May the module write `name` now, as a client's write could? The server
/// is asked the way a script would (`ffi::call::probe_write`).
pub fn gate(ctx: Ctx, name: Str) -> Result<(), Closed> {
    if server::writes_paused() {
        return Err(Closed::Paused);
    }
    if ctx.is_replica() {
        return Err(Closed::Refused);
    }
    let Some(Refusal { errno, text }) = call::probe_write(ctx, Some(name)) else {
        return Ok(());
    };
    // Some servers word the refusal as the redirection itself.
    if let Some(to) = text.filter(|t| t.starts_with("MOVED ") || t.starts_with("ASK ")) {
        return Err(Closed::Moved(to));
    }
    if errno == Some(libc::EPERM) && ctx.in_cluster() {
        let slot = key_slot(name.bytes());
        if let Some(to) = call::cluster_nodes(ctx).and_then(|nodes| redirect(&nodes, slot)) {
            return Err(Closed::Moved(to));
        }
    }
    Err(Closed::Refused)
}

/// Would this server accept a write now, to any key it serves (what a grace
/// period counts, see `grace.rs`)?
pub fn node_accepts_writes(ctx: Ctx) -> bool {
    !server::writes_paused() && !ctx.is_replica() && call::probe_write(ctx, None).is_none()
}

/// Where a writer's changes come from.
#[derive(Clone, Copy)]
enum Origin {
    /// A client's command; `owner_arg` is its owner argument, replicated as
    /// that string when an effect names those bytes. `one_key`: the command
    /// is about this key alone (a multi-key command's effects are each
    /// replicated as their own command, never the command verbatim).
    Command {
        owner_arg: Option<ClientArg>,
        one_key: bool,
    },
    /// A write the module started by itself, past the gates.
    Module,
    /// An effect from the master link or the AOF.
    Effect,
}

/// A lease key opened to change it.
pub struct KeyWriter {
    ctx: Ctx,
    name: Str,
    key: LeaseKey,
    origin: Origin,
    /// The client's label argument (`with_label_arg`; a command's only).
    label_arg: Option<ClientArg>,
}

impl KeyWriter {
    /// Opens `name` for a client's command.
    #[inline]
    pub fn for_command(ctx: Ctx, name: Str, owner_arg: Option<ClientArg>) -> KeyWriter {
        KeyWriter::command(ctx, name, owner_arg, true)
    }

    /// Opens `name`, one of the keys of a client's multi-key command.
    pub fn for_command_key(ctx: Ctx, name: Str, owner_arg: Option<ClientArg>) -> KeyWriter {
        KeyWriter::command(ctx, name, owner_arg, false)
    }

    #[inline(always)]
    fn command(ctx: Ctx, name: Str, owner_arg: Option<ClientArg>, one_key: bool) -> KeyWriter {
        KeyWriter {
            ctx,
            name,
            key: LeaseKey::open(ctx, name, Mode::Write),
            origin: Origin::Command { owner_arg, one_key },
            label_arg: None,
        }
    }

    /// Opens `name` for a write the module starts by itself, if the gates
    /// let it.
    pub fn for_module(ctx: Ctx, name: Str) -> Result<KeyWriter, Closed> {
        gate(ctx, name)?;
        Ok(KeyWriter {
            ctx,
            name,
            key: LeaseKey::open(ctx, name, Mode::Write),
            origin: Origin::Module,
            label_arg: None,
        })
    }

    /// Opens `name` to apply an effect from the master link or the AOF.
    pub fn for_effect(ctx: Ctx, name: Str) -> KeyWriter {
        KeyWriter {
            ctx,
            name,
            key: LeaseKey::open(ctx, name, Mode::Write),
            origin: Origin::Effect,
            label_arg: None,
        }
    }

    /// The client's label argument, replicated as that string when an
    /// effect ends with its bytes (a command's writer only).
    #[inline(always)]
    pub fn set_label_arg(&mut self, arg: ClientArg) {
        self.label_arg = Some(arg);
    }

    pub fn name(&self) -> Str {
        self.name
    }

    /// The stored record (live or not), `None` when empty, or WRONGTYPE.
    #[inline]
    pub fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError> {
        self.key.get().map(|r| r.map(as_ref))
    }

    /// The key's state at `now_ms` (for a decision), or WRONGTYPE.
    pub fn held(&mut self, now_ms: i64) -> Result<Held<'_>, LeaseError> {
        Ok(Held::of(self.record()?, now_ms))
    }

    /// The key's absolute expiry, if it has one.
    pub fn expire_at(&self) -> Option<i64> {
        self.key.expire_at()
    }

    /// Commits one effect: applies it to the key's record and stores what
    /// it leaves, signals the key when it changed, replicates it (verbatim
    /// for an effect from the master or the AOF), notifies and counts.
    /// Returns whether the key changed.
    #[inline(always)]
    pub fn commit(&mut self, c: &Commit<'_>) -> bool {
        let replayed = matches!(self.origin, Origin::Effect);
        if !replayed {
            self.observe(c);
        }
        let change = c.effect.apply(self.key.stored());
        let (changed, guard) = (change.changed, change.guard);
        if !replayed && change.store.is_some() {
            self.count_replaced_holders();
        }
        // A client's release deletes the key quietly (it serves the
        // waiters itself), and so does a guard that goes (its set follows
        // below): LEASE.RELEASE and LEASE.UNGUARD are their own effects.
        let release = matches!(c.effect, Effect::Release { .. });
        self.key
            .carry_out(change, guard == Some(false) || (release && !replayed));
        self.follow(guard, changed, c.event);
        self.replicate_effect(c, release);
        self.count(c.event);
        changed
    }

    /// A record replaced while it still stores ended holders: they count
    /// as expired (the key is free, so all of them have ended).
    #[inline(always)]
    fn count_replaced_holders(&mut self) {
        if let Stored::Record(RecordMut::Holders(m)) = self.key.stored() {
            STATS.expired.add(m.len() as u64);
            distribution::ended(RecordRef::Holders(m), &mut counters::record);
        }
    }

    /// What follows a change: the guards' set follows a guard that came or
    /// went (the change says which), the key is signalled when it changed,
    /// and a batch of ended holders that left more behind starts the drain
    /// (a timer takes them out, a batch at a time).
    #[inline(always)]
    fn follow(&self, guard: Option<bool>, changed: bool, event: Event) {
        match guard {
            Some(true) => guards::added(self.ctx.selected_db(), self.name.bytes()),
            Some(false) => _ = guards::removed(self.ctx.selected_db(), self.name.bytes()),
            None => {}
        }
        if changed {
            replicate::signal(self.ctx, self.name);
        }
        if let Event::Expire { drain: true, .. } = event {
            let db = self.ctx.selected_db();
            timers::start_drain(db, self.name.bytes(), DRAIN_EVERY_MS);
        }
    }

    /// Replicates an effect: from the master or the AOF verbatim (its token
    /// raising this node's clock); a client's one-key `LEASE.RELEASE` as
    /// the command itself, without a copy; the rest as its effect command.
    #[inline(always)]
    fn replicate_effect(&self, c: &Commit<'_>, release: bool) {
        match self.origin {
            Origin::Effect => {
                if let Some(token) = c.effect.token() {
                    tokens::observe(token);
                }
                replicate::replicate_verbatim(self.ctx);
            }
            Origin::Command { one_key: true, .. } if release => {
                replicate::replicate_verbatim(self.ctx)
            }
            Origin::Command { owner_arg, .. } => {
                self.replicate(&c.effect, owner_arg, self.label_arg.as_ref())
            }
            Origin::Module => self.replicate(&c.effect, None, None),
        }
    }

    /// The distributions of `INFO lease` see a holding renewed or ending.
    #[inline(always)]
    fn observe(&mut self, c: &Commit<'_>) {
        let record = match c.event {
            // A renewal's margin came with its decision: no record to read.
            Event::Renew { .. } => None,
            Event::Release { .. } | Event::Expire { .. } | Event::Lingered(_) => {
                self.key.get().ok().flatten().map(as_ref)
            }
            _ => return,
        };
        distribution::observe(record, &c.effect, c.event, counters::record);
    }

    #[inline(always)]
    fn replicate(
        &self,
        effect: &Effect<'_>,
        owner_arg: Option<ClientArg>,
        label_arg: Option<&ClientArg>,
    ) {
        let mut digits = Digits::default();
        let args = effect.args(&mut digits);
        replicate::replicate(
            self.ctx,
            effect.command(),
            self.name,
            args.as_slice(),
            owner_arg,
            label_arg,
        );
    }

    /// Counts an event and sends its keyspace notification.
    #[inline(always)]
    pub fn count(&mut self, event: Event) {
        let notify = |e: &CStr| replicate::notify(self.ctx, e, self.name);
        match event {
            Event::Acquire => {
                STATS.acquired.incr();
                notify(c"lease.acquire");
            }
            Event::Reacquire => {
                STATS.reacquired.incr();
                notify(c"lease.renew");
            }
            Event::ReacquireRaised => {
                STATS.reacquired.incr();
                notify(c"lease.acquire");
            }
            Event::Renew { .. } => {
                STATS.renewed.incr();
                notify(c"lease.renew");
            }
            Event::Release { .. } => {
                STATS.released.incr();
                notify(c"lease.release");
            }
            Event::Revoke => notify(c"lease.release"),
            Event::Guard => notify(c"lease.guard"),
            Event::Unguard => notify(c"lease.unguard"),
            Event::Expire { holders: n, .. } => {
                STATS.expired.add(n as u64);
                for _ in 0..n {
                    notify(c"lease.expire");
                }
            }
            Event::Lingered(n) => STATS.expired.add(n as u64),
            Event::Align | Event::Replayed => {}
        }
    }

    /// Deletes the key on this node alone (a replica that cannot follow its
    /// master's effects keeps no partial state, see `compat.rs`): not
    /// replicated, not counted.
    pub fn forget(&mut self) {
        self.key.delete();
        replicate::signal(self.ctx, self.name);
    }
}

impl ops::Key for KeyWriter {
    fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError> {
        KeyWriter::record(self)
    }

    fn expire_at(&mut self) -> Option<i64> {
        self.key.expire_at()
    }

    fn commit(&mut self, commit: Commit<'_>) {
        KeyWriter::commit(self, &commit);
    }

    fn count(&mut self, event: Event) {
        KeyWriter::count(self, event);
    }
}

fn as_ref(r: RecordMut<'_>) -> RecordRef<'_> {
    match r {
        RecordMut::Exclusive(l) => RecordRef::Exclusive(l),
        RecordMut::Holders(m) => RecordRef::Holders(m),
    }
}

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
    #[inline]
    pub fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError> {
        self.key.get().map(|r| r.map(as_ref))
    }

    /// The key's absolute expiry, if it has one.
    pub fn expire_at(&self) -> Option<i64> {
        self.key.expire_at()
    }
}

/// Writes `what` into the replication stream and the AOF: from a timer
/// right after the server forks (once an AOF rewrite has opened its new
/// incremental file), and when a replica comes online. Refused while writes
/// are paused (propagating then aborts Valkey); the caller tries again
/// later.
pub fn announce(ctx: Ctx, what: Announce) -> Result<(), Closed> {
    if server::writes_paused() {
        return Err(Closed::Paused);
    }
    if let Announce::Clock { last: 0 } = what {
        return Ok(());
    }
    let mut digits = Digits::default();
    replicate::replicate_keyless(ctx, what.command(), what.args(&mut digits).as_slice());
    Ok(())
}
