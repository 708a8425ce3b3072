//! The Python binding: converts arguments, results and errors, and releases
//! the GIL around every call that touches the disk. No logic lives here.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::error::{Area, Error};

create_exception!(
    adapterprobe,
    AdapterProbeError,
    PyException,
    "Base of every error adapterprobe raises."
);
create_exception!(
    adapterprobe,
    HeaderError,
    AdapterProbeError,
    "A safetensors header is truncated, oversized or malformed."
);
create_exception!(
    adapterprobe,
    LogFormatError,
    AdapterProbeError,
    "A training log cannot be read as dlm JSONL."
);
create_exception!(
    adapterprobe,
    LayerGroupingError,
    AdapterProbeError,
    "Adapter keys cannot be attributed to transformer layers."
);
create_exception!(
    adapterprobe,
    TrainingStateError,
    AdapterProbeError,
    "A training_state.pt file is corrupt or of an unknown shape."
);
create_exception!(
    adapterprobe,
    UnsafePickleError,
    TrainingStateError,
    "A pickle names a global outside the allow-list; nothing was executed."
);
create_exception!(
    adapterprobe,
    IntegrityError,
    TrainingStateError,
    "A file's sha256 disagrees with the digest recorded beside it."
);
create_exception!(
    adapterprobe,
    MissingFileError,
    AdapterProbeError,
    "A file or directory the call needs does not exist."
);
create_exception!(
    adapterprobe,
    WeightsError,
    AdapterProbeError,
    "Adapter weights or adapter_config.json are unreadable or disagree with each other."
);
create_exception!(
    adapterprobe,
    UsageError,
    AdapterProbeError,
    "The arguments of a call are invalid."
);

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
        Area::Weights => WeightsError::new_err(msg),
    }
}

// ==== core bindings: headers, layers, loss curves, metrics ====

use std::path::PathBuf;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::{layers, loss_log, metrics, safetensors_header};

/// One tensor entry of a safetensors header.
#[pyclass(frozen, module = "adapterprobe._core")]
pub struct TensorInfo {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

#[pymethods]
impl TensorInfo {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
    #[getter]
    fn data_offsets(&self) -> (u64, u64) {
        self.data_offsets
    }
    fn __repr__(&self) -> String {
        format!(
            "TensorInfo(name={:?}, dtype={:?}, shape={:?}, data_offsets={:?})",
            self.name, self.dtype, self.shape, self.data_offsets
        )
    }
}

/// A parsed safetensors header: `tensors` maps name -> TensorInfo.
#[pyclass(frozen, get_all, module = "adapterprobe._core")]
pub struct SafetensorsHeader {
    tensors: Py<PyDict>,
    metadata: Option<Py<PyDict>>,
    data_len: u64,
}

#[pymethods]
impl SafetensorsHeader {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!("SafetensorsHeader({} tensors)", self.tensors.bind(py).len())
    }
}

#[pyfunction]
fn read_safetensors_header(py: Python<'_>, path: PathBuf) -> PyResult<SafetensorsHeader> {
    let header = py
        .detach(|| safetensors_header::read_header(&path))
        .map_err(to_py_err)?;
    let tensors = PyDict::new(py);
    for t in header.tensors {
        let name = t.name.clone();
        let info = TensorInfo {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            data_offsets: t.data_offsets,
        };
        tensors.set_item(name, Py::new(py, info)?)?;
    }
    let metadata = match header.metadata {
        Some(pairs) => {
            let d = PyDict::new(py);
            for (k, v) in pairs {
                d.set_item(k, v)?;
            }
            Some(d.unbind())
        }
        None => None,
    };
    Ok(SafetensorsHeader {
        tensors: tensors.unbind(),
        metadata,
        data_len: header.data_len,
    })
}

/// Layer attribution of optimizer param ids (see `group_layers`).
#[pyclass(frozen, module = "adapterprobe._core")]
pub struct LayerGrouping {
    inner: layers::LayerGrouping,
}

