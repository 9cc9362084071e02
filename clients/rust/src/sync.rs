//! The blocking API: [`LeaseClient`], the [`Lease`] guard, its [`LossSignal`]
//! and the client's watchdog thread. What to send and what a reply means is
//! decided in `protocol/`; this file only does the blocking I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConfig, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ConnectionLike, FromRedisValue, RedisResult, Value};

use crate::protocol::{
    Acquire, Backend, Fresh, Held, Keys, Next, POOL_IDLE, ReleasePlan, Renewable, Reply, Schedule,
    guard_cmd, guard_reply, linger_left, lost_during, lost_reply, parse_waiters, refused,
    release_failed, release_opts, release_plan, renew_every, renews_first, resolve, short, start,
    unguard_cmd, unguard_reply, waiters_cmd, work_result,
};
use crate::raw::fence_cmd_with;
use crate::{Block, Error, Label, Loss, Mode, Options, Waiter, WatchdogStats, fence_cmd};

/// One connection of either kind.
enum Conn {
    One(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    fn open(backend: &Backend, opts: &Options) -> RedisResult<Conn> {
        match backend {
            Backend::One(c) => {
                let con = c.get_connection_with_timeout(opts.connect_timeout)?;
                con.set_write_timeout(Some(opts.io_timeout))?;
                Ok(Conn::One(con))
            }
            Backend::Cluster(c) => {
                let con = c.get_connection_with_config(
                    ClusterConfig::new().set_connection_timeout(opts.connect_timeout),
                )?;
                con.set_write_timeout(Some(opts.io_timeout))?;
                Ok(Conn::Cluster(Box::new(con)))
            }
        }
    }

    /// Does the connection still answer (`PING` within `read`)? A cluster
    /// connection says yes: it replaces its node connections itself.
    fn alive(&mut self, read: Duration) -> bool {
        match self {
            Conn::One(_) => self.call::<String>(&redis::cmd("PING"), Some(read)).is_ok(),
            Conn::Cluster(_) => true,
        }
    }

    /// Runs `cmd` with read timeout `read` (`None`: none).
    fn call<T: FromRedisValue>(&mut self, cmd: &Cmd, read: Option<Duration>) -> RedisResult<T> {
        self.call_on(cmd, None, read)
    }

    /// Runs `cmd` with read timeout `read`; on a cluster, on the master of
    /// `route`'s slot when given (a command the redis crate cannot route by
    /// its first argument: `LEASE.M*`, whose first argument is the key
    /// count), else where the redis crate routes it.
    fn call_on<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        route: Option<&str>,
        read: Option<Duration>,
    ) -> RedisResult<T> {
        let read = read.map(|d| d.max(Duration::from_millis(1)));
        match self {
            Conn::One(c) => {
                c.set_read_timeout(read)?;
                cmd.query(c as &mut dyn ConnectionLike)
            }
            Conn::Cluster(c) => {
                c.set_read_timeout(read)?;
                match route {
                    Some(key) => {
                        let value = c.route_command(cmd, slot_of(key))?;
                        Ok(redis::from_redis_value(value)?)
                    }
                    None => cmd.query(&mut **c as &mut dyn ConnectionLike),
                }
            }
        }
    }

