//! Quorum leases (design.md S9) against five real masters on one machine,
//! no replication between them, no persistence, each with its grace on.
//!
//! The history test: several workers take one lease over and over while
//! faults are injected (a master whose clock runs ahead inside the `FLOOR`
//! bound, a master killed with SIGKILL and restarted empty, a master
//! stopped for a second, a worker that pauses past its validity).
//! A checker that uses only the workers' own records then asks: do the
//! tokens of successive holdings strictly increase, do no two validity
//! windows overlap, and did the resource, which accepts only tokens at
//! least as high as the highest it saw, ever accept one out of order?
//! Three controls show that the checker can fail: without the commit step
//! (one master's clock ahead makes tokens go backwards), holding in one
//! round trip on a majority of different tokens instead of exactly the
//! proposal (a client whose clock runs behind makes tokens go backwards),
//! and without the grace on restart (two holders at once).
//!
//! The round trips: with agreeing clocks an acquire sends one
//! `LEASE.ACQUIRE` to every master and a release one `LEASE.RELEASE`
//! (counted with `INFO commandstats`); a client whose clock runs behind
//! pays step 3 once, then proposes above the masters' clocks.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{ClockShift, Link, Opts, Server, Value, info_int, wait_until};
use redis_lease_client::{Block, Error, Label, Options, Outlier, QuorumClient, default_label};
use support::Silent;

const MS: fn(u64) -> Duration = Duration::from_millis;
const N: usize = 5;

/// Five masters, each behind a relay that keeps its address across
/// restarts; `grace` ms of grace (0: none); master 0's clock shifted by
/// `shift` when given.
struct Masters {
    kind: common::Kind,
    opts: Vec<Opts>,
    servers: Vec<Mutex<Option<Server>>>,
    relays: Vec<Link>,
}

impl Masters {
    fn start(kind: common::Kind, grace: &str, shift: Option<&ClockShift>) -> Masters {
        let opts: Vec<Opts> = (0..N)
            .map(|i| {
                let o = Opts::default().module_args(&["grace-ms", grace]);
                match (i, shift) {
                    (0, Some(s)) => o.clock(s),
                    _ => o,
                }
            })
            .collect();
        let servers: Vec<Server> = opts
            .iter()
            .map(|o| Server::start_with(kind, o.clone()))
            .collect();
        let relays = servers.iter().map(|s| Link::to(s.port)).collect();
        let m = Masters {
            kind,
            opts,
            servers: servers.into_iter().map(|s| Mutex::new(Some(s))).collect(),
            relays,
        };
        for i in 0..N {
            m.wait_grace_over(i);
        }
        m
    }

    fn conn(&self, i: usize) -> redis::Connection {
        self.servers[i].lock().unwrap().as_ref().unwrap().conn()
    }

    fn wait_grace_over(&self, i: usize) {
        let mut c = self.conn(i);
        assert!(
            wait_until(Duration::from_secs(10), || info_int(
                &mut c,
                "lease_grace_remaining_ms"
            ) == 0),
            "master {i}: the grace never ended"
        );
    }

    fn client(&self) -> QuorumClient {
        let urls: Vec<String> = self
            .relays
            .iter()
            .map(|r| format!("redis://127.0.0.1:{}/", r.port))
            .collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let opts = Options {
            io_timeout: MS(100),
            watchdog: false,
            ..Options::default()
        };
        QuorumClient::open(&urls).unwrap().with_options(opts)
    }

    /// SIGKILL, then a start on an empty data directory at the same address.
    fn kill_and_restart(&self, i: usize) {
        let mut slot = self.servers[i].lock().unwrap();
        let old = slot.take().unwrap();
        drop(old);
        let s = Server::start_with(self.kind, self.opts[i].clone());
        self.relays[i].retarget(s.port);
        *slot = Some(s);
    }

    /// SIGSTOP for `d`, then SIGCONT.
    fn stop_for(&self, i: usize, d: Duration) {
        let slot = self.servers[i].lock().unwrap();
        let frozen = common::Frozen::stop(slot.as_ref().unwrap());
        thread::sleep(d);
        drop(frozen);
    }
}

/// One holding, as its worker recorded it.
#[derive(Debug, Clone, Copy)]
struct Holding {
    worker: usize,
    token: u64,
    /// When step 3 succeeded, and the end of the validity the worker
    /// counted on (its deadline, or its release if earlier).
    from: Instant,
    until: Instant,
}

/// The resource: accepts a write only with a token at least as high as the
/// highest it accepted.
#[derive(Default)]
struct Resource {
    highest: u64,
    accepted: Vec<u64>,
    rejected: usize,
}

impl Resource {
    fn write(&mut self, token: u64) -> bool {
        if token < self.highest {
            self.rejected += 1;
            return false;
        }
        self.highest = token;
        self.accepted.push(token);
        true
    }
}

/// What the checker found in the records: every violation, by kind.
#[derive(Debug, Default)]
struct Verdict {
    tokens_not_increasing: Vec<(Holding, Holding)>,
    overlapping: Vec<(Holding, Holding)>,
    out_of_order_writes: usize,
}

impl Verdict {
    fn clean(&self) -> bool {
        self.tokens_not_increasing.is_empty()
            && self.overlapping.is_empty()
            && self.out_of_order_writes == 0
    }
}

fn check(holdings: &[Holding], resource: &Resource) -> Verdict {
    let mut h = holdings.to_vec();
    h.sort_by_key(|x| x.from);
    let mut v = Verdict::default();
    for w in h.windows(2) {
        if w[1].token <= w[0].token {
            v.tokens_not_increasing.push((w[0], w[1]));
        }
    }
    for (i, a) in h.iter().enumerate() {
        for b in &h[i + 1..] {
            if b.from < a.until && a.worker != b.worker {
                v.overlapping.push((*a, *b));
            }
        }
    }
    v.out_of_order_writes = resource.accepted.windows(2).filter(|w| w[1] < w[0]).count();
    v
}

