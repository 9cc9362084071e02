//! The lease type (`leasetype`): what loading, the AOF rewrite, the digest,
//! unlinks and the aux data (the token clock) do with its records.

use std::os::raw::c_int;

use redis_module::native_types::RedisType;

use crate::lease::effect::{self, Digits, Effect};
use crate::lease::{Record, RecordRef};

use super::super::datatype::{self, AUX_ENCVER, ENCVER, Source, TYPE_NAME};
use super::super::ffi::ctx::Str;
use super::super::ffi::entry::{Digest, LeaseType, LoadFrom, lease_type};
use super::super::ffi::replicate::{self, AofIo};
use super::super::ffi::server::now_ms;
use super::super::{guards, tokens};

/// The type `redis_module!` creates at load.
pub static LEASE_TYPE: RedisType = lease_type::<Methods>(TYPE_NAME);

pub struct Methods;

impl LeaseType for Methods {
    const ENCVER: c_int = ENCVER;
    const AUX_ENCVER: c_int = AUX_ENCVER;

    fn rdb_load(encver: c_int, buf: Option<&[u8]>, from: LoadFrom<'_>) -> Option<Record> {
        let (source, key) = match from {
            LoadFrom::Load(key) => (Source::Load, key),
            LoadFrom::Restore(key) => (Source::Restore, key),
        };
        let record = datatype::loaded(encver, buf, source)?;
        if let Some((db, name)) = key
            && !guards::arrived(db, name, record.as_ref(), source == Source::Load)
        {
            return None;
        }
        if let (Source::Restore, Some((db, name))) = (source, key) {
            datatype::restored(db, name);
        }
        Some(record)
    }

    /// The effects that rebuild the record: one LEASE.APPLY, or one
    /// LEASE.HOLD per live holder. A Valkey slot migration's snapshot (an
    /// AOF-formatted rewrite of the slot) starts with the token clock.
    fn aof_rewrite(io: AofIo, key: Str, record: RecordRef<'_>) {
        if let Some(last) = tokens::clock_for_snapshot() {
            replicate::emit_aof_keyless(io, effect::CLOCK, last.to_string().as_bytes());
        }
        for effect in Effect::of_record(record, now_ms()) {
            let mut digits = Digits::default();
            replicate::emit_aof(
                io,
                effect.command(),
                key,
                effect.args(&mut digits).as_slice(),
            );
        }
    }

    /// What the codec writes (`RecordRef::encode`, the bytes an RDB
    /// holds): every field of the record, its guard flag included, so that
    /// a replica that lost any of it digests apart from its master.
    fn digest(d: &mut Digest, record: RecordRef<'_>) {
        d.add_bytes(&record.encode());
        d.end_sequence();
    }

    fn unlinked(db: i32, key: &[u8], record: RecordRef<'_>, quiet: bool, replaced: bool) {
        if !replaced {
            guards::unlinked(db, key, record, quiet);
        }
        if !quiet {
            datatype::unlinked(db, key, record);
        }
    }

    /// A client's release deletes its key quietly: nothing to note unless
    /// the key guards (an UNGUARD deletes a free guard quietly).
    fn notices_unlink(record: RecordRef<'_>, quiet: bool) -> bool {
        !quiet || record.is_guard()
    }

    fn copied(db: i32, key: &[u8], record: RecordRef<'_>) -> bool {
        guards::arrived(db, key, record, false)
    }

    fn aux_save() -> u64 {
        tokens::last()
    }

    fn aux_load(value: u64) {
        tokens::observe(value);
    }
}
