//! What drives `ops` in the core's own tests: a map of records as the keys
//! (`MapKey`, as `module/commit.rs`'s `KeyWriter` is on a server) and a
//! waiter queue (`SlotQueue`, as `module/waiters.rs`'s), used by the model
//! test (model.rs) and by the hand-off's scenario tests below.

use std::collections::HashMap;

use super::clock::TokenClock;
use super::decide::Held;
use super::effect::{Effect, Stored};
use super::error::LeaseError;
use super::mode::HoldersMode;
use super::ops::{Commit, Event, Key, Queue};
use super::record::{Record, RecordRef};
use super::waitq::{Slot, Step, WaitRegistry, Waiter};

/// The answers given to blocked acquires, by id, in the order they came:
/// a token, or an error's text.
pub type Late = Vec<(u32, Result<u64, String>)>;

/// One key of the map, as `ops` sees a key (`commit.rs`'s `KeyWriter`).
pub struct MapKey<'m> {
    pub key: usize,
    pub keys: &'m mut HashMap<usize, Record>,
    /// Every token issued per key (each must be above the last).
    pub issued: &'m mut HashMap<usize, Vec<u64>>,
    /// The keys that guard their hash tag, as the binding's set of guards
    /// follows them: from what each effect's change says came or went.
    pub guards: &'m mut Vec<usize>,
}

impl Key for MapKey<'_> {
    fn record(&mut self) -> Result<Option<RecordRef<'_>>, LeaseError> {
        Ok(self.keys.get(&self.key).map(|r| r.as_ref()))
    }

    /// The keys here never expire on their own: ended leases stay stored,
    /// as they do on a key whose expiry a user removed.
    fn expire_at(&mut self) -> Option<i64> {
        None
    }

    fn commit(&mut self, commit: Commit<'_>) {
        let key = self.key;
        if commit.event == Event::Acquire {
            let token = commit
                .effect
                .token()
                .expect("an acquisition carries its token");
            let all = self.issued.entry(key).or_default();
            let prev = all.last().copied().unwrap_or(0);
            assert!(token > prev, "token {token} on key {key} after {prev}");
            all.push(token);
        }
        // The decisions make room in a full LIMIT record (a PRUNE first);
        // `Effect::apply`'s own guard must never be needed.
        if let (Effect::Hold { mode, owner, .. }, Some(Record::Holders(m))) =
            (commit.effect, self.keys.get(&key))
            && let HoldersMode::Limit(n) = mode
            && m.mode() == mode
            && m.holder(owner).is_none()
        {
            assert!(
                m.len() < n as usize,
                "no room for a holder on LIMIT {n} key {key}"
            );
        }
        let stored = match self.keys.get_mut(&key) {
            Some(r) => Stored::Record(r.as_mut()),
            None => Stored::Nothing,
        };
        let change = commit.effect.apply(stored);
        match change.guard {
            Some(true) => self.guards.push(key),
            Some(false) => self.guards.retain(|k| *k != key),
            None => {}
        }
        if change.delete {
            self.keys.remove(&key);
        }
        if let Some(r) = change.store {
            self.keys.insert(key, r);
        }
        if let Some(Record::Holders(m)) = self.keys.get(&key)
            && let HoldersMode::Limit(n) = m.mode()
        {
            assert!(
                m.len() <= n as usize,
                "{} holders on LIMIT {n} key {key}",
                m.len()
            );
        }
    }

    fn count(&mut self, _event: Event) {}
}

/// One key's waiters (`waiters.rs`'s `SlotQueue`).
pub struct SlotQueue<'m> {
    pub slot: Slot,
    /// Waiters by id; a queue's timer is the time of its re-check.
    pub reg: &'m mut WaitRegistry<u32, i64>,
    pub late: &'m mut Late,
}

impl Queue<u32> for SlotQueue<'_> {
    fn grant_next(&mut self, held: Held, now_ms: i64, clock: &mut TokenClock) -> Option<Step<u32>> {
        self.reg.grant_next(&self.slot, held, now_ms, clock)
    }

    fn waiting(&self) -> usize {
        self.reg.len(&self.slot)
    }

    fn answer(&mut self, waiter: Waiter<u32>, answer: Result<u64, LeaseError>) {
        self.late
            .push((waiter.handle, answer.map_err(|e| e.to_string())));
    }
}

