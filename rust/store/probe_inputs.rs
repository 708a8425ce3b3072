//! What each probe needs about a store or an adapter version, read per
//! layout. Reading only: the verdicts are `verdicts`' kernels, so a scan and
//! a single probe can never disagree. A layout that cannot feed a probe says
//! why in `note` (the probe then SKIPs with that reason).

use std::path::{Path, PathBuf};

use crate::analysis::adapter_weights::{self, AdapterWeights};
use crate::analysis::attribution::{self, Attribution};
use crate::analysis::full_weights::{self, FullWeights};
use crate::analysis::layers::{self, LayerGrouping};
use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{LossCurve, RunProgress};
use crate::formats::logs::trainer_state;
use crate::formats::logs::{dlm_log, loss_log};
use crate::formats::model_config::{self, OutputClasses};
use crate::formats::torch_state_dict::read_tensor_header;
use crate::io::read_once;
use crate::store::layout::{
    self, checkpoint_kind, Target, FULL, HF_TRAINER, LIGHTNING, LOGS, PEFT, PICKLED_ADAPTER,
    TENSORBOARD, TRAINER_STATE,
};
use crate::store::model_files::{self, ModelFiles};
use crate::store::optimizer_state::{self, OptimizerState};
use crate::store::torch_state::{self, TrainingState};

/// What reading a store's logs gave.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, eq, eq_int, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogsStatus {
    /// The store has no place for logs (no `logs/` directory; a bare adapter).
    NoLogsDir,
    /// Where logs belong there are none.
    NoFiles,
    /// A curve was read.
    Curve,
    /// The logs exist but cannot be read (`error` says why).
    Failed,
}

/// Everything `training_drift` needs about one store.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct DriftInput {
    pub store: PathBuf,
    pub layout: String,
    pub logs_dir: PathBuf,
    pub files: Vec<PathBuf>,
    pub status: LogsStatus,
    /// Present when `status` is `Curve`.
    pub curve: Option<LossCurve>,
    /// Present when `status` is `Failed`.
    pub error: Option<Error>,
    /// Why there is no curve, in words, when the layout explains it.
    pub note: Option<String>,
    /// What the loss is a cross-entropy over, where the run saved its
    /// model's `config.json` (see `formats::model_config`).
    pub output_classes: Option<OutputClasses>,
    /// What adapterprobe's guard wrote into the run's output
    /// (`adapterprobe-guard.json`), where it did.
    pub guard: Option<GuardNote>,
}

/// The guard's verdict file of a run: its verdict and the step it stopped
/// the run at (None: it did not).
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct GuardNote {
    pub verdict: String,
    pub stopped_at: Option<i64>,
}

/// The file a guard callback writes into a run's output directory.
pub const GUARD_FILE: &str = "adapterprobe-guard.json";
/// Largest guard file read (one holds a verdict and a few findings).
const MAX_GUARD_FILE: u64 = 1 << 20;

/// `<dir>/adapterprobe-guard.json`'s verdict and stop step; None when the
/// file is absent, too large, or not what a guard writes.
pub fn guard_note(dir: &Path) -> Option<GuardNote> {
    use std::io::Read;
    let path = dir.join(GUARD_FILE);
    let file = crate::io::files::open_regular(&path, Area::LogFormat).ok()?;
    let mut text = String::new();
    file.take(MAX_GUARD_FILE + 1)
        .read_to_string(&mut text)
        .ok()?;
    if text.len() as u64 > MAX_GUARD_FILE {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    let verdict = value.get("verdict")?.as_str()?;
    if !matches!(verdict, "pass" | "warn" | "fail" | "error") {
        return None;
    }
    let stopped_at = match value.get("stopped_at") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(v.as_i64()?),
    };
    Some(GuardNote {
        verdict: verdict.to_string(),
        stopped_at,
    })
}

impl DriftInput {
    fn new(store: &Path, layout: &str, logs_dir: PathBuf) -> DriftInput {
        DriftInput {
            store: store.to_path_buf(),
            layout: layout.to_string(),
            logs_dir,
            files: vec![],
            status: LogsStatus::NoLogsDir,
            curve: None,
            error: None,
            note: None,
            output_classes: None,
            guard: None,
        }
    }

    /// The same input without the run's progress where the trainer state
    /// read is a checkpoint of a run that went on (a `checkpoint-N` beside
    /// it with a higher step): it says how far that checkpoint got, not
    /// where the run stopped. Only looked at when the state is short of
    /// its plan.
    fn with_run_end(mut self) -> DriftInput {
        let Some(curve) = self.curve.as_mut() else {
            return self;
        };
        let Some(p) = curve.side.progress.filter(|p| p.global_step < p.max_steps) else {
            return self;
        };
        let went_on = curve
            .files
            .iter()
            .filter(|f| f.file_name().is_some_and(|n| n == TRAINER_STATE))
            .filter_map(|f| f.parent())
            .filter(|dir| {
                let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
                trainer_state::checkpoint_dir_step(name, dir).is_some()
            })
            .filter_map(|dir| dir.parent())
            .any(|run| later_checkpoint(run, p.global_step));
        if went_on {
            curve.side.progress = None;
        }
        self
    }

