//! The two pieces the raw `LEASE.*` commands need from their caller, public
//! for code that sends them itself: a fresh owner id ([`new_owner`]) and a
//! command wrapped in `LEASE.FENCE` ([`fence_cmd`], and
//! [`fence_cmd_min_ttl`] with `MINTTL`). The helpers use them too.
//!
//! What such code gets back is the redis crate's own error; `Error::from`
//! types the refusals the helpers type (`STALE`, `EXPIRING`, a reader's
//! write, and `FENCED`, a write to a guarded key outside its guard's
//! fence), so that they are recognisable there too:
//!
//! ```no_run
//! # fn main() -> Result<(), redis_lease_client::Error> {
//! use redis_lease_client::Error;
//!
//! let mut con = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection()?;
//! match redis::cmd("SET").arg("{acct:7}").arg(90).query::<()>(&mut con).map_err(Error::from) {
//!     Err(Error::Fenced { key, guard }) => println!("{key} is written through {guard}'s fence only"),
//!     other => other?,
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::protocol::min_ttl_millis;

/// A fresh owner id: 16 random bytes as 32 hex digits.
pub fn new_owner() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `LEASE.FENCE key token <cmd ...>`: `cmd` run only if `token` is the
/// token of the lease held on `key` now, in the same atomic step.
pub fn fence_cmd(key: &str, token: u64, cmd: &redis::Cmd) -> redis::Cmd {
    fence_cmd_with(key, token, None, cmd)
}

/// `LEASE.FENCE key token MINTTL ms <cmd ...>`: as [`fence_cmd`], and
/// refused with `EXPIRING` ([`Error::Expiring`](crate::Error::Expiring))
/// when the lease has less than `min_ttl` left (whole milliseconds, rounded
/// up). An empty `cmd` (`redis::Cmd::new()`) only checks.
pub fn fence_cmd_min_ttl(key: &str, token: u64, min_ttl: Duration, cmd: &redis::Cmd) -> redis::Cmd {
    fence_cmd_with(key, token, Some(min_ttl), cmd)
}

/// `LEASE.FENCE key token [MINTTL ms] <cmd ...>`.
pub(crate) fn fence_cmd_with(
    key: &str,
    token: u64,
    min_ttl: Option<Duration>,
    cmd: &redis::Cmd,
) -> redis::Cmd {
    let mut fenced = redis::cmd("LEASE.FENCE");
    fenced.arg(key).arg(token);
    if let Some(min_ttl) = min_ttl {
        fenced
            .arg("MINTTL")
            .arg(min_ttl_millis(min_ttl).to_string());
    }
    for arg in cmd.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            fenced.arg(bytes);
        }
    }
    fenced
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_is_32_hex_digits_and_fresh() {
        let (a, b) = (new_owner(), new_owner());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    fn args(c: &redis::Cmd) -> Vec<Vec<u8>> {
        c.args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn fence_cmd_wraps_the_command() {
        let c = fence_cmd("lock", 42, redis::cmd("HSET").arg("k").arg("f").arg(1));
        let want: Vec<&[u8]> = vec![b"LEASE.FENCE", b"lock", b"42", b"HSET", b"k", b"f", b"1"];
        assert_eq!(args(&c), want);
    }

    #[test]
    fn fence_cmd_min_ttl_puts_minttl_right_after_the_token_rounded_up() {
        let hset = redis::cmd("HSET").arg("k").arg("f").arg(1).clone();
        let c = fence_cmd_min_ttl("lock", 42, Duration::from_millis(500), &hset);
        let want: Vec<&[u8]> = vec![
            b"LEASE.FENCE",
            b"lock",
            b"42",
            b"MINTTL",
            b"500",
            b"HSET",
            b"k",
            b"f",
            b"1",
        ];
        assert_eq!(args(&c), want);
        let c = fence_cmd_min_ttl("lock", 42, Duration::from_micros(1500), &redis::Cmd::new());
        let want: Vec<&[u8]> = vec![b"LEASE.FENCE", b"lock", b"42", b"MINTTL", b"2"];
        assert_eq!(args(&c), want, "a check only, 1.5 ms asks for 2");
        let c = fence_cmd_min_ttl("lock", 42, Duration::ZERO, &redis::Cmd::new());
        assert_eq!(args(&c).last().map(Vec::as_slice), Some(&b"0"[..]));
    }
}
