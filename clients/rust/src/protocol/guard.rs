//! Guarded keys (design.md S12): the admin commands that make a lease key
//! the guard of its hash tag and stop it (`LEASE.GUARD`, `LEASE.UNGUARD`),
//! what they answer, and the `FENCED` refusal of a write to a guarded key
//! outside its guard's fence.

use crate::Error;

/// `LEASE.GUARD key`: from now on every other key of `key`'s hash tag (in
/// that database) is written only through `LEASE.FENCE key <token> ...`.
pub(crate) fn guard_cmd(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("LEASE.GUARD");
    cmd.arg(key);
    cmd
}

/// `LEASE.UNGUARD key`: `key` guards its hash tag no more.
pub(crate) fn unguard_cmd(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("LEASE.UNGUARD");
    cmd.arg(key);
    cmd
}

fn unexpected(command: &str, reply: &redis::Value) -> Error {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{command} answered {reply:?}"),
    ))
    .into()
}

/// What `LEASE.GUARD` answered: `+OK` (RESP2 and RESP3), or anything else
/// as an error.
pub(crate) fn guard_reply(reply: &redis::Value) -> Result<(), Error> {
    match reply {
        redis::Value::Okay => Ok(()),
        redis::Value::SimpleString(s) if s == "OK" => Ok(()),
        other => Err(unexpected("LEASE.GUARD", other)),
    }
}

/// What `LEASE.UNGUARD` answered: 1, the key guarded and stops (`true`);
/// 0, it did not guard (`false`).
pub(crate) fn unguard_reply(reply: &redis::Value) -> Result<bool, Error> {
    match reply {
        redis::Value::Int(1) => Ok(true),
        redis::Value::Int(0) => Ok(false),
        other => Err(unexpected("LEASE.UNGUARD", other)),
    }
}

/// The written key and its guard of a `FENCED` error's text after its code
/// (`write to '<key>' refused: its hash tag is guarded by '<guard>'; write
/// it through LEASE.FENCE <guard> <token> ...`); `None` when it does not
/// read so. The names are as the server printed them (printable ASCII,
/// other bytes as `?`, cut at 64 bytes with `...`), and may hold quotes:
/// the guard is named twice, which says where each name ends.
pub(crate) fn fenced_of(detail: &str) -> Option<(String, String)> {
    const MIDDLE: &str = "' refused: its hash tag is guarded by '";
    const THROUGH: &str = "'; write it through LEASE.FENCE ";
    let rest = detail
        .strip_prefix("write to '")?
        .strip_suffix(" <token> ...")?;
    // rest = key MIDDLE guard THROUGH guard
    rest.match_indices(MIDDLE).find_map(|(at, _)| {
        let key = &rest[..at];
        let tail = &rest[at + MIDDLE.len()..];
        let n = tail.len().checked_sub(THROUGH.len())?;
        if n % 2 != 0 {
            return None;
        }
        let (guard, again) = (tail.get(..n / 2)?, tail.get(n / 2 + THROUGH.len()..)?);
        (tail.get(n / 2..n / 2 + THROUGH.len())? == THROUGH && guard == again)
            .then(|| (key.to_string(), guard.to_string()))
    })
}
