//! The grace period after possibly lost grants (design.md S7): when it starts
//! (a promotion; a server start whose data may be older than what it
//! acknowledged), how it counts (a timer looks every `TICK_MS` whether this
//! server could grant, and only such time counts, on the monotonic clock),
//! when it ends (re-timed by every change of `lease.grace-ms` or, with -1,
//! of `lease.max-ttl-ms` and `min-replicas-*`), and what survives a restart.
//!
//! How the module learns of each event, on Redis 7.0 to 8.2 and Valkey:
//! - promotion: the REPLICATION_ROLE_CHANGED server event, NOW_MASTER (it
//!   fires for REPLICAOF NO ONE, FAILOVER, Sentinel and Cluster failovers);
//! - a server start rather than `MODULE LOAD`: the SERVER_STARTUP context
//!   flag (Valkey) or no connection received yet (`total_connections_received`
//!   is 0 during a startup OnLoad on every server; a MODULE LOAD always comes
//!   through one);
//! - the persistence it will load: `CONFIG GET appendonly` / `appendfsync`
//!   at OnLoad (configs are read before modules load);
//! - whether it could grant now: the same probe as the write gates
//!   (`effects::node_accepts_writes`: not a replica, writes not paused, no
//!   NOREPLICAS or MISCONF). A period on a replica is dropped: a replica
//!   grants nothing, and its promotion starts a new one;
//! - a clean shutdown that saved: the SHUTDOWN server event fires after the
//!   final AOF fsync and RDB save (and not when the save fails and the server
//!   stays up). Then INFO persistence says whether everything is on disk;
//!   if so the module writes a mark file in the server's directory, which
//!   the next start reads and deletes (trusted once: if that run crashes,
//!   the start after it has a grace period again). The mark records the
//!   period that was running, so that a clean restart resumes it.
//! - a period that runs keeps a file of its own in the server's directory
//!   until it ends, so that a crash during it starts it anew at the next
//!   start whatever the persistence.
//! - data that is a replica's copy: a node that becomes a replica (the
//!   role event, or a start with `replicaof`) writes a mark file in the
//!   server's directory, removed when, as a master, it ends a grace period
//!   (or runs none, with `lease.grace-ms 0`). A start as a master with the
//!   mark there is a promotion: a full period, whatever the clean mark or
//!   the persistence say (a replica that shuts down may have missed the
//!   last writes its master acknowledged).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::lease::config::OnChange;
use crate::lease::grace::{self, AtStart, CleanMark, Period, Reason, Startup};

use super::commit::node_accepts_writes;
use super::ffi::ctx::Ctx;
use super::ffi::server::{TimerId, log_notice, log_warning, mono_ms, now_ms};
use super::settings::{self, MIN_REPLICAS_MAX_LAG, MIN_REPLICAS_TO_WRITE};
use super::timers::{self, TimerJob};
use super::tokens;

/// How long this master keeps accepting writes once cut off from its
/// replicas (0 without `min-replicas-to-write`).
pub fn cut_off_writes_ms() -> i64 {
    grace::cut_off_writes_ms(
        MIN_REPLICAS_TO_WRITE.load(Relaxed),
        MIN_REPLICAS_MAX_LAG.load(Relaxed),
    )
}

/// The length of a grace period under the current settings.
pub fn length_ms() -> i64 {
    grace::length_ms(
        settings::grace_ms(),
        settings::max_ttl_ms(),
        cut_off_writes_ms(),
    )
}

/// The running grace period (design.md S7), if any; its end follows the settings.
static GRACE: Mutex<Option<Period>> = Mutex::new(None);
/// Whether `GRACE` holds a period: the hot paths read this alone.
static GRACE_SET: AtomicBool = AtomicBool::new(false);

pub fn period() -> Option<Period> {
    if !GRACE_SET.load(Relaxed) {
        return None;
    }
    *GRACE.lock().unwrap_or_else(|e| e.into_inner())
}

fn set_period(period: Option<Period>) {
    *GRACE.lock().unwrap_or_else(|e| e.into_inner()) = period;
    GRACE_SET.store(period.is_some(), Relaxed);
}

/// Time left of the grace period now (0: none, or over).
pub fn remaining_ms() -> i64 {
    period().map_or(0, |p| p.remaining_ms(mono_ms(), length_ms()))
}

/// When the running grace period would end (wall clock) if it counted
/// from `now_ms` on, if one runs.
#[inline]
pub fn ends_at(now_ms: i64) -> Option<i64> {
    if !GRACE_SET.load(Relaxed) {
        return None;
    }
    let left = remaining_ms();
    (left > 0).then_some(now_ms + left)
}