#[pymethods]
impl LayerGrouping {
    #[getter]
    fn layer_indices<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.inner.layer_indices)
    }
    #[getter]
    fn params_per_layer(&self) -> u64 {
        self.inner.params_per_layer
    }
    #[getter]
    fn num_layers(&self) -> usize {
        self.inner.layer_indices.len()
    }
    /// Optimizer param id -> layer index, for the layered param ids.
    #[getter]
    fn layer_of<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (param_id, layer) in self.inner.layer_of.iter().enumerate() {
            d.set_item(param_id, layer)?;
        }
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!(
            "LayerGrouping(num_layers={}, params_per_layer={})",
            self.inner.layer_indices.len(),
            self.inner.params_per_layer
        )
    }
}

#[pyfunction]
#[pyo3(signature = (adapter, num_params=None))]
fn group_layers(
    py: Python<'_>,
    adapter: PathBuf,
    num_params: Option<u64>,
) -> PyResult<LayerGrouping> {
    let inner = py
        .detach(|| layers::group_layers(&adapter, num_params))
        .map_err(to_py_err)?;
    Ok(LayerGrouping { inner })
}

/// A deduplicated loss curve: `steps` (int64) and `losses` (float64, +inf
/// where the logged loss was not finite). The NumPy arrays are made on first
/// access, so scans that only need metrics never import NumPy.
#[pyclass(frozen, module = "adapterprobe._core")]
pub struct LossCurve {
    curve: loss_log::LossCurve,
    files: Vec<PathBuf>,
    steps_array: PyOnceLock<Py<PyArray1<i64>>>,
    losses_array: PyOnceLock<Py<PyArray1<f64>>>,
}

#[pymethods]
impl LossCurve {
    #[getter]
    fn steps(&self, py: Python<'_>) -> Py<PyArray1<i64>> {
        self.steps_array
            .get_or_init(py, || PyArray1::from_slice(py, &self.curve.steps).unbind())
            .clone_ref(py)
    }
    #[getter]
    fn losses(&self, py: Python<'_>) -> Py<PyArray1<f64>> {
        self.losses_array
            .get_or_init(py, || PyArray1::from_slice(py, &self.curve.losses).unbind())
            .clone_ref(py)
    }
    #[getter]
    fn num_files(&self) -> usize {
        self.curve.num_files
    }
    #[getter]
    fn files(&self) -> Vec<PathBuf> {
        self.files.clone()
    }
    /// Drift metrics of this curve, with `spike_steps` and `nonfinite_steps`
    /// as step numbers (see `curve_metrics`).
    #[pyo3(signature = (*, rolling_window=10, spike_sigma=3.0))]
    fn metrics<'py>(
        &self,
        py: Python<'py>,
        rolling_window: usize,
        spike_sigma: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_window(rolling_window, spike_sigma)?;
        let m = metrics::curve_metrics(&self.curve.losses, rolling_window, spike_sigma);
        let steps_at = |points: &[usize]| -> Vec<i64> {
            points.iter().map(|&i| self.curve.steps[i]).collect()
        };
        let d = PyDict::new(py);
        d.set_item("initial_loss", m.initial_loss)?;
        d.set_item("final_loss", m.final_loss)?;
        d.set_item("convergence_ratio", m.convergence_ratio)?;
        d.set_item("smoothness", m.smoothness)?;
        d.set_item("instability_events", m.instability_events)?;
        d.set_item("spike_steps", steps_at(&m.spike_points))?;
        d.set_item("nonfinite_steps", steps_at(&m.nonfinite_points))?;
        Ok(d)
    }
    /// At most about `cap` evenly strided (step, loss) points, the first and
    /// last always kept; a non-finite loss is None.
    #[pyo3(signature = (cap=512))]
    fn sample(&self, cap: usize) -> PyResult<Vec<(i64, Option<f64>)>> {
        if cap == 0 {
            return Err(UsageError::new_err("cap must be at least 1"));
        }
        let n = self.curve.steps.len();
        let stride = if n <= cap { 1 } else { n.div_ceil(cap) };
        let mut idx: Vec<usize> = (0..n).step_by(stride).collect();
        if n > 0 && idx.last() != Some(&(n - 1)) {
            idx.push(n - 1);
        }
        Ok(idx
            .into_iter()
            .map(|i| {
                let loss = self.curve.losses[i];
                (self.curve.steps[i], loss.is_finite().then_some(loss))
            })
            .collect())
    }
    fn __len__(&self) -> usize {
        self.curve.steps.len()
    }
    fn __repr__(&self) -> String {
        format!(
            "LossCurve({} steps from {} files)",
            self.curve.steps.len(),
            self.curve.num_files
        )
    }
}

