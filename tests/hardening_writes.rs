//! Regression tests for writes the module made when it must not, or did not
//! make when it must: a waiter served during `CLIENT PAUSE WRITE`, under
//! `min-replicas-to-write`, or on a slot that moved away (two holders);
//! a RESTOREd token that exhausts the clock; the clock lost by an AOF
//! rewrite without the RDB preamble; hand-offs that waited for the old
//! deadline after RENEW, re-acquire, PEXPIRE or SWAPDB moved it.
mod common;
use common::*;

use std::process::Command;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// 2^53-1, the largest token.
const MAX_TOKEN: i64 = (1 << 53) - 1;
const DAY_MS: i64 = 24 * 3600 * 1000;

/// The test process's wall clock in unix ms.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The server's log where it matters: the head of the crash report (the
/// failed assertion or the signal) when there is one, else its last `n`
/// lines.
fn log_tail(s: &Server, n: usize) -> String {
    let log = s.log();
    let lines: Vec<&str> = log.lines().collect();
    match lines.iter().position(|l| l.contains("BUG REPORT START")) {
        Some(at) => lines[at..]
            .iter()
            .take(n)
            .take_while(|l| !l.contains("STACK TRACE"))
            .copied()
            .collect::<Vec<_>>()
            .join("\n"),
        None => lines[lines.len().saturating_sub(n)..].join("\n"),
    }
}

/// Panics with the log tail when the server is gone. `suspect`: a client
/// just lost its connection, so give a dying process a moment to be reaped.
fn assert_alive(s: &mut Server, what: &str, suspect: bool) {
    let dead =
        !s.is_alive() || (suspect && wait_until(Duration::from_millis(1000), || !s.is_alive()));
    assert!(
        !dead,
        "{what}: the {:?} server died; its log:\n{}",
        s.kind,
        log_tail(s, 12)
    );
}

fn acquire(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str) -> i64 {
    int(&ok(c, &["LEASE.ACQUIRE", key, owner, ttl]))
}

fn token_of(c: &mut redis::Connection, key: &str) -> Option<i64> {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => None,
        v => Some(int(&field(&v, "token").expect("token field"))),
    }
}

fn waiters(c: &mut redis::Connection, key: &str) -> i64 {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => 0,
        v => int(&field(&v, "waiters").expect("waiters field")),
    }
}

/// A blocked waiter's reply and when it arrived.
type Answer = JoinHandle<(redis::RedisResult<Value>, Instant)>;

/// Starts `LEASE.ACQUIRE key owner ttl BLOCK timeout` on its own connection
/// and thread, and waits until the server counts it as a waiter.
fn spawn_waiter(s: &Server, key: &str, owner: &str, ttl: &str, timeout: &str) -> Answer {
    let mut probe = s.conn();
    let before = waiters(&mut probe, key);
    let mut c = s.conn();
    let args: Vec<String> = ["LEASE.ACQUIRE", key, owner, ttl, "BLOCK", timeout]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let h = thread::spawn(move || {
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let reply = call(&mut c, &refs);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut probe, key) > before),
        "{owner} never started waiting on {key}"
    );
    h
}

/// A field of `INFO persistence` as a string.
fn persistence_field(c: &mut redis::Connection, name: &str) -> String {
    let info: String = redis::cmd("INFO").arg("persistence").query(c).unwrap();
    info.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == name).then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("INFO persistence has no field {name}"))
}

fn no_rewrite_running(c: &mut redis::Connection) -> bool {
    persistence_field(c, "aof_rewrite_in_progress") == "0"
        && persistence_field(c, "aof_rewrite_scheduled") == "0"
}

// ---------------------------------------------------------------------------
// 1. CLIENT PAUSE WRITE

