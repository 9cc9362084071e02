//! Statistics of latency samples (microseconds): nearest-rank percentiles,
//! the median, a summary, and how a figure is printed.

/// Percentile `p` of sorted samples (nearest rank); NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median (the mean of the middle two for an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The distribution of one measurement's samples.
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    /// Rounds that gave no sample.
    pub failures: usize,
}

impl Summary {
    pub fn of(mut samples: Vec<f64>, failures: usize) -> Summary {
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let mean = if samples.is_empty() {
            f64::NAN
        } else {
            samples.iter().sum::<f64>() / samples.len() as f64
        };
        Summary {
            n: samples.len(),
            p50: percentile(&samples, 50.0),
            p99: percentile(&samples, 99.0),
            max: samples.last().copied().unwrap_or(f64::NAN),
            mean,
            failures,
        }
    }

    /// "50", or "48 (2 failed)".
    pub fn rounds(&self) -> String {
        if self.failures > 0 {
            format!("{} ({} failed)", self.n, self.failures)
        } else {
            self.n.to_string()
        }
    }

    /// "p50 / p99 / max".
    pub fn p50_p99_max(&self) -> String {
        format!(
            "{} / {} / {}",
            fmt_us(self.p50),
            fmt_us(self.p99),
            fmt_us(self.max)
        )
    }
}

/// Microseconds as "123 us", "1.23 ms" or "12.3 ms" ("n/a" for NaN).
pub fn fmt_us(us: f64) -> String {
    if us.is_nan() {
        "n/a".into()
    } else if us.abs() >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us.abs() >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.0} us", us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn medians_and_summaries() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let s = Summary::of(vec![3.0, 1.0, 2.0], 1);
        assert_eq!((s.n, s.p50, s.max, s.mean), (3, 2.0, 3.0, 2.0));
        assert_eq!(s.rounds(), "3 (1 failed)");
    }

    #[test]
    fn formats_microseconds() {
        assert_eq!(fmt_us(-13.2), "-13 us");
        assert_eq!(fmt_us(2450.0), "2.45 ms");
        assert_eq!(fmt_us(44_512.0), "44.5 ms");
        assert_eq!(fmt_us(f64::NAN), "n/a");
    }
}
