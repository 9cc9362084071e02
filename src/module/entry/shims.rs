//! Each command's entry: the handler it runs, the argument redacted as an
//! owner id, and for the getkeys-api commands (`LEASE.FENCE` and the
//! multi-key ones) the keys reported when the server asks for them.

use std::os::raw::c_int;

use crate::lease::LeaseError;

use super::super::commands::{self, OWNER_ARG};
use super::super::fence;
use super::super::ffi::call;
use super::super::ffi::ctx::{Args, Ctx};
use super::super::ffi::entry::Command;
use super::super::ffi::reply::Reply;

/// A command whose owner id is argument `OWNER_ARG`.
macro_rules! command {
    ($shim:ident => $handler:path, owner) => {
        pub struct $shim;
        impl Command for $shim {
            fn run(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
                $handler(ctx, a)
            }
            fn owner_arg(_ctx: Ctx, _a: &Args) -> Option<usize> {
                Some(OWNER_ARG)
            }
        }
    };
    ($shim:ident => $handler:path) => {
        pub struct $shim;
        impl Command for $shim {
            fn run(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
                $handler(ctx, a)
            }
        }
    };
}

command!(Acquire => commands::acquire, owner);
command!(Renew => commands::renew, owner);
command!(Release => commands::release, owner);
command!(Info => commands::info);
command!(Waiters => commands::waiters);
command!(Apply => commands::apply, owner);
command!(Hold => commands::hold, owner);
command!(Drop => commands::drop, owner);
command!(Clock => commands::clock);
command!(Prune => commands::prune);
command!(Version => commands::version);
command!(Gate => commands::gate);
command!(Guard => commands::guard);
command!(Unguard => commands::unguard);
command!(Fenced => commands::fenced);

/// LEASE.FENCE, or the server asking for its keys (getkeys-api).
pub struct Fence;

impl Command for Fence {
    fn run(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
        if call::is_keys_position_request(ctx) {
            fence::report_keys(ctx, a);
            return Ok(Reply::Sent);
        }
        commands::fence(ctx, a)
    }
}

/// A multi-key command, or the server asking for its keys (getkeys-api:
/// cluster routing looks at the keys a module reports, not at a `numkeys`
/// key spec): the `numkeys` arguments after argument 1, with `flags`. The
/// owner id follows the keys.
macro_rules! multikey {
    ($shim:ident => $handler:path, $flags:expr) => {
        pub struct $shim;
        impl Command for $shim {
            fn run(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
                if call::is_keys_position_request(ctx) {
                    report_keys(ctx, a, $flags);
                    return Ok(Reply::Sent);
                }
                $handler(ctx, a)
            }
            fn owner_arg(ctx: Ctx, a: &Args) -> Option<usize> {
                multikey_owner_arg(ctx, a)
            }
        }
    };
}

multikey!(MAcquire => commands::macquire, call::KEY_ACQUIRE);
multikey!(MRenew => commands::mrenew, call::KEY_RENEW);
multikey!(MRelease => commands::mrelease, call::KEY_RELEASE);

fn report_keys(ctx: Ctx, a: &Args, flags: c_int) {
    let n = match a.len() {
        0 | 1 => 0,
        len => crate::lease::args::parse_i64(a.bytes(1))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
            .min(len - 2),
    };
    for pos in 2..2 + n {
        call::report_key(ctx, pos, flags);
    }
}

/// After the keys of a multi-key command (`numkeys` at 1). A keys-position
/// request (only getkeys-api commands get one) has no client to redact in.
fn multikey_owner_arg(ctx: Ctx, a: &Args) -> Option<usize> {
    if a.len() > 1 && !call::is_keys_position_request(ctx) {
        commands::multikey_owner_arg(a.bytes(1)).filter(|&pos| pos < a.len())
    } else {
        None
    }
}
