//! The history test of guarded keys (design.md S12): workers take turns
//! on one lease and append to a list; some forget the fence, some pause
//! past their lease and then write, with their stale token or without the
//! fence. Against a guard, the list holds only writes made through the
//! fence with the token current then (tokens never go back, no write of an
//! ended holding, none without the fence). The same workload on a tag
//! nobody guards (the control) shows the writes of ended holdings.
mod common;
use common::*;

use std::thread;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const ROUNDS: usize = 8;
const TTL_MS: u64 = 150;
/// A pause past the lease: its holding has ended when the write goes.
const PAUSE_MS: u64 = 250;

/// What a worker does with its holding in round `round`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Plan {
    /// Writes through the fence at once: lands.
    Fenced,
    /// Forgets the fence.
    Plain,
    /// Pauses past its lease, then writes through the fence (stale token).
    LateFenced,
    /// Pauses past its lease, then writes without the fence.
    LatePlain,
}

impl Plan {
    fn of(worker: usize, round: usize) -> Plan {
        [Plan::Fenced, Plan::Plain, Plan::LateFenced, Plan::LatePlain][(worker + round) % 4]
    }

    fn name(self) -> &'static str {
        match self {
            Plan::Fenced => "fenced",
            Plan::Plain => "plain",
            Plan::LateFenced => "late-fenced",
            Plan::LatePlain => "late-plain",
        }
    }
}

/// Runs the workload on `{tag}:lock` and `{tag}:log`; returns the log's
/// entries as (token, plan).
fn workload(port: u16, tag: &'static str) -> Vec<(i64, String)> {
    let lock = format!("{{{tag}}}:lock");
    let log = format!("{{{tag}}}:log");
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (lock, log) = (lock.clone(), log.clone());
            thread::spawn(move || {
                let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let owner = format!("w{w}");
                for round in 0..ROUNDS {
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "the workload is bounded"
                    );
                    let t = match ok(
                        &mut c,
                        &[
                            "LEASE.ACQUIRE",
                            &lock,
                            &owner,
                            &TTL_MS.to_string(),
                            "BLOCK",
                            "10000",
                        ],
                    ) {
                        Value::Int(t) => t,
                        other => panic!("{owner} got no lease in 10 s: {other:?}"),
                    };
                    let plan = Plan::of(w, round);
                    if matches!(plan, Plan::LateFenced | Plan::LatePlain) {
                        thread::sleep(Duration::from_millis(PAUSE_MS));
                    }
                    let entry = format!("{t}:{}", plan.name());
                    let ts = t.to_string();
                    let write: Vec<&str> = match plan {
                        Plan::Fenced | Plan::LateFenced => {
                            vec!["LEASE.FENCE", &lock, &ts, "RPUSH", &log, &entry]
                        }
                        Plan::Plain | Plan::LatePlain => vec!["RPUSH", &log, &entry],
                    };
                    let _ = call(
                        &mut c,
                        &write.iter().map(|a| a.as_bytes()).collect::<Vec<_>>(),
                    );
                    let _ = call(
                        &mut c,
                        &[b"LEASE.RELEASE", lock.as_bytes(), owner.as_bytes()],
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    strings(&ok(&mut c, &["LRANGE", &log, "0", "-1"]))
        .into_iter()
        .map(|e| {
            let (t, plan) = e.split_once(':').expect("token:plan");
            (t.parse().expect("a token"), plan.to_string())
        })
        .collect()
}

every_server! {
    fn a_guard_keeps_only_writes_made_under_the_current_token_where_the_control_shows_stale_ones(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.GUARD", "{g}:lock"]);
        let (guarded, control) = thread::scope(|scope| {
            let g = scope.spawn(|| workload(s.port, "g"));
            let u = scope.spawn(|| workload(s.port, "u"));
            (g.join().unwrap(), u.join().unwrap())
        });
        // Guarded: only fenced writes of live holdings, tokens never back.
        assert!(!guarded.is_empty());
        for (t, plan) in &guarded {
            assert_eq!(plan, "fenced", "a write that was not made under the current token landed: {t}:{plan}");
        }
        assert!(guarded.windows(2).all(|w| w[0].0 <= w[1].0), "tokens went back: {guarded:?}");
        // At most the fenced writes of live holdings (one made after its
        // lease ended on a loaded machine is refused, rightly).
        assert!(guarded.len() <= WORKERS * ROUNDS / 4, "{guarded:?}");
        // The control took the writes without the fence, those of ended
        // holdings included.
        let late_plain = control.iter().filter(|(_, p)| p == "late-plain").count();
        let plain = control.iter().filter(|(_, p)| p == "plain").count();
        assert_eq!((plain, late_plain), (WORKERS * ROUNDS / 4, WORKERS * ROUNDS / 4), "{control:?}");
        assert!(control.iter().all(|(_, p)| p != "late-fenced"), "the fence refuses a stale token anyway");
        assert!(info_int(&mut c, "lease_guard_refused") >= (WORKERS * ROUNDS / 2) as i64);
    }
}
