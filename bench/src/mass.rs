//! B4, the mass timeout: MASS_N clients (10,000; at most maxclients - 100),
//! each on its own connection, block with the same timeout and all time
//! out together. One column per way of waiting ([`Layout`]): for reference
//! BLPOP on their own empty lists, then LEASE.ACQUIRE ... BLOCK each on its
//! own held key, then spread over MASS_KEYS held keys. Per column: how late
//! the null replies come, the server's CPU over the timeout window, memory
//! per blocked client at steady state, and checks that every client got
//! exactly one null and nothing else.

use std::thread;
use std::time::{Duration, Instant};

use crate::clock::{sleep_until, us_between};
use crate::crowd::{Crowd, Got, PER_THREAD, count_exact, raise_open_files};
use crate::knobs::Knobs;
use crate::resp::{Conn, Res, command_on, encode};
use crate::server::{
    ServerCpu, blocked_clients, info_cpu_ms, info_lease, info_lease_field, maxclients, used_memory,
};
use crate::stats::{Summary, fmt_us};

/// B4's knobs, as durations and counts.
struct MassOpts {
    asked: usize,
    timeout: Duration,
    spread_keys: usize,
    blpop: bool,
    batch: usize,
    /// CPU_WINDOW_MS and HERD_SETTLE_MS.
    window: Duration,
    settle: Duration,
}

/// How a crowd waits, in one column of B4.
struct Layout {
    label: String,
    /// The command of client `i`.
    cmd: Box<dyn Fn(usize) -> Vec<u8>>,
    /// Its timeout replies.
    nulls: &'static [&'static [u8]],
    /// A module waiter (counted by `lease_waiters`), or BLPOP (counted by
    /// `blocked_clients`).
    lease: bool,
}

/// The timeout replies of a lease waiter and of BLPOP (RESP2, or RESP3 just
/// in case).
const LEASE_NULLS: &[&[u8]] = &[b"$-1\r\n", b"_\r\n"];
const BLPOP_NULLS: &[&[u8]] = &[b"*-1\r\n", b"_\r\n"];

/// A reading of the server's CPU time, both ways.
struct CpuMark {
    at: Instant,
    ticks: u64,
    info_ms: f64,
}

impl CpuMark {
    fn take(cpu: ServerCpu, ctl: &mut Conn) -> Res<CpuMark> {
        Ok(CpuMark {
            at: Instant::now(),
            ticks: cpu.ticks()?,
            info_ms: info_cpu_ms(ctl)?,
        })
    }
}

/// How the crowd blocked, and what was read while it waited.
struct Blocked {
    /// When each client's command was sent.
    sent: Vec<Instant>,
    /// Per batch: (its end, when the server counted it blocked).
    counted: Vec<(usize, Instant)>,
    mem_blocked: i64,
    /// When memory was read, after every client was counted.
    mem_after: Duration,
    cpu_blocked: f64,
    cpu_blocked_window: Duration,
    /// Shortly before the earliest deadline.
    window_start: CpuMark,
}

/// The null replies of one column, against the deadlines.
struct Replies {
    /// From the first send until the server counted every client blocked.
    block_span_us: f64,
    /// The longest a batch took from its first send until it was counted.
    batch_wait_us: f64,
    /// Reply minus (own send + timeout), us: an upper bound of the lateness.
    late_send: Summary,
    /// Reply minus (when its batch was counted + timeout): a lower bound.
    late_counted: Summary,
    /// First reply minus (first send + timeout), last reply minus (all
    /// counted + timeout), last reply minus first reply.
    first_late_us: f64,
    last_late_us: f64,
    replies_span_us: f64,
    nulls: usize,
    early: usize,
    missing: usize,
}

/// The mass timeout of one layout.
struct MassRun {
    label: String,
    lease: bool,
    replies: Replies,
    mem_per_waiter: f64,
    mem_after: Duration,
    cpu_blocked: f64,
    cpu_blocked_window: Duration,
    /// Server CPU over the timeout window: /proc ticks (ms), INFO cpu (ms),
    /// and the window (from shortly before the earliest deadline to the last
    /// reply read).
    cpu_window_ticks_ms: f64,
    cpu_window_info_ms: f64,
    window: Duration,
    /// used_memory above the idle baseline once every reply is in.
    mem_after_timeouts: f64,
    pongs: usize,
    timeouts_delta: i64,
    waiters_after: i64,
}

