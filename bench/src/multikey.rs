//! H: the cost of multi-key leases (bench/multikey.sh). For k = 2, 10 and 100
//! keys, one client does full cycles, one after the other: take every key,
//! then give every key back. Three ways ([`Kind`]):
//!
//! - `LEASE.MACQUIRE k keys owner ttl`, then `LEASE.MRELEASE k keys owner`:
//!   all or nothing, one token, two round trips;
//! - k `LEASE.ACQUIRE` pipelined in one round trip, then k `LEASE.RELEASE`
//!   pipelined: two round trips too, but not all or nothing (a key taken
//!   by another leaves the caller holding part of its keys): the speed
//!   baseline, not an equivalent;
//! - a Redisson-style MultiLock ([`Kind::MultiLock`]: the recipe is
//!   written out there): one Lua script per key and per round trip, 2k
//!   round trips.
//!
//! MULTIKEY_REPS interleaved runs of every (k, kind), each MULTIKEY_WARM_MS of
//! warm-up and MULTIKEY_MS counted; the table shows medians of cycles per
//! second, of the acquire latency (p50, p99), of the server's CPU per cycle
//! (`INFO cpu`) and of its command time per cycle (`INFO commandstats`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::knobs::Knobs;
use crate::resp::{Conn, Res};
use crate::scripts::{REDISSON_LOCK, REDISSON_UNLOCK};
use crate::server::{info_cpu_ms, load_script};
use crate::stats::{median, percentile};

/// The numbers of keys of a cycle.
const KS: [usize; 3] = [2, 10, 100];
/// The lease time of every lock, ms.
const TTL_MS: &str = "30000";
/// The owner of every lock: shaped like Redisson's lock name
/// (`<client uuid>:<thread id>`), used by all three kinds alike.
const OWNER: &str = "8f14e45f-ceea-467f-a0e6-7c3b2f1d9a11:1";
/// RedissonLock's unlock message (LockPubSub.UNLOCK_MESSAGE).
const UNLOCK_MESSAGE: &str = "0";

/// One way of taking k keys and giving them back.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// LEASE.MACQUIRE, then LEASE.MRELEASE.
    MAcquire,
    /// k LEASE.ACQUIRE in one pipeline, then k LEASE.RELEASE in one.
    Singles,
    /// Redisson's RedissonMultiLock over k RedissonLocks, as its code does
    /// it (RedissonMultiLock.tryLock with a lease time and no wait, then
    /// unlock()), with the scripts of RedissonLock (crate::scripts):
    ///
    /// 1. Acquire: the locks one by one, in order. Each is one `EVALSHA` of
    ///    RedissonLock's lock script, `KEYS = [lock]`, `ARGV = [ttl, lock
    ///    name]`, and Redisson waits for its reply before it sends the next
    ///    (its tryLock loop calls `lock.tryLock(...)`, which blocks): one
    ///    round trip per key. nil is taken; a number (the holder's PTTL)
    ///    is a failure: the locks taken so far are unlocked, one after the
    ///    other (unlockInner), and the whole acquire fails (with no wait
    ///    time it does not retry).
    /// 2. Release: unlock() calls `unlock()` on each lock in order
    ///    (`locks.forEach(Lock::unlock)`), each one `EVALSHA` of
    ///    RedissonLock's unlock script, `KEYS = [lock, channel]`, `ARGV =
    ///    [0, ttl, lock name]` (HEXISTS, HINCRBY -1, then DEL and PUBLISH
    ///    of the unlock message on `redisson_lock__channel:{lock}`), and
    ///    waits for it: one round trip per key again.
    ///
    /// The scripts are loaded once with SCRIPT LOAD and sent with EVALSHA,
    /// as Redisson does with its script cache. This is the cheaper side of
    /// Redisson: with a lease time, its tryLock then resets every lock's
    /// expiry (`expireAsync`, one call per lock, each waited for: k more
    /// round trips), and Redisson 3.2x's unlock script also reads and
    /// writes an unlock-latch key (GET, SET PX) that a later DEL removes;
    /// neither is done here. No replicas, so none of Redisson's WAIT
    /// calls.
    MultiLock,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::MAcquire, Kind::Singles, Kind::MultiLock];

    fn name(self) -> &'static str {
        match self {
            Kind::MAcquire => "`LEASE.MACQUIRE`, then `LEASE.MRELEASE` (all or nothing, one token)",
            Kind::Singles => {
                "k `LEASE.ACQUIRE` pipelined, then k `LEASE.RELEASE` pipelined (not all or nothing)"
            }
            Kind::MultiLock => {
                "Redisson-style MultiLock: k lock scripts one after the other, then k unlock scripts"
            }
        }
    }

    /// Round trips of one cycle on k keys.
    fn round_trips(self, k: usize) -> usize {
        match self {
            Kind::MAcquire | Kind::Singles => 2,
            Kind::MultiLock => 2 * k,
        }
    }

    /// The commands the client sends, as INFO commandstats names them.
    fn commands(self) -> &'static [&'static str] {
        match self {
            Kind::MAcquire => &["lease.macquire", "lease.mrelease"],
            Kind::Singles => &["lease.acquire", "lease.release"],
            Kind::MultiLock => &["evalsha"],
        }
    }

    /// Each kind has keys of its own.
    fn key_prefix(self) -> &'static str {
        match self {
            Kind::MAcquire => "mk:m:",
            Kind::Singles => "mk:s:",
            Kind::MultiLock => "mk:r:",
        }
    }
}

