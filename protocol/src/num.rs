//! Number formatting and parsing that matches what upstream's C `printf`/`sscanf` produce.
//!
//! Rust's `{:.N}` formats the exact binary value of an `f64` and breaks exact decimal ties
//! to even, which is what glibc's `printf("%.Nf")` does in the default rounding mode
//! (`0.125` -> `"0.12"`, `2.675` -> `"2.67"`, `0.375` -> `"0.38"`); `tests/printf.rs`
//! checks this against the C library itself. Two spellings differ and are fixed here:
//! non-finite values (C: `nan`, `-nan`, `inf`, `-inf`; Rust: `NaN`, `inf`, `-inf`), and
//! negative values that round to zero (glibc: `-0.00`), which we print as `0.00` on purpose:
//! every float on the wire is a rate, a percentage or a size, and `-0.00` only ever comes
//! from `-0.0` or a rounding residue.

use std::fmt::Write as _;

/// Appends `x` formatted like C `printf("%.<prec>f", x)` (see the module notes for `-0`).
pub fn push_fixed(out: &mut String, x: f64, prec: usize) {
    if x.is_nan() {
        out.push_str(if x.is_sign_negative() { "-nan" } else { "nan" });
        return;
    }
    if x.is_infinite() {
        out.push_str(if x < 0.0 { "-inf" } else { "inf" });
        return;
    }
    let start = out.len();
    // Writing into a String cannot fail.
    let _ = write!(out, "{x:.prec$}");
    let s = &out[start..];
    if s.starts_with('-') && s[1..].bytes().all(|b| b == b'0' || b == b'.') {
        out.remove(start);
    }
}

/// `x` formatted like C `printf("%.<prec>f", x)`, as a new `String`.
pub fn fixed(x: f64, prec: usize) -> String {
    let mut s = String::new();
    push_fixed(&mut s, x, prec);
    s
}

/// Parses a float field as C prints it: decimal notation (optionally with an exponent),
/// `nan`, `-nan`, `inf`, `-inf` (any case). Never panics.
pub fn parse_f64(field: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(field).ok()?;
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if body.eq_ignore_ascii_case("nan") {
        return Some(if neg { -f64::NAN } else { f64::NAN });
    }
    if body.eq_ignore_ascii_case("inf") || body.eq_ignore_ascii_case("infinity") {
        return Some(if neg {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    // Only digits, '.', exponent and sign from here on: keeps Rust-only spellings out.
    if body.is_empty()
        || !body
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit() || b == b'.')
        || !body
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    let v: f64 = body.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Parses an unsigned decimal integer field (digits only, no sign). Never panics.
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 20 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Parses an unsigned decimal integer field that must fit in a `u32`.
pub fn parse_u32(field: &[u8]) -> Option<u32> {
    parse_u64(field).and_then(|v| u32::try_from(v).ok())
}

/// Parses a signed decimal integer field (optional leading `-` or `+`). Never panics.
pub fn parse_i64(field: &[u8]) -> Option<i64> {
    let (neg, digits) = match field.first() {
        Some(b'-') => (true, &field[1..]),
        Some(b'+') => (false, &field[1..]),
        _ => (false, field),
    };
    let mag = parse_u64(digits)?;
    if neg {
        0i64.checked_sub_unsigned(mag)
    } else {
        i64::try_from(mag).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printf_cases() {
        assert_eq!(fixed(0.125, 2), "0.12");
        assert_eq!(fixed(0.375, 2), "0.38");
        assert_eq!(fixed(2.675, 2), "2.67");
        assert_eq!(fixed(0.05, 1), "0.1"); // 0.05 is slightly above the tie in binary
        assert_eq!(fixed(0.25, 1), "0.2");
        assert_eq!(fixed(0.5, 0), "0");
        assert_eq!(fixed(1.5, 0), "2");
        assert_eq!(fixed(-0.0, 2), "0.00");
        assert_eq!(fixed(-0.001, 2), "0.00");
        assert_eq!(fixed(-1.0, 2), "-1.00");
        assert_eq!(fixed(f64::NAN, 2), "nan");
        assert_eq!(fixed(f64::NEG_INFINITY, 1), "-inf");
        assert_eq!(fixed(1e20, 2), "100000000000000000000.00");
    }

    #[test]
    fn parse_numbers() {
        assert_eq!(parse_f64(b"0.70"), Some(0.7));
        assert_eq!(parse_f64(b"-2.5"), Some(-2.5));
        assert_eq!(parse_f64(b".5"), Some(0.5));
        assert!(parse_f64(b"nan").unwrap().is_nan());
        assert!(parse_f64(b"-nan").unwrap().is_nan());
        assert_eq!(parse_f64(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_f64(b""), None);
        assert_eq!(parse_f64(b"0x10"), None);
        assert_eq!(parse_f64(b"1.5x"), None);
        assert_eq!(parse_f64(b"--1"), None);
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
        assert_eq!(parse_u32(b"+1"), None);
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_u64(b"99999999999999999999"), None);
    }
}
