//! design.md S10: `LEASE.MACQUIRE`, `LEASE.MRENEW`, `LEASE.MRELEASE` on
//! every server. Every key or none, with one token; an idempotent retry;
//! errors (in S10's order) that change nothing; each key an ordinary
//! exclusive lease afterwards; key specs (GETKEYS, ACL patterns, CROSSSLOT);
//! counters and events per key; one exact effect per key on replicas and in
//! the AOF; the grace; BLOCK in strict arrival order with single-key
//! waiters, timeouts, disconnects and the write gates; and the dining
//! philosophers, checked from the workers' own records.
mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn macquire(c: &mut redis::Connection, keys: &[&str], owner: &str, ttl: &str) -> Value {
    let n = keys.len().to_string();
    let mut args = vec!["LEASE.MACQUIRE", n.as_str()];
    args.extend_from_slice(keys);
    args.extend_from_slice(&[owner, ttl]);
    ok(c, &args)
}

fn multi(c: &mut redis::Connection, cmd: &str, keys: &[&str], tail: &[&str]) -> Value {
    let n = keys.len().to_string();
    let mut args = vec![cmd, n.as_str()];
    args.extend_from_slice(keys);
    args.extend_from_slice(tail);
    ok(c, &args)
}

/// How often the module asked the server whether it may write
/// (`LEASE.GATE` in `INFO commandstats`).
fn gate_calls(c: &mut redis::Connection) -> i64 {
    let stats = ok_text(c, &["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| {
            l.to_lowercase()
                .strip_prefix("cmdstat_lease.gate:")
                .map(str::to_string)
        })
        .and_then(|l| {
            l.split(',')
                .find_map(|f| f.strip_prefix("calls=").and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn lease_keys(c: &mut redis::Connection) -> i64 {
    int(&ok(c, &["DBSIZE"]))
}

/// Starts `LEASE.MACQUIRE ... BLOCK timeout` on its own connection and
/// thread, and waits (up to 5 s) until the server counts one more waiter.
fn spawn_mwaiter(s: &Server, keys: &[&str], owner: &str, ttl: &str, timeout: &str) -> Answer {
    let mut args: Vec<String> = vec!["LEASE.MACQUIRE".into(), keys.len().to_string()];
    args.extend(keys.iter().map(|k| k.to_string()));
    args.extend([owner, ttl, "BLOCK", timeout].iter().map(|a| a.to_string()));
    spawn_blocked(s, &args, owner)
}

fn spawn_single(s: &Server, key: &str, owner: &str, timeout: &str) -> Answer {
    spawn_waiter(s, key, owner, "60000", timeout)
}

/// A philosopher's meal as it recorded it: (worker, forks, from, to), from
/// the reply's arrival to the release's send, on the worker's own clock.
type Meal = (usize, [usize; 2], Instant, Instant);

/// A random worker's holding: (worker, keys, from, to) on its own clock.
type Holding = (usize, Vec<usize>, Instant, Instant);

/// A waiter that has not been answered yet (it stays blocked for `for_ms`).
fn still_waiting(h: &Answer, for_ms: u64) -> bool {
    thread::sleep(Duration::from_millis(for_ms));
    !h.is_finished()
}

every_server! {
    fn every_key_or_none_with_one_token(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&macquire(&mut c, &["a", "b", "c"], "me", "30000"));
        for k in ["a", "b", "c"] {
            assert_eq!(token_of(&mut c, k), Some(t), "{k}");
            assert!(pttl(&mut c, k) > 29_000);
        }
        assert_eq!(info_int(&mut c, "lease_acquired"), 3, "successes count keys");
        // One key taken by another owner: nothing is taken, and the
        // refusal is counted once.
        acquire(&mut c, "y", "other", "30000");
        assert_eq!(macquire(&mut c, &["x", "y", "z"], "me", "30000"), Value::Nil);
        assert!(!exists(&mut c, "x") && !exists(&mut c, "z"));
        assert_eq!(info_int(&mut c, "lease_contended"), 1);
        assert_eq!(info_int(&mut c, "lease_acquired"), 4);
        // The same call again is a retry: the same token, deadlines reset;
        // so is a retry for some of the keys.
        thread::sleep(Duration::from_millis(20));
        assert_eq!(int(&macquire(&mut c, &["a", "b", "c"], "me", "45000")), t);
        assert!(pttl(&mut c, "c") > 44_000);
        assert_eq!(int(&macquire(&mut c, &["c", "a"], "me", "45000")), t);
        assert_eq!(info_int(&mut c, "lease_reacquired"), 5);
        // MRENEW and MRELEASE act on every key, by the holder only.
        assert_eq!(int(&multi(&mut c, "LEASE.MRENEW", &["a", "b", "c"], &["other", "1000"])), 0);
        assert_eq!(int(&multi(&mut c, "LEASE.MRENEW", &["a", "b", "c"], &["me", "50000"])), 3);
        assert!(pttl(&mut c, "b") > 49_000);
        assert_eq!(info_int(&mut c, "lease_renewed"), 3);
        assert_eq!(int(&multi(&mut c, "LEASE.MRELEASE", &["a", "b", "c"], &["other"])), 0);
        assert_eq!(int(&multi(&mut c, "LEASE.MRELEASE", &["a", "b", "c"], &["me"])), 3);
        assert_eq!(info_int(&mut c, "lease_released"), 3);
        assert_eq!(info_int(&mut c, "lease_renew_failed"), 1, "failures count calls");
        assert_eq!(info_int(&mut c, "lease_release_failed"), 1);
        assert_eq!(lease_keys(&mut c), 1, "only y is left");
        // A new acquire of the same keys: a new token.
        assert!(int(&macquire(&mut c, &["a", "b"], "me", "1000")) > t);
    }

    fn each_key_is_an_ordinary_lease_afterwards(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&macquire(&mut c, &["a", "b", "c"], "me", "300")).to_string();
        for k in ["a", "b", "c"] {
            assert_eq!(ok(&mut c, &["LEASE.FENCE", k, &t, "SET", &format!("{k}:data"), "v"]), Value::Okay);
        }
        // RENEW and RELEASE on one key alone.
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "a", "me", "60000"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "b", "me"])), 1);
        assert!(!exists(&mut c, "b"));
        // The keys now differ: MRENEW and MRELEASE of all three change
        // nothing; a retry of MACQUIRE on all three is an error naming b.
        assert_eq!(int(&multi(&mut c, "LEASE.MRENEW", &["a", "b", "c"], &["me", "60000"])), 0);
        let e = err(&mut c, &["LEASE.MACQUIRE", "3", "a", "b", "c", "me", "60000"]);
        assert!(e.contains("holds some of the keys but not 'b'"), "{e}");
        assert!(!exists(&mut c, "b"), "the error took nothing");
        // Each key expires at its own deadline.
        assert!(wait_until(Duration::from_secs(3), || !exists(&mut c, "c")));
        assert_eq!(token_of(&mut c, "a").map(|x| x.to_string()), Some(t.clone()));
        let e = err(&mut c, &["LEASE.FENCE", "c", &t, "SET", "c:data", "late"]);
        assert!(e.starts_with("STALE"), "{e}");
    }

    fn replicas_and_the_aof_get_one_exact_effect_per_key(kind) {
        let aof = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let master = Server::start_with(kind, aof.clone());
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let t = int(&macquire(&mut m, &["a", "b", "c"], "me", "60000"));
        acquire(&mut m, "d", "x", "60000");
        assert_eq!(int(&multi(&mut m, "LEASE.MRELEASE", &["c"], &["me"])), 1);
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        let mut r = replica.conn();
        assert_eq!(token_of(&mut r, "a"), Some(t));
        assert_eq!(token_of(&mut r, "b"), Some(t));
        assert!(!exists(&mut r, "c"));
        // The replica's keys end where the master's do.
        assert!((pttl(&mut r, "a") - pttl(&mut m, "a")).abs() < 1000);
        drop(replica);
        let master = master.restart_with(aof);
        let mut m = master.conn();
        assert_eq!(token_of(&mut m, "a"), Some(t));
        assert_eq!(token_of(&mut m, "b"), Some(t));
        assert!(!exists(&mut m, "c"));
        assert_eq!(int(&multi(&mut m, "LEASE.MRELEASE", &["a", "b"], &["me"])), 2);
    }
}

