//! design.md S1: every reply of LEASE.ACQUIRE (without BLOCK), LEASE.RENEW,
//! LEASE.RELEASE, LEASE.FENCE (check form) and LEASE.INFO, in RESP2 and
//! RESP3, on Redis and Valkey. Calls that change nothing leave WATCH
//! alone, and LEASE.INFO's ttl never exceeds the key's TTL.
mod common;
use common::*;

/// Runs `f` on a RESP2 and then a RESP3 connection (`resp3` tells which),
/// each time on its own key prefix.
fn each_protocol(s: &Server, mut f: impl FnMut(&mut redis::Connection, bool, &str)) {
    f(&mut s.conn(), false, "r2:");
    f(&mut s.conn3(), true, "r3:");
}

/// All bytes of every string inside a reply, to look for leaked secrets.
fn all_bytes(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::BulkString(b) => out.extend_from_slice(b),
        Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(a) | Value::Set(a) => a.iter().for_each(|x| all_bytes(x, out)),
        Value::Map(m) => m.iter().for_each(|(k, x)| {
            all_bytes(k, out);
            all_bytes(x, out);
        }),
        Value::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        _ => {}
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

full_suite! {
    fn reacquire_by_the_same_owner_returns_the_same_token_and_resets_the_expiry(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let t1 = int(&ok(c, &["LEASE.ACQUIRE", &key, "me", "5000"]));
            assert!(pttl(c, &key) <= 5000);
            // A longer ttl moves the expiry later...
            let t2 = int(&ok(c, &["LEASE.ACQUIRE", &key, "me", "60000"]));
            assert_eq!(t2, t1, "resp3={resp3}: a retry by the holder keeps the token");
            let ttl = pttl(c, &key);
            assert!(ttl > 50_000 && ttl <= 60_000, "PTTL after re-acquire: {ttl}");
            // ...and a shorter one earlier: the expiry is reset, not extended.
            let t3 = int(&ok(c, &["LEASE.ACQUIRE", &key, "me", "2000"]));
            assert_eq!(t3, t1);
            let ttl = pttl(c, &key);
            assert!(ttl > 0 && ttl <= 2000, "PTTL after a shorter re-acquire: {ttl}");
            assert_eq!(token_of(c, &key), Some(t1));
        });
    }

    fn acquire_held_by_another_owner_returns_null_and_changes_nothing(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, "alice", "60000"]));
            let before = pttl(c, &key);
            let dump_before = ok(c, &["DUMP", &key]);
            let v = ok(c, &["LEASE.ACQUIRE", &key, "bob", "60000"]);
            assert_eq!(v, Value::Nil, "resp3={resp3}: contended ACQUIRE must answer null");
            let after = pttl(c, &key);
            assert!(after <= before && after > before - 5000, "PTTL moved: {before} -> {after}");
            assert_eq!(token_of(c, &key), Some(t));
            assert_eq!(ok(c, &["DUMP", &key]), dump_before, "the stored lease changed");
            // alice still holds it, bob does not.
            assert_eq!(int(&ok(c, &["LEASE.RELEASE", &key, "bob"])), 0);
            assert_eq!(int(&ok(c, &["LEASE.RELEASE", &key, "alice"])), 1);
        });
    }

    fn renew_by_another_owner_or_on_a_free_key_returns_0_and_changes_nothing(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let free = format!("{p}free");
            assert_eq!(ok(c, &["LEASE.RENEW", &free, "me", "1000"]), Value::Int(0), "resp3={resp3}");
            assert_eq!(int(&ok(c, &["EXISTS", &free])), 0, "RENEW must not create a key");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, "alice", "60000"]));
            let dump = ok(c, &["DUMP", &key]);
            let before = pttl(c, &key);
            assert_eq!(ok(c, &["LEASE.RENEW", &key, "bob", "60000"]), Value::Int(0));
            let after = pttl(c, &key);
            assert!(after <= before, "RENEW by another owner moved PTTL {before} -> {after}");
            assert_eq!(token_of(c, &key), Some(t));
            assert_eq!(ok(c, &["DUMP", &key]), dump);
        });
    }

    fn release_by_another_owner_returns_0_and_keeps_the_lease(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let free = format!("{p}free");
            assert_eq!(ok(c, &["LEASE.RELEASE", &free, "me"]), Value::Int(0), "resp3={resp3}");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, "alice", "60000"]));
            let dump = ok(c, &["DUMP", &key]);
            assert_eq!(ok(c, &["LEASE.RELEASE", &key, "bob"]), Value::Int(0));
            assert_eq!(ok(c, &["LEASE.RELEASE", &key, "alicE"]), Value::Int(0), "owner is case-sensitive");
            assert_eq!(ok(c, &["LEASE.RELEASE", &key, "alic"]), Value::Int(0), "owner prefix");
            assert_eq!(int(&ok(c, &["EXISTS", &key])), 1);
            assert_eq!(token_of(c, &key), Some(t));
            assert_eq!(ok(c, &["DUMP", &key]), dump);
            assert_eq!(ok(c, &["LEASE.RENEW", &key, "alice", "60000"]), Value::Int(1));
        });
    }

    fn fence_refuses_the_token_of_an_expired_lease(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}short");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, "me", "150"])).to_string();
            // Wait (bounded) until the lease is over by the server's clock.
            assert!(
                wait_until(std::time::Duration::from_secs(5), || {
                    ok(c, &["LEASE.INFO", &key]) == Value::Nil
                }),
                "a 150 ms lease is still held after 5 s"
            );
            let e = err(c, &["LEASE.FENCE", &key, &t]);
            assert!(e.starts_with("STALE"), "resp3={resp3} expired lease: {e}");
            assert_eq!(ok(c, &["LEASE.RENEW", &key, "me", "1000"]), Value::Int(0));
            assert_eq!(ok(c, &["LEASE.RELEASE", &key, "me"]), Value::Int(0));
        });
    }

    fn info_has_token_ttl_and_waiters_and_never_the_owner(kind) {
        let s = Server::start(kind);
        let owner = "owner-secret-7f3a9c";
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            assert_eq!(ok(c, &["LEASE.INFO", &key]), Value::Nil, "free key");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, owner, "60000"]));
            let info = ok(c, &["LEASE.INFO", &key]);
            match (&info, resp3) {
                (Value::Map(m), true) => assert!(m.len() >= 3, "{info:?}"),
                (Value::Array(a), false) => {
                    assert!(a.len() >= 6 && a.len() % 2 == 0, "{info:?}");
                    for name in a.iter().step_by(2) {
                        assert!(matches!(name, Value::BulkString(_) | Value::SimpleString(_)), "{info:?}");
                    }
                }
                _ => panic!("resp3={resp3}: LEASE.INFO must be a map in RESP3 and a flat array in RESP2, got {info:?}"),
            }
            assert_eq!(field(&info, "token"), Some(Value::Int(t)));
            let ttl = int(&field(&info, "ttl").expect("ttl field"));
            assert!(ttl > 50_000 && ttl <= 60_000, "ttl {ttl}");
            assert_eq!(field(&info, "waiters"), Some(Value::Int(0)));
            let mut bytes = Vec::new();
            all_bytes(&info, &mut bytes);
            assert!(!contains(&bytes, owner.as_bytes()), "INFO reveals the owner: {info:?}");
            assert!(field(&info, "owner").is_none(), "INFO has an owner field: {info:?}");
        });
    }

    fn null_replies_on_the_wire_are_resp2_nil_and_resp3_null(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "job", "alice", "60000"]);
        let mut raw = s.raw();
        assert_eq!(raw.call(&[b"LEASE.ACQUIRE", b"job", b"bob", b"1000"]), b"$-1\r\n");
        assert_eq!(raw.call(&[b"LEASE.INFO", b"free"]), b"$-1\r\n");
        let hello = raw.call(&[b"HELLO", b"3"]);
        assert!(hello.starts_with(b"%"), "HELLO 3: {hello:?}");
        assert_eq!(raw.call(&[b"LEASE.ACQUIRE", b"job", b"bob", b"1000"]), b"_\r\n");
        assert_eq!(raw.call(&[b"LEASE.INFO", b"free"]), b"_\r\n");
        // And the other replies on the wire, in RESP3.
        let t = String::from_utf8(raw.call(&[b"LEASE.ACQUIRE", b"job", b"alice", b"60000"])).unwrap();
        assert!(t.starts_with(':') && t.ends_with("\r\n"), "{t:?}");
        assert_eq!(raw.call(&[b"LEASE.RENEW", b"job", b"alice", b"60000"]), b":1\r\n");
        assert_eq!(raw.call(&[b"LEASE.RENEW", b"job", b"bob", b"60000"]), b":0\r\n");
        assert_eq!(raw.call(&[b"LEASE.FENCE", b"job", &t.as_bytes()[1..t.len() - 2]]), b"+OK\r\n");
        let stale = raw.call(&[b"LEASE.FENCE", b"job", b"1"]);
        assert!(stale.starts_with(b"-STALE "), "{:?}", String::from_utf8_lossy(&stale));
        assert_eq!(raw.call(&[b"LEASE.RELEASE", b"job", b"bob"]), b":0\r\n");
        assert_eq!(raw.call(&[b"LEASE.RELEASE", b"job", b"alice"]), b":1\r\n");

        // The redis crate sees the same nulls as Value::Nil in both protocols.
        ok(&mut c, &["LEASE.ACQUIRE", "job", "alice", "60000"]);
        let mut c3 = s.conn3();
        assert_eq!(ok(&mut c3, &["LEASE.ACQUIRE", "job", "bob", "1000"]), Value::Nil);
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "job", "bob", "1000"]), Value::Nil);
    }

    fn owner_is_binary_safe(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}bin");
            let owner: &[u8] = b"a\0b\r\nc\xff";
            let k = key.as_bytes();
            let t = int(&call(c, &[b"LEASE.ACQUIRE", k, owner, b"60000"]).unwrap());
            // Same bytes: the holder. Any other bytes: someone else.
            assert_eq!(call(c, &[b"LEASE.ACQUIRE", k, owner, b"60000"]).unwrap(), Value::Int(t), "resp3={resp3}");
            for other in [&b"a"[..], b"a\0b", b"a\0b\r\nc", b"a\0b\r\nc\xfe", b"a\0b\r\nc\xff\0", b"A\0b\r\nc\xff"] {
                assert_eq!(call(c, &[b"LEASE.ACQUIRE", k, other, b"1000"]).unwrap(), Value::Nil, "{other:?}");
                assert_eq!(call(c, &[b"LEASE.RENEW", k, other, b"1000"]).unwrap(), Value::Int(0), "{other:?}");
                assert_eq!(call(c, &[b"LEASE.RELEASE", k, other]).unwrap(), Value::Int(0), "{other:?}");
            }
            assert_eq!(call(c, &[b"LEASE.RENEW", k, owner, b"60000"]).unwrap(), Value::Int(1));
            let mut bytes = Vec::new();
            all_bytes(&call(c, &[b"LEASE.INFO", k]).unwrap(), &mut bytes);
            assert!(!contains(&bytes, owner));
            assert_eq!(call(c, &[b"LEASE.RELEASE", k, owner]).unwrap(), Value::Int(1));

            // Exactly 256 bytes (every byte value) is a valid owner; one
            // differing byte is another owner.
            let long: Vec<u8> = (0..=255u8).collect();
            let key256 = format!("{p}owner256");
            let k = key256.as_bytes();
            let t = int(&call(c, &[b"LEASE.ACQUIRE", k, &long, b"60000"]).unwrap());
            assert_eq!(call(c, &[b"LEASE.ACQUIRE", k, &long, b"60000"]).unwrap(), Value::Int(t));
            let mut other = long.clone();
            other[255] = 0;
            assert_eq!(call(c, &[b"LEASE.ACQUIRE", k, &other, b"60000"]).unwrap(), Value::Nil);
            assert_eq!(call(c, &[b"LEASE.RELEASE", k, &other]).unwrap(), Value::Int(0));
            assert_eq!(call(c, &[b"LEASE.RELEASE", k, &long]).unwrap(), Value::Int(1));
            // A one-byte owner, even NUL, is valid too.
            assert!(matches!(call(c, &[b"LEASE.ACQUIRE", k, b"\0", b"60000"]).unwrap(), Value::Int(_)));
            assert_eq!(call(c, &[b"LEASE.RELEASE", k, b"\0"]).unwrap(), Value::Int(1));
        });
    }

    fn key_names_are_binary_safe(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let key: &[u8] = b"k\0\r\n\xff";
        let t = int(&call(&mut c, &[b"LEASE.ACQUIRE", key, b"me", b"60000"]).unwrap());
        // "k" is another key: free, whatever the binary key above holds.
        let other = int(&call(&mut c, &[b"LEASE.ACQUIRE", b"k", b"other", b"60000"]).unwrap());
        assert!(other > t);
        let info = call(&mut c, &[b"LEASE.INFO", key]).unwrap();
        assert_eq!(field(&info, "token"), Some(Value::Int(t)));
        assert_eq!(call(&mut c, &[b"LEASE.RELEASE", key, b"me"]).unwrap(), Value::Int(1));
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn acquire_free_key_returns_an_integer_token(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let v = ok(c, &["LEASE.ACQUIRE", &key, "me", "30000"]);
            let Value::Int(token) = v else {
                panic!("resp3={resp3}: ACQUIRE on a free key must answer an integer, got {v:?}")
            };
            assert!((1..=MAX_TOKEN).contains(&token), "token {token} out of 1..2^53-1");
            assert_eq!(int(&ok(c, &["EXISTS", &key])), 1);
            assert_eq!(token_of(c, &key), Some(token));
            let ttl = pttl(c, &key);
            assert!(ttl > 0 && ttl <= 30000, "PTTL {ttl}");
        });
    }

    fn renew_by_the_holder_returns_1_sets_the_expiry_and_keeps_the_token(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, "me", "5000"]));
            assert_eq!(ok(c, &["LEASE.RENEW", &key, "me", "60000"]), Value::Int(1), "resp3={resp3}");
            let ttl = pttl(c, &key);
            assert!(ttl > 50_000 && ttl <= 60_000, "PTTL after RENEW: {ttl}");
            assert_eq!(ok(c, &["LEASE.RENEW", &key, "me", "3000"]), Value::Int(1));
            let ttl = pttl(c, &key);
            assert!(ttl > 0 && ttl <= 3000, "PTTL after a shorter RENEW: {ttl}");
            assert_eq!(token_of(c, &key), Some(t));
            let info = ok(c, &["LEASE.INFO", &key]);
            let info_ttl = int(&field(&info, "ttl").unwrap());
            assert!(info_ttl > 0 && info_ttl <= 3000, "INFO ttl {info_ttl}");
        });
    }

    fn release_by_the_holder_returns_1_and_deletes_the_key(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            ok(c, &["LEASE.ACQUIRE", &key, "me", "60000"]);
            assert_eq!(ok(c, &["LEASE.RELEASE", &key, "me"]), Value::Int(1), "resp3={resp3}");
            assert_eq!(int(&ok(c, &["EXISTS", &key])), 0);
            assert_eq!(ok(c, &["LEASE.INFO", &key]), Value::Nil);
            assert_eq!(ok(c, &["LEASE.RELEASE", &key, "me"]), Value::Int(0), "second release");
            // The key is free again: anyone can take it.
            assert!(matches!(ok(c, &["LEASE.ACQUIRE", &key, "other", "1000"]), Value::Int(_)));
        });
    }

    fn fence_accepts_the_current_token_only(kind) {
        let s = Server::start(kind);
        each_protocol(&s, |c, resp3, p| {
            let key = format!("{p}job");
            let free = format!("{p}free");
            let t = int(&ok(c, &["LEASE.ACQUIRE", &key, "me", "60000"]));
            let ts = t.to_string();
            assert_eq!(ok(c, &["LEASE.FENCE", &key, &ts]), Value::Okay, "resp3={resp3}");
            for wrong in [t - 1, t + 1, 1] {
                let e = err(c, &["LEASE.FENCE", &key, &wrong.to_string()]);
                assert!(e.starts_with("STALE"), "wrong token {wrong}: {e}");
            }
            let e = err(c, &["LEASE.FENCE", &free, &ts]);
            assert!(e.starts_with("STALE"), "free key: {e}");
            assert_eq!(int(&ok(c, &["EXISTS", &free])), 0);
            // After a release and a new acquisition the old token is stale.
            assert_eq!(int(&ok(c, &["LEASE.RELEASE", &key, "me"])), 1);
            let e = err(c, &["LEASE.FENCE", &key, &ts]);
            assert!(e.starts_with("STALE"), "released: {e}");
            let t2 = int(&ok(c, &["LEASE.ACQUIRE", &key, "you", "60000"]));
            assert!(t2 > t);
            let e = err(c, &["LEASE.FENCE", &key, &ts]);
            assert!(e.starts_with("STALE"), "superseded token: {e}");
            assert_eq!(ok(c, &["LEASE.FENCE", &key, &t2.to_string()]), Value::Okay);
        });
    }

    fn info_raw_reply_is_a_map_or_flat_array_without_the_owner(kind) {
        let s = Server::start(kind);
        let owner = b"owner-secret-5be1";
        let mut raw = s.raw();
        let t = raw.call(&[b"LEASE.ACQUIRE", b"job", owner, b"60000"]);
        assert!(t.starts_with(b":"), "{t:?}");
        let token = &t[1..t.len() - 2];

        let r2 = raw.call(&[b"LEASE.INFO", b"job"]);
        assert!(r2.starts_with(b"*12\r\n"), "RESP2 INFO: {:?}", String::from_utf8_lossy(&r2));
        assert!(contains(&r2, b"$5\r\nguard\r\n:0\r\n"), "not a guard {:?}", String::from_utf8_lossy(&r2));
        assert!(contains(&r2, b"$5\r\nlabel\r\n$-1\r\n"), "no label: null {:?}", String::from_utf8_lossy(&r2));
        assert!(!contains(&r2, owner), "RESP2 INFO reveals the owner");
        assert!(contains(&r2, b"$5\r\ntoken\r\n:"), "{:?}", String::from_utf8_lossy(&r2));
        assert!(contains(&r2, token));

        raw.call(&[b"HELLO", b"3"]);
        let r3 = raw.call(&[b"LEASE.INFO", b"job"]);
        assert!(r3.starts_with(b"%6\r\n"), "RESP3 INFO: {:?}", String::from_utf8_lossy(&r3));
        assert!(contains(&r3, b"$5\r\nlabel\r\n_\r\n"), "no label: null {:?}", String::from_utf8_lossy(&r3));
        assert!(!contains(&r3, owner), "RESP3 INFO reveals the owner");
        assert!(contains(&r3, b"$7\r\nwaiters\r\n:0\r\n"), "{:?}", String::from_utf8_lossy(&r3));
        assert!(contains(&r3, token));
    }
}

