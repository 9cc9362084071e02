//! The grace period after possibly lost grants (design.md S7): after this server
//! becomes a master, or starts on data that may be older than what it
//! acknowledged, it creates no new lease until every lease that might have
//! been lost has expired.
//!
//! A period is a duration, timed on the monotonic clock (a wall-clock step
//! at boot must not end it), and it counts only time in which this server
//! could grant: a promoted master that cannot accept writes yet (no good
//! replica for `min-replicas-to-write`, writes paused, a persistence error)
//! starts counting when it first can. A grace that passes while nothing
//! could be granted protects nothing.

/// Why a grace period runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// This server became a master (REPLICAOF NO ONE, FAILOVER, a Sentinel
    /// or Cluster failover).
    Promoted,
    /// This server started on data that may be older than what it had
    /// acknowledged.
    Restart,
    /// This server started with no data file at all (no RDB, no AOF): a
    /// first start, or a restart whose files were lost. It cannot tell the
    /// two apart, so it waits as after a restart.
    NoData,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Promoted => "promoted",
            Reason::Restart => "restart",
            Reason::NoData => "no-data",
        }
    }

    pub fn from_name(name: &str) -> Option<Reason> {
        match name {
            "promoted" => Some(Reason::Promoted),
            "restart" => Some(Reason::Restart),
            "no-data" => Some(Reason::NoData),
            _ => None,
        }
    }
}

/// How long a master that lost its replicas keeps accepting writes under
/// `min-replicas-to-write`: the server checks the lag in whole seconds and
/// refreshes its count of good replicas once a second, so up to
/// `min-replicas-max-lag` + 2 s. Nothing when the setting is off (either
/// value 0).
pub fn cut_off_writes_ms(min_replicas_to_write: i64, min_replicas_max_lag_s: i64) -> i64 {
    if min_replicas_to_write > 0 && min_replicas_max_lag_s > 0 {
        min_replicas_max_lag_s
            .saturating_mul(1000)
            .saturating_add(2000)
    } else {
        0
    }
}

/// The length of a grace period: `grace_ms`, where -1 means "the longest
/// lease (`max_ttl_ms`) plus the time a cut-off master may still grant
/// (`cut_off_ms`, see `cut_off_writes_ms`)" and 0 means off.
pub fn length_ms(grace_ms: i64, max_ttl_ms: i64, cut_off_ms: i64) -> i64 {
    if grace_ms < 0 {
        max_ttl_ms.saturating_add(cut_off_ms)
    } else {
        grace_ms
    }
}

/// A running grace period. Its end follows the settings at every look (a
/// change of `grace-ms`, or with -1 of `max-ttl-ms` or `min-replicas-*`,
/// re-times it); what it keeps is how much time has counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub reason: Reason,
    /// Time counted up to `mark_ms`.
    counted_ms: i64,
    /// Monotonic ms of the last look.
    mark_ms: i64,
    /// Could this server grant at the last look? Time counts from a look
    /// at which it could, until one at which it could not.
    counting: bool,
}

impl Period {
    /// A new period at monotonic `now_ms`. It counts from the first look
    /// (`observe`) that finds the server able to grant.
    pub fn start(reason: Reason, now_ms: i64) -> Period {
        Period::resume(reason, 0, now_ms)
    }

    /// A period of which `counted_ms` had counted already (before a clean
    /// restart).
    pub fn resume(reason: Reason, counted_ms: i64, now_ms: i64) -> Period {
        Period {
            reason,
            counted_ms: counted_ms.max(0),
            mark_ms: now_ms,
            counting: false,
        }
    }

    /// Time counted at monotonic `now_ms`.
    pub fn counted_ms(&self, now_ms: i64) -> i64 {
        if self.counting {
            self.counted_ms
                .saturating_add((now_ms - self.mark_ms).max(0))
        } else {
            self.counted_ms
        }
    }

    /// Time left at `now_ms` with a period of `length_ms` (0: over).
    pub fn remaining_ms(&self, now_ms: i64, length_ms: i64) -> i64 {
        (length_ms - self.counted_ms(now_ms)).max(0)
    }

    /// Does the period count time now (the server could grant at the last
    /// look)?
    pub fn is_counting(&self) -> bool {
        self.counting
    }

    /// A look at monotonic `now_ms`: `can_grant` says whether the server
    /// could grant now. The time since the last look counts only when it
    /// could at both looks (it may have stopped being able to at any moment
    /// in between). Returns whether counting changed.
    pub fn observe(&mut self, now_ms: i64, can_grant: bool) -> bool {
        let changed = self.counting != can_grant;
        if self.counting && can_grant {
            self.counted_ms = self.counted_ms(now_ms);
        }
        self.mark_ms = now_ms;
        self.counting = can_grant;
        changed
    }
}

