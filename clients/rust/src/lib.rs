//! Client helpers for the redis-lease module (`LEASE.ACQUIRE`, `LEASE.RENEW`,
//! `LEASE.RELEASE`, `LEASE.FENCE`), on the [`redis`] crate.
//!
//! The raw commands work from any client, but every user then writes the
//! same fragile code around them. This crate writes it once:
//!
//! - **a fresh owner id per acquisition**: 16 random bytes, hex;
//! - **a lost reply is retried with the same owner** (an I/O error or a
//!   timeout on `LEASE.ACQUIRE`), on a new connection, so a grant whose reply
//!   was lost is picked up again (same token) instead of being left orphaned
//!   until its ttl runs out. The read timeout is longer than the `BLOCK`
//!   timeout, so a wait is never cut short by the client;
//! - **a watchdog** renews the lease at about a third of its ttl, on its own
//!   connection, and signals the loss at once: when a renewal answers 0, or
//!   when the lease's client-side deadline passes with no successful renewal.
//!   That deadline is `ttl` from when the acquire was *sent*, moved to `ttl`
//!   from when each successful renewal was sent. It is checked where the
//!   signal is read, so the loss shows at the deadline even while the
//!   watchdog's renewal is stuck on a paused server;
//! - **fenced writes**: [`Lease::fence`] sends `LEASE.FENCE key token <cmd>`;
//!   a `STALE` refusal is [`Error::Stale`];
//! - **release on every way out**: [`Lease::release`], and on drop of the
//!   guard (an early return, an error, a panic).
//!
//! The sync API is [`LeaseClient`] / [`Lease`]. With the `tokio` feature,
//! [`aio`] has the same on tokio. Both work with one server
//! ([`redis::Client`]) and with Redis Cluster
//! ([`redis::cluster::ClusterClient`]): the `LEASE.*` commands declare the
//! lease key at position 1, and the cluster client routes every call by
//! that key's slot.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lease_client::{Block, LeaseClient};
//!
//! # fn main() -> Result<(), redis_lease_client::Error> {
//! let client = LeaseClient::open("redis://127.0.0.1:6379/")?;
//! let done = client.with_lease("{acct:7}:lock", Duration::from_secs(10), Block::For(Duration::from_secs(5)),
//!     |lease| -> Result<(), redis_lease_client::Error> {
//!         for step in 0..100 {
//!             if lease.is_lost() {
//!                 return Err(redis_lease_client::Error::Lost(lease.loss().unwrap()));
//!             }
//!             // Every write goes through the fence: refused once the lease is not ours.
//!             let _: i64 = lease.fence(redis::cmd("HSET").arg("{acct:7}").arg("step").arg(step))?;
//!         }
//!         Ok(())
//!     })?;
//! assert!(done.is_some(), "None: the lease was busy for 5 s");
//! # Ok(()) }
//! ```
//!
//! What the helpers cannot do for you: a lease is a promise about the past
//! (it was yours when the last renewal was sent). Work that does not write
//! through the fence can still overlap the next holder's by the time it
//! takes to notice the loss; write through [`Lease::fence`], and have stores
//! outside Redis refuse tokens lower than the highest they have seen.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod sync;
pub use sync::{Lease, LeaseClient, LossSignal};

#[cfg(feature = "tokio")]
pub mod aio;

pub use redis;

/// How long [`LeaseClient::acquire`] waits when another owner holds the
/// lease (`LEASE.ACQUIRE ... BLOCK timeout-ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// Do not wait: `None` at once when the lease is held.
    NoWait,
    /// Wait up to this long (whole milliseconds; under 1 ms is `NoWait`).
    For(Duration),
    /// Wait until the lease is ours (`BLOCK 0`). The acquiring connection
    /// then has no read timeout.
    Forever,
}

