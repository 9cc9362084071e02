//! The bench's one RESP client (RESP2, what a server speaks before HELLO).
//!
//! A [`Conn`] is one blocking TCP connection to 127.0.0.1. [`Conn::call`]
//! sends one command and reads its reply; [`Conn::send`] and
//! [`Conn::read`] do the two halves apart, which is how a crowd of clients
//! is driven from one thread (B3: send a blocking command on each, read the
//! replies later) and how a pipeline works ([`Conn::pipeline`]). The 10,000
//! non-blocking sockets of B4 (crate::crowd) write [`encode`]d commands too.

use std::error::Error;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Every fallible function of the bench returns this (Send, so that a
/// client thread can hand its error back).
pub type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// One command, as RESP bytes (an array of bulk strings).
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut buf = format!("*{}\r\n", args.len());
    for a in args {
        buf.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    buf.into_bytes()
}

/// `name` followed by `args`, as the arguments of one command.
pub fn command_on<'a>(name: &'a str, args: &'a [String]) -> Vec<&'a str> {
    std::iter::once(name)
        .chain(args.iter().map(String::as_str))
        .collect()
}

/// One reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`, `+PONG`, ...
    Status(String),
    /// `-ERR ...`: [`Conn::call`] turns it into an `Err`.
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// `$-1`, `*-1` (or RESP3 `_`).
    Nil,
    Array(Vec<Reply>),
}

impl Reply {
    /// An integer reply, or a bulk string holding one.
    pub fn int(&self) -> Res<i64> {
        match self {
            Reply::Int(n) => Ok(*n),
            Reply::Bulk(b) => Ok(std::str::from_utf8(b)?.parse()?),
            other => Err(format!("expected an integer, got {other:?}").into()),
        }
    }

    /// An integer, or None for a nil reply.
    pub fn opt_int(&self) -> Res<Option<i64>> {
        match self {
            Reply::Nil => Ok(None),
            other => other.int().map(Some),
        }
    }

    /// A status or bulk string reply, as text.
    pub fn text(&self) -> Res<String> {
        match self {
            Reply::Status(s) => Ok(s.clone()),
            Reply::Bulk(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            other => Err(format!("expected a string, got {other:?}").into()),
        }
    }

    pub fn is_nil(&self) -> bool {
        *self == Reply::Nil
    }

    /// The elements of an array reply.
    pub fn into_array(self) -> Res<Vec<Reply>> {
        match self {
            Reply::Array(a) => Ok(a),
            other => Err(format!("expected an array, got {other:?}").into()),
        }
    }

    /// Err for an error reply, else the reply.
    fn ok_or_error(self, args: &[&str]) -> Res<Reply> {
        match self {
            Reply::Error(e) => Err(format!("{}: {e}", args.first().unwrap_or(&"")).into()),
            r => Ok(r),
        }
    }
}

/// One blocking connection.
pub struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(port: u16) -> Res<Conn> {
        let writer = TcpStream::connect(("127.0.0.1", port))?;
        writer.set_nodelay(true)?;
        let reader = BufReader::new(writer.try_clone()?);
        Ok(Conn { writer, reader })
    }

    /// Bounds every later read (None: wait forever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Res<()> {
        Ok(self.writer.set_read_timeout(timeout)?)
    }

    /// Writes one command without reading its reply.
    pub fn send(&mut self, args: &[&str]) -> Res<()> {
        Ok(self.writer.write_all(&encode(args))?)
    }

    /// Reads the next reply (an error reply is a value here).
    pub fn read(&mut self) -> Res<Reply> {
        let line = self.read_line()?;
        let kind = line.chars().next().unwrap_or(' ');
        let rest = &line[kind.len_utf8().min(line.len())..];
        match kind {
            '+' => Ok(Reply::Status(rest.into())),
            '-' => Ok(Reply::Error(rest.into())),
            ':' => Ok(Reply::Int(rest.parse()?)),
            '_' => Ok(Reply::Nil),
            '$' => match rest.parse::<i64>()? {
                n if n < 0 => Ok(Reply::Nil),
                n => self.read_bulk(n as usize),
            },
            '*' => match rest.parse::<i64>()? {
                n if n < 0 => Ok(Reply::Nil),
                n => (0..n)
                    .map(|_| self.read())
                    .collect::<Res<_>>()
                    .map(Reply::Array),
            },
            _ => Err(format!("not a RESP reply: {line:?}").into()),
        }
    }

    /// One command and its reply; an error reply is an `Err`.
    pub fn call(&mut self, args: &[&str]) -> Res<Reply> {
        self.send(args)?;
        self.read()?.ok_or_error(args)
    }

    /// Sends every command, then reads every reply; the first error reply
    /// (after all are read) is an `Err`.
    pub fn pipeline(&mut self, commands: &[Vec<&str>]) -> Res<Vec<Reply>> {
        let mut buf = Vec::new();
        for c in commands {
            buf.extend(encode(c));
        }
        self.writer.write_all(&buf)?;
        let replies: Vec<Reply> = commands.iter().map(|_| self.read()).collect::<Res<_>>()?;
        for (r, c) in replies.iter().zip(commands) {
            r.clone().ok_or_error(c)?;
        }
        Ok(replies)
    }

    /// Subscribes this connection to `channel`; read the messages with
    /// [`Conn::read_message`].
    pub fn subscribe(&mut self, channel: &str) -> Res<()> {
        self.send(&["SUBSCRIBE", channel])?;
        match self.read()?.into_array()?.first() {
            Some(Reply::Bulk(kind)) if kind == b"subscribe" => Ok(()),
            other => Err(format!("SUBSCRIBE {channel} answered {other:?}").into()),
        }
    }

    /// The payload of the next pub/sub message.
    pub fn read_message(&mut self) -> Res<Vec<u8>> {
        loop {
            let mut parts = self.read()?.into_array()?.into_iter();
            if let (Some(Reply::Bulk(kind)), Some(_channel), Some(Reply::Bulk(payload))) =
                (parts.next(), parts.next(), parts.next())
                && kind == b"message"
            {
                return Ok(payload);
            }
        }
    }

    fn read_line(&mut self) -> Res<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err("connection closed".into());
        }
        let trimmed = line.trim_end_matches(['\r', '\n']).len();
        line.truncate(trimmed);
        Ok(line)
    }

    fn read_bulk(&mut self, len: usize) -> Res<Reply> {
        let mut data = vec![0; len + 2];
        self.reader.read_exact(&mut data)?;
        data.truncate(len);
        Ok(Reply::Bulk(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_an_array_of_bulk_strings() {
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn converts_replies() {
        assert_eq!(Reply::Bulk(b"42".to_vec()).int().unwrap(), 42);
        assert_eq!(Reply::Nil.opt_int().unwrap(), None);
        assert!(Reply::Nil.int().is_err());
        assert_eq!(Reply::Status("OK".into()).text().unwrap(), "OK");
    }
}
