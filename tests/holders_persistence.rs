//! Counting and shared leases through replication, the AOF, RDB, DUMP,
//! COPY, RENAME and MIGRATE (design.md S8, S3): one effect per holder with its
//! exact token and deadline (LEASE.HOLD, LEASE.DROP), whose size does not
//! grow with the number of holders; a replica answers INFO (and, where it
//! may run it, FENCE) as its master; every holder survives a kill -9 with
//! `appendfsync always`, AOF rewrites with and without the RDB preamble
//! (one LEASE.HOLD per live holder), RDB restarts and copies.
mod common;
use common::*;

use std::time::Duration;

fn limit(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str, n: &str) -> i64 {
    acquire_opts(c, key, owner, ttl, &["LIMIT", n]).expect("a place")
}

fn shared(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str) -> i64 {
    acquire_opts(c, key, owner, ttl, &["SHARED"]).expect("a place")
}

fn digest(c: &mut redis::Connection, key: &str) -> Value {
    ok(c, &["DEBUG", "DIGEST-VALUE", key])
}

/// LEASE.INFO without the ttls: mode, limit, token, the holders' tokens.
type Shape = (Option<Value>, Option<Value>, i64, Vec<i64>);

/// What LEASE.INFO says of a key, with the ttls left out (they tick).
fn shape(c: &mut redis::Connection, key: &str) -> Option<Shape> {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => None,
        v => Some((
            field(&v, "mode"),
            field(&v, "limit"),
            int(&field(&v, "token").unwrap()),
            holders(&v).into_iter().map(|h| h.0).collect(),
        )),
    }
}

/// The holders' ttls of a key, by token.
fn ttls(c: &mut redis::Connection, key: &str) -> Vec<(i64, i64)> {
    holders(&ok(c, &["LEASE.INFO", key]))
}

fn sync(m: &mut redis::Connection) {
    assert_eq!(int(&ok(m, &["WAIT", "1", "5000"])), 1);
}

fn offset(m: &mut redis::Connection) -> i64 {
    info_value(m, "replication", "master_repl_offset")
        .unwrap()
        .parse()
        .unwrap()
}

/// The commands in the AOF files of `s`, as their names, in order.
fn aof_commands(s: &Server) -> Vec<String> {
    let dir = s.data_dir().join("appendonlydir");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "aof"))
    {
        let bytes = std::fs::read(f).unwrap();
        // Every command is "*<n>\r\n$<len>\r\n<name>\r\n...": read the names.
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'*' && (i == 0 || bytes[i - 1] == b'\n') {
                let rest = &bytes[i..];
                let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") else {
                    break;
                };
                let after = &rest[nl + 2..];
                if after.first() == Some(&b'$') {
                    let Some(nl2) = after.windows(2).position(|w| w == b"\r\n") else {
                        break;
                    };
                    let len: usize = std::str::from_utf8(&after[1..nl2])
                        .unwrap()
                        .parse()
                        .unwrap();
                    let name = &after[nl2 + 2..nl2 + 2 + len];
                    out.push(String::from_utf8_lossy(name).to_uppercase());
                    i += nl + 2 + nl2 + 2 + len;
                    continue;
                }
            }
            i += 1;
        }
    }
    out
}

fn count(cmds: &[String], name: &str) -> usize {
    cmds.iter().filter(|c| *c == name).count()
}

/// Keys of every kind: a LIMIT 3 key with three holders of different
/// ttls, a SHARED key with two readers, an exclusive lease.
fn populate(c: &mut redis::Connection) {
    limit(c, "sem", "a", "40000", "3");
    limit(c, "sem", "b\0bin", "50000", "3");
    limit(c, "sem", "c", "60000", "3");
    shared(c, "rd", "r1", "60000");
    shared(c, "rd", "r2", "45000");
    acquire(c, "ex", "x", "60000");
}

fn digests(c: &mut redis::Connection) -> Vec<Value> {
    ["sem", "rd", "ex"].iter().map(|k| digest(c, k)).collect()
}

