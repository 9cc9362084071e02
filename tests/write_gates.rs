//! Writes the module makes on its own (a waiter served when a lease ends)
//! face the same gates as a client's: none while `CLIENT PAUSE ... WRITE`
//! holds writes off (with a replica, with the AOF), while
//! `min-replicas-to-write` is unmet, or while FAILOVER waits for a lagging
//! replica; none on a slot that moved away (the waiter is redirected).
//! Once a gate opens the waiter is served, with a token that is the stored
//! lease, on the replica too.
mod common;
use common::*;

use std::thread;
use std::time::{Duration, Instant};

/// One field of `INFO replication`.
fn replication_field(c: &mut redis::Connection, name: &str) -> Option<String> {
    info_value(c, "replication", name)
}

/// Joins waiter `w` of a lease that expired while `what` (a write pause,
/// begun at `since`) held writes off: the server must be alive, and the
/// waiter answered a token no earlier than `earliest` (the pause) and before
/// `latest` after `since`. Returns the token.
fn token_after_pause(
    s: &mut Server,
    w: Answer,
    what: &str,
    since: Instant,
    earliest: Duration,
    latest: Duration,
) -> i64 {
    let (reply, at) = w.join().unwrap();
    s.assert_alive(
        &format!("a waiter whose holder expired during {what}"),
        reply.is_err(),
    );
    let waited = at - since;
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the waiter should get a token, got {other:?} after {waited:?}"),
    };
    assert!(
        waited >= earliest,
        "the waiter was served {waited:?} after {what}: while writes were paused"
    );
    assert!(
        waited < latest,
        "the waiter was served only {waited:?} after {what} began"
    );
    t
}

/// Waits (up to 5 s) until `replica` shows token `t` on `key`, the token a
/// waiter was given on its master.
fn assert_replica_token(replica: &Server, key: &str, t: i64) {
    let mut rc = replica.conn();
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            seen = token_of(&mut rc, key);
            seen == Some(t)
        }),
        "the replica holds {seen:?}, the waiter got {t}"
    );
}

/// The waiter of a lease that expires while `CLIENT PAUSE ... WRITE` holds
/// every write off is served only once the pause ends, with a token that is the
/// stored lease, on the replica too. (Served during the pause, its new lease
/// written, replicated and appended to the AOF, Redis 7.0 aborted on a db.c
/// assertion, Valkey aborted with a replica or the AOF attached, and plain
/// Valkey answered a token it never stored.)
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
    let t = token_after_pause(
        &mut s,
        w,
        "CLIENT PAUSE 2000 WRITE",
        paused,
        Duration::from_millis(1900),
        Duration::from_millis(4000),
    );
    assert_eq!(
        token_of(&mut c, "pk"),
        Some(t),
        "the token the waiter got is not the stored lease"
    );
    if let Some(r) = replica {
        assert_replica_token(&r, "pk", t);
    }
    s.assert_alive("after the pause", false);
}

full_suite! {
    // No replica, no AOF.
    fn waiter_waits_out_a_write_pause_plain(kind) {
        waiter_waits_out_a_write_pause(kind, Opts::default(), false);
    }

    // A replica attached.
    fn waiter_waits_out_a_write_pause_with_a_replica(kind) {
        waiter_waits_out_a_write_pause(kind, Opts::default(), true);
    }

    // The AOF on.
    fn waiter_waits_out_a_write_pause_with_aof(kind) {
        waiter_waits_out_a_write_pause(kind, Opts::default().extra(&["--appendonly", "yes"]), false);
    }

    // While `min-replicas-to-write` is unmet every write is refused with
    // NOREPLICAS, and the waiter of an expiring lease is not served either (no
    // new lease written by the timer); once writes are accepted again it is
    // served promptly.
    fn min_replicas_to_write_holds_the_waiter(kind) {
        let mut s = Server::start(kind);
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
            s.assert_alive(
                "a waiter whose holder expired while writes are refused",
                reply.is_err(),
            );
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

    // FAILOVER pauses writes while it waits for a replica to catch up, and a
    // lease expiring during that pause does not have its waiter served then (a
    // write made and replicated during the pause killed the master). With the
    // replica frozen the failover times out and aborts: the master stays up and
    // master, and the waiter gets its token only once the failover attempt is
    // over, a token that is the stored lease, on the replica too.
    fn failover_with_a_lagging_replica_keeps_the_master_up(kind) {
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

    // A waiter queued on a master whose key's slot migrates away is redirected
    // (ASK/MOVED to the new master): the old master grants no lease of a key it
    // no longer owns (the moved lease is still held there: two holders), and
    // the moved lease keeps its token.
    fn waiter_is_redirected_when_the_slot_moves_away(kind) {
        let mut cluster = Cluster::start(kind, 3, 0);
        let slot = cluster.slot_of("k");
        let masters = cluster.masters();
        assert_eq!(masters.len(), 3, "three masters");
        let Master {
            id: a_id,
            port: a_port,
            ..
        } = masters
            .iter()
            .find(|m| m.serves(slot))
            .cloned()
            .expect("an owner of k's slot");
        let Master {
            id: b_id,
            port: b_port,
            ..
        } = masters.iter().find(|m| m.id != a_id).cloned().unwrap();
        let a_server = cluster.node_by_port(a_port);
        let mut a = a_server.conn();
        let mut b = cluster.node_by_port(b_port).conn();

        let t0 = acquire(&mut a, "k", "h", "10000");
        let w = spawn_waiter(a_server, "k", "w", "10000", "8000");
        let acquired = info_int(&mut a, "lease_acquired");
        let slot_s = slot.to_string();
        ok(&mut b, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &a_id]);
        ok(&mut a, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &b_id]);
        let migrate = [
            "MIGRATE",
            "127.0.0.1",
            &b_port.to_string(),
            "k",
            "0",
            "5000",
        ];
        match call_args(&mut a, &migrate) {
            Ok(v) => assert_eq!(v, Value::Okay, "{migrate:?}"),
            Err(e) => {
                cluster.assert_all_alive(&format!("{migrate:?} answered {e}"));
                panic!("{migrate:?} failed: {e}");
            }
        }
        let moved = Instant::now();

        let (reply, at) = w.join().unwrap();
        let e = match reply {
            Err(e) if e.code().is_some() => error_text(&e),
            Ok(v) => panic!(
                "the waiter got {v:?} from the old master after its slot moved (the moved lease, token {t0}, is still held)"
            ),
            Err(e) => {
                cluster.assert_all_alive(&format!("the waiter lost its connection ({e})"));
                panic!("the waiter lost its connection: {e}")
            }
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
}
