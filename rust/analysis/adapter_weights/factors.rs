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

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use super::composed::composed_factors;
use super::plan::{ModulePlan, OpenAdapter};
use crate::error::{Area, Error, Result};
use crate::formats::tensor_data::{
    decode, moments_of, FloatTensor, Moments, TensorReader, DEFAULT_CHUNK_ELEMS,
};
use crate::io::claims::{check_claim, claimed_vec};

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

/// A module's name and (in, out): what a comparison matches modules by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleShape<'a> {
    pub name: &'a str,
    pub in_features: usize,
    pub out_features: usize,
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

/// Largest module (A and B together, in values) read at once: 2^25 f64 =
/// 256 MiB, above the largest LoRA module in use (rank 256 on a 53,248 ×
/// 16,384 projection is 1.8e7 values).
pub const MAX_MODULE_VALUES: u64 = 1 << 25;

const F64_BYTES: u64 = std::mem::size_of::<f64>() as u64;

/// Where a comparison gets each module's factors: all in memory
/// ([`AdapterFactors`]) or read from the file one module at a time
/// ([`FactorFile`]), so comparing two large adapters holds one module pair.
pub trait ModuleSource {
    /// The safetensors file the factors come from.
    fn path(&self) -> &Path;
    /// Whether an `adapter_config.json` gave the scales.
    fn has_config(&self) -> bool;
    /// Every module's name and shape, sorted by (layer, name).
    fn shapes(&self) -> Vec<ModuleShape<'_>>;
    /// The factors of the `k`-th module of [`ModuleSource::shapes`].
    fn module(&self, k: usize) -> Result<Cow<'_, ModuleFactors>>;
}

impl ModuleSource for AdapterFactors {
    fn path(&self) -> &Path {
        &self.path
    }
    fn has_config(&self) -> bool {
        self.has_config
    }
    fn shapes(&self) -> Vec<ModuleShape<'_>> {
        self.modules
            .iter()
            .map(|m| ModuleShape {
                name: &m.name,
                in_features: m.in_features,
                out_features: m.out_features,
            })
            .collect()
    }
    fn module(&self, k: usize) -> Result<Cow<'_, ModuleFactors>> {
        Ok(Cow::Borrowed(&self.modules[k]))
    }
}

/// A LoRA adapter opened (header and config checked) whose factors are
/// read on demand, one module at a time.
pub struct FactorFile {
    open: OpenAdapter,
    /// Plan entries in (layer, name) order.
    order: Vec<Entry>,
}

/// A module of the plan: a LoRA pair or a LyCORIS composed module.
#[derive(Debug, Clone, Copy)]
enum Entry {
    Lora(usize),
    Composed(usize),
}

impl FactorFile {
    /// Open the adapter at `path` (a directory or its `.safetensors` file),
    /// checked as [`super::read_adapter_weights`] checks it; no factor is
    /// read yet.
    pub fn open(path: &Path) -> Result<Self> {
        let open = OpenAdapter::open_lora(path)?;
        let mut order: Vec<Entry> = (0..open.plan.modules.len())
            .map(Entry::Lora)
            .chain((0..open.plan.composed.len()).map(Entry::Composed))
            .collect();
        order.sort_by_cached_key(|e| {
            let (name, layer, ..) = open.entry_shape(*e);
            (layer, name.to_string())
        });
        Ok(Self { open, order })
    }

    /// Factor values of the whole adapter (A and B of every module; a
    /// composed module's formed factors).
    pub fn values(&self) -> u64 {
        let plan = &self.open.plan;
        plan.modules
            .iter()
            .map(|m| m.a.numel.saturating_add(m.b.numel))
            .chain(plan.composed.iter().map(|m| m.values()))
            .fold(0u64, u64::saturating_add)
    }
}

impl OpenAdapter {
    /// (name, layer, in, out) of a plan entry.
    fn entry_shape(&self, e: Entry) -> (&str, Option<u64>, u64, u64) {
        match e {
            Entry::Lora(i) => {
                let m = &self.plan.modules[i];
                (&m.name, m.layer, m.in_features, m.out_features)
            }
            Entry::Composed(i) => {
                let m = &self.plan.composed[i];
                (&m.name, m.layer, m.in_features, m.out_features)
            }
        }
    }
}

