//! The wall's side of every `extern "C"` function the server calls: a
//! generic shim per kind of entry point that turns the raw pointers into
//! the typed handles of this folder, runs the safe code inside `catch_panic` (a
//! panic becomes an error reply or a logged fallback, never an unwind
//! across `extern "C"`), and hands the result back in the server's terms.
//!
//! What each entry point does is not decided here: the shims are generic
//! over the traits below, which the binding's entry points
//! (`src/module/entry/`) implement. So nothing in `ffi/` imports the rest
//! of the binding; the server gets `command::<Acquire>`, `timer::<W>`, and
//! so on.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::lease::waitq::Slot;
use crate::lease::{LeaseError, Record, RecordRef};

use super::catch::{catch_panic, panic_message};
use super::ctx::{Args, Ctx, Str};
use super::filter::{self, Filter};
use super::key::{is_lease_key, unlink_is_quiet, unlink_is_replacement};
use super::replicate::AofIo;
use super::reply::{self, Reply};
use super::server::{self, Hooks, log_warning};
use super::{value, waker};

// --- Commands --------------------------------------------------------------

/// A command: the context and arguments in, a reply or an error out.
pub trait Command {
    fn run(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError>;

    /// Which argument is an owner id, redacted from SLOWLOG and MONITOR
    /// once the command is done (none by default).
    fn owner_arg(_ctx: Ctx, _a: &Args) -> Option<usize> {
        None
    }
}

/// A command's entry, as the command table registers it.
pub type CommandEntry = raw::RedisModuleCmdFunc;

/// The entry of command `C`.
pub const fn command_entry<C: Command>() -> CommandEntry {
    Some(command::<C>)
}

/// Runs command `C` and sends its reply.
///
/// # Safety
/// Called by the server as a command: `ctx`, `argv` and `argc` are what it
/// passes to one.
unsafe extern "C" fn command<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: the server passes a live context and `argc` live arguments.
    let ctx = unsafe { Ctx::new(ctx) };
    let mut owner_at = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let argv = if argv.is_null() || argc <= 0 {
            &[][..]
        } else {
            // SAFETY: see above.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        // SAFETY: see above.
        let a = unsafe { Args::new(argv) };
        owner_at = C::owner_arg(ctx, &a);
        C::run(ctx, &a)
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

// --- The data type ---------------------------------------------------------

/// Where `rdb_load` gets a record from.
pub enum LoadFrom<'a> {
    /// The server is loading data (an RDB, the AOF's preamble, a full
    /// sync): the key's database and name, where the server gives them.
    Load(Option<(i32, &'a [u8])>),
    /// `RESTORE` (or a `MIGRATE` arriving): the key's database and name,
    /// where the server gives them.
    Restore(Option<(i32, &'a [u8])>),
}

/// The digest of one value (`DEBUG DIGEST-VALUE`, `DEBUG DIGEST`).
pub struct Digest(*mut raw::RedisModuleDigest);

impl Digest {
    pub fn add_bytes(&mut self, b: &[u8]) {
        // SAFETY: the live digest context of the running callback, given a
        // buffer with its length.
        unsafe {
            raw::RedisModule_DigestAddStringBuffer.unwrap()(self.0, b.as_ptr() as *const _, b.len())
        }
    }

    /// Ends one element of the value.
    pub fn end_sequence(&mut self) {
        // SAFETY: as above.
        unsafe { raw::RedisModule_DigestEndSequence.unwrap()(self.0) }
    }
}

/// What the lease type does beyond storing its records: loading, the AOF
/// rewrite, the digest, unlinks and the aux data (the token clock).
pub trait LeaseType {
    /// The newest record encoding this build reads.
    const ENCVER: c_int;
    /// The newest aux-data encoding this build reads.
    const AUX_ENCVER: c_int;

    /// A record read from an RDB payload (`buf`; `None` when the encoding
    /// is newer than `ENCVER` or the payload is cut short); `None` refuses
    /// the load.
    fn rdb_load(encver: c_int, buf: Option<&[u8]>, from: LoadFrom<'_>) -> Option<Record>;
    /// The commands that rebuild `record` under `key` in a rewritten AOF.
    fn aof_rewrite(io: AofIo, key: Str, record: RecordRef<'_>);
    fn digest(d: &mut Digest, record: RecordRef<'_>);
    /// A key of database `db` holding `record` leaves the keyspace (DEL,
    /// UNLINK, expiry, eviction, an overwrite); `quiet` when the module
    /// itself removes it, `replaced` when the module stores another record
    /// in its place.
    fn unlinked(db: i32, key: &[u8], record: RecordRef<'_>, quiet: bool, replaced: bool);
    /// Does `unlinked` have work for this record (the server's calls for
    /// the key's name are skipped when not)?
    fn notices_unlink(record: RecordRef<'_>, quiet: bool) -> bool;
    /// `COPY` makes a copy of `record` under `key` of database `db`;
    /// `false` refuses it.
    fn copied(db: i32, key: &[u8], record: RecordRef<'_>) -> bool;
    /// The aux value saved before the keys of an RDB.
    fn aux_save() -> u64;
    fn aux_load(value: u64);
}

/// The lease type as `redis_module!` registers it.
pub const fn lease_type<T: LeaseType>(name: &'static str) -> RedisType {
    RedisType::new(
        name,
        T::ENCVER,
        raw::RedisModuleTypeMethods {
            version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
            rdb_load: Some(rdb_load::<T>),
            rdb_save: Some(rdb_save),
            aof_rewrite: Some(aof_rewrite::<T>),
            mem_usage: Some(mem_usage),
            digest: Some(digest::<T>),
            free: Some(free),
            aux_load: Some(aux_load::<T>),
            aux_save: Some(aux_save::<T>),
            aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
            free_effort: Some(free_effort),
            unlink: None,
            copy: None,
            defrag: None,
            mem_usage2: None,
            free_effort2: None,
            unlink2: Some(unlink2::<T>),
            copy2: Some(copy2::<T>),
            aux_save2: None,
        },
    )
}

// Every value pointer below is one this module stored (value.rs): the
// server hands back exactly the pointers the load callback returned or
// RedisModule_ModuleTypeSetValue was given, until it calls `free`.

unsafe extern "C" fn rdb_load<T: LeaseType>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
) -> *mut c_void {
    catch_panic("rdb_load", std::ptr::null_mut(), || {
        let buf = if encver > T::ENCVER {
            None
        } else {
            raw::load_string_buffer(rdb).ok()
        };
        let loading = server::detached().is_some_and(|c| c.is_loading());
        // SAFETY: the IO context of this load; the key name it gives lives
        // while the callback runs.
        let name = unsafe {
            let name = raw::RedisModule_GetKeyNameFromIO.unwrap()(rdb);
            (!name.is_null()).then(|| {
                let db = raw::RedisModule_GetDbIdFromIO.unwrap()(rdb);
                (db, Str::new(name as *mut _).bytes())
            })
        };
        let from = if loading {
            LoadFrom::Load(name)
        } else {
            LoadFrom::Restore(name)
        };
        T::rdb_load(encver, buf.as_ref().map(|b| b.as_ref()), from)
            .map_or(std::ptr::null_mut(), value::into_raw)
    })
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, v: *mut c_void) {
    catch_panic("rdb_save", (), || {
        // SAFETY: v is one of our records (see above).
        raw::save_slice(rdb, &unsafe { value::record_ref(v) }.encode());
    })
}

unsafe extern "C" fn aof_rewrite<T: LeaseType>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    v: *mut c_void,
) {
    catch_panic("aof_rewrite", (), || {
        // SAFETY: v is one of our records (see above); aof and key are the
        // rewrite's live IO context and the key's name.
        let (record, io, key) = unsafe { (value::record_ref(v), AofIo::new(aof), Str::new(key)) };
        T::aof_rewrite(io, key, record);
    })
}

unsafe extern "C" fn mem_usage(v: *const c_void) -> usize {
    // SAFETY: v is one of our records (see above).
    catch_panic("mem_usage", 0, || {
        unsafe { value::record_ref(v) }.mem_usage()
    })
}

unsafe extern "C" fn digest<T: LeaseType>(md: *mut raw::RedisModuleDigest, v: *mut c_void) {
    catch_panic("digest", (), || {
        // SAFETY: v is one of our records (see above); md is the live
        // digest context of this callback.
        T::digest(&mut Digest(md), unsafe { value::record_ref(v) });
    })
}

unsafe extern "C" fn free(v: *mut c_void) {
    catch_panic("free", (), || {
        // SAFETY: the server gives back ownership of a value we stored.
        unsafe { value::drop_raw(v) };
    })
}

/// How much work freeing a value is (its holders): the server frees a
/// large counting or shared lease in the background when lazy freeing is
/// on, as it does a large hash.
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, v: *const c_void) -> usize {
    // SAFETY: v is one of our records (see above).
    catch_panic("free_effort", 1, || {
        unsafe { value::record_ref(v) }.holders()
    })
}

unsafe extern "C" fn unlink2<T: LeaseType>(ctx: *mut raw::RedisModuleKeyOptCtx, v: *const c_void) {
    catch_panic("unlink", (), || {
        // SAFETY: the key's context of this callback: the name of the key
        // being unlinked, alive during this call, and its database; its
        // value is one of our records (see above).
        unsafe {
            let record = value::record_ref(v);
            let quiet = unlink_is_quiet();
            if !T::notices_unlink(record, quiet) {
                return;
            }
            let key = raw::RedisModule_GetKeyNameFromOptCtx.unwrap()(ctx);
            if key.is_null() {
                return;
            }
            let db = raw::RedisModule_GetDbIdFromOptCtx.unwrap()(ctx);
            let key = Str::new(key as *mut _);
            T::unlinked(db, key.bytes(), record, quiet, unlink_is_replacement());
        }
    })
}

unsafe extern "C" fn copy2<T: LeaseType>(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    v: *const c_void,
) -> *mut c_void {
    catch_panic("copy", std::ptr::null_mut(), || {
        // SAFETY: v is one of our records (see above); the key's context
        // of this callback gives the copy's name (alive during this call)
        // and database.
        unsafe {
            let record = value::record_ref(v);
            let to = raw::RedisModule_GetToKeyNameFromOptCtx.unwrap()(ctx);
            if !to.is_null() {
                let db = raw::RedisModule_GetToDbIdFromOptCtx.unwrap()(ctx);
                if !T::copied(db, Str::new(to as *mut _).bytes(), record) {
                    return std::ptr::null_mut();
                }
            }
            value::into_raw(record.to_owned())
        }
    })
}

unsafe extern "C" fn aux_save<T: LeaseType>(rdb: *mut raw::RedisModuleIO, when: c_int) {
    catch_panic("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            raw::save_unsigned(rdb, T::aux_save());
        }
    })
}

unsafe extern "C" fn aux_load<T: LeaseType>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    when: c_int,
) -> c_int {
    catch_panic("aux_load", raw::REDISMODULE_ERR as c_int, || {
        if encver > T::AUX_ENCVER || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            log_warning(&format!(
                "cannot load token-clock aux data of encoding version {encver}"
            ));
            return raw::REDISMODULE_ERR as c_int;
        }
        match raw::load_unsigned(rdb) {
            Ok(value) => {
                T::aux_load(value);
                raw::REDISMODULE_OK as c_int
            }
            Err(_) => raw::REDISMODULE_ERR as c_int,
        }
    })
}

// --- Timers, blocked clients, the waker ------------------------------------

/// What the module's timers, its blocked clients and the waker thread's
/// wake-ups do.
pub trait Waits {
    /// The work a timer carries (`server::start_timer`).
    type Job: 'static;
    /// What an unblocked client's reply callback gets.
    type Unblocked: 'static;

    fn timer(ctx: Ctx, job: Self::Job);
    fn reply(ctx: Ctx, data: Option<&mut Self::Unblocked>);
    /// The server's timeout of blocked client `bc`.
    fn timeout(ctx: Ctx, bc: usize);
    fn disconnect(bc: usize);
    fn free(data: Self::Unblocked);
    /// The key of `slot` is due for a re-check now (the waker thread).
    fn wake(slot: Slot);
}

unsafe extern "C" fn timer<W: Waits>(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    catch_panic("a module timer", (), || {
        // SAFETY: a timer's context, live while it runs; `data` is the job
        // of a timer started by server::start_timer that fired (a W::Job).
        let (ctx, job) = unsafe { (Ctx::new(ctx), server::take_timer_job::<W::Job>(data)) };
        W::timer(ctx, job);
    })
}

unsafe extern "C" fn reply<W: Waits>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    catch_panic("the waiter reply", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: the reply callback's context; its private data is the
        // Box<W::Unblocked> given to UnblockClient, freed later by `free`.
        unsafe {
            let data =
                raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) as *mut W::Unblocked;
            W::reply(Ctx::new(ctx), data.as_mut());
        }
        raw::REDISMODULE_OK as c_int
    })
}

unsafe extern "C" fn timeout<W: Waits>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    catch_panic("the waiter timeout", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: reads the blocked client handle of this callback's context.
        unsafe {
            let bc = raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) as usize;
            W::timeout(Ctx::new(ctx), bc);
        }
        raw::REDISMODULE_OK as c_int
    })
}

