//! A lease key opened for one call: typed access to the stored record, its
//! expiry, storing and deleting. The key is closed on drop. Only the
//! effects layer writes through it.

use std::os::raw::c_void;

use redis_module::raw;

use crate::lease::{Lease, LeaseError, Multi, RecordMut};

use super::super::ctx::{Ctx, Str};
use super::super::state;
use super::super::value;

/// An open key of the context's selected database.
pub struct LeaseKey {
    /// NULL when a missing key was opened for reading.
    key: *mut raw::RedisModuleKey,
}

/// How to open a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl LeaseKey {
    pub fn open(ctx: Ctx, name: Str, mode: Mode) -> Self {
        let flags = match mode {
            Mode::Read => raw::REDISMODULE_READ,
            Mode::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        // SAFETY: ctx and name are live (their types' contracts); OpenKey
        // returns NULL only for a missing key opened read-only, handled by
        // `get` through the NULL check.
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.raw(), name.raw(), flags as i32) };
        LeaseKey { key: key.cast() }
    }

    /// The stored record (live or not), `None` for an empty key, or
    /// WRONGTYPE for a key of another type.
    pub fn get(&mut self) -> Result<Option<RecordMut<'_>>, LeaseError> {
        let key = self.key;
        if key.is_null() {
            return Ok(None);
        }
        // SAFETY: key is an open key handle; KeyType/ModuleTypeGetType only
        // read it. The value pointer of our type is one this module stored
        // (value.rs), borrowed through `&mut self` so one borrow at a time.
        unsafe {
            let t = raw::RedisModule_KeyType.unwrap()(key);
            if t == raw::REDISMODULE_KEYTYPE_EMPTY as i32 {
                return Ok(None);
            }
            if t != raw::REDISMODULE_KEYTYPE_MODULE as i32
                || raw::RedisModule_ModuleTypeGetType.unwrap()(key) != state::lease_type()
            {
                return Err(LeaseError::WrongType);
            }
            let v = raw::RedisModule_ModuleTypeGetValue.unwrap()(key);
            Ok((!v.is_null()).then(|| value::record_mut(v)))
        }
    }

    /// The key's absolute expiry (unix ms), `None` when it has none or is
    /// missing.
    pub fn expire_at(&self) -> Option<i64> {
        if self.key.is_null() {
            return None;
        }
        // SAFETY: reads an open key handle.
        let at = unsafe {
            match raw::RedisModule_GetAbsExpire {
                Some(abs) => abs(self.key),
                None => {
                    let ttl = raw::RedisModule_GetExpire.unwrap()(self.key);
                    if ttl < 0 { ttl } else { state::now_ms() + ttl }
                }
            }
        };
        (at >= 0).then_some(at)
    }

    /// Stores `lease` in the key (replacing what is there) and sets the
    /// key's expiry to the lease's deadline.
    pub fn set(&self, lease: Box<Lease>) {
        let deadline = lease.deadline_ms;
        if self.set_value(value::lease_into_raw(lease)) {
            self.set_expire(deadline);
        }
    }

    /// Stores a counting or shared record (replacing what is there) and
    /// sets the key's expiry to its latest deadline.
    pub fn set_multi(&self, multi: Multi) {
        let deadline = multi.latest_deadline();
        if self.set_value(value::multi_into_raw(multi))
            && let Some(deadline) = deadline
        {
            self.set_expire(deadline);
        }
    }

    fn set_value(&self, v: *mut c_void) -> bool {
        // SAFETY: the key is open for writing; on success the server owns
        // `v` and frees it through the type's free callback.
        let status = unsafe {
            raw::RedisModule_ModuleTypeSetValue.unwrap()(self.key, state::lease_type(), v)
        };
        if status != raw::REDISMODULE_OK as i32 {
            // SAFETY: the server did not take ownership; reclaim and drop it.
            unsafe { value::drop_raw(v) };
            return false;
        }
        true
    }

    /// Sets the key's expiry to the absolute unix time `deadline_ms`.
    pub fn set_expire(&self, deadline_ms: i64) {
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => {
                    set_abs(self.key, deadline_ms);
                }
                None => {
                    let ttl = (deadline_ms - state::now_ms()).max(1);
                    raw::RedisModule_SetExpire.unwrap()(self.key, ttl);
                }
            }
        }
    }

    /// Deletes the key.
    pub fn delete(&self) {
        // SAFETY: the key is open for writing.
        unsafe {
            raw::RedisModule_DeleteKey.unwrap()(self.key);
        }
    }
}

impl Drop for LeaseKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: closes the handle opened in `open`, exactly once.
            unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
        }
    }
}
