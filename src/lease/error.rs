//! Every error a lease command can answer with. `Display` gives the full
//! reply text, error code first (`ERR`, `WRONGTYPE`, `STALE`), so the module
//! layer turns any of them into a reply in one place.

use std::fmt;

use super::limits::{MAX_LABEL_LEN, MAX_LIMIT, MAX_OWNER_LEN};
use super::mode::Mode;

/// What a malformed or refused call gets back. Each variant names the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseError {
    /// The command has the wrong number of arguments.
    Arity(&'static str),
    /// `what` is not an integer.
    NotInteger(&'static str),
    /// `what` is an integer outside `min..=max`.
    OutOfRange {
        what: &'static str,
        min: i64,
        max: i64,
    },
    /// The owner is empty.
    OwnerEmpty,
    /// The owner is longer than `MAX_OWNER_LEN` bytes.
    OwnerTooLong(usize),
    /// `LABEL` with an empty text.
    LabelEmpty,
    /// `LABEL` longer than `MAX_LABEL_LEN` bytes.
    LabelTooLong(usize),
    /// An option the command does not know.
    UnknownOption(String),
    /// An option given twice.
    RepeatedOption(&'static str),
    /// An option that needs a value came last.
    MissingValue(&'static str),
    /// Two options that exclude each other (`LIMIT` and `SHARED`).
    ExclusiveOptions(&'static str, &'static str),
    /// `LIMIT 1`: an exclusive lease is asked for without `LIMIT`.
    LimitOne,
    /// `FLOOR` with `LIMIT` or `SHARED`: a quorum lease is exclusive.
    FloorNotExclusive,
    /// A `FLOOR` token further ahead of this server's clock than its grace
    /// length (at least 1 s): how far it may be, in ms, and the largest
    /// token allowed at this moment.
    FloorTooFar { ahead_ms: i64, max: u64 },
    /// An acquire whose mode does not fit how the key is held: a `LIMIT`
    /// other than the key's, or `LIMIT` against exclusive or shared and
    /// the reverse.
    ModeMismatch { held: Mode, asked: Mode },
    /// LIMIT or SHARED asked of a key that guards its hash tag, or a guard
    /// asked of a key held with LIMIT or SHARED (design.md S12).
    GuardHolders,
    /// LEASE.GUARD of a key without a hash tag.
    NoHashTag,
    /// LEASE.GUARD of a key whose hash tag another key guards.
    AlreadyGuarded { tag: String, guard: String },
    /// A write to a guarded key outside the fence of its guard.
    Fenced { key: String, guard: String },
    /// A holder asking again in another mode (exclusive vs `SHARED`).
    HolderMode { held: Mode, asked: Mode },
    /// The key holds a value of another type.
    WrongType,
    /// The fencing token is not the token of the lease held right now.
    Stale,
    /// `LEASE.FENCE ... MINTTL ms`: the token is current, but its lease (or
    /// holding) has less than `min_ttl_ms` left at the decision's time.
    Expiring { left_ms: i64, min_ttl_ms: i64 },
    /// The token clock reached 2^53-1 (about 280 years of tokens at the
    /// wall-clock rate): no larger token can be issued exactly.
    TokensExhausted,
    /// An internal command was sent by an ordinary client.
    InternalOnly(&'static str),
    /// A feature this build refuses, with the reason.
    Unsupported(&'static str),
    /// LEASE.FENCE refuses to run this inner command (name, why).
    FenceRefused(String, &'static str),
    /// LEASE.FENCE names a command the server does not know.
    UnknownCommand(String),
    /// A key of the fenced command is in another cluster slot than the lease.
    CrossSlot,
    /// The caller's ACL user may not run the fenced command or touch its keys.
    NoPerm(String),
    /// The key's cluster slot is served by another node now: the server's
    /// own redirection (`ASK <slot> <ip:port>` or `MOVED <slot> <ip:port>`).
    Redirect(String),
    /// This node received effects or records newer than it understands
    /// (from its master or its AOF): it keeps no lease until it is upgraded.
    Incompatible { effects: u32, records: u32 },
    /// `numkeys` of a multi-key command does not match the keys given.
    NumKeys { numkeys: usize, given: usize },
    /// A multi-key command names a key twice.
    DuplicateKey(String),
    /// `LEASE.MACQUIRE` by an owner that holds some of the keys (not this
    /// one): it never waits holding part of what it asks for.
    PartlyHeld(String),
    /// `LEASE.MACQUIRE` by an owner that holds the keys under more than one
    /// token (this key's differs from the first's).
    MixedTokens(String),
    /// `LEASE.MACQUIRE` by an owner that holds this key with a counting or
    /// shared lease.
    OwnerAmongHolders(String),
    /// A bug caught at the boundary (a panic turned into an error reply).
    Internal(String),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::Arity(cmd) => {
                write!(f, "ERR wrong number of arguments for '{cmd}' command")
            }
            LeaseError::NotInteger(what) => write!(f, "ERR {what} is not an integer"),
            LeaseError::OutOfRange { what, min, max } => {
                write!(f, "ERR {what} is out of range (must be {min}..{max})")
            }
            LeaseError::OwnerEmpty => write!(f, "ERR owner must not be empty"),
            LeaseError::LabelEmpty => write!(f, "ERR LABEL must not be empty"),
            LeaseError::LabelTooLong(len) => write!(
                f,
                "ERR LABEL is {len} bytes, longer than the {} allowed",
                MAX_LABEL_LEN
            ),
            LeaseError::OwnerTooLong(len) => write!(
                f,
                "ERR owner is {len} bytes, longer than the {} allowed",
                MAX_OWNER_LEN
            ),
            LeaseError::UnknownOption(opt) => write!(f, "ERR unknown option '{opt}'"),
            LeaseError::RepeatedOption(opt) => write!(f, "ERR option {opt} given more than once"),
            LeaseError::MissingValue(opt) => write!(f, "ERR option {opt} needs a value"),
            LeaseError::ExclusiveOptions(a, b) => {
                write!(f, "ERR options {a} and {b} cannot be given together")
            }
            LeaseError::LimitOne => write!(
                f,
                "ERR LIMIT 1 is an exclusive lease: leave LIMIT out (LIMIT must be 2..{})",
                MAX_LIMIT
            ),
            LeaseError::FloorNotExclusive => write!(
                f,
                "ERR FLOOR is for exclusive leases: it cannot be given with LIMIT or SHARED"
            ),
            LeaseError::FloorTooFar { ahead_ms, max } => write!(
                f,
                "ERR FLOOR token is more than the grace length ({ahead_ms} ms, at least 1000) ahead of this server's clock (at most {max} now)"
            ),
            LeaseError::ModeMismatch { held, asked } => write!(
                f,
                "ERR the key is held with {held}, this acquire asks for {asked}"
            ),
            LeaseError::HolderMode { held, asked } => write!(
                f,
                "ERR this owner holds the key with {held} and asks for {asked}: release it first"
            ),
            LeaseError::GuardHolders => write!(
                f,
                "ERR a key that guards its hash tag holds only exclusive leases: LIMIT and SHARED cannot be used on it, and a key held with LIMIT or SHARED cannot guard"
            ),
            LeaseError::NoHashTag => write!(
                f,
                "ERR a guard needs a key with a hash tag (a non-empty {{...}} part): it guards the keys of that tag"
            ),
            LeaseError::AlreadyGuarded { tag, guard } => {
                write!(f, "ERR hash tag {{{tag}}} is already guarded by '{guard}'")
            }
            LeaseError::Fenced { key, guard } => write!(
                f,
                "FENCED write to '{key}' refused: its hash tag is guarded by '{guard}'; write it through LEASE.FENCE {guard} <token> ..."
            ),
            LeaseError::WrongType => write!(
                f,
                "WRONGTYPE Operation against a key holding the wrong kind of value"
            ),
            LeaseError::Stale => write!(
                f,
                "STALE fencing token is not the token of the lease held on this key"
            ),
            LeaseError::Expiring {
                left_ms,
                min_ttl_ms,
            } => write!(
                f,
                "EXPIRING lease has {left_ms} ms left, less than MINTTL {min_ttl_ms}"
            ),
            LeaseError::TokensExhausted => {
                write!(f, "ERR fencing tokens exhausted (2^53-1 reached)")
            }
            LeaseError::InternalOnly(cmd) => write!(
                f,
                "ERR {cmd} is internal: accepted only from the replication link and the AOF"
            ),
            LeaseError::Unsupported(why) => write!(f, "ERR {why}"),
            LeaseError::FenceRefused(cmd, why) => {
                write!(f, "ERR LEASE.FENCE cannot run '{cmd}': {why}")
            }
            LeaseError::UnknownCommand(cmd) => {
                write!(f, "ERR LEASE.FENCE: unknown command '{cmd}'")
            }
            LeaseError::CrossSlot => write!(
                f,
                "CROSSSLOT Keys of the fenced command don't hash to the slot of the lease key"
            ),
            LeaseError::NoPerm(what) => write!(f, "NOPERM {what}"),
            LeaseError::Redirect(to) => write!(f, "{to}"),
            LeaseError::Incompatible { effects, records } => write!(
                f,
                "ERR this node's lease module (effects {}, records {}) cannot follow its master's or its AOF's (effects {effects}, records {records}): it keeps no lease until it is upgraded",
                crate::lease::versions::EFFECTS,
                crate::lease::versions::RECORDS
            ),
            LeaseError::NumKeys { numkeys, given } => {
                write!(
                    f,
                    "ERR numkeys ({numkeys}) does not match the number of keys given ({given})"
                )
            }
            LeaseError::DuplicateKey(key) => {
                write!(f, "ERR key '{key}' is given more than once")
            }
            LeaseError::PartlyHeld(key) => write!(
                f,
                "ERR this owner holds some of the keys but not '{key}': release them, or ask for the ones it holds"
            ),
            LeaseError::MixedTokens(key) => write!(
                f,
                "ERR this owner holds the keys under more than one token ('{key}' has another): release them first"
            ),
            LeaseError::OwnerAmongHolders(key) => write!(
                f,
                "ERR this owner holds '{key}' with a counting or shared lease: a multi-key lease is exclusive, release it first"
            ),
            LeaseError::Internal(what) => {
                write!(f, "ERR internal error in the lease module: {what}")
            }
        }
    }
}

impl std::error::Error for LeaseError {}

/// A client-supplied name made safe to echo in an error line: printable
/// ASCII only, at most 64 characters.
pub fn printable(arg: &[u8]) -> String {
    let mut s: String = arg
        .iter()
        .take(64)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if arg.len() > 64 {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_starts_with_an_upper_case_code() {
        let all = [
            LeaseError::Arity("lease.info"),
            LeaseError::NotInteger("ttl-ms"),
            LeaseError::OutOfRange {
                what: "ttl-ms",
                min: 1,
                max: 2,
            },
            LeaseError::OwnerEmpty,
            LeaseError::OwnerTooLong(300),
            LeaseError::LabelEmpty,
            LeaseError::LabelTooLong(300),
            LeaseError::UnknownOption("FOO".into()),
            LeaseError::RepeatedOption("BLOCK"),
            LeaseError::MissingValue("BLOCK"),
            LeaseError::ExclusiveOptions("LIMIT", "SHARED"),
            LeaseError::FloorNotExclusive,
            LeaseError::FloorTooFar {
                ahead_ms: 1000,
                max: 5,
            },
            LeaseError::LimitOne,
            LeaseError::ModeMismatch {
                held: Mode::Limit(3),
                asked: Mode::Shared,
            },
            LeaseError::HolderMode {
                held: Mode::Shared,
                asked: Mode::Exclusive,
            },
            LeaseError::WrongType,
            LeaseError::Stale,
            LeaseError::Expiring {
                left_ms: 120,
                min_ttl_ms: 500,
            },
            LeaseError::TokensExhausted,
            LeaseError::InternalOnly("LEASE.APPLY"),
            LeaseError::Unsupported("x"),
            LeaseError::FenceRefused("blpop".into(), "x"),
            LeaseError::UnknownCommand("x".into()),
            LeaseError::CrossSlot,
            LeaseError::NoPerm("x".into()),
            LeaseError::Redirect("MOVED 1 127.0.0.1:7000".into()),
            LeaseError::Incompatible {
                effects: 9,
                records: 9,
            },
            LeaseError::NumKeys {
                numkeys: 3,
                given: 2,
            },
            LeaseError::DuplicateKey("k".into()),
            LeaseError::PartlyHeld("k".into()),
            LeaseError::MixedTokens("k".into()),
            LeaseError::OwnerAmongHolders("k".into()),
            LeaseError::Internal("x".into()),
        ];
        for e in all {
            let s = e.to_string();
            let code = s.split(' ').next().unwrap();
            assert!(
                !code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase()),
                "{s}"
            );
            assert!(!s.contains('\n') && !s.contains('\r'), "{s}");
        }
        assert!(LeaseError::Stale.to_string().starts_with("STALE "));
        assert_eq!(
            LeaseError::Expiring {
                left_ms: 120,
                min_ttl_ms: 500
            }
            .to_string(),
            "EXPIRING lease has 120 ms left, less than MINTTL 500"
        );
    }
}
