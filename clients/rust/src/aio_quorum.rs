//! Quorum leases on tokio (feature `tokio`): [`QuorumClient`] and
//! [`QuorumLease`], re-exported from `aio`. The same algorithm as the sync
//! [`crate::QuorumClient`] (its decisions are the functions of
//! `quorum.rs`); this file does the async I/O: plain connections per
//! master (`wire.rs`), every step sent to the masters at once, a task per
//! master, decided as soon as a majority decides it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Cmd, FromRedisValue, RedisError, RedisResult};
use tokio::sync::mpsc;

use crate::aio::LossSignal;
use crate::protocol::{
    Committed, First, Outlier, Proposer, Rule, StepReply, Steps, check_ttl, fast_outliers,
    fence_outcome, first_outcome, floor_refused, linger, lost_reply, release_cmd, release_outcome,
    renew_cmd, renew_every, resolve, retry_pause,
};
use crate::quorum::{
    OnOutlier, addr_of, drift, first_renewal, lock, majority, renew_outcome, settle_renewal,
    timed_out as missing_timed_out, valid_until, wall_ms,
};
use crate::raw::fence_cmd_with;
use crate::wire::{Conn, within};
use crate::{Block, Error, Label, Loss, Options, new_owner};

/// One master: its client and its idle connections (each one command at a
/// time, driven on the calling task; a connection whose reply was lost is
/// closed).
struct Node {
    client: redis::Client,
    idle: Mutex<Vec<Conn>>,
    /// The calls that outlived their step (decided without them): the next
    /// call to this master waits for them first, so that a release never
    /// overtakes the acquire it releases.
    late: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Node {
    async fn call<T: FromRedisValue>(&self, cmd: &Cmd, timeout: Duration) -> RedisResult<T> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        within(timeout, async {
            let mut conn = match pooled {
                Some(c) => c,
                None => Conn::open(&self.client).await?,
            };
            let result = conn.call(cmd).await;
            if !result.as_ref().is_err_and(lost_reply) {
                self.idle
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(conn);
            }
            Ok(T::from_redis_value(result?)?)
        })
        .await
    }
}

struct Inner {
    nodes: Vec<Node>,
    opts: Options,
    proposer: Mutex<Proposer>,
    on_outlier: Option<OnOutlier>,
}

