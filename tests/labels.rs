//! Labels and starts of holdings (design.md S11): `LABEL text` on
//! `LEASE.ACQUIRE` and `LEASE.MACQUIRE`, kept with the holding (per holder
//! of a counting or shared lease, on every key of a multi-key lease), a
//! waiter's label becoming its holding's; `LEASE.INFO` showing `since` and
//! `label`; both carried through replication, a failover, the AOF and its
//! rewrites, RDB, DUMP/RESTORE, COPY and MIGRATE.
mod common;
use common::*;

use std::time::Duration;

/// What LEASE.INFO shows of a holding: (token, since, label).
type Shown = (i64, i64, Option<Vec<u8>>);

fn label_of(v: &Value) -> Option<Vec<u8>> {
    match field(v, "label").expect("a label field") {
        Value::Nil => None,
        Value::BulkString(b) => Some(b),
        other => panic!("label {other:?}"),
    }
}

/// (token, since, label) of an exclusive lease, or of every holder of a
/// counting or shared one (sorted by token).
fn shown(c: &mut redis::Connection, key: &str) -> Vec<Shown> {
    let v = ok(c, &["LEASE.INFO", key]);
    if v == Value::Nil {
        return vec![];
    }
    match field(&v, "holders") {
        Some(Value::Array(hs)) => hs
            .iter()
            .map(|h| {
                (
                    int(&field(h, "token").unwrap()),
                    int(&field(h, "since").unwrap()),
                    label_of(h),
                )
            })
            .collect(),
        _ => vec![(
            int(&field(&v, "token").unwrap()),
            int(&field(&v, "since").unwrap()),
            label_of(&v),
        )],
    }
}

fn acquire_labelled(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    label: &[u8],
    opts: &[&str],
) -> i64 {
    let mut args: Vec<&[u8]> = vec![
        b"LEASE.ACQUIRE",
        key.as_bytes(),
        owner.as_bytes(),
        b"60000",
        b"LABEL",
        label,
    ];
    args.extend(opts.iter().map(|o| o.as_bytes()));
    int(&call(c, &args).expect("a lease"))
}

/// A labelled exclusive lease, a counting lease with a labelled and an
/// unlabelled holder, a shared lease and a multi-key lease, all in slot
/// `{l}`; what LEASE.INFO shows of each.
fn populate(c: &mut redis::Connection) -> Vec<Vec<Shown>> {
    acquire_labelled(c, "{l}ex", "a", b"worker-7 pid 4242 \x00\xff", &[]);
    acquire_labelled(c, "{l}sem", "s1", b"first", &["LIMIT", "3"]);
    acquire_opts(c, "{l}sem", "s2", "60000", &["LIMIT", "3"]).unwrap();
    acquire_labelled(c, "{l}rd", "r1", b"reader", &["SHARED"]);
    let v = call(
        c,
        &[
            b"LEASE.MACQUIRE",
            b"2",
            b"{l}m1",
            b"{l}m2",
            b"mk",
            b"60000",
            b"LABEL",
            b"batch 9",
        ],
    )
    .unwrap();
    assert!(int(&v) > 0);
    KEYS.iter().map(|k| shown(c, k)).collect()
}

const KEYS: [&str; 5] = ["{l}ex", "{l}sem", "{l}rd", "{l}m1", "{l}m2"];

fn all_shown(c: &mut redis::Connection) -> Vec<Vec<Shown>> {
    KEYS.iter().map(|k| shown(c, k)).collect()
}

fn aof_rewritten(c: &mut redis::Connection) {
    ok(c, &["BGREWRITEAOF"]);
    assert!(wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("INFO").arg("persistence").query(c).unwrap();
        info.contains("aof_rewrite_in_progress:0")
            && info.contains("aof_rewrite_scheduled:0")
            && info.contains("aof_last_bgrewrite_status:ok")
    }));
}

