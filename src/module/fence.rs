//! `LEASE.FENCE key token [MINTTL ms] command [arg ...]`: checks the token
//! (and the time left, with `MINTTL`) and runs the command in the same
//! atomic step, through RedisModule_Call as the calling
//! user (ACL), in script mode (no deny-script commands, no writes on a
//! read-only replica), honouring OOM like the inner command would, and
//! replicating the inner command (never LEASE.FENCE itself).

use std::cell::Cell;
use std::ffi::CString;
use std::os::raw::c_int;

use crate::lease::LeaseError;
use crate::lease::args::{FenceArgs, fence_command_at};
use crate::lease::decide::{self, Fenced};
use crate::lease::error::printable;
use crate::lease::fence::{check_inner, check_same_slot, check_shared};
use crate::lease::keyspec::{Kind, is_lease_command};

use super::commit::Reader;
use super::counters::STATS;
use super::ffi::call;
use super::ffi::ctx::{Args, Ctx, Str};
use super::ffi::reply::Reply;
use super::ffi::server::decision_ms;

/// The kind of the fenced call `name args...` (its subcommand's for a
/// container command), by the server's command table, or UnknownCommand.
fn command_kind(ctx: Ctx, name: &[u8], args: &[&[u8]]) -> Result<Kind, LeaseError> {
    call::with_command(ctx, name, |t| {
        t.command(name, args.first().copied()).map(|(c, _)| c.kind)
    })
    .ok_or_else(|| LeaseError::UnknownCommand(printable(name)))
}

/// In cluster mode, refuses an inner command with a key outside the slot
/// of the lease key. The server's routing refuses such a call first (the
/// inner keys are declared through `report_keys`); this keeps the rule in
/// the command itself, whatever path the call took.
fn check_slots(ctx: Ctx, a: &Args) -> Result<(), LeaseError> {
    if !ctx.in_cluster() {
        return Ok(());
    }
    let keys = inner_keys(ctx, a);
    check_same_slot(a.bytes(1), keys.iter().map(|&(pos, _)| a.bytes(pos)))
}

/// Maps an RM_Call failure reported through errno to an error reply.
fn errno_error(name: &str, errno: Option<i32>) -> LeaseError {
    match errno {
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

/// The token check of `LEASE.FENCE` on key `name`: a current holder's
/// token, and with `MINTTL` enough time left (`decide::fence_record`). A
/// refusal is counted: `fence_expiring` for `EXPIRING`, else
/// `fence_stale`.
#[inline]
pub fn check_token(ctx: Ctx, name: Str, f: &FenceArgs) -> Result<Fenced, LeaseError> {
    let mut key = Reader::open(ctx, name);
    // The key's expiry matters only to the time left (`MINTTL`).
    let expire = f.min_ttl_ms.and_then(|_| key.expire_at());
    decide::fence_record(
        key.record()?,
        f.token,
        f.min_ttl_ms,
        decision_ms(ctx),
        expire,
    )
    .inspect_err(|e| match e {
        LeaseError::Expiring { .. } => STATS.fence_expiring.incr(),
        _ => STATS.fence_stale.incr(),
    })
}

/// Where the fenced command's name is among the call's arguments (after
/// `MINTTL ms` when given).
fn command_index(a: &Args) -> usize {
    // The token and the word after it at most: no allocation (the server
    // asks for a fenced command's keys on every call).
    2 + a.with_head::<2, _>(2, fence_command_at)
}

/// LEASE.FENCE key token [MINTTL ms] command [arg ...]
pub fn fence_with_command(ctx: Ctx, a: &Args, f: FenceArgs) -> Result<Reply, LeaseError> {
    let at = 2 + f.command_at;
    let name = a.bytes(at);
    let shown = printable(name).to_ascii_lowercase();
    let inner_args = a.rest(at + 1);
    let kind = command_kind(ctx, name, &inner_args)?;
    check_inner(name, kind, &inner_args)?;
    check_slots(ctx, a)?;
    let inner = a.strs(at + 1);
    let fenced = check_token(ctx, a.str(1), &f)?;
    // A reader's token (SHARED) fences no write; the STALE check came first.
    if fenced.shared {
        check_shared(name, kind)?;
    }
    STATS.fence_ok.incr();
    let cname = CString::new(name).map_err(|_| LeaseError::UnknownCommand(shown.clone()))?;
    // Under the fence of a guard, the command may write its keys.
    let reply = super::guards::fencing(ctx.selected_db(), a.bytes(1), || {
        call::call_as_caller(ctx, &cname, &inner)
    })
    .map_err(|errno| errno_error(&shown, errno))?;
    if let Some(text) = reply.error_text() {
        // Redis 7.0 words ACL failures as "ERR acl verification failed, ...";
        // clients expect the NOPERM code.
        if let Some(rest) = text.strip_prefix("ERR acl verification failed, ") {
            return Err(LeaseError::NoPerm(rest.to_string()));
        }
    }
    reply.forward(ctx);
    Ok(Reply::Sent)
}

thread_local! {
    /// Set while the server is asked for a fenced command's keys: a nested
    /// key listing (another module's getkeys-api command fencing
    /// LEASE.FENCE) lists no inner keys instead of recursing.
    static LISTING: Cell<bool> = const { Cell::new(false) };
}

/// The fenced command's keys: (argument index in this call, key flags), as
/// RedisModule_GetCommandKeysWithFlags finds them (Redis 7.0+, Valkey).
/// Empty for an unknown command, a wrong arity or a command without keys,
/// which are refused when run; and empty for a fenced LEASE.* command,
/// which execution refuses: asking the server for its keys would call this
/// module back, once per level of nesting, until the stack overflows.
fn inner_keys(ctx: Ctx, a: &Args) -> Vec<(usize, c_int)> {
    // `key token` alone has no command: nothing to read (Valkey asks on
    // every call).
    if a.len() <= 3 {
        return Vec::new();
    }
    let at = command_index(a);
    if a.len() <= at || is_lease_command(a.bytes(at)) {
        return Vec::new();
    }
    if LISTING.with(|l| l.replace(true)) {
        return Vec::new();
    }
    let out = server_keys(ctx, a, at);
    LISTING.with(|l| l.set(false));
    out
}

fn server_keys(ctx: Ctx, a: &Args, at: usize) -> Vec<(usize, c_int)> {
    call::command_keys(ctx, &a.strs(at))
        .into_iter()
        .map(|(pos, flags)| (pos + at, flags))
        .collect()
}

/// Answers a keys-position request for LEASE.FENCE (the server asks for
/// cluster routing, COMMAND GETKEYS and ACL key checks): the lease key, then
/// the inner command's keys with their access flags.
pub fn report_keys(ctx: Ctx, a: &Args) {
    let inner = inner_keys(ctx, a);
    call::report_key(ctx, 1, call::KEY_READ_ACCESS);
    for (pos, flags) in inner {
        call::report_key(ctx, pos, flags);
    }
}
