//! The deployments the failovers run on: which node of a Redis Cluster
//! serves a slot, and the Sentinel deployment (`Deployment`: three
//! sentinels, a master and two replicas with the module, `node_opts`),
//! started, settled, a replica cut off, and each failover as the
//! controller saw it (`Failover`).

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use super::Params;
use crate::common::*;

/// Does `node` see itself as the master serving `slot` (its own CLUSTER
/// NODES line)?
pub(super) fn serves_itself(node: &Server, slot: i64) -> bool {
    let Some(mut c) = quick_conn(node.port) else {
        return false;
    };
    let Ok(nodes) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) else {
        return false;
    };
    nodes.lines().any(|line| {
        let f: Vec<&str> = line.split(' ').collect();
        f.len() >= 9
            && f[2].contains("myself")
            && f[2].contains("master")
            && f[8..].iter().any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                match (a.parse::<i64>(), b.parse::<i64>()) {
                    (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                    _ => false,
                }
            })
    })
}

/// Starts sentinel `index` watching `master_port` (as `mymaster`), its
/// config file (which Sentinel rewrites) in `dir`.
fn start_sentinel(kind: Kind, dir: &Path, index: usize, master_port: u16) -> Sentinel {
    Sentinel::start(kind, dir, index, "mymaster", |port, log| {
        format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {}\nlogfile {}\n\
             sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds mymaster 1000\n\
             sentinel failover-timeout mymaster 5000\n\
             sentinel parallel-syncs mymaster 1\n",
            dir.display(),
            log.display()
        )
    })
}

/// The module and server settings of a data node.
pub(super) fn node_opts(p: &Params, replica_of: Option<u16>) -> Opts {
    let max_ttl = p.max_ttl_ms.to_string();
    let mut o = Opts::default()
        .module_args(&["grace-ms", p.grace_ms, "max-ttl-ms", &max_ttl])
        .extra(&[
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "1",
            "--replica-priority",
            "100",
        ]);
    if let Some(port) = replica_of {
        o = o.extra(&["--replicaof", "127.0.0.1", &port.to_string()]);
    }
    o
}

/// One planned failover, as the controller saw it.
#[derive(Debug, Clone)]
pub(super) struct Failover {
    pub(super) killed_port: u16,
    /// The replica that was cut off before the kill (priority 1).
    pub(super) cut_port: u16,
    /// The master the sentinels agreed on first after the kill.
    pub(super) promoted_port: u16,
    pub(super) cut_at: Instant,
    pub(super) killed_at: Instant,
    /// When every sentinel named the new master.
    pub(super) switched_at: Instant,
    /// The new master's grace as first seen, and its refusals once over.
    pub(super) grace_seen: (i64, String),
    pub(super) grace_refused: i64,
    /// Its log says a grace period started after the promotion.
    pub(super) grace_logged: bool,
}

/// The servers of a Sentinel deployment. The sentinels drop first.
pub(super) struct Deployment {
    pub(super) sentinels: Vec<Sentinel>,
    pub(super) nodes: Vec<Option<Server>>,
}

