//! The decision each command makes, given what the key holds, the caller's
//! arguments and the time: for an exclusive lease (design.md S1) and for a
//! counting or shared one (design.md S8). No I/O: the module layer reads the key, asks
//! here, then applies the answer. The hand-off to waiters (`waitq.rs`) and
//! the model test decide through the same functions.

use super::clock::TokenClock;
use super::error::LeaseError;
use super::exclusive::Lease;
use super::holders::Holders;
use super::mode::{HoldersMode, Mode};
use super::record::RecordRef;

/// The lease that counts at `now_ms`: a stored record past its deadline is
/// no lease at all (the key may outlive it by a moment, or have lost its TTL
/// through a RESTORE without one).
pub fn live(current: Option<&Lease>, now_ms: i64) -> Option<&Lease> {
    current.filter(|l| l.is_live(now_ms))
}

/// What LEASE.ACQUIRE does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The key was free: a new lease with this token and deadline (the
    /// effect that stores it makes the record).
    Created { token: u64, deadline_ms: i64 },
    /// The caller already holds it: keep the token (raised to a `FLOOR`
    /// above it: `raised`), move the deadline.
    Reacquired {
        token: u64,
        deadline_ms: i64,
        raised: bool,
    },
    /// Someone else holds it: answer null, change nothing.
    Contended,
}

/// `floor`: the `FLOOR` token (0 without the option), already checked
/// ([`check_floor`]). A new lease's token is at least it; a holder's
/// re-acquire raises its token to it (design.md S9).
pub fn acquire(
    current: Option<&Lease>,
    owner: &[u8],
    ttl_ms: i64,
    floor: u64,
    now_ms: i64,
    clock: &mut TokenClock,
) -> Result<Acquire, LeaseError> {
    let deadline_ms = now_ms + ttl_ms;
    Ok(match live(current, now_ms) {
        None => {
            let token = clock
                .issue_at_least(now_ms, floor)
                .ok_or(LeaseError::TokensExhausted)?;
            Acquire::Created { token, deadline_ms }
        }
        Some(l) if l.is_held_by(owner) => {
            let token = l.token.max(floor);
            let raised = token != l.token;
            if raised {
                clock.observe(token);
            }
            Acquire::Reacquired {
                token,
                deadline_ms,
                raised,
            }
        }
        Some(_) => Acquire::Contended,
    })
}

/// A `FLOOR` token at most the grace length (`grace_ms`, at least 1 s) of
/// wall clock ahead of `now_ms` (design.md S9): no client can exhaust the
/// token clock, and a restart without persistence, which runs that grace
/// before it grants, issues tokens above any `FLOOR` could set.
pub fn check_floor(floor: Option<u64>, now_ms: i64, grace_ms: i64) -> Result<u64, LeaseError> {
    let max = super::clock::max_floor(now_ms, grace_ms);
    match floor {
        Some(t) if t > max => Err(LeaseError::FloorTooFar {
            ahead_ms: super::clock::floor_ahead_ms(grace_ms),
            max,
        }),
        Some(t) => Ok(t),
        None => Ok(0),
    }
}

/// LEASE.RENEW: the new deadline when `owner` holds the lease, else `None`.
pub fn renew(current: Option<&Lease>, owner: &[u8], ttl_ms: i64, now_ms: i64) -> Option<i64> {
    live(current, now_ms)
        .filter(|l| l.is_held_by(owner))
        .map(|_| now_ms + ttl_ms)
}

/// LEASE.RELEASE: may `owner` delete the lease?
pub fn release(current: Option<&Lease>, owner: &[u8], now_ms: i64) -> bool {
    live(current, now_ms).is_some_and(|l| l.is_held_by(owner))
}

/// What LEASE.INFO shows of a holding (never the owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfoView<'a> {
    pub token: u64,
    pub ttl_ms: i64,
    /// When the holding began (unix ms), and its label (design.md S11).
    pub since_ms: i64,
    pub label: Option<&'a [u8]>,
}

pub fn info(
    current: Option<&Lease>,
    now_ms: i64,
    key_expire_ms: Option<i64>,
) -> Option<InfoView<'_>> {
    live(current, now_ms).map(|l| InfoView {
        token: l.token,
        ttl_ms: left_ms(l.deadline_ms, key_expire_ms, now_ms),
        since_ms: l.since_ms(),
        label: l.label(),
    })
}

