//! Regression tests for two ways the module killed the server: a deeply
//! nested LEASE.FENCE whose key listing recursed once per level until the
//! stack overflowed (COMMAND GETKEYS, an ACL user limited by key patterns,
//! cluster routing), and a waiter served while FAILOVER paused writes to
//! wait for a lagging replica.
mod common;
use common::*;

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How deep the nested LEASE.FENCE goes: far beyond any stack when each
/// level costs a recursion.
const DEPTH: usize = 10_000;

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

/// `LEASE.FENCE k <token>` `depth` times, then `SET x y`.
fn nest(depth: usize, token: &str) -> Vec<String> {
    let mut args = Vec::with_capacity(3 * depth + 3);
    for _ in 0..depth {
        args.extend(["LEASE.FENCE", "k", token].map(String::from));
    }
    args.extend(["SET", "x", "y"].map(String::from));
    args
}

fn call_strings(c: &mut redis::Connection, args: &[String]) -> redis::RedisResult<Value> {
    let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    call(c, &refs)
}

/// The error text of a reply that must be an error the server wrote (not a
/// lost connection, not a success).
fn server_error(reply: redis::RedisResult<Value>, what: &str) -> String {
    match reply {
        Ok(v) => panic!("{what}: expected an error reply, got {v:?}"),
        Err(e) if e.code().is_none() => panic!("{what}: no reply from the server: {e}"),
        Err(e) => error_text(&e),
    }
}

