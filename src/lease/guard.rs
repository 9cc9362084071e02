//! Guarded keys (design.md S12): a lease key that guards its hash tag makes
//! every other key of its database with that tag writable only through
//! `LEASE.FENCE guard token ...`. Here: the hash tag rule, the set of
//! guards the binding keeps (by database and tag), and the decision on one
//! command, as values; the binding's command filter asks it, and rewrites
//! a refused command into the refusal.
//!
//! The decision runs for every command the server runs while a guard
//! stands, so it is cheap first: arguments without a guarded tag pass
//! before the command's key specs are read (`keyspec.rs`).

use std::collections::HashMap;

use super::args::parse_i64;
use super::keyspec::is_lease_command;

/// A map looked up for every argument with a hash tag while a guard
/// stands: a fast hasher (foldhash), not SipHash.
type Map<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// The hash tag of a key, as cluster slots read it: the bytes between the
/// first `{` and the first `}` after it, when there are some. The one hash
/// tag rule: the guards' tags and the cluster slot (`fence::key_slot`).
#[inline(always)]
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = find_byte(key, b'{')?;
    tag_after(&key[open + 1..])
}

/// The tag that runs from the start of `rest` (past a `{`) to its first
/// `}`, when it is not empty.
#[inline(always)]
fn tag_after(rest: &[u8]) -> Option<&[u8]> {
    let close = find_byte(rest, b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// The first `needle` in `hay`, eight bytes at a time (the filter scans
/// every argument of every command while a guard stands); the last bytes
/// of a `hay` of 8 bytes or more in one word that overlaps those looked
/// at already.
#[inline(always)]
fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    if hay.len() < 8 {
        return hay.iter().position(|&b| b == needle);
    }
    // The high bit of each byte of `word` that is `needle`: exact for the
    // first of them (the bytes before it that overlap words looked at
    // already hold no `needle`).
    let pattern = ONES * needle as u64;
    let hits = |word: &[u8; 8]| {
        let w = u64::from_le_bytes(*word) ^ pattern;
        w.wrapping_sub(ONES) & !w & HIGHS
    };
    let n = hay.len();
    let first = hay.first_chunk::<8>()?;
    let last = hay.last_chunk::<8>()?;
    // Most keys: up to three words, the last overlapping.
    if n <= 24 {
        let h = hits(first);
        if h != 0 {
            return Some((h.trailing_zeros() / 8) as usize);
        }
        if n > 16 {
            let middle = hay[8..].first_chunk::<8>()?;
            let h = hits(middle);
            if h != 0 {
                return Some(8 + (h.trailing_zeros() / 8) as usize);
            }
        }
        let h = hits(last);
        return (h != 0).then(|| n - 8 + (h.trailing_zeros() / 8) as usize);
    }
    let (words, rest) = hay.as_chunks::<8>();
    for (i, word) in words.iter().enumerate() {
        let h = hits(word);
        if h != 0 {
            return Some(i * 8 + (h.trailing_zeros() / 8) as usize);
        }
    }
    if rest.is_empty() {
        return None;
    }
    let h = hits(last);
    (h != 0).then(|| n - 8 + (h.trailing_zeros() / 8) as usize)
}

/// Commands whose declared keys say nothing of what they write: scripts
/// and functions (their specs assume the worst; the writes inside them are
/// checked one by one as they run), and `MIGRATE`, which moves keys whole
/// between servers (a resharding moves a guard with its keys).
const NOT_CHECKED: [&[u8]; 7] = [
    b"eval",
    b"evalsha",
    b"eval_ro",
    b"evalsha_ro",
    b"fcall",
    b"fcall_ro",
    b"migrate",
];

/// Is the command `name` checked by its keys? Not the lease commands
/// (design.md S12), nor `NOT_CHECKED`; nor, in a cluster, the
/// `RESTORE-ASKING` of a resharding (on a server outside a cluster it is a
/// `RESTORE` like any other).
#[inline]
pub fn is_checked(name: &[u8], cluster: bool) -> bool {
    let lease = is_lease_command(name);
    let moves = cluster && name.eq_ignore_ascii_case(b"restore-asking");
    !(lease || moves || NOT_CHECKED.iter().any(|n| n.eq_ignore_ascii_case(name)))
}

/// The database a command runs in, as the binding knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Known(i32),
    /// The server does not say (Redis 7.0's filter knows no client; a
    /// script's or another module's client is not listed): a guard of any
    /// database covers the write.
    Any,
}