    /// The same input with `output_classes` read from what lies beside the
    /// run's logs (in the store, or in the folder of a log file: the
    /// checkpoint whose `trainer_state.json` was read): a `config.json`, a
    /// base model's config, `hparams.yaml` (see
    /// [`model_config::output_classes_near`]); else from what the logs
    /// carry (W&B's config record, MLflow's params, TensorBoard's
    /// `model_config` text).
    fn with_model_config(mut self) -> DriftInput {
        let Some(curve) = &self.curve else {
            return self;
        };
        let mut dirs: Vec<&Path> = vec![self.store.as_path()];
        for dir in curve.files.iter().filter_map(|f| f.parent()) {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        // The model's own config.json first, then the tracker's record of it.
        self.output_classes =
            model_config::output_classes_near(&dirs).or_else(|| curve.output_classes.clone());
        self
    }

    fn read(mut self, curve: Result<LossCurve>) -> DriftInput {
        match curve {
            Ok(c) => {
                self.files = c.files.clone();
                self.status = LogsStatus::Curve;
                self.curve = Some(c);
            }
            // Logs that are fine but hold no loss series (event files of
            // histograms or text only, a metrics.csv of accuracies): there
            // is nothing to judge, and the message says what is there.
            Err(e) if loss_log::is_no_loss_series(&e) => {
                self.status = LogsStatus::NoFiles;
                self.note = Some(format!("{}: {}", e.path.display(), e.message));
            }
            Err(e) => {
                self.status = LogsStatus::Failed;
                self.error = Some(e);
            }
        }
        self
    }

    /// The same input with `note` set where it has none and no curve.
    fn with_note(mut self, note: String) -> DriftInput {
        if self.note.is_none() && self.status == LogsStatus::NoLogsDir {
            self.note = Some(note);
        }
        self
    }

    fn none(mut self, status: LogsStatus, note: String) -> DriftInput {
        self.status = status;
        self.note = Some(note);
        self
    }
}

/// The loss curve of `store` when it is a store of its own or an HF
/// checkpoint given alone (judged by its own `trainer_state.json`); None
/// when the runs below it must be found first (`scan::drift_input`).
pub fn direct_drift_input(store: &Path) -> Option<DriftInput> {
    // One run of an MLflow SQLite store, named by its path below the file.
    if crate::formats::logs::mlflow_db::split_run_path(store).is_some() {
        return Some(drift_input_for(store, layout::MLFLOW));
    }
    if let Some(t) = layout::classify(store, false) {
        return Some(drift_input_for(store, &t.layout));
    }
    if !read_once::is_dir(store) && layout::is_lora_file(store) {
        return Some(drift_input_for(store, layout::LORA_FILE));
    }
    layout::version_root(store)
        .filter(|t| t.log_root.is_some())
        .map(|t| drift_input_for(store, &t.layout))
}

/// The loss curve judged for `store`, a folder that is no store itself,
/// given the runs with logs a scan finds below it: the one run's, or a
/// record saying there is none or several.
pub fn drift_input_below(store: &Path, runs: &[&Target]) -> DriftInput {
    match runs {
        [] if !store.exists() => {
            dlm_drift_input(store).with_note(format!("{} does not exist", store.display()))
        }
        [] if store.is_dir() => dlm_drift_input(store).with_note(format!(
            "no logs/ directory under {}, and no other training log a layout recognises \
             (an HF trainer_state.json, TensorBoard events, a Lightning metrics.csv)",
            store.display()
        )),
        [] => dlm_drift_input(store),
        [one] => drift_input_for(one.log_root.as_deref().unwrap_or(&one.store), &one.layout),
        several => {
            let names: Vec<String> = several
                .iter()
                .take(5)
                .map(|t| t.store.display().to_string())
                .collect();
            DriftInput::new(store, layout::DLM, store.to_path_buf()).none(
                LogsStatus::NoFiles,
                format!(
                    "{} holds {} runs ({}{}); name the one to judge",
                    store.display(),
                    several.len(),
                    names.join(", "),
                    if several.len() > 5 { ", ..." } else { "" }
                ),
            )
        }
    }
}

pub fn drift_input_for(store: &Path, layout: &str) -> DriftInput {
    let mut input = drift_input_of_layout(store, layout);
    input.guard = guard_note(store);
    if layout == layout::DLM {
        return input; // a dlm store keeps adapter versions, never a model config
    }
    input.with_model_config().with_run_end()
}

/// The run logs in `<run>/logs/` (`train-*.jsonl`: a dlm store's, or the
/// GAP monitor's in a trainer's output dir), if any.
fn monitor_logs(run: &Path) -> Option<Vec<PathBuf>> {
    let logs = run.join("logs");
    if !read_once::is_dir(&logs) {
        return None;
    }
    dlm_log::train_logs_in(&logs)
        .ok()
        .filter(|files| !files.is_empty())
}

/// Most entries of a run folder looked through for a later checkpoint.
const MAX_RUN_ENTRIES: usize = 100_000;

/// Whether `run` holds a `checkpoint-N` folder with N above `step`.
fn later_checkpoint(run: &Path, step: i64) -> bool {
    let Ok(entries) = std::fs::read_dir(run) else {
        return false;
    };
    entries.take(MAX_RUN_ENTRIES).flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(trainer_state::numbered_checkpoint_step)
            .is_some_and(|n| i128::from(n) > i128::from(step))
    })
}

