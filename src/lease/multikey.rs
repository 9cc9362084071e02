//! Multi-key leases (design.md S10): `LEASE.MACQUIRE`, `LEASE.MRENEW` and
//! `LEASE.MRELEASE` decide over every key at once, all or nothing, and
//! answer with the effects to commit per key: the same exclusive-lease
//! effects a single-key call makes (`LEASE.APPLY`, `LEASE.RELEASE`), so each
//! key is an ordinary lease afterwards and the replication language does not
//! change. No I/O: the binding reads every key, asks here, commits. The
//! words are the single-key calls' (`ops`): an `Outcome` with `PerKey`
//! effects, `Then`, `Recheck`, `Env`, and `decide::Decision`.

use super::decide::{Decision, Held};
use super::effect::{Effect, Facts};
use super::error::{LeaseError, printable};
use super::ops::{Answer, Commit, Count, Env, Event, Outcome, PerKey, Recheck, Then};
use super::record::RecordRef;

/// What a multi-key call does.
pub type MultiOutcome<'a> = Outcome<PerKey<'a>, Vec<Recheck>>;

/// One key of a multi-key call, as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// No lease on it, nobody waits for it.
    Free,
    /// No lease on it, but clients wait for it: a newcomer does not take it
    /// (design.md S8's strict order).
    Waited,
    /// An exclusive lease of the caller's owner, with this token, held
    /// since then, until that deadline (unix ms).
    Mine(u64, i64, i64),
    /// Held by another owner, or by a counting or shared lease of others.
    Taken,
    /// The caller's owner holds a place of a counting or shared lease on it.
    MineShared,
}

/// The state of one key: what it stores at `now_ms`, and whether clients
/// wait for it (`waited`; a waiter being served passes `false`).
pub fn key_state(
    record: Option<RecordRef<'_>>,
    owner: &[u8],
    waited: bool,
    now_ms: i64,
) -> KeyState {
    match Held::of(record, now_ms) {
        Held::Free | Held::FreeGuard if waited => KeyState::Waited,
        Held::Free | Held::FreeGuard => KeyState::Free,
        Held::Exclusive(l) if l.is_held_by(owner) => {
            KeyState::Mine(l.token, l.since_ms(), l.deadline_ms)
        }
        Held::Exclusive(_) => KeyState::Taken,
        Held::Holders(m) if m.holder(owner).is_some_and(|h| h.is_live(now_ms)) => {
            KeyState::MineShared
        }
        Held::Holders(_) => KeyState::Taken,
    }
}

/// One key as a multi-key acquire sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyView {
    pub state: KeyState,
    /// When it is taken: when to look at it again (the end of its holding,
    /// one millisecond on).
    pub recheck_at: Option<i64>,
    /// Taken only because Redis 8.2 expired its lease within the lease's
    /// deadline millisecond: nothing else brings a waiter back to it.
    pub ended_early: bool,
}

/// One key as a multi-key acquire sees it: its state and, when it is
/// taken, when to look at it again. `ended_early`: the deadline
/// millisecond of a lease Redis 8.2 expired within that millisecond, when
/// the key is free for that reason alone: it stays taken until that
/// millisecond has passed. The command and the timer that serves a
/// multi-key waiter decide alike from it.
pub fn key_view(
    record: Option<RecordRef<'_>>,
    owner: &[u8],
    waited: bool,
    now_ms: i64,
    key_expire_ms: Option<i64>,
    ended_early: Option<i64>,
) -> KeyView {
    let state = key_state(record, owner, waited, now_ms);
    match (state, ended_early) {
        (KeyState::Free, Some(end)) => KeyView {
            state: KeyState::Taken,
            recheck_at: Some(end + 1),
            ended_early: true,
        },
        (KeyState::Taken, _) => KeyView {
            state,
            recheck_at: Held::of(record, now_ms)
                .next_end(key_expire_ms, now_ms)
                .map(|end| end + 1),
            ended_early: false,
        },
        _ => KeyView {
            state,
            recheck_at: None,
            ended_early: false,
        },
    }
}

