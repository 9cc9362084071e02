//! Random arguments through the guards' decision and the key-spec reading
//! (design.md S12): `lease::keyspec` reads the server's command table (a
//! captured one, or one read from the input itself, any shape), and every
//! argument vector gets the positions of the keys it writes, in bounds,
//! each among the arguments the cheap test reads (`KeyPlaces`, by the
//! name and the argument count), then the guards' verdict, which names a
//! written key of a guarded tag.
//! The first byte picks the table; the input is then split at 0xFE (a
//! table's RESP, when the input gives one) and its arguments at 0xFF.
//! `lease/guard.rs`'s test `random_arguments_read_in_bounds_and_decide_on_written_keys`
//! runs the same, bounded, in `cargo test`.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use redis_lease::lease::fence::key_slot;
use redis_lease::lease::guard::{Db, Guards, Verdict, hash_tag, is_checked};
use redis_lease::lease::keyspec::{KeyPlaces, Keys, Table, Value, is_lease_command};

/// A RESP2 reply (`COMMAND`'s shapes), or `None` where `buf` is not one;
/// nested at most 8 deep, with at most 100,000 elements.
fn resp(buf: &[u8], at: &mut usize, depth: usize, budget: &mut usize) -> Option<Value> {
    if depth > 8 || *budget == 0 {
        return None;
    }
    *budget -= 1;
    let end = *at + buf.get(*at..)?.windows(2).position(|w| w == b"\r\n")?;
    let kind = *buf.get(*at)?;
    let text = std::str::from_utf8(buf.get(*at + 1..end)?).ok()?;
    *at = end + 2;
    match kind {
        b':' => Some(Value::Int(text.parse().ok()?)),
        b'+' => Some(Value::Str(text.as_bytes().to_vec())),
        b'$' => {
            let n: i64 = text.parse().ok()?;
            if n < 0 {
                return Some(Value::Nil);
            }
            let s = buf.get(*at..*at + usize::try_from(n).ok()?)?.to_vec();
            *at += s.len() + 2;
            Some(Value::Str(s))
        }
        b'*' => {
            let n: i64 = text.parse().ok()?;
            if n < 0 {
                return Some(Value::Nil);
            }
            let n = usize::try_from(n).ok()?.min(*budget);
            (0..n)
                .map(|_| resp(buf, at, depth + 1, budget))
                .collect::<Option<Vec<_>>>()
                .map(Value::Array)
        }
        _ => None,
    }
}

fn captured(bytes: &[u8]) -> Table {
    let mut budget = usize::MAX;
    let v = resp(bytes, &mut 0, 0, &mut budget).expect("a captured reply");
    Table::from_command_info(&v)
}

static REDIS70: LazyLock<Table> = LazyLock::new(|| {
    captured(include_bytes!(
        "../../tests/fixtures/command-info/redis70.resp"
    ))
});
static VALKEY91: LazyLock<Table> = LazyLock::new(|| {
    captured(include_bytes!(
        "../../tests/fixtures/command-info/valkey91.resp"
    ))
});

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let read;
    let (table, args): (&Table, &[u8]) = match which % 3 {
        0 => (&REDIS70, rest),
        1 => (&VALKEY91, rest),
        _ => {
            let (spec, args) = match rest.iter().position(|&b| b == 0xFE) {
                Some(at) => (&rest[..at], &rest[at + 1..]),
                None => (rest, &[][..]),
            };
            let Some(reply) = resp(spec, &mut 0, 0, &mut 100_000) else {
                return;
            };
            read = Table::from_command_info(&reply);
            (&read, args)
        }
    };
    let argv: Vec<&[u8]> = args.split(|&b| b == 0xFF).collect();
    let mut pos = Vec::new();
    let keys = table.written(&argv, |i| pos.push(i));
    for &p in &pos {
        assert!(p >= 1 && p < argv.len(), "{argv:?}: {pos:?}");
    }
    // The cheap test reads every argument a written key can be, twice
    // (the second from its entries of the last commands) the same.
    let places = table.key_places(|_| true);
    let read = |places: &KeyPlaces| {
        let mut read = Vec::new();
        places.any(argv[0], argv.len(), |i| {
            read.push(i);
            false
        });
        read
    };
    let first = read(&places);
    assert_eq!(first, read(&places), "{argv:?}");
    for &i in &first {
        assert!(i >= 1 && i < argv.len(), "{argv:?}: {first:?}");
    }
    assert!(
        pos.iter().all(|p| first.contains(p)),
        "{argv:?}: {pos:?}, {first:?}"
    );
    if keys == Keys::Given
        && !pos.is_empty()
        && let Some((command, _)) = table.command(argv[0], argv.get(1).copied())
    {
        assert!(command.kind.writes, "{argv:?}");
    }
    // Every tag the arguments name is guarded, in database 0 or 1.
    let mut guards = Guards::default();
    for (i, a) in argv.iter().enumerate() {
        if hash_tag(a).is_some() {
            guards.add(i as i32 % 2, a);
        }
        // The one hash tag rule: a key's slot is its tag's.
        if let Some(tag) = hash_tag(a) {
            assert_eq!(key_slot(a), key_slot(tag));
        }
    }
    let checked = argv
        .first()
        .is_some_and(|n| is_checked(n, which & 0x80 != 0));
    if argv.first().is_some_and(|n| is_lease_command(n)) {
        assert!(!checked);
    }
    let db = if which & 0x40 != 0 {
        Db::Any
    } else {
        Db::Known(0)
    };
    if let Verdict::Refuse { key, guard } = guards.check(&argv, &pos, db, None) {
        let other_db = argv
            .first()
            .is_some_and(|n| n.eq_ignore_ascii_case(b"move") || n.eq_ignore_ascii_case(b"copy"));
        assert!(pos.iter().any(|&p| argv[p] == key) || other_db, "{argv:?}");
        assert_eq!(hash_tag(key), hash_tag(guard));
    }
});
