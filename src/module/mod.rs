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
pub mod fence;
#[allow(unsafe_code)]
pub mod ffi;
pub mod grace;
pub mod info;
pub mod settings;
pub mod timers;
pub mod tokens;
pub mod waiters;

use ffi::ctx::Ctx;
use ffi::reply;

/// Cargo.toml's version, and the same as `MODULE LIST` shows it (see build.rs).
pub const VERSION: &str = env!("LEASE_VERSION");
pub const VERSION_NUM: i32 = parse_num(env!("LEASE_VERSION_NUM"));
/// The git commit the module was built from (`unknown` outside a checkout).
pub const GIT_COMMIT: &str = env!("LEASE_GIT_COMMIT");

const fn parse_num(s: &str) -> i32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        n = n * 10 + (b[i] - b'0') as i32;
        i += 1;
    }
    n
}

/// What a load does once the server-side registration is done
/// (`ffi::callbacks::init`): the eviction policy, the `+OK` reply, the
/// grace period of a server start.
pub fn start(ctx: Ctx) {
    info::refresh_policy(ctx);
    reply::prepare(ctx);
    grace::at_load(ctx);
    if let Some(warning) = info::eviction_warning() {
        ffi::server::log_warning(&warning);
    }
    ffi::server::log_notice(&format!(
        "lease module {VERSION} (commit {GIT_COMMIT}) loaded"
    ));
}
