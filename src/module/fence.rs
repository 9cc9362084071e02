//! `LEASE.FENCE key token command [arg ...]`: checks the token and runs the
//! command in the same atomic step, through RedisModule_Call as the calling
//! user (ACL), in script mode (no deny-script commands, no writes on a
//! read-only replica), honouring OOM like the inner command would, and
//! replicating the inner command (never LEASE.FENCE itself).

use std::collections::HashMap;
use std::ffi::CString;
use std::os::raw::c_int;
use std::sync::Mutex;

use redis_module::raw;

use crate::lease::args::printable;
use crate::lease::fence::{check_inner, check_same_slot};
use crate::lease::{LeaseError, decide};

use super::entry::Args;
use super::key::{LeaseKey, Mode};
use super::reply::Reply;
use super::state::{self, STATS};

type Ctx = *mut raw::RedisModuleCtx;

/// COMMAND INFO flags per lower-case command name (7.0 has no API to read a
/// command's flags; the command table only grows, so the cache stays right).
static FLAGS: Mutex<Option<HashMap<Vec<u8>, Vec<String>>>> = Mutex::new(None);

/// An RM_Call reply, freed on drop.
struct CallReply(*mut raw::RedisModuleCallReply);

impl Drop for CallReply {
    fn drop(&mut self) {
        if !self.0.is_null() {
            raw::free_call_reply(self.0);
        }
    }
}

impl CallReply {
    fn error_text(&self) -> Option<String> {
        if self.0.is_null() || raw::call_reply_type(self.0) != raw::ReplyType::Error {
            return None;
        }
        raw::call_reply_string(self.0)
    }
}

/// The COMMAND INFO flags of `name`, or UnknownCommand.
fn command_flags(ctx: Ctx, name: &[u8]) -> Result<Vec<String>, LeaseError> {
    let lower = name.to_ascii_lowercase();
    if let Some(flags) = FLAGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&lower)
    {
        return Ok(flags.clone());
    }
    let unknown = || LeaseError::UnknownCommand(printable(name));
    let cname = CString::new(lower.clone()).map_err(|_| unknown())?;
    // SAFETY: RM_Call with format "cc": two C strings.
    let reply = CallReply(unsafe {
        raw::RedisModule_Call.unwrap()(
            ctx,
            c"COMMAND".as_ptr(),
            c"cc".as_ptr(),
            c"INFO".as_ptr(),
            cname.as_ptr(),
        )
    });
    if reply.0.is_null()
        || raw::call_reply_type(reply.0) != raw::ReplyType::Array
        || raw::call_reply_length(reply.0) < 1
    {
        return Err(unknown());
    }
    let entry = raw::call_reply_array_element(reply.0, 0);
    if entry.is_null()
        || raw::call_reply_type(entry) != raw::ReplyType::Array
        || raw::call_reply_length(entry) < 3
    {
        return Err(unknown());
    }
    let flags_reply = raw::call_reply_array_element(entry, 2);
    let flags: Vec<String> = (0..raw::call_reply_length(flags_reply))
        .filter_map(|i| raw::call_reply_string(raw::call_reply_array_element(flags_reply, i)))
        .collect();
    FLAGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(lower, flags.clone());
    Ok(flags)
}

/// In cluster mode, refuses an inner command with a key outside the slot
/// of the lease key. The server's routing refuses such a call first (the
/// inner keys are declared through `report_keys`); this keeps the rule in
/// the command itself, whatever path the call took.
fn check_slots(ctx: Ctx, a: &Args) -> Result<(), LeaseError> {
    if state::ctx_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER == 0 {
        return Ok(());
    }
    let keys = inner_keys(ctx, a);
    check_same_slot(a.bytes(1), keys.iter().map(|&(pos, _)| a.bytes(pos)))
}

/// Maps an RM_Call failure reported through errno to an error reply.
fn errno_error(name: &str) -> LeaseError {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EACCES) => LeaseError::NoPerm(format!(
            "this user has no permissions to run the '{name}' command or its keys"
        )),
        Some(libc::ENOSPC) => {
            LeaseError::Unsupported("OOM command not allowed when used memory > 'maxmemory'")
        }
        Some(libc::EROFS) => {
            LeaseError::Unsupported("READONLY You can't write against a read only replica")
        }
        Some(libc::ENOENT) | Some(libc::EINVAL) => LeaseError::UnknownCommand(name.to_string()),
        _ => LeaseError::Internal(format!("'{name}' could not be run")),
    }
}