full_suite! {
    fn a_thousand_keys_and_the_memory_gate(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let names: Vec<String> = (0..1000).map(|i| format!("{{big}}:{i}")).collect();
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        let t = int(&macquire(&mut c, &keys, "me", "30000"));
        assert_eq!(lease_keys(&mut c), 1000);
        assert_eq!(token_of(&mut c, "{big}:999"), Some(t));
        assert_eq!(int(&multi(&mut c, "LEASE.MRENEW", &keys, &["me", "30000"])), 1000);
        // Over maxmemory, MACQUIRE is refused (deny-oom); MRENEW and
        // MRELEASE still work, so a holder can always keep and give back
        // its keys.
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
        let e = err(&mut c, &["LEASE.MACQUIRE", "2", "x", "y", "me", "1000"]);
        assert!(e.starts_with("OOM"), "{e}");
        assert_eq!(int(&multi(&mut c, "LEASE.MRENEW", &keys[..2], &["me", "30000"])), 2);
        assert_eq!(int(&multi(&mut c, "LEASE.MRELEASE", &keys, &["me"])), 1000);
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
        assert_eq!(lease_keys(&mut c), 0);
    }

    fn a_waiter_on_a_thousand_keys_costs_work_linear_in_its_keys(kind) {
        // One waiter queued on 1,000 keys, one of them held. A non-blocking
        // MACQUIRE of the same keys, a second waiter, the first waiter's
        // timeout with the second behind it, and the release that serves
        // the second: each opens every key past the write gate at most a
        // few times, not once per free key (10^6 gate calls froze the
        // server for half a second).
        let s = Server::start(kind);
        let mut c = s.conn();
        let names: Vec<String> = (0..1000).map(|i| format!("{{big}}:{i}")).collect();
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        acquire(&mut c, keys[0], "h", "60000");
        let first = spawn_mwaiter(&s, &keys, "w1", "60000", "1500");
        let before = gate_calls(&mut c);
        let t0 = Instant::now();
        assert_eq!(macquire(&mut c, &keys, "x", "60000"), Value::Nil);
        let took = t0.elapsed();
        let second = spawn_mwaiter(&s, &keys, "w2", "60000", "10000");
        let (r, _) = first.join().unwrap();
        assert_eq!(r.unwrap(), Value::Nil, "the first waiter timed out");
        assert!(still_waiting(&second, 50), "the second waits: key 0 is held");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", keys[0], "h"])), 1);
        let t = got_token(second);
        for k in [keys[0], keys[500], keys[999]] {
            assert_eq!(token_of(&mut c, k), Some(t), "{k}");
        }
        let gates = gate_calls(&mut c) - before;
        println!("{kind:?}: non-blocking MACQUIRE of 1000 waited-for keys took {took:?}; {gates} gate calls in all");
        assert!(gates <= 5 * 1000, "{gates} gate calls for 1000 keys");
    }

    fn a_queued_retry_of_the_same_owner_gets_the_same_token(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "a", "h", "60000");
        // A client whose first wait's reply was lost waits again with the
        // same owner: both are answered with the one token.
        let first = spawn_mwaiter(&s, &["a", "b"], "w", "60000", "5000");
        let retry = spawn_mwaiter(&s, &["a", "b"], "w", "60000", "5000");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "a", "h"])), 1);
        let t = got_token(first);
        assert_eq!(got_token(retry), t);
        assert_eq!(token_of(&mut c, "b"), Some(t));
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
    }

    fn errors_come_in_order_and_change_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let cases: &[(&[&str], &str)] = &[
            (&["LEASE.MACQUIRE", "0", "a", "me", "100"], "numkeys is out of range (must be 1..1000)"),
            (&["LEASE.MACQUIRE", "1001", "a", "me", "100"], "numkeys is out of range"),
            (&["LEASE.MACQUIRE", "two", "a", "b", "me", "100"], "numkeys is not an integer"),
            (&["LEASE.MACQUIRE", "3", "a", "b", "me", "100"], "numkeys (3) does not match the number of keys given (2)"),
            (&["LEASE.MACQUIRE", "2", "a", "a", "me", "100"], "key 'a' is given more than once"),
            (&["LEASE.MACQUIRE", "2", "a", "b", "", "100"], "owner must not be empty"),
            (&["LEASE.MACQUIRE", "2", "a", "b", "me", "0"], "ttl-ms is out of range"),
            (&["LEASE.MACQUIRE", "2", "a", "b", "me", "100", "NX"], "unknown option 'NX'"),
            (&["LEASE.MACQUIRE", "2", "a", "b", "me", "100", "SHARED"], "unknown option 'SHARED'"),
            (&["LEASE.MACQUIRE", "2", "a", "b", "me", "100", "FLOOR", "5"], "unknown option 'FLOOR'"),
            (&["LEASE.MACQUIRE", "2", "a", "b", "me", "100", "BLOCK"], "option BLOCK needs a value"),
            (&["LEASE.MACQUIRE", "1", "a", "me"], "wrong number of arguments"),
            (&["LEASE.MRENEW", "2", "a", "b", "c", "me", "100"], "numkeys (2) does not match the number of keys given (3)"),
            (&["LEASE.MRELEASE", "1", "a", "b", "me"], "numkeys (1) does not match the number of keys given (2)"),
            (&["LEASE.MRELEASE", "2", "a", "b"], "numkeys (2) does not match the number of keys given (1)"),
        ];
        for (args, want) in cases {
            let e = err(&mut c, args);
            assert!(e.contains(want), "{args:?}: {e}");
        }
        assert_eq!(lease_keys(&mut c), 0, "no error took anything");
        // WRONGTYPE comes first, before a key held by another owner.
        acquire(&mut c, "held", "other", "60000");
        ok(&mut c, &["SET", "str", "v"]);
        let e = err(&mut c, &["LEASE.MACQUIRE", "3", "held", "str", "free", "me", "100"]);
        assert!(e.starts_with("WRONGTYPE"), "{e}");
        let e = err(&mut c, &["LEASE.MRELEASE", "1", "str", "me"]);
        assert!(e.starts_with("WRONGTYPE"), "{e}");
        // The owner's own holdings: some but not all, two tokens, or a
        // counting lease: an error naming a key, even when another key is
        // taken (a caller never waits holding part of its keys).
        acquire(&mut c, "m1", "me", "60000");
        let e = err(&mut c, &["LEASE.MACQUIRE", "3", "m1", "held", "free", "me", "100", "BLOCK", "0"]);
        assert!(e.contains("holds some of the keys but not 'held'"), "{e}");
        acquire(&mut c, "m2", "me", "60000");
        let e = err(&mut c, &["LEASE.MACQUIRE", "2", "m1", "m2", "me", "100"]);
        assert!(e.contains("more than one token ('m2' has another)"), "{e}");
        ok(&mut c, &["LEASE.ACQUIRE", "pool", "me", "60000", "LIMIT", "3"]);
        let e = err(&mut c, &["LEASE.MACQUIRE", "2", "free", "pool", "me", "100"]);
        assert!(e.contains("holds 'pool' with a counting or shared lease"), "{e}");
        // A counting lease of others is a taken key: null.
        assert_eq!(macquire(&mut c, &["free", "pool"], "you", "100"), Value::Nil);
        assert!(!exists(&mut c, "free"));
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
    }

    fn keys_are_declared_for_getkeys_acl_and_redaction(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let keys = strings(&ok(&mut c, &["COMMAND", "GETKEYS", "LEASE.MACQUIRE", "3", "x", "y", "z", "me", "100", "BLOCK", "5"]));
        assert_eq!(keys, ["x", "y", "z"]);
        let keys = strings(&ok(&mut c, &["COMMAND", "GETKEYS", "LEASE.MRELEASE", "2", "x", "y", "me"]));
        assert_eq!(keys, ["x", "y"]);
        let keys = strings(&ok(&mut c, &["COMMAND", "GETKEYS", "LEASE.MRENEW", "1", "x", "me", "5"]));
        assert_eq!(keys, ["x"]);
        assert!(command_flags(&mut c, "LEASE.MACQUIRE").contains(&"movablekeys".to_string()));
        // ACL key patterns apply to every key.
        ok(&mut c, &["ACL", "SETUSER", "acct", "on", ">pw", "~acct:*", "+@all"]);
        let mut u = s.conn();
        ok(&mut u, &["AUTH", "acct", "pw"]);
        assert!(int(&macquire(&mut u, &["acct:1", "acct:2"], "me", "1000")) > 0);
        let e = err(&mut u, &["LEASE.MACQUIRE", "2", "acct:3", "other:1", "me", "1000"]);
        assert!(e.starts_with("NOPERM"), "{e}");
        assert!(!exists(&mut c, "acct:3"));
        // The owner id is redacted from SLOWLOG wherever numkeys puts it.
        ok(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        ok(&mut c, &["SLOWLOG", "RESET"]);
        macquire(&mut c, &["s1", "s2"], "sekrit", "1000");
        let log = format!("{:?}", ok(&mut c, &["SLOWLOG", "GET", "10"]));
        assert!(!log.contains("sekrit"), "{log}");
        assert!(log.contains("s2"), "{log}");
    }

    fn events_per_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
        let mut sub = s.conn();
        let mut ps = sub.as_pubsub();
        ps.psubscribe("__keyevent@0__:lease.*").unwrap();
        ps.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        macquire(&mut c, &["a", "b"], "me", "60000");
        multi(&mut c, "LEASE.MRELEASE", &["a", "b"], &["me"]);
        let mut got = Vec::new();
        for _ in 0..4 {
            let m = ps.get_message().unwrap();
            got.push((m.get_channel_name().to_string(), m.get_payload::<String>().unwrap()));
        }
        let want: Vec<(String, String)> = [("lease.acquire", "a"), ("lease.acquire", "b"), ("lease.release", "a"), ("lease.release", "b")]
            .iter()
            .map(|(e, k)| (format!("__keyevent@0__:{e}"), k.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    fn the_grace_holds_new_multi_key_leases(kind) {
        let s = Server::start_with(kind, common::grace::grace("1500"));
        let mut c = s.conn();
        assert_eq!(macquire(&mut c, &["a", "b"], "me", "1000"), Value::Nil);
        assert_eq!(info_int(&mut c, "lease_grace_refused"), 1);
        let h = spawn_mwaiter(&s, &["a", "b"], "me", "1000", "5000");
        let (token, at) = {
            let (r, at) = h.join().unwrap();
            (int(&r.expect("token")), at)
        };
        assert!(token > 0);
        assert_eq!(common::grace::remaining(&mut c), 0, "served once the grace was over ({at:?})");
        assert_eq!(token_of(&mut c, "b"), Some(token));
    }

    fn block_keeps_strict_arrival_order_with_single_key_waiters(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "a", "h", "60000");
        // W1 waits for a and b; W2 then for b alone. b is free, but W1 came
        // first: W2 waits, and so is a newcomer refused.
        let w1 = spawn_mwaiter(&s, &["a", "b"], "w1", "60000", "10000");
        let w2 = spawn_single(&s, "b", "w2", "10000");
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "b", "new", "1000"]), Value::Nil);
        assert_eq!(macquire(&mut c, &["b", "z"], "new", "1000"), Value::Nil);
        assert!(!exists(&mut c, "b") && !exists(&mut c, "z"));
        assert!(still_waiting(&w1, 50) && !w2.is_finished());
        assert_eq!(info_int(&mut c, "lease_waiters"), 2, "clients, not keys");
        assert_eq!(waiters(&mut c, "a"), 1, "LEASE.INFO counts the multi-key waiter");
        // a frees: W1 takes both, with one token; W2 still waits.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "a", "h"])), 1);
        let t1 = got_token(w1);
        assert_eq!(token_of(&mut c, "a"), Some(t1));
        assert_eq!(token_of(&mut c, "b"), Some(t1));
        assert_eq!(waiters(&mut c, "b"), 1);
        assert!(still_waiting(&w2, 50));
        // W1 releases: W2 gets b.
        assert_eq!(int(&multi(&mut c, "LEASE.MRELEASE", &["a", "b"], &["w1"])), 2);
        let t2 = got_token(w2);
        assert!(t2 > t1);
        assert_eq!(token_of(&mut c, "b"), Some(t2));
        assert!(!exists(&mut c, "a"));
    }

    fn a_multi_key_waiter_is_served_when_its_last_key_frees(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "a", "h1", "60000");
        acquire(&mut c, "b", "h2", "250");
        let w = spawn_mwaiter(&s, &["a", "b", "c"], "w", "60000", "10000");
        // b expires: still a to go, nothing is taken.
        assert!(wait_until(Duration::from_secs(3), || !exists(&mut c, "b")));
        assert!(still_waiting(&w, 50));
        assert!(!exists(&mut c, "b") && !exists(&mut c, "c"));
        ok(&mut c, &["DEL", "a"]);
        let t = got_token(w);
        for k in ["a", "b", "c"] {
            assert_eq!(token_of(&mut c, k), Some(t), "{k}");
        }
    }

    fn timeouts_and_disconnects_leave_every_queue(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "a", "h", "60000");
        let started = Instant::now();
        let w = spawn_mwaiter(&s, &["a", "b"], "w", "60000", "200");
        let (r, at) = w.join().unwrap();
        assert_eq!(r.unwrap(), Value::Nil);
        assert!(at - started >= Duration::from_millis(200), "a wait is never shorter than its BLOCK");
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
        assert_eq!(info_int(&mut c, "lease_wait_timeouts"), 1);
        assert!(!exists(&mut c, "b"));
        // A waiter that disconnects leaves its queues: the single-key
        // waiter behind it on b is served at once.
        let _blocked = spawn_mwaiter(&s, &["a", "b"], "gone", "60000", "0");
        let w2 = spawn_single(&s, "b", "w2", "5000");
        assert!(still_waiting(&w2, 50));
        let list = ok_text(&mut c, &["CLIENT", "LIST"]);
        let id = list
            .lines()
            .find(|l| l.to_lowercase().contains("cmd=lease.macquire"))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .expect("the blocked client")
            .to_string();
        ok(&mut c, &["CLIENT", "KILL", "ID", &id]);
        let t = got_token(w2);
        assert_eq!(token_of(&mut c, "b"), Some(t));
        assert!(token_of(&mut c, "a").is_some(), "a is still h's");
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
    }

    fn a_hand_off_waits_for_paused_writes(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "a", "h", "1000");
        let w = spawn_mwaiter(&s, &["a", "b"], "w", "60000", "5000");
        // The lease ends while writes are paused: the hand-off waits for
        // the pause to end.
        let left = pttl(&mut c, "a");
        let paused = Instant::now();
        ok(&mut c, &["CLIENT", "PAUSE", "1500", "WRITE"]);
        assert!(left > 100, "the lease ended before the pause began ({left} ms left)");
        let (r, at) = w.join().unwrap();
        assert!(int(&r.expect("token")) > 0);
        assert!(at - paused >= Duration::from_millis(1400), "served {:?} after the pause began", at - paused);
    }

    fn dining_philosophers_all_eat_and_never_share_a_fork(kind) {
        const N: usize = 5;
        let s = Server::start(kind);
        let stop = Arc::new(AtomicBool::new(false));
        let records: Arc<Mutex<Vec<Meal>>> = Arc::default();
        let workers: Vec<_> = (0..N)
            .map(|i| {
                let (stop, records) = (stop.clone(), records.clone());
                let mut c = s.conn();
                thread::spawn(move || {
                    let forks = [i, (i + 1) % N];
                    let names = forks.map(|f| format!("fork:{f}"));
                    let owner = format!("phil{i}");
                    let mut meals = 0;
                    for _ in 0..100_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let r = ok(&mut c, &["LEASE.MACQUIRE", "2", &names[0], &names[1], &owner, "5000", "BLOCK", "3000"]);
                        let Value::Int(token) = r else { panic!("phil{i} went hungry for 3 s: {r:?}") };
                        let from = Instant::now();
                        // Eat: a write fenced with the token on each fork.
                        for n in &names {
                            let t = token.to_string();
                            ok(&mut c, &["LEASE.FENCE", n, &t, "INCR", &format!("{n}:meals")]);
                        }
                        thread::sleep(Duration::from_millis(2));
                        let to = Instant::now();
                        assert_eq!(int(&ok(&mut c, &["LEASE.MRELEASE", "2", &names[0], &names[1], &owner])), 2);
                        records.lock().unwrap().push((i, forks, from, to));
                        meals += 1;
                    }
                    meals
                })
            })
            .collect();
        thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let meals: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        for (i, m) in meals.iter().enumerate() {
            assert!(*m >= 20, "phil{i} ate {m} times in 3 s: {meals:?}");
        }
        let records = records.lock().unwrap();
        for (n, a) in records.iter().enumerate() {
            for b in &records[n + 1..] {
                if a.0 == b.0 || !a.1.iter().any(|f| b.1.contains(f)) {
                    continue;
                }
                assert!(a.3 <= b.2 || b.3 <= a.2, "phil{} and phil{} held a fork at once", a.0, b.0);
            }
        }
        let mut c = s.conn();
        let total: i64 = (0..N)
            .map(|f| match ok(&mut c, &["GET", &format!("fork:{f}:meals")]) {
                Value::Nil => 0,
                v => text(&v).parse::<i64>().unwrap(),
            })
            .sum();
        assert_eq!(total as usize, 2 * meals.iter().sum::<usize>(), "every fenced write landed once");
    }
}

