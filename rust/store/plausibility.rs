//! Values no optimizer can produce: what a corrupted or tampered optimizer
//! state holds, found while its state is walked.
//!
//! - a `step` that is negative, fractional, not finite or beyond 2^53;
//! - for Adam's family (`exp_avg` beside `exp_avg_sq`), a negative second
//!   moment, or a first moment beyond what the second allows
//!   (`analysis::adam_bound` states and proves the bound, from the
//!   parameter's group `betas` and its step);
//! - first and second moments of different sizes.
//!
//! Each finding is a short sentence; the gradient probe FAILs a state that
//! has any ("corrupted or tampered optimizer state") under every rule set,
//! since nothing judged from such a file means anything.

use std::collections::{BTreeMap, HashMap};

use rayon::prelude::*;

use crate::analysis::adam_bound::{adam_bound, FusedF32, PairCheck, MARGIN};
use crate::analysis::float_reduce::Reduction;
use crate::error::Result;
use crate::formats::pickle::{Id, Tensor, Value};
use crate::formats::tensor_data::{decode, FloatKind};
use crate::formats::torch_save::{
    float_kind, TorchSave, ViewBytes, WorkBudget, STREAM_CHUNK_BYTES,
};

/// Findings kept per file (the rest are counted).
pub const MAX_FINDINGS: usize = 8;
/// A step count as i64 must be a whole number from 0 to 2^53.
pub const MAX_STEP: f64 = 9_007_199_254_740_992.0;
/// Elements of each moment decoded per read.
const CHUNK: u64 = 1 << 15;

/// Findings of one state, capped at `MAX_FINDINGS` sentences.
#[derive(Debug, Default)]
pub struct Findings {
    pub sentences: Vec<String>,
    pub more: usize,
}

impl Findings {
    pub fn push(&mut self, sentence: String) {
        if self.sentences.len() < MAX_FINDINGS {
            self.sentences.push(sentence);
        } else {
            self.more += 1;
        }
    }

    /// The sentences, with a last one counting those left out.
    pub fn into_vec(mut self) -> Vec<String> {
        if self.more > 0 {
            self.sentences
                .push(format!("... and {} more such findings", self.more));
        }
        self.sentences
    }
}

/// `x` with three significant digits.
fn short(x: f64) -> String {
    if x.is_finite() && x.abs() < 1e6 {
        format!("{x:.3}")
    } else {
        format!("{x:.3e}")
    }
}

/// Whether `step` is a step count an optimizer could have written.
pub fn plausible_step(step: f64) -> bool {
    (0.0..=MAX_STEP).contains(&step) && step.fract() == 0.0
}

/// `(β1, β2)` of each param id, from its group's `betas`.
fn betas_by_param(ts: &TorchSave, sd: Id) -> HashMap<i64, (f64, f64)> {
    let g = &ts.graph;
    let mut out = HashMap::new();
    let groups = match g.dict_get(sd, "param_groups").map(|id| g.get(id)) {
        Some(Value::List(items)) | Some(Value::Tuple(items)) => items.clone(),
        _ => return out,
    };
    let number = |id: Id| match g.get(id) {
        Value::Float(f) => Some(*f),
        Value::Int(i) => Some(*i as f64),
        _ => None,
    };
    for group in groups {
        let betas = match g.dict_get(group, "betas").map(|id| g.get(id)) {
            Some(Value::Tuple(b)) | Some(Value::List(b)) if b.len() == 2 => {
                match (number(b[0]), number(b[1])) {
                    (Some(b1), Some(b2)) => (b1, b2),
                    _ => continue,
                }
            }
            _ => continue,
        };
        if let Some(Value::List(ids)) | Some(Value::Tuple(ids)) =
            g.dict_get(group, "params").map(|id| g.get(id))
        {
            for &id in ids {
                if let Value::Int(p) = g.get(id) {
                    out.insert(*p, betas);
                }
            }
        }
    }
    out
}