/// The waiter served by the multi-key timer of one of its keys (`fired`,
/// its index) keeps waiting when a key is still taken, without opening
/// any key for writing: `Some` with what to re-check (the keys Redis 8.2
/// expired early: nothing else brings it back to them); `None` when every
/// key may be free, to be decided by `acquire` through the write gate.
pub fn still_taken(views: &[KeyView]) -> Option<Vec<Recheck>> {
    views
        .iter()
        .any(|v| v.state == KeyState::Taken)
        .then(|| early_rechecks(views))
}

fn early_rechecks(views: &[KeyView]) -> Vec<Recheck> {
    views
        .iter()
        .enumerate()
        .filter(|(_, v)| v.ended_early)
        .filter_map(|(key, v)| {
            v.recheck_at.map(|at_ms| Recheck {
                key,
                at_ms,
                precise: true,
            })
        })
        .collect()
}

/// The one token under which the caller's owner holds every key, if it
/// does, and since when (the first key's holding's start).
pub fn one_token(states: &[KeyState]) -> Option<(u64, i64)> {
    let KeyState::Mine(first, since_ms, _) = *states.first()? else {
        return None;
    };
    states
        .iter()
        .all(|s| matches!(*s, KeyState::Mine(t, ..) if t == first))
        .then_some((first, since_ms))
}

/// `LEASE.MACQUIRE` on keys in `states` (`keys[i]`'s state is `states[i]`),
/// before any token is issued: `New` when every key is free (one new
/// token for all), `Reacquired` when the owner holds every key with one
/// token (an idempotent retry), `Contended` when a key is held by someone
/// else or waited for. The errors come first, so that a caller never waits
/// holding part of its keys: a counting or shared holding of the owner,
/// some keys held but not all, or the keys held under more than one token;
/// each names a key.
pub fn decide(keys: &[&[u8]], states: &[KeyState]) -> Result<Decision, LeaseError> {
    let named = |i: usize| printable(keys[i]);
    if let Some(i) = states.iter().position(|s| *s == KeyState::MineShared) {
        return Err(LeaseError::OwnerAmongHolders(named(i)));
    }
    let mine = |s: &KeyState| matches!(s, KeyState::Mine(..));
    if states.iter().any(mine) {
        if let Some(i) = states.iter().position(|s| !mine(s)) {
            return Err(LeaseError::PartlyHeld(named(i)));
        }
        return match one_token(states) {
            Some((token, _)) => Ok(Decision::Reacquired { token }),
            None => {
                let token = |s: &KeyState| match *s {
                    KeyState::Mine(t, ..) => Some(t),
                    _ => None,
                };
                let first = token(&states[0]);
                let i = states.iter().position(|s| token(s) != first).unwrap_or(0);
                Err(LeaseError::MixedTokens(named(i)))
            }
        };
    }
    if states.iter().any(|s| *s != KeyState::Free) {
        return Ok(Decision::Contended);
    }
    Ok(Decision::New)
}

/// Who asks `LEASE.MACQUIRE`'s question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The command; `may_wait`: `BLOCK` was given and the caller may block.
    Command { may_wait: bool },
    /// A waiter being served by the multi-key timer of its key `fired`: a
    /// refusal keeps it waiting.
    Waiter { fired: usize },
}