/// How the server's data will come back after a restart, and what the
/// previous run left.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Startup {
    /// The AOF is on with `appendfsync always`: every acknowledged write is
    /// on disk before its reply.
    pub aof_always: bool,
    /// The previous run ended with a clean shutdown that saved its data
    /// (the final RDB save, or the AOF flushed and fsynced): its mark.
    pub clean: Option<CleanMark>,
    /// A grace period was running when the previous run ended (the file a
    /// running period keeps; a period that ended removed it).
    pub was_in_grace: bool,
    /// The server has no data file to load (no RDB file, no AOF).
    pub no_data: bool,
    /// The data is a replica's copy of another master's: this server was
    /// a replica when it last ran (or since it last ended a grace as a
    /// master). A replica that shuts down may have missed the last writes
    /// its master acknowledged (it waits for its own replicas and applies
    /// nothing more meanwhile), so a clean shutdown says nothing about them.
    pub replica_data: bool,
    /// The server starts as a replica (`replicaof` in its configuration).
    pub as_replica: bool,
}

/// What a start does about the grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtStart {
    /// No period: the previous run shut down cleanly and saved.
    NoneClean,
    /// No period: the AOF is written with `appendfsync always`.
    NoneAofAlways,
    /// A full period, for this reason (`restart`, or `no-data` when there
    /// was nothing to load).
    Full(Reason),
    /// The period that ran when the previous run shut down cleanly goes on
    /// with what had counted of it.
    Resume { reason: Reason, counted_ms: i64 },
}

/// Does a start need a grace period? Anything but an AOF with `appendfsync
/// always` may come back older than what was acknowledged, unless the
/// previous run shut down cleanly. A first start cannot be told from a
/// restart that lost everything, so it gets one too (reason `no-data`,
/// when nothing else says more). A period that was
/// running goes on: resumed after a clean shutdown (which recorded how much
/// of it had counted), started anew after a crash (nothing says how much
/// had counted), whatever the persistence.
///
/// A server that starts as a master on a replica's data has, in effect,
/// been promoted: a full period with reason `promoted`, whatever its
/// persistence or clean mark (those vouch for its own writes only), unless
/// a period that was running goes on.
pub fn at_start(s: &Startup) -> AtStart {
    match &s.clean {
        Some(CleanMark {
            grace: Some((reason, counted_ms)),
            ..
        }) => AtStart::Resume {
            reason: *reason,
            counted_ms: *counted_ms,
        },
        _ if s.was_in_grace => AtStart::Full(Reason::Restart),
        _ if s.replica_data && !s.as_replica => AtStart::Full(Reason::Promoted),
        Some(_) => AtStart::NoneClean,
        None if s.aof_always => AtStart::NoneAofAlways,
        None if s.no_data => AtStart::Full(Reason::NoData),
        None => AtStart::Full(Reason::Restart),
    }
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

/// The mark a clean shutdown leaves for the next start: when, and the grace
/// period that was running then (its reason and the time it had counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanMark {
    pub at_ms: i64,
    pub grace: Option<(Reason, i64)>,
}

impl CleanMark {
    /// The mark's text: `clean shutdown at <ms> ms`, then, when a period
    /// ran, `grace <reason> counted <ms> ms`.
    pub fn format(&self) -> String {
        let mut s = format!("clean shutdown at {} ms\n", self.at_ms);
        if let Some((reason, counted)) = self.grace {
            s.push_str(&format!("grace {} counted {counted} ms\n", reason.name()));
        }
        s
    }

