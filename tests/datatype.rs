//! design.md S1/S3: lease keys are ordinary keys of a module data type; a
//! RESTORE without a TTL leaves no key that outlives its lease.
mod common;
use common::*;
use std::time::Duration;

fn info_ttl(c: &mut redis::Connection, key: &str) -> i64 {
    let info = ok(c, &["LEASE.INFO", key]);
    int(&field(&info, "ttl").unwrap_or_else(|| panic!("no lease on {key}: {info:?}")))
}

fn bulk(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        other => panic!("expected a bulk string, got {other:?}"),
    }
}

/// All keys SCAN returns with these extra arguments.
fn scan_all(c: &mut redis::Connection, extra: &[&str]) -> Vec<String> {
    let mut cursor = "0".to_string();
    let mut keys = Vec::new();
    for _ in 0..10_000 {
        let mut args = vec!["SCAN", cursor.as_str()];
        args.extend_from_slice(extra);
        let reply = ok(c, &args);
        let Value::Array(parts) = reply else {
            panic!("SCAN reply {reply:?}")
        };
        let next = String::from_utf8(bulk(&parts[0])).unwrap();
        keys.extend(strings(&parts[1]));
        if next == "0" {
            keys.sort();
            return keys;
        }
        cursor = next;
    }
    panic!("SCAN did not finish");
}

/// PTTL and LEASE.INFO ttl agree and lie in (ttl - slack, ttl].
fn assert_remaining(c: &mut redis::Connection, key: &str, ttl: i64) {
    let p = pttl(c, key);
    let i = info_ttl(c, key);
    assert!(
        p > ttl - 10_000 && p <= ttl,
        "{key}: PTTL {p}, lease ttl {ttl}"
    );
    assert!(
        (p - i).abs() <= 1000,
        "{key}: PTTL {p} but LEASE.INFO ttl {i}"
    );
}

