//! Waiters of `LEASE.ACQUIRE ... BLOCK`: one first-come-first-served queue
//! per key, and the `BLOCK` timeouts of every waiter. Generic over the handle
//! the server layer uses for a blocked client, so the queue discipline is
//! tested here without a server.
//!
//! Every operation costs O(log n) or less in the number of waiters n (a
//! mass timeout of n waiters costs O(n log n)): arrival order and timeouts
//! are ordered maps, and a waiter is found by its handle, a queue by its key
//! name, and a queue's waiters by their owner through hash indexes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use super::clock::TokenClock;
use super::decide::{self, Decision, Held};
use super::error::LeaseError;
use super::mode::Mode;

/// How long after the `BLOCK` timeout a waiter asked for it is timed out:
/// the clock reads whole milliseconds, so `now + timeout` may be up to
/// 1 ms less than `timeout` away; a wait is never shorter than its BLOCK
/// (at most 1 ms longer).
pub const BLOCK_MARGIN_MS: i64 = 1;

/// A client waiting for a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter<H> {
    /// Unique per waiter, in arrival order.
    pub id: u64,
    /// The server's handle for the blocked client.
    pub handle: H,
    /// The owner id, mode and ttl it asked for.
    pub owner: Box<[u8]>,
    pub mode: Mode,
    pub ttl_ms: i64,
    /// When its `BLOCK` timeout is served (unix ms): [`BLOCK_MARGIN_MS`]
    /// after the timeout it asked for; `None` waits forever.
    pub timeout_at: Option<i64>,
    /// Its `FLOOR` (0: none): the token it is served with is at least this.
    pub floor: u64,
    /// A `LEASE.MACQUIRE` waiter: every key it waits for (it is queued on
    /// each, with one id); `None` for a single-key waiter.
    pub keys: Option<Arc<[Slot]>>,
    /// Its `LABEL` (design.md S11): shown while it waits, its holding's
    /// label once served.
    pub label: Option<Box<[u8]>>,
    /// The server's id of its client (`CLIENT ID`), and when it began to
    /// wait (unix ms): shown by `LEASE.WAITERS`.
    pub client: u64,
    pub arrived_ms: i64,
}

/// What `LEASE.WAITERS` shows of a waiter (design.md S11): never its
/// owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterView<'w> {
    pub client: u64,
    pub label: Option<&'w [u8]>,
    /// `exclusive`, `shared`, `limit`, or `keys` for a multi-key waiter.
    pub mode: &'static str,
    /// `n` of `LIMIT n` (0 otherwise).
    pub limit: u32,
    /// How many keys it waits for (1, or a multi-key waiter's count).
    pub keys: usize,
    pub waited_ms: i64,
    /// Time to its `BLOCK` timeout; -1 when it waits forever (`BLOCK 0`).
    pub timeout_ms: i64,
}

impl<H> Waiter<H> {
    /// What `LEASE.WAITERS` shows of it at `now_ms`.
    pub fn view(&self, now_ms: i64) -> WaiterView<'_> {
        let (mode, limit) = match (self.keys.is_some(), self.mode) {
            (true, _) => ("keys", 0),
            (false, Mode::Exclusive) => ("exclusive", 0),
            (false, Mode::Shared) => ("shared", 0),
            (false, Mode::Limit(n)) => ("limit", n),
        };
        WaiterView {
            client: self.client,
            label: self.label.as_deref(),
            mode,
            limit,
            keys: self.keys.as_ref().map_or(1, |k| k.len()),
            waited_ms: (now_ms - self.arrived_ms).max(0),
            // The time to the timeout it asked for: never more than its
            // BLOCK, even in the millisecond it arrived.
            timeout_ms: self
                .timeout_at
                .map_or(-1, |at| (at - BLOCK_MARGIN_MS - now_ms).max(0)),
        }
    }
}

/// What a new waiter asks for (`WaitRegistry::push_ask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    pub owner: &'a [u8],
    pub mode: Mode,
    pub ttl_ms: i64,
    /// When its `BLOCK` timeout is served (unix ms): [`BLOCK_MARGIN_MS`]
    /// after the timeout it asked for; `None` waits forever.
    pub timeout_at: Option<i64>,
    /// Its `FLOOR` (0: none).
    pub floor: u64,
    pub label: Option<&'a [u8]>,
    pub client: u64,
    pub arrived_ms: i64,
}

