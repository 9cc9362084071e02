//! LEASE.FENCE key token [MINTTL ms] [command [arg ...]] (design.md S11):
//! with MINTTL, a current token whose lease (for a counting or shared
//! lease, whose holding) has less than `ms` left at the decision's time is
//! refused with EXPIRING and nothing runs; `ms` left exactly passes. STALE
//! is checked first. Counted as `fence_expiring`. The edge is tested inside
//! one MULTI/EXEC, where the command time is frozen on every server.
mod common;
use common::*;

/// `(fence_ok, fence_stale, fence_expiring)` of `INFO lease`.
fn fence_counts(c: &mut redis::Connection) -> (i64, i64, i64) {
    (
        info_int(c, "lease_fence_ok"),
        info_int(c, "lease_fence_stale"),
        info_int(c, "lease_fence_expiring"),
    )
}

/// The ms left that an EXPIRING error names, and its MINTTL.
fn expiring(e: &str) -> (i64, i64) {
    let rest = e
        .strip_prefix("EXPIRING lease has ")
        .unwrap_or_else(|| panic!("not an EXPIRING error: {e}"));
    let (left, rest) = rest.split_once(" ms left, less than MINTTL ").expect(e);
    let min: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (left.parse().expect(e), min.parse().expect(e))
}

fn server_error(v: &Value) -> String {
    match v {
        Value::ServerError(e) => format!("{} {}", e.code(), e.details().unwrap_or_default()),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

every_server! {
    fn minttl_equal_to_the_time_left_passes_and_one_more_refuses_in_one_exec(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "5000").to_string();
        let before = fence_counts(&mut c);
        // In one EXEC the command time is frozen: the renewal sets exactly
        // 5000 ms left at that time, and every fence after it sees 5000.
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .ignore_errors()
            .cmd("LEASE.RENEW").arg("lock").arg("me").arg(5000)
            .cmd("LEASE.FENCE").arg("lock").arg(&t).arg("MINTTL").arg(5000)
            .cmd("LEASE.FENCE").arg("lock").arg(&t).arg("MINTTL").arg(5001)
            .cmd("LEASE.FENCE").arg("lock").arg(&t).arg("MINTTL").arg(5000).arg("SET").arg("ran:5000").arg("1")
            .cmd("LEASE.FENCE").arg("lock").arg(&t).arg("MINTTL").arg(5001).arg("SET").arg("ran:5001").arg("1")
            .cmd("LEASE.FENCE").arg("lock").arg(&t).arg("MINTTL").arg(0)
            .query(&mut c)
            .expect("EXEC");
        assert_eq!(replies[0], Value::Int(1), "renewed");
        assert_eq!(replies[1], Value::Okay, "exactly MINTTL left passes");
        assert_eq!(server_error(&replies[2]), "EXPIRING lease has 5000 ms left, less than MINTTL 5001");
        assert_eq!(replies[3], Value::Okay, "the fenced SET ran");
        assert_eq!(server_error(&replies[4]), "EXPIRING lease has 5000 ms left, less than MINTTL 5001");
        assert_eq!(replies[5], Value::Okay);
        assert!(exists(&mut c, "ran:5000"));
        assert!(!exists(&mut c, "ran:5001"), "the refused fence ran its SET");
        let after = fence_counts(&mut c);
        assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (3, 0, 2), "(ok, stale, expiring)");
    }

    fn a_fence_refused_with_expiring_runs_nothing_and_counts_only_as_fence_expiring(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        ok(&mut c, &["SET", "n", "7"]);
        let before = fence_counts(&mut c);
        for inner in [&["INCR", "n"][..], &["SET", "n", "0"], &["DEL", "n"], &["RPUSH", "log", "x"]] {
            let mut args = vec!["LEASE.FENCE", "lock", &t, "MINTTL", "60000"];
            args.extend_from_slice(inner);
            let e = err(&mut c, &args);
            let (left, min) = expiring(&e);
            assert!((0..=30000).contains(&left) && min == 60000, "{inner:?}: {e}");
        }
        let e = err(&mut c, &["LEASE.FENCE", "lock", &t, "MINTTL", "60000"]);
        assert!(e.starts_with("EXPIRING lease has "), "the check alone: {e}");
        assert_eq!(ok_text(&mut c, &["GET", "n"]), "7", "no fenced write ran");
        assert!(!exists(&mut c, "log"));
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 2, "lock and n only");
        let after = fence_counts(&mut c);
        assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (0, 0, 5), "(ok, stale, expiring)");
        // With enough time left it runs, and counts as fence_ok.
        assert_eq!(int(&ok(&mut c, &["LEASE.FENCE", "lock", &t, "MINTTL", "1000", "INCR", "n"])), 8);
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "lock", &t, "minttl", "1000"]), Value::Okay, "any case");
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "lock", &t, "MinTtl", "0"]), Value::Okay);
        let last = fence_counts(&mut c);
        assert_eq!((last.0 - after.0, last.1 - after.1, last.2 - after.2), (3, 0, 0));
        // The lease itself is untouched by a refusal.
        assert_eq!(token_of(&mut c, "lock"), Some(t.parse().unwrap()));
    }

    fn minttl_looks_at_the_holding_of_the_token_on_counting_and_shared_leases(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // LIMIT 2: `long` holds for 30 s, `short` for 2 s. The key lives as
        // long as `long`, but `short`'s token has its own time.
        let long = acquire_opts(&mut c, "pool", "long", "30000", &["LIMIT", "2"]).unwrap().to_string();
        let short = acquire_opts(&mut c, "pool", "short", "2000", &["LIMIT", "2"]).unwrap().to_string();
        let e = err(&mut c, &["LEASE.FENCE", "pool", &short, "MINTTL", "5000", "SET", "w", "short"]);
        let (left, _) = expiring(&e);
        assert!(left <= 2000, "{e}");
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "pool", &long, "MINTTL", "5000", "SET", "w", "long"]), Value::Okay);
        assert_eq!(ok_text(&mut c, &["GET", "w"]), "long");
        // SHARED: the same per reader, for reads.
        let r_long = acquire_opts(&mut c, "rw", "r1", "30000", &["SHARED"]).unwrap().to_string();
        let r_short = acquire_opts(&mut c, "rw", "r2", "2000", &["SHARED"]).unwrap().to_string();
        let e = err(&mut c, &["LEASE.FENCE", "rw", &r_short, "MINTTL", "5000", "GET", "w"]);
        assert!(expiring(&e).0 <= 2000, "{e}");
        assert_eq!(ok_text(&mut c, &["LEASE.FENCE", "rw", &r_long, "MINTTL", "5000", "GET", "w"]), "long");
        // A reader's token with a write: the token's check (EXPIRING) comes
        // before the reader's refusal of writes.
        let e = err(&mut c, &["LEASE.FENCE", "rw", &r_short, "MINTTL", "5000", "SET", "w", "x"]);
        assert!(e.starts_with("EXPIRING"), "{e}");
        let e = err(&mut c, &["LEASE.FENCE", "rw", &r_long, "MINTTL", "5000", "SET", "w", "x"]);
        assert!(e.contains("a SHARED holder's token cannot fence a write command"), "{e}");
        assert_eq!(ok_text(&mut c, &["GET", "w"]), "long");
    }

    fn bad_minttl_values_are_refused_naming_minttl_and_change_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        let before = fence_counts(&mut c);
        for (ms, expect) in [
            ("-1", "ERR MINTTL is out of range (must be 0..1000000000000)"),
            ("1000000000001", "ERR MINTTL is out of range (must be 0..1000000000000)"),
            ("soon", "ERR MINTTL is not an integer"),
            ("1.5", "ERR MINTTL is not an integer"),
            ("", "ERR MINTTL is not an integer"),
            ("+5", "ERR MINTTL is not an integer"),
        ] {
            assert_eq!(err(&mut c, &["LEASE.FENCE", "lock", &t, "MINTTL", ms, "SET", "x", "1"]), expect, "MINTTL {ms:?}");
            assert_eq!(err(&mut c, &["LEASE.FENCE", "lock", &t, "MINTTL", ms]), expect, "MINTTL {ms:?}");
        }
        assert_eq!(err(&mut c, &["LEASE.FENCE", "lock", &t, "MINTTL"]), "ERR option MINTTL needs a value");
        assert_eq!(
            err(&mut c, &["LEASE.FENCE", "lock", "x", "MINTTL", "-1"]),
            "ERR token is not an integer",
            "the token is checked first"
        );
        // MINTTL is an option right after the token only: a second one,
        // or one further on, is the fenced command or its argument.
        let e = err(&mut c, &["LEASE.FENCE", "lock", &t, "MINTTL", "5", "MINTTL", "5"]);
        assert_eq!(e, "ERR LEASE.FENCE: unknown command 'MINTTL'");
        assert_eq!(int(&ok(&mut c, &["LEASE.FENCE", "lock", &t, "RPUSH", "l", "MINTTL", "99999999"])), 2);
        assert_eq!(strings(&ok(&mut c, &["LRANGE", "l", "0", "-1"])), ["MINTTL", "99999999"]);
        assert!(!exists(&mut c, "x"), "no refused call ran its SET");
        let after = fence_counts(&mut c);
        assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (1, 0, 0), "only the RPUSH counted");
    }

    fn stale_wins_over_expiring(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000");
        let before = fence_counts(&mut c);
        let huge = "1000000000000";
        // Another token, whatever MINTTL.
        let e = err(&mut c, &["LEASE.FENCE", "lock", &(t - 1).to_string(), "MINTTL", huge, "SET", "x", "1"]);
        assert!(e.starts_with("STALE"), "{e}");
        // A released lease, a free key.
        ok(&mut c, &["LEASE.RELEASE", "lock", "me"]);
        let e = err(&mut c, &["LEASE.FENCE", "lock", &t.to_string(), "MINTTL", huge]);
        assert!(e.starts_with("STALE"), "{e}");
        // An expired lease.
        let t2 = acquire(&mut c, "lock", "me", "50").to_string();
        assert!(wait_until(std::time::Duration::from_secs(2), || token_of(&mut c, "lock").is_none()));
        let e = err(&mut c, &["LEASE.FENCE", "lock", &t2, "MINTTL", "1", "SET", "x", "1"]);
        assert!(e.starts_with("STALE"), "{e}");
        assert!(!exists(&mut c, "x"));
        let after = fence_counts(&mut c);
        assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (0, 3, 0), "(ok, stale, expiring)");
    }

    fn a_script_aborted_by_expiring_makes_none_of_its_writes(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        ok(&mut c, &["HSET", "acct:7", "balance", "90"]);
        // The check first, then the write: EXPIRING aborts before it.
        let check_then_write = "redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'MINTTL', ARGV[2]); redis.call('HINCRBY', KEYS[2], 'balance', 5); return 1";
        let e = err(&mut c, &["EVAL", check_then_write, "2", "lock", "acct:7", &t, "60000"]);
        assert!(e.starts_with("EXPIRING lease has "), "{e}");
        assert_eq!(ok_text(&mut c, &["HGET", "acct:7", "balance"]), "90");
        // The command form: its write does not run, nor any after it.
        let fenced_then_write = "redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'MINTTL', ARGV[2], 'HINCRBY', KEYS[2], 'balance', 5); redis.call('SET', KEYS[3], 'done'); return 1";
        let e = err(&mut c, &["EVAL", fenced_then_write, "3", "lock", "acct:7", "after", &t, "60000"]);
        assert!(e.starts_with("EXPIRING lease has "), "{e}");
        assert_eq!(ok_text(&mut c, &["HGET", "acct:7", "balance"]), "90");
        assert!(!exists(&mut c, "after"));
        // With enough time left, both scripts run.
        assert_eq!(int(&ok(&mut c, &["EVAL", check_then_write, "2", "lock", "acct:7", &t, "1000"])), 1);
        assert_eq!(int(&ok(&mut c, &["EVAL", fenced_then_write, "3", "lock", "acct:7", "after", &t, "1000"])), 1);
        assert_eq!(ok_text(&mut c, &["HGET", "acct:7", "balance"]), "100");
        assert_eq!(ok_text(&mut c, &["GET", "after"]), "done");
    }

    fn the_fenced_commands_keys_are_found_after_minttl(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let keys = |c: &mut redis::Connection, args: &[&str]| {
            let mut full = vec!["COMMAND", "GETKEYS", "LEASE.FENCE", "lock", "1"];
            full.extend(args);
            strings(&ok(c, &full))
        };
        assert_eq!(keys(&mut c, &["MINTTL", "500"]), ["lock"]);
        assert_eq!(keys(&mut c, &["MINTTL", "500", "HSET", "acct", "f", "v"]), ["lock", "acct"]);
        assert_eq!(keys(&mut c, &["minttl", "500", "MSET", "a", "1", "b", "2"]), ["lock", "a", "b"]);
        assert_eq!(keys(&mut c, &["RPUSH", "l", "MINTTL", "5"]), ["lock", "l"]);
    }
}
