//! Multi-key leases of the sync helpers (`acquire_many`, `with_many`,
//! `MultiLease`; design.md S10) against real servers (Redis 7.0 and 8.2,
//! Valkey 8.1 and 9.1): all or nothing, one token on every key, fenced
//! writes on each key, one `LEASE.MRENEW` per renewal, the loss of every key
//! when one is taken, `BLOCK` until every key is free, release on every way
//! out, and a lost reply retried with the same owner.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread;
use std::time::{Duration, Instant};

use common::{Server, info_int, ok, ok_text, token_of, wait_until, waiters};
use redis_lease_client::{Block, Error, LeaseClient, Loss, MultiLease};
use support::{LossyProxy, calls, try_acquire};

const MS: fn(u64) -> Duration = Duration::from_millis;
const KEYS: [&str; 3] = ["{acct}:1", "{acct}:2", "{acct}:3"];

fn client(s: &Server) -> LeaseClient {
    LeaseClient::open(&s.url(false)).unwrap()
}

fn tokens(c: &mut redis::Connection) -> Vec<Option<i64>> {
    KEYS.iter().map(|k| token_of(c, k)).collect()
}

full_suite! {
    fn all_or_nothing_with_one_token_fencing_every_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        // One key held by another owner: nothing is taken.
        assert!(try_acquire(&mut c, KEYS[1], "other", "10000").is_some());
        assert!(lc.acquire_many(&KEYS, ttl, Block::NoWait).unwrap().is_none());
        assert_eq!(token_of(&mut c, KEYS[0]), None, "nothing held in part");
        assert_eq!(token_of(&mut c, KEYS[2]), None);
        assert_eq!(info_int(&mut c, "lease_acquired"), 1, "only the other owner's");
        ok(&mut c, &["LEASE.RELEASE", KEYS[1], "other"]);
        // Every key free: one token on all three.
        let mut lease: MultiLease = lc.acquire_many(&KEYS, ttl, Block::NoWait).unwrap().expect("free keys");
        assert_eq!(lease.keys(), KEYS);
        let t = lease.token() as i64;
        assert_eq!(tokens(&mut c), vec![Some(t); 3]);
        // A fenced write on each key with the one token.
        for (i, key) in KEYS.iter().enumerate() {
            let n: i64 = lease.fence(key, redis::cmd("HSET").arg("{acct}").arg(format!("f{i}")).arg(i)).unwrap();
            assert_eq!(n, 1);
        }
        assert_eq!(ok_text(&mut c, &["HGET", "{acct}", "f2"]), "2");
        // A key that is not the lease's: nothing sent.
        let r: Result<i64, _> = lease.fence("{acct}:9", redis::cmd("HSET").arg("{acct}").arg("x").arg(1));
        assert!(matches!(r, Err(Error::NotLeaseKey(ref k)) if k == "{acct}:9"), "{r:?}");
        assert!(matches!(lease.fence_cmd("{acct}:9", redis::cmd("GET").arg("x")), Err(Error::NotLeaseKey(_))));
        assert!(lease.fence_cmd(KEYS[0], redis::cmd("GET").arg("x")).is_ok());
        assert_eq!(ok(&mut c, &["HEXISTS", "{acct}", "x"]), common::Value::Int(0));
        // This client holds them: a second acquire of any fails at once.
        assert!(matches!(lc.acquire(KEYS[2], ttl, Block::Forever), Err(Error::AlreadyHeld(ref k)) if k == KEYS[2]));
        assert!(matches!(lc.acquire_many(&["{acct}:0", KEYS[0]], ttl, Block::NoWait), Err(Error::AlreadyHeld(_))));
        // No key, or a key twice: nothing sent.
        let none: [&str; 0] = [];
        assert!(matches!(client(&s).acquire_many(&none, ttl, Block::NoWait), Err(Error::InvalidKeys(_))));
        let twice = ["{acct}:7".to_string(), "{acct}:7".to_string()];
        assert!(matches!(client(&s).acquire_many(&twice, ttl, Block::NoWait), Err(Error::InvalidKeys(_))));
        assert!(matches!(client(&s).acquire_many(&["{acct}:7"], Duration::ZERO, Block::NoWait), Err(Error::InvalidTtl(_))));
        assert_eq!(calls(&mut c, "lease.macquire"), 2);
        // Renew by hand, then release: every key free, counted per key.
        assert!(lease.renew().unwrap());
        assert!(lease.release().unwrap());
        assert_eq!(tokens(&mut c), vec![None; 3]);
        assert_eq!(info_int(&mut c, "lease_released"), 1 + 3);
        let again = lc.acquire(KEYS[2], ttl, Block::NoWait).unwrap().expect("free after the release");
        assert!(again.token() > t as u64);
    }

    fn the_watchdog_renews_every_key_with_one_mrenew(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = MS(300);
        let multi = lc.acquire_many(&KEYS, ttl, Block::NoWait).unwrap().unwrap();
        let single = lc.acquire("{acct}:solo", ttl, Block::NoWait).unwrap().unwrap();
        let t = multi.token() as i64;
        // Six ttls, checked every 50 ms: every key still ours, same token.
        let start = Instant::now();
        for _ in 0..40 {
            if start.elapsed() >= ttl * 6 {
                break;
            }
            assert!(!multi.is_lost(), "lost after {:?}: {:?}", start.elapsed(), multi.loss());
            assert_eq!(tokens(&mut c), vec![Some(t); 3]);
            assert_eq!(try_acquire(&mut c, KEYS[1], "other", "1000"), None);
            thread::sleep(MS(50));
        }
        assert!(start.elapsed() >= ttl * 6, "the loop ended early");
        assert!(!single.is_lost());
        assert_eq!(lc.watchdog_stats().leases, 2);
        drop(single);
        assert!(multi.release().unwrap());
        assert_eq!(tokens(&mut c), vec![None; 3]);
        // Counted once the watchdog is done (a round in flight settles).
        thread::sleep(MS(50));
        // One LEASE.MRENEW per renewal of the three keys, which the server
        // counts as three renewed keys; the single lease's rode along in the
        // same pipelines.
        let (mrenew, renew) = (calls(&mut c, "lease.mrenew"), calls(&mut c, "lease.renew"));
        assert!(mrenew >= 12, "about three renewals per ttl: {mrenew}");
        assert!(renew >= 12, "{renew}");
        assert_eq!(info_int(&mut c, "lease_renewed"), 3 * mrenew + renew);
        let stats = lc.watchdog_stats();
        assert_eq!(stats.renewals as i64, mrenew + renew);
        assert!(stats.round_trips * 2 <= stats.renewals + 1, "one pipeline for both: {stats:?}");
        assert!(wait_until(Duration::from_secs(2), || lc.watchdog_stats().leases == 0));
    }

    fn one_key_taken_is_the_loss_of_every_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ttl = MS(600);
        let mut lease = client(&s).acquire_many(&KEYS, ttl, Block::NoWait).unwrap().unwrap();
        let _: i64 = lease.fence(KEYS[0], redis::cmd("HSET").arg("{acct}").arg("v").arg(1)).unwrap();
        // Someone deletes one key and takes it: the next MRENEW answers 0.
        ok(&mut c, &["DEL", KEYS[1]]);
        assert!(try_acquire(&mut c, KEYS[1], "thief", "10000").is_some());
        let start = Instant::now();
        assert_eq!(lease.wait_lost(Some(Duration::from_secs(3))), Some(Loss::Refused));
        assert!(start.elapsed() < ttl, "noticed at the next renewal, before the deadline");
        let r: Result<i64, _> = lease.fence(KEYS[1], redis::cmd("HSET").arg("{acct}").arg("v").arg(2));
        assert!(matches!(r, Err(Error::Stale)), "{r:?}");
        assert_eq!(ok_text(&mut c, &["HGET", "{acct}", "v"]), "1");
        assert!(!lease.renew().unwrap(), "MRENEW renews nothing now");
        // The release frees the keys still ours at once, not at their ttl,
        // and leaves the thief's alone.
        let began = Instant::now();
        assert!(!lease.release().unwrap());
        assert!(began.elapsed() < MS(500));
        assert_eq!(token_of(&mut c, KEYS[0]), None);
        assert_eq!(token_of(&mut c, KEYS[2]), None);
        assert!(token_of(&mut c, KEYS[1]).is_some(), "the thief still holds its key");
    }

    fn block_waits_until_every_key_is_free(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        assert!(try_acquire(&mut c, KEYS[0], "a", "10000").is_some());
        assert!(try_acquire(&mut c, KEYS[2], "b", "10000").is_some());
        // A wait that runs out takes nothing.
        let began = Instant::now();
        assert!(lc.acquire_many(&KEYS, ttl, Block::For(MS(300))).unwrap().is_none());
        assert!(began.elapsed() >= MS(300), "waited the BLOCK time");
        assert_eq!(token_of(&mut c, KEYS[1]), None);
        let lc2 = lc.clone();
        let waiter = thread::spawn(move || lc2.acquire_many(&KEYS, ttl, Block::For(Duration::from_secs(5))));
        assert!(wait_until(Duration::from_secs(3), || waiters(&mut c, KEYS[0]) == 1 && waiters(&mut c, KEYS[2]) == 1));
        // One key freed: still waiting, nothing held in part.
        ok(&mut c, &["LEASE.RELEASE", KEYS[0], "a"]);
        thread::sleep(MS(100));
        assert!(!waiter.is_finished());
        assert_eq!(tokens(&mut c), vec![None, None, Some(token_of(&mut c, KEYS[2]).unwrap())]);
        ok(&mut c, &["LEASE.RELEASE", KEYS[2], "b"]);
        let lease = waiter.join().unwrap().unwrap().expect("every key at once");
        assert_eq!(tokens(&mut c), vec![Some(lease.token() as i64); 3]);
        drop(lease);
        assert_eq!(tokens(&mut c), vec![None; 3]);
        // A wait longer than a third of the ttl starts with a fresh deadline
        // (an MRENEW at once).
        assert!(try_acquire(&mut c, KEYS[1], "holder", "400").is_some());
        let ttl = MS(300);
        let sent = Instant::now();
        let lease = lc.acquire_many(&KEYS, ttl, Block::For(Duration::from_secs(3))).unwrap().unwrap();
        assert!(sent.elapsed() >= MS(350), "waited for the holder's expiry");
        assert!(lease.signal().deadline() > sent + ttl, "renewed after the wait");
        thread::sleep(ttl * 2);
        assert!(!lease.is_lost(), "{:?}", lease.loss());
        assert_eq!(tokens(&mut c), vec![Some(lease.token() as i64); 3]);
    }

    fn with_many_and_drop_release_every_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        // A transfer between two accounts, fenced with the one token.
        ok(&mut c, &["HSET", "{bank}:a", "balance", "100"]);
        let accounts = ["{bank}:a:lock", "{bank}:b:lock"];
        let moved = lc.with_many(&accounts, ttl, Block::For(Duration::from_secs(1)), |lease| {
            let _: i64 = lease.fence(accounts[0], redis::cmd("HINCRBY").arg("{bank}:a").arg("balance").arg(-30))?;
            let _: i64 = lease.fence(accounts[1], redis::cmd("HINCRBY").arg("{bank}:b").arg("balance").arg(30))?;
            Ok::<_, Error>(lease.token())
        });
        assert!(matches!(moved, Ok(Some(_))), "{moved:?}");
        assert_eq!(ok_text(&mut c, &["HGET", "{bank}:a", "balance"]), "70");
        assert_eq!(ok_text(&mut c, &["HGET", "{bank}:b", "balance"]), "30");
        assert!(accounts.iter().all(|k| token_of(&mut c, k).is_none()), "released");
        // An error.
        let r: Result<Option<()>, Error> = lc.with_many(&KEYS, ttl, Block::NoWait, |lease| {
            let _: i64 = lease.fence(KEYS[0], redis::cmd("INCR").arg("{acct}:n"))?;
            let _: i64 = lease.fence(KEYS[1], redis::cmd("HSET").arg("{acct}:n").arg("f").arg(1))?; // WRONGTYPE
            Ok(())
        });
        assert!(matches!(r, Err(Error::Redis(ref e)) if e.code() == Some("WRONGTYPE")), "{r:?}");
        assert_eq!(tokens(&mut c), vec![None; 3], "released after the error");
        // A panic.
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _: Result<Option<()>, Error> = lc.with_many(&KEYS, ttl, Block::NoWait, |_| panic!("boom"));
        }));
        assert!(r.is_err());
        assert_eq!(tokens(&mut c), vec![None; 3], "released by the guard's drop");
        // The guard's drop.
        let lease = lc.acquire_many(&KEYS, ttl, Block::NoWait).unwrap().unwrap();
        drop(lease);
        assert_eq!(tokens(&mut c), vec![None; 3]);
        // Busy: Ok(None); lost during the work: Err(Lost) at its end.
        assert!(try_acquire(&mut c, KEYS[2], "other", "10000").is_some());
        assert_eq!(lc.with_many(&KEYS, ttl, Block::NoWait, |_| Ok::<_, Error>(())).unwrap(), None);
        ok(&mut c, &["LEASE.RELEASE", KEYS[2], "other"]);
        let got = lc.with_many(&KEYS, MS(600), Block::NoWait, |lease| {
            ok(&mut c, &["DEL", KEYS[0]]);
            lease.wait_lost(Some(Duration::from_secs(3)));
            Ok::<_, Error>("done")
        });
        assert!(matches!(got, Err(Error::Lost(Loss::Refused))), "{got:?}");
        assert_eq!(tokens(&mut c), vec![None; 3], "the keys still held were released too");
    }

    fn a_lost_macquire_reply_is_retried_with_the_same_owner(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let proxy = LossyProxy::start(s.port);
        let lc = LeaseClient::open(&proxy.url()).unwrap();
        proxy.arm();
        let lease = lc.acquire_many(&KEYS, Duration::from_secs(10), Block::NoWait).unwrap().unwrap();
        assert_eq!(proxy.dropped(), 1, "the first reply was lost");
        // The lost call took the keys; the retry (same owner) got the same
        // token back: three keys acquired once, reacquired once.
        assert_eq!(info_int(&mut c, "lease_acquired"), 3);
        assert_eq!(info_int(&mut c, "lease_reacquired"), 3);
        assert_eq!(tokens(&mut c), vec![Some(lease.token() as i64); 3]);
        assert!(lease.release().unwrap(), "the retry's owner is the holder");
        assert_eq!(tokens(&mut c), vec![None; 3], "no orphan left");
    }

    fn a_grace_refusal_of_a_multi_key_acquire_says_so(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "3000"]);
        ok(&mut c, &["REPLICAOF", "127.0.0.1", "1"]);
        ok(&mut c, &["REPLICAOF", "NO", "ONE"]);
        match lc.acquire_many(&KEYS, MS(1000), Block::NoWait) {
            Err(Error::Grace { remaining, reason }) => {
                assert!(remaining > Duration::ZERO && remaining <= MS(3000), "{remaining:?}");
                assert_eq!(reason, "promoted");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "0"]);
        assert!(try_acquire(&mut c, KEYS[0], "other", "10000").is_some());
        assert!(lc.acquire_many(&KEYS, MS(1000), Block::NoWait).unwrap().is_none(), "contention is Ok(None)");
    }
}

#[test]
fn the_readme_shows_the_multi_key_example_the_doctest_compiles() {
    // The example of `LeaseClient::with_many` (a doctest, compiled by
    // `cargo test --doc`) is the one in the README, hidden lines aside.
    let dir = env!("CARGO_MANIFEST_DIR");
    let src = std::fs::read_to_string(format!("{dir}/src/sync.rs")).unwrap();
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    let before = &src[..src.find("pub fn with_many").unwrap()];
    let doc = &before[before.rfind("/// ```no_run").unwrap()..];
    let body: String = doc
        .lines()
        .skip(1)
        .map(|l| l.trim_start().trim_start_matches("///"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(body.contains("with_many"), "{body}");
    assert!(
        readme.contains(&body),
        "clients/rust/README.md does not show the with_many doctest as it is:\n{body}"
    );
}
