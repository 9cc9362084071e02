//! The layer that binds the pure `crate::lease` core to the server, in
//! layers, bottom first; a file imports only its own layer and those below
//! (`tests/layout.rs` checks it):
//!
//! 0. `ffi/`: the wall, every raw server call and the `extern "C"` shims of
//!    every entry point; the only place allowed `unsafe`;
//! 1. `version`, `tokens`, `counters`, `settings`, `timers`, `early`,
//!    `guards`: the build's version, the token clock, the INFO counters,
//!    the settings' values, the module's timers, the keys Redis 8.2 expired
//!    early, the guards standing and the command filter's check
//!    (design.md S12);
//! 2. `commit`: the one place that changes lease keys (and the gates every
//!    write the module starts by itself passes);
//! 3. `grace`, `compat`, `waiters`, `datatype`, `fence`, `info`: the grace
//!    period, mixed builds, blocking acquire (and the server's snapshot a
//!    command decides on), the type's life in the keyspace, the fenced
//!    command, INFO;
//! 4. `commands`: the handlers;
//! 5. `entry/`: the entry points, cut by job: what each `extern "C"` shim
//!    of `ffi/entry.rs` runs, the command table and the load sequence.

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
pub mod guards;
pub mod info;
pub mod settings;
pub mod timers;
pub mod tokens;
pub mod version;
pub mod waiters;
