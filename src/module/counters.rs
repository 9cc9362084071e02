//! The counters of `INFO lease` (design.md S5), in the order they are shown.
//! Commands and callbacks run on the server's main thread; relaxed atomics
//! make the statics `Sync` without locks.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A monotonic counter.
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Every counter, by the name `INFO lease` shows it under (`lease_<name>`).
pub struct Stats {
    pub acquired: Counter,
    pub contended: Counter,
    pub reacquired: Counter,
    pub renewed: Counter,
    pub renew_failed: Counter,
    pub released: Counter,
    pub release_failed: Counter,
    pub expired: Counter,
    pub evicted: Counter,
    pub fence_ok: Counter,
    pub fence_stale: Counter,
    pub wait_timeouts: Counter,
    pub grace_refused: Counter,
}

pub static STATS: Stats = Stats {
    acquired: Counter::new(),
    contended: Counter::new(),
    reacquired: Counter::new(),
    renewed: Counter::new(),
    renew_failed: Counter::new(),
    released: Counter::new(),
    release_failed: Counter::new(),
    expired: Counter::new(),
    evicted: Counter::new(),
    fence_ok: Counter::new(),
    fence_stale: Counter::new(),
    wait_timeouts: Counter::new(),
    grace_refused: Counter::new(),
};

impl Stats {
    /// (name, value) for every counter.
    pub fn fields(&self) -> [(&'static str, u64); 13] {
        [
            ("acquired", self.acquired.get()),
            ("contended", self.contended.get()),
            ("reacquired", self.reacquired.get()),
            ("renewed", self.renewed.get()),
            ("renew_failed", self.renew_failed.get()),
            ("released", self.released.get()),
            ("release_failed", self.release_failed.get()),
            ("expired", self.expired.get()),
            ("evicted", self.evicted.get()),
            ("fence_ok", self.fence_ok.get()),
            ("fence_stale", self.fence_stale.get()),
            ("wait_timeouts", self.wait_timeouts.get()),
            ("grace_refused", self.grace_refused.get()),
        ]
    }

    /// Counts a refusal answered at once.
    pub fn count(&self, c: crate::lease::ops::Count) {
        use crate::lease::ops::Count;
        match c {
            Count::Contended => self.contended.incr(),
            Count::GraceRefused => self.grace_refused.incr(),
            Count::RenewFailed => self.renew_failed.incr(),
            Count::ReleaseFailed => self.release_failed.incr(),
        }
    }
}
