//! The lease data type's life in the keyspace, behind its type methods
//! (`entry/type_methods.rs`): what a loaded value must satisfy, what
//! an unlink or an expiry means, and the commands that change a lease
//! key's expiry behind the module's back (`RESTORE k 0`, `PEXPIRE`).
//!
//! The module does not subscribe to generic keyspace events: on Valkey 8.1
//! a module subscribed to them leaves the calling client on the event's
//! database after `MOVE` and `COPY ... DB` (valkey#4024). It watches the
//! expiry commands with a command filter instead, and RESTORE from the
//! type's load callback.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use crate::lease::codec::DecodeError;
use crate::lease::error::printable;
use crate::lease::{Record, RecordRef};

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lease::distribution::{self, Sample};
use crate::lease::ops;

use super::commit::{KeyWriter, Reader};
use super::counters::{self, STATS};
use super::ffi::ctx::{Ctx, Str};
use super::ffi::server::{log_warning, mono_ms, now_ms};
use super::timers::{self, TimerJob};
use super::{early, guards, info, tokens, waiters};

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
    /// master) saved. Taken as it is (design.md S3: a replica takes its master's
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
        log_warning(&format!(
            "cannot load a lease value of encoding version {encver}: this module reads up to {ENCVER}. It was written by a newer lease module: upgrade this node (replicas first, then fail over; never downgrade once newer records exist)"
        ));
        return None;
    }
    let record = match Record::decode(bytes?) {
        Ok(record) => record,
        Err(e @ DecodeError::FutureVersion(_)) => {
            log_warning(&format!(
                "refusing a stored lease value: {e} (module {}). It was written by a newer lease module: upgrade this node (replicas first, then fail over; never downgrade once newer records exist)",
                super::version::VERSION
            ));
            return None;
        }
        Err(e) => {
            log_warning(&format!("refusing a stored lease value: {e}"));
            return None;
        }
    };
    if let Err(e) = record.as_ref().check_not_ahead(now_ms()) {
        if source == Source::Restore {
            log_warning(&format!("refusing a stored lease value: {e}"));
            return None;
        }
        warn_far_ahead(&e);
    }
    tokens::observe(record.as_ref().max_token());
    Some(record)
}

/// Logs (at most once a minute) that a loaded token is far ahead of this
/// server's clock: it is taken, and the token clock goes on from it.
fn warn_far_ahead(e: &DecodeError) {
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let now = mono_ms();
    if now.saturating_sub(LAST.load(Relaxed)) >= 60_000 {
        LAST.store(now, Relaxed);
        log_warning(&format!(
            "loaded a lease value far ahead of this server's clock ({e}): taken as it is (a replica follows its master); the token clock goes on from it. Is this server's clock far behind its master's, or did it step back?"
        ));
    }
}

/// A lease key named `name`, with `record`, leaves the keyspace (DEL,
/// expiry, overwrite): its waiters are re-checked right after, and an
/// `expired` event that follows counts each holder and how long each
/// holding lasted.
pub fn unlinked(name: &[u8], record: RecordRef<'_>) {
    note_unlinked(name, record);
    waiters::key_changed(name);
}

/// A value was loaded outside of a load (RESTORE, MIGRATE's RESTORE): the
/// server sets the key's expiry from the command after this, so the key's
/// expiry is compared with the lease's deadline right after the command.
pub fn restored(db: i32, name: &[u8]) {
    timers::start(0, TimerJob::Align((db, name.to_vec())));
}

/// An `expired` keyspace event: counts the expiry of a lease key (its type
/// is gone by now; the unlink just before noted its name).
/// When the server expired it within its lease's deadline millisecond
/// (Redis 8.2's active expiry does, where every other server waits for the
/// next one), the lease counts as held until that millisecond has passed,
/// so that no one gets it while its holder may still hold it
/// (`early::ended_early`). A key whose expiry was set earlier than its lease's
/// deadline (`PEXPIRE`) ends when the server says.
pub fn on_expired(ctx: Ctx, key: Str) {
    let Some((holders, deadline_ms)) = take_unlinked(key.bytes(), true) else {
        return;
    };
    STATS.expired.add(holders as u64);
    if deadline_ms == now_ms() {
        early::note(ctx.selected_db(), key.bytes(), deadline_ms);
    }
}

