//! The fencing-token clock (design.md S2): a hybrid logical clock.
//!
//! A new token is `max(last + 1, now_ms * 1024)`. The logical part makes
//! tokens strictly increasing on one server whatever happens to keys; the
//! wall-clock floor keeps them increasing across events that lose `last`
//! (restart without persistence, failover, a slot moving), provided the
//! clocks involved differ by less than the time the event took. 1024 tokens
//! per millisecond can be issued before the logical part runs ahead of the
//! wall clock, and it catches up by itself when the load drops.

use super::limits::{MAX_AHEAD_MS, MAX_TOKEN, MIN_FLOOR_AHEAD_MS, TOKENS_PER_MS};

// How far ahead of the wall clock a stored token may be (`MAX_AHEAD_MS`,
// one year of floor): the logical part runs ahead of the wall clock only by
// the tokens issued faster than 1024 per millisecond, so real values stay
// far below it.

/// The largest token a stored value may carry at `now_ms`.
pub fn max_acceptable(now_ms: i64) -> u64 {
    let ahead = u64::try_from(now_ms.saturating_add(MAX_AHEAD_MS)).unwrap_or(0);
    ahead.saturating_mul(TOKENS_PER_MS).min(MAX_TOKEN)
}

/// How far ahead of the wall clock a `FLOOR` token may be (design.md S9):
/// the grace length, at least `MIN_FLOOR_AHEAD_MS`. A start without
/// persistence issues no token below `start_floor`: every later token is
/// above any token `FLOOR` could have set.
pub fn floor_ahead_ms(grace_ms: i64) -> i64 {
    grace_ms.max(MIN_FLOOR_AHEAD_MS)
}

/// The largest `FLOOR` token accepted at `now_ms` under a grace length of
/// `grace_ms`.
pub fn max_floor(now_ms: i64, grace_ms: i64) -> u64 {
    let ahead = u64::try_from(now_ms.saturating_add(floor_ahead_ms(grace_ms))).unwrap_or(0);
    ahead.saturating_mul(TOKENS_PER_MS).min(MAX_TOKEN)
}

/// The lowest token a start that may have lost a `FLOOR` (no data, or
/// data older than what was acknowledged) issues: above any `FLOOR` the
/// previous run could have accepted before `start_ms` under this grace
/// length (design.md S9). Its grace period may be shorter than the bound
/// (`grace-ms` below 1000, or 0): the token clock starts ahead instead, so
/// no lease waits longer for it.
pub fn start_floor(start_ms: i64, grace_ms: i64) -> u64 {
    max_floor(start_ms, grace_ms)
        .saturating_add(1)
        .min(MAX_TOKEN)
}

/// The last token this server issued or saw, and the lowest it issues.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TokenClock {
    last: u64,
    lowest: u64,
}

impl TokenClock {
    pub const fn new() -> Self {
        TokenClock { last: 0, lowest: 0 }
    }

    /// A clock that issues no token below `lowest` (a `start_floor`).
    pub const fn at_least(lowest: u64) -> Self {
        TokenClock { last: 0, lowest }
    }

    /// The last token issued or observed.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The token a new acquisition would get at `now_ms`, without issuing it.
    pub fn peek(&self, now_ms: i64) -> Option<u64> {
        let floor = u64::try_from(now_ms)
            .unwrap_or(0)
            .saturating_mul(TOKENS_PER_MS);
        let token = self.last.saturating_add(1).max(floor).max(self.lowest);
        (token <= MAX_TOKEN).then_some(token)
    }

    /// Issues the next token at `now_ms`; `None` once 2^53-1 is reached.
    pub fn issue(&mut self, now_ms: i64) -> Option<u64> {
        self.issue_at_least(now_ms, 0)
    }

    /// Issues the next token at `now_ms`, at least `floor` (`FLOOR`,
    /// design.md S9: `max(last + 1, now_ms * 1024, floor)`); `None` once
    /// 2^53-1 is reached.
    pub fn issue_at_least(&mut self, now_ms: i64, floor: u64) -> Option<u64> {
        let token = self.peek(now_ms)?.max(floor);
        if token > MAX_TOKEN {
            return None;
        }
        self.last = token;
        Some(token)
    }

