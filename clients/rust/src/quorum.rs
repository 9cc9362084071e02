//! Quorum leases over independent masters with one fencing token (design.md
//! S9), sync: [`QuorumClient`] and its [`QuorumLease`].
//!
//! N masters that do not replicate to each other, `q = N/2 + 1`. An
//! acquisition takes the lease on every master at once (step 1), and, when
//! at least `q` granted, commits the highest token `T` back to them with
//! `LEASE.ACQUIRE ... FLOOR T` (step 3): held when `q` answer exactly `T`
//! while its validity (`ttl - drift` from the first send) lasts. Each
//! master's token clock then works as a ballot, so tokens of successive
//! holdings strictly increase although the masters' clocks differ. The
//! watchdog renews on every master and signals the loss when fewer than a
//! majority renewed in time.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lease_client::{Block, QuorumClient};
//!
//! # fn main() -> Result<(), redis_lease_client::Error> {
//! let client = QuorumClient::open(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"])?;
//! if let Some(lease) = client.acquire("job", Duration::from_secs(10), Block::For(Duration::from_secs(2)))? {
//!     // On every master that committed the token; Err(Error::Stale) if current on fewer than a majority.
//!     let _: () = lease.fence(redis::cmd("SET").arg("report:done").arg(1))?;
//!     let token = lease.token(); // for a store outside Redis that keeps the highest token
//!     lease.release()?;
//! }
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Cmd, FromRedisValue, RedisResult};

pub use crate::protocol::Outlier;
use crate::protocol::{
    Commit, Committed, Steps, fence_outcome, lost_reply, release_cmd, renew_cmd, renew_every,
    resolve, retry_pause,
};
use crate::raw::fence_cmd_with;
use crate::{Block, Error, Label, Loss, LossSignal, Options, new_owner};

/// What `on_outlier` calls with each master left out of a commit.
pub(crate) type OnOutlier = Arc<dyn Fn(&Outlier) + Send + Sync>;

/// The clock drift allowed for a ttl: 1% of it plus 2 ms (as Redlock).
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How many masters of `n` make a majority.
pub(crate) fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// When a holding whose first send was at `t0` stops counting as held:
/// `ttl - drift` later.
pub(crate) fn valid_until(t0: Instant, ttl: Duration) -> Instant {
    t0 + ttl - drift(ttl).min(ttl)
}

/// The first renewal: a third of the ttl after the first send, read back
/// from the holding's deadline.
pub(crate) fn first_renewal(deadline: Instant, ttl: Duration) -> Instant {
    deadline + drift(ttl).min(ttl) - ttl + renew_every(ttl)
}

/// (master, token) of the masters of `on` that granted, from their replies.
pub(crate) fn granted(on: &[usize], replies: Vec<RedisResult<Option<u64>>>) -> Vec<(usize, u64)> {
    on.iter()
        .zip(replies)
        .filter_map(|(&i, r)| Some((i, r.ok()??)))
        .collect()
}

/// A renewal round from the replies in so far (`None`: not in yet) of `n`
/// masters: `Some(true)` a majority renewed, `Some(false)` too many
/// refused (the loss), `None` undecided.
pub(crate) fn renew_outcome<E>(replies: &[Option<Result<i64, E>>], n: usize) -> Option<bool> {
    let count = |v: i64| {
        replies
            .iter()
            .filter(|r| matches!(r, Some(Ok(x)) if *x == v))
            .count()
    };
    if count(1) >= majority(n) {
        Some(true)
    } else if count(0) > n - majority(n) {
        Some(false)
    } else {
        None
    }
}

/// What a decided renewal round does to the lease (`extend`: the validity
/// moves, false once lost or released; `lose`: the loss), for the sync and
/// the async signal alike; `None` (undecided) does nothing.
pub(crate) fn settle_renewal(
    outcome: Option<bool>,
    extend: impl FnOnce() -> bool,
    lose: impl FnOnce(),
) -> Option<bool> {
    match outcome {
        Some(true) => Some(extend()),
        Some(false) => {
            lose();
            Some(false)
        }
        None => None,
    }
}

