//! The helpers on a real Redis Cluster (3 masters, started by the module's
//! harness): every lease call goes to the master of the lease key's slot,
//! and to no other node; fenced writes land there; the watchdog renews
//! there. Multi-key leases too (all keys in one slot). Sync and async.
#![cfg(feature = "tokio")]

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Master, Value, int, ok};
use redis::cluster::ClusterClient;
use redis_lease_client::{Block, LeaseClient};

/// Three hash tags whose slots are served by three different masters.
fn tags_on_every_master(cluster: &Cluster) -> Vec<(String, Master)> {
    let masters = cluster.masters();
    let mut found: Vec<(String, Master)> = Vec::new();
    for i in 0..1000 {
        if found.len() == masters.len() {
            break;
        }
        let tag = format!("acct{i}");
        let m = cluster.master_of(cluster.slot_of(&tag));
        if !found.iter().any(|(_, f)| f.port == m.port) {
            found.push((tag, m));
        }
    }
    assert_eq!(found.len(), 3, "a tag for every master");
    found
}

/// `calls` of `cmdstat_<cmd>` on a node (0 when it never ran), rejected
/// calls (a MOVED) included.
fn calls(cluster: &Cluster, port: u16, cmd: &str) -> i64 {
    let mut c = cluster.node_by_port(port).conn();
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    let prefix = format!("cmdstat_{cmd}:");
    text.lines()
        .find(|l| l.to_lowercase().starts_with(&prefix))
        .and_then(|l| l.split_once(':'))
        .map(|(_, rest)| rest)
        .map(|rest| {
            rest.split(',')
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| *k == "calls" || *k == "rejected_calls" || *k == "failed_calls")
                .map(|(_, v)| v.parse::<i64>().unwrap())
                .sum()
        })
        .unwrap_or(0)
}

fn reset_stats(cluster: &Cluster) {
    for n in &cluster.nodes {
        let mut c = n.conn();
        ok(&mut c, &["CONFIG", "RESETSTAT"]);
    }
}

/// Every `LEASE.*` call went to `owner`, none to another master.
fn assert_routed(cluster: &Cluster, owner: &Master, tag: &str) {
    for m in cluster.masters() {
        for cmd in [
            "lease.acquire",
            "lease.fence",
            "lease.renew",
            "lease.release",
        ] {
            let n = calls(cluster, m.port, cmd);
            if m.port == owner.port {
                assert!(
                    n >= 1,
                    "{cmd} for {tag} never reached its master {}",
                    m.port
                );
            } else {
                assert_eq!(n, 0, "{cmd} for {tag} reached {} (not its master)", m.port);
            }
        }
    }
}

