//! The checker over what the holders saw: holdings of a key that overlap
//! (`overlaps`, `strict_overlaps`), fenced writes that went backwards,
//! tokens that did not grow, what the failovers lost (`lost_in`); and the
//! `assert_*` functions the tests end with.

use std::time::{Duration, Instant};

use super::workload::{Holding, KEYS, Write};
use super::{Outcome, Params};
use crate::common::*;

/// Client-side timing noise allowed between two holdings: the server's
/// clock is in whole milliseconds (a lease may end up to 1 ms before
/// `sent + ttl` as measured here), plus scheduling slack.
const MARGIN: Duration = Duration::from_millis(5);

/// Two holdings of one key that overlap by more than MARGIN, with `end`
/// as the end of a holding.
pub(super) fn overlaps(
    holdings: &[Holding],
    end: fn(&Holding) -> Instant,
) -> Vec<(Holding, Holding)> {
    let mut out = Vec::new();
    for k in 0..KEYS {
        let mut hs: Vec<&Holding> = holdings.iter().filter(|h| h.key == k).collect();
        hs.sort_by_key(|h| h.start);
        for (i, a) in hs.iter().enumerate() {
            for b in &hs[i + 1..] {
                if b.start + MARGIN < end(a) {
                    out.push(((*a).clone(), (*b).clone()));
                }
            }
        }
    }
    out
}

pub(super) fn strict_overlaps(holdings: &[Holding]) -> Vec<(Holding, Holding)> {
    overlaps(holdings, |h| h.end)
}

/// Fenced writes that replaced a larger token.
pub(super) fn backwards(writes: &[Write]) -> Vec<Write> {
    writes
        .iter()
        .filter(|w| w.prev.is_some_and(|p| p > w.token))
        .cloned()
        .collect()
}

/// Holdings of a key where a later one (started after the other ended) has
/// a token that is not larger.
pub(super) fn token_regressions(holdings: &[Holding]) -> Vec<(Holding, Holding)> {
    let mut out = Vec::new();
    for a in holdings {
        for b in holdings {
            if a.key == b.key && a.end <= b.start && a.token >= b.token {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

/// Acquisitions and renewals the killed master acknowledged while the
/// replica that then became master was cut off: lost in the failover.
pub(super) fn lost_in(outcome: &Outcome) -> (usize, usize) {
    let mut grants = 0;
    let mut renewals = 0;
    for f in outcome
        .failovers
        .iter()
        .filter(|f| f.promoted_port == f.cut_port)
    {
        for h in &outcome.holdings {
            for (i, (at, port)) in h.acks.iter().enumerate() {
                if *port == f.killed_port && *at >= f.cut_at && *at <= f.killed_at {
                    if i == 0 {
                        grants += 1;
                    } else {
                        renewals += 1;
                    }
                }
            }
        }
    }
    (grants, renewals)
}

/// Every node but the one the test killed is alive.
pub(super) fn assert_alive_but(cluster: &mut Cluster, dead: usize) {
    for (i, n) in cluster.nodes.iter_mut().enumerate() {
        if i != dead {
            n.assert_alive("after the failover", false);
        }
    }
}

/// What every run must show, grace or not: the failovers happened as
/// staged, the fence kept the data in order and tokens grew.
fn assert_fenced_and_ordered(p: &Params, o: &Outcome, report: &str) {
    assert!(
        o.counts.granted >= p.min_granted,
        "too little load\n{report}"
    );
    assert!(
        (p.kills..=p.kills + p.more_kills).contains(&o.failovers.len()),
        "{report}"
    );
    for f in &o.failovers {
        assert_eq!(
            f.promoted_port, f.cut_port,
            "Sentinel promoted another replica than the one cut off\n{report}"
        );
    }
    let (grants, renewals) = lost_in(o);
    assert!(
        grants + renewals > 0,
        "the failovers lost nothing\n{report}"
    );
    let back = backwards(&o.writes);
    assert!(
        back.is_empty(),
        "fenced writes went backwards: {back:?}\n{report}"
    );
    let reg = token_regressions(&o.holdings);
    assert!(
        reg.is_empty(),
        "a later holding got a smaller token: {:?}\n{report}",
        reg.first()
    );
}

/// With the grace: each promotion logged its period and refused grants,
/// and no two holders ever held a key at once.
pub(super) fn assert_no_double_grant(p: &Params, o: &Outcome, report: &str) {
    assert_fenced_and_ordered(p, o, report);
    for f in &o.failovers {
        assert!(
            f.grace_logged,
            "no grace logged on :{}\n{report}",
            f.promoted_port
        );
    }
    let refused: i64 = o.failovers.iter().map(|f| f.grace_refused).sum();
    assert!(refused > 0, "the grace refused nothing\n{report}");
    assert!(
        strict_overlaps(&o.holdings).is_empty(),
        "two holders at once, with the grace\n{report}"
    );
}

/// Without the grace: nothing refused by a grace; overlaps are reported.
pub(super) fn assert_graceless(p: &Params, o: &Outcome, report: &str) {
    assert_fenced_and_ordered(p, o, report);
    for f in &o.failovers {
        assert_eq!(f.grace_refused, 0, "{report}");
        assert_eq!(f.grace_seen.1, "none", "{report}");
    }
}
