//! Decoding a stored lease: the bytes rdb_load (and so RESTORE, MIGRATE and
//! a diskless replica's sync) hands to the type. Any input is refused or
//! decoded; what decodes is a valid record that re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lease::lease::Lease;
use redis_lease::lease::clock::MAX_TOKEN;

fuzz_target!(|data: &[u8]| {
    if let Ok(lease) = Lease::decode(data) {
        assert!(lease.token >= 1 && lease.token <= MAX_TOKEN);
        assert!(!lease.owner.is_empty() && lease.owner.len() <= 256);
        assert!(lease.deadline_ms > 0);
        assert_eq!(lease.encode(), data, "decoding is canonical");
    }
});
