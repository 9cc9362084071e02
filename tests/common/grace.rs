//! Helpers of the grace-period tests (tests/grace.rs, tests/grace_time.rs):
//! starting and restarting servers on their data, reading the period from
//! `INFO lease`, waiting it out, and the log lines that show it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;

/// The mark a clean shutdown leaves in the server's directory.
pub const CLEAN_MARK: &str = "lease-clean-shutdown.mark";

pub const ENDED: &str = "grace period ended";
pub const NO_GRACE_AOF: &str = "no grace period: the AOF is written with appendfsync always";
pub const NO_GRACE_CLEAN: &str =
    "no grace period: the previous run shut down cleanly and saved its data";

/// Module arguments `grace-ms <ms>`.
pub fn grace(ms: &str) -> Opts {
    Opts::default().module_args(&["grace-ms", ms])
}

/// The log line a period of `ms` ms started for `reason` begins with.
pub fn started_line(reason: &str, ms: i64) -> String {
    format!("grace period started ({reason}): no new lease for {ms} ms")
}

/// `lease_grace_remaining_ms`.
pub fn remaining(c: &mut redis::Connection) -> i64 {
    info_int(c, "lease_grace_remaining_ms")
}

/// `lease_grace_reason`.
pub fn reason(c: &mut redis::Connection) -> String {
    info_field(c, "lease_grace_reason").expect("INFO lease has lease_grace_reason")
}

/// Asserts a grace period for `why` runs, with more than 300 ms left (so
/// that the refusals a test checks next still fall inside it); returns the
/// time it has left.
pub fn assert_grace(c: &mut redis::Connection, why: &str, what: &str) -> i64 {
    let left = remaining(c);
    let r = reason(c);
    assert!(
        left > 0 && r == why,
        "{what}: expected a grace period ({why}), INFO lease shows reason {r:?}, remaining {left} ms"
    );
    assert!(
        left > 300,
        "{what}: only {left} ms of the grace period left (setup too slow?)"
    );
    left
}

/// Asserts no grace period runs.
pub fn assert_no_grace(c: &mut redis::Connection, what: &str) {
    let (left, r) = (remaining(c), reason(c));
    assert!(
        left == 0 && r == "none",
        "{what}: expected no grace period, INFO lease shows reason {r:?}, remaining {left} ms"
    );
}

/// (`lease_grace_refused`, `lease_contended`).
pub fn refusals(c: &mut redis::Connection) -> (i64, i64) {
    (
        info_int(c, "lease_grace_refused"),
        info_int(c, "lease_contended"),
    )
}

/// Asserts the server log has (or gets within 2 s) a line containing
/// `needle`. INFO shows a period over as soon as its time is up; the timer
/// that logs its end may run a few milliseconds later.
pub fn assert_logged(s: &Server, needle: &str) {
    assert!(
        wait_until(Duration::from_secs(2), || s
            .log()
            .lines()
            .any(|l| l.contains(needle))),
        "{:?}: no log line with {needle:?}:\n{}",
        s.kind,
        s.log_tail(30)
    );
}

/// Asserts the server log has no line containing `needle`.
pub fn assert_not_logged(s: &Server, needle: &str) {
    let log = s.log();
    assert!(
        !log.lines().any(|l| l.contains(needle)),
        "{:?}: unexpected log line with {needle:?}:\n{}",
        s.kind,
        s.log_tail(30)
    );
}

/// Is `s` the process this test started? Two tests may pick the same free
/// port: the server that loses the bind exits, but the harness may already
/// have had a PING answered there by the other test's server, and every
/// later connection would reach that one.
pub fn is_own(s: &Server) -> bool {
    let mut c = s.conn();
    info_value(&mut c, "server", "process_id") == Some(s.pid().to_string())
}

/// `Server::start_with`, retried (3 times) when the port went to another
/// test's server.
pub fn start(kind: Kind, opts: Opts) -> Server {
    for _ in 0..3 {
        let s = Server::start_with(kind, opts.clone());
        if is_own(&s) {
            return s;
        }
    }
    panic!("{kind:?}: three starts in a row lost their port to another server");
}

/// Starts a server of `kind` on the data directory `dir`, retried like
/// `start` (a start that lost its port is killed, its directory kept).
pub fn start_in(kind: Kind, opts: Opts, dir: PathBuf) -> Server {
    for _ in 0..3 {
        let mut s = Server::try_start_in(kind, opts.clone(), dir.clone())
            .unwrap_or_else(|e| panic!("{kind:?} server failed to start:\n{}", e.log));
        if is_own(&s) {
            return s;
        }
        s.kill();
        // Skip Drop, which would remove the data directory.
        std::mem::forget(s);
    }
    panic!("{kind:?}: three starts in a row lost their port to another server");
}

