//! Parsing of every argument kind, in one place. Each parser names the
//! argument it refuses, so every error tells the client what is wrong.

use super::error::{LeaseError, printable};
use super::limits::{MAX_KEYS, MAX_LIMIT, MAX_MS, MAX_TOKEN, MIN_LIMIT, label_ok, owner_ok};
use super::mode::{HoldersMode, Mode};

/// Parses an integer the way Redis does (`string2ll`): optional `-`, digits,
/// no `+`, no spaces, no leading zeros, no `-0`.
pub fn parse_i64(arg: &[u8]) -> Option<i64> {
    let (negative, digits) = match arg.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, arg),
    };
    match digits {
        [] => return None,
        [b'0'] if negative => return None,
        [b'0', _, ..] => return None,
        _ => {}
    }
    // Up to 18 digits cannot overflow: eight digits at a time, then one by
    // one.
    if digits.len() <= 18 {
        let mut n: i64 = 0;
        let mut rest = digits;
        while let Some((chunk, tail)) = rest.split_first_chunk::<8>() {
            n = n * 100_000_000 + eight_digits(*chunk)? as i64;
            rest = tail;
        }
        for &d in rest {
            let v = d.wrapping_sub(b'0');
            if v > 9 {
                return None;
            }
            n = n * 10 + i64::from(v);
        }
        return Some(if negative { -n } else { n });
    }
    // Longer: accumulated as a negative number so that i64::MIN fits, every
    // step checked, so an overflow is a refusal.
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative { Some(n) } else { n.checked_neg() }
}

/// Eight ASCII digits as a number (the first one the most significant), or
/// `None` when any byte is not a digit: the bytes as one little-endian word,
/// checked and combined in a few word operations.
fn eight_digits(chunk: [u8; 8]) -> Option<u64> {
    let v = u64::from_le_bytes(chunk);
    // Each byte is 0x30..=0x39: its high nibble is 3, and adding 6 to it
    // does not carry into the high nibble.
    let high = v & 0xF0F0_F0F0_F0F0_F0F0;
    let carried = (v.wrapping_add(0x0606_0606_0606_0606) & 0xF0F0_F0F0_F0F0_F0F0) >> 4;
    if high | carried != 0x3333_3333_3333_3333 {
        return None;
    }
    let v = v - 0x3030_3030_3030_3030;
    // Pairs of digits, then pairs of pairs, then the two halves.
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    let v = ((v & 0x0000_00FF_0000_00FF)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32))))
        >> 32;
    Some(v)
}

fn parse_in_range(arg: &[u8], what: &'static str, min: i64, max: i64) -> Result<i64, LeaseError> {
    // Not `ok_or`: on every call it would build the error, then drop it.
    let Some(n) = parse_i64(arg) else {
        return Err(LeaseError::NotInteger(what));
    };
    if n < min || n > max {
        return Err(LeaseError::OutOfRange { what, min, max });
    }
    Ok(n)
}

/// An owner id: 1..=256 arbitrary bytes.
pub fn check_owner(owner: &[u8]) -> Result<&[u8], LeaseError> {
    match owner.len() {
        _ if owner_ok(owner) => Ok(owner),
        0 => Err(LeaseError::OwnerEmpty),
        n => Err(LeaseError::OwnerTooLong(n)),
    }
}

/// A `LABEL` (design.md S11): 1..=256 arbitrary bytes.
pub fn check_label(label: &[u8]) -> Result<&[u8], LeaseError> {
    match label.len() {
        _ if label_ok(label) => Ok(label),
        0 => Err(LeaseError::LabelEmpty),
        n => Err(LeaseError::LabelTooLong(n)),
    }
}

/// `ttl-ms`: 1..=max_ttl_ms (the `lease.max-ttl-ms` setting).
pub fn parse_ttl(arg: &[u8], max_ttl_ms: i64) -> Result<i64, LeaseError> {
    parse_in_range(arg, "ttl-ms", 1, max_ttl_ms)
}

