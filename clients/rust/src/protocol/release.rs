//! The release plan: how a release is sent given what the holder knows
//! of its lease, and what a failed attempt leads to.

use std::time::Duration;

use super::*;
use crate::{Error, Loss, Options};

/// How a release is sent, given what the holder knows of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleasePlan {
    /// Held (or not known lost): sent, and a lost reply retried.
    Full,
    /// The deadline passed with no successful renewal: the server may
    /// still hold it (it was paused, say), so one attempt bounded by
    /// [`SHORT_RELEASE`] (connect and reply), no retry.
    Short,
    /// A renewal was refused: the server said it is not ours. Nothing sent.
    Nothing,
}

/// The bound of the one release attempt after the deadline passed.
pub(crate) const SHORT_RELEASE: Duration = Duration::from_millis(250);

/// The release of a lease whose loss signal says `loss` (before the
/// release itself sets it).
pub(crate) fn release_plan(loss: Option<Loss>) -> ReleasePlan {
    match loss {
        Some(Loss::Refused) => ReleasePlan::Nothing,
        Some(Loss::Expired) => ReleasePlan::Short,
        _ => ReleasePlan::Full,
    }
}

/// `opts` with every wait cut to [`SHORT_RELEASE`], no retry.
pub(crate) fn short(opts: &Options) -> Options {
    Options {
        connect_timeout: opts.connect_timeout.min(SHORT_RELEASE),
        io_timeout: opts.io_timeout.min(SHORT_RELEASE),
        retries: 0,
        ..opts.clone()
    }
}

/// The options a release is sent with under `plan` (`None`: nothing sent).
pub(crate) fn release_opts(plan: ReleasePlan, opts: &Options) -> Option<Options> {
    match plan {
        ReleasePlan::Nothing => None,
        ReleasePlan::Short => Some(short(opts)),
        ReleasePlan::Full => Some(opts.clone()),
    }
}

/// After release attempt `attempt` failed with `e`: `None` to send it again
/// (a lost reply, retries left), else the answer. A lease known lost whose
/// one attempt got no answer is `Ok(false)`: it ends at its ttl.
pub(crate) fn release_failed(
    e: Error,
    attempt: &mut u32,
    opts: &Options,
    plan: ReleasePlan,
) -> Option<Result<bool, Error>> {
    if let Error::Redis(r) = &e
        && lost_reply(r)
    {
        if *attempt < opts.retries {
            *attempt += 1;
            return None;
        }
        if plan == ReleasePlan::Short {
            return Some(Ok(false));
        }
    }
    Some(Err(e))
}