/// When a live lease ends: at its recorded deadline, or earlier when its
/// key expires first (a `PEXPIRE` shortened the key's TTL).
pub fn ends_at(lease: &Lease, key_expire_ms: Option<i64>) -> i64 {
    end_of(lease.deadline_ms, key_expire_ms)
}

/// When a holding with this deadline ends: at the deadline, or at the
/// key's expiry when that comes first.
#[inline]
fn end_of(deadline_ms: i64, key_expire_ms: Option<i64>) -> i64 {
    key_expire_ms.map_or(deadline_ms, |e| e.min(deadline_ms))
}

/// The time a holding with this deadline has left at `now_ms` (0 once it
/// has ended), as LEASE.INFO shows it.
#[inline]
fn left_ms(deadline_ms: i64, key_expire_ms: Option<i64>, now_ms: i64) -> i64 {
    (end_of(deadline_ms, key_expire_ms) - now_ms).max(0)
}

/// What a key's expiry should be set to so that it matches its lease: the
/// recorded deadline, when the key has no expiry or outlives the lease
/// (`RESTORE k 0`, `PERSIST`, a longer `EXPIRE`). `None`: it matches, or the
/// key goes first (the lease ends with it).
pub fn expiry_to_align(lease: &Lease, key_expire_ms: Option<i64>) -> Option<i64> {
    match key_expire_ms {
        Some(e) if e <= lease.deadline_ms => None,
        _ => Some(lease.deadline_ms),
    }
}

// --- Counting and shared leases --------------------------------------------

