//! The counters of `INFO lease` (design.md S5), as one table: the struct
//! the binding counts in, the order `INFO lease` shows them in
//! (`lease_<name>`), and the list the tests read ([`NAMES`]) all come from
//! the one list below. Commands and callbacks run on the server's main
//! thread; relaxed atomics make the counters `Sync` without locks. It uses
//! nothing but `std`: the integration tests include this very file
//! (`tests/common`) to read [`NAMES`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A monotonic counter.
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Counter::new()
    }
}

/// Declares `Stats` (one field per counter), `NAMES` and `Stats::fields`
/// from one list of names.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Every counter, by the name `INFO lease` shows it under
        /// (`lease_<name>`).
        pub struct Stats {
            $($(#[doc = $doc])* pub $name: Counter,)*
        }

        /// The counters' names, in the order `INFO lease` shows them.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        impl Stats {
            pub const fn new() -> Self {
                Stats { $($name: Counter::new(),)* }
            }

            /// (name, value) for every counter, in the order of [`NAMES`].
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.get())),*]
            }
        }
    };
}

counters! {
    /// New leases (and new holders of counting and shared leases).
    acquired,
    /// Acquires answered null: another owner holds it, or waiters are ahead.
    contended,
    /// Acquires by the owner that holds the lease (a retry).
    reacquired,
    renewed,
    renew_failed,
    released,
    release_failed,
    /// Holders whose deadline passed.
    expired,
    /// Lease keys evicted under `maxmemory` (a policy other than `noeviction`).
    evicted,
    fence_ok,
    fence_stale,
    /// `LEASE.FENCE ... MINTTL ms` refused with `EXPIRING`: the token was
    /// current but its lease had less than `ms` left.
    fence_expiring,
    /// `BLOCK` waits that ended without the lease.
    wait_timeouts,
    /// Acquires answered null because a grace period runs.
    grace_refused,
    /// Renewals that arrived with less than a tenth of their ttl left
    /// (design.md S11).
    renewed_late,
    /// Writes to guarded keys refused outside their guard's fence
    /// (design.md S12).
    guard_refused,
    /// Guards ended by the deletion of their key (`DEL`, `UNLINK`, an
    /// eviction), not by `LEASE.UNGUARD`.
    guard_deleted,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}
