//! Robustness (design.md S4): RESTORE of thousands of mutated DUMP payloads
//! (with a correct checksum, so the module's own loader sees them), of
//! exclusive leases (record version 1) and of counting and shared ones
//! (version 2), never crashes or corrupts the server; memory returns to its
//! baseline after 100k acquire/release/fence cycles, 100k timed-out waits
//! and 100k renewals, and after 50k cycles of holders coming and going; a
//! 10,000-deep nest of LEASE.FENCE keeps the server up (COMMAND GETKEYS, an
//! ACL user limited by key patterns, cluster routing).
mod common;
use common::*;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::thread;
use std::time::Duration;

/// A number in `0..n` (0 when `n` is 0). The mutations are drawn from
/// `StdRng`s with fixed seeds, so a failure reproduces.
fn below(rng: &mut StdRng, n: usize) -> usize {
    rng.random_range(0..n.max(1))
}

/// One random change to the module's part of a payload body (everything
/// after the RDB type byte, before the 2-byte RDB version).
fn mutate(body: &mut Vec<u8>, rng: &mut StdRng) {
    let end = body.len() - 2;
    match below(rng, 5) {
        0 => {
            let i = 1 + below(rng, end - 1);
            body[i] ^= 1 << below(rng, 8);
        }
        1 => {
            let i = 1 + below(rng, end - 1);
            body[i] = rng.random::<u8>();
        }
        2 => {
            let at = 1 + below(rng, end - 1);
            let n = 1 + below(rng, 4);
            let cut = n.min(end - at);
            body.drain(at..at + cut);
        }
        3 => {
            let at = 1 + below(rng, end - 1);
            for _ in 0..1 + below(rng, 4) {
                body.insert(at, rng.random::<u8>());
            }
        }
        _ => {
            // Truncate the module data, keep the RDB version trailer.
            let at = 1 + below(rng, end - 1);
            let trailer = body[end..].to_vec();
            body.truncate(at);
            body.extend_from_slice(&trailer);
        }
    }
}

/// RESTOREs 3000 mutations of `payload` as key `m`: none may crash the
/// server, what loads is a usable lease, most are refused. Returns how
/// many loaded.
fn restore_mutations(
    s: &mut Server,
    c: &mut redis::Connection,
    payload: &[u8],
    seed: u64,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut loaded, mut refused) = (0, 0);
    for round in 0..3000 {
        let bad = edit_payload(payload, |b| {
            for _ in 0..1 + below(&mut rng, 3) {
                mutate(b, &mut rng);
            }
        });
        match call(c, &[b"RESTORE", b"m", b"600000", &bad, b"REPLACE"]) {
            Ok(_) => {
                loaded += 1;
                // Whatever was accepted is a usable lease.
                match call(c, &[b"LEASE.INFO", b"m"]) {
                    Ok(Value::Array(_)) | Ok(Value::Nil) => {}
                    other => panic!("round {round}: restored value unusable: {other:?}"),
                }
                let _ = call(c, &[b"LEASE.ACQUIRE", b"m", b"probe", b"1000", b"SHARED"]);
                let _ = call(
                    c,
                    &[b"LEASE.ACQUIRE", b"m", b"probe", b"1000", b"LIMIT", b"3"],
                );
                let _ = call(c, &[b"LEASE.RELEASE", b"m", b"probe"]);
                ok(c, &["DEL", "m"]);
            }
            Err(e) => {
                refused += 1;
                assert!(!error_text(&e).is_empty());
            }
        }
        if round % 500 == 0 {
            assert_eq!(ok(c, &["PING"]), Value::SimpleString("PONG".into()));
        }
    }
    assert!(s.is_alive(), "the server died");
    assert!(
        refused > 2000,
        "mutations were mostly refused: {refused} refused, {loaded} loaded"
    );
    loaded
}

