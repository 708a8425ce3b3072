//! Constructors of the weights probes' gathered inputs from plain values
//! (`make_weights_input`, `make_adapter_weights`, `make_full_weights_input`,
//! ...): the same structs the readers produce, filled by the caller, so the
//! kernels' property tests can judge arbitrary adapters and models.
//! Conversion only.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::analysis::adapter_weights::{
    AdapterWeights, ConfigSummary, LayerEnergy, LoraModuleStats, TensorStats,
};
use crate::analysis::full_weights::{FullWeights, LayerWeights};
use crate::store::probe_inputs::{FullWeightsInput, WeightsInput};
use crate::{Area, Error};

/// A `WeightsError` with `reason` (and `path` when given), as a reader's.
fn error_of(reason: Option<String>, path: Option<PathBuf>) -> Option<Error> {
    reason.map(|r| Error::new(Area::Weights, path.unwrap_or_default(), r))
}

/// A `LoraModuleStats` with the given fields (the rest plain defaults).
#[pyfunction]
#[pyo3(signature = (
    name, *, layer=None, rank=0, norm_a=0.0, norm_b=0.0, nonfinite_a=0, nonfinite_b=0,
    delta_fro=None, stable_rank=0.0, effective_rank=0.0, rank_used=None,
    magnitude_norm=None, magnitude_nonfinite=0, singular_values=Vec::new(),
))]
#[allow(clippy::too_many_arguments)]
fn make_lora_module_stats(
    name: String,
    layer: Option<u64>,
    rank: u64,
    norm_a: f64,
    norm_b: f64,
    nonfinite_a: u64,
    nonfinite_b: u64,
    delta_fro: Option<f64>,
    stable_rank: f64,
    effective_rank: f64,
    rank_used: Option<u64>,
    magnitude_norm: Option<f64>,
    magnitude_nonfinite: u64,
    singular_values: Vec<f64>,
) -> LoraModuleStats {
    LoraModuleStats {
        name,
        layer,
        kind: "linear".to_string(),
        rank,
        in_features: 0,
        out_features: 0,
        dtype_a: "F32".to_string(),
        dtype_b: "F32".to_string(),
        alpha: None,
        scale: None,
        norm_a,
        norm_b,
        max_abs_a: 0.0,
        max_abs_b: 0.0,
        nonfinite_a,
        nonfinite_b,
        delta_fro,
        singular_values,
        stable_rank,
        effective_rank,
        rank_used,
        magnitude_norm,
        magnitude_nonfinite,
    }
}

/// A `TensorStats`.
#[pyfunction]
#[pyo3(signature = (name, *, dtype="F32".to_string(), shape=Vec::new(), numel=0, norm=0.0, max_abs=0.0, nonfinite=0))]
fn make_tensor_stats(
    name: String,
    dtype: String,
    shape: Vec<u64>,
    numel: u64,
    norm: f64,
    max_abs: f64,
    nonfinite: u64,
) -> TensorStats {
    TensorStats {
        name,
        dtype,
        shape,
        numel,
        norm,
        max_abs,
        nonfinite,
    }
}

/// A `LayerEnergy`.
#[pyfunction]
fn make_layer_energy(layer: u64, modules: u64, delta_fro_sq: f64) -> LayerEnergy {
    LayerEnergy {
        layer,
        modules,
        delta_fro_sq,
    }
}

/// A `ConfigSummary` of a LoRA config.
#[pyfunction]
#[pyo3(signature = (
    path, r, lora_alpha, *, use_rslora=false, use_dora=false,
    target_modules=Vec::new(), modules_to_save=Vec::new(),
    init_lora_weights=String::from("true"),
))]
#[allow(clippy::too_many_arguments)]
fn make_config_summary(
    path: PathBuf,
    r: u64,
    lora_alpha: f64,
    use_rslora: bool,
    use_dora: bool,
    target_modules: Vec<String>,
    modules_to_save: Vec<String>,
    init_lora_weights: String,
) -> ConfigSummary {
    ConfigSummary {
        path,
        peft_type: Some("LORA".to_string()),
        r,
        lora_alpha,
        use_rslora,
        use_dora,
        fan_in_fan_out: false,
        target_modules,
        target_modules_is_regex: false,
        modules_to_save,
        base_model_name_or_path: None,
        rank_pattern: Vec::new(),
        alpha_pattern: Vec::new(),
        init_lora_weights,
        merged_linear: false,
        format: "peft".to_string(),
    }
}

