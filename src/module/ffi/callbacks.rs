//! Every `extern "C"` entry point the server calls, in one place: commands,
//! the data type's methods, timers, blocked clients, server and keyspace
//! events, configs and INFO. Each one wraps its raw pointers in the
//! binding's handle types (`ctx.rs`) and runs the safe code inside `guard`,
//! so a panic becomes an error reply or a logged failure and never unwinds
//! across `extern "C"`.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::lease::config::Name;
use crate::lease::effect::{Digits, Effect};
use crate::lease::{LeaseError, RecordRef};

use super::super::datatype::{self, AUX_ENCVER, ENCVER, TYPE_NAME};
use super::super::timers::{Announcement, TimerJob};
use super::super::{commands, commit, fence, grace, info, settings, timers, tokens, waiters};
use super::call;
use super::ctx::{Args, Ctx, Str};
use super::key::is_lease_key;
use super::replicate::{self, AofIo};
use super::reply::{self, Reply};
use super::server::{self, log_warning, now_ms};
use super::{value, waker};

// --- Guards ----------------------------------------------------------------

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
        log_warning(&format!(
            "panic at {place}: {}",
            panic_message(info.payload())
        ));
    }));
}

/// Runs a callback; a panic is logged and `fallback` returned.
fn guard<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            log_warning(&format!("panic in {what}: {}", panic_message(p.as_ref())));
            fallback
        }
    }
}

// --- Commands --------------------------------------------------------------

/// A command handler: the context and arguments in, a reply or an error out.
type Handler = fn(Ctx, &Args) -> Result<Reply, LeaseError>;

/// Which argument of a command is an owner id, redacted from SLOWLOG and
/// MONITOR once the handler is done.
#[derive(Clone, Copy)]
enum Redact {
    No,
    At(usize),
    /// After the keys of a multi-key command (`numkeys` at 1).
    AfterKeys,
}

/// Runs a command handler and sends its reply.
///
/// # Safety
/// `ctx`, `argv` and `argc` are what the server passed to a command.
unsafe fn run_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
    redact: Redact,
) -> c_int {
    // SAFETY: the server passes a live context and `argc` live arguments.
    let ctx = unsafe { Ctx::new(ctx) };
    let mut owner_at = match redact {
        Redact::At(pos) => Some(pos),
        Redact::No | Redact::AfterKeys => None,
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let argv = if argv.is_null() || argc <= 0 {
            &[][..]
        } else {
            // SAFETY: see above.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        // SAFETY: see above.
        let a = unsafe { Args::new(argv) };
        // A keys-position request (only getkeys-api commands get one) has
        // no client to redact in.
        if let Redact::AfterKeys = redact
            && a.len() > 1
            && !call::is_keys_position_request(ctx)
        {
            owner_at = commands::multikey_owner_arg(a.bytes(1)).filter(|&pos| pos < a.len());
        }
        handler(ctx, &a)
    }))
    .unwrap_or_else(|p| {
        let msg = panic_message(p.as_ref());
        log_warning(&format!("panic in a command: {msg}"));
        Err(LeaseError::Internal(crate::lease::error::printable(
            msg.as_bytes(),
        )))
    });
    if let Some(pos) = owner_at {
        ctx.redact(pos);
    }
    match result {
        // The usual answer, without the drop of a whole result.
        Ok(Reply::Int(n)) => reply::int(ctx, n),
        other => reply::send(ctx, other),
    }
    raw::REDISMODULE_OK as c_int
}

macro_rules! command_entry {
    ($name:ident => $handler:path, $redact:expr) => {
        pub extern "C" fn $name(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            // SAFETY: called by the server as a command.
            unsafe { run_command(ctx, argv, argc, $handler, $redact) }
        }
    };
    ($name:ident => $handler:path) => {
        command_entry!($name => $handler, Redact::No);
    };
}

