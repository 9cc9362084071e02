//! The module's settings, as one table (design.md S6, S7): each row is a
//! setting's name, default, bounds and meaning. The `loadmodule` argument
//! parser below, the binding's CONFIG registration and `INFO lease`, and the
//! configuration page of the docs (checked by a test) all read it; adding a
//! setting is one row here (what a change of it does is an `OnChange`, which
//! the binding carries out in `module/grace.rs`).

use super::args::parse_i64;
use super::error::printable;
use super::limits::MAX_MS;

/// One integer setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Its name: a `loadmodule` argument, and `lease.<name>` for CONFIG.
    pub name: &'static str,
    pub default: i64,
    pub min: i64,
    pub max: i64,
    /// What it means, for the docs.
    pub doc: &'static str,
    /// What a change of it at run time does.
    pub on_change: OnChange,
}

/// What the binding does when a setting changes at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChange {
    /// A running grace period is re-timed to the new length (and a grace
    /// set shorter than its rule is warned about).
    RetimeGrace,
}

/// Declares `Name` (one variant per setting, `Name::ALL` in table order)
/// and `SETTINGS` (the rows) from one table: nothing is kept beside it.
macro_rules! settings {
    ($($(#[doc = $doc:literal])* $variant:ident = $row:expr,)*) => {
        /// Which setting (an index into `SETTINGS`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Name {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Name {
            /// Every setting, in the order of `SETTINGS`.
            pub const ALL: &[Name] = &[$(Name::$variant),*];
        }

        /// Every setting.
        pub const SETTINGS: [Setting; [$(Name::$variant),*].len()] = [$($row),*];
    };
}

settings! {
    /// Default one minute (design.md S7: the grace after a failover must
    /// outlast the longest lease that could have been lost; long leases are
    /// renewed, not granted long).
    MaxTtlMs = Setting {
        name: "max-ttl-ms",
        default: 60_000,
        min: 1,
        max: MAX_MS,
        doc: "the longest ttl-ms an acquire or renew may ask for",
        on_change: OnChange::RetimeGrace,
    },
    GraceMs = Setting {
        name: "grace-ms",
        default: -1,
        min: -1,
        max: MAX_MS,
        doc: "the grace period after a promotion or a start on possibly older data: -1 is max-ttl-ms, plus min-replicas-max-lag + 2 s when min-replicas-to-write is set; 0 turns it off",
        on_change: OnChange::RetimeGrace,
    },
}

impl Name {
    pub fn setting(self) -> &'static Setting {
        &SETTINGS[self as usize]
    }
}

/// The settings given at load time, one value per row of `SETTINGS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub values: [i64; SETTINGS.len()],
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            values: SETTINGS.map(|s| s.default),
        }
    }
}

impl Settings {
    pub fn get(&self, name: Name) -> i64 {
        self.values[name as usize]
    }
}

/// Parses `loadmodule path [name value ...]`. Names may carry the `lease.`
/// prefix used by CONFIG SET. Unknown, repeated, valueless or invalid
/// arguments are refused with a message for the server log.
pub fn parse_module_args(args: &[&[u8]]) -> Result<Settings, String> {
    let mut settings = Settings::default();
    let mut seen = [false; SETTINGS.len()];
    let mut i = 0;
    while i < args.len() {
        let raw = args[i];
        let name = raw.strip_prefix(b"lease.").unwrap_or(raw);
        let Some(at) = SETTINGS
            .iter()
            .position(|k| name.eq_ignore_ascii_case(k.name.as_bytes()))
        else {
            let names: Vec<&str> = SETTINGS.iter().map(|k| k.name).collect();
            return Err(format!(
                "unknown module argument '{}' (known: {})",
                printable(raw),
                names.join(", ")
            ));
        };
        let k = &SETTINGS[at];
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
        settings.values[at] = v;
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
        assert_eq!(Settings::default().get(Name::MaxTtlMs), 60_000);
        assert_eq!(Settings::default().get(Name::GraceMs), -1);
        assert_eq!(
            parse_module_args(&[b"max-ttl-ms", b"5000"])
                .unwrap()
                .get(Name::MaxTtlMs),
            5000
        );
        assert_eq!(
            parse_module_args(&[b"lease.max-ttl-ms", b"7"])
                .unwrap()
                .get(Name::MaxTtlMs),
            7
        );
        let s = parse_module_args(&[b"grace-ms", b"0", b"MAX-TTL-MS", b"9"]).unwrap();
        assert_eq!((s.get(Name::GraceMs), s.get(Name::MaxTtlMs)), (0, 9));
        assert_eq!(
            parse_module_args(&[b"lease.grace-ms", b"-1"])
                .unwrap()
                .get(Name::GraceMs),
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