fn drift_input_of_layout(store: &Path, layout: &str) -> DriftInput {
    match layout {
        HF_TRAINER => {
            let input = DriftInput::new(store, layout, store.to_path_buf());
            match loss_log::hf_run_sources(store) {
                None => match (tracker_run(store), monitor_logs(store)) {
                    (Some(run), _) => input.read(loss_log::read_curve_from(&run, None)),
                    // the step lines the GAP monitor's sink wrote beside its records
                    (None, Some(files)) => input.read(dlm_log::read_loss_curve(&files)),
                    (None, None) => input.none(
                        LogsStatus::NoFiles,
                        format!(
                        "no {TRAINER_STATE} (in the output dir or a checkpoint) and no TensorBoard \
                         events under runs/ in {}",
                        store.display()
                    ),
                    ),
                },
                Some(_) => input.read(loss_log::read_hf_run_curve(store)),
            }
        }
        layout::CSV_LOG => {
            let input = DriftInput::new(store, layout, store.to_path_buf());
            match layout::training_csv(store) {
                Some(csv) => input.read(loss_log::read_curve_from(&csv, None)),
                None => input.none(
                    LogsStatus::NoFiles,
                    format!("no training-log CSV in {}", store.display()),
                ),
            }
        }
        LIGHTNING | TENSORBOARD | layout::MLFLOW | layout::WANDB => {
            let input = DriftInput::new(store, layout, store.to_path_buf());
            match loss_log::detect_log_source(store) {
                Err(e) if e.area == Area::LogFormat => match tracker_run(store) {
                    Some(run) => input.read(loss_log::read_curve_from(&run, None)),
                    None => input.none(
                        LogsStatus::NoFiles,
                        format!(
                            "no metrics.csv or TensorBoard events in {}",
                            store.display()
                        ),
                    ),
                },
                Err(e) if e.area == Area::Missing => input.none(
                    LogsStatus::NoFiles,
                    format!(
                        "no metrics.csv or TensorBoard events in {}",
                        store.display()
                    ),
                ),
                _ => input.read(loss_log::read_curve(store, None)),
            }
        }
        layout::LORA_FILE => lora_file_drift_input(store),
        layout::MLX => mlx_drift_input(store),
        // A bare adapter folder is judged on its weights; a log saved in it
        // (a metrics.csv, event files, a trainer_log.jsonl, a tracker run)
        // is read too, and one that cannot be read is an error naming why,
        // never passed over in silence.
        PEFT => {
            let input = DriftInput::new(store, layout, store.to_path_buf());
            match (loss_log::detect_log_source(store), tracker_run(store)) {
                (Ok(_), _) => input.read(loss_log::read_curve(store, None)),
                (Err(_), Some(run)) => input.read(loss_log::read_curve_from(&run, None)),
                (Err(e), None) if e.area == Area::Missing || e.area == Area::LogFormat => input
                    .none(
                        LogsStatus::NoLogsDir,
                        format!(
                            "{} is a bare PEFT adapter directory: no training log is saved \
                             with it (no trainer state, TensorBoard events, metrics.csv or \
                             tracker run in it)",
                            store.display()
                        ),
                    ),
                (Err(e), None) => input.read(Err(e)),
            }
        }
        _ => dlm_drift_input(store),
    }
}

