//! Server-wide module state: the token clock and the INFO counters.
//!
//! Commands and type callbacks run on the server's main thread; atomics
//! (relaxed) make the statics `Sync` without locks, and stay correct if a
//! callback ever runs on a background thread (lazy free).

use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, Ordering::Relaxed};

use redis_module::raw;

use crate::lease::clock::TokenClock;

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
    pub fence_ok: Counter,
    pub fence_stale: Counter,
    pub wait_timeouts: Counter,
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
    fence_ok: Counter::new(),
    fence_stale: Counter::new(),
    wait_timeouts: Counter::new(),
};

impl Stats {
    /// (name, value) for every counter.
    pub fn fields(&self) -> [(&'static str, u64); 11] {
        [
            ("acquired", self.acquired.get()),
            ("contended", self.contended.get()),
            ("reacquired", self.reacquired.get()),
            ("renewed", self.renewed.get()),
            ("renew_failed", self.renew_failed.get()),
            ("released", self.released.get()),
            ("release_failed", self.release_failed.get()),
            ("expired", self.expired.get()),
            ("fence_ok", self.fence_ok.get()),
            ("fence_stale", self.fence_stale.get()),
            ("wait_timeouts", self.wait_timeouts.get()),
        ]
    }
}

/// `lease.max-ttl-ms`.
pub static MAX_TTL_MS: AtomicI64 = AtomicI64::new(crate::lease::config::DEFAULT_MAX_TTL_MS);

pub fn max_ttl_ms() -> i64 {
    MAX_TTL_MS.load(Relaxed)
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
/// scheduled from type callbacks, reading settings from INFO callbacks).
/// Used only on the main thread.
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// Makes the detached context (once, at load).
pub fn init_detached(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: called during OnLoad with the load context.
    if let Some(detach) = unsafe { raw::RedisModule_GetDetachedThreadSafeContext } {
        DETACHED.store(unsafe { detach(ctx) }, Relaxed);
    }
}

pub fn detached() -> *mut raw::RedisModuleCtx {
    DETACHED.load(Relaxed)
}

/// The context flags (REDISMODULE_CTX_FLAGS_*).
pub fn ctx_flags(ctx: *mut raw::RedisModuleCtx) -> u32 {
    // SAFETY: GetContextFlags only reads the context.
    unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) as u32 }
}
