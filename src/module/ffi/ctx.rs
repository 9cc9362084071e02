//! The server handles the binding works with, made only at the entry points
//! (`entry.rs`): a call's context, its arguments, key names. Safe
//! functions take these, never a raw server pointer; the context's own
//! questions (flags, database, INFO fields, configs) are answered here.

use std::os::raw::c_int;

use redis_module::raw;

/// The context of the running command, callback or timer.
#[derive(Clone, Copy)]
pub struct Ctx(*mut raw::RedisModuleCtx);

impl Ctx {
    /// # Safety
    /// `ctx` must be the live context the server passed to the running
    /// callback (or the module's detached context), used only on the main
    /// thread while that callback runs.
    pub unsafe fn new(ctx: *mut raw::RedisModuleCtx) -> Ctx {
        Ctx(ctx)
    }

    /// The load context `redis_module!` passes to the load function.
    pub fn of_load(ctx: &redis_module::Context) -> Ctx {
        Ctx(ctx.ctx)
    }

    /// The pointer, for the server calls made inside the binding.
    pub fn raw(self) -> *mut raw::RedisModuleCtx {
        self.0
    }

    /// The context flags (REDISMODULE_CTX_FLAGS_*).
    pub fn flags(self) -> u32 {
        // SAFETY: GetContextFlags only reads the live context.
        unsafe { raw::RedisModule_GetContextFlags.unwrap()(self.0) as u32 }
    }

    /// Is this call an effect to apply (from the master link or the AOF)
    /// rather than a client's request?
    pub fn is_effect(self) -> bool {
        Ctx::effect_in(self.flags())
    }

    /// `is_effect` from flags already read (`flags` costs about 130
    /// instructions on Redis 7.0: a hot path reads them once).
    pub fn effect_in(flags: u32) -> bool {
        flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
    }

    /// Keeps argument `pos` of the running command out of SLOWLOG and
    /// MONITOR (the server shows `(redacted)`), as it does for AUTH's
    /// password. Replication and the AOF still get the argument: the server
    /// redacts only the copy it keeps for those two.
    pub fn redact(self, pos: usize) {
        // SAFETY: a function-pointer read filled in by RedisModule_Init, then
        // a call on the live context; it checks `pos` against the argc.
        unsafe {
            if let Some(redact) = raw::RedisModule_RedactClientCommandArgument {
                redact(self.0, pos as c_int);
            }
        }
    }

    /// Loaded at the server's start (Valkey says so; Redis 7.0 does not).
    pub fn server_startup(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_SERVER_STARTUP != 0
    }

    /// Is the server loading data (an RDB, the AOF, a full sync)?
    pub fn is_loading(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_LOADING != 0
    }

    /// Is the server over `maxmemory` (with a policy that cannot free
    /// memory): the state in which it refuses `deny-oom` commands?
    pub fn out_of_memory(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_OOM != 0
    }

    pub fn is_replica(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
    }

    pub fn in_cluster(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
    }

    /// The id of the client that runs the call (as `CLIENT ID` shows it;
    /// 0 when there is none, as in a timer).
    pub fn client_id(self) -> u64 {
        // SAFETY: reads the live context.
        unsafe { raw::RedisModule_GetClientId.unwrap()(self.0) }
    }

    /// The database the call runs in.
    pub fn selected_db(self) -> i32 {
        // SAFETY: reads the live context.
        unsafe { raw::RedisModule_GetSelectedDb.unwrap()(self.0) }
    }

    /// Selects database `db` for this context; false if it does not exist.
    pub fn select_db(self, db: i32) -> bool {
        // SAFETY: SelectDb on the live context.
        unsafe { raw::RedisModule_SelectDb.unwrap()(self.0, db) == raw::REDISMODULE_OK as c_int }
    }

    /// One field of a section of the server's INFO, read without running a
    /// command (nothing shows in SLOWLOG or commandstats).
    pub fn server_info(self, section: &std::ffi::CStr, name: &std::ffi::CStr) -> Option<String> {
        let [value] = self.server_info_fields(section, [name]);
        value
    }

    /// Fields of one section of the server's INFO, read at once (the
    /// server builds the whole section for each read).
    pub fn server_info_fields<const N: usize>(
        self,
        section: &std::ffi::CStr,
        names: [&std::ffi::CStr; N],
    ) -> [Option<String>; N] {
        // SAFETY: GetServerInfo on a live context; the fields are copied
        // out and the info data is freed before returning.
        unsafe {
            let (Some(get), Some(field), Some(free)) = (
                raw::RedisModule_GetServerInfo,
                raw::RedisModule_ServerInfoGetFieldC,
                raw::RedisModule_FreeServerInfo,
            ) else {
                return [const { None }; N];
            };
            let data = get(self.0, section.as_ptr());
            if data.is_null() {
                return [const { None }; N];
            }
            let out = names.map(|name| {
                let value = field(data, name.as_ptr());
                (!value.is_null()).then(|| {
                    std::ffi::CStr::from_ptr(value)
                        .to_string_lossy()
                        .into_owned()
                })
            });
            free(self.0, data);
            out
        }
    }