/// The guards standing: for each hash tag, the guard key of each database
/// that has one.
/// The guard keys of one tag: (database, key).
type OfTag = Vec<(i32, Box<[u8]>)>;

#[derive(Debug, Default, Clone)]
pub struct Guards {
    by_tag: Map<Box<[u8]>, OfTag>,
    len: usize,
}

impl Guards {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The guard of `tag` in `db`, if any.
    pub fn guard_of(&self, db: i32, tag: &[u8]) -> Option<&[u8]> {
        self.by_tag
            .get(tag)?
            .iter()
            .find(|(d, _)| *d == db)
            .map(|(_, g)| &**g)
    }

    /// Is `tag` guarded in any database?
    #[inline]
    pub fn tag_guarded(&self, tag: &[u8]) -> bool {
        self.by_tag.contains_key(tag)
    }

    /// `key` of `db` guards its tag from now on (it has one; the caller
    /// checked that no other key guards it). Returns whether it is new.
    pub fn add(&mut self, db: i32, key: &[u8]) -> bool {
        let Some(tag) = hash_tag(key) else {
            return false;
        };
        let list = self.by_tag.entry(tag.into()).or_default();
        if let Some(at) = list.iter().position(|(d, _)| *d == db) {
            list[at].1 = key.into();
            return false;
        }
        list.push((db, key.into()));
        self.len += 1;
        true
    }

    /// `key` of `db` guards no more (it went, or stopped guarding).
    /// Returns whether it was a guard.
    pub fn remove(&mut self, db: i32, key: &[u8]) -> bool {
        let Some(tag) = hash_tag(key) else {
            return false;
        };
        let Some(list) = self.by_tag.get_mut(tag) else {
            return false;
        };
        let Some(at) = list.iter().position(|(d, g)| *d == db && **g == *key) else {
            return false;
        };
        list.swap_remove(at);
        if list.is_empty() {
            self.by_tag.remove(tag);
        }
        self.len -= 1;
        true
    }

    /// Every guard key: (database, key).
    pub fn keys(&self) -> impl Iterator<Item = (i32, &[u8])> {
        self.by_tag.values().flatten().map(|(d, k)| (*d, &**k))
    }

    /// A database emptied (`None`: all of them).
    pub fn flush(&mut self, db: Option<i32>) {
        for list in self.by_tag.values_mut() {
            list.retain(|(d, _)| db.is_some_and(|db| *d != db));
        }
        self.by_tag.retain(|_, list| !list.is_empty());
        self.len = self.by_tag.values().map(Vec::len).sum();
    }

    /// `SWAPDB a b`.
    pub fn swap(&mut self, a: i32, b: i32) {
        for list in self.by_tag.values_mut() {
            for (d, _) in list.iter_mut() {
                if *d == a {
                    *d = b;
                } else if *d == b {
                    *d = a;
                }
            }
        }
    }

    /// Must a command with the argument `arg` (of tag `tag`), run under
    /// the fence of `fencing`, be checked? Not when the fence's guard is
    /// the only guard of the tag (in any database) and `arg` is not the
    /// guard key itself: whatever the command writes of that tag, the
    /// fence lets it.
    pub fn needs_check(&self, arg: &[u8], tag: &[u8], fencing: Option<(i32, &[u8])>) -> bool {
        match (self.by_tag.get(tag), fencing) {
            (None, _) => false,
            (Some(list), Some((db, fence))) => {
                !(list.len() == 1 && list[0].0 == db && *list[0].1 == *fence && arg != fence)
            }
            (Some(_), None) => true,
        }
    }