impl Inner {
    fn quorum(&self) -> usize {
        majority(self.nodes.len())
    }

    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.opts.io_timeout.min(ttl / 3)
    }

    fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Calls `on_outlier` (when set) with each master left out.
    fn report(&self, outliers: &[Outlier]) {
        if let Some(f) = &self.on_outlier {
            outliers.iter().for_each(|o| f(o));
        }
    }

    /// `cmd` on every master of `on` at once, a task each (`retry`, when
    /// given, is sent at once to a master that refused `cmd` as a `FLOOR`
    /// too far ahead of its clock): the replies in (`None`: not in), once
    /// every master answered, or `timeout` passed, or `decided` says so of
    /// the replies in and the [`linger`] after it passed. The calls still
    /// out go on (a release reaches every master that answers).
    async fn each_until<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        on: &[usize],
        timeout: Duration,
        cmd: &Cmd,
        retry: Option<&Cmd>,
        decided: impl Fn(&[Option<RedisResult<T>>]) -> bool,
    ) -> Vec<Option<RedisResult<T>>> {
        let start = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut calls = Vec::with_capacity(on.len());
        for (slot, &i) in on.iter().enumerate() {
            let (inner, cmd, tx) = (self.clone(), cmd.clone(), tx.clone());
            let retry = retry.cloned();
            let before: Vec<_> = lock(&self.nodes[i].late).drain(..).collect();
            calls.push(tokio::spawn(async move {
                for call in before {
                    let _ = call.await;
                }
                let node = &inner.nodes[i];
                let reply = match (node.call::<T>(&cmd, timeout).await, retry) {
                    (Err(e), Some(plain)) if floor_refused(&e) => {
                        let left = timeout.saturating_sub(start.elapsed());
                        node.call::<T>(&plain, left.max(Duration::from_millis(1)))
                            .await
                    }
                    (reply, _) => reply,
                };
                let _ = tx.send((slot, reply));
            }));
        }
        drop(tx);
        let mut got: Vec<Option<RedisResult<T>>> = on.iter().map(|_| None).collect();
        let mut deadline = start + timeout.max(Duration::from_millis(1)) + Duration::from_millis(5);
        let mut settled = false;
        while got.iter().any(Option::is_none) {
            if !settled && decided(&got) {
                settled = true;
                deadline = deadline.min(Instant::now() + linger(start.elapsed()));
            }
            let wake = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(wake, rx.recv()).await {
                Ok(Some((slot, r))) => got[slot] = Some(r),
                _ => break,
            }
        }
        for ((&i, call), r) in on.iter().zip(calls).zip(&got) {
            if r.is_none() {
                lock(&self.nodes[i].late).push(call);
            }
        }
        got
    }

    /// `cmd` on every master of `on` at once: every reply (a master not in
    /// within `timeout`: a timeout).
    async fn each<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        on: &[usize],
        timeout: Duration,
        cmd: &Cmd,
    ) -> Vec<RedisResult<T>> {
        let got = self.each_until(on, timeout, cmd, None, |_| false).await;
        missing_timed_out(got).into_iter().flatten().collect()
    }

    /// `LEASE.RELEASE` everywhere, done once a majority decided it: how
    /// many released, of those in.
    async fn release_everywhere(
        self: &Arc<Self>,
        key: &str,
        owner: &str,
        timeout: Duration,
    ) -> usize {
        let n = self.nodes.len();
        let replies = self
            .each_until::<i64>(
                &self.all(),
                timeout,
                &release_cmd(key, owner),
                None,
                |got| release_outcome(got, n).is_some(),
            )
            .await;
        replies
            .into_iter()
            .filter(|r| matches!(r, Some(Ok(1))))
            .count()
    }
}

/// Takes quorum leases on N independent masters from async code, as
/// [`crate::QuorumClient`]. Cheap to clone; the clones share the
/// connections.
#[derive(Clone)]
pub struct QuorumClient {
    inner: Arc<Inner>,
    /// The `LABEL` of its acquires on every master (`None`: none),
    /// resolved once.
    label: Option<Arc<str>>,
}

impl QuorumClient {
    /// Leases on the masters at `urls`.
    pub fn open(urls: &[&str]) -> Result<QuorumClient, Error> {
        let clients = urls
            .iter()
            .map(|u| redis::Client::open(*u))
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(QuorumClient::new(clients))
    }

    /// Leases on the masters of `clients`.
    pub fn new(clients: Vec<redis::Client>) -> QuorumClient {
        QuorumClient::with(
            clients,
            Options::default(),
            None,
            resolve(&Label::Default, None),
        )
    }

    fn with(
        clients: Vec<redis::Client>,
        opts: Options,
        on_outlier: Option<OnOutlier>,
        label: Option<Arc<str>>,
    ) -> QuorumClient {
        let nodes = clients
            .into_iter()
            .map(|client| Node {
                client,
                idle: Mutex::new(Vec::new()),
                late: Mutex::new(Vec::new()),
            })
            .collect();
        QuorumClient {
            inner: Arc::new(Inner {
                nodes,
                opts,
                proposer: Mutex::new(Proposer::default()),
                on_outlier,
            }),
            label,
        }
    }

    fn clients(&self) -> Vec<redis::Client> {
        self.inner.nodes.iter().map(|n| n.client.clone()).collect()
    }

    /// The same masters (and label) with other timeouts (new connections).
    pub fn with_options(self, opts: Options) -> QuorumClient {
        let on_outlier = self.inner.on_outlier.clone();
        QuorumClient::with(self.clients(), opts, on_outlier, self.label)
    }

