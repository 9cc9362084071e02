//! What the module asks the server through `RedisModule_Call` and its key
//! API: whether a write would be accepted now (the gates' probe), the
//! cluster's nodes, the server's command table (read once, for the fence
//! and the guards), a command's keys, and the fenced command itself, run
//! as the caller.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::{Mutex, MutexGuard};

use redis_module::raw;

use crate::lease::keyspec::{Table, Value};

use super::ctx::{Ctx, Str};

/// A reply of RedisModule_Call, freed on drop.
pub struct CallReply(*mut raw::RedisModuleCallReply);

impl Drop for CallReply {
    fn drop(&mut self) {
        if !self.0.is_null() {
            raw::free_call_reply(self.0);
        }
    }
}

impl CallReply {
    /// The text of an error reply (`None` for any other reply).
    pub fn error_text(&self) -> Option<String> {
        if raw::call_reply_type(self.0) != raw::ReplyType::Error {
            return None;
        }
        raw::call_reply_string(self.0)
    }

    /// Sends this reply to the running command's client as it is.
    pub fn forward(&self, ctx: Ctx) {
        // SAFETY: forwards a live call reply on the running command's
        // context.
        unsafe { raw::RedisModule_ReplyWithCallReply.unwrap()(ctx.raw(), self.0) };
    }
}

/// How the server refused a write probe: errno and the error text.
pub struct Refusal {
    pub errno: Option<i32>,
    pub text: Option<String>,
}

/// Asks the server, in script mode, whether it would take a write now (to
/// `name`, or with no key): `None` yes, else its refusal. `LEASE.GATE` is
/// a write command that changes nothing; script mode runs the server's
/// write checks (and in a cluster the slot check) before a command.
pub fn probe_write(ctx: Ctx, name: Option<Str>) -> Option<Refusal> {
    // SAFETY: format "sSE": one RedisModuleString, script mode, errors as
    // replies (without E, Valkey 9.1 crashes on a script-mode refusal);
    // "SE" the same without the key. errno is read right after the call.
    let reply = unsafe {
        let call = raw::RedisModule_Call.unwrap();
        match name {
            Some(name) => call(
                ctx.raw(),
                c"LEASE.GATE".as_ptr(),
                c"sSE".as_ptr(),
                name.raw(),
            ),
            None => call(ctx.raw(), c"LEASE.GATE".as_ptr(), c"SE".as_ptr()),
        }
    };
    let errno = std::io::Error::last_os_error().raw_os_error();
    let reply = CallReply(reply);
    if reply.0.is_null() {
        return Some(Refusal { errno, text: None });
    }
    (raw::call_reply_type(reply.0) == raw::ReplyType::Error).then(|| Refusal {
        errno,
        text: raw::call_reply_string(reply.0),
    })
}

/// The text of `CLUSTER NODES`.
pub fn cluster_nodes(ctx: Ctx) -> Option<String> {
    // SAFETY: RM_Call with format "c": one C string; the reply is read with
    // the reply accessors and freed on drop.
    let reply = CallReply(unsafe {
        raw::RedisModule_Call.unwrap()(
            ctx.raw(),
            c"CLUSTER".as_ptr(),
            c"c".as_ptr(),
            c"NODES".as_ptr(),
        )
    });
    if reply.0.is_null() {
        return None;
    }
    match raw::call_reply_type(reply.0) {
        raw::ReplyType::VerbatimString => raw::call_reply_verbatim_string(reply.0)
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned()),
        _ => raw::call_reply_string(reply.0),
    }
}

/// Runs `name args...` as the caller: its ACL user (C), in script mode (S:
/// no deny-script commands, no writes on a read-only replica), errors as
/// replies (E), refusing deny-oom commands under OOM (M), replicated (!),
/// replying in the caller's protocol (0). `Err` with errno when the server
/// refused to run it at all.
pub fn call_as_caller(ctx: Ctx, name: &CStr, args: &[Str]) -> Result<CallReply, Option<i32>> {
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|s| s.raw()).collect();
    // SAFETY: format "v" takes the argv pointer and its length; every
    // string is an argument of the running call.
    let reply = unsafe {
        raw::RedisModule_Call.unwrap()(
            ctx.raw(),
            name.as_ptr(),
            c"vCSEM!0".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        )
    };
    if reply.is_null() {
        return Err(std::io::Error::last_os_error().raw_os_error());
    }
    Ok(CallReply(reply))
}

/// The keys of the command `args` (its name first): (index in `args`, key
/// flags), as RedisModule_GetCommandKeysWithFlags finds them (Redis 7.0+,
/// Valkey); empty where the server cannot say.
pub fn command_keys(ctx: Ctx, args: &[Str]) -> Vec<(usize, c_int)> {
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|s| s.raw()).collect();
    // SAFETY: a function-pointer read filled in by RedisModule_Init; argv
    // holds live arguments of the running call; the arrays the server
    // returns are read for `count` entries, then freed with RedisModule_Free
    // as its contract says.
    unsafe {
        let Some(get_keys) = raw::RedisModule_GetCommandKeysWithFlags else {
            return Vec::new();
        };
        let mut count: c_int = 0;
        let mut flags: *mut c_int = std::ptr::null_mut();
        let keys = get_keys(
            ctx.raw(),
            argv.as_mut_ptr(),
            argv.len() as c_int,
            &mut count,
            &mut flags,
        );
        if keys.is_null() {
            return Vec::new();
        }
        let out = (0..count.max(0) as usize)
            .map(|i| {
                let f = if flags.is_null() { 0 } else { *flags.add(i) };
                (*keys.add(i) as usize, f)
            })
            .collect();
        let free = raw::RedisModule_Free.unwrap();
        free(keys.cast());
        if !flags.is_null() {
            free(flags.cast());
        }
        out
    }
}

