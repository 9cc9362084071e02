//! Server-wide module state: the token clock, the INFO counters, the
//! settings, the lease type's handle, logging, and module timers.
//!
//! Commands and type callbacks run on the server's main thread; atomics
//! (relaxed) make the statics `Sync` without locks, and stay correct if a
//! callback ever runs on a background thread (lazy free).

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use redis_module::raw;

use crate::lease::clock::TokenClock;
use crate::lease::grace;
use crate::lease::waitq::Slot;

use super::ctx::Ctx;

static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the token clock and stores what it leaves.
pub fn with_clock<T>(f: impl FnOnce(&mut TokenClock) -> T) -> T {
    let mut clock = TokenClock::new();
    clock.observe(LAST_TOKEN.load(Relaxed));
    let out = f(&mut clock);
    LAST_TOKEN.store(clock.last(), Relaxed);
    out
}

/// The last token issued or observed.
pub fn last_token() -> u64 {
    LAST_TOKEN.load(Relaxed)
}

/// Raises the clock to at least `token`.
pub fn observe_token(token: u64) {
    with_clock(|c| c.observe(token));
}

/// A monotonic counter shown in `INFO lease`.
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Counters of `INFO lease`, in the order they are shown.
pub struct Stats {
    pub acquired: Counter,
    pub contended: Counter,
    pub reacquired: Counter,
    pub renewed: Counter,
    pub renew_failed: Counter,
    pub released: Counter,
    pub release_failed: Counter,
    pub expired: Counter,
    pub evicted: Counter,
    pub fence_ok: Counter,
    pub fence_stale: Counter,
    pub wait_timeouts: Counter,
    pub grace_refused: Counter,
}

pub static STATS: Stats = Stats {
    acquired: Counter::new(),
    contended: Counter::new(),
    reacquired: Counter::new(),
    renewed: Counter::new(),
    renew_failed: Counter::new(),
    released: Counter::new(),
    release_failed: Counter::new(),
    expired: Counter::new(),
    evicted: Counter::new(),
    fence_ok: Counter::new(),
    fence_stale: Counter::new(),
    wait_timeouts: Counter::new(),
    grace_refused: Counter::new(),
};

