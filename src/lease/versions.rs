//! What this build speaks: the version of its stored records (RDB, DUMP,
//! RESTORE, MIGRATE) and of its effects (the internal commands replicas
//! and the AOF apply), and the module version that goes with each pair.
//!
//! The rule: the module's version (Cargo.toml, shown by `MODULE LIST` and
//! `INFO lease`) changes whenever the record format or the effect commands
//! change. `HISTORY` records every pair; its unit test fails when a pair
//! changes without a new row for a new version.

use super::codec::NEWEST_VERSION;

/// The effect vocabulary this build writes and applies:
/// 1: `LEASE.APPLY`, `LEASE.CLOCK`, `LEASE.RELEASE`, `DEL`;
/// 2: + `LEASE.HOLD`, `LEASE.DROP`, `PEXPIREAT` (counting and shared leases);
/// 3: + `LEASE.PRUNE` (ended holders in batches), `LEASE.VERSION`;
/// 4: + `SINCE` and `LABEL` on `LEASE.APPLY` and `LEASE.HOLD` (design.md
/// S11);
/// 5: + `LEASE.GUARD` and `LEASE.UNGUARD` (guarded keys, design.md S12).
pub const EFFECTS: u32 = 5;
/// The newest record version this build writes and reads.
pub const RECORDS: u32 = NEWEST_VERSION as u32;

/// (module version, effects, records), oldest first. The builds of 0.1.0
/// with counting and shared leases spoke effects 2 and records 2 while still
/// saying 0.1.0; they are 0.2.0 here.
pub const HISTORY: [(&str, u32, u32); 5] = [
    ("0.1.0", 1, 1),
    ("0.2.0", 2, 2),
    ("0.3.0", 3, 2),
    ("0.4.0", 4, 4),
    ("0.5.0", 5, 5),
];

/// Can this build apply effects of version `effects` and read records of
/// version `records`?
pub fn understands(effects: u32, records: u32) -> bool {
    effects <= EFFECTS && records <= RECORDS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(v: &str) -> (u32, u32, u32) {
        let p: Vec<u32> = v.split('.').map(|x| x.parse().unwrap()).collect();
        (p[0], p[1], p[2])
    }

    #[test]
    fn this_build_is_the_last_row_of_the_history() {
        let last = HISTORY[HISTORY.len() - 1];
        assert_eq!(
            last,
            (env!("CARGO_PKG_VERSION"), EFFECTS, RECORDS),
            "the record format or the effects changed: add a row with a new version (and set it in Cargo.toml)"
        );
    }

    #[test]
    fn versions_and_vocabularies_only_grow() {
        for w in HISTORY.windows(2) {
            let ((a, ea, ra), (b, eb, rb)) = (w[0], w[1]);
            assert!(number(a) < number(b), "{a} then {b}");
            assert!(ea <= eb && ra <= rb, "{a} then {b}");
            assert!(
                (ea, ra) != (eb, rb),
                "{b} changes nothing: no new row needed"
            );
        }
    }

    #[test]
    fn newer_effects_or_records_are_not_understood() {
        assert!(understands(EFFECTS, RECORDS));
        assert!(understands(1, 1));
        assert!(!understands(EFFECTS + 1, RECORDS));
        assert!(!understands(EFFECTS, RECORDS + 1));
    }
}
