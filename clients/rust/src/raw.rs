//! The two pieces the raw `LEASE.*` commands need from their caller, public
//! for code that sends them itself: a fresh owner id ([`new_owner`]) and a
//! command wrapped in `LEASE.FENCE` ([`fence_cmd`]). The helpers use them
//! too.

/// A fresh owner id: 16 random bytes as 32 hex digits.
pub fn new_owner() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `LEASE.FENCE key token <cmd ...>`: `cmd` run only if `token` is the
/// token of the lease held on `key` now, in the same atomic step.
pub fn fence_cmd(key: &str, token: u64, cmd: &redis::Cmd) -> redis::Cmd {
    let mut fenced = redis::cmd("LEASE.FENCE");
    fenced.arg(key).arg(token);
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

    #[test]
    fn fence_cmd_wraps_the_command() {
        let c = fence_cmd("lock", 42, redis::cmd("HSET").arg("k").arg("f").arg(1));
        let args: Vec<Vec<u8>> = c
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        let want: Vec<&[u8]> = vec![b"LEASE.FENCE", b"lock", b"42", b"HSET", b"k", b"f", b"1"];
        assert_eq!(args, want);
    }
}