/// `LEASE.MACQUIRE numkeys key... owner ttl-ms`: every key or none, for
/// the command and for a waiter alike. A refusal that waits says what to
/// re-check: a new waiter every key at its end (or all at a grace
/// period's end); a waiter that keeps waiting, the keys Redis 8.2 expired
/// early and its own key at a grace period's end (its keys' ends are
/// already timed).
pub fn acquire<'a>(
    keys: &[&[u8]],
    views: &[KeyView],
    owner: &'a [u8],
    label: Option<&'a [u8]>,
    ttl_ms: i64,
    env: Env<'_>,
    caller: Caller,
) -> Result<MultiOutcome<'a>, LeaseError> {
    let now = env.server.now_ms;
    let grace_ends_at = env.server.grace_ends_at;
    let refused = |count: Count, grace_until: Option<i64>| {
        let mut out = MultiOutcome::new(Answer::Null);
        match caller {
            Caller::Command { may_wait: false } => out.count = Some(count),
            Caller::Command { may_wait: true } => {
                let rechecks = views
                    .iter()
                    .enumerate()
                    .filter_map(|(key, v)| {
                        grace_until.or(v.recheck_at).map(|at_ms| Recheck {
                            key,
                            at_ms,
                            precise: true,
                        })
                    })
                    .collect();
                out.then = Then::Wait(rechecks);
            }
            Caller::Waiter { fired } => {
                let mut rechecks = early_rechecks(views);
                if let Some(at_ms) = grace_until {
                    rechecks.push(Recheck {
                        key: fired,
                        at_ms,
                        precise: false,
                    });
                }
                out.then = Then::Wait(rechecks);
            }
        }
        out
    };
    let states: Vec<KeyState> = views.iter().map(|v| v.state).collect();
    let deadline_ms = now + ttl_ms;
    let each = |token: u64, since_ms: i64, event: Event| -> PerKey<'a> {
        (0..keys.len())
            .map(|i| {
                let effect = Effect::Apply {
                    owner,
                    token,
                    deadline_ms,
                    facts: Facts::new(since_ms, label),
                };
                (i, Commit { effect, event })
            })
            .collect()
    };
    Ok(match decide(keys, &states)? {
        Decision::Contended => refused(Count::Contended, None),
        // During a grace period nothing new is created (design.md S7).
        Decision::New if grace_ends_at.is_some() => refused(Count::GraceRefused, grace_ends_at),
        Decision::New => {
            let token = env.clock.issue(now).ok_or(LeaseError::TokensExhausted)?;
            let mut out = MultiOutcome::new(Answer::Token(token));
            out.commits = each(token, now, Event::Acquire);
            out
        }
        Decision::Reacquired { token } => {
            // Held since the first key's holding began.
            let since_ms = one_token(&states).map_or(now, |(_, since)| since);
            let mut out = MultiOutcome::new(Answer::Token(token));
            out.commits = each(token, since_ms, Event::Reacquire);
            out.then = Then::RecheckAt(deadline_ms);
            out
        }
    })
}

/// `LEASE.MRENEW numkeys key... owner ttl-ms`: every key renewed when the
/// owner holds them all with one token (the answer is their number), else
/// 0 and nothing changes.
pub fn renew<'a>(
    states: &[KeyState],
    owner: &'a [u8],
    ttl_ms: i64,
    now_ms: i64,
) -> MultiOutcome<'a> {
    let Some((token, since_ms)) = one_token(states) else {
        let mut out = MultiOutcome::new(Answer::Int(0));
        out.count = Some(Count::RenewFailed);
        return out;
    };
    let deadline_ms = now_ms + ttl_ms;
    let mut out = MultiOutcome::new(Answer::Int(states.len() as i64));
    out.commits = states
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let effect = Effect::Apply {
                owner,
                token,
                deadline_ms,
                facts: Facts::new(since_ms, None),
            };
            let left_ms = match *s {
                KeyState::Mine(_, _, held_until) => held_until - now_ms,
                _ => 0,
            };
            let event = Event::Renew {
                left_ms,
                ttl_ms: deadline_ms - now_ms,
            };
            (i, Commit { effect, event })
        })
        .collect();
    out.then = Then::RecheckAt(deadline_ms);
    out
}

/// `LEASE.MRELEASE numkeys key... owner`: every key released when the
/// owner holds them all with one token (the answer is their number), else
/// 0 and nothing changes.
pub fn release<'a>(states: &[KeyState], owner: &'a [u8], now_ms: i64) -> MultiOutcome<'a> {
    if one_token(states).is_none() {
        let mut out = MultiOutcome::new(Answer::Int(0));
        out.count = Some(Count::ReleaseFailed);
        return out;
    }
    let mut out = MultiOutcome::new(Answer::Int(states.len() as i64));
    out.commits = (0..states.len())
        .map(|i| {
            let effect = Effect::Release { owner };
            let event = Event::Release { at_ms: now_ms };
            (i, Commit { effect, event })
        })
        .collect();
    out.then = Then::Serve;
    out
}