impl<'a> Ask<'a> {
    /// A plain ask: no `FLOOR`, no label, no client id, arrived at 0.
    pub fn new(owner: &'a [u8], mode: Mode, ttl_ms: i64, timeout_at: Option<i64>) -> Self {
        Ask {
            owner,
            mode,
            ttl_ms,
            timeout_at,
            floor: 0,
            label: None,
            client: 0,
            arrived_ms: 0,
        }
    }
}

impl<H> Waiter<H> {
    /// Every queue it waits in, given one of them.
    pub fn slots(&self, slot: &Slot) -> Vec<Slot> {
        match &self.keys {
            Some(keys) => keys.to_vec(),
            None => vec![slot.clone()],
        }
    }
}

/// One step of serving a queue (`WaitRegistry::grant_next`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<H> {
    /// The oldest waiter becomes a holder in `mode`, with a new token:
    /// store it (an exclusive lease, or one more holder of a `LIMIT` or
    /// `SHARED` key) and answer `waiters` with the token. `waiters` is the
    /// oldest waiter, then every later waiter with the same owner and mode
    /// (a client's retries after a lost reply), answered as re-acquires
    /// would be, so the deadline is `now` plus the last one's ttl.
    /// `refused`: waiters of that owner in another mode, with their error.
    /// `label`: the latest label these waiters gave.
    Grant {
        mode: Mode,
        owner: Box<[u8]>,
        token: u64,
        deadline_ms: i64,
        label: Option<Box<[u8]>>,
        waiters: Vec<Waiter<H>>,
        refused: Vec<(Waiter<H>, LeaseError)>,
    },
    /// The oldest waiter's owner holds the key already, in its mode: its
    /// deadline moves to `deadline_ms` and `waiters` get its token (raised
    /// to their `FLOOR`: `raised`); `label` as in `Grant` (none: the holding
    /// keeps its label).
    Reacquired {
        owner: Box<[u8]>,
        token: u64,
        raised: bool,
        deadline_ms: i64,
        label: Option<Box<[u8]>>,
        waiters: Vec<Waiter<H>>,
        refused: Vec<(Waiter<H>, LeaseError)>,
    },
    /// The oldest waiter asks for what the key's state refuses (a mode that
    /// does not match how it is held now, or no token is left): answer it
    /// the error.
    Refused {
        waiter: Waiter<H>,
        error: LeaseError,
    },
}

/// Where a queue lives: database index and key name.
pub type Slot = (i32, Vec<u8>);

/// All queues, with a timer id per queue (the timer that re-checks the key
/// at its lease's deadline).
#[derive(Debug)]
pub struct WaitRegistry<H, T> {
    queues: HashMap<Slot, Queue<H, T>>,
    /// Databases that have a queue for a key name.
    by_name: HashMap<Vec<u8>, Vec<i32>>,
    /// Where each waiter waits.
    by_handle: HashMap<H, (Slot, u64)>,
    /// Waiters with a timeout, by (timeout, id).
    timeouts: BTreeSet<(i64, u64, H)>,
    next_id: u64,
    total: usize,
}

#[derive(Debug)]
struct Queue<H, T> {
    waiters: BTreeMap<u64, Waiter<H>>,
    /// Ids of the waiters of each owner.
    by_owner: HashMap<Box<[u8]>, BTreeSet<u64>>,
    timer: Option<T>,
}

impl<H, T> Default for WaitRegistry<H, T> {
    fn default() -> Self {
        WaitRegistry {
            queues: HashMap::new(),
            by_name: HashMap::new(),
            by_handle: HashMap::new(),
            timeouts: BTreeSet::new(),
            next_id: 1,
            total: 0,
        }
    }
}

impl<H: Eq + Hash + Ord + Clone, T: Copy> WaitRegistry<H, T> {
    /// Appends a waiter to the queue of `slot`; returns its id.
    pub fn push(
        &mut self,
        slot: Slot,
        handle: H,
        owner: &[u8],
        mode: Mode,
        ttl_ms: i64,
        timeout_at: Option<i64>,
    ) -> u64 {
        self.push_ask(slot, handle, Ask::new(owner, mode, ttl_ms, timeout_at))
    }

