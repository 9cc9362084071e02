//! Regression tests for a batch of hardening fixes: LEASE.FENCE flagged
//! `write` (SCRIPT KILL, replicas), one reply per BLOCK waiter, WATCH left
//! alone by calls that change nothing, LEASE.ACQUIRE flagged `blocking`,
//! INFO lease without CONFIG GET, LEASE.INFO ttl and the key TTL, RESTORE
//! without a TTL, a retrying waiter of the served owner, fenced XREAD
//! without BLOCK, noscript subcommands refused before the token check, the
//! `expired` counter, and the `<lease>` prefix of rdb_load log lines.
mod common;
use common::*;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

fn exists(c: &mut redis::Connection, key: &str) -> bool {
    int(&ok(c, &["EXISTS", key])) == 1
}

/// WATCH `key` on `a`, run `between`, then MULTI / SET side 1 / EXEC on
/// `a`: true when EXEC ran the transaction (the watched key was not
/// touched), false when it answered null.
fn watch_survives(a: &mut redis::Connection, key: &str, between: impl FnOnce()) -> bool {
    assert_eq!(text(&ok(a, &["WATCH", key])), "OK");
    between();
    assert_eq!(text(&ok(a, &["MULTI"])), "OK");
    assert_eq!(text(&ok(a, &["SET", "side", "1"])), "QUEUED");
    match ok(a, &["EXEC"]) {
        Value::Nil => false,
        Value::Array(replies) => {
            assert_eq!(replies.len(), 1, "{replies:?}");
            true
        }
        other => panic!("EXEC answered {other:?}"),
    }
}

/// A raw RESP connection whose reads give up after a deadline (the
/// harness's RawConn waits 10 s per read and panics; here a missing reply
/// must be seen within 2 s). Replies come back as the exact bytes.
struct TimedRaw {
    reader: std::io::BufReader<TcpStream>,
}

impl TimedRaw {
    fn connect(port: u16) -> TimedRaw {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("raw connect");
        stream.set_nodelay(true).unwrap();
        TimedRaw {
            reader: std::io::BufReader::new(stream),
        }
    }

    fn send(&mut self, args: &[&str]) {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.reader.get_mut().write_all(&buf).expect("raw write");
    }

    /// Sets the socket's read timeout to what is left until `deadline`;
    /// false once it has passed.
    fn arm(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        self.reader.get_ref().set_read_timeout(Some(left)).unwrap();
        true
    }

    fn line(&mut self, deadline: Instant, out: &mut Vec<u8>) -> Option<Vec<u8>> {
        let mut line = Vec::new();
        for _ in 0..1000 {
            if !self.arm(deadline) {
                return None;
            }
            match self.reader.read_until(b'\n', &mut line) {
                Ok(0) => panic!("connection closed by the server"),
                Ok(_) if line.ends_with(b"\r\n") => {
                    out.extend_from_slice(&line);
                    line.truncate(line.len() - 2);
                    return Some(line);
                }
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None;
                }
                Err(e) => panic!("raw read: {e}"),
            }
        }
        None
    }

    fn element(&mut self, deadline: Instant, out: &mut Vec<u8>) -> Option<()> {
        let line = self.line(deadline, out)?;
        let (kind, rest) = line.split_first().expect("empty RESP line");
        let n: i64 = std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        match kind {
            b'$' if n >= 0 => {
                let mut body = vec![0u8; n as usize + 2];
                self.arm(deadline).then_some(())?;
                self.reader.read_exact(&mut body).ok()?;
                out.extend_from_slice(&body);
            }
            b'*' => {
                for _ in 0..n.max(0) {
                    self.element(deadline, out)?;
                }
            }
            _ => {}
        }
        Some(())
    }

    /// The next complete reply, or `None` if it has not come within `within`.
    fn reply_within(&mut self, within: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        self.element(deadline, &mut out)?;
        Some(out)
    }
}

fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).escape_debug().to_string()
}

