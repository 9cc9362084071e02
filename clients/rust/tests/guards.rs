//! Guarded keys (design.md S12) through the helpers, against real servers:
//! `guard` / `unguard` and the server's refusals; every fenced write path
//! of a lease on the guard (one key, `MINTTL`, the fenced command on a
//! connection of one's own, multi-key, quorum; sync and async) writes
//! guarded data; a write outside the guard's fence (a plain one, the
//! fence of another lease key of the tag, or a fence writing another
//! guard's tag) is `Error::Fenced` and changes nothing; a stale token is `Error::Stale` there; tokens of a guard key
//! keep increasing; leases on unguarded keys work as before; on a cluster
//! every call goes to the tag's master.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{Server, Value, field, info_int, ok, wait_until};
use redis_lease_client::{Block, Error, LeaseClient, Mode, Options, QuorumClient};

const MS: fn(u64) -> Duration = Duration::from_millis;
/// The guard, the data it guards, and another lease key of its tag.
const GUARD: &str = "{g}:lock";
const DATA: &str = "{g}:data";
const OTHER: &str = "{g}:other-lock";

fn client(s: &Server) -> LeaseClient {
    LeaseClient::open(&s.url(false)).unwrap()
}

/// `LEASE.INFO key`: `None` when the key is no lease; else its `token`
/// (`None` for a free guard) and its `guard` field.
fn info(c: &mut redis::Connection, key: &str) -> Option<(Option<i64>, i64)> {
    let v = ok(c, &["LEASE.INFO", key]);
    if v == Value::Nil {
        return None;
    }
    let token = match field(&v, "token").expect("a token field") {
        Value::Nil => None,
        t => Some(common::int(&t)),
    };
    Some((
        token,
        common::int(&field(&v, "guard").expect("a guard field")),
    ))
}

/// A free guard: a lease key with no lease held, its guard on, no ttl.
fn assert_free_guard(c: &mut redis::Connection, key: &str) {
    assert_eq!(info(c, key), Some((None, 1)), "{key} is a free guard");
    assert_eq!(common::pttl(c, key), -1, "a free guard has no ttl");
}

/// `GET key` as text (`None`: no such key).
fn get(c: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(c).unwrap()
}

/// A plain command on a connection of one's own (the escape hatch), its
/// error as the crate types it; panics if it succeeds.
fn refused(c: &mut redis::Connection, cmd: &redis::Cmd) -> Error {
    match cmd.query::<Value>(c) {
        Ok(v) => panic!("{cmd:?} should be refused, got {v:?}"),
        Err(e) => Error::from(e),
    }
}

/// `r` is the refusal of a write to `key` outside the fence of `guard`.
#[track_caller]
fn assert_fenced<T: std::fmt::Debug>(r: Result<T, Error>, key: &str, guard: &str) {
    match r {
        Err(Error::Fenced { key: k, guard: g }) => {
            assert_eq!((k.as_str(), g.as_str()), (key, guard))
        }
        other => panic!("a FENCED refusal of {key} by {guard}, not {other:?}"),
    }
}

#[track_caller]
fn assert_stale<T: std::fmt::Debug>(r: Result<T, Error>) {
    assert!(matches!(r, Err(Error::Stale)), "STALE, not {r:?}");
}

fn set(key: &str, value: &str) -> redis::Cmd {
    redis::cmd("SET").arg(key).arg(value).clone()
}

fn hset(key: &str, f: &str) -> redis::Cmd {
    redis::cmd("HSET").arg(key).arg(f).arg(1).clone()
}

