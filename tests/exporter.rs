//! Metrics where Prometheus users look: Debian's `prometheus-redis-exporter`
//! reads `INFO ALL`, which leaves module sections out; with
//! `-script deploy/prometheus/lease.lua` it exports every numeric
//! `INFO lease` field. The test starts the exporter against a server with
//! some lease traffic, reads its HTTP endpoint, and checks every field and
//! every metric `deploy/prometheus/alerts.yml` uses.
//!
//! `make test` installs the exporter (Debian package
//! prometheus-redis-exporter); without it (or `LEASE_EXPORTER`, its path)
//! the test says so and passes.
mod common;
use common::*;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn deploy_file(rel: &str) -> PathBuf {
    repo_file(&format!("deploy/prometheus/{rel}"))
}

/// The exporter binary: `LEASE_EXPORTER`, or `prometheus-redis-exporter`
/// on the PATH.
fn exporter_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("LEASE_EXPORTER") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus-redis-exporter"))
            .find(|p| p.is_file())
    })
}

/// A running exporter, killed (SIGKILL through libc) on drop.
struct Exporter {
    port: u16,
    child: Child,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        signal_pid(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Exporter {
    fn start(binary: &Path, redis_port: u16) -> Exporter {
        let port = free_port();
        let child = Command::new(binary)
            .arg("-redis.addr")
            .arg(format!("redis://127.0.0.1:{redis_port}"))
            .arg("-web.listen-address")
            .arg(format!("127.0.0.1:{port}"))
            .arg("-script")
            .arg(deploy_file("lease.lua"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the exporter");
        Exporter { port, child }
    }

    /// One scrape of /metrics: the body, or `None` while it does not answer.
    fn scrape(&self) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.starts_with("HTTP/1.0 200").then_some(body)
    }
}

/// `redis_script_values{key="<key>"} <value>` lines: key -> value.
fn script_values(metrics: &str) -> HashMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("redis_script_values{key=\"")?;
            let (key, value) = rest.split_once("\"} ")?;
            Some((key.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

every_server! {
    fn the_exporter_script_exports_every_numeric_lease_field(kind) {
        let Some(binary) = exporter_binary() else {
            eprintln!(
                "skipped: prometheus-redis-exporter is not installed (make test installs the Debian package; or set LEASE_EXPORTER)"
            );
            return;
        };
        let s = Server::start(kind);
        let mut c = s.conn();
        // Some traffic, so that the counters are not all zero.
        let t = acquire(&mut c, "job:1", "a", "30000");
        assert_eq!(ok(&mut c, &["LEASE.ACQUIRE", "job:1", "b", "30000"]), Value::Nil);
        assert_eq!(ok(&mut c, &["LEASE.RENEW", "job:1", "b", "30000"]), Value::Int(0));
        assert_eq!(ok(&mut c, &["LEASE.FENCE", "job:1", &t.to_string()]), Value::Okay);
        err(&mut c, &["LEASE.FENCE", "job:1", &(t - 1).to_string()]);

        let exporter = Exporter::start(&binary, s.port);
        let mut values = HashMap::new();
        assert!(
            wait_until(Duration::from_secs(15), || {
                values = exporter.scrape().map(|m| script_values(&m)).unwrap_or_default();
                !values.is_empty()
            }),
            "{kind:?}: the exporter never served lease metrics"
        );
        let metrics = exporter.scrape().expect("a second scrape");
        assert!(metrics.lines().any(|l| l == "redis_up 1"), "{kind:?}: redis_up is not 1");

        // Every numeric INFO lease field, with the value INFO gives now
        // (nothing changed since the scrape).
        let info = ok_text(&mut c, &["INFO", "lease"]);
        let mut numeric = 0;
        for line in info.lines() {
            let Some((name, value)) = line.trim().split_once(':') else { continue };
            // Plain decimal digits, as the script reads them: the commit
            // is text even when it looks like a number (27e630641090).
            let decimal = |v: &str| {
                let v = v.strip_prefix('-').unwrap_or(v);
                let (int, frac) = v.split_once('.').unwrap_or((v, ""));
                !int.is_empty() && int.bytes().all(|b| b.is_ascii_digit()) && frac.bytes().all(|b| b.is_ascii_digit())
            };
            if name == "lease_git_commit" || !decimal(value) {
                continue;
            }
            let Ok(v) = value.parse::<f64>() else { continue };
            numeric += 1;
            assert_eq!(
                values.get(name),
                Some(&v),
                "{kind:?}: {name} is {v} in INFO lease, the exporter says {:?}",
                values.get(name)
            );
        }
        assert!(numeric >= 20, "{kind:?}: only {numeric} numeric fields in INFO lease");
        assert_eq!(values.len(), numeric + 1, "{kind:?}: the fields and the grace reason: {values:?}");
        assert_eq!(values.get("lease_grace_reason_none"), Some(&1.0));
        for (field, expected) in [
            ("lease_acquired", 1.0),
            ("lease_contended", 1.0),
            ("lease_renew_failed", 1.0),
            ("lease_fence_ok", 1.0),
            ("lease_fence_stale", 1.0),
        ] {
            assert_eq!(values.get(field), Some(&expected), "{kind:?}: {field}");
        }

        // Every metric the alerts use is one the script exports.
        let alerts = std::fs::read_to_string(deploy_file("alerts.yml")).unwrap();
        let keys: Vec<&str> = alerts
            .split("key=\"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap())
            .collect();
        assert!(keys.len() >= 6, "alerts.yml names {keys:?}");
        for key in keys {
            assert!(values.contains_key(key), "alerts.yml uses {key}, which the script does not export");
        }
    }
}
