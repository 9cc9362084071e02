//! Guarded keys in the server (design.md S12): the guards standing, kept
//! as guard keys come and go (`LEASE.GUARD`, `LEASE.UNGUARD`, loads,
//! `COPY`, deletions, flushes, `SWAPDB`); the command filter's check of
//! every command while one stands, in the order of its steps (`filter`);
//! and the fence's mark that lets its own command write its guard's keys.
//! The decisions are `lease::guard`'s; which keys a command writes,
//! `lease::keyspec`'s.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::lease::error::printable;
use crate::lease::fence::key_slot;
use crate::lease::guard::{Db, Guards, Verdict, hash_tag, is_checked};
use crate::lease::keyspec::{KeyPlaces, Keys};
use crate::lease::{LeaseError, RecordRef};

use super::counters::STATS;
use super::ffi::call;
use super::ffi::filter::{FilterCommand, Need};
use super::ffi::server::{self, log_warning, mono_ms};

static GUARDS: Mutex<Option<Guards>> = Mutex::new(None);
/// How many guards stand, readable without the lock: the filter's first
/// test, and `INFO lease`'s `guards`.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// This server is a replica: what it writes comes from its master (or a
/// client of a writable replica, which its master will overwrite), and
/// nothing is refused.
static REPLICA: AtomicBool = AtomicBool::new(false);
/// How many guards' tags fall in each bucket (`bucket`, a cheap hash of
/// the tag), up to 255 (a bucket that reached 255 stays there until the
/// next recount: it may hold a guard): the cheap test reads it without the
/// lock, and takes the lock only for a tag whose bucket holds a guard (one
/// tag in 26 with 10,000 guards). Made with the first guard (256 KiB).
static BUCKETS: OnceLock<Box<[AtomicU8]>> = OnceLock::new();
const BUCKET_BITS: u32 = 18;
const FULL: u8 = u8::MAX;

/// The bucket of `tag`: its first and last eight bytes (or all of a
/// shorter one) and its length, mixed by a multiplication.
#[inline(always)]
fn bucket(tag: &[u8]) -> usize {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let (a, b) = match (tag.first_chunk::<8>(), tag.last_chunk::<8>()) {
        (Some(a), Some(b)) => (u64::from_le_bytes(*a), u64::from_le_bytes(*b)),
        _ => (tag.iter().fold(0u64, |x, &c| (x << 8) | c as u64), 0),
    };
    let h = (a ^ tag.len() as u64).wrapping_mul(K) ^ b.rotate_left(29).wrapping_mul(K);
    (h >> (64 - BUCKET_BITS)) as usize
}

fn buckets() -> &'static [AtomicU8] {
    BUCKETS.get_or_init(|| (0..1 << BUCKET_BITS).map(|_| AtomicU8::new(0)).collect())
}

/// A guard of `tag` came (`on`) or went (a full bucket stays full).
fn count_in_bucket(tag: &[u8], on: bool) {
    let b = &buckets()[bucket(tag)];
    let _ = b.fetch_update(Relaxed, Relaxed, |n| match (n, on) {
        (FULL, _) => None,
        (n, true) => Some(n + 1),
        (n, false) => Some(n.saturating_sub(1)),
    });
}

/// The buckets counted again (after a flush).
fn recount_buckets(g: &Guards) {
    let buckets = buckets();
    for b in buckets {
        b.store(0, Relaxed);
    }
    for (_, key) in g.keys() {
        if let Some(tag) = hash_tag(key) {
            count_in_bucket(tag, true);
        }
    }
}

/// May a guard stand on `tag` (in any database)? `false` is sure.
#[inline(always)]
fn maybe_guarded(tag: &[u8]) -> bool {
    BUCKETS
        .get()
        .is_some_and(|b| b[bucket(tag)].load(Relaxed) != 0)
}

/// The guards' need of the command filter (on while a guard stands).
static FILTER_NEED: Need = Need::new();
/// The guard whose `LEASE.FENCE` runs its command right now (database and
/// key), while `FENCE_RUNS`: its keys may be written. The buffer stays
/// from one fence to the next (no allocation per fence).
static FENCING: Mutex<(i32, Vec<u8>)> = Mutex::new((0, Vec::new()));
/// A fence runs its command (`FENCING` holds its guard), readable without
/// the lock.
static FENCE_RUNS: AtomicBool = AtomicBool::new(false);

