//! A lease key opened for one call: typed access to the stored record, its
//! expiry, storing and deleting. The key is closed on drop. Only the commit
//! layer (`commit.rs`) writes through it.
//!
//! The handle knows what the key holds from the moment it is opened (one
//! `RedisModule_KeyType`), and keeps that knowledge as it stores and
//! deletes. No call on a key that holds nothing reaches the server: Redis
//! 8.2 dereferences the missing value in `RedisModule_GetAbsExpire` on a
//! key opened for writing that holds nothing (up to 8.0 that answered "no
//! expire"), so every such question is answered here instead.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::raw;

use crate::lease::effect::{Change, Stored};
use crate::lease::{LeaseError, RecordMut};

use super::ctx::{Ctx, Str};
use super::server::{self, hooks, lease_type, now_ms};
use super::value;

/// What an open key holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// Nothing (a missing key, or one opened for writing that is empty).
    Nothing,
    /// A lease record: the value pointer the server keeps for it.
    Lease(*mut c_void),
    /// A value of another type.
    Other,
}

/// An open key of the context's selected database.
pub struct LeaseKey {
    /// NULL when a missing key was opened for reading.
    key: *mut raw::RedisModuleKey,
    holds: Holds,
}

/// How to open a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl LeaseKey {
    #[inline]
    pub fn open(ctx: Ctx, name: Str, mode: Mode) -> Self {
        let flags = match mode {
            Mode::Read => raw::REDISMODULE_READ,
            Mode::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        // SAFETY: ctx and name are live (their types' contracts); OpenKey
        // returns NULL only for a missing key opened read-only.
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.raw(), name.raw(), flags as i32) };
        let key: *mut raw::RedisModuleKey = key.cast();
        let holds = if key.is_null() {
            Holds::Nothing
        } else {
            // SAFETY: key is an open handle; KeyType, ModuleTypeGetType and
            // ModuleTypeGetValue only read it, and the last two run only on a
            // key that holds a module value.
            unsafe {
                let t = raw::RedisModule_KeyType.unwrap()(key);
                if t == raw::REDISMODULE_KEYTYPE_EMPTY as i32 {
                    Holds::Nothing
                } else if t != raw::REDISMODULE_KEYTYPE_MODULE as i32
                    || raw::RedisModule_ModuleTypeGetType.unwrap()(key) != lease_type()
                {
                    Holds::Other
                } else {
                    match raw::RedisModule_ModuleTypeGetValue.unwrap()(key) {
                        v if v.is_null() => Holds::Other,
                        v => Holds::Lease(v),
                    }
                }
            }
        };
        LeaseKey { key, holds }
    }

    /// The stored record (live or not), `None` for an empty key, or
    /// WRONGTYPE for a key of another type.
    #[inline]
    pub fn get(&mut self) -> Result<Option<RecordMut<'_>>, LeaseError> {
        match self.holds {
            Holds::Nothing => Ok(None),
            Holds::Other => Err(LeaseError::WrongType),
            // SAFETY: the value pointer of our type that the server keeps
            // for this key (value.rs), borrowed through `&mut self`, so one
            // borrow at a time.
            Holds::Lease(v) => Ok(Some(unsafe { value::record_mut(v) })),
        }
    }

    /// The key's absolute expiry (unix ms), `None` when it has none or
    /// holds nothing.
    pub fn expire_at(&self) -> Option<i64> {
        if self.holds == Holds::Nothing {
            return None;
        }
        // SAFETY: reads an open key handle that holds a value.
        let at = unsafe {
            match raw::RedisModule_GetAbsExpire {
                Some(abs) => abs(self.key),
                None => {
                    let ttl = raw::RedisModule_GetExpire.unwrap()(self.key);
                    if ttl < 0 { ttl } else { now_ms() + ttl }
                }
            }
        };
        (at >= 0).then_some(at)
    }

    /// What the key holds, for an effect to apply to.
    #[inline]
    pub fn stored(&mut self) -> Stored<'_> {
        match self.holds {
            Holds::Nothing => Stored::Nothing,
            Holds::Other => Stored::Other,
            // SAFETY: as in `get`.
            Holds::Lease(v) => Stored::Record(unsafe { value::record_mut(v) }),
        }
    }

    /// Carries out what applying an effect left to do: delete, store a new
    /// record, set the expiry.
    #[inline(always)]
    pub fn carry_out(&mut self, change: Change, released: bool) {
        if change.delete {
            if released {
                self.delete_released();
            } else {
                self.delete();
            }
        }
        if let Some(record) = change.store {
            self.set_value(value::into_raw(record));
        }
        if let Some(at) = change.expire_at {
            self.set_expire(at);
        } else if change.persist {
            self.persist();
        }
    }

    /// Removes the key's expiry (a guard's key has none).
    pub fn persist(&self) {
        if self.holds == Holds::Nothing {
            return;
        }
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            raw::RedisModule_SetExpire.unwrap()(self.key, raw::REDISMODULE_NO_EXPIRE as i64);
        }
    }

    fn set_value(&mut self, v: *mut c_void) -> bool {
        // SAFETY: the key is open for writing; on success the server owns
        // `v` and frees it through the type's free callback.
        REPLACING.store(true, Relaxed);
        let status =
            unsafe { raw::RedisModule_ModuleTypeSetValue.unwrap()(self.key, lease_type(), v) };
        REPLACING.store(false, Relaxed);
        if status != raw::REDISMODULE_OK as i32 {
            // SAFETY: the server did not take ownership; reclaim and drop it.
            unsafe { value::drop_raw(v) };
            return false;
        }
        self.holds = Holds::Lease(v);
        true
    }

    /// Sets the key's expiry to the absolute unix time `deadline_ms`, when
    /// it holds a value (an empty key has no expiry to set).
    pub fn set_expire(&self, deadline_ms: i64) {
        if self.holds == Holds::Nothing {
            return;
        }
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => {
                    set_abs(self.key, deadline_ms);
                }
                None => {
                    let ttl = (deadline_ms - now_ms()).max(1);
                    raw::RedisModule_SetExpire.unwrap()(self.key, ttl);
                }
            }
        }
    }

    /// Deletes the key (nothing to do when it holds nothing).
    pub fn delete(&mut self) {
        if self.holds == Holds::Nothing {
            return;
        }
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            raw::RedisModule_DeleteKey.unwrap()(self.key);
        }
        self.holds = Holds::Nothing;
    }

    /// Deletes the key for a client's LEASE.RELEASE: the type's unlink
    /// callback, which runs inside, has nothing to note (a DEL is neither
    /// an expiry nor an eviction) and no waiters to wake (the release
    /// serves them itself).
    pub fn delete_released(&mut self) {
        QUIET_UNLINK.store(true, Relaxed);
        self.delete();
        QUIET_UNLINK.store(false, Relaxed);
    }
}

