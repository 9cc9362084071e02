//! The lease data type's life in the keyspace, behind its `extern "C"`
//! callbacks (in `callbacks.rs`): what a loaded value must satisfy, what
//! an unlink or an expiry means, and the commands that change a lease
//! key's expiry behind the module's back (`RESTORE k 0`, `PEXPIRE`).
//!
//! The module does not subscribe to generic keyspace events: on Valkey 8.1
//! a module subscribed to them leaves the calling client on the event's
//! database after `MOVE` and `COPY ... DB` (valkey#4024). It watches the
//! expiry commands with a command filter instead, and RESTORE from the
//! type's load callback.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

use crate::lease::codec::DecodeError;
use crate::lease::{Record, RecordRef, decide};

use super::ctx::{Ctx, Str};
use super::effects::{Closed, PRUNE_PER_TICK, Reader, Writer};
use super::state::{self, STATS, TimerJob};
use super::waiters;

/// Encoding version of the RDB value (the record carries its own version too).
pub const ENCVER: i32 = 1;
/// Encoding version of the aux data (the token clock).
pub const AUX_ENCVER: i32 = 1;
/// The name `TYPE key` answers.
pub const TYPE_NAME: &str = "leasetype";

/// Where a stored value comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// An RDB load, a full sync or DEBUG RELOAD: what this server (or its
    /// master) saved. Taken as it is (SPEC S3: a replica takes its master's
    /// state, never a result of its own clock).
    Load,
    /// RESTORE or MIGRATE: one client's value.
    Restore,
}

/// A value read from an RDB, a RESTORE or a MIGRATE, if it may be taken:
/// well formed (record version 1, an exclusive lease, or 2, a counting or
/// shared one). A RESTORE or MIGRATE payload may carry no token further
/// ahead of the clock than `clock::MAX_AHEAD_MS`, so one client cannot
/// exhaust the token clock; a load takes what it is given and warns when a
/// token is that far ahead (a clock over a year behind the master's, or
/// stepped back). Raises the clock to its largest token.
pub fn loaded(encver: i32, bytes: Option<&[u8]>, source: Source) -> Option<Record> {
    if encver > ENCVER {
        state::log_warning(&format!(
            "cannot load a lease value of encoding version {encver}: this module reads up to {ENCVER}. It was written by a newer lease module: upgrade this node (replicas first, then fail over; never downgrade once newer records exist)"
        ));
        return None;
    }
    let record = match Record::decode(bytes?) {
        Ok(record) => record,
        Err(e @ DecodeError::FutureVersion(_)) => {
            state::log_warning(&format!(
                "refusing a stored lease value: {e} (module {}). It was written by a newer lease module: upgrade this node (replicas first, then fail over; never downgrade once newer records exist)",
                super::VERSION
            ));
            return None;
        }
        Err(e) => {
            state::log_warning(&format!("refusing a stored lease value: {e}"));
            return None;
        }
    };
    if let Err(e) = record.as_ref().check_not_ahead(state::now_ms()) {
        if source == Source::Restore {
            state::log_warning(&format!("refusing a stored lease value: {e}"));
            return None;
        }
        warn_far_ahead(&e);
    }
    state::observe_token(record.as_ref().max_token());
    Some(record)
}

/// Logs (at most once a minute) that a loaded token is far ahead of this
/// server's clock: it is taken, and the token clock goes on from it.
fn warn_far_ahead(e: &DecodeError) {
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let now = state::mono_ms();
    if now.saturating_sub(LAST.load(Relaxed)) >= 60_000 {
        LAST.store(now, Relaxed);
        state::log_warning(&format!(
            "loaded a lease value far ahead of this server's clock ({e}): taken as it is (a replica follows its master); the token clock goes on from it. Is this server's clock far behind its master's, or did it step back?"
        ));
    }
}

/// A lease key named `name`, whose record has `holders` holders, leaves
/// the keyspace (DEL, expiry, overwrite): its waiters are re-checked right
/// after, and an `expired` event that follows counts each holder.
pub fn unlinked(name: &[u8], holders: usize, deadline_ms: i64) {
    state::note_unlinked(name, holders, deadline_ms);
    waiters::key_changed(name);
}

/// A value was loaded outside of a load (RESTORE, MIGRATE's RESTORE): the
/// server sets the key's expiry from the command after this, so the key's
/// expiry is compared with the lease's deadline right after the command.
pub fn restored(db: i32, name: &[u8]) {
    state::start_timer(0, TimerJob::Align((db, name.to_vec())));
}

/// An `expired` keyspace event: counts the expiry of a lease key (its type
/// is gone by now; the unlink just before noted its name).
/// When the server expired it within its lease's deadline millisecond
/// (Redis 8.2's active expiry does, where every other server waits for the
/// next one), the lease counts as held until that millisecond has passed,
/// so that no one gets it while its holder may still hold it
/// (`ended_early`). A key whose expiry was set earlier than its lease's
/// deadline (`PEXPIRE`) ends when the server says.
pub fn on_expired(ctx: Ctx, key: Str) {
    let Some((holders, deadline_ms)) = state::take_unlinked(key.bytes()) else {
        return;
    };
    STATS.expired.add(holders as u64);
    if deadline_ms == state::now_ms() {
        let mut early = ENDED_EARLY.lock().unwrap_or_else(|e| e.into_inner());
        early.push((ctx.selected_db(), key.bytes().to_vec(), deadline_ms));
        ANY_ENDED_EARLY.store(true, Relaxed);
    }
}