/// Every owner still holds: RENEW by it works (nothing else proves the
/// owner bytes came through).
fn owners_hold(c: &mut redis::Connection) {
    owners_hold_but(c, &[]);
}

/// `owners_hold`, leaving out the holdings in `gone` (key, owner).
fn owners_hold_but(c: &mut redis::Connection, gone: &[(&str, &[u8])]) {
    for (key, owner) in [
        ("sem", &b"a"[..]),
        ("sem", b"b\0bin"),
        ("sem", b"c"),
        ("rd", b"r1"),
        ("rd", b"r2"),
        ("ex", b"x"),
    ] {
        if gone.contains(&(key, owner)) {
            continue;
        }
        assert_eq!(
            call(c, &[b"LEASE.RENEW", key.as_bytes(), owner, b"60000"]).unwrap(),
            Value::Int(1),
            "{key}: {owner:?}"
        );
    }
}

full_suite! {
    fn one_effect_per_holder_whatever_the_holder_count(kind) {
        let master = Server::start_with(kind, Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]));
        let mut m = master.conn();
        let replica = replica_of(kind, &master);
        ok(&mut m, &["CONFIG", "SET", "repl-ping-replica-period", "3600"]);
        limit(&mut m, "small", "o0000", "60000", "2000");
        let mut p = redis::pipe();
        for i in 0..1000 {
            p.cmd("LEASE.ACQUIRE").arg("large").arg(format!("o{i:04}")).arg(60000).arg("LIMIT").arg(2000).ignore();
        }
        p.query::<()>(&mut m).unwrap();
        sync(&mut m);
        // The same call on a key with 1 holder and on one with 1000 sends
        // the same bytes to the replica.
        let mut sizes = Vec::new();
        for key in ["small", "large"] {
            let mut deltas = Vec::new();
            for args in [
                &["LEASE.ACQUIRE", key, "n9999", "60000", "LIMIT", "2000"][..],
                &["LEASE.ACQUIRE", key, "n9999", "50000", "LIMIT", "2000"],
                &["LEASE.RENEW", key, "n9999", "40000"],
                &["LEASE.RELEASE", key, "n9999"],
            ] {
                let before = offset(&mut m);
                ok(&mut m, args);
                deltas.push(offset(&mut m) - before);
            }
            sizes.push(deltas);
        }
        assert_eq!(sizes[0], sizes[1], "bytes replicated per call, 1 holder vs 1000: {sizes:?}");
        assert!(sizes[0].iter().all(|&d| d > 0 && d < 200), "{sizes:?}");
        // The AOF has one LEASE.HOLD per acquisition, one LEASE.DROP per release.
        let cmds = aof_commands(&master);
        assert_eq!(count(&cmds, "LEASE.HOLD"), 1 + 1000 + 2 * 3, "{:?}", &cmds[..10.min(cmds.len())]);
        assert_eq!(count(&cmds, "LEASE.DROP"), 2);
        let mut r = replica.conn();
        sync(&mut m);
        assert_eq!(digest(&mut r, "large"), digest(&mut m, "large"));
    }

    fn kill_9_with_appendfsync_always_keeps_every_holder(kind) {
        let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
        let s = Server::start_with(kind, opts.clone());
        let mut c = s.conn();
        populate(&mut c);
        ok(&mut c, &["LEASE.RENEW", "sem", "a", "55000"]);
        limit(&mut c, "gone", "g", "60000", "2");
        ok(&mut c, &["LEASE.RELEASE", "gone", "g"]);
        let before = digests(&mut c);
        let last = info_int(&mut c, "lease_last_token");
        let s = s.restart_with(opts);
        let mut c = s.conn();
        assert_eq!(digests(&mut c), before);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "gone"])), 0);
        assert!(info_int(&mut c, "lease_last_token") >= last);
        assert!(limit(&mut c, "new", "n", "1000", "2") > last);
        owners_hold(&mut c);
    }

}

/// A DUMP payload of a holders record, rebuilt uncompressed with its record
/// version raised to one from the future.
fn future_holders(payload: &[u8]) -> Vec<u8> {
    let mut record = holders_record(0, &[(b"p", 5, now_ms() + 1000)]);
    record[0] = FUTURE_RECORD_VERSION;
    module_payload(payload, &record)
}

