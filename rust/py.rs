//! The Python binding, and nothing else: argument and result conversion,
//! error conversion, and releasing the GIL (`py.detach`) around every call
//! that reads files or computes. The result types themselves are the core's
//! own structs, made Python classes with `cfg_attr(pyclass)` where they are
//! defined; the `#[pymethods]` here only add what Python needs on top
//! (NumPy arrays, dicts, tuples, reprs, pickling).

use std::path::PathBuf;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::analysis::adapter_weights::{self, AdapterWeights};
use crate::analysis::full_weights::{FullWeights, LayerWeights};
use crate::analysis::layers::{self, LayerGrouping};
use crate::analysis::metrics;
use crate::analysis::robust_curve::{self, RobustCurve, RobustParams, SpikeEvent};
use crate::analysis::series;
use crate::error::{Area, Error};
use crate::formats::logs::curve::LossCurve;
use crate::formats::logs::{dlm_log, loss_log};
use crate::formats::safetensors_header::{self, Header, TensorInfo};
use crate::store::optimizer_state::{self, OptimizerState};
use crate::store::scan::{
    self, Discovery, DriftInput, FullWeightsInput, GhostInput, LogsStatus, Target, TargetInputs,
    WeightsInput,
};
use crate::store::torch_state::{self, ParamStat, TrainingState};
use crate::Result;

mod compare;
mod drift_inputs;
mod ghost_inputs;
mod guard;
mod json;
mod records;
mod remote;
mod verdicts;
mod weights_inputs;

// ---- errors ----

/// `adapterprobe.errors`, where every exception class is defined.
static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class_name(area: Area) -> &'static str {
    match area {
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

/// The exception instance for `err`: its area's class called with the
/// reason, `path=` and the details as keyword arguments.
fn exception<'py>(py: Python<'py>, err: &Error) -> PyResult<Bound<'py, PyAny>> {
    let module =
        ERRORS.get_or_try_init(py, || py.import("adapterprobe.errors").map(Bound::unbind))?;
    let class = module.bind(py).getattr(class_name(err.area))?;
    let kwargs = PyDict::new(py);
    if !err.path.as_os_str().is_empty() {
        kwargs.set_item("path", &err.path)?;
    }
    for (key, value) in &err.details {
        kwargs.set_item(key, value)?;
    }
    class.call((&err.message,), Some(&kwargs))
}

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        Python::attach(|py| match exception(py, &err) {
            Ok(instance) => PyErr::from_value(instance),
            Err(failed) => failed,
        })
    }
}

/// An error held in a result (e.g. `GhostInput.error`) reaches Python as the
/// exception instance, so callers test it with `isinstance`.
impl<'py> IntoPyObject<'py> for &Error {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        exception(py, self)
    }
}

impl<'py> IntoPyObject<'py> for Error {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        exception(py, &self)
    }
}

/// Python-style float text (nan, inf) for reprs.
fn py_float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:?}")
    }
}

// ---- safetensors headers ----

#[pymethods]
impl TensorInfo {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    #[getter]
    fn dtype(&self) -> &str {
        &self.dtype
    }
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

#[pymethods]
impl Header {
    /// Tensor name -> TensorInfo, in header order.
    #[getter]
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for t in &self.tensors {
            d.set_item(&t.name, t.clone())?;
        }
        Ok(d)
    }
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(pairs) = &self.metadata else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (k, v) in pairs {
            d.set_item(k, v)?;
        }
        Ok(Some(d))
    }
    /// Bytes of the data section (file size - 8 - header length).
    #[getter]
    fn data_len(&self) -> u64 {
        self.data_len
    }
    fn __repr__(&self) -> String {
        format!("SafetensorsHeader({} tensors)", self.tensors.len())
    }
}

#[pyfunction]
fn read_safetensors_header(py: Python<'_>, path: PathBuf) -> Result<Header> {
    py.detach(|| safetensors_header::read_header(&path))
}

// ---- layer grouping ----

