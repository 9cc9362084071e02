//! Part B of `make bench` (see bench/README.md): how fast a waiting client
//! gets a lock once it is free, with `LEASE.ACQUIRE ... BLOCK` and with the
//! usual client-side recipes (B1, B2), what 1,000 blocked clients cost the
//! server (B3), and a mass timeout: up to 10,000 clients blocked with the
//! same `BLOCK` timeout, all timing out together (B4).
//!
//! Run by bench/run.sh against the server it started:
//!     handoff <port> <server-pid>
//! and, for section C (full lock cycles per second from real clients:
//! acquire, one fenced write, release, for the module and the recipes):
//!     handoff cycles <port>
//! with CYCLE_CLIENTS [16], CYCLE_REPS [3], CYCLE_MS [2000] and
//! CYCLE_WARM_MS [300]. With HANDOFF_KV=<file>, both modes also append
//! `name value` lines to that file (B2's p50s, C's rates) for run.sh's
//! summary tables.
//! Prints Markdown to stdout. Never fails on a slow result: it measures,
//! it does not judge. B4 needs a server with `maxclients` above its client
//! count and file descriptors for both processes (run.sh sets both); it
//! uses min(MASS_N, maxclients - 100) clients.
//!
//! Rounds can be changed with environment variables (defaults in brackets):
//! HANDOFF_ROUNDS [500], HANDOFF_ROUNDS_POLL100 [200], EXPIRY_ROUNDS [100],
//! EXPIRY_TTL_MS [50], HERD [1000], CPU_WINDOW_MS [2000], HERD_SETTLE_MS [6000]
//! (also B4's wait for steady-state memory), and for B4: MASS_N [10000]
//! (clients; 0 skips B4), MASS_TIMEOUT_MS [7000] (their common BLOCK
//! timeout; above HERD_SETTLE_MS + 700 so that memory is read at steady
//! state while they wait), MASS_KEYS [100] (the keys of the spread column; 0
//! skips it), MASS_BLPOP [1] (0 skips the BLPOP reference column) and
//! MASS_BATCH [100] (commands sent before waiting for the server to count
//! them blocked). HANDOFF_ONLY=B4 (or any list such as B1,B3) runs only
//! those sections, e.g. to try B4 on its own.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Connection, Value};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Compare-and-delete, the usual unlock script.
const CAD: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                   return redis.call('DEL', KEYS[1]) end return 0";
/// Compare-and-delete, then wake the waiters (Redisson's unlock does the same:
/// delete and PUBLISH in one script).
const CAD_PUBLISH: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                           redis.call('DEL', KEYS[1]) \
                           redis.call('PUBLISH', ARGV[2], ARGV[3]) return 1 end return 0";

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn connect(port: u16) -> Res<Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    Ok(client.get_connection()?)
}

fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The recipe's acquire: `SET key owner NX PX 60000`; true when it took the lock.
fn try_set_nx(c: &mut redis::Connection, key: &str, owner: &str) -> Res<bool> {
    let ok: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(owner)
        .arg("NX")
        .arg("PX")
        .arg(60_000)
        .query(c)?;
    Ok(ok.is_some())
}

