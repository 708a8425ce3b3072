//! JSON text byte for byte as Python's `json.dumps` writes it with its
//! defaults: strings escaped with `ensure_ascii`, floats as `repr(float)`.
//!
//! A large scan's JSON output is mostly numbers (each drift record carries a
//! sampled loss curve), and Python's encoder builds a string object per
//! float. The binding walks the record in Rust with these two writers
//! instead; the text stays identical, so nothing downstream can tell.

use std::fmt::Write;

/// Append `s` as a JSON string literal, quotes included, escaping like
/// `json.dumps(s)`: `\" \\ \n \r \t \b \f`, every other character outside
/// printable ASCII as `\uXXXX` (lower-case hex; UTF-16 surrogate pairs above
/// U+FFFF).
pub fn push_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    push_str_body(out, s);
    out.push('"');
}

/// [`push_str`] without the quotes: the escaped body of the literal, for
/// writers that assemble one literal from several pieces.
pub fn push_str_body(out: &mut String, s: &str) {
    let mut plain_from = 0;
    let mut at = 0;
    while let Some(&b) = s.as_bytes().get(at) {
        // Printable ASCII other than the quote and backslash: copied as is,
        // found a byte at a time (most names and messages are all of it).
        if (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\' {
            at += 1;
            continue;
        }
        let i = at;
        let Some(c) = s.get(i..).and_then(|rest| rest.chars().next()) else {
            break;
        };
        at += c.len_utf8();
        out.push_str(&s[plain_from..i]);
        plain_from = i + c.len_utf8();
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push_str(&s[plain_from..]);
}

/// Append `n` in decimal, built on the stack: a scan's records hold
/// hundreds of steps each, and `to_string` allocated for every one.
pub fn push_i64(out: &mut String, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push('-');
    }
    // ASCII digits only.
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// Append a finite `x` as `repr(x)` writes it: the shortest digits that read
/// back as `x`, positional for decimal exponents -4..=16, else `1.5e+300`
/// style with at least two exponent digits. Returns false, writing nothing,
/// for NaN and infinities (JSON has no spelling for them).
pub fn push_f64(out: &mut String, x: f64) -> bool {
    if !x.is_finite() {
        return false;
    }
    let mut buffer = zmij::Buffer::new();
    let shortest = buffer.format_finite(x);
    // zmij writes positionally for decimal exponents -5..=15, as
    // `1234.5678`, `0.0` or `100.0`; repr does for -4..=15, the same way.
    // Only -5 (`0.0000` then a digit) needs repr's exponent spelling.
    if !shortest.contains('e') && !shortest.trim_start_matches('-').starts_with("0.0000") {
        out.push_str(shortest);
        return true;
    }
    let mut digit_bytes = [0u8; MAX_DIGITS];
    let (len, point) = decimal_digits(shortest, &mut digit_bytes);
    // ASCII digits only, so this cannot fail.
    let digits = std::str::from_utf8(digit_bytes.get(..len).unwrap_or_default()).unwrap_or("");
    if x.is_sign_negative() {
        out.push('-');
    }
    if digits.is_empty() {
        out.push_str("0.0");
        return true;
    }
    let n = digits.len() as i32;
    if (-3..=16).contains(&point) {
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(digits);
        } else if point >= n {
            out.push_str(digits);
            out.extend(std::iter::repeat_n('0', (point - n) as usize));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exponent = point - 1;
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
    }
    true
}

/// More significant digits than a shortest round-trip f64 ever has (17).
const MAX_DIGITS: usize = 32;

/// The significant digits of a formatted float (no sign, no leading or
/// trailing zeros), written into `digits` (on the stack: a scan writes
/// hundreds of floats per record), and the decimal point's position: the
/// value is `0.DIGITS x 10^point`. Zero digits mean zero.
fn decimal_digits(formatted: &str, digits: &mut [u8; MAX_DIGITS]) -> (usize, i32) {
    let unsigned = formatted.trim_start_matches('-');
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (
            &unsigned[..at],
            unsigned[at + 1..].parse::<i32>().unwrap_or(0),
        ),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut len = 0;
    let mut leading = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        if len == 0 && b == b'0' {
            leading += 1;
        } else if let Some(slot) = digits.get_mut(len) {
            *slot = b;
            len += 1;
        }
    }
    while len > 0 && digits.get(len - 1) == Some(&b'0') {
        len -= 1;
    }
    let point = whole.len() as i32 - leading + exponent;
    (len, point)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(x: f64) -> String {
        let mut s = String::new();
        assert!(push_f64(&mut s, x));
        s
    }

    fn quoted(s: &str) -> String {
        let mut out = String::new();
        push_str(&mut out, s);
        out
    }

    #[test]
    fn floats_read_as_python_repr() {
        // Each pair is (value, repr(value)) as CPython prints it.
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.00001234, "1.234e-05"),
            (-0.000099999, "-9.9999e-05"),
            (0.0001234, "0.0001234"),
            (-0.0001, "-0.0001"),
            (0.000123, "0.000123"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (9999999999999998.0, "9999999999999998.0"),
            (1.2345678901234568e18, "1.2345678901234568e+18"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (4.91633415222168, "4.91633415222168"),
            (0.00032170819120361184, "0.00032170819120361184"),
            (123456789.0, "123456789.0"),
            (1e100, "1e+100"),
        ];
        for (value, expected) in cases {
            assert_eq!(repr(value), expected, "{value:e}");
        }
    }

    #[test]
    fn integers_read_as_python_str() {
        for n in [
            0,
            1,
            -1,
            9,
            10,
            -10,
            99,
            100,
            1234567890,
            i64::MAX,
            i64::MIN,
        ] {
            let mut s = String::from("x");
            push_i64(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    #[test]
    fn non_finite_floats_write_nothing() {
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut s = String::from("x");
            assert!(!push_f64(&mut s, x));
            assert_eq!(s, "x");
        }
    }

    #[test]
    fn floats_read_back_exactly() {
        let mut x = 1.0e-310_f64;
        while x < 1e300 {
            for v in [x, -x, x * 1.000_000_1, x / 3.0] {
                assert_eq!(repr(v).parse::<f64>().ok(), Some(v));
            }
            x *= 7.3;
        }
    }

    #[test]
    fn strings_escape_as_ensure_ascii() {
        assert_eq!(quoted("plain text"), "\"plain text\"");
        assert_eq!(quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(quoted("\n\r\t\u{8}\u{c}"), "\"\\n\\r\\t\\b\\f\"");
        assert_eq!(quoted("\u{0}\u{1f}\u{7f}"), "\"\\u0000\\u001f\\u007f\"");
        assert_eq!(quoted("é/日本"), "\"\\u00e9/\\u65e5\\u672c\"");
        assert_eq!(quoted("🙂"), "\"\\ud83d\\ude42\"");
        assert_eq!(quoted(""), "\"\"");
    }
}
