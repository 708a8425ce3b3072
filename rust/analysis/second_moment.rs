//! One parameter's second moment, in whichever layout its optimizer keeps.
//!
//! The gradient probe compares second moments (running means of squared
//! gradients) across parameters, and each optimizer family stores them
//! differently:
//!
//! - torch Adam/AdamW (and NAdam, RAdam, ...): `exp_avg_sq`, shaped like the
//!   parameter.
//! - bitsandbytes (0.50 nests these under `__bnb_optimizer_quant_state__`,
//!   older releases keep them flat beside `step`): `state2`, either fp32 (32-bit
//!   optimizers, and 8-bit ones for parameters under `min_8bit_size`) or
//!   uint8 codes. An 8-bit element `i` stands for `qmap2[code] * absmax2[i /
//!   B]`: `qmap2` is the 256-entry quantization map and `absmax2` one scale
//!   per block of `B` elements, the last block possibly partial, so `absmax2`
//!   has `ceil(n / B)` entries. `B` is 256 in bitsandbytes 0.50 and was
//!   2048 in older releases; a length that fits neither is refused (a healthy file
//!   whose size is not a multiple of the block, e.g. 4100 elements in 17
//!   blocks, is read). The product is formed in f64 (bitsandbytes' own
//!   dequantization rounds it to f32), streamed a bounded number of blocks
//!   at a time: nothing the size of the parameter is ever allocated.
//! - Adafactor (transformers: `exp_avg_sq_row`/`exp_avg_sq_col`; torch:
//!   `row_var`/`col_var`) factors a matrix's second moment into row
//!   statistics R and column statistics C, with the rank-1 estimate
//!   `V = R Cᵀ / mean(R)` (per matrix of a batched parameter). Its mean is
//!   exactly `mean(C)`, which is reported (it equals `mean(R)` up to
//!   rounding, both being the mean squared gradient). torch's Adafactor
//!   divides by `max(mean(R), eps1)` in its update, a guard that is not part
//!   of the estimate and is not applied here. Non-finite values are counted
//!   over the stored factors, and the mean is NaN when R is not finite
//!   (every element of V would be). Vectors keep a full `exp_avg_sq`
//!   (transformers, recognised by its `RMS` entry) or `variance` (torch).
//! - SGD keeps `momentum_buffer` only, bitsandbytes' one-state optimizers
//!   (Lion, SGD, RMSprop, ...) `state1` only: no second moment.

use std::collections::HashMap;

use crate::analysis::float_reduce::{reduce_tensor, Reduction};
use crate::error::Result;
use crate::formats::pickle::{DType, Id, Tensor, Unpickled, Value};
use crate::formats::tensor_data::decode;
use crate::formats::torch_save::{float_kind, TorchSave, WorkBudget};

/// Key under which bitsandbytes >= 0.50 nests its quantization state.
pub const BNB_QUANT_STATE: &str = "__bnb_optimizer_quant_state__";

/// Entries of a bitsandbytes quantization map.
pub const QMAP_LEN: u64 = 256;

/// Block sizes of bitsandbytes' blockwise 8-bit optimizer states: current
/// releases first, then the one used before 0.50.
pub const BNB_BLOCK_SIZES: [u64; 2] = [256, 2048];

/// Codes dequantized per read (whole blocks; at least one block).
const CODES_PER_CHUNK: u64 = 1 << 16;

/// More keys than any optimizer keeps per parameter (Adam has 3-4).
pub const MAX_SLOT_KEYS: usize = 64;

/// Statistics of one parameter's second moment.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct ParamStat {
    pub param_id: i64,
    /// Elements of the parameter.
    pub numel: u64,
    /// Shape of the parameter (for Adafactor's factored states, the shape
    /// the row and column factors describe).
    pub shape: Vec<u64>,
    /// Mean of the second moment over all elements, accumulated in f64
    /// (Adam's `exp_avg_sq`, bitsandbytes' dequantized `state2`, or the mean
    /// of Adafactor's reconstruction); NaN when any element is NaN or the
    /// tensor is empty. The name is Adam's, kept for the binding.
    pub exp_avg_sq_mean: f64,
    /// Elements that are NaN or ±inf (for Adafactor's factored states,
    /// entries of the stored factors).
    pub nonfinite: u64,
}

/// The optimizer family one parameter's state belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Adam,
    Bitsandbytes,
    BitsandbytesOneState,
    Adafactor,
    Sgd,
    Unknown,
}