/// The names one kind's cycle uses on k keys.
struct Names {
    k: String,
    keys: Vec<String>,
    /// Redisson's channel of each lock (RedissonLock.getChannelName).
    channels: Vec<String>,
}

impl Names {
    fn of(kind: Kind, k: usize) -> Names {
        let keys: Vec<String> = (0..k)
            .map(|i| format!("{}{i}", kind.key_prefix()))
            .collect();
        let channels = keys
            .iter()
            .map(|key| format!("redisson_lock__channel:{{{key}}}"))
            .collect();
        Names {
            k: k.to_string(),
            keys,
            channels,
        }
    }
}

/// Every command of one kind's cycle, built once per run.
struct Cycle<'a> {
    kind: Kind,
    k: usize,
    /// LEASE.MACQUIRE k keys owner ttl.
    macquire: Vec<&'a str>,
    /// LEASE.MRELEASE k keys owner.
    mrelease: Vec<&'a str>,
    /// Per key: LEASE.ACQUIRE key owner ttl, or the lock script's EVALSHA.
    acquires: Vec<Vec<&'a str>>,
    /// Per key: LEASE.RELEASE key owner, or the unlock script's EVALSHA.
    releases: Vec<Vec<&'a str>>,
    /// DEL of every key: frees them after a cycle that went wrong.
    del: Vec<&'a str>,
}

/// The SHAs of RedissonLock's two scripts.
struct Shas {
    lock: String,
    unlock: String,
}

