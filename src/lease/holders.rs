//! A counting or shared lease (design.md S8): the holders of a
//! key held with `LIMIT n` or `SHARED`, each with its own owner, token and
//! deadline, indexed by token, by owner and by deadline so that every
//! operation on one holder costs O(log n) even for `LIMIT 100000`; and its
//! byte encoding (record version 2, or 4 when a holder has a label or a
//! start its token does not tell, design.md S11).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::clock::max_acceptable;
use super::codec::{DecodeError, HOLDERS_VERSION, LABELLED_HOLDERS_VERSION};
use super::exclusive::Reader;
use super::limits::{MAX_LIMIT, MIN_LIMIT, states_facts};
use super::mode::HoldersMode;

/// Mode bytes in the encoding.
const MODE_LIMIT: u8 = 1;
const MODE_SHARED: u8 = 2;
/// Fixed part of an encoded holders record: version, mode, limit, count.
const HOLDERS_HEADER_LEN: usize = 1 + 1 + 4 + 4;
/// Fixed part of one encoded holder: token, deadline, owner length
/// (version 4 adds since and the label's length).
fn holder_header_len(labelled: bool) -> usize {
    if labelled {
        8 + 8 + 8 + 2 + 2
    } else {
        8 + 8 + 2
    }
}

/// A batch of ended holders, the earliest first (`Holders::ended_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub n: usize,
    /// The last one's deadline and token: they name the batch.
    pub deadline_ms: i64,
    pub token: u64,
    /// More ended holders stay after this batch.
    pub more: bool,
}

/// One holder of a counting or shared lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub owner: Box<[u8]>,
    pub token: u64,
    /// Absolute expiry, unix ms.
    pub deadline_ms: i64,
    /// When this holding began, unix ms (a renewal or a retry keeps it).
    pub since_ms: i64,
    /// Its public description (design.md S11), if it has one.
    pub label: Option<Box<[u8]>>,
}

impl Holder {
    /// Does its encoding need version 4?
    fn needs_labelled_version(&self) -> bool {
        states_facts(self.token, self.since_ms, self.label.as_deref())
    }

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
pub struct Holders {
    mode: HoldersMode,
    by_token: BTreeMap<u64, Holder>,
    by_owner: HashMap<Box<[u8]>, u64>,
    by_deadline: BTreeSet<(i64, u64)>,
}

impl Holders {
    pub fn new(mode: HoldersMode) -> Holders {
        Holders {
            mode,
            by_token: BTreeMap::new(),
            by_owner: HashMap::new(),
            by_deadline: BTreeSet::new(),
        }
    }

    /// A record with one holder.
    pub fn with(mode: HoldersMode, holder: Holder) -> Holders {
        let mut m = Holders::new(mode);
        m.put(holder);
        m
    }

