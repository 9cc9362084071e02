//! Redis Cluster: 3 masters with one replica each. Leases spread over many
//! slots keep their state and tokens keep increasing when a slot moves to
//! another master (CLUSTER SETSLOT + MIGRATE) and when a master fails over
//! (CLUSTER FAILOVER); keys are declared so MOVED routing works; the fence
//! refuses commands on keys of another slot (CROSSSLOT).
mod common;
use common::*;

use std::collections::HashMap;
use std::time::Duration;

/// MIGRATE through `src`, which must succeed; when it does not, a node that
/// died on the way is named with its log.
fn migrate_through(cluster: &mut Cluster, src_port: u16, args: &[String]) {
    let mut src = cluster.node_by_port(src_port).conn();
    match call_args(&mut src, args) {
        Ok(v) => assert_eq!(v, Value::Okay, "{args:?}"),
        Err(e) => {
            cluster.assert_all_alive(&format!("{args:?} answered {e}"));
            panic!("{args:?} failed: {e}");
        }
    }
}

full_suite! {
    fn leases_survive_slot_moves_and_failover_with_increasing_tokens(kind) {
        let mut cluster = Cluster::start(kind, 3, 1);
        // Leases over many slots, on every master.
        let mut tokens: HashMap<String, i64> = HashMap::new();
        for i in 0..150 {
            let key = format!("lease:{i}");
            let t = int(&cluster.ok(&key, &["LEASE.ACQUIRE", &key, &format!("owner{i}"), "60000"]));
            tokens.insert(key, t);
        }
        let masters = cluster.masters();
        assert_eq!(masters.len(), 3);

        // Move the slot of lease:0 to another master.
        let slot = cluster.slot_of("lease:0");
        let Master { id: src_id, port: src_port, .. } = cluster.master_of(slot);
        let Master { id: dst_id, port: dst_port, .. } = masters.iter().find(|m| m.id != src_id).cloned().unwrap();
        let mut src = cluster.node_by_port(src_port).conn();
        let mut dst = cluster.node_by_port(dst_port).conn();
        ok(&mut dst, &["CLUSTER", "SETSLOT", &slot.to_string(), "IMPORTING", &src_id]);
        ok(&mut src, &["CLUSTER", "SETSLOT", &slot.to_string(), "MIGRATING", &dst_id]);
        let Value::Array(keys) = ok(&mut src, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]) else { panic!() };
        let keys: Vec<String> = keys.iter().map(|k| match k { Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(), _ => panic!() }).collect();
        assert!(keys.contains(&"lease:0".to_string()));
        let mut migrate = vec!["MIGRATE".to_string(), "127.0.0.1".into(), dst_port.to_string(), "".into(), "0".into(), "5000".into(), "KEYS".into()];
        migrate.extend(keys.iter().cloned());
        migrate_through(&mut cluster, src_port, &migrate);
        for n in &cluster.nodes {
            let mut c = n.conn();
            let _ = call(&mut c, &[b"CLUSTER", b"SETSLOT", slot.to_string().as_bytes(), b"NODE", dst_id.as_bytes()]);
        }
        assert_eq!(cluster.master_of(slot).port, dst_port);
        for k in &keys {
            assert_eq!(cluster.token(k), Some(tokens[k]), "{k} after the slot move");
            let info = ok(&mut dst, &["LEASE.INFO", k]);
            assert!(int(&field(&info, "ttl").unwrap()) > 50_000, "expiry kept");
        }
        // The owner moved too, and the next token on that key is larger.
        let i: usize = keys[0].trim_start_matches("lease:").parse().unwrap();
        assert_eq!(int(&ok(&mut dst, &["LEASE.RELEASE", &keys[0], &format!("owner{i}")])), 1);
        let next = int(&ok(&mut dst, &["LEASE.ACQUIRE", &keys[0], "new", "60000"]));
        assert!(next > tokens[&keys[0]]);
        tokens.insert(keys[0].clone(), next);

        // Fail a master over to its replica.
        let victim_slot = cluster.slot_of("lease:1");
        let Master { id: victim_id, port: victim_port, .. } = cluster.master_of(victim_slot);
        let replica = cluster
            .nodes
            .iter()
            .find(|n| {
                let mut c = n.conn();
                ok_text(&mut c, &["INFO", "replication"]).contains(&format!("master_port:{victim_port}"))
            })
            .expect("a replica of the victim");
        let mut r = replica.conn();
        assert!(wait_until(Duration::from_secs(10), || ok_text(&mut r, &["INFO", "replication"]).contains("master_link_status:up")));
        let mut v = cluster.node_by_port(victim_port).conn();
        assert_eq!(int(&ok(&mut v, &["WAIT", "1", "5000"])), 1);
        ok(&mut r, &["CLUSTER", "FAILOVER"]);
        assert!(
            wait_until(Duration::from_secs(20), || cluster.master_of(victim_slot).port == replica.port),
            "failover of {victim_id} did not happen"
        );
        assert!(wait_until(Duration::from_secs(10), || ok_text(&mut r, &["INFO", "replication"]).contains("role:master")));
        let moved: Vec<String> = tokens.keys().filter(|k| cluster.master_of(cluster.slot_of(k)).port == replica.port).cloned().collect();
        assert!(!moved.is_empty());
        for k in &moved {
            assert_eq!(cluster.token(k), Some(tokens[k]), "{k} after failover");
            let i: usize = k.trim_start_matches("lease:").parse().unwrap();
            let owner = if tokens[k] == next { "new".to_string() } else { format!("owner{i}") };
            assert_eq!(int(&cluster.ok(k, &["LEASE.RELEASE", k, &owner])), 1, "{k}");
            let t = int(&cluster.ok(k, &["LEASE.ACQUIRE", k, "after-failover", "60000"]));
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
            let t = int(&cluster.ok(k, &["LEASE.ACQUIRE", k, "later", "60000"]));
            assert!(t > *old, "{k}: {t} after {old}");
        }
    }

    fn keys_are_declared_and_the_fence_stays_in_its_slot(kind) {
        let cluster = Cluster::start(kind, 3, 1);
        // A lease command sent to the wrong node is redirected: its key is declared.
        let key = "lock:{acct7}";
        let slot = cluster.slot_of(key);
        let owner_port = cluster.master_of(slot).port;
        let other = cluster.masters().into_iter().find(|m| m.port != owner_port).unwrap();
        let mut wrong = cluster.node_by_port(other.port).conn();
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

    fn counting_and_shared_leases_in_a_cluster(kind) {
        let cluster = Cluster::start(kind, 3, 1);
        let (sem, rd) = ("sem:{jobs}", "rd:{jobs}");
        let slot = cluster.slot_of(sem);
        let owner_port = cluster.master_of(slot).port;
        let other = cluster.masters().into_iter().find(|m| m.port != owner_port).unwrap();
        let mut wrong = cluster.node_by_port(other.port).conn();
        let e = err(&mut wrong, &["LEASE.ACQUIRE", sem, "a", "60000", "LIMIT", "2"]);
        assert!(e.starts_with("MOVED"), "{e}");
        let ta = int(&cluster.ok(sem, &["LEASE.ACQUIRE", sem, "a", "60000", "LIMIT", "2"]));
        let tb = int(&cluster.ok(sem, &["LEASE.ACQUIRE", sem, "b", "60000", "LIMIT", "2"]));
        assert_eq!(cluster.ok(sem, &["LEASE.ACQUIRE", sem, "c", "60000", "LIMIT", "2"]), Value::Nil);
        let tr = int(&cluster.ok(rd, &["LEASE.ACQUIRE", rd, "r", "60000", "SHARED"])).to_string();
        // A reader's token: reads in the slot, CROSSSLOT outside it, no writes.
        assert_eq!(cluster.ok(rd, &["LEASE.FENCE", rd, &tr, "GET", "x:{jobs}"]), Value::Nil);
        let e = cluster.call(rd, &["LEASE.FENCE", rd, &tr, "GET", "x:other"]).expect_err("CROSSSLOT");
        assert!(error_text(&e).starts_with("CROSSSLOT"), "{e}");
        let e = cluster.call(rd, &["LEASE.FENCE", rd, &tr, "SET", "x:{jobs}", "1"]).expect_err("shared write");
        assert!(error_text(&e).contains("SHARED holder"), "{e}");
        // The slot's replica holds the same holders; after a failover the
        // new master keeps them, and the next holder's token is larger.
        let replica = cluster
            .nodes
            .iter()
            .find(|n| {
                let mut c = n.conn();
                ok_text(&mut c, &["INFO", "replication"]).contains(&format!("master_port:{owner_port}"))
            })
            .expect("a replica of the slot's master");
        let mut r = replica.conn();
        let mut m = cluster.node_by_port(owner_port).conn();
        assert!(wait_until(Duration::from_secs(10), || ok_text(&mut r, &["INFO", "replication"]).contains("master_link_status:up")));
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        ok(&mut r, &["READONLY"]);
        let mut seen = Value::Nil;
        assert!(
            wait_until(Duration::from_secs(5), || {
                seen = ok(&mut r, &["LEASE.INFO", sem]);
                holders(&seen).iter().map(|h| h.0).collect::<Vec<_>>() == vec![ta, tb]
            }),
            "the replica shows {seen:?}"
        );
        ok(&mut r, &["CLUSTER", "FAILOVER"]);
        assert!(
            wait_until(Duration::from_secs(20), || cluster.master_of(slot).port == replica.port),
            "the failover did not happen"
        );
        let v = cluster.ok(sem, &["LEASE.INFO", sem]);
        assert_eq!(holders(&v).iter().map(|h| h.0).collect::<Vec<_>>(), vec![ta, tb]);
        assert_eq!(int(&cluster.ok(sem, &["LEASE.RELEASE", sem, "a"])), 1);
        let tc = int(&cluster.ok(sem, &["LEASE.ACQUIRE", sem, "c", "60000", "LIMIT", "2"]));
        assert!(tc > tb, "{tc} after {tb}");
        assert_eq!(int(&cluster.ok(rd, &["LEASE.RENEW", rd, "r", "60000"])), 1);
    }
}

