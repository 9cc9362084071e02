//! The grace period after possibly lost grants (SPEC S7): after this server
//! becomes a master, or starts on data that may be older than what it
//! acknowledged, it creates no new lease until every lease that might have
//! been lost has expired.

/// Why a grace period runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// This server became a master (REPLICAOF NO ONE, FAILOVER, a Sentinel
    /// or Cluster failover).
    Promoted,
    /// This server started on data that may be older than what it had
    /// acknowledged.
    Restart,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Promoted => "promoted",
            Reason::Restart => "restart",
        }
    }
}

/// The length of a grace period: `grace_ms`, where -1 means "equal to
/// `max_ttl_ms`" and 0 means off.
pub fn length_ms(grace_ms: i64, max_ttl_ms: i64) -> i64 {
    if grace_ms < 0 { max_ttl_ms } else { grace_ms }
}

/// A running grace period: since when and why. Its end follows the
/// settings at every look, so a change of `grace-ms` (or of `max-ttl-ms`
/// with `grace-ms -1`) re-times it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub started_ms: i64,
    pub reason: Reason,
}

impl Period {
    pub fn ends_ms(&self, length_ms: i64) -> i64 {
        self.started_ms.saturating_add(length_ms)
    }

    /// Time left at `now_ms` (0: over).
    pub fn remaining_ms(&self, now_ms: i64, length_ms: i64) -> i64 {
        (self.ends_ms(length_ms) - now_ms).max(0)
    }
}

/// How the server's data will come back after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Startup {
    /// The AOF is on with `appendfsync always`: every acknowledged write is
    /// on disk before its reply.
    pub aof_always: bool,
    /// The previous run ended with a clean shutdown that saved its data
    /// (the final RDB save, or the AOF flushed and fsynced).
    pub clean_shutdown: bool,
}

/// Does a start with these settings need a grace period? Anything but an
/// AOF with `appendfsync always` may come back older than what was
/// acknowledged, unless the previous run shut down cleanly. A first start
/// cannot be told from a restart that lost everything, so it gets one too.
pub fn start_needs_grace(s: Startup) -> bool {
    !(s.aof_always || s.clean_shutdown)
}

/// Was a shutdown clean, given what the server says right after its final
/// save: with the AOF on, its writes flushed without error; with it off,
/// nothing changed since the last successful RDB save.
pub fn shutdown_was_clean(
    aof_enabled: bool,
    aof_write_ok: bool,
    rdb_changes_since_save: i64,
    rdb_save_ok: bool,
) -> bool {
    if aof_enabled {
        aof_write_ok
    } else {
        rdb_changes_since_save == 0 && rdb_save_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_follows_the_settings() {
        assert_eq!(length_ms(-1, 60_000), 60_000);
        assert_eq!(length_ms(0, 60_000), 0);
        assert_eq!(length_ms(5_000, 60_000), 5_000);
    }

    #[test]
    fn a_period_is_retimed_by_its_length() {
        let p = Period {
            started_ms: 1000,
            reason: Reason::Promoted,
        };
        assert_eq!(p.remaining_ms(1500, 2000), 1500);
        assert_eq!(p.remaining_ms(1500, 100), 0, "a shorter setting ends it");
        assert_eq!(p.remaining_ms(1500, 0), 0);
        assert_eq!(p.ends_ms(i64::MAX), i64::MAX);
        assert_eq!(Reason::Restart.name(), "restart");
    }

    #[test]
    fn which_starts_need_a_grace() {
        let s = |aof_always, clean_shutdown| Startup {
            aof_always,
            clean_shutdown,
        };
        assert!(start_needs_grace(s(false, false)));
        assert!(!start_needs_grace(s(true, false)));
        assert!(!start_needs_grace(s(false, true)));
        assert!(shutdown_was_clean(true, true, 99, false));
        assert!(!shutdown_was_clean(true, false, 0, true));
        assert!(shutdown_was_clean(false, true, 0, true));
        assert!(!shutdown_was_clean(false, true, 3, true));
        assert!(!shutdown_was_clean(false, true, 0, false));
    }
}
