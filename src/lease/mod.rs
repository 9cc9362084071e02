//! The lease logic in plain Rust: no FFI, no server types. Everything here
//! is unit-tested on its own; `crate::module` binds it to the server.
//!
//! Dependencies run one way, from the leaves up (no file imports one above
//! it): `limits`, `mode`, `codec` -> `error` -> `args`, `clock`, `guard`
//! (guarded keys, design.md S12: the hash tag, the guards by database and
//! tag, the decision on a command) -> the records (`exclusive`, `holders`,
//! then `record`) -> `effect` (the replication language) and `decide` ->
//! `waitq` -> `ops` (what each command does, as values, and the words
//! every decision answers in: `Outcome`, `Then`, `Recheck`, `Snapshot`,
//! `Env`) -> `multikey` (the multi-key commands, in `ops`' words); beside
//! them `config`, `grace`, `versions`, `fence`, `cluster`, `keyspec`
//! (which arguments a command writes, for guarded keys), and the
//! counters and distributions of `INFO lease` (`stats`, `distribution`).
//! In tests only: `model` (the randomized model test) and `testkit` (what
//! drives `ops` there).

pub mod args;
pub mod clock;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod decide;
pub mod distribution;
pub mod effect;
pub mod error;
// The one allocation of an exclusive lease (a thin pointer to an unsized
// struct) is the core's only `unsafe`.
#[allow(unsafe_code)]
pub mod exclusive;
pub mod fence;
pub mod grace;
pub mod guard;
pub mod holders;
pub mod keyspec;
pub mod limits;
pub mod mode;
pub mod multikey;
pub mod ops;
pub mod record;
pub mod stats;
pub mod versions;
pub mod waitq;

#[cfg(test)]
mod model;
#[cfg(test)]
mod testkit;

pub use error::LeaseError;
pub use exclusive::Lease;
pub use holders::{Holder, Holders};
pub use mode::{HoldersMode, Mode};
pub use record::{Record, RecordMut, RecordRef};

// The counters' table is included as it is by the integration tests
// (tests/common), so its unit test lives here.
#[cfg(test)]
mod stats_tests {
    use super::stats::*;

    #[test]
    fn every_counter_is_named_once_and_shown_in_order() {
        let s = Stats::new();
        s.expired.add(3);
        let fields = s.fields();
        assert_eq!(fields.iter().map(|f| f.0).collect::<Vec<_>>(), NAMES);
        assert_eq!(
            fields.iter().find(|f| f.0 == "expired").map(|f| f.1),
            Some(3)
        );
        let mut names = NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), NAMES.len());
    }
}
