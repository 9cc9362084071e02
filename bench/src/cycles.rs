//! C: full lock cycles per second from real clients. A cycle is acquire,
//! one fenced write, release, one command at a time (each step needs the
//! previous reply), on the client's own lock key (uncontended), for the
//! module and for the recipes ([`Cycle`]). CYCLE_CLIENTS threads, each
//! with its own connection; CYCLE_REPS interleaved runs of each kind, each
//! CYCLE_WARM_MS of warm-up and CYCLE_MS counted; the median run is shown.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use crate::clock::sleep_until;
use crate::knobs::Knobs;
use crate::kv::KvFile;
use crate::resp::{Conn, Reply, Res};
use crate::scripts::{COMPARE_AND_DELETE, FENCED_WRITE};
use crate::server::{has_command, info_cpu_ms, load_script};
use crate::stats::median;

/// One kind of lock cycle: acquire, one fenced write, release.
#[derive(Clone, Copy, PartialEq)]
enum Cycle {
    /// LEASE.ACQUIRE, LEASE.FENCE lock token SET data v, LEASE.RELEASE.
    Module,
    /// SET NX PX, Lua (GET lock == owner, then SET data), Lua compare-and-delete.
    Lua,
    /// SET NX PX, a plain SET of the data, DELIFEQ (Valkey 9): no fencing.
    Native,
}

impl Cycle {
    fn name(self) -> &'static str {
        match self {
            Cycle::Module => "module",
            Cycle::Lua => "Lua recipe",
            Cycle::Native => "native recipe (no fencing)",
        }
    }

    fn commands(self) -> &'static str {
        match self {
            Cycle::Module => {
                "`LEASE.ACQUIRE lock owner 30000`, `LEASE.FENCE lock <token> SET data v`, \
                 `LEASE.RELEASE lock owner`"
            }
            Cycle::Lua => {
                "`SET lock owner NX PX 30000`, `EVALSHA` (GET lock == owner, then `SET data v`), \
                 `EVALSHA` compare-and-delete"
            }
            Cycle::Native => "`SET lock owner NX PX 30000`, `SET data v`, `DELIFEQ lock owner`",
        }
    }

    /// Its name in the HANDOFF_KV lines (cycles_<name>).
    fn kv_name(self) -> &'static str {
        match self {
            Cycle::Module => "module",
            Cycle::Lua => "lua",
            Cycle::Native => "native",
        }
    }
}

/// The SHAs of the Lua recipe's two scripts.
struct LuaRecipe {
    fenced_write: String,
    compare_and_delete: String,
}

/// One client's keys and owner id.
struct ClientKeys {
    lock: String,
    data: String,
    owner: String,
}

impl ClientKeys {
    fn of(i: usize) -> ClientKeys {
        ClientKeys {
            lock: format!("cy:{i}:lock"),
            data: format!("cy:{i}:data"),
            owner: format!("o:{:016x}", 0x5f2a_9c1d_7e3b_4a60u64 ^ i as u64),
        }
    }
}

/// Whether a write step answered OK (an error reply is a failed cycle,
/// not a failed run).
fn wrote(reply: Res<Reply>) -> bool {
    reply.and_then(|r| r.text()).is_ok_and(|t| t == "OK")
}

/// One module cycle; false when a step did not answer as on a free lock.
fn module_cycle(c: &mut Conn, k: &ClientKeys) -> Res<bool> {
    let acquired = c.call(&["LEASE.ACQUIRE", &k.lock, &k.owner, "30000"])?;
    let Some(token) = acquired.opt_int()? else {
        return Ok(false);
    };
    let write = c.call(&[
        "LEASE.FENCE",
        &k.lock,
        &token.to_string(),
        "SET",
        &k.data,
        "v",
    ]);
    let released = c.call(&["LEASE.RELEASE", &k.lock, &k.owner])?.int()?;
    Ok(wrote(write) && released == 1)
}

