//! The report of a Sentinel scenario: its settings, counts and failovers,
//! what the failovers lost and what the checker found, with the first
//! overlapping holdings; printed by every test and shown by a failed
//! assertion.

use std::fmt::Write as _;
use std::time::Instant;

use super::checker::{backwards, lost_in, overlaps, strict_overlaps, token_regressions};
use super::workload::{Holding, KEYS};
use super::{Outcome, Params, ms};
use crate::common::*;

fn describe(h: &Holding, t0: Instant) -> String {
    format!(
        "w{} token {} from :{} held {}..{} ms (sent {}, ttl {}, {}{})",
        h.worker,
        h.token,
        h.port,
        ms(h.start - t0),
        ms(h.end - t0),
        ms(h.sent - t0),
        h.ttl,
        h.how,
        h.first_error.map_or(String::new(), |e| format!(
            ", first error at {}",
            ms(e - t0)
        ))
    )
}

pub(super) fn report(kind: Kind, p: &Params, o: &Outcome) -> String {
    let t0 = o.began;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{kind:?} sentinel, grace-ms {}, max-ttl-ms {}, ttl {}..{}: {} ms, {} failovers planned, {} switches and {} TILTs logged",
        p.grace_ms,
        p.max_ttl_ms,
        p.ttl.0,
        p.ttl.1,
        ms(o.took),
        o.failovers.len(),
        o.switches,
        o.tilts
    );
    let _ = writeln!(s, "  counts: {:?}", o.counts);
    let per_key: Vec<usize> = (0..KEYS)
        .map(|k| o.writes.iter().filter(|w| w.key == k).count())
        .collect();
    let _ = writeln!(s, "  acknowledged fenced writes per key: {per_key:?}");
    for (i, f) in o.failovers.iter().enumerate() {
        let _ = writeln!(
            s,
            "  failover {i}: killed :{} at {} ms (:{} cut off {} ms before); the sentinels named :{}{} {} ms after the kill; grace then {:?}, refused {}",
            f.killed_port,
            ms(f.killed_at - t0),
            f.cut_port,
            ms(f.killed_at - f.cut_at),
            f.promoted_port,
            if f.promoted_port == f.cut_port {
                " (the cut-off one)"
            } else {
                " (NOT the cut-off one)"
            },
            ms(f.switched_at - f.killed_at),
            f.grace_seen,
            f.grace_refused
        );
    }
    let (grants, renewals) = lost_in(o);
    let forgotten = o
        .holdings
        .iter()
        .filter(|h| matches!(h.how, "renew 0" | "stale"))
        .count();
    let _ = writeln!(
        s,
        "  lost in the failovers: {grants} grants and {renewals} renewals acknowledged while the replica promoted next was cut off; {forgotten} holdings were told by a master, before their ttl, that it did not know them (RENEW 0 / STALE)"
    );
    let strict = strict_overlaps(&o.holdings);
    let on_error = overlaps(&o.holdings, Holding::end_on_error);
    let _ = writeln!(
        s,
        "  {} holdings, {} fenced writes; overlaps: {} (holders riding out errors), {} (an error ends a holding); backward writes: {}; token regressions: {}",
        o.holdings.len(),
        o.writes.len(),
        strict.len(),
        on_error.len(),
        backwards(&o.writes).len(),
        token_regressions(&o.holdings).len()
    );
    for (a, b) in strict.iter().take(6) {
        let _ = writeln!(
            s,
            "    lock:{}: {}\n            and {}: {} ms together",
            a.key,
            describe(a, t0),
            describe(b, t0),
            ms(a.end - b.start)
        );
    }
    s
}
