//! ACL: key patterns apply to every lease command's key; the categories
//! derived from the flags (@write, @read, @fast) hold; servers with module
//! ACL categories (Valkey 8, Redis 7.4+) get a `lease` category.
mod common;
use common::*;

fn user(s: &Server, name: &str, rules: &[&str]) -> redis::Connection {
    let mut admin = s.conn();
    let mut args = vec!["ACL", "SETUSER", name, "on", ">pw"];
    args.extend(rules);
    ok(&mut admin, &args);
    let mut c = s.conn();
    ok(&mut c, &["AUTH", name, "pw"]);
    c
}

fn noperm(c: &mut redis::Connection, args: &[&str]) {
    let e = err(c, args);
    assert!(e.starts_with("NOPERM"), "{args:?}: {e}");
}

full_suite! {
    fn key_patterns_apply_to_every_lease_command(kind) {
        let s = Server::start(kind);
        let mut admin = s.conn();
        let t = int(&ok(&mut admin, &["LEASE.ACQUIRE", "other:1", "boss", "60000"])).to_string();
        let mut c = user(&s, "worker", &["~jobs:*", "+@all"]);
        // Inside its patterns: everything works.
        let mine = int(&ok(&mut c, &["LEASE.ACQUIRE", "jobs:1", "w", "60000"])).to_string();
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "jobs:1", "w", "60000"])), 1);
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "jobs:1", &mine]), Value::Okay);
        assert!(matches!(ok(&mut c, &["LEASE.INFO", "jobs:1"]), Value::Array(_)));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "jobs:1", "w"])), 1);
        // Outside: every command is refused, and nothing changes.
        noperm(&mut c, &["LEASE.ACQUIRE", "other:2", "w", "60000"]);
        noperm(&mut c, &["LEASE.RENEW", "other:1", "boss", "60000"]);
        noperm(&mut c, &["LEASE.RELEASE", "other:1", "boss"]);
        noperm(&mut c, &["LEASE.FENCE", "other:1", &t]);
        noperm(&mut c, &["LEASE.FENCE", "other:1", &t, "SET", "jobs:x", "1"]);
        noperm(&mut c, &["LEASE.INFO", "other:1"]);
        assert_eq!(int(&ok(&mut admin, &["EXISTS", "other:2", "jobs:x"])), 0);
        let info = ok(&mut admin, &["LEASE.INFO", "other:1"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(t.parse().unwrap())));
    }

    fn read_only_keys_allow_info_and_fence_but_no_writes(kind) {
        let s = Server::start(kind);
        let mut admin = s.conn();
        let t = int(&ok(&mut admin, &["LEASE.ACQUIRE", "k", "boss", "60000"])).to_string();
        let mut c = user(&s, "watcher", &["%R~*", "+@all"]);
        assert!(matches!(ok(&mut c, &["LEASE.INFO", "k"]), Value::Array(_)));
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "k", &t]), Value::Okay);
        noperm(&mut c, &["LEASE.ACQUIRE", "k2", "w", "60000"]);
        noperm(&mut c, &["LEASE.RELEASE", "k", "boss"]);
        noperm(&mut c, &["LEASE.RENEW", "k", "boss", "60000"]);
    }

    fn categories_from_the_flags_hold(kind) {
        let s = Server::start(kind);
        let mut admin = s.conn();
        let t = int(&ok(&mut admin, &["LEASE.ACQUIRE", "k", "boss", "60000"])).to_string();
        let Value::Array(writes) = ok(&mut admin, &["ACL", "CAT", "write"]) else { panic!() };
        if !writes.contains(&Value::BulkString(b"LEASE.ACQUIRE".to_vec())) {
            // Redis 7.0 puts module commands in no category (module ACL
            // categories came with 7.2): there, commands are named.
            assert!(kind.is_redis70(), "{kind:?} has module ACL categories");
            let mut c = user(&s, "named", &["~*", "+@all", "-lease.acquire", "-lease.release", "-lease.renew"]);
            noperm(&mut c, &["LEASE.ACQUIRE", "k2", "w", "60000"]);
            noperm(&mut c, &["LEASE.RELEASE", "k", "boss"]);
            assert_eq!(ok(&mut c, &["LEASE.FENCE", "k", &t]), Value::Okay);
            return;
        }
        let mut reader = user(&s, "reader", &["~*", "+@all", "-@write"]);
        noperm(&mut reader, &["LEASE.ACQUIRE", "k2", "w", "60000"]);
        noperm(&mut reader, &["LEASE.RENEW", "k", "boss", "60000"]);
        noperm(&mut reader, &["LEASE.RELEASE", "k", "boss"]);
        // LEASE.FENCE may write through its command, so it is in @write:
        // a reader can neither check nor smuggle a write past -@write.
        noperm(&mut reader, &["LEASE.FENCE", "k", &t]);
        noperm(&mut reader, &["LEASE.FENCE", "k", &t, "SET", "x", "1"]);
        let mut writer = user(&s, "writer", &["~*", "+@all", "-@read"]);
        noperm(&mut writer, &["LEASE.INFO", "k"]);
        assert_eq!(int(&ok(&mut writer, &["LEASE.RENEW", "k", "boss", "60000"])), 1);
    }

    fn the_lease_category_where_the_server_has_module_categories(kind) {
        let s = Server::start(kind);
        let mut admin = s.conn();
        match call(&mut admin, &[b"ACL", b"CAT", b"lease"]) {
            Ok(Value::Array(cmds)) => {
                let names: Vec<String> = cmds
                    .iter()
                    .map(|v| match v {
                        Value::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                for c in ["lease.acquire", "lease.renew", "lease.release", "lease.fence", "lease.info"] {
                    assert!(names.contains(&c.to_string()), "{c} not in @lease: {names:?}");
                }
                let mut c = user(&s, "nolease", &["~*", "+@all", "-@lease"]);
                noperm(&mut c, &["LEASE.ACQUIRE", "k", "w", "60000"]);
                assert_eq!(ok(&mut c, &["SET", "k", "v"]), Value::Okay);
            }
            Err(e) => {
                // Redis 7.0 cannot add module ACL categories.
                assert!(kind.is_redis70(), "{kind:?}: {e}");
                assert!(error_text(&e).contains("Unknown category"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
