//! The entry points: what the module does when the server calls it, cut by
//! job. The server-facing `extern "C"` shims are in `ffi/entry.rs`, generic
//! over the traits implemented here, so this folder holds no `unsafe` and
//! makes no raw call.
//!
//! - `table`: the command table (names, flags, keys, COMMAND DOCS);
//! - `load`: the load sequence;
//! - `shims`: each command's entry (its handler, its redacted owner, the
//!   keys a getkeys-api command reports);
//! - `type_methods`: the lease type's loading, AOF rewrite, digest, unlinks
//!   and aux data;
//! - `events`: server and keyspace events, the command filter;
//! - `timers`: the module's timers, blocked clients and the waker's
//!   wake-ups;
//! - `configs`: `CONFIG GET/SET lease.*` and `INFO lease`.

pub mod configs;
pub mod events;
pub mod load;
pub mod shims;
pub mod table;
pub mod timers;
pub mod type_methods;