/// The run of a LoRA file of another tool: the TensorBoard events beside it
/// (kohya's sd-scripts log `loss/current`, `loss/average`, `lr/unet` to a
/// `logs/` folder: its folder and up to `MAX_SEARCH_DEPTH` levels below),
/// with the `ss_*` facts of its header (steps of how many, epochs, learning
/// rates, network dim and alpha, base model). Without events, a header that
/// says how many steps the run took is a curve of no records that the
/// step-count rules judge (`ss_steps` 5 is a run of 5 steps); else a skip
/// saying what the header holds.
fn lora_file_drift_input(file: &Path) -> DriftInput {
    use crate::formats::kohya_metadata::KohyaRun;
    let folder = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let input = DriftInput::new(file, layout::LORA_FILE, folder.to_path_buf());
    let header = crate::formats::safetensors_header::read_header(file);
    let run = header
        .as_ref()
        .ok()
        .and_then(|h| h.metadata.as_deref())
        .and_then(KohyaRun::of);
    const FROM: &str = "the LoRA file's ss_* header";
    let with_run = |mut curve: LossCurve| {
        if let Some(r) = &run {
            curve.settings = r.settings.clone();
            if let (Some(steps), Some(max), false) =
                (r.steps, r.max_train_steps, r.is_mid_run_save())
            {
                curve.side.progress = Some(RunProgress {
                    global_step: steps,
                    max_steps: max,
                });
                curve.progress_from = FROM.to_string();
            }
        }
        curve
    };
    let events = matches!(
        loss_log::detect_log_source(folder),
        Ok((loss_log::LogSource::TensorBoard, _))
    );
    if events {
        return input.read(loss_log::read_curve_from(folder, None).map(with_run));
    }
    let name = file.display();
    match &run {
        Some(r) if r.steps.is_some() && !r.is_mid_run_save() => {
            let curve = with_run(LossCurve {
                source: "kohya_metadata".to_string(),
                series: String::new(),
                ..LossCurve::default()
            });
            let mut input = input.read(Ok(curve));
            input.files = vec![file.to_path_buf()];
            input.note = Some(format!(
                "{name}: no training log beside it (no TensorBoard events in its folder);                  its header says it trained {} steps",
                r.steps.unwrap_or_default()
            ));
            input
        }
        _ => input.none(
            LogsStatus::NoLogsDir,
            format!(
                "{name} is a LoRA file with no training log beside it (no TensorBoard events                  in its folder){}",
                if run.is_some() {
                    ", and its ss_* header does not say how many steps it trained"
                } else {
                    " and no ss_* training facts in its header"
                }
            ),
        ),
    }
}

/// Most files of an mlx-lm adapter folder looked at for its training output.
const MAX_MLX_LOG_CANDIDATES: usize = 32;

/// The run of an mlx-lm adapter folder: the training output saved beside it
/// (a `*.log`, `*.txt` or `*.out` file holding its train reports; mlx-lm
/// keeps no log of its own), with the config's `iters` as the plan and its
/// rank, scale and `num_layers` as settings.
fn mlx_drift_input(dir: &Path) -> DriftInput {
    use crate::formats::logs::mlx_log;
    use crate::formats::mlx_config::MlxConfig;
    let input = DriftInput::new(dir, layout::MLX, dir.to_path_buf());
    let config = MlxConfig::read(&dir.join(layout::ADAPTER_CONFIG)).ok();
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.take(MAX_RUN_ENTRIES)
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    [".log", ".txt", ".out"].iter().any(|e| name.ends_with(e))
                        && read_once::is_file(p)
                })
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    let log = candidates
        .into_iter()
        .take(MAX_MLX_LOG_CANDIDATES)
        .find(|p| mlx_log::is_mlx_log(p));
    let Some(log) = log else {
        return input.none(
            LogsStatus::NoLogsDir,
            format!(
                "{} is an mlx-lm adapter: no training output saved beside it (mlx_lm.lora                  prints its losses; keep them with `mlx_lm.lora ... | tee train.log`)",
                dir.display()
            ),
        );
    };
    let planned = config.as_ref().and_then(|c| c.iters);
    let curve = mlx_log::read_mlx_log(&log, planned).map(|mut c| {
        if let Some(cfg) = &config {
            c.progress_from = "the log's last report, of the config's iters".to_string();
            let mut settings = vec![
                ("fine_tune_type".to_string(), cfg.fine_tune_type.clone()),
                ("rank".to_string(), cfg.rank.to_string()),
                ("scale".to_string(), cfg.scale.to_string()),
            ];
            if let Some(n) = cfg.num_layers {
                settings.push(("num_layers".to_string(), n.to_string()));
            }
            if let Some(n) = cfg.iters {
                settings.push(("iters".to_string(), n.to_string()));
            }
            if let Some(lr) = cfg.learning_rate {
                settings.push(("learning_rate".to_string(), lr.to_string()));
            }
            if let Some(m) = &cfg.model {
                settings.push(("model".to_string(), m.clone()));
            }
            c.settings = settings;
        }
        c
    });
    input.read(curve)
}

/// The newest tracker run kept inside a training output dir, read when the
/// run left no log of its own (see `layout::tracker_runs`).
fn tracker_run(store: &Path) -> Option<PathBuf> {
    layout::tracker_runs(store).pop()
}

