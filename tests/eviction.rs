//! Leases lost to eviction leave a trace (design.md S4): under a
//! `maxmemory-policy` that evicts, an evicted lease key is counted per
//! holder in `lease_evicted` and logged (at most once every ten seconds),
//! and a policy changed at run time to one that can evict is warned about.
//! An evicted guard key ends its guard (design.md S12).
mod common;
use common::*;

const EVICTED_LINE: &str = "a lease key was evicted";
const POLICY_WARNING: &str = "lease keys may be evicted";

full_suite! {
    fn evicted_leases_are_counted_and_logged(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        for i in 0..50 {
            acquire(&mut c, &format!("lease:{i}"), "me", "60000");
        }
        assert!(acquire_opts(&mut c, "sem", "a", "60000", &["LIMIT", "3"]).is_some());
        assert!(acquire_opts(&mut c, "sem", "b", "60000", &["LIMIT", "3"]).is_some());
        let limit = (used_memory(&mut c) + 2_000_000).to_string();
        ok(&mut c, &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"]);
        ok(&mut c, &["CONFIG", "SET", "maxmemory", &limit]);
        assert!(s.log().contains(POLICY_WARNING), "no warning for the new policy:\n{}", s.log_tail(10));
        // Fill memory until every lease key is gone (bounded: 400 x 100 KB).
        let big = "x".repeat(100_000);
        for i in 0..400 {
            let _ = call(&mut c, &[b"SET", format!("filler:{i}").as_bytes(), big.as_bytes()]);
            let left = (0..50)
                .filter(|i| int(&ok(&mut c, &["EXISTS", &format!("lease:{i}")])) == 1)
                .count()
                + int(&ok(&mut c, &["EXISTS", "sem"])) as usize;
            if left == 0 {
                break;
            }
        }
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
        let gone = (0..50)
            .filter(|i| int(&ok(&mut c, &["EXISTS", &format!("lease:{i}")])) == 0)
            .count()
            + 2 * (int(&ok(&mut c, &["EXISTS", "sem"])) == 0) as usize;
        assert!(gone > 0, "nothing was evicted");
        assert_eq!(info_int(&mut c, "lease_evicted"), gone as i64, "one per holder evicted");
        assert_eq!(info_int(&mut c, "lease_expired"), 0, "an eviction is no expiry");
        let lines = s.log().lines().filter(|l| l.contains(EVICTED_LINE)).count();
        assert_eq!(lines, 1, "{kind:?}: evictions are logged once per ten seconds:\n{}", s.log_tail(10));
    }

    // A guard key lost to eviction ends its guard (its tag takes plain
    // writes again), counted in `lease_guard_deleted` and, for its holder,
    // in `lease_evicted`.
    fn an_evicted_guard_key_ends_its_guard_and_is_counted(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.GUARD", "{acct}:lock"]);
        acquire(&mut c, "{acct}:lock", "me", "60000");
        assert!(err(&mut c, &["SET", "{acct}:balance", "1"]).starts_with("FENCED"));
        let limit = (used_memory(&mut c) + 2_000_000).to_string();
        ok(&mut c, &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"]);
        ok(&mut c, &["CONFIG", "SET", "maxmemory", &limit]);
        // Fill memory until the guard key is gone (bounded: 400 x 100 KB).
        let big = "x".repeat(100_000);
        for i in 0..400 {
            let _ = call(&mut c, &[b"SET", format!("filler:{i}").as_bytes(), big.as_bytes()]);
            if int(&ok(&mut c, &["EXISTS", "{acct}:lock"])) == 0 {
                break;
            }
        }
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "{acct}:lock"])), 0, "the guard key was never evicted");
        assert_eq!(info_int(&mut c, "lease_guards"), 0);
        assert_eq!(info_int(&mut c, "lease_guard_deleted"), 1);
        assert_eq!(info_int(&mut c, "lease_evicted"), 1, "its holder");
        ok(&mut c, &["SET", "{acct}:balance", "1"]);
    }

    fn a_policy_that_cannot_evict_warns_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        ok(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        assert!(!s.log().contains(POLICY_WARNING), "{}", s.log_tail(10));
        assert_eq!(info_int(&mut c, "lease_eviction_may_lose_leases"), 0);
        ok(&mut c, &["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"]);
        assert!(s.log().contains(POLICY_WARNING), "{}", s.log_tail(10));
        assert_eq!(info_int(&mut c, "lease_eviction_may_lose_leases"), 1);
    }
}
