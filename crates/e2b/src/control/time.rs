//! RFC 3339 timestamps (`startedAt`, `endAt`, `timestamp`, the
//! `startedAfter` filter), UTC only, without a date crate: the civil-date
//! conversions are Howard Hinnant's `days_from_civil` / `civil_from_days`.

use brig_runtime::UnixMillis;

/// `2026-11-21T20:30:00.123Z`.
pub fn rfc3339(ms: UnixMillis) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into milliseconds since
/// the epoch; `None` if it is not that.
pub fn parse_rfc3339(s: &str) -> Option<UnixMillis> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        let frac = &s[start..i.min(start + 3)];
        millis = frac.parse::<i64>().ok()? * 10_i64.pow(3 - frac.len() as u32);
    }
    let offset = match &s[i..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6
            && matches!(tz.as_bytes()[0], b'+' | b'-')
            && tz.as_bytes()[3] == b':' =>
        {
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            sign * (num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?) * 60
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec) - offset) * 1000 + millis)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_back() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T12:34:56.789Z, a leap day.
        let ms = 1_709_210_096_789;
        assert_eq!(rfc3339(ms), "2024-02-29T12:34:56.789Z");
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56.789Z"), Some(ms));
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), Some(ms - 789));
        assert_eq!(
            parse_rfc3339("2024-02-29T14:34:56.789123+02:00"),
            Some(ms),
            "offsets and extra fraction digits"
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:34:56",
            "x024-02-29T12:34:56Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
