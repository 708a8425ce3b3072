//! Numbers spelled exactly as Python's format specs spell them, for
//! messages: `fixed(x, 2)` is `f"{x:.2f}"`, `general(x, 4)` is
//! `f"{x:.4g}"`, `percent(x, 1)` is `f"{x:.1%}"`, `thousands(n)` is
//! `f"{n:,}"` and `repr(x)` is `str(x)`.
//!
//! The rules were written in Python first and their plain-Python
//! references are compared with the kernels text for text, so "about the
//! same" is not enough. Rust's float formatting is exactly rounded, as
//! Python's is, so the digits agree; what differs is spelled here: the
//! `g` style's choice between positional and exponent notation and its
//! trailing zeros, `e+05` exponents, `nan`/`inf` (NaN never signed).

use crate::io::json_text;

/// `nan`, `inf` or `-inf` for a non-finite `x` (Python drops NaN's sign).
fn non_finite(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some("nan")
    } else if x == f64::INFINITY {
        Some("inf")
    } else if x == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// `str(x)` / `repr(x)`: the shortest digits that read back as `x`.
pub fn repr(x: f64) -> String {
    if let Some(s) = non_finite(x) {
        return s.to_string();
    }
    let mut out = String::new();
    json_text::push_f64(&mut out, x);
    out
}

/// `f"{x:.{precision}f}"`.
pub fn fixed(x: f64, precision: usize) -> String {
    match non_finite(x) {
        Some(s) => s.to_string(),
        None => format!("{x:.precision$}"),
    }
}

/// `f"{x:+.{precision}f}"`: a sign always (`+nan`, `+inf` too).
pub fn signed_fixed(x: f64, precision: usize) -> String {
    let text = fixed(x, precision);
    if text.starts_with('-') {
        text
    } else {
        format!("+{text}")
    }
}

/// `f"{x:.{precision}%}"`: a hundred times `x` (one rounded product, as
/// Python computes it) in fixed notation, then `%`.
pub fn percent(x: f64, precision: usize) -> String {
    format!("{}%", fixed(x * 100.0, precision))
}

/// `f"{x:+.{precision}%}"`.
pub fn signed_percent(x: f64, precision: usize) -> String {
    format!("{}%", signed_fixed(x * 100.0, precision))
}

/// `f"{x:.{precision}g}"` (precision 0 counts as 1): `precision`
/// significant digits, positional when the decimal exponent is in
/// `-4..precision`, else `1.5e+300`; trailing zeros and a bare point dropped.
pub fn general(x: f64, precision: usize) -> String {
    if let Some(s) = non_finite(x) {
        return s.to_string();
    }
    let p = precision.max(1);
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let a = x.abs();
    // The exponent after rounding to p digits decides the notation.
    let sci = format!("{a:.prec$e}", prec = p - 1);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i64 = exp.parse().unwrap_or(0);
    let p_i = i64::try_from(p).unwrap_or(i64::MAX);
    if (-4..p_i).contains(&exp) {
        let decimals = usize::try_from(p_i - 1 - exp).unwrap_or(0);
        let text = format!("{a:.decimals$}");
        format!("{sign}{}", strip_zeros(&text))
    } else {
        let digits = if exp.abs() < 10 { 2 } else { 1 };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!(
            "{sign}{}e{exp_sign}{:0digits$}",
            strip_zeros(mantissa),
            exp.unsigned_abs(),
        )
    }
}

/// `f"{x:g}"`: six significant digits.
pub fn g(x: f64) -> String {
    general(x, 6)
}

/// Trailing zeros after a decimal point, and then the point, dropped.
fn strip_zeros(text: &str) -> &str {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    }
}

