//! The grace period after possibly lost grants (design.md S7): after a
//! promotion, or a start on data that may be older than what the server
//! acknowledged, no new lease is created for `lease.grace-ms`; leases the
//! server knows keep working; waiters queued meanwhile are served, first
//! come first served, when it ends. Which starts need none (AOF `appendfsync always`, a
//! clean shutdown that saved, trusted once; `MODULE LOAD`), how CONFIG SET
//! re-times a running period, and the counters and log lines that show it.
//!
//! Every test gives `grace-ms` itself (the harness turns the grace off
//! otherwise), with short periods (1.5 to 3 s) so each stays under ~10 s.
mod common;
use common::*;

use common::grace::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// 1. Promotion

// ---------------------------------------------------------------------------
// 2. Starts

// ---------------------------------------------------------------------------
// 3. Waiters

// ---------------------------------------------------------------------------
// 4. Settings

// ---------------------------------------------------------------------------
// 5. Counters

full_suite! {
    /// Every promotion starts a new period, and nothing else on a running
    /// server does: not a `CONFIG SET lease.grace-ms` (periods start only on
    /// events), not a demotion to replica.
    fn every_promotion_starts_a_period(kind) {
        let master = start(kind, Opts::default());
        let replica = replica_with(kind, &master, grace("1500"));
        let mut r = replica.conn();
        let link_up = |r: &mut redis::Connection| {
            info_value(r, "replication", "master_link_status").as_deref() == Some("up")
        };
        assert_eq!(ok(&mut r, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert_grace(&mut r, "promoted", "first promotion");
        assert_eq!(
            ok(&mut r, &["CONFIG", "SET", "lease.grace-ms", "0"]),
            Value::Okay
        );
        assert_no_grace(&mut r, "after CONFIG SET lease.grace-ms 0");
        assert_eq!(
            ok(&mut r, &["CONFIG", "SET", "lease.grace-ms", "1500"]),
            Value::Okay
        );
        assert_no_grace(&mut r, "CONFIG SET lease.grace-ms 1500 on a running server");
        let port = master.port.to_string();
        assert_eq!(ok(&mut r, &["REPLICAOF", "127.0.0.1", &port]), Value::Okay);
        assert!(
            wait_until(Duration::from_secs(10), || link_up(&mut r)),
            "the demoted server never synced"
        );
        assert_no_grace(&mut r, "after a demotion");
        assert_eq!(ok(&mut r, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert_grace(&mut r, "promoted", "second promotion");
        let started = replica
            .log()
            .matches(&started_line("promoted", 1500))
            .count();
        assert_eq!(started, 2, "one start line per promotion");
        assert_eq!(ok(&mut r, &["LEASE.ACQUIRE", "k", "a", "5000"]), Value::Nil);
    }

    /// Without persistence every start has a grace period, the first one too
    /// (it cannot be told from a restart that lost everything); a restart
    /// (kill -9) that lost a lease refuses it to a new owner until the end.
    fn a_start_without_persistence_has_a_grace(kind) {
        let s = start(kind, grace("1500"));
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "first start: no data file");
        assert_logged(&s, &started_line("no-data", 1500));
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]),
            Value::Nil
        );
        wait_out_grace(&mut c, &[], Duration::from_secs(4));
        assert_logged(&s, ENDED);
        let t = acquire(&mut c, "k", "a", "30000");

        let s = restart(s, grace("1500"));
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "restart without persistence");
        assert_logged(&s, &started_line("no-data", 1500));
        assert_eq!(token_of(&mut c, "k"), None, "nothing was persisted");
        let (refused, contended) = refusals(&mut c);
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "b", "30000"]),
            Value::Nil
        );
        assert_eq!(refusals(&mut c), (refused + 1, contended));
        wait_out_grace(&mut c, &[], Duration::from_secs(4));
        assert!(acquire(&mut c, "k", "b", "30000") > t);
    }

    /// An AOF with `appendfsync everysec` may miss the last second of
    /// acknowledged writes after kill -9: the start has a grace period.
    fn a_crash_with_aof_everysec_has_a_grace(kind) {
        let aof = ["--appendonly", "yes", "--appendfsync", "everysec"];
        let s = start(kind, grace("0").extra(&aof));
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "a", "30000");
        let s = restart(s, grace("1500").extra(&aof));
        let mut c = s.conn();
        assert_grace(&mut c, "restart", "AOF everysec start after kill -9");
        assert_logged(&s, &started_line("restart", 1500));
        assert_not_logged(&s, NO_GRACE_AOF);
        if let Some(back) = token_of(&mut c, "k") {
            assert_eq!(back, t);
            assert_eq!(acquire(&mut c, "k", "a", "30000"), t);
        }
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "new", "b", "30000"]),
            Value::Nil
        );
    }

    /// With `appendfsync always` every acknowledged write is on disk before its
    /// reply: no start needs a grace period, after kill -9 neither. The lease is
    /// back and new leases are granted at once.
    fn aof_always_needs_no_grace(kind) {
        let opts = grace("1500").extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let s = start(kind, opts.clone());
        let mut c = s.conn();
        assert_no_grace(&mut c, "first start with appendfsync always");
        assert_logged(&s, NO_GRACE_AOF);
        let t = acquire(&mut c, "k", "a", "30000");
        let s = restart(s, opts);
        let mut c = s.conn();
        assert_no_grace(&mut c, "AOF always start after kill -9");
        assert_logged(&s, NO_GRACE_AOF);
        assert_not_logged(&s, "grace period started");
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert!(acquire(&mut c, "new", "b", "30000") > t);
        assert_eq!(info_int(&mut c, "lease_grace_refused"), 0);
    }

    /// A clean `SHUTDOWN SAVE` leaves the mark: the next start (same directory)
    /// has no grace period, reads the mark and deletes it. Trusted once: when
    /// that run crashes (kill -9), the start after it has a grace period again.
    fn a_clean_shutdown_is_trusted_once(kind) {
        let s = start(kind, grace("0"));
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "a", "30000");
        let dir = shutdown(s, "SAVE");
        let mark = dir.join(CLEAN_MARK);
        assert!(mark.exists(), "SHUTDOWN SAVE left no {CLEAN_MARK}");

        let s = start_in(kind, grace("1500"), dir);
        let mut c = s.conn();
        assert_no_grace(&mut c, "start after a clean SHUTDOWN SAVE");
        assert_logged(&s, NO_GRACE_CLEAN);
        assert!(!mark.exists(), "the start did not delete {CLEAN_MARK}");
        assert_eq!(token_of(&mut c, "k"), Some(t), "the saved lease is back");
        assert!(acquire(&mut c, "new", "b", "30000") > t);

        let s = restart(s, grace("1500"));
        let mut c = s.conn();
        assert_grace(&mut c, "restart", "a crash after a trusted clean start");
        assert_logged(&s, &started_line("restart", 1500));
        assert!(!mark.exists());
    }

    /// `SHUTDOWN NOSAVE` with unsaved changes is no clean shutdown: no mark,
    /// and the next start has a grace period.
    fn an_unsaved_shutdown_leaves_no_mark(kind) {
        let s = start(kind, grace("0"));
        let mut c = s.conn();
        acquire(&mut c, "k", "a", "30000");
        let dir = shutdown(s, "NOSAVE");
        assert!(
            !dir.join(CLEAN_MARK).exists(),
            "SHUTDOWN NOSAVE of unsaved changes left {CLEAN_MARK}"
        );
        let s = start_in(kind, grace("1500"), dir);
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "start after SHUTDOWN NOSAVE");
        assert_not_logged(&s, NO_GRACE_CLEAN);
    }

    /// A clean SHUTDOWN with the AOF on (`appendfsync everysec`: flushed and
    /// fsynced at shutdown) is clean too: the next start has no grace period.
    fn a_clean_aof_shutdown_needs_no_grace(kind) {
        let aof = ["--appendonly", "yes", "--appendfsync", "everysec"];
        let s = start(kind, grace("0").extra(&aof));
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "a", "30000");
        let dir = shutdown(s, "NOSAVE");
        assert!(
            dir.join(CLEAN_MARK).exists(),
            "no {CLEAN_MARK} after an AOF shutdown"
        );
        let s = start_in(kind, grace("1500").extra(&aof), dir);
        let mut c = s.conn();
        assert_no_grace(&mut c, "start after a clean AOF shutdown");
        assert_logged(&s, NO_GRACE_CLEAN);
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert!(!s.dir.join(CLEAN_MARK).exists());
    }

    /// `MODULE LOAD` at run time starts no grace period: no lease could exist
    /// before.
    fn module_load_at_run_time_starts_none(kind) {
        let s = start(
            kind,
            Opts {
                no_module: true,
                ..Opts::default()
            }
            .extra(&["--enable-module-command", "yes"]),
        );
        let mut c = s.conn();
        let path = module_path();
        let path = path.to_str().unwrap();
        assert_eq!(
            ok(&mut c, &["MODULE", "LOAD", path, "grace-ms", "1500"]),
            Value::Okay
        );
        assert_eq!(info_int(&mut c, "lease_grace_ms"), 1500);
        assert_no_grace(&mut c, "after MODULE LOAD");
        assert!(matches!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]),
            Value::Int(_)
        ));
        assert_not_logged(&s, "grace period started");
    }

    /// Three clients queued with BLOCK during a start's grace period stay
    /// blocked until it ends; then the first gets the lease, and each release
    /// hands it to the next in order, with increasing tokens.
    fn waiters_queued_during_the_grace_are_served_in_order(kind) {
        let s = start(kind, grace("3000"));
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "start");
        let w1 = spawn_waiter(&s, "k", "w1", "5000", "8000");
        let w2 = spawn_waiter(&s, "k", "w2", "5000", "8000");
        let w3 = spawn_waiter(&s, "k", "w3", "5000", "8000");
        assert_eq!(info_int(&mut c, "lease_waiters"), 3);
        let end = wait_out_grace(&mut c, &[&w1, &w2, &w3], Duration::from_secs(5));
        let (t1, at1) = token_within(w1, Duration::from_secs(2), "w1");
        served_at_the_end(at1, end, "w1");
        assert_eq!(token_of(&mut c, "k"), Some(t1));
        assert_eq!(waiters(&mut c, "k"), 2);
        assert!(
            !w2.is_finished() && !w3.is_finished(),
            "one lease, one waiter"
        );

        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "w1"])), 1);
        let (t2, _) = token_within(w2, Duration::from_secs(2), "w2");
        assert!(t2 > t1, "{t2} after {t1}");
        assert_eq!(token_of(&mut c, "k"), Some(t2));
        assert!(!w3.is_finished(), "w3 served while w2 holds the lease");

        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "w2"])), 1);
        let (t3, _) = token_within(w3, Duration::from_secs(2), "w3");
        assert!(t3 > t2, "{t3} after {t2}");
        assert_eq!(token_of(&mut c, "k"), Some(t3));
    }

    /// A lease created before a promotion is released during the grace period
    /// that follows: it is not handed to the waiter queued on it, nor to a
    /// newcomer, before the end; then the waiter gets it.
    fn a_release_during_the_grace_hands_nothing(kind) {
        let master = start(kind, Opts::default());
        let replica = replica_with(kind, &master, grace("3000"));
        let mut m = master.conn();
        let mut r = replica.conn();
        let held = acquire(&mut m, "h", "holder", "30000");
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        assert_eq!(token_of(&mut r, "h"), Some(held));
        assert_eq!(ok(&mut r, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert_grace(&mut r, "promoted", "after REPLICAOF NO ONE");

        let w = spawn_waiter(&replica, "h", "w", "5000", "10000");
        assert_eq!(int(&ok(&mut r, &["LEASE.RELEASE", "h", "holder"])), 1);
        assert_eq!(token_of(&mut r, "h"), None, "handed over during the grace");
        let refused = info_int(&mut r, "lease_grace_refused");
        assert_eq!(ok(&mut r, &["LEASE.ACQUIRE", "h", "x", "5000"]), Value::Nil);
        assert_eq!(info_int(&mut r, "lease_grace_refused"), refused + 1);
        assert_eq!(info_int(&mut r, "lease_waiters"), 1);

        let end = wait_out_grace(&mut r, &[&w], Duration::from_secs(5));
        let (t, at) = token_within(w, Duration::from_secs(2), "the waiter");
        served_at_the_end(at, end, "the waiter");
        assert!(t > held, "{t} after {held}");
        assert_eq!(token_of(&mut r, "h"), Some(t));
    }

    /// `CONFIG SET lease.grace-ms 0` ends a running period at once: INFO shows
    /// none, a blocked waiter is served promptly, the log says it ended.
    fn config_set_zero_ends_a_running_period(kind) {
        let s = start(kind, grace("3000"));
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "start");
        let w = spawn_waiter(&s, "k", "w", "5000", "8000");
        let set = Instant::now();
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "0"]),
            Value::Okay
        );
        assert_no_grace(&mut c, "after CONFIG SET lease.grace-ms 0");
        assert_eq!(info_int(&mut c, "lease_grace_ms"), 0);
        let (t, at) = token_within(w, Duration::from_secs(2), "the waiter");
        assert!(
            at - set < Duration::from_secs(1),
            "the waiter was served {:?} after the period was ended",
            at - set
        );
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_logged(&s, ENDED);
        assert!(matches!(
            ok(&mut c, &["LEASE.ACQUIRE", "other", "a", "5000"]),
            Value::Int(_)
        ));
    }

    /// The documented way to end a period (docs/operations.md: set
    /// `lease.grace-ms` to 0, then back) ends it even when the two
    /// `CONFIG SET`s arrive together, in one pipeline: the 0 ends it within
    /// its own `CONFIG SET`, not from a timer the restore could beat.
    fn config_set_zero_then_back_in_one_pipeline_ends_the_period(kind) {
        let s = start(kind, grace("-1"));
        let mut c = s.conn();
        assert_grace(&mut c, "no-data", "start");
        let replies: Vec<Value> = redis::pipe()
            .cmd("CONFIG").arg("SET").arg("lease.grace-ms").arg("0")
            .cmd("CONFIG").arg("SET").arg("lease.grace-ms").arg("-1")
            .query(&mut c)
            .expect("both CONFIG SETs");
        assert_eq!(replies, vec![Value::Okay, Value::Okay]);
        assert_no_grace(&mut c, "after CONFIG SET 0 and -1 in one pipeline");
        assert!(matches!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "5000"]),
            Value::Int(_)
        ));
    }

    /// A larger `lease.grace-ms` lengthens a running period; bad values are
    /// refused and change nothing; with an explicit `grace-ms`,
    /// `lease.max-ttl-ms` does not re-time it.
    fn config_set_lengthens_and_refuses_bad_values(kind) {
        let s = start(kind, grace("3000"));
        let mut c = s.conn();
        let before = assert_grace(&mut c, "no-data", "start");
        assert!(before <= 3000);
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "100000"]),
            Value::Okay
        );
        let left = assert_grace(&mut c, "no-data", "after lengthening");
        assert!(left > 95_000 && left <= 100_000, "remaining {left} ms");
        let get = |c: &mut redis::Connection| strings(&ok(c, &["CONFIG", "GET", "lease.grace-ms"]));
        assert_eq!(get(&mut c), ["lease.grace-ms", "100000"]);
        for bad in ["-2", "abc", "1.5", "1000000000001", ""] {
            let e = err(&mut c, &["CONFIG", "SET", "lease.grace-ms", bad]);
            assert!(
                e.starts_with("ERR"),
                "CONFIG SET lease.grace-ms {bad:?}: {e}"
            );
            assert_eq!(get(&mut c), ["lease.grace-ms", "100000"], "after {bad:?}");
            assert_eq!(info_int(&mut c, "lease_grace_ms"), 100_000);
            let left = assert_grace(&mut c, "no-data", &format!("after {bad:?}"));
            assert!(left > 90_000, "remaining {left} ms after {bad:?}");
        }
        // The largest value is taken.
        assert_eq!(
            ok(
                &mut c,
                &["CONFIG", "SET", "lease.grace-ms", "1000000000000"]
            ),
            Value::Okay
        );
        assert!(assert_grace(&mut c, "no-data", "at the largest value") > 999_000_000_000);
        // max-ttl-ms only matters with grace-ms -1.
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "100000"]),
            Value::Okay
        );
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "2000"]),
            Value::Okay
        );
        assert!(assert_grace(&mut c, "no-data", "after max-ttl-ms 2000") > 90_000);
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "2000"]), Value::Nil);
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "0"]),
            Value::Okay
        );
        assert_no_grace(&mut c, "after CONFIG SET lease.grace-ms 0");
        assert!(matches!(
            ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "2000"]),
            Value::Int(_)
        ));
    }

    /// A bad `grace-ms` loadmodule argument fails the load, with a log line
    /// naming grace-ms.
    fn bad_grace_ms_arguments_fail_the_load(kind) {
        let cases: [&[&str]; 6] = [
            &["grace-ms", "-2"],
            &["grace-ms", "abc"],
            &["grace-ms", "1.5"],
            &["grace-ms", "1000000000001"],
            &["grace-ms"],
            &["grace-ms", "1000", "grace-ms", "2000"],
        ];
        for args in cases {
            // Up to 3 tries: a server that answers may be another test's, on a
            // port this one lost (see `is_own`).
            let mut failure = None;
            for _ in 0..3 {
                match Server::try_start(kind, Opts::default().module_args(args)) {
                    Ok(s) if is_own(&s) => panic!("the server started with module arguments {args:?}"),
                    Ok(_) => continue,
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            let e = failure.expect("three starts lost their port to another server");
            let line = e
                .log
                .lines()
                .find(|l| l.contains("lease") && l.contains("grace-ms"))
                .unwrap_or_else(|| panic!("no log line naming grace-ms for {args:?}:\n{}", e.log));
            assert!(!line.contains("panic"), "{line}");
        }
    }

    /// With `grace-ms -1` (the default) the period is as long as
    /// `lease.max-ttl-ms` (default 60000), and changing that re-times it: a
    /// longer one lengthens it, 2000 makes it end about 2 s after it started,
    /// serving the waiter queued meanwhile.
    fn max_ttl_retimes_a_period_of_grace_ms_minus_one(kind) {
        let s = start(kind, grace("-1"));
        let mut c = s.conn();
        assert_eq!(info_int(&mut c, "lease_grace_ms"), -1);
        assert_eq!(info_int(&mut c, "lease_max_ttl_ms"), 60_000);
        let left = assert_grace(&mut c, "no-data", "start with grace-ms -1");
        assert!(left > 50_000 && left <= 60_000, "remaining {left} ms");
        assert_logged(&s, &started_line("no-data", 60_000));
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "100000"]),
            Value::Okay
        );
        let left = assert_grace(&mut c, "no-data", "after max-ttl-ms 100000");
        assert!(left > 90_000, "remaining {left} ms");
        assert_eq!(
            ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "2000"]),
            Value::Okay
        );
        let w = spawn_waiter(&s, "k", "w", "2000", "8000");
        let end = wait_out_grace(&mut c, &[&w], Duration::from_secs(4));
        let (t, at) = token_within(w, Duration::from_secs(2), "the waiter");
        served_at_the_end(at, end, "the waiter");
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_logged(&s, ENDED);
    }

    /// Refusals made by the grace count in `lease_grace_refused` only, those
    /// made by a holder in `lease_contended` only, during the period and after
    /// it; `BLOCK` inside MULTI and scripts does not block and is a refusal too.
    fn grace_refusals_count_apart_from_contention(kind) {
        let s = start(kind, grace("0"));
        let mut c = s.conn();
        let held = acquire(&mut c, "held", "a", "30000");
        assert_eq!(ok(&mut c, &["SAVE"]), Value::Okay);
        let s = restart(s, grace("2500"));
        let mut c = s.conn();
        assert_grace(&mut c, "restart", "RDB start after kill -9");
        let acquired = info_int(&mut c, "lease_acquired");
        assert_eq!(refusals(&mut c), (0, 0));

        for key in ["n1", "n2", "n3"] {
            assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", key, "b", "5000"]), Value::Nil);
        }
        assert_eq!(refusals(&mut c), (3, 0), "(grace_refused, contended)");
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "held", "b", "5000"]),
            Value::Nil
        );
        assert_eq!(refusals(&mut c), (3, 1), "a holder's refusal is contention");
        assert_eq!(acquire(&mut c, "held", "a", "30000"), held);
        let multi: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LEASE.ACQUIRE")
            .arg("n4")
            .arg("b")
            .arg(5000)
            .arg("BLOCK")
            .arg(1000)
            .query(&mut c)
            .unwrap();
        assert_eq!(multi, vec![Value::Nil], "BLOCK inside MULTI");
        let script = "return redis.call('LEASE.ACQUIRE', KEYS[1], 'b', '5000', 'BLOCK', '1000')";
        assert_eq!(ok(&mut c, &["EVAL", script, "1", "n5"]), Value::Nil);
        assert_eq!(refusals(&mut c), (5, 1), "MULTI and EVAL during the grace");
        assert_eq!(
            info_int(&mut c, "lease_acquired"),
            acquired,
            "nothing created"
        );
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 1);

        wait_out_grace(&mut c, &[], Duration::from_secs(4));
        assert!(acquire(&mut c, "n1", "b", "5000") > held);
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "held", "b", "5000"]),
            Value::Nil
        );
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "n1", "c", "5000"]),
            Value::Nil
        );
        assert_eq!(refusals(&mut c), (5, 3), "after the grace period");
        assert_eq!(info_int(&mut c, "lease_acquired"), acquired + 1);
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    /// A replica cut off from its master (REPLICAOF to a port where nothing
    /// listens) misses lease `lost` the master then grants; the master dies and
    /// the replica is promoted. It must not hand `lost` to another owner while
    /// the lost grant may still be believed in: for the grace period ACQUIRE of
    /// `lost` answers null (counted as a grace refusal, not as contention),
    /// RENEW by the lost holder answers 0 (the replica never saw it), while the
    /// holder of `kept`, a lease the replica knows, RENEWs, FENCEs and
    /// re-acquires the whole time. After the period `lost` goes to the new
    /// owner with a larger token than the lost grant's.
    fn promotion_refuses_a_lost_lease_until_the_grace_ends(kind) {
        let mut master = start(kind, Opts::default());
        let replica = replica_with(kind, &master, grace("2000"));
        let mut m = master.conn();
        let mut r = replica.conn();
        let kept = acquire(&mut m, "kept", "holder", "30000");
        assert!(
            wait_until(Duration::from_secs(5), || token_of(&mut r, "kept")
                == Some(kept)),
            "the replica never got lease kept"
        );
        // Cut the replica off: it leaves its master at once and keeps its data.
        let nowhere = free_port().to_string();
        assert_eq!(
            ok(&mut r, &["REPLICAOF", "127.0.0.1", &nowhere]),
            Value::Okay
        );
        let lost = acquire(&mut m, "lost", "a", "30000");
        master.kill();
        assert_eq!(ok(&mut r, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert_eq!(token_of(&mut r, "lost"), None, "the replica saw lease lost");

        let left = assert_grace(&mut r, "promoted", "after REPLICAOF NO ONE");
        assert!(left <= 2000, "remaining {left} ms of a 2000 ms period");
        assert_eq!(info_int(&mut r, "lease_grace_ms"), 2000);
        assert_logged(&replica, &started_line("promoted", 2000));
        let (refused, contended) = refusals(&mut r);
        assert_eq!(
            ok(&mut r, &["LEASE.ACQUIRE", "lost", "b", "5000"]),
            Value::Nil,
            "the promoted replica granted lost during its grace period"
        );
        assert_eq!(
            refusals(&mut r),
            (refused + 1, contended),
            "(grace_refused, contended)"
        );
        assert_eq!(int(&ok(&mut r, &["LEASE.RENEW", "lost", "a", "5000"])), 0);
        assert_eq!(token_of(&mut r, "lost"), None);

        // The holder of kept keeps control through the whole period.
        let kept_s = kept.to_string();
        let start = Instant::now();
        let mut rounds = 0;
        for _ in 0..200 {
            if remaining(&mut r) == 0 || start.elapsed() >= Duration::from_secs(6) {
                break;
            }
            assert_eq!(
                int(&ok(&mut r, &["LEASE.RENEW", "kept", "holder", "30000"])),
                1
            );
            assert_eq!(ok(&mut r, &["LEASE.FENCE", "kept", &kept_s]), Value::Okay);
            assert_eq!(acquire(&mut r, "kept", "holder", "30000"), kept);
            assert_eq!(
                ok(&mut r, &["LEASE.ACQUIRE", "kept", "other", "5000"]),
                Value::Nil
            );
            rounds += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(rounds > 0, "the grace period was over before any check");
        assert_no_grace(&mut r, "after the grace period");
        assert_eq!(
            refusals(&mut r),
            (refused + 1, contended + rounds),
            "(grace_refused, contended): the refusals of kept are contention"
        );
        assert_logged(&replica, ENDED);
        let t = acquire(&mut r, "lost", "b", "5000");
        assert!(
            t > lost,
            "token {t} after the grace period, the lost grant had {lost}"
        );
        assert_eq!(token_of(&mut r, "kept"), Some(kept));
    }

    /// An RDB saved before a crash (SAVE, then kill -9) may be older than what
    /// was acknowledged after it: the start has a grace period. The saved lease
    /// is back and keeps working; a new key is refused.
    fn a_crash_after_an_rdb_save_has_a_grace(kind) {
        let s = start(kind, grace("0"));
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "a", "30000");
        assert_eq!(ok(&mut c, &["SAVE"]), Value::Okay);
        acquire(&mut c, "after-save", "a", "30000");
        let s = restart(s, grace("1500"));
        let mut c = s.conn();
        assert_grace(&mut c, "restart", "RDB start after kill -9");
        assert_logged(&s, &started_line("restart", 1500));
        assert!(!s.dir.join(CLEAN_MARK).exists());
        assert_eq!(token_of(&mut c, "k"), Some(t), "the saved lease is back");
        assert_eq!(token_of(&mut c, "after-save"), None, "lost with the crash");
        assert_eq!(acquire(&mut c, "k", "a", "30000"), t);
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", "a", "30000"])), 1);
        assert_eq!(
            ok(&mut c, &["LEASE.ACQUIRE", "after-save", "b", "30000"]),
            Value::Nil
        );
    }
}

/// The mark a node whose data is a replica's copy keeps in its directory.
const REPLICA_MARK: &str = "lease-replica-data.mark";

every_server! {
    fn a_replica_restarted_as_a_master_runs_a_grace_whatever_its_shutdown(kind) {
        // A replica's data is its master's, possibly without the last
        // writes the master acknowledged: restarted as a master (its own
        // command line, no replicaof), it runs a grace as after a
        // promotion, after a clean SHUTDOWN SAVE and with an AOF written
        // with appendfsync always alike (both vouch for its own writes only).
        let master = start(kind, Opts::default());
        let mut m = master.conn();
        let t = acquire(&mut m, "k", "holder", "30000");
        let aof = ["--appendonly", "yes", "--appendfsync", "always"];
        for (how, extra) in [("clean", &[][..]), ("aof-always", &aof[..])] {
            let replica = replica_with(kind, &master, grace("1500").extra(extra));
            let mut r = replica.conn();
            assert!(wait_until(Duration::from_secs(5), || token_of(&mut r, "k") == Some(t)));
            assert!(replica.dir.join(REPLICA_MARK).exists(), "{how}: a replica marks its data");
            // The AOF rewrite that follows a replica's full sync is done.
            assert!(wait_until(Duration::from_secs(10), || {
                ["aof_rewrite_in_progress", "aof_rewrite_scheduled"]
                    .iter()
                    .all(|f| info_value(&mut r, "persistence", f).is_none_or(|v| v == "0"))
            }));
            let dir = if how == "clean" {
                shutdown(replica, "SAVE")
            } else {
                let mut replica = replica;
                replica.kill();
                let dir = replica.dir.clone();
                std::mem::forget(replica);
                dir
            };
            let s = start_in(kind, grace("1500").extra(extra), dir);
            let mut c = s.conn();
            assert_grace(&mut c, "promoted", &format!("{how}: a start as a master on a replica's data"));
            assert_logged(&s, "starts as a master on data it had as a replica");
            assert_not_logged(&s, NO_GRACE_CLEAN);
            assert_eq!(token_of(&mut c, "k"), Some(t), "{how}: the replica's lease is kept");
            assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "new", "b", "30000"]), Value::Nil, "{how}: nothing new in the grace");
            // Once its grace as a master has ended, its data is its own: a
            // clean restart needs none.
            wait_out_grace(&mut c, &[], Duration::from_secs(5));
            assert_logged(&s, ENDED);
            assert!(!s.dir.join(REPLICA_MARK).exists(), "{how}: the mark outlived the grace");
            let dir = shutdown(s, "SAVE");
            let s = start_in(kind, grace("1500").extra(extra), dir);
            let mut c = s.conn();
            assert_no_grace(&mut c, &format!("{how}: a clean restart of a master after its grace"));
        }
    }

    fn grace_off_on_a_replicated_node_is_a_warning_at_start_and_promotion(kind) {
        // `lease.grace-ms 0` left over (CONFIG REWRITE keeps it) on a node
        // with replicas or min-replicas-to-write: a warning at the CONFIG
        // SET, at start and at every promotion, and `lease_grace_off` in
        // INFO. A standalone node with 0 (a test setup) says nothing.
        const AT_START: &str = "lease.grace-ms is 0 on a node with replicas or min-replicas-to-write";
        let warning = |s: &Server, needle: &str| {
            assert!(
                wait_until(Duration::from_secs(2), || s.log().lines().any(|l| l.contains(" # ") && l.contains(needle))),
                "{:?}: no warning with {needle:?}:\n{}",
                s.kind,
                s.log_tail(20)
            );
        };
        let alone = start(kind, grace("0"));
        let mut a = alone.conn();
        assert_eq!(info_int(&mut a, "lease_grace_off"), 0);
        assert_not_logged(&alone, AT_START);
        let guarded = start(kind, grace("0").extra(&["--min-replicas-to-write", "1"]));
        warning(&guarded, AT_START);
        assert_eq!(info_int(&mut guarded.conn(), "lease_grace_off"), 1);
        let master = start(kind, grace("-1"));
        let replica = replica_with(kind, &master, grace("0"));
        warning(&replica, AT_START);
        let mut r = replica.conn();
        assert_eq!(info_int(&mut r, "lease_grace_off"), 1);
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        warning(&replica, "no grace period after this promotion (lease.grace-ms is 0)");
        // The master with a replica connected: the CONFIG SET warns.
        let mut m = master.conn();
        assert_eq!(info_int(&mut m, "lease_grace_off"), 0);
        let replica2 = replica_with(kind, &master, Opts::default());
        ok(&mut m, &["CONFIG", "SET", "lease.grace-ms", "0"]);
        warning(&master, "the next failover or restart runs no grace period");
        assert_eq!(info_int(&mut m, "lease_grace_off"), 1);
        drop(replica2);
    }
}
