//! The one place that turns command results, errors included, into replies.

use std::ffi::CString;

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
    /// A map (RESP3) / flat field-value array (RESP2) of integers.
    IntMap(Vec<(&'static str, i64)>),
    /// A map (RESP3) / flat field-value array (RESP2) of mixed fields.
    Fields(Vec<(&'static str, Field)>),
    /// The reply was already sent (a forwarded command reply).
    Sent,
}

/// One value of `Reply::Fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Int(i64),
    Str(&'static str),
    /// An array of integer maps (RESP3) / of flat field-value arrays (RESP2).
    Maps(Vec<[(&'static str, i64); 2]>),
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
                raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, c"OK".as_ptr());
            }
            Ok(Reply::IntMap(fields)) => {
                match raw::RedisModule_ReplyWithMap {
                    Some(map) => map(ctx, fields.len() as _),
                    None => raw::RedisModule_ReplyWithArray.unwrap()(
                        ctx,
                        2 * fields.len() as libc::c_long,
                    ),
                };
                for (name, value) in fields {
                    raw::RedisModule_ReplyWithStringBuffer.unwrap()(
                        ctx,
                        name.as_ptr().cast(),
                        name.len(),
                    );
                    raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, value);
                }
            }
            Ok(Reply::Fields(fields)) => {
                reply_map(ctx, fields.len());
                for (name, value) in fields {
                    reply_str(ctx, name);
                    match value {
                        Field::Int(n) => {
                            raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, n);
                        }
                        Field::Str(s) => reply_str(ctx, s),
                        Field::Maps(maps) => {
                            raw::RedisModule_ReplyWithArray.unwrap()(ctx, maps.len() as _);
                            for map in maps {
                                reply_map(ctx, map.len());
                                for (k, v) in map {
                                    reply_str(ctx, k);
                                    raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, v);
                                }
                            }
                        }
                    }
                }
            }
            Ok(Reply::Sent) => {}
            Err(e) => {
                let text = CString::new(e.to_string().replace('\0', "?")).expect("no NUL");
                raw::RedisModule_ReplyWithError.unwrap()(ctx, text.as_ptr());
            }
        }
    }
}