/// Runs `args` on a fresh connection on its own thread; the reply arrives
/// on the returned channel.
fn spawn_call(s: &Server, args: &[&str]) -> mpsc::Receiver<redis::RedisResult<Value>> {
    let mut c = s.conn();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let _ = tx.send(call(&mut c, &refs));
    });
    rx
}

/// The token a blocked waiter was answered, within `within`.
fn token_within(
    rx: &mpsc::Receiver<redis::RedisResult<Value>>,
    who: &str,
    within: Duration,
) -> i64 {
    match rx.recv_timeout(within) {
        Ok(Ok(v)) => int(&v),
        Ok(Err(e)) => panic!("{who} was answered an error: {e}"),
        Err(_) => panic!("{who} got no reply within {within:?}"),
    }
}

/// Defect 7: LEASE.FENCE was flagged `readonly` although it writes
/// through its inner command. It must be flagged `write`.
fn fence_is_flagged_write(kind: Kind) {
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

/// Defect 7: a script that wrote through LEASE.FENCE could be killed
/// with SCRIPT KILL (the server saw only a read-only command), leaving
/// a half-done script's writes behind. The server must answer
/// UNKILLABLE, as for any script that wrote.
fn script_kill_refuses_a_script_that_wrote_through_fence(kind: Kind) {
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

/// Defect 7: as a `readonly` command LEASE.FENCE (which can write) was
/// accepted by a read-only replica. It must get READONLY there, while
/// LEASE.INFO on the replica still shows the master's lease.
fn fence_is_refused_on_a_read_only_replica(kind: Kind) {
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

/// Defect 8: a BLOCK waiter whose timeout raced with the release was
/// answered nothing at all (or twice). Each of 20 waiters released
/// right around its 50 ms timeout must get exactly one reply: a token
/// it then holds, or a null (and then it holds nothing).
fn every_block_waiter_gets_exactly_one_reply(kind: Kind) {
    let s = Server::start(kind);
    let mut c = s.conn();
    let (mut granted, mut timed_out) = (0, 0);
    for i in 0..20u64 {
        let key = format!("k{i}");
        acquire(&mut c, &key, "h", "10000");
        let mut raw = TimedRaw::connect(s.port);
        let sent = Instant::now();
        raw.send(&["LEASE.ACQUIRE", &key, "w", "10000", "BLOCK", "50"]);
        let release_at = sent + Duration::from_millis(50 + i % 9);
        thread::sleep(release_at.saturating_duration_since(Instant::now()));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", &key, "h"])), 1, "{key}");
        let reply = raw
            .reply_within(Duration::from_secs(2))
            .unwrap_or_else(|| panic!("waiter {i} got no reply within 2 s"));
        if let Some(n) = reply.strip_prefix(b":") {
            let token: i64 = std::str::from_utf8(n).unwrap().trim().parse().unwrap();
            assert_eq!(
                token_of(&mut c, &key),
                Some(token),
                "waiter {i} holds the lease it was given"
            );
            granted += 1;
        } else {
            assert_eq!(reply, b"$-1\r\n", "waiter {i}: {}", shown(&reply));
            assert_eq!(
                token_of(&mut c, &key),
                None,
                "waiter {i} timed out, so nobody holds {key}"
            );
            timed_out += 1;
        }
        for ping in 0..2 {
            raw.send(&["PING"]);
            let pong = raw.reply_within(Duration::from_secs(2));
            assert_eq!(
                pong.as_deref(),
                Some(&b"+PONG\r\n"[..]),
                "waiter {i}, PING {ping}: an extra reply ({:?})",
                pong.as_deref().map(shown)
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
    eprintln!("{granted} waiters were granted the lease, {timed_out} timed out");
}

/// Defect 9: lease calls that change nothing (a contended ACQUIRE, a
/// RENEW or RELEASE by another owner) opened the key for writing and so
/// broke WATCH on it. A failing `SET NX` is the control: it never did.
fn watch_survives_lease_calls_that_change_nothing(kind: Kind) {
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

/// Defect 9: a lease key leaving db 1 made the module re-check the
/// waiters of the same key name in db 0, opening db 0's key for writing
/// although the lease there is still held; that broke WATCH on it.
fn watch_survives_the_waiter_recheck_of_a_same_named_key(kind: Kind) {
    let s = Server::start(kind);
    let mut a = s.conn();
    let mut c = s.conn();
    let mut d = s.conn();
    acquire(&mut c, "k", "h", "60000");
    let waiter = spawn_call(&s, &["LEASE.ACQUIRE", "k", "w", "60000", "BLOCK", "5000"]);
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut c, "k") == 1),
        "w never waited"
    );
    ok(&mut d, &["SELECT", "1"]);
    acquire(&mut d, "k", "x", "60000");
    let survived = watch_survives(&mut a, "k", || {
        assert_eq!(int(&ok(&mut d, &["DEL", "k"])), 1);
        // The re-check runs on a 0 ms timer: give it time to run.
        thread::sleep(Duration::from_millis(200));
        assert_eq!(waiters(&mut c, "k"), 1, "w still waits in db 0");
    });
    assert!(
        survived,
        "the re-check of db 0's k (which changed nothing) broke WATCH k"
    );
    // Control: a real change (the hand-off) does break it.
    let changed = watch_survives(&mut a, "k", || {
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "h"])), 1);
        let t = token_within(&waiter, "w", Duration::from_secs(2));
        assert_eq!(token_of(&mut c, "k"), Some(t));
    });
    assert!(!changed, "the hand-off changed k, so EXEC must fail");
}

