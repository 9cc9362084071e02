//! G: quorum lock cycles from the Rust helpers (bench/quorum.sh runs the
//! peers on the same five masters): acquire on a majority with the token
//! committed (two round trips), one fenced write on the first master,
//! release everywhere, one after the other for QUORUM_MS. One JSON line per
//! helper: cycles per second and the acquire latency (p50, p99, µs).

use std::time::{Duration, Instant};

use redis_lease_client::{Block, Options, QuorumClient, aio};

use crate::resp::{Conn, Res};
use crate::stats::percentile;

fn ms() -> u64 {
    std::env::var("QUORUM_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

fn line(name: &str, cycles: u64, secs: f64, mut lat: Vec<f64>, failed: u64) {
    lat.sort_by(f64::total_cmp);
    println!(
        "{{\"name\": \"{name}\", \"cycles_per_s\": {:.1}, \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"failed\": {failed}}}",
        cycles as f64 / secs,
        percentile(&lat, 50.0),
        percentile(&lat, 99.0)
    );
}

fn opts() -> Options {
    Options {
        watchdog: false,
        ..Options::default()
    }
}

/// `handoff quorum <port> <port> ...`.
pub fn section(ports: &[u16]) -> Res<()> {
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ttl = Duration::from_secs(10);
    let mut first = Conn::open(ports[0])?;
    let client = QuorumClient::open(&urls)?.with_options(opts());
    let (mut lat, mut cycles, mut failed) = (Vec::new(), 0u64, 0u64);
    let (t0, end) = (Instant::now(), Instant::now() + Duration::from_millis(ms()));
    for i in 0..u64::MAX {
        if Instant::now() >= end {
            break;
        }
        let a = Instant::now();
        let Some(lease) = client.acquire("qjob", ttl, Block::NoWait)? else {
            failed += 1;
            continue;
        };
        lat.push(a.elapsed().as_secs_f64() * 1e6);
        let token = lease.token().to_string();
        first.call(&[
            "LEASE.FENCE",
            "qjob",
            &token,
            "SET",
            "qdata",
            &i.to_string(),
        ])?;
        lease.release()?;
        cycles += 1;
    }
    line(
        "redis-lease-client QuorumClient (Rust sync, with a token)",
        cycles,
        t0.elapsed().as_secs_f64(),
        lat,
        failed,
    );
    async_section(&urls, ports[0], ttl)
}

fn async_section(urls: &[&str], first_port: u16, ttl: Duration) -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = aio::QuorumClient::open(urls)?.with_options(opts());
    let mut first = Conn::open(first_port)?;
    let (mut lat, mut cycles, mut failed) = (Vec::new(), 0u64, 0u64);
    let (t0, end) = (Instant::now(), Instant::now() + Duration::from_millis(ms()));
    rt.block_on(async {
        for i in 0..u64::MAX {
            if Instant::now() >= end {
                break;
            }
            let a = Instant::now();
            let Some(lease) = client.acquire("qjob", ttl, Block::NoWait).await? else {
                failed += 1;
                continue;
            };
            lat.push(a.elapsed().as_secs_f64() * 1e6);
            let token = lease.token().to_string();
            first.call(&[
                "LEASE.FENCE",
                "qjob",
                &token,
                "SET",
                "qdata",
                &i.to_string(),
            ])?;
            lease.release().await?;
            cycles += 1;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    line(
        "redis-lease-client aio::QuorumClient (Rust tokio, with a token)",
        cycles,
        t0.elapsed().as_secs_f64(),
        lat,
        failed,
    );
    Ok(())
}
