//! Constructors of training_drift's inputs from plain data, for the
//! property tests that compare the drift kernel with its Python reference
//! on arbitrary curves and states: the same structs the log readers
//! produce, built the way they build them (`assemble` sorts the records by
//! step, keeps the last of each step and stores non-finite losses as +inf;
//! each side series is sorted by step, the last point of a step kept).
//! Conversion only.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::error::{Area, Error};
use crate::formats::logs::curve::{self, LossCurve, RunProgress, SideSeries};
use crate::store::probe_inputs::{DriftInput, LogsStatus};

/// A loss curve from `(step, loss)` records in reading order and the side
/// series logged beside them.
#[pyfunction]
#[pyo3(signature = (records, *, eval_loss=vec![], grad_norm=vec![], learning_rate=vec![], reward=vec![], progress=None, files=vec![], source=String::from("dlm")))]
#[allow(clippy::too_many_arguments)]
fn loss_curve_from_records(
    records: Vec<(i64, f64)>,
    eval_loss: Vec<(i64, f64)>,
    grad_norm: Vec<(i64, f64)>,
    learning_rate: Vec<(i64, f64)>,
    reward: Vec<(i64, f64)>,
    progress: Option<(i64, i64)>,
    files: Vec<PathBuf>,
    source: String,
) -> LossCurve {
    LossCurve {
        source,
        side: SideSeries {
            eval_loss: curve::by_step(eval_loss),
            grad_norm: curve::by_step(grad_norm),
            learning_rate: curve::by_step(learning_rate),
            reward: curve::by_step(reward),
            margins: vec![],
            progress: progress.map(|(global_step, max_steps)| RunProgress {
                global_step,
                max_steps,
            }),
            ending: None,
        },
        ..curve::assemble(records, files)
    }
}

/// A `DriftInput` in any of its states: `curve` exactly when the status is
/// `Curve`, `error` (a log format error's reason, and its path) exactly
/// when it is `Failed`.
#[pyfunction]
#[pyo3(signature = (store, status, *, logs_dir=None, files=vec![], curve=None, error=None, error_path=None, note=None, layout=String::from("dlm")))]
#[allow(clippy::too_many_arguments)]
fn drift_input_from(
    store: PathBuf,
    status: PyRef<'_, LogsStatus>,
    logs_dir: Option<PathBuf>,
    files: Vec<PathBuf>,
    curve: Option<PyRef<'_, LossCurve>>,
    error: Option<String>,
    error_path: Option<PathBuf>,
    note: Option<String>,
    layout: String,
) -> crate::Result<DriftInput> {
    let status = *status;
    let usage = |what: &str| Error::new(Area::Usage, "", what);
    if (status == LogsStatus::Curve) != curve.is_some() {
        return Err(usage("curve is given exactly when status is Curve"));
    }
    if (status == LogsStatus::Failed) != error.is_some() {
        return Err(usage("error is given exactly when status is Failed"));
    }
    Ok(DriftInput {
        logs_dir: logs_dir.unwrap_or_else(|| store.join("logs")),
        store,
        layout,
        files,
        status,
        curve: curve.map(|c| c.clone()),
        error: error
            .map(|reason| Error::new(Area::LogFormat, error_path.unwrap_or_default(), reason)),
        note,
        output_classes: None,
        guard: None,
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(loss_curve_from_records, m)?)?;
    m.add_function(wrap_pyfunction!(drift_input_from, m)?)?;
    Ok(())
}
