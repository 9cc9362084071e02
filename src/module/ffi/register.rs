//! Registration: commands (names, flags, key positions, and the COMMAND
//! INFO / COMMAND DOCS description of each), configs, server and keyspace
//! event subscriptions.

use std::ffi::{CStr, CString};
use std::os::raw::c_int;

use redis_module::{Context, raw};

use super::callbacks::*;
use crate::lease::config::SETTINGS;
use crate::lease::effect::{APPLY, CLOCK, DROP, HOLD, PRUNE, VERSION};
use crate::module::settings;

use super::ctx::Ctx;
use super::server;

/// The probe command of the write gates (`commit::gate`).
const GATE: &str = "LEASE.GATE";

fn name(c: &'static CStr) -> &'static str {
    c.to_str().expect("ASCII command names")
}

/// One documented argument (a `ONEOF` or `BLOCK` has `subargs`).
struct Arg {
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    token: Option<&'static CStr>,
    flags: u32,
    subargs: Vec<Arg>,
}

const fn arg(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: 0,
        subargs: Vec::new(),
    }
}

/// An argument introduced by `token` (`LIMIT n`, `BLOCK ms`, `SHARED`).
fn option(name: &'static CStr, kind: raw::RedisModuleCommandArgType, token: &'static CStr) -> Arg {
    Arg {
        token: Some(token),
        ..arg(name, kind)
    }
}

/// `LIMIT limit | SHARED | FLOOR token`: an acquire's mode, or the floor of
/// an exclusive lease's token (design.md S9), which excludes both.
fn acquire_mode_arg() -> Arg {
    let mut mode = mode_arg(raw::REDISMODULE_CMD_ARG_OPTIONAL);
    mode.subargs.push(option(c"token", INTEGER, c"FLOOR"));
    mode
}

/// `numkeys key [key ...]`, then `rest`: a multi-key command's arguments.
fn keys_then(rest: Vec<Arg>) -> Vec<Arg> {
    let mut args = vec![
        arg(c"numkeys", INTEGER),
        Arg {
            flags: raw::REDISMODULE_CMD_ARG_MULTIPLE,
            ..arg(c"key", KEY)
        },
    ];
    args.extend(rest);
    args
}

/// `LIMIT limit | SHARED`: how a counting or shared lease is held.
fn mode_arg(flags: u32) -> Arg {
    Arg {
        flags,
        subargs: vec![
            option(c"limit", INTEGER, c"LIMIT"),
            option(c"shared", PURE_TOKEN, c"SHARED"),
        ],
        ..arg(c"mode", ONEOF)
    }
}

const KEY: raw::RedisModuleCommandArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const PURE_TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;
const ONEOF: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF;
const BLOCK: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK;

/// One command as registered.
struct Spec {
    name: &'static str,
    entry: raw::RedisModuleCmdFunc,
    flags: &'static str,
    /// ACL categories on servers with module categories. Setting them
    /// replaces the ones the server derives from the flags, so they are
    /// all listed, `lease` last.
    acl: &'static CStr,
    arity: c_int,
    /// Where its keys are: none, the one at 1, or `numkeys` at 1 and that
    /// many keys after it.
    keys: Keys,
    key_flags: u32,
    summary: &'static CStr,
    complexity: &'static CStr,
    /// The module version that added it, and what later ones changed.
    since: &'static CStr,
    history: &'static [(&'static CStr, &'static CStr)],
    args: Vec<Arg>,
}

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    None,
    One,
    Counted,
}

/// The first version, where most commands come from.
const V1: &CStr = c"0.1.0";

