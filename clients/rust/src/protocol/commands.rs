//! The commands the helpers send, their arguments and read timeouts, and
//! the keys of a lease (one, or several under one token).

use std::time::{Duration, Instant};

use crate::{Block, Error, Mode, Options};

/// A ttl is at least 1 ms ([`Error::InvalidTtl`] otherwise).
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), Error> {
    if ttl < Duration::from_millis(1) {
        return Err(Error::InvalidTtl(ttl));
    }
    Ok(())
}

/// `MINTTL`'s milliseconds for a minimum time left of `d`: rounded up, so
/// that the server never accepts less than was asked for.
pub(crate) fn min_ttl_millis(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

/// Whole milliseconds of `d`, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// The `LEASE.ACQUIRE` of one attempt, and how long to wait for its reply
/// (`None`: no read timeout). `wait_until`: the end of a `Block::For` wait.
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire_cmd(
    key: &str,
    owner: &str,
    ttl: Duration,
    mode: Mode,
    label: Option<&str>,
    block: Block,
    wait_until: Option<Instant>,
    opts: &Options,
) -> (redis::Cmd, Option<Duration>) {
    let mut cmd = redis::cmd("LEASE.ACQUIRE");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    match mode {
        Mode::Exclusive => {}
        Mode::Shared => {
            cmd.arg("SHARED");
        }
        Mode::Limit(n) => {
            cmd.arg("LIMIT").arg(n);
        }
    }
    label_arg(&mut cmd, label);
    let read = block_arg(&mut cmd, block, wait_until, opts);
    (cmd, read)
}

/// The `LEASE.MACQUIRE numkeys key [key ...] owner ttl-ms [LABEL text]
/// [BLOCK ms]` of one attempt, and its read timeout, as [`acquire_cmd`].
pub(crate) fn macquire_cmd(
    keys: &[String],
    owner: &str,
    ttl: Duration,
    label: Option<&str>,
    block: Block,
    wait_until: Option<Instant>,
    opts: &Options,
) -> (redis::Cmd, Option<Duration>) {
    let mut cmd = redis::cmd("LEASE.MACQUIRE");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(millis(ttl));
    label_arg(&mut cmd, label);
    let read = block_arg(&mut cmd, block, wait_until, opts);
    (cmd, read)
}

/// Appends `LABEL text` (before `BLOCK`, which [`waits`] finds last).
pub(crate) fn label_arg(cmd: &mut redis::Cmd, label: Option<&str>) {
    if let Some(label) = label {
        cmd.arg("LABEL").arg(label);
    }
}

/// Appends the `BLOCK` option of an acquire (last on the line) and returns
/// the read timeout of its reply (`None`: none).
fn block_arg(
    cmd: &mut redis::Cmd,
    block: Block,
    wait_until: Option<Instant>,
    opts: &Options,
) -> Option<Duration> {
    match (block, wait_until) {
        (Block::Forever, _) => {
            cmd.arg("BLOCK").arg(0);
            None
        }
        (Block::For(_), Some(end)) => {
            // What is left of the wait. Nothing left (a retry at the end):
            // ask once without BLOCK, never `BLOCK 0` (which waits forever).
            // Rounded up: a wait of 300 ms asked a few microseconds later
            // is still `BLOCK 300`, never less than what was asked.
            let left = end
                .saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000) as u64;
            if left > 0 {
                cmd.arg("BLOCK").arg(left);
                Some(Duration::from_millis(left) + opts.block_margin)
            } else {
                Some(opts.io_timeout)
            }
        }
        _ => Some(opts.io_timeout),
    }
}

/// The keys of one lease: one (`LEASE.ACQUIRE`), or several taken together
/// under one token (`LEASE.MACQUIRE`, design.md S10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Keys {
    One(String),
    Many(Vec<String>),
}

