//! Weight-space health of a PEFT LoRA adapter, from `adapter_model.safetensors`
//! and `adapter_config.json` alone.
//!
//! Why: the commonest broken adapter never shows in a training log — `lora_B`
//! never left its zero init (so `ΔW = 0` and the adapter is the base model),
//! or a bad step left NaN/inf in the weights. Both are visible in the
//! factors, and the factors are small, so every value is read.
//!
//! Per LoRA module (`lora_A` `(r, in)` and `lora_B` `(out, r)`, or
//! `lora_embedding_A`/`_B`) we stream each factor once, in bounded chunks
//! (`tensor_data`), and accumulate in f64 the r×r Gram matrices
//! `G = A·Aᵀ` and `H = Bᵀ·B`; the out×in product is never formed. Then, with
//! `s` the module's scale from the config (`adapter_config`):
//!
//! - `‖ΔW‖_F² = s²·tr(H·G)` for `ΔW = s·B·A`;
//! - the singular values of `ΔW` are `|s|·sqrt(λ_i)` with `λ_i` the
//!   eigenvalues of the symmetric PSD `H^½·G·H^½` (same non-zero spectrum
//!   as `(BA)ᵀ(BA)`); from them the stable rank `Σσ²/σ_max²`, the effective
//!   rank `exp(entropy of σ_i/Σσ)` (Roy & Vetterli 2007) and the rank used:
//!   how many `σ_i > max(1e-6, ε)·σ_max`, with `ε` the machine epsilon of the
//!   coarser factor dtype (storing B·A's factors in bf16 alone perturbs
//!   σ by about `ε·σ_max`, so a stricter cut would count rounding as rank).
//!
//! Eigen-solver: nalgebra's `SymmetricEigen` (Householder tridiagonalisation
//! then implicit symmetric QR with Wilkinson shifts), run with a bounded
//! iteration count, once per module when `H` has a Cholesky factor `L`
//! (the spectrum is that of `Lᵀ·G·L`), twice otherwise (`H^½` first). Chosen over a hand-written one because r×r with r ≤ 1024
//! is cheap next to reading the factors and a maintained, tested solver is
//! worth more here than one dependency less. Gram-route accuracy: `λ` carries
//! an absolute error of about `ε_f64·λ_max`, so `σ_i` is accurate to about
//! `1e-8·σ_max` — far below the rank cut above.
//!
//! Decisions:
//! - A missing `adapter_config.json` is not an error: everything scale-free
//!   is still reported (norms, non-finite counts, Gram-based ranks) and
//!   `scale`, `delta_fro` and `singular_values` are left empty, because
//!   they need the scale. A config that exists but is unreadable is an error.
//! - Module names are the tensor keys less `base_model.model.` and the
//!   factor suffix, i.e. the names PEFT matches `rank_pattern` against.
//! - Consistency errors (`Area::Weights`): A without B or B without A; a
//!   factor that is not a matrix (conv LoRA's 3-D/4-D factors are not
//!   supported); A and B of different rank; a rank other than the config's
//!   (pattern-aware) rank; a DoRA magnitude of the wrong length or without
//!   factors; a `target_modules` none of whose entries names a module.
//! - Every tensor must be F32/F16/BF16/F64, extra ones included.
//! - The plain result structs carry `#[pyclass(frozen, get_all,
//!   skip_from_py_object)]` under the `python` feature (outputs only: pyo3
//!   0.29 wants the `FromPyObject` choice spelled out for `Clone` types);
//!   [`AdapterWeights`] nests them and so has none.
//! - DoRA: `ΔW` here is the low-rank part `s·B·A`; DoRA's renormalised
//!   update needs the base weights. Its magnitude vector gets norm and
//!   non-finite count. `fan_in_fan_out` only transposes ΔW: no statistic
//!   changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nalgebra::{Cholesky, DMatrix, SymmetricEigen};
use rayon::prelude::*;

use crate::analysis::attribution::layer_number;
use crate::analysis::layers::ADAPTER_WEIGHTS;
use crate::error::{Area, Error, Result};
use crate::formats::adapter_config::{AdapterConfig, TargetModules, CONFIG_FILE};
use crate::formats::safetensors_header::TensorInfo;
use crate::formats::tensor_data::{
    FloatTensor, Moments, SafetensorsData, TensorReader, DEFAULT_CHUNK_ELEMS, MAX_GRAM_DIM,
};

/// Largest LoRA rank read (the Gram matrices are r×r f64).
pub const MAX_RANK: u64 = MAX_GRAM_DIM as u64;
/// The prefix PEFT puts before module names in saved keys.
const KEY_PREFIX: &str = "base_model.model.";
/// Floor of the relative cut under which a singular value is negligible.
const RANK_CUT_FLOOR: f64 = 1e-6;

/// Statistics of one LoRA module.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct LoraModuleStats {
    /// Module name as PEFT names it, e.g. `model.layers.3.self_attn.q_proj`.
    pub name: String,
    /// Transformer layer index, when the name carries one.
    pub layer: Option<u64>,
    /// `"linear"` (`lora_A`/`lora_B`) or `"embedding"` (`lora_embedding_*`).
    pub kind: String,
    /// LoRA rank from the factor shapes.
    pub rank: u64,
    pub in_features: u64,
    pub out_features: u64,
    pub dtype_a: String,
    pub dtype_b: String,
    /// alpha and scale PEFT applies to this module; None without a config.
    pub alpha: Option<f64>,
    pub scale: Option<f64>,
    pub norm_a: f64,
    pub norm_b: f64,
    /// Largest |value| (NaN ignored, inf counts).
    pub max_abs_a: f64,
    pub max_abs_b: f64,
    pub nonfinite_a: u64,
    pub nonfinite_b: u64,
    /// ‖s·B·A‖_F; None without a config, NaN with non-finite factors.
    pub delta_fro: Option<f64>,
    /// Singular values of ΔW = s·B·A, descending, `rank` of them; empty
    /// without a config or with non-finite factors.
    pub singular_values: Vec<f64>,
    /// Σσ²/σ_max² (0 when ΔW = 0; NaN with non-finite factors).
    pub stable_rank: f64,
    /// exp(entropy of σ_i/Σσ) (0 when ΔW = 0; NaN with non-finite factors).
    pub effective_rank: f64,
    /// Singular values above max(1e-6, dtype epsilon)·σ_max; None with
    /// non-finite factors.
    pub rank_used: Option<u64>,
    /// DoRA magnitude vector: norm (None without DoRA) and non-finite count.
    pub magnitude_norm: Option<f64>,
    pub magnitude_nonfinite: u64,
}

/// Statistics of a tensor that is not a LoRA factor (`modules_to_save`
/// copies, saved embedding layers, biases, ...).
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct TensorStats {
    /// The full key in the safetensors file.
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub numel: u64,
    pub norm: f64,
    pub max_abs: f64,
    pub nonfinite: u64,
}

