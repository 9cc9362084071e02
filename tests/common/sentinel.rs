//! Redis Sentinel processes: the server binary with `<conf> --sentinel`,
//! started from a config text the test gives, killed (SIGKILL through libc)
//! on drop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::*;

/// A connection with short timeouts (the node may be dead or stopped).
pub fn quick_conn(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let c = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    c.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    Some(c)
}

/// `INFO <section>` of the server on `port` as text, `None` when it does
/// not answer.
pub fn try_info(port: u16, section: &str) -> Option<String> {
    let mut c = quick_conn(port)?;
    redis::cmd("INFO").arg(section).query(&mut c).ok()
}

/// A running Sentinel watching the master it calls `name`.
pub struct Sentinel {
    pub port: u16,
    pub name: String,
    /// Its config file (Sentinel rewrites it).
    pub conf: PathBuf,
    child: Child,
    log: PathBuf,
}

impl Sentinel {
    /// Starts sentinel `index` in `dir` from the config text `conf(port,
    /// log)` (written to `sentinel-<index>.conf`), for the master it calls
    /// `name`. Tries another port when the first is taken.
    pub fn start(
        kind: Kind,
        dir: &Path,
        index: usize,
        name: &str,
        conf: impl Fn(u16, &Path) -> String,
    ) -> Sentinel {
        let mut last_log = String::new();
        for _attempt in 0..3 {
            let port = free_port();
            let file = dir.join(format!("sentinel-{index}.conf"));
            let log = dir.join(format!("sentinel-{index}-{port}.log"));
            std::fs::write(&file, conf(port, &log)).expect("sentinel conf");
            let child = Command::new(server_binary(kind))
                .arg(&file)
                .arg("--sentinel")
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn sentinel");
            let mut s = Sentinel {
                port,
                name: name.to_string(),
                conf: file,
                child,
                log,
            };
            let up = wait_until(Duration::from_secs(10), || {
                if let Ok(Some(_)) = s.child.try_wait() {
                    return true;
                }
                s.conn()
                    .is_some_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
            });
            if up && matches!(s.child.try_wait(), Ok(None)) {
                return s;
            }
            last_log = s.log();
            drop(s);
            if !last_log.contains("Address already in use") {
                break;
            }
        }
        panic!("{kind:?} sentinel {index} did not start:\n{last_log}");
    }

    pub fn conn(&self) -> Option<redis::Connection> {
        quick_conn(self.port)
    }

    /// The master's port as this sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.name)
            .query(&mut self.conn()?)
            .ok()?;
        addr.get(1)?.parse().ok()
    }

    /// What this sentinel knows of the replicas: port -> (flags, priority).
    pub fn replicas(&self) -> HashMap<u16, (String, String)> {
        let Some(mut c) = self.conn() else {
            return HashMap::new();
        };
        let Ok(Value::Array(items)) = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&self.name)
            .query::<Value>(&mut c)
        else {
            return HashMap::new();
        };
        items
            .iter()
            .filter_map(|item| {
                let Value::Array(kv) = item else { return None };
                let fields: HashMap<String, String> = kv
                    .chunks(2)
                    .filter(|p| p.len() == 2)
                    .map(|p| (text(&p[0]), text(&p[1])))
                    .collect();
                let port = fields.get("port")?.parse().ok()?;
                Some((
                    port,
                    (
                        fields.get("flags").cloned().unwrap_or_default(),
                        fields.get("slave-priority").cloned().unwrap_or_default(),
                    ),
                ))
            })
            .collect()
    }

    /// How many other sentinels this one knows.
    pub fn other_sentinels(&self) -> usize {
        let Some(mut c) = self.conn() else { return 0 };
        match redis::cmd("SENTINEL")
            .arg("SENTINELS")
            .arg(&self.name)
            .query::<Value>(&mut c)
        {
            Ok(Value::Array(a)) => a.len(),
            _ => 0,
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        signal_pid(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait();
    }
}
