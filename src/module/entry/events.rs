//! Server events: flushes and SWAPDB (keys freed or moved without
//! unlinking; while guards stand or clients wait), forks (the token clock
//! is written to a rewritten AOF), replicas coming online and role
//! changes, shutdown and config changes (the grace period), Valkey's atomic
//! slot migration, and the command filter: expiry commands while someone
//! waits, every command while a guard stands.

use super::super::ffi::ctx::Ctx;
use super::super::ffi::entry::{Events, SlotMigration};
use super::super::ffi::filter::{Filter, FilterCommand};
use super::super::timers::{self, Announcement, TimerJob};
use super::super::{datatype, grace, guards, info, tokens, waiters};

pub struct Lease;

/// The versions this build speaks, then the token clock, each from a 0 ms
/// timer of its own.
fn announce_all() {
    timers::start(0, TimerJob::Announce(Announcement::Version));
    timers::start(0, TimerJob::Announce(Announcement::Clock));
}

impl Events for Lease {
    fn flushed(db: Option<i32>) {
        guards::flushed(db);
        waiters::recheck_all();
    }

    fn swapped(first: i32, second: i32) {
        guards::swapped(first, second);
        waiters::on_swapdb(first, second);
    }

    /// Not from the event itself: the fork may happen inside a command
    /// (PSYNC, BGSAVE, BGREWRITEAOF), and propagating from within it makes
    /// the server propagate that command too (PSYNC in the AOF crashes the
    /// next start). A 0 ms timer writes the clock right after, still into
    /// the AOF file the rewrite opened before it forked.
    fn forked() {
        announce_all();
    }

    /// The replica learns the versions this master speaks, from a 0 ms
    /// timer (not from inside the command that brought it online).
    fn replica_online() {
        announce_all();
    }

    fn role_changed(now_master: bool) {
        guards::role_changed(now_master);
        grace::on_role_change(now_master);
    }

    fn shutdown(ctx: Ctx) {
        grace::on_shutdown(ctx);
    }

    fn config_changed(ctx: Ctx, changed: &dyn Fn(&[&[u8]]) -> bool) {
        if changed(&[b"maxmemory-policy"]) {
            info::on_policy_change(ctx);
        }
        if changed(&[
            b"min-replicas-to-write",
            b"min-replicas-max-lag",
            b"min-slaves-to-write",
            b"min-slaves-max-lag",
        ]) {
            grace::refresh_replica_settings(ctx);
        }
    }

    /// The guards let the slot import link write the keys of the slots
    /// this node imports (guards.rs); a snapshot forked while this node
    /// exports starts with its token clock (tokens.rs). The rest needs
    /// nothing: the lease keys arrive as their effects, the import's keys
    /// are deleted by the server when it fails (each unlinked as any key),
    /// and waiters on the source's keys are redirected once the slot is
    /// gone (waiters.rs).
    fn slot_migration(step: SlotMigration, slots: &[(u16, u16)]) {
        match step {
            SlotMigration::ImportStarted => guards::importing_slots(slots, true),
            SlotMigration::ImportAborted | SlotMigration::ImportCompleted => {
                guards::importing_slots(slots, false)
            }
            SlotMigration::ExportStarted => tokens::exporting(true),
            SlotMigration::ExportAborted | SlotMigration::ExportCompleted => {
                tokens::exporting(false)
            }
        }
    }
}

/// The command filter's two users, each while it needs the filter: the
/// waiters (expiry commands on waited-for keys: `datatype.rs`) and the
/// guards (writes to guarded keys: `guards.rs`, which decides in what
/// order it looks).
impl Filter for Lease {
    #[inline]
    fn filter(command: &mut FilterCommand) {
        if command.len() < 2 {
            return;
        }
        if waiters::total() > 0
            && let Some(name) = command.arg(0)
        {
            datatype::before_command(name, command.arg(1));
        }
        guards::filter(command);
    }
}