/// A fencing token: 1..=2^53-1.
pub fn parse_token(arg: &[u8]) -> Result<u64, LeaseError> {
    parse_in_range(arg, "token", 1, MAX_TOKEN as i64).map(|t| t as u64)
}

/// `BLOCK timeout-ms`: 0 (wait forever) ..= MAX_MS.
pub fn parse_timeout(arg: &[u8]) -> Result<i64, LeaseError> {
    parse_in_range(arg, "timeout-ms", 0, MAX_MS)
}

/// An absolute unix time in ms, as carried by replication and the AOF.
pub fn parse_unix_ms(arg: &[u8], what: &'static str) -> Result<i64, LeaseError> {
    parse_in_range(arg, what, 1, i64::MAX / 2)
}

/// `LIMIT n`: 2..=100000 (`LIMIT 1` is an exclusive lease, written
/// without `LIMIT`).
pub fn parse_limit(arg: &[u8]) -> Result<u32, LeaseError> {
    let Some(n) = parse_i64(arg) else {
        return Err(LeaseError::NotInteger("LIMIT"));
    };
    if n == 1 {
        return Err(LeaseError::LimitOne);
    }
    parse_in_range(arg, "LIMIT", MIN_LIMIT as i64, MAX_LIMIT as i64).map(|n| n as u32)
}

/// The options after `LEASE.ACQUIRE key owner ttl-ms`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AcquireOptions<'a> {
    /// `BLOCK timeout-ms`: `Some(0)` waits forever.
    pub block_ms: Option<i64>,
    /// `LIMIT n`, `SHARED`, or neither (exclusive).
    pub mode: Mode,
    /// `FLOOR token` (design.md S9): the token is at least this. Exclusive
    /// leases only; how far ahead it may be is checked against the clock
    /// where the acquire is decided (`decide::check_floor`).
    pub floor: Option<u64>,
    /// `LABEL text` (design.md S11): the holding's public description.
    pub label: Option<&'a [u8]>,
}

/// The value of the option `name` at `opts[i]`: the word after it, unless
/// the option was `given` before.
#[inline(always)]
fn option_value<'a>(
    n: usize,
    arg: &impl Fn(usize) -> &'a [u8],
    i: usize,
    name: &'static str,
    given: bool,
) -> Result<&'a [u8], LeaseError> {
    if given {
        return Err(LeaseError::RepeatedOption(name));
    }
    if i + 1 < n {
        Ok(arg(i + 1))
    } else {
        Err(LeaseError::MissingValue(name))
    }
}

/// The option names of `LEASE.ACQUIRE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcquireWord {
    Block,
    Limit,
    Shared,
    Floor,
    Label,
}

/// A word of at most 8 bytes as one little-endian number, each byte's
/// 0x20 bit set: for a word of ASCII letters, the same number whatever
/// their case (a byte folds to a letter's lower case only from that
/// letter's upper or lower case).
#[inline(always)]
const fn folded<const N: usize>(word: [u8; N]) -> u64 {
    let mut v = 0u64;
    let mut i = 0;
    while i < N {
        v |= ((word[i] | 0x20) as u64) << (8 * i);
        i += 1;
    }
    v
}

/// Which option of `LEASE.ACQUIRE` `name` is (case-insensitive), in a
/// few word operations: the length, then the folded bytes (two loads)
/// against each name of that length (all of them letters).
#[inline(always)]
fn acquire_word(name: &[u8]) -> Option<AcquireWord> {
    const BLOCK: u64 = folded(*b"block");
    const LIMIT: u64 = folded(*b"limit");
    const FLOOR: u64 = folded(*b"floor");
    const LABEL: u64 = folded(*b"label");
    const SHARED: u64 = folded(*b"shared");
    // The bytes of a name of 5 or 6 bytes: the first four as one load, the
    // rest after them, folded as `folded` does.
    let head = |name: &[u8]| {
        name.first_chunk::<4>()
            .map(|h| u64::from(u32::from_le_bytes(*h)))
    };
    match name.len() {
        5 => {
            let v = (head(name)? | u64::from(name[4]) << 32) | folded([0u8; 5]);
            match v {
                LABEL => Some(AcquireWord::Label),
                BLOCK => Some(AcquireWord::Block),
                LIMIT => Some(AcquireWord::Limit),
                FLOOR => Some(AcquireWord::Floor),
                _ => None,
            }
        }
        6 => {
            let tail = u64::from(u16::from_le_bytes([name[4], name[5]]));
            let v = (head(name)? | tail << 32) | folded([0u8; 6]);
            (v == SHARED).then_some(AcquireWord::Shared)
        }
        _ => None,
    }
}

