//! Every environment variable of the bench client, in one table: name,
//! default, minimum and meaning. [`Knobs::from_env`] reads them once, at
//! start; a value that is not a whole number, or is below its minimum,
//! stops the run with a message that names the knob. bench/README.md
//! ("Knobs") lists the same table beside run.sh's own knobs.

use crate::resp::Res;

/// One row of the table, for the usage message.
pub struct Knob {
    pub name: &'static str,
    pub default: &'static str,
    /// The smallest value allowed (0 for any; none for a text knob).
    pub min: u64,
    pub meaning: &'static str,
}

/// Declares the table: `Knobs` (one field per knob), `TABLE` (the rows)
/// and `Knobs::read_env`.
macro_rules! knobs {
    (
        numbers { $( $field:ident = $name:literal, $default:literal, min $min:literal: $meaning:literal; )* }
        texts { $( $tfield:ident = $tname:literal: $tmeaning:literal; )* }
    ) => {
        /// The knobs' values for this run.
        pub struct Knobs {
            $( #[doc = $meaning] pub $field: u64, )*
            $( #[doc = $tmeaning] pub $tfield: Option<String>, )*
        }

        /// Every knob, in the order of the table.
        pub const TABLE: &[Knob] = &[
            $( Knob { name: $name, default: stringify!($default), min: $min, meaning: $meaning }, )*
            $( Knob { name: $tname, default: "unset", min: 0, meaning: $tmeaning }, )*
        ];

        impl Knobs {
            fn read_env() -> Res<Knobs> {
                Ok(Knobs {
                    $( $field: number($name, $default, $min, $meaning)?, )*
                    $( $tfield: std::env::var($tname).ok(), )*
                })
            }
        }
    };
}

knobs! {
    numbers {
        // I: the Rust helpers' cycles.
        helper_cycle_ms = "HELPER_CYCLE_MS", 2000, min 1:
            "I: each run of the Rust helper cycle bench, ms";
        helper_cycle_reps = "HELPER_CYCLE_REPS", 3, min 1:
            "I: interleaved runs of each kind in the Rust helper cycle bench";
        // B1, B2: hand-off latency.
        handoff_rounds = "HANDOFF_ROUNDS", 500, min 0:
            "B1: release hand-offs per kind of waiter (except the 100 ms poller)";
        handoff_rounds_poll100 = "HANDOFF_ROUNDS_POLL100", 200, min 0:
            "B1: release hand-offs of the waiter that polls every 100 ms";
        expiry_rounds = "EXPIRY_ROUNDS", 100, min 0:
            "B2: expiry hand-offs per kind of waiter";
        expiry_ttl_ms = "EXPIRY_TTL_MS", 50, min 1:
            "B2: the ttl of the lock that is left to expire, ms";
        // B3, B4: crowds of blocked clients.
        herd = "HERD", 1000, min 1:
            "B3: clients blocked on one key";
        cpu_window_ms = "CPU_WINDOW_MS", 2000, min 0:
            "B3, B4: how long one reading of the server's CPU lasts, ms";
        herd_settle_ms = "HERD_SETTLE_MS", 6000, min 0:
            "B3, B4: the wait before each steady-state memory reading, ms";
        mass_n = "MASS_N", 10000, min 0:
            "B4: clients of the mass timeout (at most maxclients - 100); 0 skips B4";
        mass_timeout_ms = "MASS_TIMEOUT_MS", 7000, min 1:
            "B4: their common BLOCK timeout, ms; above HERD_SETTLE_MS + 700, so that memory is read while they wait";
        mass_keys = "MASS_KEYS", 100, min 0:
            "B4: the keys of the spread column; 0 skips that column";
        mass_blpop = "MASS_BLPOP", 1, min 0:
            "B4: 0 skips the BLPOP reference column";
        mass_batch = "MASS_BATCH", 100, min 1:
            "B4: commands sent before waiting for the server to count them blocked";
        clk_tck = "CLK_TCK", 100, min 1:
            "B3, B4: clock ticks per second of /proc/<pid>/stat (run.sh passes `getconf CLK_TCK`)";
        // C: full lock cycles.
        cycle_clients = "CYCLE_CLIENTS", 16, min 1:
            "C: client threads, each with its own connection and lock key";
        cycle_reps = "CYCLE_REPS", 3, min 1:
            "C: runs of each kind of cycle, interleaved (the median run is shown)";
        cycle_ms = "CYCLE_MS", 2000, min 100:
            "C: the counted window of one run, ms";
        cycle_warm_ms = "CYCLE_WARM_MS", 300, min 0:
            "C: the warm-up before the counted window, ms";
        // E: the helpers holding many leases.
        helper_leases = "HELPER_LEASES", 10000, min 1:
            "F: leases one process holds through each helper";
        helper_ttl_ms = "HELPER_TTL_MS", 3000, min 30:
            "F: their ttl, ms (the watchdog renews at a third of it)";
        helper_hold_ms = "HELPER_HOLD_MS", 6000, min 100:
            "F: the counted window while they are held, ms";
        helper_refused = "HELPER_REFUSED", 100, min 1:
            "F: leases deleted on the server to time the loss signal";
        // H: multi-key lease cycles.
        multikey_ms = "MULTIKEY_MS", 2000, min 100:
            "H: the counted window of one run, ms";
        multikey_reps = "MULTIKEY_REPS", 3, min 1:
            "H: runs of every (k, kind), interleaved (medians shown)";
        multikey_warm_ms = "MULTIKEY_WARM_MS", 300, min 0:
            "H: the warm-up before the counted window, ms";
    }
    texts {
        handoff_only = "HANDOFF_ONLY":
            "part B: only these sections, a list such as `B4` or `B1,B3` (unset: all four)";
        handoff_kv = "HANDOFF_KV":
            "a file to append `name value` lines to (B2's p50s, C's rates) for run.sh's summary";
    }
}

/// The sections HANDOFF_ONLY may name.
const SECTIONS: [&str; 4] = ["B1", "B2", "B3", "B4"];

impl Knobs {
    /// Reads and checks every knob.
    pub fn from_env() -> Res<Knobs> {
        let knobs = Knobs::read_env()?;
        if let Some(only) = &knobs.handoff_only {
            for s in only.split(',') {
                if !SECTIONS.iter().any(|k| s.trim().eq_ignore_ascii_case(k)) {
                    return Err(
                        format!("HANDOFF_ONLY={only}: {s:?} is not one of B1, B2, B3, B4").into(),
                    );
                }
            }
        }
        Ok(knobs)
    }

    /// Whether part B's `section` (B1 .. B4) runs.
    pub fn runs(&self, section: &str) -> bool {
        self.handoff_only.as_deref().is_none_or(|only| {
            only.split(',')
                .any(|s| s.trim().eq_ignore_ascii_case(section))
        })
    }
}

/// The knob `name` as a whole number: `default` when unset.
fn number(name: &str, default: u64, min: u64, meaning: &str) -> Res<u64> {
    let Ok(raw) = std::env::var(name) else {
        return Ok(default);
    };
    let value: u64 = raw.trim().parse().map_err(|_| {
        format!("{name}={raw}: not a whole number ({name}: {meaning}; default {default})")
    })?;
    if value < min {
        return Err(format!("{name}={raw}: below its minimum {min} ({name}: {meaning})").into());
    }
    Ok(value)
}

/// The table, as the usage message shows it.
pub fn describe() -> String {
    TABLE
        .iter()
        .map(|k| {
            let at_least = match k.min {
                0 => String::new(),
                min => format!(", at least {min}"),
            };
            format!("  {:<24} [{}{at_least}] {}\n", k.name, k.default, k.meaning)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_has_a_row_and_a_distinct_name() {
        let mut names: Vec<_> = TABLE.iter().map(|k| k.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
        assert_eq!(TABLE.len(), 28);
    }

    #[test]
    fn unset_knobs_take_their_defaults() {
        let d = number("REDIS_LEASE_BENCH_TEST_UNSET_KNOB", 7, 1, "test").unwrap();
        assert_eq!(d, 7);
    }
}
