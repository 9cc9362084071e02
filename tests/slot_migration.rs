//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`, design.md S3)
//! with the module loaded: the server accepts it (the module declares it
//! handles it), every lease arrives whole on the target, effects written
//! on the source while the slot moves reach it, tokens keep increasing, a
//! client blocked on a key of the moving slot is redirected and never
//! served by the source, the guards follow their tags, and a cancelled or
//! failed migration leaves the source serving as before and nothing on the
//! target. Two masters: the source serves slots 0-8191, the target the
//! rest; the keys use the hash tag `{b}` (slot 3300). Atomic slot migration
//! is Valkey 9's: on the other servers each test only says it is skipped,
//! and the first checks that the module still loads there in cluster mode.
mod common;
use common::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The slot of the hash tag `{b}`.
const SLOT: &str = "3300";

/// Two cluster masters: `src` serves slots 0-8191 (3300 among them), `dst`
/// 8192-16383. DEBUG is on (`DEBUG SLOTMIGRATION PREVENT-PAUSE` holds a
/// migration in its streaming phase).
struct Pair {
    src: Server,
    dst: Server,
    src_id: String,
    dst_id: String,
}

fn node(kind: Kind, i: usize) -> Server {
    Server::start_with(
        kind,
        Opts::default().extra(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &format!("nodes-{i}.conf"),
            "--cluster-node-timeout",
            "3000",
            "--enable-debug-command",
            "yes",
            // The source serves on while a killed target is marked failed.
            "--cluster-require-full-coverage",
            "no",
        ]),
    )
}