unsafe extern "C" fn disconnect<W: Waits>(
    _ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    catch_panic("the waiter disconnect", (), || W::disconnect(bc as usize))
}

unsafe extern "C" fn free_privdata<W: Waits>(
    _ctx: *mut raw::RedisModuleCtx,
    privdata: *mut c_void,
) {
    catch_panic("the waiter free", (), || {
        if !privdata.is_null() {
            // SAFETY: privdata is the Box<W::Unblocked> given to UnblockClient.
            W::free(*unsafe { Box::from_raw(privdata as *mut W::Unblocked) });
        }
    })
}

/// The waker thread's one-shot call, on the main thread.
unsafe extern "C" fn wake<W: Waits>(data: *mut c_void) {
    // SAFETY: `data` is the slot the waker thread posted, taken back once.
    let slot = unsafe { waker::take_slot(data) };
    catch_panic("a wake-up", (), || W::wake(slot));
}

unsafe extern "C" fn scan(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    catch_panic("the keyspace scan", (), || {
        if name.is_null() || key.is_null() || data.is_null() {
            return;
        }
        // SAFETY: the scan's key handle, open while the callback runs; its
        // name likewise; `data` is the Vec `key::lease_key_names` passed.
        unsafe {
            if is_lease_key(key) {
                (*data.cast::<Vec<Vec<u8>>>()).push(Str::new(name).bytes().to_vec());
            }
        }
    })
}

