//! Mixed module builds (upgrades). A master announces the effect and record
//! versions it speaks (`LEASE.VERSION effects records`, into the
//! replication stream and the AOF after every fork and whenever a replica
//! comes online). A node that receives versions newer than it understands
//! says so loudly, keeps no partial state (it deletes every lease key and
//! applies no lease effect from then on) and answers every lease command
//! with an error that says why, until it is upgraded, promoted (a new
//! master speaks its own versions; its grace period covers what it dropped)
//! or told by its master that the versions are ones it understands.
//!
//! Records newer than this build reads fail their load (RDB, full sync,
//! RESTORE) with a log line that says so (`datatype::loaded`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::lease::LeaseError;
use crate::lease::versions::{self, EFFECTS, RECORDS};

use super::commit::KeyWriter;
use super::ffi::ctx::Ctx;
use super::ffi::key::lease_key_names;
use super::ffi::server::log_warning;

/// The versions announced by a source this build cannot follow.
static INCOMPATIBLE: Mutex<Option<(u32, u32)>> = Mutex::new(None);
/// Whether `INCOMPATIBLE` is set: the hot paths read this alone.
static SET: AtomicBool = AtomicBool::new(false);

#[inline]
fn incompatible() -> Option<(u32, u32)> {
    if !SET.load(Relaxed) {
        return None;
    }
    incompatible_slow()
}

#[cold]
fn incompatible_slow() -> Option<(u32, u32)> {
    *INCOMPATIBLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn set(v: Option<(u32, u32)>) {
    *INCOMPATIBLE.lock().unwrap_or_else(|e| e.into_inner()) = v;
    SET.store(v.is_some(), Relaxed);
}

/// For every lease command a client sends: an error while this node
/// follows a source it cannot understand.
#[inline]
pub fn check() -> Result<(), LeaseError> {
    match incompatible() {
        None => Ok(()),
        Some((effects, records)) => Err(LeaseError::Incompatible { effects, records }),
    }
}

/// For every lease effect: is it to be ignored (this node keeps no lease
/// state from a source it cannot understand)?
#[inline]
pub fn ignoring_effects() -> bool {
    SET.load(Relaxed)
}

/// `lease_incompatible_source` of `INFO lease`: `none`, or the versions a
/// source announced that this build does not understand.
pub fn info() -> String {
    match incompatible() {
        None => "none".into(),
        Some((e, r)) => format!("effects {e} records {r}"),
    }
}

/// `LEASE.VERSION effects records` from the master or the AOF.
pub fn announced(ctx: Ctx, effects: u32, records: u32) {
    if versions::understands(effects, records) {
        if incompatible().is_some() {
            set(None);
            log_warning(&format!(
                "the lease effects and records of this node's source (effects {effects}, records {records}) are ones it understands again: it applies lease effects again (the leases it dropped come back with the next full sync)"
            ));
        }
        return;
    }
    set(Some((effects, records)));
    let dropped = drop_all(ctx);
    log_warning(&format!(
        "=== INCOMPATIBLE LEASE MODULE === this node's source (its master, or the AOF it loads) speaks lease effects {effects} and records {records}; this build (module {}) understands effects up to {EFFECTS} and records up to {RECORDS}. It deleted its {dropped} lease keys, applies no lease effect and refuses every lease command until it is upgraded: upgrade replicas first, then fail over to them; never downgrade a node once newer records exist.",
        super::version::VERSION
    ));
}

/// This node became a master: it speaks its own versions again.
pub fn on_promoted() {
    if incompatible().is_some() {
        set(None);
        log_warning(
            "promoted: this node applies its own lease effects again (its grace period covers the leases it dropped)",
        );
    }
}

/// Deletes every lease key in every database; returns how many.
fn drop_all(ctx: Ctx) -> usize {
    let before = ctx.selected_db();
    let dbs = ctx
        .config_get(c"databases")
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(16);
    let mut n = 0;
    for db in 0..dbs {
        if !ctx.select_db(db) {
            continue;
        }
        for name in lease_key_names(ctx) {
            let name = ctx.string(&name);
            KeyWriter::for_effect(ctx, name.as_str()).forget();
            n += 1;
        }
    }
    ctx.select_db(before);
    n
}
