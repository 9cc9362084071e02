//! Blocked callers on their own connections and threads: starting a
//! `LEASE.ACQUIRE ... BLOCK` waiter (or any call) and reading what it was
//! answered and when.

use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::*;

/// A blocked waiter's reply and when it arrived.
pub type Answer = JoinHandle<(redis::RedisResult<Value>, Instant)>;

/// Starts `LEASE.ACQUIRE key owner ttl BLOCK timeout` on its own connection
/// and thread, and waits (up to 5 s) until the server counts it as a waiter.
pub fn spawn_waiter(s: &Server, key: &str, owner: &str, ttl: &str, timeout: &str) -> Answer {
    let mut probe = s.conn();
    let before = waiters(&mut probe, key);
    let mut c = s.conn();
    let args: Vec<String> = ["LEASE.ACQUIRE", key, owner, ttl, "BLOCK", timeout]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let h = thread::spawn(move || {
        let reply = call_args(&mut c, &args);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut probe, key) > before),
        "{owner} never started waiting on {key}"
    );
    h
}

/// Starts `LEASE.ACQUIRE key owner ttl <opts...>` (which include `BLOCK
/// timeout`, and `LIMIT n` or `SHARED`) on its own connection and thread,
/// and waits (up to 5 s) until the server counts it as a waiter.
pub fn spawn_waiter_with(s: &Server, key: &str, owner: &str, ttl: &str, opts: &[&str]) -> Answer {
    let mut probe = s.conn();
    let before = waiters(&mut probe, key);
    let mut c = s.conn();
    let mut args: Vec<String> = ["LEASE.ACQUIRE", key, owner, ttl]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(opts.iter().map(|a| a.to_string()));
    let h = thread::spawn(move || {
        let reply = call_args(&mut c, &args);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut probe, key) > before),
        "{owner} never started waiting on {key}"
    );
    h
}

/// The token a waiter was answered (it must be one).
pub fn got_token(h: Answer) -> i64 {
    int(&h.join().unwrap().0.expect("waiter reply"))
}

/// Runs `args` on a fresh connection on its own thread; the reply arrives
/// on the returned channel.
pub fn spawn_call(s: &Server, args: &[&str]) -> mpsc::Receiver<redis::RedisResult<Value>> {
    let mut c = s.conn();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let _ = tx.send(call(&mut c, &refs));
    });
    rx
}
