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

use crate::formats::tensor_data::widest;

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
        // The worst flagged pair so far as (|m|, m^2, v) per lane (pair `i`
        // in lane `i % 8`, so the search vectorizes), then over the lanes;
        // v = 0 is +inf.
        const LANES: usize = 8;
        let mut worst = [(0.0f64, 0.0f64, 1.0f64); LANES];
        let mut all = pairs();
        loop {
            let mut group = [(0.0f64, -1.0f64); LANES]; // v < 0: never flagged
            let mut filled = 0;
            for (g, p) in group.iter_mut().zip(&mut all) {
                *g = p;
                filled += 1;
            }
            for (w, &(m, v)) in worst.iter_mut().zip(&group) {
                keep_worse(w, m, v, exceeds(m, v, limit));
            }
            if filled < LANES {
                break;
            }
        }
        // max keeps the finite one; v = 0 gives +inf, kept.
        self.worst_ratio = self.worst_ratio.max(worst_of_lanes(&worst));
    }
}

impl PairCheck {
    /// [`PairCheck::check_bound`] for float32 bytes in one pass: the flagged
    /// count and the worst pair per lane (pair `i` in lane `i % 8`), on
    /// fixed-width groups the compiler vectorizes, then over the lanes.
    /// The exact check of a block the float32 sorting left undecided.
    fn check_bound_f32(&mut self, m: &[u8], v: &[u8], limit: f64) {
        const LANES: usize = 8;
        let mut flagged = [0u64; LANES];
        let mut worst = [(0.0f64, 0.0f64, 1.0f64); LANES];
        let lane = |w: &mut (f64, f64, f64), count: &mut u64, m: f64, v: f64| {
            let flag = exceeds(m, v, limit);
            *count += u64::from(flag);
            keep_worse(w, m, v, flag);
        };
        let mut mc = m.chunks_exact(4 * LANES);
        let mut vc = v.chunks_exact(4 * LANES);
        for (mb, vb) in (&mut mc).zip(&mut vc) {
            let (mm, vv) = (f32x8(mb), f32x8(vb));
            for j in 0..LANES {
                lane(
                    &mut worst[j],
                    &mut flagged[j],
                    f64::from(mm[j]),
                    f64::from(vv[j]),
                );
            }
        }
        let (mm, vv) = (f32x8(mc.remainder()), f32x8(vc.remainder()));
        for j in 0..vc.remainder().len().min(mc.remainder().len()) / 4 {
            lane(
                &mut worst[j],
                &mut flagged[j],
                f64::from(mm[j]),
                f64::from(vv[j]),
            );
        }
        let flagged: u64 = flagged.iter().sum();
        if flagged == 0 {
            return;
        }
        self.over_bound += flagged;
        self.worst_ratio = self.worst_ratio.max(worst_of_lanes(&worst));
    }
}

/// Make `w`, a lane's worst flagged pair so far as `(|m|, m^2, v)`, the
/// pair `(m, v)` when that is flagged and its ratio larger (compared as
/// `m^2 w.v > w.m^2 v`: no division), branch-free.
#[inline(always)]
fn keep_worse(w: &mut (f64, f64, f64), m: f64, v: f64, flagged: bool) {
    let m2 = m * m;
    // abs: a v of -0.0 is 0 (its ratio +inf, not -inf).
    let better = flagged & (m2 * w.2 > w.1 * v);
    *w = if better { (m.abs(), m2, v.abs()) } else { *w };
}

/// The ratio `|m| / sqrt(v)` of the worst of per-lane worst pairs
/// `(|m|, m^2, v)` (lanes with none flagged hold `(0, 0, 1)`).
fn worst_of_lanes(worst: &[(f64, f64, f64)]) -> f64 {
    let (mut worst_m, mut worst_m2, mut worst_v) = (0.0f64, 0.0f64, 1.0f64);
    for &(m, m2, v) in worst {
        if m2 * worst_v > worst_m2 * v {
            (worst_m, worst_m2, worst_v) = (m, m2, v);
        }
    }
    // v = 0 gives +inf.
    worst_m / worst_v.sqrt()
}

