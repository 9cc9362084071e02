//! Quorum leases over independent masters with one fencing token (design.md
//! S9), sync: [`QuorumClient`] and its [`QuorumLease`].
//!
//! N masters that do not replicate to each other, `q = N/2 + 1`. An
//! acquisition takes the lease on every master at once, proposing a token
//! `P` (step 1, `LEASE.ACQUIRE ... FLOOR P`): held with `P` when `q` answer
//! exactly `P` while its validity (`ttl - drift` from the first send)
//! lasts, in one round trip. Otherwise, when at least `q` granted, it
//! commits the highest token `T` back to them with `LEASE.ACQUIRE ... FLOOR
//! T` (step 3): held when `q` answer exactly `T`. Each master's token clock
//! then works as a ballot, so tokens of successive holdings strictly
//! increase although the masters' clocks differ. Every step is decided as
//! soon as a majority decides it, not by the slowest master. The watchdog
//! renews on every master and signals the loss when fewer than a majority
//! renewed in time.
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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Cmd, FromRedisValue, RedisResult};

pub use crate::protocol::Outlier;
use crate::protocol::{
    Committed, First, Proposer, Rule, StepReply, Steps, fast_outliers, fence_outcome,
    first_outcome, floor_refused, linger, lost_reply, release_cmd, release_outcome, renew_cmd,
    renew_every, resolve, retry_pause,
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

/// This machine's wall clock, ms since the epoch, moved by `offset_ms`
/// (0 but in the tests that play a client whose clock is wrong).
pub(crate) fn wall_ms(offset_ms: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64;
    now + offset_ms
}

/// The replies of a step once it is over: a master not in by then counts
/// as timed out.
pub(crate) fn timed_out<T>(replies: Vec<Option<RedisResult<T>>>) -> Vec<Option<RedisResult<T>>> {
    replies
        .into_iter()
        .map(|r| {
            r.or_else(|| {
                Some(Err(redis::RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                ))))
            })
        })
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

/// Work for a master's thread.
type Job = Box<dyn FnOnce() + Send>;

/// One master: its client, its idle connections, and the thread that reads
/// its replies (started at its first step, ended with the client), so that
/// a step reads every master's reply as it comes. While that thread has
/// work (a reply that came in after its step was decided, or a connect),
/// the next command to the master goes through it too, in order: a release
/// never overtakes the acquire it releases.
struct Node {
    client: redis::Client,
    idle: Mutex<Vec<redis::Connection>>,
    worker: Mutex<Option<mpsc::Sender<Job>>>,
    busy: Arc<AtomicUsize>,
}

impl Node {
    fn new(client: redis::Client) -> Node {
        Node {
            client,
            idle: Mutex::new(Vec::new()),
            worker: Mutex::new(None),
            busy: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// True while this master's thread has work queued or running.
    fn busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) > 0
    }