fn dlm_drift_input(store: &Path) -> DriftInput {
    let logs_dir = store.join("logs");
    let mut input = DriftInput::new(store, layout::DLM, logs_dir.clone());
    if !read_once::is_dir(&logs_dir) {
        return input;
    }
    let read = dlm_log::train_logs_in(&logs_dir).and_then(|files| {
        input.files = files;
        if input.files.is_empty() {
            Ok(None)
        } else {
            dlm_log::read_loss_curve(&input.files).map(Some)
        }
    });
    match read {
        Ok(None) => input.status = LogsStatus::NoFiles,
        Ok(Some(curve)) => {
            input.status = LogsStatus::Curve;
            input.curve = Some(curve);
        }
        Err(e) => {
            input.status = LogsStatus::Failed;
            input.error = Some(e);
        }
    }
    input
}

/// Everything `gradient_ghost` needs about one adapter version: the state
/// or why it could not be read; for `rules="sway"` the layer grouping of the
/// seed (`grouping`, or `grouping_error`); for `rules="robust"` the exact
/// attribution of param ids to (layer, slot) (`attribution`, or why not in
/// `attribution_error`) and any failure to read the adapter weights' header
/// (`weights_error`). `optimizer` names what the state holds; `note` says
/// why the probe cannot judge this version (a bare adapter, an optimizer
/// without second moments).
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct GhostInput {
    pub adapter: PathBuf,
    pub layout: String,
    /// What the version holds: `adapter`, `full` or `logs`.
    pub checkpoint_kind: String,
    pub state: Option<TrainingState>,
    pub error: Option<Error>,
    pub grouping: Option<LayerGrouping>,
    pub grouping_error: Option<Error>,
    pub attribution: Option<Attribution>,
    pub attribution_error: Option<String>,
    pub weights_error: Option<Error>,
    pub optimizer: Option<String>,
    pub note: Option<String>,
}

impl GhostInput {
    fn new(adapter: &Path, layout: &str) -> GhostInput {
        GhostInput {
            adapter: adapter.to_path_buf(),
            layout: layout.to_string(),
            checkpoint_kind: checkpoint_kind(adapter, layout).to_string(),
            state: None,
            error: None,
            grouping: None,
            grouping_error: None,
            attribution: None,
            attribution_error: None,
            weights_error: None,
            optimizer: None,
            note: None,
        }
    }
}

/// The layout of a version given on its own: a Lightning `.ckpt`, an HF
/// checkpoint (its `optimizer.pt`, a full model or only a
/// `trainer_state.json`), else dlm (whose reader reports a missing
/// `training_state.pt` as such).
fn version_layout(adapter: &Path) -> &'static str {
    let hf_files = read_once::is_file(&adapter.join(layout::HF_OPTIMIZER))
        || read_once::is_file(&adapter.join(TRAINER_STATE))
        || model_files::holds_model(adapter);
    if adapter.extension().is_some_and(|e| e == "ckpt") {
        LIGHTNING
    } else if hf_files && !read_once::is_file(&adapter.join(torch_state::STATE_FILE)) {
        HF_TRAINER
    } else {
        layout::DLM
    }
}

pub fn ghost_input(adapter: &Path) -> GhostInput {
    ghost_input_for(adapter, version_layout(adapter))
}

pub fn ghost_input_for(adapter: &Path, layout: &str) -> GhostInput {
    let mut input = GhostInput::new(adapter, layout);
    match layout {
        PEFT => {
            input.note = Some(format!(
                "{} is a bare PEFT adapter: no optimizer state is saved with it, so gradients \
                 cannot be judged",
                adapter.display()
            ));
            return input;
        }
        HF_TRAINER if is_named_adapter(adapter) => {
            let parent = adapter.parent().unwrap_or(adapter);
            input.note = Some(format!(
                "{} is one of several adapters saved in {}: the optimizer state there is the \
                 trained adapter's and is judged with {}",
                adapter.display(),
                parent.display(),
                parent.display()
            ));
            return input;
        }
        HF_TRAINER if input.checkpoint_kind == LOGS && !has_optimizer(adapter) => {
            input.note = Some(format!(
                "log-only checkpoint: no weights and no optimizer state in {}",
                adapter.display()
            ));
            return input;
        }
        HF_TRAINER | LIGHTNING => {
            let opt = match optimizer_state::read_optimizer_state(adapter) {
                Ok(opt) => opt,
                Err(e) => {
                    input.error = Some(e);
                    return input;
                }
            };
            input.optimizer = Some(opt.optimizer.clone());
            if let Some(why) = &opt.no_second_moment {
                input.note = Some(format!(
                    "the optimizer ({}) keeps no second moment: {why}",
                    opt.optimizer
                ));
                return input;
            }
            let state = state_of(adapter, layout, &opt);
            if layout == LIGHTNING {
                let why = "a Lightning checkpoint stores the optimizer state without the \
                           adapter's tensor names, so ids cannot be tied to layers";
                input.grouping_error = Some(Error::new(Area::LayerGrouping, adapter, why));
                input.attribution_error = Some(why.to_string());
            } else if input.checkpoint_kind == FULL {
                attach_model(&mut input, adapter, &state, &opt.param_groups);
            } else if input.checkpoint_kind == LOGS {
                let why = "the checkpoint holds no weights beside its optimizer state, so ids \
                           cannot be tied to layers";
                input.grouping_error = Some(Error::new(Area::LayerGrouping, adapter, why));
                input.attribution_error = Some(why.to_string());
            } else {
                attach_adapter(&mut input, adapter, &state, &opt.param_groups);
            }
            input.state = Some(state);
        }
        _ => match torch_state::read_training_state(adapter) {
            Ok(state) => {
                input.optimizer = Some("adam".into());
                attach_adapter(&mut input, adapter, &state, &[]);
                input.state = Some(state);
            }
            Err(e) => input.error = Some(e),
        },
    }
    input
}

