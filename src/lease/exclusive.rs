//! An exclusive lease: the record of a key held by one owner, kept in one
//! allocation (token, deadline and the owner inline), and its byte encoding
//! (record version 1, unchanged since the first release).

use super::clock::max_acceptable;
use super::codec::{DecodeError, LEASE_VERSION, NEWEST_VERSION};
use super::limits::{MAX_TOKEN, owner_ok};

/// Fixed part of an encoded record: version, token, deadline, owner length.
const HEADER_LEN: usize = 1 + 8 + 8 + 2;

/// One held lease, kept in one allocation: token, deadline and the owner's
/// bytes inline (`Lease::new` makes a `Box<Lease>`). A lease key's value is
/// this box, so a lease costs the server one allocation of the module's
/// besides its own wrapper (18 + owner bytes, rounded up to 8).
#[derive(Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Lease {
    /// The fencing token issued when the lease was acquired.
    pub token: u64,
    /// Absolute expiry, unix time in milliseconds.
    pub deadline_ms: i64,
    /// `owner.len()`, kept inline so that the box can travel as a thin
    /// pointer (`into_thin`, `from_thin`).
    owner_len: u16,
    /// The holder's opaque id (1..=256 bytes, binary-safe).
    pub owner: [u8],
}

/// Where `owner_len` is in a `Lease` (`repr(C)`: after two 8-byte fields),
/// and where the owner's bytes start (after the 2-byte length).
const OWNER_LEN_AT: usize = 8 + 8;
const OWNER_AT: usize = OWNER_LEN_AT + 2;

impl Lease {
    /// A new lease, in one allocation.
    ///
    /// # Panics
    /// On an owner longer than 65535 bytes (owners are at most 256).
    pub fn new(owner: &[u8], token: u64, deadline_ms: i64) -> Box<Lease> {
        let owner_len = u16::try_from(owner.len()).expect("an owner of at most 65535 bytes");
        let layout = Self::layout(owner.len());
        // SAFETY: `layout` has a non-zero size (at least OWNER_AT). Every
        // field is written before the box exists; the pointer's metadata
        // (the slice length) is the owner's length, so the box's layout
        // (`Layout::for_value`: OWNER_AT + len rounded up to 8, align 8) is
        // the one allocated here, and dropping the box frees it.
        unsafe {
            let p = std::alloc::alloc(layout);
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            let fat = std::ptr::slice_from_raw_parts_mut(p, owner.len()) as *mut Lease;
            std::ptr::addr_of_mut!((*fat).token).write(token);
            std::ptr::addr_of_mut!((*fat).deadline_ms).write(deadline_ms);
            std::ptr::addr_of_mut!((*fat).owner_len).write(owner_len);
            std::ptr::addr_of_mut!((*fat).owner)
                .cast::<u8>()
                .copy_from_nonoverlapping(owner.as_ptr(), owner.len());
            Box::from_raw(fat)
        }
    }

    fn layout(owner_len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align((OWNER_AT + owner_len).next_multiple_of(8), 8)
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
        // `owner_len` field is at OWNER_LEN_AT (2-byte aligned: the
        // allocation is 8-byte aligned).
        let len = unsafe { p.add(OWNER_LEN_AT).cast::<u16>().read() };
        std::ptr::slice_from_raw_parts_mut(p, len as usize) as *mut Lease
    }

    /// A copy in a new allocation.
    pub fn to_boxed(&self) -> Box<Lease> {
        Lease::new(&self.owner, self.token, self.deadline_ms)
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
    pub fn is_held_by(&self, owner: &[u8]) -> bool {
        self.owner == *owner
    }

    /// Bytes of memory this record takes, for MEMORY USAGE.
    pub fn mem_usage(&self) -> usize {
        Self::layout(self.owner.len()).size()
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

    /// The versioned byte encoding used by RDB (and so DUMP/RESTORE, MIGRATE).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.owner.len());
        out.push(LEASE_VERSION);
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.deadline_ms.to_le_bytes());
        out.extend_from_slice(&(self.owner.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.owner);
        out
    }

    /// Decodes what `encode` wrote; any other input is refused, never trusted.
    pub fn decode(bytes: &[u8]) -> Result<Box<Lease>, DecodeError> {
        let (&version, rest) = bytes.split_first().ok_or(DecodeError::Truncated)?;
        if version > NEWEST_VERSION {
            return Err(DecodeError::FutureVersion(version));
        }
        if version != LEASE_VERSION {
            return Err(DecodeError::Invalid("encoding version"));
        }
        if rest.len() < HEADER_LEN - 1 {
            return Err(DecodeError::Truncated);
        }
        let token = u64::from_le_bytes(rest[0..8].try_into().expect("8 bytes"));
        let deadline_ms = i64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        let owner_len = u16::from_le_bytes(rest[16..18].try_into().expect("2 bytes")) as usize;
        let owner = &rest[18..];
        if owner.len() < owner_len {
            return Err(DecodeError::Truncated);
        }
        if owner.len() > owner_len {
            return Err(DecodeError::TrailingBytes);
        }
        if !owner_ok(owner) {
            return Err(DecodeError::Invalid("owner"));
        }
        if token == 0 || token > MAX_TOKEN {
            return Err(DecodeError::Invalid("token"));
        }
        if deadline_ms <= 0 {
            return Err(DecodeError::Invalid("deadline"));
        }
        Ok(Lease::new(owner, token, deadline_ms))
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
        Lease::new(b"me\0\xffyou", 1_812_345_678_901_234, 1_800_000_000_000)
    }
    #[test]
    fn version_1_bytes_are_exactly_as_before() {
        // The encoding of an exclusive lease, byte for byte as the first
        // release wrote it (tests/fixtures hold records written by it).
        let l = Lease::new(b"ab", 0x0102_0304_0506_0708, 0x1112_1314_1516_1718);
        assert_eq!(
            l.encode(),
            [
                1, 8, 7, 6, 5, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 2, 0,
                b'a', b'b'
            ]
        );
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
        for len in [1usize, 7, 18, 32, 255, 256] {
            let owner: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let l = Lease::new(&owner, 42, 1_800_000_000_000);
            assert_eq!(
                (&l.owner[..], l.token, l.deadline_ms),
                (&owner[..], 42, 1_800_000_000_000)
            );
            // The box's own layout is the one allocated (its drop frees it).
            assert_eq!(std::mem::size_of_val(&*l), Lease::layout(len).size());
            assert_eq!(std::mem::align_of_val(&*l), 8);
            assert_eq!(
                l.owner.as_ptr() as usize - (&*l as *const Lease).cast::<u8>() as usize,
                OWNER_AT
            );
            assert_eq!(l.mem_usage(), (OWNER_AT + len).next_multiple_of(8));
            let copy = l.clone();
            let p = Lease::into_thin(l);
            assert_eq!(p as usize % 8, 0);
            // SAFETY: `p` was made by into_thin just above and is reclaimed once.
            let back = unsafe { Box::from_raw(Lease::from_thin(p)) };
            assert_eq!(back, copy);
        }
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
}
