//! A server's wall clock shifted while it runs (a clock step), through the
//! LD_PRELOAD shim of tests/shim/clockshift.c.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::server::{manifest_dir, scratch_dir};

/// A shift of a server's wall clock, changed while it runs (a clock step):
/// the server is started with the shim of tests/shim/clockshift.c preloaded,
/// which reads the shift from this file on every clock read. The monotonic
/// clock is left alone.
pub struct ClockShift {
    pub(super) path: PathBuf,
}

impl ClockShift {
    /// A shift of `ms` milliseconds (negative: behind).
    pub fn new(ms: i64) -> ClockShift {
        let path = scratch_dir().join("clock-shift");
        let shift = ClockShift { path };
        shift.set(ms);
        shift
    }

    /// Steps the clock to `ms` ahead of the real one.
    pub fn set(&self, ms: i64) {
        use std::io::{Seek, Write};
        // Written in place (the server maps the file), 8 bytes.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
            .expect("clock shift file");
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(&ms.to_le_bytes())
            .expect("write the clock shift");
    }
}

/// The clock shim (tests/shim/clockshift.c), compiled once with the
/// machine's C compiler into target/.
pub(super) fn clock_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| compiled_shim("clockshift")).clone()
}

/// `tests/shim/<name>.c` compiled with the machine's C compiler into
/// `target/<name>.so` (again only when the source is newer).
pub fn compiled_shim(name: &str) -> PathBuf {
    // One compile at a time in this process (tests run on threads).
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let src = manifest_dir().join(format!("tests/shim/{name}.c"));
    let out = manifest_dir().join(format!("target/{name}.so"));
    let fresh = |p: &Path| {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((m(p), m(&src)), (Some(a), Some(b)) if a >= b)
    };
    if !fresh(&out) {
        // Each test process compiles to its own file, then renames it in
        // place: several may do this at once.
        let tmp = out.with_extension(format!("{}.so", std::process::id()));
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&tmp)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("cc (the C compiler) to build tests/shim/{name}.c: {e}"));
        assert!(status.success(), "building tests/shim/{name}.c failed");
        std::fs::rename(&tmp, &out).unwrap_or_else(|e| panic!("target/{name}.so: {e}"));
    }
    out
}