/// `|m| > MARGIN k sqrt(v) + ABS_SLACK`, as `(|m| - ABS_SLACK)^2 > limit v`
/// with `limit = (MARGIN k)^2`, for `v >= 0` and `|m| > ABS_SLACK` (no
/// square root per element); NaN and infinite `m` compare false.
#[inline(always)]
fn exceeds(m: f64, v: f64, limit: f64) -> bool {
    let a = m.abs();
    let excess = a - ABS_SLACK;
    // `&`, not `&&`: no branch per element, so the count vectorizes.
    (excess > 0.0) & (v >= 0.0) & (excess * excess > limit * v) & (a < f64::INFINITY)
}

/// Pairs checked per block of the float32 pass: its per-lane counts are
/// u32 (they stay far below 2^32) and flushed to u64 after each block.
#[cfg(not(test))]
const F32_BLOCK: usize = 4096;
/// Small in unit tests, so inputs of a few hundred pairs span many blocks
/// and a block is judged after others have set the worst ratio.
#[cfg(test)]
const F32_BLOCK: usize = 64;

/// One pass over aligned float32 pieces of Adam's two moments (what torch
/// saves for float32 parameters) that gathers everything the gradient probe
/// needs of them: the [`PairCheck`] and the sum and non-finite count of the
/// second moment, so `exp_avg_sq` is read once.
///
/// The sum is bit-identical to `float_reduce::reduce_bytes` over the same
/// chunk of the second moment (8 f64 lanes, element `i` of the chunk in lane
/// `i % 8`, combined the same way), provided every piece but the last has a
/// multiple of 8 elements. The bound is first tested in float32 with a
/// limit lowered by 2^-20 (a superset of the pairs the exact f64 test
/// flags: see [`F32_LIMIT_SHRINK`]); a block with a candidate is sorted in
/// float32 ([`FusedF32::classify`]) and checked exactly in f64 only where
/// that cannot decide, so a healthy state costs one cheap pass and a
/// tampered one about two.
#[derive(Debug, Clone, Default)]
pub struct FusedF32 {
    pub check: PairCheck,
    lanes: [f64; 8],
    nonfinite: u64,
    /// Whether the last block was suspect: the next is then sorted in the
    /// pass that sums it (a tampered state is suspect throughout).
    last_suspect: bool,
}

/// Relative amount the float32 prefilter lowers the limit by. If the exact
/// test flags a pair, `m^2 > (|m| - slack)^2 > limit v (1 - 2^-52)`; the f32
/// products round by at most 2^-24 each, so `fl32(m^2) > fl32(lim32 v)`
/// whenever `lim32 <= limit (1 - 2^-21)` (the f64 to f32 rounding of the
/// shrunk limit costs another 2^-24). A product that overflows f32 is a
/// candidate too.
const F32_LIMIT_SHRINK: f64 = 1.0 - 1.0 / (1u64 << 20) as f64;

/// Relative amount [`FusedF32::classify`] raises the limit by. With `s32`
/// the least float32 at or above `ABS_SLACK`, `hi32 = fl32(limit (1 +
/// 2^-20))` and `e = fl32(|m| - s32)`, a pair is surely flagged when `e` is
/// at least [`F32_SURE_E`] (so `fl32(e^2) >= 2^-100`), `fl32(e^2)` is above
/// `fl32(hi32 v)` (so `v` is not NaN), and `fl32(m^2)` is finite (so `m` is
/// finite); a negative `v` sends its block to the exact pass.
/// Then the exact test flags it: `e > 0` means `|m| > s32 >= ABS_SLACK`,
/// and `e <= (|m| - ABS_SLACK)(1 + 2^-24)` with `fl32(e^2)` normal, so,
/// where `hi32 v` is normal:
///
/// ```text
/// (|m| - ABS_SLACK)^2 >= fl32(e^2) (1 + 2^-24)^-3
///                      > fl32(hi32 v) (1 + 2^-24)^-3
///                     >= limit v (1 + 2^-20) (1 - 2^-24)^2 (1 + 2^-24)^-3
///                     >= limit v (1 + 11 2^-24)
/// ```
///
/// far above the few 2^-53 the f64 test's roundings can take. Where
/// `hi32 v` is below the normal range, `limit v < hi32 v < 2^-125`, far
/// below `fl32(e^2) >= 2^-100`. A surely flagged pair is a candidate of the
/// prefilter too, so each pair is surely fine, surely flagged, or in the
/// band between (a candidate not surely flagged): only the band needs the
/// exact test to decide its flag.
const F32_LIMIT_RAISE: f64 = 1.0 + 1.0 / (1u64 << 20) as f64;

