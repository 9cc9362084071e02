//! Leases and the token clock survive RDB and AOF restarts (with and
//! without the RDB preamble), MIGRATE to another server; future or broken
//! encodings fail cleanly, logged under the `<lease>` prefix (design.md S2,
//! S3).
mod common;
use common::*;

use std::time::Duration;

/// A token far ahead of the wall clock, placed by RESTORE of an edited DUMP
/// payload, so only persisted clock state can keep later tokens above it.
fn plant_token_ahead(c: &mut redis::Connection, key: &str) -> i64 {
    let t = acquire(c, "plant-src", "me", "60000");
    let ahead = t + 5_000_000_000_000; // about two months of tokens ahead
    let payload = with_token(&dump_payload(c, "plant-src"), t, ahead);
    assert_eq!(
        call(c, &[b"RESTORE", key.as_bytes(), b"60000", &payload]).unwrap(),
        Value::Okay
    );
    ok(c, &["DEL", "plant-src"]);
    ahead
}

/// Checks that a restarted server kept lease `k` (owner "a", token `t`,
/// ttl about 60 s) and that every new token exceeds `floor`.
fn check_after_restart(c: &mut redis::Connection, t: i64, floor: i64) {
    assert_eq!(token_of(c, "k"), Some(t), "token kept");
    let ttl = pttl(c, "k");
    assert!(ttl > 30_000 && ttl <= 60_000, "expiry kept: PTTL {ttl}");
    assert!(contended(c, "k"), "another owner cannot take it");
    assert_eq!(
        acquire(c, "k", "a", "60000"),
        t,
        "the owner is kept: idempotent re-acquire"
    );
    let next = acquire(c, "new", "x", "60000");
    assert!(next > floor, "new token {next} must exceed {floor}");
}

fn contended(c: &mut redis::Connection, key: &str) -> bool {
    ok(c, &["LEASE.ACQUIRE", key, "intruder", "1000"]) == Value::Nil
}

full_suite! {
    fn restart_without_persistence_still_issues_larger_tokens(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut last = 0;
        for i in 0..200 {
            last = acquire(&mut c, &format!("k{i}"), "a", "60000");
        }
        let s = s.restart_with(Opts::default());
        let mut c = s.conn();
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0, "nothing persisted");
        // The wall-clock floor: restart took longer than a millisecond.
        assert!(acquire(&mut c, "k0", "b", "60000") > last);
    }

    fn migrate_moves_the_lease_and_raises_the_target_clock(kind) {
        let src = Server::start(kind);
        let dst = Server::start(kind);
        let mut c = src.conn();
        let mut d = dst.conn();
        let ahead = plant_token_ahead(&mut c, "k");
        ok(&mut c, &["PEXPIRE", "k", "60000"]);
        ok(&mut c, &["MIGRATE", "127.0.0.1", &dst.port.to_string(), "k", "0", "5000"]);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "k"])), 0);
        assert_eq!(token_of(&mut d, "k"), Some(ahead));
        assert!(pttl(&mut d, "k") > 30_000);
        assert!(info_int(&mut d, "lease_last_token") >= ahead);
        assert!(acquire(&mut d, "other", "x", "1000") > ahead);
        // The owner came along: it can release on the target.
        // (plant_token_ahead acquired as "me".)
        assert_eq!(int(&ok(&mut d, &["LEASE.RELEASE", "k", "me"])), 1);
    }

}