/// Whether `dir` is a named adapter of a multi-adapter save inside a
/// version (`<version>/<name>/`, see `layout::named_adapters`).
fn is_named_adapter(dir: &Path) -> bool {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let is_checkpoint =
        layout::checkpoint_step(name).is_some() || name == trainer_state::LAST_CHECKPOINT;
    !is_checkpoint
        && !has_optimizer(dir)
        && dir
            .parent()
            .is_some_and(|parent| layout::named_adapters(parent).iter().any(|a| a == dir))
}

fn has_optimizer(dir: &Path) -> bool {
    dir.join(layout::HF_OPTIMIZER).is_file()
}

/// A full fine-tune's tensor names (from `model.safetensors`, or the index
/// and its shards' headers) attributed to the optimizer's ids, in HF
/// Trainer's group order (weight decay, then no decay), exactly as for an
/// adapter. When that cannot be done the reason goes to
/// `attribution_error` (the probe reports the per-layer check as not done):
/// the optimizer state is still judged.
fn attach_model(input: &mut GhostInput, dir: &Path, state: &TrainingState, groups: &[Vec<i64>]) {
    let sway = "dlm-sway's layer grouping assumes layer-major adapter ids; a full model's \
                optimizer also holds its embeddings, norms and head";
    input.grouping_error = Some(Error::new(Area::LayerGrouping, dir, sway));
    let keys = match model_files::locate(dir) {
        Some(ModelFiles::Pickled(p)) => Err(format!(
            "the model is saved as {} (pickled; its tensor names are not read), so ids \
             cannot be tied to layers",
            p.file_name().unwrap_or_default().to_string_lossy()
        )),
        Some(files) => model_files::model_keys(&files)
            .map_err(|why| format!("cannot read the model's tensor names: {why}")),
        None => Err("no model weights beside the optimizer state".to_string()),
    };
    let params: Vec<(i64, Vec<u64>)> = state
        .per_param
        .iter()
        .map(|p| (p.param_id, p.shape.clone()))
        .collect();
    match keys.and_then(|keys| attribution::attribute_model(&keys, &params, groups)) {
        Ok(a) => input.attribution = Some(a),
        Err(why) => input.attribution_error = Some(why),
    }
}

/// The fields the ghost probe reads, from an HF or Lightning optimizer state
/// (HF's step count and epoch come from the checkpoint's trainer_state.json).
fn state_of(adapter: &Path, layout: &str, opt: &OptimizerState) -> TrainingState {
    let trainer = (layout == HF_TRAINER)
        .then(|| trainer_state::read_trainer_state(&adapter.join(TRAINER_STATE)).ok())
        .flatten();
    TrainingState {
        path: opt.path.clone(),
        global_step: trainer
            .as_ref()
            .map(|t| t.global_step)
            .or(opt.global_step)
            .unwrap_or(0),
        epoch: trainer.as_ref().and_then(|t| t.epoch).or(opt.epoch),
        best_val_loss: f64::NAN,
        use_qlora: false,
        per_param: opt.per_param.clone(),
        implausible: opt.implausible.clone(),
    }
}

