//! `lease.max-ttl-ms`: set by a `loadmodule` argument, and by CONFIG SET /
//! the config file where the server has module configs (Redis 7.0+, Valkey).

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{Context, raw};

use crate::lease::config::{MAX_MAX_TTL_MS, MIN_MAX_TTL_MS, Settings};

use super::state::MAX_TTL_MS;

unsafe extern "C" fn get_max_ttl(_name: *const c_char, _privdata: *mut c_void) -> c_longlong {
    MAX_TTL_MS.load(Relaxed)
}

unsafe extern "C" fn set_max_ttl(
    _name: *const c_char,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // The server checks the bounds given at registration before calling.
    MAX_TTL_MS.store(value, Relaxed);
    raw::REDISMODULE_OK as c_int
}

/// Applies the load-time settings and registers the CONFIG SET interface.
pub fn register(ctx: &Context, settings: Settings) -> Result<(), String> {
    MAX_TTL_MS.store(settings.max_ttl_ms, Relaxed);
    // SAFETY: function-pointer reads filled in by RedisModule_Init; called
    // during OnLoad with the load context, as the config API requires.
    unsafe {
        let (Some(register), Some(load)) = (
            raw::RedisModule_RegisterNumericConfig,
            raw::RedisModule_LoadConfigs,
        ) else {
            ctx.log_notice(
                "this server has no module configs; max-ttl-ms is set by loadmodule arguments only",
            );
            return Ok(());
        };
        let status = register(
            ctx.ctx,
            c"max-ttl-ms".as_ptr(),
            settings.max_ttl_ms,
            raw::REDISMODULE_CONFIG_DEFAULT,
            MIN_MAX_TTL_MS,
            MAX_MAX_TTL_MS,
            Some(get_max_ttl),
            Some(set_max_ttl),
            None,
            std::ptr::null_mut(),
        );
        if status != raw::REDISMODULE_OK as c_int {
            return Err("cannot register the config lease.max-ttl-ms".into());
        }
        if load(ctx.ctx) != raw::REDISMODULE_OK as c_int {
            return Err("invalid lease.* setting in the server configuration".into());
        }
    }
    Ok(())
}