fn ping(c: &mut redis::Connection) -> String {
    redis::cmd("PING").query(c).expect("PING")
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

fn text(c: &mut redis::Connection, args: &[&str]) -> String {
    match ok(c, args) {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        Value::SimpleString(s) => s,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// One field of `INFO replication`.
fn replication_field(c: &mut redis::Connection, name: &str) -> Option<String> {
    text(c, &["INFO", "replication"]).lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

// ---------------------------------------------------------------------------
// 1. Nested LEASE.FENCE

/// Defect: asked for the keys of `LEASE.FENCE k t LEASE.FENCE k t ...`, the
/// module asked the server for the inner command's keys, which called the
/// module back for the next level, once per level, until the stack
/// overflowed and the server died without a log line. COMMAND GETKEYS of a
/// 10,000-deep nest must be answered (a key list or an error) by a live
/// server, and executing a nest is refused: lease commands cannot be fenced.
fn command_getkeys_of_a_deep_nest(kind: Kind) {
    let mut s = Server::start(kind);
    let mut c = s.conn();
    let mut args: Vec<String> = vec!["COMMAND".into(), "GETKEYS".into()];
    args.extend(nest(DEPTH, "1"));
    let reply = call_strings(&mut c, &args);
    let lost = matches!(&reply, Err(e) if e.code().is_none());
    assert_alive(&mut s, "COMMAND GETKEYS of a 10,000-deep LEASE.FENCE", lost);
    match &reply {
        Ok(Value::Array(keys)) => assert!(
            keys.iter().all(|k| matches!(k, Value::BulkString(_))),
            "COMMAND GETKEYS answered {keys:?}"
        ),
        Ok(other) => panic!("COMMAND GETKEYS answered {other:?}"),
        Err(e) => assert!(e.code().is_some(), "COMMAND GETKEYS got no reply: {e}"),
    }
    let mut c = s.conn();
    assert_eq!(ping(&mut c), "PONG");

    // Executing a 3-level nest with a valid token is refused, and the
    // innermost SET never runs.
    let t = acquire(&mut c, "k", "me", "60000").to_string();
    let e = server_error(
        call_strings(&mut c, &nest(2, &t)),
        "LEASE.FENCE k t LEASE.FENCE k t SET x y",
    );
    assert!(
        e.contains("lease commands cannot be fenced"),
        "the nested fence was refused with {e:?}"
    );
    assert_eq!(ok(&mut c, &["EXISTS", "x"]), Value::Int(0), "x was set");
    assert_eq!(token_of(&mut c, "k"), Some(t.parse().unwrap()));
    assert_alive(&mut s, "after the nested fences", false);
}

/// Defect: for a user whose keys are limited by patterns, the ACL check
/// lists the command's keys before running it, so a 10,000-deep nest sent
/// by that user overflowed the stack the same way. The server must stay up
/// and the user get an error.
fn acl_key_check_of_a_deep_nest(kind: Kind) {
    let mut s = Server::start(kind);
    let mut admin = s.conn();
    assert_eq!(
        ok(
            &mut admin,
            &["ACL", "SETUSER", "limited", "on", "nopass", "~k*", "+@all"]
        ),
        Value::Okay
    );
    let t = acquire(&mut admin, "k", "me", "60000").to_string();
    let mut c = s.conn();
    assert_eq!(ok(&mut c, &["AUTH", "limited", "any"]), Value::Okay);
    let whoami = text(&mut c, &["ACL", "WHOAMI"]);
    assert_eq!(whoami, "limited");
    let reply = call_strings(&mut c, &nest(DEPTH, &t));
    let lost = matches!(&reply, Err(e) if e.code().is_none());
    assert_alive(
        &mut s,
        "a 10,000-deep LEASE.FENCE from a key-limited ACL user",
        lost,
    );
    let e = server_error(reply, "a 10,000-deep LEASE.FENCE from a key-limited user");
    assert!(
        e.contains("lease commands cannot be fenced"),
        "the nested fence was refused with {e:?}"
    );
    assert_eq!(ping(&mut c), "PONG");
    assert_eq!(ok(&mut admin, &["EXISTS", "x"]), Value::Int(0), "x was set");
    assert_alive(&mut s, "after the key-limited user's nest", false);
}

/// Defect: in cluster mode the server lists every command's keys to route
/// it, so a 10,000-deep nest sent as a plain command overflowed the stack.
/// A single-node cluster serving every slot must answer it with an error
/// and stay up.
fn cluster_routing_of_a_deep_nest(kind: Kind) {
    let bus = free_port().to_string();
    let mut s = Server::start_with(
        kind,
        Opts::default().extra(&[
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            "3000",
        ]),
    );
    let mut c = s.conn();
    assert_eq!(
        ok(&mut c, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Value::Okay
    );
    assert!(
        wait_until(Duration::from_secs(8), || text(
            &mut c,
            &["CLUSTER", "INFO"]
        )
        .contains("cluster_state:ok")),
        "the single-node cluster never became ok:\n{}",
        text(&mut c, &["CLUSTER", "INFO"])
    );
    let t = acquire(&mut c, "k", "me", "60000").to_string();
    let reply = call_strings(&mut c, &nest(DEPTH, &t));
    let lost = matches!(&reply, Err(e) if e.code().is_none());
    assert_alive(&mut s, "a 10,000-deep LEASE.FENCE in cluster mode", lost);
    let e = server_error(reply, "a 10,000-deep LEASE.FENCE in cluster mode");
    assert!(
        e.contains("lease commands cannot be fenced"),
        "the nested fence was refused with {e:?}"
    );
    assert_eq!(ping(&mut c), "PONG");
    assert_eq!(ok(&mut c, &["EXISTS", "x"]), Value::Int(0), "x was set");
    assert_alive(&mut s, "after the nest in cluster mode", false);
}

// ---------------------------------------------------------------------------
// 2. FAILOVER with a lagging replica

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
        let reply = call_strings(&mut c, &args);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut probe, key) > before),
        "{owner} never started waiting on {key}"
    );
    h
}

/// The state letter of a process (`T` when stopped), from /proc.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A process held with SIGSTOP, continued (SIGCONT) on drop.
struct Frozen(u32);

impl Frozen {
    fn stop(s: &Server) -> Frozen {
        let pid = s.pid();
        // SAFETY: kill(2) on the pid of a child this test started.
        let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        assert_eq!(rc, 0, "SIGSTOP to {pid}");
        let frozen = Frozen(pid);
        assert!(
            wait_until(Duration::from_secs(2), || process_state(pid) == Some('T')),
            "process {pid} did not stop: state {:?}",
            process_state(pid)
        );
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child this test started (and still
        // owns: the Server is dropped after this guard).
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// Defect: FAILOVER pauses writes while it waits for a replica to catch up;
/// a lease expiring during that pause had its waiter served anyway (a write
/// made and replicated during the pause), which killed the master. With the
/// replica frozen the failover times out and aborts: the master must stay
/// up and master, and the waiter get its token only once the failover
/// attempt is over, a token that is the stored lease, on the replica too.
fn failover_with_a_lagging_replica(kind: Kind) {
    let mut s = Server::start(kind);
    let replica = replica_of(kind, &s);
    let mut c = s.conn();
    let acquired = Instant::now();
    acquire(&mut c, "pk", "holder", "500");
    let w = spawn_waiter(&s, "pk", "waiter", "60000", "8000");
    let frozen = Frozen::stop(&replica);
    assert_eq!(ok(&mut c, &["SET", "pad", "x"]), Value::Okay);
    let mut admin = s.conn();
    let failover_at = Instant::now();
    let started = call(&mut admin, &[b"FAILOVER", b"TIMEOUT", b"2000"]);
    assert!(
        failover_at - acquired < Duration::from_millis(450),
        "setup too slow ({:?}): the 500 ms lease may have expired before FAILOVER",
        failover_at - acquired
    );
    match started {
        Ok(Value::Okay) => {}
        other => panic!("FAILOVER TIMEOUT 2000 did not start: {other:?}"),
    }
    let state = replication_field(&mut admin, "master_failover_state");
    assert_eq!(
        state.as_deref(),
        Some("waiting-for-sync"),
        "FAILOVER is not waiting for the frozen replica"
    );

    let (reply, at) = w.join().unwrap();
    assert_alive(
        &mut s,
        "a waiter whose holder expired during FAILOVER",
        reply.is_err(),
    );
    let waited = at - failover_at;
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the waiter should get a token, got {other:?} after {waited:?}"),
    };
    assert!(
        waited >= Duration::from_millis(1500),
        "the waiter was served {waited:?} after FAILOVER TIMEOUT 2000: while writes were paused"
    );
    assert!(
        waited < Duration::from_millis(5000),
        "the waiter was served only {waited:?} after FAILOVER began"
    );
    let mut c = s.conn();
    assert_eq!(
        replication_field(&mut c, "master_failover_state").as_deref(),
        Some("no-failover"),
        "the failover attempt has not ended"
    );
    assert_eq!(
        token_of(&mut c, "pk"),
        Some(t),
        "the token the waiter got is not the stored lease"
    );
    assert_eq!(
        ok(&mut c, &["LEASE.RENEW", "pk", "waiter", "60000"]),
        Value::Int(1),
        "the waiter does not hold the lease"
    );
    assert_eq!(
        replication_field(&mut c, "role").as_deref(),
        Some("master"),
        "the master gave up its role"
    );
    match ok(&mut c, &["ROLE"]) {
        Value::Array(a) => assert_eq!(
            a.first(),
            Some(&Value::BulkString(b"master".to_vec())),
            "ROLE: {a:?}"
        ),
        other => panic!("ROLE: {other:?}"),
    }

    drop(frozen);
    let mut rc = replica.conn();
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            seen = token_of(&mut rc, "pk");
            seen == Some(t)
        }),
        "the replica holds {seen:?}, the waiter got {t}"
    );
    assert_eq!(
        replication_field(&mut rc, "role").as_deref(),
        Some("slave"),
        "the replica changed role"
    );
    assert_alive(&mut s, "after the aborted failover", false);
}

both! {
    fn command_getkeys_of_a_deep_nest_keeps_the_server_up(kind) {
        command_getkeys_of_a_deep_nest(kind);
    }

    fn acl_key_check_of_a_deep_nest_keeps_the_server_up(kind) {
        acl_key_check_of_a_deep_nest(kind);
    }

    fn cluster_routing_of_a_deep_nest_keeps_the_server_up(kind) {
        cluster_routing_of_a_deep_nest(kind);
    }

    fn failover_with_a_lagging_replica_keeps_the_master_up(kind) {
        failover_with_a_lagging_replica(kind);
    }
}