    /// `CONFIG GET name` through RM_Call: the value, if the server has it.
    pub fn config_get(self, name: &std::ffi::CStr) -> Option<String> {
        // SAFETY: RM_Call with format "cc": two C strings; the reply is read
        // with the reply accessors and freed before returning.
        unsafe {
            let reply = raw::RedisModule_Call.unwrap()(
                self.0,
                c"CONFIG".as_ptr(),
                c"cc".as_ptr(),
                c"GET".as_ptr(),
                name.as_ptr(),
            );
            if reply.is_null() {
                return None;
            }
            let value = if raw::call_reply_length(reply) >= 2 {
                raw::call_reply_string(raw::call_reply_array_element(reply, 1))
            } else {
                None
            };
            raw::free_call_reply(reply);
            value
        }
    }

    /// A new string owned by this context's caller, freed on drop.
    pub fn string(self, bytes: &[u8]) -> OwnedStr {
        // SAFETY: CreateString copies the bytes; the string is freed once
        // in OwnedStr's drop with the same context.
        let s = unsafe {
            raw::RedisModule_CreateString.unwrap()(self.0, bytes.as_ptr().cast(), bytes.len())
        };
        OwnedStr { ctx: self, s }
    }
}

/// A server string that lives at least as long as every use made of it
/// here: an argument of the running call, or an `OwnedStr`.
#[derive(Clone, Copy)]
pub struct Str(*mut raw::RedisModuleString);

impl Str {
    /// # Safety
    /// `s` must be a live RedisModuleString for as long as the `Str` is used.
    pub unsafe fn new(s: *mut raw::RedisModuleString) -> Str {
        Str(s)
    }

    pub fn raw(self) -> *mut raw::RedisModuleString {
        self.0
    }

    /// The bytes of the string.
    #[inline(always)]
    pub fn bytes<'a>(self) -> &'a [u8] {
        let mut len = 0usize;
        // SAFETY: StringPtrLen returns a pointer valid for `len` bytes while
        // the string lives, which `Str`'s contract guarantees.
        // (A null pointer, which the server never returns, reads as no
        // bytes: chosen without a branch.)
        unsafe {
            let ptr = raw::RedisModule_StringPtrLen.unwrap()(self.0, &mut len);
            let null = ptr.is_null();
            let ptr = if null {
                std::ptr::NonNull::dangling().as_ptr()
            } else {
                ptr as *const u8
            };
            std::slice::from_raw_parts(ptr, if null { 0 } else { len })
        }
    }
}

/// A string this module created (a key name for a timer's work).
pub struct OwnedStr {
    ctx: Ctx,
    s: *mut raw::RedisModuleString,
}

impl OwnedStr {
    pub fn as_str(&self) -> Str {
        Str(self.s)
    }
}

impl Drop for OwnedStr {
    fn drop(&mut self) {
        // SAFETY: frees the string made in `Ctx::string`, once.
        unsafe { raw::RedisModule_FreeString.unwrap()(self.ctx.0, self.s) };
    }
}

/// The arguments of one command call.
pub struct Args<'a> {
    argv: &'a [*mut raw::RedisModuleString],
}

impl<'a> Args<'a> {
    /// # Safety
    /// Every pointer in `argv` must be a live argument of the running call.
    pub unsafe fn new(argv: &'a [*mut raw::RedisModuleString]) -> Args<'a> {
        Args { argv }
    }

    pub fn len(&self) -> usize {
        self.argv.len()
    }

    /// Argument `i` as a server string (for keys and replication).
    pub fn str(&self, i: usize) -> Str {
        Str(self.argv[i])
    }

    /// The bytes of argument `i`.
    #[inline(always)]
    pub fn bytes(&self, i: usize) -> &'a [u8] {
        Str(self.argv[i]).bytes()
    }

    /// Arguments `from..` as byte slices.
    pub fn rest(&self, from: usize) -> Vec<&'a [u8]> {
        (from..self.len()).map(|i| self.bytes(i)).collect()
    }

    /// `f` of arguments `from..` as byte slices, without an allocation for
    /// up to ten of them (a command's options: a hot path).
    #[inline]
    pub fn with_rest<R>(&self, from: usize, f: impl FnOnce(&[&'a [u8]]) -> R) -> R {
        if self.len().saturating_sub(from) > 10 {
            return f(&self.rest(from));
        }
        self.with_head::<10, R>(from, f)
    }

    /// `f` of the first `N` arguments from `from` (fewer when the call has
    /// fewer) as byte slices, without an allocation.
    #[inline]
    pub fn with_head<const N: usize, R>(&self, from: usize, f: impl FnOnce(&[&'a [u8]]) -> R) -> R {
        let n = self.len().saturating_sub(from).min(N);
        let mut few: [&'a [u8]; N] = [&[]; N];
        for (i, slot) in few.iter_mut().enumerate().take(n) {
            *slot = self.bytes(from + i);
        }
        f(&few[..n])
    }

    /// Arguments `from..` as server strings.
    pub fn strs(&self, from: usize) -> Vec<Str> {
        self.argv[from.min(self.len())..]
            .iter()
            .map(|&s| Str(s))
            .collect()
    }
}