    /// Appends a waiter that asks `ask` to the queue of `slot`; returns its
    /// id.
    pub fn push_ask(&mut self, slot: Slot, handle: H, ask: Ask<'_>) -> u64 {
        let w = self.waiter(handle, ask, None);
        let id = w.id;
        self.by_handle.insert(w.handle.clone(), (slot.clone(), id));
        self.enqueue(slot, w);
        id
    }

    /// Appends a `LEASE.MACQUIRE` waiter to the queue of every slot of
    /// `slots` (one id, one client); returns its id.
    pub fn push_multikey(&mut self, slots: Vec<Slot>, handle: H, ask: Ask<'_>) -> u64 {
        let keys: Arc<[Slot]> = slots.into();
        let ask = Ask {
            mode: Mode::Exclusive,
            floor: 0,
            ..ask
        };
        let w = self.waiter(handle, ask, Some(keys.clone()));
        let id = w.id;
        self.by_handle
            .insert(w.handle.clone(), (keys[0].clone(), id));
        for slot in keys.iter() {
            self.enqueue(slot.clone(), w.clone());
        }
        id
    }

    /// A new waiter, counted, with its timeout registered.
    fn waiter(&mut self, handle: H, ask: Ask<'_>, keys: Option<Arc<[Slot]>>) -> Waiter<H> {
        let id = self.next_id;
        self.next_id += 1;
        self.total += 1;
        if let Some(at) = ask.timeout_at {
            self.timeouts.insert((at, id, handle.clone()));
        }
        Waiter {
            id,
            handle,
            owner: ask.owner.into(),
            mode: ask.mode,
            ttl_ms: ask.ttl_ms,
            timeout_at: ask.timeout_at,
            floor: ask.floor,
            keys,
            label: ask.label.map(Into::into),
            client: ask.client,
            arrived_ms: ask.arrived_ms,
        }
    }

    /// The waiters of `slot`, oldest first, at most `count` (`LEASE.WAITERS`).
    /// O(count).
    pub fn list(&self, slot: &Slot, count: usize) -> Vec<&Waiter<H>> {
        self.queues
            .get(slot)
            .map_or_else(Vec::new, |q| q.waiters.values().take(count).collect())
    }

    /// Puts `w` at the end of the queue of `slot`.
    fn enqueue(&mut self, slot: Slot, w: Waiter<H>) {
        if !self.queues.contains_key(&slot) {
            self.by_name.entry(slot.1.clone()).or_default().push(slot.0);
        }
        let q = self.queues.entry(slot).or_insert_with(|| Queue {
            waiters: BTreeMap::new(),
            by_owner: HashMap::new(),
            timer: None,
        });
        q.by_owner.entry(w.owner.clone()).or_default().insert(w.id);
        q.waiters.insert(w.id, w);
    }

    /// Takes waiter `id` out of the queue of `slot` alone.
    fn unqueue(&mut self, slot: &Slot, id: u64) -> Option<Waiter<H>> {
        let q = self.queues.get_mut(slot)?;
        let w = q.waiters.remove(&id)?;
        if let Some(ids) = q.by_owner.get_mut(&w.owner) {
            ids.remove(&id);
            if ids.is_empty() {
                q.by_owner.remove(&w.owner);
            }
        }
        Some(w)
    }

    /// Takes waiter `id` out of the queue of `slot`, of every other queue
    /// it waits in, and of every index.
    fn take(&mut self, slot: &Slot, id: u64) -> Option<Waiter<H>> {
        let w = self.unqueue(slot, id)?;
        if let Some(keys) = &w.keys {
            for other in keys.iter().filter(|s| *s != slot) {
                self.unqueue(other, id);
            }
        }
        if let Some(at) = w.timeout_at {
            self.timeouts.remove(&(at, id, w.handle.clone()));
        }
        self.by_handle.remove(&w.handle);
        self.total -= 1;
        Some(w)
    }

    /// The oldest waiter of `slot` when it is a `LEASE.MACQUIRE` waiter
    /// that is also the oldest of every other key it waits for (so it may
    /// be served once all its keys are free): a copy, left queued.
    pub fn multikey_head(&self, slot: &Slot) -> Option<Waiter<H>> {
        let head = self.queues.get(slot)?.waiters.values().next()?;
        let keys = head.keys.as_ref()?;
        keys.iter()
            .all(|s| {
                self.queues
                    .get(s)
                    .and_then(|q| q.waiters.keys().next())
                    .is_some_and(|&id| id == head.id)
            })
            .then(|| head.clone())
    }

