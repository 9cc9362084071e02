//! The counters of `INFO lease`: the one instance the binding counts in
//! (the table is `lease::stats`).

use crate::lease::ops::Count;
pub use crate::lease::stats::Stats;

pub static STATS: Stats = Stats::new();

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
