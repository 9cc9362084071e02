//! The async (tokio) helpers against real servers (Redis 7.0, Valkey 8.1 and
//! 9.1): the same properties as tests/sync.rs.
#![cfg(feature = "tokio")]

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

#[path = "../examples/quickstart_async.rs"]
#[allow(dead_code)]
mod quickstart_async;

use std::thread;
use std::time::{Duration, Instant};

use common::{Frozen, Server, info_int, info_value, ok, ok_text, token_of, wait_until, waiters};
use redis_lease_client::aio::LeaseClient;
use redis_lease_client::{Block, Error, Loss, Mode};
use support::{LossyProxy, blocked_acquirer, calls, competitor, try_acquire};

const MS: fn(u64) -> Duration = Duration::from_millis;

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

full_suite! {
    fn many_leases_share_two_connections_and_batched_renewals(kind) {
        // As in tests/sync.rs: 300 leases of one client share one
        // multiplexed connection and one watchdog task that pipelines.
        let s = Server::start(kind);
        let mut c = s.conn();
        let clients = |c: &mut redis::Connection| -> i64 {
            info_value(c, "clients", "connected_clients").unwrap().parse().unwrap()
        };
        let base = clients(&mut c);
        let client = client(&s);
        let ttl = MS(900);
        rt().block_on(async {
            let mut leases = Vec::new();
            for i in 0..300 {
                leases.push(client.acquire(&format!("job:{i}"), ttl, Block::NoWait).await.unwrap().unwrap());
            }
            tokio::time::sleep(ttl * 3).await;
            assert!(leases.iter().all(|l| !l.is_lost()), "every lease is still held");
            for (i, l) in leases.iter().enumerate().step_by(37) {
                assert_eq!(token_of(&mut c, &format!("job:{i}")), Some(l.token() as i64));
            }
            let stats = client.watchdog_stats();
            assert_eq!(stats.leases, 300);
            assert!(stats.renewals >= 300 * 6, "{stats:?}");
            assert!(stats.round_trips * 50 <= stats.renewals, "batched: {stats:?}");
            assert_eq!(clients(&mut c) - base, 2, "the shared connection and the watchdog's");
            ok(&mut c, &["DEL", "job:7"]);
            let took = Instant::now();
            let lost = tokio::time::timeout(ttl, leases[7].lost()).await;
            assert_eq!(lost.ok(), Some(Loss::Refused));
            assert!(took.elapsed() <= ttl / 3 + MS(150), "noticed after {:?}", took.elapsed());
            assert_eq!(leases.iter().filter(|l| l.is_lost()).count(), 1);
            for l in leases {
                let _ = l.release().await;
            }
        });
        assert_eq!(info_int(&mut c, "lease_released"), 299);
        assert_eq!(client.watchdog_stats().leases, 0);
    }

    fn a_fence_after_the_server_dropped_the_connection_is_sent_on_a_new_one(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        rt().block_on(async {
            let lease = client(&s).acquire("job", MS(600), Block::NoWait).await.unwrap().unwrap();
            let _: () = lease.fence(redis::cmd("SET").arg("data").arg("before")).await.unwrap();
            let before = info_int(&mut c, "lease_renewed");
            ok(&mut c, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            for _ in 0..150 {
                if info_int(&mut c, "lease_renewed") > before {
                    break;
                }
                tokio::time::sleep(MS(20)).await;
            }
            assert!(info_int(&mut c, "lease_renewed") > before, "the watchdog renews again");
            let _: () = lease.fence(redis::cmd("SET").arg("data").arg("after")).await.unwrap();
            assert!(!lease.is_lost());
            assert!(lease.release().await.unwrap());
        });
        assert_eq!(ok_text(&mut c, &["GET", "data"]), "after");
    }

    fn a_grace_refusal_says_so_and_how_long_remains(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "3000"]);
        ok(&mut c, &["REPLICAOF", "127.0.0.1", "1"]);
        ok(&mut c, &["REPLICAOF", "NO", "ONE"]);
        rt().block_on(async {
            match lc.acquire("job", MS(1000), Block::NoWait).await {
                Err(Error::Grace { remaining, reason }) => {
                    assert!(remaining > Duration::ZERO && remaining <= MS(3000), "{remaining:?}");
                    assert_eq!(reason, "promoted");
                }
                other => panic!("{kind:?}: {other:?}"),
            }
        });
    }

    fn a_loss_during_the_work_is_reported_at_its_end(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let got = rt().block_on(client(&s).with_lease("job", MS(600), Block::NoWait, |lease| async move {
            ok(&mut c, &["DEL", "job"]);
            tokio::time::timeout(Duration::from_secs(3), lease.lost()).await.unwrap();
            Ok::<_, Error>(())
        }));
        assert!(matches!(got, Err(Error::Lost(Loss::Refused))), "{got:?}");
    }

    fn a_second_acquire_of_a_key_this_client_holds_fails_at_once(kind) {
        let s = Server::start(kind);
        rt().block_on(async {
            let lc = client(&s);
            let lease = lc.acquire("job", MS(5000), Block::NoWait).await.unwrap().unwrap();
            let again = lc.acquire("job", MS(5000), Block::Forever).await;
            assert!(matches!(again, Err(Error::AlreadyHeld(_))), "{again:?}");
            assert!(lease.release().await.unwrap());
            let again = lc.acquire("job", MS(5000), Block::NoWait).await.unwrap().unwrap();
            assert!(again.release().await.unwrap());
        });
    }

    fn shared_and_limit_modes(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["SET", "docdata", "v"]);
        rt().block_on(async {
            let reader = || client(&s).with_mode(Mode::Shared);
            let a = reader().acquire("doc", MS(600), Block::NoWait).await.unwrap().unwrap();
            let b = reader().acquire("doc", MS(600), Block::NoWait).await.unwrap().unwrap();
            assert!(client(&s).acquire("doc", MS(600), Block::NoWait).await.unwrap().is_none());
            let w: Result<(), Error> = a.fence(redis::cmd("SET").arg("docdata").arg("x")).await;
            assert!(matches!(w, Err(Error::SharedWrite)), "{w:?}");
            tokio::time::sleep(MS(1000)).await;
            assert!(!a.is_lost() && !b.is_lost(), "renewed");
            assert!(a.release().await.unwrap() && b.release().await.unwrap());
            let p = client(&s).with_mode(Mode::Limit(2)).acquire("pool", MS(600), Block::NoWait).await.unwrap();
            assert!(p.is_some());
        });
    }

    fn a_ttl_under_a_millisecond_is_an_error(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        rt().block_on(async {
            let got = client(&s).acquire("job", Duration::from_micros(500), Block::NoWait).await;
            assert!(matches!(got, Err(Error::InvalidTtl(_))), "{got:?}");
        });
        assert_eq!(token_of(&mut c, "job"), None, "nothing was sent");
    }

    fn leaving_the_block_after_a_loss_is_quick(kind) {
        let s = Server::start(kind);
        let took = rt().block_on(async {
            let lease = client(&s).acquire("job", MS(400), Block::NoWait).await.unwrap().unwrap();
            let frozen = Frozen::stop(&s);
            tokio::time::timeout(Duration::from_secs(5), lease.lost()).await.unwrap();
            let began = Instant::now();
            assert!(!lease.release().await.unwrap());
            let took = began.elapsed();
            drop(frozen);
            took
        });
        assert!(took < MS(1000), "the release of a lost lease took {took:?}");
    }

    fn watchdog_keeps_the_lease_over_several_ttls(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        rt().block_on(async {
            let ttl = MS(300);
            let lease = client(&s).acquire("job", ttl, Block::NoWait).await.unwrap().unwrap();
            let start = Instant::now();
            for _ in 0..40 {
                if start.elapsed() >= ttl * 6 {
                    break;
                }
                assert!(!lease.is_lost(), "lost after {:?}", start.elapsed());
                assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
                tokio::time::sleep(MS(50)).await;
            }
            assert!(start.elapsed() >= ttl * 6);
            assert!(info_int(&mut c, "lease_renewed") >= 10);
            assert!(lease.release().await.unwrap());
        });
        assert_eq!(token_of(&mut c, "job"), None);
    }

    fn loss_is_signalled_before_anyone_else_can_get_the_lease(kind) {
        let s = Server::start(kind);
        let ttl = MS(400);
        let runtime = rt();
        let lease = runtime
            .block_on(client(&s).acquire("job", ttl, Block::NoWait))
            .unwrap()
            .unwrap();
        let deadline = lease.signal().deadline();
        let signal = lease.signal();
        let noticed = runtime.spawn(async move {
            let loss = tokio::time::timeout(Duration::from_secs(10), signal.lost()).await;
            (loss.ok(), Instant::now())
        });
        let rival = competitor(&s, "job", Duration::from_secs(10));
        let frozen = Frozen::stop(&s);
        let thaw = thread::spawn(move || {
            thread::sleep(ttl + MS(300));
            drop(frozen);
            Instant::now()
        });
        let (loss, lost_at) = runtime.block_on(noticed).unwrap();
        let thawed_at = thaw.join().unwrap();
        let rival_at = rival.join().unwrap().expect("the competitor gets the lease");
        assert_eq!(loss, Some(Loss::Expired));
        assert!(lost_at < thawed_at, "signalled only after the server ran again");
        assert!(lost_at < rival_at, "the competitor got the lease first");
        assert!(lost_at >= deadline);
        assert!(lost_at - deadline < MS(250), "signalled {:?} late", lost_at - deadline);
        runtime.block_on(async {
            let r = lease.fence::<i64>(redis::cmd("SET").arg("data").arg("stale")).await;
            assert!(matches!(r, Err(Error::Stale)), "{r:?}");
            assert!(!lease.release().await.unwrap());
        });
        let mut c = s.conn();
        assert_eq!(ok(&mut c, &["EXISTS", "data"]), common::Value::Int(0));
    }

    fn fence_min_ttl_refuses_with_expiring_and_runs_nothing_while_the_lease_stays_held(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        rt().block_on(async {
            let ttl = MS(2000);
            let lease = client(&s).acquire("job", ttl, Block::NoWait).await.unwrap().unwrap();
            let r = lease.fence_min_ttl::<i64>(MS(60_000), redis::cmd("HSET").arg("data").arg("v").arg(1)).await;
            match r {
                Err(Error::Expiring { left, min_ttl }) => assert!(left <= ttl && min_ttl == MS(60_000), "{left:?}"),
                other => panic!("{other:?}"),
            }
            let n: i64 = lease.fence_min_ttl(MS(100), redis::cmd("HSET").arg("data").arg("v").arg(2)).await.unwrap();
            assert_eq!(n, 1);
            assert!(!lease.is_lost());
            let many = client(&s).acquire_many(&["{m}a", "{m}b"], ttl, Block::NoWait).await.unwrap().unwrap();
            let r = many.fence_min_ttl::<()>("{m}a", MS(60_000), redis::cmd("SET").arg("{m}x").arg(1)).await;
            assert!(matches!(r, Err(Error::Expiring { .. })), "{r:?}");
            assert!(lease.release().await.unwrap() && many.release().await.unwrap());
        });
        assert_eq!(ok_text(&mut c, &["HGET", "data", "v"]), "2");
        assert_eq!(ok(&mut c, &["EXISTS", "{m}x"]), common::Value::Int(0));
    }

    fn refused_renewal_signals_the_loss_and_the_fence_refuses(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        rt().block_on(async {
            let ttl = MS(600);
            let lease = client(&s).acquire("job", ttl, Block::NoWait).await.unwrap().unwrap();
            let _: i64 = lease.fence(redis::cmd("HSET").arg("data").arg("v").arg(1)).await.unwrap();
            ok(&mut c, &["DEL", "job"]);
            assert!(try_acquire(&mut c, "job", "thief", "10000").is_some());
            let start = Instant::now();
            let loss = tokio::time::timeout(Duration::from_secs(3), lease.lost()).await;
            assert_eq!(loss.ok(), Some(Loss::Refused));
            assert!(start.elapsed() < ttl);
            let r = lease.fence::<i64>(redis::cmd("HSET").arg("data").arg("v").arg(2)).await;
            assert!(matches!(r, Err(Error::Stale)), "{r:?}");
            // Lost, a renewal is not sent.
            let sent = calls(&mut c, "lease.renew");
            assert!(!lease.renew().await.unwrap());
            assert_eq!(calls(&mut c, "lease.renew"), sent, "nothing sent");
        });
        assert_eq!(ok_text(&mut c, &["HGET", "data", "v"]), "1");
    }

    fn a_lost_acquire_reply_is_retried_with_the_same_owner(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let proxy = LossyProxy::start(s.port);
        rt().block_on(async {
            let lc = LeaseClient::open(&proxy.url()).unwrap();
            proxy.arm();
            let lease = lc.acquire("job", Duration::from_secs(10), Block::NoWait).await.unwrap().unwrap();
            assert_eq!(proxy.dropped(), 1);
            assert_eq!(info_int(&mut c, "lease_acquired"), 1);
            assert_eq!(info_int(&mut c, "lease_reacquired"), 1);
            assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
            assert!(lease.release().await.unwrap());
        });
        assert_eq!(token_of(&mut c, "job"), None);
    }

    fn client_kill_of_a_blocked_acquire_is_retried(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        assert!(try_acquire(&mut c, "job", "holder", "10000").is_some());
        let runtime = rt();
        let lc = client(&s);
        let waiter = runtime.spawn(async move {
            lc.acquire("job", Duration::from_secs(10), Block::For(Duration::from_secs(10))).await
        });
        let first = blocked_acquirer(&s);
        ok(&mut c, &["CLIENT", "KILL", "ID", &first.to_string()]);
        let mut second = first;
        assert!(wait_until(Duration::from_secs(5), || {
            second = blocked_acquirer(&s);
            second != first
        }));
        assert_eq!(waiters(&mut c, "job"), 1);
        ok(&mut c, &["LEASE.RELEASE", "job", "holder"]);
        let lease = runtime.block_on(waiter).unwrap().unwrap().expect("the retry gets the lease");
        assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
        assert_eq!(info_int(&mut c, "lease_acquired"), 2);
        assert!(runtime.block_on(lease.release()).unwrap());
    }

    fn with_lease_releases_on_error_panic_and_drop(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let runtime = rt();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        runtime.block_on(async {
            let r: Result<Option<()>, Error> = lc
                .with_lease("job", ttl, Block::NoWait, |lease| async move {
                    let _: i64 = lease.fence(redis::cmd("INCR").arg("n")).await?;
                    let _: i64 = lease.fence(redis::cmd("HSET").arg("n").arg("f").arg(1)).await?;
                    Ok(())
                })
                .await;
            assert!(matches!(r, Err(Error::Redis(ref e)) if e.code() == Some("WRONGTYPE")), "{r:?}");
        });
        assert_eq!(token_of(&mut c, "job"), None, "released after the error");
        // A job that panics, in a task of its own: the guard's drop spawns
        // the release.
        let lc2 = lc.clone();
        let task = runtime.spawn(async move {
            let _: Result<Option<()>, Error> = lc2
                .with_lease("job", ttl, Block::NoWait, |_| async { panic!("boom") })
                .await;
        });
        assert!(runtime.block_on(task).unwrap_err().is_panic());
        assert!(wait_until(Duration::from_secs(5), || token_of(&mut c, "job").is_none()), "released after the panic");
        // A guard simply dropped.
        let lease = runtime.block_on(lc.acquire("job", ttl, Block::NoWait)).unwrap().unwrap();
        assert!(token_of(&mut c, "job").is_some());
        runtime.block_on(async move { drop(lease) });
        assert!(wait_until(Duration::from_secs(5), || token_of(&mut c, "job").is_none()), "released at the drop");
        assert_eq!(info_int(&mut c, "lease_released"), 3);
    }

    fn block_waits_and_hands_over(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let runtime = rt();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        // Another client holds it (this one would get Error::AlreadyHeld).
        let a = runtime.block_on(client(&s).acquire("job", ttl, Block::NoWait)).unwrap().unwrap();
        let start = Instant::now();
        assert!(runtime.block_on(lc.acquire("job", ttl, Block::For(MS(300)))).unwrap().is_none());
        assert!(start.elapsed() >= MS(300));
        let lc2 = lc.clone();
        let b = runtime.spawn(async move { lc2.acquire("job", ttl, Block::Forever).await });
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "job") == 1));
        let first = a.token();
        assert!(runtime.block_on(a.release()).unwrap());
        let b = runtime.block_on(b).unwrap().unwrap().expect("handed over");
        assert!(b.token() > first);
        assert!(runtime.block_on(b.release()).unwrap());
    }

    fn the_readme_example_runs(kind) {
        let s = Server::start(kind);
        rt().block_on(quickstart_async::run(&s.url(false))).unwrap();
        let mut c = s.conn();
        assert_eq!(ok_text(&mut c, &["HGET", "{acct:7}", "steps"]), "3");
        assert_eq!(token_of(&mut c, "{acct:7}:lock"), None);
    }
}

#[test]
fn the_readme_shows_the_async_example_that_runs() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let example = std::fs::read_to_string(format!("{dir}/examples/quickstart_async.rs")).unwrap();
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    let body: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        readme.contains(&body),
        "clients/rust/README.md does not show examples/quickstart_async.rs as it is"
    );
}
