//! Weight-space health of a PEFT LoRA adapter, from `adapter_model.safetensors`
//! (or the same state dict pickled by `torch.save` as `adapter_model.bin`,
//! read without running the pickle) and `adapter_config.json` alone.
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

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::analysis::layers::{adapter_weights_path, ADAPTER_WEIGHTS, PICKLED_ADAPTER_WEIGHTS};
use crate::error::{Area, Error, Result};
use crate::formats::adapter_config::{AdapterConfig, TargetModules, CONFIG_FILE};
use crate::formats::mlx_config::MLX_WEIGHTS;
use crate::formats::tensor_data::{
    FloatTensor, Moments, TensorReader, DEFAULT_CHUNK_ELEMS, MAX_GRAM_DIM,
};
use crate::io::read_once;

mod composed;
mod factors;
mod foreign;
mod plan;
mod stats;
#[cfg(test)]
mod tests;

use composed::reduce_composed;
pub use factors::{
    read_adapter_factors, stream_adapter_factors, AdapterFactors, FactorFile, FactorStream,
    ModuleFactors, ModuleInfo, ModuleShape, ModuleSource, MAX_FACTOR_VALUES, MAX_MODULE_VALUES,
};
pub use plan::is_frozen_original;
use plan::OpenAdapter;
pub use stats::product_spectrum;
use stats::{layer_energy, module_order, reduce_module};

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
    /// `"linear"` (`lora_A`/`lora_B`), `"embedding"` (`lora_embedding_*`),
    /// or LyCORIS's `"loha"`/`"lokr"` (ΔW formed as one low-rank product).
    pub kind: String,
    /// LoRA rank from the factor shapes; for LoHa/LoKr the rank of the
    /// product ΔW is formed as (r₁·r₂, or the two Kronecker halves' ranks
    /// multiplied), a bound on ΔW's rank.
    pub rank: u64,
    pub in_features: u64,
    pub out_features: u64,
    /// Dtypes and the `_a`/`_b` statistics below are of A and B; for LoHa
    /// of its input-side (`hada_w*_b`) and output-side (`hada_w*_a`)
    /// factors, for LoKr of its W1 and W2 halves' tensors.
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

impl TensorStats {
    /// The row of tensor `t`, from the `m` its values reduce to.
    pub fn of(t: &FloatTensor, m: &Moments) -> TensorStats {
        TensorStats {
            name: t.name.clone(),
            dtype: t.kind.safetensors_name().to_string(),
            shape: t.shape.clone(),
            numel: t.numel,
            norm: m.norm(),
            max_abs: m.max_abs,
            nonfinite: m.nonfinite,
        }
    }
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
    /// `true` (PEFT's default init), `false`, the method named
    /// (`gaussian`, `pissa`, ...), or `unknown`.
    pub init_lora_weights: String,
    /// An old PEFT `MergedLinear` adapter (`enable_lora`): grouped
    /// factors, no `B·A` per module.
    pub merged_linear: bool,
    /// Who wrote the adapter, by its naming: `peft` (a PEFT config, or
    /// diffusers' saves), `kohya`, `lycoris-loha`, `lycoris-lokr`, `mlx`.
    pub format: String,
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
    /// Modules whose update is not formed (LyCORIS's Tucker conv LoHa and
    /// LoKr, ...), each `name: reason`; their tensors are in `other_tensors`.
    pub unformed_modules: Vec<String>,
}

/// Tensor data from which an adapter's modules are reduced in parallel.
const PARALLEL_MIN_BYTES: u64 = 4 << 20;

/// Read and check the adapter at `path`: an adapter directory (holding
/// `adapter_model.safetensors` or `adapter_model.bin` and, normally,
/// `adapter_config.json`) or the weights file itself (the config is looked
/// up beside it; a `.bin`, `.pt` or `.pth` file is read as `torch.save`).
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
    let OpenAdapter {
        weights_path,
        config,
        data,
        plan,
        foreign,
    } = OpenAdapter::open(path)?;

    let tensor_bytes: u64 = data
        .header()
        .tensors
        .iter()
        .map(|t| t.data_offsets.1 - t.data_offsets.0)
        .sum();
    let stats_of = |reader: &mut TensorReader, t: &FloatTensor| -> Result<TensorStats> {
        Ok(TensorStats::of(t, &reader.moments(t)?))
    };
    let path = data.path();
    let composed_of = |reader: &mut TensorReader, p| reduce_composed(reader, p, path);
    // Modules in parallel only when there is enough data to share out: a
    // small adapter (most of a store) costs less on one thread, with one set
    // of buffers, and a scan already runs adapters in parallel.
    let (mut modules, other_tensors) = if tensor_bytes >= parallel_min_bytes {
        let mut modules: Vec<LoraModuleStats> = plan
            .modules
            .par_iter()
            .map_init(|| data.reader(chunk_elems), reduce_module)
            .collect::<Result<_>>()?;
        let composed: Vec<LoraModuleStats> = plan
            .composed
            .par_iter()
            .map_init(|| data.reader(chunk_elems), composed_of)
            .collect::<Result<_>>()?;
        modules.extend(composed);
        let others: Vec<TensorStats> = plan
            .others
            .par_iter()
            .map_init(|| data.reader(chunk_elems), stats_of)
            .collect::<Result<_>>()?;
        (modules, others)
    } else {
        let mut reader = data.reader(chunk_elems);
        let mut modules: Vec<LoraModuleStats> = plan
            .modules
            .iter()
            .map(|m| reduce_module(&mut reader, m))
            .collect::<Result<_>>()?;
        for p in &plan.composed {
            modules.push(composed_of(&mut reader, p)?);
        }
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
        config: config.as_ref().map(summary).or(foreign),
        layers: layer_energy(&modules),
        modules,
        other_tensors,
        tensor_bytes,
        nonfinite_total,
        unformed_modules: plan.unformed,
    })
}

/// (weights file, config file) for a directory or a weights file. A
/// directory's weights are `adapter_model.safetensors`, or
/// `adapter_model.bin` when only that one is there.
fn locate(path: &Path) -> Result<(PathBuf, PathBuf)> {
    if read_once::is_dir(path) {
        let mlx = path.join(MLX_WEIGHTS);
        if !read_once::exists(&path.join(ADAPTER_WEIGHTS))
            && !read_once::exists(&path.join(PICKLED_ADAPTER_WEIGHTS))
            && read_once::is_file(&mlx)
        {
            return Ok((mlx, path.join(CONFIG_FILE)));
        }
        let weights = adapter_weights_path(path);
        if !read_once::exists(&weights) {
            return Err(Error::new(
                Area::Missing,
                path,
                format!(
                    "no {ADAPTER_WEIGHTS} (or {PICKLED_ADAPTER_WEIGHTS}) in this adapter directory"
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
        init_lora_weights: c.init_lora_weights.clone(),
        merged_linear: c.merged_linear,
        format: "peft".to_string(),
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
