//! What a grace period counts (design.md S7): only time in which this server
//! could grant (a promoted master without a good replica for
//! `min-replicas-to-write` starts counting when it first can), on the
//! monotonic clock (a wall-clock step ends nothing), across a clean restart
//! (a running period resumes), and, with `lease.grace-ms -1`, long enough to
//! outlast the writes a cut-off master still accepts (the max lag plus
//! 2 s). Links between nodes are cut by `REPLICAOF` to a port where nothing
//! listens, or silently by a `Link` (a proxy that stops moving bytes).
mod common;
use common::grace::*;
use common::*;

use std::time::{Duration, Instant};

/// `min-replicas-to-write 1`, `min-replicas-max-lag 1`: docs/operations.md's
/// Sentinel settings for a master with two replicas.
const MIN_REPLICAS: [&str; 4] = [
    "--min-replicas-to-write",
    "1",
    "--min-replicas-max-lag",
    "1",
];

fn settings(max_ttl: &str, grace_ms: &str) -> Opts {
    Opts::default()
        .module_args(&["max-ttl-ms", max_ttl, "grace-ms", grace_ms])
        .extra(&MIN_REPLICAS)
}

/// Points `node` at a port where nothing listens: its link to its master
/// is cut, and it stays a replica.
fn cut(node: &Server) {
    let dead = free_port().to_string();
    let mut c = node.conn();
    assert_eq!(ok(&mut c, &["REPLICAOF", "127.0.0.1", &dead]), Value::Okay);
}

/// A replica of the server behind `link`, synced (10 s at most).
fn replica_via(kind: Kind, link: &Link, opts: Opts) -> Server {
    let port = link.port.to_string();
    let r = start(kind, opts.extra(&["--replicaof", "127.0.0.1", &port]));
    let mut c = r.conn();
    assert!(
        wait_until(Duration::from_secs(10), || {
            info_value(&mut c, "replication", "master_link_status").as_deref() == Some("up")
        }),
        "the replica never synced through its link"
    );
    r
}

fn replica_of(node: &Server, master: &Server) {
    let mut c = node.conn();
    let port = master.port.to_string();
    assert_eq!(ok(&mut c, &["REPLICAOF", "127.0.0.1", &port]), Value::Okay);
}

/// Waits (up to `within`) until `node` grants `key` to `owner`; the instant
/// the successful ACQUIRE was sent, and its token.
fn granted_within(
    node: &Server,
    key: &str,
    owner: &str,
    ttl: &str,
    within: Duration,
) -> (Instant, i64) {
    let mut c = node.conn();
    let mut got = None;
    assert!(
        wait_until(within, || {
            let sent = Instant::now();
            match call(
                &mut c,
                &[
                    b"LEASE.ACQUIRE",
                    key.as_bytes(),
                    owner.as_bytes(),
                    ttl.as_bytes(),
                ],
            ) {
                Ok(Value::Int(t)) => {
                    got = Some((sent, t));
                    true
                }
                _ => false,
            }
        }),
        "{owner} never got {key} within {within:?}:\n{}",
        node.log_tail(20)
    );
    got.unwrap()
}

