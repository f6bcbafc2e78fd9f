//! Sizes and durations as an operator writes them: a plain number (bytes, milliseconds: what
//! each key's name says), or a string with a unit, as valkey.conf takes sizes (`512mb`) and
//! as durations are written everywhere else (`10s`). A leaf: configuration sections at any
//! layer (the journal's included) use it through serde's `deserialize_with`.
//!
//! Sizes follow valkey.conf's convention exactly, so that a value copied from it means the
//! same here: `k`, `m`, `g` are powers of 1000 and `kb`, `mb`, `gb` powers of 1024, in any
//! case. Kubernetes' `Ki`, `Mi`, `Gi` (and `KiB`, ...) are powers of 1024 too, so that a
//! size copied from a volume claim does as well.

pub mod time;

use serde::{de, Deserializer};

/// A number, or a string holding one and a unit.
enum Written {
    Number(u64),
    Text(String),
}

/// Reads a [`Written`], refusing what is neither with the setting's own help (`expected`):
/// a negative number or a fraction says which it is, not serde's generic "did not match".
struct WrittenVisitor(&'static str);

impl de::Visitor<'_> for WrittenVisitor {
    type Value = Written;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.0)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Written, E> {
        Ok(Written::Number(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Written, E> {
        u64::try_from(v)
            .map(Written::Number)
            .map_err(|_| E::custom(format!("{v} is negative; expected {}", self.0)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Written, E> {
        Err(E::custom(format!(
            "{v} is not a whole number; expected {} (a fraction goes in a string with its unit, as \"1.5s\" or \"0.5gb\")",
            self.0
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Written, E> {
        Ok(Written::Text(v.to_string()))
    }
}

const SIZE_HELP: &str = "a byte count, or a number with a unit as in valkey.conf: 512kb, 64mb, 1gb (kb, mb, gb, tb are powers of 1024; k, m, g, t powers of 1000; Ki, Mi, Gi, Ti as in Kubernetes)";
const DURATION_HELP: &str =
    "milliseconds, or a number with a unit: 500ms, 10s, 5m, 1h (a fraction such as 1.5s too)";

/// A size as a person reads it: bytes below 1 KiB, else the largest binary unit that keeps
/// the figure at 1 or more, with one decimal (`312 B`, `2.2 KiB`, `1.0 GiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A size, duration or time that is none; the message quotes what was written and shows
/// the forms that are taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    #[error("{text:?} is not a size: expected {}", SIZE_HELP)]
    Size { text: String },
    #[error("{text:?} is not a duration: expected {}", DURATION_HELP)]
    Duration { text: String },
    #[error("{text:?} is not a time: expected RFC 3339 with its offset, as 2026-12-03T21:18:45Z or 2026-12-03T22:18:45.250+01:00 ({reason})")]
    Time { text: String, reason: String },
    #[error("{text:?} is before 1970, before anything walrus journaled")]
    BeforeEpoch { text: String },
}

/// Parses a size: `4096`, `64mb`, `1.5gb`, `10Gi`. Whitespace between number and unit is
/// allowed; a fraction must come to a whole number of bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitsError> {
    let refused = || UnitsError::Size {
        text: text.to_string(),
    };
    let (number, unit) = split(text);
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        "kb" | "ki" | "kib" => 1 << 10,
        "mb" | "mi" | "mib" => 1 << 20,
        "gb" | "gi" | "gib" => 1 << 30,
        "tb" | "ti" | "tib" => 1 << 40,
        _ => return Err(refused()),
    };
    scaled(number, scale).ok_or_else(refused)
}

/// Parses a duration into milliseconds: `250`, `500ms`, `10s`, `1.5m`, `2h`.
pub fn parse_millis(text: &str) -> Result<u64, UnitsError> {
    let refused = || UnitsError::Duration {
        text: text.to_string(),
    };
    let (number, unit) = split(text);
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(refused()),
    };
    scaled(number, scale).ok_or_else(refused)
}

/// The number and the unit after it, both trimmed.
fn split(text: &str) -> (&str, &str) {
    let text = text.trim();
    let at = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    (text[..at].trim(), text[at..].trim())
}

/// `number × scale`, when it is a whole, non-negative count that fits 64 bits. Integers are
/// multiplied exactly; a fraction goes through f64, exact for the sizes anyone writes.
fn scaled(number: &str, scale: u64) -> Option<u64> {
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(scale);
    }
    let x: f64 = number.parse().ok()?;
    let v = x * scale as f64;
    (x.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

fn deserialize<'de, D: Deserializer<'de>, T: TryFrom<u64>>(
    d: D,
    parse: fn(&str) -> Result<u64, UnitsError>,
    help: &'static str,
) -> Result<T, D::Error> {
    let n = match d.deserialize_any(WrittenVisitor(help))? {
        Written::Number(n) => n,
        Written::Text(t) => parse(&t).map_err(de::Error::custom)?,
    };
    T::try_from(n).map_err(|_| de::Error::custom(format!("{n} is too large for this machine")))
}

/// serde `deserialize_with` for a size in bytes.
pub fn size<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    deserialize(d, parse_size, SIZE_HELP)
}

/// serde `deserialize_with` for an optional size (the key absent: unset).
pub fn size_opt<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    size(d).map(Some)
}

/// serde `deserialize_with` for a duration in milliseconds.
pub fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    deserialize(d, parse_millis, DURATION_HELP)
}

/// The JSON Schema of a size (`#[schemars(with = "crate::units::Size")]`): what
/// [`parse_size`] takes, so that a tool validating walrus.toml (the Helm chart's schema)
/// accepts and refuses what walrus does, up to the value's range.
pub struct Size;

/// The JSON Schema of a duration in milliseconds, as [`parse_millis`] takes it.
pub struct Millis;

fn number_or_text(name: &str, pattern: &str, help: &str) -> schemars::Schema {
    schemars::json_schema!({
        "title": name,
        "description": help,
        "anyOf": [
            { "type": "integer", "minimum": 0 },
            { "type": "string", "pattern": pattern }
        ]
    })
}

impl schemars::JsonSchema for Size {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        number_or_text(
            "size",
            r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT]([bB]|[iI][bB]?)?|[bB])?\s*$",
            SIZE_HELP,
        )
    }
}

