//! Two concurrency tests of counting and shared leases (design.md S8) whose
//! checks use only what the workers themselves recorded:
//!
//! - many workers on a `LIMIT 3` key never see more than 3 holders at once;
//! - readers (`SHARED`) and writers (exclusive) on one key: a writer never
//!   holds at the same time as any reader or other writer.
//!
//! Each worker records its holding interval from the moment the acquire's
//! reply arrived to the moment it sent the release that ended it. That
//! interval lies inside the server's holding (granted before the reply,
//! ended after the release was sent), so the workers' intervals can only
//! overlap less than the server's holdings did: any overlap beyond the
//! rule is a real violation.
//!
//! Both run as they are and through a kill -9 of the server in the middle
//! (`appendonly yes`, `appendfsync always`, restarted on its data): every
//! acknowledged grant and release is on disk, so the rule holds across the
//! restart. Workers reconnect and retry with the same owner: a retried
//! acquire returns the holding the server kept, a retried release frees
//! it. A release retried after the crash that answers 0 was done by the
//! attempt before the crash, so the interval ends at that first attempt.
mod common;
use common::*;

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Bounds of each worker: rounds, and the run's length.
const MAX_ROUNDS: usize = 100_000;
const PHASE: Duration = Duration::from_millis(800);
/// Attempts to reconnect after the server went away, 25 ms apart.
const RECONNECTS: usize = 400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Permit,
    Reader,
    Writer,
}

#[derive(Debug, Clone, Copy)]
struct Interval {
    role: Role,
    start: Instant,
    end: Instant,
}

struct Run {
    port: AtomicU16,
    stop: AtomicBool,
    deadline: Instant,
    intervals: Mutex<Vec<Interval>>,
}