/// One worker's loop until `stop`: acquire, a few writes within the
/// validity, release; when `pause_every` is `Some(n)`, every n-th holding
/// pauses past its validity and then writes (the stale write).
fn worker(
    id: usize,
    client: QuorumClient,
    ttl: Duration,
    stop: Arc<AtomicBool>,
    resource: Arc<Mutex<Resource>>,
    pause_every: Option<usize>,
) -> Vec<Holding> {
    let mut out = Vec::new();
    let started = Instant::now();
    for round in 0..10_000 {
        if stop.load(Ordering::SeqCst) || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        let Ok(Some(lease)) = client.acquire("job", ttl, Block::For(MS(500))) else {
            continue;
        };
        let from = Instant::now();
        let deadline = lease.signal().deadline();
        let pause = pause_every.is_some_and(|n| round % n == n - 1);
        if pause {
            thread::sleep(deadline.saturating_duration_since(Instant::now()) + ttl);
            resource.lock().unwrap().write(lease.token());
            out.push(Holding {
                worker: id,
                token: lease.token(),
                from,
                until: deadline,
            });
            drop(lease);
            continue;
        }
        let token = lease.token();
        for _ in 0..3 {
            if lease.is_lost() {
                break;
            }
            resource.lock().unwrap().write(token);
            thread::sleep(MS(5));
        }
        let until = Instant::now().min(deadline);
        let _ = lease.release();
        out.push(Holding {
            worker: id,
            token,
            from,
            until,
        });
    }
    out
}

/// The records of two holdings taken one after the other by two workers.
fn two_holdings(first: (u64, Instant, Instant), second: (u64, Instant, Instant)) -> Vec<Holding> {
    vec![
        Holding {
            worker: 0,
            token: first.0,
            from: first.1,
            until: first.2,
        },
        Holding {
            worker: 1,
            token: second.0,
            from: second.1,
            until: second.2,
        },
    ]
}

/// Control of the commit step: master 0's clock runs an hour ahead, so its
/// tokens are the highest. A holding on all five, released; then one
/// without master 0 (stopped). With the commit step the second token is
/// higher; without it, it is lower: the checker must say so.
fn commit_control(kind: common::Kind, commit: bool) -> Verdict {
    let shift = ClockShift::new(3_600_000);
    let masters = Masters::start(kind, "0", Some(&shift));
    let client = match commit {
        true => masters.client(),
        false => masters.client().without_the_commit_step(),
    };
    let ttl = MS(2000);
    let first = client
        .acquire("job", ttl, Block::For(MS(1000)))
        .unwrap()
        .expect("a majority");
    let a = (first.token(), Instant::now(), first.signal().deadline());
    assert!(first.release().unwrap());
    let a = (a.0, a.1, Instant::now());
    let frozen = common::Frozen::stop(masters.servers[0].lock().unwrap().as_ref().unwrap());
    let second = client
        .acquire("job", ttl, Block::For(MS(1000)))
        .unwrap()
        .expect("four masters");
    let b = (second.token(), Instant::now(), second.signal().deadline());
    drop(frozen);
    let mut resource = Resource::default();
    resource.write(a.0);
    let accepted = resource.write(b.0);
    assert_eq!(
        accepted, commit,
        "the resource refuses the second holder exactly when its token went backwards"
    );
    check(&two_holdings(a, b), &resource)
}

/// Control of the exact majority of the one round trip: a holding by a
/// client with a right clock, released; then one by a client whose clock
/// runs 1 s behind, whose proposal is therefore below the first token.
/// Holding with it when a majority granted any token of at least it (a
/// majority of different tokens) makes the second token lower: the checker
/// must say so. Holding only on an exact majority, the second client goes
/// on to step 3 and its token is higher.
fn exact_control(kind: common::Kind, exact: bool) -> Verdict {
    let masters = Masters::start(kind, "0", None);
    let ttl = MS(2000);
    let first = masters
        .client()
        .acquire("job", ttl, Block::For(MS(1000)))
        .unwrap()
        .expect("free");
    let a = (first.token(), Instant::now(), first.signal().deadline());
    assert!(first.release().unwrap());
    let a = (a.0, a.1, Instant::now());
    let behind = masters.client().with_clock_offset_ms(-1000);
    let behind = match exact {
        true => behind,
        false => behind.accepting_different_tokens(),
    };
    let second = behind
        .acquire("job", ttl, Block::For(MS(1000)))
        .unwrap()
        .expect("free again");
    let b = (second.token(), Instant::now(), second.signal().deadline());
    let mut resource = Resource::default();
    resource.write(a.0);
    assert_eq!(
        resource.write(b.0),
        exact,
        "the resource refuses the second holder exactly when its token went backwards"
    );
    check(&two_holdings(a, b), &resource)
}

/// Control of the grace: a holding on all five; three masters are killed
/// and restarted empty; a second client then tries. With the grace the
/// restarted masters refuse it until every lease they may have forgotten
/// has ended; without it (grace-ms 0) it gets a majority while the first
/// still holds: two holders.
fn grace_control(kind: common::Kind, grace: &str) -> (Verdict, bool) {
    let masters = Masters::start(kind, grace, None);
    let (one, two) = (masters.client(), masters.client());
    let ttl = MS(1000);
    let first = one
        .acquire("job", ttl, Block::NoWait)
        .unwrap()
        .expect("free");
    let a = (first.token(), Instant::now(), first.signal().deadline());
    for i in 0..3 {
        masters.kill_and_restart(i);
    }
    let second = two.acquire("job", ttl, Block::NoWait).unwrap();
    let holdings = match &second {
        Some(l) if Instant::now() < a.2 => {
            two_holdings(a, (l.token(), Instant::now(), l.signal().deadline()))
        }
        _ => two_holdings(a, (u64::MAX, a.2, a.2)),
    };
    let verdict = check(&holdings, &Resource::default());
    (verdict, second.is_some())
}

