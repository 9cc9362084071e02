//! The distributions of `INFO lease` (design.md S11): `held` (how long
//! holdings lasted, ended by release or expiry), `waited` (how long `BLOCK`
//! waits lasted, served or timed out) and `renew_margin` (the time a lease
//! had left when a renewal arrived), each as count, p50, p99, p999 and max
//! in ms, and the counter `renewed_late`; after a scripted workload whose
//! holding and waiting times are known, and reset by `CONFIG RESETSTAT`.
mod common;
use common::*;

use std::thread::sleep;
use std::time::Duration;

/// (count, p50, p99, p999, max) of a distribution.
fn dist(c: &mut redis::Connection, name: &str) -> [i64; 5] {
    ["count", "p50", "p99", "p999", "max"].map(|f| info_int(c, &format!("lease_{name}_{f}")))
}

/// `v` is `want` ms, give or take 1% and 1 ms either way, and `slack` ms
/// more above (a loaded machine only makes things later; a percentile
/// shows the top of its bucket, at most 1/64 above the value).
fn about(v: i64, want: i64, slack: i64) -> bool {
    v >= want - want / 100 - 1 && v <= want + want / 100 + slack
}

every_server! {
    fn distributions_follow_a_workload_of_known_times(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        assert_eq!(dist(&mut c, "held"), [0; 5]);
        assert_eq!(dist(&mut c, "waited"), [0; 5]);
        assert_eq!(dist(&mut c, "renew_margin"), [0; 5]);

        // held: a release after 300 ms, an expiry of a 600 ms lease, a
        // counting holder released after 300 ms and one that expires after
        // 600 ms, two keys of a multi-key lease released after 300 ms.
        acquire(&mut c, "rel", "o", "60000");
        acquire_opts(&mut c, "sem", "a", "60000", &["LIMIT", "2"]).unwrap();
        acquire_opts(&mut c, "sem", "b", "600", &["LIMIT", "2"]).unwrap();
        acquire(&mut c, "exp", "o", "600");
        ok(&mut c, &["LEASE.MACQUIRE", "2", "m1", "m2", "o", "60000"]);
        sleep(Duration::from_millis(300));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rel", "o"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "a"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.MRELEASE", "2", "m1", "m2", "o"])), 2);
        // The expiries: the server's own expiry (exclusive), the holders
        // record's last holder leaving with its key.
        assert!(wait_until(Duration::from_secs(5), || {
            int(&ok(&mut c, &["EXISTS", "exp", "sem"])) == 0
        }));
        let [count, p50, _, _, max] = dist(&mut c, "held");
        assert_eq!(count, 6, "{:?}", dist(&mut c, "held"));
        assert!(about(p50, 300, 150), "p50 {p50}");
        assert!(about(max, 600, 0), "max {max}: an expired holding lasted its ttl");

        // waited: one served after 400 ms, one timed out after its 200 ms.
        acquire(&mut c, "w", "holder", "60000");
        acquire(&mut c, "w2", "holder", "60000");
        let served = spawn_waiter(&s, "w", "x", "60000", "5000");
        let timed_out = spawn_waiter(&s, "w2", "y", "1000", "200");
        sleep(Duration::from_millis(400));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "w", "holder"])), 1);
        got_token(served);
        let (reply, _) = timed_out.join().unwrap();
        assert_eq!(reply.unwrap(), Value::Nil);
        let [count, _, _, _, max] = dist(&mut c, "waited");
        assert_eq!(count, 2);
        assert!(about(max, 400, 200), "max {max}");
        assert!(info_int(&mut c, "lease_waited_p50") >= 198);

        // renew_margin: a renewal with 1900 ms of 2000 left, one with less
        // than a tenth left (late), one of a counting holder.
        let late = info_int(&mut c, "lease_renewed_late");
        acquire(&mut c, "r", "o", "2000");
        sleep(Duration::from_millis(100));
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "r", "o", "2000"])), 1);
        sleep(Duration::from_millis(1850));
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "r", "o", "2000"])), 1);
        acquire_opts(&mut c, "rs", "h", "60000", &["SHARED"]).unwrap();
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "rs", "h", "60000"])), 1);
        let [count, p50, _, _, max] = dist(&mut c, "renew_margin");
        assert_eq!(count, 3);
        assert!((1700..=1919).contains(&p50), "p50 {p50}");
        assert!(about(max, 60_000, 0) || max < 60_000, "max {max}");
        assert_eq!(info_int(&mut c, "lease_renewed_late"), late + 1, "{:?}", dist(&mut c, "renew_margin"));

        // CONFIG RESETSTAT empties the distributions; counters go on.
        let renewed = info_int(&mut c, "lease_renewed");
        ok(&mut c, &["config", "resetstat"]);
        for name in ["held", "waited", "renew_margin"] {
            assert_eq!(dist(&mut c, name), [0; 5], "{name}");
        }
        assert_eq!(info_int(&mut c, "lease_renewed_late"), late + 1);
        assert_eq!(info_int(&mut c, "lease_renewed"), renewed);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "r", "o"])), 1);
        assert_eq!(dist(&mut c, "held")[0], 1);
        // Noticed within a second without an INFO (no command filter: the
        // module looks once a second): a holding that ends after that
        // second counts.
        ok(&mut c, &["CONFIG", "RESETSTAT"]);
        sleep(Duration::from_millis(1500));
        acquire(&mut c, "r2", "o", "60000");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "r2", "o"])), 1);
        assert_eq!(dist(&mut c, "held")[0], 1, "the reset was noticed before this holding ended");
    }

    fn a_replica_records_nothing_it_applies(kind) {
        let m = Server::start(kind);
        let r = replica_of(kind, &m);
        let mut mc = m.conn();
        acquire(&mut mc, "k", "o", "60000");
        assert_eq!(int(&ok(&mut mc, &["LEASE.RENEW", "k", "o", "60000"])), 1);
        assert_eq!(int(&ok(&mut mc, &["LEASE.RELEASE", "k", "o"])), 1);
        assert_eq!(int(&ok(&mut mc, &["WAIT", "1", "5000"])), 1);
        assert_eq!(dist(&mut mc, "held")[0], 1);
        assert_eq!(dist(&mut mc, "renew_margin")[0], 1);
        let mut rc = r.conn();
        assert_eq!(dist(&mut rc, "held")[0], 0);
        assert_eq!(dist(&mut rc, "renew_margin")[0], 0);
    }
}
