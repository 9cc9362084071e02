//! Records written by the module before counting and shared leases (record
//! version 1; tests/fixtures/make.sh made them with the module at 551acc5
//! on Redis 7.0, every lease with a ttl of 10 years) load unchanged on
//! every server: an RDB file, an AOF with the RDB preamble and one without
//! (multi-part AOF directories with an incr file of LEASE.APPLY and
//! LEASE.RELEASE), and DUMP payloads. Each lease keeps its token, its
//! owner (the owner can renew it, nobody else can take it) and its
//! deadline (the remaining ttl), and the token clock stays above them.
mod common;
use common::*;

use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

struct Held {
    db: String,
    key: String,
    owner: Vec<u8>,
    token: i64,
    deadline: i64,
}

/// The leases a fixture holds, and the keys released in it.
fn expected(dir: &Path) -> (Vec<Held>, Vec<(String, String)>) {
    let text = std::fs::read_to_string(dir.join("expected.txt")).unwrap();
    let (mut held, mut gone) = (Vec::new(), Vec::new());
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split(' ').collect();
        if f[0] == "gone" {
            gone.push((f[1].to_string(), f[2].to_string()));
        } else {
            held.push(Held {
                db: f[0].to_string(),
                key: f[1].to_string(),
                owner: unhex(f[2]),
                token: f[3].parse().unwrap(),
                deadline: f[4].parse().unwrap(),
            });
        }
    }
    assert!(held.len() >= 5, "fixture {dir:?} holds too little");
    (held, gone)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Checks one lease as a fixture stated it: token, remaining ttl (about
/// deadline - now), owner (RENEW by it works; another owner is refused).
fn check_lease(c: &mut redis::Connection, h: &Held, what: &str) {
    ok(c, &["SELECT", &h.db]);
    let info = ok(c, &["LEASE.INFO", &h.key]);
    assert_eq!(
        field(&info, "token"),
        Some(Value::Int(h.token)),
        "{what}: {} token",
        h.key
    );
    let want = h.deadline - now_ms();
    let ttl = int(&field(&info, "ttl").unwrap());
    assert!(
        (ttl - want).abs() < 10_000,
        "{what}: {} ttl {ttl}, deadline says {want}",
        h.key
    );
    let key_ttl = pttl(c, &h.key);
    assert!(
        (key_ttl - want).abs() < 10_000,
        "{what}: {} PTTL {key_ttl}, deadline says {want}",
        h.key
    );
    assert_eq!(
        ok(c, &["LEASE.ACQUIRE", &h.key, "intruder", "1000"]),
        Value::Nil,
        "{what}: {}",
        h.key
    );
    let renewed = call(c, &[b"LEASE.RENEW", h.key.as_bytes(), &h.owner, b"60000"]).unwrap();
    assert_eq!(
        renewed,
        Value::Int(1),
        "{what}: {}: the owner renews",
        h.key
    );
    assert_eq!(
        token_of(c, &h.key),
        Some(h.token),
        "{what}: renewing keeps the token"
    );
}

fn check_all(s: &Server, dir: &Path, what: &str) {
    let (held, gone) = expected(dir);
    let mut c = s.conn();
    for h in &held {
        check_lease(&mut c, h, what);
    }
    for (db, key) in &gone {
        ok(&mut c, &["SELECT", db]);
        assert_eq!(
            int(&ok(&mut c, &["EXISTS", key])),
            0,
            "{what}: {key} was released"
        );
    }
    ok(&mut c, &["SELECT", "0"]);
    let max = held.iter().map(|h| h.token).max().unwrap();
    assert!(
        info_int(&mut c, "lease_last_token") >= max,
        "{what}: the clock saw every token"
    );
    assert!(acquire(&mut c, "fx:after", "new", "1000") > max, "{what}");
}

full_suite! {
    fn an_rdb_file_of_version_1_records_loads(kind) {
        let dir = fresh_dir();
        std::fs::copy(fixtures().join("rdb/dump.rdb"), dir.join("dump.rdb")).unwrap();
        let s = Server::try_start_in(kind, Opts::default(), dir).unwrap_or_else(|e| panic!("{}", e.log));
        check_all(&s, &fixtures().join("rdb"), "rdb");
    }

    fn aof_files_of_version_1_records_load_with_and_without_the_preamble(kind) {
        for name in ["aof-preamble", "aof-plain"] {
            let dir = fresh_dir();
            copy_dir(&fixtures().join(name).join("appendonlydir"), &dir.join("appendonlydir"));
            let opts = Opts::default().extra(&["--appendonly", "yes", "--appendfsync", "always"]);
            let s = Server::try_start_in(kind, opts, dir).unwrap_or_else(|e| panic!("{name}: {}", e.log));
            check_all(&s, &fixtures().join(name), name);
        }
    }

    fn dump_payloads_of_version_1_records_restore(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let text = std::fs::read_to_string(fixtures().join("dump/payloads.txt")).unwrap();
        let mut n = 0;
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let f: Vec<&str> = line.split(' ').collect();
            let h = Held {
                db: "0".into(),
                key: format!("restored:{}", f[0]),
                owner: unhex(f[1]),
                token: f[2].parse().unwrap(),
                deadline: f[3].parse().unwrap(),
            };
            // RESTORE without a ttl: the key gets the lease's own deadline.
            let payload = unhex(f[4]);
            assert_eq!(call(&mut c, &[b"RESTORE", h.key.as_bytes(), b"0", &payload]).unwrap(), Value::Okay);
            assert!(wait_until(std::time::Duration::from_secs(5), || pttl(&mut c, &h.key) > 0), "{} aligned", h.key);
            check_lease(&mut c, &h, "dump");
            n += 1;
        }
        assert!(n >= 5);
    }
}