command_entry!(acquire_entry => commands::acquire, Redact::At(commands::OWNER_ARG));
command_entry!(renew_entry => commands::renew, Redact::At(commands::OWNER_ARG));
command_entry!(release_entry => commands::release, Redact::At(commands::OWNER_ARG));
command_entry!(fence_entry => fence_or_keys);
command_entry!(info_entry => commands::info);
command_entry!(apply_entry => commands::apply, Redact::At(commands::OWNER_ARG));
command_entry!(hold_entry => commands::hold, Redact::At(commands::OWNER_ARG));
command_entry!(drop_entry => commands::drop, Redact::At(commands::OWNER_ARG));
command_entry!(clock_entry => commands::clock);
command_entry!(prune_entry => commands::prune);
command_entry!(version_entry => commands::version);
command_entry!(gate_entry => commands::gate);
command_entry!(macquire_entry => macquire_or_keys, Redact::AfterKeys);
command_entry!(mrenew_entry => mrenew_or_keys, Redact::AfterKeys);
command_entry!(mrelease_entry => mrelease_or_keys, Redact::AfterKeys);

/// A multi-key command, or the server asking for its keys (getkeys-api:
/// cluster routing looks at the keys a module reports, not at a `numkeys`
/// key spec): the `numkeys` arguments after argument 1, with `flags`.
fn multikey_or_keys(
    ctx: Ctx,
    a: &Args,
    flags: c_int,
    handler: Handler,
) -> Result<Reply, LeaseError> {
    if !call::is_keys_position_request(ctx) {
        return handler(ctx, a);
    }
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
    Ok(Reply::Sent)
}

fn macquire_or_keys(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    multikey_or_keys(ctx, a, call::KEY_ACQUIRE, commands::macquire)
}

fn mrenew_or_keys(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    multikey_or_keys(ctx, a, call::KEY_RENEW, commands::mrenew)
}

fn mrelease_or_keys(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    multikey_or_keys(ctx, a, call::KEY_RELEASE, commands::mrelease)
}

/// LEASE.FENCE, or the server asking for its keys (getkeys-api).
fn fence_or_keys(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if call::is_keys_position_request(ctx) {
        fence::report_keys(ctx, a);
        return Ok(Reply::Sent);
    }
    commands::fence(ctx, a)
}

// --- The data type ---------------------------------------------------------

pub static LEASE_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
        free_effort: Some(free_effort),
        unlink: Some(unlink),
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    },
);

// Every value pointer below is one this module stored (value.rs): the
// server hands back exactly the pointers the load callback returned or
// RedisModule_ModuleTypeSetValue was given, until it calls `free`.

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        let buf = if encver > ENCVER {
            None
        } else {
            raw::load_string_buffer(rdb).ok()
        };
        let loading = server::detached().is_some_and(|c| c.is_loading());
        let source = if loading {
            datatype::Source::Load
        } else {
            datatype::Source::Restore
        };
        let Some(record) = datatype::loaded(encver, buf.as_ref().map(|b| b.as_ref()), source)
        else {
            return std::ptr::null_mut();
        };
        if !loading {
            // SAFETY: the IO context of this load; the key name it gives
            // lives while the callback runs.
            unsafe {
                let name = raw::RedisModule_GetKeyNameFromIO.unwrap()(rdb);
                if !name.is_null() {
                    let db = raw::RedisModule_GetDbIdFromIO.unwrap()(rdb);
                    datatype::restored(db, Str::new(name as *mut _).bytes());
                }
            }
        }
        value::into_raw(record)
    })
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, v: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: v is one of our records (see above).
        raw::save_slice(rdb, &unsafe { value::record_ref(v) }.encode());
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    v: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: v is one of our records (see above); aof and key are the
        // rewrite's live IO context and the key's name.
        let (record, io, key) = unsafe { (value::record_ref(v), AofIo::new(aof), Str::new(key)) };
        // The effects that rebuild the record: one LEASE.APPLY, or one
        // LEASE.HOLD per live holder.
        for effect in Effect::of_record(record, now_ms()) {
            let mut digits = Digits::default();
            replicate::emit_aof(
                io,
                effect.command(),
                key,
                effect.args(&mut digits).as_slice(),
            );
        }
    })
}

