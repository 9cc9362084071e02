//! Robustness (SPEC S4): RESTORE of thousands of mutated DUMP payloads (with
//! a correct checksum, so the module's own loader sees them) never crashes
//! or corrupts the server; memory returns to its baseline after 100k
//! acquire/release/fence cycles, 100k timed-out waits and 100k renewals.
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

both! {
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
