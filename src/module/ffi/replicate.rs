//! What leaves a command besides its reply: effects into the replication
//! stream and the AOF (`RedisModule_Replicate`, and `RedisModule_EmitAOF`
//! for an AOF rewrite), keyspace notifications, and the signal that a key
//! changed. An effect's arguments come as byte slices (`lease::effect`);
//! the ones that are the client's own owner and label arguments go as
//! those server strings, without a copy.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::ctx::{Ctx, Str};

/// A client's argument (its owner, its label): the server string and
/// where its bytes are.
#[derive(Clone, Copy)]
pub struct ClientArg {
    s: Str,
    at: *const u8,
}

impl ClientArg {
    /// `bytes` must be `s`'s own bytes (`Str::bytes`).
    pub fn new(s: Str, bytes: &[u8]) -> ClientArg {
        ClientArg {
            s,
            at: bytes.as_ptr(),
        }
    }
}

/// The client's own owner argument, when `args[0]` is its bytes (passed as
/// that server string, `s`, without a copy; every other argument goes as a
/// buffer, `b`).
fn owner_first(args: &[&[u8]], owner_arg: Option<ClientArg>) -> Option<Str> {
    owner_arg
        .filter(|o| args.first().is_some_and(|a| std::ptr::eq(o.at, a.as_ptr())))
        .map(|o| o.s)
}

/// Calls the variadic server function `$f($target, $cmd, fmt, ...)` with the
/// key and `$args` (at most nine: `ArgList`), the first as the server
/// string `$owner` when there is one, choosing the format string from
/// that.
macro_rules! variadic {
    ($f:expr, $target:expr, $cmd:expr, $key:expr, $args:expr, $owner:expr) => {{
        let (f, t, c, k, a): (_, _, _, _, &[&[u8]]) = ($f, $target, $cmd, $key, $args);
        let p = |i: usize| a[i].as_ptr();
        let l = |i: usize| a[i].len();
        match ($owner, a.len()) {
            // Six to nine arguments (a holding's effect with its start or
            // label, not a hot path): nine buffers after the key and the
            // owner, the format saying how many the server reads; it reads
            // no further (extra variadic arguments are ignored).
            (Some(o), n) if n > 5 => {
                let q = |i: usize| if i < n { (p(i), l(i)) } else { (p(0), 0) };
                let ((p1, l1), (p2, l2), (p3, l3), (p4, l4)) = (q(1), q(2), q(3), q(4));
                let ((p5, l5), (p6, l6), (p7, l7), (p8, l8)) = (q(5), q(6), q(7), q(8));
                let fmt = [c"ssbbbbb", c"ssbbbbbb", c"ssbbbbbbb", c"ssbbbbbbbb"][n - 6];
                f(
                    t,
                    c,
                    fmt.as_ptr(),
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
                    p5,
                    l5,
                    p6,
                    l6,
                    p7,
                    l7,
                    p8,
                    l8,
                )
            }
            (None, n) if n > 5 => {
                let q = |i: usize| if i < n { (p(i), l(i)) } else { (p(0), 0) };
                let ((p0, l0), (p1, l1), (p2, l2), (p3, l3)) = (q(0), q(1), q(2), q(3));
                let ((p4, l4), (p5, l5), (p6, l6), (p7, l7), (p8, l8)) =
                    (q(4), q(5), q(6), q(7), q(8));
                let fmt = [c"sbbbbbb", c"sbbbbbbb", c"sbbbbbbbb", c"sbbbbbbbbb"][n - 6];
                f(
                    t,
                    c,
                    fmt.as_ptr(),
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
                    p5,
                    l5,
                    p6,
                    l6,
                    p7,
                    l7,
                    p8,
                    l8,
                )
            }
            (Some(o), 1) => f(t, c, c"ss".as_ptr(), k, o.raw()),
            (Some(o), 2) => f(t, c, c"ssb".as_ptr(), k, o.raw(), p(1), l(1)),
            (Some(o), 3) => f(t, c, c"ssbb".as_ptr(), k, o.raw(), p(1), l(1), p(2), l(2)),
            (Some(o), 4) => f(
                t,
                c,
                c"ssbbb".as_ptr(),
                k,
                o.raw(),
                p(1),
                l(1),
                p(2),
                l(2),
                p(3),
                l(3),
            ),
            (Some(o), _) => f(
                t,
                c,
                c"ssbbbb".as_ptr(),
                k,
                o.raw(),
                p(1),
                l(1),
                p(2),
                l(2),
                p(3),
                l(3),
                p(4),
                l(4),
            ),
            (None, 0) => f(t, c, c"s".as_ptr(), k),
            (None, 1) => f(t, c, c"sb".as_ptr(), k, p(0), l(0)),
            (None, 2) => f(t, c, c"sbb".as_ptr(), k, p(0), l(0), p(1), l(1)),
            (None, 3) => f(
                t,
                c,
                c"sbbb".as_ptr(),
                k,
                p(0),
                l(0),
                p(1),
                l(1),
                p(2),
                l(2),
            ),
            (None, 4) => f(
                t,
                c,
                c"sbbbb".as_ptr(),
                k,
                p(0),
                l(0),
                p(1),
                l(1),
                p(2),
                l(2),
                p(3),
                l(3),
            ),
            (None, _) => f(
                t,
                c,
                c"sbbbbb".as_ptr(),
                k,
                p(0),
                l(0),
                p(1),
                l(1),
                p(2),
                l(2),
                p(3),
                l(3),
                p(4),
                l(4),
            ),
        }
    }};
}