/// ΔW energy of one transformer layer: Σ‖ΔW‖_F² over its modules.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct LayerEnergy {
    pub layer: u64,
    pub modules: u64,
    /// NaN when a module of the layer has non-finite factors.
    pub delta_fro_sq: f64,
}

/// What the config says, in plain fields.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSummary {
    pub path: PathBuf,
    pub peft_type: Option<String>,
    pub r: u64,
    pub lora_alpha: f64,
    pub use_rslora: bool,
    pub use_dora: bool,
    pub fan_in_fan_out: bool,
    /// The list as written, or the one regex string.
    pub target_modules: Vec<String>,
    /// True when `target_modules` was a regex (or `all-linear`) string.
    pub target_modules_is_regex: bool,
    pub modules_to_save: Vec<String>,
    pub base_model_name_or_path: Option<String>,
    /// Pattern keys in the order PEFT tries them.
    pub rank_pattern: Vec<(String, u64)>,
    pub alpha_pattern: Vec<(String, f64)>,
}

/// The whole report of one adapter's weights.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterWeights {
    /// The safetensors file read.
    pub path: PathBuf,
    /// None when no `adapter_config.json` sits beside the weights.
    pub config: Option<ConfigSummary>,
    /// Sorted by (layer, name); modules without a layer first.
    pub modules: Vec<LoraModuleStats>,
    /// In the order the header lists them.
    pub other_tensors: Vec<TensorStats>,
    /// Per-layer ΔW energy, by layer; empty without a config.
    pub layers: Vec<LayerEnergy>,
    /// Bytes of tensor data read (every tensor of the file).
    pub tensor_bytes: u64,
    /// Non-finite values over all tensors.
    pub nonfinite_total: u64,
}

/// Tensor data from which an adapter's modules are reduced in parallel.
const PARALLEL_MIN_BYTES: u64 = 4 << 20;

/// Read and check the adapter at `path`: an adapter directory (holding
/// `adapter_model.safetensors` and, normally, `adapter_config.json`) or the
/// `.safetensors` file itself (the config is looked up beside it).
pub fn read_adapter_weights(path: &Path) -> Result<AdapterWeights> {
    read_adapter_weights_chunked(path, DEFAULT_CHUNK_ELEMS, PARALLEL_MIN_BYTES)
}

/// [`read_adapter_weights`] with an explicit read size (tests use tiny ones
/// to exercise block boundaries) and parallel threshold (tests take both
/// routes).
pub(crate) fn read_adapter_weights_chunked(
    path: &Path,
    chunk_elems: usize,
    parallel_min_bytes: u64,
) -> Result<AdapterWeights> {
    let (weights_path, config_path) = locate(path)?;
    let config = match AdapterConfig::read(&config_path) {
        Ok(c) => Some(c),
        Err(e) if e.area == Area::Missing => None,
        Err(e) => return Err(e),
    };
    let data = SafetensorsData::open(&weights_path)?;
    let plan = plan(&data, config.as_ref())?;

    let tensor_bytes: u64 = data
        .header()
        .tensors
        .iter()
        .map(|t| t.data_offsets.1 - t.data_offsets.0)
        .sum();
    let stats_of = |reader: &mut TensorReader, t: &FloatTensor| -> Result<TensorStats> {
        let m = reader.moments(t)?;
        Ok(TensorStats {
            name: t.name.clone(),
            dtype: t.kind.safetensors_name().to_string(),
            shape: t.shape.clone(),
            numel: t.numel,
            norm: m.norm(),
            max_abs: m.max_abs,
            nonfinite: m.nonfinite,
        })
    };
    // Modules in parallel only when there is enough data to share out: a
    // small adapter (most of a store) costs less on one thread, with one set
    // of buffers, and a scan already runs adapters in parallel.
    let (mut modules, other_tensors) = if tensor_bytes >= parallel_min_bytes {
        let modules: Vec<LoraModuleStats> = plan
            .modules
            .par_iter()
            .map_init(|| data.reader(chunk_elems), reduce_module)
            .collect::<Result<_>>()?;
        let others: Vec<TensorStats> = plan
            .others
            .par_iter()
            .map_init(|| data.reader(chunk_elems), stats_of)
            .collect::<Result<_>>()?;
        (modules, others)
    } else {
        let mut reader = data.reader(chunk_elems);
        let modules: Vec<LoraModuleStats> = plan
            .modules
            .iter()
            .map(|m| reduce_module(&mut reader, m))
            .collect::<Result<_>>()?;
        let others: Vec<TensorStats> = plan
            .others
            .iter()
            .map(|t| stats_of(&mut reader, t))
            .collect::<Result<_>>()?;
        (modules, others)
    };
    modules.sort_by(module_order);

    let nonfinite_total = modules
        .iter()
        .map(|m| m.nonfinite_a + m.nonfinite_b + m.magnitude_nonfinite)
        .chain(other_tensors.iter().map(|t| t.nonfinite))
        .sum();
    Ok(AdapterWeights {
        path: weights_path,
        config: config.as_ref().map(summary),
        layers: layer_energy(&modules),
        modules,
        other_tensors,
        tensor_bytes,
        nonfinite_total,
    })
}

