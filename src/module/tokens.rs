//! The server's token clock (design.md S2): the last token issued or seen, on
//! any key in any database.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::lease::clock::TokenClock;

static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);
/// The lowest token this run issues (`clock::start_floor`; 0 after a start
/// that lost nothing).
static LOWEST: AtomicU64 = AtomicU64::new(0);

/// This start may have lost a `FLOOR` the previous run accepted: no token
/// below `lowest` from now on.
pub fn issue_at_least(lowest: u64) {
    LOWEST.fetch_max(lowest, Relaxed);
}

/// Runs `f` on the token clock and stores what it leaves.
pub fn with_clock<T>(f: impl FnOnce(&mut TokenClock) -> T) -> T {
    let mut clock = TokenClock::at_least(LOWEST.load(Relaxed));
    clock.observe(LAST_TOKEN.load(Relaxed));
    let out = f(&mut clock);
    LAST_TOKEN.store(clock.last(), Relaxed);
    out
}

/// The last token issued or observed.
pub fn last() -> u64 {
    LAST_TOKEN.load(Relaxed)
}

/// Raises the clock to at least `token`.
pub fn observe(token: u64) {
    with_clock(|c| c.observe(token));
}

/// Valkey atomic slot migrations this node exports now (between their
/// start and their end).
static EXPORTS: AtomicUsize = AtomicUsize::new(0);
/// The clock was written into the snapshot this process writes (set in the
/// snapshot's child only: the parent never rewrites).
static CLOCK_IN_SNAPSHOT: AtomicBool = AtomicBool::new(false);

/// An atomic slot migration out of this node started (`started`) or ended.
pub fn exporting(started: bool) {
    if started {
        EXPORTS.fetch_add(1, Relaxed);
    } else {
        let _ = EXPORTS.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }
}

/// The clock to write ahead of the first lease key of a slot migration's
/// snapshot (forked while an export runs), once per snapshot: the target
/// then issues no token below one the source issued on a key of the slot
/// that was released before the move. `None` otherwise (an AOF rewrite
/// gets its clock from the fork's announcement, `LEASE.CLOCK` through the
/// replication stream, which the migration's stream leaves out: it carries
/// only commands with a key of the slot).
pub fn clock_for_snapshot() -> Option<u64> {
    (EXPORTS.load(Relaxed) > 0 && !CLOCK_IN_SNAPSHOT.swap(true, Relaxed)).then(last)
}
