//! The lease data type: its RDB encoding, AOF rewrite, digest, memory
//! usage, copy, free, and the token clock's aux data. Every callback is an
//! `extern "C"` entry point from the server and is panic-guarded.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::lease::Lease;

use super::entry::guard;
use super::state;

/// Encoding version of the RDB value (the record carries its own version too).
pub const ENCVER: i32 = 1;
/// Encoding version of the aux data (the token clock).
const AUX_ENCVER: c_int = 1;

/// The name `TYPE key` answers.
pub const TYPE_NAME: &str = "leasetype";

pub static LEASE_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
        free_effort: None,
        unlink: Some(unlink),
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    },
);

/// The server's handle of the lease type (set at load).
pub fn raw_type() -> *mut raw::RedisModuleType {
    *LEASE_TYPE.raw_type.borrow()
}

fn log_warning(msg: &str) {
    redis_module::logging::log_warning(msg);
}

/// # Safety
/// `value` must be a pointer this module stored for the lease type.
unsafe fn lease<'a>(value: *const c_void) -> &'a Lease {
    // SAFETY: the server hands back exactly the Box<Lease> pointer we stored.
    unsafe { &*(value as *const Lease) }
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        if encver > ENCVER {
            log_warning(&format!(
                "cannot load a lease value of encoding version {encver}: this module reads up to {ENCVER}"
            ));
            return std::ptr::null_mut();
        }
        let Ok(buf) = raw::load_string_buffer(rdb) else {
            return std::ptr::null_mut();
        };
        match Lease::decode(buf.as_ref()) {
            Ok(lease) => {
                state::observe_token(lease.token);
                Box::into_raw(Box::new(lease)) as *mut c_void
            }
            Err(e) => {
                log_warning(&format!("refusing a stored lease value: {e}"));
                std::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: value is one of our records.
        let l = unsafe { lease(value) };
        raw::save_slice(rdb, &l.encode());
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: value is one of our records.
        let l = unsafe { lease(value) };
        // SAFETY: EmitAOF with format "sbll": a RedisModuleString, a buffer
        // with its length, and two long longs, matching the arguments.
        unsafe {
            raw::RedisModule_EmitAOF.unwrap()(
                aof,
                super::registry::APPLY_CMD.as_ptr(),
                c"sbll".as_ptr(),
                key,
                l.owner.as_ptr(),
                l.owner.len(),
                l.token as i64,
                l.deadline_ms,
            );
        }
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: value is one of our records.
    guard("mem_usage", 0, || unsafe { lease(value) }.mem_usage())
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: value is one of our records; md is the digest context.
        let l = unsafe { lease(value) };
        unsafe {
            raw::RedisModule_DigestAddStringBuffer.unwrap()(
                md,
                l.owner.as_ptr() as *const _,
                l.owner.len(),
            );
            raw::RedisModule_DigestAddLongLong.unwrap()(md, l.token as i64);
            raw::RedisModule_DigestAddLongLong.unwrap()(md, l.deadline_ms);
            raw::RedisModule_DigestEndSequence.unwrap()(md);
        }
    })
}

unsafe extern "C" fn free(value: *mut c_void) {
    guard("free", (), || {
        // SAFETY: the server gives back ownership of the Box<Lease> we stored.
        drop(unsafe { Box::from_raw(value as *mut Lease) });
    })
}

/// Called when a lease key leaves the keyspace (DEL, expiry, overwrite).
/// A record past its deadline can only be leaving because it expired.
/// Clients waiting on that key name are re-checked right after.
unsafe extern "C" fn unlink(key: *mut raw::RedisModuleString, value: *const c_void) {
    guard("unlink", (), || {
        if !key.is_null() {
            let mut len = 0usize;
            // SAFETY: key is the name of the key being unlinked, alive for
            // the duration of this callback.
            let name = unsafe {
                let ptr = raw::RedisModule_StringPtrLen.unwrap()(key, &mut len);
                std::slice::from_raw_parts(ptr as *const u8, len)
            };
            super::waiters::key_removed(name);
        }
        // SAFETY: value is one of our records, still alive during unlink.
        if !unsafe { lease(value) }.is_live(state::now_ms()) {
            state::STATS.expired.incr();
        }
    })
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard("copy", std::ptr::null_mut(), || {
        // SAFETY: value is one of our records.
        Box::into_raw(Box::new(unsafe { lease(value) }.clone())) as *mut c_void
    })
}

unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            raw::save_unsigned(rdb, state::last_token());
        }
    })
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    guard("aux_load", raw::REDISMODULE_ERR as c_int, || {
        if encver > AUX_ENCVER || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            log_warning(&format!(
                "cannot load token-clock aux data of encoding version {encver}"
            ));
            return raw::REDISMODULE_ERR as c_int;
        }
        match raw::load_unsigned(rdb) {
            Ok(last) => {
                state::observe_token(last);
                raw::REDISMODULE_OK as c_int
            }
            Err(_) => raw::REDISMODULE_ERR as c_int,
        }
    })
}