#[cfg(test)]
mod tests {
    use super::KeyState::*;
    use super::*;
    use crate::lease::clock::TokenClock;
    use crate::lease::holders::{Holder, Holders};
    use crate::lease::ops::Snapshot;
    use crate::lease::{HoldersMode, Lease};

    const NOW: i64 = 1_800_000_000_000;
    /// The start of the small tokens' holdings here (`since_of_token`).
    const S: i64 = 0;
    /// The deadline of the caller's holdings here.
    const D: i64 = NOW + 10;
    const KEYS: [&[u8]; 3] = [b"a", b"b", b"c"];

    fn env(clock: &mut TokenClock, grace: Option<i64>) -> Env<'_> {
        Env {
            server: Snapshot {
                now_ms: NOW,
                grace_ends_at: grace,
                out_of_memory: false,
                prune_per_call: 0,
            },
            clock,
            waiters_ahead: false,
            ended_early: None,
        }
    }

    fn command(may_wait: bool) -> Caller {
        Caller::Command { may_wait }
    }

    /// Views of keys with these states, none of them timed.
    fn views<const N: usize>(states: [KeyState; N]) -> [KeyView; N] {
        states.map(|state| KeyView {
            state,
            recheck_at: None,
            ended_early: false,
        })
    }

    fn at(state: KeyState, recheck_at: Option<i64>, ended_early: bool) -> KeyView {
        KeyView {
            state,
            recheck_at,
            ended_early,
        }
    }

    #[test]
    fn a_key_view_says_when_to_look_again() {
        let other = Lease::plain(b"x", 8, NOW + 10);
        let ex = Some(RecordRef::Exclusive(&other));
        assert_eq!(
            key_view(ex, b"o", false, NOW, None, None),
            at(Taken, Some(NOW + 11), false)
        );
        assert_eq!(
            key_view(ex, b"o", false, NOW, Some(NOW + 5), None),
            at(Taken, Some(NOW + 6), false),
            "the key's own expiry, when earlier"
        );
        assert_eq!(
            key_view(None, b"o", false, NOW, None, None),
            at(Free, None, false)
        );
        assert_eq!(
            key_view(None, b"o", false, NOW, None, Some(NOW)),
            at(Taken, Some(NOW + 1), true),
            "expired early by the server: taken until its millisecond passed"
        );
        assert_eq!(
            key_view(None, b"o", true, NOW, None, None),
            at(Waited, None, false)
        );
    }

    #[test]
    fn key_states() {
        let mine = Lease::plain(b"o", 7, NOW + 10);
        let other = Lease::plain(b"x", 8, NOW + 10);
        let ended = Lease::plain(b"x", 8, NOW - 1);
        fn ex(l: &Lease) -> Option<RecordRef<'_>> {
            Some(RecordRef::Exclusive(l))
        }
        assert_eq!(key_state(None, b"o", false, NOW), Free);
        assert_eq!(key_state(None, b"o", true, NOW), Waited);
        assert_eq!(key_state(ex(&ended), b"o", false, NOW), Free);
        assert_eq!(key_state(ex(&mine), b"o", true, NOW), Mine(7, S, D));
        assert_eq!(key_state(ex(&other), b"o", false, NOW), Taken);
        let h = |o: &[u8]| Holder {
            owner: o.into(),
            token: 9,
            deadline_ms: NOW + 10,
            since_ms: crate::lease::limits::since_of_token(9),
            label: None,
        };
        let shared = Holders::with(HoldersMode::Shared, h(b"o"));
        let others = Holders::with(HoldersMode::Limit(3), h(b"x"));
        assert_eq!(
            key_state(Some(RecordRef::Holders(&shared)), b"o", false, NOW),
            MineShared
        );
        assert_eq!(
            key_state(Some(RecordRef::Holders(&others)), b"o", false, NOW),
            Taken
        );
    }

    #[test]
    fn every_key_or_none_with_one_token() {
        let mut clock = TokenClock::new();
        let out = acquire(
            &KEYS,
            &views([Free; 3]),
            b"o",
            None,
            100,
            env(&mut clock, None),
            command(false),
        )
        .unwrap();
        let Answer::Token(t) = out.answer else {
            panic!("{out:?}")
        };
        assert_eq!(out.commits.len(), 3);
        for (i, (k, c)) in out.commits.iter().enumerate() {
            assert_eq!(*k, i);
            assert_eq!(
                c.effect,
                Effect::Apply {
                    owner: b"o",
                    token: t,
                    deadline_ms: NOW + 100,
                    facts: Facts::plain(t),
                }
            );
            assert_eq!(c.event, Event::Acquire);
        }
        for states in [[Free, Taken, Free], [Free, Free, Waited]] {
            let last = clock.last();
            let out = acquire(
                &KEYS,
                &views(states),
                b"o",
                None,
                100,
                env(&mut clock, None),
                command(false),
            )
            .unwrap();
            assert_eq!(out.answer, Answer::Null);
            assert!(out.commits.is_empty());
            assert_eq!(out.count, Some(Count::Contended));
            assert_eq!(clock.last(), last, "no token issued");
            let out = acquire(
                &KEYS,
                &views(states),
                b"o",
                None,
                100,
                env(&mut clock, None),
                command(true),
            )
            .unwrap();
            assert_eq!(out.then, Then::Wait(Vec::new()), "no key timed");
            assert_eq!(out.count, None);
        }
    }

    #[test]
    fn a_retry_keeps_the_token_and_the_errors_name_a_key() {
        let mut clock = TokenClock::new();
        let out = acquire(
            &KEYS,
            &views([Mine(5, S, D); 3]),
            b"o",
            None,
            100,
            env(&mut clock, None),
            command(false),
        )
        .unwrap();
        assert_eq!(out.answer, Answer::Token(5));
        assert!(out.commits.iter().all(|(_, c)| c.event == Event::Reacquire));
        assert_eq!(out.then, Then::RecheckAt(NOW + 100));
        // A retry for some of the keys it took together is a retry too.
        assert_eq!(
            decide(&KEYS[..2], &[Mine(5, S, D), Mine(5, S, D)]),
            Ok(Decision::Reacquired { token: 5 })
        );
        let err = |s: [KeyState; 3]| decide(&KEYS, &s).unwrap_err();
        assert_eq!(
            err([Mine(5, S, D), Free, Mine(5, S, D)]),
            LeaseError::PartlyHeld("b".into())
        );
        assert_eq!(
            err([Mine(5, S, D), Mine(5, S, D), Taken]),
            LeaseError::PartlyHeld("c".into())
        );
        assert_eq!(
            err([Mine(5, S, D), Mine(6, S, D), Mine(5, S, D)]),
            LeaseError::MixedTokens("b".into())
        );
        assert_eq!(
            err([Free, MineShared, Taken]),
            LeaseError::OwnerAmongHolders("b".into())
        );
        // A refusal by error changes nothing, even with BLOCK.
        let e = acquire(
            &KEYS,
            &views([Mine(5, S, D), Free, Free]),
            b"o",
            None,
            100,
            env(&mut clock, None),
            command(true),
        );
        assert!(e.is_err());
    }

    #[test]
    fn the_grace_refuses_new_leases_but_not_retries() {
        let mut clock = TokenClock::new();
        let g = Some(NOW + 500);
        let out = acquire(
            &KEYS,
            &views([Free; 3]),
            b"o",
            None,
            100,
            env(&mut clock, g),
            command(false),
        )
        .unwrap();
        assert_eq!(out.answer, Answer::Null);
        assert_eq!(out.count, Some(Count::GraceRefused));
        assert_eq!(clock.last(), 0);
        let out = acquire(
            &KEYS,
            &views([Free; 3]),
            b"o",
            None,
            100,
            env(&mut clock, g),
            command(true),
        )
        .unwrap();
        let all_at_grace_end: Vec<Recheck> = (0..3)
            .map(|key| Recheck {
                key,
                at_ms: NOW + 500,
                precise: true,
            })
            .collect();
        assert_eq!(out.then, Then::Wait(all_at_grace_end));
        let out = acquire(
            &KEYS,
            &views([Mine(5, S, D); 3]),
            b"o",
            None,
            100,
            env(&mut clock, g),
            command(false),
        )
        .unwrap();
        assert_eq!(out.answer, Answer::Token(5));
    }

    #[test]
    fn a_refusal_that_waits_says_what_to_recheck() {
        let mut clock = TokenClock::new();
        let keys = [
            at(Free, None, false),
            at(Taken, Some(NOW + 30), false),
            at(Taken, Some(NOW + 1), true),
        ];
        // A new waiter: every timed key at its end.
        let out = acquire(
            &KEYS,
            &keys,
            b"o",
            None,
            100,
            env(&mut clock, None),
            command(true),
        )
        .unwrap();
        let r = |key, at_ms, precise| Recheck {
            key,
            at_ms,
            precise,
        };
        assert_eq!(
            out.then,
            Then::Wait(vec![r(1, NOW + 30, true), r(2, NOW + 1, true)])
        );
        // A waiter served by the timer of its key 0: its keys' ends are
        // timed already; the key expired early is not.
        let waiter = |clock: &mut TokenClock, grace| -> MultiOutcome<'static> {
            let caller = Caller::Waiter { fired: 0 };
            acquire(&KEYS, &keys, b"o", None, 100, env(clock, grace), caller).unwrap()
        };
        let out = waiter(&mut clock, None);
        assert_eq!(out.then, Then::Wait(vec![r(2, NOW + 1, true)]));
        assert_eq!(out.count, None, "a waiter's refusal is not counted");
        assert_eq!(still_taken(&keys), Some(vec![r(2, NOW + 1, true)]));
        // Free keys in a grace period: its own key at the grace's end.
        let free = views([Free; 3]);
        assert_eq!(still_taken(&free), None);
        let env = env(&mut clock, Some(NOW + 500));
        let caller = Caller::Waiter { fired: 1 };
        let out = acquire(&KEYS, &free, b"o", None, 100, env, caller).unwrap();
        assert_eq!(out.then, Then::Wait(vec![r(1, NOW + 500, false)]));
    }

    #[test]
    fn renew_and_release_all_or_nothing() {
        let out = renew(&[Mine(5, S, D); 3], b"o", 50, NOW);
        assert_eq!(out.answer, Answer::Int(3));
        assert!(out.commits.iter().all(|(_, c)| c.effect
            == Effect::Apply {
                owner: b"o",
                token: 5,
                deadline_ms: NOW + 50,
                facts: Facts::plain(5),
            }));
        // Each key's renewal tells the distributions its own margin.
        assert!(out.commits.iter().all(|(_, c)| c.event
            == Event::Renew {
                left_ms: D - NOW,
                ttl_ms: 50
            }));
        for bad in [
            [Mine(5, S, D), Free, Mine(5, S, D)],
            [Mine(5, S, D), Mine(6, S, D), Mine(5, S, D)],
            [Taken; 3],
        ] {
            let out = renew(&bad, b"o", 50, NOW);
            assert_eq!((out.answer, out.commits.len()), (Answer::Int(0), 0));
            assert_eq!(out.count, Some(Count::RenewFailed));
            let out = release(&bad, b"o", NOW);
            assert_eq!((out.answer, out.commits.len()), (Answer::Int(0), 0));
            assert_eq!(out.count, Some(Count::ReleaseFailed));
        }
        let out = release(&[Mine(5, S, D); 2], b"o", NOW);
        assert_eq!(out.answer, Answer::Int(2));
        assert_eq!(out.then, Then::Serve);
        assert!(
            out.commits
                .iter()
                .all(|(_, c)| c.effect == Effect::Release { owner: b"o" })
        );
    }
}
