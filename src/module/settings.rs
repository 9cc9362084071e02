//! The settings' current values (the table is `lease::config::SETTINGS`),
//! and what a change of each does. Set at load from the `loadmodule`
//! arguments, then by `CONFIG SET lease.<name>` where the server has module
//! configs (one get/set callback pair serves every row, and carries out
//! the row's `on_change` through `grace::setting_changed`).

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use crate::lease::config::{Name, SETTINGS, Settings};

static VALUES: [AtomicI64; SETTINGS.len()] = [const { AtomicI64::new(0) }; SETTINGS.len()];

/// Takes the load-time values.
pub fn init(settings: Settings) {
    for (i, v) in settings.values.iter().enumerate() {
        VALUES[i].store(*v, Relaxed);
    }
}

pub fn get(name: Name) -> i64 {
    VALUES[name as usize].load(Relaxed)
}

/// Sets a value (the server checked its bounds); what the change does
/// (its row's `on_change`) is the caller's to do.
pub fn set(name: Name, value: i64) {
    VALUES[name as usize].store(value, Relaxed);
}

/// `lease.max-ttl-ms`.
pub fn max_ttl_ms() -> i64 {
    get(Name::MaxTtlMs)
}

/// `lease.grace-ms` (-1: as max-ttl-ms plus the time a cut-off master may
/// still grant, 0: off).
pub fn grace_ms() -> i64 {
    get(Name::GraceMs)
}

/// The server's `min-replicas-to-write` and `min-replicas-max-lag`, read at
/// load and after every CONFIG SET of them (`grace::refresh_replica_settings`).
pub static MIN_REPLICAS_TO_WRITE: AtomicI64 = AtomicI64::new(0);
pub static MIN_REPLICAS_MAX_LAG: AtomicI64 = AtomicI64::new(0);