    /// Runs `job` on this master's thread (started when there is none; on
    /// this thread when none can start).
    fn run(&self, job: Job) {
        self.busy.fetch_add(1, Ordering::SeqCst);
        let busy = self.busy.clone();
        let job: Job = Box::new(move || {
            job();
            busy.fetch_sub(1, Ordering::SeqCst);
        });
        let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        let job = match worker.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let started = thread::Builder::new()
            .name("quorum-master".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        match started {
            Ok(_) => {
                let _ = tx.send(job);
                *worker = Some(tx);
            }
            Err(_) => {
                drop(worker);
                job();
            }
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
    /// How step 1 decides: [`Rule::Exact`] but in the tests that show why
    /// the one round trip needs an exact majority and why step 3 exists.
    rule: Rule,
    /// Moves this client's wall clock (0 but in the tests that play a
    /// client whose clock is wrong).
    clock_offset_ms: i64,
    proposer: Mutex<Proposer>,
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
    /// order of `on`, after every master answered or `timeout` passed (a
    /// master not in by then: a timeout).
    fn each<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        on: &[usize],
        timeout: Duration,
        cmd_for: impl Fn(usize) -> Cmd,
    ) -> Vec<RedisResult<T>> {
        timed_out(self.each_until(on, timeout, cmd_for, None, |_| false))
            .into_iter()
            .flatten()
            .collect()
    }

    /// Calls `on_outlier` (when set) with each master left out.
    fn report(&self, outliers: &[Outlier]) {
        if let Some(f) = &self.on_outlier {
            outliers.iter().for_each(|o| f(o));
        }
    }

    /// `cmd_for(i)` on every master `i` of `on` at once, each reply read on
    /// its master's thread as it comes (`retry`, when given, is sent at
    /// once to a master that refused the first as a `FLOOR` too far ahead
    /// of its clock): the replies in (`None`: not in), once every master
    /// answered, or `timeout` passed, or `decided` says so of the replies
    /// in and the [`linger`] after it passed. The calls still out finish on
    /// their threads (their connections go back to the pool).
    fn each_until<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        on: &[usize],
        timeout: Duration,
        cmd_for: impl Fn(usize) -> Cmd,
        retry: Option<&Cmd>,
        decided: impl Fn(&[Option<RedisResult<T>>]) -> bool,
    ) -> Vec<Option<RedisResult<T>>> {
        // Sent on the idle connections on this thread; a master with none
        // connects on its own thread, so that masters which accept no
        // connection cost one timeout in all, not one each; a master whose
        // thread is busy gets it from there, after what came before.
        let start = Instant::now();
        let until = start + timeout.max(Duration::from_millis(1));
        let (tx, rx) = mpsc::channel();
        let mut got: Vec<Option<RedisResult<T>>> = on.iter().map(|_| None).collect();
        for (slot, &i) in on.iter().enumerate() {
            let node = &self.nodes[i];
            let cmd = cmd_for(i);
            let idle = if node.busy() { None } else { node.pooled() };
            let sent = match idle {
                Some(c) => match node.send(Some(c), &cmd, timeout) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        got[slot] = Some(Err(e));
                        continue;
                    }
                },
                None => None,
            };
            let (inner, tx, retry) = (self.clone(), tx.clone(), retry.cloned());
            node.run(Box::new(move || {
                let node = &inner.nodes[i];
                let left = || until.saturating_duration_since(Instant::now());
                let reply = match sent {
                    Some(c) => node.recv(c, until),
                    None => node
                        .send(node.pooled(), &cmd, left())
                        .and_then(|c| node.recv(c, until)),
                };
                let reply = match (reply, retry) {
                    (Err(e), Some(plain)) if floor_refused(&e) => node.call(&plain, left()),
                    (reply, _) => reply,
                };
                let _ = tx.send((slot, reply));
            }));
        }
        drop(tx);
        let mut deadline = until;
        let mut settled = false;
        while got.iter().any(Option::is_none) {
            if !settled && decided(&got) {
                settled = true;
                deadline = deadline.min(Instant::now() + linger(start.elapsed()));
            }
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((slot, r)) => got[slot] = Some(r),
                Err(_) => break,
            }
        }
        got
    }

    fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// `LEASE.RELEASE key owner` everywhere, done once a majority decided
    /// it (the masters not in yet still get it): how many released, of
    /// those in.
    fn release_everywhere(self: &Arc<Self>, key: &str, owner: &str, timeout: Duration) -> usize {
        let n = self.nodes.len();
        self.each_until::<i64>(
            &self.all(),
            timeout,
            |_| release_cmd(key, owner),
            None,
            |got| release_outcome(got, n).is_some(),
        )
        .into_iter()
        .filter(|r| matches!(r, Some(Ok(1))))
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
                rule: Rule::Exact,
                clock_offset_ms: 0,
                proposer: Mutex::new(Proposer::default()),
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
            rule: a.rule,
            clock_offset_ms: a.clock_offset_ms,
            proposer: Mutex::new(Proposer::default()),
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

    /// Skips step 3, the commit of one token to a majority: held with the
    /// highest token granted in step 1, on every master that granted.
    /// Unsafe: tokens may then go backwards when the masters' clocks
    /// differ. Only for tests that show why the step exists.
    #[doc(hidden)]
    pub fn without_the_commit_step(self) -> QuorumClient {
        self.changed(|inner| Inner {
            rule: Rule::WithoutCommit,
            ..inner
        })
    }

    /// Holds in one round trip with the proposal `P` when a majority
    /// granted any token of at least `P`, not only exactly `P` (a majority
    /// of different tokens). Unsafe: a proposal below a token issued
    /// earlier then holds with a lower token. Only for tests that show why
    /// the one round trip needs an exact majority.
    #[doc(hidden)]
    pub fn accepting_different_tokens(self) -> QuorumClient {
        self.changed(|inner| Inner {
            rule: Rule::AtLeast,
            ..inner
        })
    }

    /// Reads this machine's wall clock `ms` later (earlier when negative)
    /// for its proposals: plays a client whose clock is wrong. Only for
    /// tests.
    #[doc(hidden)]
    pub fn with_clock_offset_ms(self, ms: i64) -> QuorumClient {
        self.changed(|inner| Inner {
            clock_offset_ms: ms,
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
        let (q, rule) = (inner.quorum(), inner.rule);
        let timeout = inner.node_timeout(ttl);
        let addr = |i: usize| addr_of(&inner.nodes[i].client);
        let t0 = Instant::now();
        let all = inner.all();
        let sent_ms = wall_ms(inner.clock_offset_ms);
        let p = lock(&inner.proposer).propose(sent_ms, rand::random());
        let replies = inner.each_until(
            &all,
            timeout,
            |_| steps.first(Some(p)),
            Some(&steps.first(None)),
            |got: &[Option<StepReply>]| first_outcome(rule, p, &all, got, q).is_some(),
        );
        lock(&inner.proposer).learn(sent_ms, p, &replies);
        let valid_until = valid_until(t0, ttl);
        let replies = timed_out(replies);
        let first = first_outcome(rule, p, &all, &replies, q).expect("decided with every reply");
        let (token, on) = match first {
            First::Failed => return Ok(None),
            First::Held { token, on } => {
                inner.report(&fast_outliers(token, &all, &replies, addr));
                (token, on)
            }
            // At most one round per master: each leaves one out.
            First::Commit(mut commit) => loop {
                let token = commit.token();
                let replies = inner.each_until(
                    commit.on(),
                    timeout,
                    |_| steps.commit(token),
                    None,
                    |got: &[Option<StepReply>]| commit.decide(got, |_| String::new()).is_some(),
                );
                match commit.decide(&timed_out(replies), addr) {
                    Some(Committed::Again(next, outliers)) => {
                        inner.report(&outliers);
                        commit = next;
                    }
                    Some(Committed::Held { token, on }) => break (token, on),
                    _ => return Ok(None),
                }
            },
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

/// The value behind `m`, also when a thread panicked holding it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        None,
        |got| renew_outcome(got, n).is_some(),
    );
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
