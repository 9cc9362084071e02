//! Counting and shared leases (SPEC S8): `LEASE.ACQUIRE ... LIMIT n` (a
//! semaphore whose permits expire) and `LEASE.ACQUIRE ... SHARED` (a read
//! lease: any number of readers, no exclusive holder meanwhile).
//!
//! A key held that way stores a [`Multi`]: its mode and one [`Holder`] per
//! holder, each with its own owner, token and deadline. The holders are
//! indexed by token, by owner and by deadline, so every operation on one
//! holder costs O(log n) even for `LIMIT 100000`. An exclusive lease keeps
//! its own small record ([`Lease`]); nothing here touches its costs.
//!
//! The decisions are plain functions of the key's state ([`Held`]), the
//! request and the queue, shared by the commands and the hand-off to
//! waiters (`waitq::WaitRegistry::grant_next`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use super::error::LeaseError;
use super::record::{DecodeError, Lease, RecordRef};

/// Smallest and largest `LIMIT n` (`LIMIT 1` is an exclusive lease).
pub const MIN_LIMIT: u32 = 2;
pub const MAX_LIMIT: u32 = 100_000;

/// Record version of a multi-holder record (version 1 is the exclusive
/// [`Lease`]).
pub const MULTI_VERSION: u8 = 2;
/// Mode bytes in the encoding.
const MODE_LIMIT: u8 = 1;
const MODE_SHARED: u8 = 2;
/// Fixed part of an encoded multi record: version, mode, limit, count.
const MULTI_HEADER_LEN: usize = 1 + 1 + 4 + 4;
/// Fixed part of one encoded holder: token, deadline, owner length.
const HOLDER_HEADER_LEN: usize = 8 + 8 + 2;

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

/// One holder of a counting or shared lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub owner: Box<[u8]>,
    pub token: u64,
    /// Absolute expiry, unix ms.
    pub deadline_ms: i64,
}

impl Holder {
    /// Held at `now_ms`? Up to and including its deadline, as a lease.
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms <= self.deadline_ms
    }
}

/// A key held with `LIMIT n` or `SHARED`: its holders, indexed three ways.
/// Invariants: the three indexes hold the same holders; tokens and owners
/// are unique; a stored record has at least one holder (the last holder
/// leaving deletes the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Multi {
    mode: MultiMode,
    by_token: BTreeMap<u64, Holder>,
    by_owner: HashMap<Box<[u8]>, u64>,
    by_deadline: BTreeSet<(i64, u64)>,
}

impl Multi {
    pub fn new(mode: MultiMode) -> Multi {
        Multi {
            mode,
            by_token: BTreeMap::new(),
            by_owner: HashMap::new(),
            by_deadline: BTreeSet::new(),
        }
    }

    /// A record with one holder.
    pub fn with(mode: MultiMode, holder: Holder) -> Multi {
        let mut m = Multi::new(mode);
        m.put(holder);
        m
    }

    pub fn mode(&self) -> MultiMode {
        self.mode
    }

    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    /// The holding of `owner` (live or not).
    pub fn holder(&self, owner: &[u8]) -> Option<&Holder> {
        self.by_owner.get(owner).and_then(|t| self.by_token.get(t))
    }

    /// The holding whose token is `token` (live or not).
    pub fn by_token(&self, token: u64) -> Option<&Holder> {
        self.by_token.get(&token)
    }

    /// Holders sorted by token.
    pub fn holders(&self) -> impl Iterator<Item = &Holder> {
        self.by_token.values()
    }

    /// Adds `holder`, replacing the holding of its owner and any holding
    /// with its token (a replicated effect states one holder exactly).
    /// Returns the holding it replaced by owner.
    pub fn put(&mut self, holder: Holder) -> Option<Holder> {
        let old = self.remove(&holder.owner);
        if let Some(other) = self.by_token.get(&holder.token) {
            let owner = other.owner.clone();
            self.remove(&owner);
        }
        self.by_owner.insert(holder.owner.clone(), holder.token);
        self.by_deadline.insert((holder.deadline_ms, holder.token));
        self.by_token.insert(holder.token, holder);
        old
    }

    /// Moves the deadline of `owner`'s holding; false when it holds nothing.
    pub fn set_deadline(&mut self, owner: &[u8], deadline_ms: i64) -> bool {
        let Some(&token) = self.by_owner.get(owner) else {
            return false;
        };
        let Some(h) = self.by_token.get_mut(&token) else {
            return false;
        };
        self.by_deadline.remove(&(h.deadline_ms, token));
        h.deadline_ms = deadline_ms;
        self.by_deadline.insert((deadline_ms, token));
        true
    }

