//! Rolling upgrades without Sentinel (docs/operations.md, "Upgrades"): a
//! `FAILOVER` from the old master to an upgraded replica, then the old
//! master upgraded and started again, while a writer takes leases on fresh
//! keys from whichever node is the master. Real servers on fixed ports (a
//! node restarted keeps its port, so its replicas and clients find it),
//! AOF with `appendfsync everysec` (a clean `SHUTDOWN` then counts as a
//! start that lost nothing), `min-replicas-*` as in `deploy/sentinel/`.
//!
//! 1. The old master started again with its own command line (no
//!    `replicaof`: `FAILOVER` rewrites no file) comes back as a master on a
//!    replica's data, which lacks what the new master granted while it was
//!    shutting down: it must run a grace period before it grants (issue 30,
//!    point 1).
//! 2. The documented procedure, step by step, with three replicas and
//!    `min-replicas-to-write 2`: the other replicas re-pointed (else the new
//!    master answers `NOREPLICAS` to every write), the old master started as
//!    a replica of the new one; no key is granted twice.
//!
//! Each test prints what it saw (grants, refusals, double grants).
mod common;
use common::grace;
use common::*;

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The longest lease, and the ttl the writer asks: 10 s, so a grace period
/// (`grace-ms -1`, `min-replicas-max-lag 1`) is 10 + 1 + 2 = 13 s.
const TTL: &str = "10000";
const TTL_MS: u64 = 10_000;

/// A node's command line: the grace rule (`grace-ms -1`), AOF with
/// `everysec`, and `min-replicas-to-write <min_replicas>` with a lag of 1 s.
fn node_opts(min_replicas: &str) -> Opts {
    Opts::default()
        .module_args(&["grace-ms", "-1", "max-ttl-ms", TTL])
        .extra(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--min-replicas-to-write",
            min_replicas,
            "--min-replicas-max-lag",
            "1",
        ])
}

/// A node and the command line it was started with.
struct Node {
    server: Option<Server>,
    port: u16,
    opts: Opts,
}

impl Node {
    fn s(&self) -> &Server {
        self.server.as_ref().expect("the node runs")
    }
    fn conn(&self) -> redis::Connection {
        self.s().conn()
    }
    fn replication(&self) -> String {
        ok_text(&mut self.conn(), &["INFO", "replication"])
    }
    /// `SHUTDOWN` (no argument, as an operator types it); waits (up to 15
    /// s: a replica first waits for its own replicas) until the process is
    /// gone, and returns the data directory.
    fn shutdown(&mut self) -> PathBuf {
        let mut s = self.server.take().expect("the node runs");
        let mut c = s.conn();
        let reply = call(&mut c, &[b"SHUTDOWN"]);
        assert!(
            wait_until(Duration::from_secs(15), || !s.is_alive()),
            "SHUTDOWN answered {reply:?} and :{} still runs:\n{}",
            s.port,
            s.log_tail(20)
        );
        let dir = s.dir.clone();
        // The process is gone; skip Drop so the data directory survives.
        std::mem::forget(s);
        dir
    }
    /// Starts the node again on its port and data, with its command line
    /// plus `extra`.
    fn start_again(&mut self, kind: Kind, dir: PathBuf, extra: &[&str]) {
        let opts = self.opts.clone().extra(extra).on_port(self.port);
        self.server = Some(grace::start_in(kind, opts, dir));
    }
}

fn start_node(kind: Kind, opts: Opts, master: Option<u16>) -> Node {
    let mut run = opts.clone();
    if let Some(m) = master {
        run = run.extra(&["--replicaof", "127.0.0.1", &m.to_string()]);
    }
    let server = grace::start(kind, run.clone());
    let port = server.port;
    // Its command line, port included, for the restarts.
    Node {
        server: Some(server),
        port,
        opts: run,
    }
}

/// Waits (up to 20 s) until `node` says `role:<role>` and, for a replica,
/// that its link to `master` is up; panics with its INFO otherwise.
fn wait_role(node: &Node, role: &str, master: Option<u16>, what: &str) {
    let ok = wait_until(Duration::from_secs(20), || {
        let info = try_info(node.port, "replication").unwrap_or_default();
        info.contains(&format!("role:{role}"))
            && master.is_none_or(|m| {
                info.contains(&format!("master_port:{m}\r"))
                    && info.contains("master_link_status:up")
            })
    });
    assert!(
        ok,
        "{what}: :{} is not {role} of {master:?}:\n{}",
        node.port,
        try_info(node.port, "replication").unwrap_or_default()
    );
}

