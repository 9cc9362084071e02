//! Stamps the module with what it was built from:
//! - `LEASE_VERSION` (Cargo.toml's version) and `LEASE_VERSION_NUM`, the same
//!   version as the integer `MODULE LIST` shows (major * 10000 + minor * 100
//!   + patch: 1.2.3 is 10203);
//! - `LEASE_GIT_COMMIT`, the commit of the checkout (`unknown` outside a git
//!   checkout).
//!
//! The module is rebuilt when the commit changes (HEAD moves, or the branch
//! it names gets a new commit) and for nothing else that this script reads.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// `major.minor.patch[-pre]` as major * 10000 + minor * 100 + patch.
fn version_number(version: &str) -> u32 {
    let core = version.split(['-', '+']).next().unwrap_or("0.0.0");
    let mut parts = core.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    major * 10_000 + minor.min(99) * 100 + patch.min(99)
}

fn main() {
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_else(|_| "0.0.0".into());
    println!("cargo:rustc-env=LEASE_VERSION={version}");
    println!(
        "cargo:rustc-env=LEASE_VERSION_NUM={}",
        version_number(&version)
    );

    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let commit =
        git(&dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LEASE_GIT_COMMIT={commit}");

    // What decides the commit: HEAD, the branch ref it points to (loose or
    // packed). Naming them means nothing else reruns this script.
    println!("cargo:rerun-if-changed=build.rs");
    let Some(git_dir) = git(&dir, &["rev-parse", "--absolute-git-dir"]) else {
        return;
    };
    let git_dir = PathBuf::from(git_dir);
    let common = git(&dir, &["rev-parse", "--git-common-dir"])
        .map(|c| {
            let p = PathBuf::from(c);
            if p.is_absolute() { p } else { dir.join(p) }
        })
        .unwrap_or_else(|| git_dir.clone());
    // Only files that exist: cargo treats a missing one as always changed.
    // A branch whose loose ref is packed away deletes the loose file, which
    // counts as a change.
    let mut watch = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(common.join(branch));
    }
    for path in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