/// The token field of a LEASE.INFO reply.
fn token_in(v: &Value) -> Option<i64> {
    field(v, "token").map(|t| int(&t))
}

full_suite! {
    // Lease calls that change nothing (a contended ACQUIRE, a RENEW or RELEASE
    // by another owner, INFO, a stale FENCE) do not open the key for writing,
    // so WATCH on it holds. A failing `SET NX` is the control: it never did.
    fn watch_survives_lease_calls_that_change_nothing(kind) {
        let s = Server::start(kind);
        let mut a = s.conn();
        let mut b = s.conn();
        let t = acquire(&mut b, "k", "h", "60000");
        ok(&mut b, &["SET", "k2", "v"]);
        assert!(
            watch_survives(&mut a, "k2", || assert_eq!(
                ok(&mut b, &["SET", "k2", "w", "NX"]),
                Value::Nil
            )),
            "control: a failing SET NX does not break WATCH"
        );
        let stale = (t - 1).to_string();
        // Each call with what it must answer: null, 0, a lease, STALE.
        let calls: [(&[&str], &str); 5] = [
            (&["LEASE.ACQUIRE", "k", "other", "1000"], "null"),
            (&["LEASE.RENEW", "k", "other", "1000"], "0"),
            (&["LEASE.RELEASE", "k", "other"], "0"),
            (&["LEASE.INFO", "k"], "lease"),
            (&["LEASE.FENCE", "k", &stale], "STALE"),
        ];
        let mut broke = Vec::new();
        for (args, expect) in calls {
            let survived = watch_survives(&mut a, "k", || {
                let bytes: Vec<&[u8]> = args.iter().map(|x| x.as_bytes()).collect();
                let got = call(&mut b, &bytes);
                let as_expected = match (expect, &got) {
                    ("null", Ok(Value::Nil)) => true,
                    ("0", Ok(Value::Int(0))) => true,
                    ("lease", Ok(v)) => token_in(v) == Some(t),
                    ("STALE", Err(e)) => error_text(e).starts_with("STALE"),
                    _ => false,
                };
                assert!(as_expected, "{args:?} answered {got:?}, expected {expect}");
            });
            if !survived {
                broke.push(args.join(" "));
            }
        }
        assert!(
            broke.is_empty(),
            "these changed nothing but broke WATCH k: {broke:?}"
        );
        assert_eq!(token_of(&mut b, "k"), Some(t), "h still holds k");
    }

    // LEASE.INFO's `ttl` never promises time the key does not have: after a
    // PEXPIRE shorter than the lease it is at most the key's TTL.
    fn info_ttl_honours_a_shorter_key_ttl(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "me", "60000");
        assert_eq!(int(&ok(&mut c, &["PEXPIRE", "k", "1000"])), 1);
        let info = ok(&mut c, &["LEASE.INFO", "k"]);
        let ttl = int(&field(&info, "ttl").expect("ttl field"));
        assert!(
            ttl > 0 && ttl <= 1000,
            "LEASE.INFO ttl {ttl} after PEXPIRE k 1000"
        );
    }
}