/// The mark a clean shutdown leaves in the server's working directory (its
/// `dir`), for the next start.
pub const CLEAN_MARK: &str = "lease-clean-shutdown.mark";
/// The file a running period keeps in the server's working directory.
pub const RUNNING_MARK: &str = "lease-grace-running.mark";
/// The file a node whose data is a replica's copy keeps in the server's
/// working directory.
pub const REPLICA_MARK: &str = "lease-replica-data.mark";

/// Marks this node's data as a replica's copy (it became a replica).
fn mark_replica_data() {
    if let Err(e) = std::fs::write(REPLICA_MARK, "replica data\n") {
        log_warning(&format!(
            "cannot write {REPLICA_MARK} ({e}): if this replica restarts as a master, it may grant leases its old master granted, with no grace period"
        ));
    }
}

/// This node's data is its own again (a master that ended a grace period,
/// or runs none).
fn unmark_replica_data() {
    let _ = std::fs::remove_file(REPLICA_MARK);
}

/// How often a running period looks whether this server could grant.
const TICK_MS: i64 = 100;

/// Whether the running period's last log line said it paused (so that the
/// moment it counts again is logged too, and a period that counts from its
/// first look logs nothing more).
static PAUSE_LOGGED: AtomicBool = AtomicBool::new(false);

/// The timer of the running period's next look.
static TICK_TIMER: Mutex<Option<TimerId>> = Mutex::new(None);

fn event_name(reason: Reason) -> &'static str {
    match reason {
        Reason::Promoted => "promotion",
        Reason::Restart => "start",
        Reason::NoData => "start with no data file",
    }
}

/// Starts a grace period now (a new promotion replaces a running period).
pub fn start(reason: Reason) {
    begin(Period::start(reason, mono_ms()), "started");
}

fn begin(period: Period, how: &str) {
    let length = length_ms();
    if length == 0 {
        let line = format!(
            "no grace period after this {} (lease.grace-ms is 0)",
            event_name(period.reason)
        );
        if period.reason == Reason::Promoted || replicated() {
            log_warning(&format!(
                "{line}: leases the old master or the previous run granted may be granted again at once; set lease.grace-ms back to -1 once a planned switchover is done (a CONFIG REWRITE keeps 0)"
            ));
        } else {
            log_notice(&line);
        }
        unmark_replica_data();
        return;
    }
    let reason = period.reason;
    PAUSE_LOGGED.store(false, Relaxed);
    set_period(Some(period));
    let left = remaining_ms();
    if left == 0 {
        end();
        return;
    }
    if let Err(e) = std::fs::write(RUNNING_MARK, format!("grace {}\n", reason.name())) {
        log_warning(&format!(
            "cannot write {RUNNING_MARK} ({e}): a crash during this grace period would not start it anew"
        ));
    }
    log_warning(&format!(
        "grace period {how} ({}): no new lease for {left} ms, so that no lease that may have been lost is granted twice (time counts only while this server accepts writes)",
        reason.name()
    ));
    arm(0);
}

/// Carries out what a change of a setting does (its row's `on_change`).
pub fn setting_changed(change: OnChange) {
    match change {
        OnChange::RetimeGrace => {
            warn_if_short();
            if off_in_replicated_setup() {
                log_warning(
                    "lease.grace-ms is 0 on a node with replicas or min-replicas-to-write: the next failover or restart runs no grace period; set it back to -1 once the switchover is done (a CONFIG REWRITE now would keep 0)",
                );
            }
            retime();
        }
    }
}

/// Re-times the running period after a settings change. A length of 0
/// ends it at once, within the `CONFIG SET` (from a timer, a `CONFIG SET`
/// that restores the old value right after could come first and keep the
/// period: the documented way to end one is to set 0, then restore).
pub fn retime() {
    if period().is_none() {
        return;
    }
    if length_ms() == 0 {
        if super::ffi::server::detached().is_some_and(|ctx| ctx.is_replica()) {
            end_on_replica();
        } else {
            end();
        }
        return;
    }
    arm(0);
}

/// (Re)schedules the next look in `delay_ms`.
fn arm(delay_ms: i64) {
    let timer = timers::start(delay_ms, TimerJob::GraceTick);
    let old = std::mem::replace(
        &mut *TICK_TIMER.lock().unwrap_or_else(|e| e.into_inner()),
        timer,
    );
    if let Some(old) = old {
        timers::stop(old);
    }
}