full_suite! {
    fn lease_calls_are_routed_by_the_lease_key_slot(kind) {
        let cluster = Cluster::start(kind, 3, 0);
        let nodes = vec![format!("redis://127.0.0.1:{}/", cluster.nodes[0].port)];
        let ttl = Duration::from_millis(300);
        let tags = tags_on_every_master(&cluster);

        // The check sees a call that went to the wrong node: it is answered
        // MOVED and counted there as a rejected call.
        let (tag, owner) = &tags[0];
        let other = tags.iter().map(|(_, m)| m).find(|m| m.port != owner.port).unwrap();
        let mut wrong = cluster.node_by_port(other.port).conn();
        let lock = format!("{{{tag}}}:lock");
        let e = common::call(&mut wrong, &[b"LEASE.ACQUIRE", lock.as_bytes(), b"me", b"1000"]).unwrap_err();
        assert!(common::error_text(&e).starts_with("MOVED"), "{e}");
        assert_eq!(calls(&cluster, other.port, "lease.acquire"), 1);

        // Sync.
        let lc = LeaseClient::cluster(ClusterClient::new(nodes.clone()).unwrap());
        for (tag, master) in &tags {
            reset_stats(&cluster);
            let lock = format!("{{{tag}}}:lock");
            let mut lease = lc.acquire(&lock, ttl, Block::NoWait).unwrap().expect("free");
            let _: i64 = lease.fence(redis::cmd("HSET").arg(format!("{{{tag}}}")).arg("by").arg("sync")).unwrap();
            // The watchdog renews it on its master for several ttls.
            let start = Instant::now();
            std::thread::sleep(ttl * 4);
            assert!(!lease.is_lost(), "lost after {:?}", start.elapsed());
            let mut direct = cluster.node_by_port(master.port).conn();
            let info = ok(&mut direct, &["LEASE.INFO", &lock]);
            assert_eq!(int(&common::field(&info, "token").unwrap()), lease.token() as i64);
            assert_eq!(
                ok(&mut direct, &["HGET", &format!("{{{tag}}}"), "by"]),
                Value::BulkString(b"sync".to_vec())
            );
            assert!(lease.release().unwrap());
            assert_routed(&cluster, master, tag);
            assert_eq!(cluster.token(&lock), None);
        }

        // Async.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let alc = redis_lease_client::aio::LeaseClient::cluster(ClusterClient::new(nodes).unwrap());
        for (tag, master) in &tags {
            reset_stats(&cluster);
            let lock = format!("{{{tag}}}:lock");
            rt.block_on(async {
                let lease = alc.acquire(&lock, ttl, Block::NoWait).await.unwrap().expect("free");
                let _: i64 = lease
                    .fence(redis::cmd("HSET").arg(format!("{{{tag}}}")).arg("by").arg("async"))
                    .await
                    .unwrap();
                tokio::time::sleep(ttl * 4).await;
                assert!(!lease.is_lost());
                assert_eq!(cluster.token(&lock), Some(lease.token() as i64));
                assert!(lease.release().await.unwrap());
            });
            let mut direct = cluster.node_by_port(master.port).conn();
            assert_eq!(
                ok(&mut direct, &["HGET", &format!("{{{tag}}}"), "by"]),
                Value::BulkString(b"async".to_vec())
            );
            assert_routed(&cluster, master, tag);
        }
    }

    fn one_watchdog_renews_leases_on_every_master_at_once(kind) {
        // Leases on every master held together: the sync watchdog sends one
        // pipeline per node each round, the async one all renewals in
        // flight at once; every lease stays held on its own master. The
        // leases are taken one after the other, so they fall into step over
        // a few rounds: at least 5 renewals a round trip on average (1
        // without batching; at most 10 here, 30 leases on 3 masters).
        let cluster = Cluster::start(kind, 3, 0);
        let nodes = vec![format!("redis://127.0.0.1:{}/", cluster.nodes[0].port)];
        let ttl = Duration::from_millis(600);
        let locks: Vec<String> = (0..30).map(|i| format!("{{job{i}}}:lock")).collect();
        let lc = LeaseClient::cluster(ClusterClient::new(nodes.clone()).unwrap());
        let leases: Vec<_> = locks
            .iter()
            .map(|l| lc.acquire(l, ttl, Block::NoWait).unwrap().expect("free"))
            .collect();
        std::thread::sleep(ttl * 3);
        for (lock, lease) in locks.iter().zip(&leases) {
            assert!(!lease.is_lost(), "{lock} lost");
            assert_eq!(cluster.token(lock), Some(lease.token() as i64));
        }
        let stats = lc.watchdog_stats();
        assert!(stats.renewals >= 30 * 6 && stats.round_trips * 5 <= stats.renewals, "{stats:?}");
        drop(leases);
        assert!(locks.iter().all(|l| cluster.token(l).is_none()));

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let alc = redis_lease_client::aio::LeaseClient::cluster(ClusterClient::new(nodes).unwrap());
        rt.block_on(async {
            let mut leases = Vec::new();
            for l in &locks {
                leases.push(alc.acquire(l, ttl, Block::NoWait).await.unwrap().expect("free"));
            }
            tokio::time::sleep(ttl * 3).await;
            for (lock, lease) in locks.iter().zip(&leases) {
                assert!(!lease.is_lost(), "{lock} lost");
                assert_eq!(cluster.token(lock), Some(lease.token() as i64));
            }
            let stats = alc.watchdog_stats();
            assert!(stats.renewals >= 30 * 6 && stats.round_trips * 5 <= stats.renewals, "{stats:?}");
            for l in leases {
                assert!(l.release().await.unwrap());
            }
        });
        assert!(locks.iter().all(|l| cluster.token(l).is_none()));
    }

    fn multi_key_leases_go_to_the_master_of_their_slot(kind) {
        // LEASE.MACQUIRE, MRENEW and MRELEASE start with the key count, by
        // which the redis crate would route them: the helpers route them by
        // their first key instead. A master other than the seed node, so
        // that a call sent to the seed would show as a MOVED there.
        let cluster = Cluster::start(kind, 3, 0);
        let seed = cluster.nodes[0].port;
        let nodes = vec![format!("redis://127.0.0.1:{seed}/")];
        let ttl = Duration::from_millis(300);
        let tags = tags_on_every_master(&cluster);
        let (tag, master) = tags.iter().find(|(_, m)| m.port != seed).unwrap();
        let keys = [format!("{{{tag}}}:a"), format!("{{{tag}}}:b")];
        let data = format!("{{{tag}}}");
        let cmds = ["lease.macquire", "lease.mrenew", "lease.mrelease", "lease.fence"];
        let check = |what: &str| {
            for m in cluster.masters() {
                for cmd in cmds {
                    let n = calls(&cluster, m.port, cmd);
                    if m.port == master.port {
                        assert!(n >= 1, "{what}: {cmd} never reached the keys' master");
                    } else {
                        assert_eq!(n, 0, "{what}: {cmd} reached {} (not the keys' master)", m.port);
                    }
                }
            }
        };

        // Sync, with a single lease on the same watchdog.
        reset_stats(&cluster);
        let lc = LeaseClient::cluster(ClusterClient::new(nodes.clone()).unwrap());
        let mut lease = lc.acquire_many(&keys, ttl, Block::NoWait).unwrap().expect("free");
        let single = lc.acquire(&format!("{{{tag}}}:solo"), ttl, Block::NoWait).unwrap().unwrap();
        for key in &keys {
            let _: i64 = lease.fence(key, redis::cmd("HINCRBY").arg(&data).arg("sync").arg(1)).unwrap();
        }
        std::thread::sleep(ttl * 4);
        assert!(!lease.is_lost() && !single.is_lost());
        for key in &keys {
            assert_eq!(cluster.token(key), Some(lease.token() as i64));
        }
        let mut direct = cluster.node_by_port(master.port).conn();
        assert_eq!(ok(&mut direct, &["HGET", &data, "sync"]), Value::BulkString(b"2".to_vec()));
        // Keys of different slots: refused before anything is sent.
        let (a, b) = (&tags[0].0, &tags[1].0);
        let cross = [format!("{{{a}}}:x"), format!("{{{b}}}:x")];
        let sent = calls(&cluster, master.port, "lease.macquire");
        let got = lc.acquire_many(&cross, ttl, Block::NoWait);
        assert!(matches!(got, Err(redis_lease_client::Error::InvalidKeys(ref m)) if m.contains("CROSSSLOT")), "{got:?}");
        assert_eq!(calls(&cluster, master.port, "lease.macquire"), sent);
        assert!(lease.release().unwrap());
        drop(single);
        assert!(keys.iter().all(|k| cluster.token(k).is_none()));
        check("sync");

        // Async.
        reset_stats(&cluster);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let alc = redis_lease_client::aio::LeaseClient::cluster(ClusterClient::new(nodes).unwrap());
        rt.block_on(async {
            let lease = alc.acquire_many(&keys, ttl, Block::NoWait).await.unwrap().expect("free");
            let single = alc.acquire(&format!("{{{tag}}}:solo"), ttl, Block::NoWait).await.unwrap().unwrap();
            for key in &keys {
                let _: i64 = lease
                    .fence(key, redis::cmd("HINCRBY").arg(&data).arg("async").arg(1))
                    .await
                    .unwrap();
            }
            tokio::time::sleep(ttl * 4).await;
            assert!(!lease.is_lost() && !single.is_lost());
            for key in &keys {
                assert_eq!(cluster.token(key), Some(lease.token() as i64));
            }
            let got = alc.acquire_many(&cross, ttl, Block::NoWait).await;
            assert!(matches!(got, Err(redis_lease_client::Error::InvalidKeys(_))), "{got:?}");
            assert!(lease.release().await.unwrap());
            assert!(single.release().await.unwrap());
        });
        assert_eq!(ok(&mut direct, &["HGET", &data, "async"]), Value::BulkString(b"2".to_vec()));
        assert!(keys.iter().all(|k| cluster.token(k).is_none()));
        check("async");
    }
}

