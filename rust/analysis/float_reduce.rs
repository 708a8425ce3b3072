//! Float reduction kernels over raw little-endian storage bytes.
//!
//! A tensor view (offset, sizes, strides) is validated against its storage's
//! capacity, contiguous dimensions are merged, and the elements are summed in
//! f64 with non-finite values counted, for float32, float64, float16 and
//! bfloat16. Contiguous runs use several independent accumulators so the
//! loops vectorize.

use crate::formats::pickle::DType;
use crate::formats::tensor_data::{dec_bf16, dec_f16, dec_f32, dec_f64};
pub use crate::formats::tensor_data::{f16_to_f32, FloatKind};

impl FloatKind {
    /// The reducible float kind of a pickled torch dtype.
    pub fn of(d: DType) -> Option<FloatKind> {
        match d.name {
            "float32" => Some(FloatKind::F32),
            "float64" => Some(FloatKind::F64),
            "float16" => Some(FloatKind::F16),
            "bfloat16" => Some(FloatKind::BF16),
            _ => None,
        }
    }
}

/// Sum and non-finite count of a set of elements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reduction {
    pub numel: u64,
    pub sum: f64,
    pub nonfinite: u64,
}

impl Reduction {
    /// Mean in f64; NaN for an empty tensor, as torch gives.
    pub fn mean(&self) -> f64 {
        if self.numel == 0 {
            f64::NAN
        } else {
            self.sum / self.numel as f64
        }
    }
}

/// A validated tensor view, relative to the first element it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewPlan {
    pub numel: u64,
    /// First storage element read.
    pub first: u64,
    /// Elements from `first` through the last element read.
    pub span: u64,
    /// (size, stride) pairs, size-1 dims dropped and mergeable dims merged,
    /// outermost first. Empty for a scalar.
    pub dims: Vec<(u64, u64)>,
}

/// Logical elements a view may have beyond its storage's size (broadcast
/// views with stride 0); past this, such views are refused.
const MAX_OVERLAP_NUMEL: u64 = 1 << 24;

/// Check that the view (offset, size, stride) lies inside a storage of
/// `capacity` elements and describe how to walk it.
pub fn plan_view(
    offset: u64,
    size: &[u64],
    stride: &[u64],
    capacity: u64,
) -> std::result::Result<ViewPlan, String> {
    if size.len() != stride.len() {
        return Err("size and stride have different lengths".into());
    }
    let numel = size
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or("element count overflows")?;
    if numel == 0 {
        if offset > capacity {
            return Err(format!(
                "view offset {offset} is past the end of its storage ({capacity} elements)"
            ));
        }
        return Ok(ViewPlan {
            numel: 0,
            first: offset,
            span: 0,
            dims: Vec::new(),
        });
    }
    let mut last = offset;
    for (&s, &st) in size.iter().zip(stride) {
        last = (s - 1)
            .checked_mul(st)
            .and_then(|x| last.checked_add(x))
            .ok_or("view extent overflows")?;
    }
    if last >= capacity {
        return Err(format!(
            "tensor view (offset {offset}, size {size:?}, stride {stride:?}) reaches element \
             {last}, past the end of its storage ({capacity} elements)"
        ));
    }
    if numel > capacity && numel > MAX_OVERLAP_NUMEL {
        return Err(format!(
            "tensor view has {numel} elements over a storage of {capacity} (overlapping \
             strides); refusing the work"
        ));
    }
    let mut dims: Vec<(u64, u64)> = Vec::with_capacity(size.len());
    for (&s, &st) in size.iter().zip(stride) {
        if s == 1 {
            continue;
        }
        match dims.last_mut() {
            // The previous (outer) dim steps exactly over this one: merge.
            Some(outer) if outer.1 == st.saturating_mul(s) => {
                *outer = (outer.0 * s, st);
            }
            _ => dims.push((s, st)),
        }
    }
    Ok(ViewPlan {
        numel,
        first: offset,
        span: last - offset + 1,
        dims,
    })
}