full_suite! {
    fn type_exists_del_unlink(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "a", "me", "60000"]);
        ok(&mut c, &["LEASE.ACQUIRE", "b", "me", "60000"]);
        assert_eq!(ok(&mut c, &["TYPE", "a"]), Value::SimpleString("leasetype".into()));
        assert_eq!(int(&ok(&mut c, &["EXISTS", "a", "b", "nope"])), 2);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 2);
        assert_eq!(int(&ok(&mut c, &["DEL", "a"])), 1);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "a"])), 0);
        assert_eq!(ok(&mut c, &["LEASE.INFO", "a"]), Value::Nil);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "a", "me"])), 0);
        assert_eq!(int(&ok(&mut c, &["UNLINK", "b"])), 1);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "b"])), 0);
        assert_eq!(ok(&mut c, &["LEASE.INFO", "b"]), Value::Nil);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
        // After DEL the key is free for anyone.
        assert!(matches!(ok(&mut c, &["LEASE.ACQUIRE", "a", "other", "1000"]), Value::Int(_)));
    }

    fn scan_finds_lease_keys(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut expected = Vec::new();
        for i in 0..50 {
            let k = format!("lease:{i:02}");
            ok(&mut c, &["LEASE.ACQUIRE", &k, "me", "60000"]);
            expected.push(k);
        }
        ok(&mut c, &["SET", "plain", "x"]);
        expected.sort();
        let all = scan_all(&mut c, &["COUNT", "7"]);
        assert_eq!(all.len(), 51);
        assert_eq!(scan_all(&mut c, &["MATCH", "lease:*", "COUNT", "7"]), expected);
        assert_eq!(scan_all(&mut c, &["TYPE", "leasetype", "COUNT", "7"]), expected);
        assert_eq!(strings(&ok(&mut c, &["KEYS", "lease:0*"])).len(), 10);
        let r = ok(&mut c, &["RANDOMKEY"]);
        assert!(matches!(r, Value::BulkString(_)), "{r:?}");
    }

    fn pttl_is_the_lease_remaining_time(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "60000"]);
        assert_remaining(&mut c, "k", 60000);
        let ttl = int(&ok(&mut c, &["TTL", "k"]));
        assert!((50..=60).contains(&ttl), "TTL {ttl}");
        let exp = int(&ok(&mut c, &["PEXPIRETIME", "k"]));
        let now = now_ms();
        assert!((exp - (now + 60000)).abs() < 10_000, "PEXPIRETIME {exp}, now {now}");
        ok(&mut c, &["LEASE.RENEW", "k", "me", "50000"]);
        assert_remaining(&mut c, "k", 50000);
        ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "40000"]);
        assert_remaining(&mut c, "k", 40000);
    }

    fn expiry_removes_the_key_like_set_px(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "lease", "me", "150"]));
        ok(&mut c, &["SET", "plain", "x", "PX", "150"]);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 2);
        // DBSIZE counts a logically expired key until the server removes it:
        // without touching the keys, wait for the server to expire both.
        assert!(
            wait_until(Duration::from_secs(10), || int(&ok(&mut c, &["DBSIZE"])) == 0),
            "keys still present after 10 s: {:?}",
            strings(&ok(&mut c, &["KEYS", "*"]))
        );
        assert_eq!(int(&ok(&mut c, &["EXISTS", "lease"])), 0);
        assert_eq!(pttl(&mut c, "lease"), -2);
        assert_eq!(ok(&mut c, &["LEASE.INFO", "lease"]), Value::Nil);
        assert!(int(&ok(&mut c, &["LEASE.ACQUIRE", "lease", "other", "60000"])) > t);
    }

    fn expiry_on_access_removes_the_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "lease", "me", "100"]);
        assert!(
            wait_until(Duration::from_secs(10), || int(&ok(&mut c, &["EXISTS", "lease"])) == 0),
            "a 100 ms lease still exists after 10 s"
        );
        assert_eq!(pttl(&mut c, "lease"), -2);
        assert_eq!(ok(&mut c, &["TYPE", "lease"]), Value::SimpleString("none".into()));
    }

    fn rename_keeps_the_lease(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "old", "me", "60000"]));
        assert_eq!(ok(&mut c, &["RENAME", "old", "new"]), Value::Okay);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "old"])), 0);
        assert_eq!(token_of(&mut c, "new"), Some(t));
        assert_remaining(&mut c, "new", 60000);
        assert_eq!(int(&ok(&mut c, &["LEASE.ACQUIRE", "new", "me", "60000"])), t);
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "new", &t.to_string()]), Value::Okay);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "new", "other"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "new", "me"])), 1);
        // RENAMENX too, onto a free name.
        let t2 = int(&ok(&mut c, &["LEASE.ACQUIRE", "a", "me", "60000"]));
        assert_eq!(int(&ok(&mut c, &["RENAMENX", "a", "b"])), 1);
        assert_eq!(token_of(&mut c, "b"), Some(t2));
    }

    fn restore_of_a_corrupt_payload_fails_cleanly(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "src", "me", "60000"]);
        let payload = bulk(&ok(&mut c, &["DUMP", "src"]));
        // Cut the payload short: the checksum no longer matches.
        let short = &payload[..payload.len() - 3];
        assert!(call(&mut c, &[b"RESTORE", b"bad", b"60000", short]).is_err());
        assert_eq!(int(&ok(&mut c, &["EXISTS", "bad"])), 0);
        assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
    }

    fn memory_usage_is_an_integer(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "small", "o", "60000"]);
        let long = "x".repeat(256);
        ok(&mut c, &["LEASE.ACQUIRE", "big", &long, "60000"]);
        let small = int(&ok(&mut c, &["MEMORY", "USAGE", "small"]));
        let big = int(&ok(&mut c, &["MEMORY", "USAGE", "big"]));
        assert!(small > 0, "MEMORY USAGE {small}");
        assert!(big > small, "a 256-byte owner should cost more than a 1-byte one: {big} vs {small}");
        assert_eq!(ok(&mut c, &["MEMORY", "USAGE", "missing"]), Value::Nil);
    }

    fn debug_digest_follows_the_value(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "a", "me", "60000"]);
        ok(&mut c, &["COPY", "a", "b"]);
        let d = strings(&ok(&mut c, &["DEBUG", "DIGEST-VALUE", "a", "b"]));
        assert_eq!(d[0], d[1]);
        assert_ne!(d[0], "0".repeat(40), "a lease digests to something");
        let db_before = ok(&mut c, &["DEBUG", "DIGEST"]);
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "a", "me", "50000"])), 1);
        let d2 = strings(&ok(&mut c, &["DEBUG", "DIGEST-VALUE", "a", "b"]));
        assert_ne!(d2[0], d[0], "RENEW with another ttl must change the digest");
        assert_eq!(d2[1], d[1], "the copy did not change");
        assert_ne!(ok(&mut c, &["DEBUG", "DIGEST"]), db_before);
        // A different owner with the same everything else digests differently.
        ok(&mut c, &["LEASE.ACQUIRE", "x", "me", "60000"]);
        ok(&mut c, &["LEASE.ACQUIRE", "y", "you", "60000"]);
        let d3 = strings(&ok(&mut c, &["DEBUG", "DIGEST-VALUE", "x", "y"]));
        assert_ne!(d3[0], d3[1]);
    }

    fn move_and_swapdb_keep_the_lease(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "60000"]));
        assert_eq!(int(&ok(&mut c, &["MOVE", "k", "1"])), 1);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "k"])), 0);
        ok(&mut c, &["SELECT", "1"]);
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_remaining(&mut c, "k", 60000);
        ok(&mut c, &["SWAPDB", "0", "1"]);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "k"])), 0);
        ok(&mut c, &["SELECT", "0"]);
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "me"])), 1);
    }

    fn persist_and_expire_act_on_the_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "60000"]));
        // Touching the key with read commands changes nothing.
        ok(&mut c, &["TOUCH", "k"]);
        assert_eq!(token_of(&mut c, "k"), Some(t));
        // EXPIRE with a shorter time shortens the key's life like any key.
        assert_eq!(int(&ok(&mut c, &["PEXPIRE", "k", "100"])), 1);
        assert!(
            wait_until(Duration::from_secs(10), || int(&ok(&mut c, &["EXISTS", "k"])) == 0),
            "PEXPIRE 100 did not remove the lease key"
        );
        assert!(int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "other", "60000"])) > t);
    }

    fn a_lease_ends_at_its_deadline_even_if_the_key_outlives_it(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // PERSIST removes the key's TTL; the lease itself still ends at its
        // deadline: then it is free (RENEW/RELEASE 0, FENCE stale, INFO null)
        // and the next ACQUIRE, even by the same owner, is a new lease.
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "100"]));
        assert_eq!(int(&ok(&mut c, &["PERSIST", "k"])), 1);
        assert!(
            wait_until(Duration::from_secs(5), || ok(&mut c, &["LEASE.INFO", "k"]) == Value::Nil),
            "the lease outlived its 100 ms deadline"
        );
        assert_eq!(int(&ok(&mut c, &["EXISTS", "k"])), 1, "the key itself has no TTL");
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", "me", "1000"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "me"])), 0);
        assert!(err(&mut c, &["LEASE.FENCE", "k", &t.to_string()]).starts_with("STALE"));
        let t2 = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "60000"]));
        assert!(t2 > t, "a new lease gets a new token: {t2} after {t}");
        assert_remaining(&mut c, "k", 60000);
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn dump_restore_keeps_owner_and_token(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let owner: &[u8] = b"own\0er\xff";
        let t = int(&call(&mut c, &[b"LEASE.ACQUIRE", b"src", owner, b"60000"]).unwrap());
        let payload = bulk(&ok(&mut c, &["DUMP", "src"]));
        let ttl = pttl(&mut c, "src").to_string();
        assert_eq!(
            call(&mut c, &[b"RESTORE", b"dst", ttl.as_bytes(), &payload]).unwrap(),
            Value::Okay
        );
        assert_eq!(token_of(&mut c, "dst"), Some(t));
        assert_remaining(&mut c, "dst", 60000);
        // The owner came along: the same bytes hold it, others do not.
        assert_eq!(call(&mut c, &[b"LEASE.ACQUIRE", b"dst", owner, b"60000"]).unwrap(), Value::Int(t));
        assert_eq!(call(&mut c, &[b"LEASE.ACQUIRE", b"dst", b"own", b"60000"]).unwrap(), Value::Nil);
        assert_eq!(call(&mut c, &[b"LEASE.RELEASE", b"dst", owner]).unwrap(), Value::Int(1));

        // RESTORE ... REPLACE over a released key, and ABSTTL.
        let abs = int(&ok(&mut c, &["PEXPIRETIME", "src"])).to_string();
        assert_eq!(call(&mut c, &[b"LEASE.RELEASE", b"src", owner]).unwrap(), Value::Int(1));
        assert_eq!(
            call(&mut c, &[b"RESTORE", b"src", abs.as_bytes(), &payload, b"ABSTTL"]).unwrap(),
            Value::Okay
        );
        assert_eq!(token_of(&mut c, "src"), Some(t));
        assert_eq!(int(&ok(&mut c, &["PEXPIRETIME", "src"])).to_string(), abs);
        let e = call(&mut c, &[b"RESTORE", b"src", b"0", &payload]).unwrap_err();
        assert!(error_text(&e).starts_with("BUSYKEY"), "{}", error_text(&e));
        assert_eq!(
            call(&mut c, &[b"RESTORE", b"src", ttl.as_bytes(), &payload, b"REPLACE"]).unwrap(),
            Value::Okay
        );
        assert_eq!(call(&mut c, &[b"LEASE.RELEASE", b"src", owner]).unwrap(), Value::Int(1));
    }

    fn debug_reload_keeps_the_lease(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let owner: &[u8] = b"reload\0\xff";
        let t = int(&call(&mut c, &[b"LEASE.ACQUIRE", b"k", owner, b"60000"]).unwrap());
        let digest = strings(&ok(&mut c, &["DEBUG", "DIGEST-VALUE", "k"]));
        assert_eq!(ok(&mut c, &["DEBUG", "RELOAD"]), Value::Okay);
        assert_eq!(ok(&mut c, &["TYPE", "k"]), Value::SimpleString("leasetype".into()));
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_remaining(&mut c, "k", 60000);
        assert_eq!(strings(&ok(&mut c, &["DEBUG", "DIGEST-VALUE", "k"])), digest);
        assert_eq!(call(&mut c, &[b"LEASE.RELEASE", b"k", b"reload"]).unwrap(), Value::Int(0));
        assert_eq!(call(&mut c, &[b"LEASE.ACQUIRE", b"k", owner, b"60000"]).unwrap(), Value::Int(t));
        assert_eq!(call(&mut c, &[b"LEASE.RELEASE", b"k", owner]).unwrap(), Value::Int(1));
    }

    fn copy_gives_an_identical_lease(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "src", "me", "60000"]));
        assert_eq!(int(&ok(&mut c, &["COPY", "src", "dst"])), 1);
        assert_eq!(ok(&mut c, &["TYPE", "dst"]), Value::SimpleString("leasetype".into()));
        assert_eq!(token_of(&mut c, "dst"), Some(t));
        assert_remaining(&mut c, "dst", 60000);
        let digests = strings(&ok(&mut c, &["DEBUG", "DIGEST-VALUE", "src", "dst"]));
        assert_eq!(digests[0], digests[1], "a copy must digest like its source");
        assert_eq!(ok(&mut c, &["DUMP", "src"]), ok(&mut c, &["DUMP", "dst"]));
        // The copy is held by the same owner, and independent of the source.
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "dst", "other", "1000"]), Value::Nil);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "dst", "other"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "dst", "me"])), 1);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "dst"])), 0);
        assert_eq!(token_of(&mut c, "src"), Some(t));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "src", "me"])), 1);
        // COPY onto an existing key needs REPLACE, like every type.
        ok(&mut c, &["LEASE.ACQUIRE", "x", "me", "60000"]);
        ok(&mut c, &["SET", "y", "v"]);
        assert_eq!(int(&ok(&mut c, &["COPY", "x", "y"])), 0);
        assert_eq!(int(&ok(&mut c, &["COPY", "x", "y", "REPLACE"])), 1);
        assert_eq!(ok(&mut c, &["TYPE", "y"]), Value::SimpleString("leasetype".into()));
    }
}

