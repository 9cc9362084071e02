//! Blocked callers on their own connections and threads: starting a
//! `LEASE.ACQUIRE ... BLOCK` waiter (or any call) and reading what it was
//! answered and when.

use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::*;

/// A blocked waiter's reply and when it arrived.
pub type Answer = JoinHandle<(redis::RedisResult<Value>, Instant)>;

/// Starts `args` (a call that blocks: `LEASE.ACQUIRE ... BLOCK`,
/// `LEASE.MACQUIRE ... BLOCK`) on its own connection and thread, and waits
/// (up to 5 s) until the server counts one waiter more (`INFO lease`: a
/// free key shows no `LEASE.INFO`). `who` names it in the failure.
pub fn spawn_blocked<A: AsRef<str>>(s: &Server, args: &[A], who: &str) -> Answer {
    let mut probe = s.conn();
    let before = info_int(&mut probe, "lease_waiters");
    let mut c = s.conn();
    let args: Vec<String> = args.iter().map(|a| a.as_ref().to_string()).collect();
    let shown = args.join(" ");
    let h = thread::spawn(move || {
        let reply = call_args(&mut c, &args);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || info_int(
            &mut probe,
            "lease_waiters"
        ) > before),
        "{who} never started waiting: {shown}"
    );
    h
}

/// Starts `LEASE.ACQUIRE key owner ttl BLOCK timeout` on its own connection
/// and thread, and waits (up to 5 s) until the server counts it as a waiter.
pub fn spawn_waiter(s: &Server, key: &str, owner: &str, ttl: &str, timeout: &str) -> Answer {
    spawn_waiter_with(s, key, owner, ttl, &["BLOCK", timeout])
}

/// Starts `LEASE.ACQUIRE key owner ttl <opts...>` (which include `BLOCK
/// timeout`, and `LIMIT n` or `SHARED`) on its own connection and thread,
/// and waits (up to 5 s) until the server counts it as a waiter.
pub fn spawn_waiter_with(s: &Server, key: &str, owner: &str, ttl: &str, opts: &[&str]) -> Answer {
    let mut args = vec!["LEASE.ACQUIRE", key, owner, ttl];
    args.extend_from_slice(opts);
    spawn_blocked(s, &args, owner)
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