/// Set while `delete_released` deletes a key.
static QUIET_UNLINK: AtomicBool = AtomicBool::new(false);

/// Set while the module stores a record in place of a key's value (the
/// server unlinks the value it replaces).
static REPLACING: AtomicBool = AtomicBool::new(false);

/// Is the unlink under way the module's own replacement of a value?
#[inline]
pub fn unlink_is_replacement() -> bool {
    REPLACING.load(Relaxed)
}

/// Is the unlink under way the one of a client's LEASE.RELEASE?
#[inline]
pub fn unlink_is_quiet() -> bool {
    QUIET_UNLINK.load(Relaxed)
}

impl Drop for LeaseKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: closes the handle opened in `open`, exactly once.
            unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
        }
    }
}

/// The names of the lease keys of the context's selected database (a
/// keyspace scan; its callback is the `scan` shim of `entry.rs`, which collects the
/// names of keys of the lease type).
pub fn lease_key_names(ctx: Ctx) -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = Vec::new();
    // SAFETY: a cursor made, used on this context and destroyed here; the
    // callback gets `names` as its private data for the length of the scan.
    unsafe {
        let (Some(create), Some(scan), Some(destroy)) = (
            raw::RedisModule_ScanCursorCreate,
            raw::RedisModule_Scan,
            raw::RedisModule_ScanCursorDestroy,
        ) else {
            return names;
        };
        let cursor = create();
        let data = (&mut names as *mut Vec<Vec<u8>>).cast::<c_void>();
        while scan(ctx.raw(), cursor, hooks().scan, data) != 0 {}
        destroy(cursor);
    }
    names
}

/// Is the open key handle `key` (of a scan) a lease key?
///
/// # Safety
/// `key` must be a live open key handle.
pub unsafe fn is_lease_key(key: *mut raw::RedisModuleKey) -> bool {
    // SAFETY: by the contract; KeyType and ModuleTypeGetType only read it.
    unsafe {
        raw::RedisModule_KeyType.unwrap()(key) == raw::REDISMODULE_KEYTYPE_MODULE as i32
            && raw::RedisModule_ModuleTypeGetType.unwrap()(key) == server::lease_type()
    }
}
