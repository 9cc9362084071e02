//! The production setups of `deploy/` (docs/operations.md), started from
//! those very files, each through the event it is built for:
//!
//! 1. `deploy/standalone.conf`: a start with no data and a kill -9 need no
//!    grace period (AOF with `appendfsync always`); the lease and its token
//!    survive the crash.
//! 2. `deploy/sentinel/`: a master and two replicas from `node.conf`, three
//!    Sentinels from `sentinel.conf`, and a `SENTINEL FAILOVER` while a
//!    holder renews its lease through Sentinel, to the replica given the
//!    lowest `replica-priority` (docs/operations.md, "With Sentinel"). The
//!    new master runs a grace period (reason `promoted`), the holder gets a
//!    larger token after it, a newcomer gets new leases again,
//!    and Sentinel's `CONFIG REWRITE` writes the nodes' lease settings into
//!    their files. The test prints what the failover cost the holder and
//!    the newcomer (docs/operations.md, "What a failover costs").
//! 3. `deploy/cluster/node.conf`: three masters and three replicas, and a
//!    `CLUSTER FAILOVER` (no FORCE) under a holder: the holder never loses
//!    its lease, the new master runs a grace period for new leases.
//!
//! The tests change only what a test must: the module path on the
//! `loadmodule` line, `dir`, the ports and log files, and a short
//! `lease.max-ttl-ms` (3 s) so that the grace periods are short. Every node
//! loads the module; the Sentinels do not.
mod common;
use common::grace;
use common::*;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The setting the Sentinel test adds to every node: leases of at most 3 s,
/// so the grace period (`lease.grace-ms -1`) is 3 + 1 + 2 = 6 s (with
/// `min-replicas-max-lag 1`).
const SHORT: [&str; 2] = ["--lease.max-ttl-ms", "3000"];

/// The Cluster test's: leases of at most 3 s (so a 3 s grace), renewed
/// every 100 ms: a `CLUSTER FAILOVER` pauses writes on the old master for
/// well under a second once the replica is in sync.
const CLUSTER_TTL: &str = "3000";

fn deploy_file(rel: &str) -> PathBuf {
    repo_file(&format!("deploy/{rel}"))
}

/// `deploy/<rel>` copied to `to`, with the module path of this build on its
/// `loadmodule` line and `dir .` (the harness starts each server in its own
/// data directory); every other line as it is. Panics when the file has no
/// such lines, so a file that loses them fails here.
fn node_conf(rel: &str, to: &Path) -> PathBuf {
    let text = std::fs::read_to_string(deploy_file(rel)).expect("deploy file");
    let (mut module, mut dir) = (false, false);
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("loadmodule ") {
                module = true;
                format!("loadmodule {}", module_path().display())
            } else if l.starts_with("dir ") {
                dir = true;
                "dir .".to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(module && dir, "{rel} has no loadmodule or dir line");
    std::fs::write(to, lines.join("\n") + "\n").expect("write conf");
    to.to_path_buf()
}

/// The options of a node started from `conf`, with leases of at most
/// `max_ttl` ms.
fn from_file(conf: &Path, max_ttl: &str) -> Opts {
    Opts::default()
        .config_file(conf)
        .extra(&["--lease.max-ttl-ms", max_ttl])
}

fn assert_module_loaded(s: &Server) {
    let mut c = s.conn();
    let modules = ok_text(&mut c, &["INFO", "modules"]);
    assert!(
        modules.contains("name=lease"),
        ":{} has no lease module: {modules}",
        s.port
    );
}

// ---------------------------------------------------------------------------
// 1. Standalone.

every_server! {
    fn standalone_setup_survives_a_crash_without_a_grace(kind) {
        let files = fresh_dir();
        let conf = node_conf("standalone.conf", &files.join("redis.conf"));
        let s = Server::start_with(kind, Opts::default().config_file(&conf));
        let mut c = s.conn();
        assert_eq!(grace::reason(&mut c), "none", "a first start with appendfsync always");
        assert!(s.log().contains("no grace period: the AOF is written with appendfsync always"));
        assert_eq!(info_field(&mut c, "lease_eviction_may_lose_leases").as_deref(), Some("0"));
        assert_eq!(info_field(&mut c, "lease_max_ttl_ms").as_deref(), Some("60000"));
        let t = acquire(&mut c, "job:1", "worker-a", "30000");
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "job:1", &t.to_string(), "SET", "out", "1"]), Value::Okay);

        // kill -9, and a start from the same file on the same data.
        let s = s.restart_with(Opts::default().config_file(&conf));
        let mut c = s.conn();
        assert_eq!(grace::reason(&mut c), "none", "a start after a crash with appendfsync always");
        assert_eq!(token_of(&mut c, "job:1"), Some(t), "the lease survived the crash");
        assert_eq!(ok(&mut c, &["LEASE.RENEW", "job:1", "worker-a", "30000"]), Value::Int(1));
        let t2 = acquire(&mut c, "job:2", "worker-b", "30000");
        assert!(t2 > t, "a token after the crash ({t2}) is larger than one before ({t})");
        let _ = std::fs::remove_dir_all(&files);
    }
}