/// LEASE.FENCE key token command [arg ...]
pub fn fence_with_command(ctx: Ctx, a: &Args, token: u64) -> Result<Reply, LeaseError> {
    let name = a.bytes(3);
    let shown = printable(name).to_ascii_lowercase();
    check_inner(name, &command_flags(ctx, name)?)?;
    check_slots(ctx, a)?;
    let mut inner: Vec<*mut raw::RedisModuleString> = (4..a.len()).map(|i| a.handle(i)).collect();
    {
        let mut key = LeaseKey::open(ctx, a.handle(1), Mode::Read);
        if let Err(e) = decide::fence(key.get()?.as_deref(), token, state::now_ms()) {
            STATS.fence_stale.incr();
            return Err(e);
        }
    }
    STATS.fence_ok.incr();
    let cname = CString::new(name).map_err(|_| LeaseError::UnknownCommand(shown.clone()))?;
    // Flags: v argv vector, C caller's ACL user, S script mode, E errors as
    // replies, M refuse deny-oom commands under OOM, ! replicate, 0 reply in
    // the caller's protocol.
    // SAFETY: format "v" takes the argv pointer and its length.
    let reply = CallReply(unsafe {
        raw::RedisModule_Call.unwrap()(
            ctx,
            cname.as_ptr(),
            c"vCSEM!0".as_ptr(),
            inner.as_mut_ptr(),
            inner.len(),
        )
    });
    if reply.0.is_null() {
        return Err(errno_error(&shown));
    }
    if let Some(text) = reply.error_text() {
        // Redis 7.0 words ACL failures as "ERR acl verification failed, ...";
        // clients expect the NOPERM code.
        if let Some(rest) = text.strip_prefix("ERR acl verification failed, ") {
            return Err(LeaseError::NoPerm(rest.to_string()));
        }
    }
    // SAFETY: forwards a live call reply to the client.
    unsafe { raw::RedisModule_ReplyWithCallReply.unwrap()(ctx, reply.0) };
    Ok(Reply::Sent)
}

/// The fenced command's keys: (argument index in this call, key flags), as
/// RedisModule_GetCommandKeysWithFlags finds them (Redis 7.0+, Valkey).
/// Empty for an unknown command, a wrong arity or a command without keys,
/// which are refused when run.
fn inner_keys(ctx: Ctx, a: &Args) -> Vec<(usize, c_int)> {
    if a.len() <= 3 {
        return Vec::new();
    }
    // SAFETY: a function-pointer read filled in by RedisModule_Init; the
    // argv points at this call's own arguments; the arrays the server
    // returns are read for `count` entries, then freed with
    // RedisModule_Free as its contract says.
    unsafe {
        let Some(get_keys) = raw::RedisModule_GetCommandKeysWithFlags else {
            return Vec::new();
        };
        let mut inner: Vec<*mut raw::RedisModuleString> =
            (3..a.len()).map(|i| a.handle(i)).collect();
        let mut count: c_int = 0;
        let mut flags: *mut c_int = std::ptr::null_mut();
        let keys = get_keys(
            ctx,
            inner.as_mut_ptr(),
            inner.len() as c_int,
            &mut count,
            &mut flags,
        );
        if keys.is_null() {
            return Vec::new();
        }
        let out = (0..count.max(0) as usize)
            .map(|i| {
                let f = if flags.is_null() { 0 } else { *flags.add(i) };
                (*keys.add(i) as usize + 3, f)
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

/// Answers a keys-position request for LEASE.FENCE (the server asks for
/// cluster routing, COMMAND GETKEYS and ACL key checks): the lease key, then
/// the inner command's keys with their access flags.
pub fn report_keys(ctx: Ctx, a: &Args) {
    let inner = inner_keys(ctx, a);
    // SAFETY: function-pointer reads filled in by RedisModule_Init; the key
    // positions are reported on the position-request context the server
    // passed.
    unsafe {
        let at = |pos: c_int, flags: c_int| match raw::RedisModule_KeyAtPosWithFlags {
            Some(with_flags) => with_flags(ctx, pos, flags),
            None => raw::RedisModule_KeyAtPos.unwrap()(ctx, pos),
        };
        at(
            1,
            (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int,
        );
        for (pos, flags) in inner {
            at(pos as c_int, flags);
        }
    }
}