impl<'a> Cycle<'a> {
    fn new(kind: Kind, names: &'a Names, shas: &'a Shas) -> Cycle<'a> {
        let keys = names.keys.iter().map(String::as_str);
        let with_keys = |head: [&'a str; 2], tail: &[&'a str]| -> Vec<&'a str> {
            head.into_iter()
                .chain(keys.clone())
                .chain(tail.iter().copied())
                .collect()
        };
        let (acquires, releases) = match kind {
            Kind::MultiLock => (
                keys.clone()
                    .map(|key| vec!["EVALSHA", &shas.lock, "1", key, TTL_MS, OWNER])
                    .collect(),
                keys.clone()
                    .zip(names.channels.iter())
                    .map(|(key, ch)| {
                        vec![
                            "EVALSHA",
                            &shas.unlock,
                            "2",
                            key,
                            ch,
                            UNLOCK_MESSAGE,
                            TTL_MS,
                            OWNER,
                        ]
                    })
                    .collect(),
            ),
            _ => (
                keys.clone()
                    .map(|key| vec!["LEASE.ACQUIRE", key, OWNER, TTL_MS])
                    .collect(),
                keys.clone()
                    .map(|key| vec!["LEASE.RELEASE", key, OWNER])
                    .collect(),
            ),
        };
        Cycle {
            kind,
            k: names.keys.len(),
            macquire: with_keys(["LEASE.MACQUIRE", &names.k], &[OWNER, TTL_MS]),
            mrelease: with_keys(["LEASE.MRELEASE", &names.k], &[OWNER]),
            acquires,
            releases,
            del: std::iter::once("DEL").chain(keys).collect(),
        }
    }

    /// Takes every key; false when one was not free (then none is held).
    fn acquire(&self, c: &mut Conn) -> Res<bool> {
        match self.kind {
            Kind::MAcquire => Ok(c.call(&self.macquire)?.opt_int()?.is_some()),
            Kind::Singles => {
                let replies = c.pipeline(&self.acquires)?;
                if !replies.iter().any(|r| r.is_nil()) {
                    return Ok(true);
                }
                // Not all or nothing: give back the part that was taken.
                let taken: Vec<Vec<&str>> = (replies.iter().zip(&self.releases))
                    .filter(|(r, _)| !r.is_nil())
                    .map(|(_, release)| release.clone())
                    .collect();
                if !taken.is_empty() {
                    c.pipeline(&taken)?;
                }
                Ok(false)
            }
            Kind::MultiLock => {
                // RedissonMultiLock.tryLock: one lock after the other, each
                // waited for; nil is taken, a PTTL is held by another.
                for (i, lock) in self.acquires.iter().enumerate() {
                    if !c.call(lock)?.is_nil() {
                        // unlockInner(acquiredLocks): one after the other.
                        for unlock in &self.releases[..i] {
                            c.call(unlock)?;
                        }
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }

    /// Gives every key back; false when one was not released.
    fn release(&self, c: &mut Conn) -> Res<bool> {
        match self.kind {
            Kind::MAcquire => Ok(c.call(&self.mrelease)?.int()? == self.k as i64),
            Kind::Singles => {
                let replies = c.pipeline(&self.releases)?;
                Ok(replies.iter().all(|r| r.int().is_ok_and(|n| n == 1)))
            }
            Kind::MultiLock => {
                // RedissonMultiLock.unlock(): locks.forEach(Lock::unlock),
                // each unlock waited for. 1: deleted and published.
                let mut all = true;
                for unlock in &self.releases {
                    all &= c.call(unlock)?.opt_int()? == Some(1);
                }
                Ok(all)
            }
        }
    }

    /// One cycle: the acquire's latency (µs) when every key was taken and
    /// given back, None when a step did not answer as on free keys (the
    /// keys are deleted then, so that the next cycle finds them free).
    fn run_once(&self, c: &mut Conn) -> Res<Option<f64>> {
        let t = Instant::now();
        let taken = self.acquire(c)?;
        let latency = t.elapsed().as_secs_f64() * 1e6;
        if taken && self.release(c)? {
            return Ok(Some(latency));
        }
        c.call(&self.del)?;
        Ok(None)
    }
}

/// One run's figures.
struct Run {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Server CPU (INFO cpu, user + sys) per cycle, µs.
    cpu_us: f64,
    /// Server time of the client's commands (INFO commandstats) per cycle, µs.
    cmd_us: f64,
    failed: u64,
}

/// The summed `usec` of `commands` in INFO commandstats.
fn command_usec(ctl: &mut Conn, commands: &[&str]) -> Res<f64> {
    let info = ctl.call(&["INFO", "commandstats"])?.text()?;
    let usec: HashMap<String, f64> = info
        .lines()
        .filter_map(|l| {
            let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let usec = fields.split(',').find_map(|f| f.strip_prefix("usec="))?;
            Some((name.to_ascii_lowercase(), usec.parse().ok()?))
        })
        .collect();
    Ok(commands.iter().filter_map(|c| usec.get(*c)).sum())
}

/// Warm-up, then cycles for the window; the server's counters are read
/// on `ctl` just before and just after the window.
fn run(c: &mut Conn, ctl: &mut Conn, cycle: &Cycle, knobs: &Knobs) -> Res<Run> {
    let warm_end = Instant::now() + Duration::from_millis(knobs.multikey_warm_ms);
    while Instant::now() < warm_end {
        cycle.run_once(c)?;
    }
    ctl.call(&["CONFIG", "RESETSTAT"])?;
    let cpu0 = info_cpu_ms(ctl)?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_millis(knobs.multikey_ms);
    let (mut lat, mut failed) = (Vec::new(), 0);
    while Instant::now() < end {
        match cycle.run_once(c)? {
            Some(us) => lat.push(us),
            None => failed += 1,
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_ms = info_cpu_ms(ctl)? - cpu0;
    let cmd_us = command_usec(ctl, cycle.kind.commands())?;
    lat.sort_by(f64::total_cmp);
    let n = lat.len() as f64;
    Ok(Run {
        per_sec: n / secs,
        p50_us: percentile(&lat, 50.0),
        p99_us: percentile(&lat, 99.0),
        cpu_us: cpu_ms * 1000.0 / n,
        cmd_us: cmd_us / n,
        failed,
    })
}

/// The medians of one (k, kind)'s runs.
struct Row {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
    cmd_us: f64,
    failed: u64,
}

impl Row {
    fn of(runs: &[Run]) -> Row {
        let med = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        Row {
            per_sec: med(|r| r.per_sec),
            p50_us: med(|r| r.p50_us),
            p99_us: med(|r| r.p99_us),
            cpu_us: med(|r| r.cpu_us),
            cmd_us: med(|r| r.cmd_us),
            failed: runs.iter().map(|r| r.failed).sum(),
        }
    }
}

/// `handoff multikey <port>`: runs part H and prints it (Markdown).
pub fn section(port: u16, knobs: &Knobs) -> Res<()> {
    let mut ctl = Conn::open(port)?;
    let mut c = Conn::open(port)?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let shas = Shas {
        lock: load_script(&mut ctl, REDISSON_LOCK)?,
        unlock: load_script(&mut ctl, REDISSON_UNLOCK)?,
    };
    let names: Vec<Vec<Names>> = KS
        .iter()
        .map(|&k| Kind::ALL.iter().map(|&kind| Names::of(kind, k)).collect())
        .collect();
    let cycles: Vec<Vec<Cycle>> = names
        .iter()
        .map(|per_k| {
            (Kind::ALL.iter().zip(per_k))
                .map(|(&kind, n)| Cycle::new(kind, n, &shas))
                .collect()
        })
        .collect();
    // runs[k][kind]: every (k, kind) once per repetition, interleaved.
    let mut runs: Vec<Vec<Vec<Run>>> = KS
        .iter()
        .map(|_| Kind::ALL.iter().map(|_| Vec::new()).collect())
        .collect();
    for _ in 0..knobs.multikey_reps {
        for (ki, per_k) in cycles.iter().enumerate() {
            for (i, cycle) in per_k.iter().enumerate() {
                runs[ki][i].push(run(&mut c, &mut ctl, cycle, knobs)?);
            }
        }
    }
    let rows: Vec<Vec<Row>> = runs
        .iter()
        .map(|per_k| per_k.iter().map(|r| Row::of(r)).collect())
        .collect();
    print_intro(knobs);
    print_table(&rows);
    print_ratios(&rows);
    Ok(())
}

fn print_intro(knobs: &Knobs) {
    println!(
        "One client, one connection, one cycle after the other on its own keys (uncontended): \
         take all k keys, then give them all back. Lease time {TTL_MS} ms, owner `{OWNER}` \
         (Redisson's lock name shape) for every kind. Each run: {} ms warm-up, then {} ms \
         counted; {} runs of every (k, kind), interleaved; medians shown. The acquire latency is \
         the time of the acquire step alone (for the MultiLock, its k round trips). Server CPU: \
         `INFO cpu` (user + sys) over the counted window, per cycle: command time, parsing, \
         replies and the event loop. Command time: `INFO commandstats` `usec` of the commands \
         the client sends (after `CONFIG RESETSTAT`), per cycle: for `EVALSHA` the whole script. \
         A cycle fails when a step does not answer as on free keys (none should).\n",
        knobs.multikey_warm_ms, knobs.multikey_ms, knobs.multikey_reps
    );
}

fn print_table(rows: &[Vec<Row>]) {
    println!(
        "| k | cycle | round trips | cycles/s | acquire p50, µs | acquire p99, µs | server CPU per cycle, µs | command time per cycle, µs (per key) | failed cycles |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for (&k, per_k) in KS.iter().zip(rows) {
        for (&kind, r) in Kind::ALL.iter().zip(per_k) {
            println!(
                "| {k} | {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} ({:.2}) | {} |",
                kind.name(),
                kind.round_trips(k),
                r.per_sec,
                r.p50_us,
                r.p99_us,
                r.cpu_us,
                r.cmd_us,
                r.cmd_us / k as f64,
                r.failed
            );
        }
    }
}

fn print_ratios(rows: &[Vec<Row>]) {
    println!(
        "\nRatios of the medians above. cycles/s: above 1, `LEASE.MACQUIRE` + `LEASE.MRELEASE` \
         does more cycles per second. Server CPU per cycle: below 1, it costs the server less.\n"
    );
    println!(
        "| k | cycles/s: MACQUIRE / pipelined singles | cycles/s: MACQUIRE / MultiLock | server CPU per cycle: MACQUIRE / pipelined singles | server CPU per cycle: MACQUIRE / MultiLock |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (&k, r) in KS.iter().zip(rows) {
        let (m, s, l) = (&r[0], &r[1], &r[2]);
        println!(
            "| {k} | {:.2} | {:.2} | {:.2} | {:.2} |",
            m.per_sec / s.per_sec,
            m.per_sec / l.per_sec,
            m.cpu_us / s.cpu_us,
            m.cpu_us / l.cpu_us
        );
    }
}
