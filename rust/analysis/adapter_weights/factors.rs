//! The LoRA factors themselves, decoded to f64, for kernels that need more
//! than the per-module Gram matrices (comparing two adapters' updates).
//!
//! Why more than [`super::read_adapter_weights`]: the health statistics
//! stream each factor once and keep only r×r Grams, but the inner product
//! of two different adapters' updates needs both factors of both
//! (`⟨B₁A₁, B₂A₂⟩_F = tr((B₁ᵀB₂)(A₂A₁ᵀ))`). All three open the adapter
//! through [`OpenAdapter`] (key names → modules and layers, rank and shape
//! checks, the config's scale), so they agree on what a module is.
//!
//! Memory: one adapter's factors, `Σ r·(in + out)` f64 values; callers that
//! walk many adapters hold a bounded number at once.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use super::plan::{ModulePlan, OpenAdapter};
use crate::error::{Area, Error, Result};
use crate::formats::tensor_data::{
    decode, FloatTensor, Moments, TensorReader, DEFAULT_CHUNK_ELEMS,
};

/// One LoRA module's factors: `ΔW = scale · B · A`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleFactors {
    /// Module name as PEFT names it (keys less `base_model.model.`).
    pub name: String,
    pub layer: Option<u64>,
    pub rank: usize,
    pub in_features: usize,
    pub out_features: usize,
    /// The config's scale for this module; 1 without a config.
    pub scale: f64,
    /// `lora_A`, rank × in, row-major.
    pub a: Vec<f64>,
    /// `lora_B`, out × rank, row-major.
    pub b: Vec<f64>,
    /// Non-finite values in A and B together.
    pub nonfinite: u64,
}

/// Every LoRA module of one adapter, sorted by (layer, name).
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterFactors {
    /// The safetensors file read.
    pub path: PathBuf,
    /// False when no `adapter_config.json` gave the scales (then every
    /// scale is 1 and only scale-free comparisons are meaningful).
    pub has_config: bool,
    pub modules: Vec<ModuleFactors>,
}

impl AdapterFactors {
    /// Bytes the factors take in memory.
    pub fn value_bytes(&self) -> usize {
        self.modules
            .iter()
            .map(|m| (m.a.len() + m.b.len()) * std::mem::size_of::<f64>())
            .sum()
    }
}

/// Largest adapter (in factor values) read whole: 2^28 f64 = 2 GiB.
pub const MAX_FACTOR_VALUES: u64 = 1 << 28;

/// Read every LoRA module's A and B of the adapter at `path` (a directory
/// or its `.safetensors` file), checked as [`super::read_adapter_weights`]
/// checks them.
pub fn read_adapter_factors(path: &Path) -> Result<AdapterFactors> {
    let OpenAdapter {
        weights_path,
        config,
        data,
        plan,
    } = OpenAdapter::open_lora(path)?;
    let values: u64 = plan
        .modules
        .iter()
        .map(|m| m.a.numel.saturating_add(m.b.numel))
        .fold(0u64, u64::saturating_add);
    if values > MAX_FACTOR_VALUES {
        return Err(Error::new(
            Area::Weights,
            &weights_path,
            format!(
                "its LoRA factors hold {values} values, more than the {MAX_FACTOR_VALUES} \
                 read at once for a comparison"
            ),
        ));
    }
    let mut reader = data.reader(DEFAULT_CHUNK_ELEMS);
    let mut modules = plan
        .modules
        .iter()
        .map(|m| module_factors(&mut reader, m))
        .collect::<Result<Vec<_>>>()?;
    modules.sort_by(|x, y| (x.layer, &x.name).cmp(&(y.layer, &y.name)));
    Ok(AdapterFactors {
        path: weights_path,
        has_config: config.is_some(),
        modules,
    })
}

fn module_factors(reader: &mut TensorReader, m: &ModulePlan) -> Result<ModuleFactors> {
    let (a, nonfinite_a) = read_values(reader, &m.a)?;
    let (b, nonfinite_b) = read_values(reader, &m.b)?;
    let info = m.info();
    Ok(ModuleFactors {
        name: info.name,
        layer: info.layer,
        rank: info.rank,
        in_features: info.in_features,
        out_features: info.out_features,
        scale: info.scale,
        a,
        b,
        nonfinite: nonfinite_a + nonfinite_b,
    })
}