    /// As [`crate::QuorumClient::on_outlier`] (new connections). `f` runs
    /// on the acquiring task: keep it short, and do not block in it.
    pub fn on_outlier(self, f: impl Fn(&Outlier) + Send + Sync + 'static) -> QuorumClient {
        let opts = self.inner.opts.clone();
        QuorumClient::with(self.clients(), opts, Some(Arc::new(f)), self.label)
    }

    /// As [`crate::QuorumClient::with_label`]: step 1 and every commit
    /// round send `label` on every master and every try; by default
    /// [`Label::Default`], [`Label::None`] for none. For one call, label a
    /// clone (it shares the connections).
    pub fn with_label(mut self, label: Label) -> QuorumClient {
        self.label = resolve(&label, None);
        self
    }

    /// The label its acquires send (`None`: none).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// How many masters make a majority.
    pub fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    /// As [`crate::QuorumClient::acquire`], labelled with this client's
    /// [`label`](Self::label). Call it inside a tokio runtime.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        block: Block,
    ) -> Result<Option<QuorumLease>, Error> {
        check_ttl(ttl)?;
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
            if let Some(held) = self.attempt(steps).await {
                return Ok(Some(held));
            }
            self.inner
                .release_everywhere(key, &owner, self.inner.node_timeout(ttl))
                .await;
            let pause = crate::quorum::backoff(ttl);
            if until.is_some_and(|u| Instant::now() + pause >= u) {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
        }
    }

    async fn attempt(&self, steps: Steps<'_>) -> Option<QuorumLease> {
        let Steps {
            key, owner, ttl, ..
        } = steps;
        let inner = &self.inner;
        let q = inner.quorum();
        let timeout = inner.node_timeout(ttl);
        let addr = |i: usize| addr_of(&inner.nodes[i].client);
        let t0 = Instant::now();
        let all = inner.all();
        let sent_ms = wall_ms(0);
        let p = lock(&inner.proposer).propose(sent_ms, rand::random());
        let decided =
            |got: &[Option<StepReply>]| first_outcome(Rule::Exact, p, &all, got, q).is_some();
        let replies = inner
            .each_until(
                &all,
                timeout,
                &steps.first(Some(p)),
                Some(&steps.first(None)),
                decided,
            )
            .await;
        lock(&inner.proposer).learn(sent_ms, p, &replies);
        let valid_until = valid_until(t0, ttl);
        let replies = missing_timed_out(replies);
        let (token, on) = match first_outcome(Rule::Exact, p, &all, &replies, q)? {
            First::Failed => return None,
            First::Held { token, on } => {
                inner.report(&fast_outliers(token, &all, &replies, addr));
                (token, on)
            }
            // At most one round per master: each leaves one out.
            First::Commit(mut commit) => loop {
                let step = steps.commit(commit.token());
                let decided =
                    |got: &[Option<StepReply>]| commit.decide(got, |_| String::new()).is_some();
                let replies = inner
                    .each_until(commit.on(), timeout, &step, None, decided)
                    .await;
                match commit.decide(&missing_timed_out(replies), addr)? {
                    Committed::Again(next, outliers) => {
                        inner.report(&outliers);
                        commit = next;
                    }
                    Committed::Held { token, on } => break (token, on),
                    Committed::Failed => return None,
                }
            },
        };
        if Instant::now() >= valid_until {
            return None;
        }
        Some(QuorumLease::start(
            self,
            key,
            owner,
            token,
            ttl,
            valid_until,
            on,
        ))
    }
}

