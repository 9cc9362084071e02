//! Redis Cluster: 3 masters with one replica each. Leases spread over many
//! slots keep their state and tokens keep increasing when a slot moves to
//! another master (CLUSTER SETSLOT + MIGRATE) and when a master fails over
//! (CLUSTER FAILOVER); keys are declared so MOVED routing works; the fence
//! refuses commands on keys of another slot (CROSSSLOT).
mod common;
use common::*;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

struct Cluster {
    nodes: Vec<Server>,
}

fn node_opts(port_conf: usize) -> Opts {
    Opts::default().extra(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &format!("nodes-{port_conf}.conf"),
        "--cluster-node-timeout",
        "3000",
    ])
}

fn text(c: &mut redis::Connection, args: &[&str]) -> String {
    match ok(c, args) {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        Value::SimpleString(s) => s,
        other => panic!("{args:?}: {other:?}"),
    }
}

impl Cluster {
    fn start(kind: Kind) -> Cluster {
        let nodes: Vec<Server> = (0..6)
            .map(|i| Server::start_with(kind, node_opts(i)))
            .collect();
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        for n in &cluster.nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || text(
                    &mut c,
                    &["CLUSTER", "INFO"]
                )
                .contains("cluster_state:ok")),
                "cluster never became ok"
            );
            assert!(
                wait_until(Duration::from_secs(20), || text(
                    &mut c,
                    &["CLUSTER", "NODES"]
                )
                .matches("slave")
                .count()
                    == 3),
                "replicas never attached"
            );
        }
        cluster
    }

    fn node_by_port(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("known node")
    }

    /// Runs a command on the node owning `key`, following MOVED.
    fn call(&self, key: &str, args: &[&str]) -> redis::RedisResult<Value> {
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

    fn ok(&self, key: &str, args: &[&str]) -> Value {
        self.call(key, args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn token(&self, key: &str) -> Option<i64> {
        match self.ok(key, &["LEASE.INFO", key]) {
            Value::Nil => None,
            v => Some(int(&field(&v, "token").unwrap())),
        }
    }

    /// (node id, port) of the master serving `slot`, as node 0 sees it.
    /// While a failover or a slot move settles, node 0's view may briefly
    /// show no owner: it is asked again for up to 10 s.
    fn master_of(&self, slot: i64) -> (String, u16) {
        let mut found = None;
        wait_until(Duration::from_secs(10), || {
            found = self.try_master_of(slot);
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no master for slot {slot}"))
    }

    fn try_master_of(&self, slot: i64) -> Option<(String, u16)> {
        let mut c = self.nodes[0].conn();
        let nodes = text(&mut c, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>())
                    && (a..=b).contains(&slot)
                {
                    let port = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                    return Some((f[0].to_string(), port));
                }
            }
        }
        None
    }

    fn masters(&self) -> Vec<(String, u16)> {
        let mut c = self.nodes[0].conn();
        text(&mut c, &["CLUSTER", "NODES"])
            .lines()
            .filter(|l| l.split(' ').nth(2).unwrap().contains("master") && l.split(' ').count() > 8)
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (
                    f[0].to_string(),
                    f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap(),
                )
            })
            .collect()
    }
}

fn slot_of(c: &Cluster, key: &str) -> i64 {
    let mut n = c.nodes[0].conn();
    int(&ok(&mut n, &["CLUSTER", "KEYSLOT", key]))
}

