//! What a reply means: a lost reply, a null acquire (another owner, or
//! the grace period), and what `with_lease` returns when its lease was
//! lost during the work.

use std::time::Duration;

use crate::{Error, Loss};

/// Is `e` a reply that may have been lost (so the command may or may not
/// have run): an I/O error, a dropped connection, a timeout.
pub(crate) fn lost_reply(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The time left and the minimum of an `EXPIRING` error's text after its
/// code (`lease has <left> ms left, less than MINTTL <ms>`); `None` when
/// it does not read so.
pub(crate) fn expiring_of(detail: &str) -> Option<(Duration, Duration)> {
    let rest = detail.strip_prefix("lease has ")?;
    let (left, rest) = rest.split_once(" ms left, less than MINTTL ")?;
    let min: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((
        Duration::from_millis(left.parse().ok()?),
        Duration::from_millis(min.parse().ok()?),
    ))
}

/// The grace period an `INFO lease` text says runs, as [`Error::Grace`];
/// `None` when none runs (or the text cannot say).
pub(crate) fn grace_of(info: &str) -> Option<Error> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
    };
    let remaining: u64 = field("lease_grace_remaining_ms")?.parse().ok()?;
    (remaining > 0).then(|| Error::Grace {
        remaining: Duration::from_millis(remaining),
        reason: field("lease_grace_reason").unwrap_or("unknown").to_string(),
    })
}

/// The loss to report when the work of a `with_lease` ended well: a lease
/// refused or expired during it (not one the work released).
pub(crate) fn lost_during(loss: Option<Loss>) -> Option<Loss> {
    loss.filter(|l| matches!(l, Loss::Refused | Loss::Expired))
}

/// What `with_lease` returns: the work's result, unless the work went well
/// and the lease was lost during it (`lost`, from [`lost_during`], read
/// before the release): its work may have overlapped the next holder's.
pub(crate) fn work_result<T, E: From<Error>>(
    result: Result<T, E>,
    lost: Option<Loss>,
) -> Result<Option<T>, E> {
    match (result, lost) {
        (Ok(_), Some(loss)) => Err(Error::Lost(loss).into()),
        (result, _) => result.map(Some),
    }
}

/// What a null acquire reply means, given the server's `INFO lease` read
/// right after it: another owner holds the lease (`Ok(None)`), or the
/// server is in its grace period ([`Error::Grace`]).
pub(crate) fn refused<T>(info: &str) -> Result<Option<T>, Error> {
    match grace_of(info) {
        Some(grace) => Err(grace),
        None => Ok(None),
    }
}
