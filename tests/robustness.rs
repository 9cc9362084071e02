//! Robustness (SPEC S4): RESTORE of thousands of mutated DUMP payloads (with
//! a correct checksum, so the module's own loader sees them), of exclusive
//! leases (record version 1) and of counting and shared ones (version 2),
//! never crashes or corrupts the server; memory returns to its baseline
//! after 100k acquire/release/fence cycles, 100k timed-out waits and 100k
//! renewals, and after 50k cycles of holders coming and going.
mod common;
use common::*;

use std::thread;

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random change to the module's part of a payload body (everything
/// after the RDB type byte, before the 2-byte RDB version).
fn mutate(body: &mut Vec<u8>, rng: &mut Rng) {
    let end = body.len() - 2;
    match rng.below(5) {
        0 => {
            let i = 1 + rng.below(end - 1);
            body[i] ^= 1 << rng.below(8);
        }
        1 => {
            let i = 1 + rng.below(end - 1);
            body[i] = rng.next() as u8;
        }
        2 => {
            let at = 1 + rng.below(end - 1);
            let n = 1 + rng.below(4);
            let cut = n.min(end - at);
            body.drain(at..at + cut);
        }
        3 => {
            let at = 1 + rng.below(end - 1);
            for _ in 0..1 + rng.below(4) {
                body.insert(at, rng.next() as u8);
            }
        }
        _ => {
            // Truncate the module data, keep the RDB version trailer.
            let at = 1 + rng.below(end - 1);
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
    let mut rng = Rng(seed);
    let (mut loaded, mut refused) = (0, 0);
    for round in 0..3000 {
        let bad = edit_payload(payload, |b| {
            for _ in 0..1 + rng.below(3) {
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

both! {
    fn mutated_multi_record_payloads_never_crash_or_corrupt(kind) {
        let mut s = Server::start(kind);
        let mut c = s.conn();
        int(&ok(&mut c, &["LEASE.ACQUIRE", "template", "t", "60000"]));
        let template = dump_payload(&mut c, "template");
        let now = now_ms();
        let t = info_int(&mut c, "lease_last_token") as u64;
        // Uncompressed records, so the mutations hit their fields.
        let limit = module_payload(&template, &multi_record(3, &[(b"a", t + 1, now + 60_000), (b"b\0", t + 2, now + 50_000), (b"c", t + 5, now + 40_000)]));
        let readers = module_payload(&template, &multi_record(0, &[(b"r1", t + 7, now + 60_000), (b"r2", t + 9, now + 30_000)]));
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
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut loaded, mut refused) = (0, 0);
        for round in 0..3000 {
            let bad = edit_payload(&payload, |b| {
                for _ in 0..1 + rng.below(3) {
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