struct Mass {
    /// How long the whole section took.
    took: Duration,
    n: usize,
    maxclients: i64,
    asked: usize,
    timeout_ms: u128,
    batch: usize,
    settle: Duration,
    cpu_idle_conns: f64,
    cpu_idle_window: Duration,
    runs: Vec<MassRun>,
}

/// B4: measures, then prints the section.
pub fn section(port: u16, cpu: ServerCpu, knobs: &Knobs) -> Res<()> {
    println!(
        "\n### B4. Mass timeout: clients blocked with the same BLOCK timeout, all timing out together\n"
    );
    let opts = MassOpts {
        asked: knobs.mass_n as usize,
        timeout: Duration::from_millis(knobs.mass_timeout_ms),
        spread_keys: knobs.mass_keys as usize,
        blpop: knobs.mass_blpop != 0,
        batch: knobs.mass_batch as usize,
        window: Duration::from_millis(knobs.cpu_window_ms),
        settle: Duration::from_millis(knobs.herd_settle_ms),
    };
    let m = measure(port, cpu, &opts)?;
    print_intro(&m);
    print_table(&m);
    println!(
        "\nThis section took {:.1} s: connecting, {:.1} s to the idle baseline, then one timeout \
         per column.",
        m.took.as_secs_f64(),
        m.settle.as_secs_f64()
    );
    Ok(())
}

fn own_key(i: usize) -> String {
    format!("bench:mass:own:{i}")
}

fn spread_key(i: usize, keys: usize) -> String {
    format!("bench:mass:spread:{}", i % keys.max(1))
}

fn list_key(i: usize) -> String {
    format!("bench:mass:list:{i}")
}

/// The columns, in order: BLPOP (if on), each on its own key, spread.
fn layouts(n: usize, spread_keys: usize, o: &MassOpts) -> Vec<Layout> {
    let t_ms = o.timeout.as_millis().to_string();
    let t_s = format!("{:.3}", o.timeout.as_millis() as f64 / 1000.0);
    let mut layouts = Vec::new();
    if o.blpop {
        layouts.push(Layout {
            label: format!("for reference: BLPOP, each on its own empty list ({n} lists)"),
            cmd: Box::new(move |i| encode(&["BLPOP", &list_key(i), &t_s])),
            nulls: BLPOP_NULLS,
            lease: false,
        });
    }
    let label = format!("LEASE.ACQUIRE BLOCK, each on its own key ({n} keys)");
    layouts.push(lease_layout(label, own_key, t_ms.clone()));
    if spread_keys > 0 && spread_keys < n {
        let per_key = n.div_ceil(spread_keys);
        let label =
            format!("LEASE.ACQUIRE BLOCK, spread over {spread_keys} keys ({per_key} per key)");
        layouts.push(lease_layout(
            label,
            move |i| spread_key(i, spread_keys),
            t_ms,
        ));
    }
    layouts
}

/// A lease column: client `i` blocks on `key(i)` as owner `w<i>`.
fn lease_layout(label: String, key: impl Fn(usize) -> String + 'static, t_ms: String) -> Layout {
    let cmd = move |i| {
        let owner = format!("w{i}");
        encode(&["LEASE.ACQUIRE", &key(i), &owner, "1000", "BLOCK", &t_ms])
    };
    Layout {
        label,
        cmd: Box::new(cmd),
        nulls: LEASE_NULLS,
        lease: true,
    }
}

/// The whole section: the crowd, the held keys and the idle baseline, then
/// one mass timeout per layout.
fn measure(port: u16, cpu: ServerCpu, o: &MassOpts) -> Res<Mass> {
    let t0 = Instant::now();
    let mut ctl = Conn::open(port)?;
    let maxclients = maxclients(&mut ctl)?;
    let fds = raise_open_files(o.asked as u64 + 1000);
    let n = o
        .asked
        .min((maxclients - 100).max(1) as usize)
        .min((fds as usize).saturating_sub(200).max(1));
    let spread_keys = o.spread_keys.min(n);
    let layouts = layouts(n, spread_keys, o);
    // The crowd, and the held keys of every layout, before the baseline.
    let crowd = Crowd::connect(port, n)?;
    if crowd.ping()? != n {
        return Err("the crowd's PING failed".into());
    }
    let held = hold_keys(&mut ctl, n, spread_keys)?;
    if o.blpop {
        let lists: Vec<String> = (0..n).map(list_key).collect();
        for chunk in lists.chunks(1000) {
            ctl.call(&command_on("DEL", chunk))?;
        }
    }
    let cpu_idle_window = o.window.min(o.settle);
    thread::sleep(o.settle.saturating_sub(cpu_idle_window));
    let cpu_idle_conns = cpu.percent_over(cpu_idle_window)?;
    let m_idle = used_memory(&mut ctl)?;
    let mut runs = Vec::new();
    for layout in &layouts {
        runs.push(time_out_together(&mut ctl, &crowd, layout, cpu, o, m_idle)?);
    }
    drop(crowd);
    for chunk in held.chunks(1000) {
        ctl.call(&command_on("UNLINK", chunk))?;
    }
    Ok(Mass {
        took: t0.elapsed(),
        n,
        maxclients,
        asked: o.asked,
        timeout_ms: o.timeout.as_millis(),
        batch: o.batch,
        settle: o.settle,
        cpu_idle_conns,
        cpu_idle_window,
        runs,
    })
}