/// The adapter's keys (from the safetensors header beside the state, or
/// the pickle of an `adapter_model.bin`): the seed's layer grouping and the
/// exact attribution.
fn attach_adapter(
    input: &mut GhostInput,
    adapter: &Path,
    state: &TrainingState,
    groups: &[Vec<i64>],
) {
    let weights = layers::adapter_weights_path(adapter);
    let header = if read_once::exists(&weights) {
        read_tensor_header(&weights)
    } else {
        Err(Error::new(
            Area::Missing,
            &weights,
            "adapter weights not found beside the optimizer state",
        ))
    };
    match header {
        Ok(header) => {
            let names = header.tensors.iter().map(|t| t.name.as_str());
            match layers::group_keys(names, Some(state.per_param.len() as u64)) {
                Ok(g) => input.grouping = Some(g),
                Err(msg) => {
                    input.grouping_error = Some(Error::new(Area::LayerGrouping, &weights, msg))
                }
            }
            let keys: Vec<(String, Vec<u64>)> = header
                .tensors
                .into_iter()
                .map(|t| (t.name, t.shape))
                .collect();
            let params: Vec<(i64, Vec<u64>)> = state
                .per_param
                .iter()
                .map(|p| (p.param_id, p.shape.clone()))
                .collect();
            match attribution::attribute_grouped(&keys, &params, groups) {
                Ok(a) => input.attribution = Some(a),
                Err(why) => input.attribution_error = Some(why),
            }
        }
        Err(e) => {
            let why = format!("adapter weights unreadable: {e}");
            input.grouping_error = Some(Error::new(Area::LayerGrouping, &weights, why));
            input.weights_error = Some(e);
        }
    }
}

/// What `adapter_weights` needs about one adapter version: its weights
/// report, or why it could not be read, or (`note`) why this layout has no
/// adapter to read.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct WeightsInput {
    pub adapter: PathBuf,
    pub layout: String,
    /// What the version holds: `adapter`, `full` or `logs`.
    pub checkpoint_kind: String,
    pub weights: Option<AdapterWeights>,
    pub error: Option<Error>,
    pub note: Option<String>,
}

pub fn weights_input(adapter: &Path) -> WeightsInput {
    weights_input_for(adapter, version_layout(adapter))
}

pub fn weights_input_for(adapter: &Path, layout: &str) -> WeightsInput {
    let mut input = WeightsInput {
        adapter: adapter.to_path_buf(),
        layout: layout.to_string(),
        checkpoint_kind: checkpoint_kind(adapter, layout).to_string(),
        weights: None,
        error: None,
        note: None,
    };
    if layout == LIGHTNING {
        input.note = Some(format!(
            "{} is a Lightning checkpoint: it holds the whole model's state_dict, not a PEFT \
             adapter (save one with save_pretrained to have its weights judged)",
            adapter.display()
        ));
        return input;
    }
    if let Some(note) = no_adapter_note(adapter, &input.checkpoint_kind, layout) {
        input.note = Some(note);
        return input;
    }
    match adapter_weights::read_adapter_weights(adapter) {
        Ok(w) => input.weights = Some(w),
        Err(e) => input.error = Some(e),
    }
    input
}

/// Whether a trainer's checkpoint directory kept its adapter's config but
/// no weights file at all (a run pushed without its large files): nothing
/// to judge, unlike a weights file that is there and unreadable.
fn weights_not_kept(version: &Path) -> bool {
    read_once::is_dir(version)
        && read_once::is_file(&version.join(crate::formats::adapter_config::CONFIG_FILE))
        && !read_once::exists(&version.join(layers::ADAPTER_WEIGHTS))
        && !read_once::exists(&version.join(PICKLED_ADAPTER))
        && !read_once::exists(&version.join(crate::formats::mlx_config::MLX_WEIGHTS))
}

/// Why a version has no adapter to judge: a full or log-only checkpoint, or
/// a trainer's checkpoint that kept no weights.
fn no_adapter_note(version: &Path, kind: &str, layout: &str) -> Option<String> {
    match kind {
        FULL => {
            let file = model_files::locate(version).map_or_else(String::new, |f| f.name());
            Some(format!(
                "full fine-tune checkpoint ({file}): no LoRA adapter to check; use --probes \
                 full_weights"
            ))
        }
        LOGS => Some("log-only checkpoint: no weights".to_string()),
        _ if layout != layout::DLM && weights_not_kept(version) => Some(format!(
            "{} holds adapter_config.json but no adapter weights ({}): they were not saved here \
             or not copied with the run; nothing to judge",
            version.display(),
            layers::ADAPTER_WEIGHTS
        )),
        _ => None,
    }
}

/// What `full_weights` needs about one version: the report of its model's
/// weights, or why it could not be read, or (`note`) why this version has
/// no model to read.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct FullWeightsInput {
    pub adapter: PathBuf,
    pub layout: String,
    /// What the version holds: `adapter`, `full` or `logs`.
    pub checkpoint_kind: String,
    /// The file naming the weights (`model.safetensors`, the index, ...).
    pub model_file: Option<PathBuf>,
    pub weights: Option<FullWeights>,
    pub error: Option<Error>,
    pub note: Option<String>,
}

pub fn full_weights_input(version: &Path) -> FullWeightsInput {
    full_weights_input_for(version, version_layout(version))
}

