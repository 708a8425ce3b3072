//! CPython's own arithmetic where the weights rules lean on it, so the
//! kernels give the plain-Python reference's numbers bit for bit:
//! `math.fsum` (exact summation, correctly rounded), `sorted` (CPython
//! 3.11's timsort, which orders NaN the way its `<` happens to, not by a
//! total order), `statistics.median` over that sort, `min`/`max` of
//! floats, and `str()` / `.name` of a `pathlib.Path`.

use std::path::Path;

use crate::Error;

use super::timsort;

/// `math.fsum(xs)`; `None` where CPython raises (an intermediate overflow of
/// finite values, or `inf + -inf`).
pub fn fsum(xs: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut partials: Vec<f64> = Vec::new();
    let mut special_sum = 0.0_f64;
    let mut inf_sum = 0.0_f64;
    for item in xs {
        let xsave = item;
        let mut x = item;
        let mut i = 0;
        for j in 0..partials.len() {
            let mut y = partials.get(j).copied().unwrap_or(0.0);
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let yr = hi - x;
            let lo = y - yr;
            if lo != 0.0 {
                if let Some(slot) = partials.get_mut(i) {
                    *slot = lo;
                }
                i += 1;
            }
            x = hi;
        }
        partials.truncate(i);
        if x != 0.0 {
            if !x.is_finite() {
                // A nan or inf among the values, or an overflow of finite ones.
                if xsave.is_finite() {
                    return None;
                }
                if xsave.is_infinite() {
                    inf_sum += xsave;
                }
                special_sum += xsave;
                partials.clear();
            } else {
                partials.push(x);
            }
        }
    }
    if special_sum != 0.0 {
        return if inf_sum.is_nan() {
            None
        } else {
            Some(special_sum)
        };
    }
    let mut hi = 0.0_f64;
    let mut n = partials.len();
    if n > 0 {
        n -= 1;
        hi = partials.get(n).copied().unwrap_or(0.0);
        let mut lo = 0.0_f64;
        while n > 0 {
            let x = hi;
            n -= 1;
            let y = partials.get(n).copied().unwrap_or(0.0);
            hi = x + y;
            let yr = hi - x;
            lo = y - yr;
            if lo != 0.0 {
                break;
            }
        }
        // Round half even across the remaining partials' sign.
        if n > 0 {
            let below = partials.get(n - 1).copied().unwrap_or(0.0);
            if (lo < 0.0 && below < 0.0) || (lo > 0.0 && below > 0.0) {
                let y = lo * 2.0;
                let x = hi + y;
                let yr = x - hi;
                if y == yr {
                    hi = x;
                }
            }
        }
    }
    Some(hi)
}

/// `x ** 2` as CPython computes it for a float: libm's `pow` (not `x * x`,
/// which may differ in the last bit); `None` where CPython raises
/// OverflowError (a finite `x` whose square overflows).
pub fn square_pow(x: f64) -> Option<f64> {
    let y = x.powf(std::hint::black_box(2.0));
    if y.is_infinite() && x.is_finite() {
        None
    } else {
        Some(y)
    }
}

/// Positions of `keys` in the order CPython 3.11's `sorted` puts them
/// (see [`timsort`]), comparing with `lt` only.
pub fn sorted_order<T>(keys: &[T], lt: impl Fn(&T, &T) -> bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    let less = |a: usize, b: usize| match (keys.get(a), keys.get(b)) {
        (Some(x), Some(y)) => lt(x, y),
        _ => false,
    };
    timsort::sort(&mut order, &less);
    order
}

/// `sorted(xs)` of floats (CPython compares floats with `<`).
pub fn sorted_floats(xs: &[f64]) -> Vec<f64> {
    sorted_order(xs, |a, b| a < b)
        .into_iter()
        .filter_map(|i| xs.get(i).copied())
        .collect()
}

/// `statistics.median(xs)` of floats; `None` for no values (StatisticsError).
pub fn median(xs: &[f64]) -> Option<f64> {
    let data = sorted_floats(xs);
    let n = data.len();
    if n == 0 {
        return None;
    }
    let i = n / 2;
    if n % 2 == 1 {
        data.get(i).copied()
    } else {
        Some((data.get(i - 1)? + data.get(i)?) / 2.0)
    }
}

/// `statistics.median` of non-negative ints: an int for an odd count, the
/// float mean of the middle two for an even one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IntMedian {
    Int(u64),
    Float(f64),
}

pub fn median_int(xs: &[u64]) -> Option<IntMedian> {
    let mut data = xs.to_vec();
    data.sort_unstable();
    let n = data.len();
    if n == 0 {
        return None;
    }
    let i = n / 2;
    if n % 2 == 1 {
        data.get(i).copied().map(IntMedian::Int)
    } else {
        // Python's int / int is the correctly rounded quotient; halving is
        // exact, so rounding the exact sum once gives the same float.
        let sum = u128::from(*data.get(i - 1)?) + u128::from(*data.get(i)?);
        Some(IntMedian::Float(sum as f64 / 2.0))
    }
}

/// `min(xs)` of floats as the builtin finds it (a later value replaces the
/// current one only when `<` it, so a leading NaN stays); None when empty.
pub fn py_min(xs: &[f64]) -> Option<f64> {
    let (first, rest) = xs.split_first()?;
    Some(rest.iter().fold(*first, |m, &x| if x < m { x } else { m }))
}

/// `max(xs)` of floats, as [`py_min`] with `>`.
pub fn py_max(xs: &[f64]) -> Option<f64> {
    let (first, rest) = xs.split_first()?;
    Some(rest.iter().fold(*first, |m, &x| if x > m { x } else { m }))
}

/// The parts of a POSIX path as `pathlib.PurePosixPath` parses them: the
/// root (`""`, `"/"`, or `"//"` for exactly two leading slashes) and the
/// names, with empty and `.` parts dropped.
fn posix_parts(path: &Path) -> (&'static str, Vec<String>) {
    let text = path.to_string_lossy();
    let root = if text.starts_with("//") && !text.starts_with("///") {
        "//"
    } else if text.starts_with('/') {
        "/"
    } else {
        ""
    };
    let parts = text
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .map(str::to_string)
        .collect();
    (root, parts)
}

/// `str(pathlib.Path(path))` on POSIX: the text Python shows for a path a
/// Rust value hands it (`a//b/./c/` is `a/b/c`, an empty path `.`).
pub fn path_str(path: &Path) -> String {
    let (root, parts) = posix_parts(path);
    let joined = parts.join("/");
    if root.is_empty() && joined.is_empty() {
        ".".to_string()
    } else {
        format!("{root}{joined}")
    }
}

/// `pathlib.Path(path).name`: the last name, `""` for a bare root or `.`.
pub fn path_name(path: &Path) -> String {
    let (_, parts) = posix_parts(path);
    parts.last().cloned().unwrap_or_default()
}

/// `str(error)` of an error the Rust core hands Python (`"<path>:
/// <reason>"`, the path as pathlib shows it), or `"None"` for none.
pub fn error_str(error: Option<&Error>) -> String {
    match error {
        None => "None".to_string(),
        Some(e) if e.path.as_os_str().is_empty() => e.message.clone(),
        Some(e) => format!("{}: {}", path_str(&e.path), e.message),
    }
}
