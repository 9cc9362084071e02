//! design.md S4: every malformed call gets an error that names what is
//! wrong, and changes nothing; WRONGTYPE both ways.
mod common;
use common::*;

/// What must not change when a call is refused.
#[derive(Debug, PartialEq)]
struct Snapshot {
    dbsize: i64,
    held_dump: Value,
    held_token: Option<Value>,
    string: Value,
    list: Value,
    last_token: i64,
}

const HOLDER: &str = "holder";

/// A keyspace with a lease `held` (owner `holder`), a string `str` and a
/// list `lst`.
fn setup(c: &mut redis::Connection) {
    let t = ok(c, &["LEASE.ACQUIRE", "held", HOLDER, "60000"]);
    assert!(matches!(t, Value::Int(_)), "{t:?}");
    ok(c, &["SET", "str", "plain"]);
    ok(c, &["RPUSH", "lst", "a", "b"]);
}

fn snapshot(c: &mut redis::Connection) -> Snapshot {
    let info = ok(c, &["LEASE.INFO", "held"]);
    Snapshot {
        dbsize: int(&ok(c, &["DBSIZE"])),
        // DUMP serialises the whole record: owner, token and deadline.
        held_dump: ok(c, &["DUMP", "held"]),
        held_token: field(&info, "token"),
        string: ok(c, &["GET", "str"]),
        list: ok(c, &["LRANGE", "lst", "0", "-1"]),
        last_token: info_int(c, "lease_last_token"),
    }
}

/// `args` must fail with an error containing every one of `needles`
/// (case-insensitive), and leave the keyspace as it was. The owner of
/// `held` is checked last: only `holder` can still renew it.
fn refused(c: &mut redis::Connection, args: &[&[u8]], needles: &[&str]) -> String {
    let before = snapshot(c);
    let e = match call(c, args) {
        Ok(v) => panic!("{} should fail, got {v:?}", show(args)),
        Err(e) => error_text(&e),
    };
    let lower = e.to_lowercase();
    for n in needles {
        assert!(
            lower.contains(&n.to_lowercase()),
            "{}: error {e:?} does not mention {n:?}",
            show(args)
        );
    }
    assert_eq!(snapshot(c), before, "{} changed the keyspace", show(args));
    e
}

