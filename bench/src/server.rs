//! Readings of the server under test: its INFO fields, its lease waiters,
//! its CPU time from /proc, and what commands it has.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply, Res};

/// The value of `field` in `INFO section`.
fn info_value(c: &mut Conn, section: &str, field: &str) -> Res<String> {
    let info = c.call(&["INFO", section])?.text()?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("no {field} in INFO {section}").into())
}

/// `used_memory` of INFO memory, bytes.
pub fn used_memory(c: &mut Conn) -> Res<i64> {
    Ok(info_value(c, "memory", "used_memory")?.parse()?)
}

/// `blocked_clients` of INFO clients (BLPOP and module waiters alike).
pub fn blocked_clients(c: &mut Conn) -> Res<i64> {
    Ok(info_value(c, "clients", "blocked_clients")?.parse()?)
}

/// `connected_clients` of INFO clients.
pub fn connected_clients(c: &mut Conn) -> Res<i64> {
    Ok(info_value(c, "clients", "connected_clients")?.parse()?)
}

/// used_cpu_sys + used_cpu_user of INFO cpu (getrusage), in ms.
pub fn info_cpu_ms(c: &mut Conn) -> Res<f64> {
    let info = c.call(&["INFO", "cpu"])?.text()?;
    let get = |k: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((get("used_cpu_sys:") + get("used_cpu_user:")) * 1000.0)
}

/// The integer fields of `INFO lease` (the module's counters).
pub fn info_lease(c: &mut Conn) -> Res<HashMap<String, i64>> {
    let info = c.call(&["INFO", "lease"])?.text()?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect())
}

/// One integer field of `INFO lease`.
pub fn info_lease_field(c: &mut Conn, name: &str) -> Res<i64> {
    info_lease(c)?
        .get(name)
        .copied()
        .ok_or_else(|| format!("no {name} in INFO lease").into())
}

/// The `waiters` field of `LEASE.INFO key` (0 when the key has no record).
pub fn lease_waiters(c: &mut Conn, key: &str) -> Res<i64> {
    let info = c.call(&["LEASE.INFO", key])?;
    let Reply::Array(fields) = info else {
        return Ok(0);
    };
    for pair in fields.chunks(2) {
        if let [name, value] = pair
            && name.text().is_ok_and(|n| n == "waiters")
        {
            return value.int();
        }
    }
    Ok(0)
}

/// `CONFIG GET maxclients`.
pub fn maxclients(c: &mut Conn) -> Res<i64> {
    let reply = c.call(&["CONFIG", "GET", "maxclients"])?.into_array()?;
    reply.get(1).ok_or("no maxclients")?.int()
}

/// Whether the server knows `command` (`COMMAND INFO` answers nil if not).
pub fn has_command(c: &mut Conn, command: &str) -> Res<bool> {
    let info = c.call(&["COMMAND", "INFO", command])?.into_array()?;
    Ok(info.iter().any(|v| !v.is_nil()))
}

/// `SCRIPT LOAD`: the script's sha1, for EVALSHA.
pub fn load_script(c: &mut Conn, body: &str) -> Res<String> {
    c.call(&["SCRIPT", "LOAD", body])?.text()
}

/// The server process's CPU time, from /proc/<pid>/stat.
#[derive(Clone, Copy)]
pub struct ServerCpu {
    pub pid: u32,
    /// Clock ticks per second (CLK_TCK).
    pub ticks_per_sec: u64,
}

impl ServerCpu {
    /// utime + stime, in clock ticks.
    pub fn ticks(&self) -> Res<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // Fields after the ")" that closes the command name: state is field 3,
        // utime field 14, stime field 15.
        let rest = &stat[stat.rfind(')').ok_or("bad /proc stat")? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
    }

    /// Ticks as milliseconds.
    pub fn ticks_ms(&self, ticks: u64) -> f64 {
        ticks as f64 / self.ticks_per_sec as f64 * 1000.0
    }

    /// The server's CPU use over `window`, in % of one core.
    pub fn percent_over(&self, window: Duration) -> Res<f64> {
        let (t0, c0) = (Instant::now(), self.ticks()?);
        thread::sleep(window);
        let (t1, c1) = (Instant::now(), self.ticks()?);
        Ok((c1 - c0) as f64 / self.ticks_per_sec as f64 / (t1 - t0).as_secs_f64() * 100.0)
    }
}