    /// Takes `owner`'s holding out.
    pub fn remove(&mut self, owner: &[u8]) -> Option<Holder> {
        let token = self.by_owner.remove(owner)?;
        let h = self.by_token.remove(&token)?;
        self.by_deadline.remove(&(h.deadline_ms, token));
        Some(h)
    }

    /// Takes out at most `max` holders whose deadline has passed at
    /// `now_ms`, earliest first (by deadline, then token). The rest stay
    /// for later: every decision here looks at each holder's deadline, so
    /// an ended holder that is still stored counts for nothing.
    pub fn take_ended(&mut self, now_ms: i64, max: usize) -> Vec<Holder> {
        let mut out = Vec::new();
        while out.len() < max
            && let Some(&(deadline, token)) = self.by_deadline.first()
        {
            if now_ms <= deadline {
                break;
            }
            self.by_deadline.pop_first();
            if let Some(h) = self.by_token.remove(&token) {
                self.by_owner.remove(&h.owner);
                out.push(h);
            }
        }
        out
    }

    /// Takes out every holder at or before `(deadline_ms, token)` in the
    /// order `take_ended` takes them: what a master's `take_ended` took,
    /// named by the last holder it took (the `LEASE.PRUNE` effect). Returns
    /// how many left.
    pub fn take_through(&mut self, deadline_ms: i64, token: u64) -> usize {
        let mut n = 0;
        while let Some(&(d, t)) = self.by_deadline.first() {
            if (d, t) > (deadline_ms, token) {
                break;
            }
            self.by_deadline.pop_first();
            if let Some(h) = self.by_token.remove(&t) {
                self.by_owner.remove(&h.owner);
                n += 1;
            }
        }
        n
    }

    /// Holders still within their time at `now_ms`. O(k) in the k holders
    /// whose time has ended (they leave at the next writes).
    pub fn live_len(&self, now_ms: i64) -> usize {
        self.len() - self.by_deadline.range(..(now_ms, 0)).count()
    }

    /// Is there room at `now_ms` for one more live holder? O(1) while the
    /// record keeps at most `n` holders of `LIMIT n` (the effects layer
    /// takes an ended holder out before it adds one to a full record).
    pub fn has_room(&self, now_ms: i64) -> bool {
        match self.mode {
            MultiMode::Shared => true,
            MultiMode::Limit(n) => {
                let (n, len) = (n as usize, self.len());
                len < n
                    || (len == n && self.has_ended(now_ms))
                    || (len > n && self.live_len(now_ms) < n)
            }
        }
    }

    /// The earliest deadline of a holder live at `now_ms`.
    pub fn next_live_deadline(&self, now_ms: i64) -> Option<i64> {
        self.by_deadline
            .range((now_ms, 0)..)
            .next()
            .map(|&(d, _)| d)
    }

    /// Does any holder's deadline lie before `now_ms`?
    pub fn has_ended(&self, now_ms: i64) -> bool {
        self.earliest_deadline().is_some_and(|d| now_ms > d)
    }

    pub fn earliest_deadline(&self) -> Option<i64> {
        self.by_deadline.first().map(|&(d, _)| d)
    }

    /// The key's expiry: the latest deadline.
    pub fn latest_deadline(&self) -> Option<i64> {
        self.by_deadline.last().map(|&(d, _)| d)
    }