/// One cycle of a recipe: SET NX PX, then the Lua fenced write and
/// compare-and-delete, or (native) a plain SET and DELIFEQ.
fn recipe_cycle(c: &mut Conn, kind: Cycle, k: &ClientKeys, lua: &LuaRecipe) -> Res<bool> {
    if c.call(&["SET", &k.lock, &k.owner, "NX", "PX", "30000"])?
        .is_nil()
    {
        return Ok(false);
    }
    let (write, released) = if kind == Cycle::Lua {
        let w = c.call(&[
            "EVALSHA",
            &lua.fenced_write,
            "2",
            &k.lock,
            &k.data,
            &k.owner,
            "v",
        ]);
        let cad = &lua.compare_and_delete;
        (w, c.call(&["EVALSHA", cad, "1", &k.lock, &k.owner])?.int()?)
    } else {
        let w = c.call(&["SET", &k.data, "v"]);
        (w, c.call(&["DELIFEQ", &k.lock, &k.owner])?.int()?)
    };
    Ok(wrote(write) && released == 1)
}

/// What one client did in one run.
struct CycleCount {
    /// Cycles completed inside the measured window.
    counted: u64,
    /// Cycles in which a step did not answer as a free lock should.
    failed: u64,
}

/// The moments of one run: every client starts together at `start`, and
/// counts the cycles that complete in [`from`, `end`].
struct RunClock<'a> {
    start: &'a Barrier,
    from: Instant,
    end: Instant,
}

/// One client: full cycles on its own lock key until `end`.
fn cycle_client(
    port: u16,
    kind: Cycle,
    i: usize,
    lua: &LuaRecipe,
    t: &RunClock,
) -> Res<CycleCount> {
    let setup = Conn::open(port).and_then(|c| {
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(c)
    });
    // Every client meets the others at `start`, even one that could not
    // connect (the main thread waits there too).
    t.start.wait();
    let mut c = setup?;
    let keys = ClientKeys::of(i);
    let (mut counted, mut failed) = (0, 0);
    // Bounded in time: ends at `end` (every command has a 5 s read timeout).
    while Instant::now() < t.end {
        let ok = match kind {
            Cycle::Module => module_cycle(&mut c, &keys)?,
            Cycle::Lua | Cycle::Native => recipe_cycle(&mut c, kind, &keys, lua)?,
        };
        let now = Instant::now();
        if !ok {
            failed += 1;
            // Leave the key free for the next cycle, whatever happened.
            let _ = c.call(&["DEL", &keys.lock]);
        } else if now >= t.from && now <= t.end {
            counted += 1;
        }
    }
    Ok(CycleCount { counted, failed })
}

/// One run's result.
struct CycleRun {
    per_sec: f64,
    server_cpu_us: f64,
    server_cpu_pct: f64,
    failed: u64,
}

/// All clients doing cycles of `kind` for the warm-up and the window; the
/// rate and the server's CPU (INFO cpu) are taken over the window only.
fn cycle_run(port: u16, kind: Cycle, knobs: &Knobs, lua: &LuaRecipe) -> Res<CycleRun> {
    let clients = knobs.cycle_clients as usize;
    let window = Duration::from_millis(knobs.cycle_ms);
    let mut ctl = Conn::open(port)?;
    let start = Barrier::new(clients + 1);
    // Room for connecting: the clock starts once every client is connected.
    let from = Instant::now() + Duration::from_millis(200 + knobs.cycle_warm_ms);
    let t = RunClock {
        start: &start,
        from,
        end: from + window,
    };
    let (counts, cpu_ms) = thread::scope(|s| -> Res<(Vec<Res<CycleCount>>, f64)> {
        let t = &t;
        let clients: Vec<_> = (0..clients)
            .map(|i| s.spawn(move || cycle_client(port, kind, i, lua, t)))
            .collect();
        start.wait();
        sleep_until(t.from);
        let c0 = info_cpu_ms(&mut ctl)?;
        sleep_until(t.end);
        let c1 = info_cpu_ms(&mut ctl)?;
        let counts = clients
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("client panicked".into())))
            .collect();
        Ok((counts, c1 - c0))
    })?;
    let (mut counted, mut failed) = (0, 0);
    for c in counts {
        let c = c.map_err(|e| format!("{} cycle client: {e}", kind.name()))?;
        counted += c.counted;
        failed += c.failed;
    }
    let secs = window.as_secs_f64();
    Ok(CycleRun {
        per_sec: counted as f64 / secs,
        server_cpu_us: if counted > 0 {
            cpu_ms * 1000.0 / counted as f64
        } else {
            f64::NAN
        },
        server_cpu_pct: cpu_ms / 1000.0 / secs * 100.0,
        failed,
    })
}

