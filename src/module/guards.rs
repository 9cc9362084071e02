//! Guarded keys in the server (design.md S12): the guards standing, kept
//! as guard keys come and go (`LEASE.GUARD`, `LEASE.UNGUARD`, loads,
//! `COPY`, deletions, flushes, `SWAPDB`); the command filter's check of
//! every command while one stands; and the fence's mark that lets its own
//! command write its guard's keys. The decisions are `lease::guard`'s.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Relaxed};

use crate::lease::error::printable;
use crate::lease::fence::key_slot;
use crate::lease::guard::{Db, Guards, Verdict, hash_tag};
use crate::lease::keyspec::{Keys, Table};
use crate::lease::{LeaseError, RecordRef};

use super::counters::STATS;
use super::ffi::call;
use super::ffi::ctx::Str;
use super::ffi::server::{self, log_warning, mono_ms};

static GUARDS: Mutex<Option<Guards>> = Mutex::new(None);
/// How many guards stand, readable without the lock: the filter's first
/// test, and `INFO lease`'s `guards`.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// This server is a replica: what it writes comes from its master (or a
/// client of a writable replica, which its master will overwrite), and
/// nothing is refused.
static REPLICA: AtomicBool = AtomicBool::new(false);
/// Which arguments each command writes, read from the server's `COMMAND`
/// when the first guard comes (`None` until then).
static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// The guard whose `LEASE.FENCE` runs its command right now (database and
/// key): its keys may be written.
static FENCING: Mutex<Option<(i32, Vec<u8>)>> = Mutex::new(None);
/// A fence runs its command (`FENCING` is set), readable without the lock.
static FENCE_RUNS: AtomicBool = AtomicBool::new(false);

fn with<R>(f: impl FnOnce(&mut Guards) -> R) -> R {
    let mut guard = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    let g = guard.get_or_insert_with(Guards::default);
    let before = g.len();
    let out = f(g);
    let after = g.len();
    COUNT.store(after, Relaxed);
    drop(guard);
    if (before == 0) != (after == 0) {
        if after > 0 {
            load_table();
        }
        server::need_command_filter(server::FilterUser::Guards, after > 0);
    }
    out
}

/// Guards standing now.
pub fn count() -> usize {
    COUNT.load(Relaxed)
}

/// Does the filter check commands (guards stand, and this is no replica)?
#[inline]
pub fn checking() -> bool {
    count() > 0 && !REPLICA.load(Relaxed)
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
    with(|g| g.add(db, key));
}

/// `key` of `db` guards no more.
pub fn removed(db: i32, key: &[u8]) -> bool {
    if count() == 0 {
        return false;
    }
    with(|g| g.remove(db, key))
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
        with(|g| g.flush(db));
    }
}

pub fn swapped(a: i32, b: i32) {
    if count() > 0 {
        with(|g| g.swap(a, b));
    }
}

pub fn role_changed(now_master: bool) {
    REPLICA.store(!now_master, Relaxed);
}

pub fn set_replica(replica: bool) {
    REPLICA.store(replica, Relaxed);
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
    let before = FENCING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace((db, key.to_vec()));
    FENCE_RUNS.store(true, Relaxed);
    let out = f();
    FENCE_RUNS.store(before.is_some(), Relaxed);
    *FENCING.lock().unwrap_or_else(|e| e.into_inner()) = before;
    out
}

/// The filter's cheap test of one argument (after the command's name):
/// must the guards look at the command? Not for an argument without a
/// guarded hash tag, nor for a key of the guard whose fence runs the
/// command now (unless it is the guard key itself, or another database's
/// guard has its tag).
#[inline]
pub fn look_at(arg: &[u8]) -> bool {
    let Some(tag) = hash_tag(arg) else {
        return false;
    };
    let guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = guards.as_ref() else {
        return false;
    };
    if !FENCE_RUNS.load(Relaxed) {
        return g.tag_guarded(tag);
    }
    let fencing = FENCING.lock().unwrap_or_else(|e| e.into_inner());
    g.needs_check(arg, tag, fencing.as_ref().map(|(d, k)| (*d, k.as_slice())))
}

fn load_table() {
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    if table.as_ref().is_some_and(|t| !t.is_empty()) {
        return;
    }
    if let Some(reply) = server::detached().and_then(call::command_table) {
        *table = Some(Table::from_command_info(&reply));
    }
}

/// At most one refusal log line per this many milliseconds.
const REFUSAL_LOG_EVERY_MS: i64 = 10_000;

/// The filter's check of the command `args` (its name first), run in the
/// database `db` says: `Some((key, guard))` refuses it.
pub fn check(args: &[Str], db: &dyn Fn() -> Option<i32>) -> Option<(Vec<u8>, Vec<u8>)> {
    if !checking() {
        return None;
    }
    if args.is_empty() {
        return None;
    }
    let guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    let g = guards.as_ref()?;
    let argv: Vec<&[u8]> = args.iter().map(|a| a.bytes()).collect();
    let written = written(args, &argv);
    let db = db().map_or(Db::Any, Db::Known);
    let fencing = FENCING.lock().unwrap_or_else(|e| e.into_inner());
    match g.check(
        &argv,
        &written,
        db,
        fencing.as_ref().map(|(d, k)| (*d, k.as_slice())),
    ) {
        Verdict::Pass => None,
        // The slot import link of a Valkey atomic slot migration writes
        // what the source wrote (its snapshot, then its stream): the
        // source judged it. Nobody else writes a key of a slot this node
        // imports (the server redirects every other client).
        Verdict::Refuse { key, .. } if importing(key) => None,
        Verdict::Refuse { key, guard } => {
            refusing(argv[0], key);
            Some((key.to_vec(), guard.to_vec()))
        }
    }
}

/// The positions of the keys `argv` writes: by the server's key specs, or
/// its key function where they cannot say (a key whose flags it does not
/// give counts as written).
fn written(args: &[Str], argv: &[&[u8]]) -> Vec<usize> {
    let mut out = Vec::new();
    let asks = {
        let table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        match table.as_ref() {
            Some(t) => t.written(argv, |i| out.push(i)) == Keys::Ask,
            None => true,
        }
    };
    if asks {
        out.clear();
        let Some(ctx) = server::detached() else {
            return (1..argv.len()).collect();
        };
        for (at, flags) in call::command_keys(ctx, args) {
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
