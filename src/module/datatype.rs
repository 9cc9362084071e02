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

use crate::lease::decide;
use crate::lease::record::Lease;

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
/// well formed, and with a token no further ahead of the clock than
/// `clock::MAX_AHEAD_MS`, so one RESTORE cannot exhaust the token clock.
/// Raises the clock to its token.
pub fn loaded(encver: i32, bytes: Option<&[u8]>) -> Option<Lease> {
    if encver > ENCVER {
        state::log_warning(&format!(
            "cannot load a lease value of encoding version {encver}: this module reads up to {ENCVER}"
        ));
        return None;
    }
    let checked =
        Lease::decode(bytes?).and_then(|l| l.check_not_ahead(state::now_ms()).map(|()| l));
    match checked {
        Ok(lease) => {
            state::observe_token(lease.token);
            Some(lease)
        }
        Err(e) => {
            state::log_warning(&format!("refusing a stored lease value: {e}"));
            None
        }
    }
}

/// A lease key named `name` leaves the keyspace (DEL, expiry, overwrite):
/// its waiters are re-checked right after, and an `expired` event that
/// follows counts it.
pub fn unlinked(name: &[u8]) {
    state::note_unlinked(name);
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
    if state::take_unlinked(key.bytes()) {
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

/// Does lease key `key` outlive its lease?
fn needs_alignment(ctx: Ctx, key: Str) -> bool {
    let mut r = Reader::open(ctx, key);
    let expire = r.expire_at();
    matches!(r.lease(), Ok(Some(l)) if decide::expiry_to_align(l, expire).is_some())
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
    let live = matches!(w.lease(), Ok(Some(l)) if l.is_live(state::now_ms()));
    if live {
        let _ = w.align_expiry();
    } else {
        w.delete_ended();
    }
}
