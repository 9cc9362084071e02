//! The record stored in a lease key, of either kind: an exclusive lease
//! (`exclusive.rs`) or a counting or shared one (`holders.rs`). The record
//! carries everything (owners, tokens, absolute deadlines): the key's Redis
//! TTL mirrors the latest deadline, but the record never depends on it, so a
//! copy made by RDB, DUMP/RESTORE, COPY or MIGRATE is complete on its own.
//! The first byte of every encoded record says which kind it is.

use super::codec::{DecodeError, HOLDERS_VERSION, LABELLED_HOLDERS_VERSION};
use super::exclusive::Lease;
use super::holders::Holders;

/// A stored record of either kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Exclusive(Box<Lease>),
    /// Boxed: the server keeps it behind one pointer, and a record moves
    /// as two words.
    Holders(Box<Holders>),
}

/// A stored record, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum RecordRef<'a> {
    Exclusive(&'a Lease),
    Holders(&'a Holders),
}

/// A stored record, borrowed to change it.
#[derive(Debug)]
pub enum RecordMut<'a> {
    Exclusive(&'a mut Lease),
    Holders(&'a mut Holders),
}

impl Record {
    pub fn as_ref(&self) -> RecordRef<'_> {
        match self {
            Record::Exclusive(l) => RecordRef::Exclusive(l),
            Record::Holders(m) => RecordRef::Holders(m),
        }
    }

    pub fn as_mut(&mut self) -> RecordMut<'_> {
        match self {
            Record::Exclusive(l) => RecordMut::Exclusive(l),
            Record::Holders(m) => RecordMut::Holders(m),
        }
    }

    /// Decodes a record of any known version (1, 3 and 5: exclusive, 2
    /// and 4: holders).
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        match bytes.first() {
            Some(&HOLDERS_VERSION | &LABELLED_HOLDERS_VERSION) => {
                Holders::decode(bytes).map(|m| Record::Holders(Box::new(m)))
            }
            _ => Lease::decode(bytes).map(Record::Exclusive),
        }
    }
}

impl RecordRef<'_> {
    pub fn encode(self) -> Vec<u8> {
        match self {
            RecordRef::Exclusive(l) => l.encode(),
            RecordRef::Holders(m) => m.encode(),
        }
    }

    /// See `Lease::check_not_ahead`: the largest token counts.
    pub fn check_not_ahead(self, now_ms: i64) -> Result<(), DecodeError> {
        match self {
            RecordRef::Exclusive(l) => l.check_not_ahead(now_ms),
            RecordRef::Holders(m) => m.check_not_ahead(now_ms),
        }
    }

    /// The largest token stored (to raise the token clock).
    pub fn max_token(self) -> u64 {
        match self {
            RecordRef::Exclusive(l) => l.token,
            RecordRef::Holders(m) => m.max_token().unwrap_or(0),
        }
    }

    pub fn mem_usage(self) -> usize {
        match self {
            RecordRef::Exclusive(l) => l.mem_usage(),
            RecordRef::Holders(m) => m.mem_usage(),
        }
    }

    /// Is this a guard key's record (design.md S12)?
    pub fn is_guard(self) -> bool {
        matches!(self, RecordRef::Exclusive(l) if l.is_guard())
    }

    /// How many holders (the `expired` counter counts each).
    pub fn holders(self) -> usize {
        match self {
            RecordRef::Exclusive(l) => usize::from(!l.is_free()),
            RecordRef::Holders(m) => m.len(),
        }
    }

    /// When the lease ends: its deadline, the latest holder's for a holders
    /// record (0 for a record without holders, which is never stored).
    pub fn latest_deadline(self) -> i64 {
        match self {
            RecordRef::Exclusive(l) => l.deadline_ms,
            RecordRef::Holders(m) => m.latest_deadline().unwrap_or(0),
        }
    }

    pub fn to_owned(self) -> Record {
        match self {
            RecordRef::Exclusive(l) => Record::Exclusive(l.to_boxed()),
            RecordRef::Holders(m) => Record::Holders(Box::new(m.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::NEWEST_VERSION;
    use super::*;

    fn sample() -> Box<Lease> {
        Lease::plain(b"me\0\xffyou", 1_812_345_678_901_234, 1_800_000_000_000)
    }
    #[test]
    fn encode_decode_round_trip() {
        let l = sample();
        assert_eq!(Lease::decode(&l.encode()), Ok(l.clone()));
        assert_eq!(Record::decode(&l.encode()), Ok(Record::Exclusive(l)));
    }

    #[test]
    fn holders_records_decode_by_their_version() {
        use super::super::holders::Holder;
        use super::super::mode::HoldersMode;
        let m = Holders::with(
            HoldersMode::Limit(4),
            Holder {
                owner: b"w".as_slice().into(),
                token: 77,
                deadline_ms: 1_800_000_000_000,
                since_ms: crate::lease::limits::since_of_token(77),
                label: None,
            },
        );
        let r = Record::Holders(Box::new(m));
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
        bytes[0] = super::super::codec::HOLDERS_VERSION;
        assert!(Lease::decode(&bytes).is_err(), "not an exclusive record");
        assert!(Record::decode(&bytes).is_err(), "not a holders record");
        let mut bytes = sample().encode();
        bytes.push(0);
        assert_eq!(Lease::decode(&bytes), Err(DecodeError::TrailingBytes));
        let mut bad_token = sample();
        bad_token.token = 0;
        assert!(Lease::decode(&bad_token.encode()).is_err());
        let empty_owner = Lease::plain(b"", sample().token, sample().deadline_ms);
        assert!(Lease::decode(&empty_owner.encode()).is_err());
        let mut bad_deadline = sample();
        bad_deadline.deadline_ms = -1;
        assert!(Lease::decode(&bad_deadline.encode()).is_err());
    }
}
