//! What an acquire asks for and how a key with several holders is held:
//! the modes of design.md S8.

use std::fmt;

/// What an acquire asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// One holder (no option).
    #[default]
    Exclusive,
    /// `LIMIT n`: up to `n` holders.
    Limit(u32),
    /// `SHARED`: any number of holders, no exclusive one meanwhile.
    Shared,
}

impl Mode {
    /// The multi-holder mode, `None` for an exclusive lease.
    pub fn multi(self) -> Option<MultiMode> {
        match self {
            Mode::Exclusive => None,
            Mode::Limit(n) => Some(MultiMode::Limit(n)),
            Mode::Shared => Some(MultiMode::Shared),
        }
    }
}

/// How a mode reads in an error: "an exclusive lease", "LIMIT 3", "SHARED".
impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => write!(f, "an exclusive lease"),
            Mode::Limit(n) => write!(f, "LIMIT {n}"),
            Mode::Shared => write!(f, "SHARED"),
        }
    }
}

/// How a key with several holders is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MultiMode {
    Limit(u32),
    Shared,
}

impl MultiMode {
    pub fn mode(self) -> Mode {
        match self {
            MultiMode::Limit(n) => Mode::Limit(n),
            MultiMode::Shared => Mode::Shared,
        }
    }

    /// `n` of `LIMIT n`; 0 for shared (as `LEASE.INFO` shows it).
    pub fn limit(self) -> u32 {
        match self {
            MultiMode::Limit(n) => n,
            MultiMode::Shared => 0,
        }
    }

    /// The `mode` field of `LEASE.INFO`.
    pub fn name(self) -> &'static str {
        match self {
            MultiMode::Limit(_) => "limit",
            MultiMode::Shared => "shared",
        }
    }

    /// Room for another holder besides `holders`?
    pub fn has_room(self, holders: usize) -> bool {
        match self {
            MultiMode::Limit(n) => holders < n as usize,
            MultiMode::Shared => true,
        }
    }
}
