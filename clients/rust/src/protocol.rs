//! The protocol written once for the sync and the async API: the commands
//! and their read timeouts, the retry plans, the deadline arithmetic, the
//! held-keys registry, and the watchdog's schedule, which batches the
//! renewals that are due into one pipeline. The I/O layers (`sync.rs`,
//! `aio.rs`) only send what these functions decide and hand the replies
//! back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Block, Error, Loss, Mode, Options, new_owner};

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

#[derive(Default)]
struct HeldKeys {
    keys: HashMap<String, StillHeld>,
    /// The size after the last sweep: the map is swept of ended leases when
    /// it has doubled since, so each check costs O(1) on average.
    swept: usize,
}

#[derive(Clone, Default)]
pub(crate) struct Held(Arc<Mutex<HeldKeys>>);

impl Held {
    /// [`Error::AlreadyHeld`] when a lease on `key` is neither released
    /// nor lost.
    pub(crate) fn check(&self, key: &str) -> Result<(), Error> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match held.keys.get(key) {
            Some(still_held) if still_held() => Err(Error::AlreadyHeld(key.to_string())),
            Some(_) => {
                held.keys.remove(key);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A lease on `key`, held while `still_held` says so.
    pub(crate) fn insert(&self, key: &str, still_held: impl Fn() -> bool + Send + 'static) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.keys.insert(key.to_string(), Box::new(still_held));
        if held.keys.len() > 2 * held.swept.max(64) {
            held.keys.retain(|_, still_held| still_held());
            held.swept = held.keys.len();
        }
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
    let read = block_arg(&mut cmd, block, wait_until, opts);
    (cmd, read)
}

/// The `LEASE.MACQUIRE numkeys key [key ...] owner ttl-ms [BLOCK ms]` of
/// one attempt, and its read timeout, as [`acquire_cmd`].
pub(crate) fn macquire_cmd(
    keys: &[String],
    owner: &str,
    ttl: Duration,
    block: Block,
    wait_until: Option<Instant>,
    opts: &Options,
) -> (redis::Cmd, Option<Duration>) {
    let mut cmd = redis::cmd("LEASE.MACQUIRE");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(millis(ttl));
    let read = block_arg(&mut cmd, block, wait_until, opts);
    (cmd, read)
}

/// Appends the `BLOCK` option of an acquire (last on the line) and returns
/// the read timeout of its reply (`None`: none).
fn block_arg(
    cmd: &mut redis::Cmd,
    block: Block,
    wait_until: Option<Instant>,
    opts: &Options,
) -> Option<Duration> {
    match (block, wait_until) {
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
    }
}

/// The keys of one lease: one (`LEASE.ACQUIRE`), or several taken together
/// under one token (`LEASE.MACQUIRE`, design.md S10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Keys {
    One(String),
    Many(Vec<String>),
}

impl Keys {
    /// The keys of a multi-key lease: at least one, none twice
    /// ([`Error::InvalidKeys`] otherwise; nothing is sent).
    pub(crate) fn many<K: AsRef<str>>(keys: &[K]) -> Result<Keys, Error> {
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        if keys.is_empty() {
            return Err(Error::InvalidKeys("no key given".to_string()));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = keys.iter().find(|k| !seen.insert(k.as_str())) {
            return Err(Error::InvalidKeys(format!("{twice:?} is given twice")));
        }
        Ok(Keys::Many(keys))
    }

    /// On a cluster: every key in one slot (a multi-key lease lives on
    /// one node), [`Error::InvalidKeys`] otherwise, before anything is
    /// sent. The server's own check answers `CROSSSLOT`; this one does not
    /// depend on it.
    pub(crate) fn one_slot(&self) -> Result<(), Error> {
        use redis::cluster_routing::Slot;
        let keys = self.all();
        let slot = Slot::for_key(&keys[0]);
        match keys.iter().find(|k| Slot::for_key(k) != slot) {
            Some(other) => Err(Error::InvalidKeys(format!(
                "{:?} and {other:?} hash to different cluster slots (CROSSSLOT): \
                 give the keys one hash tag",
                keys[0]
            ))),
            None => Ok(()),
        }
    }

    /// Every key, in the order given.
    pub(crate) fn all(&self) -> &[String] {
        match self {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many(keys) => keys,
        }
    }

    /// The first key: the one of a single lease.
    pub(crate) fn first(&self) -> &str {
        &self.all()[0]
    }

    /// What a renewal or a release that acted on every key answers: 1, or
    /// the number of keys of a multi-key lease (0 for none).
    pub(crate) fn count(&self) -> i64 {
        self.all().len() as i64
    }

    /// The key a cluster client must route this lease's commands by, when
    /// it cannot find it itself: the redis crate routes an unknown command
    /// by its first argument, which for `LEASE.M*` is the key count. All
    /// keys of a multi-key lease share one slot, so its first key says
    /// where they all are. `None`: route as usual.
    pub(crate) fn route(&self) -> Option<&str> {
        match self {
            Keys::One(_) => None,
            Keys::Many(keys) => Some(&keys[0]),
        }
    }

    /// `LEASE.RENEW key owner ttl-ms`, or `LEASE.MRENEW numkeys key ...
    /// owner ttl-ms`.
    pub(crate) fn renew_cmd(&self, owner: &str, ttl: Duration) -> redis::Cmd {
        match self {
            Keys::One(key) => renew_cmd(key, owner, ttl),
            Keys::Many(keys) => {
                let mut cmd = redis::cmd("LEASE.MRENEW");
                cmd.arg(keys.len()).arg(keys).arg(owner).arg(millis(ttl));
                cmd
            }
        }
    }

    /// After a multi-key lease was found not all ours (a renewal refused,
    /// or `LEASE.MRELEASE` answered 0, which frees nothing): one
    /// `LEASE.RELEASE key owner` per key, so that the keys still ours are
    /// free at once instead of at their ttl (a key another owner holds
    /// answers 0 and is left alone). None for a single lease.
    pub(crate) fn leftover_cmds(&self, owner: &str) -> Vec<redis::Cmd> {
        match self {
            Keys::One(_) => Vec::new(),
            Keys::Many(keys) => keys.iter().map(|k| release_cmd(k, owner)).collect(),
        }
    }

    /// `LEASE.RELEASE key owner`, or `LEASE.MRELEASE numkeys key ... owner`.
    pub(crate) fn release_cmd(&self, owner: &str) -> redis::Cmd {
        match self {
            Keys::One(key) => release_cmd(key, owner),
            Keys::Many(keys) => {
                let mut cmd = redis::cmd("LEASE.MRELEASE");
                cmd.arg(keys.len()).arg(keys).arg(owner);
                cmd
            }
        }
    }
}

/// Where the connections go: one server, or a cluster (sync and async
/// clients alike).
#[derive(Clone)]
pub(crate) enum Backend {
    One(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// One acquisition: its keys, its owner, what is left of its wait, and its
/// retries. The sync and async `acquire` loops ask it what to send and
/// whether to try again.
pub(crate) struct Acquire<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) owner: String,
    ttl: Duration,
    mode: Mode,
    block: Block,
    wait_until: Option<Instant>,
    opts: &'a Options,
    lost: u32,
}

impl<'a> Acquire<'a> {
    /// Checks the ttl, that a cluster's keys share one slot
    /// (`on_cluster`), and that the client holds none of the keys already
    /// (`held`); a fresh owner; the wait starts now. A multi-key lease is
    /// exclusive whatever `mode` says (`LEASE.MACQUIRE` has no other mode).
    pub(crate) fn new(
        keys: &'a Keys,
        ttl: Duration,
        mode: Mode,
        block: Block,
        opts: &'a Options,
        on_cluster: bool,
        held: &Held,
    ) -> Result<Acquire<'a>, Error> {
        check_ttl(ttl)?;
        if on_cluster {
            keys.one_slot()?;
        }
        for key in keys.all() {
            held.check(key)?;
        }
        let block = normalize(block);
        let wait_until = match block {
            Block::For(d) => Some(Instant::now() + d),
            _ => None,
        };
        Ok(Acquire {
            keys,
            owner: new_owner(),
            ttl,
            mode,
            block,
            wait_until,
            opts,
            lost: 0,
        })
    }

    /// The command of the next attempt and its read timeout.
    pub(crate) fn attempt(&self) -> (redis::Cmd, Option<Duration>) {
        match self.keys {
            Keys::One(key) => acquire_cmd(
                key,
                &self.owner,
                self.ttl,
                self.mode,
                self.block,
                self.wait_until,
                self.opts,
            ),
            Keys::Many(keys) => macquire_cmd(
                keys,
                &self.owner,
                self.ttl,
                self.block,
                self.wait_until,
                self.opts,
            ),
        }
    }

    /// The attempt failed with `e`: the pause before the next one (a lost
    /// reply with retries left, sent again with the same owner, a little
    /// later each time), or `None`: give up with `e`.
    pub(crate) fn retry(&mut self, e: &redis::RedisError) -> Option<Duration> {
        if !lost_reply(e) || self.lost >= self.opts.retries {
            return None;
        }
        self.lost += 1;
        Some(Duration::from_millis(20 * self.lost as u64))
    }
}

/// What a null acquire reply means, given the server's `INFO lease` read
/// right after it: another owner holds the lease (`Ok(None)`), or the
/// server is in its grace period ([`Error::Grace`]).
pub(crate) fn refused<T>(info: &str) -> Result<Option<T>, Error> {
    match grace_of(info) {
        Some(grace) => Err(grace),
        None => Ok(None),
    }
}

/// Does a new lease renew at once? After a blocking acquire granted long
/// after it was sent, the deadline counted from the send is near or past.
pub(crate) fn renews_first(sent: Instant, ttl: Duration) -> bool {
    sent.elapsed() >= renew_every(ttl)
}

/// A new lease's deadline, and its loss if the renewal at once (sent at
/// `renewed`, answering `reply`) said it is not ours: `ttl` from the
/// acquire's send, or from that renewal's when it renewed every key
/// (answered `keys`: 1, or the number of keys of a multi-key lease). A
/// renewal with no answer changes nothing.
pub(crate) fn start(
    sent: Instant,
    ttl: Duration,
    keys: i64,
    renewal: Option<(Instant, &redis::RedisResult<i64>)>,
) -> (Instant, Option<Loss>) {
    match renewal {
        Some((renewed, Ok(n))) if *n == keys => (renewed + ttl, None),
        Some((_, Ok(_))) => (sent + ttl, Some(Loss::Refused)),
        _ => (sent + ttl, None),
    }
}

/// Does this `LEASE.ACQUIRE` (or `LEASE.MACQUIRE`) wait (`BLOCK`)? It then
/// needs a connection of its own: a blocked connection carries nothing else
/// meanwhile. `BLOCK ms` is always last, so a key named `BLOCK` does not
/// count.
pub(crate) fn waits(cmd: &redis::Cmd) -> bool {
    let args: Vec<_> = cmd.args_iter().collect();
    args.len() >= 2 && matches!(args[args.len() - 2], redis::Arg::Simple(b) if b == b"BLOCK")
}

/// One renewal's reply: an integer, or anything else (an error reply).
impl From<redis::Value> for Reply {
    fn from(value: redis::Value) -> Reply {
        match value {
            redis::Value::Int(n) => Reply::Int(n),
            _ => Reply::Failed,
        }
    }
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

/// A renewal due within this of a batch goes out with it (early, which is
/// harmless: the deadline only moves later), so leases taken at different
/// moments fall into step and share their round trips.
pub(crate) fn renew_window(ttl: Duration) -> Duration {
    ttl / 12
}

/// `LEASE.RENEW key owner ttl-ms`.
pub(crate) fn renew_cmd(key: &str, owner: &str, ttl: Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("LEASE.RENEW");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    cmd
}

/// `LEASE.RELEASE key owner`.
pub(crate) fn release_cmd(key: &str, owner: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("LEASE.RELEASE");
    cmd.arg(key).arg(owner);
    cmd
}

/// A connection idle this long is checked (`PING`) before its next call,
/// as redis-py's `health_check_interval` does: the server may have closed
/// it meanwhile (a restart, `CLIENT KILL`, its idle `timeout`), and a
/// command sent on a closed connection fails without saying whether it
/// ran. The check costs one round trip, only after a pause; calls in a row
/// go straight out.
pub(crate) const IDLE_CHECK: Duration = Duration::from_millis(100);

/// At most this many idle connections stay open per client (the rest are
/// closed when they come back): concurrent calls open more, a quiet client
/// keeps few.
pub(crate) const POOL_IDLE: usize = 8;

/// When a connection last answered, and the client's count of dropped
/// connections then: a connection idle for [`IDLE_CHECK`], or one that
/// predates a drop seen on another connection (the server restarted, say),
/// is checked before it is used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fresh {
    used: Instant,
    drops: u64,
}

impl Fresh {
    /// A connection that answered now, with `drops` seen so far.
    pub(crate) fn now(drops: u64) -> Fresh {
        Fresh {
            used: Instant::now(),
            drops,
        }
    }

    /// Must it answer a `PING` before it carries a command?
    pub(crate) fn suspect(&self, drops: u64) -> bool {
        self.drops != drops || self.used.elapsed() >= IDLE_CHECK
    }
}

/// How long a watchdog with no lease left waits for the next one before it
/// ends: a client that takes and gives back leases one after the other
/// keeps one watchdog instead of starting one a lease.
pub(crate) const WATCHDOG_LINGER: Duration = Duration::from_secs(5);

/// The time a watchdog idle since `since` still lingers at `now`; `None`
/// once [`WATCHDOG_LINGER`] has passed.
pub(crate) fn linger_left(since: Instant, now: Instant) -> Option<Duration> {
    WATCHDOG_LINGER
        .checked_sub(now.saturating_duration_since(since))
        .filter(|left| !left.is_zero())
}

/// What the watchdog's schedule needs of a lease's loss signal.
pub(crate) trait Renewable {
    /// Neither lost nor released: worth renewing.
    fn live(&self) -> bool;
    /// The client-side deadline now.
    fn deadline(&self) -> Instant;
    /// A renewal sent at `sent` answered 1. False: lost or released
    /// meanwhile, renew no more.
    fn renewed(&self, sent: Instant, ttl: Duration) -> bool;
    /// A renewal answered 0: the server says the lease is not ours.
    fn refused(&self);
}

struct Entry<S> {
    ttl: Duration,
    next: Instant,
    /// `LEASE.RENEW`, or one `LEASE.MRENEW` for every key of a multi-key
    /// lease.
    cmd: redis::Cmd,
    /// What a renewal of every key answers (1, or the number of keys).
    renewed: i64,
    /// The key to route the renewal by on a cluster ([`Keys::route`]).
    route: Option<String>,
    signal: S,
}

/// The renewals of one batch: one pipeline per server.
pub(crate) struct Batch {
    ids: Vec<u64>,
    /// The `LEASE.RENEW` (or `LEASE.MRENEW`) of each lease of the batch,
    /// in order.
    pub(crate) cmds: Vec<redis::Cmd>,
    /// For each command, the key a cluster client must route it by
    /// ([`Keys::route`]; `None`: as usual).
    pub(crate) routes: Vec<Option<String>>,
    /// When the batch is sent: each success counts its ttl from here.
    pub(crate) sent: Instant,
    /// How long to wait for the replies: until the latest deadline of the
    /// batch (a reply after it renews nothing), at most the io timeout.
    pub(crate) read: Duration,
}

/// The reply to one renewal of a batch.
pub(crate) enum Reply {
    /// An integer reply: the number of keys renewed (1, or every key of a
    /// multi-key lease), 0 refused.
    Int(i64),
    /// An error reply, or no reply: tried again after a pause.
    Failed,
}

/// The watchdog's plan for every lease of a client: when each renewal is
/// due, which renewals go out together, what each reply does to its lease.
/// One per client (and its clones), whatever the number of leases; the I/O
/// layer only sends [`Batch`]es and hands their replies to
/// [`Schedule::settle`].
pub(crate) struct Schedule<S> {
    leases: HashMap<u64, Entry<S>>,
    next_id: u64,
    /// When the watchdog looks again (`None`: it is not running): a lease
    /// added whose first renewal is due later needs no wake-up, so adding
    /// many leases does not make the watchdog scan them all each time.
    looks_at: Option<Instant>,
    /// Renewals sent, and the round trips that carried them.
    pub(crate) renewals: u64,
    pub(crate) round_trips: u64,
}

impl<S> Default for Schedule<S> {
    fn default() -> Self {
        Schedule {
            leases: HashMap::new(),
            next_id: 0,
            looks_at: None,
            renewals: 0,
            round_trips: 0,
        }
    }
}

/// What the watchdog does next.
pub(crate) enum Next {
    /// Send this batch now.
    Send(Batch),
    /// Sleep until then (or until a lease is added).
    Sleep(Instant),
    /// No lease left: stop.
    Idle,
}

impl<S: Renewable> Schedule<S> {
    /// Watches a lease on `keys` (every key of a multi-key lease renewed by
    /// one `LEASE.MRENEW`): its first renewal is due at `first`. Returns its
    /// id, and whether the watchdog must be woken (it would look too late).
    pub(crate) fn add(
        &mut self,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        first: Instant,
        signal: S,
    ) -> (u64, bool) {
        self.next_id += 1;
        let entry = Entry {
            ttl,
            next: first,
            cmd: keys.renew_cmd(owner, ttl),
            renewed: keys.count(),
            route: keys.route().map(str::to_string),
            signal,
        };
        self.leases.insert(self.next_id, entry);
        let wake = self.looks_at.is_none_or(|at| first < at);
        (self.next_id, wake)
    }

    /// The watchdog has no lease and lingers until `at` (see
    /// [`WATCHDOG_LINGER`]): it looks again then, so a lease whose first
    /// renewal is later need not wake it.
    pub(crate) fn idle_until(&mut self, at: Instant) {
        self.looks_at = Some(at);
    }

    /// Stops watching a lease (released).
    pub(crate) fn remove(&mut self, id: u64) {
        self.leases.remove(&id);
    }

    /// How many leases are watched.
    pub(crate) fn len(&self) -> usize {
        self.leases.len()
    }

    /// At `now`: forgets the leases lost or released, then either the batch
    /// of every renewal due within its window (when at least one is due),
    /// or when to look again.
    pub(crate) fn next(&mut self, now: Instant, io_timeout: Duration) -> Next {
        self.leases.retain(|_, e| e.signal.live());
        let Some(first) = self.leases.values().map(|e| e.next).min() else {
            self.looks_at = None;
            return Next::Idle;
        };
        // After a batch the watchdog looks again at once (settle, then next).
        self.looks_at = Some(first.max(now));
        if first > now {
            return Next::Sleep(first);
        }
        let mut batch = Batch {
            ids: Vec::new(),
            cmds: Vec::new(),
            routes: Vec::new(),
            sent: now,
            read: Duration::from_millis(1),
        };
        for (id, e) in &self.leases {
            if e.next <= now + renew_window(e.ttl) {
                batch.ids.push(*id);
                batch.cmds.push(e.cmd.clone());
                batch.routes.push(e.route.clone());
                let left = e.signal.deadline().saturating_duration_since(now);
                batch.read = batch.read.max(left.min(io_timeout));
            }
        }
        Next::Send(batch)
    }

    /// The replies to `batch`, in its order (fewer than its commands, or
    /// none: the rest got no reply). A renewal of every key (1, or the
    /// number of keys of a multi-key lease) moves the lease's deadline and
    /// its next renewal to a third of the ttl after the batch was sent;
    /// another integer (0) is the loss; anything else is tried again soon.
    pub(crate) fn settle(&mut self, batch: &Batch, replies: Vec<Reply>) {
        self.round_trips += 1;
        self.renewals += batch.ids.len() as u64;
        let mut replies = replies.into_iter();
        for id in &batch.ids {
            let reply = replies.next().unwrap_or(Reply::Failed);
            let Some(e) = self.leases.get_mut(id) else {
                continue;
            };
            match reply {
                Reply::Int(n) if n == e.renewed && e.signal.renewed(batch.sent, e.ttl) => {
                    e.next = batch.sent + renew_every(e.ttl);
                }
                Reply::Int(n) if n == e.renewed => {
                    self.leases.remove(id);
                }
                Reply::Int(_) => {
                    e.signal.refused();
                    self.leases.remove(id);
                }
                Reply::Failed => e.next = Instant::now() + retry_pause(e.ttl),
            }
        }
    }
}

// --- Quorum leases (design.md S9): the decisions of step 3 and the fence.

/// A master left out of a quorum acquisition's commit (step 3) because the
/// others refused its token as too far ahead of their clocks (the `FLOOR`
/// bound): its clock is wrong. The token committed is the highest that a
/// majority accepts instead. Reported through `QuorumClient::on_outlier`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlier {
    /// The master's index in the client's list.
    pub master: usize,
    /// Its address (`host:port`, or a Unix socket's path).
    pub addr: String,
    /// The token it granted, which the others refused.
    pub token: u64,
    /// The token tried next in its place: the highest that the masters
    /// which refused it granted.
    pub instead: u64,
    /// How far ahead its token is of that one, in wall clock (a token
    /// counts 1024 per ms): about how far its clock runs ahead.
    pub ahead: Duration,
}

/// Is `e` a master's refusal of a `FLOOR` token as too far ahead of its
/// clock? Read from the error alone (it names `FLOOR` and says how far
/// ahead), never from the bound's value, which is the server's to choose.
pub(crate) fn floor_refused(e: &redis::RedisError) -> bool {
    let text = e.detail().unwrap_or_default();
    e.code() == Some("ERR") && text.contains("FLOOR") && text.contains("ahead")
}

/// Step 3 of a quorum acquisition, one round at a time: `LEASE.ACQUIRE
/// ... FLOOR token` to the masters `on`. The first round sends the highest
/// token granted in step 1 to every master that granted. When fewer than a
/// majority answer it exactly but a majority refused it as too far ahead of
/// their clocks, the next round leaves out the masters that granted it
/// (outliers) and sends, to the masters that refused, the highest token
/// they granted; each round leaves at least one master out, so there are
/// at most N. Any two majorities still share a master, so tokens of
/// successive holdings still increase.
#[derive(Debug, Clone)]
pub(crate) struct Commit {
    /// (master, token) of every master that granted in step 1.
    grants: Vec<(usize, u64)>,
    on: Vec<usize>,
    token: u64,
    quorum: usize,
}

/// What a round of step 3 decided.
#[derive(Debug)]
pub(crate) enum Committed {
    /// Held with `token`, committed on the masters `on` (a majority).
    Held { token: u64, on: Vec<usize> },
    /// Another round, without the outliers (reported).
    Again(Commit, Vec<Outlier>),
    /// No majority: release everywhere and try again later.
    Failed,
}

impl Commit {
    /// The first round, from step 1's grants; `None` when fewer than
    /// `quorum` masters granted.
    pub(crate) fn new(grants: Vec<(usize, u64)>, quorum: usize) -> Option<Commit> {
        let token = grants.iter().map(|&(_, t)| t).max()?;
        let on = grants.iter().map(|&(i, _)| i).collect();
        (grants.len() >= quorum).then_some(Commit {
            grants,
            on,
            token,
            quorum,
        })
    }

