//! Registration: commands (from the command table, `entry/table.rs`, with
//! the COMMAND INFO / COMMAND DOCS description of each and their ACL
//! categories), configs, the INFO section, server and keyspace event
//! subscriptions; each with the shims of `entry.rs`.

use std::ffi::{CStr, CString};
use std::os::raw::c_int;

use redis_module::{Context, raw};

use crate::lease::config::SETTINGS;

use super::ctx::Ctx;
use super::entry::{self, CommandEntry, Configs, Events};

pub use raw::{
    REDISMODULE_CMD_ARG_MULTIPLE as MULTIPLE, REDISMODULE_CMD_ARG_OPTIONAL as OPTIONAL,
    REDISMODULE_CMD_KEY_ACCESS as ACCESS, REDISMODULE_CMD_KEY_DELETE as DELETE,
    REDISMODULE_CMD_KEY_OW as OW, REDISMODULE_CMD_KEY_RO as RO, REDISMODULE_CMD_KEY_RW as RW,
    REDISMODULE_CMD_KEY_UPDATE as UPDATE, REDISMODULE_CMD_KEY_VARIABLE_FLAGS as VARIABLE_FLAGS,
};

/// One documented argument (a `ONEOF` or `BLOCK` has `subargs`).
pub struct Arg {
    pub name: &'static CStr,
    pub kind: raw::RedisModuleCommandArgType,
    pub token: Option<&'static CStr>,
    pub flags: u32,
    pub subargs: Vec<Arg>,
}

pub const fn arg(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: 0,
        subargs: Vec::new(),
    }
}

/// An argument introduced by `token` (`LIMIT n`, `BLOCK ms`, `SHARED`).
pub fn option(
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    token: &'static CStr,
) -> Arg {
    Arg {
        token: Some(token),
        ..arg(name, kind)
    }
}

pub const KEY: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
pub const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
pub const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
pub const PURE_TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;
pub const ONEOF: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF;
pub const BLOCK: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK;

/// One command as registered.
pub struct Spec {
    pub name: &'static str,
    pub entry: CommandEntry,
    pub flags: &'static str,
    /// ACL categories on servers with module categories. Setting them
    /// replaces the ones the server derives from the flags, so they are
    /// all listed, `lease` last.
    pub acl: &'static CStr,
    pub arity: c_int,
    /// Where its keys are: none, the one at 1, or `numkeys` at 1 and that
    /// many keys after it.
    pub keys: Keys,
    pub key_flags: u32,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// The module version that added it, and what later ones changed.
    pub since: &'static CStr,
    pub history: &'static [(&'static CStr, &'static CStr)],
    pub args: Vec<Arg>,
}

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    None,
    One,
    Counted,
}

/// The ACL category every lease command belongs to (on servers that let
/// modules add categories: Redis 7.4+, Valkey 8+).
const ACL_CATEGORY: &CStr = c"lease";

/// Adds the `lease` ACL category where the server supports it; `true` if
/// commands can be put in it.
fn add_acl_category(ctx: &Context) -> bool {
    // SAFETY: function-pointer reads filled in by RedisModule_Init; called
    // during OnLoad with the load context.
    match unsafe { raw::RedisModule_AddACLCategory } {
        Some(add) => {
            if unsafe { add(ctx.ctx, ACL_CATEGORY.as_ptr()) } != raw::REDISMODULE_OK as c_int {
                ctx.log_notice("the ACL category 'lease' exists already; using it");
            }
            true
        }
        None => false,
    }
}

/// The server's handle of a command registered by this module, where the
/// server can give it (7.0+).
fn command_handle(ctx: &Context, name: &CStr) -> Option<*mut raw::RedisModuleCommand> {
    // SAFETY: a function-pointer read filled in by RedisModule_Init, then a
    // lookup by NUL-terminated name during OnLoad.
    let get_command = unsafe { raw::RedisModule_GetCommand }?;
    let command = unsafe { get_command(ctx.ctx, name.as_ptr()) };
    (!command.is_null()).then_some(command)
}