/// A small xorshift generator: random phases for the pollers.
struct Rng(u64);
impl Rng {
    fn new() -> Self {
        Rng(wall_us() as u64 | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 { 0 } else { self.0 % n }
    }
    fn dur_below(&mut self, d: Duration) -> Duration {
        Duration::from_micros(self.below(d.as_micros() as u64))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Method {
    /// LEASE.ACQUIRE ... BLOCK 0
    Block,
    /// SET NX PX retried every interval.
    Poll(Duration),
    /// SET NX PX, then wait for a PUBLISH from the releaser (at most the
    /// lock's PTTL), then retry.
    PubSub,
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::Block => "LEASE.ACQUIRE ... BLOCK 0".into(),
            Method::Poll(d) if d >= Duration::from_millis(1) => {
                format!("SET NX PX polled every {} ms", d.as_millis())
            }
            Method::Poll(d) => format!("SET NX PX polled every {} us", d.as_micros()),
            Method::PubSub => "SET NX PX + pub/sub wake-up".into(),
        }
    }
}

struct Job {
    key: String,
    owner: String,
    round: u64,
    /// Sleep before the first attempt (random poll phase).
    start_delay: Duration,
}

enum Event {
    /// The first attempt failed; the waiter now waits.
    Waiting,
    /// The waiter got the lock.
    Got {
        at: Instant,
        wall_us: i64,
    },
    Failed(String),
}

/// The waiting client: one thread with its own connection(s), for one method.
fn waiter(method: Method, port: u16, channel_name: String, jobs: Receiver<Job>, ev: Sender<Event>) {
    let run = || -> Res<()> {
        let mut c = connect(port)?;
        // Pub/sub: a reader thread forwards each message (the round number)
        // to a channel, so the waiter can wait on it with a precise timeout
        // (a socket read timeout is only as fine as the kernel's jiffies).
        let (msg_tx, messages) = channel::<u64>();
        if method == Method::PubSub {
            let (ready_tx, ready) = channel::<Result<(), String>>();
            let mut sub_conn = connect(port)?;
            thread::spawn(move || {
                let mut sub = sub_conn.as_pubsub();
                if let Err(e) = sub.subscribe(&channel_name) {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                while let Ok(msg) = sub.get_message() {
                    if msg_tx.send(msg.get_payload().unwrap_or(0)).is_err() {
                        break;
                    }
                }
            });
            ready.recv()??;
        }
        for job in jobs {
            thread::sleep(job.start_delay);
            match method {
                Method::Block => {
                    let r: Option<i64> = redis::cmd("LEASE.ACQUIRE")
                        .arg(&job.key)
                        .arg(&job.owner)
                        .arg(60_000)
                        .arg("BLOCK")
                        .arg(0)
                        .query(&mut c)?;
                    let (at, w) = (Instant::now(), wall_us());
                    match r {
                        Some(_) => ev.send(Event::Got { at, wall_us: w })?,
                        None => ev.send(Event::Failed("BLOCK 0 returned null".into()))?,
                    }
                }
                Method::Poll(every) => {
                    let mut first = true;
                    loop {
                        if try_set_nx(&mut c, &job.key, &job.owner)? {
                            ev.send(Event::Got {
                                at: Instant::now(),
                                wall_us: wall_us(),
                            })?;
                            break;
                        }
                        if first {
                            ev.send(Event::Waiting)?;
                            first = false;
                        }
                        thread::sleep(every);
                    }
                }
                Method::PubSub => {
                    let mut first = true;
                    loop {
                        if try_set_nx(&mut c, &job.key, &job.owner)? {
                            ev.send(Event::Got {
                                at: Instant::now(),
                                wall_us: wall_us(),
                            })?;
                            break;
                        }
                        if first {
                            ev.send(Event::Waiting)?;
                            first = false;
                        }
                        // Wait for the release message, at most the lock's
                        // remaining time (as Redisson does), then retry.
                        let pttl: i64 = redis::cmd("PTTL").arg(&job.key).query(&mut c)?;
                        if pttl == -2 {
                            continue; // already gone: retry at once
                        }
                        let wait = Duration::from_millis(pttl.clamp(1, 60_000) as u64);
                        let until = Instant::now() + wait;
                        loop {
                            let left = until.saturating_duration_since(Instant::now());
                            match messages.recv_timeout(left) {
                                // this round's release (older rounds' messages are stale)
                                Ok(round) if round >= job.round => break,
                                Ok(_) => continue,
                                Err(_) => break, // timed out: retry
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        let _ = ev.send(Event::Failed(format!("waiter: {e}")));
    }
}

fn load_script(c: &mut Connection, body: &str) -> Res<String> {
    Ok(redis::cmd("SCRIPT").arg("LOAD").arg(body).query(c)?)
}

fn lease_waiters(c: &mut Connection, key: &str) -> Res<i64> {
    let v: Value = redis::cmd("LEASE.INFO").arg(key).query(c)?;
    let items: Vec<Value> = match v {
        Value::Array(a) => a,
        Value::Map(m) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return Ok(0),
    };
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        if let (Value::BulkString(k), Value::Int(n)) = (&k, &v)
            && k.as_slice() == b"waiters"
        {
            return Ok(*n);
        }
        if let (Value::SimpleString(k), Value::Int(n)) = (&k, &v)
            && k == "waiters"
        {
            return Ok(*n);
        }
    }
    Ok(0)
}

/// Percentile of sorted samples (nearest rank).
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct Summary {
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
    mean: f64,
    failures: usize,
}

fn summarize(mut v: Vec<f64>, failures: usize) -> Summary {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    };
    Summary {
        n: v.len(),
        p50: pct(&v, 50.0),
        p99: pct(&v, 99.0),
        max: v.last().copied().unwrap_or(f64::NAN),
        mean,
        failures,
    }
}

/// Formats microseconds as "123 us" or "12.3 ms".
fn fmt_us(us: f64) -> String {
    if us.is_nan() {
        "n/a".into()
    } else if us.abs() >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us.abs() >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.0} us", us)
    }
}

struct Bench {
    port: u16,
    ctl: Connection,
    cad: String,
    cad_pub: String,
    rng: Rng,
}

struct Worker {
    jobs: Sender<Job>,
    events: Receiver<Event>,
    handle: thread::JoinHandle<()>,
}

impl Bench {
    fn spawn(&self, method: Method, channel_name: &str) -> Worker {
        let (jtx, jrx) = channel();
        let (etx, erx) = channel();
        let port = self.port;
        let ch = channel_name.to_string();
        let handle = thread::spawn(move || waiter(method, port, ch, jrx, etx));
        Worker {
            jobs: jtx,
            events: erx,
            handle,
        }
    }

    fn take(&mut self, method: Method, key: &str, owner: &str, ttl_ms: u64) -> Res<()> {
        match method {
            Method::Block => {
                let _: i64 = redis::cmd("LEASE.ACQUIRE")
                    .arg(key)
                    .arg(owner)
                    .arg(ttl_ms)
                    .query(&mut self.ctl)?;
            }
            _ => {
                let _: String = redis::cmd("SET")
                    .arg(key)
                    .arg(owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query(&mut self.ctl)?;
            }
        }
        Ok(())
    }

    /// Frees `key` as its holder `owner` would; returns when the reply is in.
    fn release(&mut self, method: Method, key: &str, owner: &str, ch: &str, round: u64) -> Res<()> {
        let n: i64 = match method {
            Method::Block => redis::cmd("LEASE.RELEASE")
                .arg(key)
                .arg(owner)
                .query(&mut self.ctl)?,
            Method::Poll(_) => redis::cmd("EVALSHA")
                .arg(&self.cad)
                .arg(1)
                .arg(key)
                .arg(owner)
                .query(&mut self.ctl)?,
            Method::PubSub => redis::cmd("EVALSHA")
                .arg(&self.cad_pub)
                .arg(1)
                .arg(key)
                .arg(owner)
                .arg(ch)
                .arg(round)
                .query(&mut self.ctl)?,
        };
        if n != 1 {
            return Err(format!("release of {key} by {owner} returned {n}").into());
        }
        Ok(())
    }

    fn clear(&mut self, key: &str) -> Res<()> {
        let _: i64 = redis::cmd("DEL").arg(key).query(&mut self.ctl)?;
        Ok(())
    }

    /// Release hand-off: the waiter is waiting, the holder releases; time
    /// from the release reply (and from sending it) to the waiter's reply.
    fn release_handoff(&mut self, method: Method, rounds: u64) -> Res<(Summary, Summary)> {
        let ch = "bench:handoff:released";
        let key = "bench:handoff";
        self.clear(key)?;
        let w = self.spawn(method, ch);
        let (mut after_ret, mut after_send, mut failures) = (Vec::new(), Vec::new(), 0);
        for round in 1..=rounds {
            let holder = format!("holder-{round}");
            let owner = format!("waiter-{round}");
            self.take(method, key, &holder, 60_000)?;
            w.jobs.send(Job {
                key: key.into(),
                owner: owner.clone(),
                round,
                start_delay: Duration::ZERO,
            })?;
            // Wait until the waiter really waits.
            match method {
                Method::Block => {
                    let t = Instant::now();
                    while lease_waiters(&mut self.ctl, key)? < 1 {
                        if t.elapsed() > Duration::from_secs(5) {
                            return Err("the waiter never blocked".into());
                        }
                        thread::sleep(Duration::from_micros(50));
                    }
                }
                _ => match w.events.recv()? {
                    Event::Waiting => {}
                    Event::Failed(e) => return Err(e.into()),
                    Event::Got { .. } => return Err("waiter got a held lock".into()),
                },
            }
            // Release at a random point of the poll period (pollers), or
            // after up to 2 ms (the others: the waiter sits in its read).
            let spread = match method {
                Method::Poll(d) => d.max(Duration::from_millis(2)),
                _ => Duration::from_millis(2),
            };
            let d = self.rng.dur_below(spread);
            thread::sleep(d);
            let sent = Instant::now();
            self.release(method, key, &holder, ch, round)?;
            let returned = Instant::now();
            match w.events.recv()? {
                Event::Got { at, .. } => {
                    after_ret.push(signed_us(at, returned));
                    after_send.push(signed_us(at, sent));
                }
                Event::Failed(e) => return Err(e.into()),
                Event::Waiting => failures += 1,
            }
            self.clear(key)?;
        }
        drop(w.jobs);
        let _ = w.handle.join();
        Ok((
            summarize(after_ret, failures),
            summarize(after_send, failures),
        ))
    }

    /// Expiry hand-off: the holder never releases; time from the lock's
    /// deadline (PEXPIRETIME, unix ms) to the waiter's reply.
    fn expiry_handoff(&mut self, method: Method, rounds: u64, ttl_ms: u64) -> Res<Summary> {
        let ch = "bench:expiry:released";
        let key = "bench:expiry";
        self.clear(key)?;
        let w = self.spawn(method, ch);
        let (mut lat, mut failures) = (Vec::new(), 0);
        for round in 1..=rounds {
            let holder = format!("holder-{round}");
            self.take(method, key, &holder, ttl_ms)?;
            let deadline_ms: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut self.ctl)?;
            let start_delay = match method {
                Method::Poll(d) => self.rng.dur_below(d),
                _ => Duration::ZERO,
            };
            w.jobs.send(Job {
                key: key.into(),
                owner: format!("waiter-{round}"),
                round,
                start_delay,
            })?;
            loop {
                match w.events.recv()? {
                    Event::Waiting => continue,
                    Event::Got { wall_us, .. } => {
                        lat.push((wall_us - deadline_ms * 1000) as f64);
                        break;
                    }
                    Event::Failed(e) => {
                        eprintln!("expiry round {round}: {e}");
                        failures += 1;
                        break;
                    }
                }
            }
            self.clear(key)?;
        }
        drop(w.jobs);
        let _ = w.handle.join();
        Ok(summarize(lat, failures))
    }
}

fn signed_us(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1e6
    } else {
        -((b - a).as_secs_f64() * 1e6)
    }
}

fn used_memory(c: &mut Connection) -> Res<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query(c)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no used_memory in INFO".into())
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Res<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the ")" that closes the command name: state is field 3,
    // utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')').ok_or("bad /proc stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// The server's CPU use over `window`, in % of one core.
fn server_cpu(pid: u32, window: Duration) -> Res<f64> {
    // Clock ticks per second (`getconf CLK_TCK`, passed by run.sh; 100 on Linux).
    let hz = env_num("CLK_TCK", 100).max(1) as f64;
    let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
    thread::sleep(window);
    let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
    Ok((c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0)
}

/// A bare RESP connection, for the 1,000 blocked clients (no thread each).
struct Raw {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Raw {
    fn open(port: u16) -> Res<Raw> {
        let w = TcpStream::connect(("127.0.0.1", port))?;
        w.set_nodelay(true)?;
        let r = BufReader::new(w.try_clone()?);
        Ok(Raw { w, r })
    }
    fn send(&mut self, args: &[&str]) -> Res<()> {
        let mut buf = format!("*{}\r\n", args.len());
        for a in args {
            buf.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
        }
        self.w.write_all(buf.as_bytes())?;
        Ok(())
    }
    /// Reads one simple reply line (+, -, :, $-1, _).
    fn line(&mut self) -> Res<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err("connection closed".into());
        }
        Ok(l.trim_end().to_string())
    }
}

struct Herd {
    n: usize,
    mem_connected: f64,
    mem_total: f64,
    cpu_idle: f64,
    cpu_connected: f64,
    cpu_blocked: f64,
    handoff_us: f64,
    served: usize,
    in_order: bool,
    waiters_left: i64,
    blpop_mem: f64,
    blpop_cpu: f64,
}

fn herd(port: u16, pid: u32, n: usize, window: Duration, settle: Duration) -> Res<Herd> {
    let mut ctl = connect(port)?;
    let key = "bench:herd";
    let _: i64 = redis::cmd("DEL").arg(key).query(&mut ctl)?;
    let _: i64 = redis::cmd("LEASE.ACQUIRE")
        .arg(key)
        .arg("holder")
        .arg(600_000)
        .query(&mut ctl)?;
    let cpu_idle = server_cpu(pid, window)?;
    let m0 = used_memory(&mut ctl)?;
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(Raw::open(port)?);
    }
    ping_all(&mut conns)?;
    // Memory is read at steady state: the server shrinks a new client's
    // reply buffer and frees an idle client's query buffer a few seconds
    // later (clientsCron), which would otherwise land inside a difference.
    thread::sleep(settle);
    let cpu_connected = server_cpu(pid, window)?;
    let m1 = used_memory(&mut ctl)?;
    // Block them one by one, so the queue order is known.
    for (i, c) in conns.iter_mut().enumerate() {
        let owner = format!("owner{i}");
        c.send(&["LEASE.ACQUIRE", key, &owner, "1000", "BLOCK", "0"])?;
        let t = Instant::now();
        while lease_waiters(&mut ctl, key)? < (i + 1) as i64 {
            if t.elapsed() > Duration::from_secs(5) {
                return Err(format!("waiter {i} never blocked").into());
            }
        }
    }
    thread::sleep(settle);
    let cpu_blocked = server_cpu(pid, window)?;
    let m2 = used_memory(&mut ctl)?;
    // Release them all: each release hands the lease to the next in line.
    let t = Instant::now();
    let mut prev_owner = "holder".to_string();
    let (mut served, mut in_order, mut last_token) = (0usize, true, 0i64);
    for (i, c) in conns.iter_mut().enumerate() {
        let r: i64 = redis::cmd("LEASE.RELEASE")
            .arg(key)
            .arg(&prev_owner)
            .query(&mut ctl)?;
        if r != 1 {
            in_order = false;
        }
        let l = c.line()?;
        match l.strip_prefix(':').and_then(|t| t.parse::<i64>().ok()) {
            Some(tok) => {
                served += 1;
                if tok <= last_token {
                    in_order = false;
                }
                last_token = tok;
            }
            None => {
                eprintln!("waiter {i} answered {l}");
                in_order = false;
            }
        }
        prev_owner = format!("owner{i}");
    }
    let handoff_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let _: i64 = redis::cmd("LEASE.RELEASE")
        .arg(key)
        .arg(&prev_owner)
        .query(&mut ctl)?;
    drop(conns);
    thread::sleep(Duration::from_millis(100));
    let waiters_left = lease_waiters(&mut ctl, key)?;
    let (blpop_mem, blpop_cpu) = blpop_herd(port, pid, n, window, settle, &mut ctl)?;
    Ok(Herd {
        n,
        mem_connected: (m1 - m0) as f64 / n as f64,
        mem_total: (m2 - m0) as f64 / n as f64,
        cpu_idle,
        cpu_connected,
        cpu_blocked,
        handoff_us,
        served,
        in_order,
        waiters_left,
        blpop_mem,
        blpop_cpu,
    })
}

fn ping_all(conns: &mut [Raw]) -> Res<()> {
    for c in conns.iter_mut() {
        c.send(&["PING"])?;
    }
    for c in conns.iter_mut() {
        let l = c.line()?;
        if l != "+PONG" {
            return Err(format!("PING answered {l}").into());
        }
    }
    Ok(())
}

fn blocked_clients(c: &mut Connection) -> Res<i64> {
    let info: String = redis::cmd("INFO").arg("clients").query(c)?;
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no blocked_clients in INFO".into())
}

/// The same crowd in BLPOP on one list, for reference: memory per blocked
/// client (after connecting -> after blocked) and the server's CPU.
fn blpop_herd(
    port: u16,
    pid: u32,
    n: usize,
    window: Duration,
    settle: Duration,
    ctl: &mut Connection,
) -> Res<(f64, f64)> {
    let key = "bench:herd:list";
    let _: i64 = redis::cmd("DEL").arg(key).query(ctl)?;
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(Raw::open(port)?);
    }
    ping_all(&mut conns)?;
    thread::sleep(settle);
    let base = blocked_clients(ctl)?;
    let m1 = used_memory(ctl)?;
    for c in conns.iter_mut() {
        c.send(&["BLPOP", key, "0"])?;
    }
    let t = Instant::now();
    while blocked_clients(ctl)? < base + n as i64 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("BLPOP clients never all blocked".into());
        }
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(settle);
    let cpu = server_cpu(pid, window)?;
    let m2 = used_memory(ctl)?;
    let mut push = redis::cmd("RPUSH");
    push.arg(key);
    for i in 0..n {
        push.arg(i);
    }
    let _: i64 = push.query(ctl)?;
    for c in conns.iter_mut() {
        // *2, $len, key, $len, value
        for _ in 0..5 {
            c.line()?;
        }
    }
    Ok(((m2 - m1) as f64 / n as f64, cpu))
}

