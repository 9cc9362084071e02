//! The limits of every argument and stored value, in one place: the leaves
//! the rest of the core builds on.

/// Longest owner id, in bytes.
pub const MAX_OWNER_LEN: usize = 256;
/// Upper bound of any millisecond argument or setting (about 31 years), so
/// `now + ttl` can never overflow.
pub const MAX_MS: i64 = 1_000_000_000_000;
/// Largest token: 2^53-1, exact in every client language.
pub const MAX_TOKEN: u64 = (1 << 53) - 1;
/// Tokens per wall-clock millisecond in the token clock's floor.
pub const TOKENS_PER_MS: u64 = 1024;
/// How far ahead of the wall clock a token a client stores (RESTORE,
/// MIGRATE) may be: one year of floor, so that one payload can never push
/// the clock to 2^53-1 and exhaust every later acquire.
pub const MAX_AHEAD_MS: i64 = 365 * 24 * 3600 * 1000;
/// The least a `FLOOR` token may be ahead of the wall clock (design.md S9):
/// the bound is the server's grace length, and at least this.
pub const MIN_FLOOR_AHEAD_MS: i64 = 1000;
/// Smallest and largest `LIMIT n` (`LIMIT 1` is an exclusive lease).
pub const MIN_LIMIT: u32 = 2;
pub const MAX_LIMIT: u32 = 100_000;

/// Is `owner` a valid owner id (1..=256 arbitrary bytes)?
pub fn owner_ok(owner: &[u8]) -> bool {
    (1..=MAX_OWNER_LEN).contains(&owner.len())
}
/// Longest label (design.md S11), in bytes.
pub const MAX_LABEL_LEN: usize = 256;

pub fn label_ok(label: &[u8]) -> bool {
    (1..=MAX_LABEL_LEN).contains(&label.len())
}

/// When a holding began, as its token tells it: a token is issued at
/// `now_ms * TOKENS_PER_MS` or just above (design.md S2), so this is the
/// millisecond it was issued in unless the token clock ran ahead of the
/// wall clock (more than 1024 tokens in a millisecond, a `FLOOR`). Records
/// and effects state a holding's start only when it differs.
#[inline(always)]
pub fn since_of_token(token: u64) -> i64 {
    (token / TOKENS_PER_MS) as i64
}

/// Does a holding state its start and its label (the labelled record
/// versions, and the exclusive lease's bytes after the owner): it has a
/// label, or it began at another time than its token tells?
#[inline(always)]
pub fn states_facts(token: u64, since_ms: i64, label: Option<&[u8]>) -> bool {
    label.is_some_and(|l| !l.is_empty()) || since_ms != since_of_token(token)
}
/// Most keys of one multi-key command (`numkeys`).
pub const MAX_KEYS: usize = 1000;