every_server! {
    fn guard_and_unguard_round_trip_and_the_servers_refusals_come_back_as_errors(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        // A free key becomes a free guard; a second guard changes nothing.
        lc.guard(GUARD).unwrap();
        lc.guard(GUARD).unwrap();
        assert_free_guard(&mut c, GUARD);
        assert_eq!(info_int(&mut c, "lease_guards"), 1);
        assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "x"))), DATA, GUARD);
        // Unguard: it guarded (1), the free guard key is gone, writes pass.
        assert!(lc.unguard(GUARD).unwrap());
        assert_eq!(info(&mut c, GUARD), None);
        assert_eq!(info_int(&mut c, "lease_guards"), 0);
        assert!(!lc.unguard(GUARD).unwrap(), "it guards no more: 0");
        assert!(!lc.unguard("{never}:lock").unwrap(), "no such key: 0");
        ok(&mut c, &["SET", DATA, "x"]);
        // The server's refusals, as Error::Redis with its text.
        let text = |r: Result<(), Error>| match r {
            Err(Error::Redis(e)) => common::error_text(&e),
            other => panic!("a server's refusal, not {other:?}"),
        };
        assert!(text(lc.guard("no-tag")).starts_with("ERR a guard needs a key with a hash tag"));
        assert!(text(lc.guard("{}:empty-tag")).starts_with("ERR a guard needs a key with a hash tag"));
        lc.guard(GUARD).unwrap();
        assert_eq!(text(lc.guard(OTHER)), "ERR hash tag {g} is already guarded by '{g}:lock'");
        ok(&mut c, &["SET", "{s}:string", "v"]);
        assert!(text(lc.guard("{s}:string")).starts_with("WRONGTYPE"));
        // A guard key holds only exclusive leases; a key held with LIMIT or
        // SHARED cannot guard.
        const ONLY_EXCLUSIVE: &str = "ERR a key that guards its hash tag holds only exclusive leases";
        for mode in [Mode::Shared, Mode::Limit(2)] {
            let r = lc.clone().with_mode(mode).acquire(GUARD, MS(5000), Block::NoWait);
            match r {
                Err(Error::Redis(e)) => assert!(common::error_text(&e).starts_with(ONLY_EXCLUSIVE), "{e}"),
                other => panic!("{mode:?} on a guard: refused, not {other:?}"),
            }
            let key = "{l}:lock";
            let held = lc.clone().with_mode(mode).acquire(key, MS(5000), Block::NoWait).unwrap().expect("free");
            assert!(text(lc.guard(key)).starts_with(ONLY_EXCLUSIVE), "{mode:?}");
            assert!(held.release().unwrap());
        }
        assert_free_guard(&mut c, GUARD);
        // A guard that holds a lease: unguard leaves the lease, an ordinary
        // one from now on, and its fence still writes.
        let mut lease = lc.acquire(GUARD, MS(5000), Block::NoWait).unwrap().expect("a free guard");
        assert_eq!(info(&mut c, GUARD), Some((Some(lease.token() as i64), 1)));
        assert!(lc.unguard(GUARD).unwrap());
        assert_eq!(info(&mut c, GUARD), Some((Some(lease.token() as i64), 0)));
        let _: () = lease.fence(&set(DATA, "held")).unwrap();
        ok(&mut c, &["SET", DATA, "plain again"]);
        assert!(lease.release().unwrap());
        assert_eq!(info(&mut c, GUARD), None, "an ordinary lease: gone once released");
        // The same over RESP3.
        let lc3 = LeaseClient::open(&s.url(true)).unwrap();
        lc3.guard(GUARD).unwrap();
        assert_free_guard(&mut c, GUARD);
        let mut other = lc3.acquire(OTHER, MS(5000), Block::NoWait).unwrap().expect("free");
        assert_fenced(other.fence::<()>(&set(DATA, "resp3")), DATA, GUARD);
        assert!(other.release().unwrap());
        assert!(lc3.unguard(GUARD).unwrap());
        assert!(!lc3.unguard(GUARD).unwrap());
    }

    fn every_fence_of_a_lease_on_the_guard_writes_guarded_data(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        lc.guard(GUARD).unwrap();
        let ttl = Duration::from_secs(10);
        let mut written = Vec::new();
        let mut wrote = |f: &str, n: i64| {
            assert_eq!(n, 1, "{f}: a new field");
            written.push(f.to_string());
        };
        // One key: fence, fence_min_ttl, a check only.
        let mut lease = lc.acquire(GUARD, ttl, Block::NoWait).unwrap().expect("a free guard");
        wrote("fence", lease.fence(&hset(DATA, "fence")).unwrap());
        wrote("min_ttl", lease.fence_min_ttl(MS(1000), &hset(DATA, "min_ttl")).unwrap());
        let _: () = lease.fence_min_ttl(MS(1000), &redis::Cmd::new()).unwrap();
        // The fenced command on a connection of one's own, alone and in a
        // pipeline (and the crate's free fence_cmd).
        wrote("own", lease.fence_cmd(&hset(DATA, "own")).query(&mut c).unwrap());
        wrote("own_min_ttl", lease.fence_cmd_min_ttl(MS(1000), &hset(DATA, "own_min_ttl")).query(&mut c).unwrap());
        let free = redis_lease_client::fence_cmd(GUARD, lease.token(), &hset(DATA, "free"));
        wrote("free", free.query(&mut c).unwrap());
        let (a, b): (i64, i64) = redis::pipe()
            .add_command(lease.fence_cmd(&hset(DATA, "pipe1")))
            .add_command(lease.fence_cmd_min_ttl(MS(1000), &hset(DATA, "pipe2")))
            .query(&mut c)
            .unwrap();
        wrote("pipe1", a);
        wrote("pipe2", b);
        // A read needs no fence.
        let seen: i64 = redis::cmd("HLEN").arg(DATA).query(&mut c).unwrap();
        assert_eq!(seen, 7);
        assert!(lease.release().unwrap());
        assert_free_guard(&mut c, GUARD);
        // with_lease.
        let n = lc
            .with_lease(GUARD, ttl, Block::NoWait, |lease| lease.fence::<i64>(&hset(DATA, "with_lease")))
            .unwrap()
            .expect("a free guard");
        wrote("with_lease", n);
        // A multi-key lease with the guard among its keys: the fences on the
        // guard key.
        let mut many = lc.acquire_many(&[OTHER, GUARD], ttl, Block::NoWait).unwrap().expect("free keys");
        wrote("many", many.fence(GUARD, &hset(DATA, "many")).unwrap());
        wrote("many_min_ttl", many.fence_min_ttl(GUARD, MS(1000), &hset(DATA, "many_min_ttl")).unwrap());
        wrote("many_own", many.fence_cmd(GUARD, &hset(DATA, "many_own")).unwrap().query(&mut c).unwrap());
        let own = many.fence_cmd_min_ttl(GUARD, MS(1000), &hset(DATA, "many_own_min_ttl")).unwrap();
        wrote("many_own_min_ttl", own.query(&mut c).unwrap());
        assert!(many.release().unwrap());
        let n = lc
            .with_many(&[GUARD, OTHER], ttl, Block::NoWait, |m| m.fence::<i64>(GUARD, &hset(DATA, "with_many")))
            .unwrap()
            .expect("free keys");
        wrote("with_many", n);
        let mut fields: Vec<String> = redis::cmd("HKEYS").arg(DATA).query(&mut c).unwrap();
        fields.sort();
        written.sort();
        assert_eq!(fields, written, "every fenced write landed");
        assert_free_guard(&mut c, GUARD);
    }

    fn a_write_outside_the_guards_fence_is_fenced_and_changes_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        ok(&mut c, &["SET", DATA, "before"]);
        lc.guard(GUARD).unwrap();
        let before = info_int(&mut c, "lease_guard_refused");
        let mut refusals = 0;
        // Plain writes on a connection of one's own: typed by Error::from.
        let e = refused(&mut c, &set(DATA, "plain"));
        assert!(e.to_string().contains(DATA) && e.to_string().contains(GUARD), "{e}");
        assert_fenced(Err::<(), _>(e), DATA, GUARD);
        assert_fenced(Err::<(), _>(refused(&mut c, redis::cmd("DEL").arg(DATA))), DATA, GUARD);
        assert_fenced(Err::<(), _>(refused(&mut c, redis::cmd("INCR").arg("{g}:new"))), "{g}:new", GUARD);
        // A command that writes keys of two tags: refused whole.
        let mset = redis::cmd("MSET").arg("{u}:x").arg(1).arg(DATA).arg("mset").clone();
        assert_fenced(Err::<(), _>(refused(&mut c, &mset)), DATA, GUARD);
        refusals += 4;
        assert_eq!(get(&mut c, DATA).as_deref(), Some("before"));
        assert_eq!(get(&mut c, "{g}:new"), None);
        assert_eq!(get(&mut c, "{u}:x"), None, "nothing of the refused MSET ran");
        // In MULTI: the refusal comes back in EXEC's reply for that command,
        // and the others run (`ignore_errors`: the redis crate hands each
        // reply back instead of failing the whole pipeline).
        let exec: Vec<Value> = redis::pipe()
            .atomic()
            .ignore_errors()
            .add_command(set(DATA, "multi"))
            .add_command(set("{u}:y", "ran"))
            .query(&mut c)
            .unwrap_or_else(|e| panic!("EXEC answers per command: {e:?}"));
        match &exec[0] {
            Value::ServerError(e) => {
                let e = Error::from(redis::RedisError::from(e.clone()));
                assert_fenced(Err::<(), _>(e), DATA, GUARD);
            }
            other => panic!("the refusal in EXEC's reply, not {other:?}"),
        }
        refusals += 1;
        assert_eq!(get(&mut c, "{u}:y").as_deref(), Some("ran"));
        // The guard's own holder writes through its fence only.
        let mut lease = lc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).unwrap().expect("free");
        assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "holder"))), DATA, GUARD);
        refusals += 1;
        // A lease on another key of the tag (LEASE.* commands pass) has a
        // valid token, but its fence is not the guard's: every path fenced.
        let mut other = lc.acquire(OTHER, Duration::from_secs(10), Block::NoWait).unwrap().expect("free");
        assert_fenced(other.fence::<()>(&set(DATA, "other")), DATA, GUARD);
        assert_fenced(other.fence_min_ttl::<()>(MS(1000), &set(DATA, "other")), DATA, GUARD);
        let own = other.fence_cmd(&set(DATA, "other"));
        assert_fenced(Err::<(), _>(refused(&mut c, &own)), DATA, GUARD);
        refusals += 3;
        let _: () = other.fence(&redis::Cmd::new()).unwrap();
        assert_eq!(
            other.fence::<Option<String>>(redis::cmd("GET").arg(DATA)).unwrap().as_deref(),
            Some("before"),
            "its fence reads"
        );
        assert!(other.release().unwrap());
        // A multi-key lease whose keys do not include the guard.
        let mut many = lc.acquire_many(&[OTHER, "{g}:third"], Duration::from_secs(10), Block::NoWait).unwrap().expect("free");
        assert_fenced(many.fence::<()>(OTHER, &set(DATA, "many")), DATA, GUARD);
        assert_fenced(many.fence_min_ttl::<()>("{g}:third", MS(1000), &set(DATA, "many")), DATA, GUARD);
        refusals += 2;
        assert!(many.release().unwrap());
        // The guard's own fence writing a key another guard guards.
        lc.guard("{h}:lock").unwrap();
        assert_fenced(lease.fence::<()>(&set("{h}:data", "cross")), "{h}:data", "{h}:lock");
        assert_fenced(lease.fence_min_ttl::<()>(MS(1000), &set("{h}:data", "cross")), "{h}:data", "{h}:lock");
        refusals += 2;
        assert_eq!(get(&mut c, "{h}:data"), None);
        assert_eq!(get(&mut c, DATA).as_deref(), Some("before"), "nothing written");
        assert_eq!(info_int(&mut c, "lease_guard_refused") - before, refusals);
        // The guard's fence writes.
        let _: () = lease.fence(&set(DATA, "fenced")).unwrap();
        assert_eq!(get(&mut c, DATA).as_deref(), Some("fenced"));
        assert!(lease.release().unwrap());
    }

    fn a_stale_token_on_the_guard_is_stale_and_writes_nothing(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let opts = Options { watchdog: false, ..Options::default() };
        let lc = client(&s).with_options(opts);
        lc.guard(GUARD).unwrap();
        let ttl = MS(400);
        let mut old = lc.acquire(GUARD, ttl, Block::NoWait).unwrap().expect("a free guard");
        let _: () = old.fence(&set(DATA, "v1")).unwrap();
        // Too little time left: EXPIRING, not FENCED.
        let r = old.fence_min_ttl::<()>(MS(60_000), &set(DATA, "expiring"));
        assert!(matches!(r, Err(Error::Expiring { .. })), "{r:?}");
        // Not renewed: it expires, the guard stays, free.
        assert!(wait_until(Duration::from_secs(3), || info(&mut c, GUARD) == Some((None, 1))), "expired");
        assert_free_guard(&mut c, GUARD);
        assert!(old.is_lost());
        assert_stale(old.fence::<()>(&set(DATA, "v2")));
        assert_stale(old.fence_min_ttl::<()>(MS(1), &set(DATA, "v2")));
        assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "plain"))), DATA, GUARD);
        // Another holder: the old token is stale on every path.
        let t2 = common::acquire(&mut c, GUARD, "next", "10000");
        assert!(t2 > old.token() as i64, "tokens of a guard keep increasing");
        assert_stale(old.fence::<()>(&set(DATA, "v3")));
        assert_stale(old.fence_min_ttl::<()>(MS(1), &set(DATA, "v3")));
        assert_stale(Err::<(), _>(refused(&mut c, &old.fence_cmd(&set(DATA, "v3")))));
        assert_stale(Err::<(), _>(refused(&mut c, &old.fence_cmd_min_ttl(MS(1), &set(DATA, "v3")))));
        assert_eq!(get(&mut c, DATA).as_deref(), Some("v1"));
        assert_eq!(info(&mut c, GUARD), Some((Some(t2), 1)));
        assert!(!old.release().unwrap(), "not ours");
        ok(&mut c, &["LEASE.RELEASE", GUARD, "next"]);
        // A multi-key lease's old token on the guard, and on its other key.
        let mut many = lc.acquire_many(&[GUARD, OTHER], ttl, Block::NoWait).unwrap().expect("free keys");
        let _: () = many.fence(GUARD, &set(DATA, "m1")).unwrap();
        assert!(wait_until(Duration::from_secs(3), || info(&mut c, GUARD) == Some((None, 1))), "expired");
        common::acquire(&mut c, GUARD, "next", "10000");
        assert_stale(many.fence::<()>(GUARD, &set(DATA, "m2")));
        assert_stale(many.fence_min_ttl::<()>(GUARD, MS(1), &set(DATA, "m2")));
        assert_stale(many.fence::<()>(OTHER, &set(DATA, "m2")));
        assert_eq!(get(&mut c, DATA).as_deref(), Some("m1"));
        assert!(!many.release().unwrap());
    }

    fn tokens_of_a_guard_key_keep_increasing_and_the_guard_stays_between_holdings(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        lc.guard(GUARD).unwrap();
        let mut last = 0;
        for round in 0..5 {
            let mut lease = lc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).unwrap().expect("a free guard");
            assert!(lease.token() > last, "round {round}: {} after {last}", lease.token());
            last = lease.token();
            let _: () = lease.fence(&set(DATA, &round.to_string())).unwrap();
            assert!(lease.release().unwrap());
            assert_free_guard(&mut c, GUARD);
            assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "plain"))), DATA, GUARD);
        }
        // A holding that ends at its ttl leaves the guard too.
        let quiet = client(&s).with_options(Options { watchdog: false, ..Options::default() });
        let lease = quiet.acquire(GUARD, MS(100), Block::NoWait).unwrap().expect("a free guard");
        assert!(lease.token() > last);
        last = lease.token();
        assert!(wait_until(Duration::from_secs(3), || info(&mut c, GUARD) == Some((None, 1))), "expired");
        drop(lease);
        assert_free_guard(&mut c, GUARD);
        let lease = lc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).unwrap().expect("a free guard");
        assert!(lease.token() > last);
        assert!(lease.release().unwrap());
        assert_eq!(get(&mut c, DATA).as_deref(), Some("4"));
    }

    fn leases_on_unguarded_keys_behave_as_before_while_a_guard_stands(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = client(&s);
        lc.guard(GUARD).unwrap();
        let ttl = Duration::from_secs(10);
        // Another tag, and keys with no tag: plain writes pass.
        ok(&mut c, &["SET", "{u}:plain", "1"]);
        ok(&mut c, &["SET", "plain", "1"]);
        // A lock: with_lease, its fence, and a second acquire of a key held.
        let n = lc
            .with_lease("{u}:lock", ttl, Block::NoWait, |lease| {
                assert!(matches!(lc.acquire("{u}:lock", ttl, Block::NoWait), Err(Error::AlreadyHeld(_))));
                lease.fence::<i64>(&hset("{u}", "with_lease"))
            })
            .unwrap();
        assert_eq!(n, Some(1));
        assert_eq!(info(&mut c, "{u}:lock"), None, "released");
        // A read/write lock: readers together, a reader's write refused as
        // before (SharedWrite, not Fenced).
        let readers = lc.clone().with_mode(Mode::Shared);
        let mut r1 = readers.acquire("{u}:rw", ttl, Block::NoWait).unwrap().expect("a reader");
        let r2 = client(&s).with_mode(Mode::Shared).acquire("{u}:rw", ttl, Block::NoWait).unwrap().expect("a second reader");
        assert_eq!(info(&mut c, "{u}:rw").map(|(_, g)| g), Some(0));
        let seen: Option<String> = r1.fence(redis::cmd("GET").arg("{u}:plain")).unwrap();
        assert_eq!(seen.as_deref(), Some("1"));
        assert!(matches!(r1.fence::<()>(&set("{u}:plain", "2")), Err(Error::SharedWrite)));
        assert!(r1.release().unwrap() && r2.release().unwrap());
        // Permits: two of two, the third busy.
        let permits = client(&s).with_mode(Mode::Limit(2));
        let p1 = permits.acquire("{u}:sem", ttl, Block::NoWait).unwrap().expect("a permit");
        let p2 = client(&s).with_mode(Mode::Limit(2)).acquire("{u}:sem", ttl, Block::NoWait).unwrap().expect("a permit");
        assert!(client(&s).with_mode(Mode::Limit(2)).acquire("{u}:sem", ttl, Block::NoWait).unwrap().is_none());
        assert!(p1.release().unwrap() && p2.release().unwrap());
        // Several keys at once.
        let n = lc
            .with_many(&["{u}:1", "{u}:2"], ttl, Block::NoWait, |m| {
                m.fence::<i64>("{u}:2", &hset("{u}", "with_many"))
            })
            .unwrap();
        assert_eq!(n, Some(1));
        // The guard is of its database: another one's keys of the tag are
        // not guarded. Redis 7.0's command filter cannot tell a client's
        // database, so there a guard covers its tag in every database.
        let db1 = redis::Client::open(format!("redis://127.0.0.1:{}/1", s.port)).unwrap();
        let mut c1 = db1.get_connection().unwrap();
        let r = set(DATA, "db1").query::<()>(&mut c1).map_err(Error::from);
        if kind.is_redis70() {
            assert_fenced(r, DATA, GUARD);
        } else {
            r.unwrap();
        }
        // Unguarded, the tag's keys take plain writes again.
        assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "x"))), DATA, GUARD);
        assert!(lc.unguard(GUARD).unwrap());
        ok(&mut c, &["SET", DATA, "x"]);
    }
}