// --- B4. mass timeout -----------------------------------------------------------

/// One RESP command, as bytes.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut buf = format!("*{}\r\n", args.len());
    for a in args {
        buf.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    buf.into_bytes()
}

/// What one socket of the crowd received in an exchange: when its first
/// reply line was complete, and every byte read until then (a lone reply
/// is exactly one line).
struct Got {
    at: Option<Instant>,
    bytes: Vec<u8>,
}

/// Sockets of the crowd per reader thread.
const PER_THREAD: usize = 1000;

/// One reader thread: registers its sockets with a new epoll set, meets the
/// sender at `ready`, then reads until every socket has one complete reply
/// line, or `budget` after `ready`. A socket leaves the set once its line is
/// in, so anything it receives later stays in the socket, for the next
/// exchange to see.
fn read_lines(socks: &[TcpStream], ready: &std::sync::Barrier, budget: Duration) -> Res<Vec<Got>> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut out: Vec<Got> = (0..socks.len())
        .map(|_| Got {
            at: None,
            bytes: Vec::new(),
        })
        .collect();
    // SAFETY: plain epoll calls on fds of sockets this function borrows; the
    // epoll fd is closed before returning.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let registered = (|| -> Res<()> {
        if ep < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        for (i, s) in socks.iter().enumerate() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: ep and the socket's fd are open; ev outlives the call.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) } < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        Ok(())
    })();
    // Always meet the sender, even after a failure, so it never waits forever.
    ready.wait();
    let until = Instant::now() + budget;
    let result = registered.and_then(|()| {
        let mut left = socks.len();
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut buf = [0u8; 512];
        let has_line = |b: &[u8]| b.windows(2).any(|w| w == b"\r\n");
        while left > 0 {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let wait_ms = (until - now).as_millis().clamp(1, 100) as i32;
            // SAFETY: evs has room for evs.len() events.
            let k = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, wait_ms) };
            if k < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            for ev in &evs[..k as usize] {
                let i = ev.u64 as usize;
                let o = &mut out[i];
                while !has_line(&o.bytes) {
                    match (&socks[i]).read(&mut buf) {
                        Ok(0) => return Err(format!("connection {i} closed").into()),
                        Ok(m) => o.bytes.extend_from_slice(&buf[..m]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                if o.at.is_none() && has_line(&o.bytes) {
                    o.at = Some(Instant::now());
                    left -= 1;
                    // SAFETY: as above (a null event is allowed for DEL).
                    unsafe {
                        libc::epoll_ctl(
                            ep,
                            libc::EPOLL_CTL_DEL,
                            socks[i].as_raw_fd(),
                            std::ptr::null_mut(),
                        )
                    };
                }
            }
        }
        Ok(())
    });
    if ep >= 0 {
        // SAFETY: ep is the epoll fd made above.
        unsafe { libc::close(ep) };
    }
    result.map(|()| out)
}