#[pymethods]
impl LayerGrouping {
    #[getter]
    fn layer_indices<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.layer_indices)
    }
    #[getter]
    fn params_per_layer(&self) -> u64 {
        self.params_per_layer
    }
    #[getter]
    fn num_layers(&self) -> usize {
        self.layer_indices.len()
    }
    /// Optimizer param id -> layer index, for the layered param ids.
    #[getter]
    fn layer_of<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (param_id, layer) in self.layer_of.iter().enumerate() {
            d.set_item(param_id, layer)?;
        }
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!(
            "LayerGrouping(num_layers={}, params_per_layer={})",
            self.layer_indices.len(),
            self.params_per_layer
        )
    }
}

/// Group an adapter's optimizer param ids by layer: `rules="robust"` reads
/// the layer markers `adapter_weights` reads (GPT-2's `h.N` too),
/// `rules="sway"` only dlm-sway's `.layers.N.`.
#[pyfunction]
#[pyo3(signature = (adapter, num_params=None, *, rules="robust"))]
fn group_layers(
    py: Python<'_>,
    adapter: PathBuf,
    num_params: Option<Size>,
    rules: &str,
) -> Result<LayerGrouping> {
    let num_params = num_params
        .map(|n| count("num_params", n).map(|n| n as u64))
        .transpose()?;
    let rule = match rules {
        "robust" => layers::LayerKeys::Robust,
        "sway" => layers::LayerKeys::Sway,
        other => {
            return Err(usage_error(&format!(
                "rules must be 'robust' or 'sway', got {other:?}"
            )))
        }
    };
    py.detach(|| layers::group_layers_by(&adapter, num_params, rule))
}

// ---- loss curves and their metrics ----

/// The metrics of `losses` as the dict Python sees; `points` turns curve
/// indices into what the caller wants (step numbers, or index arrays).
fn metrics_dict<'py>(
    py: Python<'py>,
    m: &metrics::CurveMetrics,
    points: impl Fn(&[usize]) -> PyResult<Bound<'py, PyAny>>,
    names: (&str, &str),
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("initial_loss", m.initial_loss)?;
    d.set_item("final_loss", m.final_loss)?;
    d.set_item("convergence_ratio", m.convergence_ratio)?;
    d.set_item("smoothness", m.smoothness)?;
    d.set_item("instability_events", m.instability_events)?;
    d.set_item(names.0, points(&m.spike_points)?)?;
    d.set_item(names.1, points(&m.nonfinite_points)?)?;
    Ok(d)
}

fn index_array<'py>(py: Python<'py>, points: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let v: Vec<i64> = points.iter().map(|&i| i as i64).collect();
    Ok(PyArray1::from_vec(py, v).into_any())
}