    pub fn mode(&self) -> HoldersMode {
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

    /// Gives `owner`'s holding the label `label`; false when it holds
    /// nothing.
    pub fn set_label(&mut self, owner: &[u8], label: &[u8]) -> bool {
        match self
            .by_owner
            .get(owner)
            .and_then(|t| self.by_token.get_mut(t))
        {
            Some(h) => {
                h.label = Some(label.into());
                true
            }
            None => false,
        }
    }

    /// Takes `owner`'s holding out.
    pub fn remove(&mut self, owner: &[u8]) -> Option<Holder> {
        let token = self.by_owner.remove(owner)?;
        let h = self.by_token.remove(&token)?;
        self.by_deadline.remove(&(h.deadline_ms, token));
        Some(h)
    }

    /// The batch `take_ended(now_ms, max)` would take out, without taking
    /// it: its size, its last holder's (deadline, token), which names it
    /// (`LEASE.PRUNE`), and whether more ended holders stay after it.
    /// `None` when no holder has ended. O(k) in the batch.
    pub fn ended_batch(&self, now_ms: i64, max: usize) -> Option<Ended> {
        let mut last = None;
        let mut n = 0;
        let mut more = false;
        for &(deadline, token) in self.by_deadline.iter().take(max.saturating_add(1)) {
            if now_ms <= deadline {
                break;
            }
            if n == max {
                more = true;
                break;
            }
            last = Some((deadline, token));
            n += 1;
        }
        last.map(|(deadline_ms, token)| Ended {
            n,
            deadline_ms,
            token,
            more,
        })
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

    /// The holders `take_through(deadline_ms, token)` would take out,
    /// earliest first, without taking them.
    pub fn ended_through(&self, deadline_ms: i64, token: u64) -> impl Iterator<Item = &Holder> {
        self.by_deadline
            .range(..=(deadline_ms, token))
            .filter_map(|&(_, t)| self.by_token.get(&t))
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
            HoldersMode::Shared => true,
            HoldersMode::Limit(n) => {
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
                .map(|h| per_holder + 2 * h.owner.len() + h.label.as_ref().map_or(0, |l| l.len()))
                .sum::<usize>()
    }

    /// Refuses a stored record whose largest token is too far ahead of the
    /// wall clock (see `Lease::check_not_ahead`).
    pub fn check_not_ahead(&self, now_ms: i64) -> Result<(), DecodeError> {
        let max = max_acceptable(now_ms);
        match self.max_token() {
            Some(token) if token > max => Err(DecodeError::TooFarAhead { token, max }),
            _ => Ok(()),
        }
    }

    /// The versioned encoding: version 2 (or 4), mode, limit (0 for
    /// shared), holder count, then each holder sorted by token: token,
    /// deadline, (since,) owner length, owner(, label length, label)
    /// (little-endian integers).
    pub fn encode(&self) -> Vec<u8> {
        let labelled = self.by_token.values().any(Holder::needs_labelled_version);
        let bytes: usize = self
            .by_token
            .values()
            .map(|h| h.owner.len() + h.label.as_ref().map_or(0, |l| l.len()))
            .sum();
        let per = holder_header_len(labelled);
        let mut out = Vec::with_capacity(HOLDERS_HEADER_LEN + self.len() * per + bytes);
        out.push(if labelled {
            LABELLED_HOLDERS_VERSION
        } else {
            HOLDERS_VERSION
        });
        out.push(match self.mode {
            HoldersMode::Limit(_) => MODE_LIMIT,
            HoldersMode::Shared => MODE_SHARED,
        });
        out.extend_from_slice(&self.mode.limit().to_le_bytes());
        out.extend_from_slice(&(self.len() as u32).to_le_bytes());
        for h in self.by_token.values() {
            out.extend_from_slice(&h.token.to_le_bytes());
            out.extend_from_slice(&h.deadline_ms.to_le_bytes());
            if labelled {
                out.extend_from_slice(&h.since_ms.to_le_bytes());
            }
            out.extend_from_slice(&(h.owner.len() as u16).to_le_bytes());
            out.extend_from_slice(&h.owner);
            if labelled {
                let label = h.label.as_deref().unwrap_or_default();
                out.extend_from_slice(&(label.len() as u16).to_le_bytes());
                out.extend_from_slice(label);
            }
        }
        out
    }

    /// Decodes what `encode` wrote (version byte included); anything else is
    /// refused, never trusted: the count is bounded by the bytes present
    /// before anything is allocated, tokens must strictly increase (so the
    /// encoding is canonical) and owners must be unique.
    pub fn decode(bytes: &[u8]) -> Result<Holders, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != HOLDERS_VERSION && version != LABELLED_HOLDERS_VERSION {
            return Err(DecodeError::Invalid("encoding version"));
        }
        let labelled = version == LABELLED_HOLDERS_VERSION;
        let mode_byte = r.u8()?;
        let limit = r.u32()?;
        let count = r.u32()? as usize;
        let mode = match mode_byte {
            MODE_LIMIT if (MIN_LIMIT..=MAX_LIMIT).contains(&limit) => HoldersMode::Limit(limit),
            MODE_SHARED if limit == 0 => HoldersMode::Shared,
            MODE_LIMIT | MODE_SHARED => return Err(DecodeError::Invalid("limit")),
            _ => return Err(DecodeError::Invalid("mode")),
        };
        if count == 0 || !mode.has_room(count - 1) {
            return Err(DecodeError::Invalid("holder count"));
        }
        let per = holder_header_len(labelled);
        if count > r.0.len() / (per + 1) {
            return Err(DecodeError::Truncated);
        }
        let mut m = Holders::new(mode);
        let mut last_token = 0u64;
        for _ in 0..count {
            let h = r.holding(labelled)?;
            h.check(labelled, last_token)?;
            if m.by_owner.contains_key(h.owner) {
                return Err(DecodeError::Invalid("owner (repeated)"));
            }
            last_token = h.token;
            m.put(Holder {
                owner: h.owner.into(),
                token: h.token,
                deadline_ms: h.deadline_ms,
                since_ms: h.since_ms,
                label: h.label().map(Into::into),
            });
        }
        if !r.0.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        // One encoding per record: version 4 only where version 2 cannot say it.
        if labelled && !m.by_token.values().any(Holder::needs_labelled_version) {
            return Err(DecodeError::Invalid(
                "encoding version (4 without a label or a start to state)",
            ));
        }
        Ok(m)
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
            since_ms: crate::lease::limits::since_of_token(token),
            label: None,
        }
    }

    fn sample() -> Holders {
        let mut m = Holders::new(HoldersMode::Limit(3));
        m.put(h("a", 10, NOW + 100));
        m.put(h(b"b\0\xff", 12, NOW + 50));
        m
    }
    /// Version 2 while no holder has a label or a start its token does not
    /// tell; version 4, which reads back whole, otherwise.
    #[test]
    fn version_4_only_for_labels_or_starts_the_tokens_do_not_tell() {
        let mut m = Holders::with(HoldersMode::Limit(3), h(b"a", 1_024_000, 2_000));
        m.put(h(b"b", 2_048_000, 3_000));
        assert_eq!(m.encode()[0], HOLDERS_VERSION);
        assert_eq!(Holders::decode(&m.encode()), Ok(m.clone()));
        m.set_label(b"b", b"job 2");
        let bytes = m.encode();
        assert_eq!(bytes[0], LABELLED_HOLDERS_VERSION);
        assert_eq!(Holders::decode(&bytes), Ok(m.clone()));
        for n in 0..bytes.len() {
            assert!(Holders::decode(&bytes[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut m = Holders::with(HoldersMode::Shared, h(b"a", 1_024_000, 2_000));
        m.put(Holder {
            since_ms: 999,
            ..h(b"c", 1_024_001, 2_000)
        });
        assert_eq!(m.encode()[0], LABELLED_HOLDERS_VERSION);
        assert_eq!(Holders::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn an_ended_batch_says_whether_more_ended_holders_stay() {
        let mut m = Holders::new(HoldersMode::Limit(10));
        for i in 0..5u64 {
            m.put(h(format!("e{i}"), 1 + i, NOW - 10 + i as i64));
        }
        m.put(h("live", 9, NOW + 100));
        let b = m.ended_batch(NOW, 3).expect("three ended");
        assert_eq!((b.n, b.deadline_ms, b.token, b.more), (3, NOW - 8, 3, true));
        let b = m.ended_batch(NOW, 5).expect("five ended");
        assert_eq!((b.n, b.more), (5, false), "the live holder is no more");
        let b = m.ended_batch(NOW, 100).expect("five ended");
        assert_eq!((b.n, b.more), (5, false));
        assert_eq!(m.ended_batch(NOW - 100, 3), None);
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
        for m in [sample(), Holders::with(HoldersMode::Shared, h("r", 7, NOW))] {
            let bytes = m.encode();
            assert_eq!(bytes[0], HOLDERS_VERSION);
            assert_eq!(Holders::decode(&bytes), Ok(m.clone()));
            for n in 0..bytes.len() {
                assert!(Holders::decode(&bytes[..n]).is_err(), "prefix of {n}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert_eq!(Holders::decode(&long), Err(DecodeError::TrailingBytes));
        }
    }

    #[test]
    fn bad_fields_are_refused() {
        let good = sample().encode();
        let edit = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            Holders::decode(&b)
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
        let mut shared = Holders::with(HoldersMode::Shared, h("r", 7, NOW)).encode();
        shared[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Holders::decode(&shared), Err(DecodeError::Truncated));
        // Tokens out of order or repeated, a repeated owner, zero fields.
        let mut m = Holders::new(HoldersMode::Shared);
        m.put(h("a", 5, NOW));
        m.put(h("b", 6, NOW));
        let two = m.encode();
        let first_token = HOLDERS_HEADER_LEN;
        let second_token = HOLDERS_HEADER_LEN + holder_header_len(false) + 1;
        let mut b = two.clone();
        b[second_token..second_token + 8].copy_from_slice(&5u64.to_le_bytes());
        assert_eq!(Holders::decode(&b), Err(DecodeError::Invalid("token")));
        let mut b = two.clone();
        b[second_token + holder_header_len(false)] = b'a';
        assert_eq!(
            Holders::decode(&b),
            Err(DecodeError::Invalid("owner (repeated)"))
        );
        let mut b = two.clone();
        b[first_token..first_token + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(Holders::decode(&b).is_err());
        let mut b = two.clone();
        b[first_token + 8..first_token + 16].copy_from_slice(&0i64.to_le_bytes());
        assert_eq!(Holders::decode(&b), Err(DecodeError::Invalid("deadline")));
        let mut b = two;
        b[first_token + 16..first_token + 18].copy_from_slice(&0u16.to_le_bytes());
        assert!(Holders::decode(&b).is_err(), "empty owner");
    }

    #[test]
    fn a_token_too_far_ahead_is_refused() {
        let ahead = (NOW + 400 * 86_400_000) as u64 * 1024;
        let m = Holders::with(HoldersMode::Shared, h("a", ahead, NOW));
        assert!(matches!(
            m.check_not_ahead(NOW),
            Err(DecodeError::TooFarAhead { .. })
        ));
        assert_eq!(sample().check_not_ahead(NOW), Ok(()));
    }
}