/// Every lease key of every layout, freshly held (ttl 600 s), so that the
/// waiters block; returns their names.
fn hold_keys(ctl: &mut Conn, n: usize, spread_keys: usize) -> Res<Vec<String>> {
    let mut held: Vec<String> = (0..n).map(own_key).collect();
    held.extend((0..spread_keys).map(|i| spread_key(i, spread_keys)));
    for chunk in held.chunks(1000) {
        let commands: Vec<Vec<&str>> = chunk
            .iter()
            .flat_map(|k| [vec!["DEL", k], vec!["LEASE.ACQUIRE", k, "holder", "600000"]])
            .collect();
        ctl.pipeline(&commands)?;
    }
    Ok(held)
}

/// The server's count of the layout's blocked clients.
fn count_blocked(ctl: &mut Conn, lease: bool) -> Res<i64> {
    if lease {
        info_lease_field(ctl, "lease_waiters")
    } else {
        blocked_clients(ctl)
    }
}

/// One column: the crowd blocks with `layout` and times out together.
fn time_out_together(
    ctl: &mut Conn,
    crowd: &Crowd,
    layout: &Layout,
    cpu: ServerCpu,
    o: &MassOpts,
    m_idle: i64,
) -> Res<MassRun> {
    let base = count_blocked(ctl, layout.lease)?;
    let timeouts0 = info_lease_field(ctl, "lease_wait_timeouts")?;
    let (out, blocked) = crowd.exchange(o.timeout + Duration::from_secs(10), || {
        block_and_read_steady_state(ctl, crowd, layout, base, cpu, o)
    })?;
    let b = blocked?;
    let window_end = CpuMark::take(cpu, ctl)?;
    let replies = tally_replies(&out, &b, o.timeout, layout.nulls)?;
    let m_after = used_memory(ctl)?;
    thread::sleep(Duration::from_millis(100));
    let after = info_lease(ctl)?;
    // Nothing else arrived on any socket: the next reply of each is PONG.
    let pongs = crowd.ping()?;
    let n = out.len() as f64;
    let w0 = &b.window_start;
    Ok(MassRun {
        label: layout.label.clone(),
        lease: layout.lease,
        replies,
        mem_per_waiter: (b.mem_blocked - m_idle) as f64 / n,
        mem_after: b.mem_after,
        cpu_blocked: b.cpu_blocked,
        cpu_blocked_window: b.cpu_blocked_window,
        cpu_window_ticks_ms: cpu.ticks_ms(window_end.ticks - w0.ticks),
        cpu_window_info_ms: window_end.info_ms - w0.info_ms,
        window: window_end.at - w0.at,
        mem_after_timeouts: (m_after - m_idle) as f64,
        pongs,
        timeouts_delta: after.get("lease_wait_timeouts").copied().unwrap_or(-1) - timeouts0,
        waiters_after: after.get("lease_waiters").copied().unwrap_or(-1),
    })
}