/// The address of a master's client: `host:port`, or a Unix socket's path.
pub(crate) fn addr_of(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// One master: its client and its idle connections.
struct Node {
    client: redis::Client,
    idle: Mutex<Vec<redis::Connection>>,
}

impl Node {
    fn new(client: redis::Client) -> Node {
        Node {
            client,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `cmd` within `timeout` (connect included for a new connection).
    /// A connection whose reply was lost is closed.
    fn call<T: FromRedisValue>(&self, cmd: &Cmd, timeout: Duration) -> RedisResult<T> {
        let until = Instant::now() + timeout.max(Duration::from_millis(1));
        self.send(self.pooled(), cmd, timeout)
            .and_then(|conn| self.recv(conn, until))
    }

    /// An idle connection, if one is pooled.
    fn pooled(&self) -> Option<redis::Connection> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// Sends `cmd` on `conn` (`None`: a new connection, opened within
    /// `timeout`) without waiting for the reply: the connection, to read it
    /// from with [`recv`](Self::recv).
    fn send(
        &self,
        conn: Option<redis::Connection>,
        cmd: &Cmd,
        timeout: Duration,
    ) -> RedisResult<redis::Connection> {
        let timeout = timeout.max(Duration::from_millis(1));
        let mut conn = match conn {
            Some(c) => c,
            None => self.client.get_connection_with_timeout(timeout)?,
        };
        conn.set_write_timeout(Some(timeout))?;
        conn.send_packed_command(&cmd.get_packed_command())?;
        Ok(conn)
    }

    /// The reply to what [`send`](Self::send) sent, by `until`; the
    /// connection goes back to the pool unless its reply was lost.
    fn recv<T: FromRedisValue>(
        &self,
        mut conn: redis::Connection,
        until: Instant,
    ) -> RedisResult<T> {
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        conn.set_read_timeout(Some(left))?;
        let result = conn
            .recv_response()
            .and_then(redis::Value::extract_error)
            .and_then(|v| Ok(T::from_redis_value(v)?));
        match &result {
            Err(e) if lost_reply(e) => {}
            _ => self
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn),
        }
        result
    }
}

struct Inner {
    nodes: Vec<Node>,
    opts: Options,
    /// Skip step 3 (the commit of `T`): only for tests that show why the
    /// step exists.
    commit: bool,
    on_outlier: Option<OnOutlier>,
}

impl Inner {
    fn quorum(&self) -> usize {
        majority(self.nodes.len())
    }

    /// How long one master may take to answer one step.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.opts.io_timeout.min(ttl / 3)
    }

    /// `cmd_for(i)` on every master `i` of `on` at once: each reply, in the
    /// order of `on`.
    fn each<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        on: &[usize],
        timeout: Duration,
        cmd_for: impl Fn(usize) -> Cmd,
    ) -> Vec<RedisResult<T>> {
        // Sent on the idle connections first, on this thread; the masters
        // with none connect all at once, a scoped thread each, so that
        // masters which accept no connection cost one timeout in all, not
        // one each; then every reply is read on this thread.
        let until = Instant::now() + timeout.max(Duration::from_millis(1));
        let mut sent: Vec<Option<RedisResult<redis::Connection>>> = on
            .iter()
            .map(|&i| {
                let node = &self.nodes[i];
                node.pooled()
                    .map(|c| node.send(Some(c), &cmd_for(i), timeout))
            })
            .collect();
        let new: Vec<(usize, usize, Cmd)> = on
            .iter()
            .enumerate()
            .filter(|&(slot, _)| sent[slot].is_none())
            .map(|(slot, &i)| (slot, i, cmd_for(i)))
            .collect();
        if !new.is_empty() {
            thread::scope(|s| {
                let started: Vec<_> = new
                    .into_iter()
                    .map(|(slot, i, cmd)| {
                        let node = &self.nodes[i];
                        (slot, s.spawn(move || node.send(None, &cmd, timeout)))
                    })
                    .collect();
                for (slot, t) in started {
                    sent[slot] = Some(t.join().unwrap_or_else(|_| {
                        Err(redis::RedisError::from(std::io::Error::other(
                            "a connecting thread panicked",
                        )))
                    }));
                }
            });
        }
        on.iter()
            .zip(sent)
            .map(|(&i, conn)| {
                conn.expect("sent or failed")
                    .and_then(|c| self.nodes[i].recv(c, until))
            })
            .collect()
    }

    /// Calls `on_outlier` (when set) with each master left out.
    fn report(&self, outliers: &[Outlier]) {
        if let Some(f) = &self.on_outlier {
            outliers.iter().for_each(|o| f(o));
        }
    }

    /// As [`each`](Self::each), but returns as soon as `enough` says so of
    /// the replies in so far (the rest: a timeout, as if they never came):
    /// a renewal that a majority answered does not wait for a slow master.
    fn each_until<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        on: &[usize],
        timeout: Duration,
        cmd_for: impl Fn(usize) -> Cmd,
        enough: impl Fn(&[Option<RedisResult<T>>]) -> bool,
    ) -> Vec<RedisResult<T>> {
        let (tx, rx) = std::sync::mpsc::channel();
        for (slot, &i) in on.iter().enumerate() {
            let (inner, cmd, tx) = (self.clone(), cmd_for(i), tx.clone());
            thread::spawn(move || {
                let _ = tx.send((slot, inner.nodes[i].call::<T>(&cmd, timeout)));
            });
        }
        drop(tx);
        let mut got: Vec<Option<RedisResult<T>>> = on.iter().map(|_| None).collect();
        for _ in on {
            match rx.recv() {
                Ok((slot, r)) => got[slot] = Some(r),
                Err(_) => break,
            }
            if enough(&got) {
                break;
            }
        }
        got.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(redis::RedisError::from(std::io::Error::from(
                        std::io::ErrorKind::TimedOut,
                    )))
                })
            })
            .collect()
    }

    fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// `LEASE.RELEASE key owner` everywhere: how many released.
    fn release_everywhere(self: &Arc<Self>, key: &str, owner: &str, timeout: Duration) -> usize {
        self.each::<i64>(&self.all(), timeout, |_| release_cmd(key, owner))
            .into_iter()
            .filter(|r| matches!(r, Ok(1)))
            .count()
    }
}