both! {
    fn leases_survive_slot_moves_and_failover_with_increasing_tokens(kind) {
        let cluster = Cluster::start(kind);
        // Leases over many slots, on every master.
        let mut tokens: HashMap<String, i64> = HashMap::new();
        for i in 0..150 {
            let key = format!("lease:{i}");
            let t = int(&cluster.ok(&key, &["LEASE.ACQUIRE", &key, &format!("owner{i}"), "600000"]));
            tokens.insert(key, t);
        }
        let masters = cluster.masters();
        assert_eq!(masters.len(), 3);

        // Move the slot of lease:0 to another master.
        let slot = slot_of(&cluster, "lease:0");
        let (src_id, src_port) = cluster.master_of(slot);
        let (dst_id, dst_port) = masters.iter().find(|(id, _)| *id != src_id).cloned().unwrap();
        let mut src = cluster.node_by_port(src_port).conn();
        let mut dst = cluster.node_by_port(dst_port).conn();
        ok(&mut dst, &["CLUSTER", "SETSLOT", &slot.to_string(), "IMPORTING", &src_id]);
        ok(&mut src, &["CLUSTER", "SETSLOT", &slot.to_string(), "MIGRATING", &dst_id]);
        let Value::Array(keys) = ok(&mut src, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]) else { panic!() };
        let keys: Vec<String> = keys.iter().map(|k| match k { Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(), _ => panic!() }).collect();
        assert!(keys.contains(&"lease:0".to_string()));
        let mut migrate = vec!["MIGRATE".to_string(), "127.0.0.1".into(), dst_port.to_string(), "".into(), "0".into(), "5000".into(), "KEYS".into()];
        migrate.extend(keys.iter().cloned());
        let m: Vec<&str> = migrate.iter().map(|s| s.as_str()).collect();
        assert_eq!(ok(&mut src, &m), Value::Okay);
        for n in &cluster.nodes {
            let mut c = n.conn();
            let _ = call(&mut c, &[b"CLUSTER", b"SETSLOT", slot.to_string().as_bytes(), b"NODE", dst_id.as_bytes()]);
        }
        assert_eq!(cluster.master_of(slot).1, dst_port);
        for k in &keys {
            assert_eq!(cluster.token(k), Some(tokens[k]), "{k} after the slot move");
            let info = ok(&mut dst, &["LEASE.INFO", k]);
            assert!(int(&field(&info, "ttl").unwrap()) > 500_000, "expiry kept");
        }
        // The owner moved too, and the next token on that key is larger.
        let i: usize = keys[0].trim_start_matches("lease:").parse().unwrap();
        assert_eq!(int(&ok(&mut dst, &["LEASE.RELEASE", &keys[0], &format!("owner{i}")])), 1);
        let next = int(&ok(&mut dst, &["LEASE.ACQUIRE", &keys[0], "new", "600000"]));
        assert!(next > tokens[&keys[0]]);
        tokens.insert(keys[0].clone(), next);

        // Fail a master over to its replica.
        let victim_slot = slot_of(&cluster, "lease:1");
        let (victim_id, victim_port) = cluster.master_of(victim_slot);
        let replica = cluster
            .nodes
            .iter()
            .find(|n| {
                let mut c = n.conn();
                text(&mut c, &["INFO", "replication"]).contains(&format!("master_port:{victim_port}"))
            })
            .expect("a replica of the victim");
        let mut r = replica.conn();
        assert!(wait_until(Duration::from_secs(10), || text(&mut r, &["INFO", "replication"]).contains("master_link_status:up")));
        let mut v = cluster.node_by_port(victim_port).conn();
        assert_eq!(int(&ok(&mut v, &["WAIT", "1", "5000"])), 1);
        ok(&mut r, &["CLUSTER", "FAILOVER"]);
        assert!(
            wait_until(Duration::from_secs(20), || cluster.master_of(victim_slot).1 == replica.port),
            "failover of {victim_id} did not happen"
        );
        assert!(wait_until(Duration::from_secs(10), || text(&mut r, &["INFO", "replication"]).contains("role:master")));
        let moved: Vec<String> = tokens.keys().filter(|k| cluster.master_of(slot_of(&cluster, k)).1 == replica.port).cloned().collect();
        assert!(!moved.is_empty());
        for k in &moved {
            assert_eq!(cluster.token(k), Some(tokens[k]), "{k} after failover");
            let i: usize = k.trim_start_matches("lease:").parse().unwrap();
            let owner = if tokens[k] == next { "new".to_string() } else { format!("owner{i}") };
            assert_eq!(int(&cluster.ok(k, &["LEASE.RELEASE", k, &owner])), 1, "{k}");
            let t = int(&cluster.ok(k, &["LEASE.ACQUIRE", k, "after-failover", "600000"]));
            assert!(t > tokens[k], "{k}: {t} after {}", tokens[k]);
        }
        // Every key, on every master: the next token exceeds every earlier one.
        for (k, old) in &tokens {
            if moved.contains(k) {
                continue;
            }
            let i: usize = k.trim_start_matches("lease:").parse().unwrap();
            let owner = if *old == next { "new".to_string() } else { format!("owner{i}") };
            assert_eq!(int(&cluster.ok(k, &["LEASE.RELEASE", k, &owner])), 1, "{k}");
            let t = int(&cluster.ok(k, &["LEASE.ACQUIRE", k, "later", "600000"]));
            assert!(t > *old, "{k}: {t} after {old}");
        }
    }

    fn keys_are_declared_and_the_fence_stays_in_its_slot(kind) {
        let cluster = Cluster::start(kind);
        // A lease command sent to the wrong node is redirected: its key is declared.
        let key = "lock:{acct7}";
        let slot = slot_of(&cluster, key);
        let (_, owner_port) = cluster.master_of(slot);
        let other = cluster.masters().into_iter().find(|(_, p)| *p != owner_port).unwrap();
        let mut wrong = cluster.node_by_port(other.1).conn();
        let e = err(&mut wrong, &["LEASE.ACQUIRE", key, "me", "60000"]);
        assert!(e.starts_with("MOVED"), "{e}");
        let t = int(&cluster.ok(key, &["LEASE.ACQUIRE", key, "me", "60000"])).to_string();
        assert_eq!(cluster.ok(key, &["LEASE.FENCE", key, &t, "SET", "acct:{acct7}", "90"]), Value::Okay);
        let e = cluster.call(key, &["LEASE.FENCE", key, &t, "SET", "acct:8", "90"]).expect_err("CROSSSLOT");
        assert!(error_text(&e).starts_with("CROSSSLOT"), "{e}");
        let e = cluster.call(key, &["LEASE.FENCE", key, &t, "MSET", "x:{acct7}", "1", "y", "2"]).expect_err("CROSSSLOT");
        assert!(error_text(&e).starts_with("CROSSSLOT"), "{e}");
        assert_eq!(cluster.call(key, &["EXISTS", "x:{acct7}"]).unwrap(), Value::Int(0));
    }
}