/// On this thread, while the readers wait: sends in paced batches, reads
/// CPU and memory at steady state (before the timeout), then starts the
/// timeout window's CPU reading just before the earliest deadline.
fn block_and_read_steady_state(
    ctl: &mut Conn,
    crowd: &Crowd,
    layout: &Layout,
    base: i64,
    cpu: ServerCpu,
    o: &MassOpts,
) -> Res<Blocked> {
    let go = Instant::now();
    let limit = go
        + o.timeout
            .saturating_sub(Duration::from_millis(500))
            .min(Duration::from_secs(10));
    let mut count = || -> Res<i64> { Ok(count_blocked(ctl, layout.lease)? - base) };
    let (sent, counted) = crowd.send_paced(&*layout.cmd, o.batch, &mut count, limit)?;
    let all_blocked = counted.last().map_or(go, |c| c.1);
    let latest_mem = go + o.timeout.saturating_sub(Duration::from_millis(700));
    let mem_at = (all_blocked + o.settle).min(latest_mem).max(all_blocked);
    let cpu_blocked_window = o.window.min(mem_at - all_blocked);
    sleep_until(mem_at - cpu_blocked_window);
    let cpu_blocked = if cpu_blocked_window >= Duration::from_millis(100) {
        cpu.percent_over(cpu_blocked_window)?
    } else {
        f64::NAN
    };
    let mem_blocked = used_memory(ctl)?;
    let mem_after = Instant::now() - all_blocked;
    sleep_until(go + o.timeout.saturating_sub(Duration::from_millis(200)));
    Ok(Blocked {
        sent,
        counted,
        mem_blocked,
        mem_after,
        cpu_blocked,
        cpu_blocked_window,
        window_start: CpuMark::take(cpu, ctl)?,
    })
}

/// Each client's null reply against its deadline, bounded by its send and
/// by when its batch was counted.
fn tally_replies(out: &[Got], b: &Blocked, timeout: Duration, nulls: &[&[u8]]) -> Res<Replies> {
    let first_sent = b.sent[0];
    let all_counted = b.counted.last().ok_or("no batch")?.1;
    // When the batch of client i was counted.
    let mut batch_of = Vec::with_capacity(out.len());
    let mut batch_wait_us: f64 = 0.0;
    let mut from = 0;
    for &(end, at) in &b.counted {
        batch_wait_us = batch_wait_us.max(us_between(at, b.sent[from]));
        batch_of.extend(std::iter::repeat_n(at, end - from));
        from = end;
    }
    let (mut late_send, mut late_counted) = (Vec::new(), Vec::new());
    for (i, g) in out.iter().enumerate() {
        if let Some(at) = g.at {
            late_send.push(us_between(at, b.sent[i] + timeout));
            late_counted.push(us_between(at, batch_of[i] + timeout));
        }
    }
    let got: Vec<Instant> = out.iter().filter_map(|g| g.at).collect();
    let (first_got, last_got) = (got.iter().min().copied(), got.iter().max().copied());
    // A reply well before its timeout would mean the client never blocked.
    let early = late_send.iter().filter(|&&l| l < -5_000.0).count();
    let missing = out.iter().filter(|g| g.at.is_none()).count();
    Ok(Replies {
        block_span_us: us_between(all_counted, first_sent),
        batch_wait_us,
        late_send: Summary::of(late_send, missing),
        late_counted: Summary::of(late_counted, missing),
        first_late_us: first_got.map_or(f64::NAN, |g| us_between(g, first_sent + timeout)),
        last_late_us: last_got.map_or(f64::NAN, |g| us_between(g, all_counted + timeout)),
        replies_span_us: match (first_got, last_got) {
            (Some(a), Some(b)) => us_between(b, a),
            _ => f64::NAN,
        },
        nulls: count_exact(out, nulls),
        early,
        missing,
    })
}

// --- the report --------------------------------------------------------------------

fn print_intro(m: &Mass) {
    let n = m.n;
    println!(
        "{n} clients (`MASS_N` {}, at most `CONFIG GET maxclients` {} - 100), each on its own \
         connection, send one blocking command with the same timeout, {} ms. Every lease key is \
         held first (ttl 600 s), so the clients block; the module answers each null when its \
         timeout passes, from one timer at the earliest timeout. The commands go out in batches \
         of {}: the next batch once the server counts the previous one blocked (`lease_waiters`, \
         or `blocked_clients` for BLPOP), so no command waits long at the server before it \
         blocks, and the deadlines follow each other as fast as the server can block clients. \
         {} reader threads each wait on up to {} sockets through epoll.\n",
        m.asked,
        m.maxclients,
        m.timeout_ms,
        m.batch,
        n.div_ceil(PER_THREAD),
        PER_THREAD.min(n)
    );
    println!(
        "A client's deadline is when the server ran its command plus the timeout. Its lateness \
         is bounded above by its reply minus (its send + timeout), and below by its reply minus \
         (the moment its batch was counted + timeout). Server CPU over the timeout window is \
         utime+stime from `/proc/<pid>/stat` (clock ticks of 10 ms) and from `INFO cpu` \
         (getrusage, finer), from 200 ms before the earliest deadline until the last reply was \
         read. Memory per client is used_memory with the {n} clients blocked minus with the \
         same {n} connections idle (and the same held keys), both at steady state ({} ms after \
         connecting or blocking, unless the timeout comes first), divided by {n}.\n",
        m.settle.as_millis()
    );
}

