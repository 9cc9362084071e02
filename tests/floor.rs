//! design.md S9, the server side: `LEASE.ACQUIRE key owner ttl-ms FLOOR
//! token [BLOCK timeout-ms]`. A new lease's token is at least the floor and
//! the clock follows it; a holder's re-acquire raises its token (the old one
//! is stale, the call counts as a re-acquire and is notified as an
//! acquire); another owner's lease is untouched; a served waiter gets at
//! least its floor; errors change nothing; replicas and the AOF keep the
//! exact token; the bound is the grace length ahead of the clock, so a
//! restart without persistence never issues a token below a `FLOOR`.
mod common;
use common::grace;
use common::*;
use std::time::Duration;

const FLOOR_OFFSET: i64 = 5_000_000;

/// The grace length of these tests' servers: `FLOOR` may be this far ahead
/// of the clock (design.md S9).
const GRACE_MS: &str = "600000";

/// A server whose `FLOOR` bound is 10 minutes ahead, and that grants at once:
/// `grace-ms 600000` with an AOF written with `appendfsync always` (a start
/// on such an AOF runs no grace period).
fn floor_opts() -> Opts {
    Opts::default()
        .module_args(&["grace-ms", GRACE_MS])
        .extra(&["--appendonly", "yes", "--appendfsync", "always"])
}

fn floor_server(kind: Kind) -> Server {
    Server::start_with(kind, floor_opts())
}

/// The largest `FLOOR` a server accepts now, read from the error a token
/// beyond every bound gets, with that error.
fn max_floor(c: &mut redis::Connection) -> (String, i64) {
    let e = common::error_text(
        &call(
            c,
            &[
                b"LEASE.ACQUIRE",
                b"k",
                b"a",
                b"100",
                b"FLOOR",
                b"9007199254740991",
            ],
        )
        .unwrap_err(),
    );
    let max: i64 = e
        .rsplit("at most ")
        .next()
        .unwrap()
        .trim_end_matches(" now)")
        .parse()
        .unwrap();
    (e, max)
}

/// A floor well above what this server's clock issues now.
fn high_floor() -> i64 {
    (now_ms() + 60_000) * 1024 + FLOOR_OFFSET
}

fn acquire_floor(c: &mut redis::Connection, key: &str, owner: &str, floor: i64) -> Value {
    ok(
        c,
        &[
            "LEASE.ACQUIRE",
            key,
            owner,
            "60000",
            "FLOOR",
            &floor.to_string(),
        ],
    )
}

every_server! {
    fn a_new_lease_takes_the_floor_and_the_clock_follows(kind) {
        let s = floor_server(kind);
        let mut c = s.conn();
        let floor = high_floor();
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", floor)), floor);
        assert_eq!(token_of(&mut c, "k"), Some(floor));
        assert_eq!(info_int(&mut c, "lease_last_token"), floor);
        // Every later token on this server is larger, on any key.
        assert!(acquire(&mut c, "other", "b", "60000") > floor);
        // A floor below the clock changes nothing: the clock's token.
        let low = int(&acquire_floor(&mut c, "low", "c", 1));
        assert!(low > floor + 1);
        // The same call again is a retry: the same token.
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", floor)), floor);
        assert_eq!(info_int(&mut c, "lease_acquired"), 3);
        assert_eq!(info_int(&mut c, "lease_reacquired"), 1);
    }

    fn replicas_and_the_aof_keep_the_exact_token(kind) {
        let aof = floor_opts();
        let master = Server::start_with(kind, aof.clone());
        let replica = replica_of(kind, &master);
        let mut m = master.conn();
        let floor = high_floor();
        assert_eq!(int(&acquire_floor(&mut m, "k", "a", floor)), floor);
        acquire(&mut m, "k2", "b", "60000");
        let raised = floor + 10_000;
        assert_eq!(int(&acquire_floor(&mut m, "k2", "b", raised)), raised);
        assert_eq!(int(&ok(&mut m, &["WAIT", "1", "5000"])), 1);
        let mut r = replica.conn();
        assert_eq!(token_of(&mut r, "k"), Some(floor));
        assert_eq!(token_of(&mut r, "k2"), Some(raised));
        assert!(info_int(&mut r, "lease_last_token") >= raised);
        drop(replica);
        let master = master.restart_with(aof);
        let mut m = master.conn();
        assert_eq!(token_of(&mut m, "k"), Some(floor));
        assert_eq!(token_of(&mut m, "k2"), Some(raised));
        assert!(acquire(&mut m, "k3", "c", "60000") > raised, "the clock came back at the floor");
    }
}