/// Takes quorum leases on N independent masters. Cheap to clone; the
/// clones share the connections.
#[derive(Clone)]
pub struct QuorumClient {
    inner: Arc<Inner>,
    /// The `LABEL` of its acquires on every master (`None`: none),
    /// resolved once.
    label: Option<Arc<str>>,
}

impl QuorumClient {
    /// Leases on the masters at `urls` (at least one; three or five in
    /// practice). They must not replicate to each other, and each must run
    /// its grace period after a restart (`lease.grace-ms`, design.md S7).
    pub fn open(urls: &[&str]) -> Result<QuorumClient, Error> {
        let clients = urls
            .iter()
            .map(|u| redis::Client::open(*u))
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(QuorumClient::new(clients))
    }

    /// Leases on the masters of `clients`.
    pub fn new(clients: Vec<redis::Client>) -> QuorumClient {
        QuorumClient {
            inner: Arc::new(Inner {
                nodes: clients.into_iter().map(Node::new).collect(),
                opts: Options::default(),
                commit: true,
                on_outlier: None,
            }),
            label: resolve(&Label::Default, None),
        }
    }

    /// The same client (and label) with `change` made to its settings, on
    /// their own (new connections when it was cloned).
    fn changed(self, change: impl FnOnce(Inner) -> Inner) -> QuorumClient {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|a| Inner {
            nodes: a
                .nodes
                .iter()
                .map(|n| Node::new(n.client.clone()))
                .collect(),
            opts: a.opts.clone(),
            commit: a.commit,
            on_outlier: a.on_outlier.clone(),
        });
        QuorumClient {
            inner: Arc::new(change(inner)),
            label: self.label,
        }
    }

    /// The same client with other timeouts (`io_timeout` bounds each
    /// master's answer to one step, at most a third of the ttl).
    pub fn with_options(self, opts: Options) -> QuorumClient {
        self.changed(|inner| Inner { opts, ..inner })
    }

    /// The same client, calling `f` with each master that an acquisition
    /// leaves out of its commit because the others refused its token as
    /// too far ahead of their clocks: the master's clock is wrong, and the
    /// lease is taken without it ([`Outlier`], docs/helpers.md). `f` runs
    /// on the acquiring thread: keep it short.
    pub fn on_outlier(self, f: impl Fn(&Outlier) + Send + Sync + 'static) -> QuorumClient {
        self.changed(|inner| Inner {
            on_outlier: Some(Arc::new(f)),
            ..inner
        })
    }

    /// The same client labelling its acquires with `label` (`LABEL`, shown
    /// by `LEASE.INFO` and `LEASE.WAITERS` on every master): step 1 and
    /// every commit round send it, on every master and every try. By
    /// default [`Label::Default`], this process's
    /// [`default_label`](crate::default_label) (`<host> pid <pid>
    /// <program>`); [`Label::None`] for none. For one call, label a clone:
    /// `client.clone().with_label(Label::text("job 991")).acquire(..)`
    /// (it shares the connections).
    pub fn with_label(mut self, label: Label) -> QuorumClient {
        self.label = resolve(&label, None);
        self
    }

    /// The label its acquires send (`None`: none).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Skips step 3, the commit of the highest token to a majority. Unsafe:
    /// tokens may then go backwards when the masters' clocks differ. Only
    /// for tests that show why the step exists.
    #[doc(hidden)]
    pub fn without_the_commit_step(self) -> QuorumClient {
        self.changed(|inner| Inner {
            commit: false,
            ..inner
        })
    }

    /// How many masters make a majority.
    pub fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    /// Takes the lease on `key` for `ttl` on a majority, with one token,
    /// labelled with this client's [`label`](Self::label).
    /// `Ok(None)`: no majority within `block` (tries again after a random
    /// back-off while the wait lasts). A master that does not answer in
    /// time counts as not granting; an ambiguous outcome is safe to retry,
    /// because the same owner is used for every try of one call.
    pub fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        block: Block,
    ) -> Result<Option<QuorumLease>, Error> {
        crate::protocol::check_ttl(ttl)?;
        let inner = &self.inner;
        let owner = new_owner();
        let steps = Steps {
            key,
            owner: &owner,
            ttl,
            label: self.label.as_deref(),
        };
        let until = match block {
            Block::NoWait => Some(Instant::now()),
            Block::For(d) => Some(Instant::now() + d),
            Block::Forever => None,
        };
        loop {
            if let Some(held) = self.attempt(steps)? {
                return Ok(Some(held));
            }
            let timeout = inner.node_timeout(ttl);
            inner.release_everywhere(key, &owner, timeout);
            let pause = backoff(ttl);
            if until.is_some_and(|u| Instant::now() + pause >= u) {
                return Ok(None);
            }
            thread::sleep(pause);
        }
    }

    /// Steps 1 and 3 once: the lease, or `None` (released by the caller).
    fn attempt(&self, steps: Steps<'_>) -> Result<Option<QuorumLease>, Error> {
        let Steps {
            key, owner, ttl, ..
        } = steps;
        let inner = &self.inner;
        let timeout = inner.node_timeout(ttl);
        let t0 = Instant::now();
        let all = inner.all();
        let replies = inner.each(&all, timeout, |_| steps.first());
        let valid_until = valid_until(t0, ttl);
        let Some(mut commit) = Commit::new(granted(&all, replies), inner.quorum()) else {
            return Ok(None);
        };
        let held = match inner.commit {
            false => commit.skipped(),
            // At most one round per master: each leaves one out.
            true => loop {
                let token = commit.token();
                let replies = inner.each(commit.on(), timeout, |_| steps.commit(token));
                match commit.settle(replies, |i| addr_of(&inner.nodes[i].client)) {
                    Committed::Again(next, outliers) => {
                        inner.report(&outliers);
                        commit = next;
                    }
                    held => break held,
                }
            },
        };
        let Committed::Held { token, on } = held else {
            return Ok(None);
        };
        if Instant::now() >= valid_until {
            return Ok(None);
        }
        Ok(Some(QuorumLease::start(
            self,
            key,
            owner,
            token,
            ttl,
            valid_until,
            on,
        )))
    }
}

