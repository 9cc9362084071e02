//! The async API, on tokio (feature `tokio`): the same helpers as the sync
//! API, with futures.
//!
//! - [`LeaseClient::acquire`] returns a [`Lease`] guard. A client and its
//!   clones share one multiplexed connection for every lease's calls (a
//!   blocking acquire takes a connection of its own while it waits) and one
//!   watchdog task, which renews all their leases in batches, one pipeline
//!   per round, on a connection of its own.
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
//! What to send and what a reply means is decided in `protocol/`, as for
//! the sync API; this file only does the async I/O.
//!
//! Every call is bounded by a tokio timeout of its own (the redis crate's
//! response timeout is switched off on the connections made here; on a
//! [`ClusterClient`] do not set one shorter than your `BLOCK` waits).

use std::future::Future;
use std::io;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, RedisResult, Value};
use tokio::sync::{Notify, watch};

use crate::protocol::{
    Acquire, Backend, Fresh, Held, Keys, Next, POOL_IDLE, ReleasePlan, Renewable, Reply, Schedule,
    guard_cmd, guard_reply, linger_left, lost_during, lost_reply, parse_waiters, refused,
    release_failed, release_opts, release_plan, renew_every, renews_first, resolve, short, start,
    unguard_cmd, unguard_reply, waiters_cmd, waits, work_result,
};
use crate::raw::fence_cmd_with;
use crate::{Block, Error, Label, Loss, Mode, Options, Waiter, WatchdogStats, fence_cmd};

pub use crate::aio_quorum::{QuorumClient, QuorumLease};

#[derive(Clone)]
enum Conn {
    One(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

fn timed_out(what: &'static str) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::TimedOut, what))
}

/// The routing of a command to the master of `key`'s slot.
fn slot_of(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key,
        SlotAddr::Master,
    )))
}

/// `cmd` on a cluster connection: on the master of `route`'s slot when
/// given (`LEASE.M*`, whose first argument is the key count, which the
/// redis crate would route by), else where the redis crate routes it.
async fn on_cluster<T: FromRedisValue>(
    c: &mut redis::cluster_async::ClusterConnection,
    cmd: &Cmd,
    route: Option<&str>,
) -> RedisResult<T> {
    match route {
        Some(key) => {
            let value = c.route_command(cmd.clone(), slot_of(key)).await?;
            Ok(redis::from_redis_value(value.extract_error()?)?)
        }
        None => cmd.query_async(c).await,
    }
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
        self.call_on(cmd, None, read).await
    }

    /// Runs `cmd` as [`Conn::call`]; on a cluster, on the master of
    /// `route`'s slot when given (see [`on_cluster`]).
    async fn call_on<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        route: Option<&str>,
        read: Option<Duration>,
    ) -> RedisResult<T> {
        let call = async {
            match self {
                Conn::One(c) => cmd.query_async(c).await,
                Conn::Cluster(c) => on_cluster(c, cmd, route).await,
            }
        };
        match read {
            Some(d) => tokio::time::timeout(d.max(Duration::from_millis(1)), call)
                .await
                .map_err(|_| timed_out("no reply in time"))?,
            None => call.await,
        }
    }
    /// Sends the renewals `cmds` and reads every reply within `read`: one
    /// pipeline on one server; on a cluster each renewal goes to its
    /// slot's master at once, all in flight together (the cluster
    /// connection pipelines them per node); `routes`: the key to route each
    /// by, for `LEASE.MRENEW` (see [`on_cluster`]).
    async fn renew_all(
        &mut self,
        cmds: &[Cmd],
        routes: &[Option<String>],
        read: Duration,
    ) -> RedisResult<Vec<Reply>> {
        let send = async {
            let values: Vec<Value> = match self {
                Conn::One(c) => {
                    let mut pipe = redis::pipe();
                    pipe.ignore_errors();
                    for cmd in cmds {
                        pipe.add_command(cmd.clone());
                    }
                    pipe.query_async(c).await?
                }
                Conn::Cluster(c) => {
                    let mut set = tokio::task::JoinSet::new();
                    for (i, cmd) in cmds.iter().enumerate() {
                        let (mut c, cmd) = (c.clone(), cmd.clone());
                        let route = routes.get(i).cloned().flatten();
                        set.spawn(async move {
                            let got = on_cluster::<Value>(&mut c, &cmd, route.as_deref()).await;
                            (i, got)
                        });
                    }
                    let mut values = vec![Value::Nil; cmds.len()];
                    while let Some(done) = set.join_next().await {
                        if let Ok((i, Ok(v))) = done {
                            values[i] = v;
                        }
                    }
                    values
                }
            };
            Ok::<_, RedisError>(values)
        };
        let values = tokio::time::timeout(read.max(Duration::from_millis(1)), send)
            .await
            .map_err(|_| timed_out("no reply in time"))??;
        Ok(values.into_iter().map(Reply::from).collect())
    }
}

