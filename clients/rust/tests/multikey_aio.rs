//! Multi-key leases of the async (tokio) helpers against real servers: the
//! same properties as tests/multikey.rs.
#![cfg(feature = "tokio")]

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::{Server, info_int, ok, ok_text, token_of, wait_until, waiters};
use redis_lease_client::aio::{LeaseClient, MultiLeaseHandle};
use redis_lease_client::{Block, Error, Loss};
use support::{LossyProxy, calls, try_acquire};

const MS: fn(u64) -> Duration = Duration::from_millis;
const KEYS: [&str; 3] = ["{acct}:1", "{acct}:2", "{acct}:3"];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

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
        rt().block_on(async {
            assert!(try_acquire(&mut c, KEYS[1], "other", "10000").is_some());
            assert!(lc.acquire_many(&KEYS, ttl, Block::NoWait).await.unwrap().is_none());
            assert_eq!(token_of(&mut c, KEYS[0]), None, "nothing held in part");
            assert_eq!(token_of(&mut c, KEYS[2]), None);
            ok(&mut c, &["LEASE.RELEASE", KEYS[1], "other"]);
            let lease = lc.acquire_many(&KEYS, ttl, Block::NoWait).await.unwrap().expect("free keys");
            assert_eq!(lease.keys(), KEYS);
            let t = lease.token() as i64;
            assert_eq!(tokens(&mut c), vec![Some(t); 3]);
            for (i, key) in KEYS.iter().enumerate() {
                let n: i64 = lease.fence(key, redis::cmd("HSET").arg("{acct}").arg(format!("f{i}")).arg(i)).await.unwrap();
                assert_eq!(n, 1);
            }
            assert_eq!(ok_text(&mut c, &["HGET", "{acct}", "f1"]), "1");
            let r: Result<i64, _> = lease.fence("{acct}:9", redis::cmd("HSET").arg("{acct}").arg("x").arg(1)).await;
            assert!(matches!(r, Err(Error::NotLeaseKey(_))), "{r:?}");
            assert!(matches!(lease.fence_cmd("nope", redis::cmd("GET").arg("x")), Err(Error::NotLeaseKey(_))));
            assert!(matches!(lc.acquire(KEYS[0], ttl, Block::Forever).await, Err(Error::AlreadyHeld(_))));
            let twice = ["{acct}:7", "{acct}:7"];
            assert!(matches!(client(&s).acquire_many(&twice, ttl, Block::NoWait).await, Err(Error::InvalidKeys(_))));
            assert!(lease.renew().await.unwrap());
            assert!(lease.release().await.unwrap());
            assert_eq!(tokens(&mut c), vec![None; 3]);
            assert_eq!(info_int(&mut c, "lease_released"), 1 + 3);
        });
    }

    fn the_watchdog_renews_every_key_with_one_mrenew(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = MS(300);
        rt().block_on(async {
            let multi = lc.acquire_many(&KEYS, ttl, Block::NoWait).await.unwrap().unwrap();
            let single = lc.acquire("{acct}:solo", ttl, Block::NoWait).await.unwrap().unwrap();
            let t = multi.token() as i64;
            let start = Instant::now();
            for _ in 0..40 {
                if start.elapsed() >= ttl * 6 {
                    break;
                }
                assert!(!multi.is_lost(), "lost after {:?}", start.elapsed());
                assert_eq!(tokens(&mut c), vec![Some(t); 3]);
                tokio::time::sleep(MS(50)).await;
            }
            assert!(start.elapsed() >= ttl * 6, "the loop ended early");
            assert!(!single.is_lost());
            assert!(single.release().await.unwrap());
            assert!(multi.release().await.unwrap());
            // Counted once the watchdog is done (a round in flight settles).
            tokio::time::sleep(MS(50)).await;
            let (mrenew, renew) = (calls(&mut c, "lease.mrenew"), calls(&mut c, "lease.renew"));
            assert!(mrenew >= 12 && renew >= 12, "{mrenew} {renew}");
            assert_eq!(info_int(&mut c, "lease_renewed"), 3 * mrenew + renew);
            let stats = lc.watchdog_stats();
            assert_eq!(stats.renewals as i64, mrenew + renew);
            assert!(stats.round_trips * 2 <= stats.renewals + 1, "one pipeline for both: {stats:?}");
        });
        assert_eq!(tokens(&mut c), vec![None; 3]);
    }

    fn one_key_taken_is_the_loss_of_every_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ttl = MS(600);
        rt().block_on(async {
            let lease = client(&s).acquire_many(&KEYS, ttl, Block::NoWait).await.unwrap().unwrap();
            ok(&mut c, &["DEL", KEYS[2]]);
            assert!(try_acquire(&mut c, KEYS[2], "thief", "10000").is_some());
            let start = Instant::now();
            let loss = tokio::time::timeout(Duration::from_secs(3), lease.lost()).await.unwrap();
            assert_eq!(loss, Loss::Refused);
            assert!(start.elapsed() < ttl, "noticed at the next renewal");
            let r: Result<i64, _> = lease.fence(KEYS[2], redis::cmd("SET").arg("{acct}:v").arg(2)).await;
            assert!(matches!(r, Err(Error::Stale)), "{r:?}");
            assert!(!lease.renew().await.unwrap());
            assert!(!lease.release().await.unwrap());
        });
        assert_eq!(token_of(&mut c, KEYS[0]), None, "the keys still ours were released");
        assert_eq!(token_of(&mut c, KEYS[1]), None);
        assert!(token_of(&mut c, KEYS[2]).is_some(), "the thief's key is left alone");
    }

    fn block_waits_until_every_key_is_free(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        assert!(try_acquire(&mut c, KEYS[0], "a", "10000").is_some());
        assert!(try_acquire(&mut c, KEYS[2], "b", "10000").is_some());
        let rt = rt();
        rt.block_on(async {
            let began = Instant::now();
            assert!(lc.acquire_many(&KEYS, ttl, Block::For(MS(300))).await.unwrap().is_none());
            assert!(began.elapsed() >= MS(300));
        });
        let lc2 = lc.clone();
        let waiter = rt.spawn(async move { lc2.acquire_many(&KEYS, ttl, Block::For(Duration::from_secs(5))).await });
        assert!(wait_until(Duration::from_secs(3), || waiters(&mut c, KEYS[0]) == 1 && waiters(&mut c, KEYS[2]) == 1));
        ok(&mut c, &["LEASE.RELEASE", KEYS[0], "a"]);
        std::thread::sleep(MS(100));
        assert!(!waiter.is_finished(), "still waiting for the last key");
        ok(&mut c, &["LEASE.RELEASE", KEYS[2], "b"]);
        let lease = rt.block_on(waiter).unwrap().unwrap().expect("every key at once");
        assert_eq!(tokens(&mut c), vec![Some(lease.token() as i64); 3]);
        // Dropping the guard spawns the release of every key.
        let _guard = rt.enter();
        drop(lease);
        assert!(wait_until(Duration::from_secs(2), || tokens(&mut c) == vec![None; 3]));
    }

    fn with_many_releases_however_the_job_ends(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        ok(&mut c, &["HSET", "{bank}:a", "balance", "100"]);
        let accounts = ["{bank}:a:lock", "{bank}:b:lock"];
        rt().block_on(async {
            let job = |lease: MultiLeaseHandle| async move {
                let _: i64 = lease.fence(accounts[0], redis::cmd("HINCRBY").arg("{bank}:a").arg("balance").arg(-30)).await?;
                let _: i64 = lease.fence(accounts[1], redis::cmd("HINCRBY").arg("{bank}:b").arg("balance").arg(30)).await?;
                Ok::<_, Error>(lease.token())
            };
            let moved = lc.with_many(&accounts, ttl, Block::NoWait, job).await;
            assert!(matches!(moved, Ok(Some(_))), "{moved:?}");
            let failed: Result<Option<()>, Error> = lc
                .with_many(&KEYS, ttl, Block::NoWait, |_| async { Err(Error::Stale) })
                .await;
            assert!(matches!(failed, Err(Error::Stale)));
        });
        assert_eq!(ok_text(&mut c, &["HGET", "{bank}:a", "balance"]), "70");
        assert_eq!(ok_text(&mut c, &["HGET", "{bank}:b", "balance"]), "30");
        assert!(accounts.iter().all(|k| token_of(&mut c, k).is_none()), "released");
        assert_eq!(tokens(&mut c), vec![None; 3], "released after the error");
    }

    fn a_lost_macquire_reply_is_retried_with_the_same_owner(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let proxy = LossyProxy::start(s.port);
        let lc = LeaseClient::open(&proxy.url()).unwrap();
        proxy.arm();
        rt().block_on(async {
            let lease = lc.acquire_many(&KEYS, Duration::from_secs(10), Block::NoWait).await.unwrap().unwrap();
            assert_eq!(proxy.dropped(), 1, "the first reply was lost");
            assert_eq!(info_int(&mut c, "lease_acquired"), 3);
            assert_eq!(info_int(&mut c, "lease_reacquired"), 3);
            assert_eq!(tokens(&mut c), vec![Some(lease.token() as i64); 3]);
            assert!(lease.release().await.unwrap());
        });
        assert_eq!(tokens(&mut c), vec![None; 3], "no orphan left");
    }
}