/// A quorum lease (async), as [`crate::QuorumLease`]. Give it back with
/// [`QuorumLease::release`]; dropping it spawns the release.
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
            tokio::spawn(async move { watchdog(&client, &key, &owner, ttl, &signal).await });
        }
        lease
    }

    /// The fencing token, the same on every master that committed it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The masters (indexes in the client's list) that committed the token.
    pub fn committed(&self) -> &[usize] {
        &self.committed
    }

    /// The loss signal.
    pub fn signal(&self) -> LossSignal {
        self.signal.clone()
    }

    /// True once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.signal.is_lost()
    }

    /// Why the lease is lost, `None` while it is held.
    pub fn loss(&self) -> Option<Loss> {
        self.signal.loss()
    }

    /// Renews on every master now: `Ok(true)` when a majority renewed.
    pub async fn renew(&self) -> Result<bool, Error> {
        Ok(
            renew_round(&self.client, &self.key, &self.owner, self.ttl, &self.signal).await
                == Some(true),
        )
    }

    /// As [`crate::QuorumLease::fence`]: the first reply of a master that
    /// ran it (the command's own error when it failed there), or
    /// [`Error::Stale`] when the token was current on fewer than a
    /// majority.
    pub async fn fence<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        self.fence_with(None, cmd).await
    }

    /// As [`crate::QuorumLease::fence_min_ttl`]: `MINTTL` on every master,
    /// [`Error::Expiring`] when the token was current on a majority but
    /// too few of them had `min_ttl` left.
    pub async fn fence_min_ttl<T: FromRedisValue>(
        &self,
        min_ttl: Duration,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        self.fence_with(Some(min_ttl), cmd).await
    }

    async fn fence_with<T: FromRedisValue>(
        &self,
        min_ttl: Option<Duration>,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        let inner = &self.client.inner;
        let fenced = fence_cmd_with(&self.key, self.token, min_ttl, cmd);
        let replies = inner
            .each::<redis::Value>(&self.committed, inner.opts.io_timeout, &fenced)
            .await;
        let first = fence_outcome(replies, inner.quorum())?;
        Ok(T::from_redis_value(first).map_err(RedisError::from)?)
    }

    /// Gives the lease back on every master: `Ok(true)` when a majority
    /// released it.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.released = true;
        self.signal.lose(Loss::Released);
        let inner = &self.client.inner;
        Ok(inner
            .release_everywhere(&self.key, &self.owner, inner.node_timeout(self.ttl))
            .await
            >= inner.quorum())
    }
}

impl Drop for QuorumLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.signal.lose(Loss::Released);
        let (inner, key, owner, ttl) = (
            self.client.inner.clone(),
            self.key.clone(),
            self.owner.clone(),
            self.ttl,
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                inner
                    .release_everywhere(&key, &owner, inner.node_timeout(ttl))
                    .await;
            });
        }
    }
}

async fn renew_round(
    client: &QuorumClient,
    key: &str,
    owner: &str,
    ttl: Duration,
    signal: &LossSignal,
) -> Option<bool> {
    let inner = &client.inner;
    let n = inner.nodes.len();
    let sent = Instant::now();
    let replies = inner
        .each_until(
            &inner.all(),
            inner.node_timeout(ttl),
            &renew_cmd(key, owner, ttl),
            None,
            |got| renew_outcome(got, n).is_some(),
        )
        .await;
    settle_renewal(
        renew_outcome(&replies, n),
        || signal.extend(sent, ttl - drift(ttl).min(ttl)),
        || signal.lose(Loss::Refused),
    )
}

async fn watchdog(
    client: &QuorumClient,
    key: &str,
    owner: &str,
    ttl: Duration,
    signal: &LossSignal,
) {
    let mut next = first_renewal(signal.deadline(), ttl);
    loop {
        let wake = tokio::time::Instant::from_std(next);
        if tokio::time::timeout_at(wake, signal.lost()).await.is_ok() {
            return;
        }
        match renew_round(client, key, owner, ttl, signal).await {
            Some(true) => next = Instant::now() + renew_every(ttl),
            Some(false) => return,
            None => next = Instant::now() + retry_pause(ttl),
        }
    }
}
