//! Talking to a server: connections (RESP2, RESP3, and `RawConn` for the
//! exact bytes of a reply), running commands (`call`, `ok`, `err`), reading
//! replies (`int`, `text`, `field`, `strings`, ...) and `INFO`, and
//! `wait_until`, the one way tests wait for the server.

use std::time::{Duration, Instant};

use super::*;

impl Server {
    pub fn url(&self, resp3: bool) -> String {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        format!("redis://127.0.0.1:{}/{proto}", self.port)
    }

    pub(super) fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
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

    /// Writes `bytes` as they are, in one write (several commands: one
    /// pipeline the server reads at once).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.reader.get_mut().write_all(bytes).expect("raw write");
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

/// Like `call` with owned or borrowed arguments of any byte-like type.
pub fn call_args<A: AsRef<[u8]>>(
    con: &mut redis::Connection,
    args: &[A],
) -> redis::RedisResult<Value> {
    let refs: Vec<&[u8]> = args.iter().map(|a| a.as_ref()).collect();
    call(con, &refs)
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

/// Does the server have the command `name` (COMMAND INFO answers it)?
pub fn has_command(c: &mut redis::Connection, name: &str) -> bool {
    !matches!(&ok(c, &["COMMAND", "INFO", name]), Value::Array(a) if a.first() == Some(&Value::Nil))
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

/// Does `key` exist (EXISTS)?
pub fn exists(c: &mut redis::Connection, key: &str) -> bool {
    int(&ok(c, &["EXISTS", key])) == 1
}

/// WATCH `key` on `a`, run `between`, then MULTI / SET side 1 / EXEC on
/// `a`: true when EXEC ran the transaction (the watched key was not
/// touched), false when it answered null.
pub fn watch_survives(a: &mut redis::Connection, key: &str, between: impl FnOnce()) -> bool {
    assert_eq!(text(&ok(a, &["WATCH", key])), "OK");
    between();
    assert_eq!(text(&ok(a, &["MULTI"])), "OK");
    assert_eq!(text(&ok(a, &["SET", "side", "1"])), "QUEUED");
    match ok(a, &["EXEC"]) {
        Value::Nil => false,
        Value::Array(replies) => {
            assert_eq!(replies.len(), 1, "{replies:?}");
            true
        }
        other => panic!("EXEC answered {other:?}"),
    }
}