    /// Sends the renewals `cmds` as one pipeline (one per node on a
    /// cluster) and reads every reply within `read`. `routes`: for each
    /// command, the key to route it by on a cluster (`LEASE.MRENEW`, which
    /// the redis crate's cluster pipeline would send by its key count: each
    /// goes alone to its keys' master, after the pipeline).
    fn renew_all(
        &mut self,
        cmds: &[Cmd],
        routes: &[Option<String>],
        read: Duration,
    ) -> RedisResult<Vec<Reply>> {
        let read = Some(read.max(Duration::from_millis(1)));
        let values: Vec<Value> = match self {
            Conn::One(c) => {
                c.set_read_timeout(read)?;
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                pipe.query(c)?
            }
            Conn::Cluster(c) => {
                c.set_read_timeout(read)?;
                let (plain, routed): (Vec<usize>, Vec<usize>) =
                    (0..cmds.len()).partition(|&i| routes.get(i).is_none_or(|r| r.is_none()));
                let mut values = vec![Value::Nil; cmds.len()];
                if !plain.is_empty() {
                    let mut pipe = redis::cluster::cluster_pipe();
                    for &i in &plain {
                        pipe.add_command(cmds[i].clone());
                    }
                    match pipe.query::<Vec<Value>>(c) {
                        Ok(got) => {
                            for (&i, v) in plain.iter().zip(got) {
                                values[i] = v;
                            }
                        }
                        // An error reply fails a cluster pipeline whole: each
                        // renewal alone then, so that one key's error does not
                        // hold back the others.
                        Err(e) if !lost_reply(&e) => {
                            for &i in &plain {
                                values[i] = cmds[i]
                                    .query(&mut **c as &mut dyn ConnectionLike)
                                    .unwrap_or(Value::Nil);
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                for &i in &routed {
                    let key = routes[i].as_deref().unwrap_or_default();
                    match c.route_command(&cmds[i], slot_of(key)) {
                        Ok(v) => values[i] = v,
                        Err(e) if lost_reply(&e) => return Err(e),
                        Err(_) => {}
                    }
                }
                values
            }
        };
        Ok(values.into_iter().map(Reply::from).collect())
    }
}

/// The routing of a command to the master of `key`'s slot.
fn slot_of(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key,
        SlotAddr::Master,
    )))
}

/// The connections and the watchdog one client and its clones share: an
/// idle pool of connections for every lease's calls (renew, release,
/// fence, acquire), and one thread that renews every lease of the client
/// in batches, on a connection of its own. A thousand leases cost the same
/// two or three connections and one thread as one lease.
struct Hub {
    backend: Backend,
    opts: Options,
    idle: Mutex<Vec<(Conn, Fresh)>>,
    /// Connections found closed (by any call or the watchdog): every idle
    /// connection older than the last drop is checked before use.
    drops: AtomicU64,
    dog: Mutex<Dog>,
    wake: Condvar,
}

struct Dog {
    schedule: Schedule<LossSignal>,
    /// The watchdog thread runs (it stops once no lease is left for
    /// `WATCHDOG_LINGER`).
    running: bool,
}

impl Hub {
    fn new(backend: Backend, opts: Options) -> Arc<Hub> {
        Arc::new(Hub {
            backend,
            opts,
            idle: Mutex::new(Vec::new()),
            drops: AtomicU64::new(0),
            dog: Mutex::new(Dog {
                schedule: Schedule::default(),
                running: false,
            }),
            wake: Condvar::new(),
        })
    }

    fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }

    fn dropped(&self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection for one call: an idle one (checked with `PING` when
    /// suspect, unless `check` is false), else a new one within `opts`.
    fn take(&self, opts: &Options, check: bool) -> RedisResult<Conn> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match idle {
                Some((mut conn, fresh)) => {
                    if !check || !fresh.suspect(self.drops()) || conn.alive(opts.io_timeout) {
                        return Ok(conn);
                    }
                    self.dropped();
                }
                None => return Conn::open(&self.backend, opts),
            }
        }
    }

    /// A connection that answered goes back to the pool (or is closed when
    /// the pool is full).
    fn give(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_IDLE {
            idle.push((conn, Fresh::now(self.drops())));
        }
    }