/// What an acquire asks for (`LEASE.ACQUIRE ... [LIMIT n | SHARED]`); set
/// it with `LeaseClient::with_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// One holder at a time (a lock). The default.
    #[default]
    Exclusive,
    /// Any number of readers at once, no writer meanwhile (a read/write
    /// lock's read side; a writer is an exclusive acquire). A reader's token
    /// fences reads only: a fenced write is [`Error::SharedWrite`].
    Shared,
    /// Up to `n` holders at once (a semaphore whose permits expire), each
    /// with its own token.
    Limit(u32),
}

/// Why a lease is no longer held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// A renewal answered 0: the server says the lease is not ours.
    Refused,
    /// The client-side deadline passed with no successful renewal: the
    /// server may have handed the lease to someone else.
    Expired,
    /// The holder released it.
    Released,
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Loss::Refused => "lease lost: a renewal was refused",
            Loss::Expired => "lease lost: its deadline passed with no successful renewal",
            Loss::Released => "lease released",
        })
    }
}

/// The errors of this crate.
#[derive(Debug)]
pub enum Error {
    /// `LEASE.FENCE` answered `STALE`: the token is not the one of the lease
    /// held now, and the fenced command was not run.
    Stale,
    /// The lease is no longer held (returned by helpers that need it held).
    Lost(Loss),
    /// The server refused the lease because it is in a grace period (after a
    /// failover or a start on possibly lost data), not because another owner
    /// holds it: no new lease there for `remaining` more (`reason`:
    /// `promoted`, `restart` or `no-data`). Leases already held keep
    /// working. Read from the server's `INFO lease` right after the null.
    Grace {
        /// What remains of the period.
        remaining: Duration,
        /// Why it runs.
        reason: String,
    },
    /// A `SHARED` holder's token fenced a write command: refused by the
    /// server, nothing run. Readers fence reads only; take the lease
    /// exclusively to write.
    SharedWrite,
    /// This client (or a clone of it) already holds a lease on this key, not
    /// released and not lost: a second acquire would wait on itself (with
    /// `BLOCK`) or be refused. Use the lease you hold, or release it first.
    /// Nothing was sent.
    AlreadyHeld(String),
    /// A ttl under 1 ms: the server's shortest lease is 1 ms, and rounding
    /// up would hand out a lease nobody asked for. Nothing was sent.
    InvalidTtl(Duration),
    /// Any other error: the server's error replies, and I/O errors left
    /// after the retries.
    Redis(redis::RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Stale => f.write_str(
                "STALE: the fencing token is not the current one; the command was not run",
            ),
            Error::Lost(loss) => loss.fmt(f),
            Error::InvalidTtl(ttl) => write!(f, "ttl must be at least 1 ms, not {ttl:?}"),
            Error::SharedWrite => {
                f.write_str("a SHARED holder's token cannot fence a write command; nothing was run")
            }
            Error::AlreadyHeld(key) => write!(
                f,
                "{key:?} is already held by this client: use that lease or release it first"
            ),
            Error::Grace { remaining, reason } => write!(
                f,
                "the server is in a grace period ({reason}): no new lease for {} ms more",
                remaining.as_millis()
            ),
            Error::Redis(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        if e.code() == Some("STALE") {
            Error::Stale
        } else if e
            .detail()
            .is_some_and(|d| d.contains("a SHARED holder's token cannot fence a write command"))
        {
            Error::SharedWrite
        } else {
            Error::Redis(e)
        }
    }
}

/// Timeouts and retries. [`Options::default`] suits most uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// Timeout to open a connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Read timeout of the calls that do not block (renew, release, fence,
    /// an acquire without `BLOCK`). Default 5 s. A renewal also times out at
    /// the lease's deadline, whichever comes first.
    pub io_timeout: Duration,
    /// How much longer than its `BLOCK` timeout an acquire waits for its
    /// reply before it counts the reply as lost. Default 2 s.
    pub block_margin: Duration,
    /// How many times a lost `LEASE.ACQUIRE` (or `LEASE.RELEASE`) reply is
    /// retried, on a new connection, with the same owner. Default 3.
    pub retries: u32,
    /// Run the renewing watchdog. Default true. Without it the lease still
    /// signals the loss at its deadline; renew it yourself.
    pub watchdog: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(5),
            block_margin: Duration::from_secs(2),
            retries: 3,
            watchdog: true,
        }
    }
}

