//! Mixed module builds: every node says which record and effect versions
//! it speaks (`INFO lease`), a master announces its versions into the
//! replication stream and the AOF (`LEASE.VERSION`), and a node that is
//! sent versions newer than it understands says so loudly and keeps no
//! partial state: it deletes its lease keys, applies no lease effect and
//! refuses every lease command until its source speaks versions it knows,
//! or it is promoted. A master of a newer build is played here by a fake
//! master on a socket (it sends a real RDB, then the stream); the older
//! build that meets this build's labelled records (design.md S11) is the
//! real 0.3.0 module, built by tests/fixtures/old-module.sh.
mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The 0.3.0 module (records 2, effects 3): `$OLD_LEASE_MODULE`, else
/// built once by tests/fixtures/old-module.sh (`make integration` builds
/// it first).
fn old_module() -> PathBuf {
    if let Some(p) = std::env::var_os("OLD_LEASE_MODULE") {
        return p.into();
    }
    let out = Command::new("bash")
        .arg(repo_file("tests/fixtures/old-module.sh"))
        .output()
        .expect("run tests/fixtures/old-module.sh");
    assert!(
        out.status.success(),
        "old-module.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A server of `kind` with the 0.3.0 module loaded.
fn old_opts(old: &std::path::Path) -> Opts {
    Opts {
        no_module: true,
        ..Opts::default()
    }
    .extra(&["--loadmodule", old.to_str().unwrap(), "grace-ms", "0"])
}

fn dump(c: &mut redis::Connection, key: &str) -> Vec<u8> {
    match ok(c, &["DUMP", key]) {
        Value::BulkString(b) => b,
        other => panic!("DUMP {key}: {other:?}"),
    }
}

/// This build's versions (src/lease/versions.rs).
const EFFECTS: i64 = 5;
const RECORDS: i64 = 5;

fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One command the replica sent: its arguments.
fn read_command(r: &mut BufReader<TcpStream>) -> Vec<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line).expect("a command from the replica");
    let n: usize = line
        .trim_start_matches('*')
        .trim()
        .parse()
        .expect("an array");
    (0..n)
        .map(|_| {
            let mut len = String::new();
            r.read_line(&mut len).unwrap();
            let len: usize = len.trim_start_matches('$').trim().parse().unwrap();
            let mut buf = vec![0; len + 2];
            r.read_exact(&mut buf).unwrap();
            buf.truncate(len);
            buf
        })
        .collect()
}

/// A master of another build, as far as a replica can tell: it answers the
/// replica's handshake, sends a full sync of `rdb`, then what the test
/// writes with `send`.
struct FakeMaster {
    stream: TcpStream,
}

impl FakeMaster {
    /// Waits (10 s at most) for the replica on `listener` and syncs it.
    fn serve(listener: TcpListener, rdb: &[u8]) -> FakeMaster {
        listener.set_nonblocking(false).unwrap();
        let (stream, _) = listener.accept().expect("the replica connects");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut stream = stream;
        // Bounded: a handshake is a handful of commands.
        for _ in 0..20 {
            let cmd = read_command(&mut reader);
            let name = String::from_utf8_lossy(&cmd[0]).to_uppercase();
            match name.as_str() {
                "PING" => stream.write_all(b"+PONG\r\n").unwrap(),
                "PSYNC" | "SYNC" => {
                    let replid = "a".repeat(40);
                    stream
                        .write_all(
                            format!("+FULLRESYNC {replid} 0\r\n${}\r\n", rdb.len()).as_bytes(),
                        )
                        .unwrap();
                    stream.write_all(rdb).unwrap();
                    let mut m = FakeMaster { stream };
                    m.send(&[b"SELECT", b"0"]);
                    return m;
                }
                _ => stream.write_all(b"+OK\r\n").unwrap(),
            }
        }
        panic!("the replica never asked for a sync");
    }

    fn send(&mut self, args: &[&[u8]]) {
        self.stream
            .write_all(&resp(args))
            .expect("the stream to the replica");
    }
}