unsafe extern "C" fn mem_usage(v: *const c_void) -> usize {
    // SAFETY: v is one of our records (see above).
    guard("mem_usage", 0, || {
        unsafe { value::record_ref(v) }.mem_usage()
    })
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, v: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: v is one of our records (see above); md is the digest
        // context, given buffers with their lengths and integers.
        unsafe {
            let add_str = raw::RedisModule_DigestAddStringBuffer.unwrap();
            let add_int = raw::RedisModule_DigestAddLongLong.unwrap();
            match value::record_ref(v) {
                RecordRef::Exclusive(l) => {
                    add_str(md, l.owner.as_ptr() as *const _, l.owner.len());
                    add_int(md, l.token as i64);
                    add_int(md, l.deadline_ms);
                }
                RecordRef::Holders(m) => {
                    let name = m.mode().name();
                    add_str(md, name.as_ptr() as *const _, name.len());
                    add_int(md, m.mode().limit() as i64);
                    for h in m.holders() {
                        add_str(md, h.owner.as_ptr() as *const _, h.owner.len());
                        add_int(md, h.token as i64);
                        add_int(md, h.deadline_ms);
                    }
                }
            }
            raw::RedisModule_DigestEndSequence.unwrap()(md);
        }
    })
}

unsafe extern "C" fn free(v: *mut c_void) {
    guard("free", (), || {
        // SAFETY: the server gives back ownership of a value we stored.
        unsafe { value::drop_raw(v) };
    })
}

/// How much work freeing a value is (its holders): the server frees a
/// large counting or shared lease in the background when lazy freeing is
/// on, as it does a large hash.
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, v: *const c_void) -> usize {
    // SAFETY: v is one of our records (see above).
    guard("free_effort", 1, || {
        unsafe { value::record_ref(v) }.holders()
    })
}

unsafe extern "C" fn unlink(key: *mut raw::RedisModuleString, v: *const c_void) {
    guard("unlink", (), || {
        if !key.is_null() && !super::key::unlink_is_quiet() {
            // SAFETY: the name of the key being unlinked, alive during this
            // call, and its value, one of our records (see above).
            let record = unsafe { value::record_ref(v) };
            let deadline = record.latest_deadline();
            datatype::unlinked(unsafe { Str::new(key) }.bytes(), record.holders(), deadline);
        }
    })
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    v: *const c_void,
) -> *mut c_void {
    guard("copy", std::ptr::null_mut(), || {
        // SAFETY: v is one of our records (see above).
        value::into_raw(unsafe { value::record_ref(v) }.to_owned())
    })
}

unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            raw::save_unsigned(rdb, tokens::last());
        }
    })
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    guard("aux_load", raw::REDISMODULE_ERR as c_int, || {
        if encver > AUX_ENCVER || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            log_warning(&format!(
                "cannot load token-clock aux data of encoding version {encver}"
            ));
            return raw::REDISMODULE_ERR as c_int;
        }
        match raw::load_unsigned(rdb) {
            Ok(last) => {
                tokens::observe(last);
                raw::REDISMODULE_OK as c_int
            }
            Err(_) => raw::REDISMODULE_ERR as c_int,
        }
    })
}

// --- Scanning the keyspace -------------------------------------------------

pub unsafe extern "C" fn scan_cb(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    guard("the keyspace scan", (), || {
        if name.is_null() || key.is_null() || data.is_null() {
            return;
        }
        // SAFETY: the scan's key handle, open while the callback runs; its
        // name likewise; `data` is the Vec `lease_key_names` passed.
        unsafe {
            if is_lease_key(key) {
                (*data.cast::<Vec<Vec<u8>>>()).push(Str::new(name).bytes().to_vec());
            }
        }
    })
}

// --- Timers and blocked clients --------------------------------------------

unsafe extern "C" fn timer_cb(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("a module timer", (), || {
        // SAFETY: a timer's context, live while it runs; `data` is the job
        // of a timer started by timers::start that fired (a TimerJob).
        let (ctx, job) = unsafe { (Ctx::new(ctx), server::take_timer_job::<TimerJob>(data)) };
        match job {
            TimerJob::Recheck(slot) => waiters::on_recheck(ctx, slot),
            TimerJob::MultiKey(slot, id) => waiters::on_multikey(ctx, slot, id),
            TimerJob::Timeouts => waiters::on_timeouts(),
            TimerJob::Revoke(slot, owner, token) => waiters::on_revoke(ctx, slot, owner, token),
            TimerJob::Align((db, key)) => datatype::on_align(ctx, db, &key),
            TimerJob::Announce(what) => announce(ctx, what),
            TimerJob::GraceTick => grace::on_tick(ctx),
            TimerJob::RecheckAll => waiters::recheck_all(),
            TimerJob::Drain(slot) => datatype::on_drain(ctx, slot),
        }
    })
}

