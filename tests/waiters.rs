//! `LEASE.WAITERS key [COUNT count]` (design.md S11): the clients waiting
//! for a key, oldest first, exclusive, shared, counting and multi-key
//! waiters alike, with their client id, label, mode, keys, time waited and
//! time to their `BLOCK` timeout; never an owner; an empty list on a
//! replica.
mod common;
use common::*;

use std::time::Duration;

/// One listed waiter: (client, label, mode, limit, keys, waited, timeout).
type Row = (i64, Option<String>, String, i64, i64, i64, i64);

fn rows(c: &mut redis::Connection, args: &[&str]) -> Vec<Row> {
    let Value::Array(list) = ok(c, args) else {
        panic!("{args:?}: not an array")
    };
    list.iter()
        .map(|w| {
            let label = match field(w, "label").unwrap() {
                Value::Nil => None,
                v => Some(text(&v)),
            };
            (
                int(&field(w, "client").unwrap()),
                label,
                text(&field(w, "mode").unwrap()),
                int(&field(w, "limit").unwrap()),
                int(&field(w, "keys").unwrap()),
                int(&field(w, "waited").unwrap()),
                int(&field(w, "timeout").unwrap()),
            )
        })
        .collect()
}

/// The client id of the most recently connected client of `s` whose last
/// command was `cmd` (the waiter just started).
fn newest_client(c: &mut redis::Connection, cmd: &str) -> i64 {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .filter(|l| l.to_ascii_lowercase().contains(&format!("cmd={cmd}")))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(|id| id.parse::<i64>().unwrap())
        .max()
        .expect("a waiting client")
}

