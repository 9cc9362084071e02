//! The thin layer that binds the pure `crate::lease` core to the server:
//! command registration and entry points, the data type's callbacks,
//! replication, INFO, configuration. All `unsafe` lives here.

pub mod commands;
pub mod config;
pub mod datatype;
pub mod entry;
pub mod fence;
pub mod info;
pub mod key;
pub mod registry;
pub mod reply;
pub mod state;
pub mod waiters;

use redis_module::{Context, RedisString, Status};

/// Called by `redis_module!` at load, after the data type is created.
pub fn init(ctx: &Context, args: &[RedisString]) -> Status {
    entry::install_panic_hook();
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
        if let Some(set_options) = redis_module::raw::RedisModule_SetModuleOptions {
            // A short read (diskless replica, truncated RESTORE payload) must
            // reach rdb_load as an error, not kill the server.
            set_options(
                ctx.ctx,
                redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as i32,
            );
        }
    }
    if let Err(why) = config::register(ctx, settings) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    if let Err(why) = registry::register_all(ctx) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    state::init_detached(ctx.ctx);
    info::register(ctx);
    waiters::subscribe_events(ctx);
    if let Some(warning) = info::eviction_warning(ctx.ctx) {
        ctx.log_warning(&warning.to_string());
    }
    Status::Ok
}