/// One row of the table: its label, and its cell for each column.
type Row<'a> = (String, Box<dyn Fn(&MassRun) -> String + 'a>);

fn row<'a>(label: impl Into<String>, cell: impl Fn(&MassRun) -> String + 'a) -> Row<'a> {
    (label.into(), Box::new(cell))
}

/// The rows about the null replies.
fn reply_rows() -> Vec<Row<'static>> {
    vec![
        row(
            "deadlines spread over (first send -> all counted blocked) / slowest batch to be counted",
            |r| {
                let p = &r.replies;
                format!("{} / {}", fmt_us(p.block_span_us), fmt_us(p.batch_wait_us))
            },
        ),
        row(
            "null reply lateness, upper bound (reply - own send - timeout): p50 / p99 / max",
            |r| r.replies.late_send.p50_p99_max(),
        ),
        row(
            "null reply lateness, lower bound (reply - batch counted - timeout): p50 / p99 / max",
            |r| r.replies.late_counted.p50_p99_max(),
        ),
        row(
            "first null reply after the earliest deadline / last after the latest / first to last",
            |r| {
                let p = &r.replies;
                let (first, last) = (fmt_us(p.first_late_us), fmt_us(p.last_late_us));
                format!("{first} / {last} / {}", fmt_us(p.replies_span_us))
            },
        ),
    ]
}

/// The rows about the server's CPU and memory.
fn cost_rows(m: &Mass) -> Vec<Row<'_>> {
    let n = m.n;
    vec![
        row(
            "server CPU over the timeout window: /proc ticks / INFO cpu (window)",
            |r| {
                let w = r.window.as_millis();
                format!(
                    "{:.0} ms / {:.1} ms ({w} ms)",
                    r.cpu_window_ticks_ms, r.cpu_window_info_ms
                )
            },
        ),
        row(
            "server CPU per timed-out client (INFO cpu over the window / n)",
            move |r| fmt_us(r.cpu_window_info_ms * 1000.0 / n as f64),
        ),
        row(
            format!(
                "server CPU, {n} idle connections ({} ms window) / {n} blocked, % of one core",
                m.cpu_idle_window.as_millis()
            ),
            |r| {
                let w = r.cpu_blocked_window.as_millis();
                format!(
                    "{:.1} % / {:.1} % ({w} ms window)",
                    m.cpu_idle_conns, r.cpu_blocked
                )
            },
        ),
        row(
            "used_memory per blocked client (steady state, idle connections -> blocked)",
            |r| {
                let after = r.mem_after.as_secs_f64();
                format!(
                    "{:.0} B (read {after:.1} s after all blocked)",
                    r.mem_per_waiter
                )
            },
        ),
        row(
            "used_memory above the idle baseline right after the last null reply",
            |r| format!("{:.1} MB", r.mem_after_timeouts / 1e6),
        ),
    ]
}

/// The rows that check the outcome.
fn check_rows(n: usize) -> Vec<Row<'static>> {
    vec![
        row(
            format!(
                "clients with exactly one null reply / early / no reply / whose next reply is PONG (of {n})"
            ),
            |r| {
                let p = &r.replies;
                format!("{} / {} / {} / {}", p.nulls, p.early, p.missing, r.pongs)
            },
        ),
        row(
            "`lease_wait_timeouts` grew by / `lease_waiters` after",
            |r| {
                let not_a_lease = if r.lease { "" } else { " (not a lease)" };
                format!("{} / {}{not_a_lease}", r.timeouts_delta, r.waiters_after)
            },
        ),
    ]
}

fn print_table(m: &Mass) {
    print!("| measure |");
    for r in &m.runs {
        print!(" {} |", r.label);
    }
    println!();
    println!("|---|{}", "---:|".repeat(m.runs.len()));
    let mut rows = reply_rows();
    rows.extend(cost_rows(m));
    rows.extend(check_rows(m.n));
    for (label, cell) in rows {
        print!("| {label} |");
        for r in &m.runs {
            print!(" {} |", cell(r));
        }
        println!();
    }
}