/// Defect: the waiter of an expired lease was served (a new lease written,
/// replicated, appended to the AOF) while `CLIENT PAUSE ... WRITE` held
/// every write off. Redis 7.0 aborts (db.c assertion), Valkey aborts with a
/// replica or the AOF attached, and plain Valkey answers a token it never
/// stored. The waiter must be served only once the pause ends, with a token
/// that is the stored lease, on the replica too.
fn waiter_waits_out_a_write_pause(kind: Kind, opts: Opts, with_replica: bool) {
    let mut s = Server::start_with(kind, opts);
    let replica = with_replica.then(|| replica_of(kind, &s));
    let mut c = s.conn();
    let acquired = Instant::now();
    acquire(&mut c, "pk", "holder", "500");
    let w = spawn_waiter(&s, "pk", "waiter", "60000", "5000");
    let mut pauser = s.conn();
    let paused = Instant::now();
    assert_eq!(
        ok(&mut pauser, &["CLIENT", "PAUSE", "2000", "WRITE"]),
        Value::Okay
    );
    assert!(
        paused - acquired < Duration::from_millis(450),
        "setup too slow: the 500 ms lease may have expired before the pause"
    );
    let (reply, at) = w.join().unwrap();
    assert_alive(
        &mut s,
        "a waiter served during CLIENT PAUSE WRITE",
        reply.is_err(),
    );
    let waited = at - paused;
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the waiter should get a token, got {other:?} after {waited:?}"),
    };
    assert!(
        waited >= Duration::from_millis(1900),
        "the waiter was served {waited:?} after CLIENT PAUSE 2000 WRITE: during the pause"
    );
    assert!(
        waited < Duration::from_millis(4000),
        "the waiter was served only {waited:?} after the pause began"
    );
    assert_eq!(
        token_of(&mut c, "pk"),
        Some(t),
        "the token the waiter got is not the stored lease"
    );
    if let Some(r) = replica {
        let mut rc = r.conn();
        let mut seen = None;
        assert!(
            wait_until(Duration::from_secs(5), || {
                seen = token_of(&mut rc, "pk");
                seen == Some(t)
            }),
            "the replica holds {seen:?}, the waiter got {t}"
        );
    }
    assert_alive(&mut s, "after the pause", false);
}

// ---------------------------------------------------------------------------
// 2. A slot moving away from a master with waiters

struct Cluster {
    nodes: Vec<Server>,
}

fn text(c: &mut redis::Connection, args: &[&str]) -> String {
    match ok(c, args) {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        Value::SimpleString(s) => s,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// A master of the cluster: node id, port, served slot ranges.
type Master = (String, u16, Vec<(i64, i64)>);

impl Cluster {
    /// Three masters, no replicas.
    fn start(kind: Kind) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|i| {
                Server::start_with(
                    kind,
                    Opts::default().extra(&[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{i}.conf"),
                        "--cluster-node-timeout",
                        "3000",
                    ]),
                )
            })
            .collect();
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for n in &nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || {
                    let info = text(&mut c, &["CLUSTER", "INFO"]);
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
                }),
                "cluster never became ok"
            );
        }
        Cluster { nodes }
    }

    fn node_by_port(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("known node")
    }

    /// (node id, port, served slot ranges) of every master, as node 0 sees it.
    fn masters(&self) -> Vec<Master> {
        let mut c = self.nodes[0].conn();
        text(&mut c, &["CLUSTER", "NODES"])
            .lines()
            .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let port = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                let ranges = f[8..]
                    .iter()
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                (f[0].to_string(), port, ranges)
            })
            .collect()
    }
}

/// Defect: a waiter queued on a master kept waiting after its key's slot
/// was migrated away, and the master then handed it a new lease of a key it
/// no longer owns, while the lease moved to the new master is still held:
/// two holders. The waiter must instead be redirected (ASK/MOVED to the new
/// master), no lease granted by the old master, and the moved lease kept.
fn a_waiter_is_redirected_when_the_slot_moves_away(kind: Kind) {
    let cluster = Cluster::start(kind);
    let mut probe = cluster.nodes[0].conn();
    let slot = int(&ok(&mut probe, &["CLUSTER", "KEYSLOT", "k"]));
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "three masters");
    let (a_id, a_port, _) = masters
        .iter()
        .find(|(_, _, r)| r.iter().any(|(x, y)| (*x..=*y).contains(&slot)))
        .cloned()
        .expect("an owner of k's slot");
    let (b_id, b_port, _) = masters
        .iter()
        .find(|(id, _, _)| *id != a_id)
        .cloned()
        .unwrap();
    let a_server = cluster.node_by_port(a_port);
    let mut a = a_server.conn();
    let mut b = cluster.node_by_port(b_port).conn();

    let t0 = acquire(&mut a, "k", "h", "10000");
    let w = spawn_waiter(a_server, "k", "w", "10000", "8000");
    let acquired = info_int(&mut a, "lease_acquired");
    let slot_s = slot.to_string();
    ok(&mut b, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &a_id]);
    ok(&mut a, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &b_id]);
    assert_eq!(
        ok(
            &mut a,
            &[
                "MIGRATE",
                "127.0.0.1",
                &b_port.to_string(),
                "k",
                "0",
                "5000"
            ]
        ),
        Value::Okay
    );
    let moved = Instant::now();

    let (reply, at) = w.join().unwrap();
    let e = match reply {
        Err(e) if e.code().is_some() => error_text(&e),
        Ok(v) => panic!(
            "the waiter got {v:?} from the old master after its slot moved (the moved lease, token {t0}, is still held)"
        ),
        Err(e) => panic!("the waiter lost its connection: {e}"),
    };
    assert!(
        e.starts_with("ASK") || e.starts_with("MOVED"),
        "the waiter should be redirected, got {e}"
    );
    assert!(
        e.contains(&slot_s) && e.contains(&format!("127.0.0.1:{b_port}")),
        "the redirection should name slot {slot} at 127.0.0.1:{b_port}: {e}"
    );
    assert!(
        at - moved < Duration::from_secs(2),
        "redirected only {:?} after the move",
        at - moved
    );
    assert_eq!(
        info_int(&mut a, "lease_acquired"),
        acquired,
        "the old master granted a lease after the slot moved"
    );
    ok(&mut b, &["ASKING"]);
    assert_eq!(
        token_of(&mut b, "k"),
        Some(t0),
        "the moved lease keeps its token"
    );
    ok(&mut b, &["ASKING"]);
    assert_eq!(
        ok(&mut b, &["LEASE.ACQUIRE", "k", "w", "10000"]),
        Value::Nil,
        "the moved lease is still held by h"
    );
}

