//! An exclusive lease: the record of a key held by one owner, kept in one
//! allocation (token, deadline, since, the owner and the label inline), and
//! its byte encoding: record version 1 (unchanged since the first release)
//! while the holding has no label and began when its token says, else
//! version 3 (design.md S11).

use super::clock::max_acceptable;
use super::codec::{
    DecodeError, GUARD_VERSION, LABELLED_LEASE_VERSION, LEASE_VERSION, NEWEST_VERSION,
};
use super::limits::{MAX_TOKEN, label_ok, owner_ok, since_of_token, states_facts};

/// Fixed part of an encoded version 1 record: version, token, deadline,
/// owner length.
const HEADER_LEN: usize = 1 + 8 + 8 + 2;
/// Fixed part of an encoded version 3 record: version, token, deadline,
/// since, owner length (the label's length follows the owner).
const LABELLED_HEADER_LEN: usize = 1 + 8 + 8 + 8 + 2;

/// One held lease, kept in one allocation: token, deadline and the
/// owner's bytes inline (`Lease::new` makes a `Box<Lease>`); after the
/// owner, a holding whose start its token does not tell has its start,
/// and a holding with a label its label. A lease key's value is this box,
/// so a lease costs the server one allocation of the module's besides its
/// own wrapper: 20 + owner bytes, rounded up to 8, as before labels existed
/// (the label's bytes more when it has one, 8 more when its start is
/// stated).
#[derive(Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Lease {
    /// The fencing token issued when the lease was acquired.
    pub token: u64,
    /// Absolute expiry, unix time in milliseconds.
    pub deadline_ms: i64,
    /// `bytes.len()`, kept inline so that the box can travel as a thin
    /// pointer (`into_thin`, `from_thin`).
    bytes_len: u16,
    /// The owner's length, with two flags (`GUARD_BIT`, `SINCE_BIT`);
    /// after the owner, when `bytes` goes on: the start (8 bytes,
    /// little-endian) when `SINCE_BIT` says so, then the label (the rest).
    owner_len: u16,
    /// The holder's opaque id (1..=256 bytes, binary-safe), then its start
    /// when its token does not tell it, then its label (0..=256 bytes; none
    /// when empty).
    bytes: [u8],
}

/// Where `bytes_len` is in a `Lease` (`repr(C)`: after two 8-byte
/// fields), and where the owner's bytes start (after the two lengths).
const BYTES_LEN_AT: usize = 8 + 8;
const BYTES_AT: usize = BYTES_LEN_AT + 2 + 2;
/// The start's bytes, after the owner.
const SINCE_LEN: usize = 8;
/// The bit of `owner_len` that says the key guards its hash tag (design.md
/// S12; an owner is at most 256 bytes, so the length never uses it).
const GUARD_BIT: u16 = 0x8000;
/// The bit of `owner_len` that says the start is stored after the owner
/// (the holding began at another time than its token tells).
const SINCE_BIT: u16 = 0x4000;
/// The bits of `owner_len` that are the length.
const LEN_BITS: u16 = !(GUARD_BIT | SINCE_BIT);

