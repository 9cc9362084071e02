//! Lease keys Redis 8.2 expired within their deadline's millisecond (its
//! active expiry does, where every other server waits for the next one):
//! until that millisecond has passed, such a lease counts as held, so that
//! no one gets it while its holder may still hold it. Entries live for a
//! millisecond at most.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::ffi::server::now_ms;

/// Notes that the server expired lease key `name` of database `db` within
/// its deadline's millisecond `deadline_ms`.
pub fn note(db: i32, name: &[u8], deadline_ms: i64) {
    let mut early = ENDED_EARLY.lock().unwrap_or_else(|e| e.into_inner());
    early.push((db, name.to_vec(), deadline_ms));
    ANY_ENDED_EARLY.store(true, Relaxed);
}

/// Lease keys the server expired within their deadline's millisecond:
/// (database, name, deadline). Entries leave once that millisecond passed.
static ENDED_EARLY: Mutex<Vec<(i32, Vec<u8>, i64)>> = Mutex::new(Vec::new());
/// Whether `ENDED_EARLY` may hold an entry: the hot paths read this alone.
static ANY_ENDED_EARLY: AtomicBool = AtomicBool::new(false);

/// Did the server expire any lease key within its deadline's millisecond
/// lately? (The hot paths ask this, one load, before `ended_early`.)
#[inline]
pub fn any_ended_early() -> bool {
    ANY_ENDED_EARLY.load(Relaxed)
}

/// If the server expired lease key `name` of database `db` within its
/// deadline's millisecond and that millisecond has not passed yet, the
/// deadline: the key is gone, but its lease counts as held until then.
pub fn ended_early(db: i32, name: &[u8]) -> Option<i64> {
    if !any_ended_early() {
        return None;
    }
    let now = now_ms();
    let mut early = ENDED_EARLY.lock().unwrap_or_else(|e| e.into_inner());
    early.retain(|&(_, _, deadline)| deadline >= now);
    // Bounded: entries live for a millisecond at most.
    ANY_ENDED_EARLY.store(!early.is_empty(), Relaxed);
    early
        .iter()
        .find(|(d, n, _)| *d == db && n.as_slice() == name)
        .map(|&(_, _, deadline)| deadline)
}