full_suite! {
    // The module writes the token clock (LEASE.CLOCK) after every fork. Forks
    // happen inside commands (PSYNC of a full sync, BGSAVE, BGREWRITEAOF):
    // propagating from within the fork event made the server propagate the
    // command too, wrapped in MULTI (`MULTI, LEASE.CLOCK, PSYNC, EXEC` in the
    // AOF, which crashed the next start; the replica answered EXECABORT).
    fn forks_inside_commands_leave_only_the_clock_in_the_aof(kind) {
        let aof = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let master = Server::start_with(kind, aof.clone());
        let mut m = master.conn();
        let t = acquire(&mut m, "k", "me", "60000");
        let replica = replica_of(kind, &master);
        let idle = |m: &mut redis::Connection| {
            wait_until(Duration::from_secs(10), || {
                info_value(m, "persistence", "rdb_bgsave_in_progress").as_deref() == Some("0")
                    && info_value(m, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
                    && info_value(m, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
            })
        };
        assert!(idle(&mut m), "the full sync's save never ended");
        ok(&mut m, &["BGSAVE"]);
        assert!(idle(&mut m));
        ok(&mut m, &["BGREWRITEAOF"]);
        assert!(idle(&mut m));
        ok(&mut m, &["WAIT", "1", "2000"]);
        let mut r = replica.conn();
        assert_eq!(token_of(&mut r, "k"), Some(t));
        assert!(!replica.log().contains("EXECABORT"), "{}", replica.log_tail(20));
        let mut text = String::new();
        for entry in std::fs::read_dir(master.data_dir().join("appendonlydir")).unwrap() {
            text.push_str(&String::from_utf8_lossy(&std::fs::read(entry.unwrap().path()).unwrap()));
        }
        for cmd in ["PSYNC", "BGSAVE", "BGREWRITEAOF", "MULTI"] {
            assert!(!text.contains(cmd), "the AOF has {cmd}:\n{text}");
        }
        drop(replica);
        let mut master = master.restart_with(aof);
        master.assert_alive("restart from the AOF", true);
        let mut m = master.conn();
        assert_eq!(token_of(&mut m, "k"), Some(t));
        assert!(acquire(&mut m, "k2", "me", "60000") > t);
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn rdb_restart_keeps_leases_and_the_clock(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "a", "60000");
        let ahead = plant_token_ahead(&mut c, "planted");
        ok(&mut c, &["DEL", "planted"]); // only the aux data remembers it now
        ok(&mut c, &["SAVE"]);
        let s = s.restart_with(Opts::default());
        let mut c = s.conn();
        assert!(contended(&mut c, "k"));
        check_after_restart(&mut c, t, ahead);
    }

    fn aof_restart_keeps_leases_without_a_rewrite(kind) {
        let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let s = Server::start_with(kind, opts.clone());
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "a", "60000");
        let ahead = plant_token_ahead(&mut c, "planted");
        ok(&mut c, &["LEASE.RENEW", "k", "a", "60000"]);
        let s = s.restart_with(opts);
        let mut c = s.conn();
        assert!(contended(&mut c, "k"));
        assert_eq!(token_of(&mut c, "planted"), Some(ahead));
        check_after_restart(&mut c, t, ahead);
    }

    fn aof_rewrite_with_and_without_the_rdb_preamble_keeps_leases(kind) {
        for preamble in ["yes", "no"] {
            let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", preamble]);
            let s = Server::start_with(kind, opts.clone());
            let mut c = s.conn();
            let t = acquire(&mut c, "k", "a", "60000");
            let ahead = plant_token_ahead(&mut c, "planted");
            ok(&mut c, &["BGREWRITEAOF"]);
            assert!(wait_until(Duration::from_secs(10), || {
                let info: String = redis::cmd("INFO").arg("persistence").query(&mut c).unwrap();
                info.contains("aof_rewrite_in_progress:0")
                    && info.contains("aof_rewrite_scheduled:0")
                    && info.contains("aof_last_bgrewrite_status:ok")
            }));
            std::thread::sleep(Duration::from_millis(200));
            let s = s.restart_with(opts);
            let mut c = s.conn();
            assert_eq!(token_of(&mut c, "planted"), Some(ahead), "preamble {preamble}");
            check_after_restart(&mut c, t, ahead);
        }
    }

    fn future_and_broken_encodings_fail_cleanly(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "owner-id", "60000");
        let payload = dump_payload(&mut c, "k");
        let truncated = edit_payload(&payload, |b| {
            let owner_at = b.windows(8).position(|w| w == b"owner-id").unwrap();
            b.truncate(owner_at + 3);
        });
        let owner_too_long = edit_payload(&payload, |b| {
            let owner_at = b.windows(8).position(|w| w == b"owner-id").unwrap();
            b[owner_at - 2] = 9; // claims 9 owner bytes, has 8
        });
        // The record's own version byte and the type's encoding version are
        // raised to versions this build does not know.
        for (what, bad) in [
            ("future record", future_record(&payload, b"owner-id")),
            ("future type", future_type(&payload)),
            ("truncated", truncated),
            ("bad length", owner_too_long),
        ] {
            let e = call(&mut c, &[b"RESTORE", b"bad", b"0", &bad]).expect_err(what);
            assert!(error_text(&e).contains("Bad data format") || error_text(&e).contains("payload"), "{what}: {e}");
            assert_eq!(int(&ok(&mut c, &["EXISTS", "bad"])), 0, "{what}");
        }
        assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
        assert!(s.log().contains("lease"), "the refusal is logged");
    }
}

full_suite! {
    // rdb_load logs with the module's context: the lines about a value it
    // refuses carry `<lease>`, not `<module>`.
    fn rdb_load_log_lines_carry_the_lease_prefix(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "owner-id", "60000");
        let payload = dump_payload(&mut c, "k");
        for (what, bad) in [
            ("future record", future_record(&payload, b"owner-id")),
            ("future type", future_type(&payload)),
        ] {
            let before = s.log().lines().count();
            call(&mut c, &[b"RESTORE", b"bad", b"0", &bad]).expect_err(what);
            assert!(!exists(&mut c, "bad"), "{what}");
            let log = s.log();
            let lines: Vec<&str> = log
                .lines()
                .skip(before)
                .filter(|l| l.contains("lease value"))
                .collect();
            assert!(
                !lines.is_empty(),
                "{what}: no log line about the lease value:\n{log}"
            );
            for l in lines {
                assert!(
                    l.contains("<lease>") && !l.contains("<module>"),
                    "{what}: {l}"
                );
            }
        }
    }
}