/// What one client and its clones share: the multiplexed connection every
/// lease's calls go over, an idle pool of connections for blocking
/// acquires (a connection blocked in `BLOCK` carries nothing else), and the
/// watchdog task with its schedule.
struct Hub {
    backend: Backend,
    opts: Options,
    shared: Mutex<Option<(Conn, Fresh)>>,
    idle: Mutex<Vec<(Conn, Fresh)>>,
    /// Connections found closed: a connection older than the last drop is
    /// checked before use.
    drops: AtomicU64,
    dog: Mutex<Dog>,
    wake: Notify,
}

struct Dog {
    schedule: Schedule<LossSignal>,
    /// The watchdog task runs (it ends when no lease is left).
    running: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hub {
    fn new(backend: Backend, opts: Options) -> Arc<Hub> {
        Arc::new(Hub {
            backend,
            opts,
            shared: Mutex::new(None),
            idle: Mutex::new(Vec::new()),
            drops: AtomicU64::new(0),
            dog: Mutex::new(Dog {
                schedule: Schedule::default(),
                running: false,
            }),
            wake: Notify::new(),
        })
    }

    fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }

    fn dropped(&self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }

    /// The shared connection: checked with `PING` first when suspect
    /// (unless `check` is false), opened when there is none or it is dead.
    async fn shared(&self, opts: &Options, check: bool) -> RedisResult<Conn> {
        let current = lock(&self.shared).clone();
        if let Some((mut conn, fresh)) = current {
            if !check || !fresh.suspect(self.drops()) || conn.alive(opts.io_timeout).await {
                return Ok(conn);
            }
            self.dropped();
        }
        let conn = Conn::open(&self.backend, opts).await?;
        *lock(&self.shared) = Some((conn.clone(), Fresh::now(self.drops())));
        Ok(conn)
    }

