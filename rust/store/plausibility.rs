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

use crate::analysis::adam_bound::{adam_bound, PairCheck, MARGIN};
use crate::error::Result;
use crate::formats::pickle::{Id, Tensor, Value};
use crate::formats::tensor_data::{decode, FloatKind};
use crate::formats::torch_save::{float_kind, TorchSave, WorkBudget};

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

/// Check Adam's moments of every parameter in `by_id` (param id to its
/// state dict) whose state holds both `exp_avg` and `exp_avg_sq`; `steps`
/// holds each parameter's step where known.
pub fn check_adam(
    ts: &TorchSave,
    sd: Id,
    by_id: &BTreeMap<i64, Id>,
    steps: &HashMap<i64, f64>,
    findings: &mut Findings,
) -> Result<()> {
    let betas = betas_by_param(ts, sd);
    let mut budget = WorkBudget::for_archive(&ts.archive);
    let (mut mb, mut vb) = (Vec::new(), Vec::new());
    let (mut m, mut v) = (Vec::new(), Vec::new());
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
        let mut check = PairCheck::default();
        let mut start = 0;
        while start < n {
            let count = CHUNK.min(n - start);
            ts.read_elems(&mv, start, count, &mut mb)?;
            ts.read_elems(&vv, start, count, &mut vb)?;
            if (mk, vk) == (FloatKind::F32, FloatKind::F32) {
                check.add_f32_bytes(&mb, &vb, bound);
            } else {
                m.resize(count as usize, 0.0);
                v.resize(count as usize, 0.0);
                decode(mk, &mb, &mut m);
                decode(vk, &vb, &mut v);
                check.add(&m, &v, bound);
            }
            start += count;
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
    Ok(())
}
