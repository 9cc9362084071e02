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

use crate::lease::distribution;
use crate::lease::ops;

use super::commit::{KeyWriter, Reader};
use super::counters::{self, STATS};
use super::ffi::ctx::Ctx;
use super::ffi::server::{self, log_warning, mono_ms, now_ms};
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

/// A lease key named `name` of `db`, with `record`, leaves the keyspace
/// (DEL, expiry, eviction, overwrite; not the module's own deletions): its
/// waiters are re-checked right after, and an expiry or an eviction is
/// counted per holder. Told apart here, without a keyspace subscription
/// (which every write of every key would pay for, design.md S11):
/// - an expiry: the lease's deadline has come (the server expires a lease
///   key at its deadline; a key that outlived it is expired by the lookup
///   of any command that touches it). Its holdings count in `held`. When
///   the server expired it within its deadline's millisecond (Redis 8.2's
///   active expiry does, where every other server waits for the next one),
///   the lease counts as held until that millisecond has passed, so that no
///   one gets it while its holder may still hold it (`early::ended_early`);
/// - an eviction: a live lease's key leaves while the server is over its
///   `maxmemory`;
/// - anything else (a DEL, an overwrite, a shorter `PEXPIRE` run out) is no
///   lease ending by itself, and is not counted.
///
/// A replica, and a load, count nothing: they apply what their source
/// decided.
pub fn unlinked(db: i32, name: &[u8], record: RecordRef<'_>) {
    waiters::key_changed(name);
    let Some(server) = server::detached() else {
        return;
    };
    if server.is_replica() || server.is_loading() {
        return;
    }
    let now = now_ms();
    let deadline_ms = record.latest_deadline();
    // A guard key has no expiry (its lease ends without it going).
    if deadline_ms <= now && !record.is_guard() {
        STATS.expired.add(record.holders() as u64);
        distribution::ended(record, &mut counters::record);
        if deadline_ms == now {
            early::note(db, name, deadline_ms);
        }
    } else if server.out_of_memory() {
        evicted(record.holders());
    }
}

/// A lease key was evicted under `maxmemory-policy` (its holders lost
/// their leases without knowing): counted per holder, and logged at most
/// once every ten seconds.
fn evicted(holders: usize) {
    STATS.evicted.add(holders as u64);
    static LAST_LOG: AtomicI64 = AtomicI64::new(i64::MIN);
    let now = mono_ms();
    let last = LAST_LOG.load(Relaxed);
    if now.saturating_sub(last) >= EVICTION_LOG_EVERY_MS {
        LAST_LOG.store(now, Relaxed);
        log_warning(&format!(
            "a lease key was evicted (maxmemory-policy {}): its holders lost their leases and another owner may take them; {} lease holders evicted since the start (lease_evicted). Use 'maxmemory-policy noeviction' for leases.",
            info::maxmemory_policy(),
            STATS.evicted.get()
        ));
    }
}

/// A value was loaded outside of a load (RESTORE, MIGRATE's RESTORE): the
/// server sets the key's expiry from the command after this, so the key's
/// expiry is compared with the lease's deadline right after the command.
pub fn restored(db: i32, name: &[u8]) {
    timers::start(0, TimerJob::Align((db, name.to_vec())));
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

/// A load that read guard records ended: a guard key it read but the
/// server did not keep (its
/// TTL had passed when the snapshot was read: the server drops such a key
/// without an unlink) guards nothing.
pub fn after_load(ctx: Ctx) {
    guards::load_looked_at();
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
            Ok(Some(r)) if r.is_guard()
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
        guards::restore_done(db, key, record.is_some_and(RecordRef::is_guard));
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