    /// Runs `cmd` on the shared connection, waiting at most `read`
    /// (`route`: as [`Conn::call_on`]). A lost reply closes it for every
    /// caller: the next call opens another.
    async fn call<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        route: Option<&str>,
        read: Duration,
        opts: &Options,
        check: bool,
    ) -> Result<T, Error> {
        let mut conn = self.shared(opts, check).await?;
        let result = conn.call_on(cmd, route, Some(read)).await;
        let mut shared = lock(&self.shared);
        match &result {
            Err(e) if lost_reply(e) => {
                *shared = None;
                self.dropped();
            }
            _ => {
                if let Some((_, fresh)) = shared.as_mut() {
                    *fresh = Fresh::now(self.drops());
                }
            }
        }
        Ok(result?)
    }

    /// A connection of its own for a blocking acquire: an idle one
    /// (checked when suspect), else a new one.
    async fn take(&self, opts: &Options) -> RedisResult<Conn> {
        loop {
            let idle = lock(&self.idle).pop();
            match idle {
                Some((mut conn, fresh)) => {
                    if !fresh.suspect(self.drops()) || conn.alive(opts.io_timeout).await {
                        return Ok(conn);
                    }
                    self.dropped();
                }
                None => return Conn::open(&self.backend, opts).await,
            }
        }
    }

    fn give(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        if idle.len() < POOL_IDLE {
            idle.push((conn, Fresh::now(self.drops())));
        }
    }

    /// Watches a lease on `keys` (first renewal at `first`), spawning the
    /// watchdog task on the current runtime when none runs.
    fn watch(
        self: &Arc<Hub>,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        first: Instant,
        signal: LossSignal,
    ) -> u64 {
        let mut dog = lock(&self.dog);
        let (id, wake) = dog.schedule.add(keys, owner, ttl, first, signal);
        if !dog.running {
            dog.running = true;
            tokio::spawn(self.clone().run_watchdog());
        }
        if wake {
            self.wake.notify_one();
        }
        id
    }

    fn forget(&self, id: u64) {
        lock(&self.dog).schedule.remove(id);
    }

    /// The watchdog: sends each batch the schedule makes and hands the
    /// replies back, until no lease is left.
    async fn run_watchdog(self: Arc<Hub>) {
        let mut conn: Option<Conn> = None;
        let mut idle_since = None;
        loop {
            let now = Instant::now();
            let next = {
                let mut dog = lock(&self.dog);
                let next = dog.schedule.next(now, self.opts.io_timeout);
                if matches!(next, Next::Idle) {
                    match linger_left(*idle_since.get_or_insert(now), now) {
                        Some(left) => dog.schedule.idle_until(now + left),
                        None => {
                            dog.running = false;
                            return;
                        }
                    }
                }
                next
            };
            let batch = match next {
                Next::Send(batch) => batch,
                Next::Sleep(until) => {
                    idle_since = None;
                    let until = tokio::time::Instant::from_std(until);
                    let _ = tokio::time::timeout_at(until, self.wake.notified()).await;
                    continue;
                }
                // No lease: it lingers a while for the next one.
                Next::Idle => {
                    let left = idle_since.map_or(Duration::ZERO, |at| {
                        linger_left(at, now).unwrap_or(Duration::ZERO)
                    });
                    let _ = tokio::time::timeout(left, self.wake.notified()).await;
                    continue;
                }
            };
            idle_since = None;
            if conn.is_none() {
                conn = Conn::open(&self.backend, &self.opts).await.ok();
            }
            let replies = match conn.as_mut() {
                Some(c) => c.renew_all(&batch.cmds, &batch.routes, batch.read).await,
                None => Err(timed_out("no connection")),
            };
            let replies = replies.unwrap_or_else(|e| {
                if lost_reply(&e) {
                    conn = None;
                    self.dropped();
                }
                Vec::new()
            });
            lock(&self.dog).schedule.settle(&batch, replies);
        }
    }

    fn stats(&self) -> WatchdogStats {
        let dog = lock(&self.dog);
        WatchdogStats {
            leases: dog.schedule.len(),
            renewals: dog.schedule.renewals,
            round_trips: dog.schedule.round_trips,
        }
    }
}

