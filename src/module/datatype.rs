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

use crate::lease::{Record, RecordRef, decide, multi};

use super::ctx::{Ctx, Str};
use super::effects::{Reader, Writer};
use super::state::{self, STATS, TimerJob};
use super::waiters;

/// Encoding version of the RDB value (the record carries its own version too).
pub const ENCVER: i32 = 1;
/// Encoding version of the aux data (the token clock).
pub const AUX_ENCVER: i32 = 1;
/// The name `TYPE key` answers.
pub const TYPE_NAME: &str = "leasetype";

/// A value read from an RDB, a RESTORE or a MIGRATE, if it may be taken:
/// well formed (record version 1, an exclusive lease, or 2, a counting or
/// shared one), and with no token further ahead of the clock than
/// `clock::MAX_AHEAD_MS`, so one RESTORE cannot exhaust the token clock.
/// Raises the clock to its largest token.
pub fn loaded(encver: i32, bytes: Option<&[u8]>) -> Option<Record> {
    if encver > ENCVER {
        state::log_warning(&format!(
            "cannot load a lease value of encoding version {encver}: this module reads up to {ENCVER}"
        ));
        return None;
    }
    let checked = Record::decode(bytes?)
        .and_then(|r| r.as_ref().check_not_ahead(state::now_ms()).map(|()| r));
    match checked {
        Ok(record) => {
            state::observe_token(record.as_ref().max_token());
            Some(record)
        }
        Err(e) => {
            state::log_warning(&format!("refusing a stored lease value: {e}"));
            None
        }
    }
}

/// A lease key named `name`, whose record has `holders` holders, leaves
/// the keyspace (DEL, expiry, overwrite): its waiters are re-checked right
/// after, and an `expired` event that follows counts each holder.
pub fn unlinked(name: &[u8], holders: usize) {
    state::note_unlinked(name, holders);
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
pub fn on_expired(key: Str) {
    for _ in 0..state::take_unlinked(key.bytes()).unwrap_or(0) {
        STATS.expired.incr();
    }
}

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

/// Does lease key `key` outlive its lease (its latest holder)?
fn needs_alignment(ctx: Ctx, key: Str) -> bool {
    let mut r = Reader::open(ctx, key);
    let expire = r.expire_at();
    match r.record() {
        Ok(Some(RecordRef::Exclusive(l))) => decide::expiry_to_align(l, expire).is_some(),
        Ok(Some(RecordRef::Multi(m))) => multi::expiry_to_align(m, expire).is_some(),
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