impl Family {
    pub fn describe(self) -> &'static str {
        match self {
            Family::Adam => "Adam (exp_avg_sq)",
            Family::Bitsandbytes => "bitsandbytes (state2)",
            Family::BitsandbytesOneState => "bitsandbytes one-state (state1 only)",
            Family::Adafactor => "Adafactor",
            Family::Sgd => "SGD (momentum_buffer)",
            Family::Unknown => "unrecognised",
        }
    }
}

/// How one parameter's state holds its second moment.
#[derive(Debug, Clone, Copy)]
pub enum Layout<'g> {
    /// Adam's `exp_avg_sq`.
    ExpAvgSq(&'g Tensor),
    /// bitsandbytes' fp32 `state2`.
    BnbFloat(&'g Tensor),
    /// bitsandbytes' 8-bit `state2` with its map and block scales.
    BnbBlockwise {
        codes: &'g Tensor,
        qmap: &'g Tensor,
        absmax: &'g Tensor,
    },
    /// bitsandbytes with `state1` only.
    BnbOneState { eight_bit: bool },
    /// transformers' Adafactor: row `shape[:-1]`, column `shape[:-2] + shape[-1:]`.
    FactoredRowsCols { row: &'g Tensor, col: &'g Tensor },
    /// torch's Adafactor: row `shape` with last dim 1, column with dim -2 = 1.
    FactoredVars { row: &'g Tensor, col: &'g Tensor },
    /// Adafactor's full estimate for a vector (`exp_avg_sq` or `variance`).
    AdafactorFull(&'g Tensor),
    /// SGD's `momentum_buffer` only.
    Momentum,
    /// None of the above.
    Unknown,
}

impl Layout<'_> {
    pub fn family(&self) -> Family {
        match self {
            Layout::ExpAvgSq(_) => Family::Adam,
            Layout::BnbFloat(_) | Layout::BnbBlockwise { .. } => Family::Bitsandbytes,
            Layout::BnbOneState { .. } => Family::BitsandbytesOneState,
            Layout::FactoredRowsCols { .. } | Layout::FactoredVars { .. } => Family::Adafactor,
            Layout::AdafactorFull(_) => Family::Adafactor,
            Layout::Momentum => Family::Sgd,
            Layout::Unknown => Family::Unknown,
        }
    }
}

/// The tensor under `key` in dict `dict`, if any; an error when something
/// other than a tensor is there.
fn tensor_at<'g>(
    g: &'g Unpickled,
    dict: Id,
    key: &str,
    param_id: i64,
) -> std::result::Result<Option<&'g Tensor>, String> {
    match g.dict_get(dict, key).map(|id| g.get(id)) {
        None => Ok(None),
        Some(Value::Tensor(t)) => Ok(Some(t)),
        Some(other) => Err(format!(
            "{key} of param {param_id} is a {}, not a tensor",
            other.kind()
        )),
    }
}

fn has(g: &Unpickled, dict: Id, key: &str) -> bool {
    g.dict_get(dict, key).is_some()
}

/// Check that `slot` is a dict of a plausible size.
pub fn check_slot(g: &Unpickled, slot: Id, param_id: i64) -> std::result::Result<(), String> {
    match g.dict_entries(slot) {
        None => Err(format!(
            "optimizer state of param {param_id} is a {}, not a dict",
            g.get(slot).kind()
        )),
        Some(entries) if entries.len() > MAX_SLOT_KEYS => Err(format!(
            "optimizer state of param {param_id} has {} entries; an optimizer keeps a \
             handful per parameter",
            entries.len()
        )),
        Some(_) => Ok(()),
    }
}