pub fn full_weights_input_for(version: &Path, layout: &str) -> FullWeightsInput {
    let kind = checkpoint_kind(version, layout);
    let mut input = FullWeightsInput {
        adapter: version.to_path_buf(),
        layout: layout.to_string(),
        checkpoint_kind: kind.to_string(),
        model_file: None,
        weights: None,
        error: None,
        note: None,
    };
    let files = match (layout, kind) {
        (LIGHTNING, _) => {
            input.note = Some(format!(
                "{} is a Lightning checkpoint, a pickled torch.save whose weights are not read \
                 (unpickling runs code); save the model with save_pretrained to have them checked",
                version.display()
            ));
            return input;
        }
        (_, LOGS) => {
            input.note = Some("log-only checkpoint: no weights".to_string());
            return input;
        }
        (_, FULL) => model_files::locate(version),
        _ => None,
    };
    let Some(files) = files else {
        input.note = Some(format!(
            "{} holds a LoRA adapter, not a full model: adapter_weights checks it",
            version.display()
        ));
        return input;
    };
    input.model_file = Some(files.path().to_path_buf());
    if let ModelFiles::Pickled(p) = &files {
        input.note = Some(format!(
            "full fine-tune checkpoint ({}): pickled torch weights are not read (unpickling \
             runs code); save with safetensors to have them checked",
            p.file_name().unwrap_or_default().to_string_lossy()
        ));
        return input;
    }
    match files
        .safetensors_files()
        .and_then(|shards| full_weights::read_full_weights(version, &shards))
    {
        Ok(w) => input.weights = Some(w),
        Err(e) => input.error = Some(e),
    }
    input
}

/// Probe inputs for one target.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct TargetInputs {
    pub store: PathBuf,
    pub layout: String,
    /// The store's kind (its newest version's; see `layout`).
    pub checkpoint_kind: Option<String>,
    pub drift: Option<DriftInput>,
    pub ghosts: Vec<GhostInput>,
    pub weights: Vec<WeightsInput>,
    pub full_weights: Vec<FullWeightsInput>,
    /// The GAP monitor's records in the store's logs (None: there are none).
    pub gap: Option<GapInput>,
    pub broken: Vec<(PathBuf, String)>,
}

/// Which probes a gathering pass reads inputs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub drift: bool,
    pub ghost: bool,
    pub weights: bool,
    pub full_weights: bool,
    pub gap: bool,
}

/// What gap_monitor reads of one store: the gap records of its logs, or
/// why they could not be read.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, Default)]
pub struct GapInput {
    pub log: Option<crate::formats::logs::gap_log::GapLog>,
    pub error: Option<Error>,
}

/// The GAP monitor's records in `<base>/logs/train-*.jsonl`; None when that
/// folder holds none (or cannot be read: `training_drift` reports why).
pub fn gap_input(base: &Path) -> Option<GapInput> {
    let files = monitor_logs(base)?;
    match crate::formats::logs::gap_log::read_gap_log(&files) {
        Ok(log) if !log.records.is_empty() => Some(GapInput {
            log: Some(log),
            error: None,
        }),
        _ => None,
    }
}

/// The inputs of one target (its versions read in parallel), each small
/// file read once for all the probes that want it (`io::read_once`).
pub fn gather(t: &Target, wanted: Wanted) -> TargetInputs {
    crate::io::read_once::for_one_store(|| gather_inputs(t, wanted))
}

fn gather_inputs(t: &Target, wanted: Wanted) -> TargetInputs {
    use crate::io::confine::carried;
    use rayon::prelude::*;
    let per_version = |on: bool| -> Vec<&PathBuf> {
        if on {
            t.versions.iter().collect()
        } else {
            vec![]
        }
    };
    TargetInputs {
        store: t.store.clone(),
        layout: t.layout.clone(),
        checkpoint_kind: t.checkpoint_kind.clone(),
        drift: (wanted.drift && t.with_logs).then(|| {
            let logs = t.log_root.as_deref().unwrap_or(&t.store);
            DriftInput {
                store: t.store.clone(),
                ..drift_input_for(logs, &t.layout)
            }
        }),
        // `carried`: each version is read under this target's root, on
        // whichever rayon thread picks it up.
        ghosts: per_version(wanted.ghost)
            .par_iter()
            .map(carried(|v: &&PathBuf| ghost_input_for(v, &t.layout)))
            .collect(),
        weights: per_version(wanted.weights)
            .par_iter()
            .map(carried(|v: &&PathBuf| weights_input_for(v, &t.layout)))
            .collect(),
        full_weights: per_version(wanted.full_weights)
            .par_iter()
            .map(carried(|v: &&PathBuf| full_weights_input_for(v, &t.layout)))
            .collect(),
        gap: if wanted.gap {
            gap_input(t.log_root.as_deref().unwrap_or(&t.store))
        } else {
            None
        },
        broken: t.broken.clone(),
    }
}
