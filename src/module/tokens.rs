//! The server's token clock (design.md S2): the last token issued or seen, on
//! any key in any database.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::lease::clock::TokenClock;

static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the token clock and stores what it leaves.
pub fn with_clock<T>(f: impl FnOnce(&mut TokenClock) -> T) -> T {
    let mut clock = TokenClock::new();
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
