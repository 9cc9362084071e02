//! The workload of the Sentinel scenarios (`Workload`): four holders
//! (`Worker`s) that find the master through Sentinel for every call and
//! acquire, hold (fenced writes, renewals) and release leases on `KEYS`
//! shared keys, and what they record of it (`Holding`, `Write`, `Counts`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::Params;
use crate::common::*;

pub(super) const KEYS: usize = 3;

const WORKERS: usize = 4;

/// A worker's hard bounds, whatever the controller does.
const WORKER_MAX_RUN: Duration = Duration::from_secs(120);

const WORKER_MAX_OPS: u64 = 200_000;

fn lock_key(k: usize) -> String {
    format!("lock:{k}")
}

fn data_key(k: usize) -> String {
    format!("fenced:lock:{k}")
}

/// What a holder saw of one acquisition.
#[derive(Debug, Clone)]
pub(super) struct Holding {
    pub(super) worker: usize,
    pub(super) key: usize,
    pub(super) token: i64,
    pub(super) ttl: u64,
    /// The master that granted it.
    pub(super) port: u16,
    /// When the acquire was sent.
    pub(super) sent: Instant,
    /// When the token arrived: from then on the holder believes it holds.
    pub(super) start: Instant,
    /// When the holder's belief ended, as design.md S7 lets a client use a
    /// lease: min(the sending of the last acknowledged acquire or renewal +
    /// ttl, the answer of a master that says it does not hold it (RENEW 0,
    /// STALE), the sending of the release). A connection error or a refusal
    /// without an answer about the lease (no master, READONLY, NOREPLICAS)
    /// does not end it: the holder retries until its time is up.
    pub(super) end: Instant,
    /// The first such error, when there was one: the end under the reading
    /// "a renewal or write that errored ends the holding" (shorter holdings,
    /// so fewer overlaps to find).
    pub(super) first_error: Option<Instant>,
    /// Why it ended.
    pub(super) how: &'static str,
    /// The acknowledgements (grant, renewals): when they arrived, from
    /// which master.
    pub(super) acks: Vec<(Instant, u16)>,
}

impl Holding {
    /// The end when any error also ends the holding.
    pub(super) fn end_on_error(&self) -> Instant {
        self.first_error.map_or(self.end, |e| e.min(self.end))
    }
}

/// A fenced write the server acknowledged: `SET fenced:<key> token GET`
/// answers the value it replaced.
#[derive(Debug, Clone)]
pub(super) struct Write {
    pub(super) key: usize,
    pub(super) token: i64,
    pub(super) prev: Option<i64>,
}

#[derive(Debug, Default, Clone)]
pub(super) struct Counts {
    acquire_sent: u64,
    pub(super) granted: u64,
    null: u64,
    acquire_err: u64,
    renewed: u64,
    renew_zero: u64,
    fence_ok: u64,
    fence_stale: u64,
    /// Errors while holding (retried).
    hold_err: u64,
    released: u64,
    release_zero: u64,
    release_err: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.acquire_sent += o.acquire_sent;
        self.granted += o.granted;
        self.null += o.null;
        self.acquire_err += o.acquire_err;
        self.renewed += o.renewed;
        self.renew_zero += o.renew_zero;
        self.fence_ok += o.fence_ok;
        self.fence_stale += o.fence_stale;
        self.hold_err += o.hold_err;
        self.released += o.released;
        self.release_zero += o.release_zero;
        self.release_err += o.release_err;
    }
}

/// How a call went.
enum Reply {
    Value(Value, u16),
    /// An error reply (`STALE`, `READONLY`, `NOREPLICAS`, ...) or no
    /// answer (no master, a broken connection).
    Failed(String),
}

/// A holder: finds the master through Sentinel for every call, keeps a
/// connection per master.
struct Worker {
    id: usize,
    sentinels: Vec<u16>,
    sentinel_conns: Vec<Option<redis::Connection>>,
    conns: HashMap<u16, redis::Connection>,
    rng: StdRng,
    counts: Counts,
    /// Shared with the controller, which may look between failovers.
    holdings: Arc<Mutex<Vec<Holding>>>,
    writes: Arc<Mutex<Vec<Write>>>,
    /// The holding in progress of each worker (`end`: its deadline now).
    open: Arc<Mutex<Vec<Option<Holding>>>>,
    ops: u64,
}

impl Worker {
    fn master(&mut self) -> Option<u16> {
        for _ in 0..self.sentinels.len() {
            let i = self.rng.random_range(0..self.sentinels.len());
            if self.sentinel_conns[i].is_none() {
                self.sentinel_conns[i] = quick_conn(self.sentinels[i]);
            }
            if let Some(c) = self.sentinel_conns[i].as_mut() {
                match master_from(c) {
                    Some(p) => return Some(p),
                    None => self.sentinel_conns[i] = None,
                }
            }
        }
        None
    }

