//! Decoding a stored lease record of either version: the bytes rdb_load
//! (and so RESTORE, MIGRATE and a diskless replica's sync) hands to the
//! type. Version 1 is an exclusive lease, version 2 a counting or shared
//! one. Any input is refused or decoded; what decodes is a valid record
//! that re-encodes to the same bytes, and whose holder indexes agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lease::lease::Record;
use redis_lease::lease::limits::MAX_TOKEN;

fuzz_target!(|data: &[u8]| {
    match Record::decode(data) {
        Ok(Record::Exclusive(lease)) => {
            assert!(lease.token >= 1 && lease.token <= MAX_TOKEN);
            assert!(!lease.owner().is_empty() && lease.owner().len() <= 256);
            assert!(lease.label().is_none_or(|l| l.len() <= 256));
            assert!(lease.deadline_ms > 0);
            assert_eq!(lease.encode(), data, "decoding is canonical");
        }
        Ok(Record::Holders(m)) => {
            assert!(!m.is_empty(), "a stored record has a holder");
            assert!(
                m.mode().has_room(m.len() - 1),
                "no more holders than the limit"
            );
            let mut last = 0;
            for h in m.holders() {
                assert!(
                    h.token > last && h.token <= MAX_TOKEN,
                    "tokens strictly increase"
                );
                last = h.token;
                assert!(!h.owner.is_empty() && h.owner.len() <= 256);
                assert!(h.deadline_ms > 0);
                assert_eq!(m.holder(&h.owner).map(|x| x.token), Some(h.token));
                assert_eq!(m.by_token(h.token).map(|x| &x.owner), Some(&h.owner));
            }
            assert_eq!(m.max_token(), Some(last));
            assert_eq!(m.encode(), data, "decoding is canonical");
            // Every holder leaves by its deadline, earliest first.
            let mut rest = m.clone();
            let latest = m.latest_deadline().unwrap();
            let ended = rest.take_ended(latest.saturating_add(1), usize::MAX);
            assert_eq!(ended.len(), m.len());
            assert!(
                ended
                    .windows(2)
                    .all(|w| w[0].deadline_ms <= w[1].deadline_ms)
            );
            assert!(rest.is_empty());
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