/// An `AdapterWeights` report.
#[pyfunction]
#[pyo3(signature = (path, config, modules, other_tensors, layers, *, tensor_bytes=0, nonfinite_total=0))]
fn make_adapter_weights(
    path: PathBuf,
    config: Option<PyRef<'_, ConfigSummary>>,
    modules: Vec<PyRef<'_, LoraModuleStats>>,
    other_tensors: Vec<PyRef<'_, TensorStats>>,
    layers: Vec<PyRef<'_, LayerEnergy>>,
    tensor_bytes: u64,
    nonfinite_total: u64,
) -> AdapterWeights {
    AdapterWeights {
        path,
        config: config.map(|c| c.clone()),
        modules: modules.iter().map(|m| (**m).clone()).collect(),
        other_tensors: other_tensors.iter().map(|t| (**t).clone()).collect(),
        layers: layers.iter().map(|l| (**l).clone()).collect(),
        tensor_bytes,
        nonfinite_total,
        unformed_modules: Vec::new(),
    }
}

/// A `WeightsInput`: the weights, or an error (`error`: its reason, with
/// `error_path`), or a note.
#[pyfunction]
#[pyo3(signature = (
    adapter, *, weights=None, error=None, error_path=None, note=None,
    layout="dlm".to_string(), checkpoint_kind="adapter".to_string(),
))]
fn make_weights_input(
    adapter: PathBuf,
    weights: Option<PyRef<'_, AdapterWeights>>,
    error: Option<String>,
    error_path: Option<PathBuf>,
    note: Option<String>,
    layout: String,
    checkpoint_kind: String,
) -> WeightsInput {
    WeightsInput {
        adapter,
        layout,
        checkpoint_kind,
        weights: weights.map(|w| w.clone()),
        error: error_of(error, error_path),
        note,
    }
}

/// A `LayerWeights`.
#[pyfunction]
#[pyo3(signature = (layer, *, tensors=1, numel=0, norm=0.0, nonfinite=0))]
fn make_layer_weights(
    layer: u64,
    tensors: u64,
    numel: u64,
    norm: f64,
    nonfinite: u64,
) -> LayerWeights {
    LayerWeights {
        layer,
        tensors,
        numel,
        norm,
        nonfinite,
    }
}

/// A `FullWeights` report.
#[pyfunction]
#[pyo3(signature = (
    path, files, tensors, layers, *, skipped=Vec::new(), other_norm=0.0, total_norm=0.0,
    tensor_bytes=0, nonfinite_total=0,
))]
#[allow(clippy::too_many_arguments)]
fn make_full_weights(
    path: PathBuf,
    files: Vec<PathBuf>,
    tensors: Vec<PyRef<'_, TensorStats>>,
    layers: Vec<PyRef<'_, LayerWeights>>,
    skipped: Vec<(String, String)>,
    other_norm: f64,
    total_norm: f64,
    tensor_bytes: u64,
    nonfinite_total: u64,
) -> FullWeights {
    FullWeights {
        path,
        files,
        tensors: tensors.iter().map(|t| (**t).clone()).collect(),
        layers: layers.iter().map(|l| (**l).clone()).collect(),
        skipped,
        other_norm,
        total_norm,
        tensor_bytes,
        nonfinite_total,
    }
}

/// A `FullWeightsInput`.
#[pyfunction]
#[pyo3(signature = (
    adapter, *, model_file=None, weights=None, error=None, error_path=None, note=None,
    layout="hf".to_string(), checkpoint_kind="full".to_string(),
))]
#[allow(clippy::too_many_arguments)]
fn make_full_weights_input(
    adapter: PathBuf,
    model_file: Option<PathBuf>,
    weights: Option<PyRef<'_, FullWeights>>,
    error: Option<String>,
    error_path: Option<PathBuf>,
    note: Option<String>,
    layout: String,
    checkpoint_kind: String,
) -> FullWeightsInput {
    FullWeightsInput {
        adapter,
        layout,
        checkpoint_kind,
        model_file,
        weights: weights.map(|w| w.clone()),
        error: error_of(error, error_path),
        note,
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(make_lora_module_stats, m)?)?;
    m.add_function(wrap_pyfunction!(make_tensor_stats, m)?)?;
    m.add_function(wrap_pyfunction!(make_layer_energy, m)?)?;
    m.add_function(wrap_pyfunction!(make_config_summary, m)?)?;
    m.add_function(wrap_pyfunction!(make_adapter_weights, m)?)?;
    m.add_function(wrap_pyfunction!(make_weights_input, m)?)?;
    m.add_function(wrap_pyfunction!(make_layer_weights, m)?)?;
    m.add_function(wrap_pyfunction!(make_full_weights, m)?)?;
    m.add_function(wrap_pyfunction!(make_full_weights_input, m)?)?;
    Ok(())
}