/// Copies `src` to `dst` (`src.len()` bytes, not overlapping): from 8 to
/// 32 bytes (an owner id, a label) as two loads and two stores that
/// overlap in the middle, without a call; any other length by
/// `copy_nonoverlapping`.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes, outside `src`.
#[inline(always)]
unsafe fn copy_short(dst: *mut u8, src: &[u8]) {
    let (s, n) = (src.as_ptr(), src.len());
    // SAFETY: every read is within `src` (n bytes: at 0 and at n - 16 or
    // n - 8, each of 16 or 8 bytes, where n is at least that), every write
    // within `dst`'s n bytes, unaligned both.
    unsafe {
        if (16..=32).contains(&n) {
            let (a, b) = (
                s.cast::<u128>().read_unaligned(),
                s.add(n - 16).cast::<u128>().read_unaligned(),
            );
            dst.cast::<u128>().write_unaligned(a);
            dst.add(n - 16).cast::<u128>().write_unaligned(b);
        } else if (8..16).contains(&n) {
            let (a, b) = (
                s.cast::<u64>().read_unaligned(),
                s.add(n - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(n - 8).cast::<u64>().write_unaligned(b);
        } else {
            dst.copy_from_nonoverlapping(s, n);
        }
    }
}

impl Lease {
    /// A new lease, in one allocation.
    ///
    /// # Panics
    /// On an owner or a label longer than 65535 bytes together (each is at
    /// most 256).
    pub fn new(
        owner: &[u8],
        token: u64,
        deadline_ms: i64,
        since_ms: i64,
        label: Option<&[u8]>,
    ) -> Box<Lease> {
        let since_stated = since_ms != since_of_token(token);
        let since_len = if since_stated { SINCE_LEN } else { 0 };
        let label = label.unwrap_or_default();
        let len = owner.len() + since_len + label.len();
        let bytes_len = u16::try_from(len).expect("an owner and a label of at most 65535 bytes");
        let owner_len = owner.len() as u16 | if since_stated { SINCE_BIT } else { 0 };
        let layout = Self::layout(len);
        let since = since_ms.to_le_bytes();
        // SAFETY: `layout` has a non-zero size (at least BYTES_AT). Every
        // field is written before the box exists; the pointer's metadata
        // (the slice length) is the length of the bytes after the header,
        // so the box's layout (`Layout::for_value`: BYTES_AT + len rounded
        // up to 8, align 8) is the one allocated here, and dropping the box
        // frees it.
        unsafe {
            let p = std::alloc::alloc(layout);
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            let fat = std::ptr::slice_from_raw_parts_mut(p, len) as *mut Lease;
            std::ptr::addr_of_mut!((*fat).token).write(token);
            std::ptr::addr_of_mut!((*fat).deadline_ms).write(deadline_ms);
            std::ptr::addr_of_mut!((*fat).bytes_len).write(bytes_len);
            std::ptr::addr_of_mut!((*fat).owner_len).write(owner_len);
            let at = std::ptr::addr_of_mut!((*fat).bytes).cast::<u8>();
            copy_short(at, owner);
            let at = at.add(owner.len());
            if since_stated {
                at.copy_from_nonoverlapping(since.as_ptr(), SINCE_LEN);
            }
            if !label.is_empty() {
                copy_short(at.add(since_len), label);
            }
            Box::from_raw(fat)
        }
    }

    #[inline(always)]
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align((BYTES_AT + len).next_multiple_of(8), 8)
            .expect("a small layout")
    }

    /// The box as a thin pointer (what the server keeps as the key's value).
    pub fn into_thin(lease: Box<Lease>) -> *mut u8 {
        Box::into_raw(lease).cast::<u8>()
    }

    /// The lease behind a pointer made by `into_thin`.
    ///
    /// # Safety
    /// `p` must come from `into_thin` and not have been freed.
    pub unsafe fn from_thin(p: *mut u8) -> *mut Lease {
        // SAFETY: by the contract `p` points at a live Lease, whose
        // `bytes_len` field is at BYTES_LEN_AT (2-byte aligned: the
        // allocation is 8-byte aligned).
        let len = unsafe { p.add(BYTES_LEN_AT).cast::<u16>().read() };
        std::ptr::slice_from_raw_parts_mut(p, len as usize) as *mut Lease
    }

    /// A copy in a new allocation.
    pub fn to_boxed(&self) -> Box<Lease> {
        let mut l = Lease::new(
            self.owner(),
            self.token,
            self.deadline_ms,
            self.since_ms(),
            self.label(),
        );
        l.set_guard(self.is_guard());
        l
    }

    /// A lease without a label that began when its token says (tests).
    #[cfg(test)]
    pub fn plain(owner: &[u8], token: u64, deadline_ms: i64) -> Box<Lease> {
        Lease::new(owner, token, deadline_ms, since_of_token(token), None)
    }

    /// The guard of a key nobody holds (design.md S12): no owner, no
    /// deadline, the token of its last holding (0 before the first).
    pub fn free_guard(token: u64) -> Box<Lease> {
        let mut l = Lease::new(b"", token, 0, since_of_token(token), None);
        l.set_guard(true);
        l
    }

    /// Does the key guard its hash tag (design.md S12)?
    #[inline(always)]
    pub fn is_guard(&self) -> bool {
        self.owner_len & GUARD_BIT != 0
    }

    /// Makes the key guard its hash tag, or stop guarding it.
    pub fn set_guard(&mut self, on: bool) {
        if on {
            self.owner_len |= GUARD_BIT;
        } else {
            self.owner_len &= !GUARD_BIT;
        }
    }

    /// Is nobody holding it (a guard's record between holdings)?
    #[inline(always)]
    pub fn is_free(&self) -> bool {
        self.owner_len() == 0
    }

    #[inline(always)]
    fn owner_len(&self) -> usize {
        (self.owner_len & LEN_BITS) as usize
    }

    /// The holder's id (empty for a free guard).
    #[inline(always)]
    pub fn owner(&self) -> &[u8] {
        &self.bytes[..self.owner_len()]
    }

    /// Is its start stored (else it began when its token says)?
    #[inline(always)]
    fn since_stated(&self) -> bool {
        self.owner_len & SINCE_BIT != 0
    }

    /// Where the label starts in `bytes`: after the owner and the start.
    #[inline(always)]
    fn label_at(&self) -> usize {
        self.owner_len() + if self.since_stated() { SINCE_LEN } else { 0 }
    }

    /// When this holding began, unix ms (a renewal or a retry keeps it).
    #[inline]
    pub fn since_ms(&self) -> i64 {
        if !self.since_stated() {
            return since_of_token(self.token);
        }
        let at = self.owner_len();
        let bytes: [u8; SINCE_LEN] = self.bytes[at..at + SINCE_LEN].try_into().expect("8 bytes");
        i64::from_le_bytes(bytes)
    }

    /// The holding's label, if it has one.
    #[inline]
    pub fn label(&self) -> Option<&[u8]> {
        let label = &self.bytes[self.label_at()..];
        (!label.is_empty()).then_some(label)
    }

    /// Can the token become `token` in place, the start staying as it is
    /// (it is stored, or the new token tells it too)?
    #[inline]
    pub fn keeps_since_with(&self, token: u64) -> bool {
        self.since_stated() || since_of_token(token) == since_of_token(self.token)
    }
}

impl Lease {
    /// Is the lease still held at `now_ms`? Up to and including its
    /// deadline, as the server keeps a key until `now > expire time`: the
    /// lease and its key end in the same millisecond.
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms <= self.deadline_ms
    }

    /// Remaining time in ms at `now_ms` (0 once expired).
    pub fn remaining_ms(&self, now_ms: i64) -> i64 {
        (self.deadline_ms - now_ms).max(0)
    }

    /// Is `owner` the holder of this lease?
    #[inline(always)]
    pub fn is_held_by(&self, owner: &[u8]) -> bool {
        self.owner() == owner
    }

    /// Bytes of memory this record takes, for MEMORY USAGE.
    pub fn mem_usage(&self) -> usize {
        Self::layout(self.bytes.len()).size()
    }

    /// Refuses a stored record (RDB, RESTORE, MIGRATE) whose token is too far
    /// ahead of the wall clock at `now_ms` to be trusted: taking it would
    /// raise the token clock towards 2^53-1 for good.
    pub fn check_not_ahead(&self, now_ms: i64) -> Result<(), DecodeError> {
        let max = max_acceptable(now_ms);
        if self.token > max {
            return Err(DecodeError::TooFarAhead {
                token: self.token,
                max,
            });
        }
        Ok(())
    }

    /// Does the encoding need version 3 (a label, or a start its token
    /// does not tell)?
    pub fn needs_labelled_version(&self) -> bool {
        states_facts(self.token, self.since_ms(), self.label())
    }

    /// The versioned byte encoding used by RDB (and so DUMP/RESTORE,
    /// MIGRATE): version 1 when it can, else version 3.
    pub fn encode(&self) -> Vec<u8> {
        let owner = self.owner();
        if !self.is_guard() && !self.needs_labelled_version() {
            let mut out = Vec::with_capacity(HEADER_LEN + owner.len());
            out.push(LEASE_VERSION);
            out.extend_from_slice(&self.token.to_le_bytes());
            out.extend_from_slice(&self.deadline_ms.to_le_bytes());
            out.extend_from_slice(&(owner.len() as u16).to_le_bytes());
            out.extend_from_slice(owner);
            return out;
        }
        let label = self.label().unwrap_or_default();
        let mut out = Vec::with_capacity(LABELLED_HEADER_LEN + 2 + self.bytes.len());
        out.push(if self.is_guard() {
            GUARD_VERSION
        } else {
            LABELLED_LEASE_VERSION
        });
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.deadline_ms.to_le_bytes());
        out.extend_from_slice(&self.since_ms().to_le_bytes());
        out.extend_from_slice(&(owner.len() as u16).to_le_bytes());
        out.extend_from_slice(owner);
        out.extend_from_slice(&(label.len() as u16).to_le_bytes());
        out.extend_from_slice(label);
        out
    }

    /// Decodes what `encode` wrote; any other input is refused, never trusted.
    pub fn decode(bytes: &[u8]) -> Result<Box<Lease>, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version > NEWEST_VERSION {
            return Err(DecodeError::FutureVersion(version));
        }
        if version != LEASE_VERSION && version != LABELLED_LEASE_VERSION && version != GUARD_VERSION
        {
            return Err(DecodeError::Invalid("encoding version"));
        }
        let guard = version == GUARD_VERSION;
        let labelled = version != LEASE_VERSION;
        let h = r.holding(labelled)?;
        if !r.0.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        if guard && h.owner.is_empty() {
            // A free guard: the token of its last holding, nothing else.
            if h.token > MAX_TOKEN
                || h.deadline_ms != 0
                || h.since_ms != since_of_token(h.token)
                || !h.label.is_empty()
            {
                return Err(DecodeError::Invalid("free guard"));
            }
            return Ok(Lease::free_guard(h.token));
        }
        h.check(labelled, 0)?;
        let mut lease = Lease::new(h.owner, h.token, h.deadline_ms, h.since_ms, h.label());
        if guard {
            lease.set_guard(true);
            return Ok(lease);
        }
        // One encoding per record: version 3 only where version 1 cannot say it.
        if labelled && !lease.needs_labelled_version() {
            return Err(DecodeError::Invalid(
                "encoding version (3 without a label or a start to state)",
            ));
        }
        Ok(lease)
    }
}