/// A random pause before another try: up to a tenth of the ttl (at least
/// 1 ms, at most 50 ms), so that contenders fall out of step.
pub(crate) fn backoff(ttl: Duration) -> Duration {
    let top = (ttl / 10).clamp(Duration::from_millis(1), Duration::from_millis(50));
    top.mul_f64(rand::random::<f64>())
        .max(Duration::from_micros(200))
}

/// A quorum lease: one token `T` committed on a majority. Released when
/// dropped.
pub struct QuorumLease {
    key: String,
    owner: String,
    token: u64,
    ttl: Duration,
    committed: Vec<usize>,
    client: QuorumClient,
    signal: LossSignal,
    released: bool,
}

impl QuorumLease {
    fn start(
        client: &QuorumClient,
        key: &str,
        owner: &str,
        token: u64,
        ttl: Duration,
        valid_until: Instant,
        committed: Vec<usize>,
    ) -> QuorumLease {
        let lease = QuorumLease {
            key: key.to_string(),
            owner: owner.to_string(),
            token,
            ttl,
            committed,
            client: client.clone(),
            signal: LossSignal::new(valid_until),
            released: false,
        };
        if client.inner.opts.watchdog {
            let (client, signal) = (client.clone(), lease.signal.clone());
            let (key, owner) = (lease.key.clone(), lease.owner.clone());
            thread::Builder::new()
                .name("quorum-watchdog".into())
                .spawn(move || watchdog(&client, &key, &owner, ttl, &signal))
                .expect("spawn the quorum watchdog thread");
        }
        lease
    }

    /// The fencing token, the same on every master that committed it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The masters (indexes in the client's list) that committed the token.
    pub fn committed(&self) -> &[usize] {
        &self.committed
    }