    /// Sends `args` to the master Sentinel names now; `sent` is set just
    /// before the command goes out.
    fn call(&mut self, args: &[String], sent: &mut Instant) -> Reply {
        self.ops += 1;
        let Some(port) = self.master() else {
            *sent = Instant::now();
            return Reply::Failed("no master from Sentinel".into());
        };
        let c = match self.conns.entry(port) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match quick_conn(port) {
                Some(c) => e.insert(c),
                None => {
                    *sent = Instant::now();
                    return Reply::Failed(format!("cannot connect to {port}"));
                }
            },
        };
        *sent = Instant::now();
        match call_args(c, args) {
            Ok(v) => Reply::Value(v, port),
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    self.conns.remove(&port);
                }
                Reply::Failed(error_text(&e))
            }
        }
    }

    fn pause(&mut self, lo: u64, hi: u64) {
        thread::sleep(Duration::from_millis(self.rng.random_range(lo..=hi)));
    }

    fn bounded(&self, began: Instant) -> bool {
        began.elapsed() < WORKER_MAX_RUN && self.ops < WORKER_MAX_OPS
    }

    fn run(&mut self, p: Params, stop: &AtomicBool) {
        let began = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) && self.bounded(began) {
            n += 1;
            let key = self.rng.random_range(0..KEYS);
            let owner = format!("w{}-{n}", self.id);
            let ttl = self.rng.random_range(p.ttl.0..=p.ttl.1);
            let args = vec![
                "LEASE.ACQUIRE".to_string(),
                lock_key(key),
                owner.clone(),
                ttl.to_string(),
            ];
            let mut sent = Instant::now();
            self.counts.acquire_sent += 1;
            match self.call(&args, &mut sent) {
                Reply::Value(Value::Int(token), port) => {
                    let start = Instant::now();
                    self.counts.granted += 1;
                    let h = Holding {
                        worker: self.id,
                        key,
                        token,
                        ttl,
                        port,
                        sent,
                        start,
                        end: start,
                        first_error: None,
                        how: "",
                        acks: vec![(start, port)],
                    };
                    self.hold(h, &owner, stop, began);
                    self.pause(5, 30);
                }
                Reply::Value(Value::Nil, _) => {
                    self.counts.null += 1;
                    self.pause(10, 40);
                }
                Reply::Value(other, _) => panic!("LEASE.ACQUIRE answered {other:?}"),
                Reply::Failed(_) => {
                    self.counts.acquire_err += 1;
                    self.pause(30, 60);
                }
            }
        }
    }

    /// Sends `args` until a master answers about the lease, retrying errors
    /// every 50 ms while the holding is valid. `None`: its time ran out.
    fn attempt(
        &mut self,
        args: &[String],
        deadline: Instant,
        h: &mut Holding,
        began: Instant,
    ) -> Option<(Result<Value, String>, u16, Instant)> {
        while Instant::now() < deadline && self.bounded(began) {
            let mut sent = Instant::now();
            match self.call(args, &mut sent) {
                Reply::Value(v, port) => return Some((Ok(v), port, sent)),
                Reply::Failed(e) if e.starts_with("STALE") => return Some((Err(e), 0, sent)),
                Reply::Failed(_) => {
                    self.counts.hold_err += 1;
                    h.first_error.get_or_insert_with(Instant::now);
                    self.pause(40, 60);
                }
            }
        }
        None
    }

    /// Shows the holding in progress to the controller, `end` set to its
    /// current deadline.
    fn set_open(&self, h: &Holding, deadline: Instant) {
        let mut open = h.clone();
        open.end = deadline;
        self.open.lock().unwrap()[self.id] = Some(open);
    }

    /// Records the end of a holding: at `at`, or at its deadline if that
    /// came first.
    fn finish(&self, mut h: Holding, at: Instant, deadline: Instant, how: &'static str) {
        h.end = at.min(deadline);
        h.how = if at >= deadline { "expired" } else { how };
        self.open.lock().unwrap()[self.id] = None;
        self.holdings.lock().unwrap().push(h);
    }

    /// Holds the lease for one to three rounds of (idle for 40 to 80% of
    /// the ttl, fenced write, renewal), then a last fenced write and the
    /// release.
    fn hold(&mut self, mut h: Holding, owner: &str, stop: &AtomicBool, began: Instant) {
        let ttl = Duration::from_millis(h.ttl);
        let mut deadline = h.sent + ttl;
        let rounds = self.rng.random_range(1..=3);
        let key = lock_key(h.key);
        let token = h.token.to_string();
        let fence = vec![
            "LEASE.FENCE".to_string(),
            key.clone(),
            token.clone(),
            "SET".into(),
            data_key(h.key),
            token.clone(),
            "GET".into(),
        ];
        let renew = vec![
            "LEASE.RENEW".to_string(),
            key.clone(),
            owner.to_string(),
            h.ttl.to_string(),
        ];
        self.set_open(&h, deadline);
        for round in 0..=rounds {
            // Idle (the work between two calls), within the validity.
            let idle =
                Duration::from_millis(self.rng.random_range(h.ttl * 4 / 10..=h.ttl * 8 / 10));
            let left = deadline.saturating_duration_since(Instant::now());
            thread::sleep(idle.min(left.saturating_sub(Duration::from_millis(150))));
            match self.attempt(&fence, deadline, &mut h, began) {
                None => return self.finish(h, deadline, deadline, "expired"),
                Some((Ok(v), _, _)) => {
                    self.counts.fence_ok += 1;
                    let prev = match &v {
                        Value::Nil => None,
                        other => Some(text(other).parse().expect("a token in fenced:<key>")),
                    };
                    self.writes.lock().unwrap().push(Write {
                        key: h.key,
                        token: h.token,
                        prev,
                    });
                }
                Some((Err(_), _, _)) => {
                    self.counts.fence_stale += 1;
                    return self.finish(h, Instant::now(), deadline, "stale");
                }
            }
            if round == rounds || stop.load(Ordering::Relaxed) {
                break;
            }
            match self.attempt(&renew, deadline, &mut h, began) {
                None => return self.finish(h, deadline, deadline, "expired"),
                Some((Ok(Value::Int(1)), port, sent)) => {
                    self.counts.renewed += 1;
                    deadline = sent + ttl;
                    h.acks.push((Instant::now(), port));
                    self.set_open(&h, deadline);
                }
                Some((Ok(Value::Int(0)), _, _)) => {
                    self.counts.renew_zero += 1;
                    return self.finish(h, Instant::now(), deadline, "renew 0");
                }
                Some((other, _, _)) => panic!("LEASE.RENEW answered {other:?}"),
            }
        }
        let args = vec!["LEASE.RELEASE".to_string(), key, owner.to_string()];
        let mut sent = Instant::now();
        let reply = self.call(&args, &mut sent);
        match reply {
            Reply::Value(Value::Int(1), _) => self.counts.released += 1,
            Reply::Value(_, _) => self.counts.release_zero += 1,
            Reply::Failed(_) => self.counts.release_err += 1,
        }
        self.finish(h, sent, deadline, "released");
    }
}