// ---------------------------------------------------------------------------
// 2. Sentinel.

/// `deploy/sentinel/sentinel.conf` for sentinel `index`: its port, `dir`,
/// the master's port on the `sentinel monitor` line, and a bind address
/// and log file for the test.
fn sentinel_conf(dir: &Path, master_port: u16) -> impl Fn(u16, &Path) -> String + '_ {
    let text =
        std::fs::read_to_string(deploy_file("sentinel/sentinel.conf")).expect("sentinel.conf");
    move |port, log| {
        let mut monitor = false;
        let mut out: Vec<String> = text
            .lines()
            .map(|l| {
                if l.starts_with("port ") {
                    format!("port {port}")
                } else if l.starts_with("dir ") {
                    format!("dir {}", dir.display())
                } else if let Some(rest) = l.strip_prefix("sentinel monitor leases ") {
                    monitor = true;
                    let quorum = rest.split_whitespace().last().unwrap();
                    format!("sentinel monitor leases 127.0.0.1 {master_port} {quorum}")
                } else {
                    l.to_string()
                }
            })
            .collect();
        assert!(monitor, "sentinel.conf monitors no master named leases");
        out.push("bind 127.0.0.1".into());
        out.push(format!("logfile {}", log.display()));
        out.join("\n") + "\n"
    }
}

/// What one call of the holder got.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    /// RENEW answered 1.
    Renewed,
    /// RENEW answered 0: the lease ended.
    Lost,
    /// ACQUIRE answered null (the grace period, or another holder).
    Refused,
    /// ACQUIRE answered a token.
    Token(i64),
    /// An error reply (its code).
    Error(String),
    /// No master to ask, or no answer.
    Unreachable,
}

/// One call: RENEW while the holder thinks it holds the lease, ACQUIRE
/// otherwise.
fn holder_call(c: &mut redis::Connection, key: &str, holding: bool) -> Got {
    let cmd = if holding {
        "LEASE.RENEW"
    } else {
        "LEASE.ACQUIRE"
    };
    match call(c, &[cmd.as_bytes(), key.as_bytes(), b"holder", b"3000"]) {
        Ok(Value::Int(1)) if holding => Got::Renewed,
        Ok(Value::Int(0)) if holding => Got::Lost,
        Ok(Value::Int(t)) => Got::Token(t),
        Ok(Value::Nil) => Got::Refused,
        Ok(v) => Got::Error(format!("{v:?}")),
        Err(e) if e.is_io_error() || e.is_timeout() => Got::Unreachable,
        Err(e) => Got::Error(error_text(&e).split(' ').next().unwrap_or("").to_string()),
    }
}

/// Calls of a holder, with the moment each was sent.
type Record = Mutex<Vec<(Instant, Got)>>;