// ---------------------------------------------------------------------------
// 3. min-replicas-to-write

/// Defect: with `min-replicas-to-write` unmet, every write is refused with
/// NOREPLICAS, but the waiter of an expiring lease was still served (a new
/// lease written by the timer). It must wait until writes are accepted
/// again, then be served promptly.
fn waiter_is_not_served_while_min_replicas_refuses_writes(kind: Kind) {
    let s = Server::start(kind);
    let mut c = s.conn();
    let start = Instant::now();
    acquire(&mut c, "k", "h", "300");
    let w = spawn_waiter(&s, "k", "w", "10000", "5000");
    ok(&mut c, &["CONFIG", "SET", "min-replicas-to-write", "1"]);
    assert!(
        start.elapsed() < Duration::from_millis(250),
        "setup too slow: the 300 ms lease may have expired before the gate"
    );
    let acquired = info_int(&mut c, "lease_acquired");
    let e = err(&mut c, &["LEASE.ACQUIRE", "other", "x", "1000"]);
    assert!(e.starts_with("NOREPLICAS"), "a direct acquire: {e}");

    thread::sleep(Duration::from_millis(1000).saturating_sub(start.elapsed()));
    if w.is_finished() {
        let (reply, _) = w.join().unwrap();
        panic!("the waiter was answered while writes are refused: {reply:?}");
    }
    assert_eq!(
        ok(&mut c, &["LEASE.INFO", "k"]),
        Value::Nil,
        "a lease was written while writes are refused"
    );
    assert_eq!(info_int(&mut c, "lease_acquired"), acquired);

    ok(&mut c, &["CONFIG", "SET", "min-replicas-to-write", "0"]);
    let opened = Instant::now();
    let (reply, at) = w.join().unwrap();
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the waiter should get a token once writes are accepted: {other:?}"),
    };
    assert!(
        at - opened < Duration::from_millis(1000),
        "served {:?} after writes were accepted again",
        at - opened
    );
    assert_eq!(token_of(&mut c, "k"), Some(t));
}

// ---------------------------------------------------------------------------
// 4. RESTORE of a token far ahead of the clock