/// Ends the running period: new leases are granted again, and every queue
/// is re-checked (by a 0 ms timer) so waiters are served, first come first
/// served.
fn end() {
    set_period(None);
    let _ = std::fs::remove_file(RUNNING_MARK);
    unmark_replica_data();
    log_warning("grace period ended: new leases are granted again");
    timers::start(0, TimerJob::RecheckAll);
}

/// Ends the running period of a server that is a replica: a replica grants
/// nothing, and its promotion starts a new period of its own.
fn end_on_replica() {
    set_period(None);
    let _ = std::fs::remove_file(RUNNING_MARK);
    log_notice(
        "grace period dropped: this server is a replica, which grants nothing (a promotion starts a new period)",
    );
}

/// The period's timer fired: a look at whether this server could grant,
/// then the end, or the next look (at the end, if the time counts).
pub fn on_tick(ctx: Ctx) {
    *TICK_TIMER.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let Some(mut period) = period() else {
        return;
    };
    if ctx.is_replica() {
        end_on_replica();
        return;
    }
    let now = mono_ms();
    let can_grant = node_accepts_writes(ctx);
    period.observe(now, can_grant);
    let left = period.remaining_ms(now, length_ms());
    if !can_grant && !PAUSE_LOGGED.swap(true, Relaxed) {
        log_warning(&format!(
            "grace period paused: this server cannot accept writes now (a replica, too few good replicas for min-replicas-to-write, a persistence error, or writes paused); {left} ms remain and count from when it can"
        ));
    } else if can_grant && PAUSE_LOGGED.swap(false, Relaxed) {
        log_notice(&format!(
            "grace period counting again: this server accepts writes; {left} ms remain"
        ));
    }
    set_period(Some(period));
    if left == 0 {
        end();
    } else if period.is_counting() {
        arm(left.min(TICK_MS));
    } else {
        arm(TICK_MS);
    }
}

/// A change of role: becoming a master starts a period (a demotion does
/// not matter: a replica grants nothing).
pub fn on_role_change(now_master: bool) {
    if now_master {
        super::compat::on_promoted();
        start(Reason::Promoted);
    } else {
        mark_replica_data();
    }
}

/// Is this node part of a replicated setup: a replica, a master with
/// replicas connected, or one with `min-replicas-to-write`? Its failovers
/// and restarts need the grace period.
fn replicated() -> bool {
    if MIN_REPLICAS_TO_WRITE.load(Relaxed) > 0 {
        return true;
    }
    super::ffi::server::detached().is_some_and(|ctx| {
        ctx.is_replica()
            || ctx
                .server_info(c"replication", c"connected_slaves")
                .and_then(|n| n.parse::<i64>().ok())
                .is_some_and(|n| n > 0)
    })
}

/// `lease.grace-ms` is 0 on a node of a replicated setup: a failover or a
/// restart runs no grace period (`INFO lease`: `lease_grace_off`).
pub fn off_in_replicated_setup() -> bool {
    settings::grace_ms() == 0 && replicated()
}

/// Was the module loaded at server start (not by MODULE LOAD)?
fn at_server_start(ctx: Ctx) -> bool {
    if ctx.server_startup() {
        return true;
    }
    ctx.server_info(c"stats", c"total_connections_received")
        .as_deref()
        == Some("0")
}

/// At load: the server's `min-replicas-*`, and at a server start whose data
/// may be older than what it acknowledged, a period (or the one that ran
/// when the previous run shut down cleanly, resumed).
pub fn at_load(ctx: Ctx) {
    refresh_replica_settings(ctx);
    if !at_server_start(ctx) {
        return;
    }
    let clean = std::fs::read_to_string(CLEAN_MARK)
        .ok()
        .map(|t| CleanMark::parse(&t));
    let _ = std::fs::remove_file(CLEAN_MARK);
    let as_replica = ctx.is_replica();
    let startup = Startup {
        aof_always: ctx.config_get(c"appendonly").as_deref() == Some("yes")
            && ctx.config_get(c"appendfsync").as_deref() == Some("always"),
        clean,
        was_in_grace: std::path::Path::new(RUNNING_MARK).exists(),
        no_data: !has_data_files(ctx),
        replica_data: std::path::Path::new(REPLICA_MARK).exists(),
        as_replica,
    };
    if as_replica {
        mark_replica_data();
    }
    if settings::grace_ms() == 0 && (as_replica || replicated()) {
        log_warning(
            "lease.grace-ms is 0 on a node with replicas or min-replicas-to-write: a failover or a restart will run no grace period, and leases that were lost may be granted twice (set it to -1, the default)",
        );
    }
    if startup.replica_data && !as_replica && settings::grace_ms() != 0 {
        log_warning(
            "this server starts as a master on data it had as a replica: a grace period as after a promotion (a replica that shut down may have missed writes its master acknowledged)",
        );
    }
    let at_start = grace::at_start(&startup);
    let length = length_ms();
    if matches!(at_start, AtStart::Full(_) | AtStart::Resume { .. })
        && length > 0
        && length < crate::lease::limits::MIN_FLOOR_AHEAD_MS
    {
        // The data may be older than what the previous run acknowledged, a
        // FLOOR among it, and the grace is shorter than the FLOOR bound: no
        // token below any FLOOR the previous run could have accepted. (A
        // grace at least that long covers it: no token is issued before it
        // ends. With grace-ms 0 a start promises nothing of what was lost.)
        tokens::issue_at_least(crate::lease::clock::start_floor(now_ms(), length));
    }
    match at_start {
        AtStart::NoneClean => {
            log_notice("no grace period: the previous run shut down cleanly and saved its data")
        }
        AtStart::NoneAofAlways => {
            log_notice("no grace period: the AOF is written with appendfsync always")
        }
        AtStart::Full(reason) => start(reason),
        AtStart::Resume { reason, counted_ms } => begin(
            Period::resume(reason, counted_ms, mono_ms()),
            "resumed after a clean restart",
        ),
    }
}

