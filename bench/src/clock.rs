//! Time helpers: wall-clock microseconds, signed differences of instants,
//! sleeping until a moment.

use std::thread;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the unix epoch (to compare with the server's
/// PEXPIRETIME).
pub fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// `a - b` in microseconds, negative when `a` came first.
pub fn us_between(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1e6
    } else {
        -((b - a).as_secs_f64() * 1e6)
    }
}

/// Sleeps until `t` (returns at once if it has passed).
pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}
