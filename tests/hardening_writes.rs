//! Regression tests for writes the module made when it must not, or did not
//! make when it must: a waiter served during `CLIENT PAUSE WRITE`, under
//! `min-replicas-to-write`, or on a slot that moved away (two holders);
//! a RESTOREd token that exhausts the clock; the clock lost by an AOF
//! rewrite without the RDB preamble; hand-offs that waited for the old
//! deadline after RENEW, re-acquire, PEXPIRE or SWAPDB moved it.
mod common;
use common::*;

use std::thread;
use std::time::{Duration, Instant};

const DAY_MS: i64 = 24 * 3600 * 1000;

/// A field of `INFO persistence` as a string.
fn persistence_field(c: &mut redis::Connection, name: &str) -> String {
    info_value(c, "persistence", name)
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

// ---------------------------------------------------------------------------
// 2. A slot moving away from a master with waiters

/// Defect: a waiter queued on a master kept waiting after its key's slot
/// was migrated away, and the master then handed it a new lease of a key it
/// no longer owns, while the lease moved to the new master is still held:
/// two holders. The waiter must instead be redirected (ASK/MOVED to the new
/// master), no lease granted by the old master, and the moved lease kept.
fn a_waiter_is_redirected_when_the_slot_moves_away(kind: Kind) {
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

// ---------------------------------------------------------------------------
// 3. min-replicas-to-write

/// Defect: with `min-replicas-to-write` unmet, every write is refused with
/// NOREPLICAS, but the waiter of an expiring lease was still served (a new
/// lease written by the timer). It must wait until writes are accepted
/// again, then be served promptly.
fn waiter_is_not_served_while_min_replicas_refuses_writes(kind: Kind) {
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
        s.log_tail(20)
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
