//! The async API, on tokio (feature `tokio`): the same helpers as the sync
//! API, with futures.
//!
//! - [`LeaseClient::acquire`] returns a [`Lease`] guard; its watchdog is a
//!   tokio task with its own connection.
//! - A [`Lease`] derefs to a [`LeaseHandle`] (token, fence, renew, loss
//!   signal). Handles are cheap clones, `Send`, for other tasks.
//! - [`Lease::release`] gives it back. Dropping the guard stops the
//!   watchdog and spawns the release on the current runtime (a drop cannot
//!   wait): call `release().await` to know it was done. A release that never
//!   ran (the runtime was shutting down) leaves the lease to end at its ttl.
//! - [`LeaseClient::with_lease`] runs an async job holding the lease and
//!   releases it however the job ends (the guard's drop covers a panic, and
//!   a `with_lease` future dropped before it finished).
//!
//! Every call is bounded by a tokio timeout of its own (the redis crate's
//! response timeout is switched off on the connections made here; on a
//! [`ClusterClient`] do not set one shorter than your `BLOCK` waits).

use std::future::Future;
use std::io;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, RedisResult};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::{
    Block, Error, Held, Loss, Mode, Options, ReleasePlan, acquire_cmd, check_ttl, fence_cmd,
    grace_of, lost_during, lost_reply, millis, new_owner, normalize, release_failed, release_opts,
    release_plan, renew_every, retry_pause, work_result,
};

#[derive(Clone)]
enum Backend {
    One(redis::Client),
    Cluster(Box<ClusterClient>),
}

#[derive(Clone)]
enum Conn {
    One(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

fn timed_out(what: &'static str) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::TimedOut, what))
}

impl Conn {
    async fn open(backend: &Backend, opts: &Options) -> RedisResult<Conn> {
        let limit = opts.connect_timeout + opts.io_timeout;
        let open = async {
            match backend {
                Backend::One(c) => {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(opts.connect_timeout))
                        .set_response_timeout(None);
                    c.get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Conn::One)
                }
                Backend::Cluster(c) => c
                    .get_async_connection_with_config(
                        ClusterConfig::new().set_connection_timeout(opts.connect_timeout),
                    )
                    .await
                    .map(Conn::Cluster),
            }
        };
        tokio::time::timeout(limit, open)
            .await
            .map_err(|_| timed_out("connecting timed out"))?
    }

    /// Does the connection still answer (`PING` within `read`)? A cluster
    /// connection says yes: it replaces its node connections itself.
    async fn alive(&mut self, read: Duration) -> bool {
        match self {
            Conn::One(_) => self
                .call::<String>(&redis::cmd("PING"), Some(read))
                .await
                .is_ok(),
            Conn::Cluster(_) => true,
        }
    }

    /// Runs `cmd`, waiting at most `read` for the reply (`None`: no limit).
    async fn call<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        read: Option<Duration>,
    ) -> RedisResult<T> {
        let call = async {
            match self {
                Conn::One(c) => cmd.query_async(c).await,
                Conn::Cluster(c) => cmd.query_async(c).await,
            }
        };
        match read {
            Some(d) => tokio::time::timeout(d.max(Duration::from_millis(1)), call)
                .await
                .map_err(|_| timed_out("no reply in time"))?,
            None => call.await,
        }
    }
}

/// Opens leases on one server or a cluster, from async code. Cheap to
/// clone; every lease gets its own connections (one for the holder, one for
/// its watchdog).
#[derive(Clone)]
pub struct LeaseClient {
    backend: Backend,
    opts: Options,
    mode: Mode,
    /// The loss signals of the leases this client (and its clones) took, by
    /// key: a second acquire of a key still held fails at once.
    held: Held,
}

impl LeaseClient {
    /// Leases on the server at `url`.
    pub fn open(url: &str) -> Result<LeaseClient, Error> {
        Ok(LeaseClient::new(redis::Client::open(url)?))
    }

    /// Leases on the server of `client`.
    pub fn new(client: redis::Client) -> LeaseClient {
        LeaseClient {
            backend: Backend::One(client),
            opts: Options::default(),
            mode: Mode::Exclusive,
            held: Held::default(),
        }
    }

    /// Leases on a Redis Cluster, routed by the lease key's slot.
    pub fn cluster(client: ClusterClient) -> LeaseClient {
        LeaseClient {
            backend: Backend::Cluster(Box::new(client)),
            opts: Options::default(),
            mode: Mode::Exclusive,
            held: Held::default(),
        }
    }

    /// The same client taking leases of `mode` (exclusive by default;
    /// [`Mode::Shared`] readers, [`Mode::Limit`] permits). Clones share
    /// what this client holds.
    pub fn with_mode(mut self, mode: Mode) -> LeaseClient {
        self.mode = mode;
        self
    }