/// Waits (up to 20 s) until `node` has `n` replicas online.
fn wait_replicas(node: &Node, n: usize, what: &str) {
    let ok = wait_until(Duration::from_secs(20), || {
        try_info(node.port, "replication").is_some_and(|i| i.matches("state=online").count() == n)
    });
    assert!(
        ok,
        "{what}: :{} does not have {n} replicas online:\n{}",
        node.port,
        try_info(node.port, "replication").unwrap_or_default()
    );
}

/// Ends a grace period as docs/operations.md says (Switchovers): note the
/// value, set 0, restore it.
fn end_grace_as_documented(node: &Node) {
    let mut c = node.conn();
    let before = match ok(&mut c, &["CONFIG", "GET", "lease.grace-ms"]) {
        Value::Array(kv) => text(&kv[1]),
        other => panic!("CONFIG GET lease.grace-ms: {other:?}"),
    };
    assert_eq!(before, "-1");
    assert_eq!(
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", "0"]),
        Value::Okay
    );
    assert_eq!(
        ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", &before]),
        Value::Okay
    );
    grace::assert_no_grace(&mut c, "after ending the grace");
}

/// What one call of the writer got.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    Granted,
    /// Null: a grace period (every key is fresh, nobody else holds it).
    Refused,
    /// An error reply (its code), or `io` when the node did not answer.
    Error(String),
}

/// One call of the writer, to the node on `port`.
struct Call {
    sent: Instant,
    port: u16,
    key: String,
    got: Got,
}