/// An `evicted` keyspace event: a lease key was evicted under
/// `maxmemory-policy` (its holders lost their leases without knowing):
/// counted per holder, and logged at most once every ten seconds.
pub fn on_evicted(key: Str) {
    let Some((holders, _)) = take_unlinked(key.bytes(), false) else {
        return;
    };
    STATS.evicted.add(holders as u64);
    static LAST_LOG: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(i64::MIN);
    let now = mono_ms();
    let last = LAST_LOG.load(std::sync::atomic::Ordering::Relaxed);
    if now.saturating_sub(last) >= EVICTION_LOG_EVERY_MS {
        LAST_LOG.store(now, std::sync::atomic::Ordering::Relaxed);
        log_warning(&format!(
            "a lease key was evicted (maxmemory-policy {}): its holders lost their leases and another owner may take them; {} lease holders evicted since the start (lease_evicted). Use 'maxmemory-policy noeviction' for leases.",
            info::maxmemory_policy(),
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
/// key of `slot` (the commit schedules the one after when more remain). A
/// write the module starts by itself, so it passes the gates; a closed gate
/// tries again later, and a key whose slot moved away is left to its new
/// node.
pub fn on_drain(ctx: Ctx, slot: crate::lease::waitq::Slot) {
    timers::end_drain(&slot);
    let (db, key) = slot;
    if ctx.is_replica() || !ctx.select_db(db) {
        return;
    }
    let name = ctx.string(&key);
    match KeyWriter::for_module(ctx, name.as_str()) {
        Ok(mut w) => {
            let now = now_ms();
            if let Some(c) = w.record().ok().and_then(|r| ops::drain(r, now)) {
                w.commit(&c);
            }
        }
        Err(closed) => {
            if let Some(ms) = closed.retry_in_ms() {
                timers::start_drain(db, &key, ms);
            }
        }
    }
}

/// A load ended: a guard key it read but the server did not keep (its
/// TTL had passed when the snapshot was read: the server drops such a key
/// without an unlink) guards nothing.
pub fn after_load(ctx: Ctx) {
    let keys = guards::keys();
    if keys.is_empty() {
        return;
    }
    let before = ctx.selected_db();
    for (db, key) in keys {
        if !ctx.select_db(db) {
            continue;
        }
        let name = ctx.string(&key);
        let guards_now = matches!(
            Reader::open(ctx, name.as_str()).record(),
            Ok(Some(RecordRef::Exclusive(l))) if l.is_guard()
        );
        if !guards_now {
            guards::removed(db, &key);
            log_warning(&format!(
                "'{}' of database {db} was loaded as a guard but is gone (its TTL had passed): it guards nothing",
                printable(&key)
            ));
        }
    }
    ctx.select_db(before);
}

/// The alignment timer fired: sets the key's expiry back to its lease's
/// deadline, or deletes it when the lease has already ended
/// (`ops::align`). A write the module starts by itself, so it passes the
/// gates; when they are closed it is left as it is (the lease is free once
/// its deadline passes whatever the key's TTL).
pub fn on_align(ctx: Ctx, db: i32, key: &[u8]) {
    if ctx.is_replica() || !ctx.select_db(db) {
        return;
    }
    let name = ctx.string(key);
    let now = now_ms();
    let needed = {
        let mut r = Reader::open(ctx, name.as_str());
        let expire = r.expire_at();
        let record = r.record().ok().flatten();
        // A guard record the server loaded but did not keep (a RESTORE of
        // an already expired key) guards nothing; one it kept guards,
        // whatever the unlink of an old value under its name did.
        guards::restore_done(
            db,
            key,
            matches!(record, Some(RecordRef::Exclusive(l)) if l.is_guard()),
        );
        record
            .and_then(|rec| ops::align(Some(rec), expire, now))
            .is_some()
    };
    if !needed {
        return;
    }
    let Ok(mut w) = KeyWriter::for_module(ctx, name.as_str()) else {
        return;
    };
    let expire = w.expire_at();
    let owned = w
        .record()
        .ok()
        .and_then(|rec| ops::align(rec, expire, now).map(|c| c.to_owned()));
    if let Some(c) = owned {
        w.commit(&c.as_commit());
    }
}

/// The name of the lease key last unlinked, how many holders its record
/// had and its lease's deadline, and when, so the `expired` (or `evicted`)
/// event that follows an unlink at once can tell a lease key from any other
/// (its type is gone by then) and count each holder. Reused, so no
/// allocation per unlink once warm.
static LAST_UNLINKED: Mutex<Unlinked> = Mutex::new(Unlinked {
    name: Vec::new(),
    holders: 0,
    deadline_ms: 0,
    held: Vec::new(),
    at: None,
});

struct Unlinked {
    name: Vec<u8>,
    holders: usize,
    deadline_ms: i64,
    /// How long each holding lasted, had it ended at its deadline.
    held: Vec<Sample>,
    at: Option<Instant>,
}

fn note_unlinked(name: &[u8], record: RecordRef<'_>) {
    let mut last = LAST_UNLINKED.lock().unwrap_or_else(|e| e.into_inner());
    last.name.clear();
    last.name.extend_from_slice(name);
    last.holders = record.holders();
    last.deadline_ms = record.latest_deadline();
    last.held.clear();
    distribution::ended(record, &mut |s| last.held.push(s));
    last.at = Some(Instant::now());
}

/// How long after an unlink its `expired` or `evicted` event may come. The
/// server sends it right after the unlink, in the same call, but a loaded
/// machine may deschedule the server in between (a 1 ms bound missed an
/// eviction under a parallel test run). A longer bound only matters for a
/// lease key deleted without an event (DEL, overwrite) whose name a plain
/// key then takes and loses to expiry or eviction within it.
const UNLINK_EVENT_WITHIN: Duration = Duration::from_millis(100);

/// If `name` was the lease key unlinked just now (within
/// `UNLINK_EVENT_WITHIN`), how many holders it had and its lease's deadline;
/// `expired`: its holdings ended at their deadlines (recorded in `held`).
/// Clears the mark.
fn take_unlinked(name: &[u8], expired: bool) -> Option<(usize, i64)> {
    let mut last = LAST_UNLINKED.lock().unwrap_or_else(|e| e.into_inner());
    let recent = last
        .at
        .take()
        .is_some_and(|at| at.elapsed() < UNLINK_EVENT_WITHIN);
    if !(recent && last.name.as_slice() == name) {
        return None;
    }
    if expired {
        for &s in &last.held {
            counters::record(s);
        }
    }
    Some((last.holders, last.deadline_ms))
}
