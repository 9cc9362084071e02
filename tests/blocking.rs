//! LEASE.ACQUIRE ... BLOCK: first come first served hand-off on release,
//! expiry, DEL/UNLINK/FLUSHALL/RENAME; timeouts, disconnects, CLIENT
//! UNBLOCK; no blocking inside MULTI or scripts; the hand-off replicated.
//! Exactly one reply per waiter, also when its timeout races the release;
//! a retrying waiter of the owner being served gets the same grant; the
//! re-check of a same-named key's waiters leaves WATCH alone; the hand-off
//! comes at a deadline moved earlier (RENEW, re-acquire, PEXPIRE) and at
//! once when SWAPDB takes the held lease away. A hand-off is a new lease:
//! it waits for memory while the server is out of it.
mod common;
use common::*;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

full_suite! {
    fn a_block_timeout_never_ends_the_wait_early(kind) {
        // The clock reads whole milliseconds: a timeout taken as `now + ms`
        // could end up to 1 ms before `ms` had passed. Every wait is at
        // least its BLOCK, as the client measures it from before sending.
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "holder", "60000");
        let mut w = s.conn();
        for _ in 0..30 {
            let sent = Instant::now();
            let got = ok(&mut w, &["LEASE.ACQUIRE", "k", "waiter", "1000", "BLOCK", "40"]);
            let waited = sent.elapsed();
            assert_eq!(got, Value::Nil);
            assert!(waited >= Duration::from_millis(40), "{kind:?}: BLOCK 40 ended after {waited:?}");
        }
    }

    fn a_free_key_is_taken_at_once_and_the_holder_reacquires_without_blocking(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000", "BLOCK", "0"]));
        assert_eq!(int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000", "BLOCK", "0"])), t);
    }

    fn a_disconnected_waiter_leaves_the_queue_and_never_holds(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]);
        // b blocks on a raw socket, then goes away.
        let mut raw = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        raw.write_all(b"*6\r\n$13\r\nLEASE.ACQUIRE\r\n$1\r\nk\r\n$1\r\nb\r\n$5\r\n30000\r\n$5\r\nBLOCK\r\n$1\r\n0\r\n").unwrap();
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "k") == 1));
        let later = spawn_waiter(&s, "k", "later", "30000", "0");
        drop(raw);
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "k") == 1), "b left the queue");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        let t = got_token(later);
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "b"])), 0, "b never held it");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "later"])), 1);
    }

    fn client_unblock_answers_null_and_leaves_the_queue(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]);
        let mut w = s.conn();
        let id = int(&ok(&mut w, &["CLIENT", "ID"]));
        let h = thread::spawn(move || ok(&mut w, &["LEASE.ACQUIRE", "k", "b", "30000", "BLOCK", "0"]));
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "k") == 1));
        assert_eq!(int(&ok(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()])), 1);
        assert_eq!(h.join().unwrap(), Value::Nil);
        assert_eq!(waiters(&mut c, "k"), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        assert_eq!(ok(&mut c, &["LEASE.INFO", "k"]), Value::Nil, "b never gets it");
    }

    fn expiry_hands_off_on_time_among_many_leases(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        // 100k other leases with long TTLs: the active expiry cycle would need
        // far longer than the bound below to sample the one that expires.
        let mut p = redis::pipe();
        for i in 0..100_000 {
            p.cmd("LEASE.ACQUIRE").arg(format!("other:{i}")).arg("o").arg(60_000).ignore();
        }
        p.query::<()>(&mut c).unwrap();
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Kdx"]);
        let mut events = s.conn();
        let mut events = events.as_pubsub();
        events.subscribe("__keyspace@0__:k").unwrap();
        events.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t0 = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "300"]));
        let deadline = Instant::now() + Duration::from_millis(300);
        let w = spawn_waiter(&s, "k", "b", "30000", "0");
        let t = got_token(w);
        // The old lease expires (the core event) before the hand-off. At
        // most three events, each waited for up to 10 s; a missing one
        // shows in the assertion with those that came.
        let mut seen: Vec<String> = Vec::new();
        for _ in 0..3 {
            match events.get_message() {
                Ok(m) => seen.push(m.get_payload().unwrap_or_default()),
                Err(e) => {
                    seen.push(format!("(no event within 10 s: {e})"));
                    break;
                }
            }
        }
        assert_eq!(seen, ["lease.acquire", "expired", "lease.acquire"], "events");
        let late = Instant::now().saturating_duration_since(deadline);
        assert!(t > t0);
        assert!(late < Duration::from_millis(1000), "hand-off {late:?} after the deadline");
        assert_eq!(info_field(&mut c, "lease_expired").as_deref(), Some("1"));
    }

    fn an_expiry_hand_off_never_comes_before_the_deadline(kind) {
        // The last moments before a lease's end are timed to the
        // microsecond (src/module/waker.rs): the waiter must still never
        // get the lease while the old one could be held, i.e. before the
        // wall clock passed the deadline's millisecond.
        let s = Server::start(kind);
        let mut c = s.conn();
        let mut w = s.conn();
        let wall_us = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as i64
        };
        for round in 0..40 {
            let holder = format!("h{round}");
            let t0 = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", &holder, "15"]));
            let deadline_ms = int(&ok(&mut c, &["PEXPIRETIME", "k"]));
            let t = int(&ok(&mut w, &["LEASE.ACQUIRE", "k", "w", "30000", "BLOCK", "5000"]));
            let got_us = wall_us();
            assert!(t > t0, "round {round}: a new token");
            assert!(
                got_us >= (deadline_ms + 1) * 1000,
                "round {round}: handed over {} us before the deadline passed",
                (deadline_ms + 1) * 1000 - got_us
            );
            assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "k", &holder, "1000"])), 0);
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "w"])), 1);
        }
    }

    fn del_unlink_and_flushall_free_the_lease_for_the_oldest_waiter(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        for freeing in [&["DEL", "k"][..], &["UNLINK", "k"], &["FLUSHALL"], &["FLUSHDB"]] {
            ok(&mut c, &["FLUSHALL"]);
            ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]);
            let first = spawn_waiter(&s, "k", "b", "30000", "0");
            let second = spawn_waiter(&s, "k", "c", "30000", "0");
            ok(&mut c, freeing);
            let t = got_token(first);
            assert_eq!(token_of(&mut c, "k"), Some(t), "{freeing:?}");
            assert_eq!(waiters(&mut c, "k"), 1, "{freeing:?}: c keeps waiting");
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "b"])), 1);
            got_token(second);
        }
    }

    fn rename_frees_the_source_for_its_waiters_and_keeps_the_lease_under_the_new_name(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t0 = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]));
        let w = spawn_waiter(&s, "k", "b", "30000", "0");
        ok(&mut c, &["RENAME", "k", "k2"]);
        let t = got_token(w);
        assert!(t > t0);
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert_eq!(token_of(&mut c, "k2"), Some(t0));
    }

    fn a_key_of_another_type_appearing_fails_the_waiters_with_wrongtype(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]);
        let w = spawn_waiter(&s, "k", "b", "30000", "0");
        redis::pipe().atomic().cmd("DEL").arg("k").cmd("SET").arg("k").arg("x").query::<()>(&mut c).unwrap();
        let e = w.join().unwrap().0.expect_err("WRONGTYPE");
        assert!(error_text(&e).starts_with("WRONGTYPE"), "{e}");
        assert_eq!(waiters(&mut c, "k2"), 0);
        assert_eq!(info_field(&mut c, "lease_waiters").as_deref(), Some("0"));
        assert_eq!(ok(&mut c, &["GET", "k"]), Value::BulkString(b"x".to_vec()));
    }

}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn release_hands_off_to_the_oldest_waiter_only(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t0 = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]));
        let b = spawn_waiter(&s, "k", "b", "30000", "0");
        let d = spawn_waiter(&s, "k", "d", "30000", "0");
        let e = spawn_waiter(&s, "k", "e", "30000", "0");
        assert_eq!(waiters(&mut c, "k"), 3);
        assert_eq!(info_field(&mut c, "lease_waiters").as_deref(), Some("3"));

        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        let tb = got_token(b);
        assert!(tb > t0);
        assert_eq!(token_of(&mut c, "k"), Some(tb));
        assert_eq!(waiters(&mut c, "k"), 2, "the others keep waiting");
        // b holds it now: only b can release it.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "d"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "b"])), 1);
        let td = got_token(d);
        assert!(td > tb);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "d"])), 1);
        let te = got_token(e);
        assert!(te > td);
        assert_eq!(waiters(&mut c, "k"), 0);
        assert_eq!(info_field(&mut c, "lease_waiters").as_deref(), Some("0"));
    }

    fn timeout_answers_null_counts_and_leaves_the_queue(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]);
        let start = Instant::now();
        let mut w = s.conn();
        assert_eq!(ok(&mut w, &["LEASE.ACQUIRE", "k", "b", "30000", "BLOCK", "100"]), Value::Nil);
        assert!(start.elapsed() >= Duration::from_millis(90));
        assert_eq!(waiters(&mut c, "k"), 0);
        assert_eq!(info_field(&mut c, "lease_wait_timeouts").as_deref(), Some("1"));
        // The timed-out client never gets the lease later.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        assert_eq!(ok(&mut c, &["LEASE.INFO", "k"]), Value::Nil);
    }

    fn block_does_not_block_inside_multi_or_scripts(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "30000"]);
        let r: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LEASE.ACQUIRE").arg("k").arg("b").arg(1000).arg("BLOCK").arg(0)
            .query(&mut c)
            .unwrap();
        assert_eq!(r, vec![Value::Nil]);
        let v = ok(&mut c, &["EVAL", "return redis.call('LEASE.ACQUIRE', KEYS[1], 'b', 1000, 'BLOCK', 0)", "1", "k"]);
        assert_eq!(v, Value::Nil);
        assert_eq!(waiters(&mut c, "k"), 0);
        // A free key is still acquired inside MULTI with BLOCK.
        let r: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LEASE.ACQUIRE").arg("free").arg("b").arg(1000).arg("BLOCK").arg(0)
            .query(&mut c)
            .unwrap();
        assert!(matches!(r[0], Value::Int(t) if t > 0));
    }

    fn the_hand_off_reaches_the_replica(kind) {
        let master = Server::start(kind);
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let mut r = replica.conn();
        ok(&mut m, &["LEASE.ACQUIRE", "k", "a", "30000"]);
        let w = spawn_waiter(&master, "k", "b", "30000", "0");
        ok(&mut m, &["LEASE.RELEASE", "k", "a"]);
        let t = got_token(w);
        assert!(wait_until(Duration::from_secs(5), || token_of(&mut r, "k") == Some(t)));
        // Expiry hand-off too.
        ok(&mut m, &["LEASE.RELEASE", "k", "b"]);
        ok(&mut m, &["LEASE.ACQUIRE", "k", "c", "200"]);
        let w = spawn_waiter(&master, "k", "d", "30000", "0");
        let t = got_token(w);
        assert!(wait_until(Duration::from_secs(5), || token_of(&mut r, "k") == Some(t)));
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

/// A `change` that moves the holder's deadline earlier (LEASE.RENEW or
/// re-acquire with a shorter ttl, PEXPIRE) moves the waiters' timer with it:
/// the waiter is served at the new deadline, not at the first one (which here
/// comes after its own BLOCK timeout).
///
/// Active expiry is turned off, as it effectively is for one key among many (it
/// samples 20 keys per database per cycle): otherwise the key's own expiry
/// could serve the waiter and hide a timer left at the old deadline.
fn a_waiter_is_served_at_the_new_deadline(kind: Kind, change: &[&str]) {
    let s = Server::start(kind);
    let mut c = s.conn();
    ok(&mut c, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    let t0 = acquire(&mut c, "k", "h", "5000");
    let w = spawn_waiter(&s, "k", "w", "10000", "4000");
    ok(&mut c, change);
    let changed = Instant::now();
    let (reply, at) = w.join().unwrap();
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!(
            "after {change:?} the waiter should get the lease at the new deadline (200 ms), got {other:?} after {:?}",
            at - changed
        ),
    };
    assert!(
        at - changed < Duration::from_millis(1000),
        "after {change:?} the waiter was served {:?} later",
        at - changed
    );
    assert!(t > t0);
    assert_eq!(token_of(&mut c, "k"), Some(t));
}

full_suite! {
    // A BLOCK waiter whose timeout races with the release gets exactly one
    // reply, never none or two: each of 20 waiters released right around its 50
    // ms timeout gets a token it then holds, or a null (and then it holds
    // nothing).
    fn every_block_waiter_gets_exactly_one_reply(kind) {
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

    // A second waiter with the same owner as the waiter being served (a client
    // retrying after a lost reply) gets the same grant at once, instead of
    // staying queued behind its own lease.
    fn a_retrying_waiter_of_the_served_owner_gets_the_same_grant(kind) {
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

    // A lease key leaving db 1 makes the module re-check the waiters of the
    // same key name in db 0; that re-check, which changes nothing (the lease
    // there is still held), does not open db 0's key for writing, so WATCH on
    // it holds. The hand-off that follows does break it.
    fn watch_survives_the_waiter_recheck_of_a_same_named_key(kind) {
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

    // A RENEW to a shorter ttl.
    fn renew_to_a_shorter_ttl_serves_the_waiter_at_the_new_deadline(kind) {
        a_waiter_is_served_at_the_new_deadline(kind, &["LEASE.RENEW", "k", "h", "200"]);
    }

    // A re-acquire with a shorter ttl.
    fn reacquire_with_a_shorter_ttl_serves_the_waiter_at_the_new_deadline(kind) {
        a_waiter_is_served_at_the_new_deadline(kind, &["LEASE.ACQUIRE", "k", "h", "200"]);
    }

    // A PEXPIRE shorter than the lease.
    fn pexpire_serves_the_waiter_at_the_new_deadline(kind) {
        a_waiter_is_served_at_the_new_deadline(kind, &["PEXPIRE", "k", "200"]);
    }

    // SWAPDB moving the held lease out of the waiter's database tells its
    // waiters: the key is free in db 0, so its waiter is served at once (not at
    // the old holder's deadline, 60 s away), and the swapped lease stays in db
    // 1 unchanged.
    fn swapdb_serves_the_waiter_of_the_swapped_key(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t0 = acquire(&mut c, "k", "h", "60000");
        let w = spawn_waiter(&s, "k", "w", "10000", "4000");
        ok(&mut c, &["SWAPDB", "0", "1"]);
        let swapped = Instant::now();
        let (reply, at) = w.join().unwrap();
        let t = match reply {
            Ok(Value::Int(t)) => t,
            other => panic!(
                "after SWAPDB the waiter should get the now free key, got {other:?} after {:?}",
                at - swapped
            ),
        };
        assert!(
            at - swapped < Duration::from_millis(1000),
            "served {:?} after SWAPDB",
            at - swapped
        );
        assert!(t > t0);
        assert_eq!(
            token_of(&mut c, "k"),
            Some(t),
            "db 0 holds the waiter's lease"
        );
        let mut db1 = s.conn();
        ok(&mut db1, &["SELECT", "1"]);
        assert_eq!(
            token_of(&mut db1, "k"),
            Some(t0),
            "db 1 keeps the old lease"
        );
    }
}

every_server! {
    fn a_hand_off_waits_for_memory_like_every_new_lease(kind) {
        // Waiters queued before the server reached maxmemory: the release,
        // the expiry and the multi-key release that free their keys hand
        // nothing out until memory is back (a hand-off is a new lease,
        // refused under OOM like a client's acquire).
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire(&mut c, "r", "h", "60000");
        acquire(&mut c, "m1", "h", "60000");
        let expiring = Instant::now();
        acquire(&mut c, "e", "h", "1500");
        let by_release = spawn_waiter(&s, "r", "w1", "60000", "20000");
        let by_expiry = spawn_waiter(&s, "e", "w2", "60000", "20000");
        let multi = spawn_call(&s, &["LEASE.MACQUIRE", "2", "m1", "m2", "w3", "60000", "BLOCK", "20000"]);
        assert!(wait_until(Duration::from_secs(5), || info_int(&mut c, "lease_waiters") == 3));
        assert!(expiring.elapsed() < Duration::from_millis(1400), "e ended before the server ran out of memory");
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "r", "h"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "m1", "h"])), 1);
        thread::sleep(Duration::from_millis(1800).saturating_sub(expiring.elapsed()));
        thread::sleep(Duration::from_millis(300));
        for k in ["r", "e", "m1", "m2"] {
            assert_eq!(token_of(&mut c, k), None, "{k} was handed out under OOM");
        }
        assert!(!by_release.is_finished() && !by_expiry.is_finished());
        assert!(matches!(multi.try_recv(), Err(mpsc::TryRecvError::Empty)));
        assert_eq!(info_int(&mut c, "lease_waiters"), 3, "they keep waiting");
        let issued = info_int(&mut c, "lease_acquired");
        ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
        let (t1, t2) = (got_token(by_release), got_token(by_expiry));
        let t3 = int(&multi.recv_timeout(Duration::from_secs(5)).expect("answered").unwrap());
        assert_eq!(token_of(&mut c, "r"), Some(t1));
        assert_eq!(token_of(&mut c, "e"), Some(t2));
        assert_eq!((token_of(&mut c, "m1"), token_of(&mut c, "m2")), (Some(t3), Some(t3)));
        assert!(info_int(&mut c, "lease_acquired") > issued);
    }
}
