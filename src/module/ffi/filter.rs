//! The server's command filter, typed: the command about to run as a
//! [`FilterCommand`] (its length, its arguments, its client's database and
//! ACL user, and its replacement), the one [`Filter`] trait the binding
//! implements with its shim, and the registration, held while some part
//! of the binding holds a [`Need`] on (the filter costs every command of
//! the server). What the filter does with a command is the binding's:
//! nothing here knows who needs it or why.

use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use redis_module::raw;

use super::catch::catch_panic;
use super::ctx::Str;
use super::server;

/// The command the filter sees, before the server looks it up: valid
/// only during the filter's call (the shim lends it).
pub struct FilterCommand {
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    len: usize,
    api: &'static Api,
}

/// The server's calls the filter makes for every command, looked up once
/// (at the first registration): its argument count, argument and string
/// readers (the cheap test reads every argument).
struct Api {
    count: ArgsCount,
    get: ArgGet,
    ptr_len: PtrLen,
}

static API: OnceLock<Api> = OnceLock::new();

type ArgsCount = unsafe extern "C" fn(*mut raw::RedisModuleCommandFilterCtx) -> c_int;
type ArgGet = unsafe extern "C" fn(
    *mut raw::RedisModuleCommandFilterCtx,
    c_int,
) -> *mut raw::RedisModuleString;
type PtrLen = unsafe extern "C" fn(*const raw::RedisModuleString, *mut usize) -> *const c_char;

impl FilterCommand {
    /// Its number of arguments, the command's name included.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Argument `i` (0: the command's name) as the server holds it; null
    /// past the end. The one place that reads the filter's arguments.
    #[inline]
    fn raw_arg(&self, i: usize) -> *mut raw::RedisModuleString {
        if i >= self.len {
            return std::ptr::null_mut();
        }
        // SAFETY: a call on the filter context the shim was given, live
        // while the filter runs; `i` is below the count.
        unsafe { (self.api.get)(self.fctx, i as c_int) }
    }

    /// Argument `i`'s bytes (0: the command's name); `None` past the end
    /// (or where the server gives none). They live until the command is
    /// replaced (`replace` takes `&mut self`).
    #[inline]
    pub fn arg(&self, i: usize) -> Option<&[u8]> {
        let s = self.raw_arg(i);
        if s.is_null() {
            return None;
        }
        // SAFETY: a live argument of the command (see raw_arg); the
        // pointer StringPtrLen gives is valid for `len` bytes while the
        // argument lives, which is while `self` is borrowed.
        unsafe {
            let mut len = 0usize;
            let p = (self.api.ptr_len)(s, &mut len);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p as *const u8, len))
        }
    }

    /// Every argument as a server string (for the server's key function
    /// and its ACL check); `None` when one is missing.
    fn raw_args(&self) -> Option<Vec<*mut raw::RedisModuleString>> {
        (0..self.len)
            .map(|i| Some(self.raw_arg(i)).filter(|s| !s.is_null()))
            .collect()
    }

    /// Every argument as a [`Str`] (for `call::command_keys`); `None` when
    /// one is missing.
    pub fn strs(&self) -> Option<Vec<Str>> {
        self.raw_args().map(|v| {
            v.into_iter()
                // SAFETY: live arguments of the command (see raw_arg),
                // read while `self` is borrowed.
                .map(|s| unsafe { Str::new(s) })
                .collect()
        })
    }

    /// The database of the client whose command this is, where the server
    /// says (Redis 7.2+ and Valkey know the client; a script's or a
    /// module's client is not listed). Unknown for a command queued in a
    /// transaction: a `SELECT` queued before it may change the database it
    /// runs in at `EXEC`.
    pub fn client_db(&self) -> Option<i32> {
        // SAFETY: function-pointer reads filled in by RedisModule_Init; the
        // client info is a local of the version the server is told.
        unsafe {
            let id = raw::RedisModule_CommandFilterGetClientId?(self.fctx);
            let mut info: raw::RedisModuleClientInfo = std::mem::zeroed();
            info.version = raw::REDISMODULE_CLIENTINFO_VERSION as u64;
            let ok = raw::RedisModule_GetClientInfoById?(
                (&mut info as *mut raw::RedisModuleClientInfo).cast(),
                id,
            );
            let queued = info.flags & raw::REDISMODULE_CLIENTINFO_FLAG_MULTI as u64 != 0;
            (ok == raw::REDISMODULE_OK as c_int && !queued).then_some(info.db as i32)
        }
    }

    /// May the ACL user of the client whose command this is run it (its
    /// keys and channels included)? Where the server cannot say (a client
    /// with no user, one the server does not name), yes.
    pub fn client_may_run(&self) -> bool {
        let Some(mut argv) = self.raw_args() else {
            return true;
        };
        let Some(ctx) = server::detached() else {
            return true;
        };
        // SAFETY: function-pointer reads filled in by RedisModule_Init; the
        // user name is a new string of the detached context (no
        // auto-memory) freed here, the module user freed after the check;
        // argv holds live arguments.
        unsafe {
            let (Some(id_of), Some(name_of), Some(user_of), Some(check), Some(free_user)) = (
                raw::RedisModule_CommandFilterGetClientId,
                raw::RedisModule_GetClientUserNameById,
                raw::RedisModule_GetModuleUserFromUserName,
                raw::RedisModule_ACLCheckCommandPermissions,
                raw::RedisModule_FreeModuleUser,
            ) else {
                return true;
            };
            let name = name_of(ctx.raw(), id_of(self.fctx));
            if name.is_null() {
                return true;
            }
            let user = user_of(name);
            let mut may = true;
            if !user.is_null() {
                may = check(user, argv.as_mut_ptr(), argv.len() as c_int)
                    == raw::REDISMODULE_OK as c_int;
                free_user(user);
            }
            raw::RedisModule_FreeString.unwrap()(ctx.raw(), name);
            may
        }
    }

    /// Makes the command `words` (its name first) instead.
    pub fn replace(&mut self, words: &[&[u8]]) {
        // SAFETY: function-pointer reads filled in by RedisModule_Init, on
        // the live filter context; each new string is owned by the filter
        // from its insertion (not auto-memory, never freed by the module).
        unsafe {
            let (Some(delete), Some(insert), Some(create)) = (
                raw::RedisModule_CommandFilterArgDelete,
                raw::RedisModule_CommandFilterArgInsert,
                raw::RedisModule_CreateString,
            ) else {
                return;
            };
            for i in (0..self.len).rev() {
                delete(self.fctx, i as c_int);
            }
            for (i, word) in words.iter().enumerate() {
                let s = create(std::ptr::null_mut(), word.as_ptr().cast(), word.len());
                insert(self.fctx, i as c_int, s);
            }
        }
        self.len = words.len();
    }
}

