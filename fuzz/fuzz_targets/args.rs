//! Argument parsing of every command and of the module's load arguments,
//! and the decisions made on what parses. The input is split into
//! arguments at 0xFF bytes; the first byte picks what to exercise.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_lease::lease::args::{
    check_owner, fence_command_at, parse_acquire_options, parse_fence_args, parse_i64,
    parse_timeout, parse_token, parse_ttl,
};
use redis_lease::lease::clock::TokenClock;
use redis_lease::lease::config::parse_module_args;
use redis_lease::lease::decide::{self, Decision, Held};
use redis_lease::lease::keyspec::Kind;
use redis_lease::lease::limits::{MAX_LIMIT, MAX_OWNER_LEN, MAX_TOKEN, MIN_LIMIT};
use redis_lease::lease::{Holder, Holders, HoldersMode, Lease, LeaseError, Mode, fence};

/// An error reply must be one line starting with an upper-case code.
fn check_error(e: &LeaseError) {
    let text = e.to_string();
    assert!(!text.contains('\r') && !text.contains('\n'), "{text:?}");
    let code = text.split(' ').next().unwrap();
    assert!(
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
        "{text:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let args: Vec<&[u8]> = rest.split(|&b| b == 0xFF).collect();
    let arg = |i: usize| args.get(i).copied().unwrap_or(b"");
    match which % 6 {
        0 => {
            // LEASE.ACQUIRE key owner ttl-ms [options]
            let max = parse_i64(arg(0))
                .unwrap_or(1000)
                .clamp(1, 1_000_000_000_000);
            match (
                check_owner(arg(1)),
                parse_ttl(arg(2), max),
                parse_acquire_options(&args[args.len().min(3)..]),
            ) {
                (Ok(owner), Ok(ttl), Ok(opts)) => {
                    assert!(!owner.is_empty() && owner.len() <= MAX_OWNER_LEN);
                    assert!((1..=max).contains(&ttl));
                    if let Some(t) = opts.block_ms {
                        assert!(t >= 0);
                    }
                    if let Mode::Limit(n) = opts.mode {
                        assert!((MIN_LIMIT..=MAX_LIMIT).contains(&n));
                    }
                    let mut clock = TokenClock::new();
                    let now = 1_800_000_000_000;
                    let current = Lease::new(b"holder", 5, now + 10, now, None);
                    // The mode against every kind of key: a decision or an
                    // error; a new holder only where there is room.
                    let holder = Holder {
                        owner: b"holder".as_slice().into(),
                        token: 5,
                        deadline_ms: now + 10,
                        since_ms: now,
                        label: None,
                    };
                    let full = Holders::with(HoldersMode::Limit(2), holder.clone());
                    let readers = Holders::with(HoldersMode::Shared, holder);
                    for held in [
                        Held::Free,
                        Held::Exclusive(&current),
                        Held::Holders(&full),
                        Held::Holders(&readers),
                    ] {
                        for ahead in [false, true] {
                            match decide::acquire_mode(held, opts.mode, owner, ahead, now) {
                                Ok(Decision::New) => assert!(!ahead),
                                Ok(_) => {}
                                Err(e) => check_error(&e),
                            }
                        }
                    }
                    let floor = opts.floor.unwrap_or(0);
                    let _ = decide::acquire(Some(&current), owner, ttl, floor, now, &mut clock);
                    let _ = decide::acquire(None, owner, ttl, floor, now, &mut clock).map(|a| {
                        if let decide::Acquire::Created { token, deadline_ms } = a {
                            assert_eq!(deadline_ms, now + ttl);
                            assert!(token <= MAX_TOKEN && token >= floor);
                        }
                    });
                }
                (a, b, c) => {
                    for e in [a.err(), b.err(), c.err()].into_iter().flatten() {
                        check_error(&e);
                    }
                }
            }
        }
        1 => {
            match parse_token(arg(0)) {
                Ok(t) => assert!((1..=MAX_TOKEN).contains(&t)),
                Err(e) => check_error(&e),
            }
            // LEASE.FENCE's arguments after the key: the token, MINTTL ms.
            match parse_fence_args(&args) {
                Ok(f) => {
                    assert_eq!(f.command_at, fence_command_at(&args));
                    assert!(f.command_at <= args.len());
                    assert_eq!(f.min_ttl_ms.is_some(), f.command_at == 3);
                    assert!(f.min_ttl_ms.is_none_or(|ms| ms >= 0));
                }
                Err(e) => check_error(&e),
            }
        }
        2 => match parse_timeout(arg(0)) {
            Ok(t) => assert!(t >= 0),
            Err(e) => check_error(&e),
        },
        3 => {
            if let Err(why) = parse_module_args(&args) {
                assert!(!why.contains('\n'));
            }
        }
        4 => {
            // The command's kind from the bits of its first byte.
            let bits = arg(0).first().copied().unwrap_or(0);
            let kind = Kind {
                writes: bits & 1 != 0,
                blocking: bits & 2 != 0,
                noscript: bits & 4 != 0,
            };
            let inner: Vec<&[u8]> = args[1..].to_vec();
            if let Err(e) = fence::check_inner(arg(0), kind, &inner) {
                check_error(&e);
            }
            match fence::check_shared(arg(0), kind) {
                Ok(()) => assert!(!kind.writes),
                Err(e) => check_error(&e),
            }
            let _ = fence::key_slot(arg(0));
            assert!(fence::key_slot(arg(0)) < 16384);
        }
        _ => {
            if let Some(n) = parse_i64(arg(0)) {
                assert_eq!(
                    n.to_string().as_bytes(),
                    arg(0),
                    "only canonical integers parse"
                );
            }
        }
    }
});
