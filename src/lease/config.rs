//! Module settings and the parsing of `loadmodule` arguments (SPEC S6).

use super::args::{MAX_MS, parse_i64, printable};

/// Default `max-ttl-ms`: 30 days.
pub const DEFAULT_MAX_TTL_MS: i64 = 30 * 24 * 3600 * 1000;
/// Bounds of `max-ttl-ms`.
pub const MIN_MAX_TTL_MS: i64 = 1;
pub const MAX_MAX_TTL_MS: i64 = MAX_MS;

/// The settings given at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub max_ttl_ms: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_ttl_ms: DEFAULT_MAX_TTL_MS,
        }
    }
}

/// Parses `loadmodule path [name value ...]`. Names may carry the `lease.`
/// prefix used by CONFIG SET. Unknown, repeated, valueless or invalid
/// arguments are refused with a message for the server log.
pub fn parse_module_args(args: &[&[u8]]) -> Result<Settings, String> {
    let mut settings = Settings::default();
    let mut seen_max_ttl = false;
    let mut i = 0;
    while i < args.len() {
        let raw = args[i];
        let name = raw.strip_prefix(b"lease.").unwrap_or(raw);
        if name.eq_ignore_ascii_case(b"max-ttl-ms") {
            if seen_max_ttl {
                return Err("module argument max-ttl-ms given more than once".into());
            }
            seen_max_ttl = true;
            let value = args
                .get(i + 1)
                .ok_or("module argument max-ttl-ms needs a value")?;
            settings.max_ttl_ms = parse_i64(value)
                .filter(|v| (MIN_MAX_TTL_MS..=MAX_MAX_TTL_MS).contains(v))
                .ok_or_else(|| {
                    format!(
                        "module argument max-ttl-ms must be an integer in {MIN_MAX_TTL_MS}..{MAX_MAX_TTL_MS}, got '{}'",
                        printable(value)
                    )
                })?;
            i += 2;
        } else {
            return Err(format!(
                "unknown module argument '{}' (known: max-ttl-ms)",
                printable(raw)
            ));
        }
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_values() {
        assert_eq!(parse_module_args(&[]), Ok(Settings::default()));
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
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        assert!(
            parse_module_args(&[b"bogus", b"1"])
                .unwrap_err()
                .contains("unknown")
        );
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
    }
}