    /// The same client with other timeouts and retries.
    pub fn with_options(mut self, opts: Options) -> LeaseClient {
        self.opts = opts;
        self
    }

    /// Takes the lease on `key` for `ttl`, with a fresh random owner id; as
    /// [`crate::LeaseClient::acquire`] (the same retries of a lost reply
    /// with the same owner, the same read timeouts). Call it inside a tokio
    /// runtime: the watchdog is spawned on it.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        block: Block,
    ) -> Result<Option<Lease>, Error> {
        check_ttl(ttl)?;
        self.held.check(key)?;
        let block = normalize(block);
        let owner = new_owner();
        let wait_until = match block {
            Block::For(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut attempt = 0;
        loop {
            let (cmd, read) =
                acquire_cmd(key, &owner, ttl, self.mode, block, wait_until, &self.opts);
            let mut sent = Instant::now();
            let result = match Conn::open(&self.backend, &self.opts).await {
                Ok(mut conn) => {
                    sent = Instant::now();
                    conn.call::<Option<u64>>(&cmd, read)
                        .await
                        .map(|t| (conn, t))
                }
                Err(e) => Err(e),
            };
            match result {
                Ok((mut conn, None)) => {
                    // Null: another owner, or the server's grace period;
                    // the server says which.
                    let info = conn
                        .call::<String>(redis::cmd("INFO").arg("lease"), Some(self.opts.io_timeout))
                        .await
                        .unwrap_or_default();
                    return match grace_of(&info) {
                        Some(grace) => Err(grace),
                        None => Ok(None),
                    };
                }
                Ok((conn, Some(token))) => {
                    let lease = Lease::start(self, key, owner, token, ttl, sent, conn).await;
                    let signal = lease.signal();
                    self.held.insert(key, move || signal.loss().is_none());
                    return Ok(Some(lease));
                }
                Err(e) if lost_reply(&e) && attempt < self.opts.retries => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Runs the job `work` holding the lease on `key`, and releases it
    /// however the job ends. `work` gets a [`LeaseHandle`]: it fences its
    /// writes with it, and is told to stop by [`LeaseHandle::is_lost`] or
    /// [`LeaseHandle::lost`] (which completes the moment the lease is lost,
    /// for a `tokio::select!`). Its result is returned as it is; `Ok(None)`:
    /// the lease was not obtained.
    pub async fn with_lease<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        block: Block,
        work: F,
    ) -> Result<Option<T>, E>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let Some(lease) = self.acquire(key, ttl, block).await? else {
            return Ok(None);
        };
        let result = work(lease.handle()).await;
        let lost = lost_during(lease.loss());
        let _ = lease.release().await;
        work_result(result, lost)
    }
}

#[derive(Clone, Copy)]
struct State {
    deadline: Instant,
    loss: Option<Loss>,
}

impl State {
    fn loss(&self) -> Option<Loss> {
        self.loss
            .or_else(|| (Instant::now() >= self.deadline).then_some(Loss::Expired))
    }
}

/// The loss signal of a lease, as [`crate::LossSignal`], with an async
/// wait. Cheap to clone.
#[derive(Clone)]
pub struct LossSignal(Arc<watch::Sender<State>>);

impl LossSignal {
    /// Why the lease is lost, `None` while it is held. Never waits.
    pub fn loss(&self) -> Option<Loss> {
        self.0.borrow().loss()
    }

    /// True once the lease is lost (or released). Never waits.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Completes when the lease is lost: at once at the client-side
    /// deadline, or when a renewal is refused or the lease released.
    pub async fn lost(&self) -> Loss {
        let mut rx = self.0.subscribe();
        loop {
            let st = *rx.borrow_and_update();
            if let Some(loss) = st.loss() {
                return loss;
            }
            let wake = tokio::time::Instant::from_std(st.deadline);
            let _ = tokio::time::timeout_at(wake, rx.changed()).await;
        }
    }

    /// The client-side deadline.
    pub fn deadline(&self) -> Instant {
        self.0.borrow().deadline
    }

    fn extend(&self, sent: Instant, ttl: Duration) -> bool {
        let mut ok = false;
        self.0.send_modify(|st| {
            if st.loss().is_none() {
                st.deadline = st.deadline.max(sent + ttl);
                ok = true;
            } else if st.loss.is_none() {
                st.loss = Some(Loss::Expired);
            }
        });
        ok
    }

    fn lose(&self, loss: Loss) {
        self.0.send_modify(|st| {
            if st.loss.is_none() {
                st.loss = Some(st.loss().unwrap_or(loss));
            }
        });
    }
}

struct Inner {
    key: String,
    owner: String,
    token: u64,
    ttl: Duration,
    conn: Mutex<Option<Conn>>,
    backend: Backend,
    opts: Options,
    signal: LossSignal,
    watchdog: Mutex<Option<AbortHandle>>,
    /// How often the watchdog found its connection closed (shared with
    /// it), and when `conn` last answered with that count then: an idle or
    /// suspect connection is checked before the next call, as in the sync
    /// `Lease`.
    dropped: Arc<AtomicU64>,
    conn_used: Mutex<(Instant, u64)>,
}

/// As the sync API's: a holder connection idle this long is checked with
/// `PING` before its next call.
const IDLE_CHECK: Duration = Duration::from_millis(100);

/// What a job holding a lease works with: token, fenced writes, renewal and
/// the loss signal (no release: the [`Lease`] guard does that). Cheap to
/// clone, `Send`.
#[derive(Clone)]
pub struct LeaseHandle(Arc<Inner>);

impl LeaseHandle {
    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.0.token
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.0.key
    }

    /// The ttl each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.0.ttl
    }

    /// The loss signal.
    pub fn signal(&self) -> LossSignal {
        self.0.signal.clone()
    }

    /// Why the lease is lost, `None` while it is held. Never waits.
    pub fn loss(&self) -> Option<Loss> {
        self.0.signal.loss()
    }

    /// True once the lease is lost. Never waits.
    pub fn is_lost(&self) -> bool {
        self.0.signal.is_lost()
    }

    /// Completes the moment the lease is lost.
    pub async fn lost(&self) -> Loss {
        self.0.signal.lost().await
    }

    async fn call<T: FromRedisValue>(&self, cmd: &Cmd, read: Duration) -> Result<T, Error> {
        self.call_with(cmd, read, &self.0.opts).await
    }

    /// `call`, opening a connection (when there is none) with `opts`.
    async fn call_with<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        read: Duration,
        opts: &Options,
    ) -> Result<T, Error> {
        let current = self
            .0
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let dropped = self.0.dropped.load(Ordering::Relaxed);
        let (used, seen) = *self.0.conn_used.lock().unwrap_or_else(|p| p.into_inner());
        // An idle or suspect connection is checked first: nothing sent on a
        // closed one can have reached the server, so the call goes out
        // once, on a new connection (a fence too).
        let current = match current {
            Some(mut c) if seen != dropped || used.elapsed() >= IDLE_CHECK => {
                c.alive(opts.io_timeout).await.then_some(c)
            }
            other => other,
        };
        let mut conn = match current {
            Some(c) => c,
            None => {
                let c = Conn::open(&self.0.backend, opts).await?;
                *self.0.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
                c
            }
        };
        let result = conn.call(cmd, Some(read)).await;
        match &result {
            Err(e) if lost_reply(e) => {
                *self.0.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
            _ => {
                *self.0.conn_used.lock().unwrap_or_else(|p| p.into_inner()) =
                    (Instant::now(), dropped);
            }
        }
        Ok(result?)
    }

    /// Renews now, besides the watchdog: `Ok(true)` renewed, `Ok(false)` the
    /// server says the lease is not ours (the loss signal turns on).
    pub async fn renew(&self) -> Result<bool, Error> {
        let sent = Instant::now();
        let read = self
            .0
            .signal
            .deadline()
            .saturating_duration_since(sent)
            .min(self.0.opts.io_timeout);
        let cmd = renew_cmd(&self.0.key, &self.0.owner, self.0.ttl);
        match self.call::<i64>(&cmd, read).await? {
            1 => Ok(self.0.signal.extend(sent, self.0.ttl)),
            _ => {
                self.0.signal.lose(Loss::Refused);
                Ok(false)
            }
        }
    }

    /// `cmd` run through the fence (`LEASE.FENCE key token <cmd>`); a
    /// `STALE` refusal is [`Error::Stale`] and nothing was run.
    pub async fn fence<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        let fenced = fence_cmd(&self.0.key, self.0.token, cmd);
        self.call(&fenced, self.0.opts.io_timeout).await
    }

    /// The fenced form of `cmd`, for a connection or pipeline of your own.
    pub fn fence_cmd(&self, cmd: &Cmd) -> Cmd {
        fence_cmd(&self.0.key, self.0.token, cmd)
    }

    fn stop_watchdog(&self) {
        if let Some(h) = self
            .0
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.abort();
        }
        self.0.signal.lose(Loss::Released);
    }

    async fn release(&self) -> Result<bool, Error> {
        let plan = release_plan(self.0.signal.loss());
        self.stop_watchdog();
        let mut cmd = redis::cmd("LEASE.RELEASE");
        cmd.arg(&self.0.key).arg(&self.0.owner);
        let Some(opts) = release_opts(plan, &self.0.opts) else {
            return Ok(false);
        };
        if plan == ReleasePlan::Short {
            // One attempt on the connection there is: no check first.
            *self.0.conn_used.lock().unwrap_or_else(|p| p.into_inner()) =
                (Instant::now(), self.0.dropped.load(Ordering::Relaxed));
        }
        let mut attempt = 0;
        loop {
            match self.call_with::<i64>(&cmd, opts.io_timeout, &opts).await {
                Ok(n) => return Ok(n == 1),
                Err(e) => {
                    if let Some(answer) = release_failed(e, &mut attempt, &opts, plan) {
                        return answer;
                    }
                }
            }
        }
    }
}

