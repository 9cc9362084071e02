//! kill -9 in the middle of a concurrent acquire/release load with
//! `appendonly yes` and `appendfsync always`: after the restart every
//! acknowledged, unreleased acquisition is there with its token, every
//! acknowledged release is gone, and no token is ever issued twice.
mod common;
use common::*;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A worker's bound: it stops when the server dies (the test kills it after
/// 700 ms), and at the latest after this many acquisitions or this long.
const MAX_ROUNDS: usize = 1_000_000;
const MAX_RUN: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Ledger {
    /// key -> (owner, token) acknowledged and not released (as far as known).
    held: HashMap<String, (String, i64)>,
    /// keys whose release was acknowledged.
    released: HashSet<String>,
    /// keys with a release in flight when the server died.
    unsure: HashSet<String>,
    tokens: Vec<i64>,
}

full_suite! {
    fn kill_9_under_load_loses_no_acknowledged_acquisition(kind) {
        let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let mut s = Server::start_with(kind, opts.clone());
        let deadline = Instant::now() + MAX_RUN;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let mut c = s.conn();
                let ledger = ledger.clone();
                thread::spawn(move || {
                    for i in 0..MAX_ROUNDS {
                        if Instant::now() >= deadline {
                            return;
                        }
                        let key = format!("w{w}:k{i}");
                        let owner = format!("w{w}:o{i}");
                        let Ok(Value::Int(t)) = call(&mut c, &[b"LEASE.ACQUIRE", key.as_bytes(), owner.as_bytes(), b"60000"]) else {
                            return; // the server died
                        };
                        {
                            let mut l = ledger.lock().unwrap();
                            l.held.insert(key.clone(), (owner.clone(), t));
                            l.tokens.push(t);
                        }
                        if i % 3 == 0 {
                            ledger.lock().unwrap().unsure.insert(key.clone());
                            match call(&mut c, &[b"LEASE.RELEASE", key.as_bytes(), owner.as_bytes()]) {
                                Ok(Value::Int(1)) => {
                                    let mut l = ledger.lock().unwrap();
                                    l.unsure.remove(&key);
                                    l.held.remove(&key);
                                    l.released.insert(key);
                                }
                                _ => return,
                            }
                        }
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(700));
        let pid = s.pid();
        s.kill(); // SIGKILL, and reaped
        for w in workers {
            w.join().unwrap();
        }
        let s = s.restart_with(opts);
        let mut c = s.conn();
        let l = ledger.lock().unwrap();
        assert!(l.held.len() > 50, "load too small: {} held (pid {pid})", l.held.len());
        for (key, (owner, token)) in &l.held {
            if l.unsure.contains(key) {
                continue;
            }
            let info = ok(&mut c, &["LEASE.INFO", key]);
            assert_eq!(field(&info, "token"), Some(Value::Int(*token)), "{key} lost");
            // The owner is intact too: a re-acquire by it is idempotent.
            assert_eq!(int(&ok(&mut c, &["LEASE.ACQUIRE", key, owner, "60000"])), *token);
        }
        for key in &l.released {
            assert_eq!(ok(&mut c, &["LEASE.INFO", key]), Value::Nil, "{key} came back");
        }
        let mut sorted = l.tokens.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), l.tokens.len(), "a token was issued twice");
        let max = *sorted.last().unwrap();
        for i in 0..100 {
            let t = int(&ok(&mut c, &["LEASE.ACQUIRE", &format!("after{i}"), "x", "1000"]));
            assert!(t > max, "{t} after restart, {max} before");
        }
    }
}