impl Deployment {
    /// Starts a master, two replicas and three sentinels, the sentinels
    /// quick to notice changes; returns once they have found each other.
    pub(super) fn start(kind: Kind, p: &Params) -> Deployment {
        let n0 = Server::start_with(kind, node_opts(p, None));
        let n1 = Server::start_with(kind, node_opts(p, Some(n0.port)));
        let n2 = Server::start_with(kind, node_opts(p, Some(n0.port)));
        let dir = n0.dir.clone();
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|i| start_sentinel(kind, &dir, i, n0.port))
            .collect();
        let d = Deployment {
            sentinels,
            nodes: vec![Some(n0), Some(n1), Some(n2)],
        };
        // INFO every second (not ten), so replicas restarted on a new port
        // and changed priorities are known at once; PING every 200 ms, under
        // down-after-milliseconds (1000): at 1000 a sentinel that just
        // switched to the new master can find it "down" before its first
        // PING (the switch resets the link as if a PING were pending) and
        // fail over again. A TILT (the sentinel's timer saw a gap of over
        // 2 s: a stalled machine or a clock step) lasts 5 s, not 30.
        for s in &d.sentinels {
            let mut c = s.conn().expect("sentinel");
            for (name, value) in [
                ("info-period", "1000"),
                ("ping-period", "200"),
                ("tilt-period", "5000"),
            ] {
                let _: () = redis::cmd("SENTINEL")
                    .arg("DEBUG")
                    .arg(name)
                    .arg(value)
                    .query(&mut c)
                    .expect("SENTINEL DEBUG");
            }
        }
        assert!(
            wait_until(Duration::from_secs(15), || d
                .sentinels
                .iter()
                .all(|s| s.other_sentinels() == 2)),
            "the sentinels never found each other"
        );
        d
    }

    pub(super) fn node(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.as_ref().is_some_and(|s| s.port == port))
    }

    pub(super) fn server(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().expect("a live node")
    }

    /// The master every sentinel names, when they agree.
    pub(super) fn agreed_master(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(|s| s.master_port()).collect();
        let first = ports[0]?;
        ports.iter().all(|p| *p == Some(first)).then_some(first)
    }

    /// The replicas of `master_port` with their link up, from its INFO
    /// replication.
    fn online_replicas(&self, master_port: u16) -> Vec<u16> {
        self.replica_states(master_port)
            .into_iter()
            .filter(|(_, state)| state == "online")
            .map(|(p, _)| p)
            .collect()
    }

    /// Every replica `master_port` lists, with its state.
    fn replica_states(&self, master_port: u16) -> Vec<(u16, String)> {
        let Some(info) = try_info(master_port, "replication") else {
            return Vec::new();
        };
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains("port="))
            .filter_map(|l| {
                let get = |name: &str| l.split([',', ':']).find_map(|f| f.strip_prefix(name));
                Some((get("port=")?.parse().ok()?, get("state=")?.to_string()))
            })
            .collect()
    }

    /// Waits (up to 30 s) until the sentinels agree on a master that says
    /// it is one, every other node is its replica, online, and every
    /// sentinel knows it healthy, with `priorities` where given. Returns
    /// the master's port.
    pub(super) fn settle(&self, priorities: &[(u16, &str)]) -> u16 {
        let mut master = None;
        let ok = wait_until(Duration::from_secs(30), || {
            master = self.agreed_master();
            let Some(m) = master else { return false };
            if self.node(m).is_none()
                || !try_info(m, "replication").is_some_and(|i| i.contains("role:master"))
            {
                return false;
            }
            let others: Vec<u16> = self
                .nodes
                .iter()
                .flatten()
                .map(|s| s.port)
                .filter(|p| *p != m)
                .collect();
            let online = self.online_replicas(m);
            others.iter().all(|p| online.contains(p))
                && self.sentinels.iter().all(|s| {
                    let known = s.replicas();
                    others
                        .iter()
                        .all(|p| known.get(p).is_some_and(|(flags, _)| flags == "slave"))
                        && priorities
                            .iter()
                            .all(|(p, prio)| known.get(p).is_some_and(|(_, pr)| pr == prio))
                })
        });
        if !ok {
            let views: Vec<String> = self
                .sentinels
                .iter()
                .map(|s| format!("{:?}", s.replicas()))
                .collect();
            panic!(
                "the deployment did not settle: sentinels name {master:?}, whose replicas are {:?}; nodes {:?}; sentinels see {views:?}\n{}",
                master.map(|m| self.replica_states(m)),
                self.nodes
                    .iter()
                    .flatten()
                    .map(|s| s.port)
                    .collect::<Vec<_>>(),
                self.sentinels[0].log_tail(30)
            );
        }
        master.unwrap()
    }

    /// Cuts replica `i` off its master `master`: the replica is stopped
    /// (SIGSTOP), then the master closes its link (CLIENT KILL ADDR, the
    /// link's address as the replica's `CLIENT LIST TYPE master` shows it),
    /// so what the master acknowledges from now on reaches only the other
    /// replica (which keeps it writable under min-replicas-to-write 1), and
    /// the stopped replica cannot reconnect.
    pub(super) fn cut_off(&self, i: usize, master: u16) -> Frozen {
        let port = self.server(i).port;
        for _attempt in 0..5 {
            let mut c = self.server(i).conn();
            let list = ok_text(&mut c, &["CLIENT", "LIST", "TYPE", "master"]);
            let laddr = list
                .split_whitespace()
                .find_map(|f| f.strip_prefix("laddr="))
                .map(str::to_string)
                .unwrap_or_else(|| panic!(":{port} has no master link: {list}"));
            let frozen = Frozen::stop(self.server(i));
            let mut m = self.server(self.node(master).unwrap()).conn();
            let killed = ok(&mut m, &["CLIENT", "KILL", "ADDR", &laddr, "SKIPME", "yes"]);
            let gone = || !self.replica_states(master).iter().any(|(p, _)| *p == port);
            if killed == Value::Int(1) && wait_until(Duration::from_secs(2), gone) {
                return frozen;
            }
            // The link changed under the look: let it run and try again.
            drop(frozen);
            thread::sleep(Duration::from_millis(300));
        }
        panic!("could not cut :{port} off its master :{master}");
    }
}
