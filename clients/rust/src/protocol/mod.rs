//! The protocol written once for the sync and the async API: the commands
//! and their read timeouts, the retry plans, the deadline arithmetic, the
//! held-keys registry, and the watchdog's schedule, which batches the
//! renewals that are due into one pipeline. The I/O layers (`sync.rs`,
//! `aio.rs`) only send what these functions decide and hand the replies
//! back.
//!
//! One file a job: `commands` (what is sent), `acquire` and `release` (the
//! plans), `held` (the held-keys registry), `schedule` (the watchdog),
//! `connection` (pooled connections' checks), `replies` (what a reply
//! means), `quorum` (quorum leases' decisions), `label` (labels and the
//! waiters' records), `guard` (guarded keys: the admin commands and the
//! `FENCED` refusal).

mod acquire;
mod commands;
mod connection;
mod guard;
mod held;
mod label;
mod quorum;
mod release;
mod replies;
mod schedule;
#[cfg(test)]
mod tests;

pub(crate) use self::acquire::*;
pub(crate) use self::commands::*;
pub(crate) use self::connection::*;
pub(crate) use self::guard::*;
pub(crate) use self::held::*;
pub use self::label::{Waiter, default_label};
pub(crate) use self::label::{parse_waiters, resolve, waiters_cmd};
pub use self::quorum::Outlier;
pub(crate) use self::quorum::*;
pub(crate) use self::release::*;
pub(crate) use self::replies::*;
pub(crate) use self::schedule::*;
