//! Part B of `make bench` (see bench/README.md): how fast a waiting client
//! gets a lock once it is free, with `LEASE.ACQUIRE ... BLOCK` and with the
//! usual client-side recipes, and what 1,000 blocked clients cost the server.
//!
//! Run by bench/run.sh against the server it started:
//!     handoff <port> <server-pid>
//! Prints Markdown to stdout. Never fails on a slow result: it measures,
//! it does not judge.
//!
//! Rounds can be changed with environment variables (defaults in brackets):
//! HANDOFF_ROUNDS [500], HANDOFF_ROUNDS_POLL100 [200], EXPIRY_ROUNDS [100],
//! EXPIRY_TTL_MS [50], HERD [1000], CPU_WINDOW_MS [2000], HERD_SETTLE_MS [6000].

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

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: handoff <port> <server-pid>");
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
    Ok(())
}