/// Recognise the layout of the state dict `slot` of `param_id` (already
/// checked by [`check_slot`]).
pub fn classify(g: &Unpickled, slot: Id, param_id: i64) -> std::result::Result<Layout<'_>, String> {
    if let Some(quant) = g.dict_get(slot, BNB_QUANT_STATE) {
        check_slot(g, quant, param_id).map_err(|m| format!("{BNB_QUANT_STATE}: {m}"))?;
        return bitsandbytes(g, quant, param_id);
    }
    if has(g, slot, "state1") || has(g, slot, "state2") {
        return bitsandbytes(g, slot, param_id);
    }
    let pair = |row: &str, col: &str| -> std::result::Result<Option<(&Tensor, &Tensor)>, String> {
        let r = tensor_at(g, slot, row, param_id)?;
        let c = tensor_at(g, slot, col, param_id)?;
        match (r, c) {
            (Some(r), Some(c)) => Ok(Some((r, c))),
            (None, None) => Ok(None),
            _ => Err(format!(
                "optimizer state of param {param_id} has only one of {row} and {col} \
                 (keys [{}]); a factored second moment needs both",
                g.dict_str_keys(slot).join(", ")
            )),
        }
    };
    if let Some((row, col)) = pair("exp_avg_sq_row", "exp_avg_sq_col")? {
        return Ok(Layout::FactoredRowsCols { row, col });
    }
    if let Some((row, col)) = pair("row_var", "col_var")? {
        return Ok(Layout::FactoredVars { row, col });
    }
    if let Some(t) = tensor_at(g, slot, "variance", param_id)? {
        return Ok(Layout::AdafactorFull(t));
    }
    if let Some(t) = tensor_at(g, slot, "exp_avg_sq", param_id)? {
        return Ok(if has(g, slot, "RMS") {
            Layout::AdafactorFull(t)
        } else {
            Layout::ExpAvgSq(t)
        });
    }
    let keys = g.dict_str_keys(slot);
    let momentum_only = keys.iter().any(|k| k == "momentum_buffer")
        && keys.iter().all(|k| k == "momentum_buffer" || k == "step");
    Ok(if momentum_only {
        Layout::Momentum
    } else {
        Layout::Unknown
    })
}

fn bitsandbytes(
    g: &Unpickled,
    quant: Id,
    param_id: i64,
) -> std::result::Result<Layout<'_>, String> {
    let keys = || g.dict_str_keys(quant).join(", ");
    match tensor_at(g, quant, "state2", param_id)? {
        Some(codes) if codes.dtype == DType::UINT8 => {
            let qmap = tensor_at(g, quant, "qmap2", param_id)?;
            let absmax = tensor_at(g, quant, "absmax2", param_id)?;
            match (qmap, absmax) {
                (Some(qmap), Some(absmax)) => Ok(Layout::BnbBlockwise {
                    codes,
                    qmap,
                    absmax,
                }),
                _ => Err(format!(
                    "foreign state: optimizer state of param {param_id} has keys [{}]: a \
                     bitsandbytes 8-bit state2 needs qmap2 and absmax2 to be dequantized",
                    keys()
                )),
            }
        }
        Some(state2) => Ok(Layout::BnbFloat(state2)),
        None => match tensor_at(g, quant, "state1", param_id)? {
            Some(state1) => Ok(Layout::BnbOneState {
                eight_bit: state1.dtype == DType::UINT8,
            }),
            None => Err(format!(
                "foreign state: optimizer state of param {param_id} has keys [{}]: a \
                 bitsandbytes state without state1 or state2",
                keys()
            )),
        },
    }
}

/// Reduces second moments of one file, sharing buffers and the file's
/// work budget across parameters.
pub struct MomentReader<'a> {
    ts: &'a TorchSave,
    budget: WorkBudget,
    bytes: Vec<u8>,
    scale_bytes: Vec<u8>,
    scales: Vec<f64>,
    /// Adam second moments already reduced, by param id (see
    /// [`MomentReader::with_reduced`]).
    reduced: HashMap<i64, Reduction>,
}