/// Reader threads (one per PER_THREAD sockets) wait for one reply line on
/// every socket, for at most `budget`, while `send` runs on this thread (it
/// writes the commands, and measures meanwhile). Returns what each socket
/// received, in socket order, and what `send` returned.
fn exchange<R>(
    socks: &[TcpStream],
    budget: Duration,
    send: impl FnOnce() -> R,
) -> Res<(Vec<Got>, R)> {
    let groups: Vec<&[TcpStream]> = socks.chunks(PER_THREAD).collect();
    let ready = std::sync::Barrier::new(groups.len() + 1);
    thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|socks| {
                let ready = &ready;
                s.spawn(move || read_lines(socks, ready, budget).map_err(|e| e.to_string()))
            })
            .collect();
        ready.wait();
        let r = send();
        let mut all = Vec::with_capacity(socks.len());
        for h in handles {
            match h.join() {
                Ok(Ok(v)) => all.extend(v),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err("a reader thread panicked".into()),
            }
        }
        Ok((all, r))
    })
}

/// Writes `cmd(i)` to socket `i`, for every socket; returns the send moments.
fn send_all(socks: &[TcpStream], cmd: &dyn Fn(usize) -> Vec<u8>) -> Res<Vec<Instant>> {
    let mut sent = Vec::with_capacity(socks.len());
    for (i, s) in socks.iter().enumerate() {
        let c = cmd(i);
        sent.push(Instant::now());
        (&*s).write_all(&c)?;
    }
    Ok(sent)
}

/// The send moments, and per batch (its end, when it was counted).
type Paced = (Vec<Instant>, Vec<(usize, Instant)>);

/// Writes `cmd(i)` to the sockets in batches of `batch`, and after each
/// batch waits until `count()` (the server's count of blocked clients) has
/// them all, so that no command waits long at the server before it blocks.
/// Returns the send moments and, per batch, (its end, when it was counted).
fn send_paced(
    socks: &[TcpStream],
    cmd: &dyn Fn(usize) -> Vec<u8>,
    batch: usize,
    count: &mut dyn FnMut() -> Res<i64>,
    limit: Instant,
) -> Res<Paced> {
    let mut sent = Vec::with_capacity(socks.len());
    let mut counted = Vec::new();
    let mut start = 0;
    while start < socks.len() {
        let end = (start + batch.max(1)).min(socks.len());
        for (i, s) in socks.iter().enumerate().take(end).skip(start) {
            let c = cmd(i);
            sent.push(Instant::now());
            (&*s).write_all(&c)?;
        }
        loop {
            let c = count()?;
            if c >= end as i64 {
                break;
            }
            if Instant::now() > limit {
                return Err(format!("only {c} of the first {end} clients blocked").into());
            }
            thread::sleep(Duration::from_micros(100));
        }
        counted.push((end, Instant::now()));
        start = end;
    }
    Ok((sent, counted))
}

/// How many outcomes are exactly one of the lines `want`.
fn count_exact(out: &[Got], want: &[&[u8]]) -> usize {
    out.iter()
        .filter(|o| want.contains(&o.bytes.as_slice()))
        .count()
}

/// PING on every socket; how many answered exactly `+PONG` (first reply).
fn ping_crowd(socks: &[TcpStream]) -> Res<usize> {
    let (out, sent) = exchange(socks, Duration::from_secs(10), || {
        send_all(socks, &|_| resp(&["PING"]))
    })?;
    sent?;
    Ok(count_exact(&out, &[b"+PONG\r\n"]))
}

/// The `INFO lease` fields that are integers.
fn info_lease(c: &mut Connection) -> Res<std::collections::HashMap<String, i64>> {
    let info: String = redis::cmd("INFO").arg("lease").query(c)?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect())
}

fn info_field(c: &mut Connection, name: &str) -> Res<i64> {
    info_lease(c)?
        .get(name)
        .copied()
        .ok_or_else(|| format!("no {name} in INFO lease").into())
}

/// used_cpu_sys + used_cpu_user of INFO cpu (getrusage), in ms.
fn info_cpu_ms(c: &mut Connection) -> Res<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(c)?;
    let get = |k: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((get("used_cpu_sys:") + get("used_cpu_user:")) * 1000.0)
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

/// How a crowd waits, in one column of B4.
struct Layout<'a> {
    label: String,
    /// The command of client `i`.
    cmd: Box<dyn Fn(usize) -> Vec<u8> + 'a>,
    /// Its timeout reply (RESP2, or RESP3 just in case).
    nulls: &'static [&'static [u8]],
    /// A module waiter (counted by `lease_waiters`), or BLPOP (counted by
    /// `blocked_clients`).
    lease: bool,
}

/// The mass timeout of one layout.
struct MassRun {
    label: String,
    lease: bool,
    /// From the first send until the server counted every client blocked.
    block_span_us: f64,
    /// The longest a batch took from its first send until it was counted.
    batch_wait_us: f64,
    mem_per_waiter: f64,
    /// When memory was read, after every client was counted.
    mem_after: Duration,
    cpu_blocked: f64,
    cpu_blocked_window: Duration,
    /// Reply minus (own send + timeout), us: an upper bound of the lateness.
    late_send: Summary,
    /// Reply minus (when its batch was counted + timeout): a lower bound.
    late_counted: Summary,
    /// First reply minus first send + timeout, last reply minus (all
    /// counted + timeout), last reply minus first reply.
    first_late_us: f64,
    last_late_us: f64,
    replies_span_us: f64,
    /// Server CPU over the timeout window: /proc ticks (ms), INFO cpu (ms),
    /// and the window (from shortly before the earliest deadline to the last
    /// reply read).
    cpu_window_ticks_ms: f64,
    cpu_window_info_ms: f64,
    window: Duration,
    /// used_memory above the idle baseline once every reply is in.
    mem_after_timeouts: f64,
    nulls: usize,
    early: usize,
    missing: usize,
    pongs: usize,
    timeouts_delta: i64,
    waiters_after: i64,
}

struct Mass {
    /// How long the whole section took.
    took: Duration,
    n: usize,
    maxclients: i64,
    asked: usize,
    timeout_ms: u64,
    batch: usize,
    cpu_idle_conns: f64,
    cpu_idle_window: Duration,
    runs: Vec<MassRun>,
}

/// Raises this process's open-file soft limit towards `want` (up to the
/// hard limit); returns the soft limit.
fn raise_nofile(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < want && r.rlim_max > r.rlim_cur {
            let mut n = r;
            n.rlim_cur = want.min(r.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &n) == 0 {
                return n.rlim_cur;
            }
        }
        r.rlim_cur
    }
}

struct MassOpts {
    asked: usize,
    timeout_ms: u64,
    spread_keys: usize,
    blpop: bool,
    batch: usize,
    window: Duration,
    settle: Duration,
}