/// The guard whose fence runs the command now, if any (with `FENCING`
/// locked).
fn fence_of(fencing: &(i32, Vec<u8>)) -> Option<(i32, &[u8])> {
    FENCE_RUNS
        .load(Relaxed)
        .then_some((fencing.0, fencing.1.as_slice()))
}

fn with<R>(f: impl FnOnce(&mut Guards) -> R) -> R {
    let mut guard = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    let g = guard.get_or_insert_with(Guards::default);
    let before = g.len();
    let out = f(g);
    let after = g.len();
    COUNT.store(after, Relaxed);
    set_checking();
    drop(guard);
    if (before == 0) != (after == 0) {
        // The command table is read with the first guard: the filter never
        // calls into the server to read it.
        if after > 0
            && let Some(ctx) = server::detached()
        {
            call::load_command_table(ctx);
        }
        FILTER_NEED.set(after > 0);
    }
    if after > 0 && PLACES.get().is_none() {
        call::with_command_table(|table| {
            if let Some(t) = table.filter(|t| !t.is_empty()) {
                let _ = PLACES.set(t.key_places(|name| is_checked(name, in_cluster())));
            }
        });
    }
    out
}

/// Where each command's written keys can be (`keyspec::Places`), made
/// from the command table once it is read (with the first guard): the
/// cheap test reads only those arguments. Until then, and for a command
/// the table did not hold then, every argument.
static PLACES: OnceLock<KeyPlaces> = OnceLock::new();

/// Guards standing now.
pub fn count() -> usize {
    COUNT.load(Relaxed)
}

/// Does the filter check commands (guards stand, and this is no replica)?
#[inline]
pub fn checking() -> bool {
    CHECKING.load(Relaxed)
}

/// `checking()`, kept as the count and the role change.
static CHECKING: AtomicBool = AtomicBool::new(false);

fn set_checking() {
    CHECKING.store(count() > 0 && !REPLICA.load(Relaxed), Relaxed);
}

/// The guard of `key`'s hash tag in `db`, if any.
pub fn guard_of(db: i32, key: &[u8]) -> Option<Vec<u8>> {
    let tag = hash_tag(key)?;
    if count() == 0 {
        return None;
    }
    with(|g| g.guard_of(db, tag).map(<[u8]>::to_vec))
}

/// `key` of `db` guards its tag from now on.
pub fn added(db: i32, key: &[u8]) {
    with(|g| {
        if g.add(db, key)
            && let Some(tag) = hash_tag(key)
        {
            count_in_bucket(tag, true);
        }
    });
}

/// `key` of `db` guards no more.
pub fn removed(db: i32, key: &[u8]) -> bool {
    if count() == 0 {
        return false;
    }
    with(|g| {
        let was = g.remove(db, key);
        if was && let Some(tag) = hash_tag(key) {
            count_in_bucket(tag, false);
        }
        was
    })
}

/// A key holding `record` left database `db`: a guard key ends its guard
/// (counted unless the module removed it: `LEASE.UNGUARD` of a free
/// guard).
pub fn unlinked(db: i32, key: &[u8], record: RecordRef<'_>, quiet: bool) {
    if let RecordRef::Exclusive(l) = record
        && l.is_guard()
        && !replaced_by_restore(db, key)
        && removed(db, key)
        && !quiet
    {
        STATS.guard_deleted.incr();
    }
}

/// A guard record restored over the guard key of the same name (`RESTORE
/// ... REPLACE`, a resharding's `RESTORE-ASKING ... REPLACE`): the server
/// loads the new value, then unlinks the old, whose guard goes on in the
/// new one. Set by the load, taken by that unlink or by the restore's
/// alignment right after the command.
static REPLACING: Mutex<Option<(i32, Vec<u8>)>> = Mutex::new(None);

/// Is this unlink of a guard key the old value of a restore over it?
fn replaced_by_restore(db: i32, key: &[u8]) -> bool {
    let mut replacing = REPLACING.lock().unwrap_or_else(|e| e.into_inner());
    if replacing
        .as_ref()
        .is_some_and(|(d, k)| *d == db && k == key)
    {
        *replacing = None;
        return true;
    }
    false
}