    /// The decision on one command whose written keys are `written`
    /// (positions in `argv`), run in `db`, under the fence of `fencing`
    /// (the guard key and database of the `LEASE.FENCE` running it, if
    /// any).
    pub fn check<'a>(
        &'a self,
        argv: &[&'a [u8]],
        written: &[usize],
        db: Db,
        fencing: Option<(i32, &[u8])>,
    ) -> Verdict<'a> {
        let deletes = argv
            .first()
            .is_some_and(|n| n.eq_ignore_ascii_case(b"del") || n.eq_ignore_ascii_case(b"unlink"));
        // MOVE and COPY ... DB write a key of another database: MOVE's key
        // leaves this one too, COPY's destination is written only there.
        let elsewhere = other_database_write(argv);
        let only_there = elsewhere.and_then(|(at, _, here)| (!here).then_some(at));
        let keys = written
            .iter()
            .filter(|&&at| Some(at) != only_there)
            .map(|&at| (at, db))
            // The database a MOVE or COPY ... DB names is known whatever the
            // client's.
            .chain(elsewhere.map(|(at, other, _)| (at, Db::Known(other))));
        for (at, db) in keys {
            let Some(&key) = argv.get(at) else { continue };
            let Some(tag) = hash_tag(key) else { continue };
            let Some(list) = self.by_tag.get(tag) else {
                continue;
            };
            for (gdb, guard) in list {
                if let Db::Known(db) = db
                    && db != *gdb
                {
                    continue;
                }
                if **guard == *key {
                    // The guard key itself: DEL and UNLINK end the guard
                    // (the administrator's way out); nothing else but the
                    // lease commands writes it.
                    if deletes {
                        continue;
                    }
                } else if fencing.is_some_and(|(fdb, f)| fdb == *gdb && f == &**guard) {
                    continue;
                }
                return Verdict::Refuse { key, guard };
            }
        }
        Verdict::Pass
    }
}

/// The key a command writes in another database than its client's:
/// `MOVE key db` (the key arrives in `db`, and leaves the client's) and
/// `COPY source destination DB db` (the destination is in `db` alone);
/// (its position, that database, whether the client's is written too).
fn other_database_write(argv: &[&[u8]]) -> Option<(usize, i32, bool)> {
    let number = |a: &[u8]| parse_i64(a).and_then(|n| i32::try_from(n).ok());
    let name = argv.first()?;
    if name.eq_ignore_ascii_case(b"move") {
        return Some((1, number(argv.get(2)?)?, true));
    }
    if name.eq_ignore_ascii_case(b"copy") {
        // The server's own reading: options from the fourth argument, the
        // last `DB` winning.
        let mut db = None;
        let mut j = 3;
        while j < argv.len() {
            if argv[j].eq_ignore_ascii_case(b"db") && j + 1 < argv.len() {
                db = Some(number(argv[j + 1])?);
                j += 1;
            }
            j += 1;
        }
        return Some((2, db?, false));
    }
    None
}