every_server! {
    fn info_shows_since_and_label_and_renewals_and_retries_keep_them(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let before = now_ms();
        let t = acquire_labelled(&mut c, "job", "o", b"worker-7 pid 4242 job 991", &[]);
        let after = now_ms();
        let [(token, since, label)] = &shown(&mut c, "job")[..] else { panic!() };
        assert_eq!((*token, label.as_deref()), (t, Some(b"worker-7 pid 4242 job 991".as_slice())));
        assert!((before..=after).contains(since), "{before} <= {since} <= {after}");
        std::thread::sleep(Duration::from_millis(5));
        // A renewal and a retry without LABEL keep both.
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "job", "o", "60000"])), 1);
        assert_eq!(acquire(&mut c, "job", "o", "60000"), t);
        assert_eq!(shown(&mut c, "job"), vec![(t, *since, label.clone())]);
        // A retry with LABEL replaces the label, not the start.
        assert_eq!(acquire_labelled(&mut c, "job", "o", b"moved", &[]), t);
        assert_eq!(shown(&mut c, "job"), vec![(t, *since, Some(b"moved".to_vec()))]);
        // A new holding has no label unless it gives one.
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "job", "o"])), 1);
        let t2 = acquire(&mut c, "job", "o", "60000");
        let [(_, since2, None)] = &shown(&mut c, "job")[..] else { panic!("{:?}", shown(&mut c, "job")) };
        assert!(t2 > t && *since2 > *since);
        // Per holder on counting and shared leases.
        acquire_labelled(&mut c, "sem", "a", b"A", &["LIMIT", "2"]);
        acquire_opts(&mut c, "sem", "b", "60000", &["LIMIT", "2"]).unwrap();
        let labels: Vec<_> = shown(&mut c, "sem").into_iter().map(|h| h.2).collect();
        assert_eq!(labels, vec![Some(b"A".to_vec()), None]);
        acquire_labelled(&mut c, "sem", "b", b"B", &["LIMIT", "2"]);
        let labels: Vec<_> = shown(&mut c, "sem").into_iter().map(|h| h.2).collect();
        assert_eq!(labels, vec![Some(b"A".to_vec()), Some(b"B".to_vec())]);
        assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", "sem", "a", "60000"])), 1);
        assert_eq!(shown(&mut c, "sem")[0].2, Some(b"A".to_vec()));
        acquire_labelled(&mut c, "rd", "r", b"R", &["SHARED"]);
        assert_eq!(shown(&mut c, "rd")[0].2, Some(b"R".to_vec()));
        // On every key of a multi-key lease, and kept by MRENEW.
        call(&mut c, &[b"LEASE.MACQUIRE", b"2", b"m1", b"m2", b"mk", b"60000", b"LABEL", b"both"]).unwrap();
        assert_eq!(int(&ok(&mut c, &["LEASE.MRENEW", "2", "m1", "m2", "mk", "60000"])), 2);
        let (m1, m2) = (shown(&mut c, "m1"), shown(&mut c, "m2"));
        assert_eq!(m1, m2);
        assert_eq!(m1[0].2, Some(b"both".to_vec()));
        // A label is binary-safe, 1 to 256 bytes; a bad one changes nothing.
        let long = "x".repeat(257);
        for (args, text) in [
            (vec!["LEASE.ACQUIRE", "bad", "o", "1000", "LABEL", ""], "LABEL must not be empty"),
            (vec!["LEASE.ACQUIRE", "bad", "o", "1000", "LABEL", &long], "LABEL is 257 bytes, longer than the 256 allowed"),
            (vec!["LEASE.ACQUIRE", "bad", "o", "1000", "LABEL"], "LABEL"),
            (vec!["LEASE.ACQUIRE", "bad", "o", "1000", "LABEL", "a", "LABEL", "b"], "LABEL"),
            (vec!["LEASE.MACQUIRE", "1", "bad", "o", "1000", "LABEL", ""], "LABEL must not be empty"),
        ] {
            let e = err(&mut c, &args);
            assert!(e.contains(text), "{args:?}: {e}");
        }
        let max = "y".repeat(256);
        acquire_labelled(&mut c, "maxed", "o", max.as_bytes(), &[]);
        assert_eq!(shown(&mut c, "maxed")[0].2, Some(max.into_bytes()));
        assert_eq!(int(&ok(&mut c, &["EXISTS", "bad"])), 0);
    }

    fn a_waiters_label_becomes_its_holdings_label(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        acquire_labelled(&mut c, "k", "a", b"first", &[]);
        let w = spawn_blocked(&s, &["LEASE.ACQUIRE", "k", "b", "60000", "LABEL", "second", "BLOCK", "10000"], "b");
        std::thread::sleep(Duration::from_millis(20));
        let released = now_ms();
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "a"])), 1);
        let t = got_token(w);
        let [(token, since, label)] = &shown(&mut c, "k")[..] else { panic!() };
        assert_eq!((*token, label.as_deref()), (t, Some(b"second".as_slice())));
        assert!(*since >= released, "since {since}, released at {released}");
        // A multi-key waiter's label goes on every key.
        let w = spawn_blocked(&s, &["LEASE.MACQUIRE", "2", "k", "k2", "m", "60000", "LABEL", "multi", "BLOCK", "10000"], "m");
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "k", "b"])), 1);
        let t = got_token(w);
        for key in ["k", "k2"] {
            assert_eq!(shown(&mut c, key)[0].0, t);
            assert_eq!(shown(&mut c, key)[0].2, Some(b"multi".to_vec()), "{key}");
        }
        // A waiter without LABEL gets a holding without one.
        let w = spawn_waiter(&s, "k", "c", "60000", "10000");
        assert_eq!(int(&ok(&mut c, &["LEASE.MRELEASE", "2", "k", "k2", "m"])), 2);
        got_token(w);
        assert_eq!(shown(&mut c, "k")[0].2, None);
    }

    fn labels_and_starts_travel_through_replication_and_a_failover(kind) {
        let m = Server::start(kind);
        let r = replica_of(kind, &m);
        let mut mc = m.conn();
        let expected = populate(&mut mc);
        // A renewal and an unlabelled retry replicate without changing them.
        assert_eq!(int(&ok(&mut mc, &["LEASE.RENEW", "{l}ex", "a", "60000"])), 1);
        acquire(&mut mc, "{l}ex", "a", "60000");
        assert_eq!(int(&ok(&mut mc, &["WAIT", "1", "5000"])), 1);
        let mut rc = r.conn();
        assert_eq!(all_shown(&mut rc), expected);
        // A coordinated failover: the replica becomes the master.
        ok(&mut mc, &["FAILOVER"]);
        assert!(wait_until(Duration::from_secs(10), || {
            info_value(&mut rc, "replication", "role").as_deref() == Some("master")
        }), "the failover never completed");
        assert_eq!(all_shown(&mut rc), expected, "after the failover");
        // The promoted node renews them as its own.
        assert_eq!(int(&ok(&mut rc, &["LEASE.RENEW", "{l}sem", "s1", "60000"])), 1);
        assert_eq!(shown(&mut rc, "{l}sem"), expected[1]);
    }

    fn labels_and_starts_survive_rdb_aof_rewrites_dump_copy_and_migrate(kind) {
        for preamble in ["no", "yes"] {
            let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", preamble]);
            let s = Server::start_with(kind, opts.clone());
            let mut c = s.conn();
            let expected = populate(&mut c);
            aof_rewritten(&mut c);
            // One more labelled change after the rewrite, in the incr file.
            acquire_labelled(&mut c, "{l}ex", "a", b"after rewrite", &[]);
            let mut expected = expected;
            expected[0][0].2 = Some(b"after rewrite".to_vec());
            let s = s.restart_with(opts);
            let mut c = s.conn();
            assert_eq!(all_shown(&mut c), expected, "AOF, preamble {preamble}");
            if preamble == "yes" {
                ok(&mut c, &["SAVE"]);
                let s = s.restart_with(Opts::default());
                let mut c = s.conn();
                assert_eq!(all_shown(&mut c), expected, "RDB");
                // DUMP/RESTORE and COPY carry them.
                for (i, key) in KEYS.iter().enumerate() {
                    let payload = match ok(&mut c, &["DUMP", key]) {
                        Value::BulkString(b) => b,
                        other => panic!("{other:?}"),
                    };
                    let copy = format!("{{l}}restored{i}");
                    assert_eq!(call(&mut c, &[b"RESTORE", copy.as_bytes(), b"0", &payload]).unwrap(), Value::Okay);
                    assert_eq!(shown(&mut c, &copy), expected[i], "{key}");
                }
                assert_eq!(int(&ok(&mut c, &["COPY", "{l}ex", "{l}copied"])), 1);
                assert_eq!(shown(&mut c, "{l}copied"), expected[0]);
                // MIGRATE moves them to another server.
                let dst = Server::start(kind);
                let port = dst.port.to_string();
                let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
                args.extend(KEYS);
                ok(&mut c, &args);
                let mut d = dst.conn();
                assert_eq!(all_shown(&mut d), expected, "MIGRATE");
            }
        }
    }
}
