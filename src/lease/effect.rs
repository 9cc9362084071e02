//! The effects: the module's replication language (effect version 4, see
//! `versions.rs`). Every change to a lease key is one of these, with the
//! exact tokens and absolute deadlines (design.md S3): the
//! master decides, then commits the effect to its own key, to the
//! replication stream and to the AOF; a replica and an AOF replay apply the
//! same effect, never a result of their own clock.
//!
//! One type knows all of it: the command each effect is written as and its
//! arguments (`command`, `args`), how it is read back from those arguments
//! (`parse`), and what it does to the record a key holds (`apply`). The AOF
//! rewrite writes a record as the effects that rebuild it (`of_record`).

use std::ffi::CStr;

use super::args::{check_label, check_owner, parse_hold_mode, parse_token, parse_unix_ms};
use super::error::LeaseError;
use super::exclusive::Lease;
use super::holders::{Holder, Holders};
use super::limits::since_of_token;
use super::mode::HoldersMode;
use super::record::{Record, RecordMut, RecordRef};

/// A change to one lease key, as it travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect<'a> {
    /// `LEASE.APPLY key owner token deadline-ms [SINCE ms] [LABEL text]`:
    /// an exclusive lease's full state (an acquire, a re-acquire, a
    /// renewal, a hand-off). See `Facts` for `SINCE` and `LABEL`.
    Apply {
        owner: &'a [u8],
        token: u64,
        deadline_ms: i64,
        facts: Facts<'a>,
    },
    /// `LEASE.HOLD key owner token deadline-ms LIMIT n|SHARED [SINCE ms]
    /// [LABEL text]`: one holder of a counting or shared lease, added or
    /// updated.
    Hold {
        mode: HoldersMode,
        owner: &'a [u8],
        token: u64,
        deadline_ms: i64,
        facts: Facts<'a>,
    },
    /// `LEASE.DROP key owner`: one holder leaves (the key with the last).
    Drop { owner: &'a [u8] },
    /// `LEASE.PRUNE key deadline-ms token`: the ended holders up to and
    /// including this one, in deadline (then token) order, leave.
    Prune { deadline_ms: i64, token: u64 },
    /// `LEASE.RELEASE key owner`: an exclusive lease released by its
    /// holder; applied by owner alone (the master decided).
    Release { owner: &'a [u8] },
    /// `DEL key`: a lease nobody holds any more goes (a revoked hand-off,
    /// a record whose key outlived it).
    Delete,
    /// `PEXPIREAT key at-ms`: a holders record's key expiry set back to its
    /// latest deadline.
    ExpireAt { at_ms: i64 },
    /// `LEASE.GUARD key`: the key guards its hash tag (design.md S12): a
    /// free key becomes a free guard, an exclusive lease's key keeps its
    /// holding; either way the key has no expiry from then on.
    Guard,
    /// `LEASE.UNGUARD key`: the key stops guarding; a free guard goes, a
    /// held one expires with its lease again.
    Unguard,
}

/// What a holding shows of itself (design.md S11): when it began, and its
/// label. On the wire `SINCE ms` is written only when it differs from
/// what the token tells (`limits::since_of_token`), and `LABEL text` only
/// when the holding gets a label: applied without one, a holding keeps
/// the label it has (the same owner with the same start: a renewal, a
/// retry), and a new holding has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts<'a> {
    pub since_ms: i64,
    pub label: Option<&'a [u8]>,
}

impl<'a> Facts<'a> {
    /// A holding that began at `since_ms`, labelled `label` (or keeping
    /// its label).
    #[inline(always)]
    pub fn new(since_ms: i64, label: Option<&'a [u8]>) -> Self {
        Facts { since_ms, label }
    }

    /// A holding that began when `token` says, keeping its label (tests).
    #[cfg(test)]
    pub fn plain(token: u64) -> Self {
        Facts::new(since_of_token(token), None)
    }
}

/// The commands effects are written as, in `Effect` order (C strings: the
/// server takes them as they are).
pub const APPLY: &CStr = c"LEASE.APPLY";
pub const HOLD: &CStr = c"LEASE.HOLD";
pub const DROP: &CStr = c"LEASE.DROP";
pub const PRUNE: &CStr = c"LEASE.PRUNE";
pub const RELEASE: &CStr = c"LEASE.RELEASE";
pub const DELETE: &CStr = c"DEL";
pub const EXPIRE_AT: &CStr = c"PEXPIREAT";
pub const GUARD: &CStr = c"LEASE.GUARD";
pub const UNGUARD: &CStr = c"LEASE.UNGUARD";

/// The key-less effects: what a master announces after a fork and when a
/// replica comes online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    /// `LEASE.CLOCK last`: raises the token clock (an AOF rewritten without
    /// the RDB preamble keeps no aux data).
    Clock { last: u64 },
    /// `LEASE.VERSION effects records`: the versions the writer speaks.
    Version { effects: u32, records: u32 },
}

pub const CLOCK: &CStr = c"LEASE.CLOCK";
pub const VERSION: &CStr = c"LEASE.VERSION";

/// Room for the decimal numbers of one effect's arguments.
#[derive(Default)]
pub struct Digits([[u8; 20]; 4]);

/// The arguments of one effect after its key, at most nine.
pub struct ArgList<'a> {
    args: [&'a [u8]; 9],
    len: usize,
}