/// Resolve `source` (one path or a list of paths) to log files.
fn log_files(source: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if let Ok(path) = source.extract::<PathBuf>() {
        return Ok(vec![path]);
    }
    source.extract::<Vec<PathBuf>>().map_err(|_| {
        UsageError::new_err("source must be a path or a list of paths to .jsonl files")
    })
}

#[pyfunction]
fn read_loss_curve(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<LossCurve> {
    let given = log_files(source)?;
    let single_source = source.extract::<PathBuf>().is_ok();
    let (curve, files) = py
        .detach(|| -> crate::Result<_> {
            let files = if single_source {
                loss_log::resolve_source(&given[0])?
            } else {
                given
            };
            Ok((loss_log::read_loss_curve(&files)?, files))
        })
        .map_err(to_py_err)?;
    Ok(loss_curve_to_py(curve, files))
}

/// Values of a float64 array (copied) or of any sequence of numbers.
fn f64_values(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    if let Ok(array) = obj.extract::<PyReadonlyArray1<'_, f64>>() {
        return Ok(array.as_array().to_vec());
    }
    obj.extract::<Vec<f64>>()
        .map_err(|_| UsageError::new_err("expected a 1-D sequence of numbers"))
}

fn check_window(window: usize, sigma: f64) -> PyResult<()> {
    if window < 1 {
        return Err(UsageError::new_err("window must be at least 1"));
    }
    if !(sigma > 0.0 && sigma.is_finite()) {
        return Err(UsageError::new_err(format!(
            "sigma must be a positive number, got {sigma}"
        )));
    }
    Ok(())
}

#[pyfunction]
#[pyo3(signature = (losses, *, rolling_window=10, spike_sigma=3.0))]
fn curve_metrics<'py>(
    py: Python<'py>,
    losses: &Bound<'py, PyAny>,
    rolling_window: usize,
    spike_sigma: f64,
) -> PyResult<Bound<'py, PyDict>> {
    check_window(rolling_window, spike_sigma)?;
    let values = f64_values(losses)?;
    let m = py.detach(|| metrics::curve_metrics(&values, rolling_window, spike_sigma));
    let d = PyDict::new(py);
    d.set_item("initial_loss", m.initial_loss)?;
    d.set_item("final_loss", m.final_loss)?;
    d.set_item("convergence_ratio", m.convergence_ratio)?;
    d.set_item("smoothness", m.smoothness)?;
    d.set_item("instability_events", m.instability_events)?;
    d.set_item(
        "spike_points",
        PyArray1::from_vec(py, to_i64(m.spike_points)),
    )?;
    d.set_item(
        "nonfinite_points",
        PyArray1::from_vec(py, to_i64(m.nonfinite_points)),
    )?;
    Ok(d)
}

fn to_i64(v: Vec<usize>) -> Vec<i64> {
    v.into_iter().map(|i| i as i64).collect()
}

#[pyfunction]
#[pyo3(signature = (deltas, *, window=10, sigma=3.0))]
fn count_spikes(
    py: Python<'_>,
    deltas: &Bound<'_, PyAny>,
    window: usize,
    sigma: f64,
) -> PyResult<usize> {
    check_window(window, sigma)?;
    let values = f64_values(deltas)?;
    Ok(py.detach(|| metrics::count_spikes(&values, window, sigma)))
}

