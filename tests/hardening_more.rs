//! Regression tests for two ways the module killed the server: a deeply
//! nested LEASE.FENCE whose key listing recursed once per level until the
//! stack overflowed (COMMAND GETKEYS, an ACL user limited by key patterns,
//! cluster routing), and a waiter served while FAILOVER paused writes to
//! wait for a lagging replica.
mod common;
use common::*;

use std::time::{Duration, Instant};

/// How deep the nested LEASE.FENCE goes: far beyond any stack when each
/// level costs a recursion.
const DEPTH: usize = 10_000;

/// `LEASE.FENCE k <token>` `depth` times, then `SET x y`.
fn nest(depth: usize, token: &str) -> Vec<String> {
    let mut args = Vec::with_capacity(3 * depth + 3);
    for _ in 0..depth {
        args.extend(["LEASE.FENCE", "k", token].map(String::from));
    }
    args.extend(["SET", "x", "y"].map(String::from));
    args
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

/// One field of `INFO replication`.
fn replication_field(c: &mut redis::Connection, name: &str) -> Option<String> {
    info_value(c, "replication", name)
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
    let reply = call_args(&mut c, &args);
    let lost = matches!(&reply, Err(e) if e.code().is_none());
    s.assert_alive("COMMAND GETKEYS of a 10,000-deep LEASE.FENCE", lost);
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
        call_args(&mut c, &nest(2, &t)),
        "LEASE.FENCE k t LEASE.FENCE k t SET x y",
    );
    assert!(
        e.contains("lease commands cannot be fenced"),
        "the nested fence was refused with {e:?}"
    );
    assert_eq!(ok(&mut c, &["EXISTS", "x"]), Value::Int(0), "x was set");
    assert_eq!(token_of(&mut c, "k"), Some(t.parse().unwrap()));
    s.assert_alive("after the nested fences", false);
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
    let whoami = ok_text(&mut c, &["ACL", "WHOAMI"]);
    assert_eq!(whoami, "limited");
    let reply = call_args(&mut c, &nest(DEPTH, &t));
    let lost = matches!(&reply, Err(e) if e.code().is_none());
    s.assert_alive(
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
    s.assert_alive("after the key-limited user's nest", false);
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
        wait_until(Duration::from_secs(8), || ok_text(
            &mut c,
            &["CLUSTER", "INFO"]
        )
        .contains("cluster_state:ok")),
        "the single-node cluster never became ok:\n{}",
        ok_text(&mut c, &["CLUSTER", "INFO"])
    );
    let t = acquire(&mut c, "k", "me", "60000").to_string();
    let reply = call_args(&mut c, &nest(DEPTH, &t));
    let lost = matches!(&reply, Err(e) if e.code().is_none());
    s.assert_alive("a 10,000-deep LEASE.FENCE in cluster mode", lost);
    let e = server_error(reply, "a 10,000-deep LEASE.FENCE in cluster mode");
    assert!(
        e.contains("lease commands cannot be fenced"),
        "the nested fence was refused with {e:?}"
    );
    assert_eq!(ping(&mut c), "PONG");
    assert_eq!(ok(&mut c, &["EXISTS", "x"]), Value::Int(0), "x was set");
    s.assert_alive("after the nest in cluster mode", false);
}

// ---------------------------------------------------------------------------
// 2. FAILOVER with a lagging replica

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

    let t = token_after_pause(
        &mut s,
        w,
        "FAILOVER TIMEOUT 2000",
        failover_at,
        Duration::from_millis(1500),
        Duration::from_millis(5000),
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
    assert_replica_token(&replica, "pk", t);
    let mut rc = replica.conn();
    assert_eq!(
        replication_field(&mut rc, "role").as_deref(),
        Some("slave"),
        "the replica changed role"
    );
    s.assert_alive("after the aborted failover", false);
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
