//! What Adam's two moments can hold, so a tampered or corrupted optimizer
//! state is caught instead of judged.
//!
//! torch's Adam and AdamW (and NAdam, RAdam, AMSGrad's `exp_avg_sq`) start
//! from `m_0 = v_0 = 0` and keep, per element, with the gradient `g_t`
//! (weight decay, where Adam adds it, is part of `g_t` for both moments):
//!
//! ```text
//! m_t = β1 m_(t-1) + (1-β1) g_t   =  (1-β1) Σ_(j<t) β1^j g_(t-j)
//! v_t = β2 v_(t-1) + (1-β2) g_t²  =  (1-β2) Σ_(j<t) β2^j g²_(t-j)
//! ```
//!
//! So `v_t >= 0` always: a negative second moment is impossible. And by
//! Cauchy–Schwarz, writing `β1^j g = (β1/√β2)^j · (√β2^j g)`:
//!
//! ```text
//! |m_t| <= (1-β1) · sqrt(S_t(β1²/β2)) · sqrt(Σ_(j<t) β2^j g²)
//!        = (1-β1) · sqrt(S_t(β1²/β2) / (1-β2)) · sqrt(v_t)   =  K · sqrt(v_t)
//! ```
//!
//! with `S_t(r) = Σ_(j<t) r^j`, at most `1/(1-r)` when `r = β1²/β2 < 1`
//! (every usual setting). For torch's default betas (0.9, 0.999) `K` is
//! 7.27; for (0.9, 0.95) 1.17; for (0.9, 0.9999) 22.9. The rule of thumb
//! `|m| <= sqrt(v)/(1-β1)` (10 for β1 = 0.9) is therefore not a bound: a
//! healthy run with β2 = 0.9999 can exceed it. The check here flags an
//! element only when `|m| > MARGIN · K · sqrt(v) + ABS_SLACK`: MARGIN
//! absorbs float32 rounding of both moments, ABS_SLACK a second moment
//! that underflowed to 0 in float32 while the first did not (gradients
//! below about 1e-21). With `r >= 1` (β2 below β1²) the bound needs the
//! step count; without one nothing is checked.

/// Factor on the bound before an element is flagged.
pub const MARGIN: f64 = 2.0;
/// Absolute slack on `|m|` (see the module doc).
pub const ABS_SLACK: f64 = 1e-12;

/// `K` above for `betas` after `steps` steps (None: unknown, taken as
/// many), or None when the betas are not Adam's (`0 <= β1 < 1`,
/// `0 < β2 < 1`) or the bound needs a step count that is not known.
pub fn adam_bound(beta1: f64, beta2: f64, steps: Option<f64>) -> Option<f64> {
    if !((0.0..1.0).contains(&beta1) && beta2 > 0.0 && beta2 < 1.0) {
        return None;
    }
    let r = beta1 * beta1 / beta2;
    let sum = match steps {
        Some(t) if t >= 0.0 && t.is_finite() => {
            if (r - 1.0).abs() < 1e-12 {
                t
            } else {
                (1.0 - r.powf(t)) / (1.0 - r)
            }
        }
        _ if r < 1.0 => 1.0 / (1.0 - r),
        _ => return None,
    };
    let k = (1.0 - beta1) * (sum.max(0.0) / (1.0 - beta2)).sqrt();
    k.is_finite().then_some(k)
}

/// What a pass over one parameter's moments found.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairCheck {
    /// Elements whose second moment is negative.
    pub negative_v: u64,
    /// Elements whose first moment exceeds the bound.
    pub over_bound: u64,
    /// The largest `|m| / sqrt(v)` seen among flagged elements.
    pub worst_ratio: f64,
}

impl PairCheck {
    /// Check aligned chunks `m`, `v` of the two moments against `bound`
    /// (`K`, or None to check only the sign of `v`). Non-finite values are
    /// left to the non-finite counts.
    /// The same as `add` for little-endian float32 moments given as bytes
    /// (what torch saves for float32 parameters): decoded and checked in
    /// one pass, with no buffer of decoded values.
    pub fn add_f32_bytes(&mut self, m: &[u8], v: &[u8], bound: Option<f64>) {
        let f32s = |b: &[u8]| -> f64 { f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])) };
        let pairs = || {
            m.chunks_exact(4)
                .zip(v.chunks_exact(4))
                .map(|(m, v)| (f32s(m), f32s(v)))
        };
        self.negative_v += v
            .chunks_exact(4)
            .map(|v| u64::from(f32s(v) < 0.0))
            .sum::<u64>();
        if let Some(k) = bound {
            self.check_bound(pairs, (MARGIN * k) * (MARGIN * k));
        }
    }

    pub fn add(&mut self, m: &[f64], v: &[f64], bound: Option<f64>) {
        // Branch-free counts over the chunk (this runs over every element of
        // a state).
        self.negative_v += v.iter().map(|&v| u64::from(v < 0.0)).sum::<u64>();
        if let Some(k) = bound {
            let pairs = || m.iter().copied().zip(v.iter().copied());
            self.check_bound(pairs, (MARGIN * k) * (MARGIN * k));
        }
    }

    /// Count the pairs over the bound (`limit` = (MARGIN k)^2): one
    /// branch-free pass; where some are, a second that finds the worst
    /// with no square root or division per element (ratios compared as
    /// m_a^2 v_b > m_b^2 v_a), so a state whose every element is over the
    /// bound costs two passes, not one per element of float division.
    fn check_bound<I: Iterator<Item = (f64, f64)>>(&mut self, pairs: impl Fn() -> I, limit: f64) {
        let flagged: u64 = pairs().map(|(m, v)| u64::from(exceeds(m, v, limit))).sum();
        if flagged == 0 {
            return;
        }
        self.over_bound += flagged;
        // The worst flagged pair so far as (|m|, m^2, v); v = 0 is +inf.
        let (mut worst_m, mut worst_m2, mut worst_v) = (0.0f64, 0.0f64, 1.0f64);
        for (m, v) in pairs() {
            let m2 = m * m;
            if exceeds(m, v, limit) && m2 * worst_v > worst_m2 * v {
                (worst_m, worst_m2, worst_v) = (m.abs(), m2, v);
            }
        }
        // max keeps the finite one; v = 0 gives +inf, kept.
        self.worst_ratio = self.worst_ratio.max(worst_m / worst_v.sqrt());
    }
}