/// Kills `s` (SIGKILL: nothing saved on the way out) and starts a new
/// server of the same kind on its data directory with `opts`.
pub fn restart(mut s: Server, opts: Opts) -> Server {
    s.kill();
    let (kind, dir) = (s.kind, s.dir.clone());
    // The process is gone; skip Drop so the data directory survives.
    std::mem::forget(s);
    start_in(kind, opts, dir)
}

/// Starts a replica of `master` with `opts` (module arguments included) and
/// waits (up to 10 s) until its link is up.
pub fn replica_with(kind: Kind, master: &Server, opts: Opts) -> Server {
    let r = start(
        kind,
        opts.extra(&["--replicaof", "127.0.0.1", &master.port.to_string()]),
    );
    let mut c = r.conn();
    assert!(
        wait_until(Duration::from_secs(10), || {
            info_value(&mut c, "replication", "master_link_status").as_deref() == Some("up")
        }),
        "the replica never synced"
    );
    r
}

/// Sends `SHUTDOWN <how>` (SAVE, NOSAVE) and waits (up to 10 s) until the
/// process has exited; returns its data directory, kept for the next start.
pub fn shutdown(mut s: Server, how: &str) -> PathBuf {
    let mut c = s.conn();
    // A server that shuts down closes the connection without a reply.
    let reply = call(&mut c, &[b"SHUTDOWN", how.as_bytes()]);
    assert!(
        wait_until(Duration::from_secs(10), || !s.is_alive()),
        "SHUTDOWN {how} answered {reply:?} and the server is still running:\n{}",
        s.log_tail(20)
    );
    let dir = s.dir.clone();
    // The process is gone; skip Drop so the data directory survives.
    std::mem::forget(s);
    dir
}

/// Joins waiter `h` once it has its answer, waiting at most `within`.
pub fn join_within(h: Answer, within: Duration, who: &str) -> (redis::RedisResult<Value>, Instant) {
    assert!(
        wait_until(within, || h.is_finished()),
        "{who} got no answer within {within:?}"
    );
    h.join().unwrap()
}

/// The token waiter `h` was answered within `within`.
pub fn token_within(h: Answer, within: Duration, who: &str) -> (i64, Instant) {
    let (reply, at) = join_within(h, within, who);
    match reply {
        Ok(Value::Int(t)) => (t, at),
        other => panic!("{who} should get a token, got {other:?}"),
    }
}

/// Polls `INFO lease` every 20 ms until the running grace period is over
/// (at most `within`), checking while more than 200 ms of it remain that
/// none of `pending` has been answered. Returns the earliest and latest
/// instants its end can have been at, from the last reading with time left.
pub fn wait_out_grace(
    c: &mut redis::Connection,
    pending: &[&Answer],
    within: Duration,
) -> (Instant, Instant) {
    let start = Instant::now();
    let mut bounds = None;
    for _ in 0..within.as_millis() / 20 + 1 {
        let before = Instant::now();
        let left = remaining(c);
        let after = Instant::now();
        if left == 0 {
            break;
        }
        let left_d = Duration::from_millis(left as u64);
        bounds = Some((before + left_d, after + left_d));
        if left > 200 {
            for (i, p) in pending.iter().enumerate() {
                assert!(
                    !p.is_finished(),
                    "waiter {} was answered with {left} ms of the grace period left",
                    i + 1
                );
            }
        }
        if start.elapsed() >= within {
            break;
        }
        std::thread::sleep(Duration::from_millis(20.min(left as u64)));
    }
    assert_eq!(
        remaining(c),
        0,
        "the grace period is still running after {within:?}"
    );
    assert_eq!(reason(c), "none", "no reason once the period is over");
    bounds.expect("no grace period was running")
}

/// Asserts a waiter answered at `at` was served after the end of the grace
/// period (`end`: its earliest and latest bounds), and promptly (1 s).
pub fn served_at_the_end(at: Instant, end: (Instant, Instant), who: &str) {
    // 20 ms for the server's millisecond clock against the test's.
    assert!(
        at + Duration::from_millis(20) >= end.0,
        "{who} was served {:?} before the grace period ended",
        end.0 - at
    );
    assert!(
        at.saturating_duration_since(end.1) < Duration::from_secs(1),
        "{who} was served only {:?} after the grace period ended",
        at.saturating_duration_since(end.1)
    );
}