full_suite! {
    // `RESTORE k 0 <lease payload>` gives the key the lease's deadline as its
    // expiry (or removes it), also when the deadline has passed already: no key
    // without a TTL outlives its lease.
    fn restore_without_ttl_leaves_no_immortal_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "me", "300");
        let payload = dump_payload(&mut c, "k");
        ok(&mut c, &["DEL", "k"]);
        assert_eq!(
            text(&call(&mut c, &[b"RESTORE", b"k", b"0", &payload]).unwrap()),
            "OK"
        );
        let mut pttls = Vec::new();
        let gone = wait_until(Duration::from_millis(1500), || {
            pttls.push(int(&ok(&mut c, &["PTTL", "k"])));
            !exists(&mut c, "k")
        });
        assert!(
            gone,
            "the restored lease key is still there 1.5 s later (PTTLs seen: {:?})",
            &pttls[pttls.len().saturating_sub(5)..]
        );
        assert!(
            pttls.iter().all(|&p| p <= 300),
            "a PTTL beyond the lease's 300 ms: {pttls:?}"
        );

        // A payload whose deadline has passed already.
        acquire(&mut c, "old", "me", "50");
        let payload = dump_payload(&mut c, "old");
        assert!(
            wait_until(Duration::from_secs(2), || !exists(&mut c, "old")),
            "the 50 ms lease never expired"
        );
        let _ = call(&mut c, &[b"RESTORE", b"old", b"0", &payload]);
        assert!(
            wait_until(Duration::from_secs(1), || !exists(&mut c, "old")),
            "a restored lease past its deadline is still there 1 s later (PTTL {:?})",
            ok(&mut c, &["PTTL", "old"])
        );
    }
}
