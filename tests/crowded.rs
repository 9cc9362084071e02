//! A crowded counting lease (design.md S8): after many holders of one `LIMIT`
//! key have passed their deadlines (a worker fleet that crashed after it
//! took its permits in one burst), no single call does work or sends an
//! effect that grows with their number. A call takes out at most a small
//! batch (one `LEASE.PRUNE` effect names the last holder it took), and a
//! timer takes out the rest in batches; the replica ends with the same
//! record, every ended holder counted once.
mod common;
use common::*;

use std::time::Duration;

/// Holders in the burst.
const N: usize = 10_000;
/// What one call may replicate at most, in bytes (the effects of one
/// acquire, whatever the number of holders that ended).
const EFFECT_BOUND: i64 = 1_000;

fn repl_offset(c: &mut redis::Connection) -> i64 {
    info_value(c, "replication", "master_repl_offset")
        .and_then(|v| v.parse().ok())
        .expect("master_repl_offset")
}

/// `N` holders of `LIMIT 100000` on `key`, each for `ttl` ms, in one
/// pipeline.
fn burst(c: &mut redis::Connection, key: &str, ttl: i64) {
    let mut p = redis::pipe();
    for i in 0..N {
        p.cmd("LEASE.ACQUIRE")
            .arg(key)
            .arg(format!("worker-{i}"))
            .arg(ttl)
            .arg("LIMIT")
            .arg(100_000);
    }
    let tokens: Vec<Option<i64>> = p.query(c).unwrap();
    assert!(tokens.iter().all(|t| t.is_some()));
}

full_suite! {
    fn one_call_after_many_ended_holders_stays_small(kind) {
        let master = Server::start_with(kind, Opts::default().extra(&["--appendonly", "yes"]));
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let mut r = replica.conn();
        // Counted before the burst: a burst slower than its ttl takes out
        // its own first holders as it goes.
        let expired = info_int(&mut m, "lease_expired");
        burst(&mut m, "sem", 300);
        // One live holder besides them, so the key outlives the burst.
        assert!(acquire_opts(&mut m, "sem", "survivor", "60000", &["LIMIT", "100000"]).is_some());
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        std::thread::sleep(Duration::from_millis(400));
        // The first call on the key: an acquire.
        let before = repl_offset(&mut m);
        assert!(acquire_opts(&mut m, "sem", "newcomer", "60000", &["LIMIT", "100000"]).is_some());
        let one_call = repl_offset(&mut m) - before;
        assert!(
            one_call < EFFECT_BOUND,
            "{kind:?}: one ACQUIRE after {N} holders ended replicated {one_call} bytes"
        );
        // The rest leave in batches, from a timer.
        assert!(
            wait_until(Duration::from_secs(30), || info_int(&mut m, "lease_expired") == expired + N as i64),
            "{kind:?}: {} of {N} ended holders taken out",
            info_int(&mut m, "lease_expired") - expired
        );
        let drained = repl_offset(&mut m) - before;
        assert!(
            drained < 40 * EFFECT_BOUND,
            "{kind:?}: taking out {N} ended holders replicated {drained} bytes"
        );
        let v = ok(&mut m, &["LEASE.INFO", "sem"]);
        assert_eq!(holders(&v).len(), 2, "the survivor and the newcomer");
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        let digest = |c: &mut redis::Connection| strings(&ok(c, &["DEBUG", "DIGEST-VALUE", "sem"]));
        assert_eq!(digest(&mut m), digest(&mut r), "the replica has the master's record");
        assert_eq!(holders(&ok(&mut r, &["LEASE.INFO", "sem"])).len(), 2);
        // The AOF replays to the same record.
        let mut master = master.restart_with(Opts::default().extra(&["--appendonly", "yes"]));
        master.assert_alive("restart from the AOF", true);
        let mut m = master.conn();
        assert_eq!(holders(&ok(&mut m, &["LEASE.INFO", "sem"])).len(), 2);
    }

    fn renew_release_and_waiters_take_out_a_batch_only(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let before = info_int(&mut c, "lease_expired");
        burst(&mut c, "sem", 200);
        assert!(acquire_opts(&mut c, "sem", "survivor", "60000", &["LIMIT", "100000"]).is_some());
        std::thread::sleep(Duration::from_millis(300));
        // Each of these calls takes out a batch at most (then the timer
        // goes on): the key never loses the survivor, and no call fails.
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "survivor", "60000"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "worker-3"])), 0, "ended");
        let t = acquire_opts(&mut c, "sem", "blocker", "60000", &["LIMIT", "100000", "BLOCK", "5000"]);
        assert!(t.is_some(), "a place is free: a BLOCK acquire gets it at once");
        assert!(
            wait_until(Duration::from_secs(30), || info_int(&mut c, "lease_expired") == before + N as i64),
            "{kind:?}: every ended holder is counted once"
        );
        assert_eq!(holders(&ok(&mut c, &["LEASE.INFO", "sem"])).len(), 2);
    }
}