impl schemars::JsonSchema for Millis {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Millis".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        number_or_text(
            "duration",
            r"^\s*[0-9]+(\.[0-9]+)?\s*([mM][sS]|[sS]|[mM]([iI][nN])?|[hH])?\s*$",
            DURATION_HELP,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_or_fractional_number_is_refused_saying_which_it_is() {
        #[derive(Debug, serde::Deserialize)]
        struct S {
            #[serde(deserialize_with = "size")]
            #[allow(dead_code)]
            n: u64,
        }
        let err = |text: &str| toml::from_str::<S>(text).unwrap_err().to_string();
        assert!(err("n = -1").contains("-1 is negative; expected a byte count"));
        assert!(err("n = 1.5").contains("1.5 is not a whole number; expected a byte count"));
        assert!(err("n = true").contains("expected a byte count"));
        assert!(!err("n = -1").contains("untagged enum"));
        assert_eq!(toml::from_str::<S>("n = \"2kb\"").unwrap().n, 2048);
        assert_eq!(toml::from_str::<S>("n = 7").unwrap().n, 7);
    }

    #[test]
    fn sizes_are_printed_in_the_largest_unit_that_keeps_them_at_1_or_more() {
        for (bytes, text) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (2277, "2.2 KiB"),
            (1 << 30, "1.0 GiB"),
            (1_073_741_823, "1024.0 MiB"),
            (u64::MAX, "16384.0 PiB"),
        ] {
            assert_eq!(format_size(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn sizes_follow_valkey_conf() {
        for (text, bytes) in [
            ("4096", 4096),
            ("1k", 1000),
            ("1kb", 1024),
            ("512mb", 512 << 20),
            ("64MB", 64 << 20),
            ("1m", 1_000_000),
            ("1gb", 1 << 30),
            ("1 GB", 1 << 30),
            ("10Gi", 10 << 30),
            ("1.5kb", 1536),
            ("2tb", 2 << 40),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn a_size_that_is_no_size_is_refused_with_the_forms_it_takes() {
        for text in ["", "mb", "5 parsecs", "-1", "1.1b", "99999999999tb", "1e3"] {
            let e = parse_size(text).unwrap_err().to_string();
            assert!(
                e.contains("is not a size") && e.contains("64mb"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn durations_are_milliseconds_or_carry_a_unit() {
        for (text, ms) in [
            ("250", 250),
            ("500ms", 500),
            ("10s", 10_000),
            ("1.5s", 1_500),
            ("5m", 300_000),
            ("2h", 7_200_000),
        ] {
            assert_eq!(parse_millis(text), Ok(ms), "{text}");
        }
        for text in ["10 parsecs", "1.0005s", "s"] {
            assert!(
                parse_millis(text).unwrap_err().to_string().contains("10s"),
                "{text}"
            );
        }
    }
}