every_server! {
    fn quorum_history_with_faults_keeps_tokens_increasing_and_holdings_apart(kind) {
        // Master 0's clock runs 300 ms ahead, inside the FLOOR bound (the
        // grace, 1.5 s): its tokens are never the proposal, so holdings
        // take one round trip or, while a restarted master's clock starts
        // ahead too or one is stopped, two.
        let shift = ClockShift::new(300);
        let masters = Arc::new(Masters::start(kind, "1500", Some(&shift)));
        let ttl = MS(400);
        let stop = Arc::new(AtomicBool::new(false));
        let resource = Arc::new(Mutex::new(Resource::default()));
        let workers: Vec<_> = (0..4)
            .map(|id| {
                let (client, stop, resource) = (masters.client(), stop.clone(), resource.clone());
                let pause = (id == 3).then_some(4);
                thread::spawn(move || worker(id, client, ttl, stop, resource, pause))
            })
            .collect();
        // The faults, one after the other.
        thread::sleep(MS(1000));
        masters.kill_and_restart(1);
        thread::sleep(MS(1500));
        masters.stop_for(2, MS(1000));
        thread::sleep(MS(500));
        masters.kill_and_restart(3);
        thread::sleep(MS(2500));
        stop.store(true, Ordering::SeqCst);
        let holdings: Vec<Holding> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        let resource = resource.lock().unwrap();
        let verdict = check(&holdings, &resource);
        eprintln!(
            "quorum history ({kind:?}): 4 workers, {} holdings, {} writes accepted, {} stale writes rejected, faults: master 0's clock 300 ms ahead, 2 kill -9 + restart, 1 stop of 1 s, a worker pausing past its validity every 4th holding",
            holdings.len(), resource.accepted.len(), resource.rejected
        );
        assert!(holdings.len() >= 20, "too few holdings to judge: {}", holdings.len());
        assert!(verdict.clean(), "{verdict:?}");
    }

    fn without_the_commit_step_tokens_go_backwards(kind) {
        let control = commit_control(kind, false);
        eprintln!("commit control ({kind:?}): {control:?}");
        assert_eq!(control.tokens_not_increasing.len(), 1, "the checker sees the token go backwards");
        let real = commit_control(kind, true);
        assert!(real.clean(), "{real:?}");
    }

    fn holding_on_a_majority_of_different_tokens_in_one_round_trip_makes_tokens_go_backwards(kind) {
        let control = exact_control(kind, false);
        eprintln!("exact-majority control ({kind:?}): {control:?}");
        assert_eq!(control.tokens_not_increasing.len(), 1, "the checker sees the token go backwards");
        let real = exact_control(kind, true);
        assert!(real.clean(), "{real:?}");
    }

    fn without_the_grace_a_restarted_majority_makes_two_holders(kind) {
        let (control, granted) = grace_control(kind, "0");
        eprintln!("grace control ({kind:?}): {control:?}");
        assert!(granted && control.overlapping.len() == 1, "the checker sees two holders: {control:?}");
        let (real, granted) = grace_control(kind, "1500");
        assert!(!granted && real.clean(), "{real:?}");
    }

    fn the_watchdog_renews_on_a_majority_and_the_fence_writes_there(kind) {
        let masters = Masters::start(kind, "0", None);
        let client = masters.client().with_options(Options { io_timeout: MS(100), ..Options::default() });
        let ttl = MS(300);
        let lease = client.acquire("job", ttl, Block::NoWait).unwrap().expect("free");
        committed_within(lease.committed(), &[0, 1, 2, 3, 4]);
        let token = lease.token();
        thread::sleep(ttl * 4);
        assert!(!lease.is_lost(), "renewed on a majority: {:?}", lease.loss());
        for i in 0..N {
            assert_eq!(common::token_of(&mut masters.conn(i), "job"), Some(token as i64), "master {i}");
        }
        // The fence runs the command on every master that committed the token.
        let _: () = lease.fence(redis::cmd("SET").arg("data").arg("v1")).unwrap();
        for &i in lease.committed() {
            assert_eq!(common::ok_text(&mut masters.conn(i), &["GET", "data"]), "v1");
        }
        // Two masters lose it: still a majority. A third: the loss.
        for i in 0..2 {
            common::ok(&mut masters.conn(i), &["DEL", "job"]);
        }
        thread::sleep(ttl);
        assert!(!lease.is_lost());
        common::ok(&mut masters.conn(2), &["DEL", "job"]);
        assert_eq!(lease.signal().wait(Some(ttl * 2)), Some(redis_lease_client::Loss::Refused));
        assert!(matches!(
            lease.fence::<()>(redis::cmd("SET").arg("data").arg("v2")),
            Err(redis_lease_client::Error::Stale)
        ));
        assert!(!lease.release().unwrap(), "not held on a majority any more");
        // A frozen majority: the loss at the end of the validity.
        let lease = client.acquire("job2", ttl, Block::NoWait).unwrap().expect("free");
        let frozen: Vec<_> = (0..3)
            .map(|i| common::Frozen::stop(masters.servers[i].lock().unwrap().as_ref().unwrap()))
            .collect();
        let deadline = lease.signal().deadline();
        assert_eq!(lease.signal().wait(Some(ttl * 3)), Some(redis_lease_client::Loss::Expired));
        assert!(Instant::now() >= deadline && Instant::now() < deadline + MS(50));
        drop(frozen);
    }

    fn a_quorum_fence_min_ttl_longer_than_the_lease_runs_nowhere_and_is_expiring(kind) {
        let masters = Masters::start(kind, "0", None);
        let client = masters.client().with_options(Options { io_timeout: MS(500), ..Options::default() });
        let ttl = MS(2000);
        let lease = client.acquire("job", ttl, Block::NoWait).unwrap().expect("free");
        match lease.fence_min_ttl::<()>(MS(60_000), redis::cmd("SET").arg("data").arg("v1")) {
            Err(Error::Expiring { left, min_ttl }) => assert!(left <= ttl && min_ttl == MS(60_000), "{left:?}"),
            other => panic!("{other:?}"),
        }
        for i in 0..N {
            assert_eq!(common::ok(&mut masters.conn(i), &["EXISTS", "data"]), common::Value::Int(0), "master {i}");
        }
        let _: () = lease.fence_min_ttl(MS(100), redis::cmd("SET").arg("data").arg("v2")).unwrap();
        for &i in lease.committed() {
            assert_eq!(common::ok_text(&mut masters.conn(i), &["GET", "data"]), "v2", "master {i}");
        }
        assert!(lease.release().unwrap());
    }

    fn a_stopped_master_does_not_slow_the_renewals(kind) {
        let masters = Masters::start(kind, "0", None);
        let client = masters.client().with_options(Options { io_timeout: MS(100), ..Options::default() });
        let frozen = common::Frozen::stop(masters.servers[4].lock().unwrap().as_ref().unwrap());
        let ttl = MS(300);
        let lease = client.acquire("job", ttl, Block::For(MS(1000))).unwrap().expect("four masters");
        committed_within(lease.committed(), &[0, 1, 2, 3]);
        thread::sleep(ttl * 4);
        assert!(!lease.is_lost(), "renewed by the first majority to answer: {:?}", lease.loss());
        drop(frozen);
    }
}

