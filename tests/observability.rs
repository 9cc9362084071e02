//! design.md S4 (OOM, eviction warning), S5 (INFO lease, keyspace
//! notifications, COMMAND INFO / DOCS / GETKEYS) and S6 (module
//! configuration): LEASE.ACQUIRE is flagged `blocking` and not `fast`, INFO
//! lease runs no CONFIG GET, and `lease_expired` counts each real expiry
//! once.
mod common;
use common::*;
use std::thread;
use std::time::Duration;

/// Every counter of `INFO lease` (the module's one list of them), and the
/// waiters and the last token, by their short names.
fn counters(c: &mut redis::Connection) -> Vec<(&'static str, i64)> {
    common::stats::NAMES
        .iter()
        .chain(&["waiters", "last_token"])
        .map(|n| (*n, info_int(c, &format!("lease_{n}"))))
        .collect()
}

/// Asserts the counters equal `expected` (short names; others as before).
fn assert_counters(
    c: &mut redis::Connection,
    base: &mut Vec<(&'static str, i64)>,
    changes: &[(&str, i64)],
    what: &str,
) {
    for (name, delta) in changes {
        let slot = base.iter_mut().find(|(n, _)| n == name).expect("counter");
        slot.1 += delta;
    }
    assert_eq!(&counters(c), base, "after {what}");
}

/// A subscriber on every keyspace and keyevent channel.
struct Watcher {
    con: redis::Connection,
}

impl Watcher {
    fn new(s: &Server) -> Watcher {
        let mut con = s.conn();
        con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        con.send_packed_command(
            &redis::cmd("PSUBSCRIBE")
                .arg("__key*__:*")
                .get_packed_command(),
        )
        .expect("PSUBSCRIBE");
        let confirm = con.recv_response().expect("PSUBSCRIBE confirmation");
        assert!(format!("{confirm:?}").contains("psubscribe"), "{confirm:?}");
        Watcher { con }
    }

    /// The next `n` messages as (channel, payload), failing after 5 s each.
    fn next(&mut self, n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| {
                let m = self
                    .con
                    .recv_response()
                    .unwrap_or_else(|e| panic!("message {i} of {n} did not come: {e}"));
                let Value::Array(parts) = &m else {
                    panic!("not a pubsub message: {m:?}")
                };
                assert_eq!(parts.len(), 4, "{m:?}");
                assert_eq!(text(&parts[0]), "pmessage", "{m:?}");
                (text(&parts[2]), text(&parts[3]))
            })
            .collect()
    }
}

/// The two messages one event on one key gives (keyspace, then keyevent).
fn event(key: &str, ev: &str) -> [(String, String); 2] {
    [
        (format!("__keyspace@0__:{key}"), ev.to_string()),
        (format!("__keyevent@0__:{ev}"), key.to_string()),
    ]
}

fn events(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().flat_map(|(k, e)| event(k, e)).collect()
}

/// COMMAND DOCS of one command, as its RESP2 flat field array.
fn command_docs(c: &mut redis::Connection, name: &str) -> Value {
    let v = ok(c, &["COMMAND", "DOCS", name]);
    let Value::Array(all) = v else {
        panic!("COMMAND DOCS {name}: {v:?}")
    };
    assert_eq!(all.len(), 2, "COMMAND DOCS {name}: {all:?}");
    assert_eq!(text(&all[0]).to_lowercase(), name.to_lowercase());
    all[1].clone()
}

