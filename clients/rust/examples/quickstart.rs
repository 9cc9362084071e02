//! The example in clients/rust/README.md (tests/sync.rs runs it and checks that the
//! README shows this code). Run it against a server with the module loaded:
//! `cargo run -p redis-lease-client --example quickstart [redis://host:port/]`.

use std::time::Duration;

use redis_lease_client::{Block, Error, LeaseClient};

pub fn run(url: &str) -> Result<(), Error> {
    let client = LeaseClient::open(url)?;
    let (lock, data) = ("{acct:7}:lock", "{acct:7}"); // one hash tag: one cluster slot

    // Wait up to 5 s for the lease. Its watchdog renews it every 10 s.
    let ttl = Duration::from_secs(30);
    let Some(mut lease) = client.acquire(lock, ttl, Block::For(Duration::from_secs(5)))? else {
        println!("busy: another owner holds the lease");
        return Ok(());
    };
    println!("token {}", lease.token());
    // Fenced write: the token check and the HSET are one atomic step.
    let _: i64 = lease.fence(redis::cmd("HSET").arg(data).arg("balance").arg(90))?;
    lease.release()?; // dropping the guard releases too

    // with_lease releases on every way out (Ok, Err, panic) and hands the
    // work the lease, whose loss signal says when to stop.
    client.with_lease(lock, ttl, Block::NoWait, |lease| {
        for _ in 0..3 {
            if let Some(loss) = lease.loss() {
                return Err(Error::Lost(loss)); // stop: the lease is not ours
            }
            let _: i64 = lease.fence(redis::cmd("HINCRBY").arg(data).arg("steps").arg(1))?;
        }
        Ok(())
    })?;
    Ok(())
}

fn main() -> Result<(), Error> {
    let url = std::env::args().nth(1);
    run(url.as_deref().unwrap_or("redis://127.0.0.1:6379/"))
}