/// `handoff cycles <port>`: runs section C and prints it; the rates go to
/// HANDOFF_KV (cycles_<kind>, cycles_<kind>_failed, cycles_best,
/// cycles_ratio).
pub fn section(port: u16, knobs: &Knobs, kv: &KvFile) -> Res<()> {
    let mut ctl = Conn::open(port)?;
    let lua = LuaRecipe {
        fenced_write: load_script(&mut ctl, FENCED_WRITE)?,
        compare_and_delete: load_script(&mut ctl, COMPARE_AND_DELETE)?,
    };
    // The best recipe on this server: the native one where DELIFEQ exists.
    let best = if has_command(&mut ctl, "DELIFEQ")? {
        Cycle::Native
    } else {
        Cycle::Lua
    };
    let kinds: &[Cycle] = match best {
        Cycle::Native => &[Cycle::Module, Cycle::Lua, Cycle::Native],
        _ => &[Cycle::Module, Cycle::Lua],
    };
    let mut runs: Vec<Vec<CycleRun>> = kinds.iter().map(|_| Vec::new()).collect();
    for _ in 0..knobs.cycle_reps {
        for (k, &kind) in kinds.iter().enumerate() {
            runs[k].push(cycle_run(port, kind, knobs, &lua)?);
        }
    }
    print_intro(knobs);
    let rates = print_table(kinds, &runs, kv);
    let module = rates[0];
    let best_rate = rates[kinds.iter().position(|&k| k == best).unwrap_or(1)];
    println!(
        "\nModule cycles/s / {} cycles/s (the best recipe on this server): **{:.2}** \
         (above 1: the module does more cycles per second).",
        best.name(),
        module / best_rate
    );
    kv.put("cycles_best", best.kv_name());
    kv.put("cycles_ratio", format!("{:.2}", module / best_rate));
    Ok(())
}

fn print_intro(knobs: &Knobs) {
    println!(
        "{} clients, each a thread with its own connection, each on its own lock key \
         (uncontended); one command at a time, not pipelined (each step waits for the previous \
         reply). Each run: {} ms warm-up, then {} ms counted; {} runs of each kind, \
         interleaved. cycles/s is the median run; server CPU (`INFO cpu`, user + sys) over the \
         counted window, per cycle and as % of one core. A cycle fails when a step does not \
         answer as on a free lock (none should).\n",
        knobs.cycle_clients, knobs.cycle_warm_ms, knobs.cycle_ms, knobs.cycle_reps
    );
}

/// Prints one row per kind (the median run) and writes its KV lines;
/// returns the median cycles/s of each kind.
fn print_table(kinds: &[Cycle], runs: &[Vec<CycleRun>], kv: &KvFile) -> Vec<f64> {
    println!("| cycle | commands | cycles/s | server CPU per cycle | server CPU | failed cycles |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut rates = Vec::new();
    for (&kind, r) in kinds.iter().zip(runs) {
        let per_sec = median(r.iter().map(|x| x.per_sec).collect());
        let cpu_us = median(r.iter().map(|x| x.server_cpu_us).collect());
        let cpu_pct = median(r.iter().map(|x| x.server_cpu_pct).collect());
        let failed: u64 = r.iter().map(|x| x.failed).sum();
        println!(
            "| {} | {} | {:.0} | {:.1} us | {:.0} % | {} |",
            kind.name(),
            kind.commands(),
            per_sec,
            cpu_us,
            cpu_pct,
            failed
        );
        kv.put(
            &format!("cycles_{}", kind.kv_name()),
            format!("{per_sec:.0}"),
        );
        kv.put(&format!("cycles_{}_failed", kind.kv_name()), failed);
        rates.push(per_sec);
    }
    rates
}
