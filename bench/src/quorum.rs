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

/// One client's run: the acquire latencies, cycles and failed acquires
/// within the window.
struct Tally {
    lat: Vec<f64>,
    cycles: u64,
    failed: u64,
    t0: Instant,
    end: Instant,
}

impl Tally {
    fn start() -> Tally {
        let t0 = Instant::now();
        Tally {
            lat: Vec::new(),
            cycles: 0,
            failed: 0,
            t0,
            end: t0 + Duration::from_millis(ms()),
        }
    }

    fn running(&self) -> bool {
        Instant::now() < self.end
    }

    /// The JSON line of the run.
    fn report(mut self, name: &str) {
        self.lat.sort_by(f64::total_cmp);
        println!(
            "{{\"name\": \"{name}\", \"cycles_per_s\": {:.1}, \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"failed\": {}}}",
            self.cycles as f64 / self.t0.elapsed().as_secs_f64(),
            percentile(&self.lat, 50.0),
            percentile(&self.lat, 99.0),
            self.failed
        );
    }
}

/// The cycle's one write: fenced with the token, on the first master.
fn write(first: &mut Conn, token: u64, i: u64) -> Res<()> {
    let (token, i) = (token.to_string(), i.to_string());
    first.call(&["LEASE.FENCE", "qjob", &token, "SET", "qdata", &i])?;
    Ok(())
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
    let mut tally = Tally::start();
    for i in 0..u64::MAX {
        if !tally.running() {
            break;
        }
        let a = Instant::now();
        let Some(lease) = client.acquire("qjob", ttl, Block::NoWait)? else {
            tally.failed += 1;
            continue;
        };
        tally.lat.push(a.elapsed().as_secs_f64() * 1e6);
        write(&mut first, lease.token(), i)?;
        lease.release()?;
        tally.cycles += 1;
    }
    tally.report("redis-lease-client QuorumClient (Rust sync, with a token)");
    async_section(&urls, ports[0], ttl)
}

fn async_section(urls: &[&str], first_port: u16, ttl: Duration) -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = aio::QuorumClient::open(urls)?.with_options(opts());
    let mut first = Conn::open(first_port)?;
    // The loop runs as a task of the runtime, as a tokio service's code does
    // (not on the thread that calls block_on).
    let run = rt.spawn(async move {
        let mut tally = Tally::start();
        for i in 0..u64::MAX {
            if !tally.running() {
                break;
            }
            let a = Instant::now();
            let Some(lease) = client.acquire("qjob", ttl, Block::NoWait).await? else {
                tally.failed += 1;
                continue;
            };
            tally.lat.push(a.elapsed().as_secs_f64() * 1e6);
            write(&mut first, lease.token(), i)?;
            lease.release().await?;
            tally.cycles += 1;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(tally)
    });
    let tally = rt.block_on(run)??;
    tally.report("redis-lease-client aio::QuorumClient (Rust tokio, with a token)");
    Ok(())
}
