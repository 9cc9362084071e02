//! Soak: a bounded mixed load (acquire, blocking acquire, renew, fenced
//! writes, release, pauses past the lease) against a server with AOF and
//! RDB persistence, then checks that memory is flat and every invariant
//! held. Ignored by `make test`; run by `make soak` (SOAK_SECONDS, default 60).
mod common;
use common::*;

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

fn soak(kind: Kind) {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let s = Server::start_with(
        kind,
        Opts::default().extra(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "5 1",
            "--hz",
            "100",
        ]),
    );
    let locks = 8;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    // A worker's rounds are bounded too: far more than a worker runs in
    // `seconds` (each round is at least one round trip).
    let max_rounds = 1_000_000 * seconds.max(1);
    let workers: Vec<_> = (0..12)
        .map(|w| {
            let mut c = s.conn();
            thread::spawn(move || {
                let mut seed = 0x1234_5678_u64 ^ (w as u64) << 32;
                let mut rnd = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                let mut rounds = 0u64;
                while Instant::now() < deadline && rounds < max_rounds {
                    let lock = format!("lock:{}", rnd(locks));
                    let owner = format!("w{w}-{rounds}");
                    let acquired = if rnd(2) == 0 {
                        call(
                            &mut c,
                            &[
                                b"LEASE.ACQUIRE",
                                lock.as_bytes(),
                                owner.as_bytes(),
                                b"200",
                                b"BLOCK",
                                b"50",
                            ],
                        )
                    } else {
                        call(
                            &mut c,
                            &[b"LEASE.ACQUIRE", lock.as_bytes(), owner.as_bytes(), b"200"],
                        )
                    };
                    rounds += 1;
                    let Ok(Value::Int(token)) = acquired else {
                        continue;
                    };
                    let t = token.to_string();
                    for _ in 0..rnd(4) {
                        let _ = call(
                            &mut c,
                            &[b"LEASE.RENEW", lock.as_bytes(), owner.as_bytes(), b"200"],
                        );
                        let entry = format!("{token}:{w}");
                        let _ = call(
                            &mut c,
                            &[
                                b"LEASE.FENCE",
                                lock.as_bytes(),
                                t.as_bytes(),
                                b"RPUSH",
                                format!("log:{lock}").as_bytes(),
                                entry.as_bytes(),
                            ],
                        );
                        // Sometimes a pause longer than the lease (a GC pause).
                        if rnd(20) == 0 {
                            thread::sleep(Duration::from_millis(250));
                        }
                    }
                    if rnd(5) != 0 {
                        let _ = call(
                            &mut c,
                            &[b"LEASE.RELEASE", lock.as_bytes(), owner.as_bytes()],
                        );
                    }
                }
                rounds
            })
        })
        .collect();
    let mut c = s.conn();
    let mut samples = Vec::new();
    // One sample a second until the deadline.
    for _ in 0..=seconds {
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_secs(1));
        samples.push(used_memory(&mut c));
    }
    let rounds: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    // Invariants: per lock, fenced writes carry non-decreasing tokens, one
    // writer per token.
    for l in 0..locks {
        let Value::Array(items) = ok(&mut c, &["LRANGE", &format!("log:lock:{l}"), "0", "-1"])
        else {
            continue;
        };
        let mut last = 0i64;
        let mut writer: HashMap<i64, String> = HashMap::new();
        for v in items {
            let Value::BulkString(b) = v else { panic!() };
            let e = String::from_utf8(b).unwrap();
            let (t, w) = e.split_once(':').unwrap();
            let t: i64 = t.parse().unwrap();
            assert!(t >= last, "lock:{l}: token {t} written after {last}");
            assert_eq!(
                writer.entry(t).or_insert_with(|| w.to_string()),
                w,
                "lock:{l}: token {t} has two writers"
            );
            last = t;
        }
    }
    assert!(wait_until(Duration::from_secs(5), || info_int(
        &mut c,
        "lease_waiters"
    ) == 0));
    // Memory: the second half of the run is flat (no growth trend beyond noise).
    let half = samples.len() / 2;
    if half >= 2 {
        let first = samples[half..].iter().min().unwrap();
        let last = samples.last().unwrap();
        assert!(
            last - first < 2 * 1024 * 1024,
            "memory grew during the soak: {samples:?}"
        );
    }
    eprintln!(
        "soak {kind:?}: {seconds} s, {rounds} acquisitions tried, memory samples {samples:?}"
    );
    // The data survives a restart from the AOF (after the once-a-second fsync).
    let lengths: Vec<i64> = (0..locks)
        .map(|l| int(&ok(&mut c, &["LLEN", &format!("log:lock:{l}")])))
        .collect();
    thread::sleep(Duration::from_millis(1500));
    let s = s.restart_with(Opts::default().extra(&["--appendonly", "yes"]));
    let mut c = s.conn();
    let after: Vec<i64> = (0..locks)
        .map(|l| int(&ok(&mut c, &["LLEN", &format!("log:lock:{l}")])))
        .collect();
    assert_eq!(after, lengths, "fenced logs after the restart");
}

#[test]
#[ignore = "long: run with `make soak`"]
fn soak_redis() {
    soak(Kind::Redis);
}

#[test]
#[ignore = "long: run with `make soak`"]
fn soak_valkey() {
    soak(Kind::Valkey);
}

#[test]
#[ignore = "long: run with `make soak`"]
fn soak_valkey9() {
    soak(Kind::Valkey9);
}