/// A fresh owner id: 16 random bytes as 32 hex digits.
pub fn new_owner() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `LEASE.FENCE key token <cmd ...>`: `cmd` run only if `token` is the
/// token of the lease held on `key` now, in the same atomic step.
pub fn fence_cmd(key: &str, token: u64, cmd: &redis::Cmd) -> redis::Cmd {
    let mut fenced = redis::cmd("LEASE.FENCE");
    fenced.arg(key).arg(token);
    for arg in cmd.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            fenced.arg(bytes);
        }
    }
    fenced
}

/// Is `e` a reply that may have been lost (so the command may or may not
/// have run): an I/O error, a dropped connection, a timeout.
pub(crate) fn lost_reply(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The grace period an `INFO lease` text says runs, as [`Error::Grace`];
/// `None` when none runs (or the text cannot say).
pub(crate) fn grace_of(info: &str) -> Option<Error> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
    };
    let remaining: u64 = field("lease_grace_remaining_ms")?.parse().ok()?;
    (remaining > 0).then(|| Error::Grace {
        remaining: Duration::from_millis(remaining),
        reason: field("lease_grace_reason").unwrap_or("unknown").to_string(),
    })
}

/// The loss to report when the work of a `with_lease` ended well: a lease
/// refused or expired during it (not one the work released).
pub(crate) fn lost_during(loss: Option<Loss>) -> Option<Loss> {
    loss.filter(|l| matches!(l, Loss::Refused | Loss::Expired))
}

/// What `with_lease` returns: the work's result, unless the work went well
/// and the lease was lost during it (`lost`, from [`lost_during`], read
/// before the release): its work may have overlapped the next holder's.
pub(crate) fn work_result<T, E: From<Error>>(
    result: Result<T, E>,
    lost: Option<Loss>,
) -> Result<Option<T>, E> {
    match (result, lost) {
        (Ok(_), Some(loss)) => Err(Error::Lost(loss).into()),
        (result, _) => result.map(Some),
    }
}

/// The leases a client (and its clones) took, by key, each with a way to
/// ask whether it is still held: a second acquire of a key still held
/// fails at once ([`Error::AlreadyHeld`]).
type StillHeld = Box<dyn Fn() -> bool + Send>;

#[derive(Clone, Default)]
pub(crate) struct Held(Arc<Mutex<HashMap<String, StillHeld>>>);

impl Held {
    /// [`Error::AlreadyHeld`] when a lease on `key` is neither released
    /// nor lost.
    pub(crate) fn check(&self, key: &str) -> Result<(), Error> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|_, still_held| still_held());
        match held.contains_key(key) {
            true => Err(Error::AlreadyHeld(key.to_string())),
            false => Ok(()),
        }
    }

    /// A lease on `key`, held while `still_held` says so.
    pub(crate) fn insert(&self, key: &str, still_held: impl Fn() -> bool + Send + 'static) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), Box::new(still_held));
    }
}

/// A ttl is at least 1 ms ([`Error::InvalidTtl`] otherwise).
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), Error> {
    if ttl < Duration::from_millis(1) {
        return Err(Error::InvalidTtl(ttl));
    }
    Ok(())
}

/// How a release is sent, given what the holder knows of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleasePlan {
    /// Held (or not known lost): sent, and a lost reply retried.
    Full,
    /// The deadline passed with no successful renewal: the server may
    /// still hold it (it was paused, say), so one attempt bounded by
    /// [`SHORT_RELEASE`] (connect and reply), no retry.
    Short,
    /// A renewal was refused: the server said it is not ours. Nothing sent.
    Nothing,
}

/// The bound of the one release attempt after the deadline passed.
pub(crate) const SHORT_RELEASE: Duration = Duration::from_millis(250);

