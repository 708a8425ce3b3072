//! Python's float reductions as the rules were written with them, bit for
//! bit: `math.fsum` (Shewchuk's exact summation, correctly rounded, as
//! CPython computes it), the overflow-safe mean built on it, and
//! `statistics.median`.

/// Why `math.fsum` raised instead of answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsumError {
    /// `OverflowError`: finite values whose partial sums leave the float range.
    Overflow,
    /// `ValueError`: `inf` and `-inf` among the values.
    InfMinusInf,
}

/// `math.fsum(values)`: CPython's algorithm step for step (partials kept
/// exact, the top summed until inexact, then half-even rounding across
/// partials), so the result is the same float.
pub fn fsum(values: impl IntoIterator<Item = f64>) -> Result<f64, FsumError> {
    let mut partials: Vec<f64> = Vec::new();
    let mut special_sum = 0.0_f64;
    let mut inf_sum = 0.0_f64;
    for value in values {
        let mut x = value;
        let mut kept = 0;
        for j in 0..partials.len() {
            let mut y = partials.get(j).copied().unwrap_or(0.0);
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                if let Some(slot) = partials.get_mut(kept) {
                    *slot = lo;
                }
                kept += 1;
            }
            x = hi;
        }
        partials.truncate(kept);
        if x != 0.0 {
            if !x.is_finite() {
                // Either a partial sum overflowed or the value itself is inf/NaN.
                if value.is_finite() {
                    return Err(FsumError::Overflow);
                }
                if value.is_infinite() {
                    inf_sum += value;
                }
                special_sum += value;
                partials.clear();
            } else {
                partials.push(x);
            }
        }
    }
    if special_sum != 0.0 {
        return if inf_sum.is_nan() {
            Err(FsumError::InfMinusInf)
        } else {
            Ok(special_sum)
        };
    }
    let Some(mut hi) = partials.pop() else {
        return Ok(0.0);
    };
    let mut lo = 0.0_f64;
    while let Some(y) = partials.pop() {
        let x = hi;
        hi = x + y;
        lo = y - (hi - x);
        if lo != 0.0 {
            break;
        }
    }
    if let Some(&next) = partials.last() {
        if (lo < 0.0 && next < 0.0) || (lo > 0.0 && next > 0.0) {
            let y = lo * 2.0;
            let x = hi + y;
            if y == x - hi {
                hi = x;
            }
        }
    }
    Ok(hi)
}

/// The rules' `mean`: `fsum(values) / len(values)`, or where that sum
/// overflows, the same over the values divided by the largest magnitude,
/// scaled back. NaN for no values (the rules never take the mean of none).
pub fn mean(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    match fsum(values.iter().copied()) {
        Ok(sum) => sum / n,
        Err(FsumError::Overflow) => {
            let scale = values.iter().fold(0.0_f64, |m, v| {
                let a = v.abs();
                if a > m {
                    a
                } else {
                    m
                }
            });
            match fsum(values.iter().map(|v| v / scale)) {
                Ok(sum) => sum / n * scale,
                Err(_) => f64::NAN,
            }
        }
        Err(FsumError::InfMinusInf) => f64::NAN,
    }
}

/// `statistics.median(values)`: the middle of the values sorted (a stable
/// sort, as Python's: equal values such as 0.0 and -0.0 keep their order),
/// the mean of the two middle ones for an even count. NaN for none.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = sorted.len();
    let at = |i: usize| sorted.get(i).copied().unwrap_or(f64::NAN);
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        at(n / 2)
    } else {
        (at(n / 2 - 1) + at(n / 2)) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsum_matches_python() {
        // Values printed by Python 3.11's math.fsum.
        assert_eq!(fsum([0.1; 10]), Ok(1.0));
        assert_eq!(fsum([1e-16, 1.0, 1e16]), Ok(10000000000000002.0));
        assert_eq!(
            fsum([1e100, 1.0, -1e100, 1e-100, 1e50, -1.0, -1e50]),
            Ok(1e-100)
        );
        assert_eq!(fsum([-0.0]).map(f64::to_bits), Ok(0.0_f64.to_bits()));
        assert_eq!(fsum([]), Ok(0.0));
        assert_eq!(fsum([1e308, 1e308]), Err(FsumError::Overflow));
        assert_eq!(fsum([f64::INFINITY, 1.0]), Ok(f64::INFINITY));
        assert_eq!(
            fsum([f64::INFINITY, f64::NEG_INFINITY]),
            Err(FsumError::InfMinusInf)
        );
        assert!(fsum([f64::NAN, 1.0]).is_ok_and(f64::is_nan));
    }

    #[test]
    fn mean_survives_an_overflowing_sum() {
        assert_eq!(mean(&[1.0, 2.0, 4.0]), 7.0 / 3.0);
        // Python: fsum([v / 1e308 for v in (1e308, 1e308)]) / 2 * 1e308
        assert_eq!(mean(&[1e308, 1e308]), 1e308);
        assert!(mean(&[]).is_nan());
    }

    #[test]
    fn median_is_statistics_median() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median([]).is_nan());
        // Stable: -0.0 before 0.0 as given, so the middle is the given one.
        assert!(median([0.0, -0.0, -0.0]).is_sign_negative());
        assert!(median([-0.0, 0.0, 0.0]).is_sign_positive());
    }
}