/// The hand-off (`ops::serve`) in scenarios: who is served together, who
/// waits, who is refused.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::mode::Mode;
    use crate::lease::ops::{self, Env, Snapshot};

    const X: Mode = Mode::Exclusive;

    fn slot() -> Slot {
        (0, b"a".to_vec())
    }

    /// Serves key 0's queue at `now` as the module does; the answers.
    fn serve(
        reg: &mut WaitRegistry<u32, i64>,
        keys: &mut HashMap<usize, Record>,
        now: i64,
        clock: &mut TokenClock,
    ) -> Late {
        serve_with(reg, keys, now, clock, false).0
    }

    /// `serve`, out of memory or not; also what the core said to do next.
    fn serve_with(
        reg: &mut WaitRegistry<u32, i64>,
        keys: &mut HashMap<usize, Record>,
        now: i64,
        clock: &mut TokenClock,
        out_of_memory: bool,
    ) -> (Late, ops::Served) {
        let (mut issued, mut late) = (HashMap::new(), Vec::new());
        let mut key = MapKey {
            key: 0,
            keys,
            issued: &mut issued,
            guards: &mut Vec::new(),
        };
        let mut queue = SlotQueue {
            slot: slot(),
            reg,
            late: &mut late,
        };
        let env = Env {
            server: Snapshot {
                now_ms: now,
                grace_ends_at: None,
                out_of_memory,
                prune_per_call: ops::PRUNE_PER_CALL,
            },
            clock,
            waiters_ahead: false,
            ended_early: None,
        };
        let served = ops::serve(&mut key, &mut queue, env);
        (late, served)
    }

    #[test]
    fn out_of_memory_no_waiter_is_handed_a_lease_until_memory_is_back() {
        let mut r: WaitRegistry<u32, i64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        r.push(slot(), 1, b"w", X, 100, None);
        let mut keys = HashMap::new();
        let (got, next) = serve_with(&mut r, &mut keys, 1000, &mut clock, true);
        assert!(got.is_empty() && keys.is_empty(), "{got:?} {keys:?}");
        assert!(matches!(next, ops::Served::NoMemory), "tried again later");
        assert_eq!(r.len(&slot()), 1, "it keeps waiting");
        assert_eq!(clock.last(), 0, "no token issued");
        let (got, _) = serve_with(&mut r, &mut keys, 1000, &mut clock, false);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn a_run_of_shared_heads_is_served_together_and_never_overtakes_a_writer() {
        let mut r: WaitRegistry<u32, i64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        let s = slot();
        r.push(s.clone(), 1, b"r1", Mode::Shared, 100, None);
        r.push(s.clone(), 2, b"r2", Mode::Shared, 100, None);
        r.push(s.clone(), 3, b"w", X, 100, None);
        r.push(s.clone(), 4, b"r3", Mode::Shared, 100, None);
        let mut keys = HashMap::new();
        let got = serve(&mut r, &mut keys, 1000, &mut clock);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1, 2]);
        let Some(Record::Holders(m)) = keys.get(&0) else {
            panic!("{keys:?}")
        };
        assert_eq!((m.mode(), m.len()), (HoldersMode::Shared, 2));
        assert_eq!(r.len(&s), 2, "the writer and the reader behind it wait");
        // The readers leave: the writer comes first, then the last reader.
        keys.clear();
        let got = serve(&mut r, &mut keys, 1000, &mut clock);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![3]);
        assert!(matches!(keys.get(&0), Some(Record::Exclusive(_))));
        keys.clear();
        let got = serve(&mut r, &mut keys, 1000, &mut clock);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn limit_heads_are_served_while_permits_remain_and_mismatches_are_refused() {
        let mut r: WaitRegistry<u32, i64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        let s = slot();
        r.push(s.clone(), 1, b"a", Mode::Limit(2), 100, None);
        r.push(s.clone(), 2, b"b", Mode::Limit(5), 100, None);
        r.push(s.clone(), 3, b"c", Mode::Limit(2), 100, None);
        r.push(s.clone(), 4, b"a", Mode::Shared, 100, None);
        r.push(s.clone(), 5, b"d", Mode::Limit(2), 100, None);
        r.push(s.clone(), 6, b"e", Mode::Limit(2), 100, None);
        let mut keys = HashMap::new();
        let got = serve(&mut r, &mut keys, 1000, &mut clock);
        let handles: Vec<u32> = got.iter().map(|g| g.0).collect();
        assert_eq!(handles, vec![1, 4, 2, 3], "a, a's other mode, b refused, c");
        assert!(got[0].1.is_ok() && got[3].1.is_ok());
        assert!(got[1].1.as_ref().unwrap_err().contains("asks for SHARED"));
        assert!(
            got[2]
                .1
                .as_ref()
                .unwrap_err()
                .contains("held with LIMIT 2, this acquire asks for LIMIT 5")
        );
        assert_eq!(r.len(&s), 2, "d and e wait: both permits are taken");
        let Some(Record::Holders(m)) = keys.get_mut(&0) else {
            panic!()
        };
        m.remove(b"a");
        let got = serve(&mut r, &mut keys, 1000, &mut clock);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![5]);
    }
}
