//! The sync helpers against real servers (Redis 7.0, Valkey 8.1 and 9.1,
//! through the module's own harness): the watchdog, the loss signal under a
//! paused server, lost acquire replies, the fence after a loss, and release
//! on every way out.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread;
use std::time::{Duration, Instant};

use common::{Frozen, Server, info_int, info_value, ok, ok_text, token_of, wait_until, waiters};
use redis_lease_client::{Block, Error, LeaseClient, Loss, Mode, Options};
use support::{LossyProxy, blocked_acquirer, calls, competitor, try_acquire};

fn client(s: &Server) -> LeaseClient {
    LeaseClient::open(&s.url(false)).unwrap()
}

const MS: fn(u64) -> Duration = Duration::from_millis;

full_suite! {
    fn watchdog_keeps_the_lease_over_several_ttls(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ttl = MS(300);
        let lease = client(&s).acquire("job", ttl, Block::NoWait).unwrap().expect("free key");
        let token = lease.token() as i64;
        // Six ttls, checked every 50 ms: still ours, same token, nobody else
        // gets it.
        let start = Instant::now();
        for _ in 0..40 {
            if start.elapsed() >= ttl * 6 {
                break;
            }
            assert!(!lease.is_lost(), "lost after {:?}: {:?}", start.elapsed(), lease.loss());
            assert_eq!(token_of(&mut c, "job"), Some(token));
            assert_eq!(try_acquire(&mut c, "job", "other", "1000"), None);
            thread::sleep(MS(50));
        }
        assert!(start.elapsed() >= ttl * 6, "the loop ended early");
        assert!(info_int(&mut c, "lease_renewed") >= 10, "about three renewals per ttl");
        assert!(lease.release().unwrap());
        assert_eq!(token_of(&mut c, "job"), None);
    }

    fn loss_is_signalled_before_anyone_else_can_get_the_lease(kind) {
        let s = Server::start(kind);
        let ttl = MS(400);
        let lease = client(&s).acquire("job", ttl, Block::NoWait).unwrap().unwrap();
        let deadline = lease.signal().deadline();
        // Note when the signal fires, from a thread of its own.
        let signal = lease.signal();
        let noticed = thread::spawn(move || (signal.wait(Some(Duration::from_secs(10))), Instant::now()));
        // The competitor asks all along; its calls hang while the server is
        // stopped, and get the lease once it runs again past the deadline.
        let rival = competitor(&s, "job", Duration::from_secs(10));
        let frozen = Frozen::stop(&s);
        // The server stays stopped for the ttl and 300 ms more, whatever the
        // client does.
        let thaw = thread::spawn(move || {
            thread::sleep(ttl + MS(300));
            drop(frozen);
            Instant::now()
        });
        let (loss, lost_at) = noticed.join().unwrap();
        let thawed_at = thaw.join().unwrap();
        let rival_at = rival.join().unwrap().expect("the competitor gets the lease after SIGCONT");
        assert_eq!(loss, Some(Loss::Expired));
        assert!(lost_at < thawed_at, "signalled only after the server ran again");
        assert!(lost_at < rival_at, "the competitor got the lease before the loss was signalled");
        assert!(lost_at >= deadline, "signalled before the deadline");
        assert!(lost_at - deadline < MS(250), "signalled {:?} after the deadline", lost_at - deadline);
        // The competitor's token is current: fenced writes of the old holder
        // are refused, and nothing is written.
        let mut lease = lease;
        let r: Result<i64, _> = lease.fence(redis::cmd("SET").arg("data").arg("stale"));
        assert!(matches!(r, Err(Error::Stale)), "{r:?}");
        let mut c = s.conn();
        assert_eq!(ok(&mut c, &["EXISTS", "data"]), common::Value::Int(0));
        assert!(!lease.release().unwrap(), "released someone else's lease");
        assert!(token_of(&mut c, "job").is_some(), "the competitor still holds it");
    }

    fn refused_renewal_signals_the_loss_and_the_fence_refuses(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ttl = MS(600);
        let mut lease = client(&s).acquire("job", ttl, Block::NoWait).unwrap().unwrap();
        let _: i64 = lease.fence(redis::cmd("HSET").arg("data").arg("v").arg(1)).unwrap();
        // Someone deletes the lease and takes it: the next renewal answers 0.
        ok(&mut c, &["DEL", "job"]);
        assert!(try_acquire(&mut c, "job", "thief", "10000").is_some());
        let start = Instant::now();
        assert_eq!(lease.wait_lost(Some(Duration::from_secs(3))), Some(Loss::Refused));
        assert!(start.elapsed() < ttl, "noticed at the next renewal, before the deadline");
        let r: Result<i64, _> = lease.fence(redis::cmd("HSET").arg("data").arg("v").arg(2));
        assert!(matches!(r, Err(Error::Stale)), "{r:?}");
        assert_eq!(ok_text(&mut c, &["HGET", "data", "v"]), "1");
        assert!(!lease.renew().unwrap());
    }

    fn a_lost_acquire_reply_is_retried_with_the_same_owner(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let proxy = LossyProxy::start(s.port);
        let lc = LeaseClient::open(&proxy.url()).unwrap();
        proxy.arm();
        let lease = lc.acquire("job", Duration::from_secs(10), Block::NoWait).unwrap().unwrap();
        assert_eq!(proxy.dropped(), 1, "the first reply was lost");
        // The lost call took the lease; the retry re-acquired it (same
        // owner): one acquisition, one idempotent retry, the same token.
        assert_eq!(info_int(&mut c, "lease_acquired"), 1);
        assert_eq!(info_int(&mut c, "lease_reacquired"), 1);
        assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
        assert!(lease.release().unwrap(), "the retry's owner is the holder");
        assert_eq!(token_of(&mut c, "job"), None, "no orphan left");
    }

    fn a_lost_reply_of_a_blocking_acquire_is_retried_with_the_same_owner(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let proxy = LossyProxy::start(s.port);
        let lc = LeaseClient::open(&proxy.url()).unwrap();
        assert!(try_acquire(&mut c, "job", "holder", "10000").is_some());
        proxy.arm();
        let waiter = thread::spawn(move || {
            lc.acquire("job", Duration::from_secs(10), Block::For(Duration::from_secs(10)))
        });
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "job") == 1));
        // The hand-off's reply is lost on its way; the client retries with
        // the same owner and gets the token it was handed.
        ok(&mut c, &["LEASE.RELEASE", "job", "holder"]);
        let lease = waiter.join().unwrap().unwrap().expect("the waiter gets the lease");
        assert_eq!(proxy.dropped(), 1);
        assert_eq!(info_int(&mut c, "lease_acquired"), 2, "holder, then one hand-off");
        assert_eq!(info_int(&mut c, "lease_reacquired"), 1, "the retry");
        assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
    }

    fn client_kill_of_a_blocked_acquire_is_retried(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        assert!(try_acquire(&mut c, "job", "holder", "10000").is_some());
        let lc = client(&s);
        let waiter = thread::spawn(move || {
            lc.acquire("job", Duration::from_secs(10), Block::For(Duration::from_secs(10)))
        });
        let first = blocked_acquirer(&s);
        ok(&mut c, &["CLIENT", "KILL", "ID", &first.to_string()]);
        // The retry queues again on a new connection (the killed waiter left
        // the queue).
        let mut second = first;
        assert!(wait_until(Duration::from_secs(5), || {
            second = blocked_acquirer(&s);
            second != first
        }));
        assert_eq!(waiters(&mut c, "job"), 1);
        ok(&mut c, &["LEASE.RELEASE", "job", "holder"]);
        let lease = waiter.join().unwrap().unwrap().expect("the retry gets the lease");
        assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
        assert_eq!(info_int(&mut c, "lease_acquired"), 2, "the killed call never held it");
        assert!(lease.release().unwrap());
    }

    fn with_lease_releases_on_error_and_panic(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        // An error.
        let r: Result<Option<()>, Error> = lc.with_lease("job", ttl, Block::NoWait, |lease| {
            let _: i64 = lease.fence(redis::cmd("INCR").arg("n"))?;
            let _: i64 = lease.fence(redis::cmd("HSET").arg("n").arg("f").arg(1))?; // WRONGTYPE
            Ok(())
        });
        assert!(matches!(r, Err(Error::Redis(ref e)) if e.code() == Some("WRONGTYPE")), "{r:?}");
        assert_eq!(token_of(&mut c, "job"), None, "released after the error");
        // A panic.
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _: Result<Option<()>, Error> = lc.with_lease("job", ttl, Block::NoWait, |_| panic!("boom"));
        }));
        assert!(r.is_err());
        assert_eq!(token_of(&mut c, "job"), None, "released by the guard's drop");
        // The happy path returns the work's value; a held lease is None.
        assert_eq!(lc.with_lease("job", ttl, Block::NoWait, |l| Ok::<_, Error>(l.token())).unwrap().map(|_| ()), Some(()));
        assert!(try_acquire(&mut c, "job", "holder", "10000").is_some());
        assert_eq!(lc.with_lease("job", ttl, Block::For(MS(100)), |_| Ok::<_, Error>(())).unwrap(), None);
        assert_eq!(info_int(&mut c, "lease_released"), 3);
    }

    fn drop_releases_and_block_waits(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let ttl = Duration::from_secs(10);
        // Another client holds it (this one would get Error::AlreadyHeld).
        let a = client(&s).acquire("job", ttl, Block::NoWait).unwrap().unwrap();
        assert!(lc.acquire("job", ttl, Block::NoWait).unwrap().is_none());
        let start = Instant::now();
        assert!(lc.acquire("job", ttl, Block::For(MS(300))).unwrap().is_none());
        assert!(start.elapsed() >= MS(300), "waited the BLOCK time");
        let lc2 = lc.clone();
        let b = thread::spawn(move || lc2.acquire("job", ttl, Block::Forever).unwrap());
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "job") == 1));
        let first = a.token();
        drop(a);
        let b = b.join().unwrap().expect("handed over at the drop");
        assert!(b.token() > first);
        drop(b);
        assert_eq!(token_of(&mut c, "job"), None);
    }

    fn a_long_wait_starts_with_a_fresh_deadline(kind) {
        // The deadline counts from when the acquire was sent; after a wait
        // longer than a third of the ttl, the helper renews at once.
        let s = Server::start(kind);
        let mut c = s.conn();
        assert!(try_acquire(&mut c, "job", "holder", "400").is_some());
        let ttl = MS(300);
        let sent = Instant::now();
        let lease = client(&s).acquire("job", ttl, Block::For(Duration::from_secs(5))).unwrap().unwrap();
        assert!(sent.elapsed() >= MS(350), "waited for the holder's expiry");
        assert!(!lease.is_lost());
        assert!(lease.signal().deadline() > sent + ttl, "renewed after the wait");
        thread::sleep(ttl * 2);
        assert!(!lease.is_lost(), "{:?}", lease.loss());
        assert_eq!(token_of(&mut c, "job"), Some(lease.token() as i64));
    }

    fn without_the_watchdog_the_deadline_still_signals(kind) {
        let s = Server::start(kind);
        let opts = Options { watchdog: false, ..Options::default() };
        let mut lease = client(&s).with_options(opts)
            .acquire("job", MS(300), Block::NoWait).unwrap().unwrap();
        assert!(lease.renew().unwrap());
        assert_eq!(lease.wait_lost(Some(Duration::from_secs(3))), Some(Loss::Expired));
        // Lost, a renewal cannot succeed: it is not sent (it would only keep
        // the key from others), so it cannot time out either.
        let mut c = s.conn();
        let sent = calls(&mut c, "lease.renew");
        assert!(!lease.renew().unwrap(), "expired");
        assert_eq!(calls(&mut c, "lease.renew"), sent, "nothing sent");
    }

    fn a_renewal_with_no_reply_before_the_deadline_answers_false(kind) {
        let s = Server::start(kind);
        let opts = Options { watchdog: false, ..Options::default() };
        let mut lease = client(&s).with_options(opts)
            .acquire("job", MS(500), Block::NoWait).unwrap().unwrap();
        let frozen = Frozen::stop(&s);
        let renewed = lease.renew();
        drop(frozen);
        assert!(matches!(renewed, Ok(false)), "{renewed:?}");
        assert_eq!(lease.loss(), Some(Loss::Expired));
    }

    fn a_fence_after_the_server_dropped_the_connection_is_sent_on_a_new_one(kind) {
        // The server closes every client connection (as a restart does):
        // the watchdog reconnects and keeps the lease; the lease's own idle
        // connection is closed too, and the next fence must not fail on it
        // (it never reached the server, so a new connection is safe).
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut lease = client(&s).acquire("job", MS(600), Block::NoWait).unwrap().unwrap();
        let _: () = lease.fence(redis::cmd("SET").arg("data").arg("before")).unwrap();
        let before = info_int(&mut c, "lease_renewed");
        ok(&mut c, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        assert!(
            wait_until(Duration::from_secs(3), || info_int(&mut c, "lease_renewed") > before),
            "the watchdog renews again"
        );
        let _: () = lease.fence(redis::cmd("SET").arg("data").arg("after")).unwrap();
        assert!(!lease.is_lost());
        assert_eq!(ok_text(&mut c, &["GET", "data"]), "after");
        // And after the connection sat idle while the server closed it.
        thread::sleep(MS(100));
        ok(&mut c, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        thread::sleep(MS(300));
        let _: () = lease.fence(redis::cmd("SET").arg("data").arg("idle")).unwrap();
        assert_eq!(ok_text(&mut c, &["GET", "data"]), "idle");
        assert!(lease.release().unwrap());
    }

    fn a_grace_refusal_says_so_and_how_long_remains(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "3000"]);
        ok(&mut c, &["REPLICAOF", "127.0.0.1", "1"]);
        ok(&mut c, &["REPLICAOF", "NO", "ONE"]);
        match lc.acquire("job", MS(1000), Block::NoWait) {
            Err(Error::Grace { remaining, reason }) => {
                assert!(remaining > Duration::ZERO && remaining <= MS(3000), "{remaining:?}");
                assert_eq!(reason, "promoted");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
        // Contention is still Ok(None).
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "0"]);
        assert!(try_acquire(&mut c, "held", "other", "10000").is_some());
        assert!(lc.acquire("held", MS(1000), Block::NoWait).unwrap().is_none());
    }

    fn a_loss_during_the_work_is_reported_at_its_end(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        let got = lc.with_lease("job", MS(600), Block::NoWait, |lease| {
            ok(&mut c, &["DEL", "job"]); // taken away: the next renewal is refused
            lease.wait_lost(Some(Duration::from_secs(3)));
            Ok::<_, Error>("done")
        });
        assert!(matches!(got, Err(Error::Lost(Loss::Refused))), "{got:?}");
        // The work's own error wins; a lease kept to the end is Ok(Some).
        let got: Result<Option<()>, Error> = lc.with_lease("job", MS(600), Block::NoWait, |lease| {
            ok(&mut c, &["DEL", "job"]);
            lease.wait_lost(Some(Duration::from_secs(3)));
            Err(Error::Stale)
        });
        assert!(matches!(got, Err(Error::Stale)));
        assert_eq!(lc.with_lease("job", MS(600), Block::NoWait, |_| Ok::<_, Error>(1)).unwrap(), Some(1));
    }

    fn a_second_acquire_of_a_key_this_client_holds_fails_at_once(kind) {
        let s = Server::start(kind);
        let lc = client(&s);
        let lease = lc.acquire("job", MS(5000), Block::NoWait).unwrap().unwrap();
        let began = Instant::now();
        let again = lc.clone().acquire("job", MS(5000), Block::Forever); // would wait on itself
        assert!(matches!(again, Err(Error::AlreadyHeld(ref k)) if k == "job"), "{again:?}");
        assert!(began.elapsed() < MS(100));
        assert!(client(&s).acquire("job", MS(5000), Block::NoWait).unwrap().is_none(), "another client: contention");
        assert!(lease.release().unwrap());
        let again = lc.acquire("job", MS(5000), Block::NoWait).unwrap().expect("free again after the release");
        assert!(again.release().unwrap());
    }

    fn shared_and_limit_modes(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let reader = || client(&s).with_mode(Mode::Shared);
        let mut held: Vec<_> = (0..3)
            .map(|_| reader().acquire("doc", MS(600), Block::NoWait).unwrap().expect("readers share it"))
            .collect();
        assert!(client(&s).acquire("doc", MS(600), Block::NoWait).unwrap().is_none(), "no writer meanwhile");
        ok(&mut c, &["SET", "docdata", "v"]);
        let v: String = held[0].fence(redis::cmd("GET").arg("docdata")).unwrap();
        assert_eq!(v, "v");
        let w: Result<(), Error> = held[0].fence(redis::cmd("SET").arg("docdata").arg("x"));
        assert!(matches!(w, Err(Error::SharedWrite)), "{w:?}");
        assert_eq!(ok_text(&mut c, &["GET", "docdata"]), "v");
        thread::sleep(MS(1500));
        assert!(held.iter().all(|h| !h.is_lost()), "the watchdog renews every reader");
        for h in held.drain(..) {
            assert!(h.release().unwrap());
        }
        // LIMIT 2: two permits, a third waits for one to come back.
        let permit = || client(&s).with_mode(Mode::Limit(2));
        let p1 = permit().acquire("pool", MS(600), Block::NoWait).unwrap().unwrap();
        let p2 = permit().acquire("pool", MS(600), Block::NoWait).unwrap().unwrap();
        assert_ne!(p1.token(), p2.token());
        assert!(permit().acquire("pool", MS(600), Block::NoWait).unwrap().is_none());
        let third = permit();
        let waiter = thread::spawn(move || third.acquire("pool", MS(600), Block::For(MS(5000))).unwrap());
        thread::sleep(MS(300));
        assert!(p1.release().unwrap());
        let p3 = waiter.join().unwrap().expect("p1's place, handed over");
        assert!(p3.token() > p2.token());
    }

    fn a_ttl_under_a_millisecond_is_an_error(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        for ttl in [Duration::ZERO, Duration::from_micros(999)] {
            let got = client(&s).acquire("job", ttl, Block::NoWait);
            assert!(matches!(got, Err(Error::InvalidTtl(t)) if t == ttl), "{ttl:?}: {got:?}");
        }
        let ran = client(&s).with_lease("job", Duration::ZERO, Block::NoWait, |_| Ok::<_, Error>(()));
        assert!(matches!(ran, Err(Error::InvalidTtl(_))));
        assert_eq!(token_of(&mut c, "job"), None, "nothing was sent");
        assert_eq!(info_int(&mut c, "lease_acquired"), 0);
    }

    fn leaving_the_block_after_a_loss_is_quick(kind) {
        // The server freezes while the lease is held (default options: 2 s
        // connect, 5 s io, 3 retries). Once the deadline passed, leaving
        // the block makes one short release attempt, not (retries + 1) x
        // (connect + io) of them.
        let s = Server::start(kind);
        let mut frozen = None;
        let mut left_at = Instant::now();
        let done = client(&s)
            .with_lease("job", MS(400), Block::NoWait, |lease| {
                frozen = Some(Frozen::stop(&s));
                let loss = lease.wait_lost(Some(Duration::from_secs(5)));
                left_at = Instant::now();
                Ok::<_, Error>(loss)
            });
        let took = left_at.elapsed();
        drop(frozen);
        // The loss is reported at the end (the work itself went well).
        assert!(matches!(done, Err(Error::Lost(Loss::Expired))), "{done:?}");
        assert!(took < MS(1000), "leaving the block took {took:?}");
        // A refused renewal: the release sends nothing.
        let mut c = s.conn();
        let mut lease = client(&s).acquire("job2", MS(5000), Block::NoWait).unwrap().unwrap();
        ok(&mut c, &["DEL", "job2"]);
        assert!(!lease.renew().unwrap());
        let released = info_int(&mut c, "lease_release_failed");
        let began = Instant::now();
        assert!(!lease.release().unwrap());
        assert!(began.elapsed() < MS(100));
        assert_eq!(info_int(&mut c, "lease_release_failed"), released, "no LEASE.RELEASE sent");
    }

    fn many_leases_share_two_connections_and_batched_renewals(kind) {
        // 300 leases of one client: every call shares the client's pool,
        // one watchdog renews them all in pipelines, and a loss still shows
        // within a third of the ttl.
        let s = Server::start(kind);
        let mut c = s.conn();
        let clients = |c: &mut redis::Connection| -> i64 {
            info_value(c, "clients", "connected_clients").unwrap().parse().unwrap()
        };
        let base = clients(&mut c);
        let client = client(&s);
        let ttl = MS(900);
        let leases: Vec<_> = (0..300)
            .map(|i| client.acquire(&format!("job:{i}"), ttl, Block::NoWait).unwrap().unwrap())
            .collect();
        thread::sleep(ttl * 3);
        assert!(leases.iter().all(|l| !l.is_lost()), "every lease is still held");
        for (i, l) in leases.iter().enumerate().step_by(37) {
            assert_eq!(token_of(&mut c, &format!("job:{i}")), Some(l.token() as i64));
        }
        let stats = client.watchdog_stats();
        assert_eq!(stats.leases, 300);
        assert!(stats.renewals >= 300 * 6, "{stats:?}");
        assert!(stats.round_trips * 50 <= stats.renewals, "batched: {stats:?}");
        assert_eq!(clients(&mut c) - base, 2, "one pooled connection and the watchdog's");
        ok(&mut c, &["DEL", "job:7"]);
        let took = Instant::now();
        assert_eq!(leases[7].wait_lost(Some(ttl)), Some(Loss::Refused));
        assert!(took.elapsed() <= ttl / 3 + MS(150), "noticed after {:?}", took.elapsed());
        assert_eq!(leases.iter().filter(|l| l.is_lost()).count(), 1);
        drop(leases);
        assert_eq!(info_int(&mut c, "lease_released"), 299);
        assert!(wait_until(Duration::from_secs(2), || client.watchdog_stats().leases == 0));
    }

    fn fence_min_ttl_refuses_with_expiring_and_runs_nothing_while_the_lease_stays_held(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ttl = MS(2000);
        let mut lease = client(&s).acquire("job", ttl, Block::NoWait).unwrap().unwrap();
        let r: Result<i64, _> = lease.fence_min_ttl(MS(60_000), redis::cmd("HSET").arg("data").arg("v").arg(1));
        match r {
            Err(Error::Expiring { left, min_ttl }) => {
                assert!(left <= ttl, "{left:?}");
                assert_eq!(min_ttl, MS(60_000));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(ok(&mut c, &["EXISTS", "data"]), common::Value::Int(0), "nothing ran");
        // A check only (an empty command), and a MINTTL the lease has.
        let e: Result<(), _> = lease.fence_min_ttl(MS(60_000), &redis::Cmd::new());
        assert!(matches!(e, Err(Error::Expiring { .. })), "{e:?}");
        let n: i64 = lease.fence_min_ttl(MS(100), redis::cmd("HSET").arg("data").arg("v").arg(1)).unwrap();
        assert_eq!(n, 1);
        assert!(!lease.is_lost(), "a refusal does not lose the lease");
        // The raw form, sent on a connection of one's own.
        let raw = lease.fence_cmd_min_ttl(MS(60_000), redis::cmd("HSET").arg("data").arg("v").arg(2));
        let e = raw.query::<i64>(&mut c).unwrap_err();
        assert!(matches!(Error::from(e), Error::Expiring { .. }));
        assert_eq!(ok_text(&mut c, &["HGET", "data", "v"]), "1");
        // A multi-key lease, on each of its keys.
        let mut many = client(&s).acquire_many(&["{m}a", "{m}b"], ttl, Block::NoWait).unwrap().unwrap();
        let r: Result<(), _> = many.fence_min_ttl("{m}b", MS(60_000), redis::cmd("SET").arg("{m}x").arg(1));
        assert!(matches!(r, Err(Error::Expiring { .. })), "{r:?}");
        let _: () = many.fence_min_ttl("{m}a", MS(100), redis::cmd("SET").arg("{m}x").arg(2)).unwrap();
        assert_eq!(ok_text(&mut c, &["GET", "{m}x"]), "2");
        assert!(lease.release().unwrap() && many.release().unwrap());
    }

    fn the_readme_example_runs(kind) {
        let s = Server::start(kind);
        quickstart::run(&s.url(false)).unwrap();
        let mut c = s.conn();
        assert_eq!(ok_text(&mut c, &["HGET", "{acct:7}", "balance"]), "90");
        assert_eq!(ok_text(&mut c, &["HGET", "{acct:7}", "steps"]), "3");
        assert_eq!(token_of(&mut c, "{acct:7}:lock"), None);
    }
}

#[test]
fn the_readme_shows_the_example_that_runs() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let example = std::fs::read_to_string(format!("{dir}/examples/quickstart.rs")).unwrap();
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    let body: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        readme.contains(&body),
        "clients/rust/README.md does not show examples/quickstart.rs as it is"
    );
}