/// The release of a lease whose loss signal says `loss` (before the
/// release itself sets it).
pub(crate) fn release_plan(loss: Option<Loss>) -> ReleasePlan {
    match loss {
        Some(Loss::Refused) => ReleasePlan::Nothing,
        Some(Loss::Expired) => ReleasePlan::Short,
        _ => ReleasePlan::Full,
    }
}

/// `opts` with every wait cut to [`SHORT_RELEASE`], no retry.
pub(crate) fn short(opts: &Options) -> Options {
    Options {
        connect_timeout: opts.connect_timeout.min(SHORT_RELEASE),
        io_timeout: opts.io_timeout.min(SHORT_RELEASE),
        retries: 0,
        ..opts.clone()
    }
}

/// The options a release is sent with under `plan` (`None`: nothing sent).
pub(crate) fn release_opts(plan: ReleasePlan, opts: &Options) -> Option<Options> {
    match plan {
        ReleasePlan::Nothing => None,
        ReleasePlan::Short => Some(short(opts)),
        ReleasePlan::Full => Some(opts.clone()),
    }
}

/// After release attempt `attempt` failed with `e`: `None` to send it again
/// (a lost reply, retries left), else the answer. A lease known lost whose
/// one attempt got no answer is `Ok(false)`: it ends at its ttl.
pub(crate) fn release_failed(
    e: Error,
    attempt: &mut u32,
    opts: &Options,
    plan: ReleasePlan,
) -> Option<Result<bool, Error>> {
    if let Error::Redis(r) = &e
        && lost_reply(r)
    {
        if *attempt < opts.retries {
            *attempt += 1;
            return None;
        }
        if plan == ReleasePlan::Short {
            return Some(Ok(false));
        }
    }
    Some(Err(e))
}

/// Whole milliseconds of `d`, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// The `LEASE.ACQUIRE` of one attempt, and how long to wait for its reply
/// (`None`: no read timeout). `wait_until`: the end of a `Block::For` wait.
pub(crate) fn acquire_cmd(
    key: &str,
    owner: &str,
    ttl: Duration,
    mode: Mode,
    block: Block,
    wait_until: Option<Instant>,
    opts: &Options,
) -> (redis::Cmd, Option<Duration>) {
    let mut cmd = redis::cmd("LEASE.ACQUIRE");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    match mode {
        Mode::Exclusive => {}
        Mode::Shared => {
            cmd.arg("SHARED");
        }
        Mode::Limit(n) => {
            cmd.arg("LIMIT").arg(n);
        }
    }
    let read = match (block, wait_until) {
        (Block::Forever, _) => {
            cmd.arg("BLOCK").arg(0);
            None
        }
        (Block::For(_), Some(end)) => {
            // What is left of the wait. Nothing left (a retry at the end):
            // ask once without BLOCK, never `BLOCK 0` (which waits forever).
            // Rounded up: a wait of 300 ms asked a few microseconds later
            // is still `BLOCK 300`, never less than what was asked.
            let left = end
                .saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000) as u64;
            if left > 0 {
                cmd.arg("BLOCK").arg(left);
                Some(Duration::from_millis(left) + opts.block_margin)
            } else {
                Some(opts.io_timeout)
            }
        }
        _ => Some(opts.io_timeout),
    };
    (cmd, read)
}

/// `Block::For` shorter than 1 ms is `NoWait`.
pub(crate) fn normalize(block: Block) -> Block {
    match block {
        Block::For(d) if d.as_millis() == 0 => Block::NoWait,
        b => b,
    }
}