/// The key flags of a key that is read and accessed (the lease key of
/// `LEASE.FENCE`).
pub const KEY_READ_ACCESS: c_int =
    (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int;
/// The keys of `LEASE.MACQUIRE`, `LEASE.MRENEW`, `LEASE.MRELEASE`, as their
/// key specs declare them.
pub const KEY_ACQUIRE: c_int = (raw::REDISMODULE_CMD_KEY_RW
    | raw::REDISMODULE_CMD_KEY_ACCESS
    | raw::REDISMODULE_CMD_KEY_UPDATE) as c_int;
pub const KEY_RENEW: c_int =
    (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE) as c_int;
pub const KEY_RELEASE: c_int =
    (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE) as c_int;

/// Is the running call the server asking for the command's key positions
/// (a getkeys-api command)?
pub fn is_keys_position_request(ctx: Ctx) -> bool {
    // SAFETY: reads the context of the running call.
    unsafe { raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx.raw()) != 0 }
}

/// Reports argument `pos` as a key with `flags`, on a position request.
pub fn report_key(ctx: Ctx, pos: usize, flags: c_int) {
    // SAFETY: function-pointer reads filled in by RedisModule_Init; called
    // on the position-request context the server passed.
    unsafe {
        match raw::RedisModule_KeyAtPosWithFlags {
            Some(with_flags) => with_flags(ctx.raw(), pos as c_int, flags),
            None => raw::RedisModule_KeyAtPos.unwrap()(ctx.raw(), pos as c_int),
        }
    }
}

/// The server's command table, read once (`COMMAND`), the first time
/// the fence or the guards need it; `None` until then. The one reader of
/// the server's commands: `lease::keyspec` interprets it.
static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<Table>> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn table_read() -> bool {
    table().as_ref().is_some_and(|t| !t.is_empty())
}

/// Reads the server's command table now unless it was read (called
/// before the filter needs it: the filter never calls into the server to
/// read it). The lock is not held across the call: the server runs the
/// module's command filter on it, which may read the table.
pub fn load_command_table(ctx: Ctx) {
    if table_read() {
        return;
    }
    if let Some(reply) = call_command(ctx, None) {
        let mut table = table();
        if table.as_ref().is_none_or(Table::is_empty) {
            *table = Some(Table::from_command_info(&reply));
        }
    }
}

/// Runs `f` on the server's command table, if it was read (`None`: the
/// guards then ask the server's key function).
pub fn with_command_table<R>(f: impl FnOnce(Option<&Table>) -> R) -> R {
    f(table().as_ref())
}

/// `f`'s answer from the server's command table, read now if it was not,
/// and with `name` read from the server first when `f` finds no answer
/// in the table (a command loaded since it was read: the table only
/// grows). `None` when the server does not know `name`.
pub fn with_command<R>(ctx: Ctx, name: &[u8], f: impl Fn(&Table) -> Option<R>) -> Option<R> {
    if let Some(r) = table().as_ref().and_then(&f) {
        return Some(r);
    }
    load_command_table(ctx);
    let missing = table().as_ref().is_none_or(|t| t.get(name).is_none());
    let reply = if missing {
        call_command(ctx, Some(name))
    } else {
        None
    };
    let mut table = table();
    let t = table.get_or_insert_with(Table::default);
    if let Some(reply) = reply {
        t.add(&reply);
    }
    f(t)
}

/// `COMMAND` (every command's `COMMAND INFO`) or `COMMAND INFO name`, as
/// the key-spec table reads it; `None` when the server does not answer.
fn call_command(ctx: Ctx, name: Option<&[u8]>) -> Option<Value> {
    // SAFETY: RM_Call with an empty format (no arguments), or "cb" (a C
    // string, then a buffer and its length); the reply is read with the
    // accessors and freed on drop.
    let reply = CallReply(unsafe {
        let call = raw::RedisModule_Call.unwrap();
        match name {
            None => call(ctx.raw(), c"COMMAND".as_ptr(), c"".as_ptr()),
            Some(name) => call(
                ctx.raw(),
                c"COMMAND".as_ptr(),
                c"cb".as_ptr(),
                c"INFO".as_ptr(),
                name.as_ptr(),
                name.len(),
            ),
        }
    });
    if reply.0.is_null() {
        return None;
    }
    Some(value_of(reply.0))
}

/// A call reply as a key-spec value (RESP2 shapes: what RM_Call gives
/// without the `3` flag).
fn value_of(r: *mut raw::RedisModuleCallReply) -> Value {
    match raw::call_reply_type(r) {
        raw::ReplyType::Integer => Value::Int(raw::call_reply_integer(r)),
        raw::ReplyType::String | raw::ReplyType::VerbatimString => {
            Value::Str(raw::call_reply_string(r).unwrap_or_default().into_bytes())
        }
        raw::ReplyType::Array => Value::Array(
            (0..raw::call_reply_length(r))
                .map(|i| value_of(raw::call_reply_array_element(r, i)))
                .collect(),
        ),
        _ => Value::Nil,
    }
}

/// Key flags (`command_keys`): only read, and any kind of write.
pub const KEY_READ_ONLY: c_int = raw::REDISMODULE_CMD_KEY_RO as c_int;
pub const KEY_WRITES: c_int = (raw::REDISMODULE_CMD_KEY_RW
    | raw::REDISMODULE_CMD_KEY_OW
    | raw::REDISMODULE_CMD_KEY_RM) as c_int;
