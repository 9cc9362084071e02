//! design.md S2: fencing tokens are integers in 1..=2^53-1 and strictly
//! increase per key across every acquisition, whatever happened in between:
//! a restored token more than a year ahead of the clock is refused, and an
//! AOF rewrite without the RDB preamble keeps the clock.
mod common;
use common::*;
use std::time::Duration;

/// `acquire`, checking the token is in 1..=2^53-1.
fn acquire_in_range(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str) -> i64 {
    let t = acquire(c, key, owner, ttl);
    assert!((1..=MAX_TOKEN).contains(&t), "token {t} out of 1..=2^53-1");
    t
}

fn assert_increasing(tokens: &[i64], what: &str) {
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "{what}: tokens not strictly increasing: {tokens:?}"
        );
    }
}

full_suite! {
    fn tokens_are_in_range_and_exact_in_a_double(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire_in_range(&mut c, "k", "me", "60000");
        // Exactly representable in an IEEE double (JavaScript numbers).
        assert_eq!((t as f64) as i64, t);
        assert_eq!(info_int(&mut c, "lease_last_token"), t);
    }

    fn tokens_increase_across_release_expiry_del_unlink_and_flush(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut seen = vec![acquire_in_range(&mut c, "k", "a", "60000")];

        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        seen.push(acquire_in_range(&mut c, "k", "b", "100"));

        // Expiry.
        assert!(wait_until(Duration::from_secs(10), || {
            ok(&mut c, &["LEASE.INFO", "k"]) == Value::Nil
        }));
        seen.push(acquire_in_range(&mut c, "k", "a", "60000"));

        assert_eq!(int(&ok(&mut c, &["DEL", "k"])), 1);
        seen.push(acquire_in_range(&mut c, "k", "b", "60000"));

        assert_eq!(int(&ok(&mut c, &["UNLINK", "k"])), 1);
        seen.push(acquire_in_range(&mut c, "k", "a", "60000"));

        ok(&mut c, &["FLUSHALL"]);
        seen.push(acquire_in_range(&mut c, "k", "b", "60000"));

        ok(&mut c, &["FLUSHALL", "ASYNC"]);
        seen.push(acquire_in_range(&mut c, "k", "a", "60000"));

        ok(&mut c, &["FLUSHDB"]);
        seen.push(acquire_in_range(&mut c, "k", "b", "60000"));

        ok(&mut c, &["FLUSHDB", "SYNC"]);
        seen.push(acquire_in_range(&mut c, "k", "a", "60000"));

        // Overwritten by another type, then freed.
        ok(&mut c, &["SET", "k", "v"]);
        ok(&mut c, &["DEL", "k"]);
        seen.push(acquire_in_range(&mut c, "k", "b", "60000"));

        // Through a DEBUG RELOAD (RDB save and load of the token clock).
        ok(&mut c, &["DEL", "k"]);
        assert_eq!(ok(&mut c, &["DEBUG", "RELOAD"]), Value::Okay);
        seen.push(acquire_in_range(&mut c, "k", "a", "60000"));

        assert_increasing(&seen, "one key");
        assert_eq!(info_int(&mut c, "lease_last_token"), *seen.last().unwrap());
    }

    fn tokens_increase_across_keys_and_databases(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut seen = Vec::new();
        for i in 0..20 {
            seen.push(acquire_in_range(&mut c, &format!("k{i}"), "me", "60000"));
        }
        ok(&mut c, &["SELECT", "3"]);
        seen.push(acquire_in_range(&mut c, "k0", "me", "60000"));
        ok(&mut c, &["SELECT", "0"]);
        seen.push(acquire_in_range(&mut c, "other", "me", "60000"));
        // A second connection shares the server's one clock.
        let mut c2 = s.conn3();
        seen.push(acquire_in_range(&mut c2, "third", "me", "60000"));
        seen.push(acquire_in_range(&mut c, "fourth", "me", "60000"));
        assert_increasing(&seen, "many keys");
    }

    fn reacquire_returns_the_same_token_and_issues_none(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire_in_range(&mut c, "k", "me", "60000");
        for ttl in ["1000", "60000", "5"] {
            assert_eq!(acquire_in_range(&mut c, "k", "me", ttl), t);
        }
        ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "60000"]);
        assert_eq!(info_int(&mut c, "lease_last_token"), t);
        let next = acquire_in_range(&mut c, "other", "me", "60000");
        assert!(next > t);
    }

    fn contended_acquire_does_not_consume_a_token(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire_in_range(&mut c, "k", "alice", "60000");
        for i in 0..50 {
            let owner = format!("bob{i}");
            assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "k", &owner, "60000"]), Value::Nil);
        }
        assert_eq!(info_int(&mut c, "lease_last_token"), t);
        // Failed renews, releases and fences issue nothing either.
        ok(&mut c, &["LEASE.RENEW", "k", "bob", "1000"]);
        ok(&mut c, &["LEASE.RELEASE", "k", "bob"]);
        ok(&mut c, &["LEASE.RENEW", "k", "alice", "1000"]);
        ok(&mut c, &["LEASE.FENCE", "k", &t.to_string()]);
        ok(&mut c, &["LEASE.INFO", "k"]);
        assert_eq!(info_int(&mut c, "lease_last_token"), t);
        let info = ok(&mut c, &["LEASE.INFO", "k"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(t)));
    }

    fn copies_do_not_hold_back_the_clock(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // A lease restored from a dump keeps its token; the next new token
        // is still larger than every token seen.
        let t = acquire_in_range(&mut c, "src", "me", "60000");
        let payload = ok(&mut c, &["DUMP", "src"]);
        let Value::BulkString(payload) = payload else { panic!("{payload:?}") };
        ok(&mut c, &["DEL", "src"]);
        let later = acquire_in_range(&mut c, "x", "me", "60000");
        assert!(call(&mut c, &[b"RESTORE", b"src", b"60000", &payload]).is_ok());
        let info = ok(&mut c, &["LEASE.INFO", "src"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(t)));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "src", "me"])), 1);
        let next = acquire_in_range(&mut c, "src", "me", "60000");
        assert!(next > later && later > t);
    }
}