/// Lease keys the server expired within their deadline's millisecond:
/// (database, name, deadline). Entries leave once that millisecond passed.
static ENDED_EARLY: std::sync::Mutex<Vec<(i32, Vec<u8>, i64)>> = std::sync::Mutex::new(Vec::new());
/// Whether `ENDED_EARLY` may hold an entry: the hot paths read this alone.
static ANY_ENDED_EARLY: AtomicBool = AtomicBool::new(false);

/// Did the server expire any lease key within its deadline's millisecond
/// lately? (The hot paths ask this, one load, before `ended_early`.)
#[inline]
pub fn any_ended_early() -> bool {
    ANY_ENDED_EARLY.load(Relaxed)
}

/// If the server expired lease key `name` of database `db` within its
/// deadline's millisecond and that millisecond has not passed yet, the
/// deadline: the key is gone, but its lease counts as held until then.
pub fn ended_early(db: i32, name: &[u8]) -> Option<i64> {
    if !any_ended_early() {
        return None;
    }
    let now = state::now_ms();
    let mut early = ENDED_EARLY.lock().unwrap_or_else(|e| e.into_inner());
    early.retain(|&(_, _, deadline)| deadline >= now);
    // Bounded: entries live for a millisecond at most.
    ANY_ENDED_EARLY.store(!early.is_empty(), Relaxed);
    early
        .iter()
        .find(|(d, n, _)| *d == db && n.as_slice() == name)
        .map(|&(_, _, deadline)| deadline)
}

/// An `evicted` keyspace event: a lease key was evicted under
/// `maxmemory-policy` (its holders lost their leases without knowing):
/// counted per holder, and logged at most once every ten seconds.
pub fn on_evicted(key: Str) {
    let Some((holders, _)) = state::take_unlinked(key.bytes()) else {
        return;
    };
    STATS.evicted.add(holders as u64);
    static LAST_LOG: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(i64::MIN);
    let now = state::mono_ms();
    let last = LAST_LOG.load(std::sync::atomic::Ordering::Relaxed);
    if now.saturating_sub(last) >= EVICTION_LOG_EVERY_MS {
        LAST_LOG.store(now, std::sync::atomic::Ordering::Relaxed);
        state::log_warning(&format!(
            "a lease key was evicted (maxmemory-policy {}): its holders lost their leases and another owner may take them; {} lease holders evicted since the start (lease_evicted). Use 'maxmemory-policy noeviction' for leases.",
            state::maxmemory_policy(),
            STATS.evicted.get()
        ));
    }
}

/// At most one eviction log line per this many milliseconds.
const EVICTION_LOG_EVERY_MS: i64 = 10_000;

/// A command is about to run (the command filter, registered only while
/// someone waits, and not NOSELF: a PEXPIRE run through LEASE.FENCE counts
/// too): an expiry command on a key that clients wait on re-checks their
/// queues right after it, so a shorter `PEXPIRE` hands the lease over when
/// the key goes, not at the lease's old deadline.
pub fn before_command(name: &[u8], key: Option<&[u8]>) {
    let expiry = [&b"expire"[..], b"pexpire", b"expireat", b"pexpireat"];
    if let Some(key) = key
        && expiry.iter().any(|e| e.eq_ignore_ascii_case(name))
    {
        waiters::key_changed(key);
    }
}

/// The drain timer fired: takes the next batch of ended holders out of the
/// key of `slot` (scheduling the one after when more remain). A write the
/// module starts by itself, so it passes the gates; a closed gate tries
/// again later, and a key whose slot moved away is left to its new node.
pub fn on_drain(ctx: Ctx, slot: crate::lease::waitq::Slot) {
    state::end_drain(&slot);
    let (db, key) = slot;
    if ctx.is_replica() || !ctx.select_db(db) {
        return;
    }
    let name = ctx.string(&key);
    match Writer::open_gated(ctx, name.as_str()) {
        Ok(mut w) => {
            w.prune_up_to(state::now_ms(), PRUNE_PER_TICK);
        }
        Err(Closed::Moved(_)) => {}
        Err(_) => state::start_drain(db, &key, DRAIN_RETRY_MS),
    }
}

/// How soon a drain whose write gate was closed tries again.
const DRAIN_RETRY_MS: i64 = 50;

/// Does lease key `key` outlive its lease (its latest holder)?
fn needs_alignment(ctx: Ctx, key: Str) -> bool {
    let mut r = Reader::open(ctx, key);
    let expire = r.expire_at();
    match r.record() {
        Ok(Some(RecordRef::Exclusive(l))) => decide::expiry_to_align(l, expire).is_some(),
        Ok(Some(RecordRef::Multi(m))) => decide::holders_expiry_to_align(m, expire).is_some(),
        _ => false,
    }
}

/// The alignment timer fired: sets the key's expiry back to its lease's
/// deadline, or deletes it when the lease has already ended. A write the
/// module starts by itself, so it passes the gates; when they are closed it
/// is left as it is (the lease is free once its deadline passes whatever
/// the key's TTL).
pub fn on_align(ctx: Ctx, db: i32, key: &[u8]) {
    if ctx.is_replica() || !ctx.select_db(db) {
        return;
    }
    let name = ctx.string(key);
    if !needs_alignment(ctx, name.as_str()) {
        return;
    }
    let Ok(mut w) = Writer::open_gated(ctx, name.as_str()) else {
        return;
    };
    let now = state::now_ms();
    let live = match w.record() {
        Ok(Some(RecordRef::Exclusive(l))) => l.is_live(now),
        Ok(Some(RecordRef::Multi(m))) => m.is_live(now),
        _ => false,
    };
    if live {
        let _ = w.align_expiry();
    } else {
        w.delete_ended();
    }
}