impl ModuleSource for FactorFile {
    fn path(&self) -> &Path {
        &self.open.weights_path
    }
    fn has_config(&self) -> bool {
        self.open.scaled()
    }
    fn shapes(&self) -> Vec<ModuleShape<'_>> {
        let shape = |&e: &Entry| {
            let (name, _, in_features, out_features) = self.open.entry_shape(e);
            ModuleShape {
                name,
                in_features: in_features as usize,
                out_features: out_features as usize,
            }
        };
        self.order.iter().map(shape).collect()
    }
    fn module(&self, k: usize) -> Result<Cow<'_, ModuleFactors>> {
        let mut reader = self.open.data.reader(DEFAULT_CHUNK_ELEMS);
        let file = &self.open.weights_path;
        let m = match self.order[k] {
            Entry::Lora(i) => &self.open.plan.modules[i],
            Entry::Composed(i) => {
                // Planned within the module value cap.
                let p = &self.open.plan.composed[i];
                return composed_factors(&mut reader, p, file).map(Cow::Owned);
            }
        };
        let values = m.a.numel.saturating_add(m.b.numel);
        // The module's two factors are held together, so they are capped
        // together (each is also capped alone where it is allocated).
        let what = format!("module {:?}", m.name);
        check_claim(values, F64_BYTES, MAX_MODULE_VALUES, &what)
            .map_err(|e| Error::new(Area::Weights, file, e))?;
        module_factors(&mut reader, m, file).map(Cow::Owned)
    }
}

/// Read every LoRA module's A and B of the adapter at `path` (a directory
/// or its `.safetensors` file), checked as [`super::read_adapter_weights`]
/// checks them. For callers that keep several adapters in memory; a
/// comparison of two reads one module at a time through [`FactorFile`].
pub fn read_adapter_factors(path: &Path) -> Result<AdapterFactors> {
    let file = FactorFile::open(path)?;
    let values = file.values();
    if values > MAX_FACTOR_VALUES {
        return Err(Error::new(
            Area::Weights,
            &file.open.weights_path,
            format!(
                "its LoRA factors hold {values} values, more than the {MAX_FACTOR_VALUES} \
                 read at once for a comparison"
            ),
        ));
    }
    let modules = (0..file.order.len())
        .map(|k| file.module(k).map(Cow::into_owned))
        .collect::<Result<Vec<_>>>()?;
    Ok(AdapterFactors {
        path: file.open.weights_path.clone(),
        has_config: file.open.scaled(),
        modules,
    })
}

fn module_factors(reader: &mut TensorReader, m: &ModulePlan, file: &Path) -> Result<ModuleFactors> {
    let (mut a, nonfinite_a) = read_values(reader, &m.a, file)?;
    let (mut b, nonfinite_b) = read_values(reader, &m.b, file)?;
    let info = m.info();
    if m.transposed {
        // Stored as Aᵀ (in × r) and Bᵀ (r × out): turned to A and B.
        a = transpose(&a, info.in_features, info.rank);
        b = transpose(&b, info.rank, info.out_features);
    }
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

/// The transpose of a row-major `rows` × `cols` matrix.
fn transpose(values: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; values.len()];
    for (i, row) in values.chunks_exact(cols.max(1)).take(rows).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[j * rows + i] = v;
        }
    }
    out
}

/// Every value of `t`, in file order (exactly `numel` of them).
pub(super) fn read_all(
    reader: &mut TensorReader,
    t: &FloatTensor,
    file: &Path,
) -> Result<Vec<f64>> {
    let what = format!("tensor {:?}", t.name);
    let mut out: Vec<f64> = claimed_vec(t.numel, MAX_MODULE_VALUES, &what)
        .map_err(|e| Error::new(Area::Weights, file, e))?;
    let size = t.kind.size();
    let mut chunk = Vec::new();
    reader.for_each_raw_chunk(t, |bytes| {
        chunk.resize(bytes.len() / size, 0.0);
        decode(t.kind, bytes, &mut chunk);
        out.extend_from_slice(&chunk);
        ControlFlow::Continue(())
    })?;
    if out.len() as u64 != t.numel {
        return Err(Error::new(
            Area::Weights,
            file,
            format!(
                "tensor {:?}: read {} values of {}",
                t.name,
                out.len(),
                t.numel
            ),
        ));
    }
    Ok(out)
}