full_suite! {
    fn restore_of_a_larger_token_raises_the_clock(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire_in_range(&mut c, "src", "me", "60000");
        let ahead = t + 1_000_000_000_000; // about 11 days of tokens ahead
        let payload = with_token(&dump_payload(&mut c, "src"), t, ahead);
        assert_eq!(
            call(&mut c, &[b"RESTORE", b"dst", b"60000", &payload]).unwrap(),
            Value::Okay
        );
        let info = ok(&mut c, &["LEASE.INFO", "dst"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(ahead)));
        assert!(info_int(&mut c, "lease_last_token") >= ahead);
        // Every later acquisition, on any key, is above the restored token.
        let next = acquire_in_range(&mut c, "fresh", "me", "60000");
        assert!(next > ahead, "{next} after restoring {ahead}");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "dst", "me"])), 1);
        assert!(acquire_in_range(&mut c, "dst", "me", "60000") > next);
        // And the raised clock survives a DEBUG RELOAD.
        ok(&mut c, &["DEBUG", "RELOAD"]);
        let after = acquire_in_range(&mut c, "after-reload", "me", "60000");
        assert!(after > next, "{after} after reload, {next} before");
    }

    fn tokens_never_exceed_2_pow_53_minus_1(kind) {
        // A RESTORE cannot raise the clock that far (a token more than a
        // year ahead of the clock is refused), but the AOF and the master
        // are trusted: bring a lease with token 2^53-1 in through an AOF.
        let aof = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let s = Server::start_with(kind, aof.clone());
        let mut c = s.conn();
        let t = acquire_in_range(&mut c, "max", "me", "60000");
        let src = acquire_in_range(&mut c, "src", "me", "60000");
        let dir = s.data_dir().join("appendonlydir");
        let s = s.restart_with(Opts::default().extra(&["--appendonly", "no"]));
        drop(s.conn());
        let mut edited = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            if text.contains(&t.to_string()) {
                // Same number of digits, so the RESP lengths still hold.
                assert_eq!(t.to_string().len(), MAX_TOKEN.to_string().len());
                std::fs::write(&p, text.replace(&t.to_string(), &MAX_TOKEN.to_string())).unwrap();
                edited += 1;
            }
        }
        assert_eq!(edited, 1, "the AOF holds the lease's APPLY");
        let s = s.restart_with(aof);
        let mut c = s.conn();
        let payload = with_token(&dump_payload(&mut c, "src"), src, MAX_TOKEN);
        let info = ok(&mut c, &["LEASE.INFO", "max"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(MAX_TOKEN)));
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "max", &MAX_TOKEN.to_string()]), Value::Okay);
        // No token can be issued any more: a new acquisition is refused
        // rather than answered with a token that is too big or not larger.
        match call(&mut c, &[b"LEASE.ACQUIRE", b"fresh", b"me", b"60000"]) {
            Ok(v) => panic!("ACQUIRE after token 2^53-1 answered {v:?}"),
            Err(e) => assert!(error_text(&e).to_lowercase().contains("token"), "{}", error_text(&e)),
        }
        assert_eq!(int(&ok(&mut c, &["EXISTS", "fresh"])), 0);
        // The holder of the last lease can still use and give it back.
        assert_eq!(int(&ok(&mut c, &["LEASE.ACQUIRE", "max", "me", "60000"])), MAX_TOKEN);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "max", "me"])), 1);
        // A payload with a token above 2^53-1 is refused, not trusted.
        let bad = with_token(&payload, MAX_TOKEN, MAX_TOKEN + 1);
        assert!(call(&mut c, &[b"RESTORE", b"bad", b"60000", &payload]).is_err(), "2^53-1 is too far ahead");
        assert!(call(&mut c, &[b"RESTORE", b"bad", b"60000", &bad]).is_err());
        assert_eq!(int(&ok(&mut c, &["EXISTS", "bad"])), 0);
        assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn many_pipelined_acquisitions_strictly_increase(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // 2000 different keys in one pipeline.
        let mut p = redis::pipe();
        for i in 0..2000 {
            p.cmd("LEASE.ACQUIRE").arg(format!("key:{i}")).arg("me").arg(60000);
        }
        let tokens: Vec<i64> = p.query(&mut c).expect("pipeline");
        assert_eq!(tokens.len(), 2000);
        assert!(tokens.iter().all(|t| (1..=MAX_TOKEN).contains(t)));
        assert_increasing(&tokens, "2000 keys");

        // 1000 acquire/release rounds on one key in one pipeline.
        let mut p = redis::pipe();
        for i in 0..1000 {
            let owner = format!("owner{i}");
            p.cmd("LEASE.ACQUIRE").arg("hot").arg(&owner).arg(60000);
            p.cmd("LEASE.RELEASE").arg("hot").arg(&owner);
        }
        let replies: Vec<i64> = p.query(&mut c).expect("pipeline");
        let hot: Vec<i64> = replies.iter().step_by(2).copied().collect();
        assert!(replies.iter().skip(1).step_by(2).all(|r| *r == 1), "every release succeeds");
        assert!(hot[0] > *tokens.last().unwrap());
        assert_increasing(&hot, "1000 rounds on one key");
        assert_eq!(info_int(&mut c, "lease_last_token"), *hot.last().unwrap());
    }
}