#[pymethods]
impl LossCurve {
    /// Step numbers (int64 array, a fresh copy).
    #[getter]
    fn steps<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        PyArray1::from_slice(py, &self.steps)
    }
    /// Losses (float64 array, +inf where the logged loss was not finite).
    #[getter]
    fn losses<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_slice(py, &self.losses)
    }
    #[getter]
    fn num_files(&self) -> usize {
        self.num_files
    }
    /// The log files read, in reading order.
    #[getter]
    fn files(&self) -> Vec<PathBuf> {
        self.files.clone()
    }
    /// The format read (`dlm`, `trainer_state`, `tensorboard`, `csv`, ...).
    #[getter]
    fn source(&self) -> &str {
        &self.source
    }
    /// The series read (`loss`, a TensorBoard tag, a CSV column, ...).
    #[getter]
    fn series(&self) -> &str {
        &self.series
    }
    /// Files that ended in a torn record or line (read up to it).
    #[getter]
    fn torn_files(&self) -> Vec<PathBuf> {
        self.torn_files.clone()
    }
    /// `(step, eval loss)` pairs logged beside the training loss, by step.
    #[getter]
    fn eval_loss(&self) -> Vec<(i64, f64)> {
        self.side.eval_loss.clone()
    }
    /// `(step, gradient norm before clipping)` pairs, by step (NaN kept).
    #[getter]
    fn grad_norm(&self) -> Vec<(i64, f64)> {
        self.side.grad_norm.clone()
    }
    /// `(step, learning rate)` pairs, by step.
    #[getter]
    fn learning_rate(&self) -> Vec<(i64, f64)> {
        self.side.learning_rate.clone()
    }
    /// `(step, mean reward)` pairs of an RL objective, by step.
    #[getter]
    fn reward(&self) -> Vec<(i64, f64)> {
        self.side.reward.clone()
    }
    /// `(global_step, max_steps)` where the log says how far the run got
    /// against its plan (`trainer_state.json`, LLaMA-Factory's log).
    #[getter]
    fn progress(&self) -> Option<(i64, i64)> {
        self.side.progress.map(|p| (p.global_step, p.max_steps))
    }
    /// How the tracker that kept the log names the run (W&B `project/name
    /// (id)`, MLflow `experiment/run name (id)`); empty for plain log files.
    #[getter]
    fn run(&self) -> &str {
        &self.run
    }
    /// Drift metrics of this curve, with `spike_steps` and `nonfinite_steps`
    /// as step numbers (see `curve_metrics`).
    #[pyo3(signature = (*, rolling_window=Size(10), spike_sigma=3.0), text_signature = "($self, *, rolling_window=10, spike_sigma=3.0)")]
    fn metrics<'py>(
        &self,
        py: Python<'py>,
        rolling_window: Size,
        spike_sigma: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let rolling_window = count("rolling_window", rolling_window)?;
        metrics::check_spike_params(rolling_window, spike_sigma)?;
        let m = py.detach(|| metrics::curve_metrics(&self.losses, rolling_window, spike_sigma));
        let steps = |p: &[usize]| Ok(self.steps_at(p).into_pyobject(py)?.into_any());
        metrics_dict(py, &m, steps, ("spike_steps", "nonfinite_steps"))
    }
    /// The robust analysis of this curve (see `robust_curve`); None when no
    /// loss is finite.
    #[pyo3(signature = (*, trend_window=Size(11), spike_z=6.0, min_spike_rise=0.1, scale_block=Size(64), spike_false_alarm=0.01, spike_fall_share=0.1), text_signature = "($self, *, trend_window=11, spike_z=6.0, min_spike_rise=0.1, scale_block=64, spike_false_alarm=0.01, spike_fall_share=0.1)")]
    #[allow(clippy::too_many_arguments)]
    fn robust(
        &self,
        py: Python<'_>,
        trend_window: Size,
        spike_z: f64,
        min_spike_rise: f64,
        scale_block: Size,
        spike_false_alarm: f64,
        spike_fall_share: f64,
    ) -> Result<Option<RobustCurve>> {
        let params = robust_params(
            trend_window,
            spike_z,
            min_spike_rise,
            scale_block,
            spike_false_alarm,
            spike_fall_share,
        )?;
        Ok(py.detach(|| robust_curve::analyse(&self.losses, &params)))
    }
    /// At most about `cap` evenly strided (step, loss) points, the first and
    /// last always kept; a non-finite loss is None.
    #[pyo3(name = "sample", signature = (cap=Size(512)), text_signature = "($self, cap=512)")]
    fn sample_py(&self, cap: Size) -> Result<Vec<(i64, Option<f64>)>> {
        self.sample(count("cap", cap)?)
    }
    /// For each side series the logs carry (`eval_loss`, `grad_norm`,
    /// `learning_rate`): a dict with `len`, `sampled` (at most about `cap`
    /// points, non-finite as None), `nonfinite_steps` and `zeros`.
    #[pyo3(signature = (cap=Size(512)), text_signature = "($self, cap=512)")]
    fn side_summary<'py>(&self, py: Python<'py>, cap: Size) -> PyResult<Bound<'py, PyDict>> {
        let cap = count("cap", cap)?;
        let out = PyDict::new(py);
        for (name, points) in [
            ("eval_loss", &self.side.eval_loss),
            ("grad_norm", &self.side.grad_norm),
            ("learning_rate", &self.side.learning_rate),
            ("reward", &self.side.reward),
        ] {
            if points.is_empty() {
                continue;
            }
            let s = series::summarize(points, cap);
            let d = PyDict::new(py);
            d.set_item("len", s.len)?;
            d.set_item("sampled", s.sampled)?;
            d.set_item("nonfinite_steps", s.nonfinite_steps)?;
            d.set_item("zeros", s.zeros)?;
            out.set_item(name, d)?;
        }
        Ok(out)
    }
    fn __len__(&self) -> usize {
        self.steps.len()
    }
    fn __repr__(&self) -> String {
        format!(
            "LossCurve({} steps from {} {} files)",
            self.steps.len(),
            self.num_files,
            self.source
        )
    }
}