/// Does the server's `dir` (the working directory at load) hold a data file
/// it will load: the RDB file (`dbfilename`) or an AOF directory
/// (`appenddirname`) with something in it? When a setting cannot be read,
/// yes (the reason then stays `restart`).
fn has_data_files(ctx: Ctx) -> bool {
    let rdb = ctx
        .config_get(c"dbfilename")
        .is_none_or(|f| std::path::Path::new(&f).exists());
    let aof = ctx
        .config_get(c"appenddirname")
        .is_none_or(|d| std::fs::read_dir(d).is_ok_and(|mut entries| entries.next().is_some()));
    rdb || aof
}

/// Reads `min-replicas-to-write` and `min-replicas-max-lag` (at load and
/// after a CONFIG SET of either): with `lease.grace-ms -1` the period
/// covers the time a cut-off master may still grant. Warns when an explicit
/// `lease.grace-ms` is shorter than that rule.
pub fn refresh_replica_settings(ctx: Ctx) {
    let get = |name| {
        ctx.config_get(name)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    MIN_REPLICAS_TO_WRITE.store(get(c"min-replicas-to-write"), Relaxed);
    MIN_REPLICAS_MAX_LAG.store(get(c"min-replicas-max-lag"), Relaxed);
    warn_if_short();
    retime();
}

/// Logs a warning when `lease.grace-ms` is set below the longest lease plus
/// the time a cut-off master may still grant.
pub fn warn_if_short() {
    let set = settings::grace_ms();
    let rule = grace::length_ms(-1, settings::max_ttl_ms(), cut_off_writes_ms());
    if set > 0 && set < rule {
        log_warning(&format!(
            "lease.grace-ms is {set}, shorter than lease.max-ttl-ms + min-replicas-max-lag + 2 s = {rule} ms: after a failover a lease granted by the old master may still be held when this one grants it again (use -1 to follow the rule)"
        ));
    }
}

/// The SHUTDOWN event (after the final save): leaves the clean mark when
/// everything acknowledged is on disk, with the period that runs, if one.
pub fn on_shutdown(ctx: Ctx) {
    let now = mono_ms();
    let grace = period()
        .filter(|p| p.remaining_ms(now, length_ms()) > 0)
        .map(|p| (p.reason, p.counted_ms(now)));
    if grace.is_none() {
        // A period whose time is up but whose end timer has not run yet.
        let _ = std::fs::remove_file(RUNNING_MARK);
    }
    let field = |name| ctx.server_info(c"persistence", name);
    let clean = grace::shutdown_was_clean(
        field(c"aof_enabled").as_deref() == Some("1"),
        field(c"aof_last_write_status").as_deref() == Some("ok"),
        field(c"rdb_changes_since_last_save")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1),
        field(c"rdb_last_bgsave_status").as_deref() == Some("ok"),
    );
    if !clean {
        return;
    }
    let mark = CleanMark {
        at_ms: now_ms(),
        grace,
    };
    if let Err(e) = std::fs::write(CLEAN_MARK, mark.format()) {
        log_warning(&format!(
            "cannot write {CLEAN_MARK} ({e}): the next start will have a grace period"
        ));
    } else if let Some((reason, counted)) = grace {
        log_notice(&format!(
            "the grace period ({}) is not over: the next start resumes it ({counted} ms of it had counted)",
            reason.name()
        ));
    }
}