const DAY_MS: i64 = 24 * 3600 * 1000;

/// A field of `INFO persistence` as a string.
fn persistence_field(c: &mut redis::Connection, name: &str) -> String {
    info_value(c, "persistence", name)
        .unwrap_or_else(|| panic!("INFO persistence has no field {name}"))
}

fn no_rewrite_running(c: &mut redis::Connection) -> bool {
    persistence_field(c, "aof_rewrite_in_progress") == "0"
        && persistence_field(c, "aof_rewrite_scheduled") == "0"
}

/// An AOF rewrite without the RDB preamble writes the leases as commands, and
/// the token clock too (module aux data exists only in RDB): after a restart on
/// that AOF, new tokens stay above every token issued or seen before, instead
/// of falling back to the wall clock (or the largest surviving lease).
/// `keep_live`: one lease, with an ordinary token, survives too.
fn tokens_stay_ahead_after_an_aof_rewrite_without_preamble(kind: Kind, keep_live: bool) {
    let opts = Opts::default().extra(&[
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        "no",
        "--appendfsync",
        "always",
    ]);
    let s = Server::start_with(kind, opts.clone());
    let mut c = s.conn();
    let t = acquire(&mut c, "k", "a", "60000");
    let ahead = (now_ms() + DAY_MS) * 1024;
    let payload = with_token(&dump_payload(&mut c, "k"), t, ahead);
    assert_eq!(
        call(&mut c, &[b"RESTORE", b"k2", b"60000", &payload]).unwrap(),
        Value::Okay
    );
    let floor = info_int(&mut c, "lease_last_token");
    assert!(floor >= ahead, "lease_last_token {floor} below {ahead}");
    ok(&mut c, &["DEL", "k2"]);
    if !keep_live {
        ok(&mut c, &["DEL", "k"]);
    }

    assert!(
        wait_until(Duration::from_secs(10), || no_rewrite_running(&mut c)),
        "an earlier rewrite never finished"
    );
    let rewrites: i64 = persistence_field(&mut c, "aof_rewrites").parse().unwrap();
    ok(&mut c, &["BGREWRITEAOF"]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            no_rewrite_running(&mut c)
                && persistence_field(&mut c, "aof_last_bgrewrite_status") == "ok"
                && persistence_field(&mut c, "aof_rewrites")
                    .parse::<i64>()
                    .unwrap()
                    > rewrites
        }),
        "BGREWRITEAOF never completed"
    );

    let s = s.restart_with(opts);
    let mut c = s.conn();
    if keep_live {
        assert_eq!(token_of(&mut c, "k"), Some(t), "the live lease survived");
    } else {
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
    }
    let next = acquire(&mut c, "new", "x", "60000");
    assert!(
        next > floor,
        "token {next} after the rewrite and restart, {floor} was issued or seen before"
    );
}