#[pyfunction]
#[pyo3(signature = (deltas, *, window=10, sigma=3.0))]
fn spike_indices<'py>(
    py: Python<'py>,
    deltas: &Bound<'py, PyAny>,
    window: usize,
    sigma: f64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    check_window(window, sigma)?;
    let values = f64_values(deltas)?;
    let found = py.detach(|| metrics::spike_indices(&values, window, sigma));
    Ok(PyArray1::from_vec(py, to_i64(found)))
}

// ---- probe inputs and store scans ----

use crate::scan;

fn error_kind(err: &Error) -> &'static str {
    match err.area {
        Area::Header => "HeaderError",
        Area::LogFormat => "LogFormatError",
        Area::LayerGrouping => "LayerGroupingError",
        Area::TrainingState => "TrainingStateError",
        Area::UnsafePickle => "UnsafePickleError",
        Area::Integrity => "IntegrityError",
        Area::Missing => "MissingFileError",
        Area::Usage => "UsageError",
        Area::Weights => "WeightsError",
    }
}

fn loss_curve_to_py(curve: loss_log::LossCurve, files: Vec<PathBuf>) -> LossCurve {
    LossCurve {
        curve,
        files,
        steps_array: PyOnceLock::new(),
        losses_array: PyOnceLock::new(),
    }
}

/// What `training_drift` needs about one store. `status` is one of
/// "no_logs_dir", "no_files", "curve" or "failed".
#[pyclass(frozen, get_all, module = "adapterprobe._core")]
pub struct DriftInput {
    store: PathBuf,
    logs_dir: PathBuf,
    files: Vec<PathBuf>,
    status: &'static str,
    curve: Option<Py<LossCurve>>,
    error: Option<String>,
}

fn drift_input_to_py(py: Python<'_>, input: scan::DriftInput) -> PyResult<DriftInput> {
    let (status, curve, error) = match input.outcome {
        scan::LogsOutcome::NoLogsDir => ("no_logs_dir", None, None),
        scan::LogsOutcome::NoFiles => ("no_files", None, None),
        scan::LogsOutcome::Failed(e) => ("failed", None, Some(e.to_string())),
        scan::LogsOutcome::Curve(c) => {
            let curve = loss_curve_to_py(c, input.files.clone());
            ("curve", Some(Py::new(py, curve)?), None)
        }
    };
    Ok(DriftInput {
        store: input.store,
        logs_dir: input.logs_dir,
        files: input.files,
        status,
        curve,
        error,
    })
}

#[pyfunction]
fn drift_input(py: Python<'_>, store: PathBuf) -> PyResult<DriftInput> {
    let input = py.detach(|| scan::drift_input(&store));
    drift_input_to_py(py, input)
}

/// What `gradient_ghost` needs about one adapter version: the state (or the
/// error class name and message), and the layer grouping when it worked.
#[pyclass(frozen, get_all, module = "adapterprobe._core")]
pub struct GhostInput {
    adapter: PathBuf,
    state: Option<Py<PyTrainingState>>,
    error_kind: Option<&'static str>,
    error: Option<String>,
    grouping: Option<Py<LayerGrouping>>,
    grouping_error: Option<String>,
}

fn ghost_input_to_py(py: Python<'_>, input: scan::GhostInput) -> PyResult<GhostInput> {
    let (state, error_kind, error) = match input.state {
        Ok(s) => (Some(Py::new(py, training_state_to_py(py, s)?)?), None, None),
        Err(e) => (None, Some(error_kind(&e)), Some(e.to_string())),
    };
    let (grouping, grouping_error) = match input.grouping {
        Some(Ok(g)) => (Some(Py::new(py, LayerGrouping { inner: g })?), None),
        Some(Err(e)) => (None, Some(e.to_string())),
        None => (None, None),
    };
    Ok(GhostInput {
        adapter: input.adapter,
        state,
        error_kind,
        error,
        grouping,
        grouping_error,
    })
}

#[pyfunction]
fn ghost_input(py: Python<'_>, adapter: PathBuf) -> PyResult<GhostInput> {
    let input = py.detach(|| scan::ghost_input(&adapter));
    ghost_input_to_py(py, input)
}

