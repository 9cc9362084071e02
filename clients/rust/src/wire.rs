//! A plain async connection for the quorum client (feature `tokio`): one
//! socket, one command at a time, driven on the task that awaits it.
//!
//! The redis crate's multiplexed connection runs a driver task per
//! connection, so every call of a quorum step crosses tasks (and, on a
//! multi-thread runtime, threads) twice per master. A quorum step sends one
//! command to every master and reads every reply; with these connections
//! that is a write and a read on each socket, polled together on the
//! caller's task. Only what a `redis::Client` of this build can reach is
//! spoken: TCP and Unix sockets, a password or ACL user, a database, RESP2
//! or RESP3 as the URL asks.

use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ProtocolVersion, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

/// One connection: its socket and the bytes read past the last reply.
pub(crate) struct Conn {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
}

fn invalid(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        what.to_string(),
    ))
}

impl Conn {
    /// Connects to the server of `client` and says hello as its URL asks
    /// (`HELLO 3` for RESP3, `AUTH`, `SELECT`). The caller bounds it in time.
    pub(crate) async fn open(client: &redis::Client) -> RedisResult<Conn> {
        let info = client.get_connection_info();
        let stream: Box<dyn Stream> = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
            _ => {
                return Err(invalid(
                    "the quorum client speaks TCP and Unix sockets only",
                ));
            }
        };
        let mut conn = Conn {
            stream,
            buf: Vec::with_capacity(256),
        };
        let redis = info.redis_settings();
        let auth = redis
            .password()
            .map(|p| (redis.username().unwrap_or("default"), p));
        if matches!(redis.protocol(), ProtocolVersion::RESP3) {
            let mut hello = redis::cmd("HELLO");
            hello.arg(3);
            if let Some((user, pass)) = auth {
                hello.arg("AUTH").arg(user).arg(pass);
            }
            conn.call(&hello).await?;
        } else if let Some((user, pass)) = auth {
            let mut cmd = redis::cmd("AUTH");
            if redis.username().is_some() {
                cmd.arg(user);
            }
            conn.call(cmd.arg(pass)).await?;
        }
        if redis.db() != 0 {
            conn.call(redis::cmd("SELECT").arg(redis.db())).await?;
        }
        Ok(conn)
    }

    /// Sends `cmd` and reads its reply (a server error as an `Err`).
    pub(crate) async fn call(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.stream.write_all(&cmd.get_packed_command()).await?;
        loop {
            if let Some(n) = frame_len(&self.buf)? {
                let value = redis::parse_redis_value(&self.buf[..n]);
                self.buf.drain(..n);
                return value?.extract_error();
            }
            let mut chunk = [0u8; 4096];
            let got = self.stream.read(&mut chunk).await?;
            if got == 0 {
                return Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::UnexpectedEof,
                )));
            }
            self.buf.extend_from_slice(&chunk[..got]);
        }
    }
}

/// `call` bounded by `timeout`, as a timeout error once it runs out.
pub(crate) async fn within<T>(
    timeout: Duration,
    f: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(timeout.max(Duration::from_millis(1)), f)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// The error of a call that ran out of time.
pub(crate) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

/// Nesting deeper than this is refused (no reply of ours comes close).
const MAX_DEPTH: usize = 64;

/// The length of the first whole RESP2/RESP3 value at the start of `buf`,
/// `None` while more bytes are needed.
fn frame_len(buf: &[u8]) -> RedisResult<Option<usize>> {
    value_end(buf, 0, 0)
}

fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    buf.get(at..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| at + p)
}

fn value_end(buf: &[u8], at: usize, depth: usize) -> RedisResult<Option<usize>> {
    if depth > MAX_DEPTH {
        return Err(invalid("a reply nested too deep"));
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(eol) = line_end(buf, at + 1) else {
        return Ok(None);
    };
    let after = eol + 2;
    let count = || -> RedisResult<i64> {
        std::str::from_utf8(&buf[at + 1..eol])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid("a reply with a bad length"))
    };
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(after)),
        b'$' | b'!' | b'=' => match count()? {
            n if n < 0 => Ok(Some(after)),
            n => {
                let end = after.saturating_add(n as usize).saturating_add(2);
                Ok((buf.len() >= end).then_some(end))
            }
        },
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = count()?;
            let items = match kind {
                b'%' | b'|' => n.max(0) * 2,
                _ => n.max(0),
            };
            let mut end = after;
            for _ in 0..items {
                match value_end(buf, end, depth + 1)? {
                    Some(e) => end = e,
                    None => return Ok(None),
                }
            }
            // An attribute comes before the value it describes.
            if kind == b'|' {
                return value_end(buf, end, depth + 1);
            }
            Ok(Some(end))
        }
        _ => Err(invalid("a reply of an unknown type")),
    }
}

#[cfg(test)]
mod tests {
    use super::frame_len;

    #[test]
    fn whole_values_are_measured_and_partial_ones_wait() {
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR no\r\n",
            b":42\r\n",
            b"$-1\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"*2\r\n:1\r\n$3\r\nabc\r\n",
            b"*-1\r\n",
            b"*2\r\n*1\r\n+a\r\n*0\r\n",
            b"%1\r\n+k\r\n:1\r\n",
            b"|1\r\n+ttl\r\n:3\r\n:7\r\n",
            b"_\r\n",
        ];
        for &whole in cases {
            let mut buf = whole.to_vec();
            buf.extend_from_slice(b":9\r\n");
            assert_eq!(frame_len(&buf).unwrap(), Some(whole.len()), "{whole:?}");
            for cut in 0..whole.len() {
                assert_eq!(
                    frame_len(&whole[..cut]).unwrap(),
                    None,
                    "{whole:?} cut {cut}"
                );
            }
            let value = redis::parse_redis_value(&buf[..whole.len()]);
            assert!(value.is_ok(), "{whole:?}");
        }
    }

    #[test]
    fn bad_replies_are_errors() {
        assert!(frame_len(b"?x\r\n").is_err());
        assert!(frame_len(b"$x\r\n").is_err());
        let deep = "*1\r\n".repeat(100);
        assert!(frame_len(deep.as_bytes()).is_err());
    }
}