    /// The token this round commits.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// The masters this round goes to.
    pub(crate) fn on(&self) -> &[usize] {
        &self.on
    }

    /// Skips the commit: held with the highest token on every master that
    /// granted (only for the tests that show why step 3 exists).
    pub(crate) fn skipped(self) -> Committed {
        Committed::Held {
            token: self.token,
            on: self.on,
        }
    }

    fn granted(&self, master: usize) -> u64 {
        self.grants
            .iter()
            .find(|&&(i, _)| i == master)
            .map_or(0, |&(_, t)| t)
    }

    /// The round's replies, in the order of [`on`](Self::on); `addr` names
    /// a master for the report.
    pub(crate) fn settle(
        self,
        replies: Vec<redis::RedisResult<Option<u64>>>,
        addr: impl Fn(usize) -> String,
    ) -> Committed {
        let mut committed = Vec::new();
        let mut refused = Vec::new();
        for (&i, r) in self.on.iter().zip(replies) {
            match r {
                Ok(Some(t)) if t == self.token => committed.push(i),
                Err(e) if floor_refused(&e) => refused.push(i),
                _ => {}
            }
        }
        if committed.len() >= self.quorum {
            return Committed::Held {
                token: self.token,
                on: committed,
            };
        }
        let Some(instead) = refused.iter().map(|&i| self.granted(i)).max() else {
            return Committed::Failed;
        };
        if refused.len() < self.quorum {
            return Committed::Failed;
        }
        let outliers = self
            .on
            .iter()
            .filter(|&&i| self.granted(i) == self.token)
            .map(|&i| Outlier {
                master: i,
                addr: addr(i),
                token: self.token,
                instead,
                ahead: Duration::from_millis((self.token - instead) / 1024),
            })
            .collect();
        Committed::Again(
            Commit {
                on: refused,
                token: instead,
                ..self
            },
            outliers,
        )
    }
}

/// A quorum fence's outcome from the replies of the masters that committed
/// the token, in their order: the first reply of a master where the token
/// was current (the command's value, or the error the server returned for
/// the command) once at least `quorum` such replies came; else
/// [`Error::Stale`] (refused as stale, or no answer, on too many).
pub(crate) fn fence_outcome(
    replies: Vec<redis::RedisResult<redis::Value>>,
    quorum: usize,
) -> Result<redis::Value, Error> {
    let ran: Vec<_> = replies
        .into_iter()
        .filter(|r| match r {
            Ok(_) => true,
            Err(e) => e.code().is_some_and(|c| c != "STALE") && !lost_reply(e),
        })
        .collect();
    if ran.len() < quorum {
        return Err(Error::Stale);
    }
    ran.into_iter()
        .next()
        .expect("a majority ran it")
        .map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str) -> Keys {
        Keys::One(key.to_string())
    }