/// One store (and the adapter versions in it) that a scan will probe.
#[pyclass(frozen, from_py_object, module = "adapterprobe._core")]
#[derive(Clone)]
pub struct Target {
    inner: scan::Target,
}

#[pymethods]
impl Target {
    #[new]
    #[pyo3(signature = (store, versions, broken=Vec::new(), with_logs=true))]
    fn new(
        store: PathBuf,
        versions: Vec<PathBuf>,
        broken: Vec<(PathBuf, String)>,
        with_logs: bool,
    ) -> Self {
        Target {
            inner: scan::Target {
                store,
                versions,
                broken,
                with_logs,
            },
        }
    }
    #[getter]
    fn store(&self) -> PathBuf {
        self.inner.store.clone()
    }
    #[getter]
    fn versions(&self) -> Vec<PathBuf> {
        self.inner.versions.clone()
    }
    #[getter]
    fn broken(&self) -> Vec<(PathBuf, String)> {
        self.inner.broken.clone()
    }
    #[getter]
    fn with_logs(&self) -> bool {
        self.inner.with_logs
    }
    /// Pickle support, so targets can travel to other processes (Ray tasks).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let t = &slf.get().inner;
        let args = (
            t.store.clone(),
            t.versions.clone(),
            t.broken.clone(),
            t.with_logs,
        );
        Ok((slf.get_type().into_any(), args.into_pyobject(slf.py())?))
    }
    fn __repr__(&self) -> String {
        format!(
            "Target(store={:?}, versions={})",
            self.inner.store.display().to_string(),
            self.inner.versions.len()
        )
    }
}

/// Find stores under `roots`; returns (targets, problems) where problems
/// are (path, message) pairs for what could not be searched.
#[pyfunction]
#[pyo3(signature = (roots, *, all_versions=false, workers=None))]
#[allow(clippy::type_complexity)]
fn discover(
    py: Python<'_>,
    roots: Vec<PathBuf>,
    all_versions: bool,
    workers: Option<usize>,
) -> PyResult<(Vec<Target>, Vec<(PathBuf, String)>)> {
    let found = py
        .detach(|| {
            scan::pool(workers).map(|pool| pool.install(|| scan::discover(&roots, all_versions)))
        })
        .map_err(to_py_err)?;
    let targets = found
        .targets
        .into_iter()
        .map(|inner| Target { inner })
        .collect();
    let problems = found
        .problems
        .into_iter()
        .map(|p| (p.path, p.message))
        .collect();
    Ok((targets, problems))
}

/// Probe inputs for one target.
#[pyclass(frozen, get_all, module = "adapterprobe._core")]
pub struct TargetInputs {
    store: PathBuf,
    drift: Option<Py<DriftInput>>,
    ghosts: Vec<Py<GhostInput>>,
    broken: Vec<(PathBuf, String)>,
}

/// Gather probe inputs for `targets` in parallel (GIL released), in order.
#[pyfunction]
#[pyo3(signature = (targets, *, drift=true, ghost=true, workers=None))]
fn probe_targets(
    py: Python<'_>,
    targets: Vec<Target>,
    drift: bool,
    ghost: bool,
    workers: Option<usize>,
) -> PyResult<Vec<TargetInputs>> {
    let plain: Vec<scan::Target> = targets.into_iter().map(|t| t.inner).collect();
    let gathered = py
        .detach(|| {
            scan::pool(workers)
                .map(|pool| pool.install(|| scan::probe_targets(&plain, drift, ghost)))
        })
        .map_err(to_py_err)?;
    gathered
        .into_iter()
        .map(|t| {
            let drift = match t.drift {
                Some(d) => Some(Py::new(py, drift_input_to_py(py, d)?)?),
                None => None,
            };
            let ghosts = t
                .ghosts
                .into_iter()
                .map(|g| Py::new(py, ghost_input_to_py(py, g)?))
                .collect::<PyResult<_>>()?;
            Ok(TargetInputs {
                store: t.store,
                drift,
                ghosts,
                broken: t.broken,
            })
        })
        .collect()
}

