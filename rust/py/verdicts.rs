//! Bindings of the verdict kernels for the single probes
//! (`ap.training_drift(...)` and its kin): the gathered input and the
//! resolved options object in, `(verdict, score, raw, message, evidence)`
//! out, for Python's `ProbeResult`. Conversion only.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::store::probe_inputs::{
    DriftInput, FullWeightsInput, GapInput, GhostInput, WeightsInput,
};
use crate::verdicts::drift::{self, DriftOptions};
use crate::verdicts::full_weights::{self, FullWeightsOptions};
use crate::verdicts::gap::{self, GapOptions};
use crate::verdicts::ghost::{self, GhostOptions};
use crate::verdicts::weights::{self, WeightsOptions};
use crate::verdicts::{Evidence, Judged, Value};

/// `(verdict, score, raw, message, evidence)` of a verdict.
pub(super) type JudgedTuple<'py> = (
    &'static str,
    Option<f64>,
    Option<f64>,
    String,
    Bound<'py, PyDict>,
);

pub(super) fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Int(n) => n.into_pyobject(py)?.into_any(),
        Value::Float(x) => x.into_pyobject(py)?.into_any(),
        Value::Text(s) => s.into_pyobject(py)?.into_any(),
        Value::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Map(map) => evidence_to_py(py, map)?.into_any(),
        Value::Points(points) => {
            let list = PyList::empty(py);
            for &(step, y) in points {
                let y = y.is_finite().then_some(y);
                list.append(PyTuple::new(
                    py,
                    [
                        step.into_pyobject(py)?.into_any(),
                        y.into_pyobject(py)?.into_any(),
                    ],
                )?)?;
            }
            list.into_any()
        }
    })
}

pub(super) fn evidence_to_py<'py>(py: Python<'py>, e: &Evidence) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in &e.0 {
        d.set_item(k, value_to_py(py, v)?)?;
    }
    Ok(d)
}

pub(super) fn judged_tuple<'py>(py: Python<'py>, j: &Judged) -> PyResult<JudgedTuple<'py>> {
    Ok((
        j.verdict.as_str(),
        j.score,
        j.raw,
        j.message.clone(),
        evidence_to_py(py, &j.evidence)?,
    ))
}

/// training_drift's verdict on gathered inputs.
#[pyfunction]
fn judge_drift<'py>(
    py: Python<'py>,
    inputs: PyRef<'py, DriftInput>,
    options: DriftOptions,
) -> PyResult<JudgedTuple<'py>> {
    judged_tuple(py, &drift::judge_drift(&inputs, &options))
}

/// gradient_ghost's verdict on gathered inputs.
#[pyfunction]
fn judge_ghost<'py>(
    py: Python<'py>,
    inputs: PyRef<'py, GhostInput>,
    options: GhostOptions,
) -> PyResult<JudgedTuple<'py>> {
    judged_tuple(py, &ghost::judge_ghost(&inputs, &options))
}

/// adapter_weights' verdict on gathered inputs (`previous`: the version before).
#[pyfunction]
#[pyo3(signature = (inputs, options, previous=None))]
fn judge_weights<'py>(
    py: Python<'py>,
    inputs: PyRef<'py, WeightsInput>,
    options: WeightsOptions,
    previous: Option<PyRef<'py, WeightsInput>>,
) -> PyResult<JudgedTuple<'py>> {
    let previous = previous.as_deref();
    judged_tuple(py, &weights::judge_weights(&inputs, previous, &options))
}

/// full_weights' verdict on gathered inputs.
#[pyfunction]
fn judge_full_weights<'py>(
    py: Python<'py>,
    inputs: PyRef<'py, FullWeightsInput>,
    options: FullWeightsOptions,
) -> PyResult<JudgedTuple<'py>> {
    judged_tuple(py, &full_weights::judge_full_weights(&inputs, &options))
}

#[pymethods]
impl GapInput {
    /// The sampled steps whose records were read (after thinning).
    #[getter]
    fn steps(&self) -> Vec<i64> {
        self.log
            .as_ref()
            .map(|l| l.records.iter().map(|r| r.step).collect())
            .unwrap_or_default()
    }

    /// The log files read.
    #[getter]
    fn files(&self) -> Vec<std::path::PathBuf> {
        self.log
            .as_ref()
            .map(|l| l.files.clone())
            .unwrap_or_default()
    }

    fn __repr__(&self) -> String {
        format!("GapInput({} records)", self.steps().len())
    }
}

/// gap_monitor's verdict on gathered inputs.
#[pyfunction]
fn judge_gap<'py>(
    py: Python<'py>,
    inputs: PyRef<'py, GapInput>,
    options: GapOptions,
) -> PyResult<JudgedTuple<'py>> {
    judged_tuple(py, &gap::judge_gap(&inputs, &options))
}

/// The GAP monitor's records in `<store>/logs/train-*.jsonl` (GIL released),
/// None when there are none. For the reader's tests and the guard.
#[pyfunction]
fn gap_input(py: Python<'_>, store: std::path::PathBuf) -> Option<GapInput> {
    py.detach(|| crate::store::probe_inputs::gap_input(&store))
}

/// Every gap record of one log file as `(step, {key: value})`, in file
/// order, holding only the keys the rules read (GIL released for reading).
#[pyfunction]
fn read_gap_records(
    py: Python<'_>,
    path: std::path::PathBuf,
) -> crate::Result<Vec<(i64, std::collections::HashMap<String, f64>)>> {
    let records = py.detach(|| crate::formats::logs::gap_log::read_gap_file(&path))?;
    Ok(records
        .into_iter()
        .map(|r| (r.step, r.stats.into_iter().collect()))
        .collect())
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GapInput>()?;
    m.add_function(wrap_pyfunction!(judge_gap, m)?)?;
    m.add_function(wrap_pyfunction!(gap_input, m)?)?;
    m.add_function(wrap_pyfunction!(read_gap_records, m)?)?;
    m.add_function(wrap_pyfunction!(judge_drift, m)?)?;
    m.add_function(wrap_pyfunction!(judge_ghost, m)?)?;
    m.add_function(wrap_pyfunction!(judge_weights, m)?)?;
    m.add_function(wrap_pyfunction!(judge_full_weights, m)?)?;
    Ok(())
}