    fn words(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<not simple>".to_string(),
            })
            .collect()
    }

    /// A server's error reply, as the client reads it.
    fn server_error(text: &str) -> redis::RedisError {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn a_token_refused_as_too_far_ahead_is_left_out_and_the_next_committed() {
        const MS: u64 = 1024;
        let far = || {
            Err(server_error(
                "ERR FLOOR token is more than the grace length (1000 ms, at least 1000) ahead of this server's clock (at most 5 now)",
            ))
        };
        let grants = vec![
            (0, 900_000 * MS),
            (1, 100 * MS),
            (3, 300 * MS),
            (4, 200 * MS),
        ];
        let commit = Commit::new(grants, 3).unwrap();
        assert_eq!(
            (commit.token(), commit.on()),
            (900_000 * MS, &[0, 1, 3, 4][..])
        );
        let replies = vec![Ok(Some(900_000 * MS)), far(), far(), far()];
        let Committed::Again(next, outliers) = commit.settle(replies, |i| format!("m{i}")) else {
            panic!("another round");
        };
        assert_eq!(
            outliers,
            vec![Outlier {
                master: 0,
                addr: "m0".into(),
                token: 900_000 * MS,
                instead: 300 * MS,
                ahead: Duration::from_millis(899_700),
            }]
        );
        assert_eq!((next.token(), next.on()), (300 * MS, &[1, 3, 4][..]));
        // Another round whose answers are a majority: held without master 0.
        let replies = vec![Ok(Some(300 * MS)), Ok(Some(300 * MS)), Ok(Some(300 * MS))];
        assert!(matches!(
            next.settle(replies, |i| format!("m{i}")),
            Committed::Held { token, on } if token == 300 * MS && on == [1, 3, 4]
        ));
        // A minority refusing does not matter; too few refusing to make a
        // majority without the top: no lease.
        let commit = || Commit::new(vec![(0, 9), (1, 5), (2, 7)], 2).unwrap();
        assert!(matches!(
            commit().settle(vec![Ok(Some(9)), Ok(Some(9)), far()], |_| String::new()),
            Committed::Held { token: 9, .. }
        ));
        let timeout = || {
            Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        };
        assert!(matches!(
            commit().settle(vec![Ok(Some(9)), far(), timeout()], |_| String::new()),
            Committed::Failed
        ));
        // Other errors are no refusal of the token.
        let other = || {
            Err(server_error(
                "ERR FLOOR is for exclusive leases: it cannot be given with LIMIT or SHARED",
            ))
        };
        assert!(matches!(
            commit().settle(vec![Ok(Some(9)), other(), other()], |_| String::new()),
            Committed::Failed
        ));
        assert!(
            Commit::new(vec![(0, 9)], 2).is_none(),
            "no majority granted"
        );
    }

    #[test]
    fn a_quorum_fence_reports_the_commands_error_and_stale_only_when_stale() {
        let value = |n| Ok(redis::Value::Int(n));
        let failed = || Err(server_error("ERR value is not an integer or out of range"));
        let stale = || {
            Err(server_error(
                "STALE fencing token is not the token of the lease held on this key",
            ))
        };
        let lost = || {
            Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        };
        assert!(matches!(
            fence_outcome(vec![value(1), value(2), lost()], 2),
            Ok(redis::Value::Int(1))
        ));
        match fence_outcome(vec![failed(), failed(), failed()], 2) {
            Err(Error::Redis(e)) => assert!(e.to_string().contains("not an integer"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            fence_outcome(vec![lost(), failed(), value(3)], 2),
            Err(Error::Redis(_))
        ));
        assert!(matches!(
            fence_outcome(vec![stale(), stale(), value(3)], 2),
            Err(Error::Stale)
        ));
        assert!(matches!(
            fence_outcome(vec![failed(), lost(), lost()], 2),
            Err(Error::Stale)
        ));
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
        assert!(!waits(&c));
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
        assert!(waits(&c));
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

    /// A loss signal for the schedule's tests: a deadline and a loss.
    #[derive(Clone, Default)]
    struct Probe(Arc<Mutex<(Option<Instant>, Option<Loss>)>>);

    impl Probe {
        fn new(deadline: Instant) -> Probe {
            Probe(Arc::new(Mutex::new((Some(deadline), None))))
        }
        fn loss(&self) -> Option<Loss> {
            self.0.lock().unwrap().1
        }
    }

    impl Renewable for Probe {
        fn live(&self) -> bool {
            self.loss().is_none()
        }
        fn deadline(&self) -> Instant {
            self.0.lock().unwrap().0.unwrap()
        }
        fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
            let mut st = self.0.lock().unwrap();
            st.0 = Some(sent + ttl);
            st.1.is_none()
        }
        fn refused(&self) {
            self.0.lock().unwrap().1 = Some(Loss::Refused);
        }
    }

    fn sent(next: Next) -> Batch {
        match next {
            Next::Send(b) => b,
            Next::Sleep(_) => panic!("sleeps"),
            Next::Idle => panic!("idle"),
        }
    }

    #[test]
    fn renewals_due_together_share_one_batch() {
        let ttl = Duration::from_millis(1200);
        let t0 = Instant::now();
        let mut s = Schedule::default();
        // Due at +400 ms, +450 ms (within the 100 ms window) and +700 ms.
        let probes: Vec<Probe> = (0..3).map(|_| Probe::new(t0 + ttl)).collect();
        for (i, at) in [400u64, 450, 700].iter().enumerate() {
            s.add(
                &one(&format!("k{i}")),
                "o",
                ttl,
                t0 + Duration::from_millis(*at),
                probes[i].clone(),
            );
        }
        assert!(
            matches!(s.next(t0, Duration::from_secs(5)), Next::Sleep(t) if t == t0 + Duration::from_millis(400))
        );
        // The watchdog sleeps until +400 ms: a lease due later wakes nothing,
        // one due sooner does.
        let late = Probe::new(t0 + ttl);
        let (id, wake) = s.add(
            &one("late"),
            "o",
            ttl,
            t0 + Duration::from_millis(900),
            late,
        );
        assert!(!wake);
        s.remove(id);
        let soon = Probe::new(t0 + ttl);
        let (id, wake) = s.add(
            &one("soon"),
            "o",
            ttl,
            t0 + Duration::from_millis(300),
            soon,
        );
        assert!(wake);
        s.remove(id);
        let now = t0 + Duration::from_millis(400);
        let b = sent(s.next(now, Duration::from_secs(5)));
        assert_eq!(b.cmds.len(), 2, "the one due 50 ms later goes along");
        assert!(b.read <= Duration::from_millis(800) && b.read > Duration::from_millis(700));
        s.settle(&b, vec![Reply::Int(1), Reply::Int(1)]);
        assert_eq!((s.renewals, s.round_trips, s.len()), (2, 1, 3));
        // Both now due at now + 400 ms: in step from here on.
        assert!(
            matches!(s.next(now, Duration::from_secs(5)), Next::Sleep(t) if t == t0 + Duration::from_millis(700))
        );
        let b = sent(s.next(t0 + Duration::from_millis(700), Duration::from_secs(5)));
        assert_eq!(b.cmds.len(), 3, "700 and 800 within the window");
        // A refusal is the loss and ends the watch; no reply is tried again.
        s.settle(&b, vec![Reply::Int(0)]);
        let lost = probes
            .iter()
            .filter(|p| p.loss() == Some(Loss::Refused))
            .count();
        assert_eq!(lost, 1);
        assert_eq!(s.len(), 2);
        let b = sent(s.next(
            Instant::now() + Duration::from_millis(300),
            Duration::from_secs(5),
        ));
        assert_eq!(
            b.cmds.len(),
            2,
            "the two with no reply come back within the retry pause"
        );
    }

    #[test]
    fn lost_or_released_leases_leave_the_schedule() {
        let ttl = Duration::from_millis(300);
        let now = Instant::now();
        let mut s = Schedule::default();
        let p = Probe::new(now + ttl);
        let (id, wake) = s.add(&one("k"), "o", ttl, now, p.clone());
        assert!(wake, "a watchdog that is not running is started");
        let q = Probe::new(now + ttl);
        s.add(&one("k2"), "o", ttl, now, q.clone());
        q.refused();
        let b = sent(s.next(now, Duration::from_secs(5)));
        assert_eq!(b.cmds.len(), 1, "the lost one is not renewed");
        s.remove(id);
        s.settle(&b, vec![Reply::Int(1)]);
        assert!(matches!(s.next(now, Duration::from_secs(5)), Next::Idle));
    }

    #[test]
    fn an_acquire_retries_lost_replies_only_and_a_little_later_each_time() {
        let opts = Options {
            retries: 2,
            ..Options::default()
        };
        let ttl = Duration::from_secs(1);
        assert!(matches!(
            Acquire::new(
                &one("k"),
                Duration::ZERO,
                Mode::Exclusive,
                Block::NoWait,
                &opts,
                false,
                &Held::default()
            ),
            Err(Error::InvalidTtl(_))
        ));
        let k = one("k");
        let mut plan = Acquire::new(
            &k,
            ttl,
            Mode::Exclusive,
            Block::NoWait,
            &opts,
            false,
            &Held::default(),
        )
        .unwrap();
        let lost = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let refused = redis::RedisError::from((redis::ErrorKind::Client, "ERR"));
        assert_eq!(plan.retry(&refused), None, "an error reply is the answer");
        assert_eq!(plan.retry(&lost), Some(Duration::from_millis(20)));
        assert_eq!(plan.retry(&lost), Some(Duration::from_millis(40)));
        assert_eq!(plan.retry(&lost), None, "retries spent");
        let owner = plan.owner.clone();
        let (cmd, _) = plan.attempt();
        assert!(
            cmd.args_iter()
                .any(|a| matches!(a, redis::Arg::Simple(b) if b == owner.as_bytes())),
            "the same owner every time"
        );
    }

    #[test]
    fn a_lease_granted_late_counts_from_its_first_renewal() {
        let ttl = Duration::from_secs(3);
        let sent = Instant::now() - Duration::from_secs(2);
        assert!(renews_first(sent, ttl));
        assert!(!renews_first(Instant::now(), ttl));
        let now = Instant::now();
        assert_eq!(start(sent, ttl, 1, Some((now, &Ok(1)))), (now + ttl, None));
        assert_eq!(
            start(sent, ttl, 1, Some((now, &Ok(0)))),
            (sent + ttl, Some(Loss::Refused))
        );
        let lost = Err(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )));
        assert_eq!(start(sent, ttl, 1, Some((now, &lost))), (sent + ttl, None));
        assert_eq!(start(sent, ttl, 1, None), (sent + ttl, None));
        assert!(matches!(refused::<u64>(""), Ok(None)));
        assert!(matches!(
            refused::<u64>("lease_grace_remaining_ms:10"),
            Err(Error::Grace { .. })
        ));
    }

    #[test]
    fn a_multi_key_lease_sends_every_key_with_its_count() {
        assert!(matches!(
            Keys::many::<&str>(&[]),
            Err(Error::InvalidKeys(_))
        ));
        assert!(matches!(
            Keys::many(&["a", "b", "a"]),
            Err(Error::InvalidKeys(ref m)) if m.contains("\"a\"")
        ));
        let keys = Keys::many(&["{t}a", "{t}b"]).unwrap();
        assert_eq!(
            (keys.count(), keys.first(), keys.route()),
            (2, "{t}a", Some("{t}a"))
        );
        assert_eq!(one("k").route(), None);
        assert!(keys.one_slot().is_ok());
        let cross = Keys::many(&["{t}a", "{u}b"]).unwrap();
        assert!(
            matches!(cross.one_slot(), Err(Error::InvalidKeys(ref m)) if m.contains("CROSSSLOT"))
        );
        assert_eq!(
            words(&keys.renew_cmd("o", Duration::from_millis(1500))),
            ["LEASE.MRENEW", "2", "{t}a", "{t}b", "o", "1500"]
        );
        assert_eq!(
            words(&keys.release_cmd("o")),
            ["LEASE.MRELEASE", "2", "{t}a", "{t}b", "o"]
        );
        let each: Vec<_> = keys.leftover_cmds("o").iter().map(words).collect();
        assert_eq!(
            each,
            [
                ["LEASE.RELEASE", "{t}a", "o"],
                ["LEASE.RELEASE", "{t}b", "o"]
            ]
        );
        assert!(one("k").leftover_cmds("o").is_empty());
        let opts = Options::default();
        let plan = Acquire::new(
            &keys,
            Duration::from_secs(1),
            Mode::Shared,
            Block::Forever,
            &opts,
            false,
            &Held::default(),
        )
        .unwrap();
        let (cmd, read) = plan.attempt();
        let w = words(&cmd);
        assert_eq!(w[..4], ["LEASE.MACQUIRE", "2", "{t}a", "{t}b"]);
        assert_eq!(w[4], plan.owner);
        assert_eq!(
            w[5..],
            ["1000", "BLOCK", "0"],
            "exclusive, whatever the mode"
        );
        assert_eq!(read, None);
        assert!(waits(&cmd));
        // A key named BLOCK is not the option.
        let odd = Keys::many(&["BLOCK", "x"]).unwrap();
        let plan = Acquire::new(
            &odd,
            Duration::from_secs(1),
            Mode::Exclusive,
            Block::NoWait,
            &opts,
            false,
            &Held::default(),
        )
        .unwrap();
        let (cmd, read) = plan.attempt();
        assert!(!waits(&cmd));
        assert_eq!(read, Some(opts.io_timeout));
        let (cmd, _) = acquire_cmd(
            "BLOCK",
            "o",
            Duration::from_secs(1),
            Mode::Exclusive,
            Block::NoWait,
            None,
            &opts,
        );
        assert!(!waits(&cmd));
        // The renewal at once after a long wait renewed every key, or not.
        let sent = Instant::now() - Duration::from_secs(2);
        let now = Instant::now();
        let ttl = Duration::from_secs(3);
        assert_eq!(start(sent, ttl, 2, Some((now, &Ok(2)))), (now + ttl, None));
        assert_eq!(
            start(sent, ttl, 2, Some((now, &Ok(0)))),
            (sent + ttl, Some(Loss::Refused))
        );
    }

    #[test]
    fn a_multi_key_renewal_is_one_command_that_renews_every_key_or_none() {
        let ttl = Duration::from_millis(600);
        let now = Instant::now();
        let mut s = Schedule::default();
        let (m, single) = (Probe::new(now + ttl), Probe::new(now + ttl));
        let keys = Keys::many(&["{t}a", "{t}b", "{t}c"]).unwrap();
        s.add(&keys, "o", ttl, now, m.clone());
        s.add(&one("k"), "o", ttl, now, single.clone());
        let b = sent(s.next(now, Duration::from_secs(5)));
        assert_eq!(b.cmds.len(), 2, "one command per lease, in the same batch");
        let multi = b
            .routes
            .iter()
            .position(|r| r.is_some())
            .expect("the multi-key one is routed");
        assert_eq!(b.routes[multi].as_deref(), Some("{t}a"));
        assert_eq!(words(&b.cmds[multi])[0], "LEASE.MRENEW");
        assert_eq!(b.routes[1 - multi], None);
        // 3 renews all three keys; a 1 from LEASE.MRENEW would not.
        let mut replies = vec![Reply::Int(1), Reply::Int(1)];
        replies[multi] = Reply::Int(3);
        s.settle(&b, replies);
        assert!(m.loss().is_none() && single.loss().is_none());
        assert_eq!((s.renewals, s.round_trips, s.len()), (2, 1, 2));
        let later = now + renew_every(ttl);
        let b = sent(s.next(later, Duration::from_secs(5)));
        let multi = b.routes.iter().position(|r| r.is_some()).unwrap();
        let mut replies = vec![Reply::Int(1), Reply::Int(1)];
        replies[multi] = Reply::Int(0);
        s.settle(&b, replies);
        assert_eq!(m.loss(), Some(Loss::Refused), "0: the loss of every key");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn an_idle_watchdog_lingers_and_a_later_lease_does_not_wake_it() {
        let now = Instant::now();
        assert_eq!(
            linger_left(now, now + Duration::from_secs(1)),
            Some(WATCHDOG_LINGER - Duration::from_secs(1))
        );
        assert_eq!(
            linger_left(now, now + WATCHDOG_LINGER),
            None,
            "then it ends"
        );
        let ttl = Duration::from_secs(30);
        let mut s: Schedule<Probe> = Schedule::default();
        assert!(matches!(s.next(now, Duration::from_secs(5)), Next::Idle));
        // Without the linger mark, any lease wakes an idle watchdog.
        let (_, wake) = s.add(
            &one("a"),
            "o",
            ttl,
            now + renew_every(ttl),
            Probe::new(now + ttl),
        );
        assert!(wake);
        let mut s: Schedule<Probe> = Schedule::default();
        assert!(matches!(s.next(now, Duration::from_secs(5)), Next::Idle));
        s.idle_until(now + WATCHDOG_LINGER);
        let (_, wake) = s.add(
            &one("a"),
            "o",
            ttl,
            now + renew_every(ttl),
            Probe::new(now + ttl),
        );
        assert!(!wake, "its first renewal is after the watchdog looks again");
        let (_, wake) = s.add(
            &one("b"),
            "o",
            ttl,
            now + Duration::from_millis(10),
            Probe::new(now + ttl),
        );
        assert!(wake, "one due before that wakes it");
    }
}
