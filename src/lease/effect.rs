//! The effects: the module's replication language (effect version 3, see
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

use super::args::{check_owner, parse_hold_mode, parse_token, parse_unix_ms};
use super::error::LeaseError;
use super::exclusive::Lease;
use super::holders::{Holder, Holders};
use super::mode::HoldersMode;
use super::record::{Record, RecordMut, RecordRef};

/// A change to one lease key, as it travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect<'a> {
    /// `LEASE.APPLY key owner token deadline-ms`: an exclusive lease's full
    /// state (an acquire, a re-acquire, a renewal, a hand-off).
    Apply {
        owner: &'a [u8],
        token: u64,
        deadline_ms: i64,
    },
    /// `LEASE.HOLD key owner token deadline-ms LIMIT n|SHARED`: one holder
    /// of a counting or shared lease, added or updated.
    Hold {
        mode: HoldersMode,
        owner: &'a [u8],
        token: u64,
        deadline_ms: i64,
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
pub struct Digits([[u8; 20]; 3]);

/// The arguments of one effect after its key, at most five.
pub struct ArgList<'a> {
    args: [&'a [u8]; 5],
    len: usize,
}

impl<'a> ArgList<'a> {
    #[inline(always)]
    fn new<const N: usize>(list: [&'a [u8]; N]) -> Self {
        let mut args: [&'a [u8]; 5] = [&[]; 5];
        args[..N].copy_from_slice(&list);
        ArgList { args, len: N }
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
    /// Did the key change (to signal it as modified)?
    pub changed: bool,
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

    /// The same effect naming `owner` instead (where it names one).
    pub fn with_owner<'b>(&self, owner: &'b [u8]) -> Effect<'b> {
        match *self {
            Effect::Apply {
                token, deadline_ms, ..
            } => Effect::Apply {
                owner,
                token,
                deadline_ms,
            },
            Effect::Hold {
                mode,
                token,
                deadline_ms,
                ..
            } => Effect::Hold {
                mode,
                owner,
                token,
                deadline_ms,
            },
            Effect::Drop { .. } => Effect::Drop { owner },
            Effect::Release { .. } => Effect::Release { owner },
            Effect::Prune { deadline_ms, token } => Effect::Prune { deadline_ms, token },
            Effect::Delete => Effect::Delete,
            Effect::ExpireAt { at_ms } => Effect::ExpireAt { at_ms },
        }
    }

    /// Its arguments after the key, numbers in decimal (written into
    /// `digits`).
    #[inline(always)]
    pub fn args<'s>(&'s self, digits: &'s mut Digits) -> ArgList<'s> {
        let [a, b, c] = &mut digits.0;
        match *self {
            Effect::Apply {
                owner,
                token,
                deadline_ms,
            } => ArgList::new([owner, decimal(token as i64, a), decimal(deadline_ms, b)]),
            Effect::Hold {
                mode,
                owner,
                token,
                deadline_ms,
            } => {
                let (t, d) = (decimal(token as i64, a), decimal(deadline_ms, b));
                match mode {
                    HoldersMode::Limit(n) => {
                        ArgList::new([owner, t, d, b"LIMIT", decimal(n as i64, c)])
                    }
                    HoldersMode::Shared => ArgList::new([owner, t, d, b"SHARED"]),
                }
            }
            Effect::Drop { owner } | Effect::Release { owner } => ArgList::new([owner]),
            Effect::Prune { deadline_ms, token } => {
                ArgList::new([decimal(deadline_ms, a), decimal(token as i64, b)])
            }
            Effect::Delete => ArgList::new([]),
            Effect::ExpireAt { at_ms } => ArgList::new([decimal(at_ms, a)]),
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
                arity(3, "lease.apply")?;
                Effect::Apply {
                    owner: check_owner(args[0])?,
                    token: parse_token(args[1])?,
                    deadline_ms: parse_unix_ms(args[2], "deadline-ms")?,
                }
            }
            c if c == HOLD => {
                if args.len() != 4 && args.len() != 5 {
                    return Err(LeaseError::Arity("lease.hold"));
                }
                Effect::Hold {
                    owner: check_owner(args[0])?,
                    token: parse_token(args[1])?,
                    deadline_ms: parse_unix_ms(args[2], "deadline-ms")?,
                    mode: parse_hold_mode(&args[3..])?,
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
            _ => return Err(LeaseError::Internal(format!("no effect {command:?}"))),
        })
    }

    /// What the effect does to what the key holds: the record is changed in
    /// place where it can be, and the rest (a record to store, a delete, an
    /// expiry) is left to the caller in the `Change`.
    #[inline(always)]
    pub fn apply(&self, stored: Stored<'_>) -> Change {
        let mut change = Change::default();
        match *self {
            Effect::Apply {
                owner,
                token,
                deadline_ms,
            } => {
                match stored {
                    // Its holder's lease: changed in place (one allocation
                    // kept, no unlink).
                    Stored::Record(RecordMut::Exclusive(l)) if l.is_held_by(owner) => {
                        l.token = token;
                        l.deadline_ms = deadline_ms;
                    }
                    // Any other value (another type, a holders record, another
                    // owner's ended lease) is replaced: the master's state
                    // wins.
                    other => {
                        change.delete = matches!(other, Stored::Other);
                        change.store =
                            Some(Record::Exclusive(Lease::new(owner, token, deadline_ms)));
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
            } => {
                let holder = || Holder {
                    owner: owner.into(),
                    token,
                    deadline_ms,
                };
                match stored {
                    // A holder's renewal: its deadline moves in place.
                    Stored::Record(RecordMut::Holders(m))
                        if m.mode() == mode
                            && m.holder(owner).is_some_and(|h| h.token == token) =>
                    {
                        m.set_deadline(owner, deadline_ms);
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
                        m.put(holder());
                        change.expire_at = m.latest_deadline();
                    }
                    other => {
                        change.delete = matches!(other, Stored::Other);
                        change.store =
                            Some(Record::Holders(Box::new(Holders::with(mode, holder()))));
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
        }
        change
    }

    /// The effects that rebuild `record` from nothing (the AOF rewrite): its
    /// `LEASE.APPLY`, or one `LEASE.HOLD` per holder live at `now_ms`.
    pub fn of_record(record: RecordRef<'a>, now_ms: i64) -> Vec<Effect<'a>> {
        match record {
            RecordRef::Exclusive(l) => vec![Effect::Apply {
                owner: &l.owner,
                token: l.token,
                deadline_ms: l.deadline_ms,
            }],
            RecordRef::Holders(m) => m
                .holders()
                .filter(|h| h.is_live(now_ms))
                .map(|h| Effect::Hold {
                    mode: m.mode(),
                    owner: &h.owner,
                    token: h.token,
                    deadline_ms: h.deadline_ms,
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
        let [a, b, _] = &mut digits.0;
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
            },
            Effect::Hold {
                mode: HoldersMode::Limit(100_000),
                owner: b"w",
                token: 7,
                deadline_ms: NOW + 1,
            },
            Effect::Hold {
                mode: HoldersMode::Shared,
                owner: b"r",
                token: 9,
                deadline_ms: NOW + 2,
            },
            Effect::Drop { owner: b"x" },
            Effect::Prune {
                deadline_ms: NOW,
                token: 11,
            },
            Effect::Release { owner: b"y" },
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
        }
    }

    #[test]
    fn applied_to_a_key() {
        // APPLY on nothing, and over another type.
        let e = Effect::Apply {
            owner: b"a",
            token: 5,
            deadline_ms: NOW,
        };
        let c = e.apply(Stored::Nothing);
        assert_eq!(c.store, Some(Record::Exclusive(Lease::new(b"a", 5, NOW))));
        assert_eq!((c.delete, c.expire_at, c.changed), (false, Some(NOW), true));
        assert!(e.apply(Stored::Other).delete);
        // HOLD into a record of its mode, and one of another mode.
        let mut m = Holders::with(HoldersMode::Limit(3), holder(b"a", 1, NOW));
        let hold = Effect::Hold {
            mode: HoldersMode::Limit(3),
            owner: b"b",
            token: 2,
            deadline_ms: NOW + 5,
        };
        let c = hold.apply(Stored::Record(RecordMut::Holders(&mut m)));
        assert_eq!((c.store.is_none(), c.expire_at), (true, Some(NOW + 5)));
        assert_eq!(m.len(), 2);
        let shared = Effect::Hold {
            mode: HoldersMode::Shared,
            owner: b"r",
            token: 3,
            deadline_ms: NOW,
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
        let mut l = Lease::new(b"a", 5, 1);
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
    fn a_record_is_rewritten_as_the_effects_that_rebuild_it() {
        let l = Lease::new(b"a", 5, NOW);
        assert_eq!(
            Effect::of_record(RecordRef::Exclusive(&l), NOW),
            [Effect::Apply {
                owner: b"a",
                token: 5,
                deadline_ms: NOW
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
}
