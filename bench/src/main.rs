//! The benchmark client of `make bench`, run by bench/run.sh against the
//! server it started:
//!
//!     handoff <port> <server-pid>   part B: blocking hand-off (B1 to B4)
//!     handoff cycles <port>         part C: full lock cycles per second
//!     handoff helpers <port>        part F: the Rust helpers holding many leases
//!     handoff quorum <port>...      part G: quorum lock cycles (bench/quorum.sh)
//!     handoff multikey <port>       part H: multi-key lease cycles (bench/multikey.sh)
//!     handoff rcycles <port>        part I: the Rust helpers' cycle against the raw commands
//!
//! Prints Markdown to stdout. Never fails on a slow result: it measures, it
//! does not judge. bench/README.md says what each section measures; its
//! "Knobs" section lists the environment variables (src/knobs.rs reads them).
//!
//! The modules: one per section (handoff: B1 and B2, herd: B3, mass: B4 with
//! crowd, its sockets; cycles: C; helpers: F; quorum: G; multikey: H), and
//! what they share: resp (the RESP client), server (readings of the
//! server), stats, clock, knobs, kv (the HANDOFF_KV lines), scripts (the
//! recipes' Lua).

mod clock;
mod crowd;
mod cycles;
mod handoff;
mod helpers;
mod herd;
mod knobs;
mod kv;
mod mass;
mod multikey;
mod quorum;
mod rcycles;
mod resp;
mod scripts;
mod server;
mod stats;

use std::process::ExitCode;
use std::str::FromStr;

use crate::knobs::Knobs;
use crate::kv::KvFile;
use crate::resp::Res;
use crate::server::ServerCpu;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = match args.as_slice() {
        [mode, port] if mode == "cycles" => part_c(port),
        [mode, port] if mode == "helpers" => part_e(port),
        [mode, ports @ ..] if mode == "quorum" && !ports.is_empty() => part_g(ports),
        [mode, port] if mode == "multikey" => part_h(port),
        [mode, port] if mode == "rcycles" => part_i(port),
        [port, pid] => part_b(port, pid),
        _ => {
            eprintln!(
                "usage: handoff <port> <server-pid> | handoff cycles <port> | handoff helpers <port> | handoff quorum <port>... | handoff multikey <port> | handoff rcycles <port>\n\n\
                 Knobs (environment variables, [default]):\n{}",
                knobs::describe()
            );
            return ExitCode::from(2);
        }
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("handoff: {e}");
            ExitCode::FAILURE
        }
    }
}

fn arg<T: FromStr>(what: &str, value: &str) -> Res<T>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e| format!("{what} {value:?}: {e}").into())
}

/// `handoff cycles <port>`.
fn part_c(port: &str) -> Res<()> {
    let port = arg("port", port)?;
    let knobs = Knobs::from_env()?;
    cycles::section(port, &knobs, &KvFile::new(knobs.handoff_kv.as_deref()))
}

/// `handoff helpers <port>`.
fn part_e(port: &str) -> Res<()> {
    let port = arg("port", port)?;
    let knobs = Knobs::from_env()?;
    helpers::section(port, &knobs, &KvFile::new(knobs.handoff_kv.as_deref()))
}

/// `handoff quorum <port> <port> ...`.
fn part_g(ports: &[String]) -> Res<()> {
    let ports = ports
        .iter()
        .map(|p| arg("port", p))
        .collect::<Res<Vec<u16>>>()?;
    quorum::section(&ports)
}

/// `handoff multikey <port>`.
fn part_h(port: &str) -> Res<()> {
    let port = arg("port", port)?;
    multikey::section(port, &Knobs::from_env()?)
}

/// `handoff rcycles <port>`.
fn part_i(port: &str) -> Res<()> {
    let port = arg("port", port)?;
    let knobs = Knobs::from_env()?;
    rcycles::section(port, &knobs, &KvFile::new(knobs.handoff_kv.as_deref()))
}

/// `handoff <port> <server-pid>`: the sections that HANDOFF_ONLY leaves on.
fn part_b(port: &str, pid: &str) -> Res<()> {
    let port = arg("port", port)?;
    let pid = arg("server pid", pid)?;
    let knobs = Knobs::from_env()?;
    let kv = KvFile::new(knobs.handoff_kv.as_deref());
    let cpu = ServerCpu {
        pid,
        ticks_per_sec: knobs.clk_tck,
    };
    if knobs.runs("B1") {
        handoff::release_handoff_section(port, &knobs)?;
    }
    if knobs.runs("B2") {
        handoff::expiry_handoff_section(port, &knobs, &kv)?;
    }
    if knobs.runs("B3") {
        herd::section(port, cpu, &knobs)?;
    }
    if knobs.runs("B4") && knobs.mass_n > 0 {
        mass::section(port, cpu, &knobs)?;
    }
    Ok(())
}
