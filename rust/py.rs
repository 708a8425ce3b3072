//! The Python binding: converts arguments, results and errors, and releases
//! the GIL around every call that touches the disk. No logic lives here.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::error::{Area, Error};

create_exception!(adapterprobe, AdapterProbeError, PyException, "Base of every error adapterprobe raises.");
create_exception!(adapterprobe, HeaderError, AdapterProbeError, "A safetensors header is truncated, oversized or malformed.");
create_exception!(adapterprobe, LogFormatError, AdapterProbeError, "A training log cannot be read as dlm JSONL.");
create_exception!(adapterprobe, LayerGroupingError, AdapterProbeError, "Adapter keys cannot be attributed to transformer layers.");
create_exception!(adapterprobe, TrainingStateError, AdapterProbeError, "A training_state.pt file is corrupt or of an unknown shape.");
create_exception!(adapterprobe, UnsafePickleError, TrainingStateError, "A pickle names a global outside the allow-list; nothing was executed.");
create_exception!(adapterprobe, IntegrityError, TrainingStateError, "A file's sha256 disagrees with the digest recorded beside it.");
create_exception!(adapterprobe, MissingFileError, AdapterProbeError, "A file or directory the call needs does not exist.");
create_exception!(adapterprobe, UsageError, AdapterProbeError, "The arguments of a call are invalid.");

fn to_py_err(err: Error) -> PyErr {
    let msg = err.to_string();
    match err.area {
        Area::Header => HeaderError::new_err(msg),
        Area::LogFormat => LogFormatError::new_err(msg),
        Area::LayerGrouping => LayerGroupingError::new_err(msg),
        Area::TrainingState => TrainingStateError::new_err(msg),
        Area::UnsafePickle => UnsafePickleError::new_err(msg),
        Area::Integrity => IntegrityError::new_err(msg),
        Area::Missing => MissingFileError::new_err(msg),
        Area::Usage => UsageError::new_err(msg),
    }
}

// ==== training_state bindings (read_training_state) ====
// ==== end training_state bindings ====

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("AdapterProbeError", py.get_type::<AdapterProbeError>())?;
    m.add("HeaderError", py.get_type::<HeaderError>())?;
    m.add("LogFormatError", py.get_type::<LogFormatError>())?;
    m.add("LayerGroupingError", py.get_type::<LayerGroupingError>())?;
    m.add("TrainingStateError", py.get_type::<TrainingStateError>())?;
    m.add("UnsafePickleError", py.get_type::<UnsafePickleError>())?;
    m.add("IntegrityError", py.get_type::<IntegrityError>())?;
    m.add("MissingFileError", py.get_type::<MissingFileError>())?;
    m.add("UsageError", py.get_type::<UsageError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // ==== register training_state ====
    // ==== end register training_state ====
    let _ = to_py_err;
    Ok(())
}