#[cfg(feature = "tokio")]
full_suite! {
    fn the_async_quorum_client_takes_renews_fences_and_loses_like_the_sync_one(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let masters = Masters::start(kind, "0", None);
        let urls: Vec<String> = masters.relays.iter().map(|r| format!("redis://127.0.0.1:{}/", r.port)).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = AsyncQuorumClient::open(&urls).unwrap().with_options(Options { io_timeout: MS(100), ..Options::default() });
        let frozen = common::Frozen::stop(masters.servers[4].lock().unwrap().as_ref().unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let ttl = MS(300);
        rt.block_on(async {
            let lease = client.acquire("job", ttl, Block::For(MS(1000))).await.unwrap().expect("four masters");
            committed_within(lease.committed(), &[0, 1, 2, 3]);
            tokio::time::sleep(ttl * 4).await;
            assert!(!lease.is_lost(), "{:?}", lease.loss());
            let _: () = lease.fence(redis::cmd("SET").arg("data").arg("async")).await.unwrap();
            for &i in lease.committed() {
                assert_eq!(common::token_of(&mut masters.conn(i), "job"), Some(lease.token() as i64));
                assert_eq!(common::ok_text(&mut masters.conn(i), &["GET", "data"]), "async");
            }
            assert!(client.acquire("job", ttl, Block::NoWait).await.unwrap().is_none(), "held: no second holder");
            for i in 0..3 {
                common::ok(&mut masters.conn(i), &["DEL", "job"]);
            }
            let lost = tokio::time::timeout(ttl * 2, lease.signal().lost()).await;
            assert_eq!(lost.ok(), Some(redis_lease_client::Loss::Refused));
            assert!(!lease.release().await.unwrap());
            let again = client.acquire("job", ttl, Block::For(MS(1000))).await.unwrap().expect("free again");
            assert!(again.release().await.unwrap());
        });
        drop(frozen);
    }
}

#[cfg(feature = "tokio")]
full_suite! {
    fn the_async_quorum_client_logs_in_selects_the_database_and_speaks_resp3(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let servers: Vec<Server> = (0..3).map(|_| Server::start(kind)).collect();
        for s in &servers {
            common::ok(&mut s.conn(), &["ACL", "SETUSER", "quser", "on", ">qpass", "~*", "&*", "+@all"]);
        }
        // An ACL user and database 3 everywhere; RESP3 on the last master.
        let urls: Vec<String> = servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let resp3 = if i == 2 { "?protocol=resp3" } else { "" };
                format!("redis://quser:qpass@127.0.0.1:{}/3{resp3}", s.port)
            })
            .collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let opts = Options { io_timeout: MS(500), watchdog: false, ..Options::default() };
        let client = AsyncQuorumClient::open(&urls).unwrap().with_options(opts.clone());
        let wrong: Vec<String> = servers.iter().map(|s| format!("redis://quser:nope@127.0.0.1:{}/3", s.port)).collect();
        let wrong: Vec<&str> = wrong.iter().map(String::as_str).collect();
        let refused = AsyncQuorumClient::open(&wrong).unwrap().with_options(opts);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let none = refused.acquire("job", MS(5000), Block::For(MS(200))).await.unwrap();
            assert!(none.is_none(), "a wrong password takes no lease");
            let lease = client.acquire("job", MS(5000), Block::NoWait).await.unwrap().expect("free on all three");
            committed_within(lease.committed(), &[0, 1, 2]);
            let n: i64 = lease.fence(redis::cmd("HSET").arg("acct").arg("owner").arg("q")).await.unwrap();
            assert_eq!(n, 1);
            for s in &servers {
                let mut c = s.conn();
                assert_eq!(common::ok(&mut c, &["EXISTS", "job"]), redis::Value::Int(0), "not in database 0");
                common::ok(&mut c, &["SELECT", "3"]);
                assert_eq!(common::token_of(&mut c, "job"), Some(lease.token() as i64));
                assert_eq!(common::ok_text(&mut c, &["HGET", "acct", "owner"]), "q");
            }
            // The helper's own connections: logged in as quser, RESP3 where asked.
            for (i, s) in servers.iter().enumerate() {
                let list = common::ok_text(&mut s.conn(), &["CLIENT", "LIST"]);
                let resp = if i == 2 { "resp=3" } else { "resp=2" };
                assert!(
                    list.lines().any(|l| l.contains("user=quser") && l.contains(" db=3 ") && l.contains(resp)),
                    "master {i}: {list}"
                );
            }
            assert!(lease.release().await.unwrap());
        });
    }
}

/// `n` masters: real servers of `kind`, and at the positions `silent`
/// masters that accept no connection; their URLs in order, and what keeps
/// them up.
fn some_silent(
    kind: common::Kind,
    n: usize,
    silent: &[usize],
) -> (Vec<String>, Vec<Server>, Vec<Silent>) {
    let (mut urls, mut servers, mut quiet) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        if silent.contains(&i) {
            let s = Silent::start();
            urls.push(s.url());
            quiet.push(s);
        } else {
            let s = Server::start(kind);
            urls.push(format!("redis://127.0.0.1:{}/", s.port));
            servers.push(s);
        }
    }
    (urls, servers, quiet)
}

/// The ttl of the silent-master tests, and its step timeout (a third of
/// it: the default `io_timeout` is longer).
const SILENT_TTL: Duration = Duration::from_millis(900);
const STEP: Duration = Duration::from_millis(300);
/// A step timeout per silent master, the failure these tests catch, takes
/// at least two steps with two silent; one step plus a loaded machine's
/// connects stays below that.
const ONE_STEP_AT_MOST: Duration = Duration::from_millis(600);

