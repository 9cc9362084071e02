//! LEASE.FENCE key token command [arg ...]: the command runs only with the
//! current token, as the caller (ACL), refused for blocking, lease and
//! deny-script commands, replicated and AOF-logged once; the Lua way; and a
//! contention test proving no stale write lands. LEASE.FENCE is flagged
//! `write`: a read-only replica refuses it, and a script that wrote through
//! it cannot be killed. XREAD and XREADGROUP run through it without BLOCK,
//! and noscript subcommands are refused before the token is checked.
mod common;
use common::*;

use std::thread;
use std::time::{Duration, Instant};

/// The command names of an AOF in RESP form, lower-cased.
fn aof_command_names(aof: &str) -> Vec<String> {
    let lines: Vec<&str> = aof.split("\r\n").collect();
    let mut names = Vec::new();
    for i in 0..lines.len().saturating_sub(2) {
        if lines[i].starts_with('*') && lines[i + 1].starts_with('$') {
            names.push(lines[i + 2].to_lowercase());
        }
    }
    names
}

fn bulk(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Nil => None,
        other => panic!("expected a bulk string, got {other:?}"),
    }
}

full_suite! {
    fn refusals_name_the_problem_and_run_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        for (args, expect) in [
            (vec!["BLPOP", "list", "0"], "blocking"),
            (vec!["BRPOPLPUSH", "a", "b", "0"], "blocking"),
            (vec!["SUBSCRIBE", "ch"], "scripts"),
            (vec!["MULTI"], "scripts"),
            (vec!["LEASE.RELEASE", "lock", "me"], "lease commands"),
            (vec!["lease.fence", "lock", "1"], "lease commands"),
            (vec!["NOSUCHCOMMAND", "x"], "unknown command"),
            (vec!["GET"], "wrong number of arguments"),
        ] {
            let mut full = vec!["LEASE.FENCE", "lock", t.as_str()];
            full.extend(args.iter());
            let e = err(&mut c, &full);
            assert!(e.starts_with("ERR") && e.contains(expect), "{args:?}: {e}");
        }
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "lock", "me"])), 1, "the lease was not released");
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
    }

    fn the_command_runs_with_the_callers_acl_permissions(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        ok(&mut c, &["ACL", "SETUSER", "worker", "on", ">pw", "~lock", "~acct:*", "+@all", "-flushall"]);
        ok(&mut c, &["ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@read", "+lease.fence"]);
        let mut w = s.conn();
        ok(&mut w, &["AUTH", "worker", "pw"]);
        assert_eq!(ok(&mut w, &["LEASE.FENCE", "lock", &t, "SET", "acct:1", "x"]), Value::Okay);
        // A key outside the user's patterns.
        let e = err(&mut w, &["LEASE.FENCE", "lock", &t, "SET", "other", "x"]);
        assert!(e.starts_with("NOPERM"), "{e}");
        // A command the user may not run.
        let e = err(&mut w, &["LEASE.FENCE", "lock", &t, "FLUSHALL"]);
        assert!(e.starts_with("NOPERM"), "{e}");
        // A read-only user cannot write through the fence.
        let mut r = s.conn();
        ok(&mut r, &["AUTH", "reader", "pw"]);
        let e = err(&mut r, &["LEASE.FENCE", "lock", &t, "SET", "acct:2", "x"]);
        assert!(e.starts_with("NOPERM"), "{e}");
        assert_eq!(bulk(&ok(&mut r, &["LEASE.FENCE", "lock", &t, "GET", "acct:1"])).as_deref(), Some("x"));
        assert_eq!(int(&ok(&mut c, &["EXISTS", "other", "acct:2"])), 0);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 2, "lock and acct:1 only");
    }

    fn the_inner_commands_keys_are_declared(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let keys = |c: &mut redis::Connection, args: &[&str]| {
            let mut full = vec!["COMMAND", "GETKEYS", "LEASE.FENCE", "lock", "1"];
            full.extend(args);
            strings(&ok(c, &full))
        };
        assert_eq!(keys(&mut c, &[]), ["lock"]);
        assert_eq!(keys(&mut c, &["HSET", "acct", "f", "v"]), ["lock", "acct"]);
        assert_eq!(keys(&mut c, &["MSET", "a", "1", "b", "2"]), ["lock", "a", "b"]);
        assert_eq!(keys(&mut c, &["PING"]), ["lock"]);
        assert_eq!(keys(&mut c, &["NOSUCHCOMMAND", "x"]), ["lock"]);
    }

    fn oom_rules_follow_the_inner_command(kind) {
        let s = Server::start_with(kind, Opts::default().extra(&["--maxmemory-policy", "noeviction"]));
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        ok(&mut c, &["SET", "v", "1"]);
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
        let e = err(&mut c, &["LEASE.FENCE", "lock", &t, "SET", "v", "2"]);
        assert!(e.starts_with("OOM"), "{e}");
        assert_eq!(bulk(&ok(&mut c, &["LEASE.FENCE", "lock", &t, "GET", "v"])).as_deref(), Some("1"));
        assert_eq!(int(&ok(&mut c, &["LEASE.FENCE", "lock", &t, "DEL", "v"])), 1, "DEL is allowed under OOM");
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "lock", &t]), Value::Okay);
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    }

    fn the_lua_way_aborts_the_script_before_its_writes(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock", "me", "30000").to_string();
        let script = "redis.call('LEASE.FENCE', KEYS[1], ARGV[1]); redis.call('HSET', KEYS[2], 'balance', ARGV[2]); return 1";
        assert_eq!(int(&ok(&mut c, &["EVAL", script, "2", "lock", "acct:7", &t, "90"])), 1);
        let stale = (t.parse::<i64>().unwrap() - 1).to_string();
        let e = err(&mut c, &["EVAL", script, "2", "lock", "acct:7", &stale, "10"]);
        assert!(e.contains("STALE"), "{e}");
        assert_eq!(bulk(&ok(&mut c, &["HGET", "acct:7", "balance"])).as_deref(), Some("90"));
        // The fence with a command works from a script too.
        let inner = "return redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'HINCRBY', KEYS[2], 'balance', 5)";
        assert_eq!(int(&ok(&mut c, &["EVAL", inner, "2", "lock", "acct:7", &t])), 95);
    }

}