/// One holding as encoded (an exclusive lease, or one holder of a
/// counting or shared lease): token, deadline, (since,) owner(, label).
pub(super) struct Encoded<'b> {
    pub(super) token: u64,
    pub(super) deadline_ms: i64,
    pub(super) since_ms: i64,
    pub(super) owner: &'b [u8],
    /// Empty: no label.
    pub(super) label: &'b [u8],
}

impl Encoded<'_> {
    /// Refuses impossible fields; `after`: the token before it (tokens
    /// strictly increase in a holders record; 0 for an exclusive lease).
    pub(super) fn check(&self, labelled: bool, after: u64) -> Result<(), DecodeError> {
        if !owner_ok(self.owner) {
            return Err(DecodeError::Invalid("owner"));
        }
        if self.token == 0 || self.token > MAX_TOKEN || self.token <= after {
            return Err(DecodeError::Invalid("token"));
        }
        if self.deadline_ms <= 0 {
            return Err(DecodeError::Invalid("deadline"));
        }
        if labelled && (self.since_ms <= 0 || self.since_ms > self.deadline_ms) {
            return Err(DecodeError::Invalid("since"));
        }
        if !self.label.is_empty() && !label_ok(self.label) {
            return Err(DecodeError::Invalid("label"));
        }
        Ok(())
    }

    pub(super) fn label(&self) -> Option<&[u8]> {
        (!self.label.is_empty()).then_some(self.label)
    }
}