    /// Runs `cmd` on a pooled connection (read timeout `read`; `route`: as
    /// [`Conn::call_on`]). A connection whose reply was lost is closed,
    /// never reused.
    fn call<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        route: Option<&str>,
        read: Option<Duration>,
        opts: &Options,
        check: bool,
    ) -> Result<T, Error> {
        let mut conn = self.take(opts, check)?;
        let result = conn.call_on(cmd, route, read);
        match &result {
            Err(e) if lost_reply(e) => self.dropped(),
            _ => self.give(conn),
        }
        Ok(result?)
    }

    /// Watches a lease on `keys` (first renewal at `first`), starting the
    /// watchdog thread when none runs.
    fn watch(
        self: &Arc<Hub>,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        first: Instant,
        signal: LossSignal,
    ) -> u64 {
        let mut dog = self.dog.lock().unwrap_or_else(|p| p.into_inner());
        let (id, wake) = dog.schedule.add(keys, owner, ttl, first, signal);
        if !dog.running {
            dog.running = true;
            let hub = self.clone();
            thread::Builder::new()
                .name("lease-watchdog".into())
                .spawn(move || hub.run_watchdog())
                .expect("spawn the lease watchdog thread");
        }
        if wake {
            self.wake.notify_all();
        }
        id
    }

    fn forget(&self, id: u64) {
        self.dog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .schedule
            .remove(id);
    }

    /// The watchdog: sends each batch the schedule makes, one pipeline,
    /// and hands the replies back, until no lease is left.
    fn run_watchdog(&self) {
        let mut conn: Option<Conn> = None;
        loop {
            let batch = {
                let mut dog = self.dog.lock().unwrap_or_else(|p| p.into_inner());
                let mut idle_since = None;
                loop {
                    let now = Instant::now();
                    let wait = match dog.schedule.next(now, self.opts.io_timeout) {
                        Next::Send(batch) => break batch,
                        Next::Sleep(until) => {
                            idle_since = None;
                            until.saturating_duration_since(now)
                        }
                        // No lease: it lingers a while for the next one (a
                        // thread a lease would cost more than the lease).
                        Next::Idle => match linger_left(*idle_since.get_or_insert(now), now) {
                            Some(left) => {
                                dog.schedule.idle_until(now + left);
                                left
                            }
                            None => {
                                dog.running = false;
                                return;
                            }
                        },
                    };
                    dog = self
                        .wake
                        .wait_timeout(dog, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            let replies = match conn.as_mut() {
                Some(c) => c.renew_all(&batch.cmds, &batch.routes, batch.read),
                None => Conn::open(&self.backend, &self.opts).and_then(|mut c| {
                    let r = c.renew_all(&batch.cmds, &batch.routes, batch.read);
                    conn = Some(c);
                    r
                }),
            };
            let replies = match replies {
                Ok(replies) => replies,
                Err(e) => {
                    if lost_reply(&e) {
                        conn = None;
                        self.dropped();
                    }
                    Vec::new()
                }
            };
            let mut dog = self.dog.lock().unwrap_or_else(|p| p.into_inner());
            dog.schedule.settle(&batch, replies);
        }
    }

    fn stats(&self) -> WatchdogStats {
        let dog = self.dog.lock().unwrap_or_else(|p| p.into_inner());
        WatchdogStats {
            leases: dog.schedule.len(),
            renewals: dog.schedule.renewals,
            round_trips: dog.schedule.round_trips,
        }
    }
}

/// Opens leases on one server or a cluster. Cheap to clone; the clones
/// share one pool of connections and one watchdog thread, which renews
/// every lease they hold in batches (one pipeline per round).
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
    /// Leases on the server at `url` (`redis://host:port/db`).
    pub fn open(url: &str) -> Result<LeaseClient, Error> {
        Ok(LeaseClient::new(redis::Client::open(url)?))
    }

    /// Leases on the server of `client`.
    pub fn new(client: redis::Client) -> LeaseClient {
        LeaseClient::on(Backend::One(client))
    }

    /// Leases on a Redis Cluster: every call goes to the master of the lease
    /// key's slot (the `LEASE.*` commands declare their key at position 1).
    /// Keep the keys of a fenced command in that slot with a hash tag
    /// (`{acct:7}:lock` and `{acct:7}`).
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

    /// The same client with other timeouts and retries (and a pool and a
    /// watchdog of its own).
    pub fn with_options(mut self, opts: Options) -> LeaseClient {
        self.hub = Hub::new(self.hub.backend.clone(), opts);
        self
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.hub.opts
    }

    /// What the watchdog shared by this client and its clones did so far:
    /// the leases it renews, the renewals sent and the round trips that
    /// carried them.
    pub fn watchdog_stats(&self) -> WatchdogStats {
        self.hub.stats()
    }

    /// The clients waiting for `key` with `BLOCK`, oldest first
    /// (`LEASE.WAITERS key [COUNT count]`): at most `count` (1 to 1000,
    /// [`Error::InvalidCount`] otherwise; `None`: the server's default, 10),
    /// each a [`Waiter`] with its client id, label, mode, time waited and
    /// time left. Empty when nobody waits. It reads the key's master
    /// (waiters live there).
    pub fn waiters(&self, key: &str, count: Option<u32>) -> Result<Vec<Waiter>, Error> {
        let cmd = waiters_cmd(key, count)?;
        let opts = &self.hub.opts;
        let reply: Value = self
            .hub
            .call(&cmd, None, Some(opts.io_timeout), opts, true)?;
        parse_waiters(&reply)
    }

    /// Makes `key` the guard of its hash tag (`LEASE.GUARD key`, design.md
    /// S12; an admin call, idempotent): from now on every other key of that
    /// tag, in this database, can be written only through the fence of the
    /// lease held on `key` ([`Lease::fence`] and the other fences of a
    /// lease on `key`); any other write is refused with
    /// [`Error::Fenced`], and changes nothing. Reads pass. A free `key`
    /// becomes a free guard (no lease held, no ttl); the guard stays when
    /// its leases are released or expire, and its tokens keep increasing.
    /// The lease on a guard key is exclusive only.
    ///
    /// The server refuses ([`Error::Redis`], its text says why) a key
    /// without a hash tag (a non-empty `{...}` part), a tag another key
    /// guards already, a key held with `LIMIT` or `SHARED`, and a key of
    /// another type (`WRONGTYPE`). On a cluster it goes to `key`'s master.
    pub fn guard(&self, key: &str) -> Result<(), Error> {
        let opts = &self.hub.opts;
        let reply: Value =
            self.hub
                .call(&guard_cmd(key), None, Some(opts.io_timeout), opts, true)?;
        guard_reply(&reply)
    }

    /// Stops `key` guarding its hash tag (`LEASE.UNGUARD key`): `Ok(true)`
    /// when it guarded (a free guard key is deleted; a lease held on it
    /// stays, an ordinary lease from now on), `Ok(false)` when it did not.
    pub fn unguard(&self, key: &str) -> Result<bool, Error> {
        let opts = &self.hub.opts;
        let reply: Value =
            self.hub
                .call(&unguard_cmd(key), None, Some(opts.io_timeout), opts, true)?;
        unguard_reply(&reply)
    }

    /// Takes the lease on `key` for `ttl` (whole milliseconds), with a fresh
    /// random owner id.
    ///
    /// - `Ok(Some(lease))`: the lease is ours; the watchdog renews it.
    /// - `Ok(None)`: another owner holds it (after waiting, with `block`).
    /// - `Err(Error::Grace { remaining, .. })`: the server refused it for its
    ///   grace period (read from its `INFO lease` after the null reply).
    /// - `Err(..)`: an error reply, or no reply after [`Options::retries`]
    ///   retries.
    ///
    /// A lost reply (I/O error, timeout) is retried on another connection
    /// with the same owner: if the lost call took the lease, the retry gets
    /// the same token back. A `Block::For` retry waits only for what is left
    /// of the wait. The read timeout of a blocking call is its `BLOCK`
    /// timeout plus [`Options::block_margin`] (none for `Block::Forever`).
    pub fn acquire(&self, key: &str, ttl: Duration, block: Block) -> Result<Option<Lease>, Error> {
        self.acquire_keys(Keys::One(key.to_string()), ttl, block)
    }

    /// Takes every key of `keys` or none, in one atomic step
    /// (`LEASE.MACQUIRE numkeys key ... owner ttl [BLOCK ms]`, design.md
    /// S10), with a fresh random owner id: all get one fencing token and the
    /// same deadline. The lease is exclusive whatever
    /// [`with_mode`](LeaseClient::with_mode) says.
    ///
    /// - `Ok(Some(lease))`: every key is ours; the watchdog renews them all
    ///   with one `LEASE.MRENEW` per round.
    /// - `Ok(None)`: some key is held by another owner (or waited for), and
    ///   nothing was taken (after waiting, with `block`, until every key
    ///   could be taken at once).
    /// - `Err(Error::InvalidKeys(..))`: no key, or a key twice; nothing sent.
    /// - `Err(Error::AlreadyHeld(key))`: this client (or a clone) holds a
    ///   lease on one of the keys; nothing sent.
    /// - `Err(Error::Grace { .. })`, `Err(..)`: as [`acquire`](LeaseClient::acquire).
    ///
    /// A lost reply is retried with the same owner, as for
    /// [`acquire`](LeaseClient::acquire): a call that took the keys is
    /// answered the same token again. On a cluster every key must be in one
    /// slot (a hash tag: `{acct}:7`, `{acct}:9`); the calls go to its master.
    pub fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        ttl: Duration,
        block: Block,
    ) -> Result<Option<MultiLease>, Error> {
        let keys = Keys::many(keys)?;
        Ok(self
            .acquire_keys(keys, ttl, block)?
            .map(|lease| MultiLease { lease }))
    }

    /// The acquire of one key or of several together.
    fn acquire_keys(
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
            let mut conn = match hub.take(opts, true) {
                Ok(conn) => conn,
                Err(e) => match plan.retry(&e) {
                    Some(pause) => {
                        thread::sleep(pause);
                        continue;
                    }
                    None => return Err(e.into()),
                },
            };
            let sent = Instant::now();
            match conn.call_on::<Option<u64>>(&cmd, route, read) {
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
                        .unwrap_or_default();
                    hub.give(conn);
                    return refused(&info);
                }
                Ok(Some(token)) => {
                    let owner = std::mem::take(&mut plan.owner);
                    let lease = Lease::start(self, keys.clone(), owner, token, ttl, sent, conn);
                    for key in keys.all() {
                        let signal = lease.signal();
                        self.held.insert(key, move || signal.loss().is_none());
                    }
                    return Ok(Some(lease));
                }
                Err(e) if !lost_reply(&e) => {
                    hub.give(conn);
                    return Err(e.into());
                }
                Err(e) => {
                    // A lost reply: its connection is closed, not reused.
                    hub.dropped();
                    match plan.retry(&e) {
                        Some(pause) => thread::sleep(pause),
                        None => return Err(e.into()),
                    }
                }
            }
        }
    }

    /// Runs `work` holding the lease on `key`, and releases it on every way
    /// out: `work` returning `Ok` or `Err`, or panicking (the guard's drop).
    ///
    /// `work` gets the [`Lease`]: it writes through [`Lease::fence`] and is
    /// told to stop by [`Lease::is_lost`] (or a [`LossSignal`] it hands to
    /// other threads), which turns true the moment the lease is lost. What it
    /// returns is returned as it is. `Ok(None)`: the lease was not obtained
    /// (busy, or `block` ran out). A failure to release is not reported: the
    /// lease then ends at its ttl.
    pub fn with_lease<T, E, F>(
        &self,
        key: &str,
        ttl: Duration,
        block: Block,
        work: F,
    ) -> Result<Option<T>, E>
    where
        F: FnOnce(&mut Lease) -> Result<T, E>,
        E: From<Error>,
    {
        let Some(mut lease) = self.acquire(key, ttl, block)? else {
            return Ok(None);
        };
        let result = work(&mut lease);
        let lost = lost_during(lease.loss());
        let _ = lease.release();
        work_result(result, lost)
    }

    /// Runs `work` holding every key of `keys` at once (a [`MultiLease`],
    /// from [`acquire_many`](LeaseClient::acquire_many)), and releases them
    /// all on every way out, as [`with_lease`](LeaseClient::with_lease):
    /// `Ok(None)` when the keys were not obtained, `Err(Error::Lost(..))`
    /// when the lease was lost while `work` ran and `work` returned `Ok`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redis_lease_client::{Block, Error, LeaseClient};
    ///
    /// # fn main() -> Result<(), Error> {
    /// let client = LeaseClient::open("redis://127.0.0.1:6379/")?;
    /// let (from, to) = ("{bank}:7:lock", "{bank}:9:lock"); // one hash tag: one cluster slot
    /// let moved = client.with_many(&[from, to], Duration::from_secs(10), Block::For(Duration::from_secs(5)), |lease| {
    ///     // The one token fences a write on either key; Err(Error::Stale) if refused.
    ///     let _: i64 = lease.fence(from, redis::cmd("HINCRBY").arg("{bank}:7").arg("balance").arg(-30))?;
    ///     let _: i64 = lease.fence(to, redis::cmd("HINCRBY").arg("{bank}:9").arg("balance").arg(30))?;
    ///     Ok::<_, Error>(lease.token()) // the token, for a ledger outside Redis that keeps the highest
    /// })?; // every key released however the closure ends
    /// assert!(moved.is_some(), "None: a key was busy for 5 s, and nothing was taken");
    /// # Ok(()) }
    /// ```
    pub fn with_many<K, T, E, F>(
        &self,
        keys: &[K],
        ttl: Duration,
        block: Block,
        work: F,
    ) -> Result<Option<T>, E>
    where
        K: AsRef<str>,
        F: FnOnce(&mut MultiLease) -> Result<T, E>,
        E: From<Error>,
    {
        let Some(mut lease) = self.acquire_many(keys, ttl, block)? else {
            return Ok(None);
        };
        let result = work(&mut lease);
        let lost = lost_during(lease.loss());
        let _ = lease.release();
        work_result(result, lost)
    }
}