    /// Raises `last` to at least `token` (a replicated, loaded or restored
    /// lease), so no later token can repeat or undercut it.
    pub fn observe(&mut self, token: u64) {
        self.last = self.last.max(token.min(MAX_TOKEN));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn tokens_follow_the_wall_clock_floor() {
        let mut c = TokenClock::new();
        assert_eq!(c.issue(NOW), Some(NOW as u64 * 1024));
        assert_eq!(c.issue(NOW + 1), Some((NOW as u64 + 1) * 1024));
    }

    #[test]
    fn tokens_strictly_increase_within_one_millisecond_and_when_the_clock_steps_back() {
        let mut c = TokenClock::new();
        let a = c.issue(NOW).unwrap();
        let b = c.issue(NOW).unwrap();
        let d = c.issue(NOW - 60_000).unwrap();
        assert!(a < b && b < d);
        assert_eq!(d, b + 1);
    }

    #[test]
    fn a_start_that_may_have_lost_a_floor_issues_above_any_floor_of_the_run_before() {
        for grace in [0, 300, 999, 1000, 60_000] {
            // The highest FLOOR the previous run accepted, 1 ms before the
            // start: this start's first token is above it.
            let floor = max_floor(NOW - 1, grace);
            let mut c = TokenClock::at_least(start_floor(NOW, grace));
            let first = c.issue(NOW).unwrap();
            assert!(first > floor, "grace {grace}: {first} <= {floor}");
            assert!(first >= ((NOW + grace.max(1000)) * 1024) as u64);
            assert_eq!(c.last(), first);
            // Once the wall clock passes it, tokens follow the clock again.
            assert_eq!(c.issue(NOW + 70_000), Some((NOW as u64 + 70_000) * 1024));
        }
        assert_eq!(TokenClock::at_least(0).issue(NOW), Some(NOW as u64 * 1024));
    }

    #[test]
    fn observe_raises_but_never_lowers() {
        let mut c = TokenClock::new();
        c.observe(NOW as u64 * 1024 + 5000);
        assert_eq!(c.issue(NOW), Some(NOW as u64 * 1024 + 5001));
        c.observe(3);
        assert_eq!(c.last(), NOW as u64 * 1024 + 5001);
    }

    #[test]
    fn stored_tokens_may_run_one_year_ahead() {
        let bound = max_acceptable(NOW);
        assert_eq!(bound, (NOW + MAX_AHEAD_MS) as u64 * TOKENS_PER_MS);
        assert!(bound < MAX_TOKEN, "the bound leaves room to issue tokens");
        assert_eq!(max_acceptable(i64::MAX), MAX_TOKEN);
        assert_eq!(max_acceptable(i64::MIN), 0);
    }

    #[test]
    fn a_floor_raises_the_token_and_the_clock() {
        let mut c = TokenClock::new();
        let far = NOW as u64 * 1024 + 1_000_000;
        assert_eq!(c.issue_at_least(NOW, far), Some(far));
        assert_eq!(c.issue(NOW), Some(far + 1), "the clock is at the floor now");
        assert_eq!(
            c.issue_at_least(NOW, 5),
            Some(far + 2),
            "a low floor changes nothing"
        );
    }

    #[test]
    fn max_token_is_never_exceeded() {
        let mut c = TokenClock::new();
        c.observe(MAX_TOKEN - 1);
        assert_eq!(c.issue(0), Some(MAX_TOKEN));
        assert_eq!(c.issue(0), None);
        assert_eq!(c.last(), MAX_TOKEN);
        c.observe(u64::MAX);
        assert_eq!(c.last(), MAX_TOKEN);
        assert_eq!(TokenClock::new().peek(i64::MAX), None);
        assert_eq!(TokenClock::new().peek(-5), Some(1));
    }
}
