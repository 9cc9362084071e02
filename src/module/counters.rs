//! The counters and distributions of `INFO lease`: the one instance of
//! each the binding records in (the tables are `lease::stats` and
//! `lease::distribution`).

use crate::lease::distribution::{Distributions, Sample, renewed_late};
use crate::lease::ops::Count;
pub use crate::lease::stats::Stats;

pub static STATS: Stats = Stats::new();

/// The distributions (design.md S11), since the start or the last
/// `CONFIG RESETSTAT`.
pub static DISTRIBUTIONS: Distributions = Distributions::new();

impl Stats {
    /// Counts a refusal answered at once.
    pub fn count(&self, c: Count) {
        match c {
            Count::Contended => self.contended.incr(),
            Count::GraceRefused => self.grace_refused.incr(),
            Count::RenewFailed => self.renew_failed.incr(),
            Count::ReleaseFailed => self.release_failed.incr(),
        }
    }
}

/// Records what a commit tells the distributions.
#[inline]
pub fn record(sample: Sample) {
    match sample {
        Sample::Held(ms) => DISTRIBUTIONS.held.record(ms),
        Sample::Renewed { left_ms, ttl_ms } => {
            DISTRIBUTIONS.renew_margin.record(left_ms);
            if renewed_late(left_ms, ttl_ms) {
                STATS.renewed_late.incr();
            }
        }
    }
}

/// A `BLOCK` wait that lasted `ms` ended (served or timed out).
pub fn record_waited(ms: i64) {
    DISTRIBUTIONS.waited.record(ms)
}