/// One day of wall clock, in ms.
const DAY_MS: i64 = 86_400_000;

/// Five masters, master 0's clock 400 days ahead: beyond the `FLOOR`
/// bound of the others (365 days once, the grace length now).
fn one_far_ahead(kind: common::Kind) -> (Masters, ClockShift) {
    let shift = ClockShift::new(400 * DAY_MS);
    (Masters::start(kind, "0", Some(&shift)), shift)
}

/// A lease's `committed`: a majority of the masters `all` (the masters
/// that answer), in order. Each step is decided by the first majority to
/// answer; a master that answers much later than it (on a loaded machine)
/// is not in `committed`, though it holds the lease too.
fn committed_within(committed: &[usize], all: &[usize]) {
    let n = all.len().max(*all.last().unwrap_or(&0) + 1);
    assert!(
        committed.len() > n / 2
            && committed.iter().all(|i| all.contains(i))
            && committed.is_sorted(),
        "committed {committed:?}: a majority of {all:?}"
    );
}

/// What an acquisition with master 0 far ahead must show: committed
/// without it, the token below its token, and it reported once with its
/// address and about 400 days ahead.
fn check_left_out(masters: &Masters, token: u64, committed: &[usize], seen: &[Outlier]) {
    committed_within(committed, &[1, 2, 3, 4]);
    let [o] = seen else {
        panic!("one report: {seen:?}")
    };
    assert_eq!(o.master, 0);
    assert_eq!(o.addr, format!("127.0.0.1:{}", masters.relays[0].port));
    assert!(
        token < o.token,
        "committed {token} below the outlier's {}",
        o.token
    );
    assert_eq!(o.instead, token);
    let days = o.ahead.as_secs() / 86_400;
    assert!((399..=401).contains(&days), "{:?} ahead", o.ahead);
}

fn incr_on_a_string(masters: &[Server]) {
    for s in masters {
        common::ok(&mut s.conn(), &["SET", "data", "not a number"]);
    }
}

every_server! {
    fn three_of_seven_masters_silent_still_give_a_lease(kind) {
        let (urls, _servers, _silent) = some_silent(kind, 7, &[1, 3, 5]);
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = QuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        let t = Instant::now();
        let lease = client.acquire("job", SILENT_TTL, Block::For(MS(3000))).unwrap();
        eprintln!("3 of 7 silent ({kind:?}): acquire {:?} -> {:?}", t.elapsed(), lease.as_ref().map(|l| l.committed().to_vec()));
        let lease = lease.expect("four masters answer: a majority");
        committed_within(lease.committed(), &[0, 2, 4, 6]);
        assert!(lease.release().unwrap());
    }

    fn two_silent_masters_cost_one_step_timeout_per_acquire_and_release(kind) {
        let (urls, _servers, _silent) = some_silent(kind, 5, &[0, 3]);
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = QuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        for round in 0..2 {
            let t = Instant::now();
            let lease = client.acquire("job", SILENT_TTL, Block::NoWait).unwrap().expect("three of five");
            let acquire = t.elapsed();
            let t = Instant::now();
            assert!(lease.release().unwrap());
            let release = t.elapsed();
            eprintln!("2 of 5 silent ({kind:?}), round {round}: acquire {acquire:?}, release {release:?} (step timeout {STEP:?})");
            assert!(acquire < ONE_STEP_AT_MOST, "acquire took {acquire:?}: one step timeout, not one per silent master");
            assert!(release < ONE_STEP_AT_MOST, "release took {release:?}: one step timeout, not one per silent master");
        }
    }

    fn a_master_whose_clock_is_far_ahead_is_left_out_and_reported(kind) {
        let (masters, _shift) = one_far_ahead(kind);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let client = masters.client().on_outlier(move |o| s.lock().unwrap().push(o.clone()));
        let mut last = 0;
        for round in 0..3 {
            let lease = client.acquire("job", MS(2000), Block::For(MS(1000))).unwrap().expect("a majority without the outlier");
            let seen: Vec<Outlier> = seen.lock().unwrap().drain(..).collect();
            eprintln!("clock far ahead ({kind:?}), round {round}: token {} on {:?}, reported {seen:?}", lease.token(), lease.committed());
            check_left_out(&masters, lease.token(), lease.committed(), &seen);
            assert!(lease.token() > last, "tokens of successive holdings increase: {last} then {}", lease.token());
            last = lease.token();
            let _: () = lease.fence(redis::cmd("SET").arg("data").arg(round)).unwrap();
            assert!(lease.release().unwrap());
        }
    }

    fn a_fenced_command_that_fails_reports_its_own_error(kind) {
        let servers: Vec<Server> = (0..3).map(|_| Server::start(kind)).collect();
        incr_on_a_string(&servers);
        let urls: Vec<String> = servers.iter().map(|s| format!("redis://127.0.0.1:{}/", s.port)).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = QuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        let lease = client.acquire("job", MS(5000), Block::NoWait).unwrap().expect("free");
        match lease.fence::<i64>(redis::cmd("INCR").arg("data")) {
            Err(Error::Redis(e)) => assert!(e.to_string().contains("not an integer"), "{e}"),
            other => panic!("the command's error, not {other:?}"),
        }
        // The token is current: a command that works runs everywhere.
        let n: i64 = lease.fence(redis::cmd("APPEND").arg("data").arg("!")).unwrap();
        assert_eq!(n, 13);
        assert!(lease.release().unwrap());
    }
}

