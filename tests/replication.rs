//! Replicas receive effects (exact token, absolute expiry) and answer like
//! their master; tokens keep increasing across promotion, also when the
//! promoted replica missed the last writes (design.md S2, S3). A replica's
//! records digest as its master's, guards included (design.md S12).
mod common;
use common::*;

use std::time::Duration;

fn info(c: &mut redis::Connection, key: &str) -> Option<(i64, i64)> {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => None,
        v => Some((
            int(&field(&v, "token").unwrap()),
            int(&field(&v, "ttl").unwrap()),
        )),
    }
}

/// Waits until the replica has processed everything the master sent.
fn sync(m: &mut redis::Connection, replicas: i64) {
    assert_eq!(
        int(&ok(m, &["WAIT", &replicas.to_string(), "5000"])),
        replicas
    );
}

full_suite! {
    fn a_promoted_replica_that_missed_writes_still_issues_larger_tokens(kind) {
        let master = Server::start(kind);
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        acquire(&mut m, "k", "a", "60000");
        sync(&mut m, 1);
        // Cut the replica off (pointing it at a port where nothing listens:
        // a replica frozen with SIGSTOP would still read the stream from its
        // socket buffer later); the master goes on issuing tokens it never sees.
        let mut r = replica.conn();
        ok(&mut r, &["REPLICAOF", "127.0.0.1", &free_port().to_string()]);
        let mut last = 0;
        let mut i = 0;
        for _ in 0..3 {
            let mut p = redis::pipe();
            for j in 0..100 {
                p.cmd("LEASE.ACQUIRE").arg(format!("lost{}", i + j)).arg("a").arg(60000);
            }
            let tokens: Vec<i64> = p.query(&mut m).unwrap();
            last = *tokens.last().unwrap();
            i += 100;
        }
        let mut master = master;
        master.kill();
        // A failover takes time (design.md S2 relies on it: tokens keep
        // increasing while the clocks differ by less than the event took).
        // 300 tokens in one burst run up to a third of a millisecond ahead of
        // the wall-clock floor.
        std::thread::sleep(Duration::from_millis(20));
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        let missed = format!("lost{}", i - 1);
        assert_eq!(int(&ok(&mut r, &["EXISTS", &missed])), 0, "the replica really missed the last writes ({i} sent)");
        let t = acquire(&mut r, &missed, "b", "60000");
        assert!(t > last, "{t} on the promoted replica, lost master issued up to {last}");
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn a_replica_answers_like_its_master(kind) {
        let master = Server::start(kind);
        let mut m = master.conn();
        // A lease that exists before the replica's full sync (RDB path)...
        let before = acquire(&mut m, "early", "a", "60000");
        let replica = replica_of(kind, &master);
        let mut r = replica.conn();
        // ...and leases replicated as effects.
        let t = acquire(&mut m, "k", "a", "60000");
        ok(&mut m, &["LEASE.RENEW", "k", "a", "45000"]);
        acquire(&mut m, "gone", "a", "60000");
        ok(&mut m, &["LEASE.RELEASE", "gone", "a"]);
        acquire(&mut m, "short", "a", "150");
        sync(&mut m, 1);
        assert_eq!(info(&mut r, "early").map(|i| i.0), Some(before));
        let (mt, mttl) = info(&mut m, "k").unwrap();
        let (rt, rttl) = info(&mut r, "k").unwrap();
        assert_eq!((mt, rt), (t, t));
        assert!((mttl - rttl).abs() < 1000 && rttl <= 45_000, "master ttl {mttl}, replica ttl {rttl}");
        assert!((int(&ok(&mut m, &["PTTL", "k"])) - int(&ok(&mut r, &["PTTL", "k"]))).abs() < 1000);
        // LEASE.FENCE is a write (it may run one): the replica refuses it
        // like SET, and LEASE.INFO is how to read the token there.
        assert!(err(&mut r, &["LEASE.FENCE", "k", &t.to_string()]).starts_with("READONLY"));
        assert_eq!(info(&mut r, "gone"), None);
        // Expiry: the replica stops answering for the lease at its deadline.
        assert!(wait_until(Duration::from_secs(3), || info(&mut r, "short").is_none()));
        // The replica's token clock followed the master's.
        assert!(info_int(&mut r, "lease_last_token") >= t);
        // Writes are refused on the replica.
        let e = err(&mut r, &["LEASE.ACQUIRE", "k2", "a", "1000"]);
        assert!(e.starts_with("READONLY"), "{e}");
    }

    fn tokens_keep_increasing_after_promotion(kind) {
        let master = Server::start(kind);
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let mut last = 0;
        for i in 0..500 {
            let key = format!("k{}", i % 50);
            last = acquire(&mut m, &key, &format!("o{i}"), "60000");
            // Half are released again; the others expire later on their own.
            if i % 2 == 0 || i < 450 {
                ok(&mut m, &["LEASE.RELEASE", &key, &format!("o{i}")]);
            }
        }
        sync(&mut m, 1);
        drop(master);
        let mut r = replica.conn();
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        for i in 0..50 {
            if let Value::Int(t) = ok(&mut r, &["LEASE.ACQUIRE", &format!("k{i}"), "new", "60000"]) {
                assert!(t > last, "{t} after promotion, master issued up to {last}");
            }
        }
        assert!(acquire(&mut r, "fresh", "new", "60000") > last);
    }
}

/// `DEBUG DIGEST-VALUE key`: changes with any byte the codec writes of the
/// record (the guard flag among them).
fn digest(c: &mut redis::Connection, key: &str) -> Value {
    ok(c, &["DEBUG", "DIGEST-VALUE", key])
}

full_suite! {
    fn a_replica_digests_its_masters_guards(kind) {
        let master = Server::start(kind);
        let mut m = master.conn();
        // A held guard before the replica's full sync (the RDB path)...
        ok(&mut m, &["LEASE.GUARD", "g:{a}"]);
        acquire(&mut m, "g:{a}", "w", "60000");
        let replica = replica_of(kind, &master);
        let mut r = replica.conn();
        // ...then guards as effects: a held lease that starts guarding, a
        // guard then held, a free one, and a plain lease beside them.
        acquire(&mut m, "g:{b}", "w", "60000");
        ok(&mut m, &["LEASE.GUARD", "g:{b}"]);
        ok(&mut m, &["LEASE.GUARD", "g:{d}"]);
        acquire(&mut m, "g:{d}", "w", "60000");
        ok(&mut m, &["LEASE.GUARD", "f:{c}"]);
        acquire(&mut m, "plain", "w", "60000");
        sync(&mut m, 1);
        let keys = ["g:{a}", "g:{b}", "g:{d}", "f:{c}", "plain"];
        for key in keys {
            assert_eq!(digest(&mut r, key), digest(&mut m, key), "{kind:?}: {key}");
        }
        assert_eq!(ok(&mut r, &["DEBUG", "DIGEST"]), ok(&mut m, &["DEBUG", "DIGEST"]), "{kind:?}");
        // The guard flag is part of the digest: the same holding unguarded
        // digests apart.
        let guarded = digest(&mut m, "g:{b}");
        assert_eq!(int(&ok(&mut m, &["LEASE.UNGUARD", "g:{b}"])), 1);
        assert_ne!(digest(&mut m, "g:{b}"), guarded, "{kind:?}: the flag in the digest");
        sync(&mut m, 1);
        assert_eq!(digest(&mut r, "g:{b}"), digest(&mut m, "g:{b}"), "{kind:?}: unguarded");
    }
}
