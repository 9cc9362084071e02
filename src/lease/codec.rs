//! The stored encoding's versions and the ways a stored value is refused.
//! Every record starts with its version byte: 1 an exclusive lease
//! (`exclusive.rs`), 2 a counting or shared lease (`holders.rs`); 3 and 4
//! the same with each holding's start and label (design.md S11), written
//! only for a record that has a label or a start its token does not tell;
//! 5 an exclusive lease key that guards its hash tag (design.md S12).

use super::limits::MAX_AHEAD_MS;

/// Record version of an exclusive lease, written first in its encoding.
pub const LEASE_VERSION: u8 = 1;
/// Record version of a holders record.
pub const HOLDERS_VERSION: u8 = 2;
/// Record version of an exclusive lease with its start and label.
pub const LABELLED_LEASE_VERSION: u8 = 3;
/// Record version of a holders record with each holder's start and label.
pub const LABELLED_HOLDERS_VERSION: u8 = 4;
/// Record version of an exclusive lease key that guards its hash tag
/// (design.md S12): version 3's layout; a free guard has no owner.
pub const GUARD_VERSION: u8 = 5;
/// The newest record version this build reads.
pub const NEWEST_VERSION: u8 = GUARD_VERSION;

/// Why a stored record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the record needs.
    Truncated,
    /// Bytes left over after the record.
    TrailingBytes,
    /// A version this build does not know (written by a newer module).
    FutureVersion(u8),
    /// A field with an impossible value.
    Invalid(&'static str),
    /// A token further ahead of this server's wall clock than
    /// `clock::MAX_AHEAD_MS` allows (at most `max` now).
    TooFarAhead { token: u64, max: u64 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "lease record is truncated"),
            DecodeError::TrailingBytes => write!(f, "lease record has trailing bytes"),
            DecodeError::FutureVersion(v) => write!(
                f,
                "lease record has encoding version {v}, newer than the {NEWEST_VERSION} this module reads"
            ),
            DecodeError::Invalid(what) => write!(f, "lease record has an invalid {what}"),
            DecodeError::TooFarAhead { token, max } => write!(
                f,
                "lease record has token {token}, more than {} days ahead of this server's clock (at most {max} is accepted now)",
                MAX_AHEAD_MS / 86_400_000
            ),
        }
    }
}
