//! Module settings and the parsing of `loadmodule` arguments (SPEC S6, S7).

use super::args::parse_i64;
use super::error::printable;
use super::limits::MAX_MS;

/// Default `max-ttl-ms`: one minute (S7: the grace after a failover must
/// outlast the longest lease that could have been lost; long leases are
/// renewed, not granted long).
pub const DEFAULT_MAX_TTL_MS: i64 = 60_000;
/// Bounds of `max-ttl-ms`.
pub const MIN_MAX_TTL_MS: i64 = 1;
pub const MAX_MAX_TTL_MS: i64 = MAX_MS;
/// Default `grace-ms`: -1, "equal to max-ttl-ms".
pub const DEFAULT_GRACE_MS: i64 = -1;
/// Bounds of `grace-ms` (-1: as max-ttl-ms, 0: off).
pub const MIN_GRACE_MS: i64 = -1;
pub const MAX_GRACE_MS: i64 = MAX_MS;

/// The settings given at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub max_ttl_ms: i64,
    pub grace_ms: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_ttl_ms: DEFAULT_MAX_TTL_MS,
            grace_ms: DEFAULT_GRACE_MS,
        }
    }
}

/// One integer setting: its name, bounds and where it goes.
struct Known {
    name: &'static str,
    min: i64,
    max: i64,
    set: fn(&mut Settings, i64),
}

const KNOWN: [Known; 2] = [
    Known {
        name: "max-ttl-ms",
        min: MIN_MAX_TTL_MS,
        max: MAX_MAX_TTL_MS,
        set: |s, v| s.max_ttl_ms = v,
    },
    Known {
        name: "grace-ms",
        min: MIN_GRACE_MS,
        max: MAX_GRACE_MS,
        set: |s, v| s.grace_ms = v,
    },
];

/// Parses `loadmodule path [name value ...]`. Names may carry the `lease.`
/// prefix used by CONFIG SET. Unknown, repeated, valueless or invalid
/// arguments are refused with a message for the server log.
pub fn parse_module_args(args: &[&[u8]]) -> Result<Settings, String> {
    let mut settings = Settings::default();
    let mut seen = [false; KNOWN.len()];
    let mut i = 0;
    while i < args.len() {
        let raw = args[i];
        let name = raw.strip_prefix(b"lease.").unwrap_or(raw);
        let Some(at) = KNOWN
            .iter()
            .position(|k| name.eq_ignore_ascii_case(k.name.as_bytes()))
        else {
            let names: Vec<&str> = KNOWN.iter().map(|k| k.name).collect();
            return Err(format!(
                "unknown module argument '{}' (known: {})",
                printable(raw),
                names.join(", ")
            ));
        };
        let k = &KNOWN[at];
        if std::mem::replace(&mut seen[at], true) {
            return Err(format!("module argument {} given more than once", k.name));
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| format!("module argument {} needs a value", k.name))?;
        let v = parse_i64(value)
            .filter(|v| (k.min..=k.max).contains(v))
            .ok_or_else(|| {
                format!(
                    "module argument {} must be an integer in {}..{}, got '{}'",
                    k.name,
                    k.min,
                    k.max,
                    printable(value)
                )
            })?;
        (k.set)(&mut settings, v);
        i += 2;
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_values() {
        assert_eq!(parse_module_args(&[]), Ok(Settings::default()));
        assert_eq!(Settings::default().max_ttl_ms, 60_000);
        assert_eq!(Settings::default().grace_ms, -1);
        assert_eq!(
            parse_module_args(&[b"max-ttl-ms", b"5000"])
                .unwrap()
                .max_ttl_ms,
            5000
        );
        assert_eq!(
            parse_module_args(&[b"lease.max-ttl-ms", b"7"])
                .unwrap()
                .max_ttl_ms,
            7
        );
        let s = parse_module_args(&[b"grace-ms", b"0", b"MAX-TTL-MS", b"9"]).unwrap();
        assert_eq!((s.grace_ms, s.max_ttl_ms), (0, 9));
        assert_eq!(
            parse_module_args(&[b"lease.grace-ms", b"-1"])
                .unwrap()
                .grace_ms,
            -1
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        let e = parse_module_args(&[b"bogus", b"1"]).unwrap_err();
        assert!(e.contains("unknown") && e.contains("grace-ms"), "{e}");
        assert!(
            parse_module_args(&[b"max-ttl-ms"])
                .unwrap_err()
                .contains("needs a value")
        );
        assert!(
            parse_module_args(&[b"max-ttl-ms", b"0"])
                .unwrap_err()
                .contains("max-ttl-ms")
        );
        assert!(parse_module_args(&[b"max-ttl-ms", b"ten"]).is_err());
        assert!(
            parse_module_args(&[b"max-ttl-ms", b"1", b"max-ttl-ms", b"2"])
                .unwrap_err()
                .contains("more than once")
        );
        let e = parse_module_args(&[b"grace-ms", b"-2"]).unwrap_err();
        assert!(e.contains("grace-ms") && e.contains("-1.."), "{e}");
        assert!(parse_module_args(&[b"grace-ms", b"1.5"]).is_err());
    }
}