impl<'a> ArgList<'a> {
    #[inline(always)]
    fn new<const N: usize>(list: [&'a [u8]; N]) -> Self {
        let mut args: [&'a [u8]; 9] = [&[]; 9];
        args[..N].copy_from_slice(&list);
        ArgList { args, len: N }
    }

    /// `SINCE ms` when the token does not tell it, `LABEL text` when given.
    #[inline(always)]
    fn facts(mut self, token: u64, facts: &Facts<'a>, digits: &'a mut [u8; 20]) -> Self {
        if facts.since_ms != since_of_token(token) {
            self.push(b"SINCE");
            self.push(decimal(facts.since_ms, digits));
        }
        if let Some(label) = facts.label {
            self.push(b"LABEL");
            self.push(label);
        }
        self
    }

    fn push(&mut self, arg: &'a [u8]) {
        self.args[self.len] = arg;
        self.len += 1;
    }

    pub fn as_slice(&self) -> &[&'a [u8]] {
        &self.args[..self.len]
    }
}

/// What applying an effect leaves the binding to do on the key (it keeps
/// the record as a value the server owns: storing or deleting one is a
/// server call).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Store this record as the key's value (replacing what is there).
    pub store: Option<Record>,
    /// Delete the key.
    pub delete: bool,
    /// Set the key's expiry to this absolute unix time.
    pub expire_at: Option<i64>,
    /// Remove the key's expiry (a guard's key has none).
    pub persist: bool,
    /// Did the key change (to signal it as modified)?
    pub changed: bool,
    /// A guard came (`Some(true)`: the key guards its hash tag from now
    /// on) or went (`Some(false)`): the binding's set of guards follows
    /// (design.md S12). A guard key that leaves the keyspace otherwise (a
    /// `DEL`) is seen by the type's unlink callback instead.
    pub guard: Option<bool>,
}

/// What a key holds, for an effect to apply to.
pub enum Stored<'r> {
    Nothing,
    /// A value of another type.
    Other,
    Record(RecordMut<'r>),
}

impl<'a> Effect<'a> {
    /// The command it is written as.
    #[inline]
    pub fn command(&self) -> &'static CStr {
        match self {
            Effect::Apply { .. } => APPLY,
            Effect::Hold { .. } => HOLD,
            Effect::Drop { .. } => DROP,
            Effect::Prune { .. } => PRUNE,
            Effect::Release { .. } => RELEASE,
            Effect::Delete => DELETE,
            Effect::ExpireAt { .. } => EXPIRE_AT,
            Effect::Guard => GUARD,
            Effect::Unguard => UNGUARD,
        }
    }

