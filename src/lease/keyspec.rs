//! The server's command table (`COMMAND`, `COMMAND INFO`), read once by
//! the binding and asked by both of its users: the fence (which inner
//! commands it refuses, and what a `SHARED` token may run: [`Kind`]) and
//! the guards (which arguments of a command are keys it writes, design.md
//! S12: a write to a guarded key outside `LEASE.FENCE` is refused). "A
//! write" means one thing for both: [`Kind::writes`].
//!
//! `RedisModule_GetCommandKeysWithFlags` gives the key positions but, for
//! every command whose keys come from its key specs, no flags (0 on Redis
//! 7.0 to 8.2 and Valkey 8.1 and 9.1): it cannot tell `GET` from `SET`'s
//! cousin `APPEND`. So the specs are read once, at load, and interpreted
//! here, the way the server finds keys (its `getKeysUsingKeySpecs`):
//! a begin search (an index, or a keyword searched from one end) then a
//! find (a range, or a key count read from an argument).
//!
//! A command whose keys the specs cannot give exactly (an incomplete spec,
//! an unknown search, flags that vary with the arguments) is [`Keys::Ask`]:
//! the binding asks the server's own key function for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The maps of the table: looked up for every command the server runs
/// while a guard stands, so with a fast hasher (foldhash, what hashbrown
/// uses), not SipHash.
type Map<V> = HashMap<Vec<u8>, V, foldhash::fast::FixedState>;

/// The longest command or subcommand name lower-cased without an
/// allocation (a longer one, a module's, is lower-cased on the heap).
const NAME_MAX: usize = 32;

/// Runs `f` on `name` in lower case (in `buf` when it fits).
fn with_lower<R>(name: &[u8], buf: &mut [u8; NAME_MAX], f: impl FnOnce(&[u8]) -> R) -> R {
    match buf.get_mut(..name.len()) {
        Some(b) => {
            for (d, s) in b.iter_mut().zip(name) {
                *d = s.to_ascii_lowercase();
            }
            f(b)
        }
        None => f(&name.to_ascii_lowercase()),
    }
}

/// Is `name` one of this module's commands (`LEASE.` and more)? The one
/// test of the prefix: the fence refuses to run them, the guards never
/// check them (design.md S12).
#[inline]
pub fn is_lease_command(name: &[u8]) -> bool {
    name.len() > 6 && name[..6].eq_ignore_ascii_case(b"lease.")
}

/// A reply of `COMMAND INFO` as the binding reads it (RESP2 shapes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Str(Vec<u8>),
    Array(Vec<Value>),
    Nil,
}

impl Value {
    fn str(&self) -> Option<&[u8]> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    fn int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    fn array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A flat `[name, value, name, value, ...]` array's value for `name`.
    fn field(&self, name: &[u8]) -> Option<&Value> {
        let a = self.array()?;
        a.chunks(2)
            .find(|pair| {
                pair.len() == 2 && pair[0].str().is_some_and(|n| n.eq_ignore_ascii_case(name))
            })
            .map(|pair| &pair[1])
    }
}

/// Where a spec's keys begin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// At this argument.
    Index(usize),
    /// After this keyword, searched from `startfrom` (from the end when
    /// negative).
    Keyword {
        keyword: Vec<u8>,
        startfrom: i64,
    },
    Unknown,
}

/// How a spec's keys run from where they begin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Find {
    /// To `lastkey` (from the end when negative; with a `limit`, a
    /// fraction of what is left), every `keystep`.
    Range {
        lastkey: i64,
        keystep: usize,
        limit: usize,
    },
    /// As many as the argument `keynumidx` after the beginning says, from
    /// `firstkey` after it, every `keystep`.
    Keynum {
        keynumidx: usize,
        firstkey: usize,
        keystep: usize,
    },
    Unknown,
}

/// One key spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// `RW`, `OW` or `RM`: the keys are written (anything but a read).
    pub writes: bool,
    /// `not_key`: the arguments only look like keys.
    pub not_key: bool,
    /// `incomplete` or `variable_flags`: the spec alone does not say.
    pub unsure: bool,
    /// `incomplete`: some keys may be where the spec does not say.
    pub incomplete: bool,
    pub begin: Begin,
    pub find: Find,
}

/// What a command is, by its `COMMAND INFO` flags and key specs: what the
/// fence asks of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kind {
    /// It may write a key: flagged `write`, or flagged neither `write` nor
    /// `readonly` with a key spec that writes (a module command registered
    /// without flags). A `SHARED` token fences no such command, and the
    /// guards look for written keys only in such a command.
    pub writes: bool,
    /// Flagged `blocking`.
    pub blocking: bool,
    /// Flagged `noscript`: not allowed in scripts.
    pub noscript: bool,
}

/// A command: its kind and its keys, as its flags and specs give them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// `COMMAND INFO`'s arity: the exact argument count (the name
    /// included), or at least `-arity` where negative; 0 where not given.
    pub arity: i64,
    pub kind: Kind,
    pub specs: Vec<Spec>,
    /// Flagged `write` with no spec that writes: every key it names counts
    /// as written (`XREADGROUP`'s spec says `RO`, yet it moves the group's
    /// last-delivered id and pending list).
    pub writes_all: bool,
    /// Container commands (`XGROUP`, `OBJECT`): by lower-case subcommand.
    pub subcommands: Map<Command>,
    /// Flagged `movablekeys`: its keys are not where its index-and-range
    /// specs alone put them (a key function, another module's
    /// `getkeys-api`, a keyword or a key count).
    pub movable: bool,
}

/// Whether the specs could say what a command writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Every written key's position was given (maybe none).
    Given,
    /// The specs cannot say: ask the server's key function.
    Ask,
}

