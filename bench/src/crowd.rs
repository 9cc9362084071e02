//! B4's crowd: up to 10,000 non-blocking sockets, one per client. This
//! thread writes the commands ([`crate::resp::encode`]d); reader threads,
//! one per [`PER_THREAD`] sockets, wait through epoll for the first reply
//! line of every socket ([`Crowd::exchange`]). No socket is sent a second
//! command before its reply is in, and every wait is bounded.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Res, encode};

/// Sockets of the crowd per reader thread.
pub const PER_THREAD: usize = 1000;

/// What one socket received in an exchange: when its first reply line was
/// complete, and every byte read until then (a lone reply is exactly one
/// line).
pub struct Got {
    pub at: Option<Instant>,
    pub bytes: Vec<u8>,
}

/// The send moments, and per batch (its end, when it was counted).
pub type Paced = (Vec<Instant>, Vec<(usize, Instant)>);

/// How many outcomes are exactly one of the lines `want`.
pub fn count_exact(out: &[Got], want: &[&[u8]]) -> usize {
    out.iter()
        .filter(|o| want.contains(&o.bytes.as_slice()))
        .count()
}

pub struct Crowd {
    socks: Vec<TcpStream>,
}

impl Crowd {
    /// `n` non-blocking connections to the server.
    pub fn connect(port: u16, n: usize) -> Res<Crowd> {
        let mut socks = Vec::with_capacity(n);
        for i in 0..n {
            let addr = ([127, 0, 0, 1], port).into();
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .map_err(|e| format!("connection {i} of {n}: {e}"))?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            socks.push(s);
        }
        Ok(Crowd { socks })
    }

    /// Writes `cmd(i)` to socket `i`, for every socket; returns the send moments.
    pub fn send_all(&self, cmd: &dyn Fn(usize) -> Vec<u8>) -> Res<Vec<Instant>> {
        let mut sent = Vec::with_capacity(self.socks.len());
        for (i, s) in self.socks.iter().enumerate() {
            let c = cmd(i);
            sent.push(Instant::now());
            (&*s).write_all(&c)?;
        }
        Ok(sent)
    }

    /// Writes `cmd(i)` to the sockets in batches of `batch`, and after each
    /// batch waits until `count()` (the server's count of blocked clients)
    /// has them all, so that no command waits long at the server before it
    /// blocks. Fails once `limit` passes with a batch still uncounted.
    pub fn send_paced(
        &self,
        cmd: &dyn Fn(usize) -> Vec<u8>,
        batch: usize,
        count: &mut dyn FnMut() -> Res<i64>,
        limit: Instant,
    ) -> Res<Paced> {
        let mut sent = Vec::with_capacity(self.socks.len());
        let mut counted = Vec::new();
        let mut start = 0;
        while start < self.socks.len() {
            let end = (start + batch.max(1)).min(self.socks.len());
            for (i, s) in self.socks.iter().enumerate().take(end).skip(start) {
                let c = cmd(i);
                sent.push(Instant::now());
                (&*s).write_all(&c)?;
            }
            loop {
                let c = count()?;
                if c >= end as i64 {
                    break;
                }
                if Instant::now() > limit {
                    return Err(format!("only {c} of the first {end} clients blocked").into());
                }
                thread::sleep(Duration::from_micros(100));
            }
            counted.push((end, Instant::now()));
            start = end;
        }
        Ok((sent, counted))
    }

    /// Reader threads wait for one reply line on every socket, for at most
    /// `budget`, while `send` runs on this thread (it writes the commands,
    /// and measures meanwhile). Returns what each socket received, in
    /// socket order, and what `send` returned.
    pub fn exchange<R>(&self, budget: Duration, send: impl FnOnce() -> R) -> Res<(Vec<Got>, R)> {
        let groups: Vec<&[TcpStream]> = self.socks.chunks(PER_THREAD).collect();
        let ready = Barrier::new(groups.len() + 1);
        thread::scope(|s| {
            let readers: Vec<_> = groups
                .iter()
                .map(|socks| {
                    let ready = &ready;
                    s.spawn(move || read_first_lines(socks, ready, budget))
                })
                .collect();
            ready.wait();
            let r = send();
            let mut all = Vec::with_capacity(self.socks.len());
            for h in readers {
                all.extend(h.join().map_err(|_| "a reader thread panicked")??);
            }
            Ok((all, r))
        })
    }

