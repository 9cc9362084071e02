//! The distributions of `INFO lease` (design.md S11): how long holdings
//! lasted, how long `BLOCK` waits lasted, and how much time a lease had
//! left when a renewal arrived. The counters are `stats.rs`.

use super::effect::Effect;
use super::ops::Event;
use super::record::RecordRef;

/// A distribution of durations in ms (design.md S11): O(1) to record, a
/// fixed amount of memory (about 35 KB), its percentiles within 1%.
pub struct Distribution(hdrhistogram::Histogram<u64>);

/// The longest duration told apart (about 31 years); longer ones count as
/// this.
const MAX_RECORDED_MS: u64 = 1_000_000_000_000;

impl Distribution {
    pub fn new() -> Self {
        Distribution(
            hdrhistogram::Histogram::new_with_bounds(1, MAX_RECORDED_MS, 2)
                .expect("valid histogram bounds"),
        )
    }

    /// Records one duration (negative ones as 0).
    pub fn record(&mut self, ms: i64) {
        self.0.saturating_record(ms.max(0) as u64);
    }

    pub fn reset(&mut self) {
        self.0.reset();
    }

    /// `count`, `p50`, `p99`, `p999` and `max`, in ms (0 when empty).
    pub fn summary(&self) -> [(&'static str, u64); 5] {
        let h = &self.0;
        let q = |q: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q)
            }
        };
        [
            ("count", h.len()),
            ("p50", q(0.5)),
            ("p99", q(0.99)),
            ("p999", q(0.999)),
            ("max", if h.is_empty() { 0 } else { h.max() }),
        ]
    }
}

impl Default for Distribution {
    fn default() -> Self {
        Distribution::new()
    }
}

/// The distributions of `INFO lease`, by the name it shows them under
/// (`lease_<name>_<count|p50|p99|p999|max>`).
#[derive(Default)]
pub struct Distributions {
    /// How long holdings lasted, ended by release or expiry.
    pub held: Distribution,
    /// How long `BLOCK` waits lasted, served or timed out.
    pub waited: Distribution,
    /// The time a lease had left when a renewal arrived.
    pub renew_margin: Distribution,
}

impl Distributions {
    pub fn reset(&mut self) {
        self.held.reset();
        self.waited.reset();
        self.renew_margin.reset();
    }

    /// (name, summary) of each, in the order `INFO lease` shows them.
    pub fn all(&self) -> [(&'static str, &Distribution); 3] {
        [
            ("held", &self.held),
            ("waited", &self.waited),
            ("renew_margin", &self.renew_margin),
        ]
    }
}

/// Is a renewal that found `left_ms` of a `ttl_ms` lease left late (less
/// than a tenth of the ttl)?
pub fn renewed_late(left_ms: i64, ttl_ms: i64) -> bool {
    left_ms.saturating_mul(10) < ttl_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_distribution_gives_its_percentiles_within_one_percent() {
        let mut d = Distribution::new();
        assert_eq!(d.summary().map(|(_, v)| v), [0; 5]);
        for ms in 1..=1000 {
            d.record(ms);
        }
        d.record(-5);
        d.record(i64::MAX);
        let s: Vec<u64> = d.summary().iter().map(|(_, v)| *v).collect();
        assert_eq!(s[0], 1002);
        let near = |v: u64, want: u64| v.abs_diff(want) * 100 <= want;
        assert!(near(s[1], 500), "{s:?}");
        assert!(near(s[2], 990), "{s:?}");
        assert!(near(s[3], 1000), "{s:?}");
        assert!(s[4] >= MAX_RECORDED_MS, "{s:?}");
        d.reset();
        assert_eq!(d.summary()[0].1, 0);
    }

    #[test]
    fn late_means_less_than_a_tenth_of_the_ttl() {
        assert!(renewed_late(99, 1000));
        assert!(!renewed_late(100, 1000));
        assert!(renewed_late(0, 1));
    }
}

/// What a committed effect tells the distributions, as the master commits
/// it (a replica and an AOF replay count nothing: the master did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// A holding ended after lasting this long (ms).
    Held(i64),
    /// A renewal found this much of its lease left (ms), and asked for a
    /// lease of `ttl_ms`.
    Renewed { left_ms: i64, ttl_ms: i64 },
}

/// Calls `f` with what committing `effect` as `event` tells the
/// distributions, given the record it applies to (before it applies): a
/// release ends its holding when it was decided, a batch of ended holders
/// ended each at its deadline, a renewal has a margin. O(1), or O(k) for
/// a batch of k.
#[inline(always)]
pub fn observe(
    record: Option<RecordRef<'_>>,
    effect: &Effect<'_>,
    event: Event,
    mut f: impl FnMut(Sample),
) {
    let Some(record) = record else { return };
    match (event, effect, record) {
        (Event::Release { at_ms }, Effect::Release { owner }, RecordRef::Exclusive(l))
            if l.is_held_by(owner) =>
        {
            f(Sample::Held(at_ms - l.since_ms))
        }
        (Event::Release { at_ms }, Effect::Drop { owner }, RecordRef::Holders(m)) => {
            if let Some(h) = m.holder(owner) {
                f(Sample::Held(at_ms - h.since_ms))
            }
        }
        (Event::Renew { at_ms }, Effect::Apply { deadline_ms, .. }, RecordRef::Exclusive(l)) => {
            f(Sample::Renewed {
                left_ms: l.deadline_ms - at_ms,
                ttl_ms: deadline_ms - at_ms,
            })
        }
        (
            Event::Renew { at_ms },
            Effect::Hold {
                owner, deadline_ms, ..
            },
            RecordRef::Holders(m),
        ) => {
            if let Some(h) = m.holder(owner) {
                f(Sample::Renewed {
                    left_ms: h.deadline_ms - at_ms,
                    ttl_ms: deadline_ms - at_ms,
                })
            }
        }
        (Event::Expire { .. }, Effect::Prune { deadline_ms, token }, RecordRef::Holders(m)) => {
            for h in m.ended_through(*deadline_ms, *token) {
                f(Sample::Held(h.deadline_ms - h.since_ms))
            }
        }
        (Event::Lingered(_), _, record) => ended(record, &mut f),
        _ => {}
    }
}

/// Every holding of `record`, as ended at its deadline.
pub fn ended(record: RecordRef<'_>, f: &mut impl FnMut(Sample)) {
    match record {
        RecordRef::Exclusive(l) => f(Sample::Held(l.deadline_ms - l.since_ms)),
        RecordRef::Holders(m) => {
            for h in m.holders() {
                f(Sample::Held(h.deadline_ms - h.since_ms))
            }
        }
    }
}