impl Stats {
    /// (name, value) for every counter.
    pub fn fields(&self) -> [(&'static str, u64); 13] {
        [
            ("acquired", self.acquired.get()),
            ("contended", self.contended.get()),
            ("reacquired", self.reacquired.get()),
            ("renewed", self.renewed.get()),
            ("renew_failed", self.renew_failed.get()),
            ("released", self.released.get()),
            ("release_failed", self.release_failed.get()),
            ("expired", self.expired.get()),
            ("evicted", self.evicted.get()),
            ("fence_ok", self.fence_ok.get()),
            ("fence_stale", self.fence_stale.get()),
            ("wait_timeouts", self.wait_timeouts.get()),
            ("grace_refused", self.grace_refused.get()),
        ]
    }
}

/// `lease.max-ttl-ms`.
pub static MAX_TTL_MS: AtomicI64 = AtomicI64::new(crate::lease::config::DEFAULT_MAX_TTL_MS);

pub fn max_ttl_ms() -> i64 {
    MAX_TTL_MS.load(Relaxed)
}

/// `lease.grace-ms` (-1: as `lease.max-ttl-ms` plus the time a cut-off
/// master may still grant, 0: off).
pub static GRACE_MS: AtomicI64 = AtomicI64::new(crate::lease::config::DEFAULT_GRACE_MS);

/// The server's `min-replicas-to-write` and `min-replicas-max-lag`, read at
/// load and after every CONFIG SET of them.
pub static MIN_REPLICAS_TO_WRITE: AtomicI64 = AtomicI64::new(0);
pub static MIN_REPLICAS_MAX_LAG: AtomicI64 = AtomicI64::new(0);

/// How long this master keeps accepting writes once cut off from its
/// replicas (0 without `min-replicas-to-write`).
pub fn cut_off_writes_ms() -> i64 {
    grace::cut_off_writes_ms(
        MIN_REPLICAS_TO_WRITE.load(Relaxed),
        MIN_REPLICAS_MAX_LAG.load(Relaxed),
    )
}

/// The length of a grace period under the current settings.
pub fn grace_length_ms() -> i64 {
    grace::length_ms(GRACE_MS.load(Relaxed), max_ttl_ms(), cut_off_writes_ms())
}

/// The running grace period (SPEC S7), if any; its end follows the settings.
static GRACE: Mutex<Option<grace::Period>> = Mutex::new(None);
/// Whether `GRACE` holds a period: the hot paths read this alone.
static GRACE_SET: AtomicBool = AtomicBool::new(false);

pub fn grace_period() -> Option<grace::Period> {
    if !GRACE_SET.load(Relaxed) {
        return None;
    }
    *GRACE.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn set_grace_period(period: Option<grace::Period>) {
    *GRACE.lock().unwrap_or_else(|e| e.into_inner()) = period;
    GRACE_SET.store(period.is_some(), Relaxed);
}

/// Time left of the grace period now (0: none, or over).
pub fn grace_remaining_ms() -> i64 {
    grace_period().map_or(0, |p| p.remaining_ms(mono_ms(), grace_length_ms()))
}

/// When the running grace period would end (wall clock) if it counted
/// from `now_ms` on, if one runs.
pub fn grace_ends_at(now_ms: i64) -> Option<i64> {
    if !GRACE_SET.load(Relaxed) {
        return None;
    }
    let left = grace_remaining_ms();
    (left > 0).then_some(now_ms + left)
}

/// Monotonic milliseconds since the module was loaded: what durations (the
/// grace) are timed on, so that a step of the wall clock cannot end one.
pub fn mono_ms() -> i64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as i64
}

/// Wall-clock time in unix milliseconds, the same clock the server's key
/// expiry uses.
pub fn now_ms() -> i64 {
    // SAFETY: RedisModule_Milliseconds takes no arguments and only reads the
    // clock; the pointer is filled in by RedisModule_Init before any command.
    match unsafe { redis_module::raw::RedisModule_Milliseconds } {
        Some(ms) => unsafe { ms() },
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    }
}

/// A detached context made at load, for work outside any command (timers
/// scheduled from type callbacks, logging with the module's name). Used
/// only on the main thread.
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// Makes the detached context (once, at load).
pub fn init_detached(ctx: Ctx) {
    // SAFETY: called during OnLoad with the load context.
    if let Some(detach) = unsafe { raw::RedisModule_GetDetachedThreadSafeContext } {
        DETACHED.store(unsafe { detach(ctx.raw()) }, Relaxed);
    }
}

/// The detached context, `None` before load.
pub fn detached() -> Option<Ctx> {
    let p = DETACHED.load(Relaxed);
    // SAFETY: made by GetDetachedThreadSafeContext at load and never freed.
    (!p.is_null()).then(|| unsafe { Ctx::new(p) })
}

/// The server's handle of the lease type (set at load).
static TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(std::ptr::null_mut());

pub fn set_lease_type(t: *mut raw::RedisModuleType) {
    TYPE.store(t, Relaxed);
}

pub fn lease_type() -> *mut raw::RedisModuleType {
    TYPE.load(Relaxed)
}

fn log(level: &std::ffi::CStr, msg: &str) {
    let text = std::ffi::CString::new(msg.replace('\0', "?")).expect("no NUL");
    match detached() {
        // SAFETY: RM_Log with a format "%s" and one C string; the detached
        // context carries the module's name, so the line reads <lease>.
        Some(ctx) => unsafe {
            raw::RedisModule_Log.unwrap()(ctx.raw(), level.as_ptr(), c"%s".as_ptr(), text.as_ptr())
        },
        None => redis_module::logging::log_warning(msg),
    }
}

pub fn log_warning(msg: &str) {
    log(c"warning", msg);
}

pub fn log_notice(msg: &str) {
    log(c"notice", msg);
}

/// `maxmemory-policy`, read at load and on every CONFIG SET of it (never
/// from the INFO callback, so INFO runs no command).
static POLICY: Mutex<String> = Mutex::new(String::new());

pub fn set_maxmemory_policy(policy: String) {
    *POLICY.lock().unwrap_or_else(|e| e.into_inner()) = policy;
}

pub fn maxmemory_policy() -> String {
    POLICY.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Work a module timer does when it fires.
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
    Announce(super::effects::Announce),
    /// A look at the running grace period: does it count, is it over?
    GraceTick,
    /// Take another batch of ended holders out of a counting or shared
    /// lease key.
    Drain(Slot),
}

/// The `extern "C"` callbacks the binding hands to the server, installed at
/// load by `callbacks.rs` (which sees every layer; the layers below reach
/// it only through this table).
pub struct Hooks {
    pub timer: raw::RedisModuleTimerProc,
    pub reply: raw::RedisModuleCmdFunc,
    pub timeout: raw::RedisModuleCmdFunc,
    pub free_privdata: Option<unsafe extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void)>,
    pub disconnect: raw::RedisModuleDisconnectFunc,
    pub command_filter: raw::RedisModuleCommandFilterFunc,
    /// The one-shot call the waker thread posts to the main thread.
    pub wake: raw::RedisModuleEventLoopOneShotFunc,
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

pub fn install_hooks(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

pub fn hooks() -> &'static Hooks {
    HOOKS.get().expect("hooks are installed at load")
}

/// The command filter while it is registered (an address: the static must
/// be `Sync`).
static FILTER: Mutex<Option<usize>> = Mutex::new(None);

/// Registers (`on`) or unregisters the module's command filter.
pub fn set_command_filter(on: bool) {
    let Some(ctx) = detached() else { return };
    let mut filter = FILTER.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: function-pointer reads filled in by RedisModule_Init; the
    // filter handle is the one RegisterCommandFilter returned, unregistered
    // once; both run on the main thread with the module's context.
    unsafe {
        match (on, *filter) {
            (true, None) => {
                if let Some(register) = raw::RedisModule_RegisterCommandFilter {
                    let f = register(ctx.raw(), hooks().command_filter, 0);
                    *filter = (!f.is_null()).then_some(f as usize);
                }
            }
            (false, Some(f)) => {
                if let Some(unregister) = raw::RedisModule_UnregisterCommandFilter {
                    unregister(ctx.raw(), f as *mut raw::RedisModuleCommandFilter);
                }
                *filter = None;
            }
            _ => {}
        }
    }
}

/// Starts a module timer that runs `job` in `delay_ms`; `None` before load.
pub fn start_timer(delay_ms: i64, job: TimerJob) -> Option<raw::RedisModuleTimerID> {
    let ctx = detached()?;
    let data = Box::into_raw(Box::new(job)) as *mut c_void;
    // SAFETY: CreateTimer on the main thread with the detached context;
    // `data` is freed by the timer callback (`take_timer_job`) or `stop_timer`.
    Some(unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx.raw(), delay_ms.max(0), hooks().timer, data)
    })
}