/// The client's own label argument, when the effect's last argument is
/// its bytes.
fn label_last(args: &[&[u8]], label_arg: Option<&ClientArg>) -> Option<Str> {
    label_arg
        .filter(|l| args.last().is_some_and(|a| std::ptr::eq(l.at, a.as_ptr())))
        .map(|l| l.s)
}

/// Replicates `cmd key args...` into the replication stream and the AOF.
/// `owner_arg`: the client's owner argument, passed instead of a copy when
/// `args[0]` is its bytes; `label_arg` likewise, when an effect of an
/// acquire (owner, token, deadline, `LABEL`, label) ends with its bytes.
pub fn replicate(
    ctx: Ctx,
    cmd: &CStr,
    key: Str,
    args: &[&[u8]],
    owner_arg: Option<ClientArg>,
    label_arg: Option<&ClientArg>,
) {
    let owner = owner_first(args, owner_arg);
    if let (Some(o), [_, token, deadline, word, _]) = (owner, args)
        && let Some(l) = label_last(args, label_arg)
    {
        // SAFETY: "ssbbbs" matches the key and the owner (server strings),
        // three buffers that live until the call returns (the server copies
        // them), and the label (a server string, which the server keeps a
        // reference to).
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                ctx.raw(),
                cmd.as_ptr(),
                c"ssbbbs".as_ptr(),
                key.raw(),
                o.raw(),
                token.as_ptr(),
                token.len(),
                deadline.as_ptr(),
                deadline.len(),
                word.as_ptr(),
                word.len(),
                l.raw(),
            );
        }
        return;
    }
    // SAFETY: each format string matches the arguments passed with it ("s"
    // a RedisModuleString, "b" a pointer and a length), or a prefix of them
    // (the server reads what the format names; C ignores the rest); every
    // buffer lives until the call returns (the server copies them).
    unsafe {
        variadic!(
            raw::RedisModule_Replicate.unwrap(),
            ctx.raw(),
            cmd.as_ptr(),
            key.raw(),
            args,
            owner
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
    // SAFETY: as in `replicate`, for RedisModule_EmitAOF on the rewrite's IO.
    unsafe {
        variadic!(
            raw::RedisModule_EmitAOF.unwrap(),
            io.0,
            cmd.as_ptr(),
            key.raw(),
            args,
            None::<Str>
        );
    }
}

/// Writes `cmd arg` (no key; a number, as a buffer) into the AOF being
/// rewritten.
pub fn emit_aof_keyless(io: AofIo, cmd: &CStr, arg: &[u8]) {
    // SAFETY: as in `emit_aof`; "b" matches one buffer, which lives until
    // the call returns (the server copies it).
    unsafe {
        raw::RedisModule_EmitAOF.unwrap()(
            io.0,
            cmd.as_ptr(),
            c"b".as_ptr(),
            arg.as_ptr(),
            arg.len(),
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