fn tensor<'g>(ts: &'g TorchSave, slot: Id, key: &str) -> Option<&'g Tensor> {
    match ts.graph.dict_get(slot, key).map(|id| ts.graph.get(id)) {
        Some(Value::Tensor(t)) => Some(t),
        _ => None,
    }
}

/// Elements of each moment read at once by the fused float32 pass (a
/// multiple of 8, so the second moment's lane sums line up).
const PIECE: u64 = 1 << 16;

/// Most moment pairs a state may hold and still be checked on one thread
/// (see `check_adam`): a LoRA adapter's state (a store scan's usual one)
/// holds a few thousand to a few hundred thousand.
#[cfg(not(test))]
const SERIAL_PAIRS: u64 = 1 << 16;
/// Small in unit tests, so their states take both ways.
#[cfg(test)]
const SERIAL_PAIRS: u64 = 64;

/// One parameter whose moments are checked.
struct Pair<'a> {
    param_id: i64,
    n: u64,
    bound: Option<f64>,
    m: ViewBytes<'a>,
    v: ViewBytes<'a>,
    /// File offsets of the two views' first elements (resolved once).
    m_at: u64,
    v_at: u64,
    kinds: (FloatKind, FloatKind),
}

/// A stretch of one parameter's moments, read and checked by one worker:
/// for float32 moments one reduction chunk of the second moment (what
/// `float_reduce::reduce_tensor` sums at once), so the sums of the fused
/// pass are those the moment reducer would give.
struct Stretch {
    pair: usize,
    start: u64,
    count: u64,
}

/// What a stretch gave: the pair check and, for float32 moments, the
/// second moment's sum and non-finite count over the stretch.
struct StretchOut {
    check: PairCheck,
    sum: f64,
    nonfinite: u64,
}