/// A key's state for a decision at some instant: free, or held.
#[derive(Debug, Clone, Copy)]
pub enum Held<'a> {
    Free,
    /// Free, and the key guards its hash tag (design.md S12): only an
    /// exclusive lease may take it.
    FreeGuard,
    Exclusive(&'a Lease),
    /// Held with `LIMIT n` or `SHARED` by at least one live holder; holders
    /// past their deadline may still be stored (they leave at the next
    /// write), and every decision here looks at each holder's deadline.
    Holders(&'a Holders),
}

impl<'a> Held<'a> {
    /// The state of a stored record at `now_ms`: a lease past its deadline,
    /// or a holders record whose holders have all passed theirs, is free.
    pub fn of(record: Option<RecordRef<'a>>, now_ms: i64) -> Held<'a> {
        match record {
            Some(RecordRef::Exclusive(l)) if l.is_live(now_ms) => Held::Exclusive(l),
            Some(RecordRef::Holders(m)) if m.is_live(now_ms) => Held::Holders(m),
            Some(RecordRef::Exclusive(l)) if l.is_guard() => Held::FreeGuard,
            _ => Held::Free,
        }
    }

    pub fn is_free(&self) -> bool {
        matches!(self, Held::Free | Held::FreeGuard)
    }

    /// When the next live holder's time ends at `now_ms` (its deadline, or
    /// the key's expiry when that comes first); `None` when free.
    pub fn next_end(&self, key_expire_ms: Option<i64>, now_ms: i64) -> Option<i64> {
        let end = match self {
            Held::Free | Held::FreeGuard => return None,
            Held::Exclusive(l) => l.deadline_ms,
            Held::Holders(m) => m.next_live_deadline(now_ms)?,
        };
        Some(end_of(end, key_expire_ms))
    }
}

/// What an acquire may do, before any token is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A new holder (or a new exclusive lease): issue a token and store it.
    New,
    /// The caller holds the key in the mode it asks: same token, new deadline.
    Reacquired { token: u64 },
    /// Another holder, no room, or waiters ahead: null, or wait with BLOCK.
    Contended,
}

/// The error for asking `asked` of a key held in `held` (by anyone), or,
/// for two modes without `LIMIT`, by the caller itself.
pub fn conflict(held: Mode, asked: Mode) -> LeaseError {
    if matches!(held, Mode::Limit(_)) || matches!(asked, Mode::Limit(_)) {
        LeaseError::ModeMismatch { held, asked }
    } else {
        LeaseError::HolderMode { held, asked }
    }
}

/// LEASE.ACQUIRE in `mode` by `owner` on a key in state `held` at
/// `now_ms`. `waiters_ahead`: someone waits on the key, so a newcomer that
/// is not a holder must not overtake (strict arrival order, no writer
/// starvation). Errors change nothing: a `LIMIT` that does not match the
/// key's, a `LIMIT` on a key held exclusively or shared and the reverse,
/// and a holder asking in another mode. Holders past their deadline count
/// for nothing, so the caller may decide before it removes them.
pub fn acquire_mode(
    held: Held,
    mode: Mode,
    owner: &[u8],
    waiters_ahead: bool,
    now_ms: i64,
) -> Result<Decision, LeaseError> {
    let queued = |room: bool| {
        if waiters_ahead || !room {
            Decision::Contended
        } else {
            Decision::New
        }
    };
    Ok(match held {
        Held::Free => queued(true),
        Held::FreeGuard if mode != Mode::Exclusive => return Err(LeaseError::GuardHolders),
        Held::FreeGuard => queued(true),
        Held::Exclusive(l) if l.is_guard() && mode != Mode::Exclusive => {
            return Err(LeaseError::GuardHolders);
        }
        Held::Exclusive(l) => match mode {
            Mode::Limit(_) => return Err(conflict(Mode::Exclusive, mode)),
            _ if !l.is_held_by(owner) => Decision::Contended,
            Mode::Exclusive => Decision::Reacquired { token: l.token },
            Mode::Shared => return Err(conflict(Mode::Exclusive, mode)),
        },
        Held::Holders(m) => {
            let held_mode = m.mode().mode();
            let mine = m.holder(owner).filter(|h| h.is_live(now_ms));
            match (m.mode(), mode) {
                (HoldersMode::Limit(k), Mode::Limit(n)) if k == n => match mine {
                    Some(h) => Decision::Reacquired { token: h.token },
                    None => queued(m.has_room(now_ms)),
                },
                (HoldersMode::Limit(_), _) | (HoldersMode::Shared, Mode::Limit(_)) => {
                    return Err(conflict(held_mode, mode));
                }
                (HoldersMode::Shared, Mode::Shared) => match mine {
                    Some(h) => Decision::Reacquired { token: h.token },
                    None => queued(true),
                },
                (HoldersMode::Shared, Mode::Exclusive) => match mine {
                    Some(_) => return Err(conflict(held_mode, mode)),
                    None => Decision::Contended,
                },
            }
        }
    })
}

/// LEASE.RENEW on a holders record: the new deadline when `owner` holds a
/// live holding, else `None`.
pub fn renew_holder(m: &Holders, owner: &[u8], ttl_ms: i64, now_ms: i64) -> Option<i64> {
    m.holder(owner)
        .filter(|h| h.is_live(now_ms))
        .map(|_| now_ms + ttl_ms)
}

/// LEASE.RELEASE on a holders record: may `owner` give back its holding?
pub fn release_holder(m: &Holders, owner: &[u8], now_ms: i64) -> bool {
    m.holder(owner).is_some_and(|h| h.is_live(now_ms))
}

/// Which kind of holder a valid fencing token belongs to, and its time left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    /// A `SHARED` holder: its token cannot fence a write.
    pub shared: bool,
    /// The time the lease (or, for a counting or shared lease, the holding
    /// whose token it is) has left at the decision's time, in ms, as
    /// LEASE.INFO would show it: to its deadline, or to the key's expiry
    /// when that comes first.
    pub left_ms: i64,
}

/// LEASE.FENCE: is `token` the token of a current holder of the key
/// (else `Stale`), and, with `MINTTL` (`min_ttl_ms`), does that holding
/// have at least that long left at `now_ms` (else `Expiring`, with the time
/// left)? Both are read at the same instant; `Stale` wins.
pub fn fence_record(
    record: Option<RecordRef>,
    token: u64,
    min_ttl_ms: Option<i64>,
    now_ms: i64,
    key_expire_ms: Option<i64>,
) -> Result<Fenced, LeaseError> {
    let fenced = match record {
        Some(RecordRef::Exclusive(l)) if l.is_live(now_ms) && l.token == token => Fenced {
            shared: false,
            left_ms: left_ms(l.deadline_ms, key_expire_ms, now_ms),
        },
        Some(RecordRef::Holders(m)) => match m.by_token(token) {
            Some(h) if h.is_live(now_ms) => Fenced {
                shared: m.mode() == HoldersMode::Shared,
                left_ms: left_ms(h.deadline_ms, key_expire_ms, now_ms),
            },
            _ => return Err(LeaseError::Stale),
        },
        _ => return Err(LeaseError::Stale),
    };
    match min_ttl_ms {
        Some(min_ttl_ms) if fenced.left_ms < min_ttl_ms => Err(LeaseError::Expiring {
            left_ms: fenced.left_ms,
            min_ttl_ms,
        }),
        _ => Ok(fenced),
    }
}

