//! What a client asks for: how long an acquire waits ([`Block`]), how many
//! may hold a lease at once ([`Mode`]), and the client's timeouts and
//! retries ([`Options`]).

use std::time::Duration;

/// How long [`LeaseClient::acquire`](crate::LeaseClient::acquire) waits
/// when another owner holds the lease
/// (`LEASE.ACQUIRE ... BLOCK timeout-ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// Do not wait: `None` at once when the lease is held.
    NoWait,
    /// Wait up to this long (whole milliseconds; under 1 ms is `NoWait`).
    For(Duration),
    /// Wait until the lease is ours (`BLOCK 0`). The acquiring connection
    /// then has no read timeout.
    Forever,
}

/// What an acquire asks for (`LEASE.ACQUIRE ... [LIMIT n | SHARED]`); set
/// it with `LeaseClient::with_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// One holder at a time (a lock). The default.
    #[default]
    Exclusive,
    /// Any number of readers at once, no writer meanwhile (a read/write
    /// lock's read side; a writer is an exclusive acquire). A reader's token
    /// fences reads only: a fenced write is
    /// [`Error::SharedWrite`](crate::Error::SharedWrite).
    Shared,
    /// Up to `n` holders at once (a semaphore whose permits expire), each
    /// with its own token.
    Limit(u32),
}

/// The label of an acquire (`LEASE.ACQUIRE ... LABEL text`, design.md
/// S11): a public description of the holder that `LEASE.INFO` and
/// `LEASE.WAITERS` show (never used for any decision, and not a
/// credential). Set it with `LeaseClient::with_label`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Label {
    /// This process's default label, `<host> pid <pid> <program>`
    /// ([`default_label`](crate::default_label), computed once per process).
    /// The default.
    #[default]
    Default,
    /// No label.
    None,
    /// This text, cut to 256 bytes on a character boundary (an empty text
    /// is no label).
    Text(String),
}

impl Label {
    /// [`Label::Text`] of `text`.
    pub fn text(text: impl Into<String>) -> Label {
        Label::Text(text.into())
    }
}

/// Timeouts and retries. [`Options::default`] suits most uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// Timeout to open a connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Read timeout of the calls that do not block (renew, release, fence,
    /// an acquire without `BLOCK`). Default 5 s. A renewal also times out at
    /// the lease's deadline, whichever comes first.
    pub io_timeout: Duration,
    /// How much longer than its `BLOCK` timeout an acquire waits for its
    /// reply before it counts the reply as lost. Default 2 s.
    pub block_margin: Duration,
    /// How many times a lost `LEASE.ACQUIRE` (or `LEASE.RELEASE`) reply is
    /// retried, on a new connection, with the same owner. Default 3.
    pub retries: u32,
    /// Run the renewing watchdog. Default true. Without it the lease still
    /// signals the loss at its deadline; renew it yourself.
    pub watchdog: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(5),
            block_margin: Duration::from_secs(2),
            retries: 3,
            watchdog: true,
        }
    }
}
