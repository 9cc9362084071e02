//! The load sequence, which `redis_module!` runs after it created the
//! lease type: the settings from the module arguments, the module's
//! options, configs, commands, INFO and events, then what a start does
//! (the eviction policy, the grace period of a server start).

use redis_module::{Context, RedisString, Status};

use super::super::ffi::catch::install_panic_hook;
use super::super::ffi::ctx::Ctx;
use super::super::ffi::entry::hooks;
use super::super::ffi::{register, reply, server};
use super::super::version::{GIT_COMMIT, VERSION};
use super::super::{counters, grace, guards, info, settings};
use super::type_methods::LEASE_TYPE;
use super::{configs, events, table, timers};

/// Called by `redis_module!` at load, after the data type is created.
pub fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let lctx = Ctx::of_load(ctx);
    server::init_detached(lctx);
    install_panic_hook();
    server::install_hooks(hooks::<timers::Lease, events::Lease, events::Lease>());
    server::set_lease_type(*LEASE_TYPE.raw_type.borrow());
    let raw_args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let loaded = match crate::lease::config::parse_module_args(&raw_args) {
        Ok(s) => s,
        Err(why) => {
            ctx.log_warning(&format!("refusing to load: {why}"));
            return Status::Err;
        }
    };
    settings::init(loaded);
    let slot_migration = register::valkey_atomic_slot_migration(ctx);
    register::set_module_options(ctx, slot_migration);
    if let Err(why) = register::register_configs::<configs::Lease>(ctx, &loaded.values) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    if let Err(why) = register::register_commands(ctx, table::specs()) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    register::register_info::<configs::Lease>(ctx);
    // The slot-migration event only in cluster mode (`cluster-enabled`
    // cannot change while the server runs): every key deletion pays for
    // each listener (register.rs).
    register::subscribe_events::<events::Lease>(ctx, slot_migration && lctx.in_cluster());
    start(lctx);
    Status::Ok
}

/// What a load does once the server-side registration is done: the
/// eviction policy, the `+OK` reply, the grace period of a server start.
fn start(ctx: Ctx) {
    info::refresh_policy(ctx);
    guards::set_replica(ctx.is_replica());
    guards::set_cluster(ctx.in_cluster());
    reply::prepare(ctx);
    grace::at_load(ctx);
    counters::watch_resetstat(ctx);
    if let Some(warning) = info::eviction_warning() {
        server::log_warning(&warning);
    }
    server::log_notice(&format!(
        "lease module {VERSION} (commit {GIT_COMMIT}) loaded"
    ));
}