#[cfg(feature = "tokio")]
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[cfg(feature = "tokio")]
full_suite! {
    fn the_async_client_with_three_of_seven_masters_silent_still_gets_a_lease(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let (urls, _servers, _silent) = some_silent(kind, 7, &[1, 3, 5]);
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = AsyncQuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        runtime().block_on(async {
            let lease = client.acquire("job", SILENT_TTL, Block::For(MS(3000))).await.unwrap().expect("four masters answer");
            committed_within(lease.committed(), &[0, 2, 4, 6]);
            assert!(lease.release().await.unwrap());
        });
    }

    fn the_async_client_with_two_silent_masters_takes_one_step_timeout(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let (urls, _servers, _silent) = some_silent(kind, 5, &[0, 3]);
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = AsyncQuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        runtime().block_on(async {
            for round in 0..2 {
                let t = Instant::now();
                let lease = client.acquire("job", SILENT_TTL, Block::NoWait).await.unwrap().expect("three of five");
                let acquire = t.elapsed();
                let t = Instant::now();
                assert!(lease.release().await.unwrap());
                let release = t.elapsed();
                eprintln!("async, 2 of 5 silent ({kind:?}), round {round}: acquire {acquire:?}, release {release:?}");
                assert!(acquire < ONE_STEP_AT_MOST && release < ONE_STEP_AT_MOST, "one step timeout each");
            }
        });
    }

    fn the_async_client_leaves_out_and_reports_a_master_whose_clock_is_far_ahead(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let (masters, _shift) = one_far_ahead(kind);
        let urls: Vec<String> = masters.relays.iter().map(|r| format!("redis://127.0.0.1:{}/", r.port)).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let client = AsyncQuorumClient::open(&urls)
            .unwrap()
            .with_options(Options { io_timeout: MS(100), watchdog: false, ..Options::default() })
            .on_outlier(move |o| s.lock().unwrap().push(o.clone()));
        runtime().block_on(async {
            let mut last = 0;
            for _ in 0..3 {
                let lease = client.acquire("job", MS(2000), Block::For(MS(1000))).await.unwrap().expect("a majority without the outlier");
                let seen: Vec<Outlier> = seen.lock().unwrap().drain(..).collect();
                check_left_out(&masters, lease.token(), lease.committed(), &seen);
                assert!(lease.token() > last, "tokens of successive holdings increase");
                last = lease.token();
                assert!(lease.release().await.unwrap());
            }
        });
    }

    fn the_async_fence_of_a_command_that_fails_reports_its_own_error(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let servers: Vec<Server> = (0..3).map(|_| Server::start(kind)).collect();
        incr_on_a_string(&servers);
        let urls: Vec<String> = servers.iter().map(|s| format!("redis://127.0.0.1:{}/", s.port)).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = AsyncQuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        runtime().block_on(async {
            let lease = client.acquire("job", MS(5000), Block::NoWait).await.unwrap().expect("free");
            match lease.fence::<i64>(redis::cmd("INCR").arg("data")).await {
                Err(Error::Redis(e)) => assert!(e.to_string().contains("not an integer"), "{e}"),
                other => panic!("the command's error, not {other:?}"),
            }
            let n: i64 = lease.fence(redis::cmd("APPEND").arg("data").arg("!")).await.unwrap();
            assert_eq!(n, 13);
            assert!(lease.release().await.unwrap());
        });
    }
}

// --- Labels (design.md S11): every master's acquire, every step, every try.

/// `LEASE.INFO key`'s label on one master (`None`: no label); the key must
/// be held there.
fn label_on(c: &mut redis::Connection, key: &str) -> Option<String> {
    let info = common::ok(c, &["LEASE.INFO", key]);
    assert_ne!(info, Value::Nil, "{key} is not held");
    match common::field(&info, "label").expect("a label field") {
        Value::Nil => None,
        v => Some(common::text(&v)),
    }
}

