//! Waiters of `LEASE.ACQUIRE ... BLOCK`: one first-come-first-served queue
//! per key. Generic over the handle the server layer uses for a blocked
//! client, so the queue discipline is tested here without a server.

use std::collections::{HashMap, VecDeque};

/// A client waiting for a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter<H> {
    /// Unique per waiter, in arrival order.
    pub id: u64,
    /// The server's handle for the blocked client.
    pub handle: H,
    /// The owner id and ttl it asked for.
    pub owner: Box<[u8]>,
    pub ttl_ms: i64,
}

/// Where a queue lives: database index and key name.
pub type Slot = (i32, Vec<u8>);

/// All queues, with a timer id per queue (the timer that re-checks the key
/// at its lease's deadline).
#[derive(Debug)]
pub struct WaitRegistry<H, T> {
    queues: HashMap<Slot, Queue<H, T>>,
    next_id: u64,
    total: usize,
}

#[derive(Debug)]
struct Queue<H, T> {
    waiters: VecDeque<Waiter<H>>,
    timer: Option<T>,
}

impl<H, T> Default for WaitRegistry<H, T> {
    fn default() -> Self {
        WaitRegistry {
            queues: HashMap::new(),
            next_id: 1,
            total: 0,
        }
    }
}

impl<H: PartialEq, T: Copy> WaitRegistry<H, T> {
    /// Appends a waiter to the queue of `slot`; returns its id.
    pub fn push(&mut self, slot: Slot, handle: H, owner: &[u8], ttl_ms: i64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.total += 1;
        self.queues
            .entry(slot)
            .or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                timer: None,
            })
            .waiters
            .push_back(Waiter {
                id,
                handle,
                owner: owner.into(),
                ttl_ms,
            });
        id
    }

    /// Takes the oldest waiter of `slot`.
    pub fn pop_oldest(&mut self, slot: &Slot) -> Option<Waiter<H>> {
        let q = self.queues.get_mut(slot)?;
        let w = q.waiters.pop_front();
        if w.is_some() {
            self.total -= 1;
        }
        w
    }

    /// Removes the waiter with `handle` wherever it waits (timeout,
    /// disconnect); returns it and its slot.
    pub fn remove(&mut self, handle: &H) -> Option<(Slot, Waiter<H>)> {
        let (slot, pos) = self.queues.iter().find_map(|(slot, q)| {
            q.waiters
                .iter()
                .position(|w| w.handle == *handle)
                .map(|p| (slot.clone(), p))
        })?;
        let w = self.queues.get_mut(&slot)?.waiters.remove(pos)?;
        self.total -= 1;
        Some((slot, w))
    }

    /// Takes every waiter of `slot` (the key became unusable).
    pub fn drain(&mut self, slot: &Slot) -> Vec<Waiter<H>> {
        let Some(q) = self.queues.get_mut(slot) else {
            return Vec::new();
        };
        let all: Vec<_> = q.waiters.drain(..).collect();
        self.total -= all.len();
        all
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
        self.queues
            .keys()
            .filter(|(_, k)| k == key)
            .cloned()
            .collect()
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
        if self.queues.get(slot).is_some_and(|q| q.waiters.is_empty()) {
            return self.queues.remove(slot).and_then(|q| q.timer);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(k: &str) -> Slot {
        (0, k.as_bytes().to_vec())
    }

    #[test]
    fn first_come_first_served_per_key() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push(slot("a"), 1, b"o1", 10);
        r.push(slot("b"), 2, b"o2", 10);
        r.push(slot("a"), 3, b"o3", 10);
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
        r.push(slot("a"), 1, b"o1", 10);
        r.push(slot("a"), 2, b"o2", 10);
        let (s, w) = r.remove(&1).unwrap();
        assert_eq!((s, w.handle), (slot("a"), 1));
        assert_eq!(r.remove(&1), None);
        assert_eq!(r.pop_oldest(&slot("a")).unwrap().handle, 2);
        assert_eq!(r.total(), 0);
    }

    #[test]
    fn databases_are_separate_and_empty_queues_are_forgotten_with_their_timer() {
        let mut r: WaitRegistry<u32, u64> = WaitRegistry::default();
        r.push((0, b"k".to_vec()), 1, b"o", 10);
        r.push((1, b"k".to_vec()), 2, b"o", 10);
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
    }
}
