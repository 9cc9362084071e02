//! Lease calls and what their replies hold: tokens, waiters, holders, the
//! key's PTTL, and the wall clock tokens are measured against.

use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

/// 2^53-1, the largest token.
pub const MAX_TOKEN: i64 = (1 << 53) - 1;

/// The test process's wall clock in unix ms.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `LEASE.ACQUIRE key owner ttl`, which must answer a token.
pub fn acquire(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str) -> i64 {
    int(&ok(c, &["LEASE.ACQUIRE", key, owner, ttl]))
}

/// The token of the lease on `key` (LEASE.INFO), `None` when it is free.
pub fn token_of(c: &mut redis::Connection, key: &str) -> Option<i64> {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => None,
        v => Some(int(&field(&v, "token").expect("token field"))),
    }
}

/// How many clients wait on `key` (LEASE.INFO), 0 when it is free.
pub fn waiters(c: &mut redis::Connection, key: &str) -> i64 {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => 0,
        v => int(&field(&v, "waiters").expect("waiters field")),
    }
}

/// `PTTL key`.
pub fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    int(&ok(c, &["PTTL", key]))
}

/// The `holders` of a LEASE.INFO reply of a counting or shared lease:
/// (token, ttl) per holder, in the order given (RESP2 flat arrays or RESP3
/// maps); empty for an exclusive lease (no such field).
pub fn holders(info: &Value) -> Vec<(i64, i64)> {
    match field(info, "holders") {
        Some(Value::Array(list)) => list
            .iter()
            .map(|h| {
                (
                    int(&field(h, "token").expect("holder token")),
                    int(&field(h, "ttl").expect("holder ttl")),
                )
            })
            .collect(),
        None => Vec::new(),
        other => panic!("no holders in {info:?}: {other:?}"),
    }
}

/// `LEASE.ACQUIRE key owner ttl <opts...>`: the token, or `None` for null
/// (panics on an error reply).
pub fn acquire_opts(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    ttl: &str,
    opts: &[&str],
) -> Option<i64> {
    let mut args = vec!["LEASE.ACQUIRE", key, owner, ttl];
    args.extend_from_slice(opts);
    match ok(c, &args) {
        Value::Nil => None,
        v => Some(int(&v)),
    }
}
