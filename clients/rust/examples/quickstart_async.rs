//! The async example in clients/rust/README.md (tests/aio.rs runs it and checks
//! that the README shows this code):
//! `cargo run -p redis-lease-client --features tokio --example quickstart_async [url]`.

use std::time::Duration;

use redis_lease_client::aio::LeaseClient;
use redis_lease_client::{Block, Error};

pub async fn run(url: &str) -> Result<(), Error> {
    let client = LeaseClient::open(url)?;
    let (lock, data) = ("{acct:7}:lock", "{acct:7}"); // one hash tag: one cluster slot
    let ttl = Duration::from_secs(30);

    // The job gets a LeaseHandle; the lease is released however it ends.
    let job = |lease: redis_lease_client::aio::LeaseHandle| async move {
        for _ in 0..3 {
            let mut step = redis::cmd("HINCRBY");
            step.arg(data).arg("steps").arg(1);
            tokio::select! {
                loss = lease.lost() => return Err(Error::Lost(loss)), // stop at once
                done = lease.fence::<i64>(&step) => { done?; }
            }
        }
        Ok(lease.token())
    };
    match client
        .with_lease(lock, ttl, Block::For(Duration::from_secs(5)), job)
        .await?
    {
        Some(token) => println!("done under token {token}"),
        None => println!("busy: another owner holds the lease"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args().nth(1);
    run(url.as_deref().unwrap_or("redis://127.0.0.1:6379/")).await
}