/// Read a loss curve from `source`: a path (dlm store, logs dir or `.jsonl`;
/// HF `trainer_state.json` or output dir; TensorBoard event file or dir;
/// CSV) or a list of dlm `.jsonl` files. `tag` picks the series (a
/// TensorBoard tag, a CSV column, `eval_loss` of a trainer state).
#[pyfunction]
#[pyo3(signature = (source, *, tag=None))]
fn read_loss_curve(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    tag: Option<String>,
) -> Result<LossCurve> {
    if let Ok(path) = source.extract::<PathBuf>() {
        return py.detach(|| loss_log::read_curve(&path, tag.as_deref()));
    }
    let files = source.extract::<Vec<PathBuf>>().map_err(|_| {
        usage_error("source must be a path, or a list of paths to dlm .jsonl files")
    })?;
    if tag.as_deref().is_some_and(|t| t != "loss") {
        return Err(usage_error(
            "a list of dlm .jsonl files has only the series \"loss\"",
        ));
    }
    py.detach(|| dlm_log::read_loss_curve(&files))
}

/// Read an optimizer state without torch: HF `optimizer.pt`, a Lightning
/// `.ckpt`, or dlm's `training_state.pt` (or a directory holding one).
#[pyfunction]
fn read_optimizer_state(py: Python<'_>, path: PathBuf) -> Result<OptimizerState> {
    py.detach(|| optimizer_state::read_optimizer_state(&path))
}

/// A count argument (a window, a cap, a number of workers) as usize: a
/// negative one is a UsageError naming it, not an OverflowError.
fn count(name: &str, value: Size) -> Result<usize> {
    let Size(value) = value;
    usize::try_from(value).map_err(|_| {
        let got = if value == i64::MIN {
            "a negative integer beyond 64 bits".to_string()
        } else {
            value.to_string()
        };
        usage_error(&format!("{name} must be a non-negative integer, got {got}"))
    })
}

/// An integer argument that never fails to convert: one beyond i64 is
/// clamped to i64::MIN or i64::MAX, so `count` reports a negative one as a
/// UsageError and a huge one behaves as "as large as you like", where PyO3's
/// own i64 conversion would raise OverflowError.
#[derive(Clone, Copy)]
struct Size(i64);

impl<'a, 'py> FromPyObject<'a, 'py> for Size {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<i64>() {
            Ok(n) => Ok(Size(n)),
            Err(err) if err.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
                Ok(Size(if obj.lt(0)? { i64::MIN } else { i64::MAX }))
            }
            Err(err) => Err(err),
        }
    }
}

fn usage_error(message: &str) -> Error {
    Error::new(Area::Usage, "", message)
}

/// Values of a float64 array (copied) or of any sequence of numbers.
fn f64_values(obj: &Bound<'_, PyAny>) -> Result<Vec<f64>> {
    if let Ok(array) = obj.extract::<PyReadonlyArray1<'_, f64>>() {
        return Ok(array.as_array().to_vec());
    }
    obj.extract::<Vec<f64>>()
        .map_err(|_| usage_error("expected a 1-D sequence of numbers"))
}

#[pyfunction]
#[pyo3(signature = (losses, *, rolling_window=Size(10), spike_sigma=3.0), text_signature = "(losses, *, rolling_window=10, spike_sigma=3.0)")]
fn curve_metrics<'py>(
    py: Python<'py>,
    losses: &Bound<'py, PyAny>,
    rolling_window: Size,
    spike_sigma: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let rolling_window = count("rolling_window", rolling_window)?;
    metrics::check_spike_params(rolling_window, spike_sigma)?;
    let values = f64_values(losses)?;
    let m = py.detach(|| metrics::curve_metrics(&values, rolling_window, spike_sigma));
    let indices = |p: &[usize]| index_array(py, p);
    metrics_dict(py, &m, indices, ("spike_points", "nonfinite_points"))
}