/// Reduce the elements of `plan` from `bytes`, which start at element
/// `plan.first` and hold `plan.span` elements.
pub fn reduce_planned(
    bytes: &[u8],
    kind: FloatKind,
    plan: &ViewPlan,
) -> std::result::Result<Reduction, String> {
    let es = kind.size();
    let need = usize::try_from(plan.span)
        .ok()
        .and_then(|s| s.checked_mul(es))
        .ok_or("view too large")?;
    let bytes = bytes
        .get(..need)
        .ok_or("storage bytes shorter than the view")?;
    let mut out = Reduction {
        numel: plan.numel,
        ..Reduction::default()
    };
    for_each_run(plan, |start, len, stride| {
        let start = usize::try_from(start).map_err(|_| "view too large")? * es;
        let len = usize::try_from(len).map_err(|_| "view too large")?;
        let (s, nf) = if stride == 1 {
            let run = bytes
                .get(start..start + len * es)
                .ok_or("view outside the storage bytes")?;
            reduce_run(run, kind)
        } else {
            let step = usize::try_from(stride).map_err(|_| "view too large")? * es;
            reduce_strided(bytes, start, len, step, kind).ok_or("view outside the storage bytes")?
        };
        out.sum += s;
        out.nonfinite += nf;
        Ok(())
    })?;
    Ok(out)
}

