//! F: the Rust helpers holding many leases in one process (bench/helpers.py
//! does the same for the Python ones). HELPER_LEASES leases of one client,
//! acquired one after the other, then held for HELPER_HOLD_MS while the
//! client's one watchdog renews them. Measured: the connections the process
//! has open on the server, the renewals per second (the server's
//! `lease_renewed`) and the round trips that carried them (the client's
//! `watchdog_stats`), the process's CPU over the window, and the loss
//! signal: how long after HELPER_REFUSED of the keys are deleted on the
//! server their signals turn on (a refused renewal; the bound is a third
//! of the ttl), and how late, after `CLIENT PAUSE`, the rest turn on past
//! their deadlines (the client-side deadline, checked where it is read).

use std::thread;
use std::time::{Duration, Instant};

use redis_lease_client::{Block, LeaseClient, WatchdogStats, aio};

use crate::knobs::Knobs;
use crate::kv::KvFile;
use crate::resp::{Conn, Res};
use crate::server::{connected_clients, info_lease_field};
use crate::stats::percentile;

/// A helper's leases, as the measurement sees them.
trait Held {
    fn len(&self) -> usize;
    fn lost(&self, i: usize) -> bool;
    fn deadline(&self, i: usize) -> Instant;
    fn stats(&self) -> WatchdogStats;
}

struct SyncHeld(LeaseClient, Vec<redis_lease_client::Lease>);

impl Held for SyncHeld {
    fn len(&self) -> usize {
        self.1.len()
    }
    fn lost(&self, i: usize) -> bool {
        self.1[i].is_lost()
    }
    fn deadline(&self, i: usize) -> Instant {
        self.1[i].signal().deadline()
    }
    fn stats(&self) -> WatchdogStats {
        self.0.watchdog_stats()
    }
}

struct AsyncHeld(aio::LeaseClient, Vec<aio::Lease>);

impl Held for AsyncHeld {
    fn len(&self) -> usize {
        self.1.len()
    }
    fn lost(&self, i: usize) -> bool {
        self.1[i].is_lost()
    }
    fn deadline(&self, i: usize) -> Instant {
        self.1[i].signal().deadline()
    }
    fn stats(&self) -> WatchdogStats {
        self.0.watchdog_stats()
    }
}

/// What one helper's run measured.
struct Reading {
    acquire_s: f64,
    connections: i64,
    renewals_per_s: f64,
    round_trips_per_s: f64,
    cpu_pct: f64,
    cpu_us_per_renewal: f64,
    refused_ms: (f64, f64),
    expired_late_ms: f64,
}

/// Part F for the Rust helpers: one table, a row per helper.
pub fn section(port: u16, knobs: &Knobs, kv: &KvFile) -> Res<()> {
    println!(
        "## F. {} leases held by one process through the helpers (bench/src/helpers.rs, bench/helpers.py)\n",
        knobs.helper_leases
    );
    println!(
        "One client (and its one watchdog) holds {} leases of ttl {} ms, acquired one after the other, \
         for a counted window of {} ms. Connections: the process's connections open on the server. \
         Renewals/s: the server's `lease_renewed`; round trips/s: the pipelines of the client's watchdog. \
         Client CPU: the process (user + sys) over the window. Refusal noticed: {} keys deleted on the \
         server, the time until their loss signals are on (bound: a third of the ttl). Deadline late by: \
         after `CLIENT PAUSE`, how long past its deadline each other signal is seen on (polled every ms).\n",
        knobs.helper_leases, knobs.helper_ttl_ms, knobs.helper_hold_ms, knobs.helper_refused
    );
    header();
    let r = sync_run(port, knobs)?;
    row("Rust sync", &r);
    put(kv, "rust_sync", &r);
    let r = async_run(port, knobs)?;
    row("Rust async (tokio)", &r);
    put(kv, "rust_async", &r);
    Ok(())
}