    /// Is any holder live at `now_ms`?
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.latest_deadline().is_some_and(|d| now_ms <= d)
    }

    /// The largest token of any holder.
    pub fn max_token(&self) -> Option<u64> {
        self.by_token.last_key_value().map(|(&t, _)| t)
    }

    /// Approximate bytes of memory, for MEMORY USAGE: the record, and per
    /// holder its three index entries and its owner (kept twice).
    pub fn mem_usage(&self) -> usize {
        let per_holder = std::mem::size_of::<Holder>()
            + std::mem::size_of::<u64>() // by_token key
            + std::mem::size_of::<(Box<[u8]>, u64)>() + 1 // by_owner entry
            + std::mem::size_of::<(i64, u64)>(); // by_deadline entry
        std::mem::size_of::<Self>()
            + self
                .by_token
                .values()
                .map(|h| per_holder + 2 * h.owner.len())
                .sum::<usize>()
    }

    /// Refuses a stored record whose largest token is too far ahead of the
    /// wall clock (see `Lease::check_not_ahead`).
    pub fn check_not_ahead(&self, now_ms: i64) -> Result<(), DecodeError> {
        let max = crate::lease::clock::max_acceptable(now_ms);
        match self.max_token() {
            Some(token) if token > max => Err(DecodeError::TooFarAhead { token, max }),
            _ => Ok(()),
        }
    }

    /// The versioned encoding: version 2, mode, limit (0 for shared),
    /// holder count, then each holder sorted by token: token, deadline,
    /// owner length, owner (little-endian integers).
    pub fn encode(&self) -> Vec<u8> {
        let owners: usize = self.by_token.values().map(|h| h.owner.len()).sum();
        let mut out =
            Vec::with_capacity(MULTI_HEADER_LEN + self.len() * HOLDER_HEADER_LEN + owners);
        out.push(MULTI_VERSION);
        out.push(match self.mode {
            MultiMode::Limit(_) => MODE_LIMIT,
            MultiMode::Shared => MODE_SHARED,
        });
        out.extend_from_slice(&self.mode.limit().to_le_bytes());
        out.extend_from_slice(&(self.len() as u32).to_le_bytes());
        for h in self.by_token.values() {
            out.extend_from_slice(&h.token.to_le_bytes());
            out.extend_from_slice(&h.deadline_ms.to_le_bytes());
            out.extend_from_slice(&(h.owner.len() as u16).to_le_bytes());
            out.extend_from_slice(&h.owner);
        }
        out
    }

    /// Decodes what `encode` wrote (version byte included); anything else is
    /// refused, never trusted: the count is bounded by the bytes present
    /// before anything is allocated, tokens must strictly increase (so the
    /// encoding is canonical) and owners must be unique.
    pub fn decode(bytes: &[u8]) -> Result<Multi, DecodeError> {
        if bytes.len() < MULTI_HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        if bytes[0] != MULTI_VERSION {
            return Err(DecodeError::Invalid("encoding version"));
        }
        let limit = u32::from_le_bytes(bytes[2..6].try_into().expect("4 bytes"));
        let mode = match bytes[1] {
            MODE_LIMIT if (MIN_LIMIT..=MAX_LIMIT).contains(&limit) => MultiMode::Limit(limit),
            MODE_SHARED if limit == 0 => MultiMode::Shared,
            MODE_LIMIT | MODE_SHARED => return Err(DecodeError::Invalid("limit")),
            _ => return Err(DecodeError::Invalid("mode")),
        };
        let count = u32::from_le_bytes(bytes[6..10].try_into().expect("4 bytes")) as usize;
        let mut rest = &bytes[MULTI_HEADER_LEN..];
        if count == 0 || !mode.has_room(count - 1) {
            return Err(DecodeError::Invalid("holder count"));
        }
        if count > rest.len() / (HOLDER_HEADER_LEN + 1) {
            return Err(DecodeError::Truncated);
        }
        let mut m = Multi::new(mode);
        let mut last_token = 0u64;
        for _ in 0..count {
            if rest.len() < HOLDER_HEADER_LEN {
                return Err(DecodeError::Truncated);
            }
            let token = u64::from_le_bytes(rest[0..8].try_into().expect("8 bytes"));
            let deadline_ms = i64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
            let owner_len = u16::from_le_bytes(rest[16..18].try_into().expect("2 bytes")) as usize;
            rest = &rest[HOLDER_HEADER_LEN..];
            if rest.len() < owner_len {
                return Err(DecodeError::Truncated);
            }
            let (owner, tail) = rest.split_at(owner_len);
            rest = tail;
            crate::lease::args::check_owner(owner).map_err(|_| DecodeError::Invalid("owner"))?;
            if token == 0 || token > crate::lease::clock::MAX_TOKEN || token <= last_token {
                return Err(DecodeError::Invalid("token"));
            }
            if deadline_ms <= 0 {
                return Err(DecodeError::Invalid("deadline"));
            }
            if m.by_owner.contains_key(owner) {
                return Err(DecodeError::Invalid("owner (repeated)"));
            }
            last_token = token;
            m.put(Holder {
                owner: owner.into(),
                token,
                deadline_ms,
            });
        }
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(m)
    }
}

// --- Decisions -------------------------------------------------------------

