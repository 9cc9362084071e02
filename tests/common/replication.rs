//! Replication: a replica of a master with its link up, and `Link`, a
//! TCP proxy standing for the network between two nodes that can be cut
//! silently.

use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use super::*;

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

/// A TCP proxy in front of a server, standing for the network between two
/// nodes: a replica that connects through it can be cut off from its master
/// without either side seeing the connection close, as in a partition
/// (REPLICAOF to a dead port closes the link, and the master knows at once).
/// Cut, it stops moving bytes both ways; the kernel buffers what is sent
/// meanwhile, and `heal` lets it through, as TCP does after a partition
/// shorter than its timeouts.
pub struct Link {
    pub port: u16,
    /// Where new connections go (`retarget`).
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
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
        let to = Arc::new(std::sync::atomic::AtomicU16::new(upstream));
        let (c, s, u) = (cut.clone(), stop.clone(), to.clone());
        thread::spawn(move || {
            // Bounded: 10 minutes, 60,000 rounds of 10 ms.
            let start = Instant::now();
            for _ in 0..60_000 {
                if s.load(Ordering::SeqCst) || start.elapsed() > Duration::from_secs(600) {
                    return;
                }
                match listener.accept() {
                    Ok((down, _)) => {
                        let upstream = u.load(Ordering::SeqCst);
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
        Link {
            port,
            upstream: to,
            cut,
            stop,
        }
    }

    /// New connections go to `port` from now on (a server restarted on
    /// another port keeps its address for the clients).
    pub fn retarget(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
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