/// `|m| > MARGIN k sqrt(v) + ABS_SLACK`, as `(|m| - ABS_SLACK)^2 > limit v`
/// with `limit = (MARGIN k)^2`, for `v >= 0` and `|m| > ABS_SLACK` (no
/// square root per element); NaN and infinite `m` compare false.
#[inline]
fn exceeds(m: f64, v: f64, limit: f64) -> bool {
    let excess = m.abs() - ABS_SLACK;
    excess > 0.0 && v >= 0.0 && excess * excess > limit * v && m.is_finite()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run Adam's moment updates over `grads` (one element), as torch does.
    fn moments(grads: &[f64], b1: f64, b2: f64) -> (f64, f64) {
        grads.iter().fold((0.0, 0.0), |(m, v), &g| {
            (b1 * m + (1.0 - b1) * g, b2 * v + (1.0 - b2) * g * g)
        })
    }

    #[test]
    fn the_bound_holds_for_real_update_sequences_and_is_nearly_tight() {
        for (b1, b2) in [(0.9, 0.999), (0.9, 0.95), (0.9, 0.9999), (0.5, 0.9)] {
            let k = adam_bound(b1, b2, None).unwrap();
            // The sequence that reaches it: g_j proportional to (β1/β2)^j
            // back in time, all of one sign.
            let n = 20_000;
            let grads: Vec<f64> = (0..n).map(|j| (b1 / b2).powi(n - 1 - j)).collect();
            let (m, v) = moments(&grads, b1, b2);
            let ratio = m.abs() / v.sqrt();
            assert!(ratio <= k * (1.0 + 1e-9), "{b1} {b2}: {ratio} > {k}");
            assert!(ratio > 0.99 * k, "{b1} {b2}: {ratio} far below {k}");
            // Random-sign and constant gradients stay far inside it.
            let (m, v) = moments(&[1.0; 500], b1, b2);
            assert!(m.abs() <= k * v.sqrt());
            let mut check = PairCheck::default();
            check.add(&[m], &[v], Some(k));
            assert_eq!(check, PairCheck::default());
        }
        let default = adam_bound(0.9, 0.999, None).unwrap();
        assert!((default - 7.27).abs() < 0.01, "{default}");
        // After one step |m| = (1-β1)|g| and sqrt(v) = sqrt(1-β2)|g|.
        let one = adam_bound(0.9, 0.999, Some(1.0)).unwrap();
        assert!((one - 0.1 / 0.001f64.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn the_worst_ratio_is_the_plain_maximum_over_the_flagged_pairs() {
        let k = adam_bound(0.9, 0.999, None);
        let limit = (MARGIN * k.unwrap()).powi(2);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for round in 0..50 {
            let n = 1 + round * 7;
            let m: Vec<f64> = (0..n).map(|_| (next() - 0.5) * 10.0).collect();
            let mut v: Vec<f64> = (0..n).map(|_| next() * next() * 1e-2).collect();
            if round % 5 == 0 {
                v[n / 2] = 0.0; // an infinite ratio, where m is over the slack
            }
            let mut c = PairCheck::default();
            c.add(&m, &v, k);
            let flagged: Vec<f64> = m
                .iter()
                .zip(&v)
                .filter(|(&m, &v)| exceeds(m, v, limit))
                .map(|(m, v)| m.abs() / v.sqrt())
                .collect();
            assert_eq!(c.over_bound, flagged.len() as u64);
            let want = flagged.iter().copied().fold(0.0, f64::max);
            assert!(
                c.worst_ratio == want || (c.worst_ratio - want).abs() <= 1e-12 * want,
                "{} vs {want}",
                c.worst_ratio
            );
        }
    }

    #[test]
    fn impossible_pairs_are_counted() {
        let k = adam_bound(0.9, 0.999, None);
        let mut c = PairCheck::default();
        c.add(&[0.0, 1.0, 1e-30, 0.5], &[-1e-8, 1e-6, 0.0, f64::NAN], k);
        assert_eq!((c.negative_v, c.over_bound), (1, 1));
        assert!(c.worst_ratio > 900.0);
        // The float32 byte path counts the same.
        let (m, v) = ([0.0f32, 1.0, 1e-30, 0.5], [-1e-8f32, 1e-6, 0.0, f32::NAN]);
        let bytes = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|f| f.to_le_bytes()).collect() };
        let mut b = PairCheck::default();
        b.add_f32_bytes(&bytes(&m), &bytes(&v), k);
        assert_eq!((b.negative_v, b.over_bound), (1, 1));
        assert_eq!(adam_bound(1.0, 0.999, None), None);
        assert_eq!(adam_bound(0.9, 0.5, None), None); // r >= 1 needs the step
        assert!(adam_bound(0.9, 0.5, Some(10.0)).is_some());
    }
}
