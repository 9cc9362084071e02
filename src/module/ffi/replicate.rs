//! What leaves a command besides its reply: effects into the replication
//! stream and the AOF (`RedisModule_Replicate`, and `RedisModule_EmitAOF`
//! for an AOF rewrite), keyspace notifications, and the signal that a key
//! changed. An effect's arguments come as byte slices (`lease::effect`);
//! the one that is the client's own owner argument goes as that server
//! string, without a copy.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::ctx::{Ctx, Str};

/// One argument as it is passed: a server string (`s`) or a buffer with
/// its length (`b`).
#[derive(Clone, Copy)]
enum Arg<'a> {
    Str(Str),
    Bytes(&'a [u8]),
}

/// The arguments after the key: the first one is passed as `owner_arg`
/// when these are its bytes (the client's own argument), the others as
/// buffers.
fn classify<'a>(args: &[&'a [u8]], owner_arg: Option<Str>) -> ([Arg<'a>; 5], usize) {
    let mut out = [Arg::Bytes(&[]); 5];
    for (i, a) in args.iter().enumerate() {
        out[i] = match owner_arg {
            Some(o) if i == 0 && std::ptr::eq(o.bytes().as_ptr(), a.as_ptr()) => Arg::Str(o),
            _ => Arg::Bytes(a),
        };
    }
    (out, args.len())
}

/// Calls the variadic server function `$f($target, $cmd, fmt, ...)` with the
/// key and `$args` (at most five, only the first possibly a server string),
/// choosing the format string from the arguments' kinds.
macro_rules! variadic {
    ($f:expr, $target:expr, $cmd:expr, $key:expr, $args:expr, $n:expr) => {{
        let (f, t, c, k) = ($f, $target, $cmd, $key);
        let a = $args;
        let b = |i: usize| match a[i] {
            Arg::Bytes(x) => (x.as_ptr(), x.len()),
            Arg::Str(_) => unreachable!("only the first argument is a server string"),
        };
        match ($n, a[0]) {
            (0, _) => f(t, c, c"s".as_ptr(), k),
            (1, Arg::Str(o)) => f(t, c, c"ss".as_ptr(), k, o.raw()),
            (1, _) => {
                let (p0, l0) = b(0);
                f(t, c, c"sb".as_ptr(), k, p0, l0)
            }
            (2, Arg::Str(o)) => {
                let (p1, l1) = b(1);
                f(t, c, c"ssb".as_ptr(), k, o.raw(), p1, l1)
            }
            (2, _) => {
                let ((p0, l0), (p1, l1)) = (b(0), b(1));
                f(t, c, c"sbb".as_ptr(), k, p0, l0, p1, l1)
            }
            (3, Arg::Str(o)) => {
                let ((p1, l1), (p2, l2)) = (b(1), b(2));
                f(t, c, c"ssbb".as_ptr(), k, o.raw(), p1, l1, p2, l2)
            }
            (3, _) => {
                let ((p0, l0), (p1, l1), (p2, l2)) = (b(0), b(1), b(2));
                f(t, c, c"sbbb".as_ptr(), k, p0, l0, p1, l1, p2, l2)
            }
            (4, Arg::Str(o)) => {
                let ((p1, l1), (p2, l2), (p3, l3)) = (b(1), b(2), b(3));
                f(t, c, c"ssbbb".as_ptr(), k, o.raw(), p1, l1, p2, l2, p3, l3)
            }
            (4, _) => {
                let ((p0, l0), (p1, l1), (p2, l2), (p3, l3)) = (b(0), b(1), b(2), b(3));
                f(t, c, c"sbbbb".as_ptr(), k, p0, l0, p1, l1, p2, l2, p3, l3)
            }
            (5, Arg::Str(o)) => {
                let ((p1, l1), (p2, l2), (p3, l3), (p4, l4)) = (b(1), b(2), b(3), b(4));
                f(
                    t,
                    c,
                    c"ssbbbb".as_ptr(),
                    k,
                    o.raw(),
                    p1,
                    l1,
                    p2,
                    l2,
                    p3,
                    l3,
                    p4,
                    l4,
                )
            }
            (_, _) => {
                let ((p0, l0), (p1, l1), (p2, l2), (p3, l3), (p4, l4)) =
                    (b(0), b(1), b(2), b(3), b(4));
                f(
                    t,
                    c,
                    c"sbbbbb".as_ptr(),
                    k,
                    p0,
                    l0,
                    p1,
                    l1,
                    p2,
                    l2,
                    p3,
                    l3,
                    p4,
                    l4,
                )
            }
        }
    }};
}

/// Replicates `cmd key args...` into the replication stream and the AOF.
/// `owner_arg`: the client's owner argument, passed instead of a copy when
/// `args[0]` is its bytes.
pub fn replicate(ctx: Ctx, cmd: &CStr, key: Str, args: &[&[u8]], owner_arg: Option<Str>) {
    let (a, n) = classify(args, owner_arg);
    // SAFETY: each format string matches the arguments passed with it ("s"
    // a RedisModuleString, "b" a pointer and a length); every buffer lives
    // until the call returns (the server copies them).
    unsafe {
        variadic!(
            raw::RedisModule_Replicate.unwrap(),
            ctx.raw(),
            cmd.as_ptr(),
            key.raw(),
            a,
            n
        );
    }
}

/// Replicates `cmd args...` with no key (numbers, as buffers).
pub fn replicate_keyless(ctx: Ctx, cmd: &CStr, args: &[&[u8]]) {
    // SAFETY: as in `replicate`; "b" and "bb" match one and two buffers.
    unsafe {
        let f = raw::RedisModule_Replicate.unwrap();
        match args {
            [a] => f(ctx.raw(), cmd.as_ptr(), c"b".as_ptr(), a.as_ptr(), a.len()),
            [a, b, ..] => f(
                ctx.raw(),
                cmd.as_ptr(),
                c"bb".as_ptr(),
                a.as_ptr(),
                a.len(),
                b.as_ptr(),
                b.len(),
            ),
            [] => f(ctx.raw(), cmd.as_ptr(), c"".as_ptr()),
        };
    }
}

/// Replicates the running command as it was called.
pub fn replicate_verbatim(ctx: Ctx) {
    // SAFETY: ctx is the running command's context.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx.raw()) };
}

/// An AOF rewrite's handle, given to the type's `aof_rewrite` callback.
#[derive(Clone, Copy)]
pub struct AofIo(*mut raw::RedisModuleIO);

impl AofIo {
    /// # Safety
    /// `io` must be the live IO context of the running `aof_rewrite`.
    pub unsafe fn new(io: *mut raw::RedisModuleIO) -> AofIo {
        AofIo(io)
    }
}

/// Writes `cmd key args...` into the AOF being rewritten.
pub fn emit_aof(io: AofIo, cmd: &CStr, key: Str, args: &[&[u8]]) {
    let (a, n) = classify(args, None);
    // SAFETY: as in `replicate`, for RedisModule_EmitAOF on the rewrite's IO.
    unsafe {
        variadic!(
            raw::RedisModule_EmitAOF.unwrap(),
            io.0,
            cmd.as_ptr(),
            key.raw(),
            a,
            n
        );
    }
}

/// Sends `event` for `key` to keyspace-notification subscribers (class `d`,
/// module events).
pub fn notify(ctx: Ctx, event: &CStr, key: Str) {
    // SAFETY: ctx and key are live (their contracts).
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx.raw(),
            raw::REDISMODULE_NOTIFY_MODULE as c_int,
            event.as_ptr(),
            key.raw(),
        );
    }
}

/// Signals `key` as modified (WATCH, client-side caching): the module sets
/// NO_IMPLICIT_SIGNAL_MODIFIED, so only real changes call this.
pub fn signal(ctx: Ctx, key: Str) {
    // SAFETY: ctx and key are live (their contracts).
    unsafe { raw::RedisModule_SignalModifiedKey.unwrap()(ctx.raw(), key.raw()) };
}
