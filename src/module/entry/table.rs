//! The command table: every command's name, entry, flags, ACL categories,
//! arity, key positions and its COMMAND DOCS (summary, complexity, since,
//! history, arguments). `ffi::register` registers it.

use std::ffi::CStr;

use crate::lease::effect::{APPLY, CLOCK, DROP, GUARD, HOLD, PRUNE, UNGUARD, VERSION};

use super::super::ffi::entry::command_entry;
use super::super::ffi::register::{
    ACCESS, Arg, BLOCK, DELETE, INTEGER, KEY, Keys, MULTIPLE, ONEOF, OPTIONAL, OW, PURE_TOKEN, RO,
    RW, STRING, Spec, UPDATE, VARIABLE_FLAGS, arg, option,
};
use super::shims;

/// The probe command of the write gates (`commit::gate`).
const GATE: &str = "LEASE.GATE";

fn name(c: &'static CStr) -> &'static str {
    c.to_str().expect("ASCII command names")
}

/// `LIMIT limit | SHARED | FLOOR token`: an acquire's mode, or the floor of
/// an exclusive lease's token (design.md S9), which excludes both.
fn acquire_mode_arg() -> Arg {
    let mut mode = mode_arg(OPTIONAL);
    mode.subargs.push(option(c"token", INTEGER, c"FLOOR"));
    mode
}

/// `numkeys key [key ...]`, then `rest`: a multi-key command's arguments.
fn keys_then(rest: Vec<Arg>) -> Vec<Arg> {
    let mut args = vec![
        arg(c"numkeys", INTEGER),
        Arg {
            flags: MULTIPLE,
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
/// `[LABEL text]` of an acquire (design.md S11).
fn label_arg() -> Arg {
    Arg {
        flags: OPTIONAL,
        ..option(c"text", STRING, c"LABEL")
    }
}

/// `[SINCE ms] [LABEL text]` of an effect that states a holding.
fn facts_args() -> [Arg; 2] {
    [
        Arg {
            flags: OPTIONAL,
            ..option(c"since-ms", INTEGER, c"SINCE")
        },
        label_arg(),
    ]
}

/// The arguments of an effect that sets one holding (`LEASE.APPLY`,
/// `LEASE.HOLD`): `key owner token deadline-ms`, then `mode` (HOLD's
/// `LIMIT n | SHARED`), then the holding's facts.
fn holding_args(mode: Option<Arg>) -> Vec<Arg> {
    let mut args = vec![
        arg(c"key", KEY),
        arg(c"owner", STRING),
        arg(c"token", INTEGER),
        arg(c"deadline-ms", INTEGER),
    ];
    args.extend(mode);
    args.extend(facts_args());
    args
}

/// The version that added labels (design.md S11).
const V4: &CStr = c"0.4.0";
/// The version that added guarded keys (design.md S12).
const V5: &CStr = c"0.5.0";

/// The first version, where most commands come from.
const V1: &CStr = c"0.1.0";

pub fn specs() -> Vec<Spec> {
    vec![
        Spec {
            name: "LEASE.ACQUIRE",
            entry: command_entry::<shims::Acquire>(),
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
                (V4, c"Added the `LABEL` option."),
                (V5, c"`LIMIT` and `SHARED` are refused on a key that guards its hash tag."),
            ],
            args: vec![
                arg(c"key", KEY),
                arg(c"owner", STRING),
                arg(c"ttl-ms", INTEGER),
                acquire_mode_arg(),
                label_arg(),
                Arg {
                    flags: OPTIONAL,
                    ..option(c"timeout-ms", INTEGER, c"BLOCK")
                },
            ],
        },
        Spec {
            name: "LEASE.RENEW",
            entry: command_entry::<shims::Renew>(),
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
            entry: command_entry::<shims::Release>(),
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
            entry: command_entry::<shims::Fence>(),
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
            summary: c"Checks that token is the token of a lease held now (else a STALE error) with at least MINTTL ms left if given (else an EXPIRING error) and, in the same step, runs the command if one is given",
            complexity: c"O(1) for an exclusive lease; O(log n) with n holders",
            since: V1,
            history: &[
                (c"0.2.0", c"A `SHARED` holder's token fences no write command."),
                (V4, c"Added the `MINTTL` option."),
                (V5, c"A `SHARED` holder's token also fences no module command flagged neither `write` nor `readonly` whose key specs write."),
            ],
            args: vec![
                arg(c"key", KEY),
                arg(c"token", INTEGER),
                // Only right after the token: further on, MINTTL is the
                // fenced command's own argument.
                Arg {
                    flags: OPTIONAL,
                    ..option(c"ms", INTEGER, c"MINTTL")
                },
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
            entry: command_entry::<shims::Info>(),
            acl: c"read fast lease",
            flags: "readonly fast",
            arity: 2,
            keys: Keys::One,
            key_flags: RO | ACCESS,
            summary: c"Token, remaining ttl, waiters, start and label of the lease held on key (and mode, limit and holders of a counting or shared lease), and whether key guards its hash tag; null when free and not a guard",
            complexity: c"O(1) for an exclusive lease; O(n) with n holders",
            since: V1,
            history: &[
                (c"0.2.0", c"Added `mode`, `limit` and `holders` for counting and shared leases."),
                (V4, c"Added `since` and `label`."),
                (V5, c"Added `guard`; a guard nobody holds answers its fields with no holding."),
            ],
            args: vec![arg(c"key", KEY)],
        },
        Spec {
            name: "LEASE.WAITERS",
            entry: command_entry::<shims::Waiters>(),
            // slow: O(n) in the waiters listed (at most 1000).
            acl: c"read slow lease",
            flags: "readonly",
            arity: -2,
            keys: Keys::One,
            key_flags: RO | ACCESS,
            summary: c"The clients waiting for key, oldest first: client id, label, mode, keys, time waited and time to their BLOCK timeout",
            complexity: c"O(n) for the n waiters listed",
            since: V4,
            history: &[],
            args: vec![
                arg(c"key", KEY),
                Arg {
                    flags: OPTIONAL,
                    ..option(c"count", INTEGER, c"COUNT")
                },
            ],
        },
        Spec {
            name: "LEASE.MACQUIRE",
            entry: command_entry::<shims::MAcquire>(),
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
            history: &[(V4, c"Added the `LABEL` option.")],
            args: keys_then(vec![
                arg(c"owner", STRING),
                arg(c"ttl-ms", INTEGER),
                label_arg(),
                Arg {
                    flags: OPTIONAL,
                    ..option(c"timeout-ms", INTEGER, c"BLOCK")
                },
            ]),
        },
        Spec {
            name: "LEASE.MRENEW",
            entry: command_entry::<shims::MRenew>(),
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
            entry: command_entry::<shims::MRelease>(),
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
            entry: command_entry::<shims::Apply>(),
            acl: c"write lease",
            flags: "write",
            arity: -5,
            keys: Keys::One,
            key_flags: OW | UPDATE,
            summary: c"Internal: sets a lease's full state; accepted only from the master link and the AOF",
            complexity: c"O(1)",
            since: V1,
            history: &[(V4, c"Added `SINCE` and `LABEL`.")],
            args: holding_args(None),
        },
        Spec {
            name: name(GUARD),
            entry: command_entry::<shims::Guard>(),
            // admin-ish: it changes who may write other keys, so it is
            // not @fast (it reads the command table at the first guard)
            // and is @dangerous like the commands that change access
            // (ACL users of applications should not run it).
            acl: c"write slow dangerous lease",
            flags: "write deny-oom",
            arity: 2,
            keys: Keys::One,
            key_flags: RW | ACCESS | UPDATE,
            summary: c"Makes the lease key guard its hash tag: every other key of the database with that tag is written only through LEASE.FENCE with the current token of this key's lease",
            complexity: c"O(1)",
            since: V5,
            history: &[],
            args: vec![arg(c"key", KEY)],
        },
        Spec {
            name: name(UNGUARD),
            entry: command_entry::<shims::Unguard>(),
            acl: c"write slow dangerous lease",
            flags: "write",
            arity: 2,
            keys: Keys::One,
            key_flags: RW | UPDATE,
            summary: c"Ends the guard of a lease key; 1 if it guarded, else 0 (a key nobody holds goes)",
            complexity: c"O(1)",
            since: V5,
            history: &[],
            args: vec![arg(c"key", KEY)],
        },
        Spec {
            name: "LEASE.FENCED",
            entry: command_entry::<shims::Fenced>(),
            // What the command filter puts in the place of a write to a
            // guarded key: it answers the FENCED error. In @read and
            // @write so that any user who could send the write gets the
            // refusal, not NOPERM.
            acl: c"read write fast lease",
            flags: "readonly fast",
            arity: 3,
            keys: Keys::One,
            key_flags: RO,
            summary: c"Internal: answers the FENCED error of a write to a guarded key outside LEASE.FENCE (the command filter puts it in the place of the refused command)",
            complexity: c"O(1)",
            since: V5,
            history: &[],
            args: vec![arg(c"key", KEY), arg(c"guard", STRING)],
        },
        Spec {
            name: name(HOLD),
            entry: command_entry::<shims::Hold>(),
            acl: c"write lease",
            flags: "write",
            arity: -6,
            keys: Keys::One,
            key_flags: RW | UPDATE,
            summary: c"Internal: adds or updates one holder of a counting or shared lease; accepted only from the master link and the AOF",
            complexity: c"O(log n) with n holders",
            since: c"0.2.0",
            history: &[(V4, c"Added `SINCE` and `LABEL`.")],
            args: holding_args(Some(mode_arg(0))),
        },
        Spec {
            name: name(DROP),
            entry: command_entry::<shims::Drop>(),
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
            entry: command_entry::<shims::Prune>(),
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
            entry: command_entry::<shims::Version>(),
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
            entry: command_entry::<shims::Clock>(),
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
            entry: command_entry::<shims::Gate>(),
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