#[pyfunction]
#[pyo3(signature = (deltas, *, window=Size(10), sigma=3.0), text_signature = "(deltas, *, window=10, sigma=3.0)")]
fn count_spikes(
    py: Python<'_>,
    deltas: &Bound<'_, PyAny>,
    window: Size,
    sigma: f64,
) -> Result<usize> {
    let window = count("window", window)?;
    metrics::check_spike_params(window, sigma)?;
    let values = f64_values(deltas)?;
    Ok(py.detach(|| metrics::count_spikes(&values, window, sigma)))
}

#[pyfunction]
#[pyo3(signature = (deltas, *, window=Size(10), sigma=3.0), text_signature = "(deltas, *, window=10, sigma=3.0)")]
fn spike_indices<'py>(
    py: Python<'py>,
    deltas: &Bound<'py, PyAny>,
    window: Size,
    sigma: f64,
) -> PyResult<Bound<'py, PyAny>> {
    let window = count("window", window)?;
    metrics::check_spike_params(window, sigma)?;
    let values = f64_values(deltas)?;
    let found = py.detach(|| metrics::spike_indices(&values, window, sigma));
    index_array(py, &found)
}

/// The robust parameters from Python arguments, checked.
fn robust_params(
    trend_window: Size,
    spike_z: f64,
    min_spike_rise: f64,
    scale_block: Size,
    spike_false_alarm: f64,
    spike_fall_share: f64,
) -> Result<RobustParams> {
    let params = RobustParams {
        trend_window: count("trend_window", trend_window)?,
        spike_z,
        min_spike_rise,
        scale_block: count("scale_block", scale_block)?,
        spike_false_alarm,
        spike_fall_share,
    };
    robust_curve::check_params(&params)?;
    Ok(params)
}

/// Robust analysis of a loss sequence: rolling-median trend, noise, spike
/// events and levels. None when no loss is finite.
#[pyfunction(name = "robust_curve")]
#[pyo3(signature = (losses, *, trend_window=Size(11), spike_z=6.0, min_spike_rise=0.1, scale_block=Size(64), spike_false_alarm=0.01, spike_fall_share=0.1), text_signature = "(losses, *, trend_window=11, spike_z=6.0, min_spike_rise=0.1, scale_block=64, spike_false_alarm=0.01, spike_fall_share=0.1)")]
#[allow(clippy::too_many_arguments)]
fn robust_curve_py(
    py: Python<'_>,
    losses: &Bound<'_, PyAny>,
    trend_window: Size,
    spike_z: f64,
    min_spike_rise: f64,
    scale_block: Size,
    spike_false_alarm: f64,
    spike_fall_share: f64,
) -> Result<Option<RobustCurve>> {
    let params = robust_params(
        trend_window,
        spike_z,
        min_spike_rise,
        scale_block,
        spike_false_alarm,
        spike_fall_share,
    )?;
    let values = f64_values(losses)?;
    Ok(py.detach(|| robust_curve::analyse(&values, &params)))
}

#[pymethods]
impl RobustCurve {
    /// `(head - tail) / |head|`: the share of the starting loss the run shed.
    #[pyo3(name = "relative_drop")]
    fn relative_drop_py(&self) -> f64 {
        self.relative_drop()
    }
    /// `(tail - best) / |head|`: how far the end sits above the best level.
    #[pyo3(name = "relative_regression")]
    fn relative_regression_py(&self) -> f64 {
        self.relative_regression()
    }
    fn __repr__(&self) -> String {
        format!(
            "RobustCurve({} points, {} spikes, {} non-finite, head={}, tail={}, noise={})",
            self.trend.len(),
            self.spikes.len(),
            self.nonfinite.len(),
            py_float(self.head_level),
            py_float(self.tail_level),
            py_float(self.noise)
        )
    }
}

#[pymethods]
impl SpikeEvent {
    fn __repr__(&self) -> String {
        format!(
            "SpikeEvent(start={}, end={}, peak={}, rise={}, relative_rise={}, z={})",
            self.start,
            self.end,
            self.peak,
            py_float(self.rise),
            py_float(self.relative_rise),
            py_float(self.z)
        )
    }
}

// ---- training states ----