/// The holders' remaining times after a restart: as long as their deadlines
/// say (within a few seconds of the restart).
fn near_ttls(c: &mut redis::Connection) {
    let sem = ttls(c, "sem");
    assert_eq!(sem.len(), 3);
    for ((_, ttl), want) in sem.iter().zip([40_000, 50_000, 60_000]) {
        assert!(*ttl <= want && *ttl > want - 10_000, "{sem:?}");
    }
}

// The compatibility subset (also on Redis 7.4 and 8.0).
every_server! {
    fn a_replica_answers_like_its_master(kind) {
        let master = Server::start(kind);
        let mut m = master.conn();
        populate(&mut m); // before the replica: through its full sync
        let replica = Server::start_with(kind, Opts::default().extra(&["--replicaof", "127.0.0.1", &master.port.to_string(), "--replica-read-only", "no"]));
        let mut r = replica.conn();
        assert!(wait_until(Duration::from_secs(10), || info_value(&mut r, "replication", "master_link_status").as_deref() == Some("up")));
        // ...and as effects.
        let short = limit(&mut m, "sem2", "s", "300", "2");
        limit(&mut m, "sem2", "t", "30000", "2");
        shared(&mut m, "rd2", "q", "30000");
        ok(&mut m, &["LEASE.RENEW", "sem", "a", "20000"]);
        ok(&mut m, &["LEASE.RELEASE", "rd", "r2"]);
        sync(&mut m);
        for key in ["sem", "rd", "ex", "sem2", "rd2"] {
            assert_eq!(shape(&mut r, key), shape(&mut m, key), "{key}");
            assert_eq!(digest(&mut r, key), digest(&mut m, key), "{key}: the exact holders");
        }
        for (mh, rh) in ttls(&mut m, "sem").iter().zip(ttls(&mut r, "sem")) {
            assert_eq!(mh.0, rh.0);
            assert!((mh.1 - rh.1).abs() < 1000, "{mh:?} {rh:?}");
        }
        assert!((pttl(&mut m, "sem") - pttl(&mut r, "sem")).abs() < 1000);
        // The fence check answers as the master's (this replica takes
        // writes; a read-only one refuses FENCE like any write).
        let mut tokens: Vec<i64> = shape(&mut m, "sem").unwrap().3;
        tokens.extend(shape(&mut m, "rd").unwrap().3);
        tokens.push(short);
        tokens.push(tokens[0] - 1);
        std::thread::sleep(Duration::from_millis(400)); // the short holder ends
        for (key, t) in ["sem", "rd", "sem2"].iter().flat_map(|k| tokens.iter().map(move |t| (*k, *t))) {
            let t = t.to_string();
            let (a, b) = (call(&mut m, &[b"LEASE.FENCE", key.as_bytes(), t.as_bytes()]), call(&mut r, &[b"LEASE.FENCE", key.as_bytes(), t.as_bytes()]));
            assert_eq!(a.as_ref().map_err(error_text), b.as_ref().map_err(error_text), "FENCE {key} {t}");
        }
        assert_eq!(shape(&mut r, "sem2"), shape(&mut m, "sem2"), "both leave the ended holder out");
        // The master drops the ended holder (LEASE.DROP) on its next write.
        limit(&mut m, "sem2", "u", "30000", "2");
        sync(&mut m);
        assert_eq!(digest(&mut r, "sem2"), digest(&mut m, "sem2"));
        // The last holder out: the key goes on the replica too.
        for o in ["t", "u"] {
            ok(&mut m, &["LEASE.RELEASE", "sem2", o]);
        }
        sync(&mut m);
        assert_eq!(int(&ok(&mut r, &["EXISTS", "sem2"])), 0);
        assert!(info_int(&mut r, "lease_last_token") >= info_int(&mut m, "lease_last_token"));
        // A read-only replica refuses FENCE (a write command) and ACQUIRE.
        ok(&mut r, &["CONFIG", "SET", "replica-read-only", "yes"]);
        assert!(err(&mut r, &["LEASE.FENCE", "sem", &tokens[0].to_string()]).starts_with("READONLY"));
        assert!(err(&mut r, &["LEASE.ACQUIRE", "sem", "z", "1000", "LIMIT", "3"]).starts_with("READONLY"));
        // Promoted, it lets every holder renew (the owners came through).
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        owners_hold_but(&mut r, &[("rd", b"r2")]);
        assert_eq!(int(&ok(&mut r, &["LEASE.RENEW", "rd", "r2", "1000"])), 0, "r2 left on the master");
    }

    fn rdb_restarts_and_debug_reload_keep_every_holder(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        populate(&mut c);
        let before = digests(&mut c);
        ok(&mut c, &["DEBUG", "RELOAD"]);
        assert_eq!(digests(&mut c), before, "DEBUG RELOAD");
        ok(&mut c, &["SAVE"]);
        let last = info_int(&mut c, "lease_last_token");
        let s = s.restart_with(Opts::default());
        let mut c = s.conn();
        assert_eq!(digests(&mut c), before, "RDB restart");
        assert!(info_int(&mut c, "lease_last_token") >= last);
        near_ttls(&mut c);
        owners_hold(&mut c);
    }

    fn dump_restore_copy_rename_and_migrate_keep_the_holders(kind) {
        let s = Server::start(kind);
        let dst = Server::start(kind);
        let mut c = s.conn();
        populate(&mut c);
        let shapes: Vec<_> = ["sem", "rd"].iter().map(|k| shape(&mut c, k)).collect();
        for (i, key) in ["sem", "rd"].iter().enumerate() {
            let payload = dump_payload(&mut c, key);
            assert_eq!(payload[0], 7, "a module value (RDB_TYPE_MODULE_2)");
            // RESTORE without a ttl: the key gets its latest deadline.
            let copy = format!("{key}:restored");
            assert_eq!(call(&mut c, &[b"RESTORE", copy.as_bytes(), b"0", &payload]).unwrap(), Value::Okay);
            assert_eq!(shape(&mut c, &copy), shapes[i]);
            assert_eq!(digest(&mut c, &copy), digest(&mut c, key));
            assert!(wait_until(Duration::from_secs(3), || (pttl(&mut c, &copy) - pttl(&mut c, key)).abs() < 1000), "{copy} aligned");
            let copied = format!("{key}:copied");
            assert_eq!(int(&ok(&mut c, &["COPY", key, &copied])), 1);
            assert_eq!(shape(&mut c, &copied), shapes[i]);
            assert_eq!(digest(&mut c, &copied), digest(&mut c, key));
            let renamed = format!("{key}:renamed");
            ok(&mut c, &["RENAME", &copied, &renamed]);
            assert_eq!(shape(&mut c, &renamed), shapes[i]);
            // A version from the future is refused, cleanly.
            let e = call(&mut c, &[b"RESTORE", b"bad", b"0", &future_holders(&payload)]).expect_err("future");
            assert!(error_text(&e).contains("Bad data format"), "{e}");
            assert_eq!(int(&ok(&mut c, &["EXISTS", "bad"])), 0);
        }
        assert!(int(&ok(&mut c, &["MEMORY", "USAGE", "sem"])) > int(&ok(&mut c, &["MEMORY", "USAGE", "ex"])));
        // A record written from the documented layout loads as stated.
        let template = dump_payload(&mut c, "ex");
        let now = now_ms();
        let t0 = info_int(&mut c, "lease_last_token") + 10;
        let record = holders_record(4, &[(b"p", t0 as u64, now + 30_000), (b"q\0", t0 as u64 + 7, now + 20_000)]);
        assert_eq!(call(&mut c, &[b"RESTORE", b"built", b"0", &module_payload(&template, &record)]).unwrap(), Value::Okay);
        let v = ok(&mut c, &["LEASE.INFO", "built"]);
        assert_eq!(field(&v, "limit"), Some(Value::Int(4)));
        assert_eq!(holders(&v).iter().map(|h| h.0).collect::<Vec<_>>(), vec![t0, t0 + 7]);
        assert!(wait_until(Duration::from_secs(3), || pttl(&mut c, "built") > 25_000), "the key's TTL is the latest deadline");
        assert_eq!(call(&mut c, &[b"LEASE.RENEW", b"built", b"q\0", b"1000"]).unwrap(), Value::Int(1));
        assert!(info_int(&mut c, "lease_last_token") >= t0 + 7);
        // Broken ones are refused: no holder, LIMIT 1, tokens out of order,
        // more holders than the limit, a repeated owner, a future version.
        let bad: Vec<(&str, Vec<u8>)> = vec![
            ("no holder", holders_record(3, &[])),
            ("LIMIT 1", holders_record(1, &[(b"p", 5, now + 1000)])),
            ("unsorted", holders_record(0, &[(b"p", 9, now + 1000), (b"q", 5, now + 1000)])),
            ("over the limit", holders_record(2, &[(b"p", 5, now), (b"q", 6, now), (b"r", 7, now)])),
            ("repeated owner", holders_record(0, &[(b"p", 5, now), (b"p", 6, now)])),
            ("future", { let mut r = holders_record(0, &[(b"p", 5, now)]); r[0] = FUTURE_RECORD_VERSION; r }),
        ];
        for (what, record) in bad {
            let e = call(&mut c, &[b"RESTORE", b"bad", b"0", &module_payload(&template, &record)]).expect_err(what);
            assert!(error_text(&e).contains("Bad data format"), "{what}: {e}");
            assert_eq!(int(&ok(&mut c, &["EXISTS", "bad"])), 0, "{what}");
        }
        assert!(s.log().contains("refusing a stored lease value"));
        // MIGRATE: the holders move, the target's clock rises above them.
        let mut d = dst.conn();
        let top = shape(&mut c, "sem").unwrap().2;
        ok(&mut c, &["MIGRATE", "127.0.0.1", &dst.port.to_string(), "sem", "0", "5000"]);
        assert_eq!(int(&ok(&mut c, &["EXISTS", "sem"])), 0);
        assert_eq!(shape(&mut d, "sem"), shapes[0]);
        assert!(pttl(&mut d, "sem") > 50_000);
        assert!(info_int(&mut d, "lease_last_token") >= top);
        assert_eq!(call(&mut d, &[b"LEASE.RELEASE", b"sem", b"b\0bin"]).unwrap(), Value::Int(1));
    }

    fn aof_rewrites_keep_one_hold_per_live_holder(kind) {
        for preamble in ["no", "yes"] {
            let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", preamble]);
            let s = Server::start_with(kind, opts.clone());
            let mut c = s.conn();
            populate(&mut c);
            // A reader that ends before the rewrite, never pruned: the
            // rewrite leaves it out.
            shared(&mut c, "rd", "brief", "1");
            std::thread::sleep(Duration::from_millis(20));
            ok(&mut c, &["BGREWRITEAOF"]);
            assert!(wait_until(Duration::from_secs(10), || {
                let info: String = redis::cmd("INFO").arg("persistence").query(&mut c).unwrap();
                info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") && info.contains("aof_last_bgrewrite_status:ok")
            }));
            std::thread::sleep(Duration::from_millis(200));
            if preamble == "no" {
                let cmds = aof_commands(&s);
                assert_eq!(count(&cmds, "LEASE.HOLD"), 3 + 2, "one per live holder: {cmds:?}");
                assert_eq!(count(&cmds, "LEASE.APPLY"), 1);
            }
            let shapes: Vec<_> = ["sem", "rd", "ex"].iter().map(|k| shape(&mut c, k)).collect();
            let s = s.restart_with(opts);
            let mut c = s.conn();
            let after: Vec<_> = ["sem", "rd", "ex"].iter().map(|k| shape(&mut c, k)).collect();
            assert_eq!(after, shapes, "preamble {preamble}");
            near_ttls(&mut c);
            owners_hold(&mut c);
        }
    }
}