full_suite! {
    fn a_guard_moves_with_its_slot_and_guards_on_its_new_master(kind) {
        let mut cluster = Cluster::start(kind, 3, 0);
        let (guard, data) = ("{acct}:lock", "{acct}:balance");
        cluster.ok(data, &["SET", data, "100"]);
        assert_eq!(cluster.ok(guard, &["LEASE.GUARD", guard]), Value::Okay);
        let t = int(&cluster.ok(guard, &["LEASE.ACQUIRE", guard, "me", "60000"]));
        let e = cluster.call(data, &["SET", data, "0"]).expect_err("guarded");
        assert!(error_text(&e).starts_with("FENCED"), "{e:?}");
        // Move the slot, its keys in one MIGRATE, the guard first.
        let slot = cluster.slot_of(guard);
        let Master { id: src_id, port: src_port, .. } = cluster.master_of(slot);
        let Master { id: dst_id, port: dst_port, .. } = cluster.masters().into_iter().find(|m| m.id != src_id).unwrap();
        let mut src = cluster.node_by_port(src_port).conn();
        let mut dst = cluster.node_by_port(dst_port).conn();
        ok(&mut dst, &["CLUSTER", "SETSLOT", &slot.to_string(), "IMPORTING", &src_id]);
        ok(&mut src, &["CLUSTER", "SETSLOT", &slot.to_string(), "MIGRATING", &dst_id]);
        let migrate: Vec<String> = ["MIGRATE", "127.0.0.1", &dst_port.to_string(), "", "0", "5000", "KEYS", guard, data]
            .iter().map(|s| s.to_string()).collect();
        migrate_through(&mut cluster, src_port, &migrate);
        for n in &cluster.nodes {
            let mut c = n.conn();
            let _ = call(&mut c, &[b"CLUSTER", b"SETSLOT", slot.to_string().as_bytes(), b"NODE", dst_id.as_bytes()]);
        }
        assert_eq!(cluster.master_of(slot).port, dst_port);
        assert_eq!(info_int(&mut src, "lease_guards"), 0, "it left the source");
        assert_eq!(info_int(&mut dst, "lease_guards"), 1);
        assert_eq!(cluster.token(guard), Some(t));
        let e = cluster.call(data, &["SET", data, "0"]).expect_err("guarded on the new master");
        assert!(error_text(&e).starts_with("FENCED"), "{e:?}");
        assert_eq!(cluster.ok(guard, &["LEASE.FENCE", guard, &t.to_string(), "INCRBY", data, "1"]), Value::Int(101));
        // A resharding run again restores the guard over itself
        // (MIGRATE ... REPLACE sends RESTORE-ASKING ... REPLACE): it still
        // guards, and is counted once.
        let payload = dump_payload(&mut dst, guard);
        assert_eq!(call(&mut dst, &[b"RESTORE-ASKING", guard.as_bytes(), b"0", &payload, b"REPLACE"]).unwrap(), Value::Okay);
        assert_eq!(info_int(&mut dst, "lease_guards"), 1);
        assert_eq!(field(&ok(&mut dst, &["LEASE.INFO", guard]), "guard"), Some(Value::Int(1)));
        let e = cluster.call(data, &["SET", data, "0"]).expect_err("still guarded");
        assert!(error_text(&e).starts_with("FENCED"), "{e:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(info_int(&mut dst, "lease_guards"), 1, "after the restore's alignment");
        let e = cluster.call(data, &["SET", data, "0"]).expect_err("still guarded");
        assert!(error_text(&e).starts_with("FENCED"), "{e:?}");
    }
}
