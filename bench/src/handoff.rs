//! B1 and B2: how fast a waiting client gets a lock once it is free, with
//! `LEASE.ACQUIRE ... BLOCK 0` and with the client-side recipes (pub/sub
//! wake-up, polling every 1 ms and every 100 ms).
//!
//! - B1, release hand-off: the waiter already waits, the holder releases;
//!   the time from the release's reply (and from its send) to the waiter's
//!   successful reply.
//! - B2, expiry hand-off: the holder never releases; the time from the
//!   lock's deadline (PEXPIRETIME) to the waiter's successful reply.
//!
//! Each waiter is a thread with its own connection(s), fed one round at a
//! time ([`Job`]) and answering with [`Event`]s; this thread is the holder.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;
use std::time::{Duration, Instant};

use crate::clock::{us_between, wall_us};
use crate::knobs::Knobs;
use crate::kv::KvFile;
use crate::resp::{Conn, Res};
use crate::scripts::{COMPARE_AND_DELETE, COMPARE_AND_DELETE_PUBLISH};
use crate::server::{lease_waiters, load_script};
use crate::stats::{Summary, fmt_us};

/// How a waiter waits for the lock.
#[derive(Clone, Copy, PartialEq)]
enum Waiter {
    /// LEASE.ACQUIRE ... BLOCK 0; the holder releases with LEASE.RELEASE.
    Block,
    /// SET NX PX, then wait for a PUBLISH from the releaser (at most the
    /// lock's PTTL), then retry; the holder releases with one script that
    /// deletes and publishes.
    PubSub,
    /// SET NX PX retried every interval; the holder releases with
    /// compare-and-delete.
    Poll(Duration),
}

/// The waiters of B1 and B2, in the order of their tables.
const WAITERS: [Waiter; 4] = [
    Waiter::Block,
    Waiter::PubSub,
    Waiter::Poll(Duration::from_millis(1)),
    Waiter::Poll(Duration::from_millis(100)),
];

impl Waiter {
    /// The table's name of the waiter.
    fn label(self) -> String {
        match self {
            Waiter::Block => "LEASE.ACQUIRE ... BLOCK 0".into(),
            Waiter::Poll(d) if d >= Duration::from_millis(1) => {
                format!("SET NX PX polled every {} ms", d.as_millis())
            }
            Waiter::Poll(d) => format!("SET NX PX polled every {} us", d.as_micros()),
            Waiter::PubSub => "SET NX PX + pub/sub wake-up".into(),
        }
    }

    /// Its name in the HANDOFF_KV lines (b2_p50_us_<name>).
    fn kv_name(self) -> String {
        match self {
            Waiter::Block => "block".into(),
            Waiter::PubSub => "pubsub".into(),
            Waiter::Poll(d) => format!("poll{}ms", d.as_millis()),
        }
    }
}

/// One round for a waiter: take `key` as `owner`.
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
    /// The waiter got the lock (monotonic and wall clock).
    Got {
        at: Instant,
        wall_us: i64,
    },
    Failed(String),
}

/// A uniformly random duration in [0, d).
fn random_below(d: Duration) -> Duration {
    match d.as_micros() as u64 {
        0 => Duration::ZERO,
        us => Duration::from_micros(rand::random_range(0..us)),
    }
}

// --- the waiter's side ---------------------------------------------------------

/// A waiter thread, and its two channels.
struct Worker {
    jobs: Sender<Job>,
    events: Receiver<Event>,
    handle: thread::JoinHandle<()>,
}

impl Worker {
    fn spawn(kind: Waiter, port: u16, release_channel: &str) -> Worker {
        let (jobs, job_rx) = channel();
        let (event_tx, events) = channel();
        let release_channel = release_channel.to_string();
        let handle = thread::spawn(move || {
            if let Err(e) = serve_jobs(kind, port, &release_channel, job_rx, &event_tx) {
                let _ = event_tx.send(Event::Failed(format!("waiter: {e}")));
            }
        });
        Worker {
            jobs,
            events,
            handle,
        }
    }

    /// No more rounds: the thread ends.
    fn finish(self) {
        drop(self.jobs);
        let _ = self.handle.join();
    }
}