/// What the module's command filter does with each command the server is
/// about to run (while it is registered).
pub trait Filter {
    fn filter(command: &mut FilterCommand);
}

/// The filter's shim.
unsafe extern "C" fn command_filter<F: Filter>(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    catch_panic("the command filter", (), || {
        let Some(api) = API.get() else {
            return;
        };
        // SAFETY: a call on the filter context of the command about to
        // run, live while the filter runs.
        let len = unsafe { (api.count)(fctx) }.max(0) as usize;
        F::filter(&mut FilterCommand { fctx, len, api });
    })
}

/// The shim of filter `F`, as the server registers it.
pub fn shim<F: Filter>() -> raw::RedisModuleCommandFilterFunc {
    Some(command_filter::<F>)
}

/// One part of the binding's need of the command filter: the filter is
/// registered while some `Need` is on.
pub struct Need(AtomicBool);

/// How many `Need`s are on.
static NEEDS: AtomicUsize = AtomicUsize::new(0);

impl Need {
    pub const fn new() -> Need {
        Need(AtomicBool::new(false))
    }

    /// This need is on (`on`) or off: the filter is registered while any
    /// is on, and the flush and `SWAPDB` events are listened to from then
    /// on, until `server::settle_keyspace_moves` finds none on.
    pub fn set(&self, on: bool) {
        if self.0.swap(on, Relaxed) == on {
            return;
        }
        let needs = if on {
            NEEDS.fetch_add(1, Relaxed) + 1
        } else {
            NEEDS.fetch_sub(1, Relaxed) - 1
        };
        register(needs > 0);
    }
}

impl Default for Need {
    fn default() -> Self {
        Need::new()
    }
}

/// The command filter while it is registered (an address: the static must
/// be `Sync`).
static REGISTERED: Mutex<Option<usize>> = Mutex::new(None);

/// Registers (`on`) or unregisters the module's command filter.
fn register(on: bool) {
    let Some(ctx) = server::detached() else {
        return;
    };
    server::filter_needed(ctx, on);
    let mut filter = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: function-pointer reads filled in by RedisModule_Init; the
    // filter handle is the one RegisterCommandFilter returned, unregistered
    // once; both run on the main thread with the module's context.
    unsafe {
        match (on, *filter) {
            (true, None) => {
                if let (Some(count), Some(get), Some(ptr_len)) = (
                    raw::RedisModule_CommandFilterArgsCount,
                    raw::RedisModule_CommandFilterArgGet,
                    raw::RedisModule_StringPtrLen,
                ) {
                    let _ = API.set(Api {
                        count,
                        get,
                        ptr_len,
                    });
                }
                if let Some(register) = raw::RedisModule_RegisterCommandFilter {
                    let f = register(ctx.raw(), server::hooks().command_filter, 0);
                    *filter = (!f.is_null()).then_some(f as usize);
                }
            }
            (false, Some(f)) => {
                if let Some(unregister) = raw::RedisModule_UnregisterCommandFilter {
                    unregister(ctx.raw(), f as *mut raw::RedisModuleCommandFilter);
                }
                *filter = None;
            }
            _ => {}
        }
    }
}
