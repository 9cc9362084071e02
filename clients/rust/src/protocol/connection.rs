//! Where the connections go, and when a pooled connection is checked
//! before it carries a command.

use std::time::{Duration, Instant};

/// Where the connections go: one server, or a cluster (sync and async
/// clients alike).
#[derive(Clone)]
pub(crate) enum Backend {
    One(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// A connection idle this long is checked (`PING`) before its next call,
/// as redis-py's `health_check_interval` does: the server may have closed
/// it meanwhile (a restart, `CLIENT KILL`, its idle `timeout`), and a
/// command sent on a closed connection fails without saying whether it
/// ran. The check costs one round trip, only after a pause; calls in a row
/// go straight out.
pub(crate) const IDLE_CHECK: Duration = Duration::from_millis(100);

/// At most this many idle connections stay open per client (the rest are
/// closed when they come back): concurrent calls open more, a quiet client
/// keeps few.
pub(crate) const POOL_IDLE: usize = 8;

/// When a connection last answered, and the client's count of dropped
/// connections then: a connection idle for [`IDLE_CHECK`], or one that
/// predates a drop seen on another connection (the server restarted, say),
/// is checked before it is used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fresh {
    used: Instant,
    drops: u64,
}

impl Fresh {
    /// A connection that answered now, with `drops` seen so far.
    pub(crate) fn now(drops: u64) -> Fresh {
        Fresh {
            used: Instant::now(),
            drops,
        }
    }

    /// Must it answer a `PING` before it carries a command?
    pub(crate) fn suspect(&self, drops: u64) -> bool {
        self.drops != drops || self.used.elapsed() >= IDLE_CHECK
    }
}
