//! Test harness: starts real redis-server / valkey-server processes on free
//! ports with the module loaded, and hands out real client connections.
//! No mock of the server anywhere. Every test file reaches all of it with
//! `mod common; use common::*;`; the parts live by concern:
//!
//! - `server`: server binaries, `Opts`, `Server` start/stop/restart, ports,
//!   data directories, health, signals (`Frozen`);
//! - `clock`: `ClockShift`, a server's wall clock stepped while it runs;
//! - `client`: connections, `RawConn`, commands and reply helpers, `INFO`,
//!   `wait_until`;
//! - `lease`: lease calls and replies (`acquire`, `token_of`, `holders`, ...);
//! - `waiters`: blocked callers on their own threads (`spawn_waiter`,
//!   `Answer`, `got_token`, `spawn_call`, ...);
//! - `payload`: DUMP payloads, edited or built;
//! - `replication`: `replica_of` and `Link`, a network link that can be cut;
//! - `cluster`: `Cluster` and `Master`;
//! - `sentinel`: `Sentinel` processes and `quick_conn`;
//! - `matrix`: the `full_suite!` and `every_server!` macros;
//! - `grace`: helpers of the grace-period tests (`use common::grace::*;`);
//! - `stats`: the module's own table of `INFO lease` counters
//!   (`src/lease/stats.rs`, included as it is: `stats::NAMES`).
#![allow(dead_code)]

pub use redis::Value;

mod client;
mod clock;
mod cluster;
mod lease;
mod matrix;
mod payload;
mod replication;
mod sentinel;
mod server;
mod waiters;

/// The module's table of `INFO lease` counters, the very file it is built
/// from (it uses nothing but `std`).
#[path = "../../src/lease/stats.rs"]
pub mod stats;

// Each test file uses only some of the harness.
#[allow(unused_imports)]
pub use {
    client::*, clock::*, cluster::*, lease::*, payload::*, replication::*, sentinel::*, server::*,
    waiters::*,
};

pub mod grace;