/// An RDB saved by a server of `kind` with the module (and no lease).
fn empty_rdb(kind: Kind) -> Vec<u8> {
    let s = Server::start(kind);
    let mut c = s.conn();
    ok(&mut c, &["SAVE"]);
    std::fs::read(s.data_dir().join("dump.rdb")).expect("dump.rdb")
}

fn wait_for(what: &str, s: &Server, mut f: impl FnMut() -> bool) {
    assert!(
        wait_until(Duration::from_secs(10), &mut f),
        "{what}:\n{}",
        s.log_tail(20)
    );
}

full_suite! {
    fn every_node_says_what_it_speaks(kind) {
        let master = Server::start_with(kind, Opts::default().extra(&["--appendonly", "yes"]));
        let mut m = master.conn();
        assert_eq!(info_int(&mut m, "lease_effect_version"), EFFECTS);
        assert_eq!(info_int(&mut m, "lease_record_version"), RECORDS);
        assert_eq!(info_field(&mut m, "lease_incompatible_source").as_deref(), Some("none"));
        let t = acquire(&mut m, "k", "me", "60000");
        let replica = replica_of(kind, &master);
        let mut r = replica.conn();
        // The master announced its versions when the replica came online,
        // and writes them into every AOF it rewrites.
        ok(&mut m, &["BGREWRITEAOF"]);
        ok(&mut m, &["WAIT", "1", "5000"]);
        assert_eq!(token_of(&mut r, "k"), Some(t));
        assert_eq!(info_field(&mut r, "lease_incompatible_source").as_deref(), Some("none"));
        let dir = master.data_dir().join("appendonlydir");
        wait_for("LEASE.VERSION in the rewritten AOF", &master, || {
            std::fs::read_dir(&dir).unwrap().any(|e| {
                let text = std::fs::read(e.unwrap().path()).unwrap_or_default();
                String::from_utf8_lossy(&text).contains("LEASE.VERSION")
            })
        });
        // Internal: no client may send it.
        assert!(err(&mut m, &["LEASE.VERSION", "3", "2"]).contains("internal"));
    }

    fn a_replica_sent_newer_effects_keeps_no_lease(kind) {
        let rdb = empty_rdb(kind);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port().to_string();
        let replica = Server::start_with(kind, Opts::default().extra(&["--replicaof", "127.0.0.1", &port]));
        let mut master = FakeMaster::serve(listener, &rdb);
        let mut r = replica.conn();
        let deadline = (now_ms() + 60_000).to_string();
        master.send(&[b"LEASE.APPLY", b"before", b"o", b"5", deadline.as_bytes()]);
        wait_for("the replica applies the master's lease", &replica, || token_of(&mut r, "before") == Some(5));

        // A master of a newer build.
        master.send(&[b"LEASE.VERSION", b"99", b"9"]);
        wait_for("the replica notices", &replica, || {
            info_field(&mut r, "lease_incompatible_source").as_deref() == Some("effects 99 records 9")
        });
        assert!(replica.log().contains("INCOMPATIBLE LEASE MODULE"), "{}", replica.log_tail(10));
        assert_eq!(int(&ok(&mut r, &["EXISTS", "before"])), 0, "no partial state");
        let e = err(&mut r, &["LEASE.INFO", "before"]);
        assert!(e.contains("cannot follow") && e.contains("effects 99"), "{e}");
        master.send(&[b"LEASE.APPLY", b"after", b"o", b"6", deadline.as_bytes()]);
        master.send(&[b"SET", b"marker", b"1"]);
        wait_for("the stream goes on", &replica, || int(&ok(&mut r, &["EXISTS", "marker"])) == 1);
        assert_eq!(int(&ok(&mut r, &["EXISTS", "after"])), 0, "no lease effect applied");

        // Its source speaks versions it knows again.
        master.send(&[b"LEASE.VERSION", EFFECTS.to_string().as_bytes(), RECORDS.to_string().as_bytes()]);
        master.send(&[b"LEASE.APPLY", b"again", b"o", b"7", deadline.as_bytes()]);
        wait_for("lease effects again", &replica, || {
            matches!(call(&mut r, &[b"LEASE.INFO", b"again"]), Ok(Value::Array(_)) | Ok(Value::Map(_)))
        });
        assert_eq!(token_of(&mut r, "again"), Some(7));
        assert_eq!(info_field(&mut r, "lease_incompatible_source").as_deref(), Some("none"));

        // And a promotion clears it: a master speaks its own versions.
        master.send(&[b"LEASE.VERSION", b"99", b"9"]);
        wait_for("incompatible again", &replica, || {
            info_field(&mut r, "lease_incompatible_source").as_deref() != Some("none")
        });
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        assert_eq!(info_field(&mut r, "lease_incompatible_source").as_deref(), Some("none"));
        assert!(acquire(&mut r, "fresh", "me", "1000") > 7);
    }
}