unsafe extern "C" fn reply_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("the waiter reply", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: the reply callback's context; its private data is the
        // Box<Unblocked> given to UnblockClient, freed later by free_cb.
        unsafe {
            let data = raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx)
                as *mut waiters::Unblocked;
            waiters::on_reply(Ctx::new(ctx), data.as_mut());
        }
        raw::REDISMODULE_OK as c_int
    })
}

unsafe extern "C" fn timeout_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("the waiter timeout", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: reads the blocked client handle of this callback's context.
        unsafe {
            let bc = raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) as usize;
            waiters::on_server_timeout(Ctx::new(ctx), bc);
        }
        raw::REDISMODULE_OK as c_int
    })
}

unsafe extern "C" fn disconnect_cb(
    _ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    guard("the waiter disconnect", (), || {
        waiters::on_disconnect(bc as usize)
    })
}

unsafe extern "C" fn free_cb(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    guard("the waiter free", (), || {
        if !privdata.is_null() {
            // SAFETY: privdata is the Box<Unblocked> given to UnblockClient.
            waiters::on_free(*unsafe { Box::from_raw(privdata as *mut waiters::Unblocked) });
        }
    })
}

/// The callbacks the layers below hand to the server.
pub fn hooks() -> server::Hooks {
    server::Hooks {
        timer: Some(timer_cb),
        reply: Some(reply_cb),
        timeout: Some(timeout_cb),
        free_privdata: Some(free_cb),
        disconnect: Some(disconnect_cb),
        command_filter: Some(command_filter_cb),
        wake: Some(wake_cb),
        scan: Some(scan_cb),
    }
}

/// The waker thread's one-shot call, on the main thread: the key of the
/// slot it carries is due for a re-check now.
pub unsafe extern "C" fn wake_cb(data: *mut c_void) {
    // SAFETY: `data` is the slot the waker thread posted, taken back once.
    let slot = unsafe { waker::take_slot(data) };
    guard("a wake-up", (), || waiters::on_wake(slot));
}

// --- Server and keyspace events --------------------------------------------

fn announce(ctx: Ctx, what: Announcement) {
    if let Err(closed) = commit::announce(ctx, what.now()) {
        let retry = closed.retry_in_ms().unwrap_or(0);
        timers::start(retry.max(10), TimerJob::Announce(what));
    }
}

/// The versions this build speaks, then the token clock, each from a 0 ms
/// timer of its own.
fn announce_all() {
    timers::start(0, TimerJob::Announce(Announcement::Version));
    timers::start(0, TimerJob::Announce(Announcement::Clock));
}

pub unsafe extern "C" fn flush_cb(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the flush event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            waiters::recheck_all();
        }
    })
}

pub unsafe extern "C" fn swapdb_cb(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    guard("the swapdb event", (), || {
        // SAFETY: the SwapDB event's data is a RedisModuleSwapDbInfo.
        if let Some(info) = unsafe { (data as *const raw::RedisModuleSwapDbInfo).as_ref() } {
            waiters::on_swapdb(info.dbnum_first, info.dbnum_second);
        }
    })
}

pub unsafe extern "C" fn fork_cb(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the fork event", (), || {
        // Not from here: the fork may happen inside a command (PSYNC,
        // BGSAVE, BGREWRITEAOF), and propagating from within it makes the
        // server propagate that command too (PSYNC in the AOF crashes the
        // next start). A 0 ms timer writes the clock right after, still into
        // the AOF file the rewrite opened before it forked.
        if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
            announce_all();
        }
    })
}

/// A replica came online (after a full or a partial sync): it learns the
/// versions this master speaks, from a 0 ms timer (not from inside the
/// command that brought it online).
pub unsafe extern "C" fn replica_cb(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the replica event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_REPLICA_CHANGE_ONLINE {
            announce_all();
        }
    })
}

pub unsafe extern "C" fn role_cb(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("the role change event", (), || {
        grace::on_role_change(subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER)
    })
}