/// Defect 10: LEASE.ACQUIRE (which can block with BLOCK) was flagged
/// `fast` and not `blocking`.
fn acquire_is_flagged_blocking_and_not_fast(kind: Kind) {
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

/// Defect 11: every `INFO lease` ran `CONFIG GET maxmemory-policy`
/// through RM_Call, which showed up in INFO commandstats and SLOWLOG.
/// The section must still show the policy, and follow CONFIG SET.
fn info_lease_runs_no_config_get(kind: Kind) {
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

/// Defect 12: LEASE.INFO's `ttl` showed the lease's own deadline even
/// when the key's TTL was made shorter (PEXPIRE), so it promised time
/// the key does not have.
fn info_ttl_honours_a_shorter_key_ttl(kind: Kind) {
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

/// Defect 13: `RESTORE k 0 <lease payload>` left a key without a TTL
/// whose lease, once past its deadline, never went away. The key must
/// get the lease's deadline as its expiry (or disappear), also when the
/// deadline has passed already.
fn restore_without_ttl_leaves_no_immortal_key(kind: Kind) {
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

/// Defect 14: a second waiter with the same owner as the waiter being
/// served (a client retrying after a lost reply) stayed queued behind
/// its own lease. It must get the same grant at once.
fn a_retrying_waiter_of_the_served_owner_gets_the_same_grant(kind: Kind) {
    let s = Server::start(kind);
    let mut c = s.conn();
    acquire(&mut c, "k", "h", "60000");
    let w1 = spawn_call(&s, &["LEASE.ACQUIRE", "k", "w", "5000", "BLOCK", "3000"]);
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut c, "k") == 1),
        "W1 never waited"
    );
    let w2 = spawn_call(&s, &["LEASE.ACQUIRE", "k", "w", "5000", "BLOCK", "3000"]);
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut c, "k") == 2),
        "W2 never waited"
    );
    assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "h"])), 1);
    let t1 = token_within(&w1, "W1", Duration::from_secs(1));
    let t2 = token_within(&w2, "W2 (same owner)", Duration::from_secs(1));
    assert_eq!(t1, t2, "both requests of owner w get the one grant");
    let info = ok(&mut c, &["LEASE.INFO", "k"]);
    assert_eq!(field(&info, "token").map(|v| int(&v)), Some(t1), "{info:?}");
    assert_eq!(
        field(&info, "waiters").map(|v| int(&v)),
        Some(0),
        "{info:?}"
    );
}