/// B4: `asked` clients (at most maxclients - 100), each blocked with the
/// same timeout, all timing out together: for reference in BLPOP on their
/// own empty lists, then in LEASE.ACQUIRE ... BLOCK each on its own held
/// key, then spread over `spread_keys` held keys.
fn mass_timeout(port: u16, pid: u32, o: &MassOpts) -> Res<Mass> {
    let t0 = Instant::now();
    let mut ctl = connect(port)?;
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxclients")
        .query(&mut ctl)?;
    let maxclients: i64 = cfg
        .get(1)
        .and_then(|v| v.parse().ok())
        .ok_or("no maxclients")?;
    let fds = raise_nofile(o.asked as u64 + 1000);
    let n = o
        .asked
        .min((maxclients - 100).max(1) as usize)
        .min((fds as usize).saturating_sub(200).max(1));
    let spread_keys = o.spread_keys.min(n);
    let timeout = Duration::from_millis(o.timeout_ms);
    let t_ms = o.timeout_ms.to_string();
    let t_s = format!("{:.3}", o.timeout_ms as f64 / 1000.0);
    let own_key = |i: usize| format!("bench:mass:own:{i}");
    let spread_key = |i: usize| format!("bench:mass:spread:{}", i % spread_keys.max(1));
    let list_key = |i: usize| format!("bench:mass:list:{i}");

    let mut layouts: Vec<Layout> = Vec::new();
    if o.blpop {
        layouts.push(Layout {
            label: format!("for reference: BLPOP, each on its own empty list ({n} lists)"),
            cmd: Box::new(|i| resp(&["BLPOP", &list_key(i), &t_s])),
            nulls: &[b"*-1\r\n", b"_\r\n"],
            lease: false,
        });
    }
    layouts.push(Layout {
        label: format!("LEASE.ACQUIRE BLOCK, each on its own key ({n} keys)"),
        cmd: Box::new(|i| {
            resp(&[
                "LEASE.ACQUIRE",
                &own_key(i),
                &format!("w{i}"),
                "1000",
                "BLOCK",
                &t_ms,
            ])
        }),
        nulls: &[b"$-1\r\n", b"_\r\n"],
        lease: true,
    });
    if spread_keys > 0 && spread_keys < n {
        layouts.push(Layout {
            label: format!(
                "LEASE.ACQUIRE BLOCK, spread over {spread_keys} keys ({} per key)",
                n.div_ceil(spread_keys)
            ),
            cmd: Box::new(|i| {
                resp(&[
                    "LEASE.ACQUIRE",
                    &spread_key(i),
                    &format!("w{i}"),
                    "1000",
                    "BLOCK",
                    &t_ms,
                ])
            }),
            nulls: &[b"$-1\r\n", b"_\r\n"],
            lease: true,
        });
    }

    // The crowd, and the held keys of every layout, before the baseline.
    let mut socks = Vec::with_capacity(n);
    for i in 0..n {
        let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))
            .map_err(|e| format!("connection {i} of {n}: {e}"))?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        socks.push(s);
    }
    if ping_crowd(&socks)? != n {
        return Err("the crowd's PING failed".into());
    }
    let mut held: Vec<String> = (0..n).map(own_key).collect();
    held.extend((0..spread_keys).map(spread_key));
    for chunk in held.chunks(1000) {
        let mut p = redis::pipe();
        for k in chunk {
            p.cmd("DEL").arg(k).ignore();
            p.cmd("LEASE.ACQUIRE")
                .arg(k)
                .arg("holder")
                .arg(600_000)
                .ignore();
        }
        p.query::<()>(&mut ctl)?;
    }
    let lists: Vec<String> = if o.blpop {
        (0..n).map(list_key).collect()
    } else {
        Vec::new()
    };
    for chunk in lists.chunks(1000) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query(&mut ctl)?;
    }
    let cpu_idle_window = o.window.min(o.settle);
    thread::sleep(o.settle.saturating_sub(cpu_idle_window));
    let cpu_idle_conns = server_cpu(pid, cpu_idle_window)?;
    let m_idle = used_memory(&mut ctl)?;
    let hz = env_num("CLK_TCK", 100).max(1) as f64;

    let mut runs = Vec::new();
    for layout in &layouts {
        let count = |c: &mut Connection| -> Res<i64> {
            if layout.lease {
                info_field(c, "lease_waiters")
            } else {
                blocked_clients(c)
            }
        };
        let base = count(&mut ctl)?;
        let timeouts0 = info_field(&mut ctl, "lease_wait_timeouts")?;
        // On this thread, while the readers wait: send in paced batches,
        // read CPU and memory at steady state (before the timeout), then
        // start the timeout window's CPU reading just before the earliest
        // deadline.
        let send = || -> Res<_> {
            let go = Instant::now();
            let limit = go
                + timeout
                    .saturating_sub(Duration::from_millis(500))
                    .min(Duration::from_secs(10));
            let (sent, counted) = send_paced(
                &socks,
                &*layout.cmd,
                o.batch,
                &mut || Ok(count(&mut ctl)? - base),
                limit,
            )?;
            let blocked = counted.last().map_or(go, |c| c.1);
            let latest_mem = go + timeout.saturating_sub(Duration::from_millis(700));
            let mem_at = (blocked + o.settle).min(latest_mem).max(blocked);
            let cpu_w = o.window.min(mem_at - blocked);
            sleep_until(mem_at - cpu_w);
            let cpu_blocked = if cpu_w >= Duration::from_millis(100) {
                server_cpu(pid, cpu_w)?
            } else {
                f64::NAN
            };
            let m = used_memory(&mut ctl)?;
            let mem_after = Instant::now() - blocked;
            sleep_until(go + timeout.saturating_sub(Duration::from_millis(200)));
            let w0 = (Instant::now(), cpu_ticks(pid)?, info_cpu_ms(&mut ctl)?);
            Ok((sent, counted, m, mem_after, cpu_blocked, cpu_w, w0))
        };
        let (out, r) = exchange(&socks, timeout + Duration::from_secs(10), send)?;
        let (sent, counted, m_blocked, mem_after, cpu_blocked, cpu_blocked_window, w0) = r?;
        let (w0, ticks0, icpu0) = w0;
        let (w1, ticks1, icpu1) = (Instant::now(), cpu_ticks(pid)?, info_cpu_ms(&mut ctl)?);

        let first_sent = sent[0];
        let all_counted = counted.last().ok_or("no batch")?.1;
        // When the batch of client i was counted.
        let mut batch_of = Vec::with_capacity(n);
        let mut batch_wait_us: f64 = 0.0;
        let mut from = 0;
        for &(end, at) in &counted {
            batch_wait_us = batch_wait_us.max(signed_us(at, sent[from]));
            batch_of.extend(std::iter::repeat_n(at, end - from));
            from = end;
        }
        let mut late_send = Vec::with_capacity(n);
        let mut late_counted = Vec::with_capacity(n);
        for (i, g) in out.iter().enumerate() {
            if let Some(at) = g.at {
                late_send.push(signed_us(at, sent[i] + timeout));
                late_counted.push(signed_us(at, batch_of[i] + timeout));
            }
        }
        let got: Vec<Instant> = out.iter().filter_map(|g| g.at).collect();
        let (first_got, last_got) = (got.iter().min().copied(), got.iter().max().copied());
        // A reply well before its timeout would mean the client never blocked.
        let early = late_send.iter().filter(|&&l| l < -5_000.0).count();
        let nulls = count_exact(&out, layout.nulls);
        let missing = out.iter().filter(|g| g.at.is_none()).count();

        let m_after = used_memory(&mut ctl)?;
        thread::sleep(Duration::from_millis(100));
        let after = info_lease(&mut ctl)?;
        // Nothing else arrived on any socket: the next reply of each is PONG.
        let pongs = ping_crowd(&socks)?;
        runs.push(MassRun {
            label: layout.label.clone(),
            lease: layout.lease,
            block_span_us: signed_us(all_counted, first_sent),
            batch_wait_us,
            mem_per_waiter: (m_blocked - m_idle) as f64 / n as f64,
            mem_after,
            cpu_blocked,
            cpu_blocked_window,
            late_send: summarize(late_send, missing),
            late_counted: summarize(late_counted, missing),
            first_late_us: first_got.map_or(f64::NAN, |g| signed_us(g, first_sent + timeout)),
            last_late_us: last_got.map_or(f64::NAN, |g| signed_us(g, all_counted + timeout)),
            replies_span_us: match (first_got, last_got) {
                (Some(a), Some(b)) => signed_us(b, a),
                _ => f64::NAN,
            },
            cpu_window_ticks_ms: (ticks1 - ticks0) as f64 / hz * 1000.0,
            cpu_window_info_ms: icpu1 - icpu0,
            window: w1 - w0,
            mem_after_timeouts: (m_after - m_idle) as f64,
            nulls,
            early,
            missing,
            pongs,
            timeouts_delta: after.get("lease_wait_timeouts").copied().unwrap_or(-1) - timeouts0,
            waiters_after: after.get("lease_waiters").copied().unwrap_or(-1),
        });
    }
    drop(layouts);
    drop(socks);
    for chunk in held.chunks(1000) {
        let _: i64 = redis::cmd("UNLINK").arg(chunk).query(&mut ctl)?;
    }
    Ok(Mass {
        took: t0.elapsed(),
        n,
        maxclients,
        asked: o.asked,
        timeout_ms: o.timeout_ms,
        batch: o.batch,
        cpu_idle_conns,
        cpu_idle_window,
        runs,
    })
}