/// Keys whose ended holders a drain timer will take out (one timer a key).
static DRAINING: Mutex<Option<std::collections::HashSet<Slot>>> = Mutex::new(None);
/// Schedules the next batch of the drain of key `name` in database `db`
/// in `delay_ms`, unless one is pending.
pub fn start_drain(db: i32, name: &[u8], delay_ms: i64) {
    let slot = (db, name.to_vec());
    let new = DRAINING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .insert(slot.clone());
    if new && start_timer(delay_ms, TimerJob::Drain(slot.clone())).is_none() {
        end_drain(&slot);
    }
}

/// The drain timer of `slot` fired (its next batch may be scheduled again).
pub fn end_drain(slot: &Slot) {
    if let Some(set) = DRAINING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        set.remove(slot);
    }
}

/// Stops a pending timer and drops its job.
pub fn stop_timer(id: raw::RedisModuleTimerID) {
    let Some(ctx) = detached() else { return };
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: StopTimer hands back the data of a pending timer of this
    // module, which is a Box<TimerJob> made in `start_timer`.
    unsafe {
        if raw::RedisModule_StopTimer.unwrap()(ctx.raw(), id, &mut data)
            == raw::REDISMODULE_OK as c_int
            && !data.is_null()
        {
            drop(Box::from_raw(data as *mut TimerJob));
        }
    }
}

/// The job of a timer that fired.
///
/// # Safety
/// `data` must be the data pointer of a timer started by `start_timer`
/// that fired (so nobody else frees it).
pub unsafe fn take_timer_job(data: *mut c_void) -> TimerJob {
    // SAFETY: see above.
    *unsafe { Box::from_raw(data as *mut TimerJob) }
}

/// The name of the lease key last unlinked, how many holders its record
/// had, and when, so the `expired` event that follows an expiry's unlink at
/// once can tell a lease key from any other (its type is gone by then) and
/// count each holder. Reused, so no allocation per unlink once warm.
static LAST_UNLINKED: Mutex<Unlinked> = Mutex::new(Unlinked {
    name: Vec::new(),
    holders: 0,
    deadline_ms: 0,
    at: None,
});

/// The lease key last unlinked.
struct Unlinked {
    name: Vec<u8>,
    holders: usize,
    /// Its lease's deadline (the latest holder's).
    deadline_ms: i64,
    at: Option<Instant>,
}

pub fn note_unlinked(name: &[u8], holders: usize, deadline_ms: i64) {
    let mut last = LAST_UNLINKED.lock().unwrap_or_else(|e| e.into_inner());
    last.name.clear();
    last.name.extend_from_slice(name);
    last.holders = holders;
    last.deadline_ms = deadline_ms;
    last.at = Some(Instant::now());
}

/// If `name` was the lease key unlinked just now (within a millisecond),
/// how many holders it had and its lease's deadline. Clears the mark.
pub fn take_unlinked(name: &[u8]) -> Option<(usize, i64)> {
    let mut last = LAST_UNLINKED.lock().unwrap_or_else(|e| e.into_inner());
    let recent = last
        .at
        .take()
        .is_some_and(|at| at.elapsed().as_micros() < 1000);
    (recent && last.name.as_slice() == name).then_some((last.holders, last.deadline_ms))
}