full_suite! {
    fn info_lease_counts_every_outcome(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut base = counters(&mut c);
        assert!(base.iter().all(|(_, v)| *v == 0), "a fresh server starts at 0: {base:?}");

        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "alice", "60000"]));
        assert_counters(&mut c, &mut base, &[("acquired", 1), ("last_token", t)], "ACQUIRE");
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "k", "bob", "60000"]), Value::Nil);
        assert_counters(&mut c, &mut base, &[("contended", 1)], "contended ACQUIRE");
        ok(&mut c, &["LEASE.ACQUIRE", "k", "alice", "60000"]);
        assert_counters(&mut c, &mut base, &[("reacquired", 1)], "re-ACQUIRE");
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", "alice", "60000"])), 1);
        assert_counters(&mut c, &mut base, &[("renewed", 1)], "RENEW");
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", "bob", "60000"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "free", "bob", "60000"])), 0);
        assert_counters(&mut c, &mut base, &[("renew_failed", 2)], "failed RENEWs");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "bob"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "free", "bob"])), 0);
        assert_counters(&mut c, &mut base, &[("release_failed", 2)], "failed RELEASEs");
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "k", &t.to_string()]), Value::Okay);
        assert_counters(&mut c, &mut base, &[("fence_ok", 1)], "FENCE ok");
        err(&mut c, &["LEASE.FENCE", "k", &(t + 1).to_string()]);
        err(&mut c, &["LEASE.FENCE", "free", &t.to_string()]);
        assert_counters(&mut c, &mut base, &[("fence_stale", 2)], "stale FENCEs");
        ok(&mut c, &["LEASE.INFO", "k"]);
        assert_counters(&mut c, &mut base, &[], "LEASE.INFO");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "alice"])), 1);
        assert_counters(&mut c, &mut base, &[("released", 1)], "RELEASE");

        // A DEL of a live lease is not an expiry.
        let t2 = int(&ok(&mut c, &["LEASE.ACQUIRE", "d", "me", "60000"]));
        ok(&mut c, &["DEL", "d"]);
        assert_counters(&mut c, &mut base, &[("acquired", 1), ("last_token", t2 - t)], "DEL");

        // A lease that runs out counts as expired, without anyone touching it.
        let t3 = int(&ok(&mut c, &["LEASE.ACQUIRE", "e", "me", "100"]));
        assert!(
            wait_until(Duration::from_secs(10), || info_int(&mut c, "lease_expired") == 1),
            "lease_expired is still {} after 10 s",
            info_int(&mut c, "lease_expired")
        );
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
        assert_counters(
            &mut c,
            &mut base,
            &[("acquired", 1), ("expired", 1), ("last_token", t3 - t2)],
            "expiry",
        );

        // Malformed calls count as nothing.
        err(&mut c, &["LEASE.ACQUIRE", "k", "me", "0"]);
        err(&mut c, &["LEASE.RENEW", "k", "", "10"]);
        err(&mut c, &["LEASE.FENCE", "k", "0"]);
        assert_counters(&mut c, &mut base, &[], "malformed calls");
    }

    fn info_lease_counts_waiters_and_wait_timeouts(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "alice", "60000"]);
        // A waiter that times out.
        let mut w = s.conn();
        assert_eq!(ok(&mut w, &["LEASE.ACQUIRE", "k", "bob", "60000", "BLOCK", "50"]), Value::Nil);
        assert_eq!(info_int(&mut c, "lease_wait_timeouts"), 1);
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
        // A waiter that is served.
        let handle = std::thread::spawn(move || {
            ok(&mut w, &["LEASE.ACQUIRE", "k", "bob", "60000", "BLOCK", "0"])
        });
        assert!(
            wait_until(Duration::from_secs(5), || info_int(&mut c, "lease_waiters") == 1),
            "the blocked client is not counted in lease_waiters"
        );
        let info = ok(&mut c, &["LEASE.INFO", "k"]);
        assert_eq!(field(&info, "waiters"), Some(Value::Int(1)));
        let acquired = info_int(&mut c, "lease_acquired");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "alice"])), 1);
        let t = int(&handle.join().unwrap());
        assert_eq!(info_int(&mut c, "lease_waiters"), 0);
        assert_eq!(info_int(&mut c, "lease_acquired"), acquired + 1);
        assert_eq!(info_int(&mut c, "lease_last_token"), t);
        assert_eq!(info_int(&mut c, "lease_wait_timeouts"), 1);
    }

    fn keyspace_notifications_for_acquire_renew_release(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEd"]);
        let mut w = Watcher::new(&s);
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "alice", "60000"]));
        // No event for what changes nothing.
        ok(&mut c, &["LEASE.ACQUIRE", "k", "bob", "60000"]);
        // The idempotent re-acquire moves the expiry: a renew event.
        ok(&mut c, &["LEASE.ACQUIRE", "k", "alice", "60000"]);
        ok(&mut c, &["LEASE.RENEW", "k", "bob", "60000"]);
        ok(&mut c, &["LEASE.RELEASE", "k", "bob"]);
        ok(&mut c, &["LEASE.FENCE", "k", &t.to_string()]);
        ok(&mut c, &["LEASE.INFO", "k"]);
        ok(&mut c, &["LEASE.RENEW", "k", "alice", "60000"]);
        ok(&mut c, &["LEASE.RELEASE", "k", "alice"]);
        ok(&mut c, &["LEASE.RENEW", "k", "alice", "60000"]);
        // A sentinel: nothing else may come before it.
        ok(&mut c, &["LEASE.ACQUIRE", "end", "x", "60000"]);
        assert_eq!(
            w.next(10),
            events(&[
                ("k", "lease.acquire"),
                ("k", "lease.renew"),
                ("k", "lease.renew"),
                ("k", "lease.release"),
                ("end", "lease.acquire"),
            ])
        );
    }

    fn keyspace_notification_for_expiry(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEdx"]);
        let mut w = Watcher::new(&s);
        ok(&mut c, &["LEASE.ACQUIRE", "short", "me", "100"]);
        // Nobody touches the key: the server expires it and says so.
        assert_eq!(
            w.next(4),
            events(&[("short", "lease.acquire"), ("short", "expired")])
        );
    }

    fn lease_events_are_module_events_class_d(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // Generic events only: no lease event, the DEL is the first message.
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEg"]);
        let mut w = Watcher::new(&s);
        ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "60000"]);
        ok(&mut c, &["LEASE.RENEW", "k", "me", "60000"]);
        ok(&mut c, &["LEASE.RELEASE", "k", "me"]);
        ok(&mut c, &["SET", "plain", "v"]);
        ok(&mut c, &["DEL", "plain"]);
        assert_eq!(w.next(2), events(&[("plain", "del")]));
    }

    fn command_info_describes_every_command(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // (name, arity, flags that must be there, flags that must not)
        let table: [(&str, i64, &[&str], &[&str]); 5] = [
            // ACQUIRE may block (BLOCK): blocking, so not fast.
            ("lease.acquire", -4, &["write", "denyoom", "blocking"], &["readonly", "fast"]),
            ("lease.renew", 4, &["write", "fast"], &["readonly", "denyoom"]),
            ("lease.release", 3, &["write", "fast"], &["readonly", "denyoom"]),
            // FENCE may run a write of any cost: write (so scripts that
            // fenced a write are unkillable and clients route it to
            // masters), not denyoom (the check works under OOM), not fast.
            ("lease.fence", -3, &["write"], &["readonly", "denyoom", "fast"]),
            ("lease.info", 2, &["readonly", "fast"], &["write", "denyoom"]),
        ];
        for (name, arity, has, has_not) in table {
            let info = command_info(&mut c, name);
            assert_eq!(text(&info[0]).to_lowercase(), name);
            assert_eq!(info[1], Value::Int(arity), "{name} arity");
            let flags = strings(&info[2]);
            for f in has {
                assert!(flags.iter().any(|x| x == f), "{name} lacks flag {f}: {flags:?}");
            }
            for f in has_not {
                assert!(!flags.iter().any(|x| x == f), "{name} has flag {f}: {flags:?}");
            }
            assert_eq!(&info[3..6], &[Value::Int(1), Value::Int(1), Value::Int(1)], "{name} first/last/step");
            // Key specs (Redis 7+): one key at index 1.
            let specs = format!("{:?}", info.get(8));
            assert!(specs.contains("index"), "{name} key specs: {specs}");
        }
        // All five appear in COMMAND LIST FILTERBY MODULE lease.
        let mut listed = strings(&ok(&mut c, &["COMMAND", "LIST", "FILTERBY", "MODULE", "lease"]));
        listed.sort();
        for (name, ..) in table {
            assert!(listed.iter().any(|x| x.eq_ignore_ascii_case(name)), "{name} not listed: {listed:?}");
        }
    }

    fn command_docs_describe_every_command(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let table: [(&str, &[&str]); 5] = [
            ("lease.acquire", &["key", "owner", "ttl-ms"]),
            ("lease.renew", &["key", "owner", "ttl-ms"]),
            ("lease.release", &["key", "owner"]),
            ("lease.fence", &["key", "token"]),
            ("lease.info", &["key"]),
        ];
        for (name, first_args) in table {
            let docs = command_docs(&mut c, name);
            let summary = text(&field(&docs, "summary").unwrap_or_else(|| panic!("{name}: no summary")));
            assert!(summary.len() > 10, "{name} summary {summary:?}");
            assert!(field(&docs, "complexity").is_some(), "{name}: no complexity");
            assert_eq!(field(&docs, "module").map(|v| text(&v)), Some("lease".into()));
            let Some(Value::Array(args)) = field(&docs, "arguments") else {
                panic!("{name}: no arguments in {docs:?}")
            };
            assert!(args.len() >= first_args.len(), "{name}: {args:?}");
            for (i, want) in first_args.iter().enumerate() {
                let got = field(&args[i], "name").map(|v| text(&v));
                assert_eq!(got.as_deref(), Some(*want), "{name} argument {i}");
            }
            assert_eq!(field(&args[0], "type").map(|v| text(&v)), Some("key".into()), "{name}");
        }
        // ACQUIRE documents its BLOCK option as optional.
        let docs = command_docs(&mut c, "lease.acquire");
        let Some(Value::Array(args)) = field(&docs, "arguments") else { unreachable!() };
        let block = args
            .iter()
            .find(|a| field(a, "token").map(|v| text(&v)) == Some("BLOCK".into()))
            .unwrap_or_else(|| panic!("no BLOCK argument in {args:?}"));
        let flags = format!("{:?}", field(block, "flags"));
        assert!(flags.contains("optional"), "BLOCK flags {flags}");
    }

    fn command_getkeys_finds_the_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        for args in [
            &["LEASE.ACQUIRE", "k", "o", "100"][..],
            &["LEASE.ACQUIRE", "k", "o", "100", "BLOCK", "10"],
            &["LEASE.RENEW", "k", "o", "100"],
            &["LEASE.RELEASE", "k", "o"],
            &["LEASE.FENCE", "k", "1"],
            &["LEASE.INFO", "k"],
        ] {
            let mut full = vec!["COMMAND", "GETKEYS"];
            full.extend_from_slice(args);
            assert_eq!(strings(&ok(&mut c, &full)), vec!["k".to_string()], "{args:?}");
        }
    }

    fn max_ttl_from_loadmodule_arguments(kind) {
        let s = Server::start_with(kind, Opts::default().module_args(&["max-ttl-ms", "1000"]));
        let mut c = s.conn();
        let e = err(&mut c, &["LEASE.ACQUIRE", "k", "me", "1001"]);
        assert!(e.contains("ttl-ms"), "{e}");
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
        assert!(matches!(ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "1000"]), Value::Int(_)));
        let e = err(&mut c, &["LEASE.RENEW", "k", "me", "1001"]);
        assert!(e.contains("ttl-ms"), "{e}");
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", "me", "1000"])), 1);
        assert_eq!(
            strings(&ok(&mut c, &["CONFIG", "GET", "lease.max-ttl-ms"])),
            vec!["lease.max-ttl-ms".to_string(), "1000".to_string()]
        );
        assert_eq!(info_int(&mut c, "lease_max_ttl_ms"), 1000);

        // CONFIG SET changes the limit at once.
        assert_eq!(ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "5000"]), Value::Okay);
        assert_eq!(
            strings(&ok(&mut c, &["CONFIG", "GET", "lease.max-ttl-ms"]))[1],
            "5000"
        );
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", "me", "5000"])), 1);
        assert!(err(&mut c, &["LEASE.ACQUIRE", "k2", "me", "5001"]).contains("ttl-ms"));
        ok(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", "500"]);
        assert!(err(&mut c, &["LEASE.ACQUIRE", "k2", "me", "501"]).contains("ttl-ms"));
        assert!(matches!(ok(&mut c, &["LEASE.ACQUIRE", "k2", "me", "500"]), Value::Int(_)));
        // Invalid values are refused and leave the limit alone.
        for bad in ["0", "-1", "abc", "1.5", ""] {
            err(&mut c, &["CONFIG", "SET", "lease.max-ttl-ms", bad]);
        }
        assert_eq!(strings(&ok(&mut c, &["CONFIG", "GET", "lease.max-ttl-ms"]))[1], "500");
    }

    fn max_ttl_from_the_server_configuration(kind) {
        // Module configs as a config-file / command-line setting.
        let s = Server::start_with(kind, Opts::default().extra(&["--lease.max-ttl-ms", "2000"]));
        let mut c = s.conn();
        assert_eq!(strings(&ok(&mut c, &["CONFIG", "GET", "lease.max-ttl-ms"]))[1], "2000");
        assert!(err(&mut c, &["LEASE.ACQUIRE", "k", "me", "2001"]).contains("ttl-ms"));
        assert!(matches!(ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "2000"]), Value::Int(_)));
        // The `lease.` prefix is accepted as a loadmodule argument too.
        let s = Server::start_with(kind, Opts::default().module_args(&["lease.max-ttl-ms", "3000"]));
        let mut c = s.conn();
        assert_eq!(strings(&ok(&mut c, &["CONFIG", "GET", "lease.max-ttl-ms"]))[1], "3000");
        // Default: one minute (design.md S7); grace-ms -1, "as max-ttl-ms".
        let s = Server::start_with(kind, Opts::default().module_args(&["grace-ms", "-1"]));
        let mut c = s.conn();
        assert_eq!(strings(&ok(&mut c, &["CONFIG", "GET", "lease.max-ttl-ms"]))[1], "60000");
        assert_eq!(strings(&ok(&mut c, &["CONFIG", "GET", "lease.grace-ms"]))[1], "-1");
    }

    fn bad_loadmodule_arguments_fail_the_load_with_a_clear_log_line(kind) {
        let cases: [(&[&str], &[&str]); 5] = [
            (&["bogus", "1"], &["bogus"]),
            (&["max-ttl-ms", "zero"], &["max-ttl-ms", "zero"]),
            (&["max-ttl-ms", "0"], &["max-ttl-ms"]),
            (&["max-ttl-ms", "1000", "max-ttl-ms", "2000"], &["max-ttl-ms", "more than once"]),
            (&["max-ttl-ms"], &["max-ttl-ms", "value"]),
        ];
        for (args, needles) in cases {
            match Server::try_start(kind, Opts::default().module_args(args)) {
                Ok(_) => panic!("the server started with module arguments {args:?}"),
                Err(e) => {
                    let line = e
                        .log
                        .lines()
                        .find(|l| l.contains("lease") && needles.iter().all(|n| l.contains(n)))
                        .unwrap_or_else(|| panic!("no log line naming {needles:?} for {args:?}:\n{}", e.log));
                    assert!(!line.contains("panic"), "{line}");
                }
            }
        }
    }

    fn module_load_at_runtime_checks_its_arguments(kind) {
        let s = Server::start_with(
            kind,
            Opts { no_module: true, ..Opts::default() }.extra(&["--enable-module-command", "yes"]),
        );
        let mut c = s.conn();
        let path = module_path();
        let path = path.to_str().unwrap();
        let e = err(&mut c, &["MODULE", "LOAD", path, "bogus", "1"]);
        assert!(e.starts_with("ERR") && !e.contains("not allowed"), "{e}");
        assert!(
            s.log().lines().any(|l| l.contains("lease") && l.contains("bogus")),
            "no log line naming the bad argument:\n{}",
            s.log()
        );
        assert_eq!(ok(&mut c, &["COMMAND", "INFO", "LEASE.ACQUIRE"]), Value::Array(vec![Value::Nil]));
        assert_eq!(ok(&mut c, &["MODULE", "LOAD", path, "max-ttl-ms", "1234"]), Value::Okay);
        assert_eq!(info_int(&mut c, "lease_max_ttl_ms"), 1234);
        assert!(matches!(ok(&mut c, &["LEASE.ACQUIRE", "k", "me", "1234"]), Value::Int(_)));
    }

    fn under_oom_acquire_is_refused_but_the_holder_keeps_control(kind) {
        let s = Server::start_with(kind, Opts::default().extra(&["--maxmemory-policy", "noeviction"]));
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "held", "me", "60000"]));
        let ts = t.to_string();
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
        let e = err(&mut c, &["LEASE.ACQUIRE", "new", "me", "60000"]);
        assert!(e.starts_with("OOM"), "ACQUIRE under OOM: {e}");
        assert_eq!(int(&ok(&mut c, &["EXISTS", "new"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "held", "me", "60000"])), 1);
        let info = ok(&mut c, &["LEASE.INFO", "held"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(t)));
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "held", &ts]), Value::Okay);
        assert!(err(&mut c, &["LEASE.FENCE", "held", "1"]).starts_with("STALE"));
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "held", "other", "60000"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "held", "other"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "held", "me"])), 1);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
        assert!(int(&ok(&mut c, &["LEASE.ACQUIRE", "new", "me", "60000"])) > t);
    }

    fn eviction_policy_warning_in_the_log_and_info(kind) {
        let s = Server::start_with(kind, Opts::default().extra(&["--maxmemory-policy", "allkeys-lru"]));
        let mut c = s.conn();
        let log = s.log();
        assert!(
            log.lines().any(|l| l.contains("lease") && l.contains("maxmemory-policy") && l.contains("allkeys-lru")),
            "no warning about maxmemory-policy in the log:\n{log}"
        );
        assert_eq!(info_int(&mut c, "lease_eviction_may_lose_leases"), 1);

        let s2 = Server::start_with(kind, Opts::default().extra(&["--maxmemory-policy", "noeviction"]));
        let mut c2 = s2.conn();
        assert_eq!(info_int(&mut c2, "lease_eviction_may_lose_leases"), 0);
        assert!(
            !s2.log().lines().any(|l| l.contains("lease") && l.contains("maxmemory-policy")),
            "a warning with noeviction:\n{}",
            s2.log()
        );
        // INFO follows the policy as it changes.
        ok(&mut c2, &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
        assert_eq!(info_int(&mut c2, "lease_eviction_may_lose_leases"), 1);
        ok(&mut c2, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        assert_eq!(info_int(&mut c2, "lease_eviction_may_lose_leases"), 0);
        drop(c);
    }
}

/// Waits until `lease_expired` is `expect`, then checks it stays there.
fn settle(c: &mut redis::Connection, what: &str, expect: i64) {
    let reached = wait_until(Duration::from_secs(1), || {
        info_int(c, "lease_expired") == expect
    });
    let now = info_int(c, "lease_expired");
    assert!(reached, "{what}: lease_expired {now} (expected {expect})");
    thread::sleep(Duration::from_millis(50));
    assert_eq!(
        info_int(c, "lease_expired"),
        expect,
        "{what}: counted once only"
    );
}

full_suite! {
    // LEASE.ACQUIRE can block (BLOCK): it is flagged `blocking`, and not
    // `fast`.
    fn acquire_is_flagged_blocking_and_not_fast(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let flags = command_flags(&mut c, "LEASE.ACQUIRE");
        assert!(
            flags.iter().any(|f| f == "blocking"),
            "LEASE.ACQUIRE flags {flags:?}"
        );
        assert!(
            !flags.iter().any(|f| f == "fast"),
            "LEASE.ACQUIRE flags {flags:?}"
        );
    }

    // INFO lease shows the maxmemory policy, and follows CONFIG SET, without
    // running CONFIG GET through RM_Call (which would show in INFO commandstats
    // and SLOWLOG).
    fn info_lease_runs_no_config_get(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "RESETSTAT"]);
        for _ in 0..5 {
            let section: String = redis::cmd("INFO").arg("lease").query(&mut c).unwrap();
            assert!(
                section.contains("lease_maxmemory_policy:noeviction"),
                "{section}"
            );
        }
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .unwrap();
        let config_get: Vec<&str> = stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_config:") || l.starts_with("cmdstat_config|get:"))
            .collect();
        assert!(
            config_get.is_empty(),
            "INFO lease ran CONFIG GET: {config_get:?}"
        );
        assert!(
            stats.contains("cmdstat_info:calls=5"),
            "commandstats counts: {stats}"
        );

        ok(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        ok(&mut c, &["SLOWLOG", "RESET"]);
        let _: String = redis::cmd("INFO").arg("lease").query(&mut c).unwrap();
        let Value::Array(entries) = ok(&mut c, &["SLOWLOG", "GET", "100"]) else {
            panic!("SLOWLOG GET")
        };
        let names: Vec<Vec<String>> = entries
            .iter()
            .map(|e| match e {
                Value::Array(parts) => strings(&parts[3]),
                other => panic!("slowlog entry {other:?}"),
            })
            .collect();
        assert!(
            names
                .iter()
                .any(|args| args[0].eq_ignore_ascii_case("info")),
            "the slowlog records every command: {names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|args| args[0].eq_ignore_ascii_case("config")),
            "INFO lease left a CONFIG entry in the slowlog: {names:?}"
        );

        ok(
            &mut c,
            &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
        );
        assert_eq!(
            info_field(&mut c, "lease_maxmemory_policy").as_deref(),
            Some("allkeys-lru")
        );
    }

    // `lease_expired` counts every lease that reached its deadline exactly
    // once; a RELEASE or a DEL counts none, and neither does a key expired
    // before its lease's deadline by a shorter PEXPIRE (told apart at the
    // unlink, without a keyspace subscription that every write would pay
    // for: design.md S11).
    fn expired_counts_each_lease_that_reached_its_deadline_once(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut expect = info_int(&mut c, "lease_expired");
        acquire(&mut c, "early", "me", "60000");
        assert_eq!(int(&ok(&mut c, &["PEXPIRE", "early", "100"])), 1);
        assert!(
            wait_until(Duration::from_secs(3), || !exists(&mut c, "early")),
            "early never expired"
        );
        settle(&mut c, "PEXPIRE 100 on a 60 s lease", expect);

        acquire(&mut c, "normal", "me", "100");
        assert!(
            wait_until(Duration::from_secs(3), || !exists(&mut c, "normal")),
            "normal never expired"
        );
        expect += 1;
        settle(&mut c, "a 100 ms lease", expect);

        acquire(&mut c, "released", "me", "60000");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "released", "me"])), 1);
        acquire(&mut c, "deleted", "me", "60000");
        assert_eq!(int(&ok(&mut c, &["DEL", "deleted"])), 1);
        settle(&mut c, "a RELEASE and a DEL", expect);
    }
}