/// A null acquire on a cluster in its grace period says so: the helper asks
/// `INFO lease` of the key's master (not of every node), sync and async.
#[test]
fn a_grace_refusal_on_a_cluster_says_so() {
    use redis_lease_client::Error;
    let cluster = Cluster::start_with(common::Kind::Redis, 3, 0, &["grace-ms", "30000"], 3000);
    let urls: Vec<String> = cluster
        .masters()
        .iter()
        .map(|m| format!("redis://127.0.0.1:{}/", m.port))
        .collect();
    let client = LeaseClient::cluster(ClusterClient::new(urls.clone()).unwrap());
    match client.acquire("{g}:job", Duration::from_secs(5), Block::NoWait) {
        Err(Error::Grace { remaining, reason }) => {
            assert!(remaining > Duration::ZERO, "{remaining:?}");
            assert!(!reason.is_empty());
        }
        Err(e) => panic!("sync: {e}"),
        Ok(l) => panic!("sync: {:?}", l.map(|l| l.token())),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client =
            redis_lease_client::aio::LeaseClient::cluster(ClusterClient::new(urls).unwrap());
        match client
            .acquire("{g}:job", Duration::from_secs(5), Block::NoWait)
            .await
        {
            Err(Error::Grace { .. }) => {}
            Err(e) => panic!("async: {e}"),
            Ok(l) => panic!("async: {:?}", l.map(|l| l.token())),
        }
    });
}