fn print_mass(m: &Mass, settle: Duration) {
    let n = m.n;
    println!(
        "{n} clients (`MASS_N` {}, at most `CONFIG GET maxclients` {} - 100), each on its own \
         connection, send one blocking command with the same timeout, {} ms. Every lease key is \
         held first (ttl 600 s), so the clients block; the module answers each null when its \
         timeout passes, from one timer at the earliest timeout. The commands go out in batches \
         of {}: the next batch once the server counts the previous one blocked (`lease_waiters`, \
         or `blocked_clients` for BLPOP), so no command waits long at the server before it \
         blocks, and the deadlines follow each other as fast as the server can block clients. \
         {} reader threads each wait on up to {} sockets through epoll.\n",
        m.asked,
        m.maxclients,
        m.timeout_ms,
        m.batch,
        n.div_ceil(PER_THREAD),
        PER_THREAD.min(n)
    );
    println!(
        "A client's deadline is when the server ran its command plus the timeout. Its lateness \
         is bounded above by its reply minus (its send + timeout), and below by its reply minus \
         (the moment its batch was counted + timeout). Server CPU over the timeout window is \
         utime+stime from `/proc/<pid>/stat` (clock ticks of 10 ms) and from `INFO cpu` \
         (getrusage, finer), from 200 ms before the earliest deadline until the last reply was \
         read. Memory per client is used_memory with the {n} clients blocked minus with the \
         same {n} connections idle (and the same held keys), both at steady state ({} ms after \
         connecting or blocking, unless the timeout comes first), divided by {n}.\n",
        settle.as_millis()
    );
    print!("| measure |");
    for r in &m.runs {
        print!(" {} |", r.label);
    }
    println!();
    println!("|---|{}", "---:|".repeat(m.runs.len()));
    let row = |label: &str, f: &dyn Fn(&MassRun) -> String| {
        print!("| {label} |");
        for r in &m.runs {
            print!(" {} |", f(r));
        }
        println!();
    };
    let s3 = |s: &Summary| format!("{} / {} / {}", fmt_us(s.p50), fmt_us(s.p99), fmt_us(s.max));
    row(
        "deadlines spread over (first send -> all counted blocked) / slowest batch to be counted",
        &|r| format!("{} / {}", fmt_us(r.block_span_us), fmt_us(r.batch_wait_us)),
    );
    row(
        "null reply lateness, upper bound (reply - own send - timeout): p50 / p99 / max",
        &|r| s3(&r.late_send),
    );
    row(
        "null reply lateness, lower bound (reply - batch counted - timeout): p50 / p99 / max",
        &|r| s3(&r.late_counted),
    );
    row(
        "first null reply after the earliest deadline / last after the latest / first to last",
        &|r| {
            format!(
                "{} / {} / {}",
                fmt_us(r.first_late_us),
                fmt_us(r.last_late_us),
                fmt_us(r.replies_span_us)
            )
        },
    );
    row(
        "server CPU over the timeout window: /proc ticks / INFO cpu (window)",
        &|r| {
            format!(
                "{:.0} ms / {:.1} ms ({} ms)",
                r.cpu_window_ticks_ms,
                r.cpu_window_info_ms,
                r.window.as_millis()
            )
        },
    );
    row(
        "server CPU per timed-out client (INFO cpu over the window / n)",
        &|r| fmt_us(r.cpu_window_info_ms * 1000.0 / n as f64),
    );
    row(
        &format!(
            "server CPU, {n} idle connections ({} ms window) / {n} blocked, % of one core",
            m.cpu_idle_window.as_millis()
        ),
        &|r| {
            format!(
                "{:.1} % / {:.1} % ({} ms window)",
                m.cpu_idle_conns,
                r.cpu_blocked,
                r.cpu_blocked_window.as_millis()
            )
        },
    );
    row(
        "used_memory per blocked client (steady state, idle connections -> blocked)",
        &|r| {
            format!(
                "{:.0} B (read {:.1} s after all blocked)",
                r.mem_per_waiter,
                r.mem_after.as_secs_f64()
            )
        },
    );
    row(
        "used_memory above the idle baseline right after the last null reply",
        &|r| format!("{:.1} MB", r.mem_after_timeouts / 1e6),
    );
    row(
        &format!(
            "clients with exactly one null reply / early / no reply / whose next reply is PONG (of {n})"
        ),
        &|r| format!("{} / {} / {} / {}", r.nulls, r.early, r.missing, r.pongs),
    );
    row(
        "`lease_wait_timeouts` grew by / `lease_waiters` after",
        &|r| {
            if r.lease {
                format!("{} / {}", r.timeouts_delta, r.waiters_after)
            } else {
                format!("{} / {} (not a lease)", r.timeouts_delta, r.waiters_after)
            }
        },
    );
    println!(
        "\nThis section took {:.1} s: connecting, {:.1} s to the idle baseline, then one timeout \
         per column.",
        m.took.as_secs_f64(),
        settle.as_secs_f64()
    );
}

// --- C. full lock cycles from real clients -----------------------------------

/// Fenced write of the Lua recipe: the lock still has the caller's owner,
/// then the write.
const LUA_FENCED_WRITE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                                return redis.call('SET', KEYS[2], ARGV[2]) end \
                                return redis.error_reply('not the owner')";

/// One kind of lock cycle: acquire, one fenced write, release.
#[derive(Clone, Copy, PartialEq)]
enum Cycle {
    /// LEASE.ACQUIRE, LEASE.FENCE lock token SET data v, LEASE.RELEASE.
    Module,
    /// SET NX PX, Lua (GET lock == owner, then SET data), Lua compare-and-delete.
    Lua,
    /// SET NX PX, a plain SET of the data, DELIFEQ (Valkey 9): no fencing.
    Native,
}

impl Cycle {
    fn name(self) -> &'static str {
        match self {
            Cycle::Module => "module",
            Cycle::Lua => "Lua recipe",
            Cycle::Native => "native recipe (no fencing)",
        }
    }
    fn commands(self) -> &'static str {
        match self {
            Cycle::Module => {
                "`LEASE.ACQUIRE lock owner 30000`, `LEASE.FENCE lock <token> SET data v`, \
                 `LEASE.RELEASE lock owner`"
            }
            Cycle::Lua => {
                "`SET lock owner NX PX 30000`, `EVALSHA` (GET lock == owner, then `SET data v`), \
                 `EVALSHA` compare-and-delete"
            }
            Cycle::Native => "`SET lock owner NX PX 30000`, `SET data v`, `DELIFEQ lock owner`",
        }
    }
}