/// The waiter thread's loop: one acquisition per job, until the jobs end.
fn serve_jobs(
    kind: Waiter,
    port: u16,
    release_channel: &str,
    jobs: Receiver<Job>,
    events: &Sender<Event>,
) -> Res<()> {
    let mut c = Conn::open(port)?;
    let releases = match kind {
        Waiter::PubSub => Some(forward_release_messages(port, release_channel)?),
        _ => None,
    };
    for job in jobs {
        thread::sleep(job.start_delay);
        match kind {
            Waiter::Block => acquire_blocking(&mut c, &job, events)?,
            Waiter::Poll(every) => acquire_polling(&mut c, &job, every, events)?,
            Waiter::PubSub => {
                let releases = releases.as_ref().ok_or("not subscribed")?;
                acquire_on_message(&mut c, &job, releases, events)?
            }
        }
    }
    Ok(())
}

/// Pub/sub: a reader thread on a second, subscribed connection forwards
/// each message (the round number) to a channel, so that the waiter can
/// wait on it with a precise timeout (a socket read timeout is only as fine
/// as the kernel's jiffies).
fn forward_release_messages(port: u16, release_channel: &str) -> Res<Receiver<u64>> {
    let mut sub = Conn::open(port)?;
    sub.subscribe(release_channel)?;
    let (tx, rx) = channel();
    thread::spawn(move || {
        while let Ok(payload) = sub.read_message() {
            let round = String::from_utf8_lossy(&payload).parse().unwrap_or(0);
            if tx.send(round).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// The recipe's acquire: `SET key owner NX PX 60000`; true when it took the lock.
fn try_set_nx(c: &mut Conn, key: &str, owner: &str) -> Res<bool> {
    Ok(!c.call(&["SET", key, owner, "NX", "PX", "60000"])?.is_nil())
}

fn send_got(events: &Sender<Event>) -> Res<()> {
    let (at, wall_us) = (Instant::now(), wall_us());
    Ok(events.send(Event::Got { at, wall_us })?)
}

fn acquire_blocking(c: &mut Conn, job: &Job, events: &Sender<Event>) -> Res<()> {
    let token = c.call(&["LEASE.ACQUIRE", &job.key, &job.owner, "60000", "BLOCK", "0"])?;
    match token.opt_int()? {
        Some(_) => send_got(events),
        None => Ok(events.send(Event::Failed("BLOCK 0 returned null".into()))?),
    }
}

fn acquire_polling(c: &mut Conn, job: &Job, every: Duration, events: &Sender<Event>) -> Res<()> {
    let mut first = true;
    while !try_set_nx(c, &job.key, &job.owner)? {
        if first {
            events.send(Event::Waiting)?;
            first = false;
        }
        thread::sleep(every);
    }
    send_got(events)
}

fn acquire_on_message(
    c: &mut Conn,
    job: &Job,
    releases: &Receiver<u64>,
    events: &Sender<Event>,
) -> Res<()> {
    let mut first = true;
    while !try_set_nx(c, &job.key, &job.owner)? {
        if first {
            events.send(Event::Waiting)?;
            first = false;
        }
        // Wait for the release message, at most the lock's remaining time
        // (as Redisson does), then retry.
        let pttl = c.call(&["PTTL", &job.key])?.int()?;
        if pttl == -2 {
            continue; // already gone: retry at once
        }
        let until = Instant::now() + Duration::from_millis(pttl.clamp(1, 60_000) as u64);
        loop {
            match releases.recv_timeout(until.saturating_duration_since(Instant::now())) {
                // this round's release (older rounds' messages are stale)
                Ok(round) if round >= job.round => break,
                Ok(_) => continue,
                Err(_) => break, // timed out: retry
            }
        }
    }
    send_got(events)
}

// --- the holder's side -----------------------------------------------------------

/// The holder: a control connection, with the recipes' unlock scripts loaded.
struct Holder {
    port: u16,
    ctl: Conn,
    compare_and_delete: String,
    compare_and_delete_publish: String,
}

impl Holder {
    fn open(port: u16) -> Res<Holder> {
        let mut ctl = Conn::open(port)?;
        let compare_and_delete = load_script(&mut ctl, COMPARE_AND_DELETE)?;
        let compare_and_delete_publish = load_script(&mut ctl, COMPARE_AND_DELETE_PUBLISH)?;
        Ok(Holder {
            port,
            ctl,
            compare_and_delete,
            compare_and_delete_publish,
        })
    }

    /// Takes the free `key` as `owner`, the way `kind`'s holder does.
    fn take(&mut self, kind: Waiter, key: &str, owner: &str, ttl_ms: u64) -> Res<()> {
        let ttl = ttl_ms.to_string();
        let reply = match kind {
            Waiter::Block => self.ctl.call(&["LEASE.ACQUIRE", key, owner, &ttl])?,
            _ => self.ctl.call(&["SET", key, owner, "NX", "PX", &ttl])?,
        };
        if reply.is_nil() {
            return Err(format!("{key} was not free for {owner}").into());
        }
        Ok(())
    }

    /// Frees `key` as its holder `owner` would; returns when the reply is in.
    fn release(&mut self, kind: Waiter, key: &str, owner: &str, ch: &str, round: u64) -> Res<()> {
        let reply = match kind {
            Waiter::Block => self.ctl.call(&["LEASE.RELEASE", key, owner])?,
            Waiter::Poll(_) => {
                let sha = &self.compare_and_delete;
                self.ctl.call(&["EVALSHA", sha, "1", key, owner])?
            }
            Waiter::PubSub => {
                let (sha, round) = (&self.compare_and_delete_publish, round.to_string());
                self.ctl
                    .call(&["EVALSHA", sha, "1", key, owner, ch, &round])?
            }
        };
        match reply.int()? {
            1 => Ok(()),
            n => Err(format!("release of {key} by {owner} returned {n}").into()),
        }
    }

    fn clear(&mut self, key: &str) -> Res<()> {
        self.ctl.call(&["DEL", key])?.int()?;
        Ok(())
    }

    /// Returns once the waiter of `worker` really waits for `key`: counted
    /// by LEASE.INFO (module), or its first attempt failed (recipes).
    fn wait_until_waiting(&mut self, kind: Waiter, worker: &Worker, key: &str) -> Res<()> {
        if kind != Waiter::Block {
            return match worker.events.recv()? {
                Event::Waiting => Ok(()),
                Event::Failed(e) => Err(e.into()),
                Event::Got { .. } => Err("waiter got a held lock".into()),
            };
        }
        let t = Instant::now();
        while lease_waiters(&mut self.ctl, key)? < 1 {
            if t.elapsed() > Duration::from_secs(5) {
                return Err("the waiter never blocked".into());
            }
            thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// B1 for one waiter: the latency from the release's reply, and from
    /// its send, to the waiter's reply.
    fn release_handoff(&mut self, kind: Waiter, rounds: u64) -> Res<(Summary, Summary)> {
        let (ch, key) = ("bench:handoff:released", "bench:handoff");
        self.clear(key)?;
        let w = Worker::spawn(kind, self.port, ch);
        let (mut after_reply, mut after_send, mut failures) = (Vec::new(), Vec::new(), 0);
        for round in 1..=rounds {
            let holder = format!("holder-{round}");
            self.take(kind, key, &holder, 60_000)?;
            let owner = format!("waiter-{round}");
            let start_delay = Duration::ZERO;
            w.jobs.send(Job {
                key: key.into(),
                owner,
                round,
                start_delay,
            })?;
            self.wait_until_waiting(kind, &w, key)?;
            // Release at a random point of the poll period (pollers), or
            // after up to 2 ms (the others: the waiter sits in its read).
            let spread = match kind {
                Waiter::Poll(d) => d.max(Duration::from_millis(2)),
                _ => Duration::from_millis(2),
            };
            thread::sleep(random_below(spread));
            let sent = Instant::now();
            self.release(kind, key, &holder, ch, round)?;
            let replied = Instant::now();
            match w.events.recv()? {
                Event::Got { at, .. } => {
                    after_reply.push(us_between(at, replied));
                    after_send.push(us_between(at, sent));
                }
                Event::Failed(e) => return Err(e.into()),
                Event::Waiting => failures += 1,
            }
            self.clear(key)?;
        }
        w.finish();
        Ok((
            Summary::of(after_reply, failures),
            Summary::of(after_send, failures),
        ))
    }

    /// B2 for one waiter: the latency from the lock's deadline (PEXPIRETIME,
    /// unix ms) to the waiter's reply (wall clock).
    fn expiry_handoff(&mut self, kind: Waiter, rounds: u64, ttl_ms: u64) -> Res<Summary> {
        let (ch, key) = ("bench:expiry:released", "bench:expiry");
        self.clear(key)?;
        let w = Worker::spawn(kind, self.port, ch);
        let (mut late, mut failures) = (Vec::new(), 0);
        for round in 1..=rounds {
            self.take(kind, key, &format!("holder-{round}"), ttl_ms)?;
            let deadline_ms = self.ctl.call(&["PEXPIRETIME", key])?.int()?;
            let start_delay = match kind {
                Waiter::Poll(d) => random_below(d),
                _ => Duration::ZERO,
            };
            let owner = format!("waiter-{round}");
            w.jobs.send(Job {
                key: key.into(),
                owner,
                round,
                start_delay,
            })?;
            loop {
                match w.events.recv()? {
                    Event::Waiting => continue,
                    Event::Got { wall_us, .. } => {
                        late.push((wall_us - deadline_ms * 1000) as f64);
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
        w.finish();
        Ok(Summary::of(late, failures))
    }
}

// --- the sections ------------------------------------------------------------------

/// B1: prints the release hand-off table.
pub fn release_handoff_section(port: u16, knobs: &Knobs) -> Res<()> {
    let mut holder = Holder::open(port)?;
    println!("### B1. Release hand-off (waiter already waiting, holder releases)\n");
    println!(
        "Latency = the waiter's reply arriving minus the releaser's release reply arriving \
         (negative: the waiter's reply came first; both leave the server in the same event-loop \
         turn). \"from send\" = minus the moment the release was sent.\n"
    );
    println!("| waiter | rounds | p50 | p99 | max | p50 from send | p99 from send |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for kind in WAITERS {
        let rounds = match kind {
            Waiter::Poll(d) if d == Duration::from_millis(100) => knobs.handoff_rounds_poll100,
            _ => knobs.handoff_rounds,
        };
        let (reply, send) = holder.release_handoff(kind, rounds)?;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            kind.label(),
            reply.rounds(),
            fmt_us(reply.p50),
            fmt_us(reply.p99),
            fmt_us(reply.max),
            fmt_us(send.p50),
            fmt_us(send.p99)
        );
    }
    Ok(())
}

/// B2: prints the expiry hand-off table; each waiter's p50 goes to
/// HANDOFF_KV as b2_p50_us_<waiter>.
pub fn expiry_handoff_section(port: u16, knobs: &Knobs, kv: &KvFile) -> Res<()> {
    let mut holder = Holder::open(port)?;
    let ttl = knobs.expiry_ttl_ms;
    println!("\n### B2. Expiry hand-off (holder never releases, ttl {ttl} ms)\n");
    println!(
        "Latency = the waiter's reply (wall clock) minus the lock's deadline \
         (PEXPIRETIME, whole ms). The pub/sub waiter gets no message on expiry: \
         it waits at most the PTTL it read, then retries (as Redisson does).\n"
    );
    println!("| waiter | rounds | p50 | p99 | max | mean |");
    println!("|---|---:|---:|---:|---:|---:|");
    for kind in WAITERS {
        let s = holder.expiry_handoff(kind, knobs.expiry_rounds, ttl)?;
        kv.put(
            &format!("b2_p50_us_{}", kind.kv_name()),
            format!("{:.0}", s.p50),
        );
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            kind.label(),
            s.rounds(),
            fmt_us(s.p50),
            fmt_us(s.p99),
            fmt_us(s.max),
            fmt_us(s.mean)
        );
    }
    Ok(())
}