/// Parses the options of LEASE.ACQUIRE (case-insensitive names, each at
/// most once; `LIMIT` and `SHARED` exclude each other, and `FLOOR` goes
/// with neither).
pub fn parse_acquire_options<'a>(opts: &[&'a [u8]]) -> Result<AcquireOptions<'a>, LeaseError> {
    parse_acquire_options_with(opts.len(), |i| opts[i])
}

/// `parse_acquire_options` of the `n` options `arg(0..n)`, each read
/// when the parse comes to it (a command reads its arguments from the
/// server one by one: no list of them is made first).
#[inline(always)]
pub fn parse_acquire_options_with<'a>(
    n: usize,
    arg: impl Fn(usize) -> &'a [u8],
) -> Result<AcquireOptions<'a>, LeaseError> {
    let mut out = AcquireOptions::default();
    if n == 0 {
        return Ok(out);
    }
    let mut name = arg(0);
    // `LABEL text` alone (the usual options of a labelled acquire): no
    // loop to keep.
    if n == 2 && acquire_word(name) == Some(AcquireWord::Label) {
        out.label = Some(check_label(arg(1))?);
        return Ok(out);
    }
    let mut i = 0;
    loop {
        match acquire_word(name) {
            Some(AcquireWord::Block) => {
                let value = option_value(n, &arg, i, "BLOCK", out.block_ms.is_some())?;
                out.block_ms = Some(parse_timeout(value)?);
                i += 2;
            }
            Some(AcquireWord::Limit) => {
                match out.mode {
                    Mode::Limit(_) => return Err(LeaseError::RepeatedOption("LIMIT")),
                    Mode::Shared => return Err(LeaseError::ExclusiveOptions("LIMIT", "SHARED")),
                    Mode::Exclusive => {}
                }
                let value = option_value(n, &arg, i, "LIMIT", false)?;
                out.mode = Mode::Limit(parse_limit(value)?);
                i += 2;
            }
            Some(AcquireWord::Shared) => {
                match out.mode {
                    Mode::Shared => return Err(LeaseError::RepeatedOption("SHARED")),
                    Mode::Limit(_) => return Err(LeaseError::ExclusiveOptions("LIMIT", "SHARED")),
                    Mode::Exclusive => {}
                }
                out.mode = Mode::Shared;
                i += 1;
            }
            Some(AcquireWord::Floor) => {
                let value = option_value(n, &arg, i, "FLOOR", out.floor.is_some())?;
                out.floor = Some(parse_in_range(value, "FLOOR", 1, MAX_TOKEN as i64)? as u64);
                i += 2;
            }
            Some(AcquireWord::Label) => {
                let value = option_value(n, &arg, i, "LABEL", out.label.is_some())?;
                out.label = Some(check_label(value)?);
                i += 2;
            }
            None => return Err(LeaseError::UnknownOption(printable(name))),
        }
        if i >= n {
            break;
        }
        name = arg(i);
    }
    if out.floor.is_some() && out.mode != Mode::Exclusive {
        return Err(LeaseError::FloorNotExclusive);
    }
    Ok(out)
}

/// How many waiters `LEASE.WAITERS` lists without `COUNT`, and at most.
pub const DEFAULT_WAITERS_COUNT: usize = 10;
pub const MAX_WAITERS_COUNT: usize = 1000;