/// Defect: RESTORE (or any load) of a lease whose token is near 2^53-1
/// raised the server-wide clock there, and every later LEASE.ACQUIRE on any
/// key answered "fencing tokens exhausted". A stored token more than one
/// year ahead of the wall clock must be refused (and logged); one a day
/// ahead is still accepted and raises the clock.
fn a_restored_token_far_ahead_of_the_clock_is_refused(kind: Kind) {
    let s = Server::start(kind);
    let mut c = s.conn();
    let t = acquire(&mut c, "k", "o", "60000");
    let payload = dump_payload(&mut c, "k");
    let log_before = s.log().len();
    for (what, bad) in [
        ("2^53-1", MAX_TOKEN),
        ("400 days ahead", (now_ms() + 400 * DAY_MS) * 1024),
    ] {
        let edited = with_token(&payload, t, bad);
        match call(&mut c, &[b"RESTORE", b"k2", b"0", &edited]) {
            Ok(v) => panic!(
                "RESTORE of token {bad} ({what}) should be refused, got {v:?}; lease_last_token is now {}",
                info_int(&mut c, "lease_last_token")
            ),
            Err(e) => assert!(e.code().is_some(), "{what}: an error reply, got {e}"),
        }
        assert_eq!(int(&ok(&mut c, &["EXISTS", "k2"])), 0, "{what}");
    }
    let fresh = match call(&mut c, &[b"LEASE.ACQUIRE", b"fresh", b"o", b"1000"]) {
        Ok(Value::Int(f)) => f,
        other => panic!("LEASE.ACQUIRE after the refused RESTOREs: {other:?}"),
    };
    assert!(fresh > t);
    let last = info_int(&mut c, "lease_last_token");
    assert!(last < MAX_TOKEN, "lease_last_token {last}");
    let log = s.log();
    let new_lines = &log[log_before.min(log.len())..];
    assert!(
        new_lines.lines().any(|l| {
            let l = l.to_lowercase();
            l.contains("token")
                && ["ahead", "future", "clock", "year"]
                    .iter()
                    .any(|w| l.contains(w))
        }),
        "no log line says why the token was refused; log tail:\n{}",
        log_tail(&s, 20)
    );

    let day = (now_ms() + DAY_MS) * 1024;
    assert_eq!(
        call(
            &mut c,
            &[b"RESTORE", b"k3", b"0", &with_token(&payload, t, day)]
        )
        .unwrap(),
        Value::Okay,
        "a token one day ahead is accepted"
    );
    assert_eq!(token_of(&mut c, "k3"), Some(day));
    assert!(info_int(&mut c, "lease_last_token") >= day);
    assert!(acquire(&mut c, "after", "o", "1000") > day);
}

// ---------------------------------------------------------------------------
// 5. AOF rewrite without the RDB preamble

/// Defect: an AOF rewrite without the RDB preamble wrote the leases as
/// commands but not the token clock (module aux data exists only in RDB),
/// so after a restart on that AOF the clock fell back to the wall clock
/// (or the largest surviving lease) and new tokens went below ones already
/// issued. `keep_live`: one lease, with an ordinary token, survives too.
fn tokens_stay_ahead_after_an_aof_rewrite_without_preamble(kind: Kind, keep_live: bool) {
    let opts = Opts::default().extra(&[
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        "no",
        "--appendfsync",
        "always",
    ]);
    let s = Server::start_with(kind, opts.clone());
    let mut c = s.conn();
    let t = acquire(&mut c, "k", "a", "60000");
    let ahead = (now_ms() + DAY_MS) * 1024;
    let payload = with_token(&dump_payload(&mut c, "k"), t, ahead);
    assert_eq!(
        call(&mut c, &[b"RESTORE", b"k2", b"60000", &payload]).unwrap(),
        Value::Okay
    );
    let floor = info_int(&mut c, "lease_last_token");
    assert!(floor >= ahead, "lease_last_token {floor} below {ahead}");
    ok(&mut c, &["DEL", "k2"]);
    if !keep_live {
        ok(&mut c, &["DEL", "k"]);
    }

    assert!(
        wait_until(Duration::from_secs(10), || no_rewrite_running(&mut c)),
        "an earlier rewrite never finished"
    );
    let rewrites: i64 = persistence_field(&mut c, "aof_rewrites").parse().unwrap();
    ok(&mut c, &["BGREWRITEAOF"]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            no_rewrite_running(&mut c)
                && persistence_field(&mut c, "aof_last_bgrewrite_status") == "ok"
                && persistence_field(&mut c, "aof_rewrites")
                    .parse::<i64>()
                    .unwrap()
                    > rewrites
        }),
        "BGREWRITEAOF never completed"
    );

    let s = s.restart_with(opts);
    let mut c = s.conn();
    if keep_live {
        assert_eq!(token_of(&mut c, "k"), Some(t), "the live lease survived");
    } else {
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
    }
    let next = acquire(&mut c, "new", "x", "60000");
    assert!(
        next > floor,
        "token {next} after the rewrite and restart, {floor} was issued or seen before"
    );
}

// ---------------------------------------------------------------------------
// 6. Hand-offs at a deadline moved earlier