/// Sets a registered command's ACL categories (`lease` among them).
fn set_acl_categories(ctx: &Context, name: &CStr, categories: &CStr) -> Result<(), String> {
    // SAFETY: a function-pointer read filled in by RedisModule_Init.
    let Some(set_categories) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Ok(());
    };
    // SAFETY: a live command handle and a NUL-terminated category list.
    unsafe {
        let set =
            |command| set_categories(command, categories.as_ptr()) == raw::REDISMODULE_OK as c_int;
        if !command_handle(ctx, name).is_some_and(set) {
            return Err(format!(
                "cannot set the ACL categories of {} to '{}'",
                name.to_string_lossy(),
                categories.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// Registers every command, with its COMMAND DOCS where the server has
/// `RedisModule_SetCommandInfo` (7.0+) and its ACL category where the
/// server has module ACL categories.
pub fn register_commands(ctx: &Context, specs: Vec<Spec>) -> Result<(), String> {
    let with_category = add_acl_category(ctx);
    for spec in specs {
        let name = CString::new(spec.name).expect("no NUL");
        let flags = CString::new(spec.flags).expect("no NUL");
        // SAFETY: called during OnLoad with the load context; name and flags
        // are NUL-terminated and copied by the server.
        // A command with `numkeys` has movable keys: the server finds them
        // through its key spec (set with the command info).
        let (first, last, step) = match spec.keys {
            Keys::One => (1, 1, 1),
            Keys::None | Keys::Counted => (0, 0, 0),
        };
        let status = unsafe {
            raw::RedisModule_CreateCommand.unwrap()(
                ctx.ctx,
                name.as_ptr(),
                spec.entry,
                flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!("cannot create command {}", spec.name));
        }
        set_info(ctx, &name, &spec)?;
        if with_category {
            set_acl_categories(ctx, &name, spec.acl)?;
        }
    }
    Ok(())
}

/// `args` as the server's zero-terminated argument array (nested for a
/// `ONEOF` or `BLOCK`); the arrays live in `keep`.
fn raw_args(
    args: &[Arg],
    keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out = Vec::with_capacity(args.len() + 1);
    for a in args {
        // SAFETY: a zero-initialisable C struct of pointers and integers.
        let mut r: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
        r.name = a.name.as_ptr();
        r.type_ = a.kind;
        r.key_spec_index = if a.kind == KEY { 0 } else { -1 };
        r.token = a.token.map_or(std::ptr::null(), |t| t.as_ptr());
        r.flags = a.flags as c_int;
        if !a.subargs.is_empty() {
            r.subargs = raw_args(&a.subargs, keep);
        }
        out.push(r);
    }
    // SAFETY: as above; the zeroed entry ends the array.
    out.push(unsafe { std::mem::zeroed() });
    keep.push(out);
    keep.last_mut().expect("just pushed").as_mut_ptr()
}

fn set_info(ctx: &Context, name: &CStr, spec: &Spec) -> Result<(), String> {
    // SAFETY: a function-pointer read filled in by RedisModule_Init.
    let Some(set_command_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return Ok(());
    };
    // SAFETY: all structs below are zero-initialisable C structs; arrays end
    // with a zeroed entry as the API requires; the server copies everything
    // during SetCommandInfo, so locals may be dropped afterwards.
    unsafe {
        let mut key_specs: Vec<raw::RedisModuleCommandKeySpec> =
            vec![std::mem::zeroed(), std::mem::zeroed()];
        if spec.keys == Keys::None {
            key_specs.truncate(1);
        }
        if spec.keys != Keys::None {
            key_specs[0].flags = spec.key_flags as u64;
            key_specs[0].begin_search_type =
                raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            key_specs[0].bs.index.pos = 1;
        }
        if spec.keys == Keys::Counted {
            // `numkeys` at 1, then that many keys.
            key_specs[0].find_keys_type =
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            key_specs[0].fk.keynum.keynumidx = 0;
            key_specs[0].fk.keynum.firstkey = 1;
            key_specs[0].fk.keynum.keystep = 1;
        }
        if spec.keys == Keys::One {
            key_specs[0].find_keys_type =
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            key_specs[0].fk.range.lastkey = 0;
            key_specs[0].fk.range.keystep = 1;
            key_specs[0].fk.range.limit = 0;
        }

        // Every array the server reads stays alive in `keep` until
        // SetCommandInfo has copied it.
        let mut keep: Vec<Vec<raw::RedisModuleCommandArg>> = Vec::new();
        let args = raw_args(&spec.args, &mut keep);
        let mut history: Vec<raw::RedisModuleCommandHistoryEntry> = spec
            .history
            .iter()
            .map(|(since, changes)| raw::RedisModuleCommandHistoryEntry {
                since: since.as_ptr(),
                changes: changes.as_ptr(),
            })
            .collect();
        history.push(std::mem::zeroed());

        let version = raw::RedisModuleCommandInfoVersion {
            version: 1,
            sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
            sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
            sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
        };
        let mut info: raw::RedisModuleCommandInfo = std::mem::zeroed();
        info.version = &version;
        info.summary = spec.summary.as_ptr();
        info.complexity = spec.complexity.as_ptr();
        info.since = spec.since.as_ptr();
        if !spec.history.is_empty() {
            info.history = history.as_mut_ptr();
        }
        info.arity = spec.arity;
        info.key_specs = key_specs.as_mut_ptr();
        info.args = args;

        let set = |command| set_command_info(command, &info) == raw::REDISMODULE_OK as c_int;
        if !command_handle(ctx, name).is_some_and(set) {
            return Err(format!("cannot set the command info of {}", spec.name));
        }
    }
    Ok(())
}

/// Registers the CONFIG SET interface of every setting of
/// `lease::config::SETTINGS` (`lease.<name>`) where the server has module
/// configs, starting from the load-time `values`; one get/set callback pair
/// serves them all, told apart by their index (the privdata).
pub fn register_configs<C: Configs>(ctx: &Context, values: &[i64]) -> Result<(), String> {
    // SAFETY: function-pointer reads filled in by RedisModule_Init; called
    // during OnLoad with the load context, as the config API requires; the
    // names are copied by the server.
    unsafe {
        let (Some(register), Some(load)) = (
            raw::RedisModule_RegisterNumericConfig,
            raw::RedisModule_LoadConfigs,
        ) else {
            ctx.log_notice(
                "this server has no module configs; the lease settings are set by loadmodule arguments only",
            );
            return Ok(());
        };
        for (i, setting) in SETTINGS.iter().enumerate() {
            let cname = CString::new(setting.name).expect("no NUL");
            let status = register(
                ctx.ctx,
                cname.as_ptr(),
                values[i],
                raw::REDISMODULE_CONFIG_DEFAULT,
                setting.min,
                setting.max,
                Some(entry::get_setting::<C>),
                Some(entry::set_setting::<C>),
                None,
                i as *mut std::os::raw::c_void,
            );
            if status != raw::REDISMODULE_OK as c_int {
                return Err(format!("cannot register the config lease.{}", setting.name));
            }
        }
        if load(ctx.ctx) != raw::REDISMODULE_OK as c_int {
            return Err("invalid lease.* setting in the server configuration".into());
        }
    }
    Ok(())
}

/// Valkey's `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (`1 << 5`
/// in valkeymodule.h, Valkey 9.0+; the Redis bindings do not have it): the
/// module handles `CLUSTER MIGRATESLOTS`, which the server refuses while a
/// loaded module does not say so. Redis gives no meaning to that bit (Redis
/// 8.4's own atomic slot migration has no such option).
const VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION: u32 = 1 << 5;

/// Is the server a Valkey that knows atomic slot migration: it calls itself
/// `valkey` (`INFO server`'s `server_name`, Valkey 8+) and has the option's
/// bit among the options it knows (`GetModuleOptionsAll`, Valkey 9.0+)?
/// Redis and older Valkey answer no, and the module loads there as before.
pub fn valkey_atomic_slot_migration(ctx: &Context) -> bool {
    // SAFETY: a function-pointer read filled in by RedisModule_Init, then a
    // call that takes no arguments.
    let known = match unsafe { raw::RedisModule_GetModuleOptionsAll } {
        Some(all) => (unsafe { all() }) as u32,
        None => return false,
    };
    known & VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION != 0
        && Ctx::of_load(ctx)
            .server_info(c"server", c"server_name")
            .as_deref()
            == Some("valkey")
}

/// Module options: a short read (diskless replica, truncated RESTORE
/// payload) reaches rdb_load as an error instead of killing the server; a
/// key opened for writing is signalled as modified only when the module says
/// so (commit.rs), so calls that change nothing leave WATCH alone; on
/// Valkey 9+ (`slot_migration`), the module handles atomic slot migration
/// (docs/operations.md).
pub fn set_module_options(ctx: &Context, slot_migration: bool) {
    let mut options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    if slot_migration {
        options |= VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    // SAFETY: called once from OnLoad on the main thread with the load
    // context.
    unsafe {
        if let Some(set_options) = raw::RedisModule_SetModuleOptions {
            set_options(ctx.ctx, options as i32);
        }
    }
}

/// The `INFO lease` section's callback.
pub fn register_info<C: Configs>(ctx: &Context) {
    raw::register_info_function(ctx.ctx, Some(entry::info::<C>));
}

/// Subscribes to the server events the module always follows: forks (the
/// token clock is written to a rewritten AOF), replicas coming online,
/// config changes (maxmemory-policy, min-replicas-*), role changes and
/// shutdown (the grace period). No keyspace events: every write of every
/// key would pay for them (expiries and evictions are told apart when a
/// lease key leaves, datatype.rs). FLUSHDB and SWAPDB (keys freed or moved
/// without unlinking), and the command filter, only while the binding
/// needs the filter (filter.rs, server.rs).
///
/// With `slot_migration` (Valkey 9+ in cluster mode), also Valkey's atomic
/// slot migration event: its id means another event on Redis (8.4's slot
/// trim), so it is subscribed only there. (Redis 7.2+ and Valkey offer every
/// key deletion to every server-event listener of every module: Valkey 9.1
/// spends about 48 instructions on a `DEL` once any listener stands, and
/// about 6 more per listener.)
pub fn subscribe_events<E: Events>(ctx: &Context, slot_migration: bool) {
    let events = entry::server_events::<E>();
    // SAFETY: called during OnLoad; each event struct is the one the API
    // defines for that event, with its callback of the right signature.
    unsafe {
        if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
            for (id, callback) in events {
                subscribe(ctx.ctx, raw::RedisModuleEvent { id, dataver: 1 }, callback);
            }
            if slot_migration {
                let (id, callback) = entry::slot_migration_event::<E>();
                subscribe(ctx.ctx, raw::RedisModuleEvent { id, dataver: 1 }, callback);
            }
        }
    }
}