fn specs() -> Vec<Spec> {
    use raw::{
        REDISMODULE_CMD_ARG_MULTIPLE as MULTIPLE, REDISMODULE_CMD_ARG_OPTIONAL as OPTIONAL,
        REDISMODULE_CMD_KEY_ACCESS as ACCESS, REDISMODULE_CMD_KEY_DELETE as DELETE,
        REDISMODULE_CMD_KEY_OW as OW, REDISMODULE_CMD_KEY_RO as RO, REDISMODULE_CMD_KEY_RW as RW,
        REDISMODULE_CMD_KEY_UPDATE as UPDATE, REDISMODULE_CMD_KEY_VARIABLE_FLAGS as VARIABLE_FLAGS,
    };
    vec![
        Spec {
            name: "LEASE.ACQUIRE",
            entry: Some(acquire_entry),
            // blocking: with BLOCK it may block (so not fast either).
            acl: c"write slow blocking lease",
            flags: "write deny-oom blocking",
            arity: -4,
            keys: Keys::One,
            key_flags: RW | ACCESS | UPDATE,
            summary: c"Acquires a lease (exclusive, one of n with LIMIT n, or shared with SHARED) and returns its fencing token (at least FLOOR's); null when it is taken",
            complexity: c"O(1) for an exclusive lease; O(log n) with n holders or waiters",
            since: V1,
            history: &[
                (c"0.2.0", c"Added the `LIMIT` and `SHARED` options."),
                (c"0.3.0", c"Added the `FLOOR` option (quorum leases)."),
            ],
            args: vec![
                arg(c"key", KEY),
                arg(c"owner", STRING),
                arg(c"ttl-ms", INTEGER),
                acquire_mode_arg(),
                Arg {
                    flags: OPTIONAL,
                    ..option(c"timeout-ms", INTEGER, c"BLOCK")
                },
            ],
        },
        Spec {
            name: "LEASE.RENEW",
            entry: Some(renew_entry),
            acl: c"write fast lease",
            flags: "write fast",
            arity: 4,
            keys: Keys::One,
            key_flags: RW | UPDATE,
            summary: c"Resets the remaining time of a lease held by owner; 1 if renewed, else 0",
            complexity: c"O(1) for an exclusive lease; O(log n) with n holders",
            since: V1,
            history: &[(c"0.2.0", c"Renews one holder of a counting or shared lease.")],
            args: vec![arg(c"key", KEY), arg(c"owner", STRING), arg(c"ttl-ms", INTEGER)],
        },
        Spec {
            name: "LEASE.RELEASE",
            entry: Some(release_entry),
            acl: c"write fast lease",
            flags: "write fast",
            arity: 3,
            keys: Keys::One,
            key_flags: RW | DELETE,
            summary: c"Releases a lease held by owner; 1 if released, else 0",
            complexity: c"O(1) for an exclusive lease; O(log n) with n holders or waiters",
            since: V1,
            history: &[(c"0.2.0", c"Releases one holder of a counting or shared lease.")],
            args: vec![arg(c"key", KEY), arg(c"owner", STRING)],
        },
        Spec {
            name: "LEASE.FENCE",
            entry: Some(fence_entry),
            // write: it may run a write, so a script that fenced a write is
            // unkillable like one that wrote, cluster clients send it to
            // masters, and paused writes pause it. Not deny-oom: the check
            // must work under OOM; the inner command faces OOM on its own.
            // getkeys-api: the inner command's keys are declared too.
            acl: c"write slow lease",
            flags: "write getkeys-api",
            arity: -3,
            // VARIABLE_FLAGS: the server asks the getkeys-api callback, which
            // adds the inner command's keys, instead of this spec alone.
            keys: Keys::One,
            key_flags: RO | ACCESS | VARIABLE_FLAGS,
            summary: c"Checks that token is the token of a lease held now (else a STALE error) and, in the same step, runs the command if one is given",
            complexity: c"O(1) for an exclusive lease; O(log n) with n holders",
            since: V1,
            history: &[(c"0.2.0", c"A `SHARED` holder's token fences no write command.")],
            args: vec![
                arg(c"key", KEY),
                arg(c"token", INTEGER),
                Arg {
                    flags: OPTIONAL,
                    subargs: vec![
                        arg(c"command", STRING),
                        Arg {
                            flags: OPTIONAL | MULTIPLE,
                            ..arg(c"arg", STRING)
                        },
                    ],
                    ..arg(c"fenced-command", BLOCK)
                },
            ],
        },
        Spec {
            name: "LEASE.INFO",
            entry: Some(info_entry),
            acl: c"read fast lease",
            flags: "readonly fast",
            arity: 2,
            keys: Keys::One,
            key_flags: RO | ACCESS,
            summary: c"Token, remaining ttl and waiters of the lease held on key (and mode, limit and holders of a counting or shared lease); null when free",
            complexity: c"O(1) for an exclusive lease; O(n) with n holders",
            since: V1,
            history: &[(c"0.2.0", c"Added `mode`, `limit` and `holders` for counting and shared leases.")],
            args: vec![arg(c"key", KEY)],
        },
        Spec {
            name: "LEASE.MACQUIRE",
            entry: Some(macquire_entry),
            acl: c"write slow blocking lease",
            // getkeys-api: cluster routing finds a module command's keys
            // through the API, not through a `numkeys` key spec.
            flags: "write deny-oom blocking getkeys-api",
            arity: -5,
            keys: Keys::Counted,
            key_flags: RW | ACCESS | UPDATE,
            summary: c"Acquires an exclusive lease on every key or on none, all with one new fencing token; null when a key is taken",
            complexity: c"O(k log n) for k keys and n waiters queued on them",
            since: c"0.3.0",
            history: &[],
            args: keys_then(vec![
                arg(c"owner", STRING),
                arg(c"ttl-ms", INTEGER),
                Arg {
                    flags: OPTIONAL,
                    ..option(c"timeout-ms", INTEGER, c"BLOCK")
                },
            ]),
        },
        Spec {
            name: "LEASE.MRENEW",
            entry: Some(mrenew_entry),
            acl: c"write fast lease",
            flags: "write fast getkeys-api",
            arity: -5,
            keys: Keys::Counted,
            key_flags: RW | UPDATE,
            summary: c"Resets the remaining time of every key when owner holds them all with one token; the number of keys renewed, else 0",
            complexity: c"O(k) for k keys",
            since: c"0.3.0",
            history: &[],
            args: keys_then(vec![arg(c"owner", STRING), arg(c"ttl-ms", INTEGER)]),
        },
        Spec {
            name: "LEASE.MRELEASE",
            entry: Some(mrelease_entry),
            acl: c"write fast lease",
            flags: "write fast getkeys-api",
            arity: -4,
            keys: Keys::Counted,
            key_flags: RW | DELETE,
            summary: c"Releases every key when owner holds them all with one token; the number of keys released, else 0",
            complexity: c"O(k log n) for k keys and n waiters queued on them",
            since: c"0.3.0",
            history: &[],
            args: keys_then(vec![arg(c"owner", STRING)]),
        },
        Spec {
            name: name(APPLY),
            entry: Some(apply_entry),
            acl: c"write lease",
            flags: "write",
            arity: 5,
            keys: Keys::One,
            key_flags: OW | UPDATE,
            summary: c"Internal: sets a lease's full state; accepted only from the master link and the AOF",
            complexity: c"O(1)",
            since: V1,
            history: &[],
            args: vec![
                arg(c"key", KEY),
                arg(c"owner", STRING),
                arg(c"token", INTEGER),
                arg(c"deadline-ms", INTEGER),
            ],
        },
        Spec {
            name: name(HOLD),
            entry: Some(hold_entry),
            acl: c"write lease",
            flags: "write",
            arity: -6,
            keys: Keys::One,
            key_flags: RW | UPDATE,
            summary: c"Internal: adds or updates one holder of a counting or shared lease; accepted only from the master link and the AOF",
            complexity: c"O(log n) with n holders",
            since: c"0.2.0",
            history: &[],
            args: vec![
                arg(c"key", KEY),
                arg(c"owner", STRING),
                arg(c"token", INTEGER),
                arg(c"deadline-ms", INTEGER),
                mode_arg(0),
            ],
        },
        Spec {
            name: name(DROP),
            entry: Some(drop_entry),
            acl: c"write lease",
            flags: "write",
            arity: 3,
            keys: Keys::One,
            key_flags: RW | DELETE,
            summary: c"Internal: removes one holder of a counting or shared lease; accepted only from the master link and the AOF",
            complexity: c"O(log n) with n holders",
            since: c"0.2.0",
            history: &[],
            args: vec![arg(c"key", KEY), arg(c"owner", STRING)],
        },
        Spec {
            name: name(PRUNE),
            entry: Some(prune_entry),
            acl: c"write lease",
            flags: "write",
            arity: 4,
            keys: Keys::One,
            key_flags: RW | DELETE,
            summary: c"Internal: removes the ended holders of a counting or shared lease that the master took out, up to the one named; accepted only from the master link and the AOF",
            complexity: c"O(k log n) for k holders removed of n",
            since: c"0.3.0",
            history: &[],
            args: vec![
                arg(c"key", KEY),
                arg(c"deadline-ms", INTEGER),
                arg(c"token", INTEGER),
            ],
        },
        Spec {
            name: name(VERSION),
            entry: Some(version_entry),
            acl: c"write lease",
            flags: "write",
            arity: 3,
            keys: Keys::None,
            key_flags: 0,
            summary: c"Internal: the lease effect and record versions the writer of the stream speaks; accepted only from the master link and the AOF",
            complexity: c"O(1)",
            since: c"0.3.0",
            history: &[],
            args: vec![arg(c"effects", INTEGER), arg(c"records", INTEGER)],
        },
        Spec {
            name: name(CLOCK),
            entry: Some(clock_entry),
            acl: c"write lease",
            flags: "write",
            arity: 2,
            keys: Keys::None,
            key_flags: 0,
            summary: c"Internal: raises the token clock; accepted only from the master link and the AOF",
            complexity: c"O(1)",
            since: V1,
            history: &[],
            args: vec![arg(c"last", INTEGER)],
        },
        Spec {
            name: GATE,
            entry: Some(gate_entry),
            acl: c"write fast lease",
            flags: "write fast",
            arity: -1,
            keys: Keys::One,
            key_flags: RW | ACCESS,
            summary: c"Internal: changes nothing; the module calls it in script mode to learn whether the server would accept a write (to key) now",
            complexity: c"O(1)",
            since: V1,
            history: &[],
            args: vec![Arg {
                flags: OPTIONAL,
                ..arg(c"key", KEY)
            }],
        },
    ]
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
pub fn register_all(ctx: &Context) -> Result<(), String> {
    let with_category = add_acl_category(ctx);
    for spec in specs() {
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
pub fn register_configs(ctx: &Context, values: &[i64]) -> Result<(), String> {
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
                Some(get_setting),
                Some(set_setting),
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

/// Module options: a short read (diskless replica, truncated RESTORE
/// payload) reaches rdb_load as an error instead of killing the server; a
/// key opened for writing is signalled as modified only when the module says
/// so (commit.rs), so calls that change nothing leave WATCH alone.
pub fn set_module_options(ctx: &Context) {
    // SAFETY: called once from OnLoad on the main thread with the load
    // context.
    unsafe {
        if let Some(set_options) = raw::RedisModule_SetModuleOptions {
            set_options(
                ctx.ctx,
                (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
                    | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as i32,
            );
        }
    }
}

/// The `INFO lease` section's callback.
pub fn register_info(ctx: &Context) {
    raw::register_info_function(ctx.ctx, Some(info_cb));
}

/// Subscribes to the server events and keyspace events the module follows:
/// FLUSHDB and SWAPDB (keys freed or moved without unlinking), forks (the
/// token clock is written to a rewritten AOF), config changes
/// (maxmemory-policy, min-replicas-*), role changes and shutdown (the grace
/// period), and `expired` and `evicted` keyspace events (their counters). The command filter that
/// sees expiry commands is registered only while someone waits (waiters.rs).
pub fn subscribe_events(ctx: &Context) {
    type Callback = raw::RedisModuleEventCallback;
    let events: [(u64, Callback); 7] = [
        (raw::REDISMODULE_EVENT_FLUSHDB, Some(flush_cb)),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(role_cb),
        ),
        (raw::REDISMODULE_EVENT_SHUTDOWN, Some(shutdown_cb)),
        (raw::REDISMODULE_EVENT_SWAPDB, Some(swapdb_cb)),
        (raw::REDISMODULE_EVENT_FORK_CHILD, Some(fork_cb)),
        (raw::REDISMODULE_EVENT_CONFIG, Some(config_cb)),
        (raw::REDISMODULE_EVENT_REPLICA_CHANGE, Some(replica_cb)),
    ];
    // SAFETY: called during OnLoad; each event struct is the one the API
    // defines for that event, with its callback of the right signature.
    unsafe {
        if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
            for (id, callback) in events {
                subscribe(ctx.ctx, raw::RedisModuleEvent { id, dataver: 1 }, callback);
            }
        }
        if let Some(subscribe) = raw::RedisModule_SubscribeToKeyspaceEvents {
            subscribe(
                ctx.ctx,
                (raw::REDISMODULE_NOTIFY_EXPIRED | raw::REDISMODULE_NOTIFY_EVICTED) as c_int,
                Some(key_gone_cb),
            );
        }
    }
}

/// Called by `redis_module!` at load, after the data type is created.
pub fn init(
    ctx: &redis_module::Context,
    args: &[redis_module::RedisString],
) -> redis_module::Status {
    use redis_module::Status;
    // SAFETY: the load context, live during OnLoad.
    let lctx = unsafe { Ctx::new(ctx.ctx) };
    server::init_detached(lctx);
    install_panic_hook();
    server::install_hooks(hooks());
    server::set_lease_type(*LEASE_TYPE.raw_type.borrow());
    let raw_args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let loaded = match crate::lease::config::parse_module_args(&raw_args) {
        Ok(s) => s,
        Err(why) => {
            ctx.log_warning(&format!("refusing to load: {why}"));
            return Status::Err;
        }
    };
    settings::init(loaded);
    set_module_options(ctx);
    if let Err(why) = register_configs(ctx, &loaded.values) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    if let Err(why) = register_all(ctx) {
        ctx.log_warning(&format!("refusing to load: {why}"));
        return Status::Err;
    }
    register_info(ctx);
    subscribe_events(ctx);
    crate::module::start(lctx);
    Status::Ok
}
