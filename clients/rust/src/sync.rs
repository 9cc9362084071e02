//! The blocking API: [`LeaseClient`], the [`Lease`] guard, its [`LossSignal`]
//! and the watchdog thread.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConfig, ClusterConnection};
use redis::{Cmd, ConnectionLike, FromRedisValue, RedisResult};

use crate::{
    Block, Error, Held, Loss, Mode, Options, ReleasePlan, acquire_cmd, check_ttl, fence_cmd,
    grace_of, lost_during, lost_reply, millis, new_owner, normalize, release_failed, release_opts,
    release_plan, renew_every, retry_pause, work_result,
};

/// Where the connections go: one server, or a cluster.
#[derive(Clone)]
enum Backend {
    One(redis::Client),
    Cluster(Box<ClusterClient>),
}

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
        let read = read.map(|d| d.max(Duration::from_millis(1)));
        match self {
            Conn::One(c) => {
                c.set_read_timeout(read)?;
                cmd.query(c as &mut dyn ConnectionLike)
            }
            Conn::Cluster(c) => {
                c.set_read_timeout(read)?;
                cmd.query(&mut **c as &mut dyn ConnectionLike)
            }
        }
    }
}

/// Opens leases on one server or a cluster. Cheap to clone; every lease
/// gets its own connections (one for the holder, one for its watchdog).
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
    /// Leases on the server at `url` (`redis://host:port/db`).
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

    /// Leases on a Redis Cluster: every call goes to the master of the lease
    /// key's slot (the `LEASE.*` commands declare their key at position 1).
    /// Keep the keys of a fenced command in that slot with a hash tag
    /// (`{acct:7}:lock` and `{acct:7}`).
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

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Takes the lease on `key` for `ttl` (whole milliseconds), with a fresh
    /// random owner id.
    ///
    /// - `Ok(Some(lease))`: the lease is ours; its watchdog is running.
    /// - `Ok(None)`: another owner holds it (after waiting, with `block`).
    /// - `Err(Error::Grace { remaining, .. })`: the server refused it for its
    ///   grace period (read from its `INFO lease` after the null reply).
    /// - `Err(..)`: an error reply, or no reply after [`Options::retries`]
    ///   retries.
    ///
    /// A lost reply (I/O error, timeout) is retried on a new connection with
    /// the same owner: if the lost call took the lease, the retry gets the
    /// same token back. A `Block::For` retry waits only for what is left of
    /// the wait. The read timeout of a blocking call is its `BLOCK` timeout
    /// plus [`Options::block_margin`] (none for `Block::Forever`).
    pub fn acquire(&self, key: &str, ttl: Duration, block: Block) -> Result<Option<Lease>, Error> {
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
            let result = Conn::open(&self.backend, &self.opts).and_then(|mut conn| {
                sent = Instant::now();
                conn.call::<Option<u64>>(&cmd, read).map(|t| (conn, t))
            });
            match result {
                Ok((mut conn, None)) => {
                    // Null: another owner, or the server's grace period;
                    // the server says which.
                    let info = conn
                        .call::<String>(redis::cmd("INFO").arg("lease"), Some(self.opts.io_timeout))
                        .unwrap_or_default();
                    return match grace_of(&info) {
                        Some(grace) => Err(grace),
                        None => Ok(None),
                    };
                }
                Ok((conn, Some(token))) => {
                    let lease = Lease::start(self, key, owner, token, ttl, sent, conn);
                    let signal = lease.signal();
                    self.held.insert(key, move || signal.loss().is_none());
                    return Ok(Some(lease));
                }
                Err(e) if lost_reply(&e) && attempt < self.opts.retries => {
                    attempt += 1;
                    thread::sleep(Duration::from_millis(20 * attempt as u64));
                }
                Err(e) => return Err(e.into()),
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
}

struct State {
    /// The client-side deadline: `ttl` after the last successful acquire or
    /// renewal was sent.
    deadline: Instant,
    loss: Option<Loss>,
    /// The holder is done (released or dropped): the watchdog stops.
    stop: bool,
    /// How often the watchdog found its connection closed (the server
    /// restarted, say): the holder's idle connection is then checked
    /// before its next call.
    dropped: u64,
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
    fn new(deadline: Instant) -> LossSignal {
        LossSignal(Arc::new(Shared {
            state: Mutex::new(State {
                deadline,
                loss: None,
                stop: false,
                dropped: 0,
            }),
            cond: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    fn note_dropped(&self) {
        self.lock().dropped += 1;
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
    fn extend(&self, sent: Instant, ttl: Duration) -> bool {
        let mut st = self.lock();
        if st.stop || self.check(&mut st).is_some() {
            return false;
        }
        st.deadline = st.deadline.max(sent + ttl);
        self.0.cond.notify_all();
        true
    }

    /// Records a loss (the first one counts) and wakes every waiter.
    fn lose(&self, loss: Loss) {
        let mut st = self.lock();
        if self.check(&mut st).is_none() {
            st.loss = Some(loss);
        }
        self.0.cond.notify_all();
    }

    /// The holder is done: stops the watchdog, and the signal reads
    /// `Released` unless it was lost before.
    fn finish(&self) {
        let mut st = self.lock();
        st.stop = true;
        if self.check(&mut st).is_none() {
            st.loss = Some(Loss::Released);
        }
        self.0.cond.notify_all();
    }
}

/// A held lease: the guard of one acquisition. Released when dropped.
///
/// It has its own connection (for [`fence`](Lease::fence),
/// [`renew`](Lease::renew), [`release`](Lease::release)); the watchdog has
/// another.
pub struct Lease {
    key: String,
    owner: String,
    token: u64,
    ttl: Duration,
    conn: Option<Conn>,
    /// When `conn` last answered, and the watchdog's drop count then.
    conn_used: (Instant, u64),
    backend: Backend,
    opts: Options,
    signal: LossSignal,
    released: bool,
}

/// A holder's connection idle this long is checked (`PING`) before its
/// next call, as redis-py's `health_check_interval` does: the server may
/// have closed it meanwhile (a restart, `CLIENT KILL`, its idle
/// `timeout`), and a command sent on a closed connection fails without
/// saying whether it ran. The check costs one round trip, only after a
/// pause; calls in a row go straight out.
const IDLE_CHECK: Duration = Duration::from_millis(100);

impl Lease {
    fn start(
        client: &LeaseClient,
        key: &str,
        owner: String,
        token: u64,
        ttl: Duration,
        sent: Instant,
        conn: Conn,
    ) -> Lease {
        let mut conn = conn;
        // The deadline counts from when the acquire was sent. After a long
        // wait (a blocking acquire is granted long after it was sent) that
        // is near or past: renew at once, and count from the renewal. Its 1
        // says the lease is ours now with the same token (only the holder
        // can renew).
        let mut deadline = sent + ttl;
        let mut refused = false;
        if sent.elapsed() >= renew_every(ttl) {
            let renewed = Instant::now();
            match conn.call::<i64>(&renew_cmd(key, &owner, ttl), Some(client.opts.io_timeout)) {
                Ok(1) => deadline = renewed + ttl,
                Ok(_) => refused = true,
                Err(_) => {}
            }
        }
        let lease = Lease {
            key: key.to_string(),
            owner,
            token,
            ttl,
            conn: Some(conn),
            conn_used: (Instant::now(), 0),
            backend: client.backend.clone(),
            opts: client.opts.clone(),
            signal: LossSignal::new(deadline),
            released: false,
        };
        if refused {
            lease.signal.lose(Loss::Refused);
        }
        if lease.opts.watchdog {
            let dog = Watchdog {
                signal: lease.signal.clone(),
                backend: lease.backend.clone(),
                opts: lease.opts.clone(),
                renew: renew_cmd(&lease.key, &lease.owner, ttl),
                ttl,
            };
            let first = lease.signal.deadline() - ttl + renew_every(ttl);
            thread::Builder::new()
                .name("lease-watchdog".into())
                .spawn(move || dog.run(first))
                .expect("spawn the lease watchdog thread");
        }
        lease
    }

    /// The fencing token of this lease.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
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

    /// The holder's connection, reopened when a call lost it. One idle
    /// for [`IDLE_CHECK`], or after the watchdog found the server had
    /// closed its own, is checked with a `PING` first and replaced when
    /// dead: nothing sent on it can have reached the server, so the call
    /// goes out once, on the new connection (a fence too).
    fn conn(&mut self, opts: &Options) -> Result<&mut Conn, Error> {
        let dropped = self.signal.dropped();
        let (used, seen) = self.conn_used;
        if let Some(c) = self.conn.as_mut()
            && (seen != dropped || used.elapsed() >= IDLE_CHECK)
            && !c.alive(opts.io_timeout)
        {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.conn = Some(Conn::open(&self.backend, opts)?);
        }
        self.conn_used.1 = dropped;
        Ok(self.conn.as_mut().expect("just opened"))
    }

    /// Runs `cmd` on the holder's connection; drops the connection after an
    /// I/O error so the next call opens a new one.
    fn call<T: FromRedisValue>(&mut self, cmd: &Cmd, read: Duration) -> Result<T, Error> {
        let opts = self.opts.clone();
        self.call_with(cmd, read, &opts)
    }

    /// `call`, with the connection checked or opened within `opts`.
    fn call_with<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        read: Duration,
        opts: &Options,
    ) -> Result<T, Error> {
        let result = self.conn(opts)?.call(cmd, Some(read));
        match &result {
            Err(e) if lost_reply(e) => self.conn = None,
            _ => self.conn_used.0 = Instant::now(),
        }
        Ok(result?)
    }

    /// Renews now (`LEASE.RENEW key owner ttl`), besides the watchdog.
    /// `Ok(true)`: renewed, the deadline moves to `ttl` from now. `Ok(false)`:
    /// the server says the lease is not ours; the loss signal turns on.
    pub fn renew(&mut self) -> Result<bool, Error> {
        let sent = Instant::now();
        let left = self.signal.deadline().saturating_duration_since(sent);
        let read = left.min(self.opts.io_timeout);
        let cmd = renew_cmd(&self.key, &self.owner, self.ttl);
        match self.call::<i64>(&cmd, read)? {
            1 => Ok(self.signal.extend(sent, self.ttl)),
            _ => {
                self.signal.lose(Loss::Refused);
                Ok(false)
            }
        }
    }

    /// `cmd` run through the fence: `LEASE.FENCE key token <cmd>`. The
    /// server runs it only while this lease's token is current, in the same
    /// step; else [`Error::Stale`] and nothing is run. It is sent even when
    /// the loss signal is on: the server decides.
    pub fn fence<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error> {
        let fenced = fence_cmd(&self.key, self.token, cmd);
        let read = self.opts.io_timeout;
        self.call(&fenced, read)
    }

    /// The fenced form of `cmd`, to send on a connection of your own (or in
    /// a pipeline): `LEASE.FENCE key token <cmd>`.
    pub fn fence_cmd(&self, cmd: &Cmd) -> Cmd {
        fence_cmd(&self.key, self.token, cmd)
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
        let mut cmd = redis::cmd("LEASE.RELEASE");
        cmd.arg(&self.key).arg(&self.owner);
        let Some(opts) = release_opts(plan, &self.opts) else {
            return Ok(false);
        };
        if plan == ReleasePlan::Short {
            // One attempt on the connection there is: no check first.
            self.conn_used = (Instant::now(), self.signal.dropped());
        }
        let mut attempt = 0;
        loop {
            match self.call_with::<i64>(&cmd, opts.io_timeout, &opts) {
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

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.release_inner();
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the owner: it is the holder's credential.
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("loss", &self.signal.loss())
            .finish()
    }
}

fn renew_cmd(key: &str, owner: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("LEASE.RENEW");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    cmd
}

/// The renewing thread of one lease, on its own connection.
struct Watchdog {
    signal: LossSignal,
    backend: Backend,
    opts: Options,
    renew: Cmd,
    ttl: Duration,
}

impl Watchdog {
    /// Renews at `next`, then every third of the ttl after each success,
    /// and soon again after a failure, until the holder is done or the lease
    /// is lost. Each renewal waits for its reply at most until the deadline.
    fn run(self, mut next: Instant) {
        let mut conn: Option<Conn> = None;
        loop {
            let deadline = {
                let mut st = self.signal.lock();
                loop {
                    if st.stop || self.signal.check(&mut st).is_some() {
                        return;
                    }
                    let now = Instant::now();
                    if now >= next {
                        break st.deadline;
                    }
                    let wake = next.min(st.deadline);
                    st = self
                        .signal
                        .0
                        .cond
                        .wait_timeout(st, wake.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            let sent = Instant::now();
            let read = deadline
                .saturating_duration_since(sent)
                .min(self.opts.io_timeout);
            let reply = match conn.as_mut() {
                Some(c) => c.call::<i64>(&self.renew, Some(read)),
                None => Conn::open(&self.backend, &self.opts).and_then(|mut c| {
                    let r = c.call::<i64>(&self.renew, Some(read));
                    conn = Some(c);
                    r
                }),
            };
            match reply {
                Ok(1) => {
                    if !self.signal.extend(sent, self.ttl) {
                        return;
                    }
                    next = sent + renew_every(self.ttl);
                }
                Ok(_) => {
                    self.signal.lose(Loss::Refused);
                    return;
                }
                Err(e) => {
                    if lost_reply(&e) {
                        conn = None;
                        self.signal.note_dropped();
                    }
                    next = Instant::now() + retry_pause(self.ttl);
                }
            }
        }
    }
}
