//! Command registration: names, flags, key positions, and the COMMAND
//! INFO / COMMAND DOCS description of each command.

use std::ffi::{CStr, CString};
use std::os::raw::c_int;

use redis_module::{Context, raw};

use super::commands;

/// The internal effect command used by replication and the AOF.
pub const APPLY: &str = "LEASE.APPLY";
/// `APPLY` as a C string, for RedisModule_Replicate and EmitAOF.
pub const APPLY_CMD: &CStr = c"LEASE.APPLY";

crate::command_entry!(acquire_entry => commands::acquire);
crate::command_entry!(renew_entry => commands::renew);
crate::command_entry!(release_entry => commands::release);
crate::command_entry!(fence_entry => commands::fence);
crate::command_entry!(info_entry => commands::info);
crate::command_entry!(apply_entry => commands::apply);

/// One documented argument.
struct Arg {
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    token: Option<&'static CStr>,
    flags: u32,
}

const fn arg(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: 0,
    }
}

const KEY: raw::RedisModuleCommandArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;

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
    key_flags: u32,
    summary: &'static CStr,
    complexity: &'static CStr,
    args: Vec<Arg>,
}

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
            acl: c"write fast lease",
            flags: "write deny-oom fast",
            arity: -4,
            key_flags: RW | ACCESS | UPDATE,
            summary: c"Acquires a lease and returns its fencing token; null when another owner holds it",
            complexity: c"O(1)",
            args: vec![
                arg(c"key", KEY),
                arg(c"owner", STRING),
                arg(c"ttl-ms", INTEGER),
                Arg {
                    name: c"timeout-ms",
                    kind: INTEGER,
                    token: Some(c"BLOCK"),
                    flags: OPTIONAL,
                },
            ],
        },
        Spec {
            name: "LEASE.RENEW",
            entry: Some(renew_entry),
            acl: c"write fast lease",
            flags: "write fast",
            arity: 4,
            key_flags: RW | UPDATE,
            summary: c"Resets the remaining time of a lease held by owner; 1 if renewed, else 0",
            complexity: c"O(1)",
            args: vec![arg(c"key", KEY), arg(c"owner", STRING), arg(c"ttl-ms", INTEGER)],
        },
        Spec {
            name: "LEASE.RELEASE",
            entry: Some(release_entry),
            acl: c"write fast lease",
            flags: "write fast",
            arity: 3,
            key_flags: RW | DELETE,
            summary: c"Releases a lease held by owner; 1 if released, else 0",
            complexity: c"O(1)",
            args: vec![arg(c"key", KEY), arg(c"owner", STRING)],
        },
        Spec {
            name: "LEASE.FENCE",
            entry: Some(fence_entry),
            acl: c"read lease",
            // getkeys-api: the inner command's keys are declared too.
            flags: "readonly may-replicate getkeys-api",
            arity: -3,
            // VARIABLE_FLAGS: the server asks the getkeys-api callback, which
            // adds the inner command's keys, instead of this spec alone.
            key_flags: RO | ACCESS | VARIABLE_FLAGS,
            summary: c"Checks that token is the token of the lease held now (else a STALE error) and, in the same step, runs the command if one is given",
            complexity: c"O(1)",
            args: vec![
                arg(c"key", KEY),
                arg(c"token", INTEGER),
                Arg {
                    name: c"command",
                    kind: STRING,
                    token: None,
                    flags: OPTIONAL,
                },
                Arg {
                    name: c"arg",
                    kind: STRING,
                    token: None,
                    flags: OPTIONAL | MULTIPLE,
                },
            ],
        },
        Spec {
            name: "LEASE.INFO",
            entry: Some(info_entry),
            acl: c"read fast lease",
            flags: "readonly fast",
            arity: 2,
            key_flags: RO | ACCESS,
            summary: c"Token, remaining ttl and waiters of the lease held on key; null when free",
            complexity: c"O(1)",
            args: vec![arg(c"key", KEY)],
        },
        Spec {
            name: APPLY,
            entry: Some(apply_entry),
            acl: c"write lease",
            flags: "write",
            arity: 5,
            key_flags: OW | UPDATE,
            summary: c"Internal: sets a lease's full state; accepted only from the master link and the AOF",
            complexity: c"O(1)",
            args: vec![
                arg(c"key", KEY),
                arg(c"owner", STRING),
                arg(c"token", INTEGER),
                arg(c"deadline-ms", INTEGER),
            ],
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
        let status = unsafe {
            raw::RedisModule_CreateCommand.unwrap()(
                ctx.ctx,
                name.as_ptr(),
                spec.entry,
                flags.as_ptr(),
                1,
                1,
                1,
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
        key_specs[0].flags = spec.key_flags as u64;
        key_specs[0].begin_search_type =
            raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        key_specs[0].bs.index.pos = 1;
        key_specs[0].find_keys_type =
            raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        key_specs[0].fk.range.lastkey = 0;
        key_specs[0].fk.range.keystep = 1;
        key_specs[0].fk.range.limit = 0;

        let mut args: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(spec.args.len() + 1);
        for a in &spec.args {
            let mut r: raw::RedisModuleCommandArg = std::mem::zeroed();
            r.name = a.name.as_ptr();
            r.type_ = a.kind;
            r.key_spec_index = if a.kind == KEY { 0 } else { -1 };
            r.token = a.token.map_or(std::ptr::null(), |t| t.as_ptr());
            r.flags = a.flags as c_int;
            args.push(r);
        }
        args.push(std::mem::zeroed());

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
        info.since = c"1.0.0".as_ptr();
        info.arity = spec.arity;
        info.key_specs = key_specs.as_mut_ptr();
        info.args = args.as_mut_ptr();

        let set = |command| set_command_info(command, &info) == raw::REDISMODULE_OK as c_int;
        if !command_handle(ctx, name).is_some_and(set) {
            return Err(format!("cannot set the command info of {}", spec.name));
        }
    }
    Ok(())
}
