//! The decision each command makes, given the lease stored on the key (if
//! any), the caller's arguments and the time. No I/O: the module layer reads
//! the key, asks here, then applies the answer.

use super::clock::TokenClock;
use super::error::LeaseError;
use super::record::Lease;

/// The lease that counts at `now_ms`: a stored record past its deadline is
/// no lease at all (the key may outlive it by a moment, or have lost its TTL
/// through a RESTORE without one).
pub fn live(current: Option<&Lease>, now_ms: i64) -> Option<&Lease> {
    current.filter(|l| l.is_live(now_ms))
}

/// What LEASE.ACQUIRE does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The key was free: store this new lease and answer its token.
    Created(Box<Lease>),
    /// The caller already holds it: keep the token, move the deadline.
    Reacquired { token: u64, deadline_ms: i64 },
    /// Someone else holds it: answer null, change nothing.
    Contended,
}

pub fn acquire(
    current: Option<&Lease>,
    owner: &[u8],
    ttl_ms: i64,
    now_ms: i64,
    clock: &mut TokenClock,
) -> Result<Acquire, LeaseError> {
    let deadline_ms = now_ms + ttl_ms;
    Ok(match live(current, now_ms) {
        None => {
            let token = clock.issue(now_ms).ok_or(LeaseError::TokensExhausted)?;
            Acquire::Created(Lease::new(owner, token, deadline_ms))
        }
        Some(l) if l.is_held_by(owner) => Acquire::Reacquired {
            token: l.token,
            deadline_ms,
        },
        Some(_) => Acquire::Contended,
    })
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

/// LEASE.RELEASE replayed from the master or the AOF: the master already
/// decided, so the owner alone counts (the replica's clock must not).
pub fn release_effect(current: Option<&Lease>, owner: &[u8]) -> bool {
    current.is_some_and(|l| l.is_held_by(owner))
}

/// LEASE.FENCE: is `token` the token of the lease held right now?
pub fn fence(current: Option<&Lease>, token: u64, now_ms: i64) -> Result<(), LeaseError> {
    match live(current, now_ms) {
        Some(l) if l.token == token => Ok(()),
        _ => Err(LeaseError::Stale),
    }
}

/// What LEASE.INFO shows (never the owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfoView {
    pub token: u64,
    pub ttl_ms: i64,
}

pub fn info(current: Option<&Lease>, now_ms: i64, key_expire_ms: Option<i64>) -> Option<InfoView> {
    live(current, now_ms).map(|l| InfoView {
        token: l.token,
        ttl_ms: (ends_at(l, key_expire_ms) - now_ms).max(0),
    })
}

/// When a live lease ends: at its recorded deadline, or earlier when its
/// key expires first (a `PEXPIRE` shortened the key's TTL).
pub fn ends_at(lease: &Lease, key_expire_ms: Option<i64>) -> i64 {
    key_expire_ms.map_or(lease.deadline_ms, |e| e.min(lease.deadline_ms))
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn held(owner: &[u8], token: u64, deadline_ms: i64) -> Box<Lease> {
        Lease::new(owner, token, deadline_ms)
    }

    #[test]
    fn acquire_free_creates_with_a_fresh_token() {
        let mut clock = TokenClock::new();
        let a = acquire(None, b"a", 1000, NOW, &mut clock).unwrap();
        let Acquire::Created(l) = a else {
            panic!("{a:?}")
        };
        assert_eq!(l.token, clock.last());
        assert_eq!(l.deadline_ms, NOW + 1000);
        assert!(l.is_held_by(b"a"));
    }

    #[test]
    fn acquire_by_the_holder_keeps_the_token_and_moves_the_deadline() {
        let mut clock = TokenClock::new();
        let cur = held(b"a", 77, NOW + 10);
        let last = clock.last();
        assert_eq!(
            acquire(Some(&cur), b"a", 500, NOW, &mut clock),
            Ok(Acquire::Reacquired {
                token: 77,
                deadline_ms: NOW + 500
            })
        );
        assert_eq!(clock.last(), last, "no token issued");
    }

    #[test]
    fn acquire_held_by_another_is_contended_and_issues_nothing() {
        let mut clock = TokenClock::new();
        let cur = held(b"a", 77, NOW + 10);
        assert_eq!(
            acquire(Some(&cur), b"b", 500, NOW, &mut clock),
            Ok(Acquire::Contended)
        );
        assert_eq!(clock.last(), 0);
    }

    #[test]
    fn an_expired_record_counts_as_free() {
        let mut clock = TokenClock::new();
        let cur = held(b"a", 77, NOW - 1);
        assert!(matches!(
            acquire(Some(&cur), b"b", 500, NOW, &mut clock),
            Ok(Acquire::Created(_))
        ));
        assert_eq!(renew(Some(&cur), b"a", 10, NOW), None);
        assert!(!release(Some(&cur), b"a", NOW));
        assert_eq!(fence(Some(&cur), 77, NOW), Err(LeaseError::Stale));
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
        assert!(release_effect(Some(&cur), b"a"));
        assert!(
            release_effect(Some(&held(b"a", 77, NOW - 5)), b"a"),
            "expired: the master decided"
        );
        assert!(!release_effect(Some(&cur), b"b"));
        assert_eq!(fence(Some(&cur), 77, NOW), Ok(()));
        assert_eq!(fence(Some(&cur), 76, NOW), Err(LeaseError::Stale));
        assert_eq!(fence(None, 77, NOW), Err(LeaseError::Stale));
        assert_eq!(
            info(Some(&cur), NOW + 40, None),
            Some(InfoView {
                token: 77,
                ttl_ms: 60
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
        clock.observe(super::super::clock::MAX_TOKEN);
        assert_eq!(
            acquire(None, b"a", 1, 0, &mut clock),
            Err(LeaseError::TokensExhausted)
        );
    }
}
