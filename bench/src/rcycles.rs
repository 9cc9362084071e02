//! I: the Rust helpers' acquire + release cycle against the raw commands on
//! one connection of the same client library (the `redis` crate), sync and
//! tokio. One client, one key, uncontended: `LEASE.ACQUIRE key owner ttl`
//! then `LEASE.RELEASE key owner`, two round trips either way.
//! HELPER_CYCLE_REPS interleaved runs of HELPER_CYCLE_MS each; the median
//! run is shown, and each helper's ratio to its raw commands (1.00: as
//! fast; the goal is at least 0.85).

use std::time::{Duration, Instant};

use redis_lease_client::{Block, LeaseClient, aio};

use crate::knobs::Knobs;
use crate::kv::KvFile;
use crate::resp::Res;
use crate::stats::median;

const TTL: Duration = Duration::from_secs(30);

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// Cycles per second of `cycle`, run for `ms`.
fn rate(ms: u64, mut cycle: impl FnMut(u64) -> Res<()>) -> Res<f64> {
    let began = Instant::now();
    let mut n = 0u64;
    while began.elapsed() < Duration::from_millis(ms) {
        cycle(n)?;
        n += 1;
    }
    Ok(n as f64 / began.elapsed().as_secs_f64())
}

fn raw_sync(port: u16, ms: u64) -> Res<f64> {
    let mut c = redis::Client::open(url(port))?.get_connection()?;
    rate(ms, |n| {
        let owner = format!("o{n}");
        let t: Option<u64> = redis::cmd("LEASE.ACQUIRE")
            .arg("ic:raw")
            .arg(&owner)
            .arg(TTL.as_millis() as u64)
            .query(&mut c)?;
        t.ok_or("the key was busy")?;
        let r: i64 = redis::cmd("LEASE.RELEASE")
            .arg("ic:raw")
            .arg(&owner)
            .query(&mut c)?;
        (r == 1).then_some(()).ok_or_else(|| "not released".into())
    })
}

fn helper_sync(port: u16, ms: u64) -> Res<f64> {
    let client = LeaseClient::open(&url(port))?;
    rate(ms, |_| {
        let lease = client
            .acquire("ic:sync", TTL, Block::NoWait)?
            .ok_or("the key was busy")?;
        lease
            .release()?
            .then_some(())
            .ok_or_else(|| "not released".into())
    })
}

fn raw_async(rt: &tokio::runtime::Runtime, port: u16, ms: u64) -> Res<f64> {
    let client = redis::Client::open(url(port))?;
    let task = async move {
        let mut c = client.get_multiplexed_async_connection().await?;
        let began = Instant::now();
        let mut n = 0u64;
        while began.elapsed() < Duration::from_millis(ms) {
            let owner = format!("o{n}");
            let t: Option<u64> = redis::cmd("LEASE.ACQUIRE")
                .arg("ic:araw")
                .arg(&owner)
                .arg(TTL.as_millis() as u64)
                .query_async(&mut c)
                .await?;
            t.ok_or("the key was busy")?;
            let _: i64 = redis::cmd("LEASE.RELEASE")
                .arg("ic:araw")
                .arg(&owner)
                .query_async(&mut c)
                .await?;
            n += 1;
        }
        Ok::<f64, Box<dyn std::error::Error + Send + Sync>>(
            n as f64 / began.elapsed().as_secs_f64(),
        )
    };
    rt.block_on(rt.spawn(task))?
}

fn helper_async(rt: &tokio::runtime::Runtime, port: u16, ms: u64) -> Res<f64> {
    let client = aio::LeaseClient::open(&url(port))?;
    let task = async move {
        let began = Instant::now();
        let mut n = 0u64;
        while began.elapsed() < Duration::from_millis(ms) {
            let lease = client
                .acquire("ic:async", TTL, Block::NoWait)
                .await?
                .ok_or("the key was busy")?;
            lease.release().await?;
            n += 1;
        }
        Ok::<f64, Box<dyn std::error::Error + Send + Sync>>(
            n as f64 / began.elapsed().as_secs_f64(),
        )
    };
    rt.block_on(rt.spawn(task))?
}

pub fn section(port: u16, knobs: &Knobs, kv: &KvFile) -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ms = knobs.helper_cycle_ms;
    let mut runs: [Vec<f64>; 4] = Default::default();
    for _ in 0..knobs.helper_cycle_reps {
        runs[0].push(raw_sync(port, ms)?);
        runs[1].push(helper_sync(port, ms)?);
        runs[2].push(raw_async(&rt, port, ms)?);
        runs[3].push(helper_async(&rt, port, ms)?);
    }
    let m: Vec<f64> = runs.into_iter().map(median).collect();
    println!("\n### I. Rust helper cycles against the raw commands\n");
    println!(
        "One client, one key, acquire + release, {} interleaved runs of {} ms, medians.\n",
        knobs.helper_cycle_reps, ms
    );
    println!("| API | cycles/s | raw commands, same library | helper / raw |");
    println!("|---|---:|---:|---:|");
    println!(
        "| sync `LeaseClient` | {:.0} | {:.0} | {:.2} |",
        m[1],
        m[0],
        m[1] / m[0]
    );
    println!(
        "| tokio `aio::LeaseClient` | {:.0} | {:.0} | {:.2} |",
        m[3],
        m[2],
        m[3] / m[2]
    );
    kv.put("helper_cycle_sync_per_s", format!("{:.0}", m[1]));
    kv.put("helper_cycle_raw_sync_per_s", format!("{:.0}", m[0]));
    kv.put("helper_cycle_async_per_s", format!("{:.0}", m[3]));
    kv.put("helper_cycle_raw_async_per_s", format!("{:.0}", m[2]));
    Ok(())
}
