//! What a client reports about its leases: why one is no longer held
//! ([`Loss`]) and what its watchdog did ([`WatchdogStats`]).

use std::fmt;

/// Why a lease is no longer held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// A renewal answered 0: the server says the lease is not ours.
    Refused,
    /// The client-side deadline passed with no successful renewal: the
    /// server may have handed the lease to someone else.
    Expired,
    /// The holder released it.
    Released,
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Loss::Refused => "lease lost: a renewal was refused",
            Loss::Expired => "lease lost: its deadline passed with no successful renewal",
            Loss::Released => "lease released",
        })
    }
}

/// What a client's watchdog did: see `LeaseClient::watchdog_stats` (sync and async).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WatchdogStats {
    /// Leases it renews now.
    pub leases: usize,
    /// Renewals it sent so far.
    pub renewals: u64,
    /// Pipelines that carried them (one round trip each; a batch on a
    /// cluster is one pipeline per node).
    pub round_trips: u64,
}