    /// Reads a mark. A mark that says a period ran but cannot be read whole
    /// is taken as one of which nothing had counted; any other text (older
    /// modules wrote only the first line) as a mark without a period.
    pub fn parse(text: &str) -> CleanMark {
        let mut mark = CleanMark {
            at_ms: 0,
            grace: None,
        };
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["clean", "shutdown", "at", ms, "ms"] => {
                    mark.at_ms = ms.parse().unwrap_or(0);
                }
                ["grace", rest @ ..] => {
                    let reason = rest
                        .first()
                        .and_then(|r| Reason::from_name(r))
                        .unwrap_or(Reason::Restart);
                    let counted = match rest {
                        [_, "counted", ms, "ms"] => ms.parse().unwrap_or(0),
                        _ => 0,
                    };
                    mark.grace = Some((reason, counted));
                }
                _ => {}
            }
        }
        mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_follows_the_settings() {
        assert_eq!(length_ms(-1, 60_000, 0), 60_000);
        assert_eq!(length_ms(-1, 60_000, 3_000), 63_000);
        assert_eq!(length_ms(0, 60_000, 3_000), 0);
        assert_eq!(length_ms(5_000, 60_000, 3_000), 5_000, "an explicit value");
        assert_eq!(cut_off_writes_ms(0, 10), 0);
        assert_eq!(cut_off_writes_ms(1, 0), 0, "max-lag 0 turns the check off");
        assert_eq!(cut_off_writes_ms(1, 1), 3_000);
        assert_eq!(cut_off_writes_ms(2, 10), 12_000);
    }

    #[test]
    fn a_period_counts_only_while_the_server_could_grant() {
        let mut p = Period::start(Reason::Promoted, 1_000);
        assert_eq!(p.remaining_ms(5_000, 2_000), 2_000, "nothing counted yet");
        assert!(!p.observe(5_000, false), "still not counting");
        assert!(!p.is_counting());
        p.observe(6_000, true);
        assert!(p.is_counting());
        assert_eq!(p.remaining_ms(6_500, 2_000), 1_500);
        // It stops being able to grant: the time since the last look is
        // not counted (it may have stopped right after it).
        assert!(p.observe(6_800, false));
        assert_eq!(p.remaining_ms(9_000, 2_000), 2_000);
        p.observe(10_000, true);
        p.observe(10_400, true);
        assert_eq!(p.remaining_ms(10_400, 2_000), 1_600);
        assert_eq!(p.remaining_ms(12_400, 2_000), 0);
        assert_eq!(p.remaining_ms(10_400, 100), 0, "a shorter setting ends it");
        assert_eq!(Reason::Restart.name(), "restart");
    }

    #[test]
    fn a_resumed_period_keeps_what_had_counted() {
        let mut p = Period::resume(Reason::Promoted, 1_200, 50);
        assert_eq!(p.remaining_ms(50, 2_000), 800);
        p.observe(60, true);
        assert_eq!(p.remaining_ms(460, 2_000), 400);
        assert_eq!(Period::resume(Reason::Restart, -5, 0).counted_ms(0), 0);
    }

    #[test]
    fn which_starts_need_a_grace() {
        let s = |aof_always, clean: Option<CleanMark>, was_in_grace| Startup {
            aof_always,
            clean,
            was_in_grace,
            no_data: false,
            replica_data: false,
            as_replica: false,
        };
        let first = |aof_always, was_in_grace| Startup {
            no_data: true,
            ..s(aof_always, None, was_in_grace)
        };
        let clean = Some(CleanMark {
            at_ms: 1,
            grace: None,
        });
        let resumed = Some(CleanMark {
            at_ms: 1,
            grace: Some((Reason::Promoted, 700)),
        });
        assert_eq!(
            at_start(&s(false, None, false)),
            AtStart::Full(Reason::Restart)
        );
        assert_eq!(at_start(&s(true, None, false)), AtStart::NoneAofAlways);
        assert_eq!(
            at_start(&first(false, false)),
            AtStart::Full(Reason::NoData),
            "nothing to load: a first start, or lost files"
        );
        assert_eq!(at_start(&first(true, false)), AtStart::NoneAofAlways);
        assert_eq!(
            at_start(&first(false, true)),
            AtStart::Full(Reason::Restart),
            "the period that ran says more than the missing files"
        );
        assert_eq!(
            at_start(&s(false, clean.clone(), false)),
            AtStart::NoneClean
        );
        assert_eq!(
            at_start(&s(false, resumed.clone(), true)),
            AtStart::Resume {
                reason: Reason::Promoted,
                counted_ms: 700
            }
        );
        assert_eq!(
            at_start(&s(true, resumed, true)),
            AtStart::Resume {
                reason: Reason::Promoted,
                counted_ms: 700
            },
            "appendfsync always does not cancel a running period"
        );
        assert_eq!(
            at_start(&s(true, None, true)),
            AtStart::Full(Reason::Restart),
            "a crash during a period: it starts anew"
        );
        assert_eq!(
            at_start(&s(false, clean, true)),
            AtStart::Full(Reason::Restart)
        );
        assert_eq!(Reason::from_name("no-data"), Some(Reason::NoData));
        assert!(shutdown_was_clean(true, true, 99, false));
        assert!(!shutdown_was_clean(true, false, 0, true));
        assert!(shutdown_was_clean(false, true, 0, true));
        assert!(!shutdown_was_clean(false, true, 3, true));
        assert!(!shutdown_was_clean(false, true, 0, false));
    }

    #[test]
    fn a_master_start_on_a_replicas_data_is_a_promotion_whatever_else_holds() {
        let clean = Some(CleanMark {
            at_ms: 5,
            grace: None,
        });
        for (aof_always, clean) in [(false, clean.clone()), (true, None), (true, clean)] {
            let s = Startup {
                aof_always,
                clean,
                replica_data: true,
                ..Startup::default()
            };
            assert_eq!(at_start(&s), AtStart::Full(Reason::Promoted), "{s:?}");
            // Started as a replica again: it grants nothing, and its
            // promotion will start a period of its own.
            let replica = Startup {
                as_replica: true,
                ..s.clone()
            };
            assert_ne!(at_start(&replica), AtStart::Full(Reason::Promoted));
        }
    }

    #[test]
    fn the_clean_mark_round_trips() {
        for grace in [
            None,
            Some((Reason::Promoted, 1234)),
            Some((Reason::Restart, 0)),
        ] {
            let m = CleanMark { at_ms: 99, grace };
            assert_eq!(CleanMark::parse(&m.format()), m);
        }
        // What older modules wrote: the first line only.
        assert_eq!(
            CleanMark::parse("clean shutdown at 5 ms\n"),
            CleanMark {
                at_ms: 5,
                grace: None
            }
        );
        // A period line that cannot be read whole counts nothing.
        assert_eq!(
            CleanMark::parse("grace bogus\n").grace,
            Some((Reason::Restart, 0))
        );
    }
}