full_suite! {
    fn a_holder_s_floor_raises_its_token_and_the_old_one_is_stale(kind) {
        let s = floor_server(kind);
        let mut c = s.conn();
        ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
        let first = acquire(&mut c, "k", "a", "60000");
        let mut sub = s.conn();
        sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        sub.send_packed_command(&redis::cmd("SUBSCRIBE").arg("__keyspace@0__:k").get_packed_command())
            .unwrap();
        sub.recv_response().expect("SUBSCRIBE confirmation");
        // A floor below the token: a plain re-acquire (lease.renew).
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", first - 10)), first);
        let floor = high_floor();
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", floor)), floor);
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", floor)), floor, "the same call: the same token");
        let events: Vec<String> = (0..3)
            .map(|_| {
                let m = sub.recv_response().expect("a keyspace event");
                let Value::Array(parts) = m else { panic!("{m:?}") };
                text(&parts[2])
            })
            .collect();
        assert_eq!(events, ["lease.renew", "lease.acquire", "lease.renew"]);
        assert_eq!(
            common::error_text(&call(&mut c, &[b"LEASE.FENCE", b"k", first.to_string().as_bytes()]).unwrap_err()),
            "STALE fencing token is not the token of the lease held on this key"
        );
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "k", &floor.to_string()]), Value::Okay);
        assert_eq!(info_int(&mut c, "lease_acquired"), 1);
        assert_eq!(info_int(&mut c, "lease_reacquired"), 3);
        assert_eq!(info_int(&mut c, "lease_last_token"), floor);
        assert!(acquire(&mut c, "k2", "b", "60000") > floor);
    }

    fn another_owner_s_lease_is_untouched(kind) {
        let s = floor_server(kind);
        let mut c = s.conn();
        let token = acquire(&mut c, "k", "a", "60000");
        let last = info_int(&mut c, "lease_last_token");
        assert_eq!(acquire_floor(&mut c, "k", "b", high_floor()), Value::Nil);
        assert_eq!(token_of(&mut c, "k"), Some(token));
        assert_eq!(info_int(&mut c, "lease_last_token"), last, "the clock did not move");
    }

    fn a_served_waiter_gets_at_least_its_floor(kind) {
        let s = floor_server(kind);
        let mut c = s.conn();
        acquire(&mut c, "k", "a", "60000");
        let floor = high_floor();
        let f = floor.to_string();
        let waiter = spawn_waiter_with(&s, "k", "w", "60000", &["FLOOR", &f, "BLOCK", "5000"]);
        // Its retry after a lost reply queues too, with a higher floor.
        let higher = (floor + 7).to_string();
        let retry = spawn_waiter_with(&s, "k", "w", "60000", &["FLOOR", &higher, "BLOCK", "5000"]);
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        assert_eq!(got_token(waiter), floor + 7, "one lease: the highest floor of its calls");
        assert_eq!(got_token(retry), floor + 7);
        assert_eq!(token_of(&mut c, "k"), Some(floor + 7));
        // A waiter served as a retry of its own holding is raised too.
        let again = (floor + 100).to_string();
        let h = spawn_call(&s, &["LEASE.ACQUIRE", "k", "w", "60000", "FLOOR", &again, "BLOCK", "5000"]);
        let got = h.recv_timeout(Duration::from_secs(5)).expect("answered").unwrap();
        assert_eq!(int(&got), floor + 100);
    }

    fn errors_name_the_problem_and_change_nothing(kind) {
        let s = floor_server(kind);
        let mut c = s.conn();
        let err = |c: &mut redis::Connection, args: &[&str]| {
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            common::error_text(&call(c, &args).unwrap_err())
        };
        let (e, max) = max_floor(&mut c);
        assert!(
            e.starts_with("ERR FLOOR token is more than the grace length (600000 ms, at least 1000) ahead of this server's clock (at most "),
            "{e}"
        );
        let grace_ahead = (now_ms() + 600_000) * 1024;
        assert!((max - grace_ahead).abs() < 10_000 * 1024, "{max} vs {grace_ahead}");
        for (args, want) in [
            (vec!["FLOOR", "7", "SHARED"], "ERR FLOOR is for exclusive leases: it cannot be given with LIMIT or SHARED"),
            (vec!["LIMIT", "3", "FLOOR", "7"], "ERR FLOOR is for exclusive leases: it cannot be given with LIMIT or SHARED"),
            (vec!["FLOOR"], "ERR option FLOOR needs a value"),
            (vec!["FLOOR", "1", "FLOOR", "2"], "ERR option FLOOR given more than once"),
            (vec!["FLOOR", "x"], "ERR FLOOR is not an integer"),
            (vec!["FLOOR", "0"], "ERR FLOOR is out of range (must be 1..9007199254740991)"),
            (vec!["FLOOR", "9007199254740992"], "ERR FLOOR is out of range (must be 1..9007199254740991)"),
        ] {
            let mut full = vec!["LEASE.ACQUIRE", "k", "a", "1000"];
            full.extend(args.iter());
            assert_eq!(err(&mut c, &full), want, "{args:?}");
        }
        // Nothing changed: no key, no token issued; the bound itself is fine.
        assert_eq!(token_of(&mut c, "k"), None);
        assert_eq!(info_int(&mut c, "lease_last_token"), 0);
        let at = max_floor(&mut c).1;
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", at)), at);
    }

    fn the_floor_bound_follows_the_grace_length_and_is_at_least_a_second(kind) {
        let s = floor_server(kind);
        let mut c = s.conn();
        for (grace, ahead) in [("5000", 5000), ("0", 1000), ("10", 1000), ("-1", 60_000)] {
            ok(&mut c, &["CONFIG", "SET", "lease.grace-ms", grace]);
            let (e, max) = max_floor(&mut c);
            assert!(e.contains(&format!("the grace length ({} ms, at least 1000)", ahead.max(1000))), "{grace}: {e}");
            let want = (now_ms() + ahead) * 1024;
            assert!((max - want).abs() < 2_000 * 1024, "grace-ms {grace}: {max} vs {want}");
            assert_eq!(info_int(&mut c, "lease_last_token"), 0, "nothing issued");
        }
    }

    fn a_restart_without_persistence_issues_tokens_above_any_floor(kind) {
        // No persistence and a 1.5 s grace: the fresh start runs it, and so
        // does the restart after the kill.
        let opts = || Opts::default().module_args(&["grace-ms", "1500"]);
        let s = grace::start(kind, opts());
        let mut c = s.conn();
        grace::wait_out_grace(&mut c, &[], Duration::from_secs(10));
        let (_, max) = max_floor(&mut c);
        assert_eq!(int(&acquire_floor(&mut c, "k", "a", max)), max, "the bound itself is taken");
        let s = grace::restart(s, opts());
        let mut c = s.conn();
        assert_eq!(token_of(&mut c, "k"), None, "nothing persisted");
        grace::wait_out_grace(&mut c, &[], Duration::from_secs(10));
        let after = int(&acquire_floor(&mut c, "k", "b", 1));
        assert!(after > max, "a token after the restart ({after}) is above the floor set before it ({max})");
    }

    fn a_restart_without_persistence_issues_tokens_above_a_floor_when_the_grace_is_under_a_second(kind) {
        // A 300 ms grace: the FLOOR bound is still 1 s ahead (S9), so the
        // start's token clock starts that far ahead.
        let opts = || Opts::default().module_args(&["grace-ms", "300", "max-ttl-ms", "300"]);
        let s = grace::start(kind, opts());
        let mut c = s.conn();
        grace::wait_out_grace(&mut c, &[], Duration::from_secs(10));
        let (_, max) = max_floor(&mut c);
        let floor = ["LEASE.ACQUIRE", "k", "a", "300", "FLOOR", &max.to_string()];
        assert_eq!(int(&ok(&mut c, &floor)), max, "the bound itself is taken");
        let s = grace::restart(s, opts());
        let mut c = s.conn();
        grace::wait_out_grace(&mut c, &[], Duration::from_secs(10));
        let after = int(&ok(&mut c, &["LEASE.ACQUIRE", "k", "b", "300"]));
        assert!(after > max, "a token after the restart ({after}) is above the floor set before it ({max})");
        let next = int(&ok(&mut c, &["LEASE.ACQUIRE", "other", "b", "300"]));
        assert!(next > after, "and the clock goes on from it");
    }
}