/// The callbacks the wrappers of this folder hand to the server (timers,
/// blocked clients, the command filter, the waker, the keyspace scan).
pub fn hooks<W: Waits, E: Events, F: Filter>() -> Hooks {
    Hooks {
        timer: Some(timer::<W>),
        reply: Some(reply::<W>),
        timeout: Some(timeout::<W>),
        free_privdata: Some(free_privdata::<W>),
        disconnect: Some(disconnect::<W>),
        command_filter: filter::shim::<F>(),
        keyspace_moves: [
            (raw::REDISMODULE_EVENT_FLUSHDB, Some(flushed::<E>)),
            (raw::REDISMODULE_EVENT_SWAPDB, Some(swapped::<E>)),
        ],
        wake: Some(wake::<W>),
        scan: Some(scan),
    }
}

// --- Server and keyspace events --------------------------------------------

/// The server events and keyspace events the module follows.
pub trait Events {
    /// A `FLUSHDB` of database `db`, or a `FLUSHALL` (`None`), is done.
    fn flushed(db: Option<i32>);
    fn swapped(first: i32, second: i32);
    /// A child process was forked (BGSAVE, BGREWRITEAOF, a full sync).
    fn forked();
    /// A replica came online (after a full or a partial sync).
    fn replica_online();
    fn role_changed(now_master: bool);
    fn shutdown(ctx: Ctx);
    /// `CONFIG SET` changed settings; `changed` says whether one of the
    /// given names is among them.
    fn config_changed(ctx: Ctx, changed: &dyn Fn(&[&[u8]]) -> bool);
    /// A step of a Valkey atomic slot migration (`CLUSTER MIGRATESLOTS`)
    /// of the slot ranges `slots` (inclusive), on either end.
    fn slot_migration(step: SlotMigration, slots: &[(u16, u16)]);
}