/// A key's state for a decision at some instant: free, or held.
#[derive(Debug, Clone, Copy)]
pub enum Held<'a> {
    Free,
    Exclusive(&'a Lease),
    /// Held with `LIMIT n` or `SHARED` by at least one live holder; holders
    /// past their deadline may still be stored (they leave at the next
    /// write), and every decision here looks at each holder's deadline.
    Multi(&'a Multi),
}

impl<'a> Held<'a> {
    /// The state of a stored record at `now_ms`: a lease past its deadline,
    /// or a multi record whose holders have all passed theirs, is free.
    pub fn of(record: Option<RecordRef<'a>>, now_ms: i64) -> Held<'a> {
        match record {
            Some(RecordRef::Exclusive(l)) if l.is_live(now_ms) => Held::Exclusive(l),
            Some(RecordRef::Multi(m)) if m.is_live(now_ms) => Held::Multi(m),
            _ => Held::Free,
        }
    }

    pub fn is_free(&self) -> bool {
        matches!(self, Held::Free)
    }

    /// When the next live holder's time ends at `now_ms` (its deadline, or
    /// the key's expiry when that comes first); `None` when free.
    pub fn next_end(&self, key_expire_ms: Option<i64>, now_ms: i64) -> Option<i64> {
        let end = match self {
            Held::Free => return None,
            Held::Exclusive(l) => l.deadline_ms,
            Held::Multi(m) => m.next_live_deadline(now_ms)?,
        };
        Some(key_expire_ms.map_or(end, |e| e.min(end)))
    }
}

/// What an acquire may do, before any token is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A new holder (or a new exclusive lease): issue a token and store it.
    New,
    /// The caller holds the key in the mode it asks: same token, new deadline.
    Reacquired { token: u64 },
    /// Another holder, no room, or waiters ahead: null, or wait with BLOCK.
    Contended,
}

/// The error for asking `asked` of a key held in `held` (by anyone), or,
/// for two modes without `LIMIT`, by the caller itself.
pub fn conflict(held: Mode, asked: Mode) -> LeaseError {
    if matches!(held, Mode::Limit(_)) || matches!(asked, Mode::Limit(_)) {
        LeaseError::ModeMismatch { held, asked }
    } else {
        LeaseError::HolderMode { held, asked }
    }
}

/// LEASE.ACQUIRE in `mode` by `owner` on a key in state `held` at
/// `now_ms`. `waiters_ahead`: someone waits on the key, so a newcomer that
/// is not a holder must not overtake (strict arrival order, no writer
/// starvation). Errors change nothing: a `LIMIT` that does not match the
/// key's, a `LIMIT` on a key held exclusively or shared and the reverse,
/// and a holder asking in another mode. Holders past their deadline count
/// for nothing, so the caller may decide before it removes them.
pub fn acquire(
    held: Held,
    mode: Mode,
    owner: &[u8],
    waiters_ahead: bool,
    now_ms: i64,
) -> Result<Decision, LeaseError> {
    let queued = |room: bool| {
        if waiters_ahead || !room {
            Decision::Contended
        } else {
            Decision::New
        }
    };
    Ok(match held {
        Held::Free => queued(true),
        Held::Exclusive(l) => match mode {
            Mode::Limit(_) => return Err(conflict(Mode::Exclusive, mode)),
            _ if !l.is_held_by(owner) => Decision::Contended,
            Mode::Exclusive => Decision::Reacquired { token: l.token },
            Mode::Shared => return Err(conflict(Mode::Exclusive, mode)),
        },
        Held::Multi(m) => {
            let held_mode = m.mode().mode();
            let mine = m.holder(owner).filter(|h| h.is_live(now_ms));
            match (m.mode(), mode) {
                (MultiMode::Limit(k), Mode::Limit(n)) if k == n => match mine {
                    Some(h) => Decision::Reacquired { token: h.token },
                    None => queued(m.has_room(now_ms)),
                },
                (MultiMode::Limit(_), _) | (MultiMode::Shared, Mode::Limit(_)) => {
                    return Err(conflict(held_mode, mode));
                }
                (MultiMode::Shared, Mode::Shared) => match mine {
                    Some(h) => Decision::Reacquired { token: h.token },
                    None => queued(true),
                },
                (MultiMode::Shared, Mode::Exclusive) => match mine {
                    Some(_) => return Err(conflict(held_mode, mode)),
                    None => Decision::Contended,
                },
            }
        }
    })
}

/// LEASE.RENEW on a multi record: the new deadline when `owner` holds a
/// live holding, else `None`.
pub fn renew(m: &Multi, owner: &[u8], ttl_ms: i64, now_ms: i64) -> Option<i64> {
    m.holder(owner)
        .filter(|h| h.is_live(now_ms))
        .map(|_| now_ms + ttl_ms)
}

/// LEASE.RELEASE on a multi record: may `owner` give back its holding?
pub fn release(m: &Multi, owner: &[u8], now_ms: i64) -> bool {
    m.holder(owner).is_some_and(|h| h.is_live(now_ms))
}

/// Which kind of holder a valid fencing token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    /// A `SHARED` holder: its token cannot fence a write.
    pub shared: bool,
}