fn show(args: &[&[u8]]) -> String {
    args.iter()
        .map(|a| {
            if a.len() > 40 {
                format!("<{} bytes>", a.len())
            } else {
                String::from_utf8_lossy(a).into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn s(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

fn refused_str(c: &mut redis::Connection, args: &[&str], needles: &[&str]) -> String {
    let owned = s(args);
    let refs: Vec<&[u8]> = owned.iter().map(|a| a.as_slice()).collect();
    refused(c, &refs, needles)
}

fn holder_still_holds(c: &mut redis::Connection) {
    assert_eq!(int(&ok(c, &["LEASE.RENEW", "held", "other", "1000"])), 0);
    assert_eq!(int(&ok(c, &["LEASE.RENEW", "held", HOLDER, "60000"])), 1);
}

full_suite! {
    fn wrong_number_of_arguments(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        for args in [
            &["LEASE.ACQUIRE"][..],
            &["LEASE.ACQUIRE", "free"],
            &["LEASE.ACQUIRE", "free", "me"],
            &["LEASE.ACQUIRE", "held", HOLDER],
            &["LEASE.RENEW"],
            &["LEASE.RENEW", "held"],
            &["LEASE.RENEW", "held", HOLDER],
            &["LEASE.RENEW", "held", HOLDER, "1000", "extra"],
            &["LEASE.RELEASE"],
            &["LEASE.RELEASE", "held"],
            &["LEASE.RELEASE", "held", HOLDER, "extra"],
            &["LEASE.FENCE"],
            &["LEASE.FENCE", "held"],
            &["LEASE.INFO"],
            &["LEASE.INFO", "held", "extra"],
        ] {
            refused_str(&mut c, args, &["wrong number of arguments"]);
        }
        holder_still_holds(&mut c);
    }

    fn bad_ttl_is_refused_and_named(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        // Default lease.max-ttl-ms is 30 days.
        let over_default = (30i64 * 24 * 3600 * 1000 + 1).to_string();
        for ttl in [
            "abc", "", "1.5", "1e3", " 10", "10 ", "+10", "0x10", "0", "-1", "-1000",
            over_default.as_str(), "9223372036854775807", "9223372036854775808",
            "99999999999999999999999",
        ] {
            for cmd in [
                vec!["LEASE.ACQUIRE", "free", "me", ttl],
                vec!["LEASE.ACQUIRE", "held", HOLDER, ttl],
                vec!["LEASE.ACQUIRE", "held", "other", ttl],
                vec!["LEASE.RENEW", "held", HOLDER, ttl],
                vec!["LEASE.RENEW", "free", "me", ttl],
            ] {
                refused_str(&mut c, &cmd, &["ttl-ms"]);
            }
        }
        holder_still_holds(&mut c);
    }

    fn ttl_above_the_configured_max_is_refused(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "1000000"]);
        for cmd in [
            vec!["LEASE.ACQUIRE", "free", "me", "1000001"],
            vec!["LEASE.ACQUIRE", "held", HOLDER, "1000001"],
            vec!["LEASE.RENEW", "held", HOLDER, "1000001"],
        ] {
            let e = refused_str(&mut c, &cmd, &["ttl-ms"]);
            assert!(e.contains("1000000"), "the error should give the limit: {e}");
        }
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "held", HOLDER, "1000000"])), 1);
    }

    fn bad_token_is_refused_and_named(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        for token in [
            "0", "-1", "-9007199254740991", "abc", "", "1.0", "01", " 1", "9007199254740992",
            "18446744073709551615", "99999999999999999999999",
        ] {
            for key in ["held", "free"] {
                let e = refused_str(&mut c, &["LEASE.FENCE", key, token], &["token"]);
                assert!(!e.starts_with("STALE"), "a malformed token is not a stale one: {token:?} -> {e}");
            }
        }
        holder_still_holds(&mut c);
    }

    fn bad_owner_is_refused_and_named(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        let long = vec![b'x'; 257];
        let long_held = {
            let mut v = HOLDER.as_bytes().to_vec();
            v.resize(257, b'!');
            v
        };
        for owner in [&b""[..], &long, &long_held] {
            for key in [&b"held"[..], b"free"] {
                refused(&mut c, &[b"LEASE.ACQUIRE", key, owner, b"1000"], &["owner"]);
                refused(&mut c, &[b"LEASE.RENEW", key, owner, b"1000"], &["owner"]);
                refused(&mut c, &[b"LEASE.RELEASE", key, owner], &["owner"]);
            }
        }
        let e = refused(&mut c, &[b"LEASE.ACQUIRE", b"free", &long, b"1000"], &["owner"]);
        assert!(e.contains("256"), "the error should give the limit: {e}");
        holder_still_holds(&mut c);
    }

    fn unknown_and_malformed_options_are_refused(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        for key in ["free", "held"] {
            let owners = [HOLDER, "other"];
            for owner in owners {
                let base = ["LEASE.ACQUIRE", key, owner, "1000"];
                let with = |extra: &[&'static str]| -> Vec<&str> {
                    base.iter().copied().chain(extra.iter().copied()).collect()
                };
                let e = refused_str(&mut c, &with(&["NX"]), &["unknown option"]);
                assert!(e.contains("NX"), "the error should name the option: {e}");
                refused_str(&mut c, &with(&["PX", "100"]), &["unknown option", "PX"]);
                refused_str(&mut c, &with(&["BLOCK", "10", "EXTRA"]), &["unknown option", "EXTRA"]);
                let e = refused_str(&mut c, &with(&["BLOCK", "10", "BLOCK", "20"]), &["BLOCK"]);
                let lower = e.to_lowercase();
                assert!(
                    ["more than once", "repeated", "twice", "duplicate"].iter().any(|w| lower.contains(w)),
                    "a repeated option should be called repeated: {e}"
                );
                refused_str(&mut c, &with(&["block", "10", "BLOCK", "10"]), &["BLOCK"]);
                let e = refused_str(&mut c, &with(&["BLOCK"]), &["BLOCK"]);
                let lower = e.to_lowercase();
                assert!(
                    lower.contains("value") || lower.contains("timeout"),
                    "BLOCK without a value: {e}"
                );
                for bad in ["abc", "-1", "1.5", "", "99999999999999999999999", "9223372036854775807"] {
                    refused_str(&mut c, &with(&["BLOCK", bad]), &["timeout"]);
                }
            }
        }
        holder_still_holds(&mut c);
    }

    fn internal_apply_command_is_refused_to_clients(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        // A client must not be able to forge a lease through the effect
        // command used by replication and the AOF.
        let far = (now_ms() + 600_000).to_string();
        refused_str(&mut c, &["LEASE.APPLY", "free", "me", "5", &far], &["internal"]);
        refused_str(&mut c, &["LEASE.APPLY", "held", "thief", "5", &far], &["internal"]);
        holder_still_holds(&mut c);
    }

    fn lease_commands_on_keys_of_other_types_are_wrongtype(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        ok(&mut c, &["HSET", "hash", "f", "v"]);
        for key in ["str", "lst", "hash"] {
            for args in [
                vec!["LEASE.ACQUIRE", key, "me", "1000"],
                vec!["LEASE.RENEW", key, "me", "1000"],
                vec!["LEASE.RELEASE", key, "me"],
                vec!["LEASE.FENCE", key, "1"],
                vec!["LEASE.INFO", key],
            ] {
                let e = refused_str(&mut c, &args, &[]);
                assert!(e.starts_with("WRONGTYPE"), "{args:?}: {e}");
            }
        }
        assert_eq!(ok(&mut c, &["TYPE", "str"]), Value::SimpleString("string".into()));
        assert_eq!(ok(&mut c, &["HGET", "hash", "f"]), Value::BulkString(b"v".to_vec()));
    }

    fn other_commands_on_a_lease_key_are_wrongtype(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        for args in [
            &["GET", "held"][..],
            &["APPEND", "held", "x"],
            &["INCR", "held"],
            &["STRLEN", "held"],
            &["LPUSH", "held", "x"],
            &["LRANGE", "held", "0", "-1"],
            &["HSET", "held", "f", "v"],
            &["SADD", "held", "m"],
            &["ZADD", "held", "1", "m"],
            &["XADD", "held", "*", "f", "v"],
        ] {
            let e = refused_str(&mut c, args, &[]);
            assert!(e.starts_with("WRONGTYPE"), "{args:?}: {e}");
        }
        assert_eq!(ok(&mut c, &["TYPE", "held"]), Value::SimpleString("leasetype".into()));
        holder_still_holds(&mut c);
    }

    fn errors_inside_multi_do_not_break_the_transaction(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        setup(&mut c);
        // A runtime error (WRONGTYPE, bad ttl) inside MULTI is an error
        // element of the EXEC reply; the other commands still run.
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .ignore_errors()
            .cmd("LEASE.ACQUIRE").arg("str").arg("me").arg("1000")
            .cmd("LEASE.ACQUIRE").arg("m1").arg("me").arg("0")
            .cmd("LEASE.ACQUIRE").arg("m2").arg("me").arg("60000")
            .query(&mut c)
            .expect("EXEC");
        assert_eq!(replies.len(), 3, "{replies:?}");
        assert!(matches!(&replies[0], Value::ServerError(e) if e.code() == "WRONGTYPE"), "{replies:?}");
        assert!(matches!(&replies[1], Value::ServerError(e) if e.details().unwrap_or("").contains("ttl-ms")), "{replies:?}");
        assert!(matches!(&replies[2], Value::Int(_)), "{replies:?}");
        assert_eq!(int(&ok(&mut c, &["EXISTS", "m1"])), 0);
    }
}