fn pair(kind: Kind) -> Pair {
    let src = node(kind, 0);
    let dst = node(kind, 1);
    let mut a = src.conn();
    let mut b = dst.conn();
    ok(&mut a, &["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]);
    ok(&mut b, &["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]);
    ok(
        &mut a,
        &["CLUSTER", "MEET", "127.0.0.1", &dst.port.to_string()],
    );
    for c in [&mut a, &mut b] {
        assert!(
            wait_until(Duration::from_secs(20), || {
                let info = ok_text(c, &["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:2")
            }),
            "the two nodes never formed a cluster"
        );
    }
    let src_id = ok_text(&mut a, &["CLUSTER", "MYID"]);
    let dst_id = ok_text(&mut b, &["CLUSTER", "MYID"]);
    Pair {
        src,
        dst,
        src_id,
        dst_id,
    }
}

/// A replica of the target, joined to the cluster, once it has synced.
fn replica_of(p: &Pair, kind: Kind) -> Server {
    let r = node(kind, 2);
    let mut c = r.conn();
    ok(
        &mut c,
        &["CLUSTER", "MEET", "127.0.0.1", &p.dst.port.to_string()],
    );
    assert!(
        wait_until(Duration::from_secs(20), || ok_text(
            &mut c,
            &["CLUSTER", "NODES"]
        )
        .contains(&p.dst_id)),
        "the replica never met the target"
    );
    ok(&mut c, &["CLUSTER", "REPLICATE", &p.dst_id]);
    assert!(
        wait_until(Duration::from_secs(20), || ok_text(
            &mut c,
            &["INFO", "replication"]
        )
        .contains("master_link_status:up")),
        "the replica never synced"
    );
    r
}

/// Atomic slot migration is Valkey 9's: `false` (and a message) elsewhere.
fn runs_here(kind: Kind, test: &str) -> bool {
    if kind != Kind::Valkey9 {
        eprintln!(
            "{test}: skipped on {kind:?}: atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9's"
        );
    }
    kind == Kind::Valkey9
}

/// `CLUSTER MIGRATESLOTS SLOTSRANGE 3300 3300 NODE <to_id>` on `from`.
fn migrate(from: &Server, to_id: &str) {
    let mut c = from.conn();
    assert_eq!(
        ok(
            &mut c,
            &[
                "CLUSTER",
                "MIGRATESLOTS",
                "SLOTSRANGE",
                SLOT,
                SLOT,
                "NODE",
                to_id
            ]
        ),
        Value::Okay
    );
}

/// The newest slot migration `s` knows (CLUSTER GETSLOTMIGRATIONS lists the
/// newest first): its state and message.
fn last_migration(s: &Server) -> Option<(String, String)> {
    let mut c = s.conn();
    let Value::Array(jobs) = ok(&mut c, &["CLUSTER", "GETSLOTMIGRATIONS"]) else {
        panic!("GETSLOTMIGRATIONS is no array")
    };
    let job = jobs.first()?;
    Some((
        text(&field(job, "state").expect("state")),
        text(&field(job, "message").expect("message")),
    ))
}

/// Waits (up to 20 s) until the newest migration on `s` is in one of
/// `states`; its state and message.
fn wait_migration(s: &Server, states: &[&str]) -> (String, String) {
    let mut last = None;
    let reached = wait_until(Duration::from_secs(20), || {
        last = last_migration(s);
        last.as_ref()
            .is_some_and(|(st, _)| states.contains(&st.as_str()))
    });
    assert!(
        reached,
        "the migration on port {} never reached {states:?}: {last:?}\n{}",
        s.port,
        s.log_tail(30)
    );
    last.unwrap()
}

/// Waits (up to 20 s) until `owner` serves slot 3300 and `other` redirects
/// it there (each node's own view).
fn wait_owner(owner: &Server, other: &Server) {
    let mut o = owner.conn();
    let mut x = other.conn();
    let moved = format!("MOVED {SLOT} 127.0.0.1:{}", owner.port);
    assert!(
        wait_until(Duration::from_secs(20), || {
            call(&mut o, &[b"LEASE.INFO", b"{b}probe"]).is_ok()
                && matches!(call(&mut x, &[b"LEASE.INFO", b"{b}probe"]), Err(e) if error_text(&e) == moved)
        }),
        "slot {SLOT} never settled on port {}",
        owner.port
    );
}

/// `DEBUG SLOTMIGRATION PREVENT-PAUSE on|off` on the source: while on, a
/// migration stays in its streaming phase (the source never pauses).
fn hold_streaming(s: &Server, on: bool) {
    let mut c = s.conn();
    ok(
        &mut c,
        &[
            "DEBUG",
            "SLOTMIGRATION",
            "PREVENT-PAUSE",
            if on { "1" } else { "0" },
        ],
    );
}

/// Closes the slot import link on the target `s` (`CLIENT LIST` flags it
/// `i`): the migration fails on both nodes.
fn cut_import_link(s: &Server) {
    let mut c = s.conn();
    let list = ok_text(&mut c, &["CLIENT", "LIST"]);
    let import = list
        .lines()
        .find(|l| l.split(' ').any(|f| f == "flags=i"))
        .unwrap_or_else(|| panic!("no import link in {list}"));
    let id = import.split(' ').next().unwrap().trim_start_matches("id=");
    ok(&mut c, &["CLIENT", "KILL", "ID", id]);
}

/// `DUMP key`: the whole stored value (owner, token, deadline, label,
/// holders), `None` when the key does not exist.
fn dump(c: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    match ok(c, &["DUMP", key]) {
        Value::Nil => None,
        Value::BulkString(b) => Some(b),
        other => panic!("DUMP {key}: {other:?}"),
    }
}

fn dumps(c: &mut redis::Connection, keys: &[&str]) -> Vec<Option<Vec<u8>>> {
    keys.iter().map(|k| dump(c, k)).collect()
}

/// Keys of slot 3300 on `s` (counted, importing ones included).
fn keys_in_slot(s: &Server) -> i64 {
    let mut c = s.conn();
    int(&ok(&mut c, &["CLUSTER", "COUNTKEYSINSLOT", SLOT]))
}

fn guards(s: &Server) -> i64 {
    info_int(&mut s.conn(), "lease_guards")
}

fn pexpiretime(c: &mut redis::Connection, key: &str) -> i64 {
    int(&ok(c, &["PEXPIRETIME", key]))
}

/// The keys of slot 3300 the tests fill: an exclusive lease with a label,
/// a counting lease (two holders, one labelled), a shared lease, a
/// multi-key lease on two keys, a held guard with a data key under it, a
/// plain string.
const KEYS: [&str; 8] = [
    "{b}job",
    "{b}pool",
    "{b}readers",
    "{b}m1",
    "{b}m2",
    "g{b}",
    "{b}balance",
    "{b}plain",
];

/// Fills `KEYS` on `c`; the guard's token.
fn fill(c: &mut redis::Connection) -> i64 {
    ok(
        c,
        &[
            "LEASE.ACQUIRE",
            "{b}job",
            "worker-1",
            "50000",
            "LABEL",
            "nightly export",
        ],
    );
    ok(
        c,
        &[
            "LEASE.ACQUIRE",
            "{b}pool",
            "p1",
            "50000",
            "LIMIT",
            "3",
            "LABEL",
            "first",
        ],
    );
    ok(
        c,
        &["LEASE.ACQUIRE", "{b}pool", "p2", "40000", "LIMIT", "3"],
    );
    ok(c, &["LEASE.ACQUIRE", "{b}readers", "r1", "50000", "SHARED"]);
    ok(
        c,
        &["LEASE.MACQUIRE", "2", "{b}m1", "{b}m2", "xfer", "50000"],
    );
    ok(c, &["SET", "{b}balance", "100"]);
    ok(c, &["SET", "{b}plain", "x"]);
    ok(c, &["LEASE.GUARD", "g{b}"]);
    acquire(c, "g{b}", "guardian", "50000")
}

full_suite! {
    /// The module loads in cluster mode everywhere; only Valkey 9 has the
    /// migration, and there it is accepted (before, the server refused it:
    /// "The module lease does not support atomic slot migrations").
    fn the_server_accepts_the_migration_with_the_module_loaded(kind) {
        let s = node(kind, 0);
        let mut c = s.conn();
        let e = call(&mut c, &[b"CLUSTER", b"GETSLOTMIGRATIONS"]);
        if !runs_here(kind, "the_server_accepts_the_migration_with_the_module_loaded") {
            // No such command on the other servers: the module loaded
            // without declaring anything they do not know.
            assert!(e.is_err(), "{kind:?} knows GETSLOTMIGRATIONS: {e:?}");
            assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
            return;
        }
        drop(s);
        let p = pair(kind);
        migrate(&p.src, &p.dst_id);
        let (state, message) = wait_migration(&p.src, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "{message}");
    }

    /// Every kind of lease, its token, deadline, label and guard arrive
    /// whole (the same DUMP, the same LEASE.INFO); the guard set follows
    /// its tag on both sides; the owners carry on on the target; the next
    /// token of a moved key is above its last, also of a key released
    /// before the move while the source's clock ran ahead.
    fn every_lease_arrives_whole(kind) {
        if !runs_here(kind, "every_lease_arrives_whole") {
            return;
        }
        let p = pair(kind);
        let mut a = p.src.conn();
        let guard_token = fill(&mut a);
        // Last, the source's token clock runs ahead of the wall clock (a
        // FLOOR, up to the grace length ahead) on a key released before
        // the move: no lease of the slot carries that token.
        ok(&mut a, &["CONFIG", "SET", "lease.grace-ms", "30000"]);
        let floor = (now_ms() + 20_000) * 1024;
        let ahead = int(&ok(&mut a, &["LEASE.ACQUIRE", "{b}ahead", "f", "50000", "FLOOR", &floor.to_string()]));
        assert_eq!(int(&ok(&mut a, &["LEASE.RELEASE", "{b}ahead", "f"])), 1);
        let before = dumps(&mut a, &KEYS);
        let infos: Vec<Value> = ["{b}job", "{b}pool", "{b}readers", "{b}m1", "g{b}"]
            .iter()
            .map(|k| ok(&mut a, &["LEASE.INFO", k]))
            .collect();
        assert_eq!((guards(&p.src), guards(&p.dst)), (1, 0));

        migrate(&p.src, &p.dst_id);
        let (state, message) = wait_migration(&p.src, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "{message}");
        wait_owner(&p.dst, &p.src);

        let mut b = p.dst.conn();
        assert_eq!(dumps(&mut b, &KEYS), before, "the values on the target");
        for (k, info) in ["{b}job", "{b}pool", "{b}readers", "{b}m1", "g{b}"].iter().zip(&infos) {
            let now = ok(&mut b, &["LEASE.INFO", k]);
            for f in ["token", "since", "label", "mode", "limit", "guard", "waiters"] {
                assert_eq!(field(&now, f), field(info, f), "{k} {f}");
            }
            assert_eq!(holders(&now).len(), holders(info).len(), "{k} holders");
        }
        assert_eq!(text(&field(&ok(&mut b, &["LEASE.INFO", "{b}job"]), "label").unwrap()), "nightly export");
        // The source keeps nothing of the slot; the guard went with it.
        assert_eq!(keys_in_slot(&p.src), 0);
        assert_eq!((guards(&p.src), guards(&p.dst)), (0, 1));

        // The holders carry on there.
        assert_eq!(int(&ok(&mut b, &["LEASE.RENEW", "{b}job", "worker-1", "55000"])), 1);
        assert_eq!(int(&ok(&mut b, &["LEASE.RENEW", "{b}pool", "p2", "55000"])), 1);
        assert_eq!(int(&ok(&mut b, &["LEASE.MRENEW", "2", "{b}m1", "{b}m2", "xfer", "55000"])), 2);
        assert_eq!(acquire_opts(&mut b, "{b}job", "thief", "1000", &[]), None, "granted twice");
        // The guard guards there: a plain write is refused, a fenced one runs.
        let e = err(&mut b, &["INCRBY", "{b}balance", "5"]);
        assert!(e.starts_with("FENCED"), "{e}");
        let t = guard_token.to_string();
        assert_eq!(int(&ok(&mut b, &["LEASE.FENCE", "g{b}", &t, "INCRBY", "{b}balance", "5"])), 105);
        assert_eq!(field(&ok(&mut b, &["LEASE.INFO", "g{b}"]), "guard"), Some(Value::Int(1)));
        // The next token of a moved key is above its last, also of one
        // released before the move (the snapshot carried the clock).
        assert!(acquire(&mut b, "{b}ahead", "g", "50000") > ahead, "a token below the source's");
        let last = token_of(&mut b, "{b}job").unwrap();
        assert_eq!(int(&ok(&mut b, &["LEASE.RELEASE", "{b}job", "worker-1"])), 1);
        assert!(acquire(&mut b, "{b}job", "worker-2", "50000") > last);
        let last_holder = holders(&ok(&mut b, &["LEASE.INFO", "{b}pool"])).iter().map(|h| h.0).max().unwrap();
        assert!(acquire_opts(&mut b, "{b}pool", "p3", "50000", &["LIMIT", "3"]).unwrap() > last_holder);
        // Where the slot went, the source redirects.
        let e = err(&mut a, &["LEASE.ACQUIRE", "{b}job", "worker-3", "1000"]);
        assert_eq!(e, format!("MOVED {SLOT} 127.0.0.1:{}", p.dst.port));
    }

    /// Effects the source writes while the slot streams reach the target:
    /// an acknowledged renewal, acquires and releases of each kind, a
    /// hand-off at expiry to a blocked waiter and a prune of an ended
    /// holder (both written by the module's timers), a fenced write; and
    /// they reach the target's replica as well.
    fn effects_written_while_the_slot_moves_reach_the_target(kind) {
        if !runs_here(kind, "effects_written_while_the_slot_moves_reach_the_target") {
            return;
        }
        let p = pair(kind);
        let replica = replica_of(&p, kind);
        let mut a = p.src.conn();
        let guard_token = fill(&mut a).to_string();
        // A hand-off at expiry is due while the slot streams.
        acquire(&mut a, "{b}hand", "h1", "1500");
        let waiter = spawn_waiter(&p.src, "{b}hand", "h2", "50000", "20000");
        // So is the end of one counting holder.
        ok(&mut a, &["LEASE.ACQUIRE", "{b}pool", "p-short", "1500", "LIMIT", "3"]);

        hold_streaming(&p.src, true);
        migrate(&p.src, &p.dst_id);
        wait_migration(&p.src, &["waiting-to-pause"]);
        wait_migration(&p.dst, &["waiting-for-paused"]);
        // The module's timers, while the slot streams: the hand-off and the
        // prune.
        let handed = got_token(waiter);
        assert!(
            wait_until(Duration::from_secs(5), || holders(&ok(&mut a, &["LEASE.INFO", "{b}pool"])).len() == 2),
            "p-short never ended"
        );
        // Written on the source while the slot streams, each acknowledged.
        let renewed_at = now_ms();
        assert_eq!(int(&ok(&mut a, &["LEASE.RENEW", "{b}job", "worker-1", "58000"])), 1);
        acquire_opts(&mut a, "{b}pool", "p3", "50000", &["LIMIT", "3"]).expect("p3");
        assert_eq!(int(&ok(&mut a, &["LEASE.RELEASE", "{b}readers", "r1"])), 1);
        acquire_opts(&mut a, "{b}readers", "r2", "50000", &["SHARED", "LABEL", "late"]).expect("r2");
        assert_eq!(int(&ok(&mut a, &["LEASE.MRELEASE", "2", "{b}m1", "{b}m2", "xfer"])), 2);
        ok(&mut a, &["LEASE.MACQUIRE", "2", "{b}m1", "{b}m2", "xfer-2", "50000"]);
        assert_eq!(int(&ok(&mut a, &["LEASE.FENCE", "g{b}", &guard_token, "INCRBY", "{b}balance", "7"])), 107);
        assert_eq!(last_migration(&p.src).unwrap().0, "waiting-to-pause");
        let keys = [&KEYS[..], &["{b}hand"]].concat();
        let before = dumps(&mut a, &keys);

        hold_streaming(&p.src, false);
        let (state, message) = wait_migration(&p.src, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "{message}");
        wait_owner(&p.dst, &p.src);
        let mut b = p.dst.conn();
        assert_eq!(dumps(&mut b, &keys), before, "the values on the target");
        assert!(pexpiretime(&mut b, "{b}job") >= renewed_at + 58_000, "the renewal was lost");
        assert_eq!(token_of(&mut b, "{b}hand"), Some(handed));
        assert_eq!(int(&ok(&mut b, &["LEASE.RENEW", "{b}hand", "h2", "50000"])), 1);
        assert_eq!(int(&ok(&mut b, &["LEASE.RENEW", "{b}pool", "p-short", "50000"])), 0);
        assert_eq!(text(&field(&ok(&mut b, &["LEASE.INFO", "{b}readers"]), "mode").unwrap()), "shared");
        assert_eq!(ok_text(&mut b, &["GET", "{b}balance"]), "107");
        assert_eq!((guards(&p.src), guards(&p.dst)), (0, 1));
        // The target's replica has it all too, once, as the target has it
        // after the renewals above.
        let after = dumps(&mut b, &keys);
        let mut r = replica.conn();
        ok(&mut r, &["READONLY"]);
        assert!(
            wait_until(Duration::from_secs(5), || dumps(&mut r, &keys) == after),
            "the target's replica differs"
        );
        assert_eq!(guards(&replica), 1);
    }

    /// Under load: a bounded loop of acquires, renewals and releases on
    /// keys of the slot while it moves to the target, then back (a
    /// migration cancelled, one failed, then one that succeeds), following
    /// the redirections. Every reply is what a model of the leases
    /// predicts (nothing lost, nothing granted twice), tokens of a key
    /// only increase, and the state left matches the model, renewals
    /// included. Beside it, two clients take turns on one key with BLOCK:
    /// never both at once, tokens only increasing.
    fn leases_under_load_while_the_slot_moves_there_and_back(kind) {
        if !runs_here(kind, "leases_under_load_while_the_slot_moves_there_and_back") {
            return;
        }
        let p = Arc::new(pair(kind));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (p, stop) = (p.clone(), stop.clone());
            thread::spawn(move || load(&p, &stop))
        };
        // Beside it, two clients take turns on one key with BLOCK.
        let turns = Arc::new(Mutex::new(Turns::default()));
        let contenders: Vec<_> = ["c1", "c2"]
            .into_iter()
            .map(|name| {
                let (p, stop, turns) = (p.clone(), stop.clone(), turns.clone());
                thread::spawn(move || contend(&p, &stop, name, &turns))
            })
            .collect();
        thread::sleep(Duration::from_millis(300));
        migrate(&p.src, &p.dst_id);
        let (state, message) = wait_migration(&p.src, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "there: {message}");
        wait_owner(&p.dst, &p.src);
        thread::sleep(Duration::from_millis(300));
        // Back, cancelled while it streams, then failed (its link cut on
        // the source, the target now), then for good.
        hold_streaming(&p.dst, true);
        migrate(&p.dst, &p.src_id);
        wait_migration(&p.dst, &["waiting-to-pause"]);
        thread::sleep(Duration::from_millis(300));
        ok(&mut p.dst.conn(), &["CLUSTER", "CANCELSLOTMIGRATIONS"]);
        assert_eq!(wait_migration(&p.dst, &["cancelled", "failed", "success"]).0, "cancelled");
        assert_eq!(wait_migration(&p.src, &["failed", "cancelled", "success"]).0, "failed");
        assert!(
            wait_until(Duration::from_secs(5), || keys_in_slot(&p.src) == 0),
            "the cancelled import left keys"
        );
        migrate(&p.dst, &p.src_id);
        wait_migration(&p.src, &["waiting-for-paused"]);
        thread::sleep(Duration::from_millis(300));
        cut_import_link(&p.src);
        assert_eq!(wait_migration(&p.src, &["failed", "cancelled", "success"]).0, "failed");
        assert_eq!(wait_migration(&p.dst, &["failed", "cancelled", "success"]).0, "failed");
        assert!(
            wait_until(Duration::from_secs(5), || keys_in_slot(&p.src) == 0),
            "the failed import left keys"
        );
        hold_streaming(&p.dst, false);
        migrate(&p.dst, &p.src_id);
        let (state, message) = wait_migration(&p.dst, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "back: {message}");
        wait_owner(&p.src, &p.dst);
        thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let model = worker.join().expect("the load");
        let grants: Vec<usize> = contenders.into_iter().map(|h| h.join().expect("a contender")).collect();
        eprintln!("turns: {grants:?} grants by BLOCK");
        assert!(grants.iter().all(|&n| n > 5), "turns taken: {grants:?}");
        eprintln!(
            "load: {} calls answered by the first node, {} by the second, {} redirections followed",
            model.ops_on[0], model.ops_on[1], model.moved
        );
        assert!(model.moved >= 2, "the load never followed the slot: {} redirections", model.moved);
        assert!(model.ops_on.iter().all(|&n| n > 20), "ops per node: {:?}", model.ops_on);

        // What is left on the source (the slot is back) is the model's.
        let mut a = p.src.conn();
        for (key, held) in &model.exclusive {
            match held {
                Some((owner, token, deadline)) => {
                    assert_eq!(token_of(&mut a, key), Some(*token), "{key}");
                    assert!(pexpiretime(&mut a, key) >= *deadline, "{key}: an acknowledged renewal was lost");
                    assert_eq!(int(&ok(&mut a, &["LEASE.RENEW", key, owner, "30000"])), 1, "{key} {owner}");
                }
                None => assert_eq!(token_of(&mut a, key), None, "{key}"),
            }
        }
        let pool = ok(&mut a, &["LEASE.INFO", POOL]);
        let mut want: Vec<i64> = model.pool.values().map(|h| h.0).collect();
        let mut got: Vec<i64> = holders(&pool).iter().map(|h| h.0).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "the pool's holders");
    }

    /// A client blocked on a key of the moving slot is answered by the
    /// source with a redirection once the slot has moved, and is never
    /// handed the lease there: the release on the target hands it to
    /// nobody.
    fn a_waiter_on_the_moving_slot_is_redirected_never_served(kind) {
        if !runs_here(kind, "a_waiter_on_the_moving_slot_is_redirected_never_served") {
            return;
        }
        let p = pair(kind);
        let mut a = p.src.conn();
        acquire(&mut a, "{b}w", "x", "50000");
        ok(&mut a, &["LEASE.ACQUIRE", "{b}wp", "p1", "50000", "LIMIT", "2"]);
        ok(&mut a, &["LEASE.ACQUIRE", "{b}wp", "p2", "50000", "LIMIT", "2"]);
        let waiter = spawn_waiter(&p.src, "{b}w", "y", "50000", "15000");
        let pool_waiter = spawn_waiter_with(&p.src, "{b}wp", "p3", "50000", &["LIMIT", "2", "BLOCK", "15000"]);
        let multi_waiter = spawn_blocked(
            &p.src,
            &["LEASE.MACQUIRE", "2", "{b}w", "{b}w2", "mk", "50000", "BLOCK", "15000"],
            "mk",
        );
        let acquired = info_int(&mut a, "lease_acquired");
        let started = Instant::now();
        migrate(&p.src, &p.dst_id);
        let (state, message) = wait_migration(&p.src, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "{message}");
        let moved = format!("MOVED {SLOT} 127.0.0.1:{}", p.dst.port);
        for h in [waiter, pool_waiter, multi_waiter] {
            let (reply, at) = h.join().unwrap();
            match reply {
                Err(e) => assert_eq!(error_text(&e), moved),
                Ok(v) => panic!("the waiter was answered {v:?}"),
            }
            assert!(at.duration_since(started) < Duration::from_secs(10), "answered at its timeout");
        }
        assert_eq!(info_int(&mut a, "lease_waiters"), 0);
        // The holders release on the target: nobody is handed the lease,
        // there or on the source.
        let mut b = p.dst.conn();
        assert_eq!(int(&ok(&mut b, &["LEASE.RELEASE", "{b}w", "x"])), 1);
        assert_eq!(int(&ok(&mut b, &["LEASE.RELEASE", "{b}wp", "p1"])), 1);
        assert_eq!(int(&ok(&mut b, &["LEASE.RELEASE", "{b}wp", "p2"])), 1);
        thread::sleep(Duration::from_millis(300));
        assert_eq!(token_of(&mut b, "{b}w"), None);
        assert_eq!(token_of(&mut b, "{b}wp"), None);
        assert_eq!(token_of(&mut b, "{b}w2"), None);
        assert_eq!(info_int(&mut a, "lease_acquired"), acquired, "the source granted after the move");
    }

    /// A migration cancelled while it streams: the target keeps nothing
    /// (keys, guards) and the source serves as before; the same migration
    /// then succeeds.
    fn a_cancelled_migration_leaves_the_source_as_before(kind) {
        if !runs_here(kind, "a_cancelled_migration_leaves_the_source_as_before") {
            return;
        }
        let p = pair(kind);
        let mut a = p.src.conn();
        let guard_token = fill(&mut a).to_string();
        acquire(&mut a, "{b}held", "x", "50000");
        let waiter = spawn_waiter(&p.src, "{b}held", "y", "50000", "20000");
        hold_streaming(&p.src, true);
        migrate(&p.src, &p.dst_id);
        wait_migration(&p.src, &["waiting-to-pause"]);
        wait_migration(&p.dst, &["waiting-for-paused"]);
        // The target holds the snapshot, not yet served.
        assert_eq!(keys_in_slot(&p.dst), KEYS.len() as i64 + 1);
        assert_eq!(guards(&p.dst), 1);
        let before = dumps(&mut a, &KEYS);
        let mut c = p.src.conn();
        assert_eq!(ok(&mut c, &["CLUSTER", "CANCELSLOTMIGRATIONS"]), Value::Okay);
        assert_eq!(wait_migration(&p.src, &["cancelled", "failed", "success"]).0, "cancelled");
        assert_eq!(wait_migration(&p.dst, &["failed", "cancelled", "success"]).0, "failed");
        hold_streaming(&p.src, false);
        assert!(
            wait_until(Duration::from_secs(5), || keys_in_slot(&p.dst) == 0 && guards(&p.dst) == 0),
            "half a slot left on the target: {} keys, {} guards",
            keys_in_slot(&p.dst),
            guards(&p.dst)
        );
        serves_as_before(&p, &before, &guard_token);
        // The waiter still waits there, and is served there.
        assert_eq!(waiters(&mut a, "{b}held"), 1);
        let held = token_of(&mut a, "{b}held").unwrap();
        assert_eq!(int(&ok(&mut a, &["LEASE.RELEASE", "{b}held", "x"])), 1);
        assert!(got_token(waiter) > held);

        let now = dumps(&mut a, &KEYS);
        migrate(&p.src, &p.dst_id);
        let (state, message) = wait_migration(&p.src, &["success", "failed", "cancelled"]);
        assert_eq!(state, "success", "{message}");
        wait_owner(&p.dst, &p.src);
        let mut b = p.dst.conn();
        assert_eq!(dumps(&mut b, &KEYS), now, "the values on the target");
        assert_eq!((guards(&p.src), guards(&p.dst)), (0, 1));
    }

    /// A migration that fails while it streams, its link cut on the target
    /// and then the target killed: the target drops what it imported, the
    /// source serves as before.
    fn a_failed_migration_leaves_the_source_as_before(kind) {
        if !runs_here(kind, "a_failed_migration_leaves_the_source_as_before") {
            return;
        }
        let mut p = pair(kind);
        let mut a = p.src.conn();
        let guard_token = fill(&mut a).to_string();
        let before = dumps(&mut a, &KEYS);
        hold_streaming(&p.src, true);

        // The import's link is cut on the target.
        migrate(&p.src, &p.dst_id);
        wait_migration(&p.src, &["waiting-to-pause"]);
        wait_migration(&p.dst, &["waiting-for-paused"]);
        assert_eq!(guards(&p.dst), 1);
        cut_import_link(&p.dst);
        assert_eq!(wait_migration(&p.dst, &["failed", "cancelled", "success"]).0, "failed");
        assert_eq!(wait_migration(&p.src, &["failed", "cancelled", "success"]).0, "failed");
        assert!(
            wait_until(Duration::from_secs(5), || keys_in_slot(&p.dst) == 0 && guards(&p.dst) == 0),
            "half a slot left on the target"
        );
        serves_as_before(&p, &before, &guard_token);

        // The target dies while the slot streams.
        let before = dumps(&mut a, &KEYS);
        migrate(&p.src, &p.dst_id);
        wait_migration(&p.dst, &["waiting-for-paused"]);
        p.dst.kill();
        assert_eq!(wait_migration(&p.src, &["failed", "cancelled", "success"]).0, "failed");
        hold_streaming(&p.src, false);
        serves_as_before(&p, &before, &guard_token);
    }
}

/// The source still serves slot 3300 with `before` (the values of `KEYS`):
/// the same values, the holders renew, a new lease is granted above every
/// token, the guard refuses a plain write and lets its fence write.
fn serves_as_before(p: &Pair, before: &[Option<Vec<u8>>], guard_token: &str) {
    let mut a = p.src.conn();
    assert_eq!(&dumps(&mut a, &KEYS), before, "the source's values");
    assert_eq!(
        int(&ok(&mut a, &["LEASE.RENEW", "{b}job", "worker-1", "50000"])),
        1
    );
    assert_eq!(
        int(&ok(
            &mut a,
            &["LEASE.MRENEW", "2", "{b}m1", "{b}m2", "xfer", "50000"]
        )),
        2
    );
    assert_eq!(
        acquire_opts(&mut a, "{b}job", "thief", "1000", &[]),
        None,
        "granted twice"
    );
    let top = info_int(&mut a, "lease_last_token");
    assert!(acquire(&mut a, "{b}fresh", "n", "1000") > top);
    assert_eq!(int(&ok(&mut a, &["LEASE.RELEASE", "{b}fresh", "n"])), 1);
    let e = err(&mut a, &["SET", "{b}balance", "0"]);
    assert!(e.starts_with("FENCED"), "{e}");
    assert_eq!(
        ok_text(
            &mut a,
            &["LEASE.FENCE", "g{b}", guard_token, "GET", "{b}balance"]
        ),
        "100"
    );
    assert_eq!(guards(&p.src), 1);
}

/// The key the contenders take turns on, who holds it now by their own
/// account, and its last token.
const TURN: &str = "{b}turn";

#[derive(Default)]
struct Turns {
    holder: Option<&'static str>,
    last_token: i64,
}

/// `args` on the node owning slot 3300, following `MOVED` (`at` is the
/// index in `ports` of the node asked first, and of the one that answered).
fn call_following(
    conns: &mut [redis::Connection; 2],
    ports: [u16; 2],
    at: &mut usize,
    args: &[&str],
) -> redis::RedisResult<Value> {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    for _ in 0..100 {
        match call(&mut conns[*at], &bytes) {
            Err(e) if error_text(&e).starts_with("MOVED") => {
                let t = error_text(&e);
                let port: u16 = t.rsplit(':').next().unwrap().trim().parse().unwrap();
                *at = ports.iter().position(|&q| q == port).expect("a known node");
            }
            other => return other,
        }
    }
    panic!("{args:?}: redirected back and forth")
}

/// One contender: until `stop` (at most 30 s or 2,000 turns), waits for
/// `TURN` with BLOCK on the node owning it (a waiter the source redirects
/// asks the target), holds it 5 ms and releases it. No two contenders hold
/// it at once, and each grant's token is above every earlier one. The
/// number of grants it got.
fn contend(p: &Pair, stop: &AtomicBool, name: &'static str, turns: &Mutex<Turns>) -> usize {
    let ports = [p.src.port, p.dst.port];
    let mut conns = [p.src.conn(), p.dst.conn()];
    let mut at = 0usize;
    let mut grants = 0;
    let began = Instant::now();
    for _ in 0..2_000 {
        if stop.load(Ordering::Relaxed) || began.elapsed() > Duration::from_secs(30) {
            break;
        }
        let reply = call_following(
            &mut conns,
            ports,
            &mut at,
            &["LEASE.ACQUIRE", TURN, name, "10000", "BLOCK", "500"],
        );
        let token = match reply {
            Ok(Value::Nil) => continue,
            Ok(v) => int(&v),
            Err(e) => panic!("{name}: {e}"),
        };
        {
            let mut t = turns.lock().unwrap();
            assert_eq!(
                t.holder, None,
                "{name} was granted {TURN} while {:?} held it",
                t.holder
            );
            assert!(
                token > t.last_token,
                "{name}: token {token} not above {}",
                t.last_token
            );
            t.holder = Some(name);
            t.last_token = token;
        }
        grants += 1;
        thread::sleep(Duration::from_millis(5));
        turns.lock().unwrap().holder = None;
        let released = call_following(&mut conns, ports, &mut at, &["LEASE.RELEASE", TURN, name]);
        assert_eq!(
            released.map(|v| int(&v)).ok(),
            Some(1),
            "{name}: its release"
        );
    }
    grants
}

const POOL: &str = "{b}lpool";
const EXCLUSIVE: [&str; 6] = ["{b}l0", "{b}l1", "{b}l2", "{b}l3", "{b}l4", "{b}l5"];

/// What the load left, by the model, and how it ran.
struct Model {
    /// Per exclusive key: its holder, token and the earliest deadline its
    /// last acknowledged acquire or renewal set (ms).
    exclusive: HashMap<String, Option<(String, i64, i64)>>,
    /// The pool's holders: owner -> (token, earliest deadline).
    pool: HashMap<String, (i64, i64)>,
    /// Redirections followed.
    moved: usize,
    /// Calls answered by the slot's first node (`src`) and by the second.
    ops_on: [usize; 2],
}

/// The load: until `stop` (and at most 30 s or 200,000 calls), acquires,
/// renewals and releases on `EXCLUSIVE` and on `POOL` (LIMIT 3, five
/// owners), each reply checked against the model; a `MOVED` sends the same
/// call to the node named. TTLs are long: nothing expires while it runs.
fn load(p: &Pair, stop: &AtomicBool) -> Model {
    let ports = [p.src.port, p.dst.port];
    let mut conns = [p.src.conn(), p.dst.conn()];
    let mut at = 0usize;
    let mut m = Model {
        exclusive: EXCLUSIVE.iter().map(|k| (k.to_string(), None)).collect(),
        pool: HashMap::new(),
        moved: 0,
        ops_on: [0, 0],
    };
    let mut last_token: HashMap<String, i64> = HashMap::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let began = Instant::now();
    let mut after_stop = 0;
    for _ in 0..200_000 {
        if began.elapsed() > Duration::from_secs(30) {
            break;
        }
        if stop.load(Ordering::Relaxed) {
            after_stop += 1;
            if after_stop > 200 {
                break;
            }
        }
        let on_pool = rand(4) == 0;
        let key = if on_pool {
            POOL.to_string()
        } else {
            EXCLUSIVE[rand(6) as usize].to_string()
        };
        let owner = format!("o{}", rand(if on_pool { 5 } else { 3 }));
        let ttl = 30_000 + rand(20_000) as i64;
        let op = rand(3);
        let ttl_s = ttl.to_string();
        let mut args: Vec<&str> = match op {
            0 => vec!["LEASE.ACQUIRE", &key, &owner, &ttl_s],
            1 => vec!["LEASE.RENEW", &key, &owner, &ttl_s],
            _ => vec!["LEASE.RELEASE", &key, &owner],
        };
        if on_pool && op == 0 {
            args.extend(["LIMIT", "3"]);
        }
        let sent = now_ms();
        let reply = loop {
            let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            match call(&mut conns[at], &bytes) {
                Err(e) if error_text(&e).starts_with("MOVED") => {
                    let t = error_text(&e);
                    let port: u16 = t.rsplit(':').next().unwrap().trim().parse().unwrap();
                    at = ports.iter().position(|&q| q == port).expect("a known node");
                    m.moved += 1;
                    assert!(m.moved < 100, "redirected back and forth: {t}");
                }
                Err(e) => panic!("{args:?}: {e}"),
                Ok(v) => break v,
            }
        };
        m.ops_on[at] += 1;
        let last = last_token.get(&key).copied().unwrap_or(0);
        if on_pool {
            let held = m.pool.get(&owner).copied();
            match (op, held) {
                (0, Some((t, _))) => {
                    assert_eq!(int(&reply), t, "{args:?}: a re-acquire answers its token");
                    m.pool.insert(owner, (t, sent + ttl));
                }
                (0, None) if m.pool.len() < 3 => {
                    let t = int(&reply);
                    assert!(t > last, "{args:?}: token {t} not above {last}");
                    last_token.insert(key, t);
                    m.pool.insert(owner, (t, sent + ttl));
                }
                (0, None) => assert_eq!(reply, Value::Nil, "{args:?}: a fourth holder"),
                (1, Some((t, _))) => {
                    assert_eq!(int(&reply), 1, "{args:?}");
                    m.pool.insert(owner, (t, sent + ttl));
                }
                (2, Some(_)) => {
                    assert_eq!(int(&reply), 1, "{args:?}");
                    m.pool.remove(&owner);
                }
                _ => assert_eq!(int(&reply), 0, "{args:?}: not a holder"),
            }
            continue;
        }
        let held = m.exclusive[&key].clone();
        let mine = held.as_ref().is_some_and(|(o, _, _)| *o == owner);
        match (op, held) {
            (0, Some((_, t, _))) if mine => {
                assert_eq!(int(&reply), t, "{args:?}: a re-acquire answers its token");
                m.exclusive.insert(key, Some((owner, t, sent + ttl)));
            }
            (0, Some(_)) => assert_eq!(reply, Value::Nil, "{args:?}: granted twice"),
            (0, None) => {
                let t = int(&reply);
                assert!(t > last, "{args:?}: token {t} not above {last}");
                last_token.insert(key.clone(), t);
                m.exclusive.insert(key, Some((owner, t, sent + ttl)));
            }
            (1, Some((_, t, _))) if mine => {
                assert_eq!(int(&reply), 1, "{args:?}: an acknowledged lease was lost");
                m.exclusive.insert(key, Some((owner, t, sent + ttl)));
            }
            (2, Some(_)) if mine => {
                assert_eq!(int(&reply), 1, "{args:?}");
                m.exclusive.insert(key, None);
            }
            _ => assert_eq!(int(&reply), 0, "{args:?}: not the holder"),
        }
    }
    m
}
