//! Entry points from the server: every command and callback runs inside
//! `guard`, so a panic becomes an error reply or a logged failure and never
//! unwinds across `extern "C"`.

use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::raw;

use crate::lease::LeaseError;

use super::reply::{self, Reply};

/// The arguments of one command call.
pub struct Args<'a> {
    argv: &'a [*mut raw::RedisModuleString],
}

impl<'a> Args<'a> {
    pub fn len(&self) -> usize {
        self.argv.len()
    }

    /// The raw string handle of argument `i` (for keys and replication).
    pub fn handle(&self, i: usize) -> *mut raw::RedisModuleString {
        self.argv[i]
    }

    /// The bytes of argument `i`.
    pub fn bytes(&self, i: usize) -> &'a [u8] {
        let mut len = 0usize;
        // SAFETY: argv[i] is a live RedisModuleString of the running command;
        // StringPtrLen returns a pointer valid for `len` bytes while it lives.
        unsafe {
            let ptr = raw::RedisModule_StringPtrLen.unwrap()(self.argv[i], &mut len);
            if ptr.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(ptr as *const u8, len)
            }
        }
    }

    /// Arguments `from..` as byte slices.
    pub fn rest(&self, from: usize) -> Vec<&'a [u8]> {
        (from..self.len()).map(|i| self.bytes(i)).collect()
    }
}

/// A command handler: the context and arguments in, a reply or an error out.
pub type Handler = fn(*mut raw::RedisModuleCtx, &Args) -> Result<Reply, LeaseError>;

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

/// Installs a panic hook that logs where a panic happened to the server
/// log (the guards below then turn it into an error reply or a fallback).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let place = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "an unknown place".into());
        redis_module::logging::log_warning(format!(
            "panic at {place}: {}",
            panic_message(info.payload())
        ));
    }));
}

/// Runs a type or event callback; a panic is logged and `fallback` returned.
pub fn guard<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            redis_module::logging::log_warning(format!(
                "panic in {what}: {}",
                panic_message(p.as_ref())
            ));
            fallback
        }
    }
}

/// Runs a command handler and sends its reply.
pub fn run_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let argv = if argv.is_null() || argc <= 0 {
            &[][..]
        } else {
            // SAFETY: the server passes `argc` valid argument pointers.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        handler(ctx, &Args { argv })
    }))
    .unwrap_or_else(|p| {
        let msg = panic_message(p.as_ref());
        redis_module::logging::log_warning(format!("panic in a command: {msg}"));
        Err(LeaseError::Internal(crate::lease::args::printable(
            msg.as_bytes(),
        )))
    });
    reply::send(ctx, result);
    raw::REDISMODULE_OK as c_int
}

/// Defines the `extern "C"` entry point of a command handler.
#[macro_export]
macro_rules! command_entry {
    ($name:ident => $handler:path) => {
        pub extern "C" fn $name(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::module::entry::run_command(ctx, argv, argc, $handler)
        }
    };
}
