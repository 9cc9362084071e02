//! LEASE.ACQUIRE ... BLOCK: first come first served hand-off on release,
//! expiry, DEL/UNLINK/FLUSHALL/RENAME; timeouts, disconnects, CLIENT
//! UNBLOCK; no blocking inside MULTI or scripts; the hand-off replicated.
mod common;
use common::*;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

both! {
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
        let mut events = RawConn::connect(s.port);
        events.call(&[b"SUBSCRIBE", b"__keyspace@0__:k"]);
        let t0 = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "a", "300"]));
        let deadline = Instant::now() + Duration::from_millis(300);
        let w = spawn_waiter(&s, "k", "b", "30000", "0");
        let t = got_token(w);
        // The old lease expires (the core event) before the hand-off.
        let seen: Vec<String> = (0..3)
            .map(|_| {
                let msg = String::from_utf8_lossy(&events.reply()).into_owned();
                msg.rsplit("\r\n").nth(1).unwrap_or_default().to_string()
            })
            .collect();
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
compat! {
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