impl Run {
    fn over(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// A small deterministic generator for the workers' pauses.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A connection to the current server, reconnecting (bounded) while it is
/// down; `None` once the run is over or it never came back.
fn connect(run: &Run) -> Option<redis::Connection> {
    for _ in 0..RECONNECTS {
        if run.over() {
            return None;
        }
        let port = run.port.load(Ordering::Relaxed);
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            && let Ok(c) = client.get_connection_with_timeout(Duration::from_millis(500))
        {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            return Some(c);
        }
        thread::sleep(Duration::from_millis(25));
    }
    None
}

/// Sends `args` until a reply comes (reconnecting after a lost server);
/// returns the reply and when the attempt that got it was sent.
fn call_retrying(
    run: &Run,
    c: &mut Option<redis::Connection>,
    args: &[String],
) -> Option<(Value, Instant)> {
    for _ in 0..RECONNECTS {
        if c.is_none() {
            *c = connect(run);
        }
        let con = c.as_mut()?;
        let sent = Instant::now();
        match call_args(con, args) {
            Ok(v) => return Some((v, sent)),
            // A restarted server answers LOADING until its AOF is in.
            Err(e) if e.code() == Some("LOADING") => thread::sleep(Duration::from_millis(20)),
            Err(e) if e.code().is_some() => panic!("{args:?}: {e}"),
            Err(_) => *c = None,
        }
    }
    None
}

fn worker(run: Arc<Run>, id: usize, role: Role) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((id as u64 + 1) * 0x2545_f491));
    let mut c = connect(&run);
    let mode: &[&str] = match role {
        Role::Permit => &["LIMIT", "3"],
        Role::Reader => &["SHARED"],
        Role::Writer => &[],
    };
    let key = if role == Role::Permit { "sem" } else { "rw" };
    for round in 0..MAX_ROUNDS {
        if run.over() {
            return;
        }
        let owner = format!("w{id}-{round}");
        let mut acquire: Vec<String> = ["LEASE.ACQUIRE", key, &owner, "30000"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        acquire.extend(mode.iter().map(|a| a.to_string()));
        acquire.extend(["BLOCK".to_string(), "500".to_string()]);
        // Retried with the same owner until it holds (or the run ends).
        let start = loop {
            match call_retrying(&run, &mut c, &acquire) {
                None => return,
                Some((Value::Int(_), _)) => break Instant::now(),
                Some((Value::Nil, _)) if run.over() => return,
                Some((Value::Nil, _)) => continue,
                Some((other, _)) => panic!("{acquire:?}: {other:?}"),
            }
        };
        thread::sleep(Duration::from_micros(rng.below(1500)));
        let release: Vec<String> = ["LEASE.RELEASE", key, &owner]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let first = Instant::now();
        let end = match call_retrying(&run, &mut c, &release) {
            Some((Value::Int(1), sent)) => sent,
            Some((Value::Int(0), _)) => first,
            Some((other, _)) => panic!("{release:?}: {other:?}"),
            // The run ended while the server was down: the holding may
            // last up to its ttl. Record it open to the end of the run.
            None => run.deadline + Duration::from_secs(60),
        };
        run.intervals
            .lock()
            .unwrap()
            .push(Interval { role, start, end });
    }
}

/// Runs `roles` as workers for two phases; with `crash`, the server is
/// killed (SIGKILL) between them and restarted on its data. Returns every
/// recorded interval.
fn workload(kind: Kind, roles: &[Role], crash: bool) -> Vec<Interval> {
    let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
    let s = Server::start_with(kind, opts.clone());
    let run = Arc::new(Run {
        port: AtomicU16::new(s.port),
        stop: AtomicBool::new(false),
        deadline: Instant::now() + PHASE * 2 + Duration::from_secs(20),
        intervals: Mutex::new(Vec::new()),
    });
    let workers: Vec<_> = roles
        .iter()
        .enumerate()
        .map(|(i, &role)| {
            let run = run.clone();
            thread::spawn(move || worker(run, i, role))
        })
        .collect();
    thread::sleep(PHASE);
    let s = if crash {
        let before = run.intervals.lock().unwrap().len();
        assert!(before > 20, "too little done before the crash: {before}");
        let s = s.restart_with(opts);
        run.port.store(s.port, Ordering::Relaxed);
        s
    } else {
        s
    };
    let resumed = run.intervals.lock().unwrap().len();
    thread::sleep(PHASE);
    run.stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let all = run.intervals.lock().unwrap().clone();
    assert!(
        all.len() > resumed + 20,
        "too little done after the restart: {} then {}",
        resumed,
        all.len()
    );
    let mut c = s.conn();
    assert_eq!(info_int(&mut c, "lease_waiters"), 0);
    all
}

/// The most intervals that overlap at one instant (an end and a start at
/// the same instant do not overlap).
fn most_at_once(intervals: &[&Interval]) -> usize {
    let mut events: Vec<(Instant, i32)> = intervals
        .iter()
        .flat_map(|i| [(i.start, 1), (i.end, -1)])
        .collect();
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    most as usize
}

fn check_limit(intervals: &[Interval]) {
    let all: Vec<&Interval> = intervals.iter().collect();
    let most = most_at_once(&all);
    assert!(most <= 3, "{most} holders of a LIMIT 3 key at once");
    assert_eq!(most, 3, "the load never filled the 3 places");
}

fn check_readers_writers(intervals: &[Interval]) {
    let writers: Vec<&Interval> = intervals
        .iter()
        .filter(|i| i.role == Role::Writer)
        .collect();
    let readers: Vec<&Interval> = intervals
        .iter()
        .filter(|i| i.role == Role::Reader)
        .collect();
    for w in &writers {
        for o in intervals {
            if std::ptr::eq(*w, o) {
                continue;
            }
            assert!(
                !(o.start < w.end && w.start < o.end),
                "a writer held from {:?} to {:?} while a {:?} held from {:?} to {:?}",
                w.start,
                w.end,
                o.role,
                o.start,
                o.end
            );
        }
    }
    assert!(
        writers.len() >= 10,
        "writers got in {} times: starved",
        writers.len()
    );
    assert!(most_at_once(&readers) >= 2, "readers never shared the key");
}

const PERMITS: [Role; 8] = [Role::Permit; 8];
const READERS_WRITERS: [Role; 8] = [
    Role::Reader,
    Role::Reader,
    Role::Writer,
    Role::Reader,
    Role::Reader,
    Role::Writer,
    Role::Reader,
    Role::Reader,
];

full_suite! {
    fn limit_3_never_has_more_than_3_holders(kind) {
        check_limit(&workload(kind, &PERMITS, false));
    }

    fn limit_3_never_has_more_than_3_holders_across_a_kill_9(kind) {
        check_limit(&workload(kind, &PERMITS, true));
    }

    fn a_writer_never_holds_with_a_reader(kind) {
        check_readers_writers(&workload(kind, &READERS_WRITERS, false));
    }

    fn a_writer_never_holds_with_a_reader_across_a_kill_9(kind) {
        check_readers_writers(&workload(kind, &READERS_WRITERS, true));
    }
}
