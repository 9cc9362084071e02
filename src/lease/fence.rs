//! The server-side fence with a command (`LEASE.FENCE key token command
//! [arg ...]`): which inner commands are refused, and the cluster slot rule
//! (every key of the command must hash to the slot of the lease key).

use super::error::LeaseError;
use super::error::printable;
use super::guard::hash_tag;
use super::keyspec::{Kind, is_lease_command};

/// Would this call of a command flagged `blocking` block? XREAD and
/// XREADGROUP block only with a `BLOCK` option (before `STREAMS`, after
/// which come key names); every other blocking command always may.
fn blocks(name: &[u8], args: &[&[u8]]) -> bool {
    let is = |a: &[u8], word: &str| a.eq_ignore_ascii_case(word.as_bytes());
    if !is(name, "xread") && !is(name, "xreadgroup") {
        return true;
    }
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if is(a, "STREAMS") {
            return false;
        }
        if is(a, "BLOCK") {
            return true;
        }
        // GROUP group consumer, COUNT n: skip the values (a group may be
        // called BLOCK).
        i += if is(a, "GROUP") {
            3
        } else if is(a, "COUNT") {
            2
        } else {
            1
        };
    }
    false
}

/// Refuses an inner command by its name, its kind (that of its
/// subcommand, for container commands such as CONFIG) and, for XREAD and
/// XREADGROUP, whether it asks to block: LEASE.* commands, calls that
/// would block, commands not allowed in scripts. `args` follow the name.
pub fn check_inner(name: &[u8], kind: Kind, args: &[&[u8]]) -> Result<(), LeaseError> {
    let shown = || printable(name).to_ascii_lowercase();
    if is_lease_command(name) {
        return Err(LeaseError::FenceRefused(
            shown(),
            "lease commands cannot be fenced",
        ));
    }
    if kind.blocking && blocks(name, args) {
        return Err(LeaseError::FenceRefused(
            shown(),
            "blocking commands cannot be fenced",
        ));
    }
    if kind.noscript {
        return Err(LeaseError::FenceRefused(
            shown(),
            "commands not allowed in scripts cannot be fenced",
        ));
    }
    Ok(())
}

/// A `SHARED` holder's valid token fences reads only: an inner command
/// that writes ([`Kind::writes`], the guards' meaning of a write too) is
/// refused (nothing runs).
pub fn check_shared(name: &[u8], kind: Kind) -> Result<(), LeaseError> {
    if kind.writes {
        return Err(LeaseError::FenceRefused(
            printable(name).to_ascii_lowercase(),
            "a SHARED holder's token cannot fence a write command",
        ));
    }
    Ok(())
}

/// CRC16 (XMODEM), as Redis Cluster uses for key slots.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key: of its hash tag when it has one (the one
/// rule, `guard::hash_tag`), else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) & 16383
}

/// Checks that every key hashes to the slot of `lease_key`.
pub fn check_same_slot<'a>(
    lease_key: &[u8],
    keys: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), LeaseError> {
    let slot = key_slot(lease_key);
    if keys.into_iter().all(|k| key_slot(k) == slot) {
        Ok(())
    } else {
        Err(LeaseError::CrossSlot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_redis_cluster() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(
            key_slot(b"foo{}{bar}"),
            key_slot(b"bar"),
            "empty tag: whole key hashed"
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn same_slot_rule() {
        assert!(check_same_slot(b"lock:{acct7}", [&b"acct:{acct7}"[..], b"{acct7}:log"]).is_ok());
        assert_eq!(
            check_same_slot(b"lock:{acct7}", [&b"acct:8"[..]]),
            Err(LeaseError::CrossSlot)
        );
        assert!(check_same_slot(b"k", std::iter::empty()).is_ok());
    }

    const WRITE: Kind = Kind {
        writes: true,
        blocking: false,
        noscript: false,
    };
    const READ: Kind = Kind {
        writes: false,
        blocking: false,
        noscript: false,
    };

    #[test]
    fn refused_inner_commands() {
        assert!(check_inner(b"HSET", WRITE, &[]).is_ok());
        assert!(matches!(
            check_inner(b"lease.release", READ, &[]),
            Err(LeaseError::FenceRefused(..))
        ));
        assert!(matches!(
            check_inner(b"LEASE.FENCE", READ, &[]),
            Err(LeaseError::FenceRefused(..))
        ));
        let blocking = Kind {
            blocking: true,
            ..WRITE
        };
        let e = check_inner(b"BLPOP", blocking, &[b"l", b"0"]).unwrap_err();
        assert!(e.to_string().contains("blocking"), "{e}");
        let noscript = Kind {
            noscript: true,
            ..READ
        };
        let e = check_inner(b"subscribe", noscript, &[]).unwrap_err();
        assert!(e.to_string().contains("scripts"), "{e}");
    }

    #[test]
    fn a_shared_token_fences_reads_only() {
        let e = check_shared(b"HSET", WRITE).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR LEASE.FENCE cannot run 'hset': a SHARED holder's token cannot fence a write command"
        );
        assert!(check_shared(b"HGET", READ).is_ok());
    }

    #[test]
    fn xread_blocks_only_with_block() {
        let blocking = Kind {
            blocking: true,
            ..READ
        };
        let ok = |name: &[u8], args: &[&[u8]]| check_inner(name, blocking, args).is_ok();
        assert!(ok(b"XREAD", &[b"COUNT", b"5", b"STREAMS", b"s", b"0"]));
        assert!(
            ok(b"xread", &[b"STREAMS", b"BLOCK", b"0"]),
            "a stream named BLOCK"
        );
        assert!(!ok(b"XREAD", &[b"BLOCK", b"10", b"STREAMS", b"s", b"0"]));
        assert!(!ok(
            b"XREAD",
            &[b"COUNT", b"1", b"block", b"0", b"STREAMS", b"s", b"$"]
        ));
        assert!(ok(
            b"XREADGROUP",
            &[b"GROUP", b"BLOCK", b"c", b"STREAMS", b"s", b">"]
        ));
        assert!(!ok(
            b"XREADGROUP",
            &[b"GROUP", b"g", b"c", b"BLOCK", b"5", b"STREAMS", b"s", b">"]
        ));
        assert!(!ok(b"BLPOP", &[b"l", b"0"]));
    }
}