/// Convert a Rust training state to its Python class.
fn training_state_to_py(
    py: Python<'_>,
    state: crate::torch_state::TrainingState,
) -> PyResult<PyTrainingState> {
    let stats = state
        .per_param
        .into_iter()
        .map(|p| {
            Py::new(
                py,
                PyParamStat {
                    param_id: p.param_id,
                    numel: p.numel,
                    exp_avg_sq_mean: p.exp_avg_sq_mean,
                    nonfinite: p.nonfinite,
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyTrainingState {
        path: state.path,
        global_step: state.global_step,
        epoch: state.epoch,
        best_val_loss: state.best_val_loss,
        use_qlora: state.use_qlora,
        per_param: pyo3::types::PyList::new(py, stats)?.unbind(),
    })
}

// ==== end core bindings ====

// ==== training_state bindings (read_training_state) ====

/// Python-style float text (nan, inf) for reprs.
fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:?}")
    }
}

/// Adam second-moment statistics of one optimizer parameter.
#[pyclass(frozen, get_all, name = "ParamStat", module = "adapterprobe._core")]
pub struct PyParamStat {
    param_id: i64,
    numel: u64,
    exp_avg_sq_mean: f64,
    nonfinite: u64,
}

#[pymethods]
impl PyParamStat {
    fn __repr__(&self) -> String {
        format!(
            "ParamStat(param_id={}, numel={}, exp_avg_sq_mean={}, nonfinite={})",
            self.param_id,
            self.numel,
            py_float_repr(self.exp_avg_sq_mean),
            self.nonfinite
        )
    }
}

/// What gradient_ghost needs from a training_state.pt, read without torch.
#[pyclass(frozen, get_all, name = "TrainingState", module = "adapterprobe._core")]
pub struct PyTrainingState {
    path: std::path::PathBuf,
    global_step: i64,
    epoch: Option<f64>,
    best_val_loss: f64,
    use_qlora: bool,
    per_param: Py<pyo3::types::PyList>,
}

#[pymethods]
impl PyTrainingState {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "TrainingState(path={:?}, global_step={}, epoch={}, best_val_loss={}, \
             use_qlora={}, per_param=<{} params>)",
            self.path.display().to_string(),
            self.global_step,
            self.epoch.map_or("None".into(), py_float_repr),
            py_float_repr(self.best_val_loss),
            if self.use_qlora { "True" } else { "False" },
            self.per_param.bind(py).len()
        )
    }
}

/// Read a dlm training_state.pt (or the adapter version dir holding it)
/// with the allow-listed pickle reader; the GIL is released while reading.
#[pyfunction]
fn read_training_state(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyTrainingState> {
    let state = py
        .detach(|| crate::torch_state::read_training_state(&path))
        .map_err(to_py_err)?;
    training_state_to_py(py, state)
}

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
    m.add("WeightsError", py.get_type::<WeightsError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<TensorInfo>()?;
    m.add_class::<SafetensorsHeader>()?;
    m.add_class::<LayerGrouping>()?;
    m.add_class::<LossCurve>()?;
    m.add_function(wrap_pyfunction!(read_safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(group_layers, m)?)?;
    m.add_function(wrap_pyfunction!(read_loss_curve, m)?)?;
    m.add_function(wrap_pyfunction!(curve_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(count_spikes, m)?)?;
    m.add_function(wrap_pyfunction!(spike_indices, m)?)?;
    m.add_class::<DriftInput>()?;
    m.add_class::<GhostInput>()?;
    m.add_class::<Target>()?;
    m.add_class::<TargetInputs>()?;
    m.add_function(wrap_pyfunction!(drift_input, m)?)?;
    m.add_function(wrap_pyfunction!(ghost_input, m)?)?;
    m.add_function(wrap_pyfunction!(discover, m)?)?;
    m.add_function(wrap_pyfunction!(probe_targets, m)?)?;
    // ==== register training_state ====
    m.add_class::<PyParamStat>()?;
    m.add_class::<PyTrainingState>()?;
    m.add_function(wrap_pyfunction!(read_training_state, m)?)?;
    // ==== end register training_state ====
    Ok(())
}
