//! The `name value` lines for run.sh's summary tables (HANDOFF_KV).

use std::fmt::Display;
use std::io::Write;

/// Appends `name value` lines to the HANDOFF_KV file, if one is named.
pub struct KvFile(Option<String>);

impl KvFile {
    pub fn new(path: Option<&str>) -> KvFile {
        KvFile(path.map(str::to_string))
    }

    /// Appends one line (a failed write is reported, not fatal).
    pub fn put(&self, name: &str, value: impl Display) {
        let Some(path) = &self.0 else { return };
        let line = format!("{name} {value}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("HANDOFF_KV {path}: {e}");
        }
    }
}