    /// PING on every socket; how many answered exactly `+PONG` (first reply).
    pub fn ping(&self) -> Res<usize> {
        let (out, sent) = self.exchange(Duration::from_secs(10), || {
            self.send_all(&|_| encode(&["PING"]))
        })?;
        sent?;
        Ok(count_exact(&out, &[b"+PONG\r\n"]))
    }
}

/// An epoll set, closed on drop.
struct Epoll(RawFd);

impl Epoll {
    /// A new set with `socks` in it, each with its index as its token.
    fn with(socks: &[TcpStream]) -> Res<Epoll> {
        // SAFETY: a plain epoll_create1 call.
        let ep = Epoll(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) });
        if ep.0 < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        for (i, s) in socks.iter().enumerate() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: the epoll fd and the socket's fd are open; ev outlives the call.
            if unsafe { libc::epoll_ctl(ep.0, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) } < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        Ok(ep)
    }

    fn remove(&self, s: &TcpStream) {
        // SAFETY: both fds are open (a null event is allowed for DEL).
        unsafe {
            libc::epoll_ctl(
                self.0,
                libc::EPOLL_CTL_DEL,
                s.as_raw_fd(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Waits up to `timeout_ms` for events; their number (0 when interrupted).
    fn wait(&self, evs: &mut [libc::epoll_event], timeout_ms: i32) -> Res<usize> {
        // SAFETY: evs has room for evs.len() events.
        let k = unsafe { libc::epoll_wait(self.0, evs.as_mut_ptr(), evs.len() as i32, timeout_ms) };
        if k >= 0 {
            return Ok(k as usize);
        }
        match std::io::Error::last_os_error() {
            e if e.kind() == ErrorKind::Interrupted => Ok(0),
            e => Err(e.into()),
        }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: the fd was made by epoll_create1 and is closed only here.
        unsafe { libc::close(self.0) };
    }
}

fn has_line(b: &[u8]) -> bool {
    b.windows(2).any(|w| w == b"\r\n")
}

/// Reads what `s` has until `got` holds a complete line or the socket has
/// nothing more for now.
fn read_until_line(s: &TcpStream, got: &mut Vec<u8>, i: usize) -> Res<()> {
    let mut buf = [0u8; 512];
    while !has_line(got) {
        match (&*s).read(&mut buf) {
            Ok(0) => return Err(format!("connection {i} closed").into()),
            Ok(m) => got.extend_from_slice(&buf[..m]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One reader thread: registers its sockets with a new epoll set, meets the
/// sender at `ready`, then reads until every socket has one complete reply
/// line, or `budget` after `ready`. A socket leaves the set once its line is
/// in, so anything it receives later stays in the socket, for the next
/// exchange to see.
fn read_first_lines(socks: &[TcpStream], ready: &Barrier, budget: Duration) -> Res<Vec<Got>> {
    let registered = Epoll::with(socks);
    // Always meet the sender, even after a failure, so it never waits forever.
    ready.wait();
    let until = Instant::now() + budget;
    let ep = registered?;
    let mut out: Vec<Got> = (0..socks.len())
        .map(|_| Got {
            at: None,
            bytes: Vec::new(),
        })
        .collect();
    let mut left = socks.len();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    while left > 0 {
        let now = Instant::now();
        if now >= until {
            break;
        }
        let wait_ms = (until - now).as_millis().clamp(1, 100) as i32;
        let k = ep.wait(&mut evs, wait_ms)?;
        for ev in &evs[..k] {
            let i = ev.u64 as usize;
            let o = &mut out[i];
            read_until_line(&socks[i], &mut o.bytes, i)?;
            if o.at.is_none() && has_line(&o.bytes) {
                o.at = Some(Instant::now());
                left -= 1;
                ep.remove(&socks[i]);
            }
        }
    }
    Ok(out)
}

/// Raises this process's open-file soft limit towards `want` (up to the
/// hard limit); returns the soft limit.
pub fn raise_open_files(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on local structs.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < want && r.rlim_max > r.rlim_cur {
            let raised = libc::rlimit {
                rlim_cur: want.min(r.rlim_max),
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    r.rlim_cur
}