/// What one client did in one run of cycles.
struct CycleCount {
    /// Cycles completed inside the measured window.
    counted: u64,
    /// Cycles in which a step did not answer as a free lock should.
    failed: u64,
}

/// One client: full cycles on its own lock key (uncontended) from `start`
/// until `end`, one command at a time (not pipelined: each step needs the
/// previous reply). Counts the cycles that complete in [`from`, `end`].
fn cycle_client(
    port: u16,
    kind: Cycle,
    i: usize,
    shas: &(String, String),
    start: &std::sync::Barrier,
    from: Instant,
    end: Instant,
) -> Result<CycleCount, String> {
    let e = |e: redis::RedisError| e.to_string();
    let setup = connect(port).map_err(|e| e.to_string()).and_then(|c| {
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(e)?;
        Ok(c)
    });
    // Every client meets the others at `start`, even one that could not
    // connect (the main thread waits there too).
    start.wait();
    let mut c = setup?;
    let lock = format!("cy:{i}:lock");
    let data = format!("cy:{i}:data");
    let owner = format!("o:{:016x}", 0x5f2a_9c1d_7e3b_4a60u64 ^ i as u64);
    let (fw, cad) = shas;
    let (mut counted, mut failed) = (0, 0);
    // Bounded in time: ends at `end` (every command has a 5 s read timeout).
    while Instant::now() < end {
        let ok = match kind {
            Cycle::Module => {
                let token: Option<i64> = redis::cmd("LEASE.ACQUIRE")
                    .arg(&lock)
                    .arg(&owner)
                    .arg(30_000)
                    .query(&mut c)
                    .map_err(e)?;
                match token {
                    Some(t) => {
                        let w: redis::RedisResult<String> = redis::cmd("LEASE.FENCE")
                            .arg(&lock)
                            .arg(t)
                            .arg("SET")
                            .arg(&data)
                            .arg("v")
                            .query(&mut c);
                        let r: i64 = redis::cmd("LEASE.RELEASE")
                            .arg(&lock)
                            .arg(&owner)
                            .query(&mut c)
                            .map_err(e)?;
                        matches!(w.as_deref(), Ok("OK")) && r == 1
                    }
                    None => false,
                }
            }
            Cycle::Lua | Cycle::Native => {
                let got: Option<String> = redis::cmd("SET")
                    .arg(&lock)
                    .arg(&owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query(&mut c)
                    .map_err(e)?;
                if got.is_none() {
                    false
                } else {
                    let (w, r): (redis::RedisResult<String>, i64) = if kind == Cycle::Lua {
                        let w = redis::cmd("EVALSHA")
                            .arg(fw)
                            .arg(2)
                            .arg(&lock)
                            .arg(&data)
                            .arg(&owner)
                            .arg("v")
                            .query(&mut c);
                        let r = redis::cmd("EVALSHA")
                            .arg(cad)
                            .arg(1)
                            .arg(&lock)
                            .arg(&owner)
                            .query(&mut c)
                            .map_err(e)?;
                        (w, r)
                    } else {
                        let w = redis::cmd("SET").arg(&data).arg("v").query(&mut c);
                        let r = redis::cmd("DELIFEQ")
                            .arg(&lock)
                            .arg(&owner)
                            .query(&mut c)
                            .map_err(e)?;
                        (w, r)
                    };
                    matches!(w.as_deref(), Ok("OK")) && r == 1
                }
            }
        };
        let now = Instant::now();
        if !ok {
            failed += 1;
            // Leave the key free for the next cycle, whatever happened.
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&lock).query(&mut c);
        } else if now >= from && now <= end {
            counted += 1;
        }
    }
    Ok(CycleCount { counted, failed })
}

struct CycleRun {
    per_sec: f64,
    server_cpu_us: f64,
    server_cpu_pct: f64,
    failed: u64,
}

