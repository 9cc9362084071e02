//! [`Error`], the one error type of the crate, with its text (`Display`)
//! and its mapping from the server's error replies (`From<RedisError>`).

use std::fmt;
use std::time::Duration;

use crate::Loss;
use crate::protocol::{expiring_of, fenced_of};

/// The errors of this crate.
#[derive(Debug)]
pub enum Error {
    /// `LEASE.FENCE` answered `STALE`: the token is not the one of the lease
    /// held now, and the fenced command was not run.
    Stale,
    /// `LEASE.FENCE ... MINTTL` answered `EXPIRING`: the token is current
    /// but the lease (for a counting or shared lease, this holder's
    /// holding) had less than `min_ttl` left, so the fenced command was not
    /// run. The lease is still held: renew it and try again, or stop.
    Expiring {
        /// The time the lease had left when the server decided.
        left: Duration,
        /// The minimum asked for (`MINTTL`, in whole milliseconds).
        min_ttl: Duration,
    },
    /// The lease is no longer held (returned by helpers that need it held).
    Lost(Loss),
    /// The server refused the lease because it is in a grace period (after a
    /// failover or a start on possibly lost data), not because another owner
    /// holds it: no new lease there for `remaining` more (`reason`:
    /// `promoted`, `restart` or `no-data`). Leases already held keep
    /// working. Read from the server's `INFO lease` right after the null.
    Grace {
        /// What remains of the period.
        remaining: Duration,
        /// Why it runs.
        reason: String,
    },
    /// A `SHARED` holder's token fenced a write command: refused by the
    /// server, nothing run. Readers fence reads only; take the lease
    /// exclusively to write.
    SharedWrite,
    /// A write to a key of a guarded hash tag (design.md S12) was refused:
    /// `key`'s tag is guarded by the lease key `guard`, and its keys are
    /// written only through `LEASE.FENCE guard <token> ...` with the token
    /// of the lease held on `guard`. Nothing was run. What a plain write
    /// gets, and a fenced one whose lease key is not the guard (another
    /// lease key of the same tag). The names are as the server printed
    /// them: printable ASCII (other bytes as `?`), cut at 64 bytes with
    /// `...`.
    Fenced {
        /// The key the refused command writes.
        key: String,
        /// The lease key that guards its hash tag.
        guard: String,
    },
    /// This client (or a clone of it) already holds a lease on this key, not
    /// released and not lost: a second acquire would wait on itself (with
    /// `BLOCK`) or be refused. Use the lease you hold, or release it first.
    /// Nothing was sent.
    AlreadyHeld(String),
    /// A ttl under 1 ms: the server's shortest lease is 1 ms, and rounding
    /// up would hand out a lease nobody asked for. Nothing was sent.
    InvalidTtl(Duration),
    /// The keys of a multi-key acquire (`acquire_many`) are none, or name a
    /// key twice: the server would refuse them. Nothing was sent.
    InvalidKeys(String),
    /// A multi-key lease's `fence` named a key that is not one of its keys:
    /// its token fences nothing there. Nothing was sent.
    NotLeaseKey(String),
    /// `waiters` asked for a `COUNT` outside 1 to 1000, which the server
    /// would refuse. Nothing was sent.
    InvalidCount(u32),
    /// Any other error: the server's error replies, and I/O errors left
    /// after the retries.
    Redis(redis::RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Stale => f.write_str(
                "STALE: the fencing token is not the current one; the command was not run",
            ),
            Error::Expiring { left, min_ttl } => write!(
                f,
                "EXPIRING: the lease has {} ms left, less than the {} ms asked for; the command was not run",
                left.as_millis(),
                min_ttl.as_millis()
            ),
            Error::Lost(loss) => loss.fmt(f),
            Error::InvalidTtl(ttl) => write!(f, "ttl must be at least 1 ms, not {ttl:?}"),
            Error::InvalidKeys(why) => write!(f, "a multi-key lease needs distinct keys: {why}"),
            Error::InvalidCount(n) => {
                write!(f, "count must be 1 to 1000, not {n}; nothing was sent")
            }
            Error::NotLeaseKey(key) => {
                write!(
                    f,
                    "{key:?} is not one of the lease's keys; nothing was sent"
                )
            }
            Error::SharedWrite => {
                f.write_str("a SHARED holder's token cannot fence a write command; nothing was run")
            }
            Error::Fenced { key, guard } => write!(
                f,
                "FENCED: the write to {key:?} was refused, nothing was run: its hash tag is guarded by {guard:?}; write it through that lease's fence"
            ),
            Error::AlreadyHeld(key) => write!(
                f,
                "{key:?} is already held by this client: use that lease or release it first"
            ),
            Error::Grace { remaining, reason } => write!(
                f,
                "the server is in a grace period ({reason}): no new lease for {} ms more",
                remaining.as_millis()
            ),
            Error::Redis(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        if e.code() == Some("STALE") {
            Error::Stale
        } else if let Some((left, min_ttl)) = e
            .code()
            .filter(|&c| c == "EXPIRING")
            .and_then(|_| expiring_of(e.detail()?))
        {
            Error::Expiring { left, min_ttl }
        } else if let Some((key, guard)) = e
            .code()
            .filter(|&c| c == "FENCED")
            .and_then(|_| fenced_of(e.detail()?))
        {
            Error::Fenced { key, guard }
        } else if e
            .detail()
            .is_some_and(|d| d.contains("a SHARED holder's token cannot fence a write command"))
        {
            Error::SharedWrite
        } else {
            Error::Redis(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_error_other_than_stale_stays_a_redis_error() {
        let e = redis::RedisError::from((redis::ErrorKind::Client, "x"));
        assert!(matches!(Error::from(e), Error::Redis(_)));
    }

    #[test]
    fn an_expiring_reply_is_expiring_with_the_time_left_and_the_minimum() {
        let e =
            redis::parse_redis_value(b"-EXPIRING lease has 120 ms left, less than MINTTL 500\r\n")
                .unwrap()
                .extract_error()
                .unwrap_err();
        assert_eq!(e.code(), Some("EXPIRING"), "{e:?}");
        match Error::from(e) {
            Error::Expiring { left, min_ttl } => {
                assert_eq!(
                    (left, min_ttl),
                    (Duration::from_millis(120), Duration::from_millis(500))
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_fenced_reply_is_fenced_with_the_key_and_its_guard() {
        let e = redis::parse_redis_value(
            b"-FENCED write to '{g}:data' refused: its hash tag is guarded by '{g}:lock'; write it through LEASE.FENCE {g}:lock <token> ...\r\n",
        )
        .unwrap()
        .extract_error()
        .unwrap_err();
        match Error::from(e) {
            Error::Fenced { key, guard } => {
                assert_eq!((key.as_str(), guard.as_str()), ("{g}:data", "{g}:lock"))
            }
            other => panic!("{other:?}"),
        }
        // Another code with the same words is not a refusal of the guard.
        let e = redis::parse_redis_value(
            b"-ERR write to 'k' refused: its hash tag is guarded by 'g'; write it through LEASE.FENCE g <token> ...\r\n",
        )
        .unwrap()
        .extract_error()
        .unwrap_err();
        assert!(matches!(Error::from(e), Error::Redis(_)));
    }
}
