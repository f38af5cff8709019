//! Parsing of sizes (`512M`, `1.5G`, `4096`) and durations (`30s`, `5m`,
//! `1h30m`, `250ms`) as people type them on a command line or in JSON.

use std::fmt;
use std::time::Duration;

/// Why a size or duration could not be parsed. Each message says what a
/// valid value looks like.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("invalid size {input:?}: expected a number with an optional unit K, M, G or T (for example 512M or 2G)")]
    Size { input: String },
    #[error("invalid duration {input:?}: expected a number with a unit ms, s, m or h (for example 30s, 5m or 1h30m)")]
    Duration { input: String },
}

/// A number of bytes. Displays in the largest binary unit that divides it
/// exactly (`512 MiB`), which is what error messages quote back to users.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const KIB: u64 = 1 << 10;
    pub const MIB: u64 = 1 << 20;
    pub const GIB: u64 = 1 << 30;

    pub const fn mib(n: u64) -> Self {
        ByteSize(n * Self::MIB)
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, name) in [
            (1u64 << 40, "TiB"),
            (Self::GIB, "GiB"),
            (Self::MIB, "MiB"),
            (Self::KIB, "KiB"),
        ] {
            if n >= unit && n.is_multiple_of(unit) {
                return write!(f, "{} {}", n / unit, name);
            }
        }
        if n >= Self::MIB {
            return write!(f, "{:.1} MiB", n as f64 / Self::MIB as f64);
        }
        write!(f, "{n} B")
    }
}

/// Parse a size: a decimal number with an optional binary unit suffix
/// (`K`, `M`, `G`, `T`, optionally followed by `i`/`iB`/`B`, any case).
/// A bare number is bytes.
pub fn parse_size(input: &str) -> Result<ByteSize, UnitError> {
    let err = || UnitError::Size {
        input: input.to_string(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let value: f64 = num.parse().map_err(|_| err())?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "ki" | "kib" => 1 << 10,
        "m" | "mb" | "mi" | "mib" => 1 << 20,
        "g" | "gb" | "gi" | "gib" => 1 << 30,
        "t" | "tb" | "ti" | "tib" => 1 << 40,
        _ => return Err(err()),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(ByteSize(bytes.round() as u64))
}

/// Parse a duration: one or more `<number><unit>` groups (`1h30m`), units
/// `ms`, `s`, `m`, `h`. A bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let err = || UnitError::Duration {
        input: input.to_string(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| err());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(n_end);
        let u_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(u_end);
        let value: f64 = num.parse().map_err(|_| err())?;
        let secs = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" | "min" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(err()),
        };
        // Checked: each group fits a Duration, but their sum need not
        // (`10000000000000000000s10000000000000000000s`).
        total = total
            .checked_add(Duration::try_from_secs_f64(secs).map_err(|_| err())?)
            .ok_or_else(err)?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("512M").unwrap(), ByteSize(512 << 20));
        assert_eq!(parse_size("1g").unwrap(), ByteSize(1 << 30));
        assert_eq!(parse_size("1.5GiB").unwrap(), ByteSize(3 << 29));
        assert_eq!(parse_size("4096").unwrap(), ByteSize(4096));
        assert_eq!(parse_size("64k").unwrap(), ByteSize(64 << 10));
    }

    #[test]
    fn bad_sizes_are_rejected_with_the_input_quoted() {
        for bad in ["", "M", "12X", "-1M", "1..2G", "ten"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn durations_parse_compound_forms() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn bad_durations_are_rejected() {
        for bad in ["", "s", "10x", "5 m", "-3s", "1h-2m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should fail");
        }
    }

    /// Found by the `spec_limits` fuzz target: the sum of groups that each
    /// fit a Duration overflowed it, and `+=` panicked (a 500 from the
    /// API, a crash of the CLI) instead of refusing the input.
    #[test]
    fn durations_too_long_to_add_up_are_rejected() {
        let huge = "10000000000000000000s10000000000000000000s";
        assert_eq!(
            parse_duration(huge),
            Err(UnitError::Duration {
                input: huge.to_string()
            })
        );
        // The largest sums that fit are still taken.
        assert_eq!(
            parse_duration("9000000000000000000s1s").unwrap(),
            Duration::from_secs(9_000_000_000_000_000_001)
        );
    }

    #[test]
    fn sizes_display_in_the_largest_exact_unit() {
        assert_eq!(ByteSize(512 << 20).to_string(), "512 MiB");
        assert_eq!(ByteSize(1 << 30).to_string(), "1 GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000 B");
    }
}