#[pymethods]
impl ParamStat {
    fn __repr__(&self) -> String {
        format!(
            "ParamStat(param_id={}, numel={}, exp_avg_sq_mean={}, nonfinite={})",
            self.param_id,
            self.numel,
            py_float(self.exp_avg_sq_mean),
            self.nonfinite
        )
    }
}

#[pymethods]
impl TrainingState {
    fn __repr__(&self) -> String {
        format!(
            "TrainingState(path={:?}, global_step={}, epoch={}, best_val_loss={}, \
             use_qlora={}, per_param=<{} params>)",
            self.path.display().to_string(),
            self.global_step,
            self.epoch.map_or("None".into(), py_float),
            py_float(self.best_val_loss),
            if self.use_qlora { "True" } else { "False" },
            self.per_param.len()
        )
    }
}

#[pymethods]
impl OptimizerState {
    fn __repr__(&self) -> String {
        format!(
            "OptimizerState(path={:?}, format={:?}, optimizer={:?}, global_step={}, \
             per_param=<{} params>)",
            self.path.display().to_string(),
            self.format,
            self.optimizer,
            self.global_step.map_or("None".into(), |s| s.to_string()),
            self.per_param.len()
        )
    }
}

#[pymethods]
impl adapter_weights::AdapterWeights {
    fn __repr__(&self) -> String {
        format!(
            "AdapterWeights(path={:?}, modules=<{} LoRA modules>, other_tensors={}, \
             nonfinite_total={})",
            self.path.display().to_string(),
            self.modules.len(),
            self.other_tensors.len(),
            self.nonfinite_total
        )
    }
}

#[pymethods]
impl adapter_weights::LoraModuleStats {
    fn __repr__(&self) -> String {
        format!(
            "LoraModuleStats(name={:?}, layer={}, rank={}, delta_fro={})",
            self.name,
            self.layer.map_or("None".into(), |l| l.to_string()),
            self.rank,
            self.delta_fro.map_or("None".into(), py_float)
        )
    }
}

/// Read a dlm training_state.pt (or the adapter version dir holding it)
/// with the allow-listed pickle reader; the GIL is released while reading.
#[pyfunction]
fn read_training_state(py: Python<'_>, path: PathBuf) -> Result<TrainingState> {
    py.detach(|| torch_state::read_training_state(&path))
}

// ---- probe inputs and store scans ----

#[pyfunction]
fn drift_input(py: Python<'_>, store: PathBuf) -> DriftInput {
    py.detach(|| scan::drift_input(&store))
}

#[pyfunction]
fn ghost_input(py: Python<'_>, adapter: PathBuf) -> GhostInput {
    py.detach(|| scan::ghost_input(&adapter))
}

#[pymethods]
impl Target {
    #[new]
    #[pyo3(signature = (store, versions, broken=Vec::new(), with_logs=true, layout="dlm".to_string(), checkpoint_kind=None, log_root=None, root=None))]
    // One keyword argument per field of the struct, as Python builds it.
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        store: PathBuf,
        versions: Vec<PathBuf>,
        broken: Vec<(PathBuf, String)>,
        with_logs: bool,
        layout: String,
        checkpoint_kind: Option<String>,
        log_root: Option<PathBuf>,
        root: Option<PathBuf>,
    ) -> Self {
        Target {
            store,
            layout,
            versions,
            broken,
            with_logs,
            log_root,
            checkpoint_kind,
            root,
        }
    }
    /// Pickle support, so targets can travel to other processes (Ray tasks).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let t = slf.get();
        let args = (
            t.store.clone(),
            t.versions.clone(),
            t.broken.clone(),
            t.with_logs,
            t.layout.clone(),
            t.checkpoint_kind.clone(),
            t.log_root.clone(),
            t.root.clone(),
        );
        Ok((slf.get_type().into_any(), args.into_pyobject(slf.py())?))
    }
    fn __repr__(&self) -> String {
        format!(
            "Target(store={:?}, layout={:?}, checkpoint_kind={}, versions={})",
            self.store.display().to_string(),
            self.layout,
            self.checkpoint_kind
                .as_ref()
                .map_or("None".into(), |k| format!("{k:?}")),
            self.versions.len()
        )
    }
}