/// Opens leases on one server or a cluster, from async code. Cheap to
/// clone; the clones share one multiplexed connection and one watchdog
/// task, which renews every lease they hold in batches.
#[derive(Clone)]
pub struct LeaseClient {
    hub: Arc<Hub>,
    mode: Mode,
    /// The `LABEL` of its acquires (`None`: none), resolved once.
    label: Option<Arc<str>>,
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
        LeaseClient::on(Backend::One(client))
    }

    /// Leases on a Redis Cluster, routed by the lease key's slot.
    pub fn cluster(client: ClusterClient) -> LeaseClient {
        LeaseClient::on(Backend::Cluster(Box::new(client)))
    }

    fn on(backend: Backend) -> LeaseClient {
        LeaseClient {
            hub: Hub::new(backend, Options::default()),
            mode: Mode::Exclusive,
            label: resolve(&Label::Default, None),
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

    /// The same client labelling its acquires with `label` (`LABEL`, shown
    /// by `LEASE.INFO` and `LEASE.WAITERS`): by default
    /// [`Label::Default`], this process's
    /// [`default_label`](crate::default_label) (`<host> pid <pid>
    /// <program>`); [`Label::None`] for none. For one call, label a clone:
    /// `client.clone().with_label(Label::text("job 991")).acquire(..)`.
    /// Clones share what this client holds.
    pub fn with_label(mut self, label: Label) -> LeaseClient {
        self.label = resolve(&label, None);
        self
    }

    /// The label its acquires send (`None`: none).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The same client with other timeouts and retries (and connections and
    /// a watchdog of its own).
    pub fn with_options(mut self, opts: Options) -> LeaseClient {
        self.hub = Hub::new(self.hub.backend.clone(), opts);
        self
    }

    /// What the watchdog shared by this client and its clones did so far.
    pub fn watchdog_stats(&self) -> WatchdogStats {
        self.hub.stats()
    }

    /// The clients waiting for `key`, oldest first, at most `count`; as
    /// [`crate::LeaseClient::waiters`].
    pub async fn waiters(&self, key: &str, count: Option<u32>) -> Result<Vec<Waiter>, Error> {
        let cmd = waiters_cmd(key, count)?;
        let hub = &self.hub;
        let reply: Value = hub
            .call(&cmd, None, hub.opts.io_timeout, &hub.opts, true)
            .await?;
        parse_waiters(&reply)
    }

    /// Makes `key` the guard of its hash tag (`LEASE.GUARD key`); as
    /// [`crate::LeaseClient::guard`]: every other key of the tag is then
    /// written only through the fence of the lease held on `key`, any
    /// other write is [`Error::Fenced`].
    pub async fn guard(&self, key: &str) -> Result<(), Error> {
        let hub = &self.hub;
        let reply: Value = hub
            .call(&guard_cmd(key), None, hub.opts.io_timeout, &hub.opts, true)
            .await?;
        guard_reply(&reply)
    }

    /// Stops `key` guarding its hash tag (`LEASE.UNGUARD key`): `Ok(true)`
    /// when it guarded, `Ok(false)` when it did not; as
    /// [`crate::LeaseClient::unguard`].
    pub async fn unguard(&self, key: &str) -> Result<bool, Error> {
        let hub = &self.hub;
        let reply: Value = hub
            .call(
                &unguard_cmd(key),
                None,
                hub.opts.io_timeout,
                &hub.opts,
                true,
            )
            .await?;
        unguard_reply(&reply)
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
        self.acquire_keys(Keys::One(key.to_string()), ttl, block)
            .await
    }

    /// Takes every key of `keys` or none, in one atomic step, with one
    /// fencing token (`LEASE.MACQUIRE`); as
    /// [`crate::LeaseClient::acquire_many`] (the same answers, retries and
    /// read timeouts). Call it inside a tokio runtime.
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        ttl: Duration,
        block: Block,
    ) -> Result<Option<MultiLease>, Error> {
        let keys = Keys::many(keys)?;
        Ok(self.acquire_keys(keys, ttl, block).await?.map(|lease| {
            let handle = MultiLeaseHandle(lease.handle());
            MultiLease { lease, handle }
        }))
    }

    /// The acquire of one key or of several together.
    async fn acquire_keys(
        &self,
        keys: Keys,
        ttl: Duration,
        block: Block,
    ) -> Result<Option<Lease>, Error> {
        let (hub, opts) = (&self.hub, &self.hub.opts);
        let on_cluster = matches!(hub.backend, Backend::Cluster(_));
        let mut plan = Acquire::new(
            &keys,
            ttl,
            self.mode,
            self.label.as_deref(),
            block,
            opts,
            on_cluster,
            &self.held,
        )?;
        let route = keys.route();
        loop {
            let (cmd, read) = plan.attempt();
            // A call that may block waits on a connection of its own; one
            // that does not shares the client's.
            let own = waits(&cmd);
            let conn = match own {
                true => hub.take(opts).await,
                false => hub.shared(opts, true).await,
            };
            let mut conn = match conn {
                Ok(conn) => conn,
                Err(e) => match plan.retry(&e) {
                    Some(pause) => {
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    None => return Err(e.into()),
                },
            };
            let sent = Instant::now();
            let give = |conn: Conn| {
                if own {
                    hub.give(conn)
                }
            };
            match conn.call_on::<Option<u64>>(&cmd, route, read).await {
                Ok(None) => {
                    // Null: another owner, or the server's grace period;
                    // the server says which.
                    let info = conn
                        .call_on::<String>(
                            redis::cmd("INFO").arg("lease"),
                            // The keys' master (a cluster client would ask
                            // every node and answer a map).
                            Some(keys.first()),
                            Some(opts.io_timeout),
                        )
                        .await
                        .unwrap_or_default();
                    give(conn);
                    return refused(&info);
                }
                Ok(Some(token)) => {
                    let owner = std::mem::take(&mut plan.owner);
                    let lease =
                        Lease::start(self, keys.clone(), owner, token, ttl, sent, &mut conn).await;
                    give(conn);
                    for key in keys.all() {
                        let signal = lease.signal();
                        self.held.insert(key, move || signal.loss().is_none());
                    }
                    return Ok(Some(lease));
                }
                Err(e) if !lost_reply(&e) => {
                    give(conn);
                    return Err(e.into());
                }
                Err(e) => {
                    // A lost reply: its connection is closed, not reused.
                    if !own {
                        *lock(&hub.shared) = None;
                    }
                    hub.dropped();
                    match plan.retry(&e) {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => return Err(e.into()),
                    }
                }
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

    /// Runs the job `work` holding every key of `keys` at once (from
    /// [`acquire_many`](LeaseClient::acquire_many)), and releases them all
    /// however the job ends, as [`with_lease`](LeaseClient::with_lease).
    /// `work` gets a [`MultiLeaseHandle`].
    pub async fn with_many<K, T, E, F, Fut>(
        &self,
        keys: &[K],
        ttl: Duration,
        block: Block,
        work: F,
    ) -> Result<Option<T>, E>
    where
        K: AsRef<str>,
        F: FnOnce(MultiLeaseHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let Some(lease) = self.acquire_many(keys, ttl, block).await? else {
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

    /// A signal whose deadline is `deadline`, not lost.
    pub(crate) fn new(deadline: Instant) -> LossSignal {
        let (tx, _) = watch::channel(State {
            deadline,
            loss: None,
        });
        LossSignal(Arc::new(tx))
    }

    pub(crate) fn extend(&self, sent: Instant, ttl: Duration) -> bool {
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

    pub(crate) fn lose(&self, loss: Loss) {
        self.0.send_modify(|st| {
            if st.loss.is_none() {
                st.loss = Some(st.loss().unwrap_or(loss));
            }
        });
    }
}

impl Renewable for LossSignal {
    fn live(&self) -> bool {
        self.loss().is_none()
    }

    fn deadline(&self) -> Instant {
        LossSignal::deadline(self)
    }

    fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        self.extend(sent, ttl)
    }

    fn refused(&self) {
        self.lose(Loss::Refused)
    }
}

struct Inner {
    /// Its key, or every key of a [`MultiLease`].
    keys: Keys,
    owner: String,
    token: u64,
    ttl: Duration,
    hub: Arc<Hub>,
    signal: LossSignal,
    /// Its place in the watchdog's schedule.
    watched: Mutex<Option<u64>>,
}

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
        self.0.keys.first()
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

    /// Renews now, besides the watchdog: `Ok(true)` renewed, `Ok(false)` the
    /// lease is not ours and the loss signal is on (as the sync `renew`:
    /// refused, no reply before the deadline, or lost before and not sent).
    pub async fn renew(&self) -> Result<bool, Error> {
        // As the sync `renew`: lost, nothing is sent.
        if self.0.signal.is_lost() {
            return Ok(false);
        }
        let sent = Instant::now();
        let hub = &self.0.hub;
        let read = self
            .0
            .signal
            .deadline()
            .saturating_duration_since(sent)
            .min(hub.opts.io_timeout);
        let keys = &self.0.keys;
        let cmd = keys.renew_cmd(&self.0.owner, self.0.ttl);
        match hub
            .call::<i64>(&cmd, keys.route(), read, &hub.opts, true)
            .await
        {
            Ok(n) if n == keys.count() => Ok(self.0.signal.extend(sent, self.0.ttl)),
            Ok(_) => {
                self.0.signal.lose(Loss::Refused);
                Ok(false)
            }
            // No reply before the deadline: lost.
            Err(Error::Redis(e)) if e.is_timeout() && self.0.signal.is_lost() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `cmd` run through the fence (`LEASE.FENCE key token <cmd>`); a
    /// `STALE` refusal is [`Error::Stale`] and nothing was run; a write to a
    /// key whose hash tag another lease key guards is [`Error::Fenced`]. A
    /// connection the server closed while idle is replaced first.
    pub async fn fence<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        self.fence_on(self.key(), None, cmd).await
    }

    /// As [`Lease::fence`], and refused with [`Error::Expiring`] (nothing
    /// run, the lease still held) when the lease has less than `min_ttl`
    /// left when the server decides (`LEASE.FENCE key token MINTTL ms
    /// <cmd>`), as [`crate::Lease::fence_min_ttl`].
    pub async fn fence_min_ttl<T: FromRedisValue>(
        &self,
        min_ttl: Duration,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        self.fence_on(self.key(), Some(min_ttl), cmd).await
    }

    /// `LEASE.FENCE key token [MINTTL ms] <cmd>` on `key`.
    async fn fence_on<T: FromRedisValue>(
        &self,
        key: &str,
        min_ttl: Option<Duration>,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        let fenced = fence_cmd_with(key, self.0.token, min_ttl, cmd);
        let hub = &self.0.hub;
        hub.call(&fenced, None, hub.opts.io_timeout, &hub.opts, true)
            .await
    }

    /// The fenced form of `cmd`, for a connection or pipeline of your own.
    pub fn fence_cmd(&self, cmd: &Cmd) -> Cmd {
        fence_cmd(self.key(), self.0.token, cmd)
    }

    /// The fenced form of `cmd` with a minimum time left
    /// (`LEASE.FENCE key token MINTTL ms <cmd>`).
    pub fn fence_cmd_min_ttl(&self, min_ttl: Duration, cmd: &Cmd) -> Cmd {
        fence_cmd_with(self.key(), self.0.token, Some(min_ttl), cmd)
    }

    fn stop_watchdog(&self) {
        if let Some(id) = lock(&self.0.watched).take() {
            self.0.hub.forget(id);
        }
        self.0.signal.lose(Loss::Released);
    }

    /// Stops the watchdog and says how the release goes, from what the
    /// loss signal said before.
    fn finish(&self) -> ReleasePlan {
        let plan = release_plan(self.0.signal.loss());
        self.stop_watchdog();
        plan
    }

    async fn release(&self, plan: ReleasePlan) -> Result<bool, Error> {
        let keys = &self.0.keys;
        let cmd = keys.release_cmd(&self.0.owner);
        let Some(opts) = release_opts(plan, &self.0.hub.opts) else {
            self.release_leftovers().await;
            return Ok(false);
        };
        // Known lost: one attempt on the connection there is, no check.
        let check = plan != ReleasePlan::Short;
        let mut attempt = 0;
        loop {
            match self
                .0
                .hub
                .call::<i64>(&cmd, keys.route(), opts.io_timeout, &opts, check)
                .await
            {
                Ok(n) if n == keys.count() => return Ok(true),
                Ok(_) => {
                    self.release_leftovers().await;
                    return Ok(false);
                }
                Err(e) => {
                    if let Some(answer) = release_failed(e, &mut attempt, &opts, plan) {
                        return answer;
                    }
                }
            }
        }
    }

    /// A multi-key lease not all ours: the keys still ours released one by
    /// one (`Keys::leftover_cmds`), each one short attempt.
    async fn release_leftovers(&self) {
        let hub = &self.0.hub;
        let opts = short(&hub.opts);
        for cmd in self.0.keys.leftover_cmds(&self.0.owner) {
            let _ = hub
                .call::<i64>(&cmd, None, opts.io_timeout, &opts, true)
                .await;
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
        keys: Keys,
        owner: String,
        token: u64,
        ttl: Duration,
        sent: Instant,
        conn: &mut Conn,
    ) -> Lease {
        let hub = client.hub.clone();
        // As in the sync API: after a long wait, count from a renewal sent
        // now rather than from the acquire.
        let renewal = match renews_first(sent, ttl) {
            true => {
                let renewed = Instant::now();
                let cmd = keys.renew_cmd(&owner, ttl);
                let read = Some(hub.opts.io_timeout);
                Some((renewed, conn.call_on::<i64>(&cmd, keys.route(), read).await))
            }
            false => None,
        };
        let renewal = renewal.as_ref().map(|(at, r)| (*at, r));
        let (deadline, loss) = start(sent, ttl, keys.count(), renewal);
        let (tx, _) = watch::channel(State { deadline, loss });
        let signal = LossSignal(Arc::new(tx));
        let watched = (hub.opts.watchdog && loss.is_none()).then(|| {
            let first = deadline - ttl + renew_every(ttl);
            hub.watch(&keys, &owner, ttl, first, signal.clone())
        });
        let handle = LeaseHandle(Arc::new(Inner {
            keys,
            owner,
            token,
            ttl,
            hub,
            signal,
            watched: Mutex::new(watched),
        }));
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
        let plan = self.handle.finish();
        self.handle.release(plan).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let plan = self.handle.finish();
        let handle = self.handle.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = handle.release(plan).await;
            });
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.handle.key())
            .field("token", &self.handle.0.token)
            .field("loss", &self.handle.loss())
            .finish()
    }
}

/// A lease on several keys taken together (from
/// [`LeaseClient::acquire_many`]), as [`crate::MultiLease`]: one owner, one
/// fencing token, renewed together (one `LEASE.MRENEW` per watchdog round),
/// lost together, released together (`LEASE.MRELEASE`). Derefs to its
/// [`MultiLeaseHandle`]; give it back with [`MultiLease::release`];
/// dropping it spawns the release.
pub struct MultiLease {
    lease: Lease,
    handle: MultiLeaseHandle,
}

impl Deref for MultiLease {
    type Target = MultiLeaseHandle;
    fn deref(&self) -> &MultiLeaseHandle {
        &self.handle
    }
}

impl MultiLease {
    /// A handle for other tasks (no release).
    pub fn handle(&self) -> MultiLeaseHandle {
        self.handle.clone()
    }

    /// Gives every key back and stops the watchdog: `Ok(true)` they were
    /// ours, `Ok(false)` they were not all ours any more (lost). A lost
    /// reply is retried.
    pub async fn release(self) -> Result<bool, Error> {
        self.lease.release().await
    }
}

impl std::fmt::Debug for MultiLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLease")
            .field("keys", &self.keys())
            .field("token", &self.token())
            .field("loss", &self.loss())
            .finish()
    }
}

/// What a job holding a multi-key lease works with: the token, fenced
/// writes on any of its keys, renewal and the loss signal (no release: the
/// [`MultiLease`] guard does that). Cheap to clone, `Send`.
#[derive(Clone)]
pub struct MultiLeaseHandle(LeaseHandle);

impl MultiLeaseHandle {
    /// The fencing token, the same on every key.
    pub fn token(&self) -> u64 {
        self.0.token()
    }

    /// The keys, in the order they were given.
    pub fn keys(&self) -> &[String] {
        self.0.0.keys.all()
    }

    /// The ttl each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.0.ttl()
    }

    /// The loss signal.
    pub fn signal(&self) -> LossSignal {
        self.0.signal()
    }

    /// Why the lease is lost, `None` while it is held. Never waits.
    pub fn loss(&self) -> Option<Loss> {
        self.0.loss()
    }

    /// True once the lease is lost. Never waits.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// Completes the moment the lease is lost.
    pub async fn lost(&self) -> Loss {
        self.0.lost().await
    }

    /// Renews every key now (`LEASE.MRENEW`), besides the watchdog:
    /// `Ok(true)` all renewed, `Ok(false)` they are not all ours with this
    /// token (nothing renewed; the loss signal turns on).
    pub async fn renew(&self) -> Result<bool, Error> {
        self.0.renew().await
    }

    /// `cmd` run through the fence on `key`, one of the lease's keys
    /// (`LEASE.FENCE key token <cmd>`): [`Error::Stale`] when refused
    /// (nothing run), [`Error::NotLeaseKey`] (nothing sent) when `key` is
    /// not one of the lease's keys.
    pub async fn fence<T: FromRedisValue>(&self, key: &str, cmd: &Cmd) -> Result<T, Error> {
        self.check(key)?;
        self.0.fence_on(key, None, cmd).await
    }

    /// As [`MultiLease::fence`], and refused with [`Error::Expiring`]
    /// (nothing run) when the lease has less than `min_ttl` left on `key`.
    pub async fn fence_min_ttl<T: FromRedisValue>(
        &self,
        key: &str,
        min_ttl: Duration,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        self.check(key)?;
        self.0.fence_on(key, Some(min_ttl), cmd).await
    }

    /// The fenced form of `cmd` on `key`, for a connection or pipeline of
    /// your own; [`Error::NotLeaseKey`] when `key` is not one of the keys.
    pub fn fence_cmd(&self, key: &str, cmd: &Cmd) -> Result<Cmd, Error> {
        self.check(key)?;
        Ok(fence_cmd(key, self.token(), cmd))
    }

    /// The fenced form of `cmd` on `key` with a minimum time left
    /// (`LEASE.FENCE key token MINTTL ms <cmd>`); [`Error::NotLeaseKey`]
    /// when `key` is not one of the keys.
    pub fn fence_cmd_min_ttl(&self, key: &str, min_ttl: Duration, cmd: &Cmd) -> Result<Cmd, Error> {
        self.check(key)?;
        Ok(fence_cmd_with(key, self.token(), Some(min_ttl), cmd))
    }

    fn check(&self, key: &str) -> Result<(), Error> {
        match self.keys().iter().any(|k| k == key) {
            true => Ok(()),
            false => Err(Error::NotLeaseKey(key.to_string())),
        }
    }
}