/// The contention test: workers take a short lease, sometimes pause longer
/// than the lease, then append "token:worker" to one list. Checks that the
/// tokens in the list never go down and that each token has one writer.
fn contention(kind: Kind, fenced: bool) -> Vec<(i64, usize)> {
    let s = Server::start(kind);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let mut c = s.conn();
            thread::spawn(move || {
                let owner = format!("worker-{w}");
                let mut rounds = 0;
                let start = Instant::now();
                // 12 rounds, within 20 s and 1000 attempts.
                for _attempt in 0..1000 {
                    if rounds >= 12 || start.elapsed() >= Duration::from_secs(20) {
                        break;
                    }
                    let Value::Int(token) = ok(
                        &mut c,
                        &["LEASE.ACQUIRE", "lock", &owner, "60", "BLOCK", "2000"],
                    ) else {
                        continue;
                    };
                    rounds += 1;
                    // Every third round pauses past the lease (a GC pause).
                    let pause = if rounds % 3 == 0 { 150 } else { 5 };
                    thread::sleep(Duration::from_millis(pause));
                    let entry = format!("{token}:{w}");
                    let _ = if fenced {
                        call(
                            &mut c,
                            &[
                                b"LEASE.FENCE",
                                b"lock",
                                token.to_string().as_bytes(),
                                b"RPUSH",
                                b"writes",
                                entry.as_bytes(),
                            ],
                        )
                    } else {
                        call(&mut c, &[b"RPUSH", b"writes", entry.as_bytes()])
                    };
                    let _ = call(&mut c, &[b"LEASE.RELEASE", b"lock", owner.as_bytes()]);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let mut c = s.conn();
    let Value::Array(items) = ok(&mut c, &["LRANGE", "writes", "0", "-1"]) else {
        panic!("no list")
    };
    items
        .iter()
        .map(|v| {
            let s = bulk(v).unwrap();
            let (t, w) = s.split_once(':').unwrap();
            (t.parse().unwrap(), w.parse().unwrap())
        })
        .collect()
}

/// The invariant: tokens never decrease along the list, and a token is
/// written by one worker only. Returns the violations.
fn violations(writes: &[(i64, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut writer = std::collections::HashMap::new();
    for pair in writes.windows(2) {
        if pair[1].0 < pair[0].0 {
            out.push(format!("token {} written after {}", pair[1].0, pair[0].0));
        }
    }
    for &(t, w) in writes {
        if *writer.entry(t).or_insert(w) != w {
            out.push(format!("token {t} written by two workers"));
        }
    }
    out
}

full_suite! {
    fn contention_no_stale_write_lands_through_the_fence(kind) {
        let fenced = contention(kind, true);
        assert!(fenced.len() >= 10, "too few writes: {fenced:?}");
        assert_eq!(violations(&fenced), Vec::<String>::new(), "{fenced:?}");
        // The same workload without the fence lets stale writes land, so the
        // check above would fail if the fence did nothing.
        let unfenced = contention(kind, false);
        assert!(!violations(&unfenced).is_empty(), "the unfenced run should show stale writes: {unfenced:?}");
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn the_command_runs_only_with_the_current_token(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "lock:acct", "me", "30000").to_string();
        assert_eq!(int(&ok(&mut c, &["LEASE.FENCE", "lock:acct", &t, "HSET", "acct:7", "balance", "90"])), 1);
        assert_eq!(bulk(&ok(&mut c, &["HGET", "acct:7", "balance"])).as_deref(), Some("90"));
        // Reads pass the reply through, in the caller's protocol.
        assert_eq!(bulk(&ok(&mut c, &["LEASE.FENCE", "lock:acct", &t, "HGET", "acct:7", "balance"])).as_deref(), Some("90"));
        let mut c3 = s.conn3();
        assert!(matches!(ok(&mut c3, &["LEASE.FENCE", "lock:acct", &t, "HGETALL", "acct:7"]), Value::Map(_)));
        // Stale: an older token, a free key, an expired lease.
        let old = (t.parse::<i64>().unwrap() - 1).to_string();
        let e = err(&mut c, &["LEASE.FENCE", "lock:acct", &old, "HSET", "acct:7", "balance", "0"]);
        assert!(e.starts_with("STALE"), "{e}");
        ok(&mut c, &["LEASE.RELEASE", "lock:acct", "me"]);
        let e = err(&mut c, &["LEASE.FENCE", "lock:acct", &t, "HSET", "acct:7", "balance", "0"]);
        assert!(e.starts_with("STALE"), "{e}");
        let t2 = acquire(&mut c, "lock:acct", "me", "50").to_string();
        assert!(wait_until(Duration::from_secs(2), || ok(&mut c, &["LEASE.INFO", "lock:acct"]) == Value::Nil));
        let e = err(&mut c, &["LEASE.FENCE", "lock:acct", &t2, "HSET", "acct:7", "balance", "0"]);
        assert!(e.starts_with("STALE"), "{e}");
        assert_eq!(bulk(&ok(&mut c, &["HGET", "acct:7", "balance"])).as_deref(), Some("90"), "no stale write landed");
        assert_eq!(info_field(&mut c, "lease_fence_stale").as_deref(), Some("3"));
    }

    fn the_inner_command_is_replicated_and_logged_once(kind) {
        let master = Server::start_with(kind, Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", "no"]));
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let mut r = replica.conn();
        let t = acquire(&mut m, "lock", "me", "30000").to_string();
        ok(&mut m, &["LEASE.FENCE", "lock", &t, "RPUSH", "log", "a"]);
        ok(&mut m, &["LEASE.FENCE", "lock", &t, "INCR", "n"]);
        let stale = (t.parse::<i64>().unwrap() - 1).to_string();
        err(&mut m, &["LEASE.FENCE", "lock", &stale, "RPUSH", "log", "stale"]);
        assert!(wait_until(Duration::from_secs(5), || ok(&mut r, &["GET", "n"]) == Value::BulkString(b"1".to_vec())));
        assert_eq!(ok(&mut r, &["LRANGE", "log", "0", "-1"]), Value::Array(vec![Value::BulkString(b"a".to_vec())]));
        // LEASE.FENCE is a write command (it may run one): a read-only
        // replica refuses both forms, as it refuses SET; its LEASE.INFO
        // shows the master's token.
        let e = err(&mut r, &["LEASE.FENCE", "lock", &t]);
        assert!(e.starts_with("READONLY"), "{e}");
        assert_eq!(field(&ok(&mut r, &["LEASE.INFO", "lock"]), "token"), Some(Value::Int(t.parse().unwrap())));
        let e = err(&mut r, &["LEASE.FENCE", "lock", &t, "INCR", "n"]);
        assert!(e.contains("READONLY") || e.contains("read only"), "{e}");
        // The AOF has the inner commands once each and no LEASE.FENCE.
        let mut aof = String::new();
        for entry in std::fs::read_dir(master.data_dir().join("appendonlydir")).unwrap() {
            let p = entry.unwrap().path();
            if p.to_string_lossy().contains(".incr.aof") {
                aof.push_str(&String::from_utf8_lossy(&std::fs::read(p).unwrap()));
            }
        }
        let names = aof_command_names(&aof);
        assert_eq!(names.iter().filter(|n| *n == "rpush").count(), 1, "{names:?}");
        assert_eq!(names.iter().filter(|n| *n == "incr").count(), 1, "{names:?}");
        assert!(!names.iter().any(|n| n == "lease.fence"), "{names:?}");
        // Replaying the AOF ends in the same state.
        ok(&mut m, &["DEBUG", "LOADAOF"]);
        assert_eq!(ok(&mut m, &["GET", "n"]), Value::BulkString(b"1".to_vec()));
        assert_eq!(ok(&mut m, &["LRANGE", "log", "0", "-1"]), Value::Array(vec![Value::BulkString(b"a".to_vec())]));
        assert_eq!(ok(&mut m, &["LEASE.FENCE", "lock", &t]), Value::Okay);
    }
}

/// Element `i` of an array reply.
fn field_at(v: &Value, i: usize) -> Value {
    match v {
        Value::Array(a) => a[i].clone(),
        other => panic!("expected an array, got {other:?}"),
    }
}

full_suite! {
    // LEASE.FENCE writes through its inner command: it is flagged `write`,
    // never `readonly`.
    fn fence_is_flagged_write(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let flags = command_flags(&mut c, "LEASE.FENCE");
        assert!(
            flags.iter().any(|f| f == "write"),
            "LEASE.FENCE flags {flags:?}"
        );
        assert!(
            !flags.iter().any(|f| f == "readonly"),
            "LEASE.FENCE flags {flags:?}"
        );
    }

    // A script that wrote through LEASE.FENCE cannot be killed: SCRIPT KILL
    // answers UNKILLABLE, as for any script that wrote (killed, it would leave
    // a half-done script's writes behind).
    fn script_kill_refuses_a_script_that_wrote_through_fence(kind) {
        let s = match Server::try_start(
            kind,
            Opts::default().extra(&["--busy-reply-threshold", "100"]),
        ) {
            Ok(s) => s,
            Err(_) => Server::start_with(kind, Opts::default().extra(&["--lua-time-limit", "100"])),
        };
        let mut c = s.conn();
        let mut killer = s.conn();
        let t = acquire(&mut c, "k", "me", "60000").to_string();
        let script = "redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'SET', 'x', 'y') local i = 0 while true do i = i + 1 end";
        let busy = spawn_call(&s, &["EVAL", script, "1", "k", &t]);
        let mut last = String::new();
        assert!(
            wait_until(Duration::from_secs(5), || {
                match call(&mut killer, &[b"PING"]) {
                    Err(e) => {
                        last = error_text(&e);
                        last.starts_with("BUSY")
                    }
                    Ok(v) => {
                        last = format!("{v:?}");
                        false
                    }
                }
            }),
            "the script never made the server busy (last PING reply: {last})"
        );
        let e = err(&mut killer, &["SCRIPT", "KILL"]);
        assert!(e.starts_with("UNKILLABLE"), "SCRIPT KILL answered {e:?}");
        // The script runs forever: end the server the hard way.
        assert!(s.signal(libc::SIGKILL), "SIGKILL to the busy server");
        assert!(
            matches!(busy.recv_timeout(Duration::from_secs(5)), Ok(Err(_))),
            "the EVAL connection ends with the server"
        );
        drop(s);
    }

    // A read-only replica refuses LEASE.FENCE (which can write) with READONLY,
    // while its LEASE.INFO still shows the master's lease.
    fn fence_is_refused_on_a_read_only_replica(kind) {
        let m = Server::start(kind);
        let r = replica_of(kind, &m);
        let mut mc = m.conn();
        let mut rc = r.conn();
        let t = acquire(&mut mc, "k", "me", "60000");
        assert!(
            wait_until(Duration::from_secs(5), || token_of(&mut rc, "k") == Some(t)),
            "the replica never showed the master's lease"
        );
        let e = err(&mut rc, &["LEASE.FENCE", "k", &t.to_string()]);
        assert!(
            e.starts_with("READONLY"),
            "LEASE.FENCE on the replica answered {e:?}"
        );
        assert_eq!(token_of(&mut rc, "k"), Some(t));
    }

    // XREAD and XREADGROUP are flagged `blocking` but block only with BLOCK:
    // without it they run through the fence; with BLOCK (any case) they stay
    // refused.
    fn fence_runs_xread_without_block_and_refuses_it_with_block(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "me", "60000").to_string();
        let id = text(&ok(&mut c, &["XADD", "s", "*", "f", "v"]));
        let read = ok(
            &mut c,
            &["LEASE.FENCE", "k", &t, "XREAD", "STREAMS", "s", "0"],
        );
        assert!(
            format!("{read:?}").contains(&id),
            "fenced XREAD answered {read:?}"
        );
        assert_eq!(
            read,
            ok(&mut c, &["XREAD", "STREAMS", "s", "0"]),
            "the same as XREAD itself"
        );
        ok(&mut c, &["XGROUP", "CREATE", "s", "g", "0"]);
        let group = ok(
            &mut c,
            &[
                "LEASE.FENCE",
                "k",
                &t,
                "XREADGROUP",
                "GROUP",
                "g",
                "c1",
                "STREAMS",
                "s",
                ">",
            ],
        );
        assert!(
            format!("{group:?}").contains(&id),
            "fenced XREADGROUP answered {group:?}"
        );
        let pending = ok(&mut c, &["XPENDING", "s", "g"]);
        assert_eq!(
            int(&field_at(&pending, 0)),
            1,
            "the fenced XREADGROUP delivered the entry: {pending:?}"
        );
        for args in [
            vec!["XREAD", "BLOCK", "10", "STREAMS", "s", "0"],
            vec!["XREAD", "block", "10", "STREAMS", "s", "0"],
            vec![
                "XREADGROUP",
                "GROUP",
                "g",
                "c1",
                "BLOCK",
                "10",
                "STREAMS",
                "s",
                ">",
            ],
        ] {
            let mut full = vec!["LEASE.FENCE", "k", t.as_str()];
            full.extend(args.iter());
            let e = err(&mut c, &full);
            assert!(
                e.starts_with("ERR LEASE.FENCE cannot run")
                    && e.contains("blocking commands cannot be fenced"),
                "{args:?}: {e}"
            );
        }
    }

    // A noscript subcommand (CONFIG SET, CLIENT KILL, ...) is refused up front,
    // by its own flags rather than its container's, whatever the token (no
    // STALE for a stale one, no internal error for the valid one), and the
    // refusal counts nothing.
    fn fence_refuses_noscript_subcommands_before_the_token_check(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "me", "60000");
        let (valid, stale) = (t.to_string(), (t - 1).to_string());
        assert!(command_flags(&mut c, "config|set").contains(&"noscript".to_string()));
        let candidates: [(&str, &[&str]); 5] = [
            ("config|set", &["CONFIG", "SET", "maxmemory", "104857600"]),
            ("config|get", &["CONFIG", "GET", "maxmemory"]),
            ("config|resetstat", &["CONFIG", "RESETSTAT"]),
            ("client|kill", &["CLIENT", "KILL", "ID", "999999999"]),
            ("client|list", &["CLIENT", "LIST"]),
        ];
        let (ok_before, stale_before) = (
            info_int(&mut c, "lease_fence_ok"),
            info_int(&mut c, "lease_fence_stale"),
        );
        let mut tested = 0;
        for (sub, args) in candidates {
            if !command_flags(&mut c, sub).contains(&"noscript".to_string()) {
                continue;
            }
            tested += 1;
            for token in [&stale, &valid] {
                let mut full = vec!["LEASE.FENCE", "k", token.as_str()];
                full.extend(args.iter());
                let e = err(&mut c, &full);
                assert!(
                    e.starts_with("ERR LEASE.FENCE cannot run") && e.contains("scripts"),
                    "{sub} with {} token: {e}",
                    if token == &valid {
                        "the valid"
                    } else {
                        "a stale"
                    }
                );
            }
        }
        assert!(
            tested >= 2,
            "at least CONFIG SET and CONFIG GET are noscript"
        );
        assert_eq!(
            strings(&ok(&mut c, &["CONFIG", "GET", "maxmemory"]))[1],
            "0",
            "CONFIG SET did not run"
        );
        assert_eq!(
            info_int(&mut c, "lease_fence_ok"),
            ok_before,
            "refusals count nothing"
        );
        assert_eq!(
            info_int(&mut c, "lease_fence_stale"),
            stale_before,
            "refusals count nothing"
        );
    }
}

/// A transfer of 30 units from `from` to `to`, both writes fenced with
/// `token` in one `MULTI`, with `DEBUG SLEEP <pause>` between them: the
/// EXEC reply's elements for the two fenced writes.
fn fenced_transfer_in_exec(c: &mut redis::Connection, token: i64, pause: &str) -> (Value, Value) {
    let t = token.to_string();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .ignore_errors()
        .cmd("LEASE.FENCE")
        .arg("acct")
        .arg(&t)
        .arg("DECRBY")
        .arg("from")
        .arg(30)
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg(pause)
        .cmd("LEASE.FENCE")
        .arg("acct")
        .arg(&t)
        .arg("INCRBY")
        .arg("to")
        .arg(30)
        .query(c)
        .expect("EXEC");
    (replies[0].clone(), replies[2].clone())
}

/// The same transfer in one script, with a busy loop of `ARGV[2]` rounds
/// between the two fenced writes (`redis.call`: an error aborts the
/// script). Not `TIME`: from Redis 7.2 on it answers the frozen time too.
const FENCED_TRANSFER_SCRIPT: &str = r#"
local a = redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'DECRBY', KEYS[2], 30)
local x = 0
for i = 1, tonumber(ARGV[2]) do x = x + i end
local b = redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'INCRBY', KEYS[3], 30)
return {a, b}
"#;

fn balances(c: &mut redis::Connection) -> (i64, i64) {
    let get = |c: &mut redis::Connection, k| ok_text(c, &["GET", k]).parse::<i64>().unwrap();
    (get(c, "from"), get(c, "to"))
}

every_server! {
    fn one_exec_or_script_sees_one_time_for_every_fence(kind) {
        // A lease that ends while a transaction or a script runs: every
        // lease decision in it sees the time it began (as the server's own
        // expiry does), so both fenced writes of a transfer run, or, once
        // the lease is gone, neither.
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["SET", "from", "100"]);
        ok(&mut c, &["SET", "to", "0"]);
        let mut done = false;
        for _attempt in 0..3 {
            let asked = Instant::now();
            let t = acquire(&mut c, "acct", "me", "500");
            if asked.elapsed() > Duration::from_millis(200) {
                continue; // too slow a machine to be sure EXEC starts in time
            }
            let (a, b) = fenced_transfer_in_exec(&mut c, t, "0.8");
            assert!(asked.elapsed() > Duration::from_millis(800));
            assert_eq!(token_of(&mut c, "acct"), None, "the lease ended during the EXEC");
            assert!(matches!((&a, &b), (Value::Int(70), Value::Int(30))), "{a:?} {b:?}");
            assert_eq!(balances(&mut c), (70, 30));
            // Once it has ended, both are refused.
            let (a, b) = fenced_transfer_in_exec(&mut c, t, "0");
            assert!(matches!((&a, &b), (Value::ServerError(x), Value::ServerError(y)) if x.code() == "STALE" && y.code() == "STALE"), "{a:?} {b:?}");
            assert_eq!(balances(&mut c), (70, 30));
            // A script: the same. Its busy loop must outlast the lease (and
            // stay under busy-reply-threshold, raised so the server does not
            // start serving others meanwhile): rounds grow until it does.
            ok(&mut c, &["CONFIG", "SET", "busy-reply-threshold", "60000"]);
            let mut ran_long = false;
            for rounds in [20_000_000u64, 80_000_000, 320_000_000] {
                ok(&mut c, &["SET", "from", "70"]);
                ok(&mut c, &["SET", "to", "30"]);
                let asked = Instant::now();
                let t = acquire(&mut c, "acct", "me", "300").to_string();
                let r = ok(&mut c, &["EVAL", FENCED_TRANSFER_SCRIPT, "3", "acct", "from", "to", &t, &rounds.to_string()]);
                assert_eq!(r, Value::Array(vec![Value::Int(40), Value::Int(60)]), "{rounds} rounds");
                assert_eq!(balances(&mut c), (40, 60));
                if asked.elapsed() > Duration::from_millis(450) {
                    assert_eq!(token_of(&mut c, "acct"), None, "the lease ended during the script");
                    ran_long = true;
                    break;
                }
                ok(&mut c, &["LEASE.RELEASE", "acct", "me"]);
            }
            assert!(ran_long, "no script outlasted its lease");
            done = true;
            break;
        }
        assert!(done, "three acquires in a row took over 200 ms");
    }
}