full_suite! {
    // RESTORE (or any load from a client) of a lease whose token is more than
    // one year ahead of the wall clock is refused and logged: such a token,
    // near 2^53-1, would raise the server-wide clock there and leave every
    // later LEASE.ACQUIRE on any key with "fencing tokens exhausted". One a day
    // ahead is still accepted and raises the clock.
    fn restore_refuses_a_token_far_ahead_of_the_clock(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "o", "60000");
        let payload = dump_payload(&mut c, "k");
        let log_before = s.log().len();
        for (what, bad) in [
            ("2^53-1", MAX_TOKEN),
            ("400 days ahead", (now_ms() + 400 * DAY_MS) * 1024),
        ] {
            let edited = with_token(&payload, t, bad);
            match call(&mut c, &[b"RESTORE", b"k2", b"0", &edited]) {
                Ok(v) => panic!(
                    "RESTORE of token {bad} ({what}) should be refused, got {v:?}; lease_last_token is now {}",
                    info_int(&mut c, "lease_last_token")
                ),
                Err(e) => assert!(e.code().is_some(), "{what}: an error reply, got {e}"),
            }
            assert_eq!(int(&ok(&mut c, &["EXISTS", "k2"])), 0, "{what}");
        }
        let fresh = match call(&mut c, &[b"LEASE.ACQUIRE", b"fresh", b"o", b"1000"]) {
            Ok(Value::Int(f)) => f,
            other => panic!("LEASE.ACQUIRE after the refused RESTOREs: {other:?}"),
        };
        assert!(fresh > t);
        let last = info_int(&mut c, "lease_last_token");
        assert!(last < MAX_TOKEN, "lease_last_token {last}");
        let log = s.log();
        let new_lines = &log[log_before.min(log.len())..];
        assert!(
            new_lines.lines().any(|l| {
                let l = l.to_lowercase();
                l.contains("token")
                    && ["ahead", "future", "clock", "year"]
                        .iter()
                        .any(|w| l.contains(w))
            }),
            "no log line says why the token was refused; log tail:\n{}",
            s.log_tail(20)
        );

        let day = (now_ms() + DAY_MS) * 1024;
        assert_eq!(
            call(
                &mut c,
                &[b"RESTORE", b"k3", b"0", &with_token(&payload, t, day)]
            )
            .unwrap(),
            Value::Okay,
            "a token one day ahead is accepted"
        );
        assert_eq!(token_of(&mut c, "k3"), Some(day));
        assert!(info_int(&mut c, "lease_last_token") >= day);
        assert!(acquire(&mut c, "after", "o", "1000") > day);
    }

    // No lease survives the rewrite.
    fn aof_rewrite_without_preamble_keeps_the_clock(kind) {
        tokens_stay_ahead_after_an_aof_rewrite_without_preamble(kind, false);
    }

    // A live lease with an ordinary token survives it.
    fn aof_rewrite_without_preamble_keeps_the_clock_with_a_live_lease(kind) {
        tokens_stay_ahead_after_an_aof_rewrite_without_preamble(kind, true);
    }
}