/// The restore of `key` of `db` is over (its alignment timer fired): a
/// guard record there guards, whatever became of the old value.
pub fn restore_done(db: i32, key: &[u8], guards_now: bool) {
    REPLACING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take_if(|(d, k)| *d == db && k == key);
    if guards_now {
        if guard_of(db, key).as_deref() != Some(key) {
            added(db, key);
        }
    } else {
        removed(db, key);
    }
}

/// A guard record arrived under `key` of `db` (a load, `RESTORE`,
/// `MIGRATE`, `COPY`): it guards from now on. `false` refuses it where it
/// could not guard: a name without a hash tag, or a tag another key guards
/// already (a `RESTORE` or `COPY`; a load takes the keys it is given).
pub fn arrived(db: i32, key: &[u8], record: RecordRef<'_>, loading: bool) -> bool {
    let RecordRef::Exclusive(l) = record else {
        return true;
    };
    if !l.is_guard() {
        return true;
    }
    if loading {
        after_load_once();
    }
    if !loading && hash_tag(key).is_none() {
        log_warning(&format!(
            "refusing a guard record for '{}': its name has no hash tag to guard",
            printable(key)
        ));
        return false;
    }
    if !loading && let Some(other) = guard_of(db, key) {
        if other != key {
            log_warning(&format!(
                "refusing a guard record for '{}': its hash tag is guarded by '{}' already",
                printable(key),
                printable(&other)
            ));
            return false;
        }
        // Restored over itself: the unlink of the old value that follows
        // leaves the guard standing.
        *REPLACING.lock().unwrap_or_else(|e| e.into_inner()) = Some((db, key.to_vec()));
        return true;
    }
    added(db, key);
    true
}

/// Every guard standing: (database, key).
pub fn keys() -> Vec<(i32, Vec<u8>)> {
    if count() == 0 {
        return Vec::new();
    }
    with(|g| g.keys().map(|(d, k)| (d, k.to_vec())).collect())
}

/// A load read guard records, and the look after it is pending.
static LOAD_LOOK_PENDING: AtomicBool = AtomicBool::new(false);

/// A guard record was loaded: once the load is over (a timer does not fire
/// while the server loads), the guards whose key the server did not keep go
/// (`datatype::after_load`). One timer per load.
fn after_load_once() {
    if !LOAD_LOOK_PENDING.swap(true, Relaxed) {
        super::timers::start(0, super::timers::TimerJob::GuardsLoaded);
    }
}

/// The look after a load is under way: the next load starts another.
pub fn load_looked_at() {
    LOAD_LOOK_PENDING.store(false, Relaxed);
}

pub fn flushed(db: Option<i32>) {
    if count() > 0 {
        with(|g| {
            g.flush(db);
            recount_buckets(g);
        });
    }
}

pub fn swapped(a: i32, b: i32) {
    if count() > 0 {
        with(|g| g.swap(a, b));
    }
}

pub fn role_changed(now_master: bool) {
    set_replica(!now_master);
}

pub fn set_replica(replica: bool) {
    REPLICA.store(replica, Relaxed);
    set_checking();
}

/// This server runs in cluster mode (set at load: it cannot change).
static CLUSTER: AtomicBool = AtomicBool::new(false);

pub fn set_cluster(cluster: bool) {
    CLUSTER.store(cluster, Relaxed);
}

#[inline]
pub fn in_cluster() -> bool {
    CLUSTER.load(Relaxed)
}

/// The slot ranges (inclusive) this node imports by Valkey's atomic slot
/// migration now, one entry per migration: between the import's start and
/// its end (completed or aborted).
static IMPORTING: Mutex<Vec<(u16, u16)>> = Mutex::new(Vec::new());

/// An atomic slot migration into this node started (`started`) or ended.
pub fn importing_slots(slots: &[(u16, u16)], started: bool) {
    let mut importing = IMPORTING.lock().unwrap_or_else(|e| e.into_inner());
    for range in slots {
        if started {
            importing.push(*range);
        } else if let Some(at) = importing.iter().position(|r| r == range) {
            importing.swap_remove(at);
        }
    }
}

/// Is `key` of a slot this node imports now?
fn importing(key: &[u8]) -> bool {
    let importing = IMPORTING.lock().unwrap_or_else(|e| e.into_inner());
    if importing.is_empty() {
        return false;
    }
    let slot = key_slot(key);
    importing.iter().any(|(a, b)| (*a..=*b).contains(&slot))
}

