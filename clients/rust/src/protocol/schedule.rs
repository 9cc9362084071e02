//! The watchdog's schedule: when each renewal is due, which go out
//! together in one pipeline, what each reply does to its lease, and how
//! long an idle watchdog lingers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;

/// One renewal's reply: an integer, or anything else (an error reply).
impl From<redis::Value> for Reply {
    fn from(value: redis::Value) -> Reply {
        match value {
            redis::Value::Int(n) => Reply::Int(n),
            _ => Reply::Failed,
        }
    }
}

/// The renewal interval for `ttl`: a third of it (at least 1 ms).
pub(crate) fn renew_every(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// The pause before a renewal that failed (not refused) is tried again.
pub(crate) fn retry_pause(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

/// A renewal due within this of a batch goes out with it (early, which is
/// harmless: the deadline only moves later), so leases taken at different
/// moments fall into step and share their round trips.
pub(crate) fn renew_window(ttl: Duration) -> Duration {
    ttl / 12
}

/// How long a watchdog with no lease left waits for the next one before it
/// ends: a client that takes and gives back leases one after the other
/// keeps one watchdog instead of starting one a lease.
pub(crate) const WATCHDOG_LINGER: Duration = Duration::from_secs(5);

/// The time a watchdog idle since `since` still lingers at `now`; `None`
/// once [`WATCHDOG_LINGER`] has passed.
pub(crate) fn linger_left(since: Instant, now: Instant) -> Option<Duration> {
    WATCHDOG_LINGER
        .checked_sub(now.saturating_duration_since(since))
        .filter(|left| !left.is_zero())
}

/// What the watchdog's schedule needs of a lease's loss signal.
pub(crate) trait Renewable {
    /// Neither lost nor released: worth renewing.
    fn live(&self) -> bool;
    /// The client-side deadline now.
    fn deadline(&self) -> Instant;
    /// A renewal sent at `sent` answered 1. False: lost or released
    /// meanwhile, renew no more.
    fn renewed(&self, sent: Instant, ttl: Duration) -> bool;
    /// A renewal answered 0: the server says the lease is not ours.
    fn refused(&self);
}

struct Entry<S> {
    ttl: Duration,
    next: Instant,
    /// `LEASE.RENEW`, or one `LEASE.MRENEW` for every key of a multi-key
    /// lease.
    cmd: redis::Cmd,
    /// What a renewal of every key answers (1, or the number of keys).
    renewed: i64,
    /// The key to route the renewal by on a cluster ([`Keys::route`]).
    route: Option<String>,
    signal: S,
}

/// The renewals of one batch: one pipeline per server.
pub(crate) struct Batch {
    ids: Vec<u64>,
    /// The `LEASE.RENEW` (or `LEASE.MRENEW`) of each lease of the batch,
    /// in order.
    pub(crate) cmds: Vec<redis::Cmd>,
    /// For each command, the key a cluster client must route it by
    /// ([`Keys::route`]; `None`: as usual).
    pub(crate) routes: Vec<Option<String>>,
    /// When the batch is sent: each success counts its ttl from here.
    pub(crate) sent: Instant,
    /// How long to wait for the replies: until the latest deadline of the
    /// batch (a reply after it renews nothing), at most the io timeout.
    pub(crate) read: Duration,
}

/// The reply to one renewal of a batch.
pub(crate) enum Reply {
    /// An integer reply: the number of keys renewed (1, or every key of a
    /// multi-key lease), 0 refused.
    Int(i64),
    /// An error reply, or no reply: tried again after a pause.
    Failed,
}

/// The watchdog's plan for every lease of a client: when each renewal is
/// due, which renewals go out together, what each reply does to its lease.
/// One per client (and its clones), whatever the number of leases; the I/O
/// layer only sends [`Batch`]es and hands their replies to
/// [`Schedule::settle`].
pub(crate) struct Schedule<S> {
    leases: HashMap<u64, Entry<S>>,
    next_id: u64,
    /// When the watchdog looks again (`None`: it is not running): a lease
    /// added whose first renewal is due later needs no wake-up, so adding
    /// many leases does not make the watchdog scan them all each time.
    looks_at: Option<Instant>,
    /// Renewals sent, and the round trips that carried them.
    pub(crate) renewals: u64,
    pub(crate) round_trips: u64,
}

impl<S> Default for Schedule<S> {
    fn default() -> Self {
        Schedule {
            leases: HashMap::new(),
            next_id: 0,
            looks_at: None,
            renewals: 0,
            round_trips: 0,
        }
    }
}

/// What the watchdog does next.
pub(crate) enum Next {
    /// Send this batch now.
    Send(Batch),
    /// Sleep until then (or until a lease is added).
    Sleep(Instant),
    /// No lease left: stop.
    Idle,
}

impl<S: Renewable> Schedule<S> {
    /// Watches a lease on `keys` (every key of a multi-key lease renewed by
    /// one `LEASE.MRENEW`): its first renewal is due at `first`. Returns its
    /// id, and whether the watchdog must be woken (it would look too late).
    pub(crate) fn add(
        &mut self,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        first: Instant,
        signal: S,
    ) -> (u64, bool) {
        self.next_id += 1;
        let entry = Entry {
            ttl,
            next: first,
            cmd: keys.renew_cmd(owner, ttl),
            renewed: keys.count(),
            route: keys.route().map(str::to_string),
            signal,
        };
        self.leases.insert(self.next_id, entry);
        let wake = self.looks_at.is_none_or(|at| first < at);
        (self.next_id, wake)
    }

    /// The watchdog has no lease and lingers until `at` (see
    /// [`WATCHDOG_LINGER`]): it looks again then, so a lease whose first
    /// renewal is later need not wake it.
    pub(crate) fn idle_until(&mut self, at: Instant) {
        self.looks_at = Some(at);
    }

    /// Stops watching a lease (released).
    pub(crate) fn remove(&mut self, id: u64) {
        self.leases.remove(&id);
    }

    /// How many leases are watched.
    pub(crate) fn len(&self) -> usize {
        self.leases.len()
    }

    /// At `now`: forgets the leases lost or released, then either the batch
    /// of every renewal due within its window (when at least one is due),
    /// or when to look again.
    pub(crate) fn next(&mut self, now: Instant, io_timeout: Duration) -> Next {
        self.leases.retain(|_, e| e.signal.live());
        let Some(first) = self.leases.values().map(|e| e.next).min() else {
            self.looks_at = None;
            return Next::Idle;
        };
        // After a batch the watchdog looks again at once (settle, then next).
        self.looks_at = Some(first.max(now));
        if first > now {
            return Next::Sleep(first);
        }
        let mut batch = Batch {
            ids: Vec::new(),
            cmds: Vec::new(),
            routes: Vec::new(),
            sent: now,
            read: Duration::from_millis(1),
        };
        for (id, e) in &self.leases {
            if e.next <= now + renew_window(e.ttl) {
                batch.ids.push(*id);
                batch.cmds.push(e.cmd.clone());
                batch.routes.push(e.route.clone());
                let left = e.signal.deadline().saturating_duration_since(now);
                batch.read = batch.read.max(left.min(io_timeout));
            }
        }
        Next::Send(batch)
    }

    /// The replies to `batch`, in its order (fewer than its commands, or
    /// none: the rest got no reply). A renewal of every key (1, or the
    /// number of keys of a multi-key lease) moves the lease's deadline and
    /// its next renewal to a third of the ttl after the batch was sent;
    /// another integer (0) is the loss; anything else is tried again soon.
    pub(crate) fn settle(&mut self, batch: &Batch, replies: Vec<Reply>) {
        self.round_trips += 1;
        self.renewals += batch.ids.len() as u64;
        let mut replies = replies.into_iter();
        for id in &batch.ids {
            let reply = replies.next().unwrap_or(Reply::Failed);
            let Some(e) = self.leases.get_mut(id) else {
                continue;
            };
            match reply {
                Reply::Int(n) if n == e.renewed && e.signal.renewed(batch.sent, e.ttl) => {
                    e.next = batch.sent + renew_every(e.ttl);
                }
                Reply::Int(n) if n == e.renewed => {
                    self.leases.remove(id);
                }
                Reply::Int(_) => {
                    e.signal.refused();
                    self.leases.remove(id);
                }
                Reply::Failed => e.next = Instant::now() + retry_pause(e.ttl),
            }
        }
    }
}
