//! The module's timers (each `TimerJob`), its blocked clients (reply,
//! timeout, disconnect, free) and the waker thread's wake-ups.

use super::super::commit;
use super::super::ffi::ctx::Ctx;
use super::super::ffi::entry::Waits;
use super::super::timers::{self, Announcement, TimerJob};
use super::super::waiters::{self, Unblocked};
use super::super::{counters, datatype, grace};
use crate::lease::waitq::Slot;

pub struct Lease;

/// Announces `what` (replicated); a closed write gate tries again later.
fn announce(ctx: Ctx, what: Announcement) {
    if let Err(closed) = commit::announce(ctx, what.now()) {
        let retry = closed.retry_in_ms().unwrap_or(0);
        timers::start(retry.max(10), TimerJob::Announce(what));
    }
}

impl Waits for Lease {
    type Job = TimerJob;
    type Unblocked = Unblocked;

    fn timer(ctx: Ctx, job: TimerJob) {
        match job {
            TimerJob::Recheck(slot) => waiters::on_recheck(ctx, slot),
            TimerJob::MultiKey(slot, id) => waiters::on_multikey(ctx, slot, id),
            TimerJob::Timeouts => waiters::on_timeouts(),
            TimerJob::Revoke(slot, owner, token) => waiters::on_revoke(ctx, slot, owner, token),
            TimerJob::Align((db, key)) => datatype::on_align(ctx, db, &key),
            TimerJob::Announce(what) => announce(ctx, what),
            TimerJob::GraceTick => grace::on_tick(ctx),
            TimerJob::ResetstatTick => counters::on_resetstat_tick(ctx),
            TimerJob::GuardsLoaded => datatype::after_load(ctx),
            TimerJob::RecheckAll => waiters::recheck_all(),
            TimerJob::Drain(slot) => datatype::on_drain(ctx, slot),
        }
    }

    fn reply(ctx: Ctx, data: Option<&mut Unblocked>) {
        waiters::on_reply(ctx, data);
    }

    fn timeout(ctx: Ctx, bc: usize) {
        waiters::on_server_timeout(ctx, bc);
    }

    fn disconnect(bc: usize) {
        waiters::on_disconnect(bc);
    }

    fn free(data: Unblocked) {
        waiters::on_free(data);
    }

    fn wake(slot: Slot) {
        waiters::on_wake(slot);
    }
}
