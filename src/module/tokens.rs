//! The server's token clock (design.md S2): the last token issued or seen, on
//! any key in any database.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
