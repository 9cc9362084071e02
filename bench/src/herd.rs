//! B3: what HERD (1,000) clients blocked on one key cost the server, in
//! memory and CPU, against the same crowd in BLPOP; then the release chain
//! that serves them all, in FIFO order.
//!
//! The clients are plain connections driven from this thread: each is sent
//! its blocking command, and its reply is read when its turn comes.

use std::thread;
use std::time::{Duration, Instant};

use crate::knobs::Knobs;
use crate::resp::{Conn, Reply, Res, command_on};
use crate::server::{ServerCpu, blocked_clients, lease_waiters, used_memory};
use crate::stats::fmt_us;

const KEY: &str = "bench:herd";
const LIST: &str = "bench:herd:list";

/// The figures of B3's table.
struct HerdCost {
    n: usize,
    /// used_memory per client: no connections -> idle connections, and
    /// no connections -> blocked.
    mem_connected: f64,
    mem_blocked: f64,
    /// Server CPU, % of one core.
    cpu_idle: f64,
    cpu_connected: f64,
    cpu_blocked: f64,
    chain: ReleaseChain,
    waiters_left: i64,
    blpop_mem: f64,
    blpop_cpu: f64,
}

/// What the release chain saw.
struct ReleaseChain {
    /// One RELEASE and the next waiter's reply, on average.
    per_handoff_us: f64,
    served: usize,
    in_order: bool,
}

/// B3: measures, then prints the table.
pub fn section(port: u16, cpu: ServerCpu, knobs: &Knobs) -> Res<()> {
    let n = knobs.herd as usize;
    let window = Duration::from_millis(knobs.cpu_window_ms);
    let settle = Duration::from_millis(knobs.herd_settle_ms);
    println!("\n### B3. {n} clients blocked on one key\n");
    let h = measure(port, cpu, n, window, settle)?;
    print_table(&h, window);
    Ok(())
}

/// `n` connections, each answered one PING.
fn open_idle_crowd(port: u16, n: usize) -> Res<Vec<Conn>> {
    let mut crowd = (0..n).map(|_| Conn::open(port)).collect::<Res<Vec<_>>>()?;
    for c in crowd.iter_mut() {
        c.send(&["PING"])?;
    }
    for c in crowd.iter_mut() {
        match c.read()? {
            Reply::Status(s) if s == "PONG" => {}
            other => return Err(format!("PING answered {other:?}").into()),
        }
    }
    Ok(crowd)
}

fn measure(
    port: u16,
    cpu: ServerCpu,
    n: usize,
    window: Duration,
    settle: Duration,
) -> Res<HerdCost> {
    let mut ctl = Conn::open(port)?;
    ctl.call(&["DEL", KEY])?;
    ctl.call(&["LEASE.ACQUIRE", KEY, "holder", "600000"])?
        .int()?;
    let cpu_idle = cpu.percent_over(window)?;
    let m0 = used_memory(&mut ctl)?;
    let mut crowd = open_idle_crowd(port, n)?;
    // Memory is read at steady state: the server shrinks a new client's
    // reply buffer and frees an idle client's query buffer a few seconds
    // later (clientsCron), which would otherwise land inside a difference.
    thread::sleep(settle);
    let cpu_connected = cpu.percent_over(window)?;
    let m1 = used_memory(&mut ctl)?;
    block_in_line(&mut ctl, &mut crowd)?;
    thread::sleep(settle);
    let cpu_blocked = cpu.percent_over(window)?;
    let m2 = used_memory(&mut ctl)?;
    let chain = release_chain(&mut ctl, &mut crowd)?;
    drop(crowd);
    thread::sleep(Duration::from_millis(100));
    let waiters_left = lease_waiters(&mut ctl, KEY)?;
    let (blpop_mem, blpop_cpu) = blpop_crowd(port, cpu, n, window, settle, &mut ctl)?;
    Ok(HerdCost {
        n,
        mem_connected: (m1 - m0) as f64 / n as f64,
        mem_blocked: (m2 - m0) as f64 / n as f64,
        cpu_idle,
        cpu_connected,
        cpu_blocked,
        chain,
        waiters_left,
        blpop_mem,
        blpop_cpu,
    })
}