/// `f"{n:,}"`: thousands separated by commas.
pub fn thousands(n: impl Into<i128>) -> String {
    let n: i128 = n.into();
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// [`thousands`] of a count.
pub fn count(n: usize) -> String {
    thousands(i128::try_from(n).unwrap_or(i128::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected texts printed by CPython 3.11's format() for the same values.
    const XS: [f64; 18] = [
        0.0,
        -0.0,
        1.0,
        123456.789,
        0.000123456,
        1e-5,
        9.9995,
        99999.5,
        1e16,
        1.5e300,
        -2.5,
        0.125,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        2.675,
        1e-300,
        0.00001234,
    ];

    fn all(f: impl Fn(f64) -> String) -> Vec<String> {
        XS.iter().map(|&x| f(x)).collect()
    }

    #[test]
    fn general_matches_python() {
        let want_4g = [
            "0",
            "-0",
            "1",
            "1.235e+05",
            "0.0001235",
            "1e-05",
            "9.999",
            "1e+05",
            "1e+16",
            "1.5e+300",
            "-2.5",
            "0.125",
            "nan",
            "inf",
            "-inf",
            "2.675",
            "1e-300",
            "1.234e-05",
        ];
        assert_eq!(all(|x| general(x, 4)), want_4g);
        let want_3g = [
            "0", "-0", "1", "1.23e+05", "0.000123", "1e-05", "10", "1e+05", "1e+16", "1.5e+300",
            "-2.5", "0.125", "nan", "inf", "-inf", "2.67", "1e-300", "1.23e-05",
        ];
        assert_eq!(all(|x| general(x, 3)), want_3g);
        let want_g = [
            "0",
            "-0",
            "1",
            "123457",
            "0.000123456",
            "1e-05",
            "9.9995",
            "99999.5",
            "1e+16",
            "1.5e+300",
            "-2.5",
            "0.125",
            "nan",
            "inf",
            "-inf",
            "2.675",
            "1e-300",
            "1.234e-05",
        ];
        assert_eq!(all(g), want_g);
    }

    #[test]
    fn fixed_and_percent_match_python() {
        let want_2f = [
            "0.00",
            "-0.00",
            "1.00",
            "123456.79",
            "0.00",
            "0.00",
            "10.00",
            "99999.50",
            "10000000000000000.00",
        ];
        assert_eq!(all(|x| fixed(x, 2))[..9], want_2f);
        assert_eq!(fixed(-2.5, 2), "-2.50");
        assert_eq!(fixed(0.125, 2), "0.12");
        assert_eq!(fixed(2.675, 2), "2.67");
        assert_eq!(fixed(f64::NAN, 2), "nan");
        assert_eq!(fixed(-f64::NAN, 2), "nan");
        assert_eq!(fixed(2.675, 0), "3");
        let want_0pct = [
            "0%",
            "-0%",
            "100%",
            "12345679%",
            "0%",
            "0%",
            "1000%",
            "9999950%",
        ];
        assert_eq!(all(|x| percent(x, 0))[..8], want_0pct);
        assert_eq!(percent(2.675, 0), "268%");
        assert_eq!(percent(0.125, 1), "12.5%");
        assert_eq!(percent(9.9995, 1), "999.9%");
        assert_eq!(percent(f64::INFINITY, 0), "inf%");
        assert_eq!(signed_percent(0.0, 1), "+0.0%");
        assert_eq!(signed_percent(-0.0, 1), "-0.0%");
        assert_eq!(signed_percent(-2.5, 1), "-250.0%");
        assert_eq!(signed_percent(f64::NAN, 1), "+nan%");
        assert_eq!(signed_percent(f64::NEG_INFINITY, 1), "-inf%");
    }

    #[test]
    fn repr_and_thousands_match_python() {
        let want = [
            "0.0",
            "-0.0",
            "1.0",
            "123456.789",
            "0.000123456",
            "1e-05",
            "9.9995",
            "99999.5",
            "1e+16",
            "1.5e+300",
            "-2.5",
            "0.125",
            "nan",
            "inf",
            "-inf",
            "2.675",
            "1e-300",
            "1.234e-05",
        ];
        assert_eq!(all(repr), want);
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
        assert_eq!(thousands(1i128 << 64), "18,446,744,073,709,551,616");
        assert_eq!(count(2750), "2,750");
    }
}
