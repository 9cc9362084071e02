//! No panic crosses `extern "C"`: every entry point (`entry.rs`,
//! `filter.rs`) runs its safe code inside `catch_panic`, which logs a panic
//! to the server log and returns a fallback instead.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::server::log_warning;

/// The text of a panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

/// Installs a panic hook that logs where a panic happened to the server
/// log (`catch_panic` then turns it into an error reply or a fallback).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let place = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "an unknown place".into());
        log_warning(&format!(
            "panic at {place}: {}",
            panic_message(info.payload())
        ));
    }));
}

/// Runs a callback; a panic is logged and `fallback` returned.
pub fn catch_panic<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            log_warning(&format!("panic in {what}: {}", panic_message(p.as_ref())));
            fallback
        }
    }
}