/// The steps of a Valkey atomic slot migration, as its server event names
/// them (`VALKEYMODULE_SUBEVENT_ATOMIC_SLOT_MIGRATION_*`, 0 to 5): this node
/// imports (the target) or exports (the source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMigration {
    ImportStarted,
    ExportStarted,
    ImportAborted,
    ExportAborted,
    ImportCompleted,
    ExportCompleted,
}

/// Valkey's `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` (Valkey 9.0+; the
/// same id is another event on Redis).
const VALKEY_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;

/// `ValkeyModuleSlotRange`.
#[repr(C)]
struct ValkeySlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfo` (version 1), the event's data.
#[repr(C)]
struct ValkeySlotMigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const ValkeySlotRange,
    num_slot_ranges: u32,
}

unsafe extern "C" fn slot_migration<E: Events>(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    catch_panic("the slot migration event", (), || {
        let step = match subevent {
            0 => SlotMigration::ImportStarted,
            1 => SlotMigration::ExportStarted,
            2 => SlotMigration::ImportAborted,
            3 => SlotMigration::ExportAborted,
            4 => SlotMigration::ImportCompleted,
            5 => SlotMigration::ExportCompleted,
            _ => return,
        };
        // SAFETY: the event's data is a ValkeyModuleAtomicSlotMigrationInfo
        // (version 1 was asked for) whose ranges live while the event runs.
        let slots: Vec<(u16, u16)> = unsafe {
            match (data as *const ValkeySlotMigrationInfo).as_ref() {
                Some(info) if !info.slot_ranges.is_null() => {
                    std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize)
                        .iter()
                        .map(|r| (r.start.clamp(0, 16383) as u16, r.end.clamp(0, 16383) as u16))
                        .collect()
                }
                _ => Vec::new(),
            }
        };
        E::slot_migration(step, &slots);
    })
}

/// The atomic slot migration event's id and shim (subscribed on Valkey 9+
/// only: register.rs).
pub fn slot_migration_event<E: Events>() -> (u64, raw::RedisModuleEventCallback) {
    (
        VALKEY_EVENT_ATOMIC_SLOT_MIGRATION,
        Some(slot_migration::<E>),
    )
}

unsafe extern "C" fn flushed<E: Events>(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch_panic("the flush event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            // SAFETY: the FlushDB event's data is a RedisModuleFlushInfo.
            let db = unsafe { (_data as *const raw::RedisModuleFlushInfo).as_ref() }
                .map_or(-1, |info| info.dbnum);
            E::flushed((db >= 0).then_some(db));
        }
    })
}

unsafe extern "C" fn swapped<E: Events>(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    catch_panic("the swapdb event", (), || {
        // SAFETY: the SwapDB event's data is a RedisModuleSwapDbInfo.
        if let Some(info) = unsafe { (data as *const raw::RedisModuleSwapDbInfo).as_ref() } {
            E::swapped(info.dbnum_first, info.dbnum_second);
        }
    })
}

unsafe extern "C" fn forked<E: Events>(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch_panic("the fork event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
            E::forked();
        }
    })
}

unsafe extern "C" fn replica_changed<E: Events>(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch_panic("the replica event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_REPLICA_CHANGE_ONLINE {
            E::replica_online();
        }
    })
}

unsafe extern "C" fn role_changed<E: Events>(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch_panic("the role change event", (), || {
        E::role_changed(subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER)
    })
}

unsafe extern "C" fn shutdown<E: Events>(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    catch_panic("the shutdown event", (), || {
        // SAFETY: the event's context, live while it runs.
        E::shutdown(unsafe { Ctx::new(ctx) });
        waker::stop();
    })
}

unsafe extern "C" fn config_changed<E: Events>(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    catch_panic("the config event", (), || {
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
        E::config_changed(unsafe { Ctx::new(ctx) }, &changed);
    })
}

/// The server events to subscribe to, each with its shim.
pub fn server_events<E: Events>() -> [(u64, raw::RedisModuleEventCallback); 5] {
    [
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(role_changed::<E>),
        ),
        (raw::REDISMODULE_EVENT_SHUTDOWN, Some(shutdown::<E>)),
        (raw::REDISMODULE_EVENT_FORK_CHILD, Some(forked::<E>)),
        (raw::REDISMODULE_EVENT_CONFIG, Some(config_changed::<E>)),
        (
            raw::REDISMODULE_EVENT_REPLICA_CHANGE,
            Some(replica_changed::<E>),
        ),
    ]
}

// --- Configs and INFO ------------------------------------------------------

/// The settings behind `CONFIG GET/SET lease.<name>`, by their index in
/// `lease::config::SETTINGS` (one shim pair serves every row), and the
/// `INFO lease` section.
pub trait Configs {
    fn get(index: usize) -> i64;
    /// The server checked the bounds given at registration.
    fn set(index: usize, value: i64);
    fn info() -> Vec<InfoField>;
}

/// One field of `INFO lease`.
pub enum InfoField {
    Unsigned(&'static str, u64),
    Signed(&'static str, i64),
    Text(&'static str, &'static str),
    Owned(&'static str, String),
    /// A setting: its name as in `lease::config` (`max-ttl-ms`), shown as
    /// `max_ttl_ms`.
    Setting(&'static str, i64),
    /// One figure of a distribution: `held` and `p99` shown as `held_p99`.
    Figure(&'static str, &'static str, u64),
}

pub(super) unsafe extern "C" fn get_setting<C: Configs>(
    _name: *const c_char,
    privdata: *mut c_void,
) -> c_longlong {
    catch_panic("CONFIG GET of a lease setting", 0, || {
        C::get(privdata as usize)
    })
}

pub(super) unsafe extern "C" fn set_setting<C: Configs>(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    catch_panic("CONFIG SET of a lease setting", (), || {
        C::set(privdata as usize, value)
    });
    raw::REDISMODULE_OK as c_int
}

pub(super) extern "C" fn info<C: Configs>(
    ictx: *mut raw::RedisModuleInfoCtx,
    _for_crash_report: c_int,
) {
    catch_panic("INFO", (), || {
        raw::add_info_section(ictx, None);
        for field in C::info() {
            match field {
                InfoField::Unsigned(name, v) => {
                    raw::add_info_field_unsigned_long_long(ictx, name, v);
                }
                InfoField::Signed(name, v) => {
                    raw::add_info_field_long_long(ictx, name, v);
                }
                InfoField::Text(name, v) => {
                    raw::add_info_field_str(ictx, name, v);
                }
                InfoField::Owned(name, v) => {
                    raw::add_info_field_str(ictx, name, &v);
                }
                InfoField::Setting(name, v) => {
                    raw::add_info_field_long_long(ictx, &name.replace('-', "_"), v);
                }
                InfoField::Figure(name, figure, v) => {
                    raw::add_info_field_unsigned_long_long(ictx, &format!("{name}_{figure}"), v);
                }
            }
        }
    })
}
