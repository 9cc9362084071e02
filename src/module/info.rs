//! The `INFO lease` section and the eviction-policy warning (design.md S4, S5).
//! The policy is read at load and on every change of it (a config event),
//! never from the INFO callback: INFO runs no command.

use std::sync::Mutex;

use crate::lease::config::SETTINGS;

use super::counters::{self, STATS};
use super::ffi::ctx::Ctx;
use super::ffi::server::log_warning;
use super::{compat, grace, settings, tokens, waiters};

/// `maxmemory-policy`, read at load and on every CONFIG SET of it (never
/// from the INFO callback, so INFO runs no command).
static POLICY: Mutex<String> = Mutex::new(String::new());

fn set_maxmemory_policy(policy: String) {
    *POLICY.lock().unwrap_or_else(|e| e.into_inner()) = policy;
}

pub fn maxmemory_policy() -> String {
    POLICY.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// May the eviction policy remove lease keys under memory pressure?
/// Every policy but `noeviction` can (lease keys all have a TTL, so the
/// volatile-* policies pick them too).
fn policy_may_evict(policy: &str) -> bool {
    policy != "noeviction"
}

/// Reads `maxmemory-policy` from the server's INFO memory section (no
/// command is run, so nothing shows in SLOWLOG or commandstats).
pub fn refresh_policy(ctx: Ctx) {
    if let Some(p) = ctx.server_info(c"memory", c"maxmemory_policy") {
        set_maxmemory_policy(p);
    }
}

/// `maxmemory-policy` changed (CONFIG SET): warns when the new policy may
/// evict lease keys and the old one could not.
pub fn on_policy_change(ctx: Ctx) {
    let before = maxmemory_policy();
    refresh_policy(ctx);
    if before.is_empty() || policy_may_evict(&before) {
        return;
    }
    if let Some(warning) = eviction_warning() {
        log_warning(&warning);
    }
}

/// The warning to log when the policy may evict leases.
pub fn eviction_warning() -> Option<String> {
    let policy = maxmemory_policy();
    (!policy.is_empty() && policy_may_evict(&policy)).then(|| {
        format!(
            "WARNING maxmemory-policy is '{policy}': under maxmemory, lease keys may be evicted and a held lease lost. Use 'maxmemory-policy noeviction' for leases."
        )
    })
}

pub use super::ffi::entry::InfoField as Field;

/// The fields of `INFO lease`, in order.
pub fn fields() -> Vec<Field> {
    let mut out = vec![
        Field::Text("version", super::version::VERSION),
        Field::Text("git_commit", super::version::GIT_COMMIT),
        Field::Unsigned("effect_version", crate::lease::versions::EFFECTS as u64),
        Field::Unsigned("record_version", crate::lease::versions::RECORDS as u64),
        Field::Owned("incompatible_source", compat::info()),
    ];
    out.extend(
        STATS
            .fields()
            .into_iter()
            .map(|(name, value)| Field::Unsigned(name, value)),
    );
    // The distributions (design.md S11): `lease_<name>_<figure>`, after a
    // look for a `CONFIG RESETSTAT`.
    counters::notice_resetstat_now();
    for (name, dist) in counters::DISTRIBUTIONS.all() {
        for (figure, v) in dist.summary() {
            out.push(Field::Figure(name, figure, v));
        }
    }
    out.push(Field::Unsigned("waiters", waiters::total() as u64));
    out.push(Field::Unsigned("guards", super::guards::count() as u64));
    out.push(Field::Unsigned("last_token", tokens::last()));
    // Every setting, as `lease_<name>` with `_` for `-`.
    for (i, s) in SETTINGS.iter().enumerate() {
        out.push(Field::Setting(
            s.name,
            settings::get(crate::lease::config::Name::ALL[i]),
        ));
    }
    let remaining = grace::remaining_ms();
    out.push(Field::Signed("grace_length_ms", grace::length_ms()));
    out.push(Field::Signed("grace_remaining_ms", remaining));
    let period = grace::period().filter(|_| remaining > 0);
    out.push(Field::Text(
        "grace_reason",
        period.map_or("none", |p| p.reason.name()),
    ));
    // 1 while a period runs but does not count: this server cannot accept
    // writes (see grace.rs).
    out.push(Field::Signed(
        "grace_paused",
        period.is_some_and(|p| !p.is_counting()) as i64,
    ));
    // 1 when `lease.grace-ms` is 0 on a node with replicas or
    // `min-replicas-to-write`: failovers and restarts run no grace.
    out.push(Field::Signed(
        "grace_off",
        grace::off_in_replicated_setup() as i64,
    ));
    let policy = maxmemory_policy();
    if !policy.is_empty() {
        let may_evict = policy_may_evict(&policy) as i64;
        out.push(Field::Owned("maxmemory_policy", policy));
        out.push(Field::Signed("eviction_may_lose_leases", may_evict));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_noeviction_is_safe() {
        assert!(!super::policy_may_evict("noeviction"));
        for p in [
            "allkeys-lru",
            "volatile-lru",
            "volatile-ttl",
            "allkeys-random",
        ] {
            assert!(super::policy_may_evict(p));
        }
    }
}
