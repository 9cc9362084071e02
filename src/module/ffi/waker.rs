//! Re-checks to the microsecond for the last moments before a lease ends.
//!
//! A module timer for time T fires up to about a millisecond after T: its
//! period is whole milliseconds counted from the moment it was made, and
//! the event loop sleeps in whole milliseconds, rounded up. A waiter on a
//! lease that expires would get it ~0.8 ms later than the clock allows on
//! average, later than a client polling `SET NX PX` every millisecond. So
//! a re-check due within `LEAD_MS` is handed to a helper thread that sleeps
//! until its exact microsecond and then wakes the event loop
//! (RedisModule_EventLoopAddOneShot, which writes to the server's module
//! pipe); on the main thread the callback starts a 0 ms timer, and the key
//! is re-checked by the usual timer path (`waiters::on_recheck`), with a
//! context of its own. The thread touches no server state: it only keeps
//! the due times and posts the one-shot calls.
//!
//! A stale wake (the lease was renewed, the waiters left) costs one re-check
//! that finds nothing to do. The thread starts at the first use; where the
//! server has no one-shot API, or the thread cannot start, `wake_at` says
//! so and the caller keeps a module timer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_module::raw;

use crate::lease::waitq::Slot;

use super::server;

/// Re-checks due within this many milliseconds go to the thread; a module
/// timer for a later one is set this much early (so that it fires before
/// the moment, then hands it over).
pub const LEAD_MS: i64 = 2;

type OneShot = unsafe extern "C" fn(raw::RedisModuleEventLoopOneShotFunc, *mut c_void) -> i32;

struct Waker {
    due: Mutex<BinaryHeap<Reverse<(Instant, Slot)>>>,
    cv: Condvar,
    /// Set (under `due`'s lock) when the server shuts down: the thread ends.
    stop: AtomicBool,
}

impl Waker {
    fn lock(&self) -> MutexGuard<'_, BinaryHeap<Reverse<(Instant, Slot)>>> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
    }
}

static WAKER: OnceLock<Option<&'static Waker>> = OnceLock::new();
/// The thread, joined at shutdown (`stop`).
static THREAD: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

fn waker() -> Option<&'static Waker> {
    *WAKER.get_or_init(|| {
        // SAFETY: a function-pointer read filled in by RedisModule_Init.
        let add: OneShot = unsafe { raw::RedisModule_EventLoopAddOneShot }?;
        let callback = server::hooks().wake?;
        let w: &'static Waker = Box::leak(Box::new(Waker {
            due: Mutex::new(BinaryHeap::new()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        }));
        let started = std::thread::Builder::new()
            .name("lease-waker".into())
            .spawn(move || run(w, add, callback));
        match started {
            Ok(handle) => {
                *THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
                Some(w)
            }
            Err(e) => {
                server::log_warning(&format!(
                    "no waker thread ({e}): expiry hand-offs run on module timers"
                ));
                None
            }
        }
    })
}

/// Whether re-checks can be handed to the thread here.
pub fn available() -> bool {
    waker().is_some()
}

/// Asks for a re-check of `slot` at `at_ms` (unix ms), to the microsecond.
/// False when no thread can do it (the caller then sets a module timer).
pub fn wake_at(at_ms: i64, slot: &Slot) -> bool {
    let Some(w) = waker() else {
        return false;
    };
    if w.stop.load(Ordering::Relaxed) {
        return false;
    }
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let ahead_us = (at_ms.saturating_mul(1000) - now_us).clamp(0, LEAD_MS * 2000);
    let when = Instant::now() + Duration::from_micros(ahead_us as u64);
    let mut due = w.lock();
    let earliest = due.peek().is_none_or(|Reverse((t, _))| when < *t);
    due.push(Reverse((when, slot.clone())));
    drop(due);
    if earliest {
        w.cv.notify_one();
    }
    true
}

/// The thread: sleeps until the earliest due time, then posts that slot's
/// one-shot call to the main thread.
fn run(w: &'static Waker, add: OneShot, callback: unsafe extern "C" fn(*mut c_void)) {
    // Linux lets a sleeping thread wake up to 50 us late by default (timer
    // slack), which would be most of what this thread is for: 1 ns.
    // SAFETY: prctl on the calling thread with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let mut due = w.lock();
    loop {
        if w.stop.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let next = due.peek().map(|Reverse((t, _))| *t);
        match next {
            None => due = w.cv.wait(due).unwrap_or_else(|e| e.into_inner()),
            Some(t) if t > now => {
                due =
                    w.cv.wait_timeout(due, t - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
            }
            Some(_) => {
                let Some(Reverse((_, slot))) = due.pop() else {
                    continue;
                };
                drop(due);
                let data = Box::into_raw(Box::new(slot)).cast::<c_void>();
                // SAFETY: EventLoopAddOneShot may be called from any thread;
                // the callback (the `wake` shim of entry.rs) takes `data` back with
                // `take_slot`. On failure it was not queued: reclaimed here.
                if unsafe { add(Some(callback), data) } != raw::REDISMODULE_OK as i32 {
                    drop(unsafe { take_slot(data) });
                }
                due = w.lock();
            }
        }
    }
}

/// Ends the thread, if it runs, and waits for it: called when the server
/// shuts down (its one-shot calls would find no event loop).
pub fn stop() {
    let Some(Some(w)) = WAKER.get() else {
        return;
    };
    {
        let _due = w.lock();
        w.stop.store(true, Ordering::Relaxed);
        w.cv.notify_all();
    }
    if let Some(handle) = THREAD.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = handle.join();
    }
}

/// The slot a one-shot call carries.
///
/// # Safety
/// `data` must be a pointer posted by `run`, taken back once.
pub unsafe fn take_slot(data: *mut c_void) -> Slot {
    // SAFETY: by the contract, a Box<Slot> made in `run`.
    *unsafe { Box::from_raw(data.cast::<Slot>()) }
}