    /// The loss signal: on at the end of the validity (`ttl - drift` from
    /// the last send that a majority renewed), when a majority refused a
    /// renewal, or on release.
    pub fn signal(&self) -> LossSignal {
        self.signal.clone()
    }

    /// Why the lease is lost, `None` while it is held.
    pub fn loss(&self) -> Option<Loss> {
        self.signal.loss()
    }

    /// True once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.signal.is_lost()
    }

    /// Renews now on every master: `Ok(true)` when a majority renewed (the
    /// validity moves to `ttl - drift` from now).
    pub fn renew(&self) -> Result<bool, Error> {
        Ok(renew_round(&self.client, &self.key, &self.owner, self.ttl, &self.signal) == Some(true))
    }

    /// `cmd` fenced with the token on every master that committed it
    /// (`LEASE.FENCE key T cmd`): the first reply of a master that ran it,
    /// which is the command's own error ([`Error::Redis`]) when it failed
    /// there ([`Error::Fenced`] when the key is not the guard of a hash tag
    /// the command writes), or [`Error::Stale`] when the token was current
    /// on fewer than a majority (docs/helpers.md).
    pub fn fence<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, Error> {
        self.fence_with(None, cmd)
    }

    /// As [`QuorumLease::fence`], with `MINTTL` on every master: a master
    /// where the lease has less than `min_ttl` left runs nothing. When the
    /// token was current on a majority but too few of them had the time,
    /// [`Error::Expiring`] (the first such master's); the masters that had
    /// it ran the command, as with a `STALE` minority.
    pub fn fence_min_ttl<T: FromRedisValue + Send>(
        &self,
        min_ttl: Duration,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        self.fence_with(Some(min_ttl), cmd)
    }

    fn fence_with<T: FromRedisValue + Send>(
        &self,
        min_ttl: Option<Duration>,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        let inner = &self.client.inner;
        let fenced = fence_cmd_with(&self.key, self.token, min_ttl, cmd);
        let replies =
            inner.each::<redis::Value>(&self.committed, inner.opts.io_timeout, |_| fenced.clone());
        let first = fence_outcome(replies, inner.quorum())?;
        Ok(T::from_redis_value(first).map_err(redis::RedisError::from)?)
    }

    /// Gives the lease back on every master: `Ok(true)` when a majority
    /// released it.
    pub fn release(mut self) -> Result<bool, Error> {
        Ok(self.release_inner())
    }

    fn release_inner(&mut self) -> bool {
        if self.released {
            return false;
        }
        self.released = true;
        self.signal.finish();
        let inner = &self.client.inner;
        let n = inner.release_everywhere(&self.key, &self.owner, inner.node_timeout(self.ttl));
        n >= inner.quorum()
    }
}

impl Drop for QuorumLease {
    fn drop(&mut self) {
        self.release_inner();
    }
}

/// One renewal on every master, sent now, done once a majority answered
/// either way (the others still get theirs): `Some(true)` a majority
/// renewed (the validity moved), `Some(false)` too many refused (the
/// loss), `None` not enough answers (try again soon).
fn renew_round(
    client: &QuorumClient,
    key: &str,
    owner: &str,
    ttl: Duration,
    signal: &LossSignal,
) -> Option<bool> {
    let inner = &client.inner;
    let n = inner.nodes.len();
    let sent = Instant::now();
    let replies = inner.each_until(
        &inner.all(),
        inner.node_timeout(ttl),
        |_| renew_cmd(key, owner, ttl),
        |got| renew_outcome(got, n).is_some(),
    );
    let replies: Vec<Option<RedisResult<i64>>> = replies.into_iter().map(Some).collect();
    settle_renewal(
        renew_outcome(&replies, n),
        || signal.extend(sent, ttl - drift(ttl).min(ttl)),
        || signal.lose(Loss::Refused),
    )
}

/// Renews every third of the ttl on every master until the lease is lost
/// or released.
fn watchdog(client: &QuorumClient, key: &str, owner: &str, ttl: Duration, signal: &LossSignal) {
    // The first renewal a third of the ttl after the acquisition's first
    // send (its validity counts from there, not from when it was held).
    let mut next = first_renewal(signal.deadline(), ttl);
    loop {
        if signal
            .wait(Some(next.saturating_duration_since(Instant::now())))
            .is_some()
        {
            return;
        }
        match renew_round(client, key, owner, ttl, signal) {
            Some(true) => next = Instant::now() + renew_every(ttl),
            Some(false) => return,
            None => next = Instant::now() + retry_pause(ttl),
        }
    }
}
