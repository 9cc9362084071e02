//! The test matrix: `full_suite!` and `every_server!` turn one test body
//! into one test per server binary.

/// Defines one test per server that runs the full suite: `full_suite! { fn
/// name(kind) { ... } }` makes `name::redis` (Redis 7.0), `name::valkey`
/// (Valkey 8.1), `name::valkey9` (Valkey 9.1) and `name::redis82` (Redis
/// 8.2), each running the body with `kind` set to its `Kind`. Doc comments
/// and attributes before `fn` go on the test's module.
#[macro_export]
macro_rules! full_suite {
    ($($(#[$meta:meta])* fn $name:ident($kind:ident) $body:block)*) => {
        $(
            $(#[$meta])*
            mod $name {
                #[allow(unused_imports)]
                use super::*;
                fn run($kind: $crate::common::Kind) $body
                #[test]
                fn redis() { run($crate::common::Kind::Redis) }
                #[test]
                fn valkey() { run($crate::common::Kind::Valkey) }
                #[test]
                fn valkey9() { run($crate::common::Kind::Valkey9) }
                #[test]
                fn redis82() { run($crate::common::Kind::Redis82) }
            }
        )*
    };
}

/// One test per server of the matrix: `full_suite!` plus Redis 7.4 and 8.0
/// (`name::redis74`, `name::redis80`), which run only these tests (the
/// compatibility subset, chosen so that together they exercise every
/// command, mode, option, persistence path and replication).
#[macro_export]
macro_rules! every_server {
    ($($(#[$meta:meta])* fn $name:ident($kind:ident) $body:block)*) => {
        $(
            $(#[$meta])*
            mod $name {
                #[allow(unused_imports)]
                use super::*;
                fn run($kind: $crate::common::Kind) $body
                #[test]
                fn redis() { run($crate::common::Kind::Redis) }
                #[test]
                fn valkey() { run($crate::common::Kind::Valkey) }
                #[test]
                fn valkey9() { run($crate::common::Kind::Valkey9) }
                #[test]
                fn redis82() { run($crate::common::Kind::Redis82) }
                #[test]
                fn redis74() { run($crate::common::Kind::Redis74) }
                #[test]
                fn redis80() { run($crate::common::Kind::Redis80) }
            }
        )*
    };
}