/// A held lease: the guard of one acquisition. Derefs to its
/// [`LeaseHandle`]. Give it back with [`Lease::release`]; dropping it
/// spawns the release.
pub struct Lease {
    handle: LeaseHandle,
    released: bool,
}

impl Deref for Lease {
    type Target = LeaseHandle;
    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl Lease {
    async fn start(
        client: &LeaseClient,
        key: &str,
        owner: String,
        token: u64,
        ttl: Duration,
        sent: Instant,
        conn: Conn,
    ) -> Lease {
        let mut conn = conn;
        // As in the sync API: after a long wait, count from a renewal sent
        // now rather than from the acquire.
        let mut deadline = sent + ttl;
        let mut loss = None;
        if sent.elapsed() >= renew_every(ttl) {
            let renewed = Instant::now();
            let cmd = renew_cmd(key, &owner, ttl);
            match conn.call::<i64>(&cmd, Some(client.opts.io_timeout)).await {
                Ok(1) => deadline = renewed + ttl,
                Ok(_) => loss = Some(Loss::Refused),
                Err(_) => {}
            }
        }
        let (tx, _) = watch::channel(State { deadline, loss });
        let handle = LeaseHandle(Arc::new(Inner {
            key: key.to_string(),
            owner,
            token,
            ttl,
            conn: Mutex::new(Some(conn)),
            backend: client.backend.clone(),
            opts: client.opts.clone(),
            signal: LossSignal(Arc::new(tx)),
            watchdog: Mutex::new(None),
            dropped: Arc::new(AtomicU64::new(0)),
            conn_used: Mutex::new((Instant::now(), 0)),
        }));
        if client.opts.watchdog {
            let dog = Watchdog {
                signal: handle.0.signal.clone(),
                dropped: handle.0.dropped.clone(),
                backend: client.backend.clone(),
                opts: client.opts.clone(),
                renew: renew_cmd(key, &handle.0.owner, ttl),
                ttl,
            };
            let first = handle.0.signal.deadline() - ttl + renew_every(ttl);
            let task = tokio::spawn(dog.run(first));
            *handle.0.watchdog.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(task.abort_handle());
        }
        Lease {
            handle,
            released: false,
        }
    }

    /// A handle for other tasks (no release).
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Gives the lease back and stops the watchdog: `Ok(true)` it was ours,
    /// `Ok(false)` it was lost before. A lost reply is retried.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.released = true;
        self.handle.release().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.handle.stop_watchdog();
        let handle = self.handle.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = handle.release().await;
            });
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.handle.0.key)
            .field("token", &self.handle.0.token)
            .field("loss", &self.handle.loss())
            .finish()
    }
}