    /// The owner it names, if any (the binding passes a client's own
    /// argument instead of a copy when these are its bytes).
    pub fn owner(&self) -> Option<&'a [u8]> {
        match *self {
            Effect::Apply { owner, .. }
            | Effect::Hold { owner, .. }
            | Effect::Drop { owner }
            | Effect::Release { owner } => Some(owner),
            _ => None,
        }
    }

    /// The label it gives, if any.
    pub fn label(&self) -> Option<&'a [u8]> {
        match *self {
            Effect::Apply { facts, .. } | Effect::Hold { facts, .. } => facts.label,
            _ => None,
        }
    }

    /// The same effect naming `owner` and giving `label` instead (where it
    /// names an owner).
    pub fn with_bytes<'b>(&self, owner: &'b [u8], label: Option<&'b [u8]>) -> Effect<'b> {
        match *self {
            Effect::Apply {
                token,
                deadline_ms,
                facts,
                ..
            } => Effect::Apply {
                owner,
                token,
                deadline_ms,
                facts: Facts::new(facts.since_ms, label),
            },
            Effect::Hold {
                mode,
                token,
                deadline_ms,
                facts,
                ..
            } => Effect::Hold {
                mode,
                owner,
                token,
                deadline_ms,
                facts: Facts::new(facts.since_ms, label),
            },
            Effect::Drop { .. } => Effect::Drop { owner },
            Effect::Release { .. } => Effect::Release { owner },
            Effect::Prune { deadline_ms, token } => Effect::Prune { deadline_ms, token },
            Effect::Delete => Effect::Delete,
            Effect::ExpireAt { at_ms } => Effect::ExpireAt { at_ms },
            Effect::Guard => Effect::Guard,
            Effect::Unguard => Effect::Unguard,
        }
    }

    /// Its arguments after the key, numbers in decimal (written into
    /// `digits`).
    #[inline(always)]
    pub fn args<'s>(&'s self, digits: &'s mut Digits) -> ArgList<'s> {
        let [a, b, c, e] = &mut digits.0;
        match self {
            Effect::Apply {
                owner,
                token,
                deadline_ms,
                facts,
            } => ArgList::new([owner, decimal(*token as i64, a), decimal(*deadline_ms, b)])
                .facts(*token, facts, e),
            Effect::Hold {
                mode,
                owner,
                token,
                deadline_ms,
                facts,
            } => {
                let (t, d) = (decimal(*token as i64, a), decimal(*deadline_ms, b));
                match mode {
                    HoldersMode::Limit(n) => {
                        ArgList::new([owner, t, d, b"LIMIT", decimal(*n as i64, c)])
                    }
                    HoldersMode::Shared => ArgList::new([owner, t, d, b"SHARED"]),
                }
                .facts(*token, facts, e)
            }
            Effect::Drop { owner } | Effect::Release { owner } => ArgList::new([owner]),
            Effect::Prune { deadline_ms, token } => {
                ArgList::new([decimal(*deadline_ms, a), decimal(*token as i64, b)])
            }
            Effect::Delete | Effect::Guard | Effect::Unguard => ArgList::new([]),
            Effect::ExpireAt { at_ms } => ArgList::new([decimal(*at_ms, a)]),
        }
    }

    /// Reads the lease effect `command` from its arguments after the key
    /// (the replica's and the AOF replay's side of `args`). The commands
    /// the server runs itself (`DEL`, `PEXPIREAT`) are not read here.
    pub fn parse(command: &CStr, args: &[&'a [u8]]) -> Result<Effect<'a>, LeaseError> {
        let arity = |n: usize, name: &'static str| {
            if args.len() == n {
                Ok(())
            } else {
                Err(LeaseError::Arity(name))
            }
        };
        Ok(match command {
            c if c == APPLY => {
                if args.len() < 3 {
                    return Err(LeaseError::Arity("lease.apply"));
                }
                let token = parse_token(args[1])?;
                Effect::Apply {
                    owner: check_owner(args[0])?,
                    token,
                    deadline_ms: parse_unix_ms(args[2], "deadline-ms")?,
                    facts: parse_facts(token, &args[3..], "lease.apply")?,
                }
            }
            c if c == HOLD => {
                if args.len() < 4 {
                    return Err(LeaseError::Arity("lease.hold"));
                }
                let n = if args[3].eq_ignore_ascii_case(b"LIMIT") {
                    5
                } else {
                    4
                };
                let token = parse_token(args[1])?;
                Effect::Hold {
                    owner: check_owner(args[0])?,
                    token,
                    deadline_ms: parse_unix_ms(args[2], "deadline-ms")?,
                    mode: parse_hold_mode(&args[3..n.min(args.len())])?,
                    facts: parse_facts(token, &args[n.min(args.len())..], "lease.hold")?,
                }
            }
            c if c == DROP => {
                arity(1, "lease.drop")?;
                Effect::Drop {
                    owner: check_owner(args[0])?,
                }
            }
            c if c == PRUNE => {
                arity(2, "lease.prune")?;
                Effect::Prune {
                    deadline_ms: parse_unix_ms(args[0], "deadline-ms")?,
                    token: parse_token(args[1])?,
                }
            }
            c if c == RELEASE => {
                arity(1, "lease.release")?;
                Effect::Release {
                    owner: check_owner(args[0])?,
                }
            }
            c if c == GUARD => {
                arity(0, "lease.guard")?;
                Effect::Guard
            }
            c if c == UNGUARD => {
                arity(0, "lease.unguard")?;
                Effect::Unguard
            }
            _ => return Err(LeaseError::Internal(format!("no effect {command:?}"))),
        })
    }

    /// What the effect does to what the key holds: the record is changed in
    /// place where it can be, and the rest (a record to store, a delete, an
    /// expiry) is left to the caller in the `Change`.
    #[inline(always)]
    pub fn apply(&self, stored: Stored<'_>) -> Change {
        // A guard's key keeps guarding whatever happens to its holdings
        // (design.md S12): a new holding is guarded too, a holding that
        // leaves leaves a free guard with its token, and the key never
        // expires.
        let guarding = match &stored {
            Stored::Record(RecordMut::Exclusive(l)) if l.is_guard() => Some(l.token),
            _ => None,
        };
        let mut change = self.apply_unguarded(stored);
        if let Some(last) = guarding
            && !matches!(self, Effect::Unguard)
        {
            match &mut change.store {
                Some(Record::Exclusive(l)) => l.set_guard(true),
                // A holders record in its place (never sent by a master:
                // it refuses to guard one) ends the guard.
                Some(Record::Holders(_)) => {
                    change.guard = Some(false);
                    return change;
                }
                None if change.delete && !matches!(self, Effect::Delete) => {
                    change.delete = false;
                    change.store = Some(Record::Exclusive(Lease::free_guard(last)));
                }
                None => {}
            }
            if !change.delete {
                change.expire_at = None;
                // A guard asked of a guard changes nothing but takes away
                // an expiry it was restored with (`ops::align`).
                change.persist = change.changed || matches!(self, Effect::Guard);
            }
        }
        change
    }

    #[inline(always)]
    fn apply_unguarded(&self, stored: Stored<'_>) -> Change {
        let mut change = Change::default();
        match *self {
            Effect::Apply {
                owner,
                token,
                deadline_ms,
                facts,
            } => {
                match stored {
                    // Its holding, keeping its label or given the one it
                    // has: changed in place (one allocation kept, no
                    // unlink).
                    Stored::Record(RecordMut::Exclusive(l))
                        if l.is_held_by(owner)
                            && l.since_ms() == facts.since_ms
                            && l.keeps_since_with(token)
                            && (facts.label.is_none() || facts.label == l.label()) =>
                    {
                        l.token = token;
                        l.deadline_ms = deadline_ms;
                    }
                    // Any other value (another type, a holders record, another
                    // holding, a new label) is replaced: the master's state
                    // wins.
                    other => {
                        let label = match &other {
                            Stored::Record(RecordMut::Exclusive(l))
                                if facts.label.is_none()
                                    && l.is_held_by(owner)
                                    && l.since_ms() == facts.since_ms =>
                            {
                                l.label()
                            }
                            _ => facts.label,
                        };
                        change.delete = matches!(other, Stored::Other);
                        change.store = Some(Record::Exclusive(Lease::new(
                            owner,
                            token,
                            deadline_ms,
                            facts.since_ms,
                            label,
                        )));
                    }
                }
                change.expire_at = Some(deadline_ms);
                change.changed = true;
            }
            Effect::Hold {
                mode,
                owner,
                token,
                deadline_ms,
                facts,
            } => {
                let holder = |kept: Option<Box<[u8]>>| Holder {
                    owner: owner.into(),
                    token,
                    deadline_ms,
                    since_ms: facts.since_ms,
                    label: facts.label.map(Into::into).or(kept),
                };
                match stored {
                    // A holder's renewal: its deadline moves in place.
                    Stored::Record(RecordMut::Holders(m))
                        if m.mode() == mode
                            && m.holder(owner).is_some_and(|h| {
                                h.token == token && h.since_ms == facts.since_ms
                            }) =>
                    {
                        m.set_deadline(owner, deadline_ms);
                        if let Some(label) = facts.label {
                            m.set_label(owner, label);
                        }
                        change.expire_at = m.latest_deadline();
                    }
                    Stored::Record(RecordMut::Holders(m)) if m.mode() == mode => {
                        // A full LIMIT n record never takes an (n+1)th
                        // holder: the master prunes ended ones first
                        // (LEASE.PRUNE); should it not have, the earliest
                        // deadlines give way, on every node alike.
                        if let HoldersMode::Limit(n) = mode
                            && m.holder(owner).is_none()
                            && let Some(b) =
                                m.ended_batch(i64::MAX, (m.len() + 1).saturating_sub(n as usize))
                        {
                            m.take_through(b.deadline_ms, b.token);
                        }
                        let kept = m
                            .holder(owner)
                            .filter(|h| h.since_ms == facts.since_ms)
                            .and_then(|h| h.label.clone());
                        m.put(holder(kept));
                        change.expire_at = m.latest_deadline();
                    }
                    other => {
                        change.delete = matches!(other, Stored::Other);
                        change.store =
                            Some(Record::Holders(Box::new(Holders::with(mode, holder(None)))));
                        change.expire_at = Some(deadline_ms);
                    }
                }
                change.changed = true;
            }
            // A holder leaves: one holding of a holders record, or the
            // exclusive lease of that owner, whatever the clock says.
            Effect::Drop { owner } | Effect::Release { owner } => match stored {
                Stored::Record(RecordMut::Holders(m)) => {
                    let removed = m.remove(owner).is_some();
                    if removed {
                        after_removal(m, &mut change);
                    }
                }
                Stored::Record(RecordMut::Exclusive(l)) if l.is_held_by(owner) => {
                    change.delete = true;
                    change.changed = true;
                }
                _ => {}
            },
            Effect::Prune { deadline_ms, token } => {
                if let Stored::Record(RecordMut::Holders(m)) = stored
                    && m.take_through(deadline_ms, token) > 0
                {
                    after_removal(m, &mut change);
                }
            }
            Effect::Delete => {
                if !matches!(stored, Stored::Nothing) {
                    change.delete = true;
                    change.changed = true;
                }
            }
            Effect::ExpireAt { at_ms } => {
                if !matches!(stored, Stored::Nothing) {
                    change.expire_at = Some(at_ms);
                    change.changed = true;
                }
            }
            Effect::Guard => match stored {
                Stored::Nothing => {
                    change.store = Some(Record::Exclusive(Lease::free_guard(0)));
                    change.persist = true;
                    change.changed = true;
                    change.guard = Some(true);
                }
                Stored::Record(RecordMut::Exclusive(l)) if !l.is_guard() => {
                    l.set_guard(true);
                    change.persist = true;
                    change.changed = true;
                    change.guard = Some(true);
                }
                // A guard already, or a holders record (the master refuses
                // to guard one, so no effect asks it).
                _ => {}
            },
            Effect::Unguard => {
                if let Stored::Record(RecordMut::Exclusive(l)) = stored
                    && l.is_guard()
                {
                    if l.is_free() {
                        change.delete = true;
                    } else {
                        l.set_guard(false);
                        change.expire_at = Some(l.deadline_ms);
                    }
                    change.changed = true;
                    change.guard = Some(false);
                }
            }
        }
        change
    }

    /// The effects that rebuild `record` from nothing (the AOF rewrite): its
    /// `LEASE.APPLY`, or one `LEASE.HOLD` per holder live at `now_ms`.
    pub fn of_record(record: RecordRef<'a>, now_ms: i64) -> Vec<Effect<'a>> {
        match record {
            RecordRef::Exclusive(l) => {
                let mut effects = Vec::with_capacity(2);
                if !l.is_free() {
                    effects.push(Effect::Apply {
                        owner: l.owner(),
                        token: l.token,
                        deadline_ms: l.deadline_ms,
                        facts: Facts::new(l.since_ms(), l.label()),
                    });
                }
                if l.is_guard() {
                    effects.push(Effect::Guard);
                }
                effects
            }
            RecordRef::Holders(m) => m
                .holders()
                .filter(|h| h.is_live(now_ms))
                .map(|h| Effect::Hold {
                    mode: m.mode(),
                    owner: &h.owner,
                    token: h.token,
                    deadline_ms: h.deadline_ms,
                    facts: Facts::new(h.since_ms, h.label.as_deref()),
                })
                .collect(),
        }
    }

    /// The largest token it carries (a replica raises its clock to it).
    #[inline]
    pub fn token(&self) -> Option<u64> {
        match *self {
            Effect::Apply { token, .. } | Effect::Hold { token, .. } => Some(token),
            _ => None,
        }
    }
}

/// `[SINCE ms] [LABEL text]` after an effect's fixed arguments.
fn parse_facts<'a>(
    token: u64,
    words: &[&'a [u8]],
    name: &'static str,
) -> Result<Facts<'a>, LeaseError> {
    let mut facts = Facts::new(since_of_token(token), None);
    let mut rest = words;
    if let [w, v, tail @ ..] = rest
        && w.eq_ignore_ascii_case(b"SINCE")
    {
        facts.since_ms = parse_unix_ms(v, "SINCE")?;
        rest = tail;
    }
    if let [w, v, tail @ ..] = rest
        && w.eq_ignore_ascii_case(b"LABEL")
    {
        facts.label = Some(check_label(v)?);
        rest = tail;
    }
    if rest.is_empty() {
        Ok(facts)
    } else {
        Err(LeaseError::Arity(name))
    }
}