/// Every master logs every command from now on (`SLOWLOG`, emptied).
fn log_everything(masters: &Masters) {
    for i in 0..N {
        let mut c = masters.conn(i);
        common::ok(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        common::ok(&mut c, &["CONFIG", "SET", "slowlog-max-len", "1000"]);
        common::ok(&mut c, &["SLOWLOG", "RESET"]);
    }
}

/// What follows the ttl in each `LEASE.ACQUIRE` that master `i` logged
/// (`FLOOR t`, `LABEL text`), oldest first; the log is emptied.
fn acquires_logged(masters: &Masters, i: usize) -> Vec<Vec<String>> {
    let mut c = masters.conn(i);
    let Value::Array(entries) = common::ok(&mut c, &["SLOWLOG", "GET", "1000"]) else {
        panic!("SLOWLOG GET")
    };
    common::ok(&mut c, &["SLOWLOG", "RESET"]);
    entries
        .iter()
        .rev()
        .filter_map(|e| {
            let Value::Array(parts) = e else {
                panic!("a slowlog entry {e:?}")
            };
            let Value::Array(args) = &parts[3] else {
                panic!("slowlog arguments {parts:?}")
            };
            let args: Vec<String> = args.iter().map(common::text).collect();
            args[0]
                .eq_ignore_ascii_case("LEASE.ACQUIRE")
                .then(|| args[4..].to_vec())
        })
        .collect()
}

/// Checks that every `LEASE.ACQUIRE` each master logged sent `label` (none
/// for `None`): the number each master logged, and of those how many were
/// commit rounds (`FLOOR`).
fn check_logged(masters: &Masters, label: Option<&str>) -> Vec<(usize, usize)> {
    (0..N)
        .map(|i| {
            let logged = acquires_logged(masters, i);
            let floors = logged
                .iter()
                .filter(|a| a.first().is_some_and(|w| w == "FLOOR"))
                .count();
            for rest in &logged {
                let sent = rest
                    .iter()
                    .position(|w| w == "LABEL")
                    .map(|p| rest[p + 1].as_str());
                assert_eq!(sent, label, "master {i}: LEASE.ACQUIRE ... {rest:?}");
            }
            (logged.len(), floors)
        })
        .collect()
}

/// An io timeout no loaded machine reaches, for tests where no master
/// is silent and a timed-out step would change what they count.
const UNHURRIED: Duration = Duration::from_millis(2000);

/// One acquire logged as step 1 with its proposal on every master. (A
/// machine so loaded that a master handles the request more than 20 ms
/// after the client read its clock answers above the proposal, and the
/// commit round follows, with `FLOOR` too: let through, as in
/// `one_round_trip_each`.)
fn step_1_with_its_proposal(logged: &[(usize, usize)]) {
    assert!(
        logged
            .iter()
            .all(|&(n, floors)| n == floors && n == logged[0].0)
            && (1..=2).contains(&logged[0].0),
        "LEASE.ACQUIRE per master (all, FLOOR) {logged:?}: step 1 with its proposal"
    );
}

full_suite! {
    fn the_quorum_client_labels_every_masters_acquire_on_every_step_and_try(kind) {
        let masters = Masters::start(kind, "0", None);
        let client = masters.client().with_options(Options { io_timeout: UNHURRIED, watchdog: false, ..Options::default() });
        assert_eq!(client.label(), Some(default_label()), "the default");
        let ttl = MS(5000);
        // The default label, on every master.
        let lease = client.acquire("job", ttl, Block::NoWait).unwrap().expect("free");
        committed_within(lease.committed(), &[0, 1, 2, 3, 4]);
        for i in 0..N {
            assert_eq!(label_on(&mut masters.conn(i), "job").as_deref(), Some(default_label()), "master {i}");
        }
        assert!(lease.release().unwrap());
        // One call's label (a labelled clone), in step 1 and in the commit.
        log_everything(&masters);
        let one = client.clone().with_label(Label::text("job 991"));
        assert_eq!(client.label(), Some(default_label()), "the clone's label is its own");
        let lease = one.acquire("job", ttl, Block::NoWait).unwrap().expect("free");
        for i in 0..N {
            assert_eq!(label_on(&mut masters.conn(i), "job").as_deref(), Some("job 991"), "master {i}");
        }
        step_1_with_its_proposal(&check_logged(&masters, Some("job 991")));
        assert!(lease.release().unwrap());
        // No label.
        let quiet = client.clone().with_label(Label::None);
        assert_eq!(quiet.label(), None);
        let lease = quiet.acquire("job", ttl, Block::NoWait).unwrap().expect("free");
        for i in 0..N {
            assert_eq!(label_on(&mut masters.conn(i), "job"), None, "master {i}");
        }
        step_1_with_its_proposal(&check_logged(&masters, None));
        assert!(lease.release().unwrap());
        // Tries again while another owner holds a majority: every try with the same label.
        for i in 0..3 {
            let _ = common::ok(&mut masters.conn(i), &["LEASE.ACQUIRE", "job", "other", "400"]);
        }
        log_everything(&masters);
        let patient = client.with_label(Label::text("patient"));
        let lease = patient.acquire("job", ttl, Block::For(MS(3000))).unwrap().expect("free after 400 ms");
        // Committed on a majority: a master whose rival lease had not yet
        // expired when the commit went out may be left out.
        assert!(lease.committed().len() > N / 2, "{:?}", lease.committed());
        for &i in lease.committed() {
            assert_eq!(label_on(&mut masters.conn(i), "job").as_deref(), Some("patient"), "master {i}");
        }
        let logged = check_logged(&masters, Some("patient"));
        eprintln!("labelled tries ({kind:?}): LEASE.ACQUIRE per master (all, FLOOR) {logged:?}");
        assert!(logged.iter().all(|&(n, _)| n >= 3), "several tries: {logged:?}");
        assert!(lease.committed().iter().all(|&i| logged[i].1 >= 1), "a FLOOR where committed: {logged:?}");
        assert!(lease.release().unwrap());
    }

    fn a_commit_round_that_leaves_out_a_master_sends_the_label_too(kind) {
        let (masters, _shift) = one_far_ahead(kind);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        // A clock 5 s behind the masters' makes step 1 miss its proposal,
        // so step 3 runs: its first round commits the outlier's token
        // everywhere, the four others refuse it as too far ahead, and the
        // next round leaves the outlier out.
        let client = masters
            .client()
            .with_clock_offset_ms(-5000)
            .with_label(Label::text("far ahead"))
            .on_outlier(move |o| s.lock().unwrap().push(o.clone()))
            .with_options(Options { io_timeout: UNHURRIED, watchdog: false, ..Options::default() });
        assert_eq!(client.label(), Some("far ahead"), "kept by the other settings");
        log_everything(&masters);
        let lease = client.acquire("job", MS(2000), Block::For(MS(1000))).unwrap().expect("a majority without the outlier");
        check_left_out(&masters, lease.token(), lease.committed(), &seen.lock().unwrap());
        for i in 0..N {
            assert_eq!(label_on(&mut masters.conn(i), "job").as_deref(), Some("far ahead"), "master {i}");
        }
        // Every round with the label (`check_logged`): step 1 and the
        // first commit round on the outlier, a second commit round where
        // committed (on a loaded machine a master may answer too late for
        // a round).
        let logged = check_logged(&masters, Some("far ahead"));
        let committed = lease.committed();
        assert_eq!(logged[0], (2, 2), "{logged:?}");
        assert!(
            (1..N).all(|i| logged[i].0 == logged[i].1 && if committed.contains(&i) { logged[i].0 == 3 } else { logged[i].0 <= 3 }),
            "{logged:?}, committed {committed:?}"
        );
        assert!(lease.release().unwrap());
    }
}

#[cfg(feature = "tokio")]
full_suite! {
    fn the_async_quorum_client_labels_every_masters_acquire(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let masters = Masters::start(kind, "0", None);
        let urls: Vec<String> = masters.relays.iter().map(|r| format!("redis://127.0.0.1:{}/", r.port)).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = AsyncQuorumClient::open(&urls).unwrap();
        assert_eq!(client.label(), Some(default_label()), "the default");
        let custom = client.clone().with_label(Label::text("async job"));
        let custom = custom.with_options(Options { io_timeout: UNHURRIED, watchdog: false, ..Options::default() });
        assert_eq!(custom.label(), Some("async job"), "kept by the options");
        let client = client.with_options(Options { io_timeout: UNHURRIED, watchdog: false, ..Options::default() });
        let ttl = MS(5000);
        runtime().block_on(async {
            let lease = client.acquire("job", ttl, Block::NoWait).await.unwrap().expect("free");
            for i in 0..N {
                assert_eq!(label_on(&mut masters.conn(i), "job").as_deref(), Some(default_label()), "master {i}");
            }
            assert!(lease.release().await.unwrap());
            log_everything(&masters);
            let lease = custom.acquire("job", ttl, Block::NoWait).await.unwrap().expect("free");
            for i in 0..N {
                assert_eq!(label_on(&mut masters.conn(i), "job").as_deref(), Some("async job"), "master {i}");
            }
            step_1_with_its_proposal(&check_logged(&masters, Some("async job")));
            assert!(lease.release().await.unwrap());
            let quiet = client.clone().with_label(Label::None);
            let lease = quiet.acquire("job", ttl, Block::NoWait).await.unwrap().expect("free");
            for i in 0..N {
                assert_eq!(label_on(&mut masters.conn(i), "job"), None, "master {i}");
            }
            step_1_with_its_proposal(&check_logged(&masters, None));
            assert!(lease.release().await.unwrap());
        });
    }
}

// --- Round trips (design.md S9, one round trip in the common case),
// counted on the masters with INFO commandstats.

/// `calls` of `command` (lower case) in each master's `INFO
/// commandstats` (0: none).
fn calls(masters: &Masters, command: &str) -> Vec<i64> {
    (0..N)
        .map(|i| {
            let info = common::ok_text(&mut masters.conn(i), &["INFO", "commandstats"]);
            let field = format!("cmdstat_{command}:calls=");
            info.lines()
                .map(str::to_ascii_lowercase)
                .find_map(|l| l.strip_prefix(&field).map(str::to_string))
                .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
        })
        .collect()
}

fn reset_stats(masters: &Masters) {
    for i in 0..N {
        common::ok(&mut masters.conn(i), &["CONFIG", "RESETSTAT"]);
    }
}

/// How many cycles the counting tests make.
const CYCLES: i64 = 20;

/// One `LEASE.ACQUIRE` per master per acquire: no step 3. (A machine so
/// loaded that a master handles a request more than 20 ms after the
/// client read its clock answers above the proposal: one such acquire in
/// the run is let through, and shows.)
fn one_round_trip_each(acquires: &[i64]) {
    let extra: i64 = acquires.iter().map(|a| a - CYCLES).sum();
    assert!(
        acquires.iter().all(|&a| a >= CYCLES) && extra <= N as i64,
        "LEASE.ACQUIRE per master {acquires:?} for {CYCLES} acquires"
    );
}

every_server! {
    fn with_agreeing_clocks_an_acquire_and_a_release_are_one_round_trip_each(kind) {
        let masters = Masters::start(kind, "0", None);
        let client = masters.client();
        reset_stats(&masters);
        let mut last = 0;
        for _ in 0..CYCLES {
            let lease = client.acquire("job", MS(2000), Block::NoWait).unwrap().expect("free");
            assert!(lease.token() > last, "tokens of successive holdings increase");
            last = lease.token();
            assert!(lease.release().unwrap());
        }
        // The releases not in when the release returned still arrive.
        assert!(wait_until(MS(2000), || calls(&masters, "lease.release") == [CYCLES; N]));
        let (acquires, releases) = (calls(&masters, "lease.acquire"), calls(&masters, "lease.release"));
        eprintln!("{CYCLES} cycles ({kind:?}): LEASE.ACQUIRE per master {acquires:?}, LEASE.RELEASE {releases:?}");
        one_round_trip_each(&acquires);
    }

    fn a_client_whose_clock_runs_behind_pays_step_3_once_then_proposes_above_the_masters_clocks(kind) {
        let masters = Masters::start(kind, "0", None);
        let client = masters.client().with_clock_offset_ms(-5000);
        reset_stats(&masters);
        let lease = client.acquire("job", MS(2000), Block::NoWait).unwrap().expect("free");
        // Step 3 goes to the masters whose grant was in when step 1 was
        // decided (a majority; on a loaded machine not always all five).
        let committed = lease.committed().to_vec();
        assert!(committed.len() > N / 2, "{committed:?}");
        assert!(lease.release().unwrap());
        // Every master's release comes after its acquire: all in once all are.
        assert!(wait_until(MS(2000), || calls(&masters, "lease.release") == [1; N]));
        let want: Vec<i64> = (0..N).map(|i| 1 + i64::from(committed.contains(&i))).collect();
        assert_eq!(calls(&masters, "lease.acquire"), want, "step 1 everywhere, then step 3 where committed");
        reset_stats(&masters);
        for _ in 0..CYCLES {
            let lease = client.acquire("job", MS(2000), Block::NoWait).unwrap().expect("free");
            assert!(lease.release().unwrap());
        }
        one_round_trip_each(&calls(&masters, "lease.acquire"));
    }

    fn a_master_whose_clock_is_far_ahead_costs_no_round_trip(kind) {
        let (masters, _shift) = one_far_ahead(kind);
        let client = masters.client();
        reset_stats(&masters);
        for _ in 0..CYCLES {
            let lease = client.acquire("job", MS(2000), Block::NoWait).unwrap().expect("a majority without the outlier");
            committed_within(lease.committed(), &[1, 2, 3, 4]);
            assert!(lease.release().unwrap());
        }
        one_round_trip_each(&calls(&masters, "lease.acquire"));
    }
}

#[cfg(feature = "tokio")]
full_suite! {
    fn the_async_client_acquires_and_releases_in_one_round_trip_each(kind) {
        use redis_lease_client::aio::QuorumClient as AsyncQuorumClient;
        let masters = Masters::start(kind, "0", None);
        let urls: Vec<String> = masters.relays.iter().map(|r| format!("redis://127.0.0.1:{}/", r.port)).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = AsyncQuorumClient::open(&urls).unwrap().with_options(Options { io_timeout: UNHURRIED, watchdog: false, ..Options::default() });
        reset_stats(&masters);
        runtime().block_on(async {
            let mut last = 0;
            for _ in 0..CYCLES {
                let lease = client.acquire("job", MS(2000), Block::NoWait).await.unwrap().expect("free");
                assert!(lease.token() > last);
                last = lease.token();
                assert!(lease.release().await.unwrap());
            }
        });
        assert!(wait_until(MS(2000), || calls(&masters, "lease.release") == [CYCLES; N]));
        let acquires = calls(&masters, "lease.acquire");
        eprintln!("async, {CYCLES} cycles ({kind:?}): LEASE.ACQUIRE per master {acquires:?}");
        one_round_trip_each(&acquires);
    }
}