full_suite! {
    fn mutated_holders_record_payloads_never_crash_or_corrupt(kind) {
        let mut s = Server::start(kind);
        let mut c = s.conn();
        int(&ok(&mut c, &["LEASE.ACQUIRE", "template", "t", "60000"]));
        let template = dump_payload(&mut c, "template");
        let now = now_ms();
        let t = info_int(&mut c, "lease_last_token") as u64;
        // Uncompressed records, so the mutations hit their fields.
        let limit = module_payload(&template, &holders_record(3, &[(b"a", t + 1, now + 60_000), (b"b\0", t + 2, now + 50_000), (b"c", t + 5, now + 40_000)]));
        let readers = module_payload(&template, &holders_record(0, &[(b"r1", t + 7, now + 60_000), (b"r2", t + 9, now + 30_000)]));
        for (i, payload) in [limit, readers].iter().enumerate() {
            assert_eq!(call(&mut c, &[b"RESTORE", b"good", b"0", payload, b"REPLACE"]).unwrap(), Value::Okay);
            restore_mutations(&mut s, &mut c, payload, 0x51ed_270b_2719_9a3d + i as u64);
        }
        // A real DUMP of a multi key (the server may compress it) too.
        for o in ["x", "y"] {
            ok(&mut c, &["LEASE.ACQUIRE", "sem", o, "60000", "LIMIT", "4"]);
        }
        let real = dump_payload(&mut c, "sem");
        restore_mutations(&mut s, &mut c, &real, 0x2545_f491_4f6c_dd1d);
        assert!(field(&ok(&mut c, &["LEASE.INFO", "sem"]), "holders").is_some());
        ok(&mut c, &["DEBUG", "RELOAD"]);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 3);
    }

    fn memory_returns_to_its_baseline_with_holders_coming_and_going(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let cycles = |c: &mut redis::Connection, n: usize| {
            for round in 0..n / 1000 {
                let mut p = redis::pipe();
                for i in 0..1000 {
                    let (key, mode): (String, &[&str]) = if i % 2 == 0 { (format!("sem{}", i % 100), &["LIMIT", "500"]) } else { (format!("rd{}", i % 100), &["SHARED"]) };
                    p.cmd("LEASE.ACQUIRE").arg(&key).arg(format!("o{round}-{i}")).arg(60000).arg(mode);
                }
                let tokens: Vec<Option<i64>> = p.query(c).unwrap();
                let mut p = redis::pipe();
                for (i, t) in tokens.iter().enumerate() {
                    let key = if i % 2 == 0 { format!("sem{}", i % 100) } else { format!("rd{}", i % 100) };
                    let owner = format!("o{round}-{i}");
                    let t = t.expect("a place");
                    p.cmd("LEASE.FENCE").arg(&key).arg(t).ignore();
                    p.cmd("LEASE.FENCE").arg(&key).arg(t).arg("GET").arg("nothing").ignore();
                    p.cmd("LEASE.RENEW").arg(&key).arg(&owner).arg(60000).ignore();
                    if i % 10 == 0 {
                        p.cmd("LEASE.INFO").arg(&key).ignore();
                    }
                    p.cmd("LEASE.RELEASE").arg(&key).arg(&owner).ignore();
                }
                p.query::<()>(c).unwrap();
            }
        };
        cycles(&mut c, 5_000);
        let baseline = used_memory(&mut c);
        cycles(&mut c, 50_000);
        let after = used_memory(&mut c);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0, "every holder left");
        assert!(after - baseline < 256 * 1024, "memory grew by {} bytes (baseline {baseline}, after {after})", after - baseline);
    }

    fn mutated_restore_payloads_never_crash_or_corrupt(kind) {
        let mut s = Server::start(kind);
        let mut c = s.conn();
        int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a-binary\0owner", "60000"]));
        let payload = dump_payload(&mut c, "k");
        let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let (mut loaded, mut refused) = (0, 0);
        for round in 0..3000 {
            let bad = edit_payload(&payload, |b| {
                for _ in 0..1 + below(&mut rng, 3) {
                    mutate(b, &mut rng);
                }
            });
            match call(&mut c, &[b"RESTORE", b"m", b"600000", &bad, b"REPLACE"]) {
                Ok(_) => {
                    loaded += 1;
                    // Whatever was accepted is a usable lease.
                    match call(&mut c, &[b"LEASE.INFO", b"m"]) {
                        Ok(Value::Array(_)) | Ok(Value::Nil) => {}
                        other => panic!("round {round}: restored value unusable: {other:?}"),
                    }
                    ok(&mut c, &["DEL", "m"]);
                }
                Err(e) => {
                    refused += 1;
                    assert!(!error_text(&e).is_empty());
                }
            }
            if round % 500 == 0 {
                assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
            }
        }
        assert!(s.is_alive(), "the server died");
        assert!(refused > 2000, "mutations were mostly refused: {refused} refused, {loaded} loaded");
        // The original lease is untouched and the server still works.
        let info = ok(&mut c, &["LEASE.INFO", "k"]);
        assert!(field(&info, "token").is_some());
        assert_eq!(call(&mut c, &[b"RESTORE", b"k2", b"600000", &payload]).unwrap(), Value::Okay);
        ok(&mut c, &["DEBUG", "RELOAD"]);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 2);
    }

    fn memory_returns_to_its_baseline(kind) {
        // Blocked-client timeouts are noticed on server ticks: a high hz makes
        // 100k 1 ms waits take seconds, not minutes.
        let s = Server::start_with(kind, Opts::default().extra(&["--hz", "500"]));
        let mut c = s.conn();
        let cycles = |c: &mut redis::Connection, n: usize| {
            for _ in 0..n / 1000 {
                let mut p = redis::pipe();
                for i in 0..1000 {
                    p.cmd("LEASE.ACQUIRE").arg(format!("k{i}")).arg("owner").arg(60000);
                }
                let tokens: Vec<i64> = p.query(c).unwrap();
                let mut p = redis::pipe();
                for (i, t) in tokens.iter().enumerate() {
                    let key = format!("k{i}");
                    p.cmd("LEASE.FENCE").arg(&key).arg(*t).ignore();
                    p.cmd("LEASE.FENCE").arg(&key).arg(*t).arg("GET").arg("nothing").ignore();
                    p.cmd("LEASE.RENEW").arg(&key).arg("owner").arg(60000).ignore();
                    p.cmd("LEASE.INFO").arg(&key).ignore();
                    p.cmd("LEASE.RELEASE").arg(&key).arg("owner").ignore();
                }
                p.query::<()>(c).unwrap();
            }
        };
        let waits = |s: &Server, total: usize| {
            let threads: Vec<_> = (0..100)
                .map(|t| {
                    let mut w = s.conn();
                    thread::spawn(move || {
                        let mut p = redis::pipe();
                        for _ in 0..total / 100 {
                            p.cmd("LEASE.ACQUIRE").arg(format!("held{}", t % 5)).arg(format!("w{t}")).arg(1000).arg("BLOCK").arg(1);
                        }
                        let _: Vec<Value> = p.query(&mut w).unwrap();
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        };
        for i in 0..5 {
            ok(&mut c, &["LEASE.ACQUIRE", &format!("held{i}"), "holder", "60000"]);
        }
        // Warm up every structure once, then take the baseline.
        cycles(&mut c, 10_000);
        waits(&s, 1_000);
        let baseline = used_memory(&mut c);
        cycles(&mut c, 100_000);
        let after_cycles = used_memory(&mut c);
        // The waits below must time out: the keys they wait for stay held
        // however long the cycles took (on a loaded machine, more than the
        // holder's 60 s).
        for i in 0..5 {
            ok(&mut c, &["LEASE.ACQUIRE", &format!("held{i}"), "holder", "60000"]);
        }
        waits(&s, 100_000);
        let after_waits = used_memory(&mut c);
        let mut p = redis::pipe();
        for i in 0..100_000 {
            p.cmd("LEASE.RENEW").arg(format!("held{}", i % 5)).arg("holder").arg(60000).ignore();
        }
        p.query::<()>(&mut c).unwrap();
        let after = used_memory(&mut c);
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
        assert!(info_int(&mut c, "lease_wait_timeouts") >= 101_000);
        assert!(
            after - baseline < 256 * 1024,
            "memory grew by {} bytes (baseline {baseline}, after cycles {after_cycles}, after waits {after_waits}, after renewals {after})",
            after - baseline
        );
    }
}

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

full_suite! {
    // COMMAND GETKEYS of a 10,000-deep nest of `LEASE.FENCE k t` is answered (a
    // key list or an error) by a live server: listing the keys does not recurse
    // once per level (which overflowed the stack and killed the server without
    // a log line). Executing a nest is refused: lease commands cannot be
    // fenced.
    fn command_getkeys_of_a_deep_nest_keeps_the_server_up(kind) {
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

    // For a user whose keys are limited by patterns the ACL check lists the
    // command's keys before running it: a 10,000-deep nest sent by that user
    // gets an error, and the server stays up.
    fn acl_key_check_of_a_deep_nest_keeps_the_server_up(kind) {
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

    // In cluster mode the server lists every command's keys to route it: a
    // single-node cluster serving every slot answers a 10,000-deep nest sent as
    // a plain command with an error, and stays up.
    fn cluster_routing_of_a_deep_nest_keeps_the_server_up(kind) {
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
}
