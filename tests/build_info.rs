//! What the module says about its build (build.rs): `MODULE LIST` reports
//! Cargo.toml's version as a number, and `INFO lease` and the load log line
//! show the version and the git commit it was built from.
mod common;
use common::*;

/// Cargo.toml's version as `MODULE LIST` shows it: major*10000+minor*100+patch.
fn version_number() -> i64 {
    let v: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split(['-', '+'])
        .next()
        .unwrap()
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    v[0] * 10_000 + v[1] * 100 + v[2]
}

/// The commit build.rs read: 12 hex digits, or `unknown` outside git.
fn built_commit() -> &'static str {
    let c = env!("LEASE_GIT_COMMIT");
    assert!(
        c == "unknown" || (c.len() == 12 && c.chars().all(|x| x.is_ascii_hexdigit())),
        "{c}"
    );
    c
}

fn module_list_version(c: &mut redis::Connection) -> i64 {
    let Value::Array(mods) = ok(c, &["MODULE", "LIST"]) else {
        panic!("MODULE LIST is not an array")
    };
    for m in mods {
        let name = field(&m, "name").map(|v| strings(&Value::Array(vec![v]))[0].clone());
        if name.as_deref() == Some("lease") {
            return int(&field(&m, "ver").expect("ver"));
        }
    }
    panic!("the lease module is not in MODULE LIST")
}

full_suite! {
    fn module_list_info_and_log_show_the_build(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        assert_eq!(module_list_version(&mut c), version_number());
        assert_eq!(
            info_field(&mut c, "lease_version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(info_field(&mut c, "lease_git_commit").as_deref(), Some(built_commit()));
        let line = format!(
            "lease module {} (commit {}) loaded",
            env!("CARGO_PKG_VERSION"),
            built_commit()
        );
        assert!(s.log().contains(&line), "no '{line}' in the log:\n{}", s.log());
    }
}