/// `COUNT count` of `LEASE.WAITERS`: 1..=1000.
pub fn parse_count(word: &[u8], value: &[u8]) -> Result<usize, LeaseError> {
    if !word.eq_ignore_ascii_case(b"COUNT") {
        return Err(LeaseError::UnknownOption(printable(word)));
    }
    Ok(parse_in_range(value, "COUNT", 1, MAX_WAITERS_COUNT as i64)? as usize)
}

/// The arguments of `LEASE.FENCE key token [MINTTL ms] [command [arg ...]]`
/// after the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceArgs {
    pub token: u64,
    /// `MINTTL ms`: refuse when the lease has less than `ms` left.
    pub min_ttl_ms: Option<i64>,
    /// Where the fenced command starts among the arguments after the key
    /// (1, or 3 after `MINTTL ms`); no command when it is their length.
    pub command_at: usize,
}

impl FenceArgs {
    /// `key token` alone: no `MINTTL`, no command.
    pub fn plain(token: u64) -> FenceArgs {
        FenceArgs {
            token,
            min_ttl_ms: None,
            command_at: 1,
        }
    }
}

/// Where the fenced command starts among LEASE.FENCE's arguments after the
/// key: after `MINTTL ms` when the word (any case) follows the token, else
/// right after the token. `MINTTL` is recognised there only: further on it
/// is the command's own argument.
pub fn fence_command_at(after_key: &[&[u8]]) -> usize {
    match after_key.get(1) {
        Some(w) if w.eq_ignore_ascii_case(b"MINTTL") => 3,
        _ => 1,
    }
}

/// Parses LEASE.FENCE's arguments after the key (the token first: at least
/// one argument, the arity says so): the token, then `MINTTL ms` (`ms`:
/// 0..=MAX_MS) when given.
pub fn parse_fence_args(after_key: &[&[u8]]) -> Result<FenceArgs, LeaseError> {
    let token = parse_token(after_key.first().copied().unwrap_or_default())?;
    let command_at = fence_command_at(after_key);
    let min_ttl_ms = if command_at == 1 {
        None
    } else {
        let ms = after_key.get(2).ok_or(LeaseError::MissingValue("MINTTL"))?;
        Some(parse_in_range(ms, "MINTTL", 0, MAX_MS)?)
    };
    Ok(FenceArgs {
        token,
        min_ttl_ms,
        command_at,
    })
}

/// `numkeys` of a multi-key command: 1..=1000, and at most `given`, the
/// arguments left for the keys.
pub fn parse_numkeys(arg: &[u8], given: usize) -> Result<usize, LeaseError> {
    let n = parse_in_range(arg, "numkeys", 1, MAX_KEYS as i64)? as usize;
    if n > given {
        return Err(LeaseError::NumKeys { numkeys: n, given });
    }
    Ok(n)
}

/// The keys of a multi-key command, none twice (the error names the
/// first repeated one). Sorted copies are compared, so the check costs
/// O(k log k).
pub fn check_distinct(keys: &[&[u8]]) -> Result<(), LeaseError> {
    let mut sorted: Vec<&[u8]> = keys.to_vec();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(LeaseError::DuplicateKey(printable(w[0]))),
        None => Ok(()),
    }
}

/// The options after `LEASE.MACQUIRE numkeys key... owner ttl-ms`: only
/// `BLOCK timeout-ms` and `LABEL text` (a multi-key lease is exclusive,
/// and has no `FLOOR`).
pub fn parse_macquire_options<'a>(opts: &[&'a [u8]]) -> Result<AcquireOptions<'a>, LeaseError> {
    let o = parse_acquire_options(opts)?;
    match (o.mode, o.floor) {
        (Mode::Limit(_), _) => Err(LeaseError::UnknownOption("LIMIT".into())),
        (Mode::Shared, _) => Err(LeaseError::UnknownOption("SHARED".into())),
        (_, Some(_)) => Err(LeaseError::UnknownOption("FLOOR".into())),
        _ => Ok(o),
    }
}

