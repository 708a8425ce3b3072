//! Summaries of a logged side series (eval loss, gradient norm, learning
//! rate): a strided sample for evidence and charts, where it was not finite,
//! and how often it was exactly zero. One pass, so judging a store's side
//! series costs no more than reading it.

/// What the judges and the report need of one `(step, value)` series.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeriesSummary {
    /// Points in the series.
    pub len: usize,
    /// At most about `cap` evenly strided points, the first and last kept;
    /// a non-finite value is None.
    pub sampled: Vec<(i64, Option<f64>)>,
    /// Steps whose value is NaN or infinite, in order.
    pub nonfinite_steps: Vec<i64>,
    /// Values that are exactly 0.
    pub zeros: usize,
}

/// Summarise `points` (ascending steps), sampling at most about `cap` of them
/// (`cap` at least 1).
pub fn summarize(points: &[(i64, f64)], cap: usize) -> SeriesSummary {
    let n = points.len();
    let stride = if n <= cap.max(1) {
        1
    } else {
        n.div_ceil(cap.max(1))
    };
    let mut out = SeriesSummary {
        len: n,
        ..SeriesSummary::default()
    };
    for (i, &(step, value)) in points.iter().enumerate() {
        let finite = value.is_finite();
        if !finite {
            out.nonfinite_steps.push(step);
        } else if value == 0.0 {
            out.zeros += 1;
        }
        if i % stride == 0 || i + 1 == n {
            out.sampled.push((step, finite.then_some(value)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_samples_with_both_ends_kept() {
        let points: Vec<(i64, f64)> = (0..10)
            .map(|i| (i, if i == 3 { f64::NAN } else { (i % 2) as f64 }))
            .collect();
        let s = summarize(&points, 4);
        assert_eq!(s.len, 10);
        assert_eq!(s.nonfinite_steps, vec![3]);
        assert_eq!(s.zeros, 5); // the even steps
        assert_eq!(
            s.sampled.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![0, 3, 6, 9]
        );
        assert_eq!(s.sampled[1].1, None);
        assert_eq!(summarize(&[], 4), SeriesSummary::default());
    }
}
