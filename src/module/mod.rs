//! The thin layer that binds the pure `crate::lease` core to the server.
//! All `unsafe` lives here. Dependencies run one way:
//!
//! - `ctx`, `value`, `state`, `reply`: handles, the lease type's value
//!   pointer (exclusive or multi-holder record), server-wide state, replies;
//! - `effects`: the one place that changes lease keys, and the gates that
//!   every write the module starts by itself passes;
//! - `waiters`, `fence`, `datatype`, `info`: blocking acquire, the fenced
//!   command, the type's life in the keyspace, INFO;
//! - `commands`: the handlers;
//! - `callbacks`: every `extern "C"` entry point; `registry`: registration.

pub mod callbacks;
pub mod commands;
pub mod compat;
pub mod ctx;
pub mod datatype;
pub mod effects;
pub mod fence;
pub mod grace;
pub mod info;
pub mod registry;
pub mod reply;
pub mod state;
pub mod value;
pub mod waiters;
pub mod waker;

use redis_module::{Context, RedisString, Status, raw};

use ctx::Ctx;

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

/// Called by `redis_module!` at load, after the data type is created.
pub fn init(ctx: &Context, args: &[RedisString]) -> Status {
    // SAFETY: the load context, live during OnLoad.
    let lctx = unsafe { Ctx::new(ctx.ctx) };
    state::init_detached(lctx);
    callbacks::install_panic_hook();
    state::install_hooks(callbacks::hooks());
    state::set_lease_type(*callbacks::LEASE_TYPE.raw_type.borrow());
    let raw_args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let settings = match crate::lease::config::parse_module_args(&raw_args) {
        Ok(s) => s,
        Err(why) => {
            ctx.log_warning(&format!("refusing to load: {why}"));
            return Status::Err;
        }
    };
    // SAFETY: called once from OnLoad on the main thread with the load context.
    unsafe {
        if let Some(set_options) = raw::RedisModule_SetModuleOptions {
            // A short read (diskless replica, truncated RESTORE payload) must
            // reach rdb_load as an error, not kill the server. A key opened
            // for writing is signalled as modified only when the module says
            // so (effects), so calls that change nothing leave WATCH alone.
            set_options(
                ctx.ctx,
                (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
                    | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as i32,
            );
        }
    }
    if let Err(why) = registry::register_configs(ctx, settings) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    if let Err(why) = registry::register_all(ctx) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    raw::register_info_function(ctx.ctx, Some(callbacks::info_cb));
    registry::subscribe_events(ctx);
    info::refresh_policy(lctx);
    reply::prepare(lctx);
    grace::at_load(lctx);
    if let Some(warning) = info::eviction_warning() {
        ctx.log_warning(&warning);
    }
    ctx.log_notice(&format!(
        "lease module {VERSION} (commit {GIT_COMMIT}) loaded"
    ));
    Status::Ok
}
