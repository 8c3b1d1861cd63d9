//! Text in and out: durations on the command line, durations and JSON in the output.

use std::fmt::Write as _;
use std::time::Duration;

/// Parses a duration given on the command line: a whole number and a unit, `ms`, `s`, `m` or
/// `h` (`500ms`, `30s`, `2m`, `1h`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let usage = || {
        format!("{text:?} is not a duration: write a whole number and a unit, as in 500ms, 30s, 2m or 1h")
    };
    if number.is_empty() {
        return Err(usage());
    }
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is too long a duration"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(usage()),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

/// Parses a connection or response timeout: a duration above zero, at most an hour (the
/// library's [`MAX_TIMEOUT`](fencelock::MAX_TIMEOUT)).
pub(crate) fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("{text:?} is no time: give it at least 1ms")),
        d if d > fencelock::MAX_TIMEOUT => Err(format!(
            "{text:?} is longer than {}, the longest timeout",
            human(fencelock::MAX_TIMEOUT)
        )),
        d => Ok(d),
    }
}

/// A duration for people: `850ms`, `2.9s`, `1m05s`, `2h03m`.
pub(crate) fn human(d: Duration) -> String {
    let millis = d.as_millis();
    let secs = d.as_secs();
    if millis < 1_000 {
        format!("{millis}ms")
    } else if secs < 60 {
        match d.subsec_millis() / 100 {
            0 => format!("{secs}s"),
            tenths => format!("{secs}.{tenths}s"),
        }
    } else if secs < 3_600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3_600, secs % 3_600 / 60)
    }
}

/// Whole seconds, as a wait is shown while it lasts: `0s`, `59s`, `1m00s`, `1h00m`.
pub(crate) fn seconds(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{secs}s")
    } else {
        human(Duration::from_secs(secs))
    }
}

/// `text` as a JSON string, quotes included.
pub(crate) fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn durations_take_a_whole_number_and_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "30", "s", "1.5s", "-1s", "10 s", "1d", "5sec", "1m30s"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("500ms, 30s, 2m"), "{bad:?}: {err}");
        }
        let huge = format!("{}h", u64::MAX / 1000);
        assert!(parse_duration(&huge).unwrap_err().contains("too long"));
        assert!(parse_duration("99999999999999999999999s")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn timeouts_are_above_zero_and_at_most_an_hour() {
        assert_eq!(parse_timeout("1ms"), Ok(ms(1)));
        assert_eq!(parse_timeout("1h"), Ok(ms(3_600_000)));
        assert!(parse_timeout("0s").unwrap_err().contains("at least 1ms"));
        assert!(parse_timeout("61m").unwrap_err().contains("1h00m"));
        assert!(parse_timeout("5").unwrap_err().contains("500ms, 30s"));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(ms(850)), "850ms");
        assert_eq!(human(ms(2_950)), "2.9s");
        assert_eq!(human(ms(30_000)), "30s");
        assert_eq!(human(ms(65_000)), "1m05s");
        assert_eq!(human(ms(7_380_000)), "2h03m");
        assert_eq!(seconds(ms(999)), "0s");
        assert_eq!(seconds(ms(59_999)), "59s");
        assert_eq!(seconds(ms(60_000)), "1m00s");
    }

    #[test]
    fn json_strings_escape_what_json_requires() {
        assert_eq!(json_string("a"), r#""a""#);
        assert_eq!(json_string("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(json_string("nul\0cr\r\nlf\t"), r#""nul\u0000cr\r\nlf\t""#);
        assert_eq!(json_string("ключ{}"), "\"ключ{}\"");
    }
}