/// Call `f(start, len, stride)` for each innermost run of the view: `len`
/// elements starting at element `start` of the planned span (relative to
/// `plan.first`), `stride` elements apart. A scalar view is one run of one.
pub fn for_each_run(
    plan: &ViewPlan,
    mut f: impl FnMut(u64, u64, u64) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    let Some((&(inner_n, inner_stride), outer)) = plan.dims.split_last() else {
        return f(0, 1, 1);
    };
    let mut index = vec![0u64; outer.len()];
    loop {
        let base: u64 = index.iter().zip(outer).map(|(i, d)| i * d.1).sum();
        f(base, inner_n, inner_stride)?;
        // Odometer over the outer dims, innermost fastest.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            index[d] += 1;
            if index[d] < outer[d].0 {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Sum and non-finite count of a contiguous run of elements.
pub fn reduce_bytes(bytes: &[u8], kind: FloatKind) -> (f64, u64) {
    reduce_run(bytes, kind)
}

/// Sum a contiguous run with 8 independent f64 accumulators (vectorizable).
#[inline(always)]
fn sum_contig<const N: usize>(bytes: &[u8], dec: impl Fn([u8; N]) -> (f64, bool)) -> (f64, u64) {
    const LANES: usize = 8;
    let mut acc = [0.0f64; LANES];
    let mut bad = [0u64; LANES];
    let mut blocks = bytes.chunks_exact(N * LANES);
    for block in &mut blocks {
        for ((a, b), c) in acc
            .iter_mut()
            .zip(bad.iter_mut())
            .zip(block.chunks_exact(N))
        {
            let (v, nf) = dec(<[u8; N]>::try_from(c).unwrap_or([0; N]));
            *a += v;
            *b += u64::from(nf);
        }
    }
    for (i, c) in blocks.remainder().chunks_exact(N).enumerate() {
        let (v, nf) = dec(<[u8; N]>::try_from(c).unwrap_or([0; N]));
        acc[i % LANES] += v;
        bad[i % LANES] += u64::from(nf);
    }
    let sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    (sum, bad.iter().sum())
}

fn reduce_run(bytes: &[u8], kind: FloatKind) -> (f64, u64) {
    match kind {
        FloatKind::F32 => sum_contig::<4>(bytes, dec_f32),
        FloatKind::F64 => sum_contig::<8>(bytes, dec_f64),
        FloatKind::F16 => sum_f16(bytes),
        FloatKind::BF16 => sum_contig::<2>(bytes, dec_bf16),
    }
}

/// Half floats in two passes per block: decode 64 values to f32 (a simple
/// loop the compiler vectorizes), then sum them as f32 runs do.
fn sum_f16(bytes: &[u8]) -> (f64, u64) {
    const BLOCK: usize = 64;
    let mut sum = 0.0f64;
    let mut bad = 0u64;
    let mut blocks = bytes.chunks_exact(2 * BLOCK);
    let mut tmp = [0.0f32; BLOCK];
    for block in &mut blocks {
        let mut nb = 0u32;
        for (t, c) in tmp.iter_mut().zip(block.chunks_exact(2)) {
            let h = u16::from_le_bytes(<[u8; 2]>::try_from(c).unwrap_or([0; 2]));
            *t = f16_to_f32(h);
            nb += u32::from(h & 0x7c00 == 0x7c00);
        }
        let mut acc = [0.0f64; 8];
        for lane in tmp.chunks_exact(8) {
            for (a, v) in acc.iter_mut().zip(lane) {
                *a += f64::from(*v);
            }
        }
        sum += ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        bad += u64::from(nb);
    }
    let (s, b) = sum_contig::<2>(blocks.remainder(), dec_f16);
    (sum + s, bad + b)
}

fn gather<const N: usize>(
    bytes: &[u8],
    start: usize,
    n: usize,
    step: usize,
    dec: impl Fn([u8; N]) -> (f64, bool),
) -> Option<(f64, u64)> {
    let mut acc = [0.0f64; 4];
    let mut bad = 0u64;
    for i in 0..n {
        let at = start.checked_add(i.checked_mul(step)?)?;
        let c = bytes.get(at..at.checked_add(N)?)?;
        let (v, nf) = dec(<[u8; N]>::try_from(c).ok()?);
        acc[i % 4] += v;
        bad += u64::from(nf);
    }
    Some(((acc[0] + acc[2]) + (acc[1] + acc[3]), bad))
}

fn reduce_strided(
    bytes: &[u8],
    start: usize,
    n: usize,
    step: usize,
    kind: FloatKind,
) -> Option<(f64, u64)> {
    match kind {
        FloatKind::F32 => gather::<4>(bytes, start, n, step, dec_f32),
        FloatKind::F64 => gather::<8>(bytes, start, n, step, dec_f64),
        FloatKind::F16 => gather::<2>(bytes, start, n, step, dec_f16),
        FloatKind::BF16 => gather::<2>(bytes, start, n, step, dec_bf16),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::tensor_data::tests::encode;

    /// Reference: decode every element the slow obvious way.
    fn naive(
        bytes: &[u8],
        kind: FloatKind,
        offset: u64,
        size: &[u64],
        stride: &[u64],
    ) -> (f64, u64) {
        let es = kind.size();
        let numel: u64 = size.iter().product();
        let mut sum = 0.0;
        let mut bad = 0;
        for flat in 0..numel {
            let mut rem = flat;
            let mut idx = offset;
            for d in (0..size.len()).rev() {
                idx += (rem % size[d]) * stride[d];
                rem /= size[d];
            }
            let at = idx as usize * es;
            let c = &bytes[at..at + es];
            let v = match kind {
                FloatKind::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap())),
                FloatKind::F64 => f64::from_le_bytes(c.try_into().unwrap()),
                FloatKind::BF16 => f64::from(f32::from_bits(
                    u32::from(u16::from_le_bytes(c.try_into().unwrap())) << 16,
                )),
                FloatKind::F16 => half_reference(u16::from_le_bytes(c.try_into().unwrap())),
            };
            if !v.is_finite() {
                bad += 1;
            }
            sum += v;
        }
        (sum, bad)
    }

    /// IEEE half by the textbook formula.
    fn half_reference(h: u16) -> f64 {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((h >> 10) & 0x1f);
        let m = f64::from(h & 0x3ff);
        match e {
            0 => sign * m * 2f64.powi(-24),
            31 if m == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn f16_decode_matches_formula_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let got = f64::from(f16_to_f32(h));
            let want = half_reference(h);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
            assert_eq!(dec_f16(h.to_le_bytes()).1, !want.is_finite(), "{h:#06x}");
        }
    }

    fn check_view(kind: FloatKind, vals: &[f64], offset: u64, size: &[u64], stride: &[u64]) {
        let bytes = encode(kind, vals);
        let plan = plan_view(offset, size, stride, vals.len() as u64).unwrap();
        let es = kind.size();
        let span = &bytes[plan.first as usize * es..(plan.first + plan.span) as usize * es];
        let got = reduce_planned(span, kind, &plan).unwrap();
        let (sum, bad) = naive(&bytes, kind, offset, size, stride);
        assert_eq!(got.numel, size.iter().product::<u64>());
        assert_eq!(got.nonfinite, bad);
        assert!(
            (got.sum - sum).abs() <= 1e-12 * sum.abs().max(1.0)
                || (got.sum.is_nan() && sum.is_nan()),
            "{kind:?} {size:?} {stride:?}: {} vs {sum}",
            got.sum
        );
    }

    #[test]
    fn views_match_naive_walk() {
        let vals: Vec<f64> = (0..240).map(|i| f64::from(i % 17) * 0.25 + 0.5).collect();
        for kind in [
            FloatKind::F32,
            FloatKind::F64,
            FloatKind::F16,
            FloatKind::BF16,
        ] {
            check_view(kind, &vals, 0, &[240], &[1]);
            check_view(kind, &vals, 3, &[7, 5], &[5, 1]);
            check_view(kind, &vals, 0, &[12, 20], &[1, 12]); // transposed
            check_view(kind, &vals, 10, &[4, 3, 5], &[40, 1, 6]);
            check_view(kind, &vals, 5, &[3, 1, 4], &[8, 99, 2]); // size-1 dim with odd stride
            check_view(kind, &vals, 7, &[], &[]); // scalar
            check_view(kind, &vals, 0, &[3, 4], &[0, 1]); // broadcast
            check_view(kind, &vals, 0, &[37], &[1]); // remainder handling
        }
    }

    #[test]
    fn nonfinite_counted_and_nan_propagates() {
        let vals = [
            1.0,
            f64::NAN,
            2.0,
            f64::INFINITY,
            3.0,
            4.0,
            5.0,
            6.0,
            7.0,
            -f64::INFINITY,
        ];
        for kind in [
            FloatKind::F32,
            FloatKind::F64,
            FloatKind::F16,
            FloatKind::BF16,
        ] {
            let bytes = encode(kind, &vals);
            let plan = plan_view(0, &[10], &[1], 10).unwrap();
            let r = reduce_planned(&bytes, kind, &plan).unwrap();
            assert_eq!(r.nonfinite, 3, "{kind:?}");
            assert!(r.mean().is_nan());
        }
        let plan = plan_view(0, &[2], &[1], 2).unwrap();
        let r = reduce_planned(
            &encode(FloatKind::F32, &[1.0, f64::INFINITY]),
            FloatKind::F32,
            &plan,
        )
        .unwrap();
        assert_eq!(r.mean(), f64::INFINITY);
    }

    #[test]
    fn views_past_the_storage_are_refused() {
        assert!(plan_view(0, &[10], &[1], 10).is_ok());
        assert!(plan_view(1, &[10], &[1], 10).is_err());
        assert!(plan_view(0, &[4, 3], &[3, 1], 11).is_err());
        assert!(plan_view(0, &[3, 4], &[1, 3], 12).is_ok());
        assert!(plan_view(0, &[u64::MAX, 2], &[1, 1], 10).is_err());
        assert!(plan_view(0, &[2], &[u64::MAX], 10).is_err());
        assert!(plan_view(11, &[0], &[1], 10).is_err());
        assert_eq!(plan_view(10, &[0, 5], &[5, 1], 10).unwrap().numel, 0);
        assert!(plan_view(0, &[1 << 30], &[0], 1).is_err());
        assert!(Reduction::default().mean().is_nan());
    }

    #[test]
    fn contiguous_dims_merge() {
        let plan = plan_view(6, &[2, 3, 4], &[12, 4, 1], 30).unwrap();
        assert_eq!(plan.dims, vec![(24, 1)]);
        assert_eq!(plan.span, 24);
    }
}
