//! The layer that binds the pure `crate::lease` core to the server.
//! Dependencies run one way (no file imports one above it):
//!
//! - `ffi/`: the wall, every raw server call and every `extern "C"` entry
//!   point; the only place allowed `unsafe`;
//! - `tokens`, `counters`, `settings`, `timers`, `early`: the token clock,
//!   the INFO counters, the settings' values, the module's timers, the keys
//!   Redis 8.2 expired early;
//! - `commit`: the one place that changes lease keys (and the gates every
//!   write the module starts by itself passes);
//! - `grace`, `compat`, `waiters`, `datatype`, `fence`, `info`: the grace
//!   period, mixed builds, blocking acquire, the type's life in the
//!   keyspace, the fenced command, INFO;
//! - `commands`: the handlers.

pub mod commands;
pub mod commit;
pub mod compat;
pub mod counters;
pub mod datatype;
pub mod early;
pub mod entry;
pub mod fence;
#[allow(unsafe_code)]
pub mod ffi;
pub mod grace;
pub mod info;
pub mod settings;
pub mod timers;
pub mod tokens;
pub mod version;
pub mod waiters;