/// Check Adam's moments of every parameter in `by_id` (param id to its
/// state dict) whose state holds both `exp_avg` and `exp_avg_sq`; `steps`
/// holds each parameter's step where known. Parameters are cut into
/// stretches read and checked on the rayon pool with positioned reads.
/// Where both moments are contiguous float32, the pass also reduces
/// `exp_avg_sq`: returned by param id, for `MomentReader::with_reduced`,
/// so it is not read a second time.
pub fn check_adam(
    ts: &TorchSave,
    sd: Id,
    by_id: &BTreeMap<i64, Id>,
    steps: &HashMap<i64, f64>,
    findings: &mut Findings,
) -> Result<HashMap<i64, Reduction>> {
    let betas = betas_by_param(ts, sd);
    let mut budget = WorkBudget::for_archive(&ts.archive);
    let mut pairs = Vec::new();
    for (&param_id, &slot) in by_id {
        let (Some(mt), Some(vt)) = (tensor(ts, slot, "exp_avg"), tensor(ts, slot, "exp_avg_sq"))
        else {
            continue;
        };
        if ts.graph.dict_get(slot, "RMS").is_some() {
            continue; // Adafactor's exp_avg_sq is a different estimate
        }
        let (Ok(mk), Ok(vk)) = (float_kind(mt, "exp_avg"), float_kind(vt, "exp_avg_sq")) else {
            continue;
        };
        // Views that are not plain contiguous runs are left to the reducer.
        let (Ok(mv), Ok(vv)) = (
            ts.contiguous(mt, "exp_avg", &mut budget),
            ts.contiguous(vt, "exp_avg_sq", &mut budget),
        ) else {
            continue;
        };
        let n = vv.plan.numel;
        if mv.plan.numel != n {
            findings.push(format!(
                "param {param_id}: exp_avg has {} elements but exp_avg_sq {n}",
                mv.plan.numel
            ));
            continue;
        }
        let bound = betas
            .get(&param_id)
            .and_then(|&(b1, b2)| adam_bound(b1, b2, steps.get(&param_id).copied()));
        let at = |v: &ViewBytes<'_>| -> Result<u64> {
            let start = ts.archive.data_offset(&v.entry_name, v.entry)?;
            Ok(start + v.plan.first * v.elem_size)
        };
        let (m_at, v_at) = (at(&mv)?, at(&vv)?);
        pairs.push(Pair {
            param_id,
            n,
            bound,
            m_at,
            v_at,
            m: mv,
            v: vv,
            kinds: (mk, vk),
        });
    }
    // One reduction chunk of a float32 second moment (see `Stretch`).
    let stretch = STREAM_CHUNK_BYTES / 4;
    let stretches: Vec<Stretch> = pairs
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            (0..p.n.div_ceil(stretch)).map(move |c| Stretch {
                pair: i,
                start: c * stretch,
                count: stretch.min(p.n - c * stretch),
            })
        })
        .collect();
    // A state of a few stretches (a LoRA adapter's, most of a store scan)
    // is checked on this thread: shared out, its stretches cost more in
    // buffers and hand-offs than in checking. The outcome is the same.
    let total: u64 = stretches.iter().map(|s| s.count).sum();
    let outs: Vec<StretchOut> = if total <= SERIAL_PAIRS {
        let mut bufs = Buffers::default();
        stretches
            .iter()
            .map(|s| check_stretch(ts, &pairs[s.pair], s, &mut bufs))
            .collect::<Result<_>>()?
    } else {
        stretches
            .par_iter()
            .map_init(Buffers::default, |bufs, s| {
                check_stretch(ts, &pairs[s.pair], s, bufs)
            })
            .collect::<Result<_>>()?
    };
    let mut reduced = HashMap::new();
    let mut outs = stretches.iter().zip(outs).peekable();
    for (i, p) in pairs.iter().enumerate() {
        let n = p.n;
        let param_id = p.param_id;
        let bound = p.bound;
        let mut check = PairCheck::default();
        let mut sum = Reduction {
            numel: n,
            ..Reduction::default()
        };
        // In stretch order, as the reducer adds its chunks.
        while let Some((_, out)) = outs.next_if(|(s, _)| s.pair == i) {
            check.negative_v += out.check.negative_v;
            check.over_bound += out.check.over_bound;
            check.worst_ratio = check.worst_ratio.max(out.check.worst_ratio);
            sum.sum += out.sum;
            sum.nonfinite += out.nonfinite;
        }
        if p.kinds == (FloatKind::F32, FloatKind::F32) {
            reduced.insert(param_id, sum);
        }
        if check.negative_v > 0 {
            findings.push(format!(
                "param {param_id}: {} of {n} exp_avg_sq values are negative (a running mean \
                 of squares never is)",
                check.negative_v
            ));
        }
        if let (Some(k), true) = (bound, check.over_bound > 0) {
            findings.push(format!(
                "param {param_id}: {} of {n} exp_avg values exceed what exp_avg_sq allows \
                 (|m| up to {} sqrt(v); Adam bounds it by {} sqrt(v) for these betas, \
                 flagged beyond {MARGIN}x)",
                check.over_bound,
                short(check.worst_ratio),
                short(k)
            ));
        }
    }
    Ok(reduced)
}

/// One worker's read and decode buffers, reused across stretches.
#[derive(Default)]
struct Buffers {
    mb: Vec<u8>,
    vb: Vec<u8>,
    m: Vec<f64>,
    v: Vec<f64>,
}