/// Find stores under `roots`: the targets and what could not be searched
/// (with `explain`, also what was passed over on purpose, and why). Links
/// are followed only inside each root (or its entry in `bounds`) unless
/// `follow_symlinks`.
#[pyfunction]
#[pyo3(signature = (roots, *, all_versions=false, workers=None, follow_symlinks=false, explain=false, bounds=None, exclude=None))]
#[allow(clippy::too_many_arguments)]
fn discover(
    py: Python<'_>,
    roots: Vec<PathBuf>,
    all_versions: bool,
    workers: Option<Size>,
    follow_symlinks: bool,
    explain: bool,
    bounds: Option<Vec<PathBuf>>,
    exclude: Option<Vec<String>>,
) -> Result<Discovery> {
    let bounds = bounds.unwrap_or_default();
    let workers = workers.map(|n| count("workers", n)).transpose()?;
    let exclude = scan::Exclude::new(&exclude.unwrap_or_default())?;
    py.detach(|| {
        scan::pool(workers).map(|p| {
            p.install(|| {
                scan::discover_excluding(
                    &roots,
                    &bounds,
                    all_versions,
                    follow_symlinks,
                    explain,
                    exclude,
                )
            })
        })
    })
}

/// Files and bytes read by a plain walk of `root` that reads every regular
/// file whose name is not in `skip` once (`io::walk::read_tree`): the
/// floor `benches/bench_scan.py` measures a scan against.
#[pyfunction]
#[pyo3(signature = (root, *, skip=None, workers=None))]
fn read_tree(
    py: Python<'_>,
    root: PathBuf,
    skip: Option<Vec<String>>,
    workers: Option<Size>,
) -> Result<(u64, u64)> {
    let skip = skip.unwrap_or_default();
    let workers = workers.map(|n| count("workers", n)).transpose()?;
    py.detach(|| {
        scan::pool(workers).map(|p| p.install(|| crate::io::walk::read_tree(&root, &skip)))
    })
}

/// `text` as a short printable-ASCII excerpt: how every message quotes a
/// file's content (see `io::excerpt`).
/// Lone surrogates (a non-UTF-8 file name read with `surrogateescape`)
/// show as U+FFFD rather than failing.
#[pyfunction]
fn excerpt(text: &Bound<'_, PyString>) -> String {
    crate::io::excerpt::excerpt(&text.to_string_lossy())
}

/// Whether the file at `path` is a LoRA file of another tool than PEFT
/// (kohya, LyCORIS, diffusers, mlx-lm naming): a store given alone.
#[pyfunction]
fn is_lora_file(path: PathBuf) -> bool {
    crate::store::layout::is_lora_file(&path)
}

/// Gather probe inputs for `targets` in parallel (GIL released), in order.
#[pyfunction]
#[pyo3(signature = (targets, *, drift=true, ghost=true, weights=true, full_weights=false, gap=true, workers=None))]
#[allow(clippy::too_many_arguments)]
fn probe_targets(
    py: Python<'_>,
    targets: Vec<Target>,
    drift: bool,
    ghost: bool,
    weights: bool,
    full_weights: bool,
    gap: bool,
    workers: Option<Size>,
) -> Result<Vec<TargetInputs>> {
    let workers = workers.map(|n| count("workers", n)).transpose()?;
    let wanted = scan::Wanted {
        drift,
        ghost,
        weights,
        full_weights,
        gap,
    };
    py.detach(|| scan::pool(workers).map(|p| p.install(|| scan::probe_targets(&targets, wanted))))
}

/// Read an adapter's weights and config (a PEFT adapter dir or its
/// `.safetensors` file): per-module norms, ΔW spectrum, non-finite counts.
#[pyfunction]
fn read_adapter_weights(py: Python<'_>, path: PathBuf) -> Result<AdapterWeights> {
    py.detach(|| adapter_weights::read_adapter_weights(&path))
}

#[pyfunction]
fn weights_input(py: Python<'_>, adapter: PathBuf) -> WeightsInput {
    py.detach(|| scan::weights_input(&adapter))
}

/// What `full_weights` needs about one checkpoint (a directory, or its
/// `model.safetensors` or `model.safetensors.index.json`).
#[pyfunction]
fn full_weights_input(py: Python<'_>, version: PathBuf) -> FullWeightsInput {
    py.detach(|| scan::full_weights_input(&version))
}

