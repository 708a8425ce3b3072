//! One reader for the optimizer states teams already have, without torch
//! and without running a pickle:
//!
//! - `torch.save(optimizer.state_dict())`: HF Trainer/TRL/axolotl's
//!   `checkpoint-N/optimizer.pt` (or the checkpoint directory);
//! - Lightning `*.ckpt`: `global_step`, `epoch` and `optimizer_states[0]`;
//! - dlm's `training_state.pt`: its `optimizer_state_dict`.
//!
//! Lightning checkpoints also pickle user classes (`hyper_parameters`,
//! `callbacks`, ...), so a `*.ckpt` is unpickled with placeholders for
//! globals outside the allow-list, and refused only when a placeholder sits
//! in the part read (`optimizer_states[0]`, `global_step`, `epoch`). Every
//! other file is unpickled strictly: any unknown global refuses it.
//!
//! The state walk recognises the optimizer from what it keeps per
//! parameter (see `second_moment` for the layouts) and reports, per
//! parameter, the mean and non-finite count of its second moment. An
//! optimizer that keeps none (SGD, ...) is not an error: `per_param` stays
//! empty and `no_second_moment` says why, so a probe can skip honestly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::analysis::second_moment::{
    check_slot, classify, Family, Layout, MomentReader, ParamStat,
};
use crate::error::{Area, Error, Result};
use crate::formats::pickle::{Id, UnknownGlobals, Value};
use crate::formats::torch_save::TorchSave;
use crate::io::sidecar;
use crate::store::plausibility::{self, plausible_step, Findings};

/// File names a checkpoint or adapter version directory may hold.
pub const HF_OPTIMIZER_FILE: &str = "optimizer.pt";
pub const DLM_STATE_FILE: &str = "training_state.pt";

/// What an optimizer state file says about the optimizer and its run.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerState {
    /// The file that was read.
    pub path: PathBuf,
    /// `"optimizer_state_dict"`, `"lightning"` or `"dlm"`.
    pub format: String,
    /// `"adam"`, `"bnb-8bit"`, `"bnb-32bit"`, `"adafactor"`, `"sgd"`, or
    /// `"unknown: keys [...]"` (the keys of the first parameter's state).
    pub optimizer: String,
    /// `"exp_avg_sq"`, `"bnb state2 (dequantized)"` or `"adafactor row/col"`;
    /// None when there is none.
    pub second_moment: Option<String>,
    /// One entry per parameter with state, ordered by param id; empty when
    /// the optimizer keeps no second moment.
    pub per_param: Vec<ParamStat>,
    /// Why `per_param` is empty, when the optimizer keeps no second moment
    /// (or no state at all).
    pub no_second_moment: Option<String>,
    /// The param ids of each param group, in group order.
    pub param_groups: Vec<Vec<i64>>,
    /// The trainer's step count where the file records one (Lightning's and
    /// dlm's `global_step`), else the largest per-parameter `step`; None when
    /// there is neither.
    pub global_step: Option<i64>,
    /// The trainer's epoch (Lightning, dlm); None for a bare state_dict.
    pub epoch: Option<f64>,
    /// Values no optimizer writes (a negative second moment, a first
    /// moment beyond Adam's bound, an impossible step), one sentence each
    /// (see `store::plausibility`); empty for a plausible state.
    pub implausible: Vec<String>,
}

/// Read an optimizer state: `path` is an `optimizer.pt`, a Lightning
/// `*.ckpt`, a dlm `training_state.pt`, or a directory holding
/// `optimizer.pt` or `training_state.pt`. A `<file>.sha256` beside the file
/// must match it.
pub fn read_optimizer_state(path: &Path) -> Result<OptimizerState> {
    let file = resolve(path)?;
    let unknown = if is_lightning_name(&file) {
        UnknownGlobals::Placeholder
    } else {
        UnknownGlobals::Refuse
    };
    sidecar::verified(&file, || {
        let ts = TorchSave::open(&file, unknown)?;
        read_payload(&ts)
    })
}

/// A `*.ckpt` file: unpickled with placeholders.
fn is_lightning_name(file: &Path) -> bool {
    file.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("ckpt"))
}

