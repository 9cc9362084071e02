//! The module's handles on the server that outlive one call: the detached
//! context (timers, logging with the module's name), the lease type, the
//! server's clock, module timers, the flush and `SWAPDB` events while the
//! command filter is registered (`filter.rs`), and the table of
//! `extern "C"` shims the wrappers hand out (the load installs it; the
//! wrappers here read it).

use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::Relaxed};

use redis_module::raw;

use super::ctx::Ctx;

/// A module timer, as the server names it.
pub type TimerId = raw::RedisModuleTimerID;

/// Monotonic milliseconds since the module was loaded: what durations (the
/// grace) are timed on, so that a step of the wall clock cannot end one.
pub fn mono_ms() -> i64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as i64
}

/// Wall-clock time in unix milliseconds, the same clock the server's key
/// expiry uses.
pub fn now_ms() -> i64 {
    // SAFETY: RedisModule_Milliseconds takes no arguments and only reads the
    // clock; the pointer is filled in by RedisModule_Init before any command.
    match unsafe { raw::RedisModule_Milliseconds } {
        Some(ms) => unsafe { ms() },
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    }
}

/// The time a command's lease decisions use: the server's command time,
/// the time its own key expiry uses. It stays the same for the whole of a
/// transaction (`EXEC`) or a script (`EVAL`, `FCALL`), so every lease
/// decision of one `EXEC` or script sees one time (two fenced writes in one
/// `EXEC` pass or fail together).
///
/// Redis 7.2+ and Valkey give it as `RedisModule_CachedMicroseconds`: the
/// time the outermost command running now began (for a command on its own,
/// a few microseconds ago). Redis 7.0 has no such call: inside a
/// transaction or a script it gives the same value (`server.ustime`, which
/// 7.0 also freezes for the whole outermost command) as `server_time_usec`
/// in `INFO server`, and elsewhere the wall clock serves (`now_ms`). (On
/// 7.0 a script's expiry uses the script's own start, a few microseconds
/// later: this time is never later than the server's, so a key the server
/// keeps is never a lease this time calls ended.)
#[inline]
pub fn decision_ms(ctx: Ctx) -> i64 {
    decision_ms_given(ctx, || ctx.flags())
}

/// `decision_ms` with the context flags the caller has already read, when
/// it needs them (Redis 7.0 only).
#[inline]
pub fn decision_ms_given(ctx: Ctx, flags: impl FnOnce() -> u32) -> i64 {
    // SAFETY: a function-pointer read filled in by RedisModule_Init, then a
    // call that takes no arguments and reads the server's cached time.
    if let Some(cached) = unsafe { raw::RedisModule_CachedMicroseconds } {
        return unsafe { cached() } / 1000;
    }
    if flags() & (raw::REDISMODULE_CTX_FLAGS_MULTI | raw::REDISMODULE_CTX_FLAGS_LUA) == 0 {
        return now_ms();
    }
    ctx.server_info(c"server", c"server_time_usec")
        .and_then(|us| us.parse::<i64>().ok())
        .map_or_else(now_ms, |us| us / 1000)
}