/// Defect 15: LEASE.FENCE refused XREAD and XREADGROUP always, because
/// they are flagged `blocking`, although they block only with BLOCK.
/// Without BLOCK they must run; with BLOCK (any case) stay refused.
fn fence_runs_xread_without_block_and_refuses_it_with_block(kind: Kind) {
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

/// Defect 16: a noscript subcommand (CONFIG SET, CLIENT KILL, ...) was
/// not refused up front: the container's flags were checked, so a stale
/// token got STALE and a valid one an internal error. The refusal must
/// come first, whatever the token, and count nothing.
fn fence_refuses_noscript_subcommands_before_the_token_check(kind: Kind) {
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

/// Defect 17: `lease_expired` counted a key only when it left past the
/// lease's deadline, so a key expired early (PEXPIRE) was not counted.
/// Every real expiry counts exactly once; a RELEASE or DEL counts none.
fn expired_counts_real_expiries_including_early_ones(kind: Kind) {
    let s = Server::start(kind);
    let mut c = s.conn();
    let mut expect = info_int(&mut c, "lease_expired");
    acquire(&mut c, "early", "me", "60000");
    assert_eq!(int(&ok(&mut c, &["PEXPIRE", "early", "100"])), 1);
    assert!(
        wait_until(Duration::from_secs(3), || !exists(&mut c, "early")),
        "early never expired"
    );
    expect += 1;
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

/// Defect 18: rdb_load logged without the module's context, so its
/// lines carried `<module>` instead of `<lease>`.
fn rdb_load_log_lines_carry_the_lease_prefix(kind: Kind) {
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

/// The token field of a LEASE.INFO reply.
fn token_in(v: &Value) -> Option<i64> {
    field(v, "token").map(|t| int(&t))
}

/// Element `i` of an array reply.
fn field_at(v: &Value, i: usize) -> Value {
    match v {
        Value::Array(a) => a[i].clone(),
        other => panic!("expected an array, got {other:?}"),
    }
}

both! {
    fn fence_is_flagged_write(kind) {
        fence_is_flagged_write(kind);
    }

    fn script_kill_refuses_a_script_that_wrote_through_fence(kind) {
        script_kill_refuses_a_script_that_wrote_through_fence(kind);
    }

    fn fence_is_refused_on_a_read_only_replica(kind) {
        fence_is_refused_on_a_read_only_replica(kind);
    }

    fn every_block_waiter_gets_exactly_one_reply(kind) {
        every_block_waiter_gets_exactly_one_reply(kind);
    }

    fn watch_survives_lease_calls_that_change_nothing(kind) {
        watch_survives_lease_calls_that_change_nothing(kind);
    }

    fn watch_survives_the_waiter_recheck_of_a_same_named_key(kind) {
        watch_survives_the_waiter_recheck_of_a_same_named_key(kind);
    }

    fn acquire_is_flagged_blocking_and_not_fast(kind) {
        acquire_is_flagged_blocking_and_not_fast(kind);
    }

    fn info_lease_runs_no_config_get(kind) {
        info_lease_runs_no_config_get(kind);
    }

    fn info_ttl_honours_a_shorter_key_ttl(kind) {
        info_ttl_honours_a_shorter_key_ttl(kind);
    }

    fn restore_without_ttl_leaves_no_immortal_key(kind) {
        restore_without_ttl_leaves_no_immortal_key(kind);
    }

    fn a_retrying_waiter_of_the_served_owner_gets_the_same_grant(kind) {
        a_retrying_waiter_of_the_served_owner_gets_the_same_grant(kind);
    }

    fn fence_runs_xread_without_block_and_refuses_it_with_block(kind) {
        fence_runs_xread_without_block_and_refuses_it_with_block(kind);
    }

    fn fence_refuses_noscript_subcommands_before_the_token_check(kind) {
        fence_refuses_noscript_subcommands_before_the_token_check(kind);
    }

    fn expired_counts_real_expiries_including_early_ones(kind) {
        expired_counts_real_expiries_including_early_ones(kind);
    }

    fn rdb_load_log_lines_carry_the_lease_prefix(kind) {
        rdb_load_log_lines_carry_the_lease_prefix(kind);
    }
}
