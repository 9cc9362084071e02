//! The grace period after possibly lost grants (SPEC S7): when it starts
//! (a promotion; a server start whose data may be older than what it
//! acknowledged), when it ends (a timer, re-timed by every change of
//! `lease.grace-ms` or, with -1, of `lease.max-ttl-ms`), and the clean
//! shutdown mark.
//!
//! How the module learns of each event, on Redis 7.0 and Valkey 8.1/9.1:
//! - promotion: the REPLICATION_ROLE_CHANGED server event, NOW_MASTER (it
//!   fires for REPLICAOF NO ONE, FAILOVER, Sentinel and Cluster failovers);
//! - a server start rather than `MODULE LOAD`: the SERVER_STARTUP context
//!   flag (Valkey) or no connection received yet (`total_connections_received`
//!   is 0 during a startup OnLoad on every server; a MODULE LOAD always comes
//!   through one);
//! - the persistence it will load: `CONFIG GET appendonly` / `appendfsync`
//!   at OnLoad (configs are read before modules load);
//! - a clean shutdown that saved: the SHUTDOWN server event fires after the
//!   final AOF fsync and RDB save (and not when the save fails and the server
//!   stays up). Then INFO persistence says whether everything is on disk;
//!   if so the module writes a mark file in the server's directory, which
//!   the next start reads and deletes (trusted once: if that run crashes,
//!   the start after it has a grace period again).

use std::sync::Mutex;

use redis_module::raw;

use crate::lease::grace::{self, Period, Reason, Startup};

use super::ctx::Ctx;
use super::state::{self, TimerJob};
use super::waiters;

/// The mark a clean shutdown leaves in the server's working directory (its
/// `dir`), for the next start.
pub const CLEAN_MARK: &str = "lease-clean-shutdown.mark";

/// The timer at the end of the running period.
static END_TIMER: Mutex<Option<raw::RedisModuleTimerID>> = Mutex::new(None);

/// Starts a grace period now (a new promotion replaces a running period).
pub fn start(reason: Reason) {
    let length = state::grace_length_ms();
    if length == 0 {
        state::log_notice(&format!(
            "no grace period after this {} (lease.grace-ms is 0)",
            match reason {
                Reason::Promoted => "promotion",
                Reason::Restart => "start",
            }
        ));
        return;
    }
    state::set_grace_period(Some(Period {
        started_ms: state::now_ms(),
        reason,
    }));
    state::log_warning(&format!(
        "grace period started ({}): no new lease for {length} ms, so that no lease that may have been lost is granted twice",
        reason.name()
    ));
    arm();
}

/// Re-times the running period after a settings change.
pub fn retime() {
    if state::grace_period().is_some() {
        arm();
    }
}

/// (Re)schedules the end timer at the period's current end.
fn arm() {
    let delay = state::grace_remaining_ms(state::now_ms());
    let timer = state::start_timer(delay, TimerJob::GraceEnd);
    let old = std::mem::replace(
        &mut *END_TIMER.lock().unwrap_or_else(|e| e.into_inner()),
        timer,
    );
    if let Some(old) = old {
        state::stop_timer(old);
    }
}

/// The end timer fired: ends the period if it is over (else re-arms), and
/// re-checks every queue so waiters are served, first come first served.
pub fn on_end_timer() {
    *END_TIMER.lock().unwrap_or_else(|e| e.into_inner()) = None;
    if state::grace_period().is_none() {
        return;
    }
    if state::grace_remaining_ms(state::now_ms()) > 0 {
        arm();
        return;
    }
    state::set_grace_period(None);
    state::log_warning("grace period ended: new leases are granted again");
    waiters::recheck_all();
}

/// A change of role: becoming a master starts a period (a demotion does
/// not matter: a replica grants nothing).
pub fn on_role_change(now_master: bool) {
    if now_master {
        start(Reason::Promoted);
    }
}

/// Was the module loaded at server start (not by MODULE LOAD)?
fn at_server_start(ctx: Ctx) -> bool {
    if ctx.flags() & raw::REDISMODULE_CTX_FLAGS_SERVER_STARTUP != 0 {
        return true;
    }
    ctx.server_info(c"stats", c"total_connections_received")
        .as_deref()
        == Some("0")
}

/// At load: a server start whose data may be older than what it
/// acknowledged starts a period.
pub fn at_load(ctx: Ctx) {
    if !at_server_start(ctx) {
        return;
    }
    let clean_shutdown = std::fs::remove_file(CLEAN_MARK).is_ok();
    let aof_always = config_get(ctx, c"appendonly").as_deref() == Some("yes")
        && config_get(ctx, c"appendfsync").as_deref() == Some("always");
    let startup = Startup {
        aof_always,
        clean_shutdown,
    };
    if grace::start_needs_grace(startup) {
        start(Reason::Restart);
    } else {
        state::log_notice(if aof_always {
            "no grace period: the AOF is written with appendfsync always"
        } else {
            "no grace period: the previous run shut down cleanly and saved its data"
        });
    }
}

/// The SHUTDOWN event (after the final save): leaves the clean mark when
/// everything acknowledged is on disk.
pub fn on_shutdown(ctx: Ctx) {
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
    let text = format!("clean shutdown at {} ms\n", state::now_ms());
    if let Err(e) = std::fs::write(CLEAN_MARK, text) {
        state::log_warning(&format!(
            "cannot write {CLEAN_MARK} ({e}): the next start will have a grace period"
        ));
    }
}

/// `CONFIG GET name` through RM_Call (at load only).
fn config_get(ctx: Ctx, name: &std::ffi::CStr) -> Option<String> {
    // SAFETY: RM_Call with format "cc": two C strings; the reply is read
    // with the reply accessors and freed before returning.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(
            ctx.raw(),
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        let value = if raw::call_reply_length(reply) >= 2 {
            raw::call_reply_string(raw::call_reply_array_element(reply, 1))
        } else {
            None
        };
        raw::free_call_reply(reply);
        value
    }
}