/// Three masters, each with `GUARD` guarding its tag (through the
/// client's `guard`), and their URLs.
fn guarded_masters(kind: common::Kind) -> (Vec<Server>, Vec<String>) {
    let servers: Vec<Server> = (0..3).map(|_| Server::start(kind)).collect();
    for s in &servers {
        client(s).guard(GUARD).unwrap();
    }
    let urls = servers.iter().map(|s| s.url(false)).collect();
    (servers, urls)
}

full_suite! {
    fn a_quorum_lease_on_the_guard_of_every_master_writes_guarded_data(kind) {
        let (servers, urls) = guarded_masters(kind);
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let qc = QuorumClient::open(&urls).unwrap();
        let lease = qc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).unwrap().expect("free guards");
        let _: () = lease.fence(&set(DATA, "q1")).unwrap();
        let _: () = lease.fence_min_ttl(MS(1000), &set("{g}:more", "q2")).unwrap();
        let r = lease.fence_min_ttl::<()>(MS(60_000), &set(DATA, "expiring"));
        assert!(matches!(r, Err(Error::Expiring { .. })), "{r:?}");
        for s in &servers {
            let mut c = s.conn();
            assert_eq!(get(&mut c, DATA).as_deref(), Some("q1"));
            assert_eq!(get(&mut c, "{g}:more").as_deref(), Some("q2"));
            assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "plain"))), DATA, GUARD);
        }
        // A quorum lease on another key of the tag: fenced on every master.
        let other = qc.acquire(OTHER, Duration::from_secs(10), Block::NoWait).unwrap().expect("free");
        assert_fenced(other.fence::<()>(&set(DATA, "other")), DATA, GUARD);
        assert_fenced(other.fence_min_ttl::<()>(MS(1000), &set(DATA, "other")), DATA, GUARD);
        assert!(other.release().unwrap());
        assert!(lease.release().unwrap());
        // An old token: stale.
        let quiet = QuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        let old = quiet.acquire(GUARD, MS(1000), Block::NoWait).unwrap().expect("free guards");
        for s in &servers {
            let mut c = s.conn();
            assert!(wait_until(Duration::from_secs(5), || info(&mut c, GUARD) == Some((None, 1))), "expired");
        }
        let next = qc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).unwrap().expect("free again");
        assert!(next.token() > old.token());
        assert_stale(old.fence::<()>(&set(DATA, "old")));
        assert_stale(old.fence_min_ttl::<()>(MS(1), &set(DATA, "old")));
        let _: () = next.fence(&set(DATA, "next")).unwrap();
        for s in &servers {
            assert_eq!(get(&mut s.conn(), DATA).as_deref(), Some("next"));
        }
        assert!(next.release().unwrap());
    }
}