/// All values of `t` in file order, and how many are not finite.
fn read_values(reader: &mut TensorReader, t: &FloatTensor, file: &Path) -> Result<(Vec<f64>, u64)> {
    let out = read_all(reader, t, file)?;
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
/// the factors); a LyCORIS composed module's formed factors come from
/// memory, one block each.
pub struct FactorStream<'r, 'd> {
    source: StreamSource<'r, 'd>,
}

enum StreamSource<'r, 'd> {
    File {
        reader: &'r mut TensorReader<'d>,
        a: &'r FloatTensor,
        b: &'r FloatTensor,
        /// Stored as Aᵀ and Bᵀ (mlx-lm): blocks are turned as they are read.
        transposed: bool,
    },
    Memory(&'r ModuleFactors),
}

impl FactorStream<'_, '_> {
    /// `lora_B` (out × r) in blocks of whole rows: `f(first_row, rows,
    /// values)`, values row-major (rows × r). Returns B's moments.
    pub fn b_rows(&mut self, mut f: impl FnMut(usize, usize, &[f64])) -> Result<Moments> {
        let mut row = 0;
        let (reader, b, transposed) = match &mut self.source {
            StreamSource::Memory(m) => {
                f(0, m.out_features, &m.b);
                return Ok(moments_of(&m.b));
            }
            StreamSource::File {
                reader,
                b,
                transposed,
                ..
            } => (reader, *b, *transposed),
        };
        if transposed {
            // Bᵀ (r × out) by columns: each block of B's rows, turned.
            let mut turned = Vec::new();
            let rank = b.shape.first().copied().unwrap_or(0) as usize;
            return reader.for_each_column_block(b, |w, vals| {
                turned.clear();
                turned.extend(transpose(vals, rank, w));
                f(row, w, &turned);
                row += w;
            });
        }
        reader.for_each_row_block(b, |n, vals| {
            f(row, n, vals);
            row += n;
        })
    }

    /// `lora_A` (r × in) in blocks of whole columns: `f(first_col, cols,
    /// values)`, values row-major (r × cols). Returns A's moments.
    pub fn a_columns(&mut self, mut f: impl FnMut(usize, usize, &[f64])) -> Result<Moments> {
        let mut col = 0;
        let (reader, a, transposed) = match &mut self.source {
            StreamSource::Memory(m) => {
                f(0, m.in_features, &m.a);
                return Ok(moments_of(&m.a));
            }
            StreamSource::File {
                reader,
                a,
                transposed,
                ..
            } => (reader, *a, *transposed),
        };
        if transposed {
            // Aᵀ (in × r) by rows: each block of A's columns, turned.
            let mut turned = Vec::new();
            let rank = a.shape.get(1).copied().unwrap_or(0) as usize;
            return reader.for_each_row_block(a, |n, vals| {
                turned.clear();
                turned.extend(transpose(vals, n, rank));
                f(col, n, &turned);
                col += n;
            });
        }
        reader.for_each_column_block(a, |w, vals| {
            f(col, w, vals);
            col += w;
        })
    }
}

/// Visit every LoRA module of the adapter at `path` (checked as
/// [`read_adapter_factors`] checks them), in plan order (by name; LyCORIS
/// composed modules after the LoRA pairs), with its
/// factors streamed in chunks of at most `chunk_elems` values. Returns
/// whether a config gave the scales.
pub fn stream_adapter_factors(
    path: &Path,
    chunk_elems: usize,
    mut visit: impl FnMut(&ModuleInfo, &mut FactorStream<'_, '_>) -> Result<()>,
) -> Result<bool> {
    let open = OpenAdapter::open_lora(path)?;
    let scaled = open.scaled();
    let OpenAdapter {
        data,
        plan,
        weights_path,
        ..
    } = open;
    let mut reader = data.reader(chunk_elems);
    for m in &plan.modules {
        let info = m.info();
        let mut stream = FactorStream {
            source: StreamSource::File {
                reader: &mut reader,
                a: &m.a,
                b: &m.b,
                transposed: m.transposed,
            },
        };
        visit(&info, &mut stream)?;
    }
    for p in &plan.composed {
        let m = composed_factors(&mut reader, p, &weights_path)?;
        let info = ModuleInfo {
            name: m.name.clone(),
            layer: m.layer,
            rank: m.rank,
            in_features: m.in_features,
            out_features: m.out_features,
            scale: m.scale,
        };
        let mut stream = FactorStream {
            source: StreamSource::Memory(&m),
        };
        visit(&info, &mut stream)?;
    }
    Ok(scaled)
}