/// `SENTINEL get-master-addr-by-name mymaster` on `c`: the port.
fn master_from(c: &mut redis::Connection) -> Option<u16> {
    let addr: Vec<String> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("mymaster")
        .query(c)
        .ok()?;
    addr.get(1)?.parse().ok()
}

/// Sets the flag on drop: the workers stop however the test ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The holders at work, `WORKERS` threads for the whole run, and what they
/// record, shared with the controller.
pub(super) struct Workload {
    /// Set on drop too: the workers stop however the test ends.
    stop: StopOnDrop,
    holdings: Arc<Mutex<Vec<Holding>>>,
    writes: Arc<Mutex<Vec<Write>>>,
    open: Arc<Mutex<Vec<Option<Holding>>>>,
    workers: Vec<thread::JoinHandle<Counts>>,
}

impl Workload {
    /// Starts the holders; they find the master through the sentinels on
    /// `sentinel_ports`.
    pub(super) fn start(p: Params, sentinel_ports: &[u16]) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let holdings: Arc<Mutex<Vec<Holding>>> = Arc::default();
        let writes: Arc<Mutex<Vec<Write>>> = Arc::default();
        let open: Arc<Mutex<Vec<Option<Holding>>>> = Arc::new(Mutex::new(vec![None; WORKERS]));
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let stop = stop.clone();
                let sentinels = sentinel_ports.to_vec();
                let (holdings, writes, open) = (holdings.clone(), writes.clone(), open.clone());
                thread::spawn(move || {
                    let mut w = Worker {
                        id,
                        sentinel_conns: sentinels.iter().map(|_| None).collect(),
                        sentinels,
                        conns: HashMap::new(),
                        rng: StdRng::seed_from_u64(now_ms() as u64 ^ ((id as u64) << 40)),
                        counts: Counts::default(),
                        holdings,
                        writes,
                        open,
                        ops: 0,
                    };
                    w.run(p, &stop);
                    w.counts
                })
            })
            .collect();
        Workload {
            stop: StopOnDrop(stop),
            holdings,
            writes,
            open,
            workers,
        }
    }

    /// The holdings so far: the ended ones, and those in progress as held
    /// until now (or their deadline, if that came first).
    pub(super) fn so_far(&self) -> Vec<Holding> {
        let now = Instant::now();
        let mut all = self.holdings.lock().unwrap().clone();
        all.extend(self.open.lock().unwrap().iter().flatten().map(|h| {
            let mut h = h.clone();
            h.end = h.end.min(now);
            h
        }));
        all
    }

    /// Stops the holders and waits for them: their counts, summed, the
    /// holdings and the acknowledged fenced writes.
    pub(super) fn stop(self) -> (Counts, Vec<Holding>, Vec<Write>) {
        self.stop.0.store(true, Ordering::Relaxed);
        let mut counts = Counts::default();
        for w in self.workers {
            counts.add(&w.join().expect("a worker panicked"));
        }
        let holdings = std::mem::take(&mut *self.holdings.lock().unwrap());
        let writes = std::mem::take(&mut *self.writes.lock().unwrap());
        (counts, holdings, writes)
    }
}