/// LEASE.FENCE: is `token` the token of a current holder of the key?
pub fn fence(record: Option<RecordRef>, token: u64, now_ms: i64) -> Result<Fenced, LeaseError> {
    match record {
        Some(RecordRef::Exclusive(l)) if l.is_live(now_ms) && l.token == token => {
            Ok(Fenced { shared: false })
        }
        Some(RecordRef::Multi(m)) => match m.by_token(token) {
            Some(h) if h.is_live(now_ms) => Ok(Fenced {
                shared: m.mode() == MultiMode::Shared,
            }),
            _ => Err(LeaseError::Stale),
        },
        _ => Err(LeaseError::Stale),
    }
}

/// What LEASE.INFO shows of a counting or shared lease (never an owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiInfo {
    pub mode: MultiMode,
    /// The newest holder's token.
    pub token: u64,
    /// Time to the latest deadline (or the key's expiry when earlier).
    pub ttl_ms: i64,
    /// (token, ttl) of every live holder, sorted by token.
    pub holders: Vec<(u64, i64)>,
}

/// LEASE.INFO of a multi record at `now_ms`: its live holders only; `None`
/// when none is live.
pub fn info(m: &Multi, now_ms: i64, key_expire_ms: Option<i64>) -> Option<MultiInfo> {
    let end = |deadline: i64| key_expire_ms.map_or(deadline, |e| e.min(deadline));
    let holders: Vec<(u64, i64)> = m
        .holders()
        .filter(|h| h.is_live(now_ms))
        .map(|h| (h.token, (end(h.deadline_ms) - now_ms).max(0)))
        .collect();
    let &(token, _) = holders.last()?;
    let latest = m.latest_deadline()?;
    Some(MultiInfo {
        mode: m.mode(),
        token,
        ttl_ms: (end(latest) - now_ms).max(0),
        holders,
    })
}