/// A writer that takes a lease on a fresh key every 10 ms from whichever
/// node is the master: it asks the node that granted last, then the others
/// in turn, until one grants. Bounded: 3000 keys and 90 s.
fn writer(ports: &[u16], stop: &AtomicBool, calls: &Mutex<Vec<Call>>) {
    let began = Instant::now();
    let mut conns: Vec<Option<redis::Connection>> = ports.iter().map(|_| None).collect();
    let mut master = 0;
    for i in 0..3000 {
        if stop.load(Ordering::SeqCst) || began.elapsed() > Duration::from_secs(90) {
            break;
        }
        let key = format!("job:{i}");
        for k in 0..ports.len() {
            let n = (master + k) % ports.len();
            if conns[n].is_none() {
                conns[n] = quick_conn(ports[n]);
            }
            let sent = Instant::now();
            let got = match conns[n].as_mut() {
                None => Got::Error("io".into()),
                Some(c) => match call(
                    c,
                    &[
                        b"LEASE.ACQUIRE",
                        key.as_bytes(),
                        format!("w{i}").as_bytes(),
                        TTL.as_bytes(),
                    ],
                ) {
                    Ok(Value::Int(_)) => Got::Granted,
                    Ok(Value::Nil) => Got::Refused,
                    Ok(v) => Got::Error(format!("{v:?}")),
                    Err(e) if e.is_io_error() || e.is_timeout() => {
                        conns[n] = None;
                        Got::Error("io".into())
                    }
                    Err(e) => {
                        Got::Error(error_text(&e).split(' ').next().unwrap_or("").to_string())
                    }
                },
            };
            let granted = got == Got::Granted;
            calls.lock().unwrap().push(Call {
                sent,
                port: ports[n],
                key: key.clone(),
                got,
            });
            if granted {
                master = n;
                break;
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Asks `node` for every key another node granted whose lease may still be
/// held (sent less than the ttl ago, with 300 ms to spare), with a new
/// owner. Returns (keys asked, keys `node` lacked, keys it granted again).
fn second_grants(node: &Node, calls: &[Call]) -> (usize, usize, Vec<String>) {
    let mut c = node.conn();
    let (mut asked, mut missing, mut twice) = (0, 0, Vec::new());
    for call in calls
        .iter()
        .filter(|c| c.got == Got::Granted && c.port != node.port)
    {
        if call.sent.elapsed() + Duration::from_millis(300) >= Duration::from_millis(TTL_MS) {
            continue;
        }
        asked += 1;
        if !exists(&mut c, &call.key) {
            missing += 1;
        }
        if let Value::Int(_) = ok(&mut c, &["LEASE.ACQUIRE", &call.key, "second", TTL]) {
            twice.push(call.key.clone());
        }
    }
    (asked, missing, twice)
}

/// Grants, refusals and errors per node, for the printout.
fn summary(calls: &[Call], ports: &[(&str, u16)]) -> String {
    ports
        .iter()
        .map(|(name, p)| {
            let of = |f: &dyn Fn(&Got) -> bool| {
                calls.iter().filter(|c| c.port == *p && f(&c.got)).count()
            };
            format!(
                "{name}: {} granted, {} null, {} NOREPLICAS, {} READONLY",
                of(&|g| *g == Got::Granted),
                of(&|g| *g == Got::Refused),
                of(&|g| *g == Got::Error("NOREPLICAS".into())),
                of(&|g| *g == Got::Error("READONLY".into())),
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

// ---------------------------------------------------------------------------
// 1. The old master started again without `replicaof`.

every_server! {
    fn old_master_restarted_as_master_grants_no_lease_the_new_master_granted(kind) {
        let mut a = start_node(kind, node_opts("1"), None);
        let b = start_node(kind, node_opts("1"), Some(a.port));
        let c = start_node(kind, node_opts("1"), Some(a.port));
        wait_replicas(&a, 2, "setup");
        // A's first start (no data) runs a grace period: ended, as a new
        // deployment does.
        end_grace_as_documented(&a);
        let ports = [a.port, b.port, c.port];
        let calls = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        let a_dir = thread::scope(|scope| {
            scope.spawn(|| writer(&ports, &stop, &calls));
            thread::sleep(Duration::from_millis(500));
            // The switchover: B becomes the master, A its replica, C stays A's.
            let reply = ok(
                &mut a.conn(),
                &["FAILOVER", "TO", "127.0.0.1", &b.port.to_string()],
            );
            assert_eq!(reply, Value::Okay);
            wait_role(&b, "master", None, "FAILOVER TO B");
            wait_role(&a, "slave", Some(b.port), "FAILOVER TO B");
            end_grace_as_documented(&b);
            thread::sleep(Duration::from_millis(1000));
            // The old master is shut down to be upgraded, while the writer goes
            // on with B, then B refuses writes (its one replica is gone).
            let dir = a.shutdown();
            thread::sleep(Duration::from_millis(2500));
            stop.store(true, Ordering::SeqCst);
            dir
        });
        let calls = calls.into_inner().unwrap();
        // A started again with its own command line: no replicaof.
        a.start_again(kind, a_dir, &[]);
        let reason = grace::reason(&mut a.conn());
        // Once C follows A again, A can take writes (min-replicas-to-write 1).
        wait_role(&c, "slave", Some(a.port), "C back to the restarted A");
        let mut ac = a.conn();
        let writable = wait_until(Duration::from_secs(5), || {
            call(&mut ac, &[b"SET", b"probe", b"1"]).is_ok()
        });
        assert!(writable, "{kind:?}: the restarted A never took a write");
        let (asked, missing, twice) = second_grants(&a, &calls);
        let names = [("A", a.port), ("B", b.port), ("C", c.port)];
        eprintln!(
            "{kind:?} old master restarted without replicaof: grace reason {reason}; \
             of {asked} leases B granted that may still be held, A lacked {missing} and granted {} again ({:?}); \
             writer: {}",
            twice.len(),
            twice,
            summary(&calls, &names)
        );
        assert!(
            missing > 0,
            "{kind:?}: the scenario did not reproduce: A has every lease B granted ({asked}); writer: {}",
            summary(&calls, &names)
        );
        assert!(
            twice.is_empty(),
            "{kind:?}: A, started again as a master on a replica's data (grace reason {reason}), \
             granted {} of the {missing} live leases B granted that it lacked: {twice:?}",
            twice.len()
        );
        assert_ne!(
            reason, "none",
            "{kind:?}: A started as a master on a replica's data without a grace period"
        );
        drop((b, c));
    }
}

// ---------------------------------------------------------------------------
// 2. The documented procedure.

full_suite! {
    fn documented_upgrade_without_sentinel_keeps_writes_and_grants_no_lease_twice(kind) {
        let mut nodes: Vec<Node> = vec![start_node(kind, node_opts("2"), None)];
        let a_port = nodes[0].port;
        for _ in 0..3 {
            nodes.push(start_node(kind, node_opts("2"), Some(a_port)));
        }
        wait_replicas(&nodes[0], 3, "setup");
        end_grace_as_documented(&nodes[0]);
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        let calls = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        let b_port = ports[1];
        let mut chained_refusal = None;
        let mut steps_done = Instant::now();
        thread::scope(|scope| {
            scope.spawn(|| writer(&ports, &stop, &calls));
            thread::sleep(Duration::from_millis(300));
            // Step 1: the replicas, one at a time, started again on their data
            // with their command lines; each online again before the next.
            for i in 1..4 {
                let dir = nodes[i].shutdown();
                nodes[i].start_again(kind, dir, &[]);
                wait_role(&nodes[i], "slave", Some(a_port), "step 1");
                wait_replicas(&nodes[0], 3, "step 1");
            }
            // Step 2: FAILOVER TO B, on A.
            let reply = ok(
                &mut nodes[0].conn(),
                &["FAILOVER", "TO", "127.0.0.1", &b_port.to_string()],
            );
            assert_eq!(reply, Value::Okay);
            wait_role(&nodes[1], "master", None, "step 2");
            wait_role(&nodes[0], "slave", Some(b_port), "step 2");
            // What FAILOVER leaves: C and D still follow A, B has one replica
            // and, with min-replicas-to-write 2, refuses every write (once its
            // count of good replicas is refreshed: up to 2 s).
            thread::sleep(Duration::from_millis(2500));
            chained_refusal = call(&mut nodes[1].conn(), &[b"SET", b"probe", b"1"])
                .err()
                .map(|e| error_text(&e));
            // Step 3: the other replicas re-pointed to B.
            for node in &nodes[2..] {
                let reply = ok(
                    &mut node.conn(),
                    &["REPLICAOF", "127.0.0.1", &b_port.to_string()],
                );
                assert_eq!(reply, Value::Okay);
            }
            for node in &nodes[2..] {
                wait_role(node, "slave", Some(b_port), "step 3");
            }
            wait_replicas(&nodes[1], 3, "step 3");
            // Step 4: B's grace ended (FAILOVER lost nothing).
            end_grace_as_documented(&nodes[1]);
            let repointed = Instant::now();
            // Step 5: the old master upgraded and started as a replica of B.
            let dir = nodes[0].shutdown();
            nodes[0].start_again(
                kind,
                dir,
                &["--replicaof", "127.0.0.1", &b_port.to_string()],
            );
            wait_role(&nodes[0], "slave", Some(b_port), "step 5");
            wait_replicas(&nodes[1], 3, "step 5");
            steps_done = Instant::now();
            thread::sleep(Duration::from_millis(1000));
            stop.store(true, Ordering::SeqCst);
            // From the re-pointing on, B took every write.
            let after: Vec<String> = calls
                .lock()
                .unwrap()
                .iter()
                .filter(|c| c.port == b_port && c.sent > repointed + Duration::from_millis(100))
                .filter_map(|c| match &c.got {
                    Got::Error(e) => Some(e.clone()),
                    _ => None,
                })
                .collect();
            assert!(
                after.is_empty(),
                "{kind:?}: B refused writes after step 3: {after:?}"
            );
        });
        let calls = calls.into_inner().unwrap();
        let names = [
            ("A", ports[0]),
            ("B", ports[1]),
            ("C", ports[2]),
            ("D", ports[3]),
        ];
        // Without step 3, B refused writes.
        let chained = chained_refusal.unwrap_or_default();
        assert!(
            chained.starts_with("NOREPLICAS"),
            "{kind:?}: B with C and D chained behind A: expected NOREPLICAS, got {chained:?}"
        );
        // B takes writes and grants after the steps.
        let mut bc = nodes[1].conn();
        assert_eq!(
            ok(&mut bc, &["SET", "probe", "2"]),
            Value::Okay,
            "{kind:?}: B after the steps"
        );
        assert!(
            matches!(
                ok(&mut bc, &["LEASE.ACQUIRE", "job:after", "me", TTL]),
                Value::Int(_)
            ),
            "{kind:?}: B grants no new lease after the steps"
        );
        assert!(
            calls
                .iter()
                .any(|c| c.port == b_port && c.sent > steps_done && c.got == Got::Granted),
            "{kind:?}: the writer got no lease from B after the steps: {}",
            summary(&calls, &names)
        );
        // The old master is a replica of B, and refuses writes.
        assert!(nodes[0].replication().contains("role:slave"));
        let e = err(
            &mut nodes[0].conn(),
            &["LEASE.ACQUIRE", "job:0", "second", TTL],
        );
        assert!(e.starts_with("READONLY"), "{kind:?}: the old master: {e}");
        // No lease granted twice: B holds every lease granted before it that
        // may still be held.
        let (asked, missing, twice) = second_grants(&nodes[1], &calls);
        let first_b = calls
            .iter()
            .find(|c| c.port == b_port && c.got == Got::Granted)
            .map(|c| c.sent);
        let last_a = calls
            .iter()
            .rev()
            .find(|c| c.port == a_port && c.got == Got::Granted)
            .map(|c| c.sent);
        eprintln!(
            "{kind:?} documented upgrade: without step 3 B answered {chained:?}; no new lease for {}; \
             B lacked {missing} of {asked} live leases granted before it, granted {} again; writer: {}",
            match (last_a, first_b) {
                (Some(a), Some(b)) if b > a => format!("{:.1} s", (b - a).as_secs_f64()),
                _ => "?".into(),
            },
            twice.len(),
            summary(&calls, &names)
        );
        assert!(
            twice.is_empty(),
            "{kind:?}: B granted again {twice:?} ({missing} of {asked} live leases missing on B)"
        );
        assert_eq!(missing, 0, "{kind:?}: FAILOVER lost leases");
    }
}
