//! The build's version and commit (a leaf: it imports nothing).

/// Cargo.toml's version, and the same as `MODULE LIST` shows it (see build.rs).
pub const VERSION: &str = env!("LEASE_VERSION");
pub const VERSION_NUM: i32 = parse_num(env!("LEASE_VERSION_NUM"));
/// The git commit the module was built from (`unknown` outside a checkout).
pub const GIT_COMMIT: &str = env!("LEASE_GIT_COMMIT");

const fn parse_num(s: &str) -> i32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        n = n * 10 + (b[i] - b'0') as i32;
        i += 1;
    }
    n
}