struct State {
    /// The client-side deadline: `ttl` after the last successful acquire or
    /// renewal was sent.
    deadline: Instant,
    loss: Option<Loss>,
    /// The holder is done (released or dropped): the watchdog stops.
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
}

/// The loss signal of a lease: cheap to clone, for other threads. It turns
/// on once and stays on: at the lease's client-side deadline (checked
/// wherever the signal is read, so it does not depend on the watchdog
/// being on time), when a renewal answers 0, or when the lease is released.
#[derive(Clone)]
pub struct LossSignal(Arc<Shared>);

impl LossSignal {
    pub(crate) fn new(deadline: Instant) -> LossSignal {
        LossSignal(Arc::new(Shared {
            state: Mutex::new(State {
                deadline,
                loss: None,
                stop: false,
            }),
            cond: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns the deadline into a loss when it has passed.
    fn check(&self, st: &mut State) -> Option<Loss> {
        if st.loss.is_none() && Instant::now() >= st.deadline {
            st.loss = Some(Loss::Expired);
            self.0.cond.notify_all();
        }
        st.loss
    }

    /// Why the lease is lost, `None` while it is held. Never blocks.
    pub fn loss(&self) -> Option<Loss> {
        let mut st = self.lock();
        self.check(&mut st)
    }

    /// True once the lease is lost (or released). Never blocks.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Waits until the lease is lost, at most `timeout` (`None`: no limit).
    /// Returns why, or `None` when `timeout` ran out first.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Loss> {
        let until = timeout.map(|t| Instant::now() + t);
        let mut st = self.lock();
        loop {
            if let Some(loss) = self.check(&mut st) {
                return Some(loss);
            }
            let now = Instant::now();
            let mut wake = st.deadline;
            if let Some(u) = until {
                if now >= u {
                    return None;
                }
                wake = wake.min(u);
            }
            st = self
                .0
                .cond
                .wait_timeout(st, wake.saturating_duration_since(now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The client-side deadline: the lease counts as ours until then, unless
    /// a renewal moves it.
    pub fn deadline(&self) -> Instant {
        self.lock().deadline
    }

    /// A renewal sent at `sent` succeeded: the deadline moves to `sent +
    /// ttl`. False (and no change) once the lease is lost or stopped.
    pub(crate) fn extend(&self, sent: Instant, ttl: Duration) -> bool {
        let mut st = self.lock();
        if st.stop || self.check(&mut st).is_some() {
            return false;
        }
        st.deadline = st.deadline.max(sent + ttl);
        self.0.cond.notify_all();
        true
    }

    /// Records a loss (the first one counts) and wakes every waiter.
    pub(crate) fn lose(&self, loss: Loss) {
        let mut st = self.lock();
        if self.check(&mut st).is_none() {
            st.loss = Some(loss);
        }
        self.0.cond.notify_all();
    }

    /// The holder is done: stops the watchdog, and the signal reads
    /// `Released` unless it was lost before.
    pub(crate) fn finish(&self) {
        let mut st = self.lock();
        st.stop = true;
        if self.check(&mut st).is_none() {
            st.loss = Some(Loss::Released);
        }
        self.0.cond.notify_all();
    }
}

impl Renewable for LossSignal {
    fn live(&self) -> bool {
        let mut st = self.lock();
        !st.stop && self.check(&mut st).is_none()
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

/// A held lease: the guard of one acquisition. Released when dropped.
///
/// Its calls ([`fence`](Lease::fence), [`renew`](Lease::renew),
/// [`release`](Lease::release)) go over the client's pool of connections;
/// the client's watchdog renews it.
pub struct Lease {
    /// Its key, or every key of a [`MultiLease`].
    keys: Keys,
    owner: String,
    token: u64,
    ttl: Duration,
    hub: Arc<Hub>,
    /// Its place in the watchdog's schedule.
    watched: Option<u64>,
    signal: LossSignal,
    released: bool,
}

impl Lease {
    fn start(
        client: &LeaseClient,
        keys: Keys,
        owner: String,
        token: u64,
        ttl: Duration,
        sent: Instant,
        conn: Conn,
    ) -> Lease {
        let hub = client.hub.clone();
        let mut conn = conn;
        // The deadline counts from when the acquire was sent. After a long
        // wait (a blocking acquire is granted long after it was sent) that
        // is near or past: renew at once, and count from the renewal. Its 1
        // says the lease is ours now with the same token (only the holder
        // can renew).
        let renewal = renews_first(sent, ttl).then(|| {
            let renewed = Instant::now();
            let cmd = keys.renew_cmd(&owner, ttl);
            let read = Some(hub.opts.io_timeout);
            (renewed, conn.call_on::<i64>(&cmd, keys.route(), read))
        });
        match &renewal {
            Some((_, Err(e))) if lost_reply(e) => hub.dropped(),
            _ => hub.give(conn),
        }
        let renewal = renewal.as_ref().map(|(at, r)| (*at, r));
        let (deadline, loss) = start(sent, ttl, keys.count(), renewal);
        let signal = LossSignal::new(deadline);
        if let Some(loss) = loss {
            signal.lose(loss);
        }
        let watched = hub.opts.watchdog.then(|| {
            let first = deadline - ttl + renew_every(ttl);
            hub.watch(&keys, &owner, ttl, first, signal.clone())
        });
        Lease {
            keys,
            owner,
            token,
            ttl,
            hub,
            watched,
            signal,
            released: false,
        }
    }

    /// The fencing token of this lease.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        self.keys.first()
    }

    /// The ttl each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The loss signal, to hand to other threads.
    pub fn signal(&self) -> LossSignal {
        self.signal.clone()
    }

    /// Why the lease is lost, `None` while it is held. Never blocks.
    pub fn loss(&self) -> Option<Loss> {
        self.signal.loss()
    }

    /// True once the lease is lost. Never blocks: poll it between steps.
    pub fn is_lost(&self) -> bool {
        self.signal.is_lost()
    }

    /// Waits until the lease is lost, at most `timeout`.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<Loss> {
        self.signal.wait(timeout)
    }

    /// Renews now (`LEASE.RENEW key owner ttl`), besides the watchdog.
    /// `Ok(true)`: renewed, the deadline moves to `ttl` from now. `Ok(false)`:
    /// the lease is not ours and the loss signal is on: the server refused
    /// the renewal, no reply came before the deadline, or the lease was
    /// lost before (then nothing is sent).
    pub fn renew(&mut self) -> Result<bool, Error> {
        // Lost, no renewal can succeed: none is sent (it would only keep
        // the key from others).
        if self.signal.is_lost() {
            return Ok(false);
        }
        let sent = Instant::now();
        let left = self.signal.deadline().saturating_duration_since(sent);
        let read = left.min(self.hub.opts.io_timeout);
        let cmd = self.keys.renew_cmd(&self.owner, self.ttl);
        let route = self.keys.route();
        match self
            .hub
            .call::<i64>(&cmd, route, Some(read), &self.hub.opts, true)
        {
            Ok(n) if n == self.keys.count() => Ok(self.signal.extend(sent, self.ttl)),
            Ok(_) => {
                self.signal.lose(Loss::Refused);
                Ok(false)
            }
            // No reply before the deadline: lost.
            Err(Error::Redis(e)) if e.is_timeout() && self.signal.is_lost() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `cmd` run through the fence: `LEASE.FENCE key token <cmd>`. The
    /// server runs it only while this lease's token is current, in the same
    /// step; else [`Error::Stale`] and nothing is run. A write to a key
    /// whose hash tag another lease key guards is [`Error::Fenced`] (nothing
    /// run): only the guard's fence writes there. It is sent even when
    /// the loss signal is on: the server decides. A connection that the
    /// server closed while idle is replaced before the fence goes out
    /// (nothing sent on it can have run, so sending on a new one is safe).
    pub fn fence<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error> {
        self.fence_with(None, cmd)
    }

    /// As [`Lease::fence`], and refused with [`Error::Expiring`] (nothing
    /// run, the lease still held) when the lease has less than `min_ttl`
    /// left when the server decides: `LEASE.FENCE key token MINTTL ms <cmd>`.
    /// Ask for the time the work that follows needs under the lease. An
    /// empty `cmd` (`redis::Cmd::new()`) only checks.
    pub fn fence_min_ttl<T: FromRedisValue>(
        &mut self,
        min_ttl: Duration,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        self.fence_with(Some(min_ttl), cmd)
    }

    fn fence_with<T: FromRedisValue>(
        &mut self,
        min_ttl: Option<Duration>,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        let fenced = fence_cmd_with(self.keys.first(), self.token, min_ttl, cmd);
        let opts = &self.hub.opts;
        self.hub
            .call(&fenced, None, Some(opts.io_timeout), opts, true)
    }

    /// The fenced form of `cmd`, to send on a connection of your own (or in
    /// a pipeline): `LEASE.FENCE key token <cmd>`.
    pub fn fence_cmd(&self, cmd: &Cmd) -> Cmd {
        fence_cmd(self.keys.first(), self.token, cmd)
    }

    /// The fenced form of `cmd` with a minimum time left:
    /// `LEASE.FENCE key token MINTTL ms <cmd>` (see [`Lease::fence_min_ttl`]).
    pub fn fence_cmd_min_ttl(&self, min_ttl: Duration, cmd: &Cmd) -> Cmd {
        fence_cmd_with(self.keys.first(), self.token, Some(min_ttl), cmd)
    }

    /// Gives the lease back (`LEASE.RELEASE key owner`) and stops the
    /// watchdog. `Ok(true)`: it was ours and is free now; `Ok(false)`: it
    /// was not ours any more (lost). A lost reply is retried with the same
    /// owner (a second release of a lease already given back answers 0).
    pub fn release(mut self) -> Result<bool, Error> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<bool, Error> {
        if self.released {
            return Ok(false);
        }
        self.released = true;
        let plan = release_plan(self.signal.loss());
        self.signal.finish();
        if let Some(id) = self.watched.take() {
            self.hub.forget(id);
        }
        let cmd = self.keys.release_cmd(&self.owner);
        let Some(opts) = release_opts(plan, &self.hub.opts) else {
            self.release_leftovers();
            return Ok(false);
        };
        // Known lost: one attempt on a connection there is, no check first.
        let check = plan != ReleasePlan::Short;
        let route = self.keys.route();
        let mut attempt = 0;
        loop {
            match self
                .hub
                .call::<i64>(&cmd, route, Some(opts.io_timeout), &opts, check)
            {
                Ok(n) if n == self.keys.count() => return Ok(true),
                Ok(_) => {
                    self.release_leftovers();
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

    /// A multi-key lease not all ours: the keys still ours released one
    /// by one ([`Keys::leftover_cmds`]), each one short attempt.
    fn release_leftovers(&self) {
        let opts = short(&self.hub.opts);
        for cmd in self.keys.leftover_cmds(&self.owner) {
            let _ = self
                .hub
                .call::<i64>(&cmd, None, Some(opts.io_timeout), &opts, true);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.release_inner();
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the owner: it is the holder's credential.
        f.debug_struct("Lease")
            .field("key", &self.key())
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("loss", &self.signal.loss())
            .finish()
    }
}

/// A lease on several keys taken together (from
/// [`LeaseClient::acquire_many`]): every key held by one owner with one
/// fencing token, renewed together (one `LEASE.MRENEW` per watchdog round),
/// lost together, released together (`LEASE.MRELEASE`). Released when
/// dropped.
///
/// Each key is an ordinary exclusive lease on the server: fence a write on
/// any of them with the one token ([`fence`](MultiLease::fence)). The loss
/// signal turns on when a renewal is refused (the server answers 0 unless
/// the owner still holds every key with the one token: one key deleted or
/// taken is the loss of all), or at the client-side deadline.
pub struct MultiLease {
    lease: Lease,
}

impl MultiLease {
    /// The fencing token, the same on every key.
    pub fn token(&self) -> u64 {
        self.lease.token
    }

    /// The keys, in the order they were given.
    pub fn keys(&self) -> &[String] {
        self.lease.keys.all()
    }

    /// The ttl each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.lease.ttl
    }

    /// The loss signal, to hand to other threads.
    pub fn signal(&self) -> LossSignal {
        self.lease.signal()
    }

    /// Why the lease is lost, `None` while it is held. Never blocks.
    pub fn loss(&self) -> Option<Loss> {
        self.lease.loss()
    }

    /// True once the lease is lost. Never blocks: poll it between steps.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Waits until the lease is lost, at most `timeout`.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<Loss> {
        self.lease.wait_lost(timeout)
    }

    /// Renews every key now (`LEASE.MRENEW`), besides the watchdog.
    /// `Ok(true)`: all renewed. `Ok(false)`: the server says they are not
    /// all ours with this token (nothing renewed); the loss signal turns on.
    pub fn renew(&mut self) -> Result<bool, Error> {
        self.lease.renew()
    }

    /// `cmd` run through the fence on `key`, one of the lease's keys:
    /// `LEASE.FENCE key token <cmd>`, as [`Lease::fence`];
    /// [`Error::Stale`] when refused (nothing run), and
    /// [`Error::NotLeaseKey`] (nothing sent) when `key` is not one of the
    /// lease's keys. On a cluster the command goes to the keys' master: keep
    /// its own keys in their slot.
    pub fn fence<T: FromRedisValue>(&mut self, key: &str, cmd: &Cmd) -> Result<T, Error> {
        let fenced = self.fence_cmd(key, cmd)?;
        self.send_fenced(&fenced)
    }

    /// As [`MultiLease::fence`], and refused with [`Error::Expiring`]
    /// (nothing run) when the lease has less than `min_ttl` left on `key`,
    /// as [`Lease::fence_min_ttl`].
    pub fn fence_min_ttl<T: FromRedisValue>(
        &mut self,
        key: &str,
        min_ttl: Duration,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        let fenced = self.fence_cmd_min_ttl(key, min_ttl, cmd)?;
        self.send_fenced(&fenced)
    }

    fn send_fenced<T: FromRedisValue>(&mut self, fenced: &Cmd) -> Result<T, Error> {
        let opts = &self.lease.hub.opts;
        self.lease
            .hub
            .call(fenced, None, Some(opts.io_timeout), opts, true)
    }

    /// The fenced form of `cmd` on `key` (`LEASE.FENCE key token <cmd>`),
    /// for a connection or pipeline of your own; [`Error::NotLeaseKey`]
    /// when `key` is not one of the lease's keys.
    pub fn fence_cmd(&self, key: &str, cmd: &Cmd) -> Result<Cmd, Error> {
        self.fenced_on(key, None, cmd)
    }

    /// The fenced form of `cmd` on `key` with a minimum time left
    /// (`LEASE.FENCE key token MINTTL ms <cmd>`); [`Error::NotLeaseKey`]
    /// when `key` is not one of the lease's keys.
    pub fn fence_cmd_min_ttl(&self, key: &str, min_ttl: Duration, cmd: &Cmd) -> Result<Cmd, Error> {
        self.fenced_on(key, Some(min_ttl), cmd)
    }

    fn fenced_on(&self, key: &str, min_ttl: Option<Duration>, cmd: &Cmd) -> Result<Cmd, Error> {
        if !self.keys().iter().any(|k| k == key) {
            return Err(Error::NotLeaseKey(key.to_string()));
        }
        Ok(fence_cmd_with(key, self.lease.token, min_ttl, cmd))
    }

    /// Gives every key back (`LEASE.MRELEASE numkeys key ... owner`) and
    /// stops the watchdog. `Ok(true)`: they were ours and are free now;
    /// `Ok(false)`: they were not all ours any more (lost), and nothing was
    /// released. A lost reply is retried with the same owner; a lease known
    /// lost is released briefly, as [`Lease::release`].
    pub fn release(self) -> Result<bool, Error> {
        self.lease.release()
    }
}

impl std::fmt::Debug for MultiLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the owner: it is the holder's credential.
        f.debug_struct("MultiLease")
            .field("keys", &self.keys())
            .field("token", &self.token())
            .field("ttl", &self.ttl())
            .field("loss", &self.loss())
            .finish()
    }
}