/// What becomes of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// It runs (a `DEL` or `UNLINK` of a guard key among them: the guard
    /// ends, counted when the key goes).
    Pass,
    /// Refused: it writes `key`, which `guard` guards.
    Refuse { key: &'a [u8], guard: &'a [u8] },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_byte_finds_the_first_at_every_offset() {
        for len in 0..40 {
            for at in 0..=len {
                let mut hay = vec![b'a'; len];
                if at < len {
                    hay[at] = b'{';
                    if at + 3 < len {
                        hay[at + 3] = b'{';
                    }
                }
                let want = (at < len).then_some(at);
                assert_eq!(find_byte(&hay, b'{'), want, "len {len}, at {at}");
            }
        }
        assert_eq!(find_byte(&[0x7b ^ 0x80, 0x7b], b'{'), Some(1));
        assert_eq!(find_byte(&[0xff; 9], b'{'), None);
    }

    #[test]
    fn the_hash_tag_is_what_cluster_slots_read() {
        assert_eq!(hash_tag(b"{user1}:data"), Some(&b"user1"[..]));
        assert_eq!(hash_tag(b"a{b}c{d}"), Some(&b"b"[..]));
        assert_eq!(hash_tag(b"a{}b{c}"), None, "an empty first tag: no tag");
        assert_eq!(hash_tag(b"a{b"), None);
        assert_eq!(hash_tag(b"}a{b}"), Some(&b"b"[..]));
        assert_eq!(hash_tag(b"{{x}}"), Some(&b"{x"[..]));
        assert_eq!(hash_tag(b"plain"), None);
    }

    fn guards() -> Guards {
        let mut g = Guards::default();
        assert!(g.add(0, b"{t}:lock"));
        assert!(g.add(1, b"{t}:other"));
        assert!(g.add(0, b"{u}:lock"));
        g
    }

    #[test]
    fn lease_commands_scripts_and_a_clusters_moves_are_not_checked_by_their_keys() {
        for name in [
            &b"LEASE.ACQUIRE"[..],
            b"lease.fence",
            b"EVAL",
            b"fcall_ro",
            b"MIGRATE",
        ] {
            assert!(
                !is_checked(name, false),
                "{}",
                String::from_utf8_lossy(name)
            );
            assert!(!is_checked(name, true), "{}", String::from_utf8_lossy(name));
        }
        for name in [&b"SET"[..], b"RESTORE", b"lease", b"EVALX", b"del"] {
            assert!(is_checked(name, false), "{}", String::from_utf8_lossy(name));
            assert!(is_checked(name, true), "{}", String::from_utf8_lossy(name));
        }
        // A resharding's RESTORE-ASKING exists only in a cluster.
        assert!(!is_checked(b"restore-asking", true));
        assert!(is_checked(b"RESTORE-ASKING", false));
    }

    #[test]
    fn guards_are_kept_by_database_and_tag() {
        let mut g = guards();
        assert_eq!(g.len(), 3);
        assert_eq!(g.guard_of(0, b"t"), Some(&b"{t}:lock"[..]));
        assert_eq!(g.guard_of(1, b"t"), Some(&b"{t}:other"[..]));
        assert_eq!(g.guard_of(2, b"t"), None);
        assert!(!g.add(0, b"{t}:lock"), "twice is once");
        assert!(!g.add(0, b"notag"));
        assert!(!g.remove(0, b"{t}:other"), "not the guard of db 0");
        assert!(g.remove(1, b"{t}:other"));
        assert_eq!(g.len(), 2);
        g.swap(0, 3);
        assert_eq!(g.guard_of(3, b"u"), Some(&b"{u}:lock"[..]));
        assert_eq!(g.guard_of(0, b"u"), None);
        g.flush(Some(3));
        assert!(g.is_empty());
        let mut g = guards();
        g.flush(None);
        assert!(g.is_empty() && !g.tag_guarded(b"t"));
    }

    #[test]
    fn under_its_guards_fence_a_command_needs_no_check_but_for_the_guard_key() {
        let g = guards();
        let fence = Some((0, &b"{u}:lock"[..]));
        assert!(!g.needs_check(b"{u}:data", b"u", fence));
        assert!(
            g.needs_check(b"{u}:lock", b"u", fence),
            "the guard key itself"
        );
        assert!(g.needs_check(b"{u}:data", b"u", None), "no fence");
        assert!(
            g.needs_check(b"{u}:data", b"u", Some((1, b"{u}:lock"))),
            "another database's fence"
        );
        assert!(!g.needs_check(b"{x}:data", b"x", None), "an unguarded tag");
        // {t} has guards in two databases: a fence of one is checked.
        assert!(g.needs_check(b"{t}:data", b"t", Some((0, b"{t}:lock"))));
    }

    #[test]
    fn only_arguments_with_a_guarded_tag_are_looked_at() {
        let g = guards();
        let guarded = |arg: &[u8]| hash_tag(arg).is_some_and(|t| g.tag_guarded(t));
        assert!(guarded(b"{t}:a"));
        assert!(!guarded(b"{x}:a") && !guarded(b"{y}") && !guarded(b"v"));
    }

    #[test]
    fn a_write_to_a_guarded_key_is_refused_outside_its_guards_fence() {
        let g = guards();
        let argv: [&[u8]; 3] = [b"SET", b"{t}:a", b"v"];
        let refused = Verdict::Refuse {
            key: b"{t}:a",
            guard: b"{t}:lock",
        };
        assert_eq!(g.check(&argv, &[1], Db::Known(0), None), refused);
        assert_eq!(
            g.check(&argv, &[], Db::Known(0), None),
            Verdict::Pass,
            "a read"
        );
        assert_eq!(
            g.check(&argv, &[1], Db::Known(2), None),
            Verdict::Pass,
            "another database"
        );
        assert_eq!(
            g.check(&argv, &[1], Db::Known(0), Some((0, b"{t}:lock"))),
            Verdict::Pass
        );
        assert_eq!(
            g.check(&argv, &[1], Db::Known(0), Some((0, b"{u}:lock"))),
            refused,
            "another guard's fence"
        );
        assert_eq!(
            g.check(&argv, &[1], Db::Known(0), Some((1, b"{t}:lock"))),
            refused,
            "the fence of another database"
        );
        // Not knowing the database, a guard of any database covers it.
        assert!(matches!(
            g.check(&argv, &[1], Db::Any, Some((0, b"{t}:lock"))),
            Verdict::Refuse {
                guard: b"{t}:other",
                ..
            }
        ));
    }

    #[test]
    fn move_and_copy_to_another_database_are_checked_there() {
        let g = guards();
        // {t}:other guards {t} in database 1.
        let moved: [&[u8]; 3] = [b"MOVE", b"{t}:a", b"1"];
        assert!(matches!(
            g.check(&moved, &[1], Db::Known(2), None),
            Verdict::Refuse {
                guard: b"{t}:other",
                ..
            }
        ));
        let copied: [&[u8]; 5] = [b"COPY", b"{x}:src", b"{t}:a", b"db", b"1"];
        assert!(matches!(
            g.check(&copied, &[2], Db::Known(2), None),
            Verdict::Refuse {
                guard: b"{t}:other",
                ..
            }
        ));
        let copied: [&[u8]; 5] = [b"COPY", b"{x}:src", b"{t}:a", b"DB", b"3"];
        assert_eq!(g.check(&copied, &[2], Db::Known(2), None), Verdict::Pass);
        // DB twice: the server takes the last.
        let twice: [&[u8]; 8] = [
            b"COPY", b"{x}:src", b"{t}:a", b"DB", b"3", b"REPLACE", b"DB", b"1",
        ];
        assert!(matches!(
            g.check(&twice, &[2], Db::Known(2), None),
            Verdict::Refuse { .. }
        ));
        assert_eq!(other_database_write(&twice), Some((2, 1, false)));
        assert_eq!(
            other_database_write(&[b"COPY", b"a", b"b", b"DB", b"1", b"DB", b"3"]),
            Some((2, 3, false))
        );
        assert_eq!(
            other_database_write(&[b"MOVE", b"a", b"4"]),
            Some((1, 4, true))
        );
        // COPY ... DB writes nothing in the client's database: database
        // 1's guard of {t} does not stop a copy from it to database 3.
        let elsewhere: [&[u8]; 5] = [b"COPY", b"{t}:src", b"{t}:a", b"DB", b"3"];
        assert_eq!(g.check(&elsewhere, &[2], Db::Known(1), None), Verdict::Pass);
        // MOVE takes the key out of the client's database: checked there.
        let moved: [&[u8]; 3] = [b"MOVE", b"{t}:a", b"3"];
        assert!(matches!(
            g.check(&moved, &[1], Db::Known(1), None),
            Verdict::Refuse { .. }
        ));
        assert_eq!(
            other_database_write(&[b"COPY", b"a", b"b", b"REPLACE"]),
            None
        );
        assert_eq!(other_database_write(&[b"MOVE", b"a", b"x"]), None);
    }

    #[test]
    fn the_guard_key_itself_is_written_only_by_del_and_unlink() {
        let g = guards();
        for name in [&b"DEL"[..], b"unlink"] {
            assert_eq!(
                g.check(&[name, b"{t}:lock"], &[1], Db::Known(0), None),
                Verdict::Pass
            );
            assert!(matches!(
                g.check(
                    &[name, b"{t}:lock", b"{t}:data"],
                    &[1, 2],
                    Db::Known(0),
                    None
                ),
                Verdict::Refuse {
                    key: b"{t}:data",
                    ..
                }
            ));
        }
        for argv in [
            &[&b"SET"[..], b"{t}:lock", b"x"][..],
            &[b"RENAME", b"{t}:lock", b"{t}:x"],
            &[b"EXPIRE", b"{t}:lock", b"1"],
        ] {
            assert!(matches!(
                g.check(argv, &[1], Db::Known(0), Some((0, b"{t}:lock"))),
                Verdict::Refuse {
                    key: b"{t}:lock",
                    ..
                }
            ));
        }
    }

    /// Random arguments through the key-spec reading (`keyspec.rs`) and the
    /// guards' decision, on every server's table (bounded: a fixed seed, a fixed
    /// count): nothing panics or overflows, a position given is one of the
    /// arguments after the name, the cheap test's places (`KeyPlaces`)
    /// hold it, only a command that writes (`Kind::writes`) gives one, and
    /// a refusal names a written key of a guarded tag. The fuzz target `guard` (fuzz/) drives the same
    /// without bounds.
    #[test]
    fn random_arguments_read_in_bounds_and_decide_on_written_keys() {
        use crate::lease::keyspec::Keys;
        use crate::lease::keyspec::testdata::{SERVERS, names, table, written};
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        const WORDS: [&[u8]; 24] = [
            b"{t}a",
            b"{t}b",
            b"{u}c",
            b"{t}",
            b"x{",
            b"{}",
            b"",
            b"0",
            b"1",
            b"2",
            b"3",
            b"-1",
            b"9223372036854775807",
            b"-9223372036854775808",
            b"STORE",
            b"STOREDIST",
            b"STREAMS",
            b"KEYS",
            b"DB",
            b"BLOCK",
            b"GROUP",
            b"LEFT",
            b"REPLACE",
            b"COUNT",
        ];
        let mut guards = Guards::default();
        guards.add(0, b"{t}");
        guards.add(1, b"{u}");
        let mut rng = StdRng::seed_from_u64(44);
        let mut refused = 0;
        for server in SERVERS {
            let t = table(server);
            let places = t.key_places(|_| true);
            let mut names = names(&t);
            names.push(b"NOSUCH");
            for _ in 0..20_000 {
                let name = names[rng.random_range(0..names.len())];
                let argc = rng.random_range(0..9);
                let mut argv: Vec<&[u8]> = vec![name];
                let command = t.get(name);
                // A real subcommand half the time.
                if let Some(c) = command
                    && !c.subcommands.is_empty()
                    && rng.random_range(0..2) == 0
                {
                    let subs: Vec<&[u8]> = {
                        let mut v: Vec<&[u8]> = c.subcommands.keys().map(Vec::as_slice).collect();
                        v.sort();
                        v
                    };
                    argv.push(subs[rng.random_range(0..subs.len())]);
                }
                for _ in 0..argc {
                    argv.push(WORDS[rng.random_range(0..WORDS.len())]);
                }
                let (keys, pos) = written(&t, &argv);
                for &p in &pos {
                    assert!(p >= 1 && p < argv.len(), "{server}: {argv:?}: {pos:?}");
                }
                // The cheap test reads every written key's argument.
                let mut read = Vec::new();
                places.any(argv[0], argv.len(), |i| {
                    read.push(i);
                    false
                });
                assert!(
                    read.iter().all(|&i| i >= 1 && i < argv.len())
                        && pos.iter().all(|p| read.contains(p)),
                    "{server}: {argv:?}: {pos:?} written, {read:?} read"
                );
                if keys == Keys::Given && !pos.is_empty() {
                    let (c, _) = t.command(argv[0], argv.get(1).copied()).unwrap();
                    assert!(c.kind.writes, "{server}: {argv:?}");
                }
                let db = if rng.random_range(0..2) == 0 {
                    Db::Any
                } else {
                    Db::Known(rng.random_range(0..3))
                };
                if let Verdict::Refuse { key, guard } = guards.check(&argv, &pos, db, None) {
                    refused += 1;
                    assert!(
                        pos.iter().any(|&p| argv[p] == key)
                            || argv[0].eq_ignore_ascii_case(b"move")
                            || argv[0].eq_ignore_ascii_case(b"copy"),
                        "{server}: {argv:?}"
                    );
                    assert_eq!(hash_tag(key), hash_tag(guard), "{server}: {argv:?}");
                }
            }
        }
        assert!(refused > 100, "{refused} refused");
    }
}
