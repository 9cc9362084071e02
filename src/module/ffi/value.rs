//! The lease type's value pointer: the one place that knows how a stored
//! record is handed to the server and read back. Every access to a lease
//! key's value (key.rs) and every type method (entry.rs)
//! goes through these functions.
//!
//! A value is one of two boxes: a `Box<Lease>` (an exclusive lease: one
//! allocation with the owner inline, passed as a thin pointer, see
//! `Lease::into_thin`) or a `Box<Holders>` (`LIMIT n` or `SHARED`). Which one
//! is told by the pointer's low bit: both types are 8-byte aligned, so a
//! box's address has its low three bits clear, and a `Holders` is stored with
//! bit 0 set.
//! The server never dereferences a module value: it keeps the pointer and
//! hands it back to the type's callbacks (rdb_save, aof_rewrite, free,
//! copy, mem_usage, digest, unlink, free_effort; no defrag callback is
//! registered, so active defrag moves only the server's own wrapper).

use std::os::raw::c_void;

use crate::lease::{Holders, Lease, Record, RecordMut, RecordRef};

/// Bit 0 of the value pointer: set for a `Holders`.
const HOLDERS_TAG: usize = 1;

// Both boxes leave the tag bit free.
const _: () = assert!(std::mem::align_of::<u64>() > HOLDERS_TAG); // a Lease's first field
const _: () = assert!(std::mem::align_of::<Holders>() > HOLDERS_TAG);

/// An exclusive lease as a value pointer (the server owns it from
/// RedisModule_ModuleTypeSetValue or the load callback's return on).
pub fn lease_into_raw(lease: Box<Lease>) -> *mut c_void {
    Lease::into_thin(lease).cast()
}

/// A holders record as a value pointer, tagged.
pub fn holders_into_raw(holders: Box<Holders>) -> *mut c_void {
    let p: *mut Holders = Box::into_raw(holders);
    p.map_addr(|a| a | HOLDERS_TAG).cast()
}

/// A record of either kind as a value pointer.
pub fn into_raw(record: Record) -> *mut c_void {
    match record {
        Record::Exclusive(l) => lease_into_raw(l),
        Record::Holders(m) => holders_into_raw(m),
    }
}

fn is_holders(value: *const c_void) -> bool {
    value.addr() & HOLDERS_TAG != 0
}

/// Reads a stored record.
///
/// # Safety
/// `value` must be a pointer made by this module's `*_into_raw` that the
/// server still holds (not freed), used only while nothing else changes it
/// (the main thread, inside the callback or command that got it).
pub unsafe fn record_ref<'a>(value: *const c_void) -> RecordRef<'a> {
    // SAFETY: by the contract above, `value` is a live Box<Lease>, or a
    // live Box<Holders> with bit 0 set; clearing the bit gives the box back.
    unsafe {
        if is_holders(value) {
            RecordRef::Holders(&*value.map_addr(|a| a & !HOLDERS_TAG).cast::<Holders>())
        } else {
            RecordRef::Exclusive(&*Lease::from_thin(value.cast_mut().cast()))
        }
    }
}

/// A stored record, to change it in place.
///
/// # Safety
/// As `record_ref`, and no other reference to the record may be alive.
pub unsafe fn record_mut<'a>(value: *mut c_void) -> RecordMut<'a> {
    // SAFETY: see `record_ref`; exclusive access by the contract.
    unsafe {
        if is_holders(value) {
            RecordMut::Holders(&mut *value.map_addr(|a| a & !HOLDERS_TAG).cast::<Holders>())
        } else {
            RecordMut::Exclusive(&mut *Lease::from_thin(value.cast()))
        }
    }
}

/// Frees a value the server gives back (the type's free callback), or one
/// it refused to take.
///
/// # Safety
/// `value` must be a pointer made by `*_into_raw` that nobody else frees
/// or uses afterwards.
pub unsafe fn drop_raw(value: *mut c_void) {
    // SAFETY: the box is reclaimed once, by the contract above.
    unsafe {
        if is_holders(value) {
            drop(Box::from_raw(
                value.map_addr(|a| a & !HOLDERS_TAG).cast::<Holders>(),
            ));
        } else {
            drop(Box::from_raw(Lease::from_thin(value.cast())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Holder, HoldersMode};

    #[test]
    fn both_kinds_round_trip_through_a_tagged_pointer() {
        let l = Lease::plain(b"x", 3, 9);
        let m = Holders::with(
            HoldersMode::Shared,
            Holder {
                owner: b"y".as_slice().into(),
                token: 4,
                deadline_ms: 9,
                since_ms: 1,
                label: Some(b"z".as_slice().into()),
            },
        );
        let (pl, pm) = (
            lease_into_raw(l.clone()),
            holders_into_raw(Box::new(m.clone())),
        );
        assert!(!is_holders(pl) && is_holders(pm));
        // SAFETY: both were just made here and are freed once below.
        unsafe {
            assert!(matches!(record_ref(pl), RecordRef::Exclusive(x) if *x == *l));
            assert!(matches!(record_ref(pm), RecordRef::Holders(x) if *x == m));
            if let RecordMut::Holders(x) = record_mut(pm) {
                x.set_deadline(b"y", 10);
            }
            assert!(
                matches!(record_ref(pm), RecordRef::Holders(x) if x.latest_deadline() == Some(10))
            );
            drop_raw(pl);
            drop_raw(pm);
        }
    }
}