impl Keys {
    /// The keys of a multi-key lease: at least one, none twice
    /// ([`Error::InvalidKeys`] otherwise; nothing is sent).
    pub(crate) fn many<K: AsRef<str>>(keys: &[K]) -> Result<Keys, Error> {
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        if keys.is_empty() {
            return Err(Error::InvalidKeys("no key given".to_string()));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = keys.iter().find(|k| !seen.insert(k.as_str())) {
            return Err(Error::InvalidKeys(format!("{twice:?} is given twice")));
        }
        Ok(Keys::Many(keys))
    }

    /// On a cluster: every key in one slot (a multi-key lease lives on
    /// one node), [`Error::InvalidKeys`] otherwise, before anything is
    /// sent. The server's own check answers `CROSSSLOT`; this one does not
    /// depend on it.
    pub(crate) fn one_slot(&self) -> Result<(), Error> {
        use redis::cluster_routing::Slot;
        let keys = self.all();
        let slot = Slot::for_key(&keys[0]);
        match keys.iter().find(|k| Slot::for_key(k) != slot) {
            Some(other) => Err(Error::InvalidKeys(format!(
                "{:?} and {other:?} hash to different cluster slots (CROSSSLOT): \
                 give the keys one hash tag",
                keys[0]
            ))),
            None => Ok(()),
        }
    }

    /// Every key, in the order given.
    pub(crate) fn all(&self) -> &[String] {
        match self {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many(keys) => keys,
        }
    }

    /// The first key: the one of a single lease.
    pub(crate) fn first(&self) -> &str {
        &self.all()[0]
    }

    /// What a renewal or a release that acted on every key answers: 1, or
    /// the number of keys of a multi-key lease (0 for none).
    pub(crate) fn count(&self) -> i64 {
        self.all().len() as i64
    }

    /// The key a cluster client must route this lease's commands by, when
    /// it cannot find it itself: the redis crate routes an unknown command
    /// by its first argument, which for `LEASE.M*` is the key count. All
    /// keys of a multi-key lease share one slot, so its first key says
    /// where they all are. `None`: route as usual.
    pub(crate) fn route(&self) -> Option<&str> {
        match self {
            Keys::One(_) => None,
            Keys::Many(keys) => Some(&keys[0]),
        }
    }

    /// `LEASE.RENEW key owner ttl-ms`, or `LEASE.MRENEW numkeys key ...
    /// owner ttl-ms`.
    pub(crate) fn renew_cmd(&self, owner: &str, ttl: Duration) -> redis::Cmd {
        match self {
            Keys::One(key) => renew_cmd(key, owner, ttl),
            Keys::Many(keys) => {
                let mut cmd = redis::cmd("LEASE.MRENEW");
                cmd.arg(keys.len()).arg(keys).arg(owner).arg(millis(ttl));
                cmd
            }
        }
    }

    /// After a multi-key lease was found not all ours (a renewal refused,
    /// or `LEASE.MRELEASE` answered 0, which frees nothing): one
    /// `LEASE.RELEASE key owner` per key, so that the keys still ours are
    /// free at once instead of at their ttl (a key another owner holds
    /// answers 0 and is left alone). None for a single lease.
    pub(crate) fn leftover_cmds(&self, owner: &str) -> Vec<redis::Cmd> {
        match self {
            Keys::One(_) => Vec::new(),
            Keys::Many(keys) => keys.iter().map(|k| release_cmd(k, owner)).collect(),
        }
    }

    /// `LEASE.RELEASE key owner`, or `LEASE.MRELEASE numkeys key ... owner`.
    pub(crate) fn release_cmd(&self, owner: &str) -> redis::Cmd {
        match self {
            Keys::One(key) => release_cmd(key, owner),
            Keys::Many(keys) => {
                let mut cmd = redis::cmd("LEASE.MRELEASE");
                cmd.arg(keys.len()).arg(keys).arg(owner);
                cmd
            }
        }
    }
}

/// Does this `LEASE.ACQUIRE` (or `LEASE.MACQUIRE`) wait (`BLOCK`)? It then
/// needs a connection of its own: a blocked connection carries nothing else
/// meanwhile. `BLOCK ms` is always last, so a key named `BLOCK` does not
/// count. (Only the async client asks: the sync one gives every call a
/// connection of its own anyway.)
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
pub(crate) fn waits(cmd: &redis::Cmd) -> bool {
    let args: Vec<_> = cmd.args_iter().collect();
    args.len() >= 2 && matches!(args[args.len() - 2], redis::Arg::Simple(b) if b == b"BLOCK")
}

/// `LEASE.RENEW key owner ttl-ms`.
pub(crate) fn renew_cmd(key: &str, owner: &str, ttl: Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("LEASE.RENEW");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    cmd
}

/// `LEASE.RELEASE key owner`.
pub(crate) fn release_cmd(key: &str, owner: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("LEASE.RELEASE");
    cmd.arg(key).arg(owner);
    cmd
}