/// Runs `f` (a `LEASE.FENCE`'s command) as the fence of the lease key
/// `key` of `db`: the guards let it write the keys `key` guards.
pub fn fencing<R>(db: i32, key: &[u8], f: impl FnOnce() -> R) -> R {
    if count() == 0 {
        return f();
    }
    let was = FENCE_RUNS.load(Relaxed);
    let before = {
        let mut fencing = FENCING.lock().unwrap_or_else(|e| e.into_inner());
        // A fence inside a fence (a script's, another module's): the
        // outer one's guard comes back after.
        let before = was.then(|| (fencing.0, std::mem::take(&mut fencing.1)));
        fencing.0 = db;
        fencing.1.clear();
        fencing.1.extend_from_slice(key);
        before
    };
    FENCE_RUNS.store(true, Relaxed);
    let out = f();
    if let Some(before) = before {
        *FENCING.lock().unwrap_or_else(|e| e.into_inner()) = before;
    }
    FENCE_RUNS.store(was, Relaxed);
    out
}

/// The guards' part of the command filter, for every command the server
/// is about to run while a guard stands, step by step, the cheapest first:
///
/// 1. the cheap test: an argument where the command's key specs put a
///    key it may write (`looks_at`) with a guarded hash tag (the guards'
///    lock is taken only for a tag whose bucket holds a guard; a key of
///    the guard whose fence runs the command now passes);
/// 2. the name test: a command checked by its keys (`guard::is_checked`:
///    not the lease commands, scripts, `MIGRATE`);
/// 3. the full check: the keys it writes (the command table, or the
///    server's key function where the specs cannot say) against the
///    guards of the client's database;
/// 4. the ACL check: a command its client's user may not run is left to
///    the server's NOPERM, as without a guard (only for a command about to
///    be refused: it decides between two refusals);
/// 5. the rewrite into `LEASE.FENCED key guard`, which answers the
///    refusal once the server has judged it as it would the command
///    (authentication, a transaction's queue).
#[inline]
pub fn filter(command: &mut FilterCommand) {
    if checking() && command.len() >= 2 && looks_at(command) {
        judge(command);
    }
}

/// Steps 2 to 5 of `filter`, for a command the cheap test let through.
#[inline(never)]
fn judge(command: &mut FilterCommand) {
    if !command
        .arg(0)
        .is_some_and(|name| is_checked(name, in_cluster()))
    {
        return;
    }
    let Some((key, guard)) = check(command) else {
        return;
    };
    if !command.client_may_run() {
        return;
    }
    if let Some(name) = command.arg(0) {
        refusing(name, &key);
    }
    // Three arguments, whatever the command had: an argument vector grown
    // by more than one crashed Valkey 9.1's scripts (redis.pcall of a
    // two-argument write made into four).
    command.replace(&[b"LEASE.FENCED", &key, &guard]);
}

/// The cheap test (step 1 of `filter`): must the guards look at the
/// command? Only its arguments where a key it writes can be are read
/// (`Places`, by its name and argument count: none for a command that
/// writes no key or that the guards never check, every argument for one
/// whose keys move or that the command table did not hold). Not when
/// none of those has a hash tag whose bucket holds a guard (both read
/// without a lock), nor when none of those is guarded, or each is a key of
/// the guard whose fence runs the command now (unless it is the guard key
/// itself, or another database's guard has its tag). An argument the
/// server does not give: yes.
#[inline(always)]
fn looks_at(command: &FilterCommand) -> bool {
    let argc = command.len();
    // One argument after the name: reading it costs what the name's
    // places would.
    if argc <= 2 {
        return argc == 2 && looks_at_arg(command, 1);
    }
    let (Some(places), Some(name)) = (PLACES.get(), command.arg(0)) else {
        return (1..argc).any(|i| looks_at_arg(command, i));
    };
    places.any(name, argc, |i| looks_at_arg(command, i))
}

/// Must the guards look at the command for its argument `i`: one with a
/// hash tag whose bucket holds a guard, a guarded one, or one the server
/// does not give?
#[inline(always)]
fn looks_at_arg(command: &FilterCommand, i: usize) -> bool {
    let Some(arg) = command.arg(i) else {
        return true;
    };
    hash_tag(arg).is_some_and(|tag| maybe_guarded(tag) && tag_needs_check(arg, tag))
}

