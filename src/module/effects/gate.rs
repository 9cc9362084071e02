//! The gates a write passes. A client's write passes the server's own checks
//! before its command runs; a write the module starts by itself (a waiter
//! timer's hand-off, a revoke, an expiry fix) must pass the same ones here:
//! writes paused (`CLIENT PAUSE`, `FAILOVER`, `CLUSTER FAILOVER`), this node
//! a replica, `min-replicas-to-write` not met, a persistence error (MISCONF),
//! the cluster down, or the key's slot served by another node.
//!
//! No API answers "would the server refuse a write to this key now", so the
//! server is asked the way a script would: `RedisModule_Call` in script mode
//! of `LEASE.GATE key`, a write command that changes nothing. Script mode
//! runs the server's write checks and its cluster slot check before the
//! command, and reports a refusal through errno.

use redis_module::raw;

use crate::lease::cluster::redirect;
use crate::lease::fence::key_slot;

use super::super::ctx::{Ctx, Str};

/// Why a module-started write may not happen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Writes are paused: try again shortly.
    Paused,
    /// The server refuses writes for now (replica, min-replicas, MISCONF,
    /// cluster down): try again later.
    Refused,
    /// The key's slot is served by another node: the redirection to send.
    Moved(String),
}

/// The probe command: a write that changes nothing (see the module doc).
pub const GATE: &str = "LEASE.GATE";

/// May the module write `name` now, as a client's write could?
pub fn check(ctx: Ctx, name: Str) -> Result<(), Closed> {
    let Refusal { errno, text } = match probe(ctx, Some(name))? {
        None => return Ok(()),
        Some(r) => r,
    };
    // Some servers word the refusal as the redirection itself.
    if let Some(to) = text.filter(|t| t.starts_with("MOVED ") || t.starts_with("ASK ")) {
        return Err(Closed::Moved(to));
    }
    if errno == Some(libc::EPERM) && ctx.in_cluster() {
        let slot = key_slot(name.bytes());
        if let Some(to) = cluster_nodes(ctx).and_then(|nodes| redirect(&nodes, slot)) {
            return Err(Closed::Moved(to));
        }
    }
    Err(Closed::Refused)
}

/// Would this server accept a write now, to any key it serves: not a
/// replica, writes not paused, `min-replicas-to-write` met, no persistence
/// error? (What a grace period counts, see `grace.rs`.)
pub fn node_accepts_writes(ctx: Ctx) -> bool {
    matches!(probe(ctx, None), Ok(None))
}

/// How the server refused the probe.
struct Refusal {
    errno: Option<i32>,
    text: Option<String>,
}

/// Asks the server whether it would take a write now (to `name`, or to no
/// key): `Ok(None)` yes, `Ok(Some)` its refusal, `Err` writes paused or
/// this server a replica.
fn probe(ctx: Ctx, name: Option<Str>) -> Result<Option<Refusal>, Closed> {
    // SAFETY: a function-pointer read filled in by RedisModule_Init.
    if let Some(avoid) = unsafe { raw::RedisModule_AvoidReplicaTraffic }
        && unsafe { avoid() } != 0
    {
        return Err(Closed::Paused);
    }
    if ctx.is_replica() {
        return Err(Closed::Refused);
    }
    // SAFETY: format "sSE": one RedisModuleString, script mode, errors as
    // replies (without E, Valkey 9.1 crashes on a script-mode refusal);
    // "SE" the same without the key. The reply is freed at once; errno is
    // read right after the call.
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
    let refused = reply.is_null() || raw::call_reply_type(reply) == raw::ReplyType::Error;
    let text = (!reply.is_null())
        .then(|| raw::call_reply_string(reply))
        .flatten();
    if !reply.is_null() {
        raw::free_call_reply(reply);
    }
    Ok(refused.then_some(Refusal { errno, text }))
}

/// The text of `CLUSTER NODES`.
fn cluster_nodes(ctx: Ctx) -> Option<String> {
    // SAFETY: RM_Call with format "c": one C string; the reply is read with
    // the reply accessors and freed before returning.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(
            ctx.raw(),
            c"CLUSTER".as_ptr(),
            c"c".as_ptr(),
            c"NODES".as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        let text = match raw::call_reply_type(reply) {
            raw::ReplyType::VerbatimString => raw::call_reply_verbatim_string(reply)
                .map(|(_, b)| String::from_utf8_lossy(&b).into_owned()),
            _ => raw::call_reply_string(reply),
        };
        raw::free_call_reply(reply);
        text
    }
}