/// The state file `path` names: itself, or the one state file inside a
/// directory.
fn resolve(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(Area::TrainingState, path, &e))?;
    if !meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    let present: Vec<PathBuf> = [HF_OPTIMIZER_FILE, DLM_STATE_FILE]
        .iter()
        .map(|name| path.join(name))
        .filter(|p| p.exists())
        .collect();
    match present.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::new(
            Area::Missing,
            path,
            format!("holds neither {HF_OPTIMIZER_FILE} nor {DLM_STATE_FILE}"),
        )),
        _ => Err(Error::new(
            Area::TrainingState,
            path,
            format!("holds both {HF_OPTIMIZER_FILE} and {DLM_STATE_FILE}; pass the file to read"),
        )),
    }
}

fn read_payload(ts: &TorchSave) -> Result<OptimizerState> {
    let g = &ts.graph;
    let root = g.root;
    if g.dict_entries(root).is_none() {
        return Err(ts.err(format!(
            "payload is a {}, not an optimizer state dict or a checkpoint dict",
            g.get(root).kind()
        )));
    }
    let (format, state_dict, trainer) = if let Some(states) = g.dict_get(root, "optimizer_states") {
        ("lightning", lightning_optimizer(ts, states)?, true)
    } else if let Some(sd) = g.dict_get(root, "optimizer_state_dict") {
        ("dlm", sd, true)
    } else if g.dict_get(root, "state").is_some() && g.dict_get(root, "param_groups").is_some() {
        ("optimizer_state_dict", root, false)
    } else {
        return Err(ts.err(format!(
            "payload is neither an optimizer state_dict ('state', 'param_groups'), a \
             Lightning checkpoint ('optimizer_states') nor a dlm state \
             ('optimizer_state_dict'); keys: {}",
            g.dict_str_keys(root).join(", ")
        )));
    };
    // Placeholders are tolerated only where Lightning needs them; in any
    // other payload they mean a class the strict reader would refuse.
    let opaque = if format == "lightning" {
        g.find_opaque(state_dict)
    } else {
        g.any_opaque()
    };
    if let Some(class) = opaque {
        return Err(refused_class(ts, class, "the optimizer state"));
    }
    let (global_step, epoch) = if trainer {
        (
            optional_int(ts, root, "global_step")?,
            optional_float(ts, root, "epoch")?,
        )
    } else {
        (None, None)
    };
    let what = if format == "lightning" {
        "optimizer_states[0]"
    } else if format == "dlm" {
        "optimizer_state_dict"
    } else {
        "the optimizer state"
    };
    let summary = summarize(ts, state_dict, what, true)?;
    Ok(OptimizerState {
        path: ts.path().to_path_buf(),
        format: format.into(),
        optimizer: summary.optimizer,
        second_moment: summary.second_moment,
        per_param: summary.per_param,
        no_second_moment: summary.no_second_moment,
        param_groups: summary.param_groups,
        global_step: global_step.or(summary.max_step),
        epoch,
        implausible: summary.implausible,
    })
}

fn refused_class(ts: &TorchSave, class: &str, part: &str) -> Error {
    ts.err(format!(
        "{part} holds an instance of {class}, a class outside the allow-list (it was \
         neither imported nor run); refusing to read it"
    ))
    .with("global_name", class)
}

/// `optimizer_states[0]` of a Lightning checkpoint.
fn lightning_optimizer(ts: &TorchSave, states: Id) -> Result<Id> {
    let g = &ts.graph;
    match g.get(states) {
        Value::List(items) | Value::Tuple(items) => items.first().copied().ok_or_else(|| {
            ts.err(
                "optimizer_states is empty: the checkpoint was saved without optimizer \
                 state (e.g. save_weights_only=True or no optimizer configured)",
            )
        }),
        Value::Opaque(class) => Err(refused_class(ts, class, "optimizer_states")),
        other => Err(ts.err(format!(
            "optimizer_states is a {}, not a list",
            other.kind()
        ))),
    }
}

fn optional_int(ts: &TorchSave, dict: Id, key: &str) -> Result<Option<i64>> {
    let g = &ts.graph;
    match g.dict_get(dict, key).map(|id| g.get(id)) {
        None | Some(Value::None) => Ok(None),
        Some(Value::Int(i)) => Ok(Some(*i)),
        Some(Value::Opaque(class)) => Err(refused_class(ts, class, key)),
        Some(other) => Err(ts.err(format!("{key} is a {}, not an int", other.kind()))),
    }
}

