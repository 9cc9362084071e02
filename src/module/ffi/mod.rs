//! The wall: every raw call into the server sits here, behind small typed
//! wrappers, and every `extern "C"` function the server calls, as a generic
//! shim (`entry.rs`). This is the only place in the binding allowed
//! `unsafe` (the crate denies it elsewhere), and it imports nothing of the
//! binding above it (`tests/layout.rs` checks both).
//!
//! - `ctx`: a call's context, its arguments, key names;
//! - `server`: the module's long-lived handles (detached context, the lease
//!   type, the clock, timers, logging, the callback table);
//! - `key`: a lease key opened for one call; `value`: the lease type's
//!   value pointer;
//! - `replicate`: effects into the replication stream and the AOF,
//!   keyspace notifications, the modified-key signal;
//! - `reply`: replies; `blocked`: blocked clients; `call`: what the module
//!   asks the server through RedisModule_Call and its key API;
//! - `waker`: the thread that times a waiter's re-check to the microsecond;
//! - `catch`: no panic crosses `extern "C"`;
//! - `entry`: the shims of every entry point, generic over the traits the
//!   binding's entry points (`src/module/entry/`) implement;
//! - `filter`: the command filter, typed (the command about to run, the
//!   `Filter` trait and its shim, its registration while it is needed);
//! - `register`: commands, configs, the INFO section, events.

pub mod blocked;
pub mod call;
pub mod catch;
pub mod ctx;
pub mod entry;
pub mod filter;
pub mod key;
pub mod register;
pub mod replicate;
pub mod reply;
pub mod server;
pub mod value;
pub mod waker;
