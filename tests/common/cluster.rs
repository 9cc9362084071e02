//! Clusters of module-loaded servers, joined by `redis-cli --cluster
//! create`: who serves which slot, and commands that follow MOVED.

use std::process::Command;
use std::time::Duration;

use super::*;

/// A master of a cluster, as `CLUSTER NODES` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    pub id: String,
    pub port: u16,
    /// The slot ranges it serves (inclusive).
    pub ranges: Vec<(i64, i64)>,
}

impl Master {
    pub fn serves(&self, slot: i64) -> bool {
        self.ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// The masters serving slots, from a `CLUSTER NODES` text. `skip_failed`:
/// leave out masters flagged `fail`.
fn parse_masters(nodes: &str, skip_failed: bool) -> Vec<Master> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") || (skip_failed && f[2].contains("fail")) {
                return None;
            }
            let port = f[1].split(['@', ':']).nth(1)?.parse().ok()?;
            let ranges: Vec<(i64, i64)> = f[8..]
                .iter()
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            Some(Master {
                id: f[0].to_string(),
                port,
                ranges,
            })
        })
        .collect()
}

/// A running cluster of module-loaded servers.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each, created by
    /// `redis-cli --cluster create`; returns once every node sees the
    /// cluster ok, knows every node and sees every replica attached, and
    /// every replica has finished its first sync (up to 20 s each).
    pub fn start(kind: Kind, masters: usize, replicas: usize) -> Cluster {
        Cluster::start_with(kind, masters, replicas, &[], 3000)
    }

    /// `start` with `module_args` for every node and its
    /// `cluster-node-timeout`.
    pub fn start_with(
        kind: Kind,
        masters: usize,
        replicas: usize,
        module_args: &[&str],
        node_timeout_ms: u64,
    ) -> Cluster {
        Cluster::start_from(kind, masters, replicas, |i| {
            Opts::default().module_args(module_args).extra(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{i}.conf"),
                "--cluster-node-timeout",
                &node_timeout_ms.to_string(),
            ])
        })
    }

    /// `start` with the options of node `i` given by `opts(i)`, which make
    /// it a cluster node (`--cluster-enabled yes` or a config file that
    /// says so).
    pub fn start_from(
        kind: Kind,
        masters: usize,
        replicas: usize,
        opts: impl Fn(usize) -> Opts,
    ) -> Cluster {
        let total = masters * (1 + replicas);
        let nodes: Vec<Server> = (0..total)
            .map(|i| Server::start_with(kind, opts(i)))
            .collect();
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas".to_string(), replicas.to_string()]);
        args.push("--cluster-yes".to_string());
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let known = format!("cluster_known_nodes:{total}");
        for n in &nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || {
                    let info = ok_text(&mut c, &["CLUSTER", "INFO"]);
                    info.contains("cluster_state:ok") && info.contains(&known)
                }),
                "cluster never became ok"
            );
            assert!(
                wait_until(Duration::from_secs(20), || ok_text(
                    &mut c,
                    &["CLUSTER", "NODES"]
                )
                .matches("slave")
                .count()
                    == masters * replicas),
                "replicas never attached"
            );
        }
        // And every replica has finished its first sync (a switchover
        // before that waits for it).
        for n in &nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || {
                    let info = ok_text(&mut c, &["INFO", "replication"]);
                    info.contains("role:master") || info.contains("master_link_status:up")
                }),
                "a replica never finished its first sync"
            );
        }
        Cluster { nodes }
    }

    pub fn node_by_port(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("known node")
    }

    /// The slot of `key` (CLUSTER KEYSLOT on node 0).
    pub fn slot_of(&self, key: &str) -> i64 {
        let mut n = self.nodes[0].conn();
        int(&ok(&mut n, &["CLUSTER", "KEYSLOT", key]))
    }

    /// Every master serving slots, as node 0 sees it.
    pub fn masters(&self) -> Vec<Master> {
        let mut c = self.nodes[0].conn();
        parse_masters(&ok_text(&mut c, &["CLUSTER", "NODES"]), false)
    }

    /// The master serving `slot`, as node 0 sees it (a master flagged
    /// `fail` does not count). While a failover or a slot move settles,
    /// node 0's view may briefly show no owner: it is asked again for up to
    /// 10 s.
    pub fn master_of(&self, slot: i64) -> Master {
        let mut found = None;
        wait_until(Duration::from_secs(10), || {
            found = self.try_master_of(slot);
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no master for slot {slot}"))
    }

    fn try_master_of(&self, slot: i64) -> Option<Master> {
        let mut c = self.nodes[0].conn();
        parse_masters(&ok_text(&mut c, &["CLUSTER", "NODES"]), true)
            .into_iter()
            .find(|m| m.serves(slot))
    }

    /// Runs a command on the node owning `key`, following MOVED (up to 5
    /// redirections).
    pub fn call(&self, key: &str, args: &[&str]) -> redis::RedisResult<Value> {
        let mut port = self.nodes[0].port;
        for _ in 0..5 {
            let mut c = self.node_by_port(port).conn();
            let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            match call(&mut c, &bytes) {
                Err(e) if error_text(&e).starts_with("MOVED") => {
                    let t = error_text(&e);
                    port = t.rsplit(':').next().unwrap().trim().parse().unwrap();
                }
                other => return other,
            }
        }
        panic!("too many redirections for {key}")
    }

    /// `call`, which must succeed.
    pub fn ok(&self, key: &str, args: &[&str]) -> Value {
        self.call(key, args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// The token of the lease on `key`, asked of the node owning it.
    pub fn token(&self, key: &str) -> Option<i64> {
        match self.ok(key, &["LEASE.INFO", key]) {
            Value::Nil => None,
            v => Some(int(&field(&v, "token").unwrap())),
        }
    }

    /// Panics with the log of a node that died, naming `what`. A client
    /// just saw an error that may mean a node is dying: it is given up to
    /// 1 s to be reaped.
    pub fn assert_all_alive(&mut self, what: &str) {
        wait_until(Duration::from_millis(1000), || {
            self.nodes.iter_mut().any(|n| !n.is_alive())
        });
        for n in &mut self.nodes {
            n.assert_alive(what, false);
        }
    }
}