full_suite! {
    fn a_cluster_takes_keys_of_one_slot_and_refuses_crossslot(kind) {
        let cl = Cluster::start(kind, 3, 0);
        let t = int(&cl.ok("{acct}:1", &["LEASE.MACQUIRE", "2", "{acct}:1", "{acct}:2", "me", "60000"]));
        assert_eq!(cl.token("{acct}:2"), Some(t));
        let e = cl.call("{acct}:1", &["LEASE.MACQUIRE", "2", "{acct}:3", "{other}:1", "me", "60000"]).unwrap_err();
        assert!(error_text(&e).starts_with("CROSSSLOT"), "{e:?}");
        assert_eq!(int(&cl.ok("{acct}:1", &["LEASE.MRELEASE", "2", "{acct}:1", "{acct}:2", "me"])), 2);
    }

    // A multi-key waiter on a master whose slot migrates away is
    // redirected, as a single-key waiter is: the old master grants nothing
    // of keys it no longer owns.
    fn a_multi_key_waiter_is_redirected_when_the_slot_moves_away(kind) {
        let cl = Cluster::start(kind, 3, 0);
        let slot = cl.slot_of("{k}:1");
        let masters = cl.masters();
        let a = masters.iter().find(|m| m.serves(slot)).cloned().expect("an owner");
        let b = masters.iter().find(|m| m.id != a.id).cloned().unwrap();
        let a_server = cl.node_by_port(a.port);
        let mut ac = a_server.conn();
        let mut bc = cl.node_by_port(b.port).conn();
        acquire(&mut ac, "{k}:1", "h", "10000");
        let w = spawn_mwaiter(a_server, &["{k}:1", "{k}:2"], "w", "10000", "8000");
        let acquired = info_int(&mut ac, "lease_acquired");
        let slot_s = slot.to_string();
        ok(&mut bc, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &a.id]);
        ok(&mut ac, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &b.id]);
        let port = b.port.to_string();
        assert_eq!(ok(&mut ac, &["MIGRATE", "127.0.0.1", &port, "{k}:1", "0", "5000"]), Value::Okay);
        let moved = Instant::now();
        let (reply, at) = w.join().unwrap();
        let e = error_text(&reply.expect_err("redirected, not served"));
        assert!(e.starts_with("ASK") || e.starts_with("MOVED"), "{e}");
        assert!(at - moved < Duration::from_secs(2), "redirected {:?} after the move", at - moved);
        assert_eq!(info_int(&mut ac, "lease_acquired"), acquired, "nothing granted after the move");
        assert_eq!(info_int(&mut ac, "lease_waiters"), 0);
    }

    // Single-key and multi-key workers on a few keys, at random, with
    // BLOCK, DEL and expiry mixed in: from the workers' own records no two
    // holdings of a key overlap, every blocked call is answered within its
    // timeout, and the server ends with no waiter and no lease left.
    fn mixed_random_workers_never_overlap_and_nobody_hangs(kind) {
        const KEYS: usize = 6;
        let s = Server::start(kind);
        let stop = Arc::new(AtomicBool::new(false));
        let records: Arc<Mutex<Vec<Holding>>> = Arc::default();
        let workers: Vec<_> = (0..6)
            .map(|i| {
                let (stop, records) = (stop.clone(), records.clone());
                let mut c = s.conn();
                thread::spawn(move || {
                    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ ((i as u64 + 1) * 0x1000_0001);
                    let mut next = move |n: u64| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % n) as usize
                    };
                    let (mut held, mut nulls) = (0, 0);
                    for round in 0..100_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let owner = format!("w{i}-{round}");
                        let mut keys: Vec<usize> = (0..KEYS).filter(|_| next(3) == 0).collect();
                        if keys.is_empty() {
                            keys.push(next(KEYS as u64));
                        }
                        let names: Vec<String> = keys.iter().map(|k| format!("r:{k}")).collect();
                        let ttl = (20 + next(200)).to_string();
                        let sent = Instant::now();
                        let reply = if keys.len() == 1 && next(2) == 0 {
                            ok(&mut c, &["LEASE.ACQUIRE", &names[0], &owner, &ttl, "BLOCK", "300"])
                        } else {
                            let n = names.len().to_string();
                            let mut args = vec!["LEASE.MACQUIRE", n.as_str()];
                            args.extend(names.iter().map(String::as_str));
                            args.extend([owner.as_str(), ttl.as_str(), "BLOCK", "300"]);
                            ok(&mut c, &args)
                        };
                        assert!(sent.elapsed() < Duration::from_secs(2), "a BLOCK 300 call took {:?}", sent.elapsed());
                        let Value::Int(_) = reply else {
                            nulls += 1;
                            continue;
                        };
                        let from = Instant::now();
                        thread::sleep(Duration::from_millis(next(4) as u64));
                        let to = Instant::now();
                        // Give it back one way or another: MRELEASE, one
                        // key's DEL (the others expire), or nothing (all
                        // expire). A record ends where the worker still
                        // knew the holding to be valid: at the release, or
                        // before its ttl could have run out.
                        match next(4) {
                            0 => {
                                ok(&mut c, &["DEL", &names[0]]);
                            }
                            1 => {}
                            _ => {
                                let n = names.len().to_string();
                                let mut args = vec!["LEASE.MRELEASE", n.as_str()];
                                args.extend(names.iter().map(String::as_str));
                                args.push(owner.as_str());
                                ok(&mut c, &args);
                            }
                        }
                        let ttl_end = sent + Duration::from_millis(ttl.parse::<u64>().unwrap());
                        records.lock().unwrap().push((i, keys, from, to.min(ttl_end)));
                        held += 1;
                    }
                    (held, nulls)
                })
            })
            .collect();
        thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let (held, nulls): (Vec<usize>, Vec<usize>) = workers.into_iter().map(|w| w.join().unwrap()).unzip();
        assert!(held.iter().all(|&h| h > 0), "every worker held something: {held:?}");
        let records = records.lock().unwrap();
        let multi = records.iter().filter(|r| r.1.len() > 1).count();
        eprintln!("{kind:?}: {} holdings ({multi} of several keys) by {held:?}, timed out {nulls:?}", records.len());
        for (n, a) in records.iter().enumerate() {
            for b in &records[n + 1..] {
                if !a.1.iter().any(|k| b.1.contains(k)) {
                    continue;
                }
                assert!(a.3 <= b.2 || b.3 <= a.2, "two holdings of one key at once: {a:?} {b:?}");
            }
        }
        let mut c = s.conn();
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
        assert!(wait_until(Duration::from_secs(2), || lease_keys(&mut c) == 0), "every lease ended");
    }
}