/// What a multi key's expiry should be set to so that it matches its
/// latest deadline (see `decide::expiry_to_align`).
pub fn expiry_to_align(m: &Multi, key_expire_ms: Option<i64>) -> Option<i64> {
    let latest = m.latest_deadline()?;
    match key_expire_ms {
        Some(e) if e <= latest => None,
        _ => Some(latest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn h(owner: impl AsRef<[u8]>, token: u64, deadline_ms: i64) -> Holder {
        Holder {
            owner: owner.as_ref().into(),
            token,
            deadline_ms,
        }
    }

    fn sample() -> Multi {
        let mut m = Multi::new(MultiMode::Limit(3));
        m.put(h("a", 10, NOW + 100));
        m.put(h(b"b\0\xff", 12, NOW + 50));
        m
    }

    #[test]
    fn indexes_agree_and_put_replaces_by_owner_and_token() {
        let mut m = sample();
        assert_eq!(m.len(), 2);
        assert_eq!(m.holder(b"a").map(|h| h.token), Some(10));
        assert_eq!(m.by_token(12).map(|h| &*h.owner), Some(&b"b\0\xff"[..]));
        assert_eq!(m.earliest_deadline(), Some(NOW + 50));
        assert_eq!(m.latest_deadline(), Some(NOW + 100));
        assert_eq!(m.max_token(), Some(12));
        let old = m.put(h("a", 13, NOW + 500)).unwrap();
        assert_eq!(old.token, 10);
        assert_eq!(m.len(), 2);
        assert_eq!(m.by_token(10), None);
        m.put(h("c", 13, NOW + 1));
        assert_eq!(m.holder(b"a"), None, "token 13 now belongs to c");
        assert_eq!(m.len(), 2);
        assert!(m.set_deadline(b"c", NOW + 900));
        assert!(!m.set_deadline(b"zz", NOW));
        assert_eq!(m.latest_deadline(), Some(NOW + 900));
        assert_eq!(m.remove(b"c").map(|h| h.token), Some(13));
        assert_eq!(m.remove(b"c"), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.by_deadline.len(), 1);
        assert_eq!(m.by_owner.len(), 1);
    }

    #[test]
    fn ended_holders_come_out_earliest_first() {
        let mut m = sample();
        m.put(h("c", 14, NOW + 50));
        assert!(!m.has_ended(NOW + 50));
        assert!(
            m.take_ended(NOW + 50, usize::MAX).is_empty(),
            "live through the deadline"
        );
        assert!(m.has_ended(NOW + 51));
        let mut copy = m.clone();
        let first: Vec<u64> = m.take_ended(NOW + 51, 1).iter().map(|h| h.token).collect();
        assert_eq!(first, vec![12], "at most as many as asked, earliest first");
        let gone: Vec<u64> = m.take_ended(NOW + 51, 5).iter().map(|h| h.token).collect();
        assert_eq!(gone, vec![14]);
        assert_eq!(m.len(), 1);
        // A replica takes the same holders, named by the last one taken.
        assert_eq!(copy.take_through(NOW + 50, 14), 2);
        assert_eq!(copy, m);
        assert!(m.is_live(NOW + 100));
        assert!(!m.is_live(NOW + 101));
    }

    #[test]
    fn encode_decode_round_trip_and_every_truncation_refused() {
        for m in [sample(), Multi::with(MultiMode::Shared, h("r", 7, NOW))] {
            let bytes = m.encode();
            assert_eq!(bytes[0], MULTI_VERSION);
            assert_eq!(Multi::decode(&bytes), Ok(m.clone()));
            for n in 0..bytes.len() {
                assert!(Multi::decode(&bytes[..n]).is_err(), "prefix of {n}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert_eq!(Multi::decode(&long), Err(DecodeError::TrailingBytes));
        }
    }

    #[test]
    fn bad_fields_are_refused() {
        let good = sample().encode();
        let edit = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            Multi::decode(&b)
        };
        assert!(edit(&|b| b[1] = 9).is_err(), "mode");
        assert!(
            edit(&|b| b[2..6].copy_from_slice(&1u32.to_le_bytes())).is_err(),
            "LIMIT 1"
        );
        assert!(edit(&|b| b[2..6].copy_from_slice(&100_001u32.to_le_bytes())).is_err());
        assert!(
            edit(&|b| b[1] = MODE_SHARED).is_err(),
            "shared with a limit"
        );
        assert!(
            edit(&|b| b[6..10].copy_from_slice(&0u32.to_le_bytes())).is_err(),
            "no holder"
        );
        assert_eq!(
            edit(&|b| b[6..10].copy_from_slice(&u32::MAX.to_le_bytes())),
            Err(DecodeError::Invalid("holder count")),
            "more holders than the limit"
        );
        // More holders than the bytes can carry: refused before allocating.
        let mut shared = Multi::with(MultiMode::Shared, h("r", 7, NOW)).encode();
        shared[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Multi::decode(&shared), Err(DecodeError::Truncated));
        // Tokens out of order or repeated, a repeated owner, zero fields.
        let mut m = Multi::new(MultiMode::Shared);
        m.put(h("a", 5, NOW));
        m.put(h("b", 6, NOW));
        let two = m.encode();
        let first_token = MULTI_HEADER_LEN;
        let second_token = MULTI_HEADER_LEN + HOLDER_HEADER_LEN + 1;
        let mut b = two.clone();
        b[second_token..second_token + 8].copy_from_slice(&5u64.to_le_bytes());
        assert_eq!(Multi::decode(&b), Err(DecodeError::Invalid("token")));
        let mut b = two.clone();
        b[second_token + HOLDER_HEADER_LEN] = b'a';
        assert_eq!(
            Multi::decode(&b),
            Err(DecodeError::Invalid("owner (repeated)"))
        );
        let mut b = two.clone();
        b[first_token..first_token + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(Multi::decode(&b).is_err());
        let mut b = two.clone();
        b[first_token + 8..first_token + 16].copy_from_slice(&0i64.to_le_bytes());
        assert_eq!(Multi::decode(&b), Err(DecodeError::Invalid("deadline")));
        let mut b = two;
        b[first_token + 16..first_token + 18].copy_from_slice(&0u16.to_le_bytes());
        assert!(Multi::decode(&b).is_err(), "empty owner");
    }

    #[test]
    fn a_token_too_far_ahead_is_refused() {
        let ahead = (NOW + 400 * 86_400_000) as u64 * 1024;
        let m = Multi::with(MultiMode::Shared, h("a", ahead, NOW));
        assert!(matches!(
            m.check_not_ahead(NOW),
            Err(DecodeError::TooFarAhead { .. })
        ));
        assert_eq!(sample().check_not_ahead(NOW), Ok(()));
    }

    fn excl(owner: &str) -> Box<Lease> {
        Lease::new(owner.as_bytes(), 5, NOW + 10)
    }

    #[test]
    fn acquire_on_a_free_key_and_strict_order() {
        for mode in [Mode::Exclusive, Mode::Limit(3), Mode::Shared] {
            assert_eq!(
                acquire(Held::Free, mode, b"a", false, NOW),
                Ok(Decision::New)
            );
            assert_eq!(
                acquire(Held::Free, mode, b"a", true, NOW),
                Ok(Decision::Contended),
                "a newcomer never overtakes a waiter"
            );
        }
    }

    #[test]
    fn acquire_on_an_exclusive_key() {
        let l = excl("a");
        let held = Held::Exclusive(&l);
        assert_eq!(
            acquire(held, Mode::Exclusive, b"a", true, NOW),
            Ok(Decision::Reacquired { token: 5 })
        );
        assert_eq!(
            acquire(held, Mode::Exclusive, b"b", false, NOW),
            Ok(Decision::Contended)
        );
        assert_eq!(
            acquire(held, Mode::Shared, b"b", false, NOW),
            Ok(Decision::Contended)
        );
        let e = acquire(held, Mode::Shared, b"a", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR this owner holds the key with an exclusive lease and asks for SHARED: release it first"
        );
        let e = acquire(held, Mode::Limit(4), b"b", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR the key is held with an exclusive lease, this acquire asks for LIMIT 4"
        );
    }

    #[test]
    fn acquire_on_a_limit_key() {
        let m = sample(); // LIMIT 3, holders a and b
        let held = Held::Multi(&m);
        assert_eq!(
            acquire(held, Mode::Limit(3), b"a", true, NOW),
            Ok(Decision::Reacquired { token: 10 })
        );
        assert_eq!(
            acquire(held, Mode::Limit(3), b"c", false, NOW),
            Ok(Decision::New)
        );
        assert_eq!(
            acquire(held, Mode::Limit(3), b"c", true, NOW),
            Ok(Decision::Contended)
        );
        let mut full = m.clone();
        full.put(h("c", 20, NOW + 5));
        assert_eq!(
            acquire(Held::Multi(&full), Mode::Limit(3), b"d", false, NOW),
            Ok(Decision::Contended)
        );
        let e = acquire(held, Mode::Limit(5), b"c", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR the key is held with LIMIT 3, this acquire asks for LIMIT 5"
        );
        for mode in [Mode::Exclusive, Mode::Shared] {
            for owner in [&b"a"[..], b"c"] {
                assert!(matches!(
                    acquire(held, mode, owner, false, NOW),
                    Err(LeaseError::ModeMismatch { .. })
                ));
            }
        }
    }

    #[test]
    fn holders_past_their_deadline_count_for_nothing() {
        let mut m = sample(); // LIMIT 3: a until NOW + 100, b until NOW + 50
        m.put(h("c", 20, NOW + 50));
        let later = NOW + 60;
        assert_eq!(m.live_len(later), 1);
        assert!(
            !m.has_room(NOW) && m.has_room(later),
            "full, then two ended"
        );
        assert_eq!(
            acquire(Held::Multi(&m), Mode::Limit(3), b"d", false, NOW),
            Ok(Decision::Contended),
            "full"
        );
        assert_eq!(
            acquire(Held::Multi(&m), Mode::Limit(3), b"d", false, later),
            Ok(Decision::New),
            "b's and c's places are free"
        );
        assert_eq!(
            acquire(Held::Multi(&m), Mode::Limit(3), b"c", false, later),
            Ok(Decision::New),
            "c's holding ended: it is a newcomer"
        );
        let s = Multi::with(MultiMode::Shared, h("r", 9, NOW + 10));
        assert_eq!(
            acquire(Held::Multi(&s), Mode::Exclusive, b"r", false, NOW + 11),
            Ok(Decision::Contended),
            "an ended reader is no holder: its exclusive ask is no error"
        );
    }

    #[test]
    fn acquire_on_a_shared_key() {
        let m = Multi::with(MultiMode::Shared, h("r", 9, NOW + 10));
        let held = Held::Multi(&m);
        assert_eq!(
            acquire(held, Mode::Shared, b"r", true, NOW),
            Ok(Decision::Reacquired { token: 9 })
        );
        assert_eq!(
            acquire(held, Mode::Shared, b"s", false, NOW),
            Ok(Decision::New)
        );
        assert_eq!(
            acquire(held, Mode::Shared, b"s", true, NOW),
            Ok(Decision::Contended)
        );
        assert_eq!(
            acquire(held, Mode::Exclusive, b"w", false, NOW),
            Ok(Decision::Contended)
        );
        assert!(matches!(
            acquire(held, Mode::Exclusive, b"r", false, NOW),
            Err(LeaseError::HolderMode { .. })
        ));
        let e = acquire(held, Mode::Limit(2), b"w", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR the key is held with SHARED, this acquire asks for LIMIT 2"
        );
    }

    #[test]
    fn renew_release_fence_info() {
        let mut m = sample();
        assert_eq!(renew(&m, b"a", 30, NOW), Some(NOW + 30));
        assert_eq!(renew(&m, b"a", 30, NOW + 101), None, "expired");
        assert_eq!(renew(&m, b"zz", 30, NOW), None);
        assert!(release(&m, b"a", NOW));
        assert!(!release(&m, b"a", NOW + 101));
        fn rec(m: &Multi) -> Option<RecordRef<'_>> {
            Some(RecordRef::Multi(m))
        }
        assert_eq!(fence(rec(&m), 12, NOW), Ok(Fenced { shared: false }));
        assert_eq!(fence(rec(&m), 12, NOW + 51), Err(LeaseError::Stale));
        assert_eq!(fence(rec(&m), 11, NOW), Err(LeaseError::Stale));
        let s = Multi::with(MultiMode::Shared, h("r", 9, NOW + 10));
        assert_eq!(fence(rec(&s), 9, NOW), Ok(Fenced { shared: true }));
        let l = excl("a");
        assert_eq!(
            fence(Some(RecordRef::Exclusive(&l)), 5, NOW),
            Ok(Fenced { shared: false })
        );
        assert_eq!(fence(None, 5, NOW), Err(LeaseError::Stale));
        let view = info(&m, NOW + 10, None).unwrap();
        assert_eq!(view.mode, MultiMode::Limit(3));
        assert_eq!((view.token, view.ttl_ms), (12, 90));
        assert_eq!(view.holders, vec![(10, 90), (12, 40)]);
        let view = info(&m, NOW + 60, Some(NOW + 80)).unwrap();
        assert_eq!(
            view.holders,
            vec![(10, 20)],
            "the ended holder is not shown"
        );
        assert_eq!((view.token, view.ttl_ms), (10, 20));
        assert_eq!(info(&m, NOW + 101, None), None);
        assert_eq!(expiry_to_align(&m, None), Some(NOW + 100));
        assert_eq!(expiry_to_align(&m, Some(NOW + 100)), None);
        assert_eq!(expiry_to_align(&m, Some(NOW + 200)), Some(NOW + 100));
        m.take_ended(NOW + 1000, usize::MAX);
        assert_eq!(expiry_to_align(&m, None), None);
    }

    #[test]
    fn held_state_and_next_end() {
        let m = sample();
        let l = excl("a");
        assert!(Held::of(None, NOW).is_free());
        assert!(Held::of(Some(RecordRef::Exclusive(&l)), NOW + 11).is_free());
        assert!(!Held::of(Some(RecordRef::Multi(&m)), NOW + 100).is_free());
        assert!(Held::of(Some(RecordRef::Multi(&m)), NOW + 101).is_free());
        let held = Held::of(Some(RecordRef::Multi(&m)), NOW);
        assert_eq!(held.next_end(None, NOW), Some(NOW + 50));
        assert_eq!(held.next_end(Some(NOW + 20), NOW), Some(NOW + 20));
        assert_eq!(
            held.next_end(None, NOW + 60),
            Some(NOW + 100),
            "an ended holder still stored is no next end"
        );
        assert_eq!(Held::Exclusive(&l).next_end(None, NOW), Some(NOW + 10));
        assert_eq!(Held::Free.next_end(None, NOW), None);
    }
}