pub unsafe extern "C" fn shutdown_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    guard("the shutdown event", (), || {
        // SAFETY: the event's context, live while it runs.
        grace::on_shutdown(unsafe { Ctx::new(ctx) });
        waker::stop();
    })
}

pub unsafe extern "C" fn config_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    guard("the config event", (), || {
        // SAFETY: the Config event's data is a RedisModuleConfigChangeV1
        // whose names are `num_changes` C strings.
        let changed = |wanted: &[&[u8]]| unsafe {
            (data as *const raw::RedisModuleConfigChangeV1)
                .as_ref()
                .is_some_and(|c| {
                    (0..c.num_changes as usize).any(|i| {
                        let name = *c.config_names.add(i);
                        !name.is_null()
                            && wanted.contains(&std::ffi::CStr::from_ptr(name).to_bytes())
                    })
                })
        };
        // SAFETY: the event's context, live while it runs.
        let ctx = unsafe { Ctx::new(ctx) };
        if changed(&[b"maxmemory-policy"]) {
            info::on_policy_change(ctx);
        }
        if changed(&[
            b"min-replicas-to-write",
            b"min-replicas-max-lag",
            b"min-slaves-to-write",
            b"min-slaves-max-lag",
        ]) {
            grace::refresh_replica_settings(ctx);
        }
    })
}

/// The `expired` and `evicted` keyspace events.
pub unsafe extern "C" fn key_gone_cb(
    ctx: *mut raw::RedisModuleCtx,
    class: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard("the expired event", raw::REDISMODULE_OK as c_int, || {
        if !key.is_null() {
            // SAFETY: the notification's key, live while it runs.
            let key = unsafe { Str::new(key) };
            if class & raw::REDISMODULE_NOTIFY_EVICTED as c_int != 0 {
                datatype::on_evicted(key);
            } else {
                // SAFETY: the notification's context, live while it runs.
                datatype::on_expired(unsafe { Ctx::new(ctx) }, key);
            }
        }
        raw::REDISMODULE_OK as c_int
    })
}

pub unsafe extern "C" fn command_filter_cb(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    guard("the command filter", (), || {
        // SAFETY: the filter context of the command about to run; its
        // arguments live while the filter runs and are only read here.
        unsafe {
            if raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx) < 2 {
                return;
            }
            let arg = |i| {
                let s = raw::RedisModule_CommandFilterArgGet.unwrap()(fctx, i);
                (!s.is_null()).then(|| Str::new(s as *mut _).bytes())
            };
            if let Some(name) = arg(0) {
                datatype::before_command(name, arg(1));
            }
        }
    })
}

// --- Configs and INFO ------------------------------------------------------

/// `CONFIG GET lease.<name>`: `privdata` is the setting's index in
/// `lease::config::SETTINGS` (one callback pair serves every row).
pub unsafe extern "C" fn get_setting(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    Name::ALL
        .get(privdata as usize)
        .map_or(0, |&name| settings::get(name))
}

/// `CONFIG SET lease.<name>`: the server checked the bounds given at
/// registration before calling.
pub unsafe extern "C" fn set_setting(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    if let Some(&name) = Name::ALL.get(privdata as usize) {
        guard("CONFIG SET of a lease setting", (), || {
            settings::set(name, value);
            grace::setting_changed(name.setting().on_change);
        });
    }
    raw::REDISMODULE_OK as c_int
}

pub extern "C" fn info_cb(ictx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard("INFO", (), || {
        raw::add_info_section(ictx, None);
        for field in info::fields() {
            match field {
                info::Field::Unsigned(name, v) => {
                    raw::add_info_field_unsigned_long_long(ictx, name, v);
                }
                info::Field::Signed(name, v) => {
                    raw::add_info_field_long_long(ictx, name, v);
                }
                info::Field::Text(name, v) => {
                    raw::add_info_field_str(ictx, name, v);
                }
                info::Field::Owned(name, v) => {
                    raw::add_info_field_str(ictx, name, &v);
                }
                info::Field::Setting(name, v) => {
                    raw::add_info_field_long_long(ictx, &name.replace('-', "_"), v);
                }
            }
        }
    })
}