/// Read and check one stretch of a pair's moments, a piece at a time.
fn check_stretch(
    ts: &TorchSave,
    p: &Pair<'_>,
    s: &Stretch,
    bufs: &mut Buffers,
) -> Result<StretchOut> {
    let Buffers { mb, vb, m, v } = bufs;
    let fused_f32 = p.kinds == (FloatKind::F32, FloatKind::F32);
    let piece = if fused_f32 { PIECE } else { CHUNK };
    let mut fused = FusedF32::default();
    let mut check = PairCheck::default();
    let mut done = 0;
    while done < s.count {
        let count = piece.min(s.count - done);
        // In the views (start + count <= n), which lie in their entries.
        let from = s.start + done;
        ts.archive
            .read_exact_at(p.m_at + from * p.m.elem_size, count * p.m.elem_size, mb)?;
        ts.archive
            .read_exact_at(p.v_at + from * p.v.elem_size, count * p.v.elem_size, vb)?;
        if fused_f32 {
            fused.add(mb, vb, p.bound);
        } else {
            let len = usize::try_from(count).unwrap_or(0);
            m.resize(len, 0.0);
            v.resize(len, 0.0);
            decode(p.kinds.0, mb, m);
            decode(p.kinds.1, vb, v);
            check.add(m, v, p.bound);
        }
        done += count;
    }
    if !fused_f32 {
        return Ok(StretchOut {
            check,
            sum: 0.0,
            nonfinite: 0,
        });
    }
    let (sum, nonfinite) = fused.reduction();
    Ok(StretchOut {
        check: fused.check,
        sum,
        nonfinite,
    })
}

#[cfg(test)]
mod fused_tests {
    use super::*;
    use crate::analysis::float_reduce::reduce_tensor;
    use crate::formats::pickle::UnknownGlobals;

    /// The second moments the Adam pass reduces are bit for bit the ones
    /// the moment reducer gives reading `exp_avg_sq` on its own.
    #[test]
    fn the_fused_pass_reduces_exp_avg_sq_as_the_reducer_does() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/testdata/optim");
        let (mut checked, mut serial) = (0, 0);
        for name in ["hf_gpt2", "hf_lora", "hf_bias_all", "hf_modules_to_save"] {
            let file = root.join(name).join("checkpoint-3/optimizer.pt");
            let ts = TorchSave::open(&file, UnknownGlobals::Refuse).unwrap();
            let sd = ts.graph.root;
            let state = ts.graph.dict_get(sd, "state").unwrap();
            let by_id: BTreeMap<i64, Id> = ts
                .graph
                .dict_entries(state)
                .unwrap()
                .iter()
                .map(|(k, v)| match ts.graph.get(*k) {
                    Value::Int(i) => (*i, *v),
                    _ => unreachable!(),
                })
                .collect();
            let mut findings = Findings::default();
            let reduced = check_adam(&ts, sd, &by_id, &HashMap::new(), &mut findings).unwrap();
            assert!(findings.sentences.is_empty(), "{:?}", findings.sentences);
            assert_eq!(reduced.len(), by_id.len(), "{name}");
            let mut budget = WorkBudget::for_archive(&ts.archive);
            for (id, slot) in &by_id {
                let t = tensor(&ts, *slot, "exp_avg_sq").unwrap();
                let want = reduce_tensor(&ts, t, "v", &mut Vec::new(), &mut budget).unwrap();
                // The whole state, shared out over the pool, and the
                // parameter alone: at most `SERIAL_PAIRS` (64 in unit
                // tests) are checked on this thread.
                let one = BTreeMap::from([(*id, *slot)]);
                let alone = check_adam(&ts, sd, &one, &HashMap::new(), &mut findings).unwrap();
                serial += usize::from(want.numel <= SERIAL_PAIRS);
                for got in [reduced[id], alone[id]] {
                    assert_eq!((got.numel, got.nonfinite), (want.numel, want.nonfinite));
                    assert_eq!(got.sum.to_bits(), want.sum.to_bits(), "{name} param {id}");
                }
                assert!(findings.sentences.is_empty(), "{:?}", findings.sentences);
                checked += 1;
            }
        }
        assert!(checked > 10, "{checked}");
        assert!(
            0 < serial && serial < checked,
            "{serial} of {checked} on one thread"
        );
    }
}