/// Must the command be checked for its argument `arg` of tag `tag`, a tag
/// that may be guarded (under the guards' lock)?
#[inline(never)]
fn tag_needs_check(arg: &[u8], tag: &[u8]) -> bool {
    let guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = guards.as_ref() else {
        return false;
    };
    if !FENCE_RUNS.load(Relaxed) {
        return g.tag_guarded(tag);
    }
    let fencing = FENCING.lock().unwrap_or_else(|e| e.into_inner());
    g.needs_check(arg, tag, fence_of(&fencing))
}

/// The full check (step 3 of `filter`): `Some((key, guard))` refuses the
/// command.
fn check(command: &FilterCommand) -> Option<(Vec<u8>, Vec<u8>)> {
    let argv: Vec<&[u8]> = (0..command.len())
        .map(|i| command.arg(i))
        .collect::<Option<_>>()?;
    let written = written(command, &argv);
    let db = command.client_db().map_or(Db::Any, Db::Known);
    let guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    let g = guards.as_ref()?;
    let fencing = FENCING.lock().unwrap_or_else(|e| e.into_inner());
    match g.check(&argv, &written, db, fence_of(&fencing)) {
        Verdict::Pass => None,
        // The slot import link of a Valkey atomic slot migration writes
        // what the source wrote (its snapshot, then its stream): the
        // source judged it. Nobody else writes a key of a slot this node
        // imports (the server redirects every other client).
        Verdict::Refuse { key, .. } if importing(key) => None,
        Verdict::Refuse { key, guard } => Some((key.to_vec(), guard.to_vec())),
    }
}

/// At most one refusal log line per this many milliseconds.
const REFUSAL_LOG_EVERY_MS: i64 = 10_000;

/// The positions of the keys `argv` (the arguments of `command`) writes:
/// by the server's key specs, or its key function where they cannot say
/// (a key whose flags it does not give counts as written).
fn written(command: &FilterCommand, argv: &[&[u8]]) -> Vec<usize> {
    let mut out = Vec::new();
    let asks = call::with_command_table(|table| {
        table.is_none_or(|t| t.written(argv, |i| out.push(i)) == Keys::Ask)
    });
    if asks {
        out.clear();
        let (Some(ctx), Some(args)) = (server::detached(), command.strs()) else {
            return (1..argv.len()).collect();
        };
        for (at, flags) in call::command_keys(ctx, &args) {
            if flags & call::KEY_READ_ONLY == 0 || flags & call::KEY_WRITES != 0 {
                out.push(at);
            }
        }
    }
    out
}

fn log_refusal(command: &[u8], key: &[u8], guard: &[u8]) {
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let now = mono_ms();
    if now.saturating_sub(LAST.load(Relaxed)) < REFUSAL_LOG_EVERY_MS {
        return;
    }
    LAST.store(now, Relaxed);
    log_warning(&format!(
        "refused '{}' writing '{}': its hash tag is guarded by '{}' (write it through LEASE.FENCE); {} writes refused since the start (lease_guard_refused)",
        printable(command),
        printable(key),
        printable(guard),
        STATS.guard_refused.get()
    ));
}

/// The command the filter last turned into `LEASE.FENCED`, and the key it
/// was refused for: the log line names it.
static REFUSING: Mutex<Option<(Vec<u8>, Vec<u8>)>> = Mutex::new(None);

/// The filter turns `command` into `LEASE.FENCED` for a write to `key`.
fn refusing(command: &[u8], key: &[u8]) {
    *REFUSING.lock().unwrap_or_else(|e| e.into_inner()) = Some((command.to_vec(), key.to_vec()));
}

/// `LEASE.FENCED key guard`: the refusal of a write the server would have
/// run (its client authenticated, its user allowed it), counted and logged.
pub fn refused(key: &[u8], guard: &[u8]) -> LeaseError {
    STATS.guard_refused.incr();
    let command = REFUSING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .filter(|(_, k)| k == key)
        .map_or_else(|| b"a write".to_vec(), |(c, _)| c);
    log_refusal(&command, key, guard);
    LeaseError::Fenced {
        key: printable(key),
        guard: printable(guard),
    }
}
