//! Blocked clients (`LEASE.ACQUIRE ... BLOCK`): blocking the caller,
//! unblocking it with its answer, and giving a handle back to the server.

use redis_module::raw;

use super::ctx::Ctx;
use super::server::hooks;

/// A blocked client's handle, as an address (the waiter registry is
/// `Sync`).
pub type Handle = usize;

/// Blocks the calling client (with no server timeout: the module times out
/// its waiters itself) and watches for its disconnection; `None` when the
/// server refused.
pub fn block(ctx: Ctx) -> Option<Handle> {
    let h = hooks();
    // SAFETY: ctx is the running command's context; the callbacks match the
    // signatures BlockClient expects. Timeout 0: the module times out its
    // waiters itself.
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(ctx.raw(), h.reply, h.timeout, h.free_privdata, 0)
    };
    if bc.is_null() {
        return None;
    }
    // SAFETY: bc was just returned by BlockClient.
    unsafe {
        if let Some(set_disconnect) = raw::RedisModule_SetDisconnectCallback {
            set_disconnect(bc, h.disconnect);
        }
    }
    Some(bc as Handle)
}

/// Unblocks waiter `bc` with its answer `data`, which the server hands to
/// the reply callback and then to the free callback.
pub fn unblock<T>(bc: Handle, data: Box<T>) {
    // SAFETY: bc is a blocked client still waiting (it leaves the registry
    // when answered, timed out or disconnected); the privdata is a Box<T>
    // that the free callback reclaims with the same type (the binding has
    // one answer type).
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(
            bc as *mut raw::RedisModuleBlockedClient,
            Box::into_raw(data).cast(),
        );
    }
}

/// Gives a waiter's handle back to the server, with no answer. A client
/// blocked with RedisModule_BlockClient that is unblocked by `CLIENT
/// UNBLOCK` or disconnects is freed only when the module unblocks it (the
/// timeout callback replied, or nobody is listening).
pub fn release(bc: Handle) {
    // SAFETY: bc was just taken out of the registry, so it was never
    // unblocked before, and the server has not freed it yet.
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(
            bc as *mut raw::RedisModuleBlockedClient,
            std::ptr::null_mut(),
        );
    }
}

/// May this call block? Not inside MULTI/EXEC, scripts, or wherever the
/// server denies blocking (BLPOP's rule).
pub fn may_block(ctx: Ctx) -> bool {
    ctx.flags()
        & (raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}