/// The mode words of `LEASE.HOLD`: `LIMIT n` or `SHARED`.
pub fn parse_hold_mode(words: &[&[u8]]) -> Result<HoldersMode, LeaseError> {
    match words {
        [w] if w.eq_ignore_ascii_case(b"SHARED") => Ok(HoldersMode::Shared),
        [w, n] if w.eq_ignore_ascii_case(b"LIMIT") => Ok(HoldersMode::Limit(parse_limit(n)?)),
        [w, ..] if !w.eq_ignore_ascii_case(b"LIMIT") && !w.eq_ignore_ascii_case(b"SHARED") => {
            Err(LeaseError::UnknownOption(printable(w)))
        }
        _ => Err(LeaseError::Arity("lease.hold")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_like_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"42"), Some(42));
        assert_eq!(parse_i64(b"-7"), Some(-7));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"01",
            b"1.5",
            b"1e3",
            b"abc",
            b"9223372036854775808",
            b"99999999999999999999",
            // Found by the `args` fuzz target: Redis refuses "-0" too.
            b"-0",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// The one-pass parser against the plain definition (the rules
    /// above, then the standard library's parse), on edge values and on
    /// random strings over the characters that matter.
    #[test]
    fn integers_parse_as_the_reference_does() {
        fn reference(arg: &[u8]) -> Option<i64> {
            let digits = arg.strip_prefix(b"-").unwrap_or(arg);
            if digits.is_empty()
                || arg == b"-0"
                || !digits.iter().all(u8::is_ascii_digit)
                || (digits.len() > 1 && digits[0] == b'0')
            {
                return None;
            }
            std::str::from_utf8(arg).ok()?.parse().ok()
        }
        let mut cases: Vec<Vec<u8>> =
            [i64::MIN, i64::MIN + 1, -1, 1, 9, 10, i64::MAX - 1, i64::MAX]
                .iter()
                .map(|n| n.to_string().into_bytes())
                .collect();
        cases.push(b"-9223372036854775809".to_vec());
        cases.push(b"18446744073709551616".to_vec());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 22) as usize;
            let s: Vec<u8> = (0..len)
                .map(|i| b"-0123456789x"[((x >> (i * 3)) % 12) as usize])
                .collect();
            cases.push(s);
        }
        // Digit strings of every length, some with one byte changed to a
        // neighbour of the digits ('/', ':', a high-bit byte, a space).
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % 20) as usize;
            let mut s: Vec<u8> = (0..len)
                .map(|i| b'0' + ((x >> (i * 3)) % 10) as u8)
                .collect();
            if x.is_multiple_of(3) {
                let at = ((x >> 7) as usize) % len;
                s[at] = [b'/', b':', 0xB0, b' '][((x >> 11) % 4) as usize];
            }
            if x.is_multiple_of(5) {
                s.insert(0, b'-');
            }
            cases.push(s);
        }
        for c in &cases {
            assert_eq!(
                parse_i64(c),
                reference(c),
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
    }

    #[test]
    fn owner_bounds() {
        assert_eq!(check_owner(b""), Err(LeaseError::OwnerEmpty));
        assert!(check_owner(&[0u8; 1]).is_ok());
        assert!(check_owner(&[7u8; 256]).is_ok());
        assert_eq!(check_owner(&[7u8; 257]), Err(LeaseError::OwnerTooLong(257)));
    }

    #[test]
    fn ttl_token_and_timeout_ranges() {
        assert_eq!(parse_ttl(b"1", 10), Ok(1));
        assert_eq!(parse_ttl(b"10", 10), Ok(10));
        assert!(matches!(
            parse_ttl(b"11", 10),
            Err(LeaseError::OutOfRange { what: "ttl-ms", .. })
        ));
        assert!(matches!(
            parse_ttl(b"0", 10),
            Err(LeaseError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_ttl(b"-5", 10),
            Err(LeaseError::OutOfRange { .. })
        ));
        assert_eq!(parse_ttl(b"x", 10), Err(LeaseError::NotInteger("ttl-ms")));
        assert_eq!(parse_token(b"9007199254740991"), Ok(MAX_TOKEN));
        assert!(matches!(
            parse_token(b"9007199254740992"),
            Err(LeaseError::OutOfRange { what: "token", .. })
        ));
        assert!(parse_token(b"0").is_err());
        assert_eq!(parse_timeout(b"0"), Ok(0));
        assert!(parse_timeout(b"-1").is_err());
    }

    #[test]
    fn acquire_options() {
        assert_eq!(parse_acquire_options(&[]), Ok(AcquireOptions::default()));
        assert_eq!(
            parse_acquire_options(&[b"block", b"100"]),
            Ok(AcquireOptions {
                block_ms: Some(100),
                mode: Mode::Exclusive,
                floor: None,
                label: None,
            })
        );
        assert_eq!(
            parse_acquire_options(&[b"BLOCK"]),
            Err(LeaseError::MissingValue("BLOCK"))
        );
        assert_eq!(
            parse_acquire_options(&[b"BLOCK", b"1", b"BLOCK", b"2"]),
            Err(LeaseError::RepeatedOption("BLOCK"))
        );
        assert_eq!(
            parse_acquire_options(&[b"NX"]),
            Err(LeaseError::UnknownOption("NX".into()))
        );
        assert_eq!(
            parse_acquire_options(&[b"BLOCK", b"soon"]),
            Err(LeaseError::NotInteger("timeout-ms"))
        );
    }

    #[test]
    fn option_names_match_in_any_case_and_nothing_else() {
        let names: [(&[u8], AcquireWord); 5] = [
            (b"BLOCK", AcquireWord::Block),
            (b"LIMIT", AcquireWord::Limit),
            (b"SHARED", AcquireWord::Shared),
            (b"FLOOR", AcquireWord::Floor),
            (b"LABEL", AcquireWord::Label),
        ];
        for (name, word) in names {
            // Every mix of cases of the name is the option.
            for mask in 0u32..(1 << name.len()) {
                let mixed: Vec<u8> = (name.iter().enumerate())
                    .map(|(i, &b)| {
                        if mask & (1 << i) != 0 {
                            b.to_ascii_lowercase()
                        } else {
                            b
                        }
                    })
                    .collect();
                assert_eq!(acquire_word(&mixed), Some(word), "{mixed:?}");
            }
            // One byte changed into anything but the other case of its
            // letter, or a byte more or less, is no option.
            for i in 0..name.len() {
                for b in 0..=255u8 {
                    let mut other = name.to_vec();
                    other[i] = b;
                    let same = b.eq_ignore_ascii_case(&name[i]);
                    assert_eq!(acquire_word(&other) == Some(word), same, "{other:?}");
                }
            }
            assert_eq!(acquire_word(&name[1..]), None);
            for b in [0u8, b' ', b'S', b'\x20'] {
                assert_eq!(acquire_word(&[name, &[b]].concat()), None);
            }
        }
        assert_eq!(acquire_word(b""), None);
    }

    #[test]
    fn limit_and_shared_options() {
        let mode = |opts: &[&[u8]]| parse_acquire_options(opts).map(|o| o.mode);
        assert_eq!(mode(&[b"LIMIT", b"3"]), Ok(Mode::Limit(3)));
        assert_eq!(mode(&[b"limit", b"100000"]), Ok(Mode::Limit(100_000)));
        assert_eq!(mode(&[b"shared"]), Ok(Mode::Shared));
        assert_eq!(
            parse_acquire_options(&[b"SHARED", b"BLOCK", b"5"]),
            Ok(AcquireOptions {
                block_ms: Some(5),
                mode: Mode::Shared,
                floor: None,
                label: None,
            })
        );
        assert_eq!(
            parse_acquire_options(&[b"BLOCK", b"0", b"LIMIT", b"2"]).map(|o| o.mode),
            Ok(Mode::Limit(2))
        );
        assert_eq!(mode(&[b"LIMIT", b"1"]), Err(LeaseError::LimitOne));
        for bad in [&b"0"[..], b"-3", b"100001"] {
            assert_eq!(
                mode(&[b"LIMIT", bad]),
                Err(LeaseError::OutOfRange {
                    what: "LIMIT",
                    min: 2,
                    max: 100_000
                })
            );
        }
        assert_eq!(
            mode(&[b"LIMIT", b"two"]),
            Err(LeaseError::NotInteger("LIMIT"))
        );
        assert_eq!(mode(&[b"LIMIT"]), Err(LeaseError::MissingValue("LIMIT")));
        assert_eq!(
            mode(&[b"LIMIT", b"2", b"LIMIT", b"2"]),
            Err(LeaseError::RepeatedOption("LIMIT"))
        );
        assert_eq!(
            mode(&[b"SHARED", b"SHARED"]),
            Err(LeaseError::RepeatedOption("SHARED"))
        );
        assert_eq!(
            mode(&[b"LIMIT", b"2", b"SHARED"]),
            Err(LeaseError::ExclusiveOptions("LIMIT", "SHARED"))
        );
        assert_eq!(
            mode(&[b"SHARED", b"LIMIT", b"2"]),
            Err(LeaseError::ExclusiveOptions("LIMIT", "SHARED"))
        );
        assert!(LeaseError::LimitOne.to_string().contains("leave LIMIT out"));
    }

    #[test]
    fn floor_option() {
        let floor = |o: &[&[u8]]| parse_acquire_options(o).map(|o| o.floor);
        assert_eq!(floor(&[b"FLOOR", b"42"]), Ok(Some(42)));
        assert_eq!(floor(&[b"floor", b"42", b"BLOCK", b"5"]), Ok(Some(42)));
        assert_eq!(floor(&[b"BLOCK", b"5"]), Ok(None));
        assert_eq!(floor(&[b"FLOOR"]), Err(LeaseError::MissingValue("FLOOR")));
        assert_eq!(
            floor(&[b"FLOOR", b"1", b"FLOOR", b"2"]),
            Err(LeaseError::RepeatedOption("FLOOR"))
        );
        assert_eq!(
            floor(&[b"FLOOR", b"x"]),
            Err(LeaseError::NotInteger("FLOOR"))
        );
        for bad in [&b"0"[..], b"-1", b"9007199254740992"] {
            assert_eq!(
                floor(&[b"FLOOR", bad]),
                Err(LeaseError::OutOfRange {
                    what: "FLOOR",
                    min: 1,
                    max: MAX_TOKEN as i64
                })
            );
        }
        assert_eq!(floor(&[b"FLOOR", b"9007199254740991"]), Ok(Some(MAX_TOKEN)));
        for with in [&[&b"SHARED"[..]][..], &[b"LIMIT", b"3"]] {
            let mut o: Vec<&[u8]> = vec![b"FLOOR", b"7"];
            o.extend_from_slice(with);
            assert_eq!(
                parse_acquire_options(&o),
                Err(LeaseError::FloorNotExclusive)
            );
        }
    }

    #[test]
    fn fence_args_take_minttl_right_after_the_token_only() {
        let f = |a: &[&[u8]]| parse_fence_args(a);
        assert_eq!(
            f(&[b"42"]),
            Ok(FenceArgs {
                token: 42,
                min_ttl_ms: None,
                command_at: 1
            })
        );
        assert_eq!(
            f(&[b"42", b"HSET", b"h", b"MINTTL", b"5"]),
            Ok(FenceArgs {
                token: 42,
                min_ttl_ms: None,
                command_at: 1
            }),
            "further on, MINTTL is the command's argument"
        );
        assert_eq!(
            f(&[b"42", b"minTTL", b"500"]),
            Ok(FenceArgs {
                token: 42,
                min_ttl_ms: Some(500),
                command_at: 3
            })
        );
        assert_eq!(
            f(&[b"42", b"MINTTL", b"0", b"SET", b"k", b"v"]),
            Ok(FenceArgs {
                token: 42,
                min_ttl_ms: Some(0),
                command_at: 3
            })
        );
        assert_eq!(
            f(&[b"42", b"MINTTL", b"1000000000000"]).map(|a| a.min_ttl_ms),
            Ok(Some(MAX_MS))
        );
        assert_eq!(
            f(&[b"42", b"MINTTL"]),
            Err(LeaseError::MissingValue("MINTTL"))
        );
        for bad in [&b"-1"[..], b"1000000000001"] {
            assert_eq!(
                f(&[b"42", b"MINTTL", bad]),
                Err(LeaseError::OutOfRange {
                    what: "MINTTL",
                    min: 0,
                    max: MAX_MS
                })
            );
        }
        for bad in [&b"soon"[..], b"1.5", b"", b"+5", b"05"] {
            assert_eq!(
                f(&[b"42", b"MINTTL", bad]),
                Err(LeaseError::NotInteger("MINTTL"))
            );
        }
        assert_eq!(
            f(&[b"x", b"MINTTL", b"-1"]),
            Err(LeaseError::NotInteger("token")),
            "the token is checked first"
        );
        assert_eq!(fence_command_at(&[b"1", b"GET", b"k"]), 1);
        assert_eq!(fence_command_at(&[b"1", b"mintTl", b"x", b"GET"]), 3);
        assert_eq!(
            LeaseError::NotInteger("MINTTL").to_string(),
            "ERR MINTTL is not an integer"
        );
        assert_eq!(
            LeaseError::MissingValue("MINTTL").to_string(),
            "ERR option MINTTL needs a value"
        );
    }

    #[test]
    fn numkeys_and_distinct_keys() {
        assert_eq!(parse_numkeys(b"2", 2), Ok(2));
        assert_eq!(parse_numkeys(b"1000", 5000), Ok(1000));
        assert_eq!(
            parse_numkeys(b"3", 2),
            Err(LeaseError::NumKeys {
                numkeys: 3,
                given: 2
            })
        );
        for bad in [&b"0"[..], b"-1", b"1001"] {
            assert_eq!(
                parse_numkeys(bad, 5000),
                Err(LeaseError::OutOfRange {
                    what: "numkeys",
                    min: 1,
                    max: 1000
                })
            );
        }
        assert_eq!(
            parse_numkeys(b"x", 5),
            Err(LeaseError::NotInteger("numkeys"))
        );
        assert_eq!(check_distinct(&[b"a", b"b", b"c"]), Ok(()));
        assert_eq!(
            check_distinct(&[b"b", b"a", b"b"]),
            Err(LeaseError::DuplicateKey("b".into()))
        );
        assert_eq!(parse_macquire_options(&[]).map(|o| o.block_ms), Ok(None));
        assert_eq!(
            parse_macquire_options(&[b"block", b"5"]).map(|o| o.block_ms),
            Ok(Some(5))
        );
        assert_eq!(
            parse_macquire_options(&[b"SHARED"]),
            Err(LeaseError::UnknownOption("SHARED".into()))
        );
        assert_eq!(
            parse_macquire_options(&[b"FLOOR", b"3"]),
            Err(LeaseError::UnknownOption("FLOOR".into()))
        );
        assert_eq!(
            parse_macquire_options(&[b"NX"]),
            Err(LeaseError::UnknownOption("NX".into()))
        );
    }

    #[test]
    fn hold_modes() {
        assert_eq!(parse_hold_mode(&[b"SHARED"]), Ok(HoldersMode::Shared));
        assert_eq!(
            parse_hold_mode(&[b"LIMIT", b"7"]),
            Ok(HoldersMode::Limit(7))
        );
        assert!(parse_hold_mode(&[b"LIMIT", b"1"]).is_err());
        assert!(parse_hold_mode(&[b"LIMIT"]).is_err());
        assert!(parse_hold_mode(&[b"SHARED", b"x"]).is_err());
        assert!(matches!(
            parse_hold_mode(&[b"NX"]),
            Err(LeaseError::UnknownOption(_))
        ));
        assert!(parse_hold_mode(&[]).is_err());
    }

    #[test]
    fn printable_strips_control_bytes() {
        assert_eq!(printable(b"a\r\nb"), "a??b");
        assert_eq!(printable(&[b'x'; 70]).len(), 67);
    }
}
