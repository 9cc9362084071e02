//! Labels (`LABEL text`, design.md S11): this process's default label, the
//! text a [`Label`] sends, and the records of `LEASE.WAITERS`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::{Error, Label};

/// The longest label the server takes, in bytes.
pub(crate) const MAX_LABEL: usize = 256;

/// `s` cut to [`MAX_LABEL`] bytes on a character boundary (a character that
/// does not fit is dropped whole).
pub(crate) fn truncate(s: &str) -> &str {
    if s.len() <= MAX_LABEL {
        return s;
    }
    let mut cut = MAX_LABEL;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// The host's name (`gethostname`), `unknown-host` when it cannot be read.
fn host_name() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes at
        // most that many bytes.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            if end > 0 {
                return String::from_utf8_lossy(&buf[..end]).into_owned();
            }
        }
    }
    #[cfg(not(unix))]
    if let Ok(name) = std::env::var("COMPUTERNAME") {
        return name;
    }
    "unknown-host".to_string()
}

/// The running program's name: the executable's file name.
fn program_name() -> String {
    let exe = std::env::current_exe()
        .ok()
        .or_else(|| std::env::args_os().next().map(Into::into));
    exe.as_deref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "rust".to_string())
}

/// This process's default label, `<host> pid <pid> <program>` (e.g.
/// `web-3 pid 4242 billing-worker`), at most 256 bytes. Computed once per
/// process, at the first call.
pub fn default_label() -> &'static str {
    static DEFAULT: OnceLock<String> = OnceLock::new();
    DEFAULT.get_or_init(|| {
        let label = format!(
            "{} pid {} {}",
            host_name(),
            std::process::id(),
            program_name()
        );
        truncate(&label).to_string()
    })
}

/// The text `label` sends (`None`: no `LABEL`): [`Label::Default`] is
/// `inherited` when given (a client's label), else [`default_label`]. A
/// text is cut to 256 bytes; an empty one sends none.
pub(crate) fn resolve(label: &Label, inherited: Option<&Option<Arc<str>>>) -> Option<Arc<str>> {
    match label {
        Label::Default => match inherited {
            Some(l) => l.clone(),
            None => Some(Arc::from(default_label())),
        },
        Label::None => None,
        Label::Text(t) => {
            let t = truncate(t);
            (!t.is_empty()).then(|| Arc::from(t))
        }
    }
}

/// One client waiting for a key (`LEASE.WAITERS`), oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// Its client id (`CLIENT KILL ID <id>` ends its wait).
    pub client: u64,
    /// Its label (bytes that are not UTF-8 are replaced), or `None`.
    pub label: Option<String>,
    /// What it waits for: `exclusive`, `shared`, `limit`, or `keys` for a
    /// multi-key waiter.
    pub mode: String,
    /// `n` of a `LIMIT n` waiter, else 0.
    pub limit: u32,
    /// How many keys it waits for (1, or a multi-key waiter's).
    pub keys: u32,
    /// How long it has waited.
    pub waited: Duration,
    /// The time left until its `BLOCK` timeout; `None` when it waits
    /// forever (`BLOCK 0`).
    pub timeout: Option<Duration>,
}

/// `LEASE.WAITERS key [COUNT n]`; `count` must be 1 to 1000
/// ([`Error::InvalidCount`] otherwise, nothing sent).
pub(crate) fn waiters_cmd(key: &str, count: Option<u32>) -> Result<redis::Cmd, Error> {
    let mut cmd = redis::cmd("LEASE.WAITERS");
    cmd.arg(key);
    if let Some(n) = count {
        if !(1..=1000).contains(&n) {
            return Err(Error::InvalidCount(n));
        }
        cmd.arg("COUNT").arg(n);
    }
    Ok(cmd)
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn int(v: Option<&redis::Value>) -> Option<i64> {
    match v? {
        redis::Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn unexpected(what: &str) -> Error {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected LEASE.WAITERS reply",
        what.to_string(),
    ))
    .into()
}

/// The records of a `LEASE.WAITERS` reply: RESP3 maps or RESP2 flat
/// arrays of field, value.
pub(crate) fn parse_waiters(reply: &redis::Value) -> Result<Vec<Waiter>, Error> {
    let entries = match reply {
        redis::Value::Array(a) | redis::Value::Set(a) => a.as_slice(),
        redis::Value::Nil => &[],
        other => return Err(unexpected(&format!("{other:?}"))),
    };
    entries
        .iter()
        .map(|entry| {
            let pairs: Vec<(String, &redis::Value)> = match entry {
                redis::Value::Map(m) => m.iter().filter_map(|(k, v)| Some((text(k)?, v))).collect(),
                redis::Value::Array(a) => a
                    .chunks(2)
                    .filter_map(|kv| Some((text(&kv[0])?, kv.get(1)?)))
                    .collect(),
                other => return Err(unexpected(&format!("{other:?}"))),
            };
            let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
            let field = |name: &str| int(get(name)).ok_or_else(|| unexpected(name));
            let timeout = field("timeout")?;
            Ok(Waiter {
                client: field("client")? as u64,
                label: get("label").and_then(text),
                mode: get("mode")
                    .and_then(text)
                    .ok_or_else(|| unexpected("mode"))?,
                limit: field("limit")? as u32,
                keys: field("keys")? as u32,
                waited: Duration::from_millis(field("waited")?.max(0) as u64),
                timeout: (timeout >= 0).then(|| Duration::from_millis(timeout as u64)),
            })
        })
        .collect()
}
