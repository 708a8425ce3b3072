//! Float reduction kernels over raw little-endian storage bytes.
//!
//! The elements of a planned tensor view (`formats::tensor_view`) are summed
//! in f64 with non-finite values counted, for float32, float64, float16 and
//! bfloat16. Contiguous runs use several independent accumulators so the
//! loops vectorize. [`reduce_tensor`] reduces one tensor of a `torch.save`
//! archive in bounded memory, streaming views larger than a chunk.

use crate::error::{Error, Result};
use crate::formats::pickle::Tensor;
use crate::formats::tensor_data::{
    dec_bf16, dec_f16, dec_f32, dec_f64, f16_to_f32, widest, FloatKind,
};
use crate::formats::tensor_view::{for_each_run, ViewPlan};
use crate::formats::torch_save::{float_kind, TorchSave, WorkBudget, STREAM_CHUNK_BYTES};

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

/// Sum and non-finite count of the float tensor `t` of the archive `ts`. Memory stays
/// bounded whatever the file claims: a view whose storage span is
/// larger than [`STREAM_CHUNK_BYTES`] is read run by run, in chunks.
pub fn reduce_tensor(
    ts: &TorchSave,
    t: &Tensor,
    what: &str,
    scratch: &mut Vec<u8>,
    budget: &mut WorkBudget,
) -> Result<Reduction> {
    let kind = float_kind(t, what).map_err(|m| ts.err(m))?;
    let v = ts.view(t, what)?;
    if v.plan.numel == 0 {
        return Ok(Reduction::default());
    }
    if !budget.charge(v.plan.numel.saturating_add(v.plan.span)) {
        return Err(ts.over_budget(what));
    }
    let es = v.elem_size;
    if v.plan.span.saturating_mul(es) <= STREAM_CHUNK_BYTES {
        ts.archive.read_entry_range(
            &v.entry_name,
            v.entry,
            v.plan.first * es,
            v.plan.span * es,
            scratch,
        )?;
        return reduce_planned(scratch, kind, &v.plan).map_err(|m| ts.err(format!("{what}: {m}")));
    }
    let mut out = Reduction {
        numel: v.plan.numel,
        ..Reduction::default()
    };
    let mut failure: Option<Error> = None;
    let per_chunk = (STREAM_CHUNK_BYTES / es).max(1);
    let walked = for_each_run(&v.plan, |start, len, stride| {
        let read = |from: u64, count: u64, buf: &mut Vec<u8>| {
            ts.archive.read_entry_range(
                &v.entry_name,
                v.entry,
                (v.plan.first + from) * es,
                count * es,
                buf,
            )
        };
        // Contiguous runs in chunks; a strided run one element at a time
        // (the budget above bounds how many there can be).
        let (chunk, step) = if stride == 1 {
            (per_chunk, per_chunk)
        } else {
            (1, 1)
        };
        let mut done = 0u64;
        while done < len {
            let count = chunk.min(len - done);
            let at = start + done * if stride == 1 { 1 } else { stride };
            if let Err(e) = read(at, count, scratch) {
                failure = Some(e);
                return Err(String::new());
            }
            let (s, nf) = reduce_bytes(scratch, kind);
            out.sum += s;
            out.nonfinite += nf;
            done += step.min(len - done);
        }
        Ok(())
    });
    match (walked, failure) {
        (_, Some(e)) => Err(e),
        (Err(m), None) => Err(ts.err(format!("{what}: {m}"))),
        (Ok(()), None) => Ok(out),
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
    widest(
        #[inline(always)]
        || reduce_run_here(bytes, kind),
    )
}

#[inline(always)]
fn reduce_run_here(bytes: &[u8], kind: FloatKind) -> (f64, u64) {
    match kind {
        FloatKind::F32 => sum_contig::<4>(bytes, dec_f32),
        FloatKind::F64 => sum_contig::<8>(bytes, dec_f64),
        FloatKind::F16 => sum_f16(bytes),
        FloatKind::BF16 => sum_contig::<2>(bytes, dec_bf16),
    }
}

/// Half floats in two passes per block: decode 64 values to f32 (a simple
/// loop the compiler vectorizes), then sum them as f32 runs do.
#[inline(always)]
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
    use crate::formats::tensor_view::plan_view;

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
        assert!(Reduction::default().mean().is_nan());
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

    proptest::proptest! {
        /// A run summed through `widest` (AVX2 or AVX-512 where the CPU has
        /// them) is bit for bit the baseline build's sum of the same bytes.
        #[test]
        fn the_widest_kernels_sum_as_the_baseline_does(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            kind in 0usize..4,
        ) {
            let kind = [FloatKind::F32, FloatKind::F64, FloatKind::F16, FloatKind::BF16][kind];
            let (sum, bad) = reduce_bytes(&bytes, kind);
            let (want, want_bad) = reduce_run_here(&bytes, kind);
            proptest::prop_assert_eq!(bad, want_bad);
            proptest::prop_assert!(
                sum.to_bits() == want.to_bits() || (sum.is_nan() && want.is_nan()),
                "{} vs {}", sum, want
            );
        }
    }
}
