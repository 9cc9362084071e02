//! What the client tests add to the module's harness (`tests/common`): a TCP
//! proxy that loses the reply of one `LEASE.ACQUIRE`, and small helpers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{self, Server, Value};

/// A proxy in front of one server. Armed, it forwards the next request that
/// holds `LEASE.ACQUIRE` (or `LEASE.MACQUIRE`) to the server and then, when the server's reply
/// comes back, closes the client's connection instead of passing it on: the
/// server did the acquire, the client never hears of it. Every other byte
/// passes through.
pub struct LossyProxy {
    pub port: u16,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl LossyProxy {
    pub fn start(upstream: u16) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, d, s) = (armed.clone(), dropped.clone(), stop.clone());
        thread::spawn(move || {
            // Bounded: at most 10 minutes, and 60,000 rounds of 10 ms.
            let start = Instant::now();
            for _ in 0..60_000 {
                if s.load(Ordering::SeqCst) || start.elapsed() > Duration::from_secs(600) {
                    return;
                }
                match listener.accept() {
                    Ok((down, _)) => {
                        down.set_nonblocking(false).unwrap();
                        let up = TcpStream::connect(("127.0.0.1", upstream)).expect("upstream");
                        pump(down, up, a.clone(), d.clone());
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        LossyProxy {
            port,
            armed,
            dropped,
            stop,
        }
    }

    /// Loses the reply of the next `LEASE.ACQUIRE` or `LEASE.MACQUIRE`
    /// (once).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many replies it lost.
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn pump(down: TcpStream, up: TcpStream, armed: Arc<AtomicBool>, dropped: Arc<AtomicUsize>) {
    // This connection's next reply is to be lost.
    let lose = Arc::new(AtomicBool::new(false));
    let (mut d_read, mut u_write) = (down.try_clone().unwrap(), up.try_clone().unwrap());
    let l = lose.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            let n = match d_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            // Decide before the request reaches the server, so its reply
            // cannot overtake the decision.
            let acquire = chunk.windows(13).any(|w| w == b"LEASE.ACQUIRE")
                || chunk.windows(14).any(|w| w == b"LEASE.MACQUIRE");
            if acquire && armed.swap(false, Ordering::SeqCst) {
                l.store(true, Ordering::SeqCst);
            }
            if u_write.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = u_write.shutdown(Shutdown::Both);
    });
    let (mut u_read, mut d_write) = (up, down);
    thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            let n = match u_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if lose.load(Ordering::SeqCst) {
                dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if d_write.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = d_write.shutdown(Shutdown::Both);
        let _ = u_read.shutdown(Shutdown::Both);
    });
}

/// The client id of the connection blocked in `LEASE.ACQUIRE` on `s`
/// (from `CLIENT LIST`), once there is exactly one (up to 5 s).
pub fn blocked_acquirer(s: &Server) -> i64 {
    let mut c = s.conn();
    let mut found = None;
    let ok = common::wait_until(Duration::from_secs(5), || {
        let list = common::ok_text(&mut c, &["CLIENT", "LIST"]);
        let ids: Vec<i64> = list
            .lines()
            .filter(|l| l.to_lowercase().contains("cmd=lease.acquire") && l.contains("flags=b"))
            .filter_map(|l| l.split(' ').next()?.strip_prefix("id=")?.parse().ok())
            .collect();
        found = (ids.len() == 1).then(|| ids[0]);
        found.is_some()
    });
    assert!(ok, "no single client blocked in LEASE.ACQUIRE");
    found.unwrap()
}

/// `LEASE.ACQUIRE key owner ttl` answered null or a token.
pub fn try_acquire(c: &mut redis::Connection, key: &str, owner: &str, ttl: &str) -> Option<i64> {
    match common::ok(c, &["LEASE.ACQUIRE", key, owner, ttl]) {
        Value::Nil => None,
        v => Some(common::int(&v)),
    }
}

/// A competitor on its own thread: from now on it tries `LEASE.ACQUIRE` on
/// `key` every 5 ms (each call may hang while the server is stopped), up to
/// `within`, and returns when it got the lease (`None`: never).
/// Its connection is opened now, before the server may be stopped.
pub fn competitor(s: &Server, key: &str, within: Duration) -> thread::JoinHandle<Option<Instant>> {
    let mut c = s.conn();
    let key = key.to_string();
    thread::spawn(move || {
        let start = Instant::now();
        let rounds = within.as_millis() / 5 + 1;
        for _ in 0..rounds {
            if start.elapsed() > within {
                break;
            }
            if try_acquire(&mut c, &key, "competitor", "10000").is_some() {
                return Some(Instant::now());
            }
            thread::sleep(Duration::from_millis(5));
        }
        None
    })
}

/// A master that accepts no TCP connection: a loopback listener that never
/// accepts, its backlog shrunk to nothing and filled, so that a new
/// connect gets no answer at all (its SYN is dropped) until the client's
/// own timeout.
pub struct Silent {
    pub port: u16,
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

impl Silent {
    pub fn start() -> Silent {
        use std::os::fd::AsRawFd;
        let listener = TcpListener::bind("127.0.0.1:0").expect("silent bind");
        // std listens with a backlog of 128: listen again with 0.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let addr = listener.local_addr().unwrap();
        // Bounded: 50 connects, the first that gets no answer ends it.
        let mut queued = Vec::new();
        for _ in 0..50 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
                Ok(s) => queued.push(s),
                Err(_) => break,
            }
        }
        assert!(queued.len() < 50, "the listener's queue never filled");
        Silent {
            port: addr.port(),
            _listener: listener,
            _queued: queued,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// `calls` of `cmdstat_<cmd>` (lowercase, e.g. `lease.mrenew`), 0 when it
/// never ran.
pub fn calls(c: &mut redis::Connection, cmd: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let prefix = format!("cmdstat_{cmd}:calls=");
    text.lines()
        .find_map(|l| l.to_lowercase().strip_prefix(&prefix).map(str::to_string))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}