every_server! {
    fn an_older_build_refuses_labelled_records_and_guards_loudly(kind) {
        let old = old_module();
        let new = Server::start(kind);
        let mut n = new.conn();
        let t = acquire(&mut n, "plain", "o", "60000");
        call(&mut n, &[b"LEASE.ACQUIRE", b"labelled", b"o", b"60000", b"LABEL", b"worker 7"]).unwrap();
        call(&mut n, &[b"LEASE.ACQUIRE", b"sem", b"o", b"60000", b"LIMIT", b"2", b"LABEL", b"w"]).unwrap();
        ok(&mut n, &["LEASE.GUARD", "{g}:lock"]);
        let payloads: Vec<Vec<u8>> = ["plain", "labelled", "sem", "{g}:lock"].iter().map(|k| dump(&mut n, k)).collect();

        let o = Server::start_with(kind, old_opts(&old));
        let mut oc = o.conn();
        assert_eq!(info_field(&mut oc, "lease_version").as_deref(), Some("0.3.0"));
        // An unlabelled record is still written as the older build reads it.
        assert_eq!(call(&mut oc, &[b"RESTORE", b"plain", b"0", &payloads[0]]).unwrap(), Value::Okay);
        assert_eq!(token_of(&mut oc, "plain"), Some(t));
        // A labelled one is refused (the server's own RESTORE error; the
        // module's log line says why) and leaves nothing.
        // A guard (design.md S12) likewise.
        for (key, payload, version) in [("labelled", &payloads[1], "3"), ("sem", &payloads[2], "4"), ("{g}:lock", &payloads[3], "5")] {
            let e = call(&mut oc, &[b"RESTORE", key.as_bytes(), b"0", payload]).expect_err(key);
            assert!(error_text(&e).contains("Bad data format"), "{key}: {e:?}");
            let why = format!("encoding version {version}, newer than the 2 this module reads (module 0.3.0)");
            assert!(o.log().contains(&why), "{key}: {}", o.log_tail(5));
            assert_eq!(int(&ok(&mut oc, &["EXISTS", key])), 0, "{key}");
        }
        drop((oc, o));

        // An RDB with labelled records: the older build refuses to start on
        // it, and says why.
        ok(&mut n, &["SAVE"]);
        let dir = fresh_dir();
        std::fs::copy(new.data_dir().join("dump.rdb"), dir.join("dump.rdb")).unwrap();
        match Server::try_start_in(kind, old_opts(&old), dir) {
            Ok(_) => panic!("the 0.3.0 module loaded an RDB with labelled records"),
            Err(e) => assert!(["3", "4", "5"].iter().any(|v| e.log.contains(&format!("encoding version {v}"))), "{}", e.log),
        }

        // A replica of the older build keeps no lease of a master that
        // speaks effects 5 (it says so), here with no labelled record yet.
        let m = Server::start(kind);
        let mut mc = m.conn();
        let r = Server::start_with(kind, old_opts(&old).extra(&["--replicaof", "127.0.0.1", &m.port.to_string()]));
        let mut rc = r.conn();
        acquire(&mut mc, "k", "o", "60000");
        wait_for("the older replica notices", &r, || {
            info_field(&mut rc, "lease_incompatible_source").as_deref() == Some("effects 5 records 5")
        });
        assert!(r.log().contains("INCOMPATIBLE LEASE MODULE"), "{}", r.log_tail(10));
        assert_eq!(int(&ok(&mut rc, &["EXISTS", "k"])), 0, "no partial state");
    }
}
