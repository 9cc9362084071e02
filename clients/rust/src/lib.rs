//! Client helpers for the redis-lease module (`LEASE.ACQUIRE`, `LEASE.RENEW`,
//! `LEASE.RELEASE`, `LEASE.FENCE`), on the [`redis`] crate.
//!
//! The raw commands work from any client, but every user then writes the
//! same fragile code around them. This crate writes it once: a fresh owner
//! id per acquisition, a lost acquire reply retried with the same owner, a
//! watchdog with a client-side deadline and a loss signal, fenced writes
//! ([`Lease::fence`]), release on every way out, multi-key leases
//! ([`LeaseClient::acquire_many`]) and quorum leases ([`QuorumClient`]). The
//! rules, the same in every language, are listed once in the project's
//! `docs/helpers.md`, "What the helpers do for you".
//!
//! The sync API is [`LeaseClient`] / [`Lease`]. With the `tokio` feature,
//! [`aio`] has the same on tokio. Both work with one server
//! ([`redis::Client`]) and with Redis Cluster
//! ([`redis::cluster::ClusterClient`]): the `LEASE.*` commands declare the
//! lease key at position 1, and the cluster client routes every call by
//! that key's slot.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lease_client::{Block, LeaseClient};
//!
//! # fn main() -> Result<(), redis_lease_client::Error> {
//! let client = LeaseClient::open("redis://127.0.0.1:6379/")?;
//! let done = client.with_lease("{acct:7}:lock", Duration::from_secs(10), Block::For(Duration::from_secs(5)),
//!     |lease| -> Result<(), redis_lease_client::Error> {
//!         for step in 0..100 {
//!             if lease.is_lost() {
//!                 return Err(redis_lease_client::Error::Lost(lease.loss().unwrap()));
//!             }
//!             // Every write goes through the fence: refused once the lease is not ours.
//!             let _: i64 = lease.fence(redis::cmd("HSET").arg("{acct:7}").arg("step").arg(step))?;
//!         }
//!         Ok(())
//!     })?;
//! assert!(done.is_some(), "None: the lease was busy for 5 s");
//! # Ok(()) }
//! ```
//!
//! What the helpers cannot do for you: a lease is a promise about the past
//! (it was yours when the last renewal was sent). Work that does not write
//! through the fence can still overlap the next holder's by the time it
//! takes to notice the loss; write through [`Lease::fence`], and have stores
//! outside Redis refuse tokens lower than the highest they have seen.

#![warn(missing_docs)]

mod error;
mod options;
mod protocol;
pub mod quorum;
mod raw;
mod status;
mod sync;
pub use error::Error;
pub use options::{Block, Label, Mode, Options};
pub use protocol::{Waiter, default_label};
pub use quorum::{Outlier, QuorumClient, QuorumLease};
pub use raw::{fence_cmd, fence_cmd_min_ttl, new_owner};
pub use status::{Loss, WatchdogStats};
pub use sync::{Lease, LeaseClient, LossSignal, MultiLease};

#[cfg(feature = "tokio")]
pub mod aio;
#[cfg(feature = "tokio")]
mod aio_quorum;
#[cfg(feature = "tokio")]
mod wire;

pub use redis;