/// (weights file, config file) for a directory or a weights file.
fn locate(path: &Path) -> Result<(PathBuf, PathBuf)> {
    if path.is_dir() {
        let weights = path.join(ADAPTER_WEIGHTS);
        if !weights.exists() {
            let pickled = path.join("adapter_model.bin").exists();
            return Err(Error::new(
                Area::Missing,
                path,
                format!(
                    "no {ADAPTER_WEIGHTS} in this adapter directory{}",
                    if pickled {
                        " (adapter_model.bin is pickled torch weights, which are not read)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        return Ok((weights, path.join(CONFIG_FILE)));
    }
    let config = path
        .parent()
        .map_or_else(|| PathBuf::from(CONFIG_FILE), |dir| dir.join(CONFIG_FILE));
    Ok((path.to_path_buf(), config))
}

fn summary(c: &AdapterConfig) -> ConfigSummary {
    ConfigSummary {
        path: c.path.clone(),
        peft_type: c.peft_type.clone(),
        r: c.r,
        lora_alpha: c.lora_alpha,
        use_rslora: c.use_rslora,
        use_dora: c.use_dora,
        fan_in_fan_out: c.fan_in_fan_out,
        target_modules: c
            .target_modules
            .as_ref()
            .map(TargetModules::entries)
            .unwrap_or_default(),
        target_modules_is_regex: c.target_modules.as_ref().is_some_and(|t| t.is_pattern()),
        modules_to_save: c.modules_to_save.clone(),
        base_model_name_or_path: c.base_model_name_or_path.clone(),
        rank_pattern: c
            .rank_pattern
            .iter()
            .map(|p| (p.key.clone(), p.value))
            .collect(),
        alpha_pattern: c
            .alpha_pattern
            .iter()
            .map(|p| (p.key.clone(), p.value))
            .collect(),
    }
}

// ---------------------------------------------------------------------------
// grouping keys into modules

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    A,
    B,
    Magnitude,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModuleKind {
    Linear,
    Embedding,
}

impl ModuleKind {
    fn name(self) -> &'static str {
        match self {
            ModuleKind::Linear => "linear",
            ModuleKind::Embedding => "embedding",
        }
    }
}

/// (module name, role, kind) of a LoRA tensor key; None for other tensors.
fn classify(key: &str) -> Option<(&str, Role, Option<ModuleKind>)> {
    const SUFFIXES: [(&str, Role, Option<ModuleKind>); 6] = [
        (".lora_A.weight", Role::A, Some(ModuleKind::Linear)),
        (".lora_B.weight", Role::B, Some(ModuleKind::Linear)),
        (".lora_embedding_A", Role::A, Some(ModuleKind::Embedding)),
        (".lora_embedding_B", Role::B, Some(ModuleKind::Embedding)),
        (".lora_magnitude_vector", Role::Magnitude, None),
        (".lora_magnitude_vector.weight", Role::Magnitude, None),
    ];
    SUFFIXES.iter().find_map(|&(suffix, role, kind)| {
        let module = key.strip_suffix(suffix)?;
        let module = module.strip_prefix(KEY_PREFIX).unwrap_or(module);
        (!module.is_empty()).then_some((module, role, kind))
    })
}

/// Tensors of one module as found in the header.
#[derive(Default)]
struct Found<'h> {
    a: Option<(&'h TensorInfo, ModuleKind)>,
    b: Option<(&'h TensorInfo, ModuleKind)>,
    magnitude: Option<&'h TensorInfo>,
}

/// A module checked and ready to reduce.
struct ModulePlan {
    name: String,
    layer: Option<u64>,
    kind: ModuleKind,
    rank: u64,
    in_features: u64,
    out_features: u64,
    a: FloatTensor,
    b: FloatTensor,
    magnitude: Option<FloatTensor>,
    alpha: Option<f64>,
    scale: Option<f64>,
}

struct Plan {
    modules: Vec<ModulePlan>,
    others: Vec<FloatTensor>,
}

fn plan(data: &SafetensorsData, config: Option<&AdapterConfig>) -> Result<Plan> {
    let err = |msg: String| Error::new(Area::Weights, data.path(), msg);
    let mut found: BTreeMap<&str, Found> = BTreeMap::new();
    let mut others = Vec::new();
    for info in &data.header().tensors {
        let Some((module, role, kind)) = classify(&info.name) else {
            others.push(data.float_tensor(info)?);
            continue;
        };
        let slot = found.entry(module).or_default();
        let taken = match role {
            Role::A => slot.a.replace((info, kind.unwrap_or(ModuleKind::Linear))),
            Role::B => slot.b.replace((info, kind.unwrap_or(ModuleKind::Linear))),
            Role::Magnitude => slot
                .magnitude
                .replace(info)
                .map(|t| (t, ModuleKind::Linear)),
        };
        if let Some((earlier, _)) = taken {
            return Err(err(format!(
                "tensors {:?} and {:?} are both the {role:?} tensor of module {module:?}",
                earlier.name, info.name
            )));
        }
    }

    let mut modules = Vec::with_capacity(found.len());
    for (name, f) in found {
        let ((a, kind_a), (b, kind_b)) = match (f.a, f.b) {
            (Some(a), Some(b)) => (a, b),
            (Some((a, _)), None) => {
                return Err(err(format!(
                    "module {name:?} has lora_A ({:?}) but no lora_B",
                    a.name
                )))
            }
            (None, Some((b, _))) => {
                return Err(err(format!(
                    "module {name:?} has lora_B ({:?}) but no lora_A",
                    b.name
                )))
            }
            (None, None) => {
                let m = f.magnitude.map_or("", |m| m.name.as_str());
                return Err(err(format!(
                    "module {name:?} has a DoRA magnitude ({m:?}) but no lora_A/lora_B"
                )));
            }
        };
        if kind_a != kind_b {
            return Err(err(format!(
                "module {name:?} mixes {:?} and {:?} (one embedding and one linear factor)",
                a.name, b.name
            )));
        }
        let ta = data.float_tensor(a)?;
        let tb = data.float_tensor(b)?;
        let (rank, in_features) = matrix(&ta, name, "lora_A").map_err(err)?;
        let (out_features, rank_b) = matrix(&tb, name, "lora_B").map_err(err)?;
        if rank != rank_b {
            return Err(err(format!(
                "module {name:?}: lora_A {:?} has rank {rank} (shape {:?}) but lora_B {:?} has \
                 rank {rank_b} (shape {:?})",
                a.name, ta.shape, b.name, tb.shape
            )));
        }
        if rank == 0 || rank > MAX_RANK {
            return Err(err(format!(
                "module {name:?}: rank {rank} is outside 1..={MAX_RANK}"
            )));
        }
        let magnitude = match f.magnitude {
            None => None,
            Some(m) => {
                let tm = data.float_tensor(m)?;
                if tm.shape != [out_features] {
                    return Err(err(format!(
                        "module {name:?}: DoRA magnitude {:?} has shape {:?}, expected [{out_features}] \
                         (one per output feature)",
                        m.name, tm.shape
                    )));
                }
                Some(tm)
            }
        };
        let (alpha, scale) = match config {
            None => (None, None),
            Some(c) => {
                let s = c.scale_for(name);
                if s.r != rank {
                    let source = c.rank_pattern_key(name).map_or_else(
                        || "its r".to_string(),
                        |k| format!("rank_pattern key {k:?}"),
                    );
                    return Err(Error::new(
                        Area::Weights,
                        &c.path,
                        format!(
                            "module {name:?} has rank {rank} in {} but the config gives it rank {} \
                             ({source})",
                            data.path().display(),
                            s.r
                        ),
                    ));
                }
                (Some(s.alpha), Some(s.scale))
            }
        };
        modules.push(ModulePlan {
            name: name.to_string(),
            layer: layer_number(name),
            kind: kind_a,
            rank,
            in_features,
            out_features,
            a: ta,
            b: tb,
            magnitude,
            alpha,
            scale,
        });
    }

    if let Some(c) = config {
        check_targets(c, &modules, data.path())?;
    }
    Ok(Plan { modules, others })
}

/// (rows, cols) of a LoRA factor, or why it is not a matrix.
fn matrix(t: &FloatTensor, module: &str, role: &str) -> std::result::Result<(u64, u64), String> {
    t.matrix_dims().ok_or_else(|| {
        let hint = if t.shape.len() > 2 {
            " (LoRA factors of conv layers are not supported)"
        } else {
            ""
        };
        format!(
            "{role} of module {module:?} ({:?}) has shape {:?}: LoRA factors are matrices{hint}",
            t.name, t.shape
        )
    })
}

fn check_targets(c: &AdapterConfig, modules: &[ModulePlan], weights: &Path) -> Result<()> {
    let Some(targets) = &c.target_modules else {
        return Ok(());
    };
    let applies = match targets {
        TargetModules::Names(names) => !names.is_empty(),
        TargetModules::Regex { .. } => true,
        TargetModules::AllLinear => false,
    };
    if !applies || modules.iter().any(|m| targets.matches(&m.name)) {
        return Ok(());
    }
    let shown: Vec<&str> = modules.iter().take(5).map(|m| m.name.as_str()).collect();
    Err(Error::new(
        Area::Weights,
        &c.path,
        format!(
            "target_modules {:?} names none of the {} LoRA modules in {}{}",
            targets.entries(),
            modules.len(),
            weights.display(),
            if shown.is_empty() {
                String::new()
            } else {
                format!(" (e.g. {})", shown.join(", "))
            }
        ),
    ))
}

// ---------------------------------------------------------------------------
// per-module reduction

fn reduce_module(reader: &mut TensorReader, m: &ModulePlan) -> Result<LoraModuleStats> {
    let (g, ma) = reader.row_gram(&m.a)?;
    let (h, mb) = reader.column_gram(&m.b)?;
    let magnitude: Option<Moments> = m
        .magnitude
        .as_ref()
        .map(|t| reader.moments(t))
        .transpose()?;

    let finite = ma.nonfinite == 0
        && mb.nonfinite == 0
        && g.iter().all(|v| v.is_finite())
        && h.iter().all(|v| v.is_finite());
    let spectrum = if finite {
        product_spectrum(&g, &h)
    } else {
        None
    };
    let ba_fro_sq = if finite {
        h.component_mul(&g).sum().max(0.0)
    } else {
        f64::NAN
    };
    let cut = RANK_CUT_FLOOR
        .max(m.a.kind.epsilon())
        .max(m.b.kind.epsilon());
    let ranks = spectrum.as_deref().map(|l| SpectrumRanks::of(l, cut));

    let singular_values = match (m.scale, &spectrum) {
        (Some(s), Some(l)) => l.iter().map(|&x| s.abs() * x.sqrt()).collect(),
        _ => Vec::new(),
    };
    Ok(LoraModuleStats {
        name: m.name.clone(),
        layer: m.layer,
        kind: m.kind.name().to_string(),
        rank: m.rank,
        in_features: m.in_features,
        out_features: m.out_features,
        dtype_a: m.a.kind.safetensors_name().to_string(),
        dtype_b: m.b.kind.safetensors_name().to_string(),
        alpha: m.alpha,
        scale: m.scale,
        norm_a: ma.norm(),
        norm_b: mb.norm(),
        max_abs_a: ma.max_abs,
        max_abs_b: mb.max_abs,
        nonfinite_a: ma.nonfinite,
        nonfinite_b: mb.nonfinite,
        delta_fro: m.scale.map(|s| s.abs() * ba_fro_sq.sqrt()),
        singular_values,
        stable_rank: ranks.map_or(f64::NAN, |r| r.stable),
        effective_rank: ranks.map_or(f64::NAN, |r| r.effective),
        rank_used: ranks.map(|r| r.used),
        magnitude_norm: magnitude.map(|x| x.norm()),
        magnitude_nonfinite: magnitude.map_or(0, |x| x.nonfinite),
    })
}

/// Eigenvalues (descending, clamped at 0) of `H^½·G·H^½` (computed as
/// those of `Lᵀ·G·L` when `H = L·Lᵀ`): the squared singular values of B·A when `G = A·Aᵀ` and `H = Bᵀ·B`. None if the
/// solver does not converge or the product overflows.
pub fn product_spectrum(g: &DMatrix<f64>, h: &DMatrix<f64>) -> Option<Vec<f64>> {
    let n = g.nrows();
    if n == 0 || g.shape() != (n, n) || h.shape() != (n, n) {
        return Some(Vec::new());
    }
    let max_iter = 30 * n + 30;
    // A matrix with the spectrum of G·H: Lᵀ·G·L when H = L·Lᵀ (Cholesky,
    // which holds when B has full column rank: the usual trained adapter),
    // else H^½·G·H^½ from H's eigen-decomposition (an untouched B is zero).
    // The first costs a fraction of the second's solve.
    let m = match Cholesky::new(h.clone()) {
        Some(c) => {
            let l = c.unpack();
            l.transpose() * g * &l
        }
        None => {
            let eh = SymmetricEigen::try_new(h.clone(), f64::EPSILON, max_iter)?;
            // H^½ = V·diag(sqrt(max(d, 0)))·Vᵀ; PSD up to rounding, so clamp.
            let mut vd = eh.eigenvectors.clone();
            for (mut col, &d) in vd.column_iter_mut().zip(eh.eigenvalues.iter()) {
                col *= d.max(0.0).sqrt();
            }
            let root = &vd * eh.eigenvectors.transpose();
            &root * g * &root
        }
    };
    let m = (&m + m.transpose()) * 0.5;
    if !m.iter().all(|v| v.is_finite()) {
        return None;
    }
    let em = SymmetricEigen::try_new(m, f64::EPSILON, max_iter)?;
    let mut lambda: Vec<f64> = em.eigenvalues.iter().map(|&l| l.max(0.0)).collect();
    lambda.sort_unstable_by(|x, y| y.total_cmp(x));
    Some(lambda)
}

/// Scale-free rank measures of a spectrum of squared singular values.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SpectrumRanks {
    stable: f64,
    effective: f64,
    used: u64,
}

impl SpectrumRanks {
    /// `lambda`: squared singular values, descending, non-negative.
    fn of(lambda: &[f64], cut: f64) -> SpectrumRanks {
        let top = lambda.first().copied().unwrap_or(0.0);
        if top <= 0.0 {
            return SpectrumRanks {
                stable: 0.0,
                effective: 0.0,
                used: 0,
            };
        }
        let sigma: Vec<f64> = lambda.iter().map(|l| l.sqrt()).collect();
        let sigma_max = top.sqrt();
        let total: f64 = sigma.iter().sum();
        let entropy: f64 = sigma
            .iter()
            .filter(|&&s| s > 0.0)
            .map(|&s| {
                let p = s / total;
                -p * p.ln()
            })
            .sum();
        SpectrumRanks {
            stable: lambda.iter().sum::<f64>() / top,
            effective: entropy.exp(),
            used: sigma.iter().filter(|&&s| s > cut * sigma_max).count() as u64,
        }
    }
}

/// Σ‖ΔW‖_F² per layer over the modules that have a layer and a scale.
fn layer_energy(modules: &[LoraModuleStats]) -> Vec<LayerEnergy> {
    let mut by_layer: BTreeMap<u64, LayerEnergy> = BTreeMap::new();
    for m in modules {
        let (Some(layer), Some(fro)) = (m.layer, m.delta_fro) else {
            continue;
        };
        let e = by_layer.entry(layer).or_insert(LayerEnergy {
            layer,
            modules: 0,
            delta_fro_sq: 0.0,
        });
        e.modules += 1;
        e.delta_fro_sq += fro * fro;
    }
    by_layer.into_values().collect()
}

/// Sort key: layer-less modules first, then by layer, then by name.
fn module_order(a: &LoraModuleStats, b: &LoraModuleStats) -> std::cmp::Ordering {
    (a.layer, &a.name).cmp(&(b.layer, &b.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::io::Write;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/testdata/weights")
    }

    fn fixture(name: &str) -> PathBuf {
        fixtures().join(name)
    }

    fn all_fixtures() -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join(ADAPTER_WEIGHTS).exists())
            .collect();
        dirs.sort();
        assert_eq!(dirs.len(), 6);
        dirs
    }

    fn expected(dir: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap()
    }

    /// A JSON number, or the generator's "NaN"/"Infinity" strings.
    fn num(v: &Value) -> f64 {
        match v {
            Value::String(s) if s == "NaN" => f64::NAN,
            Value::String(s) if s == "Infinity" => f64::INFINITY,
            Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
            _ => v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")),
        }
    }

    /// |got - want| / max(|want|, floor), NaN-aware (NaN == NaN is 0).
    fn rel_err(got: f64, want: f64, floor: f64) -> f64 {
        if got.is_nan() && want.is_nan() || got == want {
            0.0
        } else {
            (got - want).abs() / want.abs().max(floor)
        }
    }

    /// Compare one reading of a fixture with torch's numbers; returns the
    /// largest relative error seen on norms/ΔW and on singular values.
    fn compare(dir: &Path, got: &AdapterWeights) -> (f64, f64) {
        let want = expected(dir);
        let mods = want["modules"].as_object().unwrap();
        assert_eq!(got.modules.len(), mods.len(), "{dir:?}");
        let (mut worst_norm, mut worst_sigma) = (0.0f64, 0.0f64);
        for m in &got.modules {
            let w = &mods[&m.name];
            let ctx = format!("{dir:?} {}", m.name);
            assert_eq!(m.kind, w["kind"].as_str().unwrap(), "{ctx}");
            assert_eq!(Some(m.rank), w["r"].as_u64(), "{ctx}");
            assert_eq!(Some(m.in_features), w["in_features"].as_u64(), "{ctx}");
            assert_eq!(Some(m.out_features), w["out_features"].as_u64(), "{ctx}");
            assert!(
                rel_err(m.scale.unwrap(), num(&w["scale"]), 1e-300) <= 1e-15,
                "{ctx}"
            );
            for (norm, max_abs, nonfinite, t) in [
                (m.norm_a, m.max_abs_a, m.nonfinite_a, &w["a"]),
                (m.norm_b, m.max_abs_b, m.nonfinite_b, &w["b"]),
            ] {
                worst_norm = worst_norm.max(rel_err(norm, num(&t["norm"]), 1e-300));
                // serde_json's default float parsing may be 1 ulp off.
                assert!(
                    rel_err(max_abs, num(&t["max_abs"]), 1e-300) <= 1e-15,
                    "{ctx}"
                );
                assert_eq!(Some(nonfinite), t["nonfinite"].as_u64(), "{ctx}");
            }
            let fro = m.delta_fro.unwrap();
            let want_fro = num(&w["delta_fro"]);
            worst_norm = worst_norm.max(rel_err(fro, want_fro, 1e-300));
            match w["singular_values"].as_array() {
                None => assert!(
                    m.singular_values.is_empty() && m.rank_used.is_none(),
                    "{ctx}"
                ),
                Some(sv) => {
                    assert_eq!(m.singular_values.len(), sv.len(), "{ctx}");
                    let top = num(&sv[0]);
                    for (g, s) in m.singular_values.iter().zip(sv) {
                        // Relative to σ_max: the Gram route's accuracy.
                        worst_sigma = worst_sigma.max(rel_err(*g, num(s), top.max(1e-300)));
                    }
                }
            }
            match (&w["magnitude"], m.magnitude_norm) {
                (Value::Null, None) => {}
                (mag, Some(norm)) => {
                    worst_norm = worst_norm.max(rel_err(norm, num(&mag["norm"]), 1e-300));
                    assert_eq!(Some(m.magnitude_nonfinite), mag["nonfinite"].as_u64());
                }
                (mag, None) => panic!("{ctx}: expected magnitude {mag}"),
            }
        }
        let others = want["other_tensors"].as_object().unwrap();
        assert_eq!(got.other_tensors.len(), others.len(), "{dir:?}");
        for t in &got.other_tensors {
            let w = &others[&t.name];
            worst_norm = worst_norm.max(rel_err(t.norm, num(&w["norm"]), 1e-300));
            assert!(rel_err(t.max_abs, num(&w["max_abs"]), 1e-300) <= 1e-15);
            assert_eq!(Some(t.nonfinite), w["nonfinite"].as_u64());
            assert_eq!(serde_json::json!(t.shape), w["shape"]);
        }
        assert_eq!(
            Some(got.tensor_bytes),
            want["tensor_bytes"].as_u64(),
            "{dir:?}"
        );
        assert_eq!(
            Some(got.nonfinite_total),
            want["nonfinite_total"].as_u64(),
            "{dir:?}"
        );
        (worst_norm, worst_sigma)
    }

    #[test]
    fn every_fixture_matches_torch_float64() {
        let (mut worst_norm, mut worst_sigma) = (0.0f64, 0.0f64);
        for dir in all_fixtures() {
            for (chunk, parallel) in [
                (DEFAULT_CHUNK_ELEMS, 0),
                (DEFAULT_CHUNK_ELEMS, u64::MAX),
                (1, 0),
                (3, u64::MAX),
                (50, 0),
            ] {
                let got = read_adapter_weights_chunked(&dir, chunk, parallel).unwrap();
                let (n, s) = compare(&dir, &got);
                worst_norm = worst_norm.max(n);
                worst_sigma = worst_sigma.max(s);
            }
        }
        assert!(worst_norm < 1e-13, "{worst_norm}");
        assert!(worst_sigma < 1e-11, "{worst_sigma}");
    }

    #[test]
    fn an_untouched_adapter_has_zero_delta_and_rank() {
        let got = read_adapter_weights(&fixture("llama_untouched")).unwrap();
        assert_eq!(got.modules.len(), 6);
        for m in &got.modules {
            assert!(m.norm_a > 0.0, "{}", m.name);
            assert_eq!(m.norm_b, 0.0);
            assert_eq!(m.delta_fro, Some(0.0));
            assert_eq!(m.singular_values, vec![0.0; 8]);
            assert_eq!(
                (m.stable_rank, m.effective_rank, m.rank_used),
                (0.0, 0.0, Some(0))
            );
        }
        assert!(got
            .layers
            .iter()
            .all(|l| l.delta_fro_sq == 0.0 && l.modules == 3));
    }

    #[test]
    fn a_trained_adapter_uses_its_whole_rank() {
        for name in [
            "llama_trained",
            "gpt2_fan_in_fan_out",
            "llama_patterns_rslora_bf16",
        ] {
            let got = read_adapter_weights(&fixture(name)).unwrap();
            for m in &got.modules {
                assert_eq!(m.rank_used, Some(m.rank), "{name} {}", m.name);
                assert!(m.stable_rank >= 1.0 && m.stable_rank <= m.rank as f64);
                assert!(m.effective_rank > 1.0 && m.effective_rank <= m.rank as f64 + 1e-9);
                let sum_sq: f64 = m.singular_values.iter().map(|s| s * s).sum();
                let fro = m.delta_fro.unwrap();
                assert!((sum_sq - fro * fro).abs() <= 1e-10 * fro * fro);
            }
        }
    }

    #[test]
    fn a_nan_in_lora_b_is_counted_and_voids_the_spectrum() {
        let got = read_adapter_weights(&fixture("llama_nan")).unwrap();
        assert_eq!(got.nonfinite_total, 1);
        let bad: Vec<_> = got.modules.iter().filter(|m| m.nonfinite_b > 0).collect();
        assert_eq!(bad.len(), 1);
        let m = bad[0];
        assert_eq!(m.name, "model.layers.1.self_attn.v_proj");
        assert!(m.norm_b.is_nan() && m.delta_fro.unwrap().is_nan());
        assert!(m.singular_values.is_empty() && m.rank_used.is_none());
        assert!(m.stable_rank.is_nan() && m.effective_rank.is_nan());
        assert!(m.max_abs_b.is_finite());
        let layer1 = got.layers.iter().find(|l| l.layer == 1).unwrap();
        assert!(layer1.delta_fro_sq.is_nan());
        assert!(
            got.layers
                .iter()
                .find(|l| l.layer == 0)
                .unwrap()
                .delta_fro_sq
                > 0.0
        );
    }

    #[test]
    fn modules_carry_layers_kinds_and_dtypes_in_order() {
        let got = read_adapter_weights(&fixture("llama_trained")).unwrap();
        let order: Vec<(Option<u64>, &str)> = got
            .modules
            .iter()
            .map(|m| (m.layer, m.name.as_str()))
            .collect();
        assert_eq!(order[0], (None, "model.embed_tokens"));
        assert_eq!(got.modules[0].kind, "embedding");
        assert!(order.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(order.iter().filter(|(l, _)| *l == Some(1)).count(), 4);
        assert_eq!(got.layers.len(), 2);
        let config = got.config.as_ref().unwrap();
        assert_eq!((config.r, config.lora_alpha), (4, 8.0));
        assert_eq!(
            got.other_tensors[0].name,
            "base_model.model.model.embed_tokens.base_layer.weight"
        );

        let gpt2 = read_adapter_weights(&fixture("gpt2_fan_in_fan_out")).unwrap();
        assert!(gpt2.config.as_ref().unwrap().fan_in_fan_out);
        let layers: Vec<_> = gpt2.modules.iter().map(|m| m.layer).collect();
        assert_eq!(layers, [Some(0), Some(0), Some(1), Some(1)]);
        assert_eq!(gpt2.modules[0].in_features, 32);
        assert_eq!(gpt2.modules[0].out_features, 96);

        let bf16 = read_adapter_weights(&fixture("llama_patterns_rslora_bf16")).unwrap();
        assert!(bf16
            .modules
            .iter()
            .all(|m| m.dtype_a == "BF16" && m.dtype_b == "BF16"));
        let c = bf16.config.unwrap();
        assert!(c.use_rslora);
        assert_eq!(
            c.rank_pattern[0],
            ("model.layers.1.self_attn.q_proj".to_string(), 2)
        );

        let dora = read_adapter_weights(&fixture("llama_dora_f16")).unwrap();
        assert!(dora.config.as_ref().unwrap().use_dora);
        assert!(dora.modules.iter().all(|m| m.magnitude_norm.unwrap() > 0.0));
        assert_eq!(
            dora.other_tensors[0].name,
            "base_model.model.lm_head.weight"
        );
    }

    #[test]
    fn layer_indices_follow_the_common_families() {
        let cases = [
            ("model.layers.12.self_attn.q_proj", Some(12)),
            (
                "base_model.model.model.layers.3.mlp.up_proj.lora_A.weight",
                Some(3),
            ),
            ("transformer.h.7.attn.c_attn", Some(7)),
            ("gpt_neox.layers.2.attention.query_key_value", Some(2)),
            ("bert.encoder.layer.5.attention.self.query", Some(5)),
            ("encoder.block.4.layer.1.DenseReluDense.wi", Some(4)),
            ("layers.0.attn", Some(0)),
            ("model.layers.x.q_proj", None),
            ("model.layers.3x.q_proj", None),
            ("model.mylayers.3.q_proj", None),
            ("model.layers..3.q", None),
            ("model.layers.99999999999999999999999.q", None),
            ("model.layers.99999999999999999999999.h.2.q", Some(2)),
            ("model.embed_tokens", None),
            ("lm_head", None),
            ("model.layers.3", Some(3)),
        ];
        for (key, want) in cases {
            assert_eq!(layer_number(key), want, "{key}");
        }
    }

    #[test]
    fn spectrum_measures_of_known_matrices() {
        // B·A with A = [I 0] and B = diag(3, 4, 0) pads: σ = 4, 3, 0.
        let g = DMatrix::<f64>::identity(3, 3);
        let h = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(vec![9.0, 16.0, 0.0]));
        let l = product_spectrum(&g, &h).unwrap();
        assert!((l[0] - 16.0).abs() < 1e-12 && (l[1] - 9.0).abs() < 1e-12 && l[2].abs() < 1e-12);
        let r = SpectrumRanks::of(&l, 1e-6);
        assert_eq!(r.used, 2);
        assert!((r.stable - 25.0 / 16.0).abs() < 1e-12);
        let (p, q) = (4.0 / 7.0, 3.0 / 7.0);
        let erank = (-(p * f64::ln(p)) - q * f64::ln(q)).exp();
        assert!((r.effective - erank).abs() < 1e-12);
        // Equal singular values: every measure equals the rank.
        let r = SpectrumRanks::of(&[2.0; 5], 1e-6);
        assert_eq!(r.used, 5);
        assert!((r.stable - 5.0).abs() < 1e-12 && (r.effective - 5.0).abs() < 1e-12);
        // A σ under the cut is not counted.
        assert_eq!(SpectrumRanks::of(&[1.0, 1e-14], 1e-6).used, 1);
        assert_eq!(SpectrumRanks::of(&[1.0, 1e-10], 1e-6).used, 2);
    }

    /// A pseudo-random orthogonal n x n matrix (Q of a QR).
    fn orthogonal(n: usize, seed: u64) -> DMatrix<f64> {
        let mut x = seed;
        let m = DMatrix::from_fn(n, n, |_, _| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        });
        m.qr().q()
    }

    #[test]
    fn spectrum_keeps_small_singular_values_to_1e8_of_the_largest() {
        // B·A = U·diag(σ)·Vᵀ with σ over seven decades, hidden behind
        // rotations: G = A·Aᵀ and H = Bᵀ·B are dense.
        let r = 12;
        let sigma: Vec<f64> = (0..r)
            .map(|i| 10f64.powf(-(i as f64) * 7.0 / 11.0))
            .collect();
        let (u, w) = (orthogonal(r, 1), orthogonal(r, 2));
        let a = &w * DMatrix::from_diagonal(&nalgebra::DVector::from_vec(sigma.clone())); // r x r
        let b = u.clone(); // B·A = U·W·Σ
        let g = &a * a.transpose();
        let h = b.transpose() * &b;
        let l = product_spectrum(&g, &h).unwrap();
        for (got, want) in l.iter().map(|x| x.sqrt()).zip(&sigma) {
            assert!((got - want).abs() <= 2e-8 * sigma[0], "{got} vs {want}");
        }
        // The decades above 1e-6 count as used rank, those under do not.
        assert_eq!(SpectrumRanks::of(&l, 1e-6).used, 10);
    }

    // ---- paths and configs ----

    /// A copy of a fixture in a tempdir, to mutate.
    fn copy_fixture(name: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for file in [ADAPTER_WEIGHTS, CONFIG_FILE] {
            std::fs::copy(fixture(name).join(file), dir.path().join(file)).unwrap();
        }
        dir
    }

    #[test]
    fn a_file_path_finds_its_config_and_a_missing_config_drops_only_the_scale() {
        let file = fixture("llama_trained").join(ADAPTER_WEIGHTS);
        let by_file = read_adapter_weights(&file).unwrap();
        let by_dir = read_adapter_weights(&fixture("llama_trained")).unwrap();
        assert_eq!(by_file, by_dir);
        assert_eq!(by_file.path, file);

        let dir = copy_fixture("llama_trained");
        std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
        let bare = read_adapter_weights(dir.path()).unwrap();
        assert!(bare.config.is_none() && bare.layers.is_empty());
        for (m, full) in bare.modules.iter().zip(&by_dir.modules) {
            assert_eq!(m.name, full.name);
            assert!(m.scale.is_none() && m.delta_fro.is_none() && m.singular_values.is_empty());
            assert_eq!(
                (m.norm_a, m.norm_b, m.rank_used),
                (full.norm_a, full.norm_b, full.rank_used)
            );
            assert!((m.stable_rank - full.stable_rank).abs() < 1e-12);
        }
    }

    #[test]
    fn missing_weights_are_a_missing_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_adapter_weights(dir.path()).unwrap_err();
        assert_eq!(e.area, Area::Missing);
        assert!(e.message.contains(ADAPTER_WEIGHTS), "{e}");
        std::fs::write(dir.path().join("adapter_model.bin"), b"x").unwrap();
        assert!(read_adapter_weights(dir.path())
            .unwrap_err()
            .message
            .contains("pickled"));
        let e = read_adapter_weights(&dir.path().join("nope.safetensors")).unwrap_err();
        assert_eq!(e.area, Area::Missing);
    }

    #[test]
    fn a_config_that_is_not_json_or_disagrees_with_the_weights_is_refused() {
        let dir = copy_fixture("llama_trained");
        let config_path = dir.path().join(CONFIG_FILE);
        let original: Value =
            serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
        let write_config = |v: &Value| std::fs::write(&config_path, v.to_string()).unwrap();

        std::fs::write(&config_path, b"{ not json").unwrap();
        let e = read_adapter_weights(dir.path()).unwrap_err();
        assert_eq!(e.area, Area::Weights);
        assert!(e.to_string().contains(CONFIG_FILE), "{e}");

        let mut c = original.clone();
        c["r"] = Value::from(8);
        write_config(&c);
        let e = read_adapter_weights(dir.path()).unwrap_err();
        assert_eq!(e.area, Area::Weights);
        assert!(
            e.message.contains("has rank 4") && e.message.contains("rank 8 (its r)"),
            "{e}"
        );

        let mut c = original.clone();
        c["rank_pattern"] = serde_json::json!({"q_proj": 2});
        write_config(&c);
        let e = read_adapter_weights(dir.path()).unwrap_err();
        assert!(e.message.contains("rank_pattern key \"q_proj\""), "{e}");

        let mut c = original.clone();
        c["target_modules"] = serde_json::json!(["query", "value"]);
        write_config(&c);
        let e = read_adapter_weights(dir.path()).unwrap_err();
        assert!(
            e.message.contains("names none of the 9 LoRA modules"),
            "{e}"
        );

        let mut c = original.clone();
        c["target_modules"] = Value::from(r".*\.(q|k|v|o)_proj");
        write_config(&c);
        assert!(read_adapter_weights(dir.path()).is_ok());
        c["peft_type"] = Value::from("LOHA");
        write_config(&c);
        assert!(read_adapter_weights(dir.path())
            .unwrap_err()
            .message
            .contains("LOHA"));
    }

    // ---- hostile weights, made by mutating a real file ----

    /// (header JSON, data section) of a safetensors file.
    fn split(bytes: &[u8]) -> (serde_json::Map<String, Value>, Vec<u8>) {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        (header, bytes[8 + n..].to_vec())
    }

    fn join(header: &serde_json::Map<String, Value>, data: &[u8]) -> Vec<u8> {
        let json = Value::Object(header.clone()).to_string();
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(json.as_bytes());
        out.extend_from_slice(data);
        out
    }

    /// Read a copy of `name` whose header `edit` changed.
    fn read_edited(
        name: &str,
        edit: impl FnOnce(&mut serde_json::Map<String, Value>, &mut Vec<u8>),
    ) -> Result<AdapterWeights> {
        let dir = copy_fixture(name);
        let path = dir.path().join(ADAPTER_WEIGHTS);
        let (mut header, mut data) = split(&std::fs::read(&path).unwrap());
        edit(&mut header, &mut data);
        std::fs::write(&path, join(&header, &data)).unwrap();
        read_adapter_weights(dir.path())
    }

    const Q0: &str = "base_model.model.model.layers.0.self_attn.q_proj";

    fn key(suffix: &str) -> String {
        format!("{Q0}.{suffix}")
    }

    fn assert_err(r: Result<AdapterWeights>, area: Area, needles: &[&str]) {
        let e = r.unwrap_err();
        assert_eq!(e.area, area, "{e}");
        for n in needles {
            assert!(e.to_string().contains(n), "{n:?} not in: {e}");
        }
    }

    #[test]
    fn unchanged_round_trip_reads_the_same() {
        let got = read_edited("llama_trained", |_, _| {}).unwrap();
        let want = read_adapter_weights(&fixture("llama_trained")).unwrap();
        assert_eq!(got.modules, want.modules);
    }

    #[test]
    fn lying_offsets_and_truncation_are_header_errors() {
        let a = key("lora_A.weight");
        let r = read_edited("llama_trained", |h, data| {
            let end = data.len() as u64;
            h[&a]["data_offsets"] = serde_json::json!([end - 64, end + 448]);
        });
        assert_err(r, Area::Header, &[&a, "outside"]);
        let r = read_edited("llama_trained", |_, data| data.truncate(data.len() - 100));
        assert_err(r, Area::Header, &["outside"]);
        // Two tensors claiming the same bytes.
        let b = key("lora_B.weight");
        let r = read_edited("llama_trained", |h, _| {
            let offsets = h[&a]["data_offsets"].clone();
            h[&b]["data_offsets"] = offsets;
            h[&b]["shape"] = serde_json::json!([4, 32]);
        });
        assert_err(r, Area::Header, &["overlap"]);
    }

    #[test]
    fn dtype_and_shape_lies_are_refused() {
        let a = key("lora_A.weight");
        let r = read_edited("llama_trained", |h, _| h[&a]["dtype"] = Value::from("F16"));
        assert_err(r, Area::Header, &[&a, "needs 256 bytes"]);
        let r = read_edited("llama_trained", |h, _| h[&a]["dtype"] = Value::from("I32"));
        assert_err(r, Area::Weights, &[&a, "dtype I32"]);
        let r = read_edited("llama_trained", |h, _| {
            h[&a]["shape"] = serde_json::json!([128])
        });
        assert_err(
            r,
            Area::Weights,
            &[&a, "[128]", "LoRA factors are matrices"],
        );
        let r = read_edited("llama_trained", |h, _| {
            h[&a]["shape"] = serde_json::json!([4, 4, 8])
        });
        assert_err(r, Area::Weights, &[&a, "conv layers"]);
        let b = key("lora_B.weight");
        let r = read_edited("llama_trained", |h, _| {
            h[&b]["shape"] = serde_json::json!([16, 8])
        });
        assert_err(r, Area::Weights, &["rank 4", "rank 8", &b]);
        let r = read_edited("llama_dora_f16", |h, _| {
            h[&key("lora_magnitude_vector")]["shape"] = serde_json::json!([2, 16]);
        });
        assert_err(r, Area::Weights, &["magnitude", "expected [32]"]);
    }

    #[test]
    fn unpaired_and_duplicate_factors_are_refused() {
        let r = read_edited("llama_trained", |h, _| {
            h.remove(&key("lora_B.weight"));
        });
        assert_err(r, Area::Weights, &["has lora_A", "but no lora_B"]);
        let r = read_edited("llama_trained", |h, _| {
            h.remove(&key("lora_A.weight"));
        });
        assert_err(r, Area::Weights, &["has lora_B", "but no lora_A"]);
        let r = read_edited("llama_dora_f16", |h, _| {
            h.remove(&key("lora_A.weight"));
            h.remove(&key("lora_B.weight"));
        });
        assert_err(r, Area::Weights, &["DoRA magnitude", "no lora_A/lora_B"]);
        let r = read_edited("llama_trained", |h, _| {
            let a = h.remove(&key("lora_A.weight")).unwrap();
            h.insert(key("lora_A.weight").replace(KEY_PREFIX, ""), a);
            let b = h[&key("lora_B.weight")].clone();
            h.insert(
                key("lora_B.weight").replace(KEY_PREFIX, ""),
                serde_json::json!({"dtype": "F32", "shape": [0, 4], "data_offsets": b["data_offsets"][0].as_u64().map(|x| [x, x])}),
            );
        });
        assert_err(r, Area::Weights, &["are both the B tensor"]);
        let r = read_edited("llama_trained", |h, _| {
            let emb = h
                .remove("base_model.model.model.embed_tokens.lora_embedding_B")
                .unwrap();
            h.insert(
                "base_model.model.model.embed_tokens.lora_B.weight".into(),
                emb,
            );
        });
        assert_err(r, Area::Weights, &["one embedding and one linear"]);
    }

    #[test]
    fn a_huge_claim_is_refused_or_streamed_without_allocating_it() {
        // lora_A claims 4 x 2^30 floats (16 GiB) that the file lacks.
        let a = key("lora_A.weight");
        let r = read_edited("llama_trained", |h, data| {
            let end = data.len() as u64;
            h[&a]["shape"] = serde_json::json!([4, 1u64 << 30]);
            h[&a]["data_offsets"] = serde_json::json!([end, end + (16u64 << 30)]);
        });
        assert_err(r, Area::Header, &[&a, "outside"]);

        // The same claim backed by a sparse file: the shapes are checked
        // against the config before any data is read, so the rank lie is
        // found without touching (or allocating) the 16 GiB.
        let dir = copy_fixture("llama_trained");
        let path = dir.path().join(ADAPTER_WEIGHTS);
        let (mut h, data) = split(&std::fs::read(&path).unwrap());
        let end = data.len() as u64;
        h[&a]["shape"] = serde_json::json!([8, 1u64 << 29]);
        h[&a]["data_offsets"] = serde_json::json!([end, end + (16u64 << 30)]);
        let bytes = join(&h, &data);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.set_len(bytes.len() as u64 + (16u64 << 30)).unwrap();
        drop(f);
        let e = read_adapter_weights(dir.path()).unwrap_err();
        assert!(
            e.message.contains("rank 8") && e.message.contains("rank 4"),
            "{e}"
        );

        // A sparse 16 MiB extra tensor (a modules_to_save copy) is streamed in
        // 32 reads.
        let dir = copy_fixture("llama_trained");
        let path = dir.path().join(ADAPTER_WEIGHTS);
        let (mut h, data) = split(&std::fs::read(&path).unwrap());
        let end = data.len() as u64;
        h.insert(
            "base_model.model.lm_head.weight".into(),
            serde_json::json!({"dtype": "BF16", "shape": [1u64 << 13, 1024], "data_offsets": [end, end + (16u64 << 20)]}),
        );
        let bytes = join(&h, &data);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.set_len(bytes.len() as u64 + (16u64 << 20)).unwrap();
        drop(f);
        let got = read_adapter_weights(dir.path()).unwrap();
        let head = got
            .other_tensors
            .iter()
            .find(|t| t.name.ends_with("lm_head.weight"))
            .unwrap();
        assert_eq!((head.numel, head.norm, head.nonfinite), (1 << 23, 0.0, 0));
        assert_eq!(got.tensor_bytes, end + (16u64 << 20));
    }
}
