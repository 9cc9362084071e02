//! The acquire plan: what each attempt sends, whether a failed one is
//! tried again, and a new lease's deadline.

use std::time::{Duration, Instant};

use super::*;
use crate::{Block, Error, Loss, Mode, Options, new_owner};

/// One acquisition: its keys, its owner, what is left of its wait, and its
/// retries. The sync and async `acquire` loops ask it what to send and
/// whether to try again.
pub(crate) struct Acquire<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) owner: String,
    ttl: Duration,
    mode: Mode,
    label: Option<&'a str>,
    block: Block,
    wait_until: Option<Instant>,
    opts: &'a Options,
    lost: u32,
}

impl<'a> Acquire<'a> {
    /// Checks the ttl, that a cluster's keys share one slot
    /// (`on_cluster`), and that the client holds none of the keys already
    /// (`held`); a fresh owner; the wait starts now. A multi-key lease is
    /// exclusive whatever `mode` says (`LEASE.MACQUIRE` has no other mode).
    /// `label`: the `LABEL` of every attempt, the same on each retry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        keys: &'a Keys,
        ttl: Duration,
        mode: Mode,
        label: Option<&'a str>,
        block: Block,
        opts: &'a Options,
        on_cluster: bool,
        held: &Held,
    ) -> Result<Acquire<'a>, Error> {
        check_ttl(ttl)?;
        if on_cluster {
            keys.one_slot()?;
        }
        for key in keys.all() {
            held.check(key)?;
        }
        let block = normalize(block);
        let wait_until = match block {
            Block::For(d) => Some(Instant::now() + d),
            _ => None,
        };
        Ok(Acquire {
            keys,
            owner: new_owner(),
            ttl,
            mode,
            label,
            block,
            wait_until,
            opts,
            lost: 0,
        })
    }

    /// The command of the next attempt and its read timeout.
    pub(crate) fn attempt(&self) -> (redis::Cmd, Option<Duration>) {
        match self.keys {
            Keys::One(key) => acquire_cmd(
                key,
                &self.owner,
                self.ttl,
                self.mode,
                self.label,
                self.block,
                self.wait_until,
                self.opts,
            ),
            Keys::Many(keys) => macquire_cmd(
                keys,
                &self.owner,
                self.ttl,
                self.label,
                self.block,
                self.wait_until,
                self.opts,
            ),
        }
    }

    /// The attempt failed with `e`: the pause before the next one (a lost
    /// reply with retries left, sent again with the same owner, a little
    /// later each time), or `None`: give up with `e`.
    pub(crate) fn retry(&mut self, e: &redis::RedisError) -> Option<Duration> {
        if !lost_reply(e) || self.lost >= self.opts.retries {
            return None;
        }
        self.lost += 1;
        Some(Duration::from_millis(20 * self.lost as u64))
    }
}

/// Does a new lease renew at once? After a blocking acquire granted long
/// after it was sent, the deadline counted from the send is near or past.
pub(crate) fn renews_first(sent: Instant, ttl: Duration) -> bool {
    sent.elapsed() >= renew_every(ttl)
}

/// A new lease's deadline, and its loss if the renewal at once (sent at
/// `renewed`, answering `reply`) said it is not ours: `ttl` from the
/// acquire's send, or from that renewal's when it renewed every key
/// (answered `keys`: 1, or the number of keys of a multi-key lease). A
/// renewal with no answer changes nothing.
pub(crate) fn start(
    sent: Instant,
    ttl: Duration,
    keys: i64,
    renewal: Option<(Instant, &redis::RedisResult<i64>)>,
) -> (Instant, Option<Loss>) {
    match renewal {
        Some((renewed, Ok(n))) if *n == keys => (renewed + ttl, None),
        Some((_, Ok(_))) => (sent + ttl, Some(Loss::Refused)),
        _ => (sent + ttl, None),
    }
}

/// `Block::For` shorter than 1 ms is `NoWait`.
pub(crate) fn normalize(block: Block) -> Block {
    match block {
        Block::For(d) if d.as_millis() == 0 => Block::NoWait,
        b => b,
    }
}