impl<'a> MomentReader<'a> {
    pub fn new(ts: &'a TorchSave) -> MomentReader<'a> {
        MomentReader::with_reduced(ts, HashMap::new())
    }

    /// A reader that takes the `exp_avg_sq` of the params in `reduced` as
    /// already reduced (by Adam's plausibility pass, which reads the same
    /// contiguous tensor with the same chunking, so the sums are the ones
    /// [`reduce_tensor`] gives) instead of reading it again. The work is
    /// still charged to the budget, as a read would be.
    pub fn with_reduced(ts: &'a TorchSave, reduced: HashMap<i64, Reduction>) -> MomentReader<'a> {
        MomentReader {
            ts,
            budget: WorkBudget::for_archive(&ts.archive),
            bytes: Vec::new(),
            scale_bytes: Vec::new(),
            scales: Vec::new(),
            reduced,
        }
    }

    /// Statistics of the second moment in `layout`, or None for a layout
    /// without one.
    pub fn stat(&mut self, param_id: i64, layout: &Layout<'_>) -> Result<Option<ParamStat>> {
        let full = |t: &Tensor, r: Reduction| ParamStat {
            param_id,
            numel: r.numel,
            shape: t.size.clone(),
            exp_avg_sq_mean: r.mean(),
            nonfinite: r.nonfinite,
        };
        let stat = match *layout {
            Layout::ExpAvgSq(t) => {
                let what = format!("exp_avg_sq of param {param_id}");
                let r = match self.reduced.get(&param_id) {
                    // Charged as `reduce_tensor` charges a contiguous view.
                    Some(r) if r.numel == 0 => *r,
                    Some(r) if self.budget.charge(r.numel.saturating_mul(2)) => *r,
                    Some(_) => return Err(self.ts.over_budget(&what)),
                    None => self.reduce(t, &what)?,
                };
                full(t, r)
            }
            Layout::BnbFloat(t) => full(t, self.reduce(t, &format!("state2 of param {param_id}"))?),
            Layout::AdafactorFull(t) => full(
                t,
                self.reduce(t, &format!("second moment of param {param_id}"))?,
            ),
            Layout::BnbBlockwise {
                codes,
                qmap,
                absmax,
            } => {
                let r = self.dequantized(param_id, codes, qmap, absmax)?;
                full(codes, r)
            }
            Layout::FactoredRowsCols { row, col } => {
                self.factored(param_id, row, col, ["exp_avg_sq_row", "exp_avg_sq_col"], 1)?
            }
            Layout::FactoredVars { row, col } => {
                self.factored(param_id, row, col, ["row_var", "col_var"], 2)?
            }
            Layout::BnbOneState { .. } | Layout::Momentum | Layout::Unknown => return Ok(None),
        };
        Ok(Some(stat))
    }

    fn reduce(&mut self, t: &Tensor, what: &str) -> Result<Reduction> {
        reduce_tensor(self.ts, t, what, &mut self.bytes, &mut self.budget)
    }

    /// Sum and non-finite count of `qmap[code] * absmax[i / B]` over the
    /// codes, a bounded number of blocks at a time.
    fn dequantized(
        &mut self,
        param_id: i64,
        codes: &Tensor,
        qmap: &Tensor,
        absmax: &Tensor,
    ) -> Result<Reduction> {
        let ts = self.ts;
        let code_view = ts.contiguous(
            codes,
            &format!("state2 of param {param_id}"),
            &mut self.budget,
        )?;
        let map = self.quantization_map(param_id, qmap)?;
        let what = format!("absmax2 of param {param_id}");
        let scale_kind = float_kind(absmax, &what).map_err(|m| ts.err(m))?;
        let scale_view = ts.contiguous(absmax, &what, &mut self.budget)?;
        let n = code_view.plan.numel;
        let blocks = scale_view.plan.numel;
        let Some(block) = BNB_BLOCK_SIZES
            .iter()
            .copied()
            .find(|&b| n.div_ceil(b) == blocks)
        else {
            return Err(ts
                .err(format!(
                    "absmax2 of param {param_id} has {blocks} entries, but {n} elements in \
                 bitsandbytes' blocks of {} make {} (or {} in blocks of {}); the state2 \
                 scales do not belong to its codes",
                    BNB_BLOCK_SIZES[0],
                    n.div_ceil(BNB_BLOCK_SIZES[0]),
                    n.div_ceil(BNB_BLOCK_SIZES[1]),
                    BNB_BLOCK_SIZES[1],
                ))
                .with("numel", n.to_string())
                .with("absmax_len", blocks.to_string()));
        };
        let (values, bad) = map;
        let blocks_per_chunk = (CODES_PER_CHUNK / block).max(1);
        let block_len = usize::try_from(block).unwrap_or(usize::MAX);
        let mut out = Reduction {
            numel: n,
            ..Reduction::default()
        };
        let mut first_block = 0u64;
        while first_block < blocks {
            let count = blocks_per_chunk.min(blocks - first_block);
            ts.read_elems(&scale_view, first_block, count, &mut self.scale_bytes)?;
            self.scales.clear();
            self.scales
                .resize(self.scale_bytes.len() / scale_kind.size(), 0.0);
            decode(scale_kind, &self.scale_bytes, &mut self.scales);
            let start = first_block * block;
            let end = n.min((first_block + count) * block);
            ts.read_elems(&code_view, start, end - start, &mut self.bytes)?;
            for (block_codes, &scale) in self.bytes.chunks(block_len).zip(&self.scales) {
                let mut sum = 0.0f64;
                let mut nonfinite = 0u64;
                for &c in block_codes {
                    sum += values[usize::from(c)];
                    nonfinite += bad[usize::from(c)];
                }
                out.sum += sum * scale;
                out.nonfinite += if scale.is_finite() {
                    nonfinite
                } else {
                    block_codes.len() as u64
                };
            }
            first_block += count;
        }
        Ok(out)
    }

    /// The 256 values of a quantization map and, per code, 1 when its
    /// value is not finite.
    fn quantization_map(
        &mut self,
        param_id: i64,
        qmap: &Tensor,
    ) -> Result<([f64; QMAP_LEN as usize], [u64; QMAP_LEN as usize])> {
        let ts = self.ts;
        let what = format!("qmap2 of param {param_id}");
        let kind = float_kind(qmap, &what).map_err(|m| ts.err(m))?;
        let view = ts.contiguous(qmap, &what, &mut self.budget)?;
        if view.plan.numel != QMAP_LEN {
            return Err(ts
                .err(format!(
                    "{what} has {} entries; a bitsandbytes quantization map has {QMAP_LEN}",
                    view.plan.numel
                ))
                .with("qmap_len", view.plan.numel.to_string()));
        }
        ts.read_elems(&view, 0, QMAP_LEN, &mut self.bytes)?;
        let mut values = [0.0f64; QMAP_LEN as usize];
        decode(kind, &self.bytes, &mut values);
        let mut bad = [0u64; QMAP_LEN as usize];
        for (b, v) in bad.iter_mut().zip(&values) {
            *b = u64::from(!v.is_finite());
        }
        Ok((values, bad))
    }

    /// Adafactor's factored estimate: `batch` trailing dims differ between
    /// the factors' layouts (1 for transformers, 2 for torch).
    fn factored(
        &mut self,
        param_id: i64,
        row: &Tensor,
        col: &Tensor,
        names: [&str; 2],
        layout_dims: usize,
    ) -> Result<ParamStat> {
        let ts = self.ts;
        let shape = factored_shape(&row.size, &col.size, layout_dims).ok_or_else(|| {
            ts.err(format!(
                "{} and {} of param {param_id} have shapes {:?} and {:?}, which are not the \
                 row and column factors of one tensor",
                names[0], names[1], row.size, col.size
            ))
        })?;
        let numel = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| ts.err(format!("param {param_id}: element count overflows")))?;
        let r = self.reduce(row, &format!("{} of param {param_id}", names[0]))?;
        let c = self.reduce(col, &format!("{} of param {param_id}", names[1]))?;
        let mean = if r.sum.is_finite() {
            c.mean()
        } else {
            f64::NAN
        };
        Ok(ParamStat {
            param_id,
            numel,
            shape,
            exp_avg_sq_mean: mean,
            nonfinite: r.nonfinite + c.nonfinite,
        })
    }
}

/// The parameter shape behind Adafactor's factors, or None when they do
/// not fit together. transformers (`layout_dims` 1): row `S[:-1]`, column
/// `S[:-2] + S[-1:]`. torch (`layout_dims` 2): row `S` with `S[-1] = 1`,
/// column `S` with `S[-2] = 1`.
pub fn factored_shape(row: &[u64], col: &[u64], layout_dims: usize) -> Option<Vec<u64>> {
    if row.len() != col.len() || row.len() < layout_dims.max(1) {
        return None;
    }
    let (&cols, col_rest) = col.split_last()?;
    match layout_dims {
        1 => {
            if row.split_last()?.1 != col_rest {
                return None;
            }
            let mut shape = row.to_vec();
            shape.push(cols);
            Some(shape)
        }
        2 => {
            let (&one_r, row_rest) = row.split_last()?;
            let (&rows, batch) = row_rest.split_last()?;
            let (&one_c, col_batch) = col_rest.split_last()?;
            if one_r != 1 || one_c != 1 || batch != col_batch {
                return None;
            }
            let mut shape = batch.to_vec();
            shape.extend([rows, cols]);
            Some(shape)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factor_shapes() {
        // transformers: (4, 6) → row (4,), col (6,); (2, 4, 6) → (2, 4), (2, 6).
        assert_eq!(factored_shape(&[4], &[6], 1), Some(vec![4, 6]));
        assert_eq!(factored_shape(&[2, 4], &[2, 6], 1), Some(vec![2, 4, 6]));
        assert_eq!(factored_shape(&[2, 4], &[3, 6], 1), None);
        assert_eq!(factored_shape(&[4], &[2, 6], 1), None);
        // torch: (4, 6) → row (4, 1), col (1, 6).
        assert_eq!(factored_shape(&[4, 1], &[1, 6], 2), Some(vec![4, 6]));
        assert_eq!(
            factored_shape(&[2, 4, 1], &[2, 1, 6], 2),
            Some(vec![2, 4, 6])
        );
        assert_eq!(factored_shape(&[4, 2], &[1, 6], 2), None);
        assert_eq!(factored_shape(&[2, 4, 1], &[3, 1, 6], 2), None);
        assert_eq!(factored_shape(&[4], &[6], 2), None);
        assert_eq!(factored_shape(&[], &[], 1), None);
    }
}
