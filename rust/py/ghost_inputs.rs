//! `ghost_input_of(obj)`: a `GhostInput` from any object carrying its
//! attributes, so gradient_ghost's kernel judges plain data as it judges
//! what the readers gathered (the benches scale a real state's second
//! moments; the tests build arbitrary states). Reader classes in it
//! (`TrainingState`, `ParamStat`, `LayerGrouping`, `Attribution`,
//! `ParamSlot`) are taken as they are; anything else is read attribute by
//! attribute, those absent taking the readers' empty values. Conversion only.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::analysis::attribution::{Attribution, ParamSlot};
use crate::analysis::layers::LayerGrouping;
use crate::error::{Area, Error};
use crate::store::probe_inputs::GhostInput;
use crate::store::torch_state::{ParamStat, TrainingState};

/// `obj.name`, None when absent or None.
fn attr<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) if v.is_none() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

fn field<'py, T: FromPyObjectOwned<'py>>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    default: T,
) -> PyResult<T> {
    match attr(obj, name)? {
        Some(v) => v.extract().map_err(Into::into),
        None => Ok(default),
    }
}

/// The area of an `adapterprobe.errors` exception, from its class or bases.
fn area_of(err: &Bound<'_, PyAny>) -> PyResult<Area> {
    let mro = err.get_type().getattr("__mro__")?;
    for class in mro.try_iter()? {
        let name: String = class?.getattr("__name__")?.extract()?;
        let area = match name.as_str() {
            "MissingFileError" => Area::Missing,
            "UnsafePickleError" => Area::UnsafePickle,
            "IntegrityError" => Area::Integrity,
            "TrainingStateError" => Area::TrainingState,
            "HeaderError" => Area::Header,
            "LogFormatError" => Area::LogFormat,
            "LayerGroupingError" => Area::LayerGrouping,
            "UsageError" => Area::Usage,
            "WeightsError" => Area::Weights,
            _ => continue,
        };
        return Ok(area);
    }
    Ok(Area::TrainingState)
}

/// An error held in the input: an `AdapterProbeError` keeps its path and
/// reason (so its text is `str(error)`); anything else is its `str()`.
fn error_of(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<Error>> {
    let Some(err) = attr(obj, name)? else {
        return Ok(None);
    };
    let area = area_of(&err)?;
    let reason: Option<String> = field(&err, "reason", None)?;
    Ok(Some(match reason {
        Some(reason) => {
            let path: Option<PathBuf> = field(&err, "path", None)?;
            Error::new(area, path.unwrap_or_default(), reason)
        }
        None => Error::new(area, "", err.str()?.to_string()),
    }))
}

fn param_stat(p: &Bound<'_, PyAny>) -> PyResult<ParamStat> {
    if let Ok(stat) = p.cast::<ParamStat>() {
        return Ok(stat.get().clone());
    }
    Ok(ParamStat {
        param_id: field(p, "param_id", 0)?,
        numel: field(p, "numel", 0)?,
        shape: field(p, "shape", Vec::new())?,
        exp_avg_sq_mean: field(p, "exp_avg_sq_mean", f64::NAN)?,
        nonfinite: field(p, "nonfinite", 0)?,
    })
}

fn training_state(s: &Bound<'_, PyAny>) -> PyResult<TrainingState> {
    if let Ok(state) = s.cast::<TrainingState>() {
        return Ok(state.get().clone());
    }
    let per_param = match attr(s, "per_param")? {
        Some(list) => list
            .try_iter()?
            .map(|p| param_stat(&p?))
            .collect::<PyResult<Vec<_>>>()?,
        None => Vec::new(),
    };
    Ok(TrainingState {
        path: field(s, "path", PathBuf::new())?,
        global_step: field(s, "global_step", 0)?,
        epoch: field(s, "epoch", None)?,
        best_val_loss: field(s, "best_val_loss", f64::NAN)?,
        use_qlora: field(s, "use_qlora", false)?,
        per_param,
        implausible: field(s, "implausible", Vec::new())?,
    })
}

/// `layer_of` is a dict of param id to layer, for ids 0..n.
fn grouping(g: &Bound<'_, PyAny>) -> PyResult<LayerGrouping> {
    if let Ok(grouping) = g.cast::<LayerGrouping>() {
        return Ok(grouping.get().clone());
    }
    let mut layer_of = Vec::new();
    if let Some(map) = attr(g, "layer_of")? {
        let map = map.cast_into::<PyDict>()?;
        for id in 0..map.len() {
            let layer = map.get_item(id)?.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "layer_of must map every param id 0..{} to its layer; {id} is missing",
                    map.len()
                ))
            })?;
            layer_of.push(layer.extract()?);
        }
    }
    Ok(LayerGrouping {
        layer_indices: field(g, "layer_indices", Vec::new())?,
        params_per_layer: field(g, "params_per_layer", 0)?,
        layer_of,
    })
}

fn attribution(a: &Bound<'_, PyAny>) -> PyResult<Attribution> {
    if let Ok(attribution) = a.cast::<Attribution>() {
        return Ok(attribution.get().clone());
    }
    let mut params = Vec::new();
    if let Some(list) = attr(a, "params")? {
        for p in list.try_iter()? {
            let p = p?;
            params.push(match p.cast::<ParamSlot>() {
                Ok(slot) => slot.get().clone(),
                Err(_) => ParamSlot {
                    param_id: field(&p, "param_id", 0)?,
                    layer: field(&p, "layer", 0)?,
                    slot: field(&p, "slot", 0)?,
                },
            });
        }
    }
    Ok(Attribution {
        layer_indices: field(a, "layer_indices", Vec::new())?,
        params,
        slot_names: field(a, "slot_names", Vec::new())?,
        unattributed: field(a, "unattributed", Vec::new())?,
    })
}

/// A `GhostInput` from `obj` (see the module doc); a `GhostInput` itself
/// comes back as a copy.
#[pyfunction]
fn ghost_input_of(obj: &Bound<'_, PyAny>) -> PyResult<GhostInput> {
    if let Ok(input) = obj.cast::<GhostInput>() {
        return Ok(input.get().clone());
    }
    let text = |name: &str| -> PyResult<Option<String>> {
        attr(obj, name)?
            .map(|v| v.str().map(|s| s.to_string()))
            .transpose()
    };
    Ok(GhostInput {
        adapter: field(obj, "adapter", PathBuf::new())?,
        layout: field(obj, "layout", String::new())?,
        checkpoint_kind: field(obj, "checkpoint_kind", String::new())?,
        state: attr(obj, "state")?
            .map(|s| training_state(&s))
            .transpose()?,
        error: error_of(obj, "error")?,
        grouping: attr(obj, "grouping")?.map(|g| grouping(&g)).transpose()?,
        grouping_error: error_of(obj, "grouping_error")?,
        attribution: attr(obj, "attribution")?
            .map(|a| attribution(&a))
            .transpose()?,
        attribution_error: text("attribution_error")?,
        weights_error: error_of(obj, "weights_error")?,
        optimizer: field(obj, "optimizer", None)?,
        note: field(obj, "note", None)?,
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ghost_input_of, m)?)?;
    Ok(())
}