/// `clients` clients doing cycles of `kind` for `warm` + `window`; the rate
/// and the server's CPU (INFO cpu) are taken over `window` only.
fn cycle_run(
    port: u16,
    kind: Cycle,
    clients: usize,
    warm: Duration,
    window: Duration,
    shas: &(String, String),
) -> Res<CycleRun> {
    let mut ctl = connect(port)?;
    let start = std::sync::Barrier::new(clients + 1);
    // Room for connecting: the clock starts once every client is connected.
    let t0 = Instant::now() + Duration::from_millis(200);
    let (from, end) = (t0 + warm, t0 + warm + window);
    let (counts, cpu) = thread::scope(|s| -> Res<(Vec<Result<CycleCount, String>>, f64)> {
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let start = &start;
                s.spawn(move || cycle_client(port, kind, i, shas, start, from, end))
            })
            .collect();
        start.wait();
        sleep_until(from);
        let c0 = info_cpu_ms(&mut ctl)?;
        sleep_until(end);
        let c1 = info_cpu_ms(&mut ctl)?;
        let counts = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("client panicked".into())))
            .collect();
        Ok((counts, c1 - c0))
    })?;
    let (mut counted, mut failed) = (0, 0);
    for c in counts {
        let c = c.map_err(|e| format!("{} cycle client: {e}", kind.name()))?;
        counted += c.counted;
        failed += c.failed;
    }
    let secs = window.as_secs_f64();
    Ok(CycleRun {
        per_sec: counted as f64 / secs,
        server_cpu_us: if counted > 0 {
            cpu * 1000.0 / counted as f64
        } else {
            f64::NAN
        },
        server_cpu_pct: cpu / 1000.0 / secs * 100.0,
        failed,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Appends `name value` to the file named by HANDOFF_KV (run.sh reads it
/// for the summary tables), if set.
fn kv(name: &str, value: impl std::fmt::Display) {
    if let Ok(path) = std::env::var("HANDOFF_KV") {
        let line = format!("{name} {value}\n");
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = r {
            eprintln!("HANDOFF_KV {path}: {e}");
        }
    }
}

/// `handoff cycles <port>`: section C.
fn cycles_main(port: u16) -> Res<()> {
    let clients = env_num("CYCLE_CLIENTS", 16).max(1) as usize;
    let reps = env_num("CYCLE_REPS", 3).max(1);
    let window = Duration::from_millis(env_num("CYCLE_MS", 2000).max(100));
    let warm = Duration::from_millis(env_num("CYCLE_WARM_MS", 300));
    let mut ctl = connect(port)?;
    let shas = (
        load_script(&mut ctl, LUA_FENCED_WRITE)?,
        load_script(&mut ctl, CAD)?,
    );
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .query(&mut ctl)?;
    let has_delifeq = matches!(&info, Value::Array(a) if a.iter().any(|v| *v != Value::Nil));
    let mut kinds = vec![Cycle::Module, Cycle::Lua];
    if has_delifeq {
        kinds.push(Cycle::Native);
    }
    let best = if has_delifeq {
        Cycle::Native
    } else {
        Cycle::Lua
    };
    let mut runs: Vec<Vec<CycleRun>> = kinds.iter().map(|_| Vec::new()).collect();
    for _ in 0..reps {
        for (k, &kind) in kinds.iter().enumerate() {
            runs[k].push(cycle_run(port, kind, clients, warm, window, &shas)?);
        }
    }
    println!(
        "{clients} clients, each a thread with its own connection, each on its own lock key \
         (uncontended); one command at a time, not pipelined (each step waits for the previous \
         reply). Each run: {} ms warm-up, then {} ms counted; {reps} runs of each kind, \
         interleaved. cycles/s is the median run; server CPU (`INFO cpu`, user + sys) over the \
         counted window, per cycle and as % of one core. A cycle fails when a step does not \
         answer as on a free lock (none should).\n",
        warm.as_millis(),
        window.as_millis()
    );
    println!("| cycle | commands | cycles/s | server CPU per cycle | server CPU | failed cycles |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut rate = Vec::new();
    for (k, &kind) in kinds.iter().enumerate() {
        let r = &runs[k];
        let per_sec = median(r.iter().map(|x| x.per_sec).collect());
        let cpu_us = median(r.iter().map(|x| x.server_cpu_us).collect());
        let cpu_pct = median(r.iter().map(|x| x.server_cpu_pct).collect());
        let failed: u64 = r.iter().map(|x| x.failed).sum();
        println!(
            "| {} | {} | {:.0} | {:.1} us | {:.0} % | {} |",
            kind.name(),
            kind.commands(),
            per_sec,
            cpu_us,
            cpu_pct,
            failed
        );
        rate.push(per_sec);
        let key = match kind {
            Cycle::Module => "module",
            Cycle::Lua => "lua",
            Cycle::Native => "native",
        };
        kv(&format!("cycles_{key}"), format!("{per_sec:.0}"));
        kv(&format!("cycles_{key}_failed"), failed);
    }
    let m = rate[0];
    let b = rate[kinds.iter().position(|&k| k == best).unwrap_or(1)];
    println!(
        "\nModule cycles/s / {} cycles/s (the best recipe on this server): **{:.2}** \
         (above 1: the module does more cycles per second).",
        best.name(),
        m / b
    );
    kv(
        "cycles_best",
        if best == Cycle::Native {
            "native"
        } else {
            "lua"
        },
    );
    kv("cycles_ratio", format!("{:.2}", m / b));
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "cycles" {
        return cycles_main(args[2].parse()?);
    }
    if args.len() != 3 {
        eprintln!("usage: handoff <port> <server-pid> | handoff cycles <port>");
        std::process::exit(2);
    }
    let port: u16 = args[1].parse()?;
    let pid: u32 = args[2].parse()?;
    let rounds = env_num("HANDOFF_ROUNDS", 500);
    let rounds_slow = env_num("HANDOFF_ROUNDS_POLL100", 200);
    let expiry_rounds = env_num("EXPIRY_ROUNDS", 100);
    let ttl = env_num("EXPIRY_TTL_MS", 50);
    let herd_n = env_num("HERD", 1000) as usize;
    let window = Duration::from_millis(env_num("CPU_WINDOW_MS", 2000));
    let settle = Duration::from_millis(env_num("HERD_SETTLE_MS", 6000));
    let mass_n = env_num("MASS_N", 10_000) as usize;
    let mass_timeout_ms = env_num("MASS_TIMEOUT_MS", 7000).max(1);
    let mass_keys = env_num("MASS_KEYS", 100) as usize;
    let mass_blpop = env_num("MASS_BLPOP", 1) != 0;
    let mass_batch = env_num("MASS_BATCH", 100).max(1) as usize;
    // HANDOFF_ONLY=B4 (or B1,B3, ...) runs only those sections.
    let only = std::env::var("HANDOFF_ONLY").ok();
    let on = |section: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|x| x.trim().eq_ignore_ascii_case(section)))
    };

    let mut ctl = connect(port)?;
    let cad = load_script(&mut ctl, CAD)?;
    let cad_pub = load_script(&mut ctl, CAD_PUBLISH)?;
    let mut b = Bench {
        port,
        ctl,
        cad,
        cad_pub,
        rng: Rng::new(),
    };
    let methods = [
        Method::Block,
        Method::PubSub,
        Method::Poll(Duration::from_millis(1)),
        Method::Poll(Duration::from_millis(100)),
    ];

    if on("B1") {
        println!("### B1. Release hand-off (waiter already waiting, holder releases)\n");
        println!(
            "Latency = the waiter's reply arriving minus the releaser's release reply arriving \
         (negative: the waiter's reply came first; both leave the server in the same event-loop \
         turn). \"from send\" = minus the moment the release was sent.\n"
        );
        println!("| waiter | rounds | p50 | p99 | max | p50 from send | p99 from send |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for m in methods {
            let r = if m == Method::Poll(Duration::from_millis(100)) {
                rounds_slow
            } else {
                rounds
            };
            let (ret, send) = b.release_handoff(m, r)?;
            println!(
                "| {} | {}{} | {} | {} | {} | {} | {} |",
                m.name(),
                ret.n,
                if ret.failures > 0 {
                    format!(" ({} failed)", ret.failures)
                } else {
                    String::new()
                },
                fmt_us(ret.p50),
                fmt_us(ret.p99),
                fmt_us(ret.max),
                fmt_us(send.p50),
                fmt_us(send.p99)
            );
        }
    }

    if on("B2") {
        println!("\n### B2. Expiry hand-off (holder never releases, ttl {ttl} ms)\n");
        println!(
            "Latency = the waiter's reply (wall clock) minus the lock's deadline \
         (PEXPIRETIME, whole ms). The pub/sub waiter gets no message on expiry: \
         it waits at most the PTTL it read, then retries (as Redisson does).\n"
        );
        println!("| waiter | rounds | p50 | p99 | max | mean |");
        println!("|---|---:|---:|---:|---:|---:|");
        for m in methods {
            let s = b.expiry_handoff(m, expiry_rounds, ttl)?;
            let key = match m {
                Method::Block => "block".to_string(),
                Method::PubSub => "pubsub".to_string(),
                Method::Poll(d) => format!("poll{}ms", d.as_millis()),
            };
            kv(&format!("b2_p50_us_{key}"), format!("{:.0}", s.p50));
            println!(
                "| {} | {}{} | {} | {} | {} | {} |",
                m.name(),
                s.n,
                if s.failures > 0 {
                    format!(" ({} failed)", s.failures)
                } else {
                    String::new()
                },
                fmt_us(s.p50),
                fmt_us(s.p99),
                fmt_us(s.max),
                fmt_us(s.mean)
            );
        }
    }

    if on("B3") {
        println!("\n### B3. {herd_n} clients blocked on one key\n");
        let h = herd(port, pid, herd_n, window, settle)?;
        println!("| measure | value |");
        println!("|---|---:|");
        println!(
            "| used_memory per blocked waiter (steady state, {n} idle connections -> {n} blocked) | {:.0} B |",
            h.mem_total - h.mem_connected,
            n = h.n
        );
        println!(
            "| used_memory per blocked waiter incl. its connection (no connections -> {n} blocked) | {:.0} B |",
            h.mem_total,
            n = h.n
        );
        println!(
            "| server CPU, idle, 1 client ({} ms window) | {:.1} % of one core |",
            window.as_millis(),
            h.cpu_idle
        );
        println!(
            "| server CPU, {} idle connections | {:.1} % of one core |",
            h.n, h.cpu_connected
        );
        println!(
            "| server CPU, {} clients blocked (LEASE.ACQUIRE ... BLOCK 0) | {:.1} % of one core |",
            h.n, h.cpu_blocked
        );
        println!(
            "| for reference, {} clients in BLPOP on one list: used_memory per blocked client / server CPU | {:.0} B / {:.1} % |",
            h.n, h.blpop_mem, h.blpop_cpu
        );
        println!(
            "| release chain: RELEASE + next waiter's reply, per hand-off | {} |",
            fmt_us(h.handoff_us)
        );
        println!(
            "| waiters served / in FIFO order with increasing tokens / left waiting after | {} of {} / {} / {} |",
            h.served,
            h.n,
            if h.in_order { "yes" } else { "NO" },
            h.waiters_left
        );
    }

    if on("B4") && mass_n > 0 {
        println!(
            "\n### B4. Mass timeout: clients blocked with the same BLOCK timeout, all timing out together\n"
        );
        let opts = MassOpts {
            asked: mass_n,
            timeout_ms: mass_timeout_ms,
            spread_keys: mass_keys,
            blpop: mass_blpop,
            batch: mass_batch,
            window,
            settle,
        };
        let m = mass_timeout(port, pid, &opts)?;
        print_mass(&m, settle);
    }
    Ok(())
}
