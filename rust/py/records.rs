//! Binding of the scan pass: targets and resolved options in, finished
//! records out (the GIL released for the whole gather-and-judge pass).
//! Conversion only; see `records`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::verdicts::evidence_to_py;
use super::{count, Size};
use crate::records::{self, Record, ScanOptions};
use crate::store::layout::Target;
use crate::store::scan;
use crate::Result;

/// One record made by the scan pass: its evidence (converted to a dict
/// only when asked for) and its JSON text (when the pass wrote it).
#[pyclass(frozen, module = "adapterprobe._core", name = "CoreRecord")]
pub struct CoreRecord(Record);

#[pymethods]
impl CoreRecord {
    /// The evidence as a new dict.
    fn evidence<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        evidence_to_py(py, &self.0.judged.evidence)
    }

    /// The evidence as JSON text (as `json.dumps` writes it, non-finite
    /// numbers as null), without making the dict.
    fn evidence_json(&self) -> String {
        let mut out = String::new();
        self.0.judged.evidence.write_json(&mut out);
        out
    }

    /// The probe's headline number before scoring (None when it has none).
    #[getter]
    fn raw(&self) -> Option<f64> {
        self.0.judged.raw
    }

    /// The record's JSON object, when the pass wrote it.
    #[getter]
    fn json(&self) -> Option<&str> {
        self.0.json.as_deref()
    }
}

/// `{probe name: options object}` as the pass's options.
fn scan_options(options: &Bound<'_, PyDict>) -> PyResult<ScanOptions> {
    let mut out = ScanOptions::default();
    for (name, value) in options.iter() {
        let name: String = name.extract()?;
        match name.as_str() {
            "training_drift" => out.drift = Some(value.extract()?),
            "gradient_ghost" => out.ghost = Some(value.extract()?),
            "adapter_weights" => out.weights = Some(value.extract()?),
            "full_weights" => out.full_weights = Some(value.extract()?),
            "gap_monitor" => out.gap = Some(value.extract()?),
            other => return Err(PyValueError::new_err(format!("unknown probe {other:?}"))),
        }
    }
    Ok(out)
}

/// Gather, judge and assemble the records of `targets` in parallel (GIL
/// released), in target order. `options`: `{probe name: resolved options}`
/// for the probes to run. Returns one tuple per record: `(store, adapter,
/// layout, probe, verdict, score, message, checkpoint_kind, core)`, `core`
/// a `CoreRecord` holding the evidence and (with `json=True`) the JSON text.
#[pyfunction]
#[pyo3(signature = (targets, options, *, workers=None, json=false))]
fn scan_records<'py>(
    py: Python<'py>,
    targets: Vec<Target>,
    options: &Bound<'py, PyDict>,
    workers: Option<Size>,
    json: bool,
) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let options = scan_options(options)?;
    let workers = workers.map(|n| count("workers", n)).transpose()?;
    let made: Result<Vec<Record>> = py.detach(|| {
        scan::pool(workers).map(|p| p.install(|| records::scan_records(&targets, &options, json)))
    });
    let mut out = Vec::new();
    // A target's records share one store string.
    let mut last_store: Option<(std::ffi::OsString, Bound<'py, PyString>)> = None;
    for r in made? {
        let store = match &last_store {
            Some((raw, text)) if *raw == r.store => text.clone(),
            _ => {
                let text = r.store.as_os_str().into_pyobject(py)?;
                last_store = Some((r.store.clone(), text.clone()));
                text
            }
        };
        let adapter = r.adapter.as_deref().into_pyobject(py)?;
        let message = PyString::new(py, &r.judged.message);
        let kind = r.checkpoint_kind.as_deref().into_pyobject(py)?;
        let head = (
            r.layout.as_str(),
            r.judged.kind,
            r.judged.verdict.as_str(),
            r.judged.score,
        );
        let (layout, probe, verdict, score) = head.into_pyobject(py)?.extract::<(
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
        )>()?;
        let core = Bound::new(py, CoreRecord(r))?;
        out.push(PyTuple::new(
            py,
            [
                store.into_any(),
                adapter.into_any(),
                layout,
                probe,
                verdict,
                score,
                message.into_any(),
                kind.into_any(),
                core.into_any(),
            ],
        )?);
    }
    Ok(out)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CoreRecord>()?;
    m.add_function(wrap_pyfunction!(scan_records, m)?)?;
    Ok(())
}
