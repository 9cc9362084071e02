//! The lease logic in plain Rust: no FFI, no Redis types. Everything here is
//! unit-tested on its own; `crate::module` binds it to the server.

pub mod args;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod decide;
pub mod error;
pub mod fence;
pub mod grace;
pub mod multi;
pub mod record;
pub mod versions;
pub mod waitq;

#[cfg(test)]
mod model;

pub use error::LeaseError;
pub use multi::{Holder, Mode, Multi, MultiMode};
pub use record::{Lease, Record, RecordMut, RecordRef};