/// Blocks the crowd on KEY one by one (`LEASE.ACQUIRE KEY owner<i> 1000
/// BLOCK 0`, the next once LEASE.INFO counts the previous), so that the
/// queue order is known.
fn block_in_line(ctl: &mut Conn, crowd: &mut [Conn]) -> Res<()> {
    for (i, c) in crowd.iter_mut().enumerate() {
        c.send(&[
            "LEASE.ACQUIRE",
            KEY,
            &format!("owner{i}"),
            "1000",
            "BLOCK",
            "0",
        ])?;
        let t = Instant::now();
        while lease_waiters(ctl, KEY)? < (i + 1) as i64 {
            if t.elapsed() > Duration::from_secs(5) {
                return Err(format!("waiter {i} never blocked").into());
            }
        }
    }
    Ok(())
}

/// Releases the lease as each owner in turn: each release hands it to the
/// next in line, whose reply (its token) is read before the next release.
fn release_chain(ctl: &mut Conn, crowd: &mut [Conn]) -> Res<ReleaseChain> {
    let t = Instant::now();
    let mut prev_owner = "holder".to_string();
    let (mut served, mut in_order, mut last_token) = (0usize, true, 0i64);
    for (i, c) in crowd.iter_mut().enumerate() {
        if ctl.call(&["LEASE.RELEASE", KEY, &prev_owner])?.int()? != 1 {
            in_order = false;
        }
        match c.read()? {
            Reply::Int(token) => {
                served += 1;
                in_order &= token > last_token;
                last_token = token;
            }
            other => {
                eprintln!("waiter {i} answered {other:?}");
                in_order = false;
            }
        }
        prev_owner = format!("owner{i}");
    }
    let per_handoff_us = t.elapsed().as_secs_f64() * 1e6 / crowd.len() as f64;
    ctl.call(&["LEASE.RELEASE", KEY, &prev_owner])?.int()?;
    Ok(ReleaseChain {
        per_handoff_us,
        served,
        in_order,
    })
}

/// The same crowd in BLPOP on one list, for reference: used_memory per
/// blocked client (idle connections -> blocked) and the server's CPU.
fn blpop_crowd(
    port: u16,
    cpu: ServerCpu,
    n: usize,
    window: Duration,
    settle: Duration,
    ctl: &mut Conn,
) -> Res<(f64, f64)> {
    ctl.call(&["DEL", LIST])?;
    let mut crowd = open_idle_crowd(port, n)?;
    thread::sleep(settle);
    let base = blocked_clients(ctl)?;
    let m1 = used_memory(ctl)?;
    for c in crowd.iter_mut() {
        c.send(&["BLPOP", LIST, "0"])?;
    }
    let t = Instant::now();
    while blocked_clients(ctl)? < base + n as i64 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("BLPOP clients never all blocked".into());
        }
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(settle);
    let cpu_blocked = cpu.percent_over(window)?;
    let m2 = used_memory(ctl)?;
    let values: Vec<String> = std::iter::once(LIST.to_string())
        .chain((0..n).map(|i| i.to_string()))
        .collect();
    ctl.call(&command_on("RPUSH", &values))?;
    for c in crowd.iter_mut() {
        c.read()?; // [list, value]
    }
    Ok(((m2 - m1) as f64 / n as f64, cpu_blocked))
}

fn print_table(h: &HerdCost, window: Duration) {
    let n = h.n;
    println!("| measure | value |");
    println!("|---|---:|");
    println!(
        "| used_memory per blocked waiter (steady state, {n} idle connections -> {n} blocked) | {:.0} B |",
        h.mem_blocked - h.mem_connected
    );
    println!(
        "| used_memory per blocked waiter incl. its connection (no connections -> {n} blocked) | {:.0} B |",
        h.mem_blocked
    );
    println!(
        "| server CPU, idle, 1 client ({} ms window) | {:.1} % of one core |",
        window.as_millis(),
        h.cpu_idle
    );
    println!(
        "| server CPU, {n} idle connections | {:.1} % of one core |",
        h.cpu_connected
    );
    println!(
        "| server CPU, {n} clients blocked (LEASE.ACQUIRE ... BLOCK 0) | {:.1} % of one core |",
        h.cpu_blocked
    );
    println!(
        "| for reference, {n} clients in BLPOP on one list: used_memory per blocked client / server CPU | {:.0} B / {:.1} % |",
        h.blpop_mem, h.blpop_cpu
    );
    println!(
        "| release chain: RELEASE + next waiter's reply, per hand-off | {} |",
        fmt_us(h.chain.per_handoff_us)
    );
    println!(
        "| waiters served / in FIFO order with increasing tokens / left waiting after | {} of {n} / {} / {} |",
        h.chain.served,
        if h.chain.in_order { "yes" } else { "NO" },
        h.waiters_left
    );
}