/// The table's head (bench/helpers.py prints rows under it).
fn header() {
    println!(
        "| helper | connections | acquire all, s | renewals/s | round trips/s | renewals per round trip \
         | client CPU, % of a core | CPU per renewal, µs | refusal noticed, p50 / max ms | deadline late by, max ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

fn row(name: &str, r: &Reading) {
    println!(
        "| {name} | {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.1} | {:.2} | {:.1} / {:.1} | {:.1} |",
        r.connections,
        r.acquire_s,
        r.renewals_per_s,
        r.round_trips_per_s,
        r.renewals_per_s / r.round_trips_per_s.max(f64::MIN_POSITIVE),
        r.cpu_pct,
        r.cpu_us_per_renewal,
        r.refused_ms.0,
        r.refused_ms.1,
        r.expired_late_ms
    );
}

fn put(kv: &KvFile, name: &str, r: &Reading) {
    kv.put(&format!("helpers_{name}_connections"), r.connections);
    kv.put(
        &format!("helpers_{name}_round_trips_per_s"),
        format!("{:.2}", r.round_trips_per_s),
    );
    kv.put(
        &format!("helpers_{name}_cpu_pct"),
        format!("{:.1}", r.cpu_pct),
    );
    kv.put(
        &format!("helpers_{name}_refused_max_ms"),
        format!("{:.1}", r.refused_ms.1),
    );
}

fn keys(knobs: &Knobs) -> Vec<String> {
    (0..knobs.helper_leases)
        .map(|i| format!("hl:{i:06}"))
        .collect()
}

fn sync_run(port: u16, knobs: &Knobs) -> Res<Reading> {
    Conn::open(port)?.call(&["FLUSHALL", "SYNC"])?;
    let client = LeaseClient::open(&format!("redis://127.0.0.1:{port}/"))?;
    let ttl = Duration::from_millis(knobs.helper_ttl_ms);
    let began = Instant::now();
    let mut leases = Vec::new();
    for key in keys(knobs) {
        leases.push(
            client
                .acquire(&key, ttl, Block::NoWait)?
                .ok_or("a free key was busy")?,
        );
    }
    let acquire_s = began.elapsed().as_secs_f64();
    let held = SyncHeld(client, leases);
    measure(port, knobs, &held, acquire_s)
}

fn async_run(port: u16, knobs: &Knobs) -> Res<Reading> {
    Conn::open(port)?.call(&["FLUSHALL", "SYNC"])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = aio::LeaseClient::open(&format!("redis://127.0.0.1:{port}/"))?;
    let ttl = Duration::from_millis(knobs.helper_ttl_ms);
    let began = Instant::now();
    let leases = rt.block_on(async {
        let mut leases = Vec::new();
        for key in keys(knobs) {
            let lease = client.acquire(&key, ttl, Block::NoWait).await?;
            leases.push(lease.ok_or("a free key was busy")?);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(leases)
    })?;
    let acquire_s = began.elapsed().as_secs_f64();
    let held = AsyncHeld(client, leases);
    let reading = measure(port, knobs, &held, acquire_s);
    rt.block_on(async {
        for lease in held.1 {
            let _ = lease.release().await;
        }
    });
    reading
}

/// The window, then the two loss measurements, on leases already held.
fn measure(port: u16, knobs: &Knobs, held: &dyn Held, acquire_s: f64) -> Res<Reading> {
    let mut c = Conn::open(port)?;
    let (cpu0, renewed0, s0, t0) = (
        process_cpu_s(),
        info_lease_field(&mut c, "lease_renewed")?,
        held.stats(),
        Instant::now(),
    );
    thread::sleep(Duration::from_millis(knobs.helper_hold_ms));
    let window = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_s() - cpu0;
    let renewals = (info_lease_field(&mut c, "lease_renewed")? - renewed0) as f64;
    let trips = (held.stats().round_trips - s0.round_trips) as f64;
    let connections = connected_clients(&mut c)? - 1;
    let refused_ms = refusals(&mut c, knobs, held)?;
    let expired_late_ms = expiries(&mut c, knobs, held)?;
    Ok(Reading {
        acquire_s,
        connections,
        renewals_per_s: renewals / window,
        round_trips_per_s: trips / window,
        cpu_pct: 100.0 * cpu / window,
        cpu_us_per_renewal: 1e6 * cpu / renewals.max(1.0),
        refused_ms,
        expired_late_ms,
    })
}

/// Deletes HELPER_REFUSED of the keys; p50 and max of the time until their
/// signals are on, ms.
fn refusals(c: &mut Conn, knobs: &Knobs, held: &dyn Held) -> Res<(f64, f64)> {
    let n = held.len();
    let picked: Vec<usize> = (0..knobs.helper_refused as usize)
        .map(|j| j * n / knobs.helper_refused as usize)
        .collect();
    let names = keys(knobs);
    let dels: Vec<Vec<&str>> = picked
        .iter()
        .map(|&i| vec!["DEL", names[i].as_str()])
        .collect();
    c.pipeline(&dels)?;
    let deleted = Instant::now();
    let mut seen: Vec<Option<f64>> = vec![None; picked.len()];
    let limit = Duration::from_millis(knobs.helper_ttl_ms * 2);
    while deleted.elapsed() < limit && seen.iter().any(Option::is_none) {
        for (slot, &i) in seen.iter_mut().zip(&picked) {
            if slot.is_none() && held.lost(i) {
                *slot = Some(deleted.elapsed().as_secs_f64() * 1000.0);
            }
        }
        thread::sleep(Duration::from_millis(1));
    }
    let mut ms: Vec<f64> = seen
        .into_iter()
        .map(|s| s.unwrap_or(f64::INFINITY))
        .collect();
    ms.sort_by(f64::total_cmp);
    Ok((percentile(&ms, 50.0), ms[ms.len() - 1]))
}

/// Pauses the server past every deadline; the largest lateness of a signal
/// seen on after its deadline, ms.
fn expiries(c: &mut Conn, knobs: &Knobs, held: &dyn Held) -> Res<f64> {
    let pause = knobs.helper_ttl_ms + 1000;
    c.call(&["CLIENT", "PAUSE", &pause.to_string(), "ALL"])?;
    let paused = Instant::now();
    let mut late = 0f64;
    let mut open: Vec<usize> = (0..held.len()).filter(|&i| !held.lost(i)).collect();
    while !open.is_empty() && paused.elapsed() < Duration::from_millis(pause) {
        let now = Instant::now();
        open.retain(|&i| {
            if !held.lost(i) {
                return true;
            }
            let past = now.saturating_duration_since(held.deadline(i));
            late = late.max(past.as_secs_f64() * 1000.0);
            false
        });
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(pause).saturating_sub(paused.elapsed()));
    Ok(if open.is_empty() { late } else { f64::INFINITY })
}

/// The CPU time this process used so far (user + sys), seconds.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage writes one rusage struct, which we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