/// Every command of a `COMMAND INFO` reply, by lower-case name.
#[derive(Clone, Debug, Default)]
pub struct Table {
    commands: Map<Command>,
}

impl Table {
    /// Reads a whole `COMMAND INFO` reply; entries it cannot read are
    /// left out (a command the table does not know is [`Keys::Ask`]).
    pub fn from_command_info(reply: &Value) -> Table {
        let mut t = Table::default();
        t.add(reply);
        t
    }

    /// Adds the commands of a `COMMAND INFO` reply (a command loaded
    /// since the table was read: another module's); a nil entry (a name
    /// the server does not know) adds nothing.
    pub fn add(&mut self, reply: &Value) {
        for entry in reply.array().unwrap_or_default() {
            if let Some((name, command)) = parse_command(entry) {
                self.commands.insert(name, command);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// Every command's [`Places`], for the guards' cheap test; nowhere
    /// for a command `checked` says the guards never check.
    pub fn key_places(&self, checked: impl Fn(&[u8]) -> bool) -> KeyPlaces {
        KeyPlaces::new(self, checked)
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// The command `name` (any case), or the server does not know it.
    pub fn get(&self, name: &[u8]) -> Option<&Command> {
        with_lower(name, &mut [0; NAME_MAX], |n| self.commands.get(n))
    }

    /// The command `name` runs with `first` as its first argument: for a
    /// container (`CONFIG`, `XGROUP`), its subcommand `first` when the
    /// server has one of that name, else the container. `None` when the
    /// server does not know `name`.
    pub fn command(&self, name: &[u8], first: Option<&[u8]>) -> Option<(&Command, bool)> {
        let command = self.get(name)?;
        match first {
            Some(sub) if !command.subcommands.is_empty() => Some(
                with_lower(sub, &mut [0; NAME_MAX], |s| command.subcommands.get(s))
                    .map_or((command, false), |c| (c, true)),
            ),
            _ => Some((command, false)),
        }
    }

    /// Gives `key` the position of every key `argv` (the command name
    /// first) writes, unless the answer is [`Keys::Ask`].
    pub fn written(&self, argv: &[&[u8]], key: impl FnMut(usize)) -> Keys {
        let Some(&name) = argv.first() else {
            return Keys::Ask;
        };
        match self.command(name, argv.get(1).copied()) {
            None => Keys::Ask,
            // An unknown subcommand is the server's error to give.
            Some((c, false)) if !c.subcommands.is_empty() => Keys::Given,
            Some((c, _)) => c.written(argv, key),
        }
    }
}

impl Command {
    /// Gives `key` the position of every key `argv` writes, by this
    /// command's specs, unless the answer is [`Keys::Ask`] (then some
    /// positions may have been given already).
    pub fn written(&self, argv: &[&[u8]], mut key: impl FnMut(usize)) -> Keys {
        // The wrong number of arguments: the server refuses the command
        // before it runs (an arity error, not the guard's).
        if !self.kind.writes || !self.arity_fits(argv.len()) {
            return Keys::Given;
        }
        for spec in &self.specs {
            if spec.not_key {
                continue;
            }
            if spec.unsure {
                return Keys::Ask;
            }
            let writes = spec.writes || self.writes_all;
            // A written keyword's every occurrence: the server's search
            // stops at the first, but a command that takes an option twice
            // (`GEORADIUS ... STORE a STORE b`) uses the last.
            let mut after = 0;
            loop {
                match spec.positions(argv, after) {
                    Found::Keys(first, last, step, hit) => {
                        if writes {
                            (first..=last)
                                .step_by(step)
                                .filter(|&i| i < argv.len())
                                .for_each(&mut key);
                        }
                        match hit {
                            Some(at) if writes => after = at,
                            _ => break,
                        }
                    }
                    Found::None => break,
                    // A syntax error: the command will refuse itself, but
                    // ask the server rather than guess.
                    Found::Invalid if after == 0 => return Keys::Ask,
                    // A later occurrence that is no option (a value that
                    // spells the keyword): the first was given.
                    Found::Invalid => break,
                }
            }
        }
        Keys::Given
    }

    /// Does `argc` arguments (the name included) fit the arity?
    fn arity_fits(&self, argc: usize) -> bool {
        let argc = argc as i64;
        match self.arity {
            0 => true,
            a if a > 0 => argc == a,
            a => argc >= -a,
        }
    }
}

impl Command {
    /// Where the keys this command writes can be, by the argument count
    /// alone (the guards' cheap test): nowhere for a command that writes
    /// no key; the positions its specs give where every spec begins at an
    /// index and runs a range, none is `incomplete` and the server does
    /// not flag its keys `movablekeys`; anywhere else. A container's
    /// places are those of all its subcommands together. Never fewer
    /// places than [`Command::written`] or the server's key function
    /// could give (a `not_key` spec's places count too).
    pub fn places(&self) -> Places {
        if !self.subcommands.is_empty() {
            let mut places = Places::None;
            for sub in self.subcommands.values() {
                places = places.with(sub.places());
            }
            return places;
        }
        if !self.kind.writes {
            return Places::None;
        }
        if self.movable {
            return Places::Any;
        }
        let mut places = Places::None;
        for spec in &self.specs {
            let span = match (&spec.begin, &spec.find) {
                (
                    Begin::Index(first),
                    Find::Range {
                        lastkey,
                        keystep,
                        limit: 0,
                    },
                ) if !spec.incomplete => Places::span(*first, *lastkey, *keystep),
                _ => Places::Any,
            };
            places = places.with(span);
        }
        places
    }
}

/// Where the keys a command writes can be, by its name and argument
/// count alone: [`Command::places`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Places {
    /// Nowhere: it writes no key (or the guards never check it).
    None,
    /// At the positions below 64 set in `fixed`, and at those set in
    /// `tail` up to `back` arguments before the end (a spec whose last key
    /// is counted from the end: `DEL`'s, `MSET`'s). A command of more
    /// than 64 arguments: anywhere.
    Spans { fixed: u64, tail: u64, back: u8 },
    /// Any argument after the name may be a key.
    #[default]
    Any,
}

/// Does `f` hold for one of the bits set in `at` (bit `i`: argument
/// `i`), lowest first? The first that does ends the search.
#[inline(always)]
fn any_bit(mut at: u64, mut f: impl FnMut(usize) -> bool) -> bool {
    while at != 0 {
        if f(at.trailing_zeros() as usize) {
            return true;
        }
        at &= at - 1;
    }
    false
}

/// Bits 0 to `n - 1` (`n` at most 64).
#[inline(always)]
fn low_bits(n: usize) -> u64 {
    u64::MAX.checked_shr(64 - n as u32).unwrap_or(0)
}

impl Places {
    /// The places of one spec: from `first` to `last` (from the end when
    /// negative), every `step`; anywhere for one the server could not use
    /// (at the name, no step) or that does not fit.
    fn span(first: usize, last: i64, step: usize) -> Places {
        if first == 0 || first >= 64 || step == 0 {
            return Places::Any;
        }
        let every = (first..64).step_by(step).fold(0u64, |m, at| m | 1 << at);
        if last >= 0 {
            let end = (first as u64).saturating_add(last as u64).min(63);
            return Places::Spans {
                fixed: every & low_bits(end as usize + 1),
                tail: 0,
                back: 0,
            };
        }
        match u8::try_from(last.unsigned_abs()) {
            Ok(back) => Places::Spans {
                fixed: 0,
                tail: every,
                back,
            },
            Err(_) => Places::Any,
        }
    }

    /// These places and `other`'s (anywhere for two tails that end apart).
    fn with(self, other: Places) -> Places {
        match (self, other) {
            (Places::Any, _) | (_, Places::Any) => Places::Any,
            (Places::None, p) | (p, Places::None) => p,
            (
                Places::Spans { fixed, tail, back },
                Places::Spans {
                    fixed: f,
                    tail: t,
                    back: b,
                },
            ) => {
                if tail != 0 && t != 0 && back != b {
                    return Places::Any;
                }
                Places::Spans {
                    fixed: fixed | f,
                    tail: tail | t,
                    back: if tail != 0 { back } else { b },
                }
            }
        }
    }

    /// These places among `argc` arguments (the name included), at most
    /// 64: bit `i` for argument `i`.
    #[inline]
    fn positions(&self, argc: usize) -> u64 {
        let all = low_bits(argc.min(64));
        match *self {
            Places::None => 0,
            Places::Spans { fixed, tail, back } => {
                let before_end = argc.saturating_sub(back as usize) + 1;
                (fixed | tail & low_bits(before_end.min(64))) & all
            }
            Places::Any => all & !1,
        }
    }

    /// Does `f` hold for one of these places among `argc` arguments (the
    /// name included)? The first that does ends the search.
    pub fn any(&self, argc: usize, f: impl FnMut(usize) -> bool) -> bool {
        match self {
            Places::None => false,
            Places::Spans { .. } if argc <= 64 => any_bit(self.positions(argc), f),
            _ => (1..argc).any(f),
        }
    }
}

/// Every command's [`Places`] by name, looked up for every command the
/// server runs while a guard stands: an open-addressed table keyed by the
/// name's length and up to two words of it, compared whatever their case
/// (a name of up to 16 bytes: every command of the tested servers but
/// `GEORADIUSBYMEMBER`), no hashing of the whole name, no lower-casing,
/// no allocation. A name it does not hold (a longer one, a command loaded
/// since, one the server does not know) is [`Places::Any`]. In front of
/// it, the last commands looked up (one per [`Last`] entry, chosen by the
/// name's first byte and length) with their argument count, and their
/// positions: a pipeline of a few commands does not look their names up
/// again.
#[derive(Debug, Default)]
pub struct KeyPlaces {
    slots: Box<[Slot]>,
    /// 64 minus the table's bits.
    shift: u32,
    last: [Last; 16],
}

/// A command looked up lately: its name's two words, its length and
/// argument count (`len | argc << 8`), the positions (bit `i`: argument
/// `i`), and a check word that a read mixing two entries would not match
/// (the filter runs on one thread at a time; atomics keep that safe).
#[derive(Debug, Default)]
struct Last {
    a: AtomicU64,
    b: AtomicU64,
    len_argc: AtomicU64,
    at: AtomicU64,
    check: AtomicU64,
}

impl Last {
    #[inline(always)]
    fn get(&self, (a, b): (u64, u64), len_argc: u64) -> Option<u64> {
        let at = self.at.load(Relaxed);
        (self.a.load(Relaxed) == a
            && self.b.load(Relaxed) == b
            && self.len_argc.load(Relaxed) == len_argc
            && self.check.load(Relaxed) == a ^ b.rotate_left(17) ^ len_argc ^ at.rotate_left(31))
        .then_some(at)
    }

    fn set(&self, (a, b): (u64, u64), len_argc: u64, at: u64) {
        self.check.store(0, Relaxed);
        self.a.store(a, Relaxed);
        self.b.store(b, Relaxed);
        self.len_argc.store(len_argc, Relaxed);
        self.at.store(at, Relaxed);
        self.check.store(
            a ^ b.rotate_left(17) ^ len_argc ^ at.rotate_left(31),
            Relaxed,
        );
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The name's length; 0: an empty slot.
    len: usize,
    /// The name in lower case, as `name_words` reads it.
    words: (u64, u64),
    /// 0x20 in each byte of `words` that is a letter: where a name looked
    /// up may differ from it (its case).
    case: (u64, u64),
    places: Places,
}

/// A name of 1 to 16 bytes as two words, which with its length give it
/// whole: its first and last eight bytes (overlapping), or its first and
/// last four, or its first, middle and last byte.
#[inline(always)]
fn name_words(name: &[u8]) -> Option<(u64, u64)> {
    let n = name.len();
    if let (Some(f), Some(l)) = (name.first_chunk::<8>(), name.last_chunk::<8>()) {
        if n > 16 {
            return None;
        }
        Some((u64::from_le_bytes(*f), u64::from_le_bytes(*l)))
    } else if let (Some(f), Some(l)) = (name.first_chunk::<4>(), name.last_chunk::<4>()) {
        let f = u32::from_le_bytes(*f) as u64;
        Some((f | (u32::from_le_bytes(*l) as u64) << 32, 0))
    } else {
        let first = *name.first()? as u64;
        Some((
            first | (name[n / 2] as u64) << 8 | (name[n - 1] as u64) << 16,
            0,
        ))
    }
}

/// 0x20 in each byte of `w` that is an ASCII letter.
fn letters(w: u64) -> u64 {
    w.to_le_bytes()
        .iter()
        .enumerate()
        .filter(|(_, b)| b.is_ascii_alphabetic())
        .fold(0, |m, (i, _)| m | 0x20 << (8 * i))
}

/// Bit 5 of every byte set: the same for a name in any case (and for a
/// few non-letters: the slot's `case` tells them apart).
const FOLD: u64 = 0x2020_2020_2020_2020;

impl KeyPlaces {
    /// The places of every command of `table` named up to 16 bytes;
    /// nowhere for a name `checked` says no to.
    fn new(table: &Table, checked: impl Fn(&[u8]) -> bool) -> KeyPlaces {
        let held: Vec<Slot> = table
            .commands
            .iter()
            .filter_map(|(name, c)| {
                let places = if checked(name) {
                    c.places()
                } else {
                    Places::None
                };
                let words = name_words(name)?;
                Some(Slot {
                    len: name.len(),
                    words,
                    case: (letters(words.0), letters(words.1)),
                    places,
                })
            })
            .collect();
        let bits = (held.len() * 2)
            .next_power_of_two()
            .max(16)
            .trailing_zeros();
        let mut slots = vec![Slot::default(); 1 << bits].into_boxed_slice();
        let shift = 64 - bits;
        for slot in held {
            let mut at = slot_of(slot.len, slot.words, shift);
            while slots[at].len != 0 {
                at = (at + 1) & (slots.len() - 1);
            }
            slots[at] = slot;
        }
        KeyPlaces {
            slots,
            shift,
            last: Default::default(),
        }
    }

    /// Does `f` hold for one of the places of the command `name` (any
    /// case) among `argc` arguments (the name included)? The first that
    /// does ends the search.
    #[inline(always)]
    pub fn any(&self, name: &[u8], argc: usize, f: impl FnMut(usize) -> bool) -> bool {
        let Some(words) = name_words(name) else {
            return (1..argc).any(f);
        };
        if argc > 64 {
            return self.find(name.len(), words).any(argc, f);
        }
        let len_argc = name.len() as u64 | (argc as u64) << 8;
        // The first byte and the length pick the entry (the first byte is
        // the low byte of the first word).
        let last = &self.last[(words.0 as usize ^ name.len()) % 16];
        let at = match last.get(words, len_argc) {
            Some(at) => at,
            None => {
                let at = self.find(name.len(), words).positions(argc);
                last.set(words, len_argc, at);
                at
            }
        };
        any_bit(at, f)
    }

    /// The places of the command `name` (any case).
    pub fn of(&self, name: &[u8]) -> &Places {
        match name_words(name) {
            Some(words) => self.find(name.len(), words),
            None => &Places::Any,
        }
    }

    /// The places of the command of `len` bytes whose words are `(a, b)`.
    #[inline]
    fn find(&self, len: usize, (a, b): (u64, u64)) -> &Places {
        if self.slots.is_empty() {
            return &Places::Any;
        }
        let mask = self.slots.len() - 1;
        let mut at = slot_of(len, (a, b), self.shift);
        loop {
            let slot = &self.slots[at];
            if slot.len == len
                && (a ^ slot.words.0) & !slot.case.0 == 0
                && (b ^ slot.words.1) & !slot.case.1 == 0
            {
                return &slot.places;
            }
            if slot.len == 0 {
                return &Places::Any;
            }
            at = (at + 1) & mask;
        }
    }
}

/// The slot a name's words start looking from, whatever its case.
#[inline(always)]
fn slot_of(len: usize, (a, b): (u64, u64), shift: u32) -> usize {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    (((a | FOLD) ^ len as u64 ^ (b | FOLD).rotate_left(29)).wrapping_mul(K)).wrapping_shr(shift)
        as usize
}

enum Found {
    /// First, last, step; and for a keyword search, where the keyword was
    /// found (the next search starts past it).
    Keys(usize, usize, usize, Option<usize>),
    None,
    Invalid,
}

impl Spec {
    /// The keys of the first search hit past argument `after` (0: the
    /// server's own search).
    fn positions(&self, argv: &[&[u8]], after: usize) -> Found {
        let argc = argv.len() as i64;
        let mut hit_at = None;
        let first = match &self.begin {
            Begin::Index(i) => *i as i64,
            Begin::Keyword { keyword, startfrom } => {
                let from = if *startfrom > 0 {
                    *startfrom
                } else {
                    argc + startfrom
                };
                let is_hit = |i: &i64| argv[*i as usize].eq_ignore_ascii_case(keyword);
                let hit = if *startfrom > 0 {
                    (from.max(1).max(after as i64 + 1)..argc).find(is_hit)
                } else if after == 0 {
                    (1..=from.min(argc - 1)).rev().find(is_hit)
                } else {
                    (1..after as i64).rev().find(is_hit)
                };
                match hit {
                    Some(i) => {
                        hit_at = Some(i as usize);
                        i + 1
                    }
                    None => return Found::None,
                }
            }
            Begin::Unknown => return Found::Invalid,
        };
        let (first, last, step) = match &self.find {
            Find::Range {
                lastkey,
                keystep,
                limit,
            } => {
                let last = if *lastkey >= 0 {
                    first + lastkey
                } else if *limit == 0 {
                    argc + lastkey
                } else {
                    first + ((argc - first) / *limit as i64 + lastkey)
                };
                (first, last, *keystep)
            }
            Find::Keynum {
                keynumidx,
                firstkey,
                keystep,
            } => {
                let at = first + *keynumidx as i64;
                if at >= argc {
                    return Found::Invalid;
                }
                let Some(n) = std::str::from_utf8(argv[at as usize])
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                else {
                    return Found::Invalid;
                };
                if n < 0 || n > argc {
                    return Found::Invalid;
                }
                // `n` keys, one every `keystep` arguments (MSETEX's
                // key-value pairs: a step of 2).
                let first = first + *firstkey as i64;
                let step = i64::try_from(*keystep).unwrap_or(i64::MAX);
                (
                    first,
                    first.saturating_add((n - 1).saturating_mul(step)),
                    *keystep,
                )
            }
            Find::Unknown => return Found::Invalid,
        };
        if step == 0 {
            return Found::Invalid;
        }
        if first < 1 || first >= argc || last >= argc {
            return Found::Invalid;
        }
        if last < first {
            // No keys: a key count of 0 (LMPOP refuses it, ZUNION too).
            return Found::None;
        }
        Found::Keys(first as usize, last as usize, step, hit_at)
    }
}

fn parse_command(entry: &Value) -> Option<(Vec<u8>, Command)> {
    let a = entry.array()?;
    let name = a.first()?.str()?.to_ascii_lowercase();
    let specs = match a.get(8) {
        Some(Value::Array(specs)) => specs.iter().map(parse_spec).collect::<Option<Vec<_>>>()?,
        _ => Vec::new(),
    };
    let arity = a.get(1).and_then(Value::int).unwrap_or(0);
    let flags: Vec<&[u8]> = a.get(2)?.array()?.iter().filter_map(Value::str).collect();
    let flag = |f: &[u8]| flags.iter().any(|x| x.eq_ignore_ascii_case(f));
    // A module command registered without key specs gets a read-write
    // spec from the server (`JSON.GET`, `VCARD`): its `readonly` flag
    // overrules it.
    let spec_writes = specs.iter().any(|s| s.writes && !s.not_key);
    let kind = Kind {
        writes: flag(b"write") || (!flag(b"readonly") && spec_writes),
        blocking: flag(b"blocking"),
        noscript: flag(b"noscript"),
    };
    let writes_all = flag(b"write") && !spec_writes;
    let mut subcommands = Map::default();
    for sub in a.get(9).and_then(Value::array).unwrap_or_default() {
        let (full, command) = parse_command(sub)?;
        // "xgroup|create" -> "create"
        let short = match full.iter().position(|&b| b == b'|') {
            Some(p) => full[p + 1..].to_vec(),
            None => full,
        };
        subcommands.insert(short, command);
    }
    Some((
        name,
        Command {
            arity,
            kind,
            specs,
            writes_all,
            subcommands,
            movable: flag(b"movablekeys"),
        },
    ))
}

fn parse_spec(v: &Value) -> Option<Spec> {
    let flags: Vec<Vec<u8>> = v
        .field(b"flags")?
        .array()?
        .iter()
        .filter_map(|f| f.str().map(|s| s.to_ascii_lowercase()))
        .collect();
    let has = |f: &[u8]| flags.iter().any(|x| x == f);
    let begin_v = v.field(b"begin_search")?;
    let begin_spec = begin_v.field(b"spec");
    let begin = match begin_v.field(b"type")?.str()? {
        b"index" => Begin::Index(usize::try_from(begin_spec?.field(b"index")?.int()?).ok()?),
        b"keyword" => Begin::Keyword {
            keyword: begin_spec?.field(b"keyword")?.str()?.to_vec(),
            startfrom: begin_spec?.field(b"startfrom")?.int()?,
        },
        _ => Begin::Unknown,
    };
    let find_v = v.field(b"find_keys")?;
    let find_spec = find_v.field(b"spec");
    let uint = |s: Option<&Value>, name: &[u8]| -> Option<usize> {
        usize::try_from(s?.field(name)?.int()?).ok()
    };
    let find = match find_v.field(b"type")?.str()? {
        b"range" => Find::Range {
            lastkey: find_spec?.field(b"lastkey")?.int()?,
            keystep: uint(find_spec, b"keystep")?,
            limit: uint(find_spec, b"limit")?,
        },
        b"keynum" => Find::Keynum {
            keynumidx: uint(find_spec, b"keynumidx")?,
            firstkey: uint(find_spec, b"firstkey")?,
            keystep: uint(find_spec, b"keystep")?,
        },
        _ => Find::Unknown,
    };
    Some(Spec {
        writes: has(b"rw") || has(b"ow") || has(b"rm"),
        not_key: has(b"not_key"),
        unsure: has(b"incomplete") || has(b"variable_flags"),
        incomplete: has(b"incomplete"),
        begin,
        find,
    })
}

/// The captured `COMMAND` replies of every tested server
/// (tests/fixtures/command-info), for the tests here and in `guard.rs`.
#[cfg(test)]
pub(crate) mod testdata {
    use super::*;

    /// Every command name of `t`, sorted.
    pub(crate) fn names(t: &Table) -> Vec<&[u8]> {
        let mut v: Vec<&[u8]> = t.commands.keys().map(Vec::as_slice).collect();
        v.sort();
        v
    }

    /// A RESP2 reader for the captured replies (tests/fixtures/command-info).
    pub(crate) fn parse(buf: &[u8], at: &mut usize) -> Value {
        let line_end = buf[*at..].windows(2).position(|w| w == b"\r\n").unwrap() + *at;
        let kind = buf[*at];
        let text = std::str::from_utf8(&buf[*at + 1..line_end]).unwrap();
        *at = line_end + 2;
        match kind {
            b':' => Value::Int(text.parse().unwrap()),
            b'+' => Value::Str(text.as_bytes().to_vec()),
            b'$' => {
                let n: i64 = text.parse().unwrap();
                if n < 0 {
                    return Value::Nil;
                }
                let s = buf[*at..*at + n as usize].to_vec();
                *at += n as usize + 2;
                Value::Str(s)
            }
            b'*' => {
                let n: i64 = text.parse().unwrap();
                if n < 0 {
                    return Value::Nil;
                }
                Value::Array((0..n).map(|_| parse(buf, at)).collect())
            }
            other => panic!("unexpected RESP type {}", other as char),
        }
    }

    pub(crate) fn written(t: &Table, argv: &[&[u8]]) -> (Keys, Vec<usize>) {
        let mut pos = Vec::new();
        let keys = t.written(argv, |i| pos.push(i));
        (keys, pos)
    }

    pub(crate) const SERVERS: [&str; 6] = [
        "redis70", "redis74", "redis80", "redis82", "valkey81", "valkey91",
    ];

    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/command-info/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    pub(crate) fn table(server: &str) -> Table {
        let buf = fixture(&format!("{server}.resp"));
        let mut at = 0;
        let t = Table::from_command_info(&parse(&buf, &mut at));
        assert_eq!(at, buf.len(), "{server}: one whole reply");
        t
    }
}

#[cfg(test)]
mod tests {
    use super::testdata::*;
    use super::*;

    /// Splits a line of cases.txt the way the shell that captured it did:
    /// words, with '' quotes and "" for an empty argument.
    fn words(line: &str) -> Vec<Vec<u8>> {
        line.split_whitespace()
            .map(|w| match w {
                "\"\"" => Vec::new(),
                w => w.trim_matches('\'').as_bytes().to_vec(),
            })
            .collect()
    }

    /// The server's own answer (`COMMAND GETKEYSANDFLAGS`, captured in
    /// <server>.keys): each key with its flags, or None for an error.
    fn server_answer(rest: &str) -> Option<Vec<(String, bool)>> {
        let rest = rest.trim();
        if rest.starts_with("ERR") {
            return None;
        }
        let mut out: Vec<(String, bool)> = Vec::new();
        for w in rest.split_whitespace() {
            match w {
                "RO" | "RW" | "OW" | "RM" => out.last_mut().unwrap().1 = w != "RO",
                w if w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                    && !out.is_empty() => {}
                key => out.push((key.to_string(), false)),
            }
        }
        Some(out)
    }

    #[test]
    fn every_servers_command_info_is_read_whole() {
        for server in SERVERS {
            let t = table(server);
            assert!(t.len() > 200, "{server}: {} commands", t.len());
            let xgroup = &t.commands[b"xgroup".as_slice()];
            assert!(
                xgroup.subcommands.contains_key(b"create".as_slice()),
                "{server}"
            );
        }
    }

    /// `f(server, its table, the line, argv, the keys and whether each
    /// is written)` for every line of every server's `<server>.keys` (the
    /// server's own `COMMAND GETKEYSANDFLAGS`) whose command it has.
    fn each_server_answer(mut f: impl FnMut(&str, &Table, &str, &[&[u8]], Vec<(String, bool)>)) {
        for server in SERVERS {
            let t = table(server);
            let keys = String::from_utf8(fixture(&format!("{server}.keys"))).unwrap();
            for line in keys.lines() {
                let (argv, answer) = line.split_once(" => ").unwrap();
                let argv = words(argv);
                let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
                let Some(answer) = server_answer(answer) else {
                    continue; // a command this server does not have
                };
                f(server, &t, line, &argv, answer);
            }
        }
    }

    #[test]
    fn written_keys_agree_with_the_servers_own_answer_on_every_server() {
        let mut asked = 0;
        let mut checked = 0;
        each_server_answer(|server, t, line, argv, answer| {
            // Where the command flags overrule the specs: XREADGROUP
            // (`write`, its spec `RO`) writes its keys; PFCOUNT
            // (`readonly`, its spec `RW` for the cached count it may
            // update) writes none.
            let name = String::from_utf8_lossy(argv[0]).to_ascii_lowercase();
            let want: Vec<&[u8]> = answer
                .iter()
                .filter(|(_, w)| match name.as_str() {
                    "xreadgroup" => true,
                    "pfcount" => false,
                    _ => *w,
                })
                .map(|(k, _)| k.as_bytes())
                .collect();
            let (keys, pos) = written(t, argv);
            match keys {
                Keys::Given => {
                    let got: Vec<&[u8]> = pos.iter().map(|&i| argv[i]).collect();
                    assert_eq!(got, want, "{server}: {line}");
                    checked += 1;
                }
                Keys::Ask => asked += 1,
            }
        });
        assert!(checked > 300, "{checked} checked, {asked} asked");
    }

    #[test]
    fn commands_with_a_key_function_are_asked() {
        for server in SERVERS {
            let t = table(server);
            for line in [
                "SET {t}a v",
                "SORT {t}l STORE {t}d",
                "MIGRATE h 1 \"\" 0 10 KEYS {t}a",
                "BITFIELD {t}a GET u8 0",
            ] {
                let argv = words(line);
                let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
                assert_eq!(written(&t, &argv).0, Keys::Ask, "{server}: {line}");
            }
        }
    }

    #[test]
    fn reads_and_unknown_subcommands_write_nothing() {
        let t = table("redis70");
        for line in [
            "GET {t}a",
            "MGET {t}a {t}b",
            "XINFO STREAM {t}x",
            "OBJECT NOSUCH {t}a",
            "PING",
        ] {
            let argv = words(line);
            let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            assert_eq!(written(&t, &argv), (Keys::Given, vec![]), "{line}");
        }
        assert_eq!(written(&t, &[b"NOSUCHCOMMAND".as_slice()]).0, Keys::Ask);
        assert_eq!(
            written(&t, &[[b'x'; 40].as_slice()]).0,
            Keys::Ask,
            "a name too long to be a command"
        );
    }

    #[test]
    fn the_command_flags_overrule_specs_that_say_less() {
        for server in SERVERS {
            let t = table(server);
            let case = |line: &str| {
                let argv = words(line);
                let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
                let (keys, pos) = written(&t, &argv);
                (
                    keys,
                    pos.iter().map(|&i| argv[i].to_vec()).collect::<Vec<_>>(),
                )
            };
            let given = |keys: &[&str]| {
                (
                    Keys::Given,
                    keys.iter()
                        .map(|k| k.as_bytes().to_vec())
                        .collect::<Vec<_>>(),
                )
            };
            // `write`, its spec `RO`: the group's state is written.
            assert_eq!(
                case("XREADGROUP GROUP g c STREAMS {t}x {t}y > >"),
                given(&["{t}x", "{t}y"]),
                "{server}"
            );
            // `readonly`, its spec `RW`: reads.
            assert_eq!(case("PFCOUNT {t}h"), given(&[]), "{server}");
            if server == "redis82" {
                assert_eq!(case("VCARD {t}v"), given(&[]), "{server}");
            }
            // An option given twice: the server uses the last (Valkey 9.1
            // marks these specs incomplete: its key function is asked).
            for line in [
                "GEORADIUS {x}g 0 0 1 km STORE {x}a STORE {t}d",
                "GEORADIUSBYMEMBER {x}g m 1 km STOREDIST {x}a STOREDIST {t}d",
            ] {
                let got = case(line);
                assert!(
                    got == given(&["{x}a", "{t}d"]) || got.0 == Keys::Ask,
                    "{server}: {line}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn a_command_with_the_wrong_number_of_arguments_writes_nothing() {
        for server in SERVERS {
            let t = table(server);
            // The server refuses these for their arity before they run.
            for line in [
                "SET {t}a",
                "HSET {t}h f",
                "GETSET {t}a x y",
                "XGROUP CREATE {t}x",
            ] {
                let argv = words(line);
                let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
                assert_eq!(
                    written(&t, &argv),
                    (Keys::Given, vec![]),
                    "{server}: {line}"
                );
            }
        }
    }

    #[test]
    fn a_key_count_that_is_not_a_number_or_runs_past_the_end_is_asked() {
        let t = table("valkey91");
        for line in [
            "ZUNIONSTORE {t}d x {t}z",
            "ZUNIONSTORE {t}d 5 {t}z",
            "ZUNIONSTORE {t}d 9223372036854775807 {t}z",
            "LMPOP -1 {t}l LEFT",
        ] {
            let argv = words(line);
            let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            assert_eq!(written(&t, &argv).0, Keys::Ask, "{line}");
        }
    }

    /// "A write" (`Kind::writes`) is the `write` flag for every command
    /// of every server but the script commands, which the fence refuses
    /// anyway (`noscript`): the one meaning changed the `SHARED` rule for
    /// no command of the servers, only for a module's command flagged
    /// neither `write` nor `readonly` whose key specs write.
    #[test]
    fn a_write_is_the_write_flag_on_every_server_but_for_scripts() {
        fn walk(e: &Value, server: &str, seen: &mut usize) {
            let a = e.array().unwrap();
            let (name, c) = parse_command(e).unwrap();
            let flags: Vec<&[u8]> = a[2]
                .array()
                .unwrap()
                .iter()
                .filter_map(Value::str)
                .collect();
            let write = flags.iter().any(|f| *f == b"write");
            assert!(
                c.kind.writes == write || c.kind.noscript,
                "{server}: {}",
                String::from_utf8_lossy(&name)
            );
            *seen += 1;
            for sub in a.get(9).and_then(Value::array).unwrap_or_default() {
                walk(sub, server, seen);
            }
        }
        for server in SERVERS {
            let buf = fixture(&format!("{server}.resp"));
            let mut seen = 0;
            for e in parse(&buf, &mut 0).array().unwrap() {
                walk(e, server, &mut seen);
            }
            assert!(seen > 300, "{server}: {seen}");
        }
    }

    /// The positions `places` gives among `argv`'s arguments, by the
    /// name-keyed table (twice: the second from its entries of the last
    /// commands) and by the command's own places.
    fn positions(p: &KeyPlaces, argv: &[&[u8]]) -> Vec<usize> {
        let mut got = Vec::new();
        p.any(argv[0], argv.len(), |i| {
            got.push(i);
            false
        });
        let mut again = Vec::new();
        p.any(argv[0], argv.len(), |i| {
            again.push(i);
            false
        });
        assert_eq!(got, again, "{argv:?}: the entry of the last commands");
        let mut direct = Vec::new();
        p.of(argv[0]).any(argv.len(), |i| {
            direct.push(i);
            false
        });
        direct.sort();
        assert_eq!(got, direct, "{argv:?}");
        got
    }

    fn argv_of(line: &str) -> Vec<Vec<u8>> {
        words(line)
    }

    #[test]
    fn key_places_by_name_and_argument_count() {
        for server in SERVERS {
            let t = table(server);
            // As if the guards never checked FCALL (they never check the
            // lease commands, scripts, MIGRATE: guard::is_checked).
            let p = t.key_places(|name| name != b"fcall");
            let case = |line: &str| {
                let argv = argv_of(line);
                let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
                positions(&p, &argv)
            };
            // Fixed positions, whatever the case of the name.
            assert_eq!(case("SET {t}:k v NX PX 60000"), [1], "{server}");
            assert_eq!(case("set {t}:k v"), [1], "{server}");
            assert_eq!(case("SeT {t}:k v GET"), [1], "{server}");
            assert_eq!(case("HSET h f v f2 v2"), [1], "{server}");
            assert_eq!(case("EXPIRE k 10"), [1], "{server}");
            // From the end: every one, every other.
            assert_eq!(case("DEL a b c"), [1, 2, 3], "{server}");
            assert_eq!(case("MSET k1 v1 k2 v2 k3 v3"), [1, 3, 5], "{server}");
            assert_eq!(case("MSETNX k1 v1 k2 v2"), [1, 3], "{server}");
            // Two specs.
            assert_eq!(case("LMOVE a b LEFT RIGHT"), [1, 2], "{server}");
            assert_eq!(case("RENAME a b"), [1, 2], "{server}");
            assert_eq!(case("COPY a b DB 1 REPLACE"), [1, 2], "{server}");
            // A container: its subcommands' places together.
            assert_eq!(case("XGROUP CREATE x g $ MKSTREAM"), [2], "{server}");
            // Writes no key, or the guards never check it.
            assert_eq!(case("GET k"), [] as [usize; 0], "{server}");
            assert_eq!(case("MGET a b c"), [] as [usize; 0], "{server}");
            assert_eq!(case("CONFIG SET a b"), [] as [usize; 0], "{server}");
            assert_eq!(case("FCALL f 1 {t}k"), [] as [usize; 0], "{server}");
            // Keys that are not at fixed positions: every argument.
            let all = |n: usize| (1..n).collect::<Vec<_>>();
            assert_eq!(
                case("XREADGROUP GROUP g c STREAMS {t}x >"),
                all(7),
                "{server}"
            );
            assert_eq!(case("ZUNIONSTORE d 2 a b"), all(5), "{server}");
            assert_eq!(case("EVAL s 1 {t}k"), all(4), "{server}");
            assert_eq!(case("SORT l STORE {t}d"), all(4), "{server}");
            assert_eq!(case("MIGRATE h 1 \"\" 0 10 KEYS {t}a"), all(8), "{server}");
            assert_eq!(case("NOSUCHCOMMAND a b"), all(3), "{server}");
            assert_eq!(
                case("GEORADIUSBYMEMBER g m 1 km STORE {t}d"),
                all(7),
                "{server}"
            );
            // More than 64 arguments: every argument.
            let long: Vec<String> = (0..40).map(|i| format!("k{i} v{i}")).collect();
            assert_eq!(case(&format!("MSET {}", long.join(" "))), all(81));
        }
    }

    /// The places cover every key the specs give as written and every key
    /// the server's own key function names (`COMMAND GETKEYSANDFLAGS`, in
    /// `<server>.keys`), on every tested server: the cheap test reads no
    /// fewer arguments than the full check.
    #[test]
    fn key_places_cover_what_the_specs_and_the_server_find() {
        let mut covered = 0;
        let mut places: Option<(String, KeyPlaces)> = None;
        each_server_answer(|server, t, line, argv, answer| {
            if places.as_ref().is_none_or(|(s, _)| s != server) {
                places = Some((server.to_string(), t.key_places(|_| true)));
            }
            let p = &places.as_ref().expect("this server's places").1;
            let at = positions(p, argv);
            let named: Vec<&[u8]> = at.iter().map(|&i| argv[i]).collect();
            let writes = t.get(argv[0]).is_some_and(|c| c.places() != Places::None);
            for (key, _) in &answer {
                assert!(
                    named.contains(&key.as_bytes()) || !writes,
                    "{server}: {line}: {at:?}"
                );
            }
            let (_, written) = written(t, argv);
            assert!(written.iter().all(|w| at.contains(w)), "{server}: {line}");
            covered += 1;
        });
        assert!(covered > 300, "{covered}");
    }

    #[test]
    fn names_that_differ_by_more_than_case_are_not_confused() {
        let t = table("redis70");
        let p = t.key_places(|_| true);
        assert_eq!(
            p.of(b"SET"),
            &Places::Spans {
                fixed: 2,
                tail: 0,
                back: 0
            }
        );
        // Bit 5 flipped where it is no case: not SET, nor GETEX, nor
        // ZRANGESTORE.
        for name in [
            &b"S\x05T"[..],
            b"sEt\x00",
            b"GETE\x18",
            b"ZRANGE\x13TORE",
            b"",
            b"SE",
        ] {
            assert_eq!(p.of(name), &Places::Any, "{name:?}");
        }
        assert_eq!(p.of(b"zrangestore"), p.of(b"ZRANGESTORE"));
        assert_eq!(p.of(b"getex"), p.of(b"GETEX"));
    }
}