/// Are writes paused in a way that covers replica traffic (`CLIENT PAUSE`,
/// `FAILOVER`, `CLUSTER FAILOVER`)? Propagating then aborts Valkey, and a
/// module timer that stores into a key whose time passed aborts Redis 7.0.
pub fn writes_paused() -> bool {
    // SAFETY: a function-pointer read filled in by RedisModule_Init, then a
    // call that takes no arguments.
    unsafe { raw::RedisModule_AvoidReplicaTraffic }.is_some_and(|avoid| unsafe { avoid() } != 0)
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

fn log(level: &CStr, msg: &str) {
    let text = CString::new(msg.replace('\0', "?")).expect("no NUL");
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

/// The `extern "C"` shims the wrappers hand to the server (`entry::hooks`),
/// installed at load.
pub struct Hooks {
    pub timer: raw::RedisModuleTimerProc,
    pub reply: raw::RedisModuleCmdFunc,
    pub timeout: raw::RedisModuleCmdFunc,
    pub free_privdata: Option<unsafe extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void)>,
    pub disconnect: raw::RedisModuleDisconnectFunc,
    pub command_filter: raw::RedisModuleCommandFilterFunc,
    /// The server events listened to only while the command filter is
    /// needed (`FLUSHDB`/`FLUSHALL` and `SWAPDB`), with their shims.
    pub keyspace_moves: [(u64, raw::RedisModuleEventCallback); 2],
    /// The one-shot call the waker thread posts to the main thread.
    pub wake: raw::RedisModuleEventLoopOneShotFunc,
    /// A keyspace scan's callback (`key::lease_key_names`).
    pub scan: raw::RedisModuleScanCB,
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

pub fn install_hooks(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

pub fn hooks() -> &'static Hooks {
    HOOKS.get().expect("hooks are installed at load")
}

/// Whether the module listens to the flush and `SWAPDB` events.
static MOVES_SUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// The command filter is needed (`filter.rs`).
static FILTER_NEEDED: AtomicBool = AtomicBool::new(false);

/// The command filter is needed (`on`: it was registered) or not any
/// more: the flush and `SWAPDB` events are listened to from its
/// registration on, until `settle_keyspace_moves` finds the filter needed
/// no more (every server event the module listens to costs every deletion
/// of any key on Redis 7.2+ and Valkey, whose key event the server offers
/// to each listener).
pub(super) fn filter_needed(ctx: Ctx, on: bool) {
    FILTER_NEEDED.store(on, Relaxed);
    if on && !MOVES_SUBSCRIBED.swap(true, Relaxed) {
        // SAFETY: on the main thread (the filter is registered there), with
        // the detached context.
        unsafe { subscribe_keyspace_moves(ctx, true) };
    }
}

/// Stops listening to the flush and `SWAPDB` events once nobody needs them
/// (from the module's once-a-second timer: never from inside an event,
/// whose listener list the server is walking).
pub fn settle_keyspace_moves() {
    if FILTER_NEEDED.load(Relaxed) || !MOVES_SUBSCRIBED.load(Relaxed) {
        return;
    }
    let Some(ctx) = detached() else { return };
    MOVES_SUBSCRIBED.store(false, Relaxed);
    // SAFETY: on the main thread (a timer), with the detached context.
    unsafe { subscribe_keyspace_moves(ctx, false) };
}

/// Subscribes to the flush and `SWAPDB` events (`on`), or unsubscribes (a
/// null callback).
///
/// # Safety
/// On the main thread, with the module's detached context.
unsafe fn subscribe_keyspace_moves(ctx: Ctx, on: bool) {
    // SAFETY: a function-pointer read filled in by RedisModule_Init; each
    // event struct is the one the API defines, its shim of the right
    // signature.
    unsafe {
        if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
            for (id, callback) in hooks().keyspace_moves {
                let callback = if on { callback } else { None };
                subscribe(
                    ctx.raw(),
                    raw::RedisModuleEvent { id, dataver: 1 },
                    callback,
                );
            }
        }
    }
}

/// Starts a module timer that hands `job` to the timer callback in
/// `delay_ms`; `None` before load.
pub fn start_timer<J: 'static>(delay_ms: i64, job: J) -> Option<TimerId> {
    let ctx = detached()?;
    let data = Box::into_raw(Box::new(job)) as *mut c_void;
    // SAFETY: CreateTimer on the main thread with the detached context;
    // `data` is freed by the timer callback (`take_timer_job`) or
    // `stop_timer`, with the same type `J` (the binding has one job type).
    Some(unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx.raw(), delay_ms.max(0), hooks().timer, data)
    })
}

/// Stops a pending timer and drops its job (of the type it was started
/// with).
pub fn stop_timer<J: 'static>(id: TimerId) {
    let Some(ctx) = detached() else { return };
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: StopTimer hands back the data of a pending timer of this
    // module, which is a Box<J> made in `start_timer`.
    unsafe {
        if raw::RedisModule_StopTimer.unwrap()(ctx.raw(), id, &mut data)
            == raw::REDISMODULE_OK as c_int
            && !data.is_null()
        {
            drop(Box::from_raw(data as *mut J));
        }
    }
}

/// The job of a timer that fired.
///
/// # Safety
/// `data` must be the data pointer of a timer started by `start_timer`
/// with job type `J` that fired (so nobody else frees it).
pub unsafe fn take_timer_job<J: 'static>(data: *mut c_void) -> J {
    // SAFETY: see above.
    *unsafe { Box::from_raw(data as *mut J) }
}