every_server! {
    fn waiters_are_listed_oldest_first_with_what_each_waits_for(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "holder", "60000");
        assert!(acquire_opts(&mut c, "sem", "p1", "60000", &["LIMIT", "2"]).is_some());
        assert!(acquire_opts(&mut c, "sem", "p2", "60000", &["LIMIT", "2"]).is_some());
        assert_eq!(rows(&mut c, &["LEASE.WAITERS", "k"]), vec![], "nobody waits");

        let mut ids = Vec::new();
        let a = spawn_blocked(&s, &["LEASE.ACQUIRE", "k", "owner-a-secret", "1000", "LABEL", "job a", "BLOCK", "30000"], "a");
        ids.push(newest_client(&mut c, "lease.acquire"));
        let b = spawn_blocked(&s, &["LEASE.ACQUIRE", "k", "owner-b-secret", "1000", "SHARED", "BLOCK", "0"], "b");
        ids.push(newest_client(&mut c, "lease.acquire"));
        let m = spawn_blocked(&s, &["LEASE.MACQUIRE", "2", "k", "sem", "owner-m-secret", "1000", "LABEL", "both", "BLOCK", "20000"], "m");
        ids.push(newest_client(&mut c, "lease.macquire"));
        let l = spawn_blocked(&s, &["LEASE.ACQUIRE", "sem", "owner-l-secret", "1000", "LIMIT", "2", "LABEL", "permit", "BLOCK", "10000"], "l");
        ids.push(newest_client(&mut c, "lease.acquire"));
        std::thread::sleep(Duration::from_millis(50));

        let on_k = rows(&mut c, &["LEASE.WAITERS", "k"]);
        let shape: Vec<_> = on_k.iter().map(|r| (r.0, r.1.clone(), r.2.clone(), r.3, r.4)).collect();
        assert_eq!(shape, vec![
            (ids[0], Some("job a".into()), "exclusive".into(), 0, 1),
            (ids[1], None, "shared".into(), 0, 1),
            (ids[2], Some("both".into()), "keys".into(), 0, 2),
        ]);
        // Waited: the oldest longest, all at least the 50 ms slept.
        assert!(on_k[0].5 >= on_k[1].5 && on_k[1].5 >= on_k[2].5 && on_k[2].5 >= 50, "{on_k:?}");
        // Time to the BLOCK timeout; -1 for BLOCK 0.
        assert!((29_000..=30_000).contains(&on_k[0].6), "{on_k:?}");
        assert_eq!(on_k[1].6, -1);
        assert!((19_000..=20_000).contains(&on_k[2].6), "{on_k:?}");
        let on_sem = rows(&mut c, &["LEASE.WAITERS", "sem"]);
        let shape: Vec<_> = on_sem.iter().map(|r| (r.0, r.1.clone(), r.2.clone(), r.3, r.4)).collect();
        assert_eq!(shape, vec![
            (ids[2], Some("both".into()), "keys".into(), 0, 2),
            (ids[3], Some("permit".into()), "limit".into(), 2, 1),
        ]);
        // COUNT, and never an owner in the reply.
        assert_eq!(rows(&mut c, &["LEASE.WAITERS", "k", "count", "2"]).len(), 2);
        let raw = s.raw().call(&[b"LEASE.WAITERS", b"k", b"COUNT", b"1000"]);
        assert!(!String::from_utf8_lossy(&raw).contains("secret"), "{raw:?}");
        // Served waiters leave the list, in order.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "holder"])), 1);
        got_token(a);
        let left: Vec<i64> = rows(&mut c, &["LEASE.WAITERS", "k"]).iter().map(|r| r.0).collect();
        assert_eq!(left, vec![ids[1], ids[2]]);
        // A client killed while it waits leaves the list.
        ok(&mut c, &["CLIENT", "KILL", "ID", &ids[1].to_string()]);
        assert!(wait_until(Duration::from_secs(5), || rows(&mut c, &["LEASE.WAITERS", "k"]).len() == 1));
        let _ = b.join();
        for key in ["k", "sem"] {
            for w in rows(&mut c, &["LEASE.WAITERS", key]) {
                ok(&mut c, &["CLIENT", "KILL", "ID", &w.0.to_string()]);
            }
        }
        let _ = (m.join(), l.join());
        assert_eq!(rows(&mut c, &["LEASE.WAITERS", "sem"]), vec![]);
    }

    fn waiters_default_to_ten_and_bad_calls_change_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "holder", "60000");
        let ws: Vec<_> = (0..12)
            .map(|i| spawn_blocked(&s, &["LEASE.ACQUIRE", "k", &format!("w{i}"), "1000", "BLOCK", "5000"], "w"))
            .collect();
        assert_eq!(rows(&mut c, &["LEASE.WAITERS", "k"]).len(), 10);
        assert_eq!(rows(&mut c, &["LEASE.WAITERS", "k", "COUNT", "1000"]).len(), 12);
        for (args, text) in [
            (vec!["LEASE.WAITERS"], "wrong number of arguments"),
            (vec!["LEASE.WAITERS", "k", "COUNT"], "wrong number of arguments"),
            (vec!["LEASE.WAITERS", "k", "COUNT", "0"], "COUNT is out of range (must be 1..1000)"),
            (vec!["LEASE.WAITERS", "k", "COUNT", "1001"], "COUNT is out of range (must be 1..1000)"),
            (vec!["LEASE.WAITERS", "k", "COUNT", "x"], "COUNT is not an integer"),
            (vec!["LEASE.WAITERS", "k", "LIMIT", "3"], "unknown option 'LIMIT'"),
        ] {
            let e = err(&mut c, &args);
            assert!(e.contains(text), "{args:?}: {e}");
        }
        ok(&mut c, &["SET", "plain", "x"]);
        assert!(err(&mut c, &["LEASE.WAITERS", "plain"]).starts_with("WRONGTYPE"));
        assert_eq!(rows(&mut c, &["LEASE.WAITERS", "k"]).len(), 10, "nothing changed");
        // Each is served in arrival order as the one before releases.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "holder"])), 1);
        for (i, w) in ws.into_iter().enumerate() {
            got_token(w);
            assert_eq!(rows(&mut c, &["LEASE.WAITERS", "k", "COUNT", "1000"]).len(), 11 - i);
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", &format!("w{i}")])), 1);
        }
    }

    fn a_replica_lists_no_waiters(kind) {
        let m = Server::start(kind);
        let r = replica_of(kind, &m);
        let mut mc = m.conn();
        acquire(&mut mc, "k", "holder", "60000");
        let w = spawn_waiter(&m, "k", "w", "1000", "10000");
        assert_eq!(rows(&mut mc, &["LEASE.WAITERS", "k"]).len(), 1);
        assert_eq!(int(&ok(&mut mc, &["WAIT", "1", "5000"])), 1);
        let mut rc = r.conn();
        assert_eq!(rows(&mut rc, &["LEASE.WAITERS", "k"]), vec![]);
        assert_eq!(int(&ok(&mut mc, &["LEASE.RELEASE", "k", "holder"])), 1);
        got_token(w);
    }
}