    /// The id of the oldest waiter of `slot`, when it is a `LEASE.MACQUIRE`
    /// waiter.
    pub fn head_multikey_id(&self, slot: &Slot) -> Option<u64> {
        self.queues
            .get(slot)
            .and_then(|q| q.waiters.values().next())
            .filter(|w| w.keys.is_some())
            .map(|w| w.id)
    }

    /// Takes the waiter `id` of `slot` (and of every queue it waits in),
    /// to answer it.
    pub fn take_id(&mut self, slot: &Slot, id: u64) -> Option<Waiter<H>> {
        self.take(slot, id)
    }

    /// Takes the oldest waiter of `slot`.
    pub fn pop_oldest(&mut self, slot: &Slot) -> Option<Waiter<H>> {
        let id = *self.queues.get(slot)?.waiters.keys().next()?;
        self.take(slot, id)
    }

    /// Serves the oldest waiter of `slot`, whose key is in state `held` at
    /// `now_ms`, as its acquire
    /// would be decided now with nobody ahead of it (`decide::acquire_mode`).
    /// `None` when nobody waits or the oldest must keep waiting: a later
    /// waiter is never served before it. The caller applies the step to the
    /// key and asks again, so an unbroken run of `SHARED` waiters, or
    /// `LIMIT` waiters while permits remain, is served together.
    pub fn grant_next(
        &mut self,
        slot: &Slot,
        held: Held,
        now_ms: i64,
        clock: &mut TokenClock,
    ) -> Option<Step<H>> {
        let q = self.queues.get(slot)?;
        let head = q.waiters.values().next()?;
        // A LEASE.MACQUIRE waiter is served with all its keys at once
        // (`multikey_head`); until then nobody behind it is.
        if head.keys.is_some() {
            return None;
        }
        let (head_id, mode, owner) = (head.id, head.mode, head.owner.clone());
        // The token of a grant is at least the FLOOR of every waiter it
        // answers (the oldest, and that owner's retries in the same mode).
        let floor = q.by_owner.get(&owner).map_or(0, |ids| {
            ids.iter()
                .filter_map(|id| q.waiters.get(id))
                .filter(|w| w.mode == mode && w.keys.is_none())
                .map(|w| w.floor)
                .max()
                .unwrap_or(0)
        });
        let token = match decide::acquire_mode(held, mode, &owner, false, now_ms) {
            Ok(Decision::Contended) => return None,
            Err(error) => {
                let waiter = self.take(slot, head_id)?;
                return Some(Step::Refused { waiter, error });
            }
            Ok(Decision::Reacquired { token: held }) => {
                let token = held.max(floor);
                if token > held {
                    clock.observe(token);
                }
                Err((token, token > held))
            }
            Ok(Decision::New) => match clock.issue_at_least(now_ms, floor) {
                Some(token) => Ok(token),
                None => {
                    let waiter = self.take(slot, head_id)?;
                    let error = LeaseError::TokensExhausted;
                    return Some(Step::Refused { waiter, error });
                }
            },
        };
        let (waiters, refused): (Vec<_>, Vec<_>) = self
            .take_owner(slot, &owner)
            .into_iter()
            .partition(|w| w.mode == mode);
        let refused = refused
            .into_iter()
            .map(|w| {
                let e = decide::conflict(mode, w.mode);
                (w, e)
            })
            .collect();
        let deadline_ms = now_ms + waiters.last().map_or(0, |w| w.ttl_ms);
        let label = waiters.iter().rev().find_map(|w| w.label.clone());
        Some(match token {
            Ok(token) => Step::Grant {
                mode,
                owner,
                token,
                deadline_ms,
                label,
                waiters,
                refused,
            },
            Err((token, raised)) => Step::Reacquired {
                owner,
                token,
                raised,
                deadline_ms,
                label,
                waiters,
                refused,
            },
        })
    }