/// The renewal interval for `ttl`: a third of it (at least 1 ms).
pub(crate) fn renew_every(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// The pause before a renewal that failed (not refused) is tried again.
pub(crate) fn retry_pause(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_is_32_hex_digits_and_fresh() {
        let (a, b) = (new_owner(), new_owner());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn fence_cmd_wraps_the_command() {
        let c = fence_cmd("lock", 42, redis::cmd("HSET").arg("k").arg("f").arg(1));
        let args: Vec<Vec<u8>> = c
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        let want: Vec<&[u8]> = vec![b"LEASE.FENCE", b"lock", b"42", b"HSET", b"k", b"f", b"1"];
        assert_eq!(args, want);
    }

    #[test]
    fn a_block_retry_with_nothing_left_does_not_wait_forever() {
        let opts = Options::default();
        let past = Instant::now() - Duration::from_secs(1);
        let (c, read) = acquire_cmd(
            "k",
            "o",
            Duration::from_secs(1),
            Mode::Exclusive,
            Block::For(Duration::from_secs(1)),
            Some(past),
            &opts,
        );
        assert_eq!(c.args_iter().count(), 4, "no BLOCK option");
        assert_eq!(read, Some(opts.io_timeout));
        let (c, read) = acquire_cmd(
            "k",
            "o",
            Duration::from_secs(1),
            Mode::Exclusive,
            Block::Forever,
            None,
            &opts,
        );
        assert_eq!(c.args_iter().count(), 6);
        assert_eq!(read, None);
        assert_eq!(
            normalize(Block::For(Duration::from_micros(10))),
            Block::NoWait
        );
    }

    #[test]
    fn a_grace_period_is_read_from_info_lease() {
        let info = "# lease\r\nlease_grace_remaining_ms:4210\r\nlease_grace_reason:promoted\r\n";
        match grace_of(info) {
            Some(Error::Grace { remaining, reason }) => {
                assert_eq!(
                    (remaining, reason.as_str()),
                    (Duration::from_millis(4210), "promoted")
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(grace_of("lease_grace_remaining_ms:0\nlease_grace_reason:none").is_none());
        assert!(grace_of("").is_none());
    }

    #[test]
    fn a_ttl_under_a_millisecond_is_an_error() {
        assert!(matches!(
            check_ttl(Duration::from_micros(999)),
            Err(Error::InvalidTtl(_))
        ));
        assert!(matches!(
            check_ttl(Duration::ZERO),
            Err(Error::InvalidTtl(_))
        ));
        assert!(check_ttl(Duration::from_millis(1)).is_ok());
    }

    #[test]
    fn a_lease_known_lost_is_released_briefly_or_not_at_all() {
        assert_eq!(release_plan(None), ReleasePlan::Full);
        assert_eq!(release_plan(Some(Loss::Expired)), ReleasePlan::Short);
        assert_eq!(release_plan(Some(Loss::Refused)), ReleasePlan::Nothing);
        let io = || {
            Error::Redis(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        };
        let opts = Options::default();
        let mut attempt = 0;
        assert!(
            release_failed(io(), &mut attempt, &opts, ReleasePlan::Full).is_none(),
            "a lost reply is sent again"
        );
        assert_eq!(attempt, 1);
        attempt = opts.retries;
        assert!(matches!(
            release_failed(io(), &mut attempt, &opts, ReleasePlan::Full),
            Some(Err(_))
        ));
        let mut attempt = 0;
        let s = short(&opts);
        assert!(
            matches!(
                release_failed(io(), &mut attempt, &s, ReleasePlan::Short),
                Some(Ok(false))
            ),
            "known lost: one try"
        );
        assert!(matches!(
            release_failed(Error::Stale, &mut attempt, &opts, ReleasePlan::Full),
            Some(Err(Error::Stale))
        ));
        assert!(release_opts(ReleasePlan::Nothing, &opts).is_none());
        let s = short(&Options::default());
        assert_eq!(
            (s.connect_timeout, s.io_timeout, s.retries),
            (SHORT_RELEASE, SHORT_RELEASE, 0)
        );
    }

    #[test]
    fn stale_maps_to_its_own_error() {
        let e = redis::RedisError::from((redis::ErrorKind::Client, "x"));
        assert!(matches!(Error::from(e), Error::Redis(_)));
    }
}
