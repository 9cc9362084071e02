//! The `INFO lease` section and the eviction-policy warning (SPEC S4, S5).

use std::os::raw::c_int;

use redis_module::{Context, raw};

use super::state::{self, STATS};

/// Reads `CONFIG GET name` through RM_Call; `None` if unavailable.
fn config_get(ctx: *mut raw::RedisModuleCtx, name: &std::ffi::CStr) -> Option<String> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: RM_Call with format "cc" and two C strings; the reply is read
    // with the reply accessors and freed before returning. Runs on the main
    // thread, which holds the server lock.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        let value = if raw::call_reply_length(reply) >= 2 {
            let v = raw::call_reply_array_element(reply, 1);
            raw::call_reply_string(v)
        } else {
            None
        };
        raw::free_call_reply(reply);
        value
    }
}

/// May the eviction policy remove lease keys under memory pressure?
/// Every policy but `noeviction` can (lease keys all have a TTL, so the
/// volatile-* policies pick them too).
fn policy_may_evict(policy: &str) -> bool {
    policy != "noeviction"
}

/// The warning to log when the policy may evict leases.
pub fn eviction_warning(ctx: *mut raw::RedisModuleCtx) -> Option<String> {
    let policy = config_get(ctx, c"maxmemory-policy")?;
    policy_may_evict(&policy).then(|| {
        format!(
            "WARNING maxmemory-policy is '{policy}': under maxmemory, lease keys may be evicted and a held lease lost. Use 'maxmemory-policy noeviction' for leases."
        )
    })
}

/// Registers the INFO callback (replacing the toolkit's default one).
pub fn register(ctx: &Context) {
    raw::register_info_function(ctx.ctx, Some(info_callback));
}

extern "C" fn info_callback(ictx: *mut raw::RedisModuleInfoCtx, for_crash_report: c_int) {
    super::entry::guard("INFO", (), || {
        raw::add_info_section(ictx, None);
        for (name, value) in STATS.fields() {
            raw::add_info_field_unsigned_long_long(ictx, name, value);
        }
        raw::add_info_field_unsigned_long_long(ictx, "waiters", super::waiters::total() as u64);
        raw::add_info_field_unsigned_long_long(ictx, "last_token", state::last_token());
        raw::add_info_field_long_long(ictx, "max_ttl_ms", state::max_ttl_ms());
        if for_crash_report == 0
            && let Some(policy) = config_get(state::detached(), c"maxmemory-policy")
        {
            raw::add_info_field_str(ictx, "maxmemory_policy", &policy);
            raw::add_info_field_long_long(
                ictx,
                "eviction_may_lose_leases",
                policy_may_evict(&policy) as i64,
            );
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_noeviction_is_safe() {
        assert!(!super::policy_may_evict("noeviction"));
        for p in [
            "allkeys-lru",
            "volatile-lru",
            "volatile-ttl",
            "allkeys-random",
        ] {
            assert!(super::policy_may_evict(p));
        }
    }
}