/// The least `fl32(|m| - s32)` of a surely flagged pair: 2^-50, so its
/// square is normal and the relative rounding bound above holds.
const F32_SURE_E: f32 = 1.0 / (1u64 << 50) as f32;

/// The limits (`(MARGIN K)^2`) [`FusedF32::classify`] handles: 2^-60 to
/// 2^60, so `hi32` is finite and normal. Outside (betas no optimizer
/// uses) a suspect block is tested pair by pair in f64.
const F32_CLASSIFY_LIMITS: (f64, f64) = (8.673_617_379_884_035e-19, 1.152_921_504_606_847e18);

/// `fl32(worst^2 (1 - 2^-20))`, the limit a pair's `m^2 / v` must pass to
/// beat `worst` (see [`FusedF32::classify`]): infinite for an infinite
/// `worst` (nothing beats it), 0 where `worst^2` is past float32's range
/// (every flagged pair is looked at).
fn worst_limit(worst: f64) -> f32 {
    match worst * worst * F32_LIMIT_SHRINK {
        _ if worst == f64::INFINITY => f32::INFINITY,
        w if w < f64::from(f32::MAX) => w as f32,
        _ => 0.0,
    }
}

/// A pair with `e = fl32(|m| - s32) >= 0` (`s32` as in [`F32_LIMIT_RAISE`])
/// is surely fine when `fl32(u^2) <= fl32(lo32 v)`, `u = fl32(e + F32_UP)`,
/// and `fl32(m^2)` is finite. The slack decides many tiny moments of a
/// real state (`|m|` near `ABS_SLACK`, `v` near 1e-27), where `m^2` alone
/// would send the block to the exact pass. Proof: `s32 - ABS_SLACK <=
/// ABS_SLACK 2^-23 < F32_UP` and `|m| - s32 <= e (1 + 2^-23)`, so `u >=
/// (|m| - ABS_SLACK)(1 - 2^-22)`. A flagged pair has `(|m| - ABS_SLACK)^2 >
/// limit v (1 - 2^-50)`, so `fl32(u^2) > limit v (1 - 2^-20.4)`, above
/// `fl32(lo32 v) <= limit v (1 - 2^-20)(1 + 2^-24)^2` where that is normal.
/// `u >= F32_UP` makes `fl32(u^2) >= 2^-124` normal, above any subnormal
/// `lo32 v`. Where `lo32 v` overflows and `m^2` does not, `(|m| -
/// ABS_SLACK)^2 < MAX < limit v`.
const F32_UP: f32 = 1.0 / (1u64 << 62) as f32; // 2.2e-19

/// The least float32 at or above `ABS_SLACK`.
fn slack32() -> f32 {
    let s = ABS_SLACK as f32;
    if f64::from(s) < ABS_SLACK {
        f32::from_bits(s.to_bits() + 1)
    } else {
        s
    }
}

/// What [`FusedF32::classify`] found in a block.
struct Sorted {
    /// Pairs surely flagged (the exact count when `undecided` is false).
    flagged: u64,
    /// A pair in the band, a negative `v`, or a flagged pair that may beat
    /// the worst ratio so far: the block needs the exact pass (rare: ties
    /// with the worst so far are few, and the worst only grows).
    undecided: bool,
}

