//! The one size parser of Sluice: target config, `sluice bench` job specs
//! and command-line flags all use [`parse_size`].
//!
//! Rules:
//! * a whole number of bytes (`4096`), or a number followed by a unit;
//! * units are binary (powers of 1024) and case-insensitive: `k`, `kb`,
//!   `kib` (1024), `m`/`mb`/`mib`, `g`/`gb`/`gib`, `t`/`tb`/`tib`; `b` is
//!   bytes. `kB`, `MB`, `GB` and `TB` are **binary too** (1 kB = 1024 B):
//!   that is what every Sluice parser has always done, and config files
//!   that say `"64MB"` keep meaning 64 MiB;
//! * blanks around the number and between number and unit are ignored;
//! * a decimal fraction is allowed when the result is a whole number of
//!   bytes (`"1.5G"`, `"0.5k"`), and refused otherwise (`"1.5"`);
//! * refused with a message: empty strings, negative numbers, unknown
//!   units, anything that is not a number, and sizes above `u64::MAX`.

use std::fmt;

/// Why a size string was refused; the message quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size (e.g. 4096, 64k, 1GiB)")]
    Empty,
    #[error("`{0}` is negative")]
    Negative(String),
    #[error("`{0}` is not a size (e.g. 4096, 64k, 1GiB)")]
    NotANumber(String),
    #[error("unknown size unit `{unit}` in `{input}` (units: k, M, G, T, KiB, MiB, GiB, TiB; all powers of 1024)")]
    UnknownUnit { unit: String, input: String },
    #[error("`{0}` is not a whole number of bytes")]
    Fraction(String),
    #[error("`{0}` is out of range (above 2^64 - 1 bytes)")]
    Overflow(String),
}

/// Units from largest to smallest, as [`format_size`] writes them.
const UNITS: [(&str, u64); 4] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

fn multiplier(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    })
}

/// Parses `"4096"`, `"4k"`, `"4KiB"`, `"1.5G"`, `"64MB"` (binary units)
/// into bytes; see the module documentation for the rules.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    if t.starts_with('-') {
        return Err(SizeError::Negative(s.to_string()));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(SizeError::NotANumber(s.to_string()));
    }
    let mul = multiplier(unit).ok_or_else(|| {
        if unit.starts_with(|c: char| c.is_ascii_alphabetic()) && !num.is_empty() {
            SizeError::UnknownUnit {
                unit: unit.to_string(),
                input: s.to_string(),
            }
        } else {
            SizeError::NotANumber(s.to_string())
        }
    })?;
    let overflow = || SizeError::Overflow(s.to_string());
    let mut bytes: u64 = 0;
    for d in int.bytes() {
        bytes = bytes
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d - b'0')))
            .ok_or_else(overflow)?;
    }
    bytes = bytes.checked_mul(mul).ok_or_else(overflow)?;
    // The fraction: exact in u128 (mul ≤ 2^40, at most 19 significant digits kept).
    let frac = frac.trim_end_matches('0');
    if !frac.is_empty() {
        if frac.len() > 19 {
            return Err(SizeError::Fraction(s.to_string()));
        }
        let (digits, scale) = frac.bytes().fold((0u128, 1u128), |(a, scale), d| {
            (a * 10 + u128::from(d - b'0'), scale * 10)
        });
        let scaled = digits * u128::from(mul);
        if !scaled.is_multiple_of(scale) {
            return Err(SizeError::Fraction(s.to_string()));
        }
        let extra = u64::try_from(scaled / scale).map_err(|_| overflow())?;
        bytes = bytes.checked_add(extra).ok_or_else(overflow)?;
    }
    Ok(bytes)
}

/// Writes `bytes` with the largest binary unit that divides it exactly
/// (`4096` → `"4KiB"`, `4097` → `"4097"`); [`parse_size`] reads it back.
pub fn format_size(bytes: u64) -> String {
    for (name, m) in UNITS {
        if bytes != 0 && bytes.is_multiple_of(m) {
            return format!("{}{name}", bytes / m);
        }
    }
    bytes.to_string()
}

/// A size in a config file: an integer (bytes) or a string with a unit.
/// Sizes built from bytes are written with [`format_size`] (`"8KiB"`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum SizeValue {
    Int(i64),
    Str(String),
}

impl SizeValue {
    /// The size in bytes.
    pub fn bytes(&self) -> Result<u64, SizeError> {
        match self {
            SizeValue::Int(i) => u64::try_from(*i).map_err(|_| SizeError::Negative(i.to_string())),
            SizeValue::Str(s) => parse_size(s),
        }
    }
}

impl From<u64> for SizeValue {
    fn from(v: u64) -> Self {
        let s = format_size(v);
        match i64::try_from(v) {
            Ok(i) if s.ends_with(|c: char| c.is_ascii_digit()) => SizeValue::Int(i),
            _ => SizeValue::Str(s),
        }
    }
}

impl fmt::Display for SizeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeValue::Int(i) => write!(f, "{i}"),
            SizeValue::Str(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn units_and_rules() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("4kB"), Ok(4096), "kB is binary");
        assert_eq!(parse_size("64MB"), Ok(64 << 20), "MB is binary");
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("3TiB"), Ok(3 << 40));
        assert_eq!(parse_size("512b"), Ok(512));
        assert_eq!(parse_size(" 4 k "), Ok(4096));
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size(&u64::MAX.to_string()), Ok(u64::MAX));
    }

    #[test]
    fn refusals_say_why() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("  "), Err(SizeError::Empty));
        assert!(matches!(parse_size("-4k"), Err(SizeError::Negative(_))));
        assert!(matches!(parse_size("k"), Err(SizeError::NotANumber(_))));
        assert!(matches!(parse_size("lots"), Err(SizeError::NotANumber(_))));
        assert!(matches!(parse_size("."), Err(SizeError::NotANumber(_))));
        assert!(matches!(
            parse_size("1.2.3k"),
            Err(SizeError::NotANumber(_))
        ));
        assert!(matches!(
            parse_size("4ib"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("4xb"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("4P"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size("1.5"), Err(SizeError::Fraction(_))));
        assert!(matches!(
            parse_size("9999999999T"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(SizeError::Overflow(_))
        ));
        let e = parse_size("4xb").expect_err("unknown unit").to_string();
        assert!(e.contains("`xb`") && e.contains("`4xb`"), "{e}");
    }

    #[test]
    fn format_examples() {
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(4097), "4097");
        assert_eq!(format_size(3 << 30), "3GiB");
        assert_eq!(format_size(1 << 41), "2TiB");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(n in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(n)), Ok(n));
            prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
        }

        #[test]
        fn unit_multiplies(n in 0u64..(1 << 20), i in 0usize..4, lower in any::<bool>()) {
            let (name, m) = UNITS[i];
            let unit = if lower { name[..1].to_ascii_lowercase() } else { name.to_string() };
            prop_assert_eq!(parse_size(&format!("{n}{unit}")), Ok(n * m));
        }

        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = parse_size(&s);
        }

        #[test]
        fn never_panics_on_size_like(s in "[ 0-9.\\-]{0,24}[kKmMgGtTiIbBpP]{0,4}") {
            let _ = parse_size(&s);
        }
    }
}