    /// Takes every single-key waiter of `slot` that asked with `owner`,
    /// oldest first (retries of a client whose owner was just granted the
    /// lease). `LEASE.MACQUIRE` waiters of that owner stay: they wait for
    /// more than this key.
    pub fn take_owner(&mut self, slot: &Slot, owner: &[u8]) -> Vec<Waiter<H>> {
        let ids: Vec<u64> = self
            .queues
            .get(slot)
            .and_then(|q| {
                let ids = q.by_owner.get(owner)?;
                Some(
                    ids.iter()
                        .copied()
                        .filter(|id| q.waiters.get(id).is_some_and(|w| w.keys.is_none()))
                        .collect(),
                )
            })
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.take(slot, id))
            .collect()
    }

    /// Removes the waiter with `handle` wherever it waits (timeout,
    /// disconnect); returns it and its slot.
    pub fn remove(&mut self, handle: &H) -> Option<(Slot, Waiter<H>)> {
        let (slot, id) = self.by_handle.get(handle).cloned()?;
        let w = self.take(&slot, id)?;
        Some((slot, w))
    }

    /// Takes every waiter whose timeout is at or before `now_ms`, with its
    /// slot, earliest first.
    pub fn take_timed_out(&mut self, now_ms: i64) -> Vec<(Slot, Waiter<H>)> {
        let mut out = Vec::new();
        while let Some((at, _, handle)) = self.timeouts.first().cloned() {
            if at > now_ms {
                break;
            }
            match self.remove(&handle) {
                Some(x) => out.push(x),
                None => {
                    self.timeouts.pop_first();
                }
            }
        }
        out
    }

    /// The earliest `BLOCK` timeout of any waiter.
    pub fn next_timeout(&self) -> Option<i64> {
        self.timeouts.first().map(|(at, _, _)| *at)
    }

    /// Takes every waiter of `slot` (the key became unusable).
    pub fn drain(&mut self, slot: &Slot) -> Vec<Waiter<H>> {
        let ids: Vec<u64> = self
            .queues
            .get(slot)
            .map(|q| q.waiters.keys().copied().collect())
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.take(slot, id))
            .collect()
    }

    /// Waiters queued on `slot`.
    pub fn len(&self, slot: &Slot) -> usize {
        self.queues.get(slot).map_or(0, |q| q.waiters.len())
    }

    /// Waiters on every key.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Slots with a queue (waiting or with a timer), for a given key name.
    pub fn slots_named(&self, key: &[u8]) -> Vec<Slot> {
        self.by_name.get(key).map_or_else(Vec::new, |dbs| {
            dbs.iter().map(|&db| (db, key.to_vec())).collect()
        })
    }

    /// Every slot with a queue.
    pub fn slots(&self) -> Vec<Slot> {
        self.queues.keys().cloned().collect()
    }

    /// Replaces the timer of `slot`, returning the previous one.
    pub fn set_timer(&mut self, slot: &Slot, timer: Option<T>) -> Option<T> {
        let q = self.queues.get_mut(slot)?;
        std::mem::replace(&mut q.timer, timer)
    }

    /// Forgets `slot` if nobody waits there; returns its timer to stop.
    pub fn forget_if_empty(&mut self, slot: &Slot) -> Option<T> {
        if !self.queues.get(slot).is_some_and(|q| q.waiters.is_empty()) {
            return None;
        }
        if let Some(dbs) = self.by_name.get_mut(&slot.1) {
            dbs.retain(|&db| db != slot.0);
            if dbs.is_empty() {
                self.by_name.remove(&slot.1);
            }
        }
        self.queues.remove(slot).and_then(|q| q.timer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Holder, Holders, HoldersMode, Lease};

    const X: Mode = Mode::Exclusive;

    /// `LEASE.WAITERS`: oldest first, at most `count`, with what each asked
    /// for and how long it has waited and may still wait; never its owner.
    #[test]
    fn waiters_are_listed_oldest_first_with_what_they_asked() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        let now = 1_800_000_000_000;
        let ask = |owner: &'static [u8], mode, timeout_at, arrived_ms| Ask {
            client: 40 + owner.len() as u64,
            arrived_ms,
            label: Some(b"who".as_slice()),
            ..Ask::new(owner, mode, 100, timeout_at)
        };
        r.push_ask(
            slot("k"),
            1,
            ask(b"a", X, Some(now + 500 + BLOCK_MARGIN_MS), now - 30),
        );
        r.push_ask(slot("k"), 2, ask(b"bb", Mode::Shared, None, now - 20));
        r.push_ask(
            slot("k"),
            3,
            ask(b"ccc", Mode::Limit(4), Some(now - 1), now - 10),
        );
        r.push_multikey(vec![slot("k"), slot("j")], 4, ask(b"dddd", X, None, now));
        let shown: Vec<_> = r.list(&slot("k"), 10).iter().map(|w| w.view(now)).collect();
        let rows: Vec<_> = shown
            .iter()
            .map(|v| (v.client, v.mode, v.limit, v.keys, v.waited_ms, v.timeout_ms))
            .collect();
        assert_eq!(
            rows,
            [
                (41, "exclusive", 0, 1, 30, 500),
                (42, "shared", 0, 1, 20, -1),
                (43, "limit", 4, 1, 10, 0),
                (44, "keys", 0, 2, 0, -1),
            ]
        );
        assert!(shown.iter().all(|v| v.label == Some(b"who".as_slice())));
        assert_eq!(r.list(&slot("k"), 2).len(), 2);
        assert_eq!(r.list(&slot("j"), 10).len(), 1);
        assert!(r.list(&slot("none"), 10).is_empty());
    }

    #[test]
    fn a_waiter_listed_in_the_millisecond_it_arrived_shows_its_whole_block_and_no_more() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        let now = 1_800_000_000_000;
        r.push_ask(
            slot("k"),
            1,
            Ask {
                arrived_ms: now,
                ..Ask::new(b"a", X, 100, Some(now + 8000 + BLOCK_MARGIN_MS))
            },
        );
        let v = r.list(&slot("k"), 10)[0].view(now);
        assert_eq!((v.waited_ms, v.timeout_ms), (0, 8000));
        let v = r.list(&slot("k"), 10)[0].view(now + 8001);
        assert_eq!(v.timeout_ms, 0, "timed out any moment now");
    }

    fn slot(k: &str) -> Slot {
        (0, k.as_bytes().to_vec())
    }

    #[test]
    fn a_multi_key_waiter_keeps_its_place_on_every_key() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        let now = 1_800_000_000_000;
        r.push(slot("a"), 1, b"o1", X, 10, None);
        let m = r.push_multikey(
            vec![slot("a"), slot("b")],
            2,
            Ask::new(b"om", X, 10, Some(now + 50)),
        );
        r.push(slot("b"), 3, b"o3", X, 10, None);
        assert_eq!(r.total(), 3, "a client is one waiter");
        assert_eq!((r.len(&slot("a")), r.len(&slot("b"))), (2, 2));
        // b is free, but its oldest waiter waits for a too: nobody behind
        // it is served, and it is not the oldest on a yet.
        assert!(r.head_multikey_id(&slot("b")).is_some());
        assert_eq!(r.grant_next(&slot("b"), Held::Free, now, &mut clock), None);
        assert_eq!(r.multikey_head(&slot("b")), None);
        // a goes to its oldest waiter; then the multi-key waiter is the
        // oldest of both keys.
        assert!(matches!(
            r.grant_next(&slot("a"), Held::Free, now, &mut clock),
            Some(Step::Grant { .. })
        ));
        let head = r.multikey_head(&slot("b")).expect("oldest on a and b");
        assert_eq!((head.id, head.handle), (m, 2));
        assert_eq!(r.multikey_head(&slot("a")).map(|w| w.id), Some(m));
        let w = r.take_id(&slot("a"), m).unwrap();
        assert_eq!(w.slots(&slot("a")), vec![slot("a"), slot("b")]);
        assert_eq!((r.len(&slot("a")), r.len(&slot("b"))), (0, 1));
        assert_eq!(r.next_timeout(), None, "its timeout went with it");
        assert_eq!(r.total(), 1);
        // Removed by its handle (a disconnect), it leaves every queue.
        r.push_multikey(vec![slot("a"), slot("b")], 4, Ask::new(b"om", X, 10, None));
        let (s, w) = r.remove(&4).unwrap();
        assert_eq!(w.slots(&s).len(), 2);
        assert_eq!((r.len(&slot("a")), r.len(&slot("b"))), (0, 1));
        // A drain of one key takes it out of the other too.
        r.push_multikey(vec![slot("c"), slot("b")], 5, Ask::new(b"om", X, 10, None));
        assert_eq!(r.drain(&slot("c")).len(), 1);
        assert_eq!(r.len(&slot("b")), 1);
        // Same-owner retries of a single-key grant leave its multi-key
        // waiters queued.
        r.push_multikey(vec![slot("d"), slot("e")], 6, Ask::new(b"o7", X, 10, None));
        r.push(slot("d"), 7, b"o7", X, 10, None);
        assert_eq!(r.take_owner(&slot("d"), b"o7").len(), 1);
        assert_eq!(r.len(&slot("d")), 1);
    }

    #[test]
    fn first_come_first_served_per_key() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push(slot("a"), 1, b"o1", X, 10, None);
        r.push(slot("b"), 2, b"o2", X, 10, None);
        r.push(slot("a"), 3, b"o3", X, 10, None);
        assert_eq!(r.total(), 3);
        assert_eq!(r.len(&slot("a")), 2);
        assert_eq!(r.pop_oldest(&slot("a")).unwrap().handle, 1);
        assert_eq!(r.pop_oldest(&slot("a")).unwrap().handle, 3);
        assert_eq!(r.pop_oldest(&slot("a")), None);
        assert_eq!(r.total(), 1);
    }

    #[test]
    fn a_removed_waiter_never_comes_out() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push(slot("a"), 1, b"o1", X, 10, Some(50));
        r.push(slot("a"), 2, b"o2", X, 10, None);
        let (s, w) = r.remove(&1).unwrap();
        assert_eq!((s, w.handle), (slot("a"), 1));
        assert_eq!(r.remove(&1), None);
        assert_eq!(r.next_timeout(), None, "its timeout went with it");
        assert_eq!(r.pop_oldest(&slot("a")).unwrap().handle, 2);
        assert_eq!(r.total(), 0);
    }

    #[test]
    fn timeouts_come_out_in_order_and_only_when_due() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push(slot("a"), 1, b"o", X, 10, Some(300));
        r.push(slot("b"), 2, b"o", X, 10, Some(100));
        r.push(slot("a"), 3, b"o", X, 10, None);
        r.push(slot("c"), 4, b"o", X, 10, Some(100));
        assert_eq!(r.next_timeout(), Some(100));
        assert!(r.take_timed_out(99).is_empty());
        let due: Vec<u32> = r
            .take_timed_out(100)
            .into_iter()
            .map(|(_, w)| w.handle)
            .collect();
        assert_eq!(due, vec![2, 4]);
        assert_eq!(r.next_timeout(), Some(300));
        assert_eq!(r.pop_oldest(&slot("a")).unwrap().handle, 1);
        assert_eq!(
            r.next_timeout(),
            None,
            "a served waiter has no timeout left"
        );
        assert_eq!(r.total(), 1);
    }

    #[test]
    fn waiters_of_one_owner_are_taken_together() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push(slot("a"), 1, b"w", X, 10, None);
        r.push(slot("a"), 2, b"x", X, 10, None);
        r.push(slot("a"), 3, b"w", X, 20, Some(9));
        r.push(slot("b"), 4, b"w", X, 10, None);
        let same: Vec<u32> = r
            .take_owner(&slot("a"), b"w")
            .into_iter()
            .map(|w| w.handle)
            .collect();
        assert_eq!(same, vec![1, 3]);
        assert_eq!(r.len(&slot("a")), 1);
        assert_eq!(r.len(&slot("b")), 1);
        assert_eq!(r.next_timeout(), None);
        assert!(r.take_owner(&slot("a"), b"w").is_empty());
    }

    #[test]
    fn databases_are_separate_and_empty_queues_are_forgotten_with_their_timer() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push((0, b"k".to_vec()), 1, b"o", X, 10, None);
        r.push((1, b"k".to_vec()), 2, b"o", X, 10, None);
        assert_eq!(r.slots_named(b"k").len(), 2);
        assert_eq!(r.set_timer(&(0, b"k".to_vec()), Some(9)), None);
        assert_eq!(
            r.forget_if_empty(&(0, b"k".to_vec())),
            None,
            "still has a waiter"
        );
        assert_eq!(r.drain(&(0, b"k".to_vec())).len(), 1);
        assert_eq!(r.forget_if_empty(&(0, b"k".to_vec())), Some(9));
        assert_eq!(r.slots_named(b"k"), vec![(1, b"k".to_vec())]);
        assert_eq!(r.total(), 1);
        r.drain(&(1, b"k".to_vec()));
        r.forget_if_empty(&(1, b"k".to_vec()));
        assert!(r.slots_named(b"k").is_empty());
        assert!(r.slots().is_empty());
    }

    #[test]
    fn a_grant_goes_to_the_oldest_and_its_retries() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        let s = slot("a");
        assert!(r.grant_next(&s, Held::Free, 1000, &mut clock).is_none());
        r.push(s.clone(), 1, b"w", X, 100, None);
        r.push(s.clone(), 2, b"x", X, 100, None);
        r.push(s.clone(), 3, b"w", X, 300, None);
        let Some(Step::Grant {
            mode,
            owner,
            token,
            deadline_ms,
            waiters,
            refused,
            ..
        }) = r.grant_next(&s, Held::Free, 1000, &mut clock)
        else {
            panic!("a grant")
        };
        assert_eq!(mode, X);
        assert_eq!(
            waiters.iter().map(|w| w.handle).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert!(refused.is_empty());
        assert_eq!(owner.as_ref(), b"w");
        assert_eq!(token, clock.last());
        assert_eq!(deadline_ms, 1300, "the last retry's ttl");
        assert_eq!(r.len(&s), 1);
        let held = Lease::plain(&owner, token, deadline_ms);
        assert!(
            r.grant_next(&s, Held::Exclusive(&held), 1000, &mut clock)
                .is_none(),
            "held: the next waits"
        );
        clock.observe(crate::lease::limits::MAX_TOKEN);
        let Some(Step::Refused { waiter, error }) = r.grant_next(&s, Held::Free, 1000, &mut clock)
        else {
            panic!("refused")
        };
        assert_eq!(waiter.handle, 2, "the waiter to answer with the error");
        assert_eq!(error, LeaseError::TokensExhausted);
    }

    #[test]
    fn a_waiting_holder_is_answered_its_own_token() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        let s = slot("k");
        r.push(s.clone(), 1, b"a", Mode::Shared, 100, None);
        let m = Holders::with(
            HoldersMode::Shared,
            Holder {
                owner: b"a".as_slice().into(),
                token: 42,
                deadline_ms: 2000,
                since_ms: crate::lease::limits::since_of_token(42),
                label: None,
            },
        );
        let step = r.grant_next(&s, Held::Holders(&m), 1000, &mut clock);
        assert!(matches!(
            step,
            Some(Step::Reacquired {
                token: 42,
                deadline_ms: 1100,
                ..
            })
        ));
        assert_eq!(clock.last(), 0, "no token issued");
    }

    #[test]
    fn a_floor_raises_the_grant_and_a_waiting_holder_s_token() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        let mut clock = TokenClock::new();
        let s = slot("k");
        r.push_ask(
            s.clone(),
            1,
            Ask {
                floor: 5_000,
                ..Ask::new(b"w", X, 100, None)
            },
        );
        r.push_ask(
            s.clone(),
            2,
            Ask {
                floor: 9_000,
                ..Ask::new(b"w", X, 100, None)
            },
        );
        r.push(s.clone(), 3, b"x", X, 100, None);
        let Some(Step::Grant { token, waiters, .. }) = r.grant_next(&s, Held::Free, 1, &mut clock)
        else {
            panic!("a grant")
        };
        assert_eq!(token, 9_000, "the highest floor of the owner's calls");
        assert_eq!(waiters.len(), 2);
        assert_eq!(clock.last(), 9_000);
        // Owner x holds the key and waits again with a floor above its token.
        r.push_ask(
            s.clone(),
            4,
            Ask {
                floor: 20_000,
                ..Ask::new(b"x", X, 100, None)
            },
        );
        let held = Lease::plain(b"x", 10_000, 5_000);
        let step = r.grant_next(&s, Held::Exclusive(&held), 1000, &mut clock);
        assert!(matches!(
            step,
            Some(Step::Reacquired {
                token: 20_000,
                raised: true,
                ..
            })
        ));
        assert_eq!(clock.last(), 20_000);
    }

    #[test]
    fn ten_thousand_timeouts_at_once_are_cheap() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        for i in 0..10_000u32 {
            r.push(
                (0, format!("k{}", i % 100).into_bytes()),
                i,
                b"o",
                X,
                10,
                Some(5),
            );
        }
        assert_eq!(r.take_timed_out(5).len(), 10_000);
        assert_eq!(r.total(), 0);
    }
}