/// Values among little-endian float32 bytes that `which` picks.
fn count_f32(bytes: &[u8], which: impl Fn(f32) -> bool) -> u64 {
    bytes
        .chunks_exact(4)
        .filter(|c| which(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .count() as u64
}

/// Whether the float32 prefilter keeps the pair (`lv` = the shrunk
/// limit times `v`): `m^2 > lv`, a NaN on either side, or `lv` overflowed.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)] // the negations keep NaN, as they must
fn candidate(m: f32, lv: f32) -> bool {
    !(m * m <= lv) | !(lv < f32::INFINITY)
}

#[inline(always)]
fn f32x8(bytes: &[u8]) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    out
}

impl FusedF32 {
    /// Add aligned pieces `m` and `v` (little-endian float32, the same
    /// number of bytes) against `bound` (`K`, or None to check only the
    /// sign of `v`), with the widest vector instructions the CPU has: the
    /// sorting pass a tampered state takes has about six times the clean
    /// pass's operations a pair, which AVX-512 makes as cheap as reading.
    pub fn add(&mut self, m: &[u8], v: &[u8], bound: Option<f64>) {
        widest(
            #[inline(always)]
            || self.add_here(m, v, bound),
        );
    }

    /// [`FusedF32::add`] in whatever instructions its caller is compiled for.
    #[inline(always)]
    fn add_here(&mut self, m: &[u8], v: &[u8], bound: Option<f64>) {
        let limit = bound.map(|k| (MARGIN * k) * (MARGIN * k));
        let lim32 = limit.map_or(0.0, |l| (l * F32_LIMIT_SHRINK) as f32);
        let sortable =
            limit.filter(|l| (F32_CLASSIFY_LIMITS.0..=F32_CLASSIFY_LIMITS.1).contains(l));
        let n = (m.len().min(v.len()) / 4) * 4;
        for (mb, vb) in m[..n]
            .chunks(4 * F32_BLOCK)
            .zip(v[..n].chunks(4 * F32_BLOCK))
        {
            let was_finite = self.lanes.iter().all(|l| l.is_finite());
            let suspect = match (self.last_suspect, sortable, limit) {
                (true, Some(limit), _) => {
                    let sorted = self.classify::<true>(mb, vb, limit);
                    self.settle(mb, vb, limit, &sorted);
                    sorted.flagged > 0 || sorted.undecided
                }
                (_, _, None) => {
                    let suspect = self.block::<false>(mb, vb, lim32);
                    if suspect {
                        self.check.negative_v += count_f32(vb, |x| x < 0.0);
                    }
                    suspect
                }
                (_, _, Some(limit)) => {
                    let suspect = self.block::<true>(mb, vb, lim32);
                    if suspect && sortable.is_some() {
                        let sorted = self.classify::<false>(mb, vb, limit);
                        self.settle(mb, vb, limit, &sorted);
                    } else if suspect {
                        self.check.negative_v += count_f32(vb, |x| x < 0.0);
                        self.check.check_bound_f32(mb, vb, limit);
                    }
                    suspect
                }
            };
            self.last_suspect = suspect;
            // A non-finite v makes its lane's sum non-finite for good: a
            // block that leaves the lanes finite has none (the common case,
            // which counts nothing).
            if !(was_finite && self.lanes.iter().all(|l| l.is_finite())) {
                self.nonfinite += count_f32(vb, |x| !x.is_finite());
            }
        }
    }

    /// One block: the lane sums of `v`, and whether any pair is suspect (a
    /// negative `v`, or with `BOUND` a candidate of the prefilter), so
    /// the main loop keeps just the sums and one mask per lane.
    #[inline(always)]
    fn block<const BOUND: bool>(&mut self, m: &[u8], v: &[u8], lim32: f32) -> bool {
        let mut suspect = [false; 8];
        let mut mc = m.chunks_exact(32);
        let mut vc = v.chunks_exact(32);
        let flag = |m: f32, v: f32| (v < 0.0) | (BOUND && candidate(m, lim32 * v));
        for (mb, vb) in (&mut mc).zip(&mut vc) {
            let (mm, vv) = (f32x8(mb), f32x8(vb));
            for (l, &x) in self.lanes.iter_mut().zip(&vv) {
                *l += f64::from(x);
            }
            for j in 0..8 {
                suspect[j] |= flag(mm[j], vv[j]);
            }
        }
        let (mm, vv) = (f32x8(mc.remainder()), f32x8(vc.remainder()));
        for j in 0..vc.remainder().len() / 4 {
            self.lanes[j] += f64::from(vv[j]);
            suspect[j] |= flag(mm[j], vv[j]);
        }
        suspect.iter().any(|&s| s)
    }

    /// Sort a block's float32 pairs in one branch-free pass (pair `i` in
    /// lane `i % 8`, so it vectorizes; with `SUMS` the lane sums of `v` are
    /// added too, as [`FusedF32::block`] adds them): surely fine, surely
    /// flagged (counted; see [`F32_LIMIT_RAISE`]) or in the band between
    /// (see [`Sorted`]). A tampered state, every block suspect, so costs
    /// about the one pass a healthy state costs, and the f64 check runs
    /// only where float32 cannot decide.
    ///
    /// A surely flagged pair may beat `w`, the worst ratio so far, when
    /// `fl32(m^2) > fl32(w_lo v)` with `w_lo = fl32(w^2 (1 - 2^-20))`: the
    /// prefilter's test with `w^2` for the limit, so a superset of the
    /// pairs with `|m| / sqrt(v) > w` (see [`F32_LIMIT_SHRINK`]; a surely
    /// flagged `m^2` is normal, so a product `w_lo v` below the normal
    /// range cannot hide one). Nothing beats an infinite `w`; where `w^2`
    /// is past float32's range every flagged pair is looked at.
    #[inline(always)]
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // the negation keeps NaN
    fn classify<const SUMS: bool>(&mut self, m: &[u8], v: &[u8], limit: f64) -> Sorted {
        const LANES: usize = 8;
        let lo = (limit * F32_LIMIT_SHRINK) as f32;
        let hi = (limit * F32_LIMIT_RAISE) as f32;
        let slack = slack32();
        let worst_lo = worst_limit(self.check.worst_ratio);
        // Conditions as u32 masks (0 or all ones, what a vector compare
        // gives), so nothing converts between bools and integers.
        let all = |c: bool| u32::from(c).wrapping_neg();
        let mut flagged = [0u32; LANES];
        let mut undecided = [0u32; LANES];
        // A local copy, so the sums stay in registers.
        let mut lanes = self.lanes;
        let mut step = |j: usize, m: f32, v: f32| {
            if SUMS {
                lanes[j] += f64::from(v);
            }
            let m2 = m * m;
            let finite = all(m2 < f32::INFINITY);
            let e = m.abs() - slack;
            let sure = all(e >= F32_SURE_E) & all(e * e > hi * v) & finite;
            flagged[j] = flagged[j].wrapping_sub(sure);
            // Surely fine: `|m| < s32` (then `|m| <= ABS_SLACK`, as `s32`
            // is the least float32 at or above it), or see `F32_UP`. A
            // negative `v` is in the band too (`sure` above may hold for
            // one), so it sends the block to the exact pass, which counts
            // it.
            let lv = lo * v;
            let up = e + F32_UP;
            let fine = all(up * up <= lv) & finite;
            let band = (!sure & !fine & all(e >= 0.0)) | all(v < 0.0);
            let beats = sure & all(m2 > worst_lo * v);
            undecided[j] |= band | beats;
        };
        let mut mc = m.chunks_exact(4 * LANES);
        let mut vc = v.chunks_exact(4 * LANES);
        for (mb, vb) in (&mut mc).zip(&mut vc) {
            let (mm, vv) = (f32x8(mb), f32x8(vb));
            for j in 0..LANES {
                step(j, mm[j], vv[j]);
            }
        }
        let rest = vc.remainder().len().min(mc.remainder().len()) / 4;
        let (mm, vv) = (f32x8(mc.remainder()), f32x8(vc.remainder()));
        for j in 0..rest {
            step(j, mm[j], vv[j]);
        }
        self.lanes = lanes;
        Sorted {
            flagged: flagged.iter().map(|&c| u64::from(c)).sum(),
            undecided: undecided.iter().any(|&u| u != 0),
        }
    }

    /// Take a sorted block's count, or check it exactly where its sorting
    /// left it undecided.
    fn settle(&mut self, m: &[u8], v: &[u8], limit: f64, sorted: &Sorted) {
        if sorted.undecided {
            self.check.negative_v += count_f32(v, |x| x < 0.0);
            self.check.check_bound_f32(m, v, limit);
        } else {
            self.check.over_bound += sorted.flagged;
        }
    }

    /// Sum and non-finite count of the second moment's elements added.
    pub fn reduction(&self) -> (f64, u64) {
        let a = &self.lanes;
        (
            ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])),
            self.nonfinite,
        )
    }
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
        let mut b = FusedF32::default();
        b.add(&bytes(&m), &bytes(&v), k);
        assert_eq!((b.check.negative_v, b.check.over_bound), (1, 1));
        // A second moment of -0.0 is 0: the flagged pair's ratio is +inf.
        let mut z = PairCheck::default();
        z.add(&[1.0, 2.0], &[-0.0, 1e-6], k);
        assert_eq!((z.over_bound, z.worst_ratio), (2, f64::INFINITY));
        assert_eq!(adam_bound(1.0, 0.999, None), None);
        assert_eq!(adam_bound(0.9, 0.5, None), None); // r >= 1 needs the step
        assert!(adam_bound(0.9, 0.5, Some(10.0)).is_some());
    }

    /// A tampered state whose worst pair comes in a later block than the
    /// first flagged one: the block that holds it must be checked exactly,
    /// here where its second moment is subnormal and where it beats the
    /// earlier worst by one ulp, and where the earlier worst squared is
    /// past float32's range.
    #[test]
    fn a_later_block_holding_the_worst_pair_is_checked_exactly() {
        let k = adam_bound(0.9, 0.999, None);
        let bytes = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|f| f.to_le_bytes()).collect() };
        let filler = (1e-6f32, 1e-20f32); // ratio 1e4, flagged
        let tiny = f32::from_bits(7); // 1e-44, subnormal
        let cases = [
            // ratio 1e13, then about 1.2e14
            ((1e-2f32, 1e-30f32), (1e-8f32, tiny)),
            // one ulp above the first
            (
                (1e-2, 1e-30),
                (f32::from_bits(1e-2f32.to_bits() + 1), 1e-30),
            ),
            // ratio about 1.2e21, then twice that
            ((0.1, tiny), (0.2, tiny)),
        ];
        for (first, last) in cases {
            let mut pairs = vec![first];
            pairs.extend(std::iter::repeat_n(filler, 3 * F32_BLOCK));
            pairs.push(last);
            let (m, v): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
            let mut fused = FusedF32::default();
            fused.add(&bytes(&m), &bytes(&v), k);
            let wide = |x: &[f32]| -> Vec<f64> { x.iter().map(|&f| f64::from(f)).collect() };
            let mut plain = PairCheck::default();
            plain.add(&wide(&m), &wide(&v), k);
            assert_eq!(plain.over_bound, m.len() as u64);
            assert_eq!(fused.check, plain);
            let want = f64::from(last.0) / f64::from(last.1).sqrt();
            assert_eq!(fused.check.worst_ratio, want);
        }
    }

    /// Float32 moments near the bound: the pair `(m, v)` from `bits` as
    /// `style` says (raw bit patterns; `|m|` a hair either side of
    /// `MARGIN K sqrt(v) + ABS_SLACK`; zeros, negatives and extremes).
    fn pair(style: u8, a: u32, b: u32, k: f64) -> (f32, f32) {
        match style {
            0 => (f32::from_bits(a), f32::from_bits(b)),
            1 | 2 => {
                let v = f32::from_bits(b % 0x7f00_0000);
                let edge = MARGIN * k * f64::from(v).sqrt() + ABS_SLACK;
                let m = edge as f32;
                // A few ulps either side of the edge (style 2: far side).
                let ulps = (a % 7) as i32 - 3 + if style == 2 { 1 << 10 } else { 0 };
                let m = f32::from_bits((m.to_bits() as i32).saturating_add(ulps).max(0) as u32);
                (if a & 1 == 0 { m } else { -m }, v)
            }
            4 => {
                // A few ulps either side of the classifier's two limits (the
                // prefilter's lowered one and the raised one).
                let v = f32::from_bits(b % 0x7f00_0000);
                let scale = if a & 2 == 0 {
                    F32_LIMIT_SHRINK
                } else {
                    F32_LIMIT_RAISE
                };
                let edge = MARGIN * k * (scale * f64::from(v)).sqrt() + ABS_SLACK;
                let ulps = ((a >> 2) % 9) as i32 - 4;
                let m = f32::from_bits(
                    ((edge as f32).to_bits() as i32).saturating_add(ulps).max(0) as u32,
                );
                (if a & 1 == 0 { m } else { -m }, v)
            }
            5 => {
                // Tampered: far over the bound, the ratios near-ties (a few
                // ulps of m and of v around one ratio).
                let v = f32::from_bits(0x3000_0000 + (b % 8));
                let m = (1e4 * MARGIN * k * f64::from(v).sqrt()) as f32;
                let m = f32::from_bits(m.to_bits() + (a >> 1) % 4);
                (if a & 1 == 0 { m } else { -m }, v)
            }
            6 => {
                // Tampered, ratios spread over decades: |m| log-uniform in
                // 1e-11..0.1, v up to 1.2e-7, one in a hundred subnormal.
                let v = f32::from_bits(b % 0x3400_0000);
                let m = 10f32.powf(-11.0 + 10.0 * (a >> 1) as f32 / (u32::MAX >> 1) as f32);
                (if a & 1 == 0 { m } else { -m }, v)
            }
            7 => {
                // Around the absolute slack, the second moment tiny or zero.
                let m = f32::from_bits((ABS_SLACK as f32).to_bits() - 4 + a % 9);
                let v = [0.0, -0.0, f32::from_bits(b % 0x0100_0000)][(a >> 4) as usize % 3];
                (if a & 1 == 0 { m } else { -m }, v)
            }
            _ => {
                let picks = [
                    0.0,
                    -0.0,
                    -1e-30,
                    1e38,
                    f32::MAX,
                    f32::MIN_POSITIVE,
                    1e-40,
                    1.0,
                    1e15,
                    f32::INFINITY,
                    f32::NAN,
                ];
                (picks[a as usize % 11], picks[b as usize % 11])
            }
        }
    }

    proptest::proptest! {
        // Cheap (a few hundred pairs a case), and the near-ties and edges
        // it must meet are rare draws.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// The fused float32 pass counts what the plain f64 check counts,
        /// and its second-moment sum is bit-identical to the reducer's over
        /// the same chunk, whatever the pieces (multiples of 8 elements).
        #[test]
        fn the_fused_f32_pass_matches_the_plain_check_and_reducer(
            elems in proptest::collection::vec(
                (0u8..9, proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>()),
                0..700,
            ),
            tampered in 0u8..3,
            piece in 1usize..20,
            betas in 0usize..4,
        ) {
            let bound = [
                adam_bound(0.9, 0.999, None),
                adam_bound(0.9, 0.95, Some(3.0)),
                adam_bound(0.9, 0.9999, None),
                None,
            ][betas];
            let k = bound.unwrap_or(7.27);
            let (m, v): (Vec<f32>, Vec<f32>) =
                elems.iter().map(|&(s, a, b)| {
                    // A tampered state: nearly every pair far over the bound.
                    let s = match tampered { 1 if s != 0 => 5, 2 if s > 1 => 6, _ => s };
                    pair(s, a, b, k)
                }).unzip();
            let bytes = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|f| f.to_le_bytes()).collect() };
            let (mb, vb) = (bytes(&m), bytes(&v));
            let mut fused = FusedF32::default();
            // The same pass compiled for the baseline CPU, not `widest`.
            let mut baseline = FusedF32::default();
            for (mp, vp) in mb.chunks(32 * piece).zip(vb.chunks(32 * piece)) {
                fused.add(mp, vp, bound);
                baseline.add_here(mp, vp, bound);
            }
            proptest::prop_assert_eq!(fused.check, baseline.check);
            let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let ((s1, n1), (s2, n2)) = (fused.reduction(), baseline.reduction());
            proptest::prop_assert!(same(s1, s2) && n1 == n2, "{} vs {}", s1, s2);
            let wide = |x: &[f32]| -> Vec<f64> { x.iter().map(|&f| f64::from(f)).collect() };
            let mut plain = PairCheck::default();
            plain.add(&wide(&m), &wide(&v), bound);
            proptest::prop_assert_eq!(fused.check.negative_v, plain.negative_v);
            proptest::prop_assert_eq!(fused.check.over_bound, plain.over_bound);
            let (w, want) = (fused.check.worst_ratio, plain.worst_ratio);
            proptest::prop_assert!(w.to_bits() == want.to_bits(), "{} vs {} {:?}", w, want,
                m.iter().zip(&v).filter(|(&a, &b)| exceeds(f64::from(a), f64::from(b), (MARGIN * k).powi(2))).collect::<Vec<_>>());
            let (sum, bad) = fused.reduction();
            let (want_sum, want_bad) =
                crate::analysis::float_reduce::reduce_bytes(&vb, crate::formats::tensor_data::FloatKind::F32);
            proptest::prop_assert_eq!(bad, want_bad);
            proptest::prop_assert!(
                sum.to_bits() == want_sum.to_bits() || (sum.is_nan() && want_sum.is_nan()),
                "{} vs {}", sum, want_sum
            );
        }
    }
}