/// A holder left a holders record: the key goes with the last one, else its
/// expiry follows the latest deadline.
fn after_removal(m: &Holders, change: &mut Change) {
    match m.latest_deadline() {
        Some(latest) => change.expire_at = Some(latest),
        None => change.delete = true,
    }
    change.changed = true;
}

impl Announce {
    pub fn command(&self) -> &'static CStr {
        match self {
            Announce::Clock { .. } => CLOCK,
            Announce::Version { .. } => VERSION,
        }
    }

    pub fn args<'s>(&self, digits: &'s mut Digits) -> ArgList<'s> {
        let [a, b, _, _] = &mut digits.0;
        match *self {
            Announce::Clock { last } => ArgList::new([decimal(last as i64, a)]),
            Announce::Version { effects, records } => {
                ArgList::new([decimal(effects as i64, a), decimal(records as i64, b)])
            }
        }
    }

    pub fn parse(command: &CStr, args: &[&[u8]]) -> Result<Announce, LeaseError> {
        let number = |i: usize, what| {
            super::args::parse_i64(args[i])
                .and_then(|v| u32::try_from(v).ok())
                .ok_or(LeaseError::NotInteger(what))
        };
        match command {
            c if c == CLOCK && args.len() == 1 => Ok(Announce::Clock {
                last: parse_token(args[0])?,
            }),
            c if c == CLOCK => Err(LeaseError::Arity("lease.clock")),
            c if c == VERSION && args.len() == 2 => Ok(Announce::Version {
                effects: number(0, "effects")?,
                records: number(1, "records")?,
            }),
            c if c == VERSION => Err(LeaseError::Arity("lease.version")),
            _ => Err(LeaseError::Internal(format!("no announcement {command:?}"))),
        }
    }
}

