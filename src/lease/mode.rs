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
    /// The counting or shared mode, `None` for an exclusive lease.
    pub fn holders(self) -> Option<HoldersMode> {
        match self {
            Mode::Exclusive => None,
            Mode::Limit(n) => Some(HoldersMode::Limit(n)),
            Mode::Shared => Some(HoldersMode::Shared),
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
pub enum HoldersMode {
    Limit(u32),
    Shared,
}

impl HoldersMode {
    pub fn mode(self) -> Mode {
        match self {
            HoldersMode::Limit(n) => Mode::Limit(n),
            HoldersMode::Shared => Mode::Shared,
        }
    }

    /// `n` of `LIMIT n`; 0 for shared (as `LEASE.INFO` shows it).
    pub fn limit(self) -> u32 {
        match self {
            HoldersMode::Limit(n) => n,
            HoldersMode::Shared => 0,
        }
    }

    /// The `mode` field of `LEASE.INFO`.
    pub fn name(self) -> &'static str {
        match self {
            HoldersMode::Limit(_) => "limit",
            HoldersMode::Shared => "shared",
        }
    }

    /// Room for another holder besides `holders`?
    pub fn has_room(self, holders: usize) -> bool {
        match self {
            HoldersMode::Limit(n) => holders < n as usize,
            HoldersMode::Shared => true,
        }
    }
}