/// What LEASE.INFO shows of a counting or shared lease (never an owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldersInfo<'a> {
    pub mode: HoldersMode,
    /// The newest holder's token.
    pub token: u64,
    /// Time to the latest deadline (or the key's expiry when earlier).
    pub ttl_ms: i64,
    /// Every live holder, sorted by token.
    pub holders: Vec<InfoView<'a>>,
}

/// LEASE.INFO of a holders record at `now_ms`: its live holders only; `None`
/// when none is live.
pub fn holders_info(
    m: &Holders,
    now_ms: i64,
    key_expire_ms: Option<i64>,
) -> Option<HoldersInfo<'_>> {
    let holders: Vec<InfoView<'_>> = m
        .holders()
        .filter(|h| h.is_live(now_ms))
        .map(|h| InfoView {
            token: h.token,
            ttl_ms: left_ms(h.deadline_ms, key_expire_ms, now_ms),
            since_ms: h.since_ms,
            label: h.label.as_deref(),
        })
        .collect();
    let token = holders.last()?.token;
    let latest = m.latest_deadline()?;
    Some(HoldersInfo {
        mode: m.mode(),
        token,
        ttl_ms: left_ms(latest, key_expire_ms, now_ms),
        holders,
    })
}

/// What a holders record's key expiry should be set to so that it matches its
/// latest deadline (see `decide::expiry_to_align`).
pub fn holders_expiry_to_align(m: &Holders, key_expire_ms: Option<i64>) -> Option<i64> {
    let latest = m.latest_deadline()?;
    match key_expire_ms {
        Some(e) if e <= latest => None,
        _ => Some(latest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn held(owner: &[u8], token: u64, deadline_ms: i64) -> Box<Lease> {
        Lease::plain(owner, token, deadline_ms)
    }

    #[test]
    fn acquire_free_creates_with_a_fresh_token() {
        let mut clock = TokenClock::new();
        let a = acquire(None, b"a", 1000, 0, NOW, &mut clock).unwrap();
        let Acquire::Created { token, deadline_ms } = a else {
            panic!("{a:?}")
        };
        assert_eq!(token, clock.last());
        assert_eq!(deadline_ms, NOW + 1000);
    }

    #[test]
    fn acquire_by_the_holder_keeps_the_token_and_moves_the_deadline() {
        let mut clock = TokenClock::new();
        let cur = held(b"a", 77, NOW + 10);
        let last = clock.last();
        assert_eq!(
            acquire(Some(&cur), b"a", 500, 0, NOW, &mut clock),
            Ok(Acquire::Reacquired {
                token: 77,
                deadline_ms: NOW + 500,
                raised: false
            })
        );
        assert_eq!(clock.last(), last, "no token issued");
        // FLOOR below the token changes nothing; above it raises the token
        // and the clock.
        assert_eq!(
            acquire(Some(&cur), b"a", 500, 50, NOW, &mut clock),
            Ok(Acquire::Reacquired {
                token: 77,
                deadline_ms: NOW + 500,
                raised: false
            })
        );
        assert_eq!(
            acquire(Some(&cur), b"a", 500, 900, NOW, &mut clock),
            Ok(Acquire::Reacquired {
                token: 900,
                deadline_ms: NOW + 500,
                raised: true
            })
        );
        assert_eq!(clock.last(), 900);
    }

    #[test]
    fn a_floor_sets_a_new_token_and_is_bounded_by_a_year() {
        let mut clock = TokenClock::new();
        let far = NOW as u64 * 1024 + 5000;
        assert!(matches!(
            acquire(None, b"a", 1000, far, NOW, &mut clock),
            Ok(Acquire::Created { token, .. }) if token == far
        ));
        let cur = held(b"a", 77, NOW + 10);
        assert_eq!(
            acquire(Some(&cur), b"b", 500, far * 2, NOW, &mut clock),
            Ok(Acquire::Contended),
            "another owner's lease: nothing changes"
        );
        assert_eq!(clock.last(), far);
        // The bound is the grace length ahead of the clock, at least 1 s.
        for (grace, ahead) in [(60_000, 60_000), (0, 1000), (10, 1000)] {
            let max = (NOW + ahead) as u64 * 1024;
            assert_eq!(check_floor(Some(max), NOW, grace), Ok(max));
            assert_eq!(
                check_floor(Some(max + 1), NOW, grace),
                Err(LeaseError::FloorTooFar {
                    ahead_ms: ahead,
                    max
                })
            );
            assert_eq!(check_floor(None, NOW, grace), Ok(0));
        }
    }

    #[test]
    fn acquire_held_by_another_is_contended_and_issues_nothing() {
        let mut clock = TokenClock::new();
        let cur = held(b"a", 77, NOW + 10);
        assert_eq!(
            acquire(Some(&cur), b"b", 500, 0, NOW, &mut clock),
            Ok(Acquire::Contended)
        );
        assert_eq!(clock.last(), 0);
    }

    #[test]
    fn an_expired_record_counts_as_free() {
        let mut clock = TokenClock::new();
        let cur = held(b"a", 77, NOW - 1);
        assert!(matches!(
            acquire(Some(&cur), b"b", 500, 0, NOW, &mut clock),
            Ok(Acquire::Created { .. })
        ));
        assert_eq!(renew(Some(&cur), b"a", 10, NOW), None);
        assert!(!release(Some(&cur), b"a", NOW));
        assert!(matches!(
            fence_record(Some(RecordRef::Exclusive(&cur)), 77, None, NOW, None),
            Err(LeaseError::Stale)
        ));
        assert_eq!(info(Some(&cur), NOW, None), None);
    }

    #[test]
    fn renew_release_fence_info_on_a_live_lease() {
        let cur = held(b"a", 77, NOW + 100);
        assert_eq!(renew(Some(&cur), b"a", 5000, NOW), Some(NOW + 5000));
        assert_eq!(renew(Some(&cur), b"b", 5000, NOW), None);
        assert_eq!(renew(None, b"a", 5000, NOW), None);
        assert!(release(Some(&cur), b"a", NOW));
        assert!(!release(Some(&cur), b"b", NOW));
        assert!(!release(None, b"a", NOW));
        assert_eq!(
            info(Some(&cur), NOW + 40, None),
            Some(InfoView {
                token: 77,
                ttl_ms: 60,
                since_ms: cur.since_ms(),
                label: None,
            })
        );
        assert_eq!(
            info(Some(&cur), NOW + 40, Some(NOW + 50)).map(|v| v.ttl_ms),
            Some(10),
            "a shorter key TTL wins"
        );
        assert_eq!(
            info(Some(&cur), NOW + 40, Some(NOW + 500)).map(|v| v.ttl_ms),
            Some(60)
        );
    }

    #[test]
    fn minttl_refuses_a_lease_with_less_left_and_stale_wins() {
        let cur = held(b"a", 77, NOW + 5000);
        let rec = Some(RecordRef::Exclusive(&cur));
        let fence = |min, at, expire| fence_record(rec, 77, min, at, expire);
        assert_eq!(
            fence(Some(5000), NOW, None),
            Ok(Fenced {
                shared: false,
                left_ms: 5000
            }),
            "exactly MINTTL left passes"
        );
        assert_eq!(
            fence(Some(5001), NOW, None),
            Err(LeaseError::Expiring {
                left_ms: 5000,
                min_ttl_ms: 5001
            })
        );
        assert_eq!(fence(None, NOW + 4999, None).map(|f| f.left_ms), Ok(1));
        assert_eq!(
            fence(Some(0), NOW + 5000, None).map(|f| f.left_ms),
            Ok(0),
            "MINTTL 0 passes a lease at its deadline, like no MINTTL"
        );
        assert_eq!(
            fence(Some(1), NOW + 5000, None),
            Err(LeaseError::Expiring {
                left_ms: 0,
                min_ttl_ms: 1
            })
        );
        assert_eq!(
            fence(Some(500), NOW, Some(NOW + 120)),
            Err(LeaseError::Expiring {
                left_ms: 120,
                min_ttl_ms: 500
            }),
            "a shorter key expiry ends the lease earlier, as LEASE.INFO shows"
        );
        assert_eq!(
            fence(Some(5000), NOW, Some(NOW + 9000)).map(|f| f.left_ms),
            Ok(5000)
        );
        assert_eq!(
            fence(Some(1_000_000), NOW + 5001, None),
            Err(LeaseError::Stale),
            "an ended lease is STALE, not EXPIRING"
        );
        assert_eq!(
            fence_record(rec, 76, Some(1_000_000), NOW, None),
            Err(LeaseError::Stale),
            "another token is STALE, not EXPIRING"
        );
        assert_eq!(
            fence_record(None, 77, Some(1), NOW, None),
            Err(LeaseError::Stale)
        );
    }

    #[test]
    fn key_expiry_follows_the_lease() {
        let cur = held(b"a", 77, NOW + 100);
        assert_eq!(ends_at(&cur, None), NOW + 100);
        assert_eq!(ends_at(&cur, Some(NOW + 20)), NOW + 20);
        assert_eq!(expiry_to_align(&cur, None), Some(NOW + 100));
        assert_eq!(expiry_to_align(&cur, Some(NOW + 900)), Some(NOW + 100));
        assert_eq!(expiry_to_align(&cur, Some(NOW + 100)), None);
        assert_eq!(expiry_to_align(&cur, Some(NOW + 20)), None);
    }

    #[test]
    fn exhausted_tokens_refuse_instead_of_wrapping() {
        let mut clock = TokenClock::new();
        clock.observe(crate::lease::limits::MAX_TOKEN);
        assert_eq!(
            acquire(None, b"a", 1, 0, 0, &mut clock),
            Err(LeaseError::TokensExhausted)
        );
    }
}

#[cfg(test)]
mod holders_tests {
    use super::*;
    use crate::lease::holders::Holder;

    const NOW: i64 = 1_800_000_000_000;

    fn h(owner: impl AsRef<[u8]>, token: u64, deadline_ms: i64) -> Holder {
        Holder {
            owner: owner.as_ref().into(),
            token,
            deadline_ms,
            since_ms: crate::lease::limits::since_of_token(token),
            label: None,
        }
    }

    fn excl(owner: &str) -> Box<Lease> {
        Lease::plain(owner.as_bytes(), 5, NOW + 10)
    }

    fn sample() -> Holders {
        let mut m = Holders::new(HoldersMode::Limit(3));
        m.put(h("a", 10, NOW + 100));
        m.put(h(b"b\0\xff", 12, NOW + 50));
        m
    }
    #[test]
    fn acquire_on_a_free_key_and_strict_order() {
        for mode in [Mode::Exclusive, Mode::Limit(3), Mode::Shared] {
            assert_eq!(
                acquire_mode(Held::Free, mode, b"a", false, NOW),
                Ok(Decision::New)
            );
            assert_eq!(
                acquire_mode(Held::Free, mode, b"a", true, NOW),
                Ok(Decision::Contended),
                "a newcomer never overtakes a waiter"
            );
        }
    }

    #[test]
    fn acquire_on_an_exclusive_key() {
        let l = excl("a");
        let held = Held::Exclusive(&l);
        assert_eq!(
            acquire_mode(held, Mode::Exclusive, b"a", true, NOW),
            Ok(Decision::Reacquired { token: 5 })
        );
        assert_eq!(
            acquire_mode(held, Mode::Exclusive, b"b", false, NOW),
            Ok(Decision::Contended)
        );
        assert_eq!(
            acquire_mode(held, Mode::Shared, b"b", false, NOW),
            Ok(Decision::Contended)
        );
        let e = acquire_mode(held, Mode::Shared, b"a", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR this owner holds the key with an exclusive lease and asks for SHARED: release it first"
        );
        let e = acquire_mode(held, Mode::Limit(4), b"b", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR the key is held with an exclusive lease, this acquire asks for LIMIT 4"
        );
    }

    #[test]
    fn acquire_on_a_limit_key() {
        let m = sample(); // LIMIT 3, holders a and b
        let held = Held::Holders(&m);
        assert_eq!(
            acquire_mode(held, Mode::Limit(3), b"a", true, NOW),
            Ok(Decision::Reacquired { token: 10 })
        );
        assert_eq!(
            acquire_mode(held, Mode::Limit(3), b"c", false, NOW),
            Ok(Decision::New)
        );
        assert_eq!(
            acquire_mode(held, Mode::Limit(3), b"c", true, NOW),
            Ok(Decision::Contended)
        );
        let mut full = m.clone();
        full.put(h("c", 20, NOW + 5));
        assert_eq!(
            acquire_mode(Held::Holders(&full), Mode::Limit(3), b"d", false, NOW),
            Ok(Decision::Contended)
        );
        let e = acquire_mode(held, Mode::Limit(5), b"c", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR the key is held with LIMIT 3, this acquire asks for LIMIT 5"
        );
        for mode in [Mode::Exclusive, Mode::Shared] {
            for owner in [&b"a"[..], b"c"] {
                assert!(matches!(
                    acquire_mode(held, mode, owner, false, NOW),
                    Err(LeaseError::ModeMismatch { .. })
                ));
            }
        }
    }

    #[test]
    fn holders_past_their_deadline_count_for_nothing() {
        let mut m = sample(); // LIMIT 3: a until NOW + 100, b until NOW + 50
        m.put(h("c", 20, NOW + 50));
        let later = NOW + 60;
        assert_eq!(m.live_len(later), 1);
        assert!(
            !m.has_room(NOW) && m.has_room(later),
            "full, then two ended"
        );
        assert_eq!(
            acquire_mode(Held::Holders(&m), Mode::Limit(3), b"d", false, NOW),
            Ok(Decision::Contended),
            "full"
        );
        assert_eq!(
            acquire_mode(Held::Holders(&m), Mode::Limit(3), b"d", false, later),
            Ok(Decision::New),
            "b's and c's places are free"
        );
        assert_eq!(
            acquire_mode(Held::Holders(&m), Mode::Limit(3), b"c", false, later),
            Ok(Decision::New),
            "c's holding ended: it is a newcomer"
        );
        let s = Holders::with(HoldersMode::Shared, h("r", 9, NOW + 10));
        assert_eq!(
            acquire_mode(Held::Holders(&s), Mode::Exclusive, b"r", false, NOW + 11),
            Ok(Decision::Contended),
            "an ended reader is no holder: its exclusive ask is no error"
        );
    }

    #[test]
    fn acquire_on_a_shared_key() {
        let m = Holders::with(HoldersMode::Shared, h("r", 9, NOW + 10));
        let held = Held::Holders(&m);
        assert_eq!(
            acquire_mode(held, Mode::Shared, b"r", true, NOW),
            Ok(Decision::Reacquired { token: 9 })
        );
        assert_eq!(
            acquire_mode(held, Mode::Shared, b"s", false, NOW),
            Ok(Decision::New)
        );
        assert_eq!(
            acquire_mode(held, Mode::Shared, b"s", true, NOW),
            Ok(Decision::Contended)
        );
        assert_eq!(
            acquire_mode(held, Mode::Exclusive, b"w", false, NOW),
            Ok(Decision::Contended)
        );
        assert!(matches!(
            acquire_mode(held, Mode::Exclusive, b"r", false, NOW),
            Err(LeaseError::HolderMode { .. })
        ));
        let e = acquire_mode(held, Mode::Limit(2), b"w", false, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR the key is held with SHARED, this acquire asks for LIMIT 2"
        );
    }

    #[test]
    fn renew_release_fence_info() {
        let mut m = sample();
        assert_eq!(renew_holder(&m, b"a", 30, NOW), Some(NOW + 30));
        assert_eq!(renew_holder(&m, b"a", 30, NOW + 101), None, "expired");
        assert_eq!(renew_holder(&m, b"zz", 30, NOW), None);
        assert!(release_holder(&m, b"a", NOW));
        assert!(!release_holder(&m, b"a", NOW + 101));
        fn rec(m: &Holders) -> Option<RecordRef<'_>> {
            Some(RecordRef::Holders(m))
        }
        let fence = |r, t, at| fence_record(r, t, None, at, None).map(|f| f.shared);
        assert_eq!(fence(rec(&m), 12, NOW), Ok(false));
        assert_eq!(fence(rec(&m), 12, NOW + 51), Err(LeaseError::Stale));
        assert_eq!(fence(rec(&m), 11, NOW), Err(LeaseError::Stale));
        let s = Holders::with(HoldersMode::Shared, h("r", 9, NOW + 10));
        assert_eq!(fence(rec(&s), 9, NOW), Ok(true));
        let l = excl("a");
        assert_eq!(fence(Some(RecordRef::Exclusive(&l)), 5, NOW), Ok(false));
        assert_eq!(fence(None, 5, NOW), Err(LeaseError::Stale));
        // MINTTL looks at the holding whose token it is, not the key's
        // latest deadline.
        assert_eq!(
            fence_record(rec(&m), 12, Some(50), NOW, None),
            Ok(Fenced {
                shared: false,
                left_ms: 50
            })
        );
        assert_eq!(
            fence_record(rec(&m), 12, Some(51), NOW, None),
            Err(LeaseError::Expiring {
                left_ms: 50,
                min_ttl_ms: 51
            })
        );
        assert_eq!(
            fence_record(rec(&m), 10, Some(51), NOW, None).map(|f| f.left_ms),
            Ok(100)
        );
        assert_eq!(
            fence_record(rec(&m), 10, Some(51), NOW, Some(NOW + 30)),
            Err(LeaseError::Expiring {
                left_ms: 30,
                min_ttl_ms: 51
            })
        );
        assert_eq!(
            fence_record(rec(&m), 12, Some(1), NOW + 51, None),
            Err(LeaseError::Stale)
        );
        assert_eq!(
            fence_record(rec(&s), 9, Some(11), NOW, None),
            Err(LeaseError::Expiring {
                left_ms: 10,
                min_ttl_ms: 11
            }),
            "a reader's holding too"
        );
        let view = holders_info(&m, NOW + 10, None).unwrap();
        assert_eq!(view.mode, HoldersMode::Limit(3));
        assert_eq!((view.token, view.ttl_ms), (12, 90));
        let shown = |v: &HoldersInfo| -> Vec<(u64, i64)> {
            v.holders.iter().map(|h| (h.token, h.ttl_ms)).collect()
        };
        assert_eq!(shown(&view), vec![(10, 90), (12, 40)]);
        let view = holders_info(&m, NOW + 60, Some(NOW + 80)).unwrap();
        assert_eq!(
            shown(&view),
            vec![(10, 20)],
            "the ended holder is not shown"
        );
        assert_eq!((view.token, view.ttl_ms), (10, 20));
        assert_eq!(holders_info(&m, NOW + 101, None), None);
        assert_eq!(holders_expiry_to_align(&m, None), Some(NOW + 100));
        assert_eq!(holders_expiry_to_align(&m, Some(NOW + 100)), None);
        assert_eq!(
            holders_expiry_to_align(&m, Some(NOW + 200)),
            Some(NOW + 100)
        );
        m.take_ended(NOW + 1000, usize::MAX);
        assert_eq!(holders_expiry_to_align(&m, None), None);
    }

    #[test]
    fn held_state_and_next_end() {
        let m = sample();
        let l = excl("a");
        assert!(Held::of(None, NOW).is_free());
        assert!(Held::of(Some(RecordRef::Exclusive(&l)), NOW + 11).is_free());
        assert!(!Held::of(Some(RecordRef::Holders(&m)), NOW + 100).is_free());
        assert!(Held::of(Some(RecordRef::Holders(&m)), NOW + 101).is_free());
        let held = Held::of(Some(RecordRef::Holders(&m)), NOW);
        assert_eq!(held.next_end(None, NOW), Some(NOW + 50));
        assert_eq!(held.next_end(Some(NOW + 20), NOW), Some(NOW + 20));
        assert_eq!(
            held.next_end(None, NOW + 60),
            Some(NOW + 100),
            "an ended holder still stored is no next end"
        );
        assert_eq!(Held::Exclusive(&l).next_end(None, NOW), Some(NOW + 10));
        assert_eq!(Held::Free.next_end(None, NOW), None);
    }

    /// A guard's key takes only exclusive leases (design.md S12).
    #[test]
    fn limit_and_shared_cannot_take_a_guard_free_or_held() {
        let free = Lease::free_guard(5);
        let held = Held::of(Some(RecordRef::Exclusive(&free)), NOW);
        assert!(matches!(held, Held::FreeGuard) && held.is_free());
        for mode in [Mode::Limit(3), Mode::Shared] {
            assert_eq!(
                acquire_mode(held, mode, b"a", false, NOW),
                Err(LeaseError::GuardHolders)
            );
        }
        assert_eq!(
            acquire_mode(held, Mode::Exclusive, b"a", false, NOW),
            Ok(Decision::New)
        );
        let mut l = Lease::new(b"a", 9 << 10, NOW + 100, 9, None);
        l.set_guard(true);
        let held = Held::of(Some(RecordRef::Exclusive(&l)), NOW);
        assert_eq!(
            acquire_mode(held, Mode::Shared, b"a", false, NOW),
            Err(LeaseError::GuardHolders)
        );
        assert_eq!(
            acquire_mode(held, Mode::Exclusive, b"b", false, NOW),
            Ok(Decision::Contended)
        );
    }
}
