//! Numbers in verdict messages: one small formatter, so every rule spells
//! a figure the same way and says its unit. What a reader needs is the
//! meaning (`12.5%`, `3.1e-05`, `2,750 steps`), not any one language's
//! digits, so the rules here are ours: a fixed count of decimals, or of
//! significant digits with an exponent only where positional digits would
//! run long; `NaN` and `inf` spelled out; a sign where a change is meant.

/// `NaN`, `inf` or `-inf` for a non-finite `x`.
fn non_finite(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some("NaN")
    } else if x.is_infinite() {
        Some(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        None
    }
}

/// `x` with `decimals` digits after the point: `fixed(0.125, 2)` is `0.12`
/// (round half to even on the exact binary value).
pub fn fixed(x: f64, decimals: usize) -> String {
    match non_finite(x) {
        Some(s) => s.to_string(),
        None => format!("{x:.decimals$}"),
    }
}

/// A fraction as a percentage with `decimals` decimals: `0.125` is `12.5%`.
pub fn percent(x: f64, decimals: usize) -> String {
    format!("{}%", fixed(x * 100.0, decimals))
}

/// A relative change as a signed percentage: `+0.5%` is a rise, `-3.0%` a fall.
pub fn signed_percent(x: f64, decimals: usize) -> String {
    let text = percent(x, decimals);
    if text.starts_with('-') || x.is_nan() {
        text
    } else {
        format!("+{text}")
    }
}

/// `x` to `digits` significant digits (at least one), trailing zeros
/// dropped: positional from 1e-4 up to 10^digits (`0.0001235`, `1235`),
/// else with an exponent (`1.235e5`, `1.2e-5`), so no figure hides its
/// size behind a row of zeros.
pub fn significant(x: f64, digits: usize) -> String {
    if let Some(s) = non_finite(x) {
        return s.to_string();
    }
    let digits = digits.max(1);
    if x == 0.0 {
        return "0".to_string();
    }
    // The exponent of x once rounded to `digits` digits picks the notation.
    let sci = format!("{x:.prec$e}", prec = digits - 1);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i64 = exp.parse().unwrap_or(0);
    let width = i64::try_from(digits).unwrap_or(i64::MAX);
    if (-4..width).contains(&exp) {
        let decimals = usize::try_from(width - 1 - exp).unwrap_or(0);
        strip_zeros(&format!("{x:.decimals$}")).to_string()
    } else {
        format!("{}e{exp}", strip_zeros(mantissa))
    }
}

/// A threshold as the user set it: the shortest digits that read back as
/// `x` (`0.05`, `1`, `1e-8`).
pub fn setting(x: f64) -> String {
    match non_finite(x) {
        Some(s) => s.to_string(),
        None => strip_zeros(&format!("{x:?}")).to_string(),
    }
}

/// Trailing zeros after a decimal point, and then the point, dropped.
fn strip_zeros(text: &str) -> &str {
    match text.split_once('e') {
        Some(_) => text,
        None if text.contains('.') => text.trim_end_matches('0').trim_end_matches('.'),
        None => text,
    }
}

/// A whole number with its thousands separated by commas: `2,750`.
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

    #[test]
    fn non_finite_values_are_spelled_out() {
        for text in [
            fixed(f64::NAN, 2),
            significant(-f64::NAN, 3),
            setting(f64::NAN),
        ] {
            assert_eq!(text, "NaN");
        }
        assert_eq!(percent(f64::INFINITY, 0), "inf%");
        assert_eq!(signed_percent(f64::NAN, 1), "NaN%");
        assert_eq!(signed_percent(f64::NEG_INFINITY, 1), "-inf%");
        assert_eq!(significant(f64::NEG_INFINITY, 4), "-inf");
    }

    #[test]
    fn percentages_carry_their_unit_and_a_change_its_sign() {
        assert_eq!(percent(0.125, 1), "12.5%");
        assert_eq!(percent(0.5, 0), "50%");
        assert_eq!(signed_percent(0.005, 1), "+0.5%");
        assert_eq!(signed_percent(0.0, 1), "+0.0%");
        assert_eq!(signed_percent(-0.03, 1), "-3.0%");
    }

    #[test]
    fn significant_digits_switch_to_an_exponent_at_the_ends() {
        let cases = [
            (0.0, 4, "0"),
            (1.0, 4, "1"),
            (-2.5, 4, "-2.5"),
            (1234.5678, 4, "1235"),
            (9.9995, 3, "10"),
            (123_456.789, 4, "1.235e5"),
            (0.000_123_456, 4, "0.0001235"),
            (0.000_012_34, 4, "1.234e-5"),
            (1.5e300, 4, "1.5e300"),
            (99_999.5, 4, "1e5"),
            (0.25, 0, "0.2"),
        ];
        for (x, digits, want) in cases {
            assert_eq!(significant(x, digits), want, "{x} to {digits} digits");
        }
    }

    #[test]
    fn significant_keeps_the_digits_it_was_asked_for() {
        // Read back, the text is x to within half a unit of its last digit.
        for &x in &[0.3217, 17.77, 4.2e-7, 6.02e23, 123.456] {
            let back: f64 = significant(x, 3).parse().unwrap();
            assert!(((back - x) / x).abs() <= 5e-3, "{x} -> {back}");
        }
    }

    #[test]
    fn settings_read_back_exactly() {
        for &x in &[0.05, 1.0, 1e-8, 0.1 + 0.2, 3e20] {
            let text = setting(x);
            assert_eq!(text.parse::<f64>().unwrap(), x, "{text}");
        }
        assert_eq!(setting(1.0), "1");
        assert_eq!(setting(0.05), "0.05");
    }

    #[test]
    fn fixed_and_thousands() {
        assert_eq!(fixed(2.675, 2), "2.67");
        assert_eq!(fixed(-2.5, 2), "-2.50");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
        assert_eq!(thousands(1i128 << 64), "18,446,744,073,709,551,616");
        assert_eq!(count(2750), "2,750");
    }
}