fn optional_float(ts: &TorchSave, dict: Id, key: &str) -> Result<Option<f64>> {
    let g = &ts.graph;
    match g.dict_get(dict, key).map(|id| g.get(id)) {
        None | Some(Value::None) => Ok(None),
        Some(Value::Float(f)) => Ok(Some(*f)),
        Some(Value::Int(i)) => Ok(Some(*i as f64)),
        Some(Value::Opaque(class)) => Err(refused_class(ts, class, key)),
        Some(other) => Err(ts.err(format!("{key} is a {}, not a float", other.kind()))),
    }
}

/// What the walk of one optimizer state_dict found.
#[derive(Debug)]
pub struct Summary {
    pub optimizer: String,
    pub second_moment: Option<String>,
    pub no_second_moment: Option<String>,
    pub per_param: Vec<ParamStat>,
    pub param_groups: Vec<Vec<i64>>,
    /// Largest per-parameter `step` (when steps were asked for).
    pub max_step: Option<i64>,
    /// The first parameter whose state has no second moment, and its keys.
    pub without_second_moment: Option<(i64, String)>,
    /// What no optimizer writes (see `store::plausibility`).
    pub implausible: Vec<String>,
}

/// Walk the optimizer state_dict `sd` (`what` names it in messages):
/// param groups, the optimizer, per-parameter second moments and, when
/// `read_steps`, the largest per-parameter step.
pub fn summarize(ts: &TorchSave, sd: Id, what: &str, read_steps: bool) -> Result<Summary> {
    let g = &ts.graph;
    if g.dict_entries(sd).is_none() {
        return Err(ts.err(format!("{what} is a {}, not a dict", g.get(sd).kind())));
    }
    let state = g.dict_get(sd, "state").ok_or_else(|| {
        ts.err(format!(
            "{what} has no 'state' (keys: {})",
            g.dict_str_keys(sd).join(", ")
        ))
    })?;
    let entries = g.dict_entries(state).ok_or_else(|| {
        ts.err(format!(
            "{what}['state'] is a {}, not a dict",
            g.get(state).kind()
        ))
    })?;
    // Last duplicate wins, as in a Python dict; BTreeMap orders by id.
    let mut by_id: BTreeMap<i64, Id> = BTreeMap::new();
    for (k, v) in entries {
        match g.get(*k) {
            Value::Int(id) => {
                by_id.insert(*id, *v);
            }
            other => {
                return Err(ts.err(format!(
                    "optimizer state key is a {}, not an int param id",
                    other.kind()
                )))
            }
        }
    }
    let param_groups = param_groups(ts, sd, what)?;
    let mut layouts: Vec<(i64, Layout<'_>)> = Vec::with_capacity(by_id.len());
    let mut max_step: Option<f64> = None;
    let mut step_bytes = Vec::new();
    let mut steps: HashMap<i64, f64> = HashMap::new();
    let mut findings = Findings::default();
    for (&param_id, &slot) in &by_id {
        check_slot(g, slot, param_id).map_err(|m| ts.err(m))?;
        layouts.push((
            param_id,
            classify(g, slot, param_id).map_err(|m| ts.err(m))?,
        ));
        // A malformed step is an error where the step is used; elsewhere
        // (dlm keeps its own global_step) it is only checked when numeric.
        let step = if read_steps {
            step_of(ts, slot, param_id, &mut step_bytes)?
        } else {
            step_of(ts, slot, param_id, &mut step_bytes).unwrap_or(None)
        };
        match step {
            Some(step) if !plausible_step(step) => findings.push(format!(
                "param {param_id}: step is {step}, which no optimizer counts to"
            )),
            Some(step) => {
                steps.insert(param_id, step);
                if read_steps {
                    max_step = Some(max_step.map_or(step, |m: f64| m.max(step)));
                }
            }
            None => {}
        }
    }
    let family = common_family(ts, &layouts)?;
    // Adam's float32 second moments come back reduced by the same pass.
    let reduced = if family == Some(Family::Adam) {
        plausibility::check_adam(ts, sd, &by_id, &steps, &mut findings)?
    } else {
        HashMap::new()
    };
    let implausible = findings.into_vec();
    let max_step = max_step.map(|s| s as i64);
    let without_second_moment = layouts
        .iter()
        .find(|(_, l)| {
            matches!(
                l,
                Layout::BnbOneState { .. } | Layout::Momentum | Layout::Unknown
            )
        })
        .map(|(id, _)| {
            let keys = by_id
                .get(id)
                .map(|&slot| g.dict_str_keys(slot).join(", "))
                .unwrap_or_default();
            (*id, keys)
        });
    let first_keys = || {
        by_id
            .values()
            .next()
            .map(|&slot| g.dict_str_keys(slot).join(", "))
            .unwrap_or_default()
    };
    let Some(family) = family else {
        let sgd_group = param_groups_look_like_sgd(ts, sd);
        return Ok(Summary {
            optimizer: if sgd_group {
                "sgd".into()
            } else {
                "unknown: keys []".into()
            },
            second_moment: None,
            no_second_moment: Some(
                "the optimizer state holds no per-parameter entries (the optimizer never \
                 stepped, or keeps no state, e.g. SGD without momentum)"
                    .into(),
            ),
            per_param: Vec::new(),
            param_groups,
            max_step,
            without_second_moment,
            implausible,
        });
    };
    let eight_bit = layouts.iter().any(|(_, l)| {
        matches!(
            l,
            Layout::BnbBlockwise { .. } | Layout::BnbOneState { eight_bit: true }
        )
    });
    let bnb_name = if eight_bit { "bnb-8bit" } else { "bnb-32bit" };
    let (optimizer, second_moment, no_second_moment) = match family {
        Family::Adam => ("adam".to_owned(), Some("exp_avg_sq"), None),
        Family::Bitsandbytes => (bnb_name.to_owned(), Some("bnb state2 (dequantized)"), None),
        Family::Adafactor => ("adafactor".to_owned(), Some("adafactor row/col"), None),
        Family::BitsandbytesOneState => (
            bnb_name.to_owned(),
            None,
            Some(
                "a bitsandbytes one-state optimizer (state1 only, e.g. Lion, SGD or RMSprop) \
                 keeps no second moment"
                    .to_owned(),
            ),
        ),
        Family::Sgd => (
            "sgd".to_owned(),
            None,
            Some("SGD keeps only momentum_buffer: there is no second moment to read".to_owned()),
        ),
        Family::Unknown => {
            let keys = first_keys();
            (
                format!("unknown: keys [{keys}]"),
                None,
                Some(format!(
                    "the optimizer state (keys [{keys}]) holds no second moment this reader \
                     knows (exp_avg_sq, bitsandbytes state2, Adafactor's factors)"
                )),
            )
        }
    };
    let mut per_param = Vec::new();
    if no_second_moment.is_none() {
        per_param.reserve(layouts.len());
        let mut reader = MomentReader::with_reduced(ts, reduced);
        for (param_id, layout) in &layouts {
            if let Some(stat) = reader.stat(*param_id, layout)? {
                per_param.push(stat);
            }
        }
    }
    Ok(Summary {
        optimizer,
        second_moment: second_moment.map(str::to_owned),
        no_second_moment,
        per_param,
        param_groups,
        max_step,
        without_second_moment,
        implausible,
    })
}

/// The one family all parameters' layouts belong to (None without
/// parameters); a mix is an error.
fn common_family(ts: &TorchSave, layouts: &[(i64, Layout<'_>)]) -> Result<Option<Family>> {
    let Some((first_id, first)) = layouts.first() else {
        return Ok(None);
    };
    let family = first.family();
    match layouts.iter().find(|(_, l)| l.family() != family) {
        None => Ok(Some(family)),
        Some((id, other)) => Err(ts.err(format!(
            "the optimizer state mixes layouts: param {first_id} is {} but param {id} is {}; \
             one optimizer does not write both",
            family.describe(),
            other.family().describe()
        ))),
    }
}

/// The ids of each param group. A state without `param_groups` (dlm
/// test payloads) has none; a malformed one is an error.
fn param_groups(ts: &TorchSave, sd: Id, what: &str) -> Result<Vec<Vec<i64>>> {
    let g = &ts.graph;
    let Some(groups) = g.dict_get(sd, "param_groups") else {
        return Ok(Vec::new());
    };
    let groups = match g.get(groups) {
        Value::List(items) | Value::Tuple(items) => items,
        other => {
            return Err(ts.err(format!(
                "{what}['param_groups'] is a {}, not a list",
                other.kind()
            )))
        }
    };
    let mut out = Vec::with_capacity(groups.len());
    for (i, &group) in groups.iter().enumerate() {
        let params = g.dict_get(group, "params").map(|id| g.get(id));
        let ids = match params {
            Some(Value::List(ids)) | Some(Value::Tuple(ids)) => ids,
            _ => {
                return Err(ts.err(format!(
                    "param group {i} of {what} has no 'params' list of ids"
                )))
            }
        };
        let ids = ids
            .iter()
            .map(|&id| match g.get(id) {
                Value::Int(i) => Ok(*i),
                other => Err(ts.err(format!(
                    "param group {i} of {what} lists a {} among its param ids",
                    other.kind()
                ))),
            })
            .collect::<Result<Vec<i64>>>()?;
        out.push(ids);
    }
    Ok(out)
}

/// Whether the first param group carries SGD's hyperparameters.
fn param_groups_look_like_sgd(ts: &TorchSave, sd: Id) -> bool {
    let g = &ts.graph;
    let first = match g.dict_get(sd, "param_groups").map(|id| g.get(id)) {
        Some(Value::List(items)) | Some(Value::Tuple(items)) => items.first().copied(),
        _ => None,
    };
    first.is_some_and(|group| {
        ["momentum", "dampening", "nesterov"]
            .iter()
            .all(|k| g.dict_get(group, k).is_some())
    })
}

/// The `step` of one parameter's state: an int (bitsandbytes,
/// transformers' Adafactor) or a one-element tensor (torch >= 2.0).
fn step_of(ts: &TorchSave, slot: Id, param_id: i64, scratch: &mut Vec<u8>) -> Result<Option<f64>> {
    let g = &ts.graph;
    let what = format!("step of param {param_id}");
    let step = match g.dict_get(slot, "step").map(|id| g.get(id)) {
        None => return Ok(None),
        Some(Value::Int(i)) => *i as f64,
        Some(Value::Float(f)) => *f,
        Some(Value::Tensor(t)) => ts.scalar(t, &what, scratch)?,
        Some(other) => return Err(ts.err(format!("{what} is a {}, not a number", other.kind()))),
    };
    Ok(Some(step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::torch_save::test_support::{
        insert_before_stop, replace_after, text, with_edited_pickle,
    };
    use serde_json::Value as Json;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/testdata/optim")
    }

    fn expected(name: &str) -> Json {
        let text = std::fs::read_to_string(fixtures().join(name).join("expected.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn json_f64(v: &Json) -> f64 {
        match v {
            Json::String(s) if s == "NaN" => f64::NAN,
            Json::String(s) if s == "Infinity" => f64::INFINITY,
            Json::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
            other => other.as_f64().unwrap(),
        }
    }

    fn close(got: f64, want: f64, rel: f64) -> bool {
        (got.is_nan() && want.is_nan()) || got == want || (got - want).abs() <= rel * want.abs()
    }

    /// Every field of `state` against the fixture's expected.json.
    fn check_against_expected(name: &str, state: &OptimizerState) {
        let want = expected(name);
        assert_eq!(state.format, want["format"].as_str().unwrap(), "{name}");
        assert_eq!(
            state.optimizer,
            want["optimizer"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(
            state.second_moment.as_deref(),
            want["second_moment"].as_str(),
            "{name}"
        );
        assert_eq!(state.global_step, want["global_step"].as_i64(), "{name}");
        assert_eq!(state.epoch, want["epoch"].as_f64(), "{name}");
        let groups: Vec<Vec<i64>> = serde_json::from_value(want["param_groups"].clone()).unwrap();
        assert_eq!(state.param_groups, groups, "{name}");
        let per_param = want["per_param"].as_array().unwrap();
        assert_eq!(state.per_param.len(), per_param.len(), "{name}");
        assert_eq!(
            state.no_second_moment.is_some(),
            per_param.is_empty(),
            "{name}"
        );
        for (got, want) in state.per_param.iter().zip(per_param) {
            let what = format!("{name} param {}", got.param_id);
            assert_eq!(got.param_id, want["param_id"].as_i64().unwrap(), "{what}");
            assert_eq!(got.numel, want["numel"].as_u64().unwrap(), "{what}");
            let shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).unwrap();
            assert_eq!(got.shape, shape, "{what}");
            assert_eq!(got.nonfinite, want["nonfinite"].as_u64().unwrap(), "{what}");
            let mean = json_f64(&want["mean"]);
            assert!(
                close(got.exp_avg_sq_mean, mean, 1e-12),
                "{what}: mean {} vs {mean}",
                got.exp_avg_sq_mean
            );
            // bitsandbytes' own dequantization rounds each value to f32.
            if let Some(bnb) = want.get("bnb_dequantize_blockwise_mean") {
                let bnb = json_f64(bnb);
                assert!(
                    close(got.exp_avg_sq_mean, bnb, 1e-6),
                    "{what}: {} vs bitsandbytes {bnb}",
                    got.exp_avg_sq_mean
                );
            }
        }
    }

    const FILES: [(&str, &str); 12] = [
        ("hf_lora", "checkpoint-3"),
        ("hf_bias_all", "checkpoint-3/optimizer.pt"),
        ("hf_modules_to_save", "checkpoint-3"),
        ("hf_gpt2", "checkpoint-3/optimizer.pt"),
        ("hf_gpt2_bias_all", "checkpoint-3/optimizer.pt"),
        ("lightning", "last.ckpt"),
        ("bnb_adamw8bit", "optimizer.pt"),
        ("bnb_adamw32bit", "optimizer.pt"),
        ("dlm_bnb8", "training_state.pt"),
        ("adafactor_hf", "optimizer.pt"),
        ("adafactor_torch", "optimizer.pt"),
        ("sgd", ""),
    ];

    #[test]
    fn real_states_match_what_their_libraries_computed() {
        for (name, rel) in FILES {
            let path = fixtures().join(name).join(rel);
            let state = read_optimizer_state(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            check_against_expected(name, &state);
            // Real optimizers never write what the plausibility checks flag.
            assert!(
                state.implausible.is_empty(),
                "{name}: {:?}",
                state.implausible
            );
        }
    }

    #[test]
    fn the_reported_path_is_the_file_read() {
        let dir = fixtures().join("hf_lora/checkpoint-3");
        let state = read_optimizer_state(&dir).unwrap();
        assert_eq!(state.path, dir.join(HF_OPTIMIZER_FILE));
    }

    #[test]
    fn optimizers_without_a_second_moment_are_skipped_not_failed() {
        let state = read_optimizer_state(&fixtures().join("sgd")).unwrap();
        assert_eq!(state.optimizer, "sgd");
        assert!(state.per_param.is_empty());
        let why = state.no_second_moment.unwrap();
        assert!(
            why.contains("SGD") && why.contains("momentum_buffer"),
            "{why}"
        );
        // dlm's reader has no way to say "no second moment": it refuses.
        let e =
            crate::store::torch_state::read_training_state(&fixtures().join("sgd/optimizer.pt"))
                .unwrap_err();
        assert_eq!(e.area, Area::TrainingState);
    }

    #[test]
    fn lightning_checkpoints_are_read_strictly_unless_named_ckpt() {
        let dir = tempfile::tempdir().unwrap();
        let as_pt = dir.path().join("last.pt");
        std::fs::copy(fixtures().join("lightning/last.ckpt"), &as_pt).unwrap();
        // The model's state_dict (BUILD state on an OrderedDict) and the
        // user class in hyper_parameters are both refused.
        assert!(read_optimizer_state(&as_pt).is_err());
    }

    /// A copy of the Lightning fixture whose root dict gets `key = value`
    /// (pickle opcodes) after everything else.
    fn lightning_with(dir: &Path, key: &str, value: &[u8]) -> PathBuf {
        let src = fixtures().join("lightning/last.ckpt");
        with_edited_pickle(&src, dir, "edited.ckpt", |pkl| {
            let mut ops = text(key);
            ops.extend(value);
            ops.push(b's');
            insert_before_stop(pkl, &ops);
        })
    }

    const EVIL: &[u8] = b"cevil_module\nEvil\n)\x81";

    #[test]
    fn lightning_refuses_placeholders_in_the_parts_it_reads() {
        let dir = tempfile::tempdir().unwrap();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("optimizer_states", b"]".to_vec(), "is empty"),
            ("optimizer_states", EVIL.to_vec(), "evil_module.Evil"),
            ("global_step", EVIL.to_vec(), "evil_module.Evil"),
            ("epoch", EVIL.to_vec(), "evil_module.Evil"),
            ("optimizer_states", b"N".to_vec(), "not a list"),
            // An opaque value deep inside optimizer_states[0].
            (
                "optimizer_states",
                [
                    b"]}".as_slice(),
                    &text("state"),
                    b"}s",
                    &text("param_groups"),
                    b"]}",
                    &text("params"),
                    b"]s",
                    &text("extra"),
                    b"]",
                    EVIL,
                    b"as", // extra = [Evil]
                    b"as", // param_groups = [{'params': [], 'extra': [Evil]}]
                    b"a",  // [{'state': {}, 'param_groups': [...]}]
                ]
                .concat(),
                "evil_module.Evil",
            ),
        ];
        for (key, value, needle) in cases {
            let path = lightning_with(dir.path(), key, &value);
            let e = read_optimizer_state(&path).unwrap_err();
            assert_eq!(e.area, Area::TrainingState, "{key}: {e}");
            assert!(e.message.contains(needle), "{key}: {e}");
            if needle.contains("Evil") {
                assert!(
                    e.details
                        .contains(&("global_name", "evil_module.Evil".into())),
                    "{e:?}"
                );
            }
        }
        // The same class where nothing is read from it is fine.
        let path = lightning_with(dir.path(), "hyper_parameters", EVIL);
        let state = read_optimizer_state(&path).unwrap();
        check_against_expected("lightning", &state);
    }

    #[test]
    fn placeholder_mode_keeps_every_cap() {
        let dir = tempfile::tempdir().unwrap();
        // Nesting deeper than the MARK cap inside hyper_parameters.
        let marks = vec![b'('; 5000];
        let path = lightning_with(dir.path(), "hyper_parameters", &marks);
        let e = read_optimizer_state(&path).unwrap_err();
        assert!(e.message.contains("MARK"), "{e}");
        // 300k nested lists as optimizer_states: walked without recursion.
        let depth = 300_000;
        let mut nested = vec![b']'; depth];
        nested.extend(std::iter::repeat_n(b'a', depth - 1));
        let path = lightning_with(dir.path(), "optimizer_states", &nested);
        let e = read_optimizer_state(&path).unwrap_err();
        assert!(e.message.contains("not a dict"), "{e}");
        // A sharing bomb: 200 tuples each holding the previous one twice
        // (2^200 leaves if expanded), with a placeholder at the bottom.
        let mut bomb = b"]".to_vec();
        bomb.extend(EVIL);
        bomb.extend(b"2\x86".repeat(200));
        bomb.push(b'a');
        let path = lightning_with(dir.path(), "optimizer_states", &bomb);
        let e = read_optimizer_state(&path).unwrap_err();
        assert!(e.message.contains("evil_module.Evil"), "{e}");
    }

    #[test]
    fn other_payloads_stay_strict_even_as_ckpt() {
        let dir = tempfile::tempdir().unwrap();
        let src = fixtures().join("hf_lora/checkpoint-3/optimizer.pt");
        let inject = |name: &str| {
            with_edited_pickle(&src, dir.path(), name, |pkl| {
                let mut ops = text("extra");
                ops.extend(EVIL);
                ops.push(b's');
                insert_before_stop(pkl, &ops);
            })
        };
        let e = read_optimizer_state(&inject("optimizer.pt")).unwrap_err();
        assert_eq!(e.area, Area::UnsafePickle, "{e}");
        assert!(e
            .details
            .contains(&("global_name", "evil_module.Evil".into())));
        let e = read_optimizer_state(&inject("renamed.ckpt")).unwrap_err();
        assert_eq!(e.area, Area::TrainingState, "{e}");
        assert!(e.message.contains("evil_module.Evil"), "{e}");
    }

    #[test]
    fn lying_bitsandbytes_states_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let src = fixtures().join("bnb_adamw8bit/optimizer.pt");
        // absmax2 of param 0 (4096 codes, 16 blocks) shrunk to 15 entries.
        let path = with_edited_pickle(&src, dir.path(), "absmax.pt", |pkl| {
            replace_after(pkl, b"absmax2", b"K\x10\x85", b"K\x0f\x85")
        });
        let e = read_optimizer_state(&path).unwrap_err();
        assert_eq!(e.area, Area::TrainingState);
        assert!(
            e.message.contains("absmax2 of param 0 has 15 entries"),
            "{e}"
        );
        assert!(e.details.contains(&("absmax_len", "15".into())));
        // A quantization map of 255 entries.
        let path = with_edited_pickle(&src, dir.path(), "qmap.pt", |pkl| {
            replace_after(pkl, b"qmap2", b"M\x00\x01\x85", b"M\xff\x00\x85")
        });
        let e = read_optimizer_state(&path).unwrap_err();
        assert!(e.message.contains("has 255 entries"), "{e}");
        assert!(e.message.contains("256"), "{e}");
        // Codes that are not contiguous (a transposed view) are refused.
        let path = with_edited_pickle(&src, dir.path(), "stride.pt", |pkl| {
            // state2 of param 0: size (64, 64), stride (64, 1) → (1, 64).
            replace_after(pkl, b"state2", b"K@K\x01\x86", b"K\x01K@\x86")
        });
        let e = read_optimizer_state(&path).unwrap_err();
        assert!(e.message.contains("not a contiguous tensor"), "{e}");
    }

    #[test]
    fn mismatched_adafactor_factors_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let src = fixtures().join("adafactor_hf/optimizer.pt");
        // exp_avg_sq_col of param 2 (2, 12) claims (1, 12): its batch no
        // longer matches the row factor's (2, 8).
        let path = with_edited_pickle(&src, dir.path(), "col.pt", |pkl| {
            replace_after(pkl, b"exp_avg_sq_col", b"K\x02K\x0c\x86", b"K\x01K\x0c\x86")
        });
        let e = read_optimizer_state(&path).unwrap_err();
        assert!(e.message.contains("not the row and column factors"), "{e}");
    }

    #[test]
    fn dlm_reader_accepts_bitsandbytes_through_the_shared_walk() {
        let want = expected("dlm_bnb8");
        let path = fixtures().join("dlm_bnb8/training_state.pt");
        let dlm = crate::store::torch_state::read_training_state(&path).unwrap();
        assert_eq!(dlm.global_step, 30);
        assert_eq!(dlm.epoch, Some(1.5));
        assert_eq!(dlm.best_val_loss, 2.25);
        assert!(dlm.use_qlora);
        let state = read_optimizer_state(&path).unwrap();
        assert_eq!(dlm.per_param, state.per_param);
        assert_eq!(state.global_step, want["global_step"].as_i64());
        // The sidecar guards both readers.
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(DLM_STATE_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 100;
        bytes[last] ^= 1;
        std::fs::write(&copy, bytes).unwrap();
        std::fs::copy(
            fixtures().join("dlm_bnb8/training_state.pt.sha256"),
            dir.path().join("training_state.pt.sha256"),
        )
        .unwrap();
        assert_eq!(
            read_optimizer_state(dir.path()).unwrap_err().area,
            Area::Integrity
        );
        assert_eq!(
            crate::store::torch_state::read_training_state(dir.path())
                .unwrap_err()
                .area,
            Area::Integrity
        );
    }

    #[test]
    fn truncated_and_lying_real_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        for (name, rel) in [
            ("bnb_adamw8bit", "optimizer.pt"),
            ("adafactor_torch", "optimizer.pt"),
            ("lightning", "last.ckpt"),
        ] {
            let bytes = std::fs::read(fixtures().join(name).join(rel)).unwrap();
            let cut = dir.path().join(rel);
            for n in (0..bytes.len()).step_by(bytes.len() / 61 + 1) {
                std::fs::write(&cut, &bytes[..n]).unwrap();
                let e = read_optimizer_state(&cut).unwrap_err();
                assert_eq!(e.area, Area::TrainingState, "{name} cut at {n}: {e}");
            }
        }
        // The central directory claims data.pkl runs far past the file.
        let mut bytes = std::fs::read(fixtures().join("sgd/optimizer.pt")).unwrap();
        let name = b"optimizer/data.pkl";
        let cd_name = bytes.windows(name.len()).rposition(|w| w == name).unwrap();
        let entry = cd_name - 46;
        assert_eq!(&bytes[entry..entry + 4], b"PK\x01\x02");
        for field in [entry + 20, entry + 24] {
            bytes[field..field + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
        }
        let lying = dir.path().join("lying.pt");
        std::fs::write(&lying, bytes).unwrap();
        let e = read_optimizer_state(&lying).unwrap_err();
        assert!(e.message.contains("past the end"), "{e}");
    }

    #[test]
    fn directories_resolve_to_their_one_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_optimizer_state(dir.path()).unwrap_err();
        assert_eq!(e.area, Area::Missing);
        for name in [HF_OPTIMIZER_FILE, DLM_STATE_FILE] {
            std::fs::copy(fixtures().join("sgd/optimizer.pt"), dir.path().join(name)).unwrap();
        }
        let e = read_optimizer_state(dir.path()).unwrap_err();
        assert!(e.message.contains("both"), "{e}");
    }
}
