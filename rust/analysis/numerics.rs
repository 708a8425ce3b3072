//! The shared numerics of the verdict rules, in one place: an exact
//! compensated sum, the mean built on it, medians and extremes.
//!
//! NaN policy: [`fsum`] and [`mean`] propagate NaN (a NaN among the values
//! is a NaN result, which the rules treat as an event of its own); [`median`]
//! and [`extremes`] leave NaN values out, so one NaN neither hides in a sort
//! order nor moves the middle. Orders are total (`f64::total_cmp`: -0.0
//! before 0.0), never an accident of `<` on NaN.

use std::cmp::Ordering;

/// Why [`fsum`] has no finite answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsumError {
    /// Finite values whose partial sums leave the float range.
    Overflow,
    /// `inf` and `-inf` among the values.
    InfMinusInf,
}

/// The correctly rounded sum of `values` (Shewchuk's exact partials, the
/// top summed until inexact, then half-even rounding across partials):
/// independent of the values' order, so permuting layers or modules never
/// moves a total by a bit. An infinity among the values is the answer; NaN
/// propagates.
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

/// `fsum(values) / len(values)`, or where that sum overflows, the same over
/// the values divided by the largest magnitude, scaled back. NaN for no
/// values.
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

/// The median of the values that are not NaN (the mean of the two middle
/// ones for an even count); `None` when none is left.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut sorted: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    middle(&sorted)
}

/// The median of values already sorted by `total_cmp`, none of them NaN.
fn middle(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let upper = *sorted.get(n / 2)?;
    if n % 2 == 1 {
        Some(upper)
    } else {
        let lower = *sorted.get(n / 2 - 1)?;
        let sum = lower + upper;
        // Two values near f64::MAX: halve first rather than overflow.
        Some(
            if sum.is_finite() || !lower.is_finite() || !upper.is_finite() {
                sum / 2.0
            } else {
                lower / 2.0 + upper / 2.0
            },
        )
    }
}

/// The median of counts: a count for an odd number of them, the mean of
/// the two middle ones (a float) for an even number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CountMedian {
    Count(u64),
    Between(f64),
}

/// The median of `counts`; `None` for none.
pub fn count_median(counts: &[u64]) -> Option<CountMedian> {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let upper = *sorted.get(n / 2)?;
    if n % 2 == 1 {
        Some(CountMedian::Count(upper))
    } else {
        let lower = *sorted.get(n / 2 - 1)?;
        Some(CountMedian::Between((lower as f64 + upper as f64) / 2.0))
    }
}

/// The smallest and largest values that are not NaN; `None` when none is left.
pub fn extremes(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| !v.is_nan())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((
                if v.total_cmp(&lo) == Ordering::Less {
                    v
                } else {
                    lo
                },
                if v.total_cmp(&hi) == Ordering::Greater {
                    v
                } else {
                    hi
                },
            )),
        })
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
    fn median_leaves_nan_out() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([]), None);
        assert_eq!(median([f64::NAN, f64::NAN]), None);
        // NaN is left out wherever it stands, never sorted into the middle.
        assert_eq!(median([f64::NAN, 5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median([5.0, 1.0, f64::NAN, 3.0]), Some(3.0));
        assert_eq!(median([f64::INFINITY, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([f64::MAX, f64::MAX]), Some(f64::MAX));
        // A total order: -0.0 sorts before 0.0.
        assert!(median([0.0, -0.0, -0.0]).is_some_and(f64::is_sign_negative));
        assert!(median([0.0, -0.0, 0.0]).is_some_and(f64::is_sign_positive));
    }

    #[test]
    fn median_does_not_depend_on_order() {
        let values = [0.3, f64::NAN, 7.0, -2.0, 0.3, 1e300, f64::NEG_INFINITY];
        let mut reversed = values;
        reversed.reverse();
        assert_eq!(median(values), median(reversed));
        assert_eq!(median(values), Some(0.3));
    }

    #[test]
    fn count_median_is_a_count_or_between_two() {
        assert_eq!(count_median(&[5, 1, 3]), Some(CountMedian::Count(3)));
        assert_eq!(count_median(&[1, 2]), Some(CountMedian::Between(1.5)));
        assert_eq!(
            count_median(&[u64::MAX, u64::MAX]),
            Some(CountMedian::Between(u64::MAX as f64))
        );
        assert_eq!(count_median(&[]), None);
    }

    #[test]
    fn extremes_leave_nan_out() {
        assert_eq!(extremes([2.0, f64::NAN, 1.0, 3.0]), Some((1.0, 3.0)));
        assert_eq!(extremes([f64::NAN]), None);
        assert_eq!(extremes([]), None);
        assert_eq!(extremes([f64::INFINITY, -1.0]), Some((-1.0, f64::INFINITY)));
    }
}