fn renew_cmd(key: &str, owner: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("LEASE.RENEW");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    cmd
}

struct Watchdog {
    signal: LossSignal,
    dropped: Arc<AtomicU64>,
    backend: Backend,
    opts: Options,
    renew: Cmd,
    ttl: Duration,
}

impl Watchdog {
    async fn run(self, mut next: Instant) {
        let mut rx = self.signal.0.subscribe();
        let mut conn: Option<Conn> = None;
        loop {
            let st = *rx.borrow_and_update();
            if st.loss().is_some() {
                return;
            }
            let now = Instant::now();
            if now < next {
                let wake = tokio::time::Instant::from_std(next.min(st.deadline));
                let _ = tokio::time::timeout_at(wake, rx.changed()).await;
                continue;
            }
            let read = st
                .deadline
                .saturating_duration_since(now)
                .min(self.opts.io_timeout);
            let reply = match conn.as_mut() {
                Some(c) => c.call::<i64>(&self.renew, Some(read)).await,
                None => match Conn::open(&self.backend, &self.opts).await {
                    Ok(mut c) => {
                        let r = c.call::<i64>(&self.renew, Some(read)).await;
                        conn = Some(c);
                        r
                    }
                    Err(e) => Err(e),
                },
            };
            match reply {
                Ok(1) => {
                    if !self.signal.extend(now, self.ttl) {
                        return;
                    }
                    next = now + renew_every(self.ttl);
                }
                Ok(_) => {
                    self.signal.lose(Loss::Refused);
                    return;
                }
                Err(e) => {
                    if lost_reply(&e) {
                        conn = None;
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    next = Instant::now() + retry_pause(self.ttl);
                }
            }
        }
    }
}