/// All values of `t` in file order, and how many are not finite.
fn read_values(reader: &mut TensorReader, t: &FloatTensor) -> Result<(Vec<f64>, u64)> {
    let n = usize::try_from(t.numel).unwrap_or(usize::MAX);
    let mut out: Vec<f64> = Vec::new();
    // The count comes from the file's header: an allocation the system
    // refuses is this adapter's error, not an abort of the whole process.
    out.try_reserve_exact(n).map_err(|_| {
        Error::new(
            Area::Weights,
            Path::new(&t.name),
            format!(
                "cannot allocate {} MB for the {n} values its header claims",
                n.saturating_mul(std::mem::size_of::<f64>()) >> 20
            ),
        )
    })?;
    let size = t.kind.size();
    let mut chunk = Vec::new();
    reader.for_each_raw_chunk(t, |bytes| {
        chunk.resize(bytes.len() / size, 0.0);
        decode(t.kind, bytes, &mut chunk);
        out.extend_from_slice(&chunk);
        ControlFlow::Continue(())
    })?;
    let nonfinite = out.iter().filter(|v| !v.is_finite()).count() as u64;
    Ok((out, nonfinite))
}

/// Shape and scale of one LoRA module, as the module plan found them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleInfo {
    pub name: String,
    pub layer: Option<u64>,
    pub rank: usize,
    pub in_features: usize,
    pub out_features: usize,
    /// The config's scale; 1 without a config.
    pub scale: f64,
}

impl ModulePlan {
    /// The module's shape and scale (1 without a config).
    fn info(&self) -> ModuleInfo {
        ModuleInfo {
            name: self.name.clone(),
            layer: self.layer,
            rank: self.rank as usize,
            in_features: self.in_features as usize,
            out_features: self.out_features as usize,
            scale: self.scale.unwrap_or(1.0),
        }
    }
}

/// One module's factors, streamed in bounded blocks through a reader whose
/// buffers are reused from module to module (no per-adapter allocation of
/// the factors).
pub struct FactorStream<'r, 'd> {
    reader: &'r mut TensorReader<'d>,
    a: &'r FloatTensor,
    b: &'r FloatTensor,
}

impl FactorStream<'_, '_> {
    /// `lora_B` (out × r) in blocks of whole rows: `f(first_row, rows,
    /// values)`, values row-major (rows × r). Returns B's moments.
    pub fn b_rows(&mut self, mut f: impl FnMut(usize, usize, &[f64])) -> Result<Moments> {
        let mut row = 0;
        self.reader.for_each_row_block(self.b, |n, vals| {
            f(row, n, vals);
            row += n;
        })
    }

    /// `lora_A` (r × in) in blocks of whole columns: `f(first_col, cols,
    /// values)`, values row-major (r × cols). Returns A's moments.
    pub fn a_columns(&mut self, mut f: impl FnMut(usize, usize, &[f64])) -> Result<Moments> {
        let mut col = 0;
        self.reader.for_each_column_block(self.a, |w, vals| {
            f(col, w, vals);
            col += w;
        })
    }
}

/// Visit every LoRA module of the adapter at `path` (checked as
/// [`read_adapter_factors`] checks them), in plan order (by name), with its
/// factors streamed in chunks of at most `chunk_elems` values. Returns
/// whether a config gave the scales.
pub fn stream_adapter_factors(
    path: &Path,
    chunk_elems: usize,
    mut visit: impl FnMut(&ModuleInfo, &mut FactorStream<'_, '_>) -> Result<()>,
) -> Result<bool> {
    let OpenAdapter {
        config, data, plan, ..
    } = OpenAdapter::open_lora(path)?;
    let mut reader = data.reader(chunk_elems);
    for m in &plan.modules {
        let info = m.info();
        let mut stream = FactorStream {
            reader: &mut reader,
            a: &m.a,
            b: &m.b,
        };
        visit(&info, &mut stream)?;
    }
    Ok(config.is_some())
}
