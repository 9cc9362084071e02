//! The held-keys registry: a second acquire of a key this client still
//! holds fails at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::Error;

/// The leases a client (and its clones) took, by key, each with a way to
/// ask whether it is still held: a second acquire of a key still held
/// fails at once ([`Error::AlreadyHeld`]).
type StillHeld = Box<dyn Fn() -> bool + Send>;

#[derive(Default)]
struct HeldKeys {
    keys: HashMap<String, StillHeld>,
    /// The size after the last sweep: the map is swept of ended leases when
    /// it has doubled since, so each check costs O(1) on average.
    swept: usize,
}

#[derive(Clone, Default)]
pub(crate) struct Held(Arc<Mutex<HeldKeys>>);

impl Held {
    /// [`Error::AlreadyHeld`] when a lease on `key` is neither released
    /// nor lost.
    pub(crate) fn check(&self, key: &str) -> Result<(), Error> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match held.keys.get(key) {
            Some(still_held) if still_held() => Err(Error::AlreadyHeld(key.to_string())),
            Some(_) => {
                held.keys.remove(key);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A lease on `key`, held while `still_held` says so.
    pub(crate) fn insert(&self, key: &str, still_held: impl Fn() -> bool + Send + 'static) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.keys.insert(key.to_string(), Box::new(still_held));
        if held.keys.len() > 2 * held.swept.max(64) {
            held.keys.retain(|_, still_held| still_held());
            held.swept = held.keys.len();
        }
    }
}
