//! The one place that turns command results, errors included, into replies.

use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::lease::LeaseError;

use super::ctx::Ctx;

/// What a lease command answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Int(i64),
    /// RESP2 nil, RESP3 null.
    Null,
    Ok,
    /// An array of maps (RESP3) / of flat field-value arrays (RESP2).
    Maps(Vec<Vec<(&'static str, Field)>>),
    /// A map (RESP3) / flat field-value array (RESP2) of fields.
    Fields(Vec<(&'static str, Field)>),
    /// The reply was already sent (a forwarded command reply).
    Sent,
}

/// One value of `Reply::Fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Int(i64),
    Str(&'static str),
    /// A binary-safe string, or null.
    Bytes(Option<Box<[u8]>>),
    /// An array of maps (RESP3) / of flat field-value arrays (RESP2).
    Maps(Vec<Vec<(&'static str, Field)>>),
}

/// Sends the fields of a map.
///
/// # Safety
/// `ctx` is the context of the running command.
unsafe fn reply_fields(ctx: *mut raw::RedisModuleCtx, fields: Vec<(&'static str, Field)>) {
    // SAFETY: each Reply* call writes one complete reply element, the map's
    // header first.
    unsafe {
        reply_map(ctx, fields.len());
        for (name, value) in fields {
            reply_str(ctx, name);
            match value {
                Field::Int(n) => {
                    raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, n);
                }
                Field::Str(s) => reply_str(ctx, s),
                Field::Bytes(Some(b)) => {
                    raw::RedisModule_ReplyWithStringBuffer.unwrap()(
                        ctx,
                        b.as_ptr().cast(),
                        b.len(),
                    );
                }
                Field::Bytes(None) => {
                    raw::RedisModule_ReplyWithNull.unwrap()(ctx);
                }
                Field::Maps(maps) => reply_maps(ctx, maps),
            }
        }
    }
}

/// Sends an array of maps.
///
/// # Safety
/// `ctx` is the context of the running command.
unsafe fn reply_maps(ctx: *mut raw::RedisModuleCtx, maps: Vec<Vec<(&'static str, Field)>>) {
    // SAFETY: the array's header, then one complete map per element.
    unsafe {
        raw::RedisModule_ReplyWithArray.unwrap()(ctx, maps.len() as _);
        for map in maps {
            reply_fields(ctx, map);
        }
    }
}

/// `+OK`, as the server's own reply, made once at load (`prepare`):
/// sending it is one copy of its five bytes (RedisModule_ReplyWithCallReply),
/// where RedisModule_ReplyWithSimpleString takes three copies, or on Redis
/// 7.0 as Debian builds it, a temporary string and a scan for line breaks.
/// Null when it could not be made; `OK` is then sent as a simple string.
static OK_REPLY: AtomicPtr<raw::RedisModuleCallReply> = AtomicPtr::new(std::ptr::null_mut());

/// Makes the `+OK` reply: `UNWATCH` through RedisModule_Call answers OK and
/// changes nothing but the (empty) watch list of the call's own temporary
/// client. The server counts that one call in `INFO commandstats`. Kept for
/// the module's lifetime; called at load.
pub fn prepare(ctx: Ctx) {
    // SAFETY: RM_Call with an empty format (no arguments) on the load
    // context; the reply is read with CallReplyProto and either kept (never
    // freed: the module cannot be unloaded once it registered its data
    // type) or freed at once.
    unsafe {
        let (Some(call), Some(proto), Some(free)) = (
            raw::RedisModule_Call,
            raw::RedisModule_CallReplyProto,
            raw::RedisModule_FreeCallReply,
        ) else {
            return;
        };
        let reply = call(ctx.raw(), c"UNWATCH".as_ptr(), c"".as_ptr());
        if reply.is_null() {
            return;
        }
        let mut len = 0usize;
        let p = proto(reply, &mut len);
        if !p.is_null() && std::slice::from_raw_parts(p.cast::<u8>(), len) == b"+OK\r\n" {
            OK_REPLY.store(reply, Ordering::Relaxed);
        } else {
            free(reply);
        }
    }
}

/// Opens a map of `n` pairs: a RESP3 map, or a flat array of 2n in RESP2.
///
/// # Safety
/// `ctx` is the context of the running command.
unsafe fn reply_map(ctx: *mut raw::RedisModuleCtx, n: usize) {
    // SAFETY: see above.
    unsafe {
        match raw::RedisModule_ReplyWithMap {
            Some(map) => map(ctx, n as _),
            None => raw::RedisModule_ReplyWithArray.unwrap()(ctx, 2 * n as libc::c_long),
        };
    }
}

/// # Safety
/// `ctx` is the context of the running command.
unsafe fn reply_str(ctx: *mut raw::RedisModuleCtx, s: &str) {
    // SAFETY: a buffer with its length.
    unsafe { raw::RedisModule_ReplyWithStringBuffer.unwrap()(ctx, s.as_ptr().cast(), s.len()) };
}

/// Sends an integer reply.
#[inline(always)]
pub fn int(ctx: Ctx, n: i64) {
    // SAFETY: ctx is the context of the running command.
    unsafe { raw::RedisModule_ReplyWithLongLong.unwrap()(ctx.raw(), n) };
}

/// Sends `result` to the client.
pub fn send(ctx: Ctx, result: Result<Reply, LeaseError>) {
    let ctx = ctx.raw();
    // SAFETY: ctx is the context of the running command; each Reply* call
    // writes one complete reply element.
    unsafe {
        match result {
            Ok(Reply::Int(n)) => {
                raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, n);
            }
            Ok(Reply::Null) => {
                raw::RedisModule_ReplyWithNull.unwrap()(ctx);
            }
            Ok(Reply::Ok) => {
                let ok = OK_REPLY.load(Ordering::Relaxed);
                let sent = !ok.is_null()
                    && raw::RedisModule_ReplyWithCallReply
                        .is_some_and(|reply| reply(ctx, ok) == raw::REDISMODULE_OK as libc::c_int);
                if !sent {
                    raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, c"OK".as_ptr());
                }
            }
            Ok(Reply::Fields(fields)) => reply_fields(ctx, fields),
            Ok(Reply::Maps(maps)) => reply_maps(ctx, maps),
            Ok(Reply::Sent) => {}
            Err(e) => {
                let text = CString::new(e.to_string().replace('\0', "?")).expect("no NUL");
                raw::RedisModule_ReplyWithError.unwrap()(ctx, text.as_ptr());
            }
        }
    }
}
