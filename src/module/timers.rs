//! The module's timers: the one job type every module timer carries, and
//! the drains of crowded counting leases (one pending timer a key).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::lease::effect::Announce;
use crate::lease::versions;
use crate::lease::waitq::Slot;

use super::ffi::server::{self, TimerId};

/// Work a module timer does when it fires (`entry::timers`).
pub enum TimerJob {
    /// Re-check the key of a waiter queue (its lease may be free).
    Recheck(Slot),
    /// Answer the waiters whose BLOCK timeout has passed.
    Timeouts,
    /// Give back a lease handed to a waiter that disconnected before it
    /// learnt its token: (queue, owner, token).
    Revoke(Slot, Box<[u8]>, u64),
    /// Set a lease key's expiry back to its lease's deadline.
    Align(Slot),
    /// Write the token clock, or the versions this build speaks, into the
    /// replication stream and the AOF.
    Announce(Announcement),
    /// A look at the running grace period: does it count, is it over?
    GraceTick,
    /// Re-check every waiter queue (the grace period ended).
    RecheckAll,
    /// Take another batch of ended holders out of a counting or shared
    /// lease key.
    Drain(Slot),
    /// A look for a `CONFIG RESETSTAT` (once a second).
    ResetstatTick,
    /// A load that read guard records is over: drop the guards whose key
    /// the server did not keep.
    GuardsLoaded,
    /// The oldest waiter of a queue is a `LEASE.MACQUIRE` waiter (this id):
    /// serve it if all its keys are free and it is the oldest waiter of each.
    MultiKey(Slot, u64),
}

/// What an announcement timer writes (its values are read when it fires).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Announcement {
    Version,
    Clock,
}

impl Announcement {
    /// The announcement as of now.
    pub fn now(self) -> Announce {
        match self {
            Announcement::Version => Announce::Version {
                effects: versions::EFFECTS,
                records: versions::RECORDS,
            },
            Announcement::Clock => Announce::Clock {
                last: super::tokens::last(),
            },
        }
    }
}

/// Starts a module timer that runs `job` in `delay_ms`.
pub fn start(delay_ms: i64, job: TimerJob) -> Option<TimerId> {
    server::start_timer(delay_ms, job)
}

/// Stops a pending timer and drops its job.
pub fn stop(id: TimerId) {
    server::stop_timer::<TimerJob>(id);
}

/// Keys whose ended holders a drain timer will take out (one timer a key).
static DRAINING: Mutex<Option<HashSet<Slot>>> = Mutex::new(None);

/// Schedules the next batch of the drain of key `name` in database `db`
/// in `delay_ms`, unless one is pending.
pub fn start_drain(db: i32, name: &[u8], delay_ms: i64) {
    let slot = (db, name.to_vec());
    let new = DRAINING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .insert(slot.clone());
    if new && start(delay_ms, TimerJob::Drain(slot.clone())).is_none() {
        end_drain(&slot);
    }
}

/// The drain timer of `slot` fired (its next batch may be scheduled again).
pub fn end_drain(slot: &Slot) {
    if let Some(set) = DRAINING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        set.remove(slot);
    }
}
