//! The owner id is a credential: SLOWLOG and MONITOR never show it for
//! LEASE.ACQUIRE, LEASE.RENEW and LEASE.RELEASE (the server's argument
//! redaction, as for AUTH), while replication and the AOF still carry it
//! intact and apply every effect.
mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const OWNER: &str = "owner-secret-7f3a";

/// ACQUIRE, re-acquire, RENEW and RELEASE on `k`, and a lease kept on `kept`.
fn lease_calls(c: &mut redis::Connection) -> i64 {
    let t = acquire(c, "k", OWNER, "60000");
    assert_eq!(acquire(c, "k", OWNER, "60000"), t);
    assert_eq!(int(&ok(c, &["LEASE.RENEW", "k", OWNER, "30000"])), 1);
    assert_eq!(int(&ok(c, &["LEASE.RELEASE", "k", OWNER])), 1);
    acquire(c, "kept", OWNER, "60000")
}

fn slowlog_text(c: &mut redis::Connection) -> String {
    format!("{:?}", ok(c, &["SLOWLOG", "GET", "100"]))
}

/// Everything MONITOR printed while `f` ran, read for at most 2 s after.
fn monitored(s: &Server, f: impl FnOnce()) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    stream.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "+OK\r\n");
    f();
    let mut seen = String::new();
    let start = Instant::now();
    // At most 2 s, and at most 10,000 lines.
    for _ in 0..10_000 {
        if start.elapsed() >= Duration::from_secs(2) {
            break;
        }
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {
                seen.push_str(&line);
                if line.contains("\"PING\"") || line.contains("\"ping\"") {
                    break; // the marker sent last
                }
            }
            Err(_) => {}
        }
    }
    seen
}

/// LIMIT and SHARED holdings of `OWNER`: acquire, re-acquire, renew,
/// release, and one holder that ends and is dropped by the master.
fn holder_calls(c: &mut redis::Connection) {
    for (key, opts) in [("sem", &["LIMIT", "3"][..]), ("rd", &["SHARED"])] {
        let t = acquire_opts(c, key, OWNER, "60000", opts).unwrap();
        assert_eq!(acquire_opts(c, key, OWNER, "60000", opts), Some(t));
        assert_eq!(int(&ok(c, &["LEASE.RENEW", key, OWNER, "30000"])), 1);
        assert_eq!(int(&ok(c, &["LEASE.RELEASE", key, OWNER])), 1);
        acquire_opts(c, key, OWNER, "60000", opts).unwrap();
    }
    let brief = format!("{OWNER}-brief");
    acquire_opts(c, "sem", &brief, "1", &["LIMIT", "3"]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(10));
    acquire_opts(c, "sem", "other", "60000", &["LIMIT", "3"]).unwrap(); // drops brief
}

full_suite! {
    fn the_owner_of_a_holding_stays_out_of_slowlog_and_monitor(kind) {
        let master = Server::start(kind);
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let mut r = replica.conn();
        ok(&mut r, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        ok(&mut m, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        let shown = monitored(&replica, || {
            holder_calls(&mut m);
            ok(&mut m, &["WAIT", "1", "5000"]);
            ok(&mut r, &["PING"]);
        });
        assert!(shown.to_lowercase().contains("lease.hold"), "the replica applied LEASE.HOLD:\n{shown}");
        assert!(shown.to_lowercase().contains("lease.drop"), "and LEASE.DROP:\n{shown}");
        assert!(!shown.contains(OWNER), "the replica's MONITOR shows the owner:\n{shown}");
        for (who, c) in [("master", &mut m), ("replica", &mut r)] {
            let log = slowlog_text(c);
            assert!(!log.contains(OWNER), "{who}'s SLOWLOG shows the owner: {log}");
        }
        assert!(slowlog_text(&mut r).to_lowercase().contains("lease.hold"));
        // The owner reached the replica intact: promoted, it renews.
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        for key in ["sem", "rd"] {
            assert_eq!(int(&ok(&mut r, &["LEASE.RENEW", key, OWNER, "60000"])), 1, "{key}");
        }
        let brief = format!("{OWNER}-brief");
        assert_eq!(int(&ok(&mut r, &["LEASE.RENEW", "sem", &brief, "60000"])), 0, "dropped");
    }

    fn slowlog_and_monitor_show_no_owner(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        ok(&mut c, &["SLOWLOG", "RESET"]);
        let shown = monitored(&s, || {
            lease_calls(&mut c);
            ok(&mut c, &["PING"]);
        });
        for cmd in ["lease.acquire", "lease.renew", "lease.release"] {
            assert!(shown.to_lowercase().contains(cmd), "MONITOR missed {cmd}:\n{shown}");
        }
        assert!(!shown.contains(OWNER), "MONITOR shows the owner:\n{shown}");
        assert!(shown.contains("redacted"), "{shown}");
        let log = slowlog_text(&mut c);
        assert!(log.to_lowercase().contains("lease.release"), "{log}");
        assert!(!log.contains(OWNER), "SLOWLOG shows the owner: {log}");
        // Errors too: a call refused for a bad ttl still hides its owner.
        ok(&mut c, &["SLOWLOG", "RESET"]);
        err(&mut c, &["LEASE.ACQUIRE", "k", OWNER, "nope"]);
        assert!(!slowlog_text(&mut c).contains(OWNER));
    }

    fn a_replica_and_an_aof_replay_still_apply_every_effect(kind) {
        let aof = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let master = Server::start_with(kind, aof.clone());
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let mut r = replica.conn();
        // The replica's own SLOWLOG and MONITOR hide the owner of what it applies.
        ok(&mut r, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        let kept = lease_calls(&mut m);
        ok(&mut m, &["WAIT", "1", "5000"]);
        assert!(wait_until(Duration::from_secs(5), || {
            token_of(&mut r, "kept") == Some(kept)
        }));
        assert_eq!(ok(&mut r, &["LEASE.INFO", "k"]), Value::Nil, "the release reached the replica");
        assert!(!slowlog_text(&mut r).contains(OWNER));
        // The replica holds the real owner: promoted, it lets the holder renew.
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        assert_eq!(int(&ok(&mut r, &["LEASE.RENEW", "kept", OWNER, "60000"])), 1);
        // AOF replay: the same state after a kill -9.
        let master = master.restart_with(aof);
        let mut m = master.conn();
        assert_eq!(token_of(&mut m, "kept"), Some(kept));
        assert_eq!(ok(&mut m, &["LEASE.INFO", "k"]), Value::Nil);
        assert_eq!(int(&ok(&mut m, &["LEASE.RELEASE", "kept", OWNER])), 1);
    }
}
