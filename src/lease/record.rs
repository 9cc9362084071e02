//! The record stored in a lease key, of either kind: an exclusive lease
//! (`exclusive.rs`) or a counting or shared one (`holders.rs`). The record
//! carries everything (owners, tokens, absolute deadlines): the key's Redis
//! TTL mirrors the latest deadline, but the record never depends on it, so a
//! copy made by RDB, DUMP/RESTORE, COPY or MIGRATE is complete on its own.
//! The first byte of every encoded record says which kind it is.

use super::codec::{DecodeError, MULTI_VERSION};
use super::exclusive::Lease;
use super::holders::Multi;

/// A stored record of either kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Exclusive(Box<Lease>),
    /// Boxed: the server keeps it behind one pointer, and a record moves
    /// as two words.
    Multi(Box<Multi>),
}

/// A stored record, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum RecordRef<'a> {
    Exclusive(&'a Lease),
    Multi(&'a Multi),
}

/// A stored record, borrowed to change it.
#[derive(Debug)]
pub enum RecordMut<'a> {
    Exclusive(&'a mut Lease),
    Multi(&'a mut Multi),
}

impl Record {
    pub fn as_ref(&self) -> RecordRef<'_> {
        match self {
            Record::Exclusive(l) => RecordRef::Exclusive(l),
            Record::Multi(m) => RecordRef::Multi(m),
        }
    }

    pub fn as_mut(&mut self) -> RecordMut<'_> {
        match self {
            Record::Exclusive(l) => RecordMut::Exclusive(l),
            Record::Multi(m) => RecordMut::Multi(m),
        }
    }

    /// Decodes a record of any known version (1: exclusive, 2: multi).
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        match bytes.first() {
            Some(&MULTI_VERSION) => Multi::decode(bytes).map(|m| Record::Multi(Box::new(m))),
            _ => Lease::decode(bytes).map(Record::Exclusive),
        }
    }
}

impl RecordRef<'_> {
    pub fn encode(self) -> Vec<u8> {
        match self {
            RecordRef::Exclusive(l) => l.encode(),
            RecordRef::Multi(m) => m.encode(),
        }
    }

    /// See `Lease::check_not_ahead`: the largest token counts.
    pub fn check_not_ahead(self, now_ms: i64) -> Result<(), DecodeError> {
        match self {
            RecordRef::Exclusive(l) => l.check_not_ahead(now_ms),
            RecordRef::Multi(m) => m.check_not_ahead(now_ms),
        }
    }

    /// The largest token stored (to raise the token clock).
    pub fn max_token(self) -> u64 {
        match self {
            RecordRef::Exclusive(l) => l.token,
            RecordRef::Multi(m) => m.max_token().unwrap_or(0),
        }
    }

    pub fn mem_usage(self) -> usize {
        match self {
            RecordRef::Exclusive(l) => l.mem_usage(),
            RecordRef::Multi(m) => m.mem_usage(),
        }
    }

    /// How many holders (the `expired` counter counts each).
    pub fn holders(self) -> usize {
        match self {
            RecordRef::Exclusive(_) => 1,
            RecordRef::Multi(m) => m.len(),
        }
    }

    /// When the lease ends: its deadline, the latest holder's for a multi
    /// record (0 for a record without holders, which is never stored).
    pub fn latest_deadline(self) -> i64 {
        match self {
            RecordRef::Exclusive(l) => l.deadline_ms,
            RecordRef::Multi(m) => m.latest_deadline().unwrap_or(0),
        }
    }

    pub fn to_owned(self) -> Record {
        match self {
            RecordRef::Exclusive(l) => Record::Exclusive(l.to_boxed()),
            RecordRef::Multi(m) => Record::Multi(Box::new(m.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::NEWEST_VERSION;
    use super::*;

    fn sample() -> Box<Lease> {
        Lease::new(b"me\0\xffyou", 1_812_345_678_901_234, 1_800_000_000_000)
    }
    #[test]
    fn encode_decode_round_trip() {
        let l = sample();
        assert_eq!(Lease::decode(&l.encode()), Ok(l.clone()));
        assert_eq!(Record::decode(&l.encode()), Ok(Record::Exclusive(l)));
    }

    #[test]
    fn multi_records_decode_by_their_version() {
        use super::super::holders::Holder;
        use super::super::mode::MultiMode;
        let m = Multi::with(
            MultiMode::Limit(4),
            Holder {
                owner: b"w".as_slice().into(),
                token: 77,
                deadline_ms: 1_800_000_000_000,
            },
        );
        let r = Record::Multi(Box::new(m));
        assert_eq!(Record::decode(&r.as_ref().encode()), Ok(r.clone()));
        assert_eq!(r.as_ref().max_token(), 77);
        assert_eq!(r.as_ref().holders(), 1);
    }

    #[test]
    fn future_version_trailing_bytes_and_bad_fields_are_refused() {
        let mut bytes = sample().encode();
        bytes[0] = NEWEST_VERSION + 1;
        assert_eq!(
            Lease::decode(&bytes),
            Err(DecodeError::FutureVersion(NEWEST_VERSION + 1))
        );
        assert_eq!(
            Record::decode(&bytes),
            Err(DecodeError::FutureVersion(NEWEST_VERSION + 1))
        );
        bytes[0] = super::super::codec::MULTI_VERSION;
        assert!(Lease::decode(&bytes).is_err(), "not an exclusive record");
        assert!(Record::decode(&bytes).is_err(), "not a multi record");
        let mut bytes = sample().encode();
        bytes.push(0);
        assert_eq!(Lease::decode(&bytes), Err(DecodeError::TrailingBytes));
        let mut bad_token = sample();
        bad_token.token = 0;
        assert!(Lease::decode(&bad_token.encode()).is_err());
        let empty_owner = Lease::new(b"", sample().token, sample().deadline_ms);
        assert!(Lease::decode(&empty_owner.encode()).is_err());
        let mut bad_deadline = sample();
        bad_deadline.deadline_ms = -1;
        assert!(Lease::decode(&bad_deadline.encode()).is_err());
    }
}