/// Defect: the waiters' timer stayed at the holder's first deadline when a
/// `change` moved it earlier (LEASE.RENEW or re-acquire with a shorter ttl,
/// PEXPIRE), so the waiter was served only at the old deadline (here after
/// its own BLOCK timeout). It must be served at the new deadline.
///
/// Active expiry is turned off, as it effectively is for one key among many
/// (it samples 20 keys per database per cycle): otherwise the key's own
/// expiry could serve the waiter and hide a timer left at the old deadline.
fn a_waiter_is_served_at_the_new_deadline(kind: Kind, change: &[&str]) {
    let s = Server::start(kind);
    let mut c = s.conn();
    ok(&mut c, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    let t0 = acquire(&mut c, "k", "h", "5000");
    let w = spawn_waiter(&s, "k", "w", "10000", "4000");
    ok(&mut c, change);
    let changed = Instant::now();
    let (reply, at) = w.join().unwrap();
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!(
            "after {change:?} the waiter should get the lease at the new deadline (200 ms), got {other:?} after {:?}",
            at - changed
        ),
    };
    assert!(
        at - changed < Duration::from_millis(1000),
        "after {change:?} the waiter was served {:?} later",
        at - changed
    );
    assert!(t > t0);
    assert_eq!(token_of(&mut c, "k"), Some(t));
}

/// Defect: SWAPDB moved the held lease out of the waiter's database without
/// telling the waiters, so the key stayed free in db 0 while its waiter
/// waited for the old holder's deadline (60 s). It must be served at once,
/// and the swapped lease stays in db 1 unchanged.
fn swapdb_frees_the_key_for_its_waiter(kind: Kind) {
    let s = Server::start(kind);
    let mut c = s.conn();
    let t0 = acquire(&mut c, "k", "h", "60000");
    let w = spawn_waiter(&s, "k", "w", "10000", "4000");
    ok(&mut c, &["SWAPDB", "0", "1"]);
    let swapped = Instant::now();
    let (reply, at) = w.join().unwrap();
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!(
            "after SWAPDB the waiter should get the now free key, got {other:?} after {:?}",
            at - swapped
        ),
    };
    assert!(
        at - swapped < Duration::from_millis(1000),
        "served {:?} after SWAPDB",
        at - swapped
    );
    assert!(t > t0);
    assert_eq!(
        token_of(&mut c, "k"),
        Some(t),
        "db 0 holds the waiter's lease"
    );
    let mut db1 = s.conn();
    ok(&mut db1, &["SELECT", "1"]);
    assert_eq!(
        token_of(&mut db1, "k"),
        Some(t0),
        "db 1 keeps the old lease"
    );
}

both! {
    fn waiter_waits_out_a_write_pause_plain(kind) {
        waiter_waits_out_a_write_pause(kind, Opts::default(), false);
    }

    fn waiter_waits_out_a_write_pause_with_a_replica(kind) {
        waiter_waits_out_a_write_pause(kind, Opts::default(), true);
    }

    fn waiter_waits_out_a_write_pause_with_aof(kind) {
        waiter_waits_out_a_write_pause(kind, Opts::default().extra(&["--appendonly", "yes"]), false);
    }

    fn waiter_is_redirected_when_the_slot_moves_away(kind) {
        a_waiter_is_redirected_when_the_slot_moves_away(kind);
    }

    fn min_replicas_to_write_holds_the_waiter(kind) {
        waiter_is_not_served_while_min_replicas_refuses_writes(kind);
    }

    fn restore_refuses_a_token_far_ahead_of_the_clock(kind) {
        a_restored_token_far_ahead_of_the_clock_is_refused(kind);
    }

    fn aof_rewrite_without_preamble_keeps_the_clock(kind) {
        tokens_stay_ahead_after_an_aof_rewrite_without_preamble(kind, false);
    }

    fn aof_rewrite_without_preamble_keeps_the_clock_with_a_live_lease(kind) {
        tokens_stay_ahead_after_an_aof_rewrite_without_preamble(kind, true);
    }

    fn renew_to_a_shorter_ttl_serves_the_waiter_at_the_new_deadline(kind) {
        a_waiter_is_served_at_the_new_deadline(kind, &["LEASE.RENEW", "k", "h", "200"]);
    }

    fn reacquire_with_a_shorter_ttl_serves_the_waiter_at_the_new_deadline(kind) {
        a_waiter_is_served_at_the_new_deadline(kind, &["LEASE.ACQUIRE", "k", "h", "200"]);
    }

    fn pexpire_serves_the_waiter_at_the_new_deadline(kind) {
        a_waiter_is_served_at_the_new_deadline(kind, &["PEXPIRE", "k", "200"]);
    }

    fn swapdb_serves_the_waiter_of_the_swapped_key(kind) {
        swapdb_frees_the_key_for_its_waiter(kind);
    }
}