/// The longest stretch between two calls that got `good`, and the first
/// and last call that got `bad` (when any did).
fn windows(
    calls: &[(Instant, Got)],
    good: impl Fn(&Got) -> bool,
    bad: impl Fn(&Got) -> bool,
) -> (Duration, Option<(Instant, Instant)>) {
    let mut longest = Duration::ZERO;
    let mut last_good: Option<Instant> = None;
    for (at, g) in calls {
        if good(g) {
            if let Some(prev) = last_good {
                longest = longest.max(*at - prev);
            }
            last_good = Some(*at);
        }
    }
    let bads: Vec<Instant> = calls
        .iter()
        .filter(|(_, g)| bad(g))
        .map(|(at, _)| *at)
        .collect();
    (longest, bads.first().map(|f| (*f, *bads.last().unwrap())))
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn sentinel_failover(kind: Kind) {
    let files = fresh_dir();
    // Sentinel rewrites each node's file (CONFIG REWRITE): one copy each.
    let confs: Vec<PathBuf> = (0..3)
        .map(|i| node_conf("sentinel/node.conf", &files.join(format!("node-{i}.conf"))))
        .collect();
    let master = Server::start_with(kind, from_file(&confs[0], SHORT[1]));
    let mp = master.port.to_string();
    let replicas: Vec<Server> = confs[1..]
        .iter()
        .map(|conf| {
            Server::start_with(
                kind,
                from_file(conf, SHORT[1]).extra(&["--replicaof", "127.0.0.1", &mp]),
            )
        })
        .collect();
    let mut nodes = vec![master];
    nodes.extend(replicas);
    let mut mc = nodes[0].conn();
    assert!(
        wait_until(Duration::from_secs(20), || {
            let info = ok_text(&mut mc, &["INFO", "replication"]);
            info.matches("state=online").count() == 2
        }),
        "the replicas never came online"
    );
    for n in &nodes {
        assert_module_loaded(n);
        assert_eq!(
            grace::reason(&mut n.conn()),
            "none",
            "{kind:?} :{} at its first start",
            n.port
        );
    }
    assert_eq!(
        info_field(&mut mc, "lease_grace_length_ms").as_deref(),
        Some("6000"),
        "the grace rule: max-ttl-ms + min-replicas-max-lag + 2 s"
    );
    assert_eq!(
        info_field(&mut mc, "lease_max_ttl_ms").as_deref(),
        Some("3000")
    );

    let sentinels: Vec<Sentinel> = (0..3)
        .map(|i| {
            Sentinel::start(
                kind,
                &files,
                i,
                "leases",
                sentinel_conf(&files, nodes[0].port),
            )
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(40), || sentinels.iter().all(|s| {
            s.other_sentinels() == 2
                && s.replicas()
                    .values()
                    .filter(|(flags, _)| flags == "slave")
                    .count()
                    == 2
        })),
        "the sentinels never knew each other and both replicas: {:?}\n{}",
        sentinels
            .iter()
            .map(|s| (s.other_sentinels(), s.replicas()))
            .collect::<Vec<_>>(),
        sentinels[0].log_tail(20)
    );

    // The switchover's target, chosen as docs/operations.md says: the
    // lowest `replica-priority` (the default is 100), seen by every
    // Sentinel (they read it from the replica's INFO, every 10 s).
    let target = nodes[2].port;
    assert_eq!(
        ok(
            &mut nodes[2].conn(),
            &["CONFIG", "SET", "replica-priority", "10"]
        ),
        Value::Okay
    );
    assert!(
        wait_until(Duration::from_secs(25), || sentinels
            .iter()
            .all(|s| s.replicas().get(&target).is_some_and(|(_, p)| p == "10"))),
        "the sentinels never saw the target's replica-priority: {:?}",
        sentinels.iter().map(|s| s.replicas()).collect::<Vec<_>>()
    );

    // What CONFIG REWRITE does to a temporary setting: the old master is
    // given `lease.grace-ms 0`, and Sentinel's rewrite puts it in its file.
    assert_eq!(
        ok(&mut mc, &["CONFIG", "SET", "lease.grace-ms", "0"]),
        Value::Okay
    );

    // A holder that finds the master through Sentinel for every call.
    let key = "job:nightly";
    let t0 = acquire(&mut mc, key, "holder", "3000");
    let record: Record = Mutex::new(Vec::new());
    // A newcomer that asks for a lease on a fresh key every 200 ms, through
    // Sentinel: how long no new lease is granted.
    let newcomer: Record = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    let (promoted_at, failover_done_at) = thread::scope(|scope| {
        scope.spawn(|| {
            for i in 0..400 {
                if stop.load(Ordering::SeqCst) || began.elapsed() > Duration::from_secs(60) {
                    break;
                }
                let sent = Instant::now();
                let got = match sentinels[i % 3].master_port().and_then(quick_conn) {
                    Some(mut c) => holder_call(&mut c, &format!("new:{i}"), false),
                    None => Got::Unreachable,
                };
                newcomer.lock().unwrap().push((sent, got));
                thread::sleep(Duration::from_millis(200));
            }
        });
        scope.spawn(|| {
            let mut holding = true;
            let mut sentinel = 0;
            for _ in 0..400 {
                if stop.load(Ordering::SeqCst) || began.elapsed() > Duration::from_secs(60) {
                    break;
                }
                let sent = Instant::now();
                let got = match sentinels[sentinel].master_port().and_then(quick_conn) {
                    Some(mut c) => holder_call(&mut c, key, holding),
                    None => {
                        sentinel = (sentinel + 1) % sentinels.len();
                        Got::Unreachable
                    }
                };
                match got {
                    Got::Lost => holding = false,
                    Got::Token(_) => holding = true,
                    _ => {}
                }
                record.lock().unwrap().push((sent, got));
                thread::sleep(Duration::from_millis(200));
            }
        });
        thread::sleep(Duration::from_millis(1000));
        let s0 = sentinels[0].conn().expect("sentinel 0");
        let mut s0 = s0;
        assert_eq!(
            ok(&mut s0, &["SENTINEL", "FAILOVER", "leases"]),
            Value::Okay
        );
        let at = Instant::now();
        // Done: the sentinels agree on a new master, which says it is one,
        // with both other nodes online as its replicas.
        let mut new_master = None;
        let done = wait_until(Duration::from_secs(60), || {
            let ports: Vec<Option<u16>> = sentinels.iter().map(|s| s.master_port()).collect();
            let Some(m) =
                ports[0].filter(|m| *m != nodes[0].port && ports.iter().all(|p| *p == Some(*m)))
            else {
                return false;
            };
            new_master = Some(m);
            try_info(m, "replication").is_some_and(|i| {
                i.contains("role:master") && i.matches("state=online").count() == 2
            })
        });
        assert!(
            done,
            "{kind:?}: the failover did not finish within 60 s\n{}",
            sentinels[0].log_tail(30)
        );
        let done_at = Instant::now();
        // Then the holder's lease: wait for its next token (after the
        // grace), up to 30 s, and the newcomer's.
        wait_until(Duration::from_secs(30), || {
            [&record, &newcomer].iter().all(|r| {
                r.lock()
                    .unwrap()
                    .iter()
                    .any(|(t, g)| *t > done_at && matches!(g, Got::Token(_)))
            })
        });
        stop.store(true, Ordering::SeqCst);
        ((at, new_master.unwrap()), done_at)
    });
    let (failover_at, new_port) = promoted_at;
    let calls = record.into_inner().unwrap();
    let new_calls = newcomer.into_inner().unwrap();
    assert_eq!(
        new_port, target,
        "{kind:?}: Sentinel promoted another replica than the one with the lowest replica-priority"
    );
    let new_i = nodes
        .iter()
        .position(|n| n.port == new_port)
        .expect("the new master is one of the nodes");
    let mut nc = nodes[new_i].conn();

    // The new master ran a grace period for what the old one may have
    // granted, and the holder got a larger token after it.
    assert!(
        nodes[new_i]
            .log()
            .contains("grace period started (promoted)"),
        "{kind:?}: the new master logged no grace period:\n{}",
        nodes[new_i].log()
    );
    let t1 = calls.iter().rev().find_map(|(at, g)| match g {
        Got::Token(t) if *at > failover_at => Some(*t),
        _ => None,
    });
    let t1 = t1.unwrap_or_else(|| {
        panic!("{kind:?}: the holder got no token after the failover: {calls:?}")
    });
    assert!(
        t1 > t0,
        "{kind:?}: the token after the failover ({t1}) is not above the one before ({t0})"
    );
    // Every error the holder met is one the docs list for a failover.
    for (_, g) in &calls {
        if let Got::Error(code) = g {
            assert!(
                ["NOREPLICAS", "READONLY"].contains(&code.as_str()),
                "{kind:?}: the holder got {code} during the failover: {calls:?}"
            );
        }
    }
    // Sentinel's CONFIG REWRITE: the old master's file now says whom it
    // replicates, and keeps the module's settings, the temporary
    // `lease.grace-ms 0` included.
    let old_file = std::fs::read_to_string(&confs[0]).unwrap();
    assert!(
        old_file.contains("replicaof 127.0.0.1"),
        "no replicaof in the old master's file:\n{old_file}"
    );
    assert!(
        old_file.contains("lease.grace-ms 0"),
        "CONFIG REWRITE did not write lease.grace-ms:\n{old_file}"
    );
    assert!(old_file.contains("lease.max-ttl-ms 3000"), "{old_file}");

    // What it cost, for docs/operations.md.
    let (renew_gap, noreplicas) = windows(
        &calls,
        |g| matches!(g, Got::Renewed | Got::Token(_)),
        |g| *g == Got::Error("NOREPLICAS".into()),
    );
    let (_, refused) = windows(&calls, |_| false, |g| *g == Got::Refused);
    let lost_at = calls.iter().find(|(_, g)| *g == Got::Lost).map(|(t, _)| *t);
    let (no_new_lease, _) = windows(&new_calls, |g| matches!(g, Got::Token(_)), |_| false);
    assert!(
        new_calls
            .iter()
            .any(|(t, g)| *t > failover_done_at && matches!(g, Got::Token(_))),
        "{kind:?}: no new lease after the failover: {new_calls:?}"
    );
    eprintln!(
        "{kind:?} SENTINEL FAILOVER: done after {}; NOREPLICAS for {} ({} calls); lease lost: {}; refused (grace) for {}; \
         longest stretch without a lease answer: {}; new master's grace refusals: {}; \
         no new lease (fresh keys) for {}; the held lease survived: {}",
        secs(failover_done_at - failover_at),
        noreplicas.map_or("0 s".into(), |(a, b)| secs(b - a)),
        calls
            .iter()
            .filter(|(_, g)| *g == Got::Error("NOREPLICAS".into()))
            .count(),
        lost_at.map_or("no".into(), |t| format!(
            "{} after the failover began",
            secs(t - failover_at)
        )),
        refused.map_or("0 s".into(), |(a, b)| secs(b - a)),
        secs(renew_gap),
        info_int(&mut nc, "lease_grace_refused"),
        secs(no_new_lease),
        if lost_at.is_none() { "yes" } else { "no" },
    );
    drop(sentinels);
    drop(nodes);
    let _ = std::fs::remove_dir_all(&files);
}

mod sentinel_setup_fails_over_to_a_replica {
    use super::*;
    #[test]
    fn redis() {
        sentinel_failover(Kind::Redis)
    }
    #[test]
    fn valkey9() {
        sentinel_failover(Kind::Valkey9)
    }
}

// ---------------------------------------------------------------------------
// 3. Cluster.

fn cluster_failover(kind: Kind) {
    let files = fresh_dir();
    let conf = node_conf("cluster/node.conf", &files.join("node.conf"));
    let cluster = Cluster::start_from(kind, 3, 1, |_| from_file(&conf, CLUSTER_TTL));
    for n in &cluster.nodes {
        assert_module_loaded(n);
        assert_eq!(grace::reason(&mut n.conn()), "none");
    }
    let key = "{job}:lock";
    let slot = cluster.slot_of(key);
    let t0 = int(&cluster.ok(key, &["LEASE.ACQUIRE", key, "holder", CLUSTER_TTL]));
    let old = cluster.master_of(slot);
    let replica = cluster
        .nodes
        .iter()
        .find(|n| {
            let info = ok_text(&mut n.conn(), &["INFO", "replication"]);
            info.contains("role:slave") && info.contains(&format!("master_port:{}", old.port))
        })
        .expect("the master's replica");
    let record: Record = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    let (failover_at, promoted_after) = thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..200 {
                if stop.load(Ordering::SeqCst) || began.elapsed() > Duration::from_secs(40) {
                    break;
                }
                let sent = Instant::now();
                let got = match cluster.call(key, &["LEASE.RENEW", key, "holder", CLUSTER_TTL]) {
                    Ok(Value::Int(1)) => Got::Renewed,
                    Ok(Value::Int(0)) => Got::Lost,
                    Ok(v) => Got::Error(format!("{v:?}")),
                    Err(e) => {
                        Got::Error(error_text(&e).split(' ').next().unwrap_or("").to_string())
                    }
                };
                record.lock().unwrap().push((sent, got));
                thread::sleep(Duration::from_millis(100));
            }
        });
        thread::sleep(Duration::from_millis(500));
        let at = Instant::now();
        assert_eq!(
            ok(&mut replica.conn(), &["CLUSTER", "FAILOVER"]),
            Value::Okay
        );
        let promoted = wait_until(Duration::from_secs(20), || {
            ok_text(&mut replica.conn(), &["INFO", "replication"]).contains("role:master")
                && cluster.master_of(slot).port == replica.port
        });
        assert!(
            promoted,
            "{kind:?}: CLUSTER FAILOVER did not promote the replica"
        );
        let after = at.elapsed();
        // New leases wait for the grace; the holder's goes on.
        let mut rc = replica.conn();
        let other = "{job}:other";
        assert_eq!(
            ok(&mut rc, &["LEASE.ACQUIRE", other, "newcomer", "3000"]),
            Value::Nil
        );
        assert!(info_int(&mut rc, "lease_grace_refused") >= 1);
        assert_eq!(
            token_of(&mut rc, key),
            Some(t0),
            "the lease came over as it was (promoted after {:?}): {:?}",
            at.elapsed(),
            record
                .lock()
                .unwrap()
                .iter()
                .map(|(t, g)| (*t - at, g.clone()))
                .collect::<Vec<_>>()
        );
        let granted = wait_until(Duration::from_secs(8), || {
            matches!(
                ok(&mut rc, &["LEASE.ACQUIRE", other, "newcomer", "3000"]),
                Value::Int(_)
            )
        });
        assert!(granted, "{kind:?}: no new lease after the grace");
        thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
        (at, after)
    });
    let calls = record.into_inner().unwrap();
    let mut rc = replica.conn();
    assert!(
        replica.log().contains("grace period started (promoted)"),
        "{kind:?}: the promoted replica logged no grace period"
    );
    let t_other = token_of(&mut rc, "{job}:other").expect("the newcomer's lease");
    assert!(t_other > t0);
    // A switchover without FORCE loses nothing: every renewal succeeded or
    // was refused by a node in the middle of the switch, none found the
    // lease gone.
    assert!(
        !calls.iter().any(|(_, g)| *g == Got::Lost),
        "{kind:?}: the holder lost its lease: {calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|(t, g)| *t > failover_at + promoted_after && *g == Got::Renewed),
        "{kind:?}: no renewal on the new master: {calls:?}"
    );
    let (gap, _) = windows(&calls, |g| *g == Got::Renewed, |_| false);
    let errors: Vec<&String> = calls
        .iter()
        .filter_map(|(_, g)| match g {
            Got::Error(c) => Some(c),
            _ => None,
        })
        .collect();
    eprintln!(
        "{kind:?} CLUSTER FAILOVER: promoted after {}; longest stretch between renewals {}; errors {errors:?}",
        secs(promoted_after),
        secs(gap)
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&files);
}

mod cluster_setup_fails_over_without_loss {
    use super::*;
    #[test]
    fn redis() {
        cluster_failover(Kind::Redis)
    }
    #[test]
    fn valkey9() {
        cluster_failover(Kind::Valkey9)
    }
}
