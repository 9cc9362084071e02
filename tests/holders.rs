//! Counting and shared leases (design.md S8) on every server: `LIMIT n` admits
//! up to n holders, `SHARED` any number of readers and no writer; each
//! holder has its own owner, token and deadline; RENEW and RELEASE act on
//! the caller's own holding; FENCE takes any current holder's token, and a
//! reader's token fences no write; INFO shows mode, limit and holders;
//! each holder ends at its own deadline and its place goes to the oldest
//! waiter; waiters are served in strict arrival order (no writer
//! starvation); bad input is an error that changes nothing; the grace
//! period admits no new holder; ACL, OOM, events and counters apply.
mod common;
use common::*;

use std::time::{Duration, Instant};

fn limit(c: &mut redis::Connection, key: &str, owner: &str, n: &str) -> Option<i64> {
    acquire_opts(c, key, owner, "30000", &["LIMIT", n])
}

fn shared(c: &mut redis::Connection, key: &str, owner: &str) -> Option<i64> {
    acquire_opts(c, key, owner, "30000", &["SHARED"])
}

fn info(c: &mut redis::Connection, key: &str) -> Value {
    ok(c, &["LEASE.INFO", key])
}

/// DEBUG DIGEST-VALUE of a key: changes with any bit of its record.
fn digest(c: &mut redis::Connection, key: &str) -> String {
    format!("{:?}", ok(c, &["DEBUG", "DIGEST-VALUE", key]))
}

/// Every counter of `INFO lease` (the module's one list of them).
fn counters(c: &mut redis::Connection) -> Vec<(String, i64)> {
    common::stats::NAMES
        .iter()
        .map(|n| (n.to_string(), info_int(c, &format!("lease_{n}"))))
        .collect()
}

fn counter(c: &mut redis::Connection, name: &str) -> i64 {
    info_int(c, &format!("lease_{name}"))
}

fn near(got: i64, want: i64, what: &str) {
    assert!(
        (got - want).abs() <= 1500,
        "{what}: {got}, expected about {want}"
    );
}

/// The token a waiter was answered, within 5 s.
fn answered(h: Answer, who: &str) -> (i64, Instant) {
    assert!(
        wait_until(Duration::from_secs(5), || h.is_finished()),
        "{who} got no answer"
    );
    match h.join().unwrap() {
        (Ok(Value::Int(t)), at) => (t, at),
        (other, _) => panic!("{who} should get a token, got {other:?}"),
    }
}

/// Runs `cmds` in one MULTI/EXEC on `c`; returns EXEC's replies.
fn transaction(c: &mut redis::Connection, cmds: &[&[&str]]) -> Vec<Value> {
    assert_eq!(ok(c, &["MULTI"]), Value::Okay);
    for cmd in cmds {
        assert_eq!(ok(c, cmd), Value::SimpleString("QUEUED".into()), "{cmd:?}");
    }
    match ok(c, &["EXEC"]) {
        Value::Array(replies) => replies,
        other => panic!("EXEC: {other:?}"),
    }
}