#[cfg(feature = "tokio")]
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[cfg(feature = "tokio")]
full_suite! {
    fn the_async_client_guards_and_unguards_and_gets_the_same_refusals(kind) {
        use redis_lease_client::aio::LeaseClient;
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = LeaseClient::open(&s.url(false)).unwrap();
        rt().block_on(async {
            lc.guard(GUARD).await.unwrap();
            lc.guard(GUARD).await.unwrap();
            assert_free_guard(&mut c, GUARD);
            assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "x"))), DATA, GUARD);
            assert!(lc.unguard(GUARD).await.unwrap());
            assert!(!lc.unguard(GUARD).await.unwrap());
            assert_eq!(info(&mut c, GUARD), None);
            ok(&mut c, &["SET", DATA, "x"]);
            let text = |r: Result<(), Error>| match r {
                Err(Error::Redis(e)) => common::error_text(&e),
                other => panic!("a server's refusal, not {other:?}"),
            };
            assert!(text(lc.guard("no-tag").await).starts_with("ERR a guard needs a key with a hash tag"));
            lc.guard(GUARD).await.unwrap();
            assert_eq!(text(lc.guard(OTHER).await), "ERR hash tag {g} is already guarded by '{g}:lock'");
            ok(&mut c, &["SET", "{s}:string", "v"]);
            assert!(text(lc.guard("{s}:string").await).starts_with("WRONGTYPE"));
            let r = lc.clone().with_mode(Mode::Shared).acquire(GUARD, MS(5000), Block::NoWait).await;
            assert!(matches!(r, Err(Error::Redis(_))), "{r:?}");
            assert_free_guard(&mut c, GUARD);
        });
    }

    fn every_async_fence_of_a_lease_on_the_guard_writes_guarded_data(kind) {
        use redis_lease_client::aio::LeaseClient;
        let s = Server::start(kind);
        let mut c = s.conn();
        let lc = LeaseClient::open(&s.url(false)).unwrap();
        let ttl = Duration::from_secs(10);
        rt().block_on(async {
            lc.guard(GUARD).await.unwrap();
            let lease = lc.acquire(GUARD, ttl, Block::NoWait).await.unwrap().expect("a free guard");
            assert_eq!(lease.fence::<i64>(&hset(DATA, "fence")).await.unwrap(), 1);
            assert_eq!(lease.fence_min_ttl::<i64>(MS(1000), &hset(DATA, "min_ttl")).await.unwrap(), 1);
            let own: i64 = lease.fence_cmd(&hset(DATA, "own")).query(&mut c).unwrap();
            let own_min: i64 = lease.fence_cmd_min_ttl(MS(1000), &hset(DATA, "own_min_ttl")).query(&mut c).unwrap();
            assert_eq!((own, own_min), (1, 1));
            // The handle, from another task.
            let handle = lease.handle();
            let n = tokio::spawn(async move { handle.fence::<i64>(&hset(DATA, "task")).await.unwrap() }).await.unwrap();
            assert_eq!(n, 1);
            assert!(lease.release().await.unwrap());
            let n = lc
                .with_lease(GUARD, ttl, Block::NoWait, |h| async move { h.fence::<i64>(&hset(DATA, "with_lease")).await })
                .await
                .unwrap();
            assert_eq!(n, Some(1));
            let many = lc.acquire_many(&[OTHER, GUARD], ttl, Block::NoWait).await.unwrap().expect("free keys");
            assert_eq!(many.fence::<i64>(GUARD, &hset(DATA, "many")).await.unwrap(), 1);
            assert_eq!(many.fence_min_ttl::<i64>(GUARD, MS(1000), &hset(DATA, "many_min_ttl")).await.unwrap(), 1);
            let own: i64 = many.fence_cmd(GUARD, &hset(DATA, "many_own")).unwrap().query(&mut c).unwrap();
            assert_eq!(own, 1);
            assert!(many.release().await.unwrap());
            let n = lc
                .with_many(&[GUARD, OTHER], ttl, Block::NoWait, |m| async move {
                    m.fence::<i64>(GUARD, &hset(DATA, "with_many")).await
                })
                .await
                .unwrap();
            assert_eq!(n, Some(1));
        });
        let fields: i64 = redis::cmd("HLEN").arg(DATA).query(&mut c).unwrap();
        assert_eq!(fields, 10, "every fenced write landed");
        assert_free_guard(&mut c, GUARD);
    }

    fn an_async_write_outside_the_guards_fence_is_fenced_and_an_old_token_stale(kind) {
        use redis_lease_client::aio::LeaseClient;
        let s = Server::start(kind);
        let mut c = s.conn();
        ok(&mut c, &["SET", DATA, "before"]);
        let lc = LeaseClient::open(&s.url(false)).unwrap();
        let quiet = LeaseClient::open(&s.url(false)).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        rt().block_on(async {
            lc.guard(GUARD).await.unwrap();
            // Another key of the tag: its fences are not the guard's.
            let other = lc.acquire(OTHER, Duration::from_secs(10), Block::NoWait).await.unwrap().expect("free");
            assert_fenced(other.fence::<()>(&set(DATA, "other")).await, DATA, GUARD);
            assert_fenced(other.fence_min_ttl::<()>(MS(1000), &set(DATA, "other")).await, DATA, GUARD);
            assert!(other.release().await.unwrap());
            let many = lc.acquire_many(&[OTHER, "{g}:third"], Duration::from_secs(10), Block::NoWait).await.unwrap().expect("free");
            assert_fenced(many.fence::<()>(OTHER, &set(DATA, "many")).await, DATA, GUARD);
            assert_fenced(many.fence_min_ttl::<()>(OTHER, MS(1000), &set(DATA, "many")).await, DATA, GUARD);
            assert!(many.release().await.unwrap());
            // The guard's fence writing a key another guard guards.
            lc.guard("{h}:lock").await.unwrap();
            let lease = lc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).await.unwrap().expect("free");
            assert_fenced(lease.fence::<()>(&set("{h}:data", "cross")).await, "{h}:data", "{h}:lock");
            assert!(lease.release().await.unwrap());
            assert_eq!(get(&mut c, DATA).as_deref(), Some("before"));
            // An old token on the guard: stale on every path.
            let old = quiet.acquire(GUARD, MS(400), Block::NoWait).await.unwrap().expect("a free guard");
            let _: () = old.fence(&set(DATA, "v1")).await.unwrap();
            assert!(wait_until(Duration::from_secs(3), || info(&mut c, GUARD) == Some((None, 1))), "expired");
            assert_stale(old.fence::<()>(&set(DATA, "v2")).await);
            common::acquire(&mut c, GUARD, "next", "10000");
            assert_stale(old.fence::<()>(&set(DATA, "v2")).await);
            assert_stale(old.fence_min_ttl::<()>(MS(1), &set(DATA, "v2")).await);
            assert_stale(Err::<(), _>(refused(&mut c, &old.fence_cmd(&set(DATA, "v2")))));
            assert!(!old.release().await.unwrap());
            ok(&mut c, &["LEASE.RELEASE", GUARD, "next"]);
            let many = quiet.acquire_many(&[GUARD, OTHER], MS(400), Block::NoWait).await.unwrap().expect("free keys");
            let _: () = many.fence(GUARD, &set(DATA, "m1")).await.unwrap();
            assert!(wait_until(Duration::from_secs(3), || info(&mut c, GUARD) == Some((None, 1))), "expired");
            common::acquire(&mut c, GUARD, "next", "10000");
            assert_stale(many.fence::<()>(GUARD, &set(DATA, "m2")).await);
            assert_stale(many.fence_min_ttl::<()>(GUARD, MS(1), &set(DATA, "m2")).await);
            assert!(!many.release().await.unwrap());
        });
        assert_eq!(get(&mut c, DATA).as_deref(), Some("m1"));
        assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "plain"))), DATA, GUARD);
    }

    fn the_async_quorum_lease_on_the_guard_of_every_master_writes_guarded_data(kind) {
        use redis_lease_client::aio::QuorumClient;
        let (servers, urls) = guarded_masters(kind);
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let qc = QuorumClient::open(&urls).unwrap();
        let quiet = QuorumClient::open(&urls).unwrap().with_options(Options { watchdog: false, ..Options::default() });
        rt().block_on(async {
            let lease = qc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).await.unwrap().expect("free guards");
            let _: () = lease.fence(&set(DATA, "q1")).await.unwrap();
            let _: () = lease.fence_min_ttl(MS(1000), &set("{g}:more", "q2")).await.unwrap();
            let other = qc.acquire(OTHER, Duration::from_secs(10), Block::NoWait).await.unwrap().expect("free");
            assert_fenced(other.fence::<()>(&set(DATA, "other")).await, DATA, GUARD);
            assert_fenced(other.fence_min_ttl::<()>(MS(1000), &set(DATA, "other")).await, DATA, GUARD);
            assert!(other.release().await.unwrap());
            assert!(lease.release().await.unwrap());
            for s in &servers {
                let mut c = s.conn();
                assert_eq!(get(&mut c, DATA).as_deref(), Some("q1"));
                assert_eq!(get(&mut c, "{g}:more").as_deref(), Some("q2"));
                assert_fenced(Err::<(), _>(refused(&mut c, &set(DATA, "plain"))), DATA, GUARD);
            }
            let old = quiet.acquire(GUARD, MS(1000), Block::NoWait).await.unwrap().expect("free guards");
            for s in &servers {
                let mut c = s.conn();
                assert!(wait_until(Duration::from_secs(5), || info(&mut c, GUARD) == Some((None, 1))), "expired");
            }
            let next = qc.acquire(GUARD, Duration::from_secs(10), Block::NoWait).await.unwrap().expect("free again");
            assert!(next.token() > old.token());
            assert_stale(old.fence::<()>(&set(DATA, "old")).await);
            assert_stale(old.fence_min_ttl::<()>(MS(1), &set(DATA, "old")).await);
            let _: () = next.fence(&set(DATA, "next")).await.unwrap();
            assert!(next.release().await.unwrap());
        });
        for s in &servers {
            assert_eq!(get(&mut s.conn(), DATA).as_deref(), Some("next"));
        }
    }

    fn on_a_cluster_the_guard_and_the_fenced_writes_go_to_the_tags_master(kind) {
        use redis::cluster::ClusterClient;
        let cluster = common::Cluster::start(kind, 3, 0);
        let nodes = vec![format!("redis://127.0.0.1:{}/", cluster.nodes[0].port)];
        let master = cluster.master_of(cluster.slot_of(GUARD));
        let on_master = || cluster.node_by_port(master.port).conn();
        let ttl = Duration::from_secs(10);
        // Sync.
        let lc = LeaseClient::cluster(ClusterClient::new(nodes.clone()).unwrap());
        lc.guard(GUARD).unwrap();
        assert_free_guard(&mut on_master(), GUARD);
        let mut lease = lc.acquire(GUARD, ttl, Block::NoWait).unwrap().expect("a free guard");
        let _: () = lease.fence(&set(DATA, "sync")).unwrap();
        assert_eq!(get(&mut on_master(), DATA).as_deref(), Some("sync"));
        assert!(lease.release().unwrap());
        let mut cc = ClusterClient::new(nodes.clone()).unwrap().get_connection().unwrap();
        let plain = set(DATA, "plain").query::<()>(&mut cc).map_err(Error::from);
        assert_fenced(plain, DATA, GUARD);
        assert!(lc.unguard(GUARD).unwrap());
        assert_eq!(info(&mut on_master(), GUARD), None);
        // Async.
        let alc = redis_lease_client::aio::LeaseClient::cluster(ClusterClient::new(nodes).unwrap());
        rt().block_on(async {
            alc.guard(GUARD).await.unwrap();
            assert_free_guard(&mut on_master(), GUARD);
            let lease = alc.acquire(GUARD, ttl, Block::NoWait).await.unwrap().expect("a free guard");
            let _: () = lease.fence(&set(DATA, "async")).await.unwrap();
            assert!(lease.release().await.unwrap());
            assert!(alc.unguard(GUARD).await.unwrap());
            assert!(!alc.unguard(GUARD).await.unwrap());
        });
        assert_eq!(get(&mut on_master(), DATA).as_deref(), Some("async"));
        assert_eq!(info(&mut on_master(), GUARD), None);
    }
}