full_suite! {
    /// The partition that heals (the Sentinel state, staged by hand):
    /// master `m` and replicas `r1`, `r2`. `m` is cut off from both and `r1`
    /// promoted; with no replica, `r1` cannot accept writes, and its grace must
    /// not count. Longer than the grace later, the partition heals before `r2`
    /// is moved: `r2` follows `m` again, `m` writes again and grants `k` to A.
    /// Then `r2` and `m` move to `r1`, which can now write: it must not grant
    /// `k` to B while A's lease may still be held.
    fn a_promoted_master_counts_its_grace_from_when_it_can_write(kind) {
        let m = start(kind, settings("2000", "0"));
        let r1 = replica_with(kind, &m, settings("2000", "2500"));
        let r2 = replica_with(kind, &m, settings("2000", "2500"));
        cut(&r1);
        cut(&r2);
        let mut c1 = r1.conn();
        assert_eq!(ok(&mut c1, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert_grace(&mut c1, "promoted", "r1 promoted");
        // Longer than the whole grace: none of it may pass.
        std::thread::sleep(Duration::from_millis(3500));
        assert_eq!(
            info_int(&mut c1, "lease_grace_paused"),
            1,
            "r1 cannot accept writes (no replica): its grace waits"
        );
        let left = remaining(&mut c1);
        assert_eq!(
            left,
            2500,
            "r1 counted {} ms of grace while it could not grant",
            2500 - left
        );
        assert_logged(&r1, "grace period paused");

        // The partition heals before r2 is moved: m writes again.
        replica_of(&r2, &m);
        let (a_sent, _) = granted_within(&m, "k", "A", "2000", Duration::from_secs(10));
        let a_ends = a_sent + Duration::from_millis(2000);
        // Now both move to r1.
        replica_of(&r2, &r1);
        replica_of(&m, &r1);
        let (b_sent, tb) = granted_within(&r1, "k", "B", "2000", Duration::from_secs(15));
        assert!(
            b_sent >= a_ends,
            "{kind:?}: r1 granted k to B {:?} before A's lease (granted by m) ended: two holders",
            a_ends - b_sent
        );
        assert!(tb > 0);
        assert_logged(&r1, "grace period counting again");
        assert_eq!(info_int(&mut c1, "lease_grace_paused"), 0);
    }
    /// `lease_grace_length_ms`: with `lease.grace-ms -1` the longest lease plus
    /// the time a cut-off master still accepts writes (`min-replicas-max-lag` +
    /// 2 s), following CONFIG SET of either setting; an explicit value stays as
    /// it is, with a warning when it is shorter than that rule.
    fn grace_minus_one_covers_the_writes_of_a_cut_off_master(kind) {
        let s = start(
            kind,
            Opts::default()
                .module_args(&["max-ttl-ms", "1000", "grace-ms", "-1"])
                .extra(&MIN_REPLICAS),
        );
        let mut c = s.conn();
        assert_eq!(
            info_int(&mut c, "lease_grace_length_ms"),
            1000 + 1000 + 2000
        );
        ok(&mut c, &["CONFIG", "SET", "min-replicas-max-lag", "3"]);
        assert_eq!(
            info_int(&mut c, "lease_grace_length_ms"),
            1000 + 3000 + 2000
        );
        ok(&mut c, &["CONFIG", "SET", "min-replicas-to-write", "0"]);
        assert_eq!(
            info_int(&mut c, "lease_grace_length_ms"),
            1000,
            "min-replicas off"
        );
        ok(&mut c, &["CONFIG", "SET", "min-replicas-to-write", "2"]);
        ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "5000"]);
        assert_eq!(
            info_int(&mut c, "lease_grace_length_ms"),
            5000 + 3000 + 2000
        );
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "4000"]);
        assert_eq!(
            info_int(&mut c, "lease_grace_length_ms"),
            4000,
            "an explicit value"
        );
        assert_logged(&s, "lease.grace-ms is 4000, shorter than");
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "0"]);
        assert_eq!(info_int(&mut c, "lease_grace_length_ms"), 0);
    }
    /// The prompt promotion: a master cut off from its replicas by a
    /// partition (the links stay open, silent: `Link`) keeps accepting writes
    /// for up to `min-replicas-max-lag` + 2 s, while a replica promoted 0.7 s
    /// after the cut soon can write. With `lease.grace-ms -1` the new master
    /// grants nothing while a lease the old one granted in that window may
    /// still be held.
    fn a_prompt_promotion_waits_out_the_cut_off_masters_last_grants(kind) {
        let m = start(kind, settings("1000", "0"));
        let (l1, l2) = (Link::to(m.port), Link::to(m.port));
        let r1 = replica_via(kind, &l1, settings("1000", "-1"));
        let r2 = replica_via(kind, &l2, settings("1000", "-1"));
        // A holder that keeps re-acquiring its lease on m (each call resets its
        // deadline), until m refuses writes.
        let mut a = m.conn();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let holder = std::thread::spawn(move || {
            let start = Instant::now();
            let mut last = None;
            // Bounded: 20 s, 400 rounds of 50 ms.
            for _ in 0..400 {
                if stop2.load(std::sync::atomic::Ordering::SeqCst)
                    || start.elapsed() > Duration::from_secs(20)
                {
                    break;
                }
                let sent = Instant::now();
                if let Ok(Value::Int(_)) = call(&mut a, &[b"LEASE.ACQUIRE", b"k", b"A", b"1000"]) {
                    last = Some(sent);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            last
        });
        std::thread::sleep(Duration::from_millis(300));
        let cut_at = Instant::now();
        l1.cut();
        l2.cut();
        std::thread::sleep(Duration::from_millis(700));
        let mut c1 = r1.conn();
        assert_eq!(ok(&mut c1, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        replica_of(&r2, &r1);
        let (b_sent, _) = granted_within(&r1, "k", "B", "1000", Duration::from_secs(15));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let a_last = holder.join().unwrap().expect("m granted A at least once");
        let a_ends = a_last + Duration::from_millis(1000);
        assert!(
            a_last > cut_at + Duration::from_millis(500),
            "{kind:?}: m stopped granting {:?} after the cut: the link was not cut silently",
            a_last.saturating_duration_since(cut_at)
        );
        assert!(
            b_sent >= a_ends,
            "{kind:?}: r1 granted k to B {:?} before the lease m granted A {:?} after the cut ended",
            a_ends - b_sent,
            a_last.saturating_duration_since(cut_at)
        );
    }
    /// A wall-clock step right after a start (NTP at boot) ends no grace: the
    /// period is timed on the monotonic clock. Forward ten minutes, the period
    /// runs on; back ten minutes, it still ends on time.
    fn a_wall_clock_step_ends_no_grace(kind) {
        let shift = ClockShift::new(0);
        let s = start(
            kind,
            Opts::default()
                .module_args(&["max-ttl-ms", "3000", "grace-ms", "-1"])
                .clock(&shift),
        );
        let mut c = s.conn();
        let started = Instant::now();
        assert_grace(&mut c, "no-data", "start");
        shift.set(600_000);
        std::thread::sleep(Duration::from_millis(200));
        let left = remaining(&mut c);
        assert!(
            left > 1500 && reason(&mut c) == "no-data",
            "{kind:?}: a +10 min step left {left} ms of a 3000 ms grace"
        );
        let (refused, _) = refusals(&mut c);
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "1000"]), Value::Nil);
        assert_eq!(refusals(&mut c).0, refused + 1);
        shift.set(-600_000);
        let end = wait_out_grace(&mut c, &[], Duration::from_secs(6));
        assert!(
            end.1 >= started + Duration::from_millis(2800) && end.0 <= started + Duration::from_secs(5),
            "{kind:?}: the grace ended {:?} after the start",
            end.0 - started
        );
        assert!(matches!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "1000"]),
            Value::Int(_)
        ));
    }
    /// A clean restart during a grace period resumes it (what had counted
    /// stays counted): a crash, a restart (its grace running), then a clean
    /// `SHUTDOWN SAVE` and a start must not grant at once.
    fn a_clean_restart_resumes_a_running_period(kind) {
        let s = start(kind, grace("3000"));
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "a start without persistence");
        std::thread::sleep(Duration::from_millis(1000));
        let dir = shutdown(s, "SAVE");
        assert!(dir.join(CLEAN_MARK).exists());
        let s = start_in(kind, grace("3000"), dir);
        let mut c = s.conn();
        let left = assert_grace(&mut c, "no-data", "after the clean restart");
        assert!(
            left <= 2200,
            "{kind:?}: {left} ms left: what had counted was lost"
        );
        assert_logged(&s, "grace period resumed after a clean restart (no-data)");
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "k", "b", "1000"]), Value::Nil);
        wait_out_grace(&mut c, &[], Duration::from_secs(4));
        assert!(matches!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "b", "1000"]),
            Value::Int(_)
        ));
        // Once it ended, a clean restart has none.
        let dir = shutdown(s, "SAVE");
        let s = start_in(kind, grace("3000"), dir);
        assert_no_grace(&mut s.conn(), "a clean restart after the period ended");
    }
    /// A promotion after a master crash, then a clean restart of the new
    /// master: its promotion grace resumes (reason `promoted`). With
    /// `appendfsync always` too: that persistence says nothing of the leases the
    /// old master granted. And a crash during the period starts it anew.
    fn a_promotion_grace_survives_restarts(kind) {
        let aof = ["--appendonly", "yes", "--appendfsync", "always"];
        let master = start(kind, Opts::default());
        let r = replica_with(kind, &master, grace("3000").extra(&aof));
        drop(master);
        let mut c = r.conn();
        assert_eq!(ok(&mut c, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert_grace(&mut c, "promoted", "promoted");
        std::thread::sleep(Duration::from_millis(500));
        let dir = shutdown(r, "SAVE");
        let r = start_in(kind, grace("3000").extra(&aof), dir);
        let mut c = r.conn();
        assert_grace(
            &mut c,
            "promoted",
            "after a clean restart with appendfsync always",
        );
        assert_logged(&r, "grace period resumed after a clean restart (promoted)");
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "k", "b", "1000"]), Value::Nil);
        // A crash now: the next start cannot know how much counted; it starts
        // a full period, even with appendfsync always.
        let r = restart(r, grace("3000").extra(&aof));
        let mut c = r.conn();
        let left = assert_grace(&mut c, "restart", "after a crash during the period");
        assert!(left > 2500, "{left}");
        assert_not_logged(&r, NO_GRACE_AOF);
    }
}