fn aof_bytes(s: &Server) -> u64 {
    std::fs::read_dir(s.data_dir().join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

full_suite! {
    fn info_on_the_wire(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let t = shared(&mut c, "rd", "r1").unwrap();
        let mut raw = s.raw();
        let r2 = String::from_utf8(raw.call(&[b"LEASE.INFO", b"rd"])).unwrap();
        let prefix = format!("*14\r\n$4\r\nmode\r\n$6\r\nshared\r\n$5\r\nlimit\r\n:0\r\n$5\r\ntoken\r\n:{t}\r\n$3\r\nttl\r\n:");
        assert!(r2.starts_with(&prefix), "{r2:?}");
        assert!(r2.contains(&format!("$7\r\nwaiters\r\n:0\r\n$7\r\nholders\r\n*1\r\n*8\r\n$5\r\ntoken\r\n:{t}\r\n$3\r\nttl\r\n:")), "{r2:?}");
        assert!(r2.ends_with("$5\r\nlabel\r\n$-1\r\n$5\r\nguard\r\n:0\r\n"), "{r2:?}");
        raw.call(&[b"HELLO", b"3"]);
        let r3 = String::from_utf8(raw.call(&[b"LEASE.INFO", b"rd"])).unwrap();
        assert!(r3.starts_with("%7\r\n$4\r\nmode\r\n$6\r\nshared\r\n"), "{r3:?}");
        assert!(r3.contains(&format!("$7\r\nholders\r\n*1\r\n%4\r\n$5\r\ntoken\r\n:{t}\r\n")), "{r3:?}");
        assert!(r3.ends_with("$5\r\nlabel\r\n_\r\n$5\r\nguard\r\n:0\r\n"), "{r3:?}");
        // An exclusive lease's INFO: token, ttl and waiters first, then
        // since and label (design.md S11).
        let te = acquire(&mut c, "ex", "me", "30000");
        let r3 = String::from_utf8(raw.call(&[b"LEASE.INFO", b"ex"])).unwrap();
        assert!(r3.starts_with(&format!("%6\r\n$5\r\ntoken\r\n:{te}\r\n$3\r\nttl\r\n:")), "{r3:?}");
        assert!(r3.contains("$7\r\nwaiters\r\n:0\r\n$5\r\nsince\r\n:"), "{r3:?}");
    }

    fn an_error_leaves_even_ended_holders_in_place(kind) {
        let s = Server::start_with(kind, Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]));
        let mut c = s.conn();
        acquire_opts(&mut c, "sem", "a", "100", &["LIMIT", "2"]).unwrap();
        acquire_opts(&mut c, "sem", "b", "30000", &["LIMIT", "2"]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let (d, expired, aof) = (digest(&mut c, "sem"), counter(&mut c, "expired"), aof_bytes(&s));
        assert!(err(&mut c, &["LEASE.ACQUIRE", "sem", "c", "1000", "LIMIT", "5"]).contains("LIMIT 2"));
        assert!(err(&mut c, &["LEASE.ACQUIRE", "sem", "c", "1000", "SHARED"]).contains("LIMIT 2"));
        assert_eq!((digest(&mut c, "sem"), counter(&mut c, "expired"), aof_bytes(&s)), (d, expired, aof));
        // a's place is free: a newcomer takes it, and a leaves then.
        assert!(limit(&mut c, "sem", "c", "2").is_some());
        assert_eq!(counter(&mut c, "expired"), expired + 1);
        assert_eq!(holders(&info(&mut c, "sem")).len(), 2);
    }

    fn renew_and_release_act_on_the_callers_own_holding(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ta = acquire_opts(&mut c, "sem", "a", "10000", &["LIMIT", "3"]).unwrap();
        let tb = acquire_opts(&mut c, "sem", "b", "20000", &["LIMIT", "3"]).unwrap();
        let tc = acquire_opts(&mut c, "sem", "c", "30000", &["LIMIT", "3"]).unwrap();
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "a", "25000"])), 1);
        let h = holders(&info(&mut c, "sem"));
        near(h[0].1, 25_000, "a renewed");
        near(h[1].1, 20_000, "b untouched");
        near(h[2].1, 30_000, "c untouched");
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "z", "25000"])), 0);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "z"])), 0);
        // The latest holder leaves: the key's TTL follows the next latest.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "c"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "c"])), 0);
        near(pttl(&mut c, "sem"), 25_000, "PTTL after the latest left");
        assert!(err(&mut c, &["LEASE.FENCE", "sem", &tc.to_string()]).starts_with("STALE"));
        assert_eq!(holders(&info(&mut c, "sem")).iter().map(|h| h.0).collect::<Vec<_>>(), vec![ta, tb]);
        // Shortening the latest holding shortens the key's TTL.
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "a", "5000"])), 1);
        near(pttl(&mut c, "sem"), 20_000, "PTTL after a shortened its holding");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "a"])), 1);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "b"])), 1);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "sem"])), 0, "the last holder takes the key");
        assert_eq!(info(&mut c, "sem"), Value::Nil);
        assert_eq!(
            (counter(&mut c, "renewed"), counter(&mut c, "renew_failed"), counter(&mut c, "released"), counter(&mut c, "release_failed")),
            (2, 1, 3, 2)
        );
    }

    fn fence_takes_any_holders_token_and_readers_fence_no_writes(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ta = limit(&mut c, "sem", "a", "2").unwrap().to_string();
        let tb = limit(&mut c, "sem", "b", "2").unwrap().to_string();
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "sem", &ta]), Value::Okay);
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "sem", &tb]), Value::Okay);
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "sem", &tb, "SET", "x", "1"]), Value::Okay, "a LIMIT holder writes");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "a"])), 1);
        assert!(err(&mut c, &["LEASE.FENCE", "sem", &ta]).starts_with("STALE"));
        assert!(err(&mut c, &["LEASE.FENCE", "sem", &ta, "SET", "x", "9"]).starts_with("STALE"));
        // Readers: their tokens fence reads, never writes.
        let r1 = shared(&mut c, "rd", "r1").unwrap().to_string();
        let r2 = shared(&mut c, "rd", "r2").unwrap().to_string();
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "rd", &r1]), Value::Okay);
        assert_eq!(ok_text(&mut c, &["LEASE.FENCE", "rd", &r2, "GET", "x"]), "1");
        let fence_ok = counter(&mut c, "fence_ok");
        for write in [&["SET", "x", "2"][..], &["DEL", "x"], &["INCR", "n"], &["EXPIRE", "x", "5"]] {
            let mut args = vec!["LEASE.FENCE", "rd", &r1];
            args.extend_from_slice(write);
            let e = err(&mut c, &args);
            assert_eq!(e, format!("ERR LEASE.FENCE cannot run '{}': a SHARED holder's token cannot fence a write command", write[0].to_lowercase()));
        }
        assert_eq!(counter(&mut c, "fence_ok"), fence_ok, "refusals are not counted");
        assert_eq!(ok_text(&mut c, &["GET", "x"]), "1", "nothing ran");
        assert_eq!(int(&ok(&mut c, &["EXISTS", "n"])), 0);
        assert_eq!(int(&ok(&mut c, &["TTL", "x"])), -1);
        // In a script the refusal aborts it before its writes.
        let e = call(&mut c, &[b"EVAL", b"redis.call('LEASE.FENCE', KEYS[1], ARGV[1], 'SET', KEYS[2], 'y') redis.call('SET', KEYS[2], 'z')", b"2", b"rd", b"x", r1.as_bytes()]).unwrap_err();
        assert!(error_text(&e).contains("SHARED holder"), "{e}");
        assert_eq!(ok_text(&mut c, &["GET", "x"]), "1");
        // STALE comes first: a stale reader's token gets STALE, not the write refusal.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "r2"])), 1);
        assert!(err(&mut c, &["LEASE.FENCE", "rd", &r2, "SET", "x", "3"]).starts_with("STALE"));
        // Once the readers are gone, a writer's token fences writes.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "r1"])), 1);
        let w = acquire(&mut c, "rd", "w", "30000").to_string();
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "rd", &w, "SET", "x", "4"]), Value::Okay);
        assert!(err(&mut c, &["LEASE.FENCE", "rd", &r1]).starts_with("STALE"));
    }

    fn each_holder_ends_at_its_own_deadline(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ta = acquire_opts(&mut c, "sem", "a", "200", &["LIMIT", "2"]).unwrap();
        let tb = acquire_opts(&mut c, "sem", "b", "30000", &["LIMIT", "2"]).unwrap();
        assert_eq!(limit(&mut c, "sem", "c", "2"), None, "full");
        std::thread::sleep(Duration::from_millis(350));
        assert!(err(&mut c, &["LEASE.FENCE", "sem", &ta.to_string()]).starts_with("STALE"));
        let v = info(&mut c, "sem");
        assert_eq!(holders(&v).iter().map(|h| h.0).collect::<Vec<_>>(), vec![tb], "the ended holder is not shown");
        let expired = counter(&mut c, "expired");
        // The first write to the key notices the ended holder: it leaves.
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "a", "1000"])), 0);
        assert_eq!(counter(&mut c, "expired"), expired + 1, "the ended holder counted as expired");
        let tc = limit(&mut c, "sem", "c", "2").unwrap();
        assert!(tc > tb);
        near(pttl(&mut c, "sem"), 30_000, "the key lives to the latest deadline");
        // The key goes at its latest deadline, with every holder counted.
        for o in ["a", "b", "c"] {
            acquire_opts(&mut c, "short", o, "150", &["SHARED"]).unwrap();
        }
        let expired = counter(&mut c, "expired");
        assert!(wait_until(Duration::from_secs(3), || int(&ok(&mut c, &["EXISTS", "short"])) == 0));
        assert!(wait_until(Duration::from_secs(2), || counter(&mut c, "expired") == expired + 3), "expired {} after {expired}", counter(&mut c, "expired"));
    }

    fn a_place_handed_to_a_waiter_that_vanished_goes_to_the_next(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let ta = limit(&mut c, "sem", "a", "2").unwrap();
        let tb = limit(&mut c, "sem", "b", "2").unwrap();
        // w1 waits on a raw connection whose client id we know.
        let mut w1 = s.raw();
        let id = String::from_utf8(w1.call(&[b"CLIENT", b"ID"])).unwrap();
        let id = id.trim_start_matches(':').trim().to_string();
        w1.send(&[b"LEASE.ACQUIRE", b"sem", b"w1", b"30000", b"LIMIT", b"2", b"BLOCK", b"0"]);
        assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, "sem") == 1));
        let w2 = spawn_waiter_with(&s, "sem", "w2", "30000", &["LIMIT", "2", "BLOCK", "0"]);
        // In one transaction: a's place goes to w1, then w1 is gone before
        // its reply could be written. Nobody learnt w1's token: the place
        // is given back and goes to w2.
        let replies = transaction(&mut c, &[&["LEASE.RELEASE", "sem", "a"], &["CLIENT", "KILL", "ID", &id]]);
        assert_eq!(replies[0], Value::Int(1));
        let (t2, _) = answered(w2, "w2");
        assert!(t2 > tb);
        let h: Vec<i64> = holders(&info(&mut c, "sem")).iter().map(|h| h.0).collect();
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(h.contains(&tb) && h.contains(&t2) && !h.contains(&ta));
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "w1", "1000"])), 0, "w1 holds nothing");
        assert_eq!(waiters(&mut c, "sem"), 0);
    }

    fn del_and_a_shorter_pexpire_hand_the_places_over(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        for o in ["a", "b"] {
            limit(&mut c, "sem", o, "2").unwrap();
        }
        let w = spawn_waiter_with(&s, "sem", "w", "30000", &["LIMIT", "2", "BLOCK", "0"]);
        assert_eq!(int(&ok(&mut c, &["DEL", "sem"])), 1);
        let (t, _) = answered(w, "the waiter after DEL");
        assert_eq!(holders(&info(&mut c, "sem")).iter().map(|h| h.0).collect::<Vec<_>>(), vec![t]);
        // A shorter key expiry ends every holding with the key.
        shared(&mut c, "rd", "r").unwrap();
        let w = spawn_waiter_with(&s, "rd", "x", "30000", &["BLOCK", "0"]);
        let since = Instant::now();
        assert_eq!(int(&ok(&mut c, &["PEXPIRE", "rd", "150"])), 1);
        near(int(&field(&info(&mut c, "rd"), "ttl").unwrap()), 150, "INFO follows the key's expiry");
        let (tx, at) = answered(w, "the writer after PEXPIRE");
        assert!(at - since < Duration::from_millis(1500), "{:?}", at - since);
        assert_eq!(token_of(&mut c, "rd"), Some(tx));
    }

    fn readers_never_overtake_a_waiting_writer(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        shared(&mut c, "rd", "r1").unwrap();
        let w = spawn_waiter_with(&s, "rd", "w", "30000", &["BLOCK", "0"]);
        // A reader would fit, but the writer came first.
        assert_eq!(shared(&mut c, "rd", "r2"), None);
        let r3 = spawn_waiter_with(&s, "rd", "r3", "30000", &["SHARED", "BLOCK", "0"]);
        let r4 = spawn_waiter_with(&s, "rd", "r4", "30000", &["SHARED", "BLOCK", "0"]);
        assert_eq!(waiters(&mut c, "rd"), 3);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "r1"])), 1);
        let (tw, _) = answered(w, "the writer");
        assert_eq!(token_of(&mut c, "rd"), Some(tw));
        assert!(field(&info(&mut c, "rd"), "mode").is_none(), "held exclusively now");
        assert_eq!(waiters(&mut c, "rd"), 2);
        assert!(!r3.is_finished() && !r4.is_finished());
        // The writer leaves: the run of readers at the head comes in together.
        let w2 = {
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "w"])), 1);
            let (t3, _) = answered(r3, "r3");
            let (t4, _) = answered(r4, "r4");
            assert!(tw < t3 && t3 < t4);
            assert_eq!(holders(&info(&mut c, "rd")).len(), 2);
            spawn_waiter_with(&s, "rd", "w2", "30000", &["BLOCK", "0"])
        };
        let r5 = spawn_waiter_with(&s, "rd", "r5", "30000", &["SHARED", "BLOCK", "0"]);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "r3"])), 1);
        assert!(!w2.is_finished(), "r4 still reads");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "r4"])), 1);
        let (tw2, _) = answered(w2, "w2");
        assert_eq!(token_of(&mut c, "rd"), Some(tw2));
        assert!(!r5.is_finished(), "r5 waits for w2");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", "w2"])), 1);
        answered(r5, "r5");
    }

    fn readers_behind_a_writer_that_gives_up_come_in_at_once(kind) {
        // A writer waits on a key readers hold, and readers queue behind
        // it. When the writer leaves the queue (its BLOCK timeout, or its
        // connection closing), the readers fit: they come in then, not when
        // the readers' lease ends.
        let s = Server::start(kind);
        let mut c = s.conn();
        for leaving in ["timeout", "disconnect"] {
            let key = format!("rd:{leaving}");
            acquire_opts(&mut c, &key, "r1", "60000", &["SHARED"]).unwrap();
            let mut raw = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            let writer = if leaving == "timeout" {
                Some(spawn_waiter_with(&s, &key, "w", "30000", &["BLOCK", "300"]))
            } else {
                let cmd = ["LEASE.ACQUIRE", key.as_str(), "w", "30000", "BLOCK", "0"];
                let mut resp = format!("*{}\r\n", cmd.len());
                for a in cmd {
                    resp.push_str(&format!("${}\r\n{a}\r\n", a.len()));
                }
                std::io::Write::write_all(&mut raw, resp.as_bytes()).unwrap();
                assert!(wait_until(Duration::from_secs(5), || waiters(&mut c, &key) == 1));
                None
            };
            let r2 = spawn_waiter_with(&s, &key, "r2", "30000", &["SHARED", "BLOCK", "0"]);
            let since = Instant::now();
            match writer {
                Some(w) => assert_eq!(w.join().unwrap().0.unwrap(), Value::Nil, "the writer timed out"),
                None => drop(raw),
            }
            let (t2, at) = answered(r2, &format!("the reader behind the writer ({leaving})"));
            assert!(at - since < Duration::from_millis(2000), "{leaving}: {:?}", at - since);
            assert_eq!(holders(&info(&mut c, &key)).len(), 2);
            assert_eq!(token_of(&mut c, &key), Some(t2));
        }
    }

    fn the_grace_period_admits_no_new_holder(kind) {
        let master = Server::start(kind);
        let replica = Server::start_with(kind, Opts::default().module_args(&["grace-ms", "30000"]).extra(&["--replicaof", "127.0.0.1", &master.port.to_string()]));
        let mut m = master.conn();
        let mut r = replica.conn();
        assert!(wait_until(Duration::from_secs(10), || info_value(&mut r, "replication", "master_link_status").as_deref() == Some("up")));
        let ta = limit(&mut m, "sem", "a", "3").unwrap();
        let tr = shared(&mut m, "rd", "r1").unwrap();
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        assert_eq!(ok(&mut r, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
        assert!(info_int(&mut r, "lease_grace_remaining_ms") > 0);
        let refused = counter(&mut r, "grace_refused");
        assert_eq!(limit(&mut r, "sem", "b", "3"), None, "room, but no new holder now");
        assert_eq!(shared(&mut r, "rd", "r2"), None);
        assert_eq!(counter(&mut r, "grace_refused"), refused + 2);
        // Holders the server knows keep working.
        assert_eq!(limit(&mut r, "sem", "a", "3"), Some(ta));
        assert_eq!(shared(&mut r, "rd", "r1"), Some(tr));
        assert_eq!(int(&ok(&mut r, &["LEASE.RENEW", "sem", "a", "30000"])), 1);
        assert_eq!(ok(&mut r, &["LEASE.FENCE", "sem", &ta.to_string()]), Value::Okay);
        // A waiter queues; a released place is not handed over during the period.
        let w = spawn_waiter_with(&replica, "sem", "b", "30000", &["LIMIT", "3", "BLOCK", "0"]);
        assert_eq!(int(&ok(&mut r, &["LEASE.RELEASE", "sem", "a"])), 1);
        std::thread::sleep(Duration::from_millis(200));
        assert!(!w.is_finished(), "served during the grace period");
        assert_eq!(ok(&mut r, &["CONFIG", "SET", "lease.grace-ms", "0"]), Value::Okay);
        let (tb, _) = answered(w, "the waiter");
        assert!(tb > ta);
    }

    fn acl_oom_and_wrong_keys(kind) {
        let s = Server::start(kind);
        let mut admin = s.conn();
        let rules: Vec<&str> = match kind {
            _ if kind.is_redis70() => vec!["~lock:*", "+lease.acquire", "+lease.renew", "+lease.release", "+lease.info", "+lease.fence", "+get"],
            _ => vec!["~lock:*", "+@lease", "+get"],
        };
        let mut args = vec!["ACL", "SETUSER", "worker", "on", ">pw"];
        args.extend(rules);
        ok(&mut admin, &args);
        let mut c = s.conn();
        ok(&mut c, &["AUTH", "worker", "pw"]);
        let t = limit(&mut c, "lock:sem", "w", "2").unwrap();
        assert!(shared(&mut c, "lock:rd", "w").is_some());
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "lock:sem", &t.to_string()]), Value::Okay);
        for key in ["jobs:sem", "other"] {
            assert!(err(&mut c, &["LEASE.ACQUIRE", key, "w", "1000", "LIMIT", "2"]).starts_with("NOPERM"));
            assert!(err(&mut c, &["LEASE.ACQUIRE", key, "w", "1000", "SHARED"]).starts_with("NOPERM"));
        }
        assert_eq!(int(&ok(&mut admin, &["EXISTS", "jobs:sem", "other"])), 0);
        // The internal effects: refused to every client, whatever its ACL.
        assert!(err(&mut admin, &["LEASE.HOLD", "lock:x", "o", "5", "1900000000000", "SHARED"]).contains("internal"));
        // Under OOM: a new holder is refused, holders keep control.
        let tr = shared(&mut admin, "rd", "r1").unwrap();
        let ts = limit(&mut admin, "sem", "a", "3").unwrap();
        ok(&mut admin, &["CONFIG", "SET", "maxmemory", "1"]);
        for opts in [&["LIMIT", "3"][..], &["SHARED"]] {
            let mut args = vec!["LEASE.ACQUIRE", if opts[0] == "SHARED" { "rd" } else { "sem" }, "new", "1000"];
            args.extend_from_slice(opts);
            assert!(err(&mut admin, &args).starts_with("OOM"), "{args:?}");
        }
        assert_eq!(int(&ok(&mut admin, &["LEASE.RENEW", "rd", "r1", "30000"])), 1);
        assert_eq!(ok(&mut admin, &["LEASE.FENCE", "sem", &ts.to_string()]), Value::Okay);
        assert_eq!(ok(&mut admin, &["LEASE.FENCE", "rd", &tr.to_string()]), Value::Okay);
        assert!(matches!(info(&mut admin, "sem"), Value::Array(_)));
        assert_eq!(int(&ok(&mut admin, &["LEASE.RELEASE", "rd", "r1"])), 1);
        assert_eq!(int(&ok(&mut admin, &["LEASE.RELEASE", "sem", "a"])), 1);
        ok(&mut admin, &["CONFIG", "SET", "maxmemory", "0"]);
    }

    fn keyspace_events_per_holder(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEdx$"]);
        let mut sub = s.conn();
        sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut ps = sub.as_pubsub();
        ps.psubscribe("__keyevent@0__:*").unwrap();
        let mut next = |n: usize| -> Vec<String> {
            (0..n).map(|_| {
                let msg = ps.get_message().expect("an event");
                let key: String = msg.get_payload().unwrap();
                format!("{} {key}", msg.get_channel_name().trim_start_matches("__keyevent@0__:"))
            }).collect()
        };
        limit(&mut c, "sem", "a", "2").unwrap();
        acquire_opts(&mut c, "sem", "b", "150", &["LIMIT", "2"]).unwrap();
        limit(&mut c, "sem", "a", "2").unwrap();
        ok(&mut c, &["LEASE.RENEW", "sem", "a", "30000"]);
        assert_eq!(next(4), ["lease.acquire sem", "lease.acquire sem", "lease.renew sem", "lease.renew sem"]);
        std::thread::sleep(Duration::from_millis(250));
        // b's end is noticed on access: it leaves (lease.expire), c comes in.
        limit(&mut c, "sem", "c", "2").unwrap();
        ok(&mut c, &["LEASE.RELEASE", "sem", "c"]);
        ok(&mut c, &["LEASE.RELEASE", "sem", "a"]);
        assert_eq!(next(4), ["lease.expire sem", "lease.acquire sem", "lease.release sem", "lease.release sem"]);
        acquire_opts(&mut c, "rd", "r", "100", &["SHARED"]).unwrap();
        assert_eq!(next(2), ["lease.acquire rd", "expired rd"]);
        // Nothing for refusals and errors.
        shared(&mut c, "rd2", "r").unwrap();
        assert_eq!(acquire_opts(&mut c, "rd2", "w", "1000", &[]), None);
        let _ = err(&mut c, &["LEASE.ACQUIRE", "rd2", "w", "1000", "LIMIT", "2"]);
        ok(&mut c, &["SET", "marker", "1"]);
        assert_eq!(next(2), ["lease.acquire rd2", "set marker"]);
    }

    fn a_limit_100000_key_stays_cheap(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let n = 100_000;
        let started = Instant::now();
        for chunk in 0..n / 10_000 {
            let mut p = redis::pipe();
            for i in 0..10_000 {
                p.cmd("LEASE.ACQUIRE").arg("big").arg(format!("o{}", chunk * 10_000 + i)).arg(60_000).arg("LIMIT").arg(n);
            }
            let tokens: Vec<Option<i64>> = p.query(&mut c).unwrap();
            assert!(tokens.iter().all(|t| t.is_some()));
        }
        assert_eq!(limit(&mut c, "big", "one-too-many", &n.to_string()), None);
        ok(&mut c, &["CONFIG", "RESETSTAT"]);
        // Release and re-acquire one holder, many times: each call is
        // O(log n), so it costs about what it costs on a key with few holders.
        for i in 0..200 {
            let o = format!("o{}", i * 7);
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "big", &o])), 1);
            assert!(limit(&mut c, "big", &o, &n.to_string()).is_some());
            assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "big", &o, "60000"])), 1);
        }
        let per_call = |c: &mut redis::Connection, cmd: &str| -> f64 {
            let stats: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
            let line = stats.lines().find(|l| l.to_lowercase().starts_with(&format!("cmdstat_{cmd}:"))).unwrap().to_string();
            line.split("usec_per_call=").nth(1).unwrap().split(',').next().unwrap().parse().unwrap()
        };
        let big = per_call(&mut c, "lease.acquire");
        ok(&mut c, &["CONFIG", "RESETSTAT"]);
        for i in 0..200 {
            let o = format!("s{i}");
            assert!(limit(&mut c, "small", &o, "2").is_some());
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "small", &o])), 1);
        }
        let small = per_call(&mut c, "lease.acquire");
        assert!(big < small * 20.0 + 50.0, "acquire on 100000 holders: {big} us per call, on one: {small} us");
        let v = info(&mut c, "big");
        assert_eq!(holders(&v).len(), n as usize);
        assert!(started.elapsed() < Duration::from_secs(120));
        // DEL of the big key: freed (in the background where lazy freeing is on).
        assert_eq!(int(&ok(&mut c, &["DEL", "big"])), 1);
        assert_eq!(int(&ok(&mut c, &["DBSIZE"])), 0);
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn limit_admits_n_holders_each_with_its_own_token(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let before = counters(&mut c);
        let ta = limit(&mut c, "sem", "owner-a", "3").unwrap();
        let tb = limit(&mut c, "sem", "owner-b", "3").unwrap();
        let tc = limit(&mut c, "sem", "owner-c", "3").unwrap();
        assert!(ta < tb && tb < tc, "{ta} {tb} {tc}");
        assert_eq!(limit(&mut c, "sem", "owner-d", "3"), None, "a fourth holder");
        // A holder's retry: same token, its own deadline moves.
        assert_eq!(acquire_opts(&mut c, "sem", "owner-a", "5000", &["LIMIT", "3"]), Some(ta));
        assert_eq!(ok_text(&mut c, &["TYPE", "sem"]), "leasetype");
        let v = info(&mut c, "sem");
        assert_eq!(field(&v, "mode"), Some(Value::BulkString(b"limit".to_vec())));
        assert_eq!(field(&v, "limit"), Some(Value::Int(3)));
        assert_eq!(field(&v, "token"), Some(Value::Int(tc)), "the newest holder's");
        assert_eq!(field(&v, "waiters"), Some(Value::Int(0)));
        near(int(&field(&v, "ttl").unwrap()), 30_000, "ttl to the latest deadline");
        let h = holders(&v);
        assert_eq!(h.iter().map(|h| h.0).collect::<Vec<_>>(), vec![ta, tb, tc], "sorted by token");
        near(h[0].1, 5_000, "a's own ttl");
        near(h[1].1, 30_000, "b's ttl");
        assert!(!format!("{v:?}").contains("owner-"), "INFO shows no owner: {v:?}");
        near(pttl(&mut c, "sem"), 30_000, "the key's TTL is the latest deadline");
        let after = counters(&mut c);
        let delta = |n: &str| after.iter().find(|x| x.0 == n).unwrap().1 - before.iter().find(|x| x.0 == n).unwrap().1;
        assert_eq!((delta("acquired"), delta("contended"), delta("reacquired")), (3, 1, 1));
        // RESP3: a map, holders as maps.
        let mut c3 = s.conn3();
        let v3 = info(&mut c3, "sem");
        assert!(matches!(v3, Value::Map(_)), "{v3:?}");
        assert_eq!(holders(&v3).iter().map(|h| h.0).collect::<Vec<_>>(), vec![ta, tb, tc]);
        assert!(matches!(field(&v3, "holders"), Some(Value::Array(ref l)) if matches!(l[0], Value::Map(_))));
        // Tokens strictly increase across holders of every key.
        let td = limit(&mut c, "sem2", "owner-a", "2").unwrap();
        assert!(td > tc);
    }

    fn shared_admits_readers_and_no_writer(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let tokens: Vec<i64> = (1..=5).map(|i| shared(&mut c, "rd", &format!("r{i}")).unwrap()).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]));
        let contended = counter(&mut c, "contended");
        assert_eq!(acquire_opts(&mut c, "rd", "writer", "30000", &[]), None, "a writer waits for the readers");
        assert_eq!(counter(&mut c, "contended"), contended + 1);
        let e = err(&mut c, &["LEASE.ACQUIRE", "rd", "r1", "30000"]);
        assert_eq!(e, "ERR this owner holds the key with SHARED and asks for an exclusive lease: release it first");
        let v = info(&mut c, "rd");
        assert_eq!(field(&v, "mode"), Some(Value::BulkString(b"shared".to_vec())));
        assert_eq!(field(&v, "limit"), Some(Value::Int(0)));
        assert_eq!(holders(&v).len(), 5);
        // A key held exclusively: readers wait, its holder may not read.
        let tx = acquire(&mut c, "ex", "x", "30000");
        assert_eq!(shared(&mut c, "ex", "y"), None);
        let e = err(&mut c, &["LEASE.ACQUIRE", "ex", "x", "30000", "SHARED"]);
        assert_eq!(e, "ERR this owner holds the key with an exclusive lease and asks for SHARED: release it first");
        assert_eq!(token_of(&mut c, "ex"), Some(tx));
        // Exclusive INFO: exactly token, ttl, waiters, since, label, guard.
        let Value::Array(fields) = info(&mut c, "ex") else { panic!() };
        assert_eq!(fields.len(), 12);
        assert!(field(&Value::Array(fields), "mode").is_none());
        // Readers' retries keep their tokens; the last reader out deletes the key.
        assert_eq!(shared(&mut c, "rd", "r3"), Some(tokens[2]));
        for i in 1..=5 {
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "rd", &format!("r{i}")])), 1);
        }
        assert_eq!(int(&ok(&mut c, &["EXISTS", "rd"])), 0);
        let tw = acquire(&mut c, "rd", "writer", "30000");
        assert!(tw > tokens[4]);
    }

    fn a_freed_place_goes_to_the_oldest_waiter(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        limit(&mut c, "sem", "a", "2").unwrap();
        let tb = acquire_opts(&mut c, "sem", "b", "400", &["LIMIT", "2"]).unwrap();
        let w1 = spawn_waiter_with(&s, "sem", "w1", "30000", &["LIMIT", "2", "BLOCK", "0"]);
        let w2 = spawn_waiter_with(&s, "sem", "w2", "30000", &["BLOCK", "5000", "LIMIT", "2"]);
        let w3 = spawn_waiter_with(&s, "sem", "w3", "30000", &["LIMIT", "2", "BLOCK", "5000"]);
        assert_eq!(waiters(&mut c, "sem"), 3);
        // No newcomer overtakes them.
        assert_eq!(limit(&mut c, "sem", "late", "2"), None);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "a"])), 1);
        let (t1, _) = answered(w1, "w1");
        assert!(t1 > tb);
        assert_eq!(waiters(&mut c, "sem"), 2);
        // b's deadline passes while w2 waits: a timer at the earliest
        // deadline hands its place over.
        let since = Instant::now();
        let (t2, at) = answered(w2, "w2");
        assert!(t2 > t1);
        assert!(at - since < Duration::from_millis(1500), "served {:?} after", at - since);
        assert!(!w3.is_finished(), "w3 still waits: both places are taken");
        let v = info(&mut c, "sem");
        assert_eq!(holders(&v).iter().map(|h| h.0).collect::<Vec<_>>(), vec![t1, t2]);
        assert_eq!(field(&v, "waiters"), Some(Value::Int(1)));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "sem", "w2"])), 1);
        let (t3, _) = answered(w3, "w3");
        assert!(t3 > t2);
        // A waiter that times out leaves the queue.
        let w4 = spawn_waiter_with(&s, "sem", "w4", "30000", &["LIMIT", "2", "BLOCK", "100"]);
        let (reply, _) = w4.join().unwrap();
        assert_eq!(reply.unwrap(), Value::Nil);
        assert_eq!(waiters(&mut c, "sem"), 0);
    }

    fn bad_options_and_mismatched_modes_are_errors_that_change_nothing(kind) {
        let s = Server::start_with(kind, Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]));
        let mut c = s.conn();
        limit(&mut c, "sem", "a", "3").unwrap();
        let tx = acquire(&mut c, "ex", "x", "30000");
        shared(&mut c, "rd", "r").unwrap();
        let keys = ["sem", "ex", "rd"];
        let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
        let before = counters(&mut c);
        let aof = aof_bytes(&s);
        let cases: &[(&str, &str, &[&str], &str)] = &[
            ("free", "z", &["LIMIT", "0"], "ERR LIMIT is out of range (must be 2..100000)"),
            ("free", "z", &["LIMIT", "-2"], "ERR LIMIT is out of range (must be 2..100000)"),
            ("free", "z", &["LIMIT", "100001"], "ERR LIMIT is out of range (must be 2..100000)"),
            ("free", "z", &["LIMIT", "1"], "ERR LIMIT 1 is an exclusive lease: leave LIMIT out (LIMIT must be 2..100000)"),
            ("free", "z", &["LIMIT", "3x"], "ERR LIMIT is not an integer"),
            ("free", "z", &["LIMIT", "2.5"], "ERR LIMIT is not an integer"),
            ("free", "z", &["LIMIT"], "ERR option LIMIT needs a value"),
            ("free", "z", &["LIMIT", "3", "SHARED"], "ERR options LIMIT and SHARED cannot be given together"),
            ("free", "z", &["SHARED", "BLOCK", "10", "LIMIT", "3"], "ERR options LIMIT and SHARED cannot be given together"),
            ("free", "z", &["LIMIT", "3", "LIMIT", "3"], "ERR option LIMIT given more than once"),
            ("free", "z", &["shared", "SHARED"], "ERR option SHARED given more than once"),
            ("sem", "z", &["LIMIT", "5"], "ERR the key is held with LIMIT 3, this acquire asks for LIMIT 5"),
            ("sem", "a", &["LIMIT", "4"], "ERR the key is held with LIMIT 3, this acquire asks for LIMIT 4"),
            ("sem", "z", &["LIMIT", "5", "BLOCK", "1000"], "ERR the key is held with LIMIT 3, this acquire asks for LIMIT 5"),
            ("sem", "z", &[], "ERR the key is held with LIMIT 3, this acquire asks for an exclusive lease"),
            ("sem", "a", &[], "ERR the key is held with LIMIT 3, this acquire asks for an exclusive lease"),
            ("sem", "z", &["SHARED", "BLOCK", "0"], "ERR the key is held with LIMIT 3, this acquire asks for SHARED"),
            ("ex", "z", &["LIMIT", "3"], "ERR the key is held with an exclusive lease, this acquire asks for LIMIT 3"),
            ("ex", "x", &["SHARED"], "ERR this owner holds the key with an exclusive lease and asks for SHARED: release it first"),
            ("rd", "z", &["LIMIT", "2"], "ERR the key is held with SHARED, this acquire asks for LIMIT 2"),
            ("rd", "r", &[], "ERR this owner holds the key with SHARED and asks for an exclusive lease: release it first"),
        ];
        for (key, owner, opts, want) in cases {
            let mut args = vec!["LEASE.ACQUIRE", key, owner, "30000"];
            args.extend_from_slice(opts);
            let started = Instant::now();
            assert_eq!(&err(&mut c, &args), want, "{args:?}");
            assert!(started.elapsed() < Duration::from_millis(500), "{args:?} blocked");
        }
        assert_eq!(int(&ok(&mut c, &["EXISTS", "free"])), 0, "no key was created");
        for (k, d) in keys.iter().zip(&digests) {
            assert_eq!(&digest(&mut c, k), d, "{k} changed");
        }
        assert_eq!(counters(&mut c), before, "no counter moved");
        assert_eq!(token_of(&mut c, "ex"), Some(tx));
        assert_eq!(aof_bytes(&s), aof, "nothing was written to the AOF");
        // The internal effects are refused to clients.
        let e = err(&mut c, &["LEASE.HOLD", "sem", "z", "5", "1900000000000", "LIMIT", "3"]);
        assert_eq!(e, "ERR LEASE.HOLD is internal: accepted only from the replication link and the AOF");
        let e = err(&mut c, &["LEASE.DROP", "sem", "a"]);
        assert_eq!(e, "ERR LEASE.DROP is internal: accepted only from the replication link and the AOF");
        assert_eq!(digest(&mut c, "sem"), digests[0]);
        // A key of another type.
        ok(&mut c, &["SET", "plain", "v"]);
        assert!(err(&mut c, &["LEASE.ACQUIRE", "plain", "z", "1000", "LIMIT", "2"]).starts_with("WRONGTYPE"));
        assert!(err(&mut c, &["LEASE.ACQUIRE", "plain", "z", "1000", "SHARED"]).starts_with("WRONGTYPE"));
    }
}
