//! The counters and distributions of `INFO lease`: the one instance of
//! each the binding records in (the tables are `lease::stats` and
//! `lease::distribution`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::lease::distribution::{Distributions, Sample, renewed_late};
use crate::lease::ops::Count;
pub use crate::lease::stats::Stats;

use super::ffi::ctx::Ctx;
use super::ffi::server;
use super::timers::{self, TimerJob};

pub static STATS: Stats = Stats::new();

/// The distributions (design.md S11), since the start or the last
/// `CONFIG RESETSTAT`.
pub static DISTRIBUTIONS: Distributions = Distributions::new();

impl Stats {
    /// Counts a refusal answered at once.
    pub fn count(&self, c: Count) {
        match c {
            Count::Contended => self.contended.incr(),
            Count::GraceRefused => self.grace_refused.incr(),
            Count::RenewFailed => self.renew_failed.incr(),
            Count::ReleaseFailed => self.release_failed.incr(),
        }
    }
}

/// Records what a commit tells the distributions.
#[inline]
pub fn record(sample: Sample) {
    match sample {
        Sample::Held(ms) => DISTRIBUTIONS.held.record(ms),
        Sample::Renewed { left_ms, ttl_ms } => {
            DISTRIBUTIONS.renew_margin.record(left_ms);
            if renewed_late(left_ms, ttl_ms) {
                STATS.renewed_late.incr();
            }
        }
    }
}

/// How often the module looks for a `CONFIG RESETSTAT` (design.md S11:
/// noticed within a second; the server tells a module nothing of it, and
/// no other command may pay for noticing it).
const RESETSTAT_LOOK_EVERY_MS: i64 = 1000;

/// The server's `total_commands_processed` and `total_connections_received`
/// at the last look. Both only go down when `CONFIG RESETSTAT` zeroes them.
static SEEN_COMMANDS: AtomicU64 = AtomicU64::new(0);
static SEEN_CONNECTIONS: AtomicU64 = AtomicU64::new(0);

/// At load: the first look, and a look every second from then on.
pub fn watch_resetstat(ctx: Ctx) {
    notice_resetstat(ctx);
    timers::start(RESETSTAT_LOOK_EVERY_MS, TimerJob::ResetstatTick);
}

/// The module's once-a-second timer: a look for a `CONFIG RESETSTAT`, and
/// the server events nobody needs any more let go. Never inlined:
/// `bench/callgrind.sh` leaves this background work out by its name.
#[inline(never)]
pub fn on_resetstat_tick(ctx: Ctx) {
    notice_resetstat(ctx);
    server::settle_keyspace_moves();
    timers::start(RESETSTAT_LOOK_EVERY_MS, TimerJob::ResetstatTick);
}

/// Empties the distributions if the server's statistics went down since
/// the last look: a `CONFIG RESETSTAT` ran (on the timer, and before
/// `INFO lease` answers). A reset followed, before the next look, by as
/// many commands and connections as the server had seen before it goes
/// unnoticed.
pub fn notice_resetstat(ctx: Ctx) {
    let [commands, connections] = ctx
        .server_info_fields(
            c"stats",
            [c"total_commands_processed", c"total_connections_received"],
        )
        .map(|v| v.and_then(|v| v.trim().parse::<u64>().ok()));
    let (Some(commands), Some(connections)) = (commands, connections) else {
        return;
    };
    let fewer_commands = commands < SEEN_COMMANDS.swap(commands, Relaxed);
    let fewer_connections = connections < SEEN_CONNECTIONS.swap(connections, Relaxed);
    if fewer_commands || fewer_connections {
        DISTRIBUTIONS.reset();
    }
}

/// `notice_resetstat` where no call's context is at hand (`INFO lease`).
pub fn notice_resetstat_now() {
    if let Some(ctx) = server::detached() {
        notice_resetstat(ctx);
    }
}

/// A `BLOCK` wait that lasted `ms` ended (served or timed out).
pub fn record_waited(ms: i64) {
    DISTRIBUTIONS.waited.record(ms)
}