/// `n` in decimal, written into `buf`: the numbers an effect carries are
/// passed to the server as byte buffers, which it keeps in one allocation
/// each, where a number argument costs it two (the string, then the object
/// around it).
#[inline]
pub fn decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut v = n.unsigned_abs();
    let mut i = buf.len();
    // Eight digits at a time while there are more than eight, each eight
    // in 32-bit arithmetic.
    while v >= 100_000_000 {
        let low = (v % 100_000_000) as u32;
        v /= 100_000_000;
        i -= 8;
        four(low / 10_000, &mut buf[i..i + 4]);
        four(low % 10_000, &mut buf[i + 4..i + 8]);
    }
    // At most eight digits are left.
    let mut v = v as u32;
    if v >= 10_000 {
        i -= 4;
        four(v % 10_000, &mut buf[i..i + 4]);
        v /= 10_000;
    }
    // At most four digits are left: at most one more pair before the last.
    if v >= 100 {
        i -= 2;
        pair(v % 100, &mut buf[i..i + 2]);
        v /= 100;
    }
    if v >= 10 {
        i -= 2;
        pair(v, &mut buf[i..i + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    if n < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

/// The two digits of `v` (below 100), from a table of "00" to "99".
#[inline(always)]
fn pair(v: u32, out: &mut [u8]) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let at = v as usize * 2;
    out.copy_from_slice(&PAIRS[at..at + 2]);
}

/// The four digits of `v` (below 10,000), leading zeros included.
#[inline(always)]
fn four(v: u32, out: &mut [u8]) {
    pair(v / 100, &mut out[..2]);
    pair(v % 100, &mut out[2..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    /// Every effect, as written, reads back as itself: the replication
    /// contract.
    #[test]
    fn every_effect_reads_back_from_its_arguments() {
        let all = [
            Effect::Apply {
                owner: b"me\0\xff",
                token: 1_839_225_399_109_632,
                deadline_ms: NOW,
                facts: Facts::plain(1_839_225_399_109_632),
            },
            Effect::Hold {
                mode: HoldersMode::Limit(100_000),
                owner: b"w",
                token: 7,
                deadline_ms: NOW + 1,
                facts: Facts::plain(7),
            },
            Effect::Hold {
                mode: HoldersMode::Shared,
                owner: b"r",
                token: 9,
                deadline_ms: NOW + 2,
                facts: Facts::plain(9),
            },
            Effect::Drop { owner: b"x" },
            Effect::Prune {
                deadline_ms: NOW,
                token: 11,
            },
            Effect::Release { owner: b"y" },
            Effect::Guard,
            Effect::Unguard,
        ];
        for e in all {
            let mut digits = Digits::default();
            let args = e.args(&mut digits);
            assert_eq!(Effect::parse(e.command(), args.as_slice()), Ok(e), "{e:?}");
        }
        let mut digits = Digits::default();
        assert_eq!(Effect::Delete.args(&mut digits).as_slice().len(), 0);
        let at = Effect::ExpireAt { at_ms: NOW };
        assert_eq!(
            at.args(&mut digits).as_slice(),
            [b"1800000000000".as_slice()]
        );
        for a in [
            Announce::Clock { last: 5 },
            Announce::Version {
                effects: 3,
                records: 2,
            },
        ] {
            let mut digits = Digits::default();
            let args = a.args(&mut digits);
            assert_eq!(Announce::parse(a.command(), args.as_slice()), Ok(a));
        }
    }

    /// `SINCE` is written only when the token does not tell it, `LABEL`
    /// only when given; both read back.
    #[test]
    fn since_and_label_travel_only_when_needed() {
        let token = (NOW as u64) * 1024 + 3;
        let plain = Effect::Apply {
            owner: b"o",
            token,
            deadline_ms: NOW + 10,
            facts: Facts::new(NOW, None),
        };
        let mut digits = Digits::default();
        assert_eq!(plain.args(&mut digits).as_slice().len(), 3, "as before");
        let labelled = [
            Effect::Apply {
                owner: b"o",
                token,
                deadline_ms: NOW + 10,
                facts: Facts::new(NOW - 5, Some(b"worker 7\0\xff")),
            },
            Effect::Hold {
                mode: HoldersMode::Limit(3),
                owner: b"w",
                token,
                deadline_ms: NOW + 1,
                facts: Facts::new(NOW, Some(b"w")),
            },
            Effect::Hold {
                mode: HoldersMode::Shared,
                owner: b"r",
                token,
                deadline_ms: NOW + 1,
                facts: Facts::new(NOW - 1, None),
            },
        ];
        let lens = [7, 7, 6];
        for (e, len) in labelled.into_iter().zip(lens) {
            let mut digits = Digits::default();
            let args = e.args(&mut digits);
            assert_eq!(args.as_slice().len(), len, "{e:?}");
            assert_eq!(Effect::parse(e.command(), args.as_slice()), Ok(e), "{e:?}");
        }
        assert!(Effect::parse(APPLY, &[b"o", b"1", b"2", b"LABEL", b""]).is_err());
        assert!(Effect::parse(APPLY, &[b"o", b"1", b"2", b"LABEL", b"a", b"SINCE", b"1"]).is_err());
        assert!(Effect::parse(HOLD, &[b"o", b"1", b"2", b"SHARED", b"SINCE"]).is_err());
    }

    /// A holding applied without `LABEL` keeps its label while it is the
    /// same holding (a renewal, a retry); a new holding starts without
    /// one; `LABEL` replaces it.
    #[test]
    fn a_holding_keeps_its_label_until_it_ends_or_gets_another() {
        let apply = |token: u64, since_ms: i64, label: Option<&'static [u8]>| Effect::Apply {
            owner: b"o",
            token,
            deadline_ms: NOW + 10,
            facts: Facts::new(since_ms, label),
        };
        let stored = |c: Change| match c.store {
            Some(Record::Exclusive(l)) => l,
            other => panic!("{other:?}"),
        };
        let mut l = stored(apply(5, NOW, Some(b"one")).apply(Stored::Nothing));
        assert_eq!((l.label(), l.since_ms()), (Some(b"one".as_slice()), NOW));
        // A renewal: in place, label kept.
        let c = apply(5, NOW, None).apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(c.store.is_none());
        assert_eq!(l.label(), Some(b"one".as_slice()));
        // A retry with another label.
        let mut l =
            stored(apply(5, NOW, Some(b"two")).apply(Stored::Record(RecordMut::Exclusive(&mut l))));
        assert_eq!(l.label(), Some(b"two".as_slice()));
        // The same owner's new holding (another start): no label.
        let l =
            stored(apply(9, NOW + 20, None).apply(Stored::Record(RecordMut::Exclusive(&mut l))));
        assert_eq!((l.label(), l.since_ms(), l.token), (None, NOW + 20, 9));
        // Holders alike.
        let hold = |token: u64, since_ms: i64, label: Option<&'static [u8]>| Effect::Hold {
            mode: HoldersMode::Shared,
            owner: b"r",
            token,
            deadline_ms: NOW + 10,
            facts: Facts::new(since_ms, label),
        };
        let mut m = Holders::with(HoldersMode::Shared, holder(b"x", 1, NOW));
        hold(5, NOW, Some(b"r1")).apply(Stored::Record(RecordMut::Holders(&mut m)));
        hold(5, NOW, None).apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert_eq!(
            m.holder(b"r").unwrap().label.as_deref(),
            Some(b"r1".as_slice())
        );
        hold(5, NOW, Some(b"r2")).apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert_eq!(
            m.holder(b"r").unwrap().label.as_deref(),
            Some(b"r2".as_slice())
        );
        hold(8, NOW + 3, None).apply(Stored::Record(RecordMut::Holders(&mut m)));
        let h = m.holder(b"r").unwrap();
        assert_eq!((h.label.as_deref(), h.since_ms), (None, NOW + 3));
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(Effect::parse(APPLY, &[b"o", b"1"]).is_err());
        assert!(Effect::parse(APPLY, &[b"", b"1", b"2"]).is_err());
        assert!(Effect::parse(HOLD, &[b"o", b"1", b"2", b"LIMIT", b"1"]).is_err());
        assert!(Effect::parse(PRUNE, &[b"x", b"1"]).is_err());
        assert!(Effect::parse(DROP, &[]).is_err());
        assert!(Announce::parse(VERSION, &[b"3"]).is_err());
        assert!(Announce::parse(CLOCK, &[b"0"]).is_err());
    }

    fn holder(owner: &[u8], token: u64, deadline_ms: i64) -> Holder {
        Holder {
            owner: owner.into(),
            token,
            deadline_ms,
            since_ms: crate::lease::limits::since_of_token(token),
            label: None,
        }
    }

    #[test]
    fn applied_to_a_key() {
        // APPLY on nothing, and over another type.
        let e = Effect::Apply {
            owner: b"a",
            token: 5,
            deadline_ms: NOW,
            facts: Facts::plain(5),
        };
        let c = e.apply(Stored::Nothing);
        assert_eq!(c.store, Some(Record::Exclusive(Lease::plain(b"a", 5, NOW))));
        assert_eq!((c.delete, c.expire_at, c.changed), (false, Some(NOW), true));
        assert!(e.apply(Stored::Other).delete);
        // HOLD into a record of its mode, and one of another mode.
        let mut m = Holders::with(HoldersMode::Limit(3), holder(b"a", 1, NOW));
        let hold = Effect::Hold {
            mode: HoldersMode::Limit(3),
            owner: b"b",
            token: 2,
            deadline_ms: NOW + 5,
            facts: Facts::plain(2),
        };
        let c = hold.apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert_eq!((c.store.is_none(), c.expire_at), (true, Some(NOW + 5)));
        assert_eq!(m.len(), 2);
        let shared = Effect::Hold {
            mode: HoldersMode::Shared,
            owner: b"r",
            token: 3,
            deadline_ms: NOW,
            facts: Facts::plain(3),
        };
        assert!(
            shared
                .apply(Stored::Record(RecordMut::Holders(&mut m)))
                .store
                .is_some()
        );
        // PRUNE takes what the master took; DROP of the last deletes.
        let c = Effect::Prune {
            deadline_ms: NOW,
            token: 1,
        }
        .apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert_eq!((m.len(), c.expire_at, c.delete), (1, Some(NOW + 5), false));
        let c = Effect::Drop { owner: b"b" }.apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert!(c.delete && c.changed);
        // RELEASE by owner alone, whatever the clock.
        let mut l = Lease::plain(b"a", 5, 1);
        let c = Effect::Release { owner: b"a" }.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(c.delete);
        let c = Effect::Release { owner: b"z" }.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert_eq!(c, Change::default(), "someone else's: nothing");
        assert_eq!(Effect::Delete.apply(Stored::Nothing), Change::default());
    }

    /// A full LIMIT n record never stores n+1 holders (its encoding would
    /// not load): the earliest deadline gives way, whatever the clock, so
    /// every node that applies the effect ends with the same record.
    #[test]
    fn a_full_limit_record_keeps_its_limit() {
        let mut m = Holders::with(HoldersMode::Limit(2), holder(b"a", 1, NOW + 9));
        m.put(holder(b"b", 2, NOW + 3));
        let hold = |owner: &'static [u8], token| Effect::Hold {
            mode: HoldersMode::Limit(2),
            owner,
            token,
            deadline_ms: NOW + 20,
            facts: Facts::plain(token),
        };
        hold(b"c", 3).apply(Stored::Record(RecordMut::Holders(&mut m)));
        let owners: Vec<&[u8]> = m.holders().map(|h| &*h.owner).collect();
        assert_eq!((m.len(), m.holder(b"b")), (2, None), "{owners:?}");
        // A holder's own retry (same owner, new token) takes no one's place.
        hold(b"a", 4).apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert_eq!(m.len(), 2);
        assert!(m.holder(b"c").is_some() && m.holder(b"a").is_some());
    }

    #[test]
    fn a_labelled_record_is_rewritten_with_its_since_and_label() {
        let l = Lease::new(b"a", 5, NOW, NOW - 7, Some(b"job 1"));
        let effects = Effect::of_record(RecordRef::Exclusive(&l), NOW);
        let c = effects[0].apply(Stored::Nothing);
        assert_eq!(c.store, Some(Record::Exclusive(l)));
        let mut m = Holders::new(HoldersMode::Limit(2));
        m.put(Holder {
            label: Some(b"h".as_slice().into()),
            since_ms: NOW - 3,
            ..holder(b"a", 1, NOW + 1)
        });
        let effects = Effect::of_record(RecordRef::Holders(&m), NOW);
        let c = effects[0].apply(Stored::Nothing);
        assert_eq!(c.store, Some(Record::Holders(Box::new(m))));
    }

    #[test]
    fn a_record_is_rewritten_as_the_effects_that_rebuild_it() {
        let l = Lease::plain(b"a", 5, NOW);
        assert_eq!(
            Effect::of_record(RecordRef::Exclusive(&l), NOW),
            [Effect::Apply {
                owner: b"a",
                token: 5,
                deadline_ms: NOW,
                facts: Facts::plain(5),
            }]
        );
        let mut m = Holders::with(HoldersMode::Shared, holder(b"a", 1, NOW - 1));
        m.put(holder(b"b", 2, NOW + 1));
        let effects = Effect::of_record(RecordRef::Holders(&m), NOW);
        assert_eq!(effects.len(), 1, "only live holders");
        // Applied to nothing, in order, they give the live record back.
        let mut rebuilt: Option<Record> = None;
        for e in &effects {
            let stored = match rebuilt.as_mut() {
                Some(r) => Stored::Record(r.as_mut()),
                None => Stored::Nothing,
            };
            if let Some(r) = e.apply(stored).store {
                rebuilt = Some(r);
            }
        }
        let mut live = m.clone();
        live.take_ended(NOW, usize::MAX);
        assert_eq!(rebuilt, Some(Record::Holders(Box::new(live))));
    }

    #[test]
    fn decimal_writes_what_display_does() {
        let mut buf = [0u8; 20];
        for n in [
            0,
            7,
            10,
            99,
            1_839_225_399_109_632,
            i64::MAX,
            -1,
            -10,
            i64::MIN,
        ] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
        // Every length, every sign, from a seeded generator.
        let mut x: i64 = 1;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            for n in [x, x >> 20, x >> 40, x >> 54, x % 1000, x % 100_000] {
                assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
            }
        }
    }

    fn held_guard(token: u64) -> Box<Lease> {
        let mut l = Lease::new(b"a", token, NOW + 100, since_of_token(token), None);
        l.set_guard(true);
        l
    }

    fn stored_lease(c: Change) -> Box<Lease> {
        match c.store {
            Some(Record::Exclusive(l)) => l,
            other => panic!("{other:?}"),
        }
    }

    /// A guard keeps guarding whatever its holdings do (design.md S12): a
    /// new holding is guarded, a release leaves a free guard with the last
    /// token, and the key never gets an expiry.
    #[test]
    fn a_guard_outlives_its_holdings_and_never_expires() {
        // GUARD of nothing: a free guard; of a lease: the same holding.
        let c = Effect::Guard.apply(Stored::Nothing);
        assert!(c.persist && c.changed && c.expire_at.is_none());
        assert_eq!(c.guard, Some(true), "a guard came");
        let free = stored_lease(c);
        assert!(free.is_guard() && free.is_free() && free.token == 0);
        let mut l = Lease::plain(b"a", 7 << 10, NOW + 100);
        let c = Effect::Guard.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(c.persist && c.changed && c.store.is_none() && l.is_guard() && l.owner() == b"a");
        assert_eq!(c.guard, Some(true), "a guard came");
        // GUARD of a guard changes nothing but takes any expiry away.
        let c = Effect::Guard.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(c.persist && !c.changed && c.store.is_none() && !c.delete && l.is_guard());
        assert_eq!(c.guard, None, "no guard came or went");
        // A new holding of a free guard is guarded, without an expiry.
        let mut free = Lease::free_guard(5);
        let apply = Effect::Apply {
            owner: b"b",
            token: 9 << 10,
            deadline_ms: NOW + 50,
            facts: Facts::plain(9 << 10),
        };
        let c = apply.apply(Stored::Record(RecordMut::Exclusive(&mut free)));
        assert!(c.persist && c.expire_at.is_none(), "{c:?}");
        let held = stored_lease(c);
        assert!(held.is_guard() && held.is_held_by(b"b"));
        // A renewal in place keeps it; no expiry either.
        let mut l = held_guard(9 << 10);
        let c = Effect::Apply {
            owner: b"a",
            token: 9 << 10,
            deadline_ms: NOW + 500,
            facts: Facts::plain(9 << 10),
        }
        .apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(c.store.is_none() && c.expire_at.is_none() && c.persist && l.is_guard());
        assert_eq!(l.deadline_ms, NOW + 500);
        // A release, a drop: a free guard with the token, not a delete.
        for effect in [
            Effect::Release { owner: b"a" },
            Effect::Drop { owner: b"a" },
        ] {
            let mut l = held_guard(9 << 10);
            let c = effect.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
            assert!(!c.delete, "{effect:?}");
            assert_eq!(c.guard, None, "{effect:?}: the guard stays");
            let free = stored_lease(c);
            assert!(
                free.is_guard() && free.is_free() && free.token == 9 << 10,
                "{effect:?}"
            );
        }
        // An expiry effect does not give it one.
        let mut l = held_guard(9 << 10);
        let c = Effect::ExpireAt { at_ms: NOW }.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(c.expire_at.is_none() && c.persist);
    }

    #[test]
    fn unguard_deletes_a_free_guard_and_gives_a_held_one_its_expiry_back() {
        let mut free = Lease::free_guard(5);
        let c = Effect::Unguard.apply(Stored::Record(RecordMut::Exclusive(&mut free)));
        assert!(c.delete && c.changed);
        assert_eq!(c.guard, Some(false), "a guard went");
        let mut l = held_guard(9 << 10);
        let c = Effect::Unguard.apply(Stored::Record(RecordMut::Exclusive(&mut l)));
        assert!(!c.delete && c.changed && !l.is_guard());
        assert_eq!(c.guard, Some(false), "a guard went");
        assert_eq!(c.expire_at, Some(NOW + 100));
        let mut plain = Lease::plain(b"a", 7 << 10, NOW + 100);
        let c = Effect::Unguard.apply(Stored::Record(RecordMut::Exclusive(&mut plain)));
        assert!(!c.changed && c.guard.is_none(), "not a guard: nothing");
        assert!(!Effect::Unguard.apply(Stored::Nothing).changed);
    }

    /// The AOF rewrite writes a guard as the effects that rebuild it.
    #[test]
    fn a_guard_is_rewritten_as_its_holding_then_guard() {
        let free = Lease::free_guard(5);
        assert_eq!(
            Effect::of_record(RecordRef::Exclusive(&free), NOW),
            vec![Effect::Guard]
        );
        let l = held_guard(9 << 10);
        let effects = Effect::of_record(RecordRef::Exclusive(&l), NOW);
        assert!(
            matches!(
                effects[..],
                [Effect::Apply { owner: b"a", .. }, Effect::Guard]
            ),
            "{effects:?}"
        );
    }
}