#[pymethods]
impl FullWeights {
    fn __repr__(&self) -> String {
        format!(
            "FullWeights(path={:?}, files={}, tensors={}, layers={}, nonfinite_total={})",
            self.path.display().to_string(),
            self.files.len(),
            self.tensors.len(),
            self.layers.len(),
            self.nonfinite_total
        )
    }
}

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<TensorInfo>()?;
    m.add_class::<Header>()?;
    m.add_class::<LayerGrouping>()?;
    m.add_class::<LossCurve>()?;
    m.add_class::<RobustCurve>()?;
    m.add_class::<SpikeEvent>()?;
    m.add_function(wrap_pyfunction!(robust_curve_py, m)?)?;
    m.add_class::<ParamStat>()?;
    m.add_class::<crate::analysis::attribution::Attribution>()?;
    m.add_class::<crate::analysis::attribution::ParamSlot>()?;
    m.add_class::<TrainingState>()?;
    m.add_class::<LogsStatus>()?;
    m.add_class::<DriftInput>()?;
    m.add_class::<crate::formats::model_config::OutputClasses>()?;
    m.add_class::<crate::store::probe_inputs::GuardNote>()?;
    m.add_class::<GhostInput>()?;
    m.add_class::<Target>()?;
    m.add_class::<TargetInputs>()?;
    m.add_class::<Discovery>()?;
    m.add_class::<scan::Problem>()?;
    m.add_function(wrap_pyfunction!(read_safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(group_layers, m)?)?;
    m.add_function(wrap_pyfunction!(read_loss_curve, m)?)?;
    m.add_function(wrap_pyfunction!(curve_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(count_spikes, m)?)?;
    m.add_function(wrap_pyfunction!(spike_indices, m)?)?;
    m.add_function(wrap_pyfunction!(read_training_state, m)?)?;
    m.add_class::<OptimizerState>()?;
    m.add_function(wrap_pyfunction!(read_optimizer_state, m)?)?;
    m.add_function(wrap_pyfunction!(drift_input, m)?)?;
    m.add_function(wrap_pyfunction!(ghost_input, m)?)?;
    m.add_function(wrap_pyfunction!(discover, m)?)?;
    m.add_function(wrap_pyfunction!(excerpt, m)?)?;
    m.add_function(wrap_pyfunction!(is_lora_file, m)?)?;
    m.add_function(wrap_pyfunction!(read_tree, m)?)?;
    m.add_function(wrap_pyfunction!(probe_targets, m)?)?;
    m.add_class::<WeightsInput>()?;
    m.add_class::<AdapterWeights>()?;
    m.add_class::<adapter_weights::LoraModuleStats>()?;
    m.add_class::<adapter_weights::TensorStats>()?;
    m.add_class::<adapter_weights::LayerEnergy>()?;
    m.add_class::<adapter_weights::ConfigSummary>()?;
    m.add_function(wrap_pyfunction!(read_adapter_weights, m)?)?;
    m.add_function(wrap_pyfunction!(weights_input, m)?)?;
    m.add_class::<FullWeightsInput>()?;
    m.add_class::<FullWeights>()?;
    m.add_class::<LayerWeights>()?;
    m.add_function(wrap_pyfunction!(full_weights_input, m)?)?;
    compare::register(m)?;
    ghost_inputs::register(m)?;
    guard::register(m)?;
    json::register(m)?;
    records::register(m)?;
    remote::register(m)?;
    verdicts::register(m)?;
    add_testing(m)
}

/// `_core._testing`: constructors of the kernels' inputs from plain values,
/// for the property tests. Kept out of `_core` itself so the public surface
/// (and its stub) is what a user calls; registered in `sys.modules` so that
/// `from adapterprobe._core import _testing` and a plain import both work.
fn add_testing(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let testing = PyModule::new(py, "adapterprobe._core._testing")?;
    drift_inputs::register(&testing)?;
    weights_inputs::register(&testing)?;
    m.setattr("_testing", &testing)?;
    py.import("sys")?
        .getattr("modules")?
        .set_item("adapterprobe._core._testing", &testing)?;
    Ok(())
}
