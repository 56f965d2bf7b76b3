//! Durations on the command line: a whole number and a unit, `500ms`, `90s`, `15m`, `12h`,
//! `7d` (`0` alone is zero). Each option has its own upper bound, so no value can overflow a
//! clock or a PostgreSQL interval later on.

use std::time::Duration;

/// The units, smallest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Why a duration was refused; clap prints it after "invalid value '…' for '--option'".
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum DurationError {
    #[error("not a duration: use a whole number and a unit (ms, s, m, h or d), e.g. 90s or 7d")]
    Malformed,
    #[error("too long: at most {max}")]
    TooLong { max: String },
    #[error("too short: at least {min}")]
    TooShort { min: String },
}

/// Parses `text` and checks it lies in `min..=max`.
pub(crate) fn parse(text: &str, min: Duration, max: Duration) -> Result<Duration, DurationError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(DurationError::Malformed);
    }
    let millis_per_unit = match unit {
        "" if number.bytes().all(|b| b == b'0') => 0,
        unit => {
            UNITS
                .iter()
                .find(|(name, _)| *name == unit)
                .ok_or(DurationError::Malformed)?
                .1
        }
    };
    let too_long = || DurationError::TooLong { max: show(max) };
    // Digits only, so a failed parse can only be an overflow.
    let number: u64 = number.parse().map_err(|_| too_long())?;
    let millis = number.checked_mul(millis_per_unit).ok_or_else(too_long)?;
    let duration = Duration::from_millis(millis);
    if duration > max {
        return Err(too_long());
    }
    if duration < min {
        return Err(DurationError::TooShort { min: show(min) });
    }
    Ok(duration)
}

/// `duration` in the largest unit that divides it, as the parser reads it back.
pub(crate) fn show(duration: Duration) -> String {
    let millis = duration.as_millis();
    for (name, length) in UNITS.iter().rev() {
        let length = u128::from(*length);
        if millis >= length && millis.is_multiple_of(length) {
            return format!("{}{name}", millis / length);
        }
    }
    format!("{millis}ms")
}

/// `--retention`: up to 100 years (PostgreSQL intervals end near 178 million years, and no
/// trash needs more).
pub(crate) fn retention(text: &str) -> Result<Duration, DurationError> {
    parse(text, Duration::ZERO, Duration::from_secs(36_500 * 86_400))
}

/// `--connect-timeout`: 1 ms to 1 hour.
pub(crate) fn connect_timeout(text: &str) -> Result<Duration, DurationError> {
    parse(text, Duration::from_millis(1), Duration::from_secs(3_600))
}

/// `--wait`: 0 (do not wait) to 1 hour.
pub(crate) fn wait(text: &str) -> Result<Duration, DurationError> {
    parse(text, Duration::ZERO, Duration::from_secs(3_600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_unit() {
        let max = Duration::MAX;
        for (text, millis) in [
            ("0", 0),
            ("0s", 0),
            ("250ms", 250),
            ("90s", 90_000),
            ("15m", 900_000),
            ("12h", 43_200_000),
            ("7d", 604_800_000),
        ] {
            assert_eq!(
                parse(text, Duration::ZERO, max),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_nonsense_and_huge_values_without_panicking() {
        let max = Duration::from_secs(3_600);
        for text in [
            "", "s", "7", "7 d", "-1s", "1.5h", "7days", "3x", "soon", "1e3s", "½s",
        ] {
            assert_eq!(
                parse(text, Duration::ZERO, max),
                Err(DurationError::Malformed),
                "{text}"
            );
        }
        for text in [
            "18446744073709551615d",
            "18446744073709551616ms",
            "99999999999999999999999999999s",
            "213503982334601d",
            "2h",
        ] {
            assert!(
                matches!(
                    parse(text, Duration::ZERO, max),
                    Err(DurationError::TooLong { .. })
                ),
                "{text}"
            );
        }
        assert!(matches!(
            connect_timeout("0s"),
            Err(DurationError::TooShort { .. })
        ));
        assert!(retention("36500d").is_ok());
        assert!(retention("36501d").is_err());
    }

    #[test]
    fn shows_what_it_reads() {
        for text in ["250ms", "90s", "15m", "12h", "7d", "1500ms"] {
            let duration = parse(text, Duration::ZERO, Duration::MAX).unwrap();
            assert_eq!(show(duration), text);
        }
        assert_eq!(show(Duration::ZERO), "0ms");
    }
}