/// Reads the fields of an encoded record, refusing a short one.
pub(super) struct Reader<'b>(pub(super) &'b [u8]);

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A 2-byte length, then that many bytes.
    pub(super) fn bytes(&mut self) -> Result<&'b [u8], DecodeError> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    /// One holding, with its start and label in versions 3 and 4
    /// (`labelled`; else its start is what its token tells).
    pub(super) fn holding(&mut self, labelled: bool) -> Result<Encoded<'b>, DecodeError> {
        let token = self.u64()?;
        let deadline_ms = self.u64()? as i64;
        let since_ms = if labelled {
            self.u64()? as i64
        } else {
            since_of_token(token)
        };
        let owner = self.bytes()?;
        let label = if labelled { self.bytes()? } else { &[] };
        Ok(Encoded {
            token,
            deadline_ms,
            since_ms,
            owner,
            label,
        })
    }
}

impl Clone for Box<Lease> {
    fn clone(&self) -> Self {
        self.to_boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Box<Lease> {
        Lease::plain(b"me\0\xffyou", 1_812_345_678_901_234, 1_800_000_000_000)
    }
    #[test]
    fn version_1_bytes_are_exactly_as_before() {
        // The encoding of an exclusive lease, byte for byte as the first
        // release wrote it (tests/fixtures hold records written by it).
        let l = Lease::plain(b"ab", 0x0102_0304_0506_0708, 0x1112_1314_1516_1718);
        assert_eq!(
            l.encode(),
            [
                1, 8, 7, 6, 5, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 2, 0,
                b'a', b'b'
            ]
        );
    }

    /// A holding without a label that began when its token says is
    /// written as version 1, byte for byte; any other as version 3, which
    /// reads back whole.
    #[test]
    fn version_3_only_for_a_label_or_a_start_the_token_does_not_tell() {
        let now = 1_800_000_000_000i64;
        let token = now as u64 * 1024 + 5;
        let plain = Lease::new(b"ab", token, now + 10, now, None);
        assert_eq!(plain.encode()[0], LEASE_VERSION);
        assert_eq!(
            plain.encode(),
            Lease::plain(b"ab", token, now + 10).encode()
        );
        assert_eq!(Lease::decode(&plain.encode()), Ok(plain));
        for (since, label) in [
            (now, Some(b"w\0\xff".as_slice())),
            (now - 1, None),
            (now - 1, Some(b"x".as_slice())),
        ] {
            let l = Lease::new(b"ab", token, now + 10, since, label);
            let bytes = l.encode();
            assert_eq!(bytes[0], LABELLED_LEASE_VERSION);
            assert_eq!(Lease::decode(&bytes), Ok(l.clone()));
            assert_eq!(
                (l.owner(), l.label(), l.since_ms()),
                (b"ab".as_slice(), label, since)
            );
            for n in 0..bytes.len() {
                assert!(Lease::decode(&bytes[..n]).is_err(), "prefix of {n} bytes");
            }
        }
        let long = vec![b'x'; 257];
        let bad = Lease::new(b"ab", token, now + 10, now, Some(&long));
        assert_eq!(
            Lease::decode(&bad.encode()),
            Err(DecodeError::Invalid("label"))
        );
        let bad = Lease::new(b"ab", token, now + 10, now + 11, Some(b"x"));
        assert_eq!(
            Lease::decode(&bad.encode()),
            Err(DecodeError::Invalid("since"))
        );
        // Version 3 for what version 1 says is refused: one encoding each.
        let mut bytes = Lease::new(b"ab", token, now + 10, now, Some(b"x")).encode();
        let n = bytes.len();
        bytes[n - 3] = 0; // the label's length: none
        bytes.truncate(n - 1);
        assert!(matches!(
            Lease::decode(&bytes),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn liveness_and_remaining() {
        let l = sample();
        assert!(l.is_live(l.deadline_ms - 1));
        assert!(l.is_live(l.deadline_ms));
        assert!(!l.is_live(l.deadline_ms + 1));
        assert_eq!(l.remaining_ms(l.deadline_ms - 250), 250);
        assert_eq!(l.remaining_ms(l.deadline_ms + 5), 0);
        assert!(l.is_held_by(b"me\0\xffyou"));
        assert!(!l.is_held_by(b"me"));
    }

    #[test]
    fn a_lease_is_one_allocation_that_travels_as_a_thin_pointer() {
        // Without a label and begun when its token says: the owner alone
        // after the header, as before labels existed; else its start (when
        // its token does not tell it) and its label after the owner.
        let facts = [
            (0, None),
            (0, Some(b"label".as_slice())),
            (0, Some(b"host-a:pid-4242:worker-7:job-991")),
            (7, None),
            (7, Some(b"label")),
            (7, Some(b"twelve bytes")),
        ];
        for (len, (since, label)) in [1usize, 7, 8, 12, 15, 16, 18, 32, 33, 255, 256]
            .into_iter()
            .flat_map(|n| facts.map(|f| (n, f)))
        {
            let owner: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let l = Lease::new(&owner, 42, 1_800_000_000_000, since, label);
            assert_eq!(
                (l.owner(), l.token, l.deadline_ms, l.since_ms(), l.label()),
                (&owner[..], 42, 1_800_000_000_000, since, label)
            );
            assert_eq!(l.needs_labelled_version(), since != 0 || label.is_some());
            let len = len + if since != 0 { 8 } else { 0 } + label.map_or(0, <[u8]>::len);
            // The box's own layout is the one allocated (its drop frees it).
            assert_eq!(std::mem::size_of_val(&*l), Lease::layout(len).size());
            assert_eq!(std::mem::align_of_val(&*l), 8);
            assert_eq!(
                l.owner().as_ptr() as usize - (&*l as *const Lease).cast::<u8>() as usize,
                BYTES_AT
            );
            assert_eq!(l.mem_usage(), (BYTES_AT + len).next_multiple_of(8));
            let copy = l.clone();
            let p = Lease::into_thin(l);
            assert_eq!(p as usize % 8, 0);
            // SAFETY: `p` was made by into_thin just above and is reclaimed once.
            let back = unsafe { Box::from_raw(Lease::from_thin(p)) };
            assert_eq!(back, copy);
        }
    }

    /// A token changed in place keeps the start only where the start is
    /// stored, or the new token tells the same.
    #[test]
    fn the_start_stays_with_a_token_changed_in_place_only_where_it_can() {
        let now = 1_800_000_000_000i64;
        let t = now as u64 * 1024;
        let plain = Lease::new(b"o", t, now + 10, now, None);
        assert!(plain.keeps_since_with(t + 5));
        assert!(
            !plain.keeps_since_with(t + 5 * 1024),
            "a FLOOR that raised the token"
        );
        let stated = Lease::new(b"o", t, now + 10, now - 3, None);
        assert!(stated.keeps_since_with(t + 5 * 1024));
        assert_eq!(stated.since_ms(), now - 3);
    }

    #[test]
    fn a_token_too_far_ahead_of_the_clock_is_refused() {
        let now = 1_800_000_000_000;
        let day = 86_400_000;
        let mut ok = sample();
        ok.token = (now + day) as u64 * 1024;
        assert_eq!(ok.check_not_ahead(now), Ok(()));
        let mut ahead = sample();
        ahead.token = (now + 400 * day) as u64 * 1024;
        let e = ahead.check_not_ahead(now).unwrap_err();
        assert!(matches!(e, DecodeError::TooFarAhead { .. }));
        assert!(e.to_string().contains("365 days ahead"), "{e}");
        let mut capped = sample();
        capped.token = crate::lease::limits::MAX_TOKEN;
        assert!(capped.check_not_ahead(now).is_err());
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(Lease::decode(&bytes[..n]).is_err(), "prefix of {n} bytes");
        }
    }

    /// A guard is written as version 5, whole, held or free; a free
    /// guard's impossible fields are refused.
    #[test]
    fn guards_are_version_5_and_read_back_whole() {
        let now = 1_800_000_000_000i64;
        let token = now as u64 * 1024 + 5;
        let mut held = Lease::new(b"ab", token, now + 10, now, Some(b"w"));
        held.set_guard(true);
        let free = Lease::free_guard(token);
        for l in [held, free, Lease::free_guard(0)] {
            let bytes = l.encode();
            assert_eq!(bytes[0], GUARD_VERSION);
            let back = Lease::decode(&bytes).unwrap();
            assert!(back.is_guard());
            assert_eq!(back, l);
        }
        let mut plain = Lease::new(b"ab", token, now + 10, now, None);
        assert_eq!(plain.encode()[0], LEASE_VERSION);
        plain.set_guard(true);
        plain.set_guard(false);
        assert_eq!(plain.encode()[0], LEASE_VERSION, "unguarded: as before");
        // A free guard with a deadline, or a label, is refused.
        let mut bad = Lease::free_guard(token).encode();
        bad[9..17].copy_from_slice(&5i64.to_le_bytes());
        assert!(Lease::decode(&bad).is_err());
        // An owner's length never reaches the guard bit.
        let big = Lease::new(&[7; 256], token, now + 10, now, None);
        assert!(!big.is_guard() && big.owner().len() == 256);
    }
}
