use std::path::PathBuf;

use super::*;
use crate::analysis::adapter_weights::{ConfigSummary, LayerEnergy, TensorStats};
use crate::{Area, Error};

fn module(name: &str, layer: u64, delta: f64) -> LoraModuleStats {
    LoraModuleStats {
        name: name.to_string(),
        layer: Some(layer),
        kind: "linear".into(),
        rank: 8,
        in_features: 64,
        out_features: 64,
        dtype_a: "F32".into(),
        dtype_b: "F32".into(),
        alpha: Some(16.0),
        scale: Some(2.0),
        norm_a: 1.0,
        norm_b: delta,
        max_abs_a: 0.1,
        max_abs_b: 0.1,
        nonfinite_a: 0,
        nonfinite_b: 0,
        delta_fro: Some(delta),
        singular_values: vec![],
        stable_rank: 1.5,
        effective_rank: 2.0,
        rank_used: Some(if delta == 0.0 { 0 } else { 4 }),
        magnitude_norm: None,
        magnitude_nonfinite: 0,
    }
}

fn config() -> ConfigSummary {
    ConfigSummary {
        path: PathBuf::from("/a/adapter_config.json"),
        peft_type: Some("LORA".into()),
        r: 8,
        lora_alpha: 16.0,
        use_rslora: false,
        use_dora: false,
        fan_in_fan_out: false,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
        target_modules_is_regex: false,
        modules_to_save: vec![],
        base_model_name_or_path: None,
        rank_pattern: vec![],
        alpha_pattern: vec![],
        init_lora_weights: "true".into(),
        merged_linear: false,
        format: "peft".to_string(),
    }
}

fn weights(deltas: &[f64]) -> AdapterWeights {
    let modules: Vec<LoraModuleStats> = deltas
        .iter()
        .enumerate()
        .map(|(i, &d)| module(&format!("model.layers.{i}.q_proj"), i as u64, d))
        .collect();
    let layers = modules
        .iter()
        .map(|m| LayerEnergy {
            layer: m.layer.unwrap_or(0),
            modules: 1,
            delta_fro_sq: m.delta_fro.unwrap_or(0.0).powi(2),
        })
        .collect();
    AdapterWeights {
        path: PathBuf::from("/store/v0001/adapter_model.safetensors"),
        config: Some(config()),
        modules,
        other_tensors: vec![],
        layers,
        tensor_bytes: 4096,
        nonfinite_total: 0,
        unformed_modules: vec![],
    }
}

fn input(w: Option<AdapterWeights>) -> WeightsInput {
    WeightsInput {
        adapter: PathBuf::from("/store/v0001"),
        layout: "dlm".into(),
        checkpoint_kind: "adapter".into(),
        weights: w,
        error: None,
        note: None,
    }
}

fn options() -> WeightsOptions {
    WeightsOptions {
        rules: "robust".into(),
        dead_relative_norm: 1e-6,
        max_top_share: 0.9,
        min_modules_for_share: 8,
    }
}

fn judge(w: AdapterWeights) -> Judged {
    judge_weights(&input(Some(w)), None, &options())
}

#[test]
fn ranks_from_rank_pattern_are_each_modules_own() {
    // `r` is 8, but rank_pattern gave the modules ranks 26 and 45 (what our
    // extractor, AdaLoRA and PEFT write): "used 25-45 of 8" made no sense.
    let mut w = weights(&[1.0, 2.0]);
    for (m, (rank, used)) in w.modules.iter_mut().zip([(26, 25), (45, 45)]) {
        m.rank = rank;
        m.rank_used = Some(used);
    }
    let j = judge(w);
    assert!(
        j.message
            .ends_with("rank used 25-45 of 26-45 (rank_pattern)"),
        "{}",
        j.message
    );
    let Some(Value::Map(nominal)) = j.evidence.get("rank_nominal") else {
        panic!("no rank_nominal")
    };
    assert_eq!(nominal.get("max"), Some(&Value::from(45u64)));
}

#[test]
fn healthy_adapter_passes_with_a_summary() {
    let j = judge(weights(&[1.0, 2.0, 2.0, 3.0]));
    assert_eq!(j.verdict, Verdict::Pass);
    assert_eq!(j.score, Some(1.0));
    assert_eq!(
        j.message,
        "4 LoRA modules in 4 layers, ||dW|| 4.243, rank used 4-4 of 8"
    );
    let keys: Vec<&str> = j.evidence.0.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(
        keys,
        [
            "rules",
            "num_modules",
            "num_other_tensors",
            "tensor_bytes",
            "config",
            "total_delta_fro",
            "layer_delta_energy",
            "top_modules",
            "dead_modules",
            "rank_configured",
            "rank_nominal",
            "rank_used",
            "stable_rank_median",
            "factor_scale_median",
            "factor_init",
            "findings"
        ]
    );
    // Sorted by energy, largest first, ties in module order.
    let Some(Value::List(top)) = j.evidence.get("top_modules") else {
        panic!("no top_modules")
    };
    let names: Vec<_> = top
        .iter()
        .filter_map(|t| match t {
            Value::Map(m) => m.get("module").cloned(),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        [
            Value::from("model.layers.3.q_proj"),
            Value::from("model.layers.1.q_proj"),
            Value::from("model.layers.2.q_proj"),
            Value::from("model.layers.0.q_proj"),
        ]
    );
}

#[test]
fn note_error_and_missing_config() {
    let mut i = input(None);
    i.note = Some("a note".into());
    let j = judge_weights(&i, None, &options());
    assert_eq!((j.verdict, j.message.as_str()), (Verdict::Skip, "a note"));

    let mut i = input(None);
    i.error = Some(Error::new(Area::Missing, "/x//y/", "no such file"));
    let j = judge_weights(&i, None, &options());
    assert_eq!(j.verdict, Verdict::Error);
    // The probe's name is not repeated: the table shows it beside the message.
    assert_eq!(j.message, "/x/y: no such file");

    let mut w = weights(&[1.0]);
    w.config = None;
    let j = judge(w);
    assert_eq!(j.verdict, Verdict::Error);
    assert!(j
        .message
        .contains("no adapter_config.json beside /store/v0001/adapter_model"));
}

#[test]
fn nonfinite_values_fail_naming_the_tensors() {
    let mut w = weights(&[1.0; 8]);
    w.nonfinite_total = 3;
    for m in w.modules.iter_mut().take(7) {
        m.nonfinite_b = 1;
    }
    w.other_tensors.push(TensorStats {
        name: "lm_head.weight".into(),
        dtype: "F32".into(),
        shape: vec![2],
        numel: 2,
        norm: f64::NAN,
        max_abs: f64::INFINITY,
        nonfinite: 1,
    });
    let j = judge(w);
    assert_eq!(j.verdict, Verdict::Fail);
    assert_eq!(j.score, Some(0.0));
    assert!(j
        .message
        .starts_with("nonfinite_weights: 3 NaN/inf values in 8 tensors (model.layers.0.q_proj"));
    assert!(j.message.contains("model.layers.5.q_proj and 2 more)"));
    assert_eq!(j.evidence.get("nonfinite_total"), Some(&Value::Int(3)));
}

#[test]
fn dead_adapter_fails_and_some_dead_modules_warn() {
    let j = judge(weights(&[0.0, 0.0, -0.0]));
    assert_eq!(j.verdict, Verdict::Fail);
    assert!(j
        .message
        .starts_with("dead_adapter: every one of the 3 LoRA modules"));

    let j = judge(weights(&[0.0, 1.0, 1e-9, 1.0]));
    assert_eq!(j.verdict, Verdict::Warn);
    assert_eq!(j.score, Some(0.5));
    assert!(j.message.starts_with(
        "dead_modules: 2 of 4 modules have dW = 0: model.layers.0.q_proj, model.layers.2.q_proj ("
    ));
    assert!(j.message.ends_with("rank used 0-4 of 8)"));
}

#[test]
fn energy_in_one_module_warns_above_the_share() {
    let mut deltas = vec![0.01; 9];
    deltas.push(10.0);
    let j = judge(weights(&deltas));
    assert_eq!(j.verdict, Verdict::Warn);
    assert!(
        j.message
            .starts_with("concentrated: 1 of 10 modules hold 100% of the dW energy (more than 90%): model.layers.9.q_proj ("),
        "{}",
        j.message
    );
    // Below min_modules_for_share nothing is said.
    let j = judge(weights(&[0.01, 10.0]));
    assert_eq!(j.verdict, Verdict::Pass);
}

#[test]
fn an_identical_previous_version_warns() {
    let w = weights(&[1.0, 2.0]);
    let mut before = input(Some(w.clone()));
    before.adapter = PathBuf::from("/store/versions/v0001/");
    let j = judge_weights(&input(Some(w.clone())), Some(&before), &options());
    assert_eq!(j.verdict, Verdict::Warn);
    assert!(j
        .message
        .starts_with("unchanged: identical to the previous version v0001: no module"));
    assert_eq!(
        j.evidence.get("previous_version"),
        Some(&Value::from("/store/versions/v0001"))
    );
    assert_eq!(
        j.evidence.get("total_delta_fro_previous"),
        Some(&Value::Float(5.0_f64.sqrt()))
    );
    let mut changed = w;
    if let Some(m) = changed.modules.first_mut() {
        m.norm_a = 1.5;
    }
    let j = judge_weights(&input(Some(changed)), Some(&before), &options());
    assert_eq!(j.verdict, Verdict::Pass);
}

#[test]
fn no_modules_skips() {
    let j = judge(weights(&[]));
    assert_eq!(j.verdict, Verdict::Skip);
    assert_eq!(
        j.message,
        "no LoRA factors in /store/v0001/adapter_model.safetensors (only 0 other tensors), \
         so there is no dW to judge"
    );
    assert_eq!(j.evidence.len(), 5);
}

fn top_module_names(j: &Judged) -> Vec<String> {
    let Some(Value::List(top)) = j.evidence.get("top_modules") else {
        return vec![];
    };
    top.iter()
        .filter_map(|item| match item {
            Value::Map(m) => match m.get("module") {
                Some(Value::Text(name)) => Some(name.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn modules_rank_by_energy_and_a_nan_norm_ranks_last() {
    let j = judge(weights(&[1.0, f64::NAN, 3.0, 2.0, 3.0]));
    assert_eq!(
        top_module_names(&j),
        [
            "model.layers.2.q_proj",
            "model.layers.4.q_proj", // a tie keeps the file's order
            "model.layers.3.q_proj",
            "model.layers.0.q_proj",
            "model.layers.1.q_proj",
        ]
    );
}

#[test]
fn a_nan_norm_does_not_move_the_median_that_finds_dead_modules() {
    // Median of the norms without NaN is 2.0; 1e-7 is below 1e-6 of it.
    let j = judge(weights(&[1e-7, f64::NAN, 2.0, 2.0, 3.0]));
    assert_eq!(
        j.evidence.get("dead_modules"),
        Some(&Value::from(vec!["model.layers.0.q_proj"]))
    );
}

#[test]
fn rank_used_median_is_a_count_or_between_two() {
    let mut w = weights(&[1.0, 2.0, 3.0, 4.0]);
    for (m, used) in w.modules.iter_mut().zip([1, 2, 6, 8]) {
        m.rank_used = Some(used);
    }
    let j = judge(w);
    let Some(Value::Map(used)) = j.evidence.get("rank_used") else {
        panic!("no rank_used");
    };
    assert_eq!(used.get("median"), Some(&Value::Float(4.0)));
    assert_eq!(used.get("min"), Some(&Value::from(1_u64)));
}

fn other_method(norms: &[f64], nonfinite: u64) -> AdapterWeights {
    let mut w = weights(&[]);
    let mut c = config();
    c.peft_type = Some("IA3".into());
    w.config = Some(c);
    w.other_tensors = norms
        .iter()
        .enumerate()
        .map(|(i, &norm)| TensorStats {
            name: format!("base_model.model.h.{i}.attn.ia3_l"),
            dtype: "F32".into(),
            shape: vec![96],
            numel: 96,
            norm,
            max_abs: norm,
            nonfinite: if i == 0 { nonfinite } else { 0 },
        })
        .collect();
    w.nonfinite_total = nonfinite;
    w
}

#[test]
fn another_peft_method_is_judged_on_finiteness_and_zeros() {
    let judge = |w| judge_weights(&input(Some(w)), None, &options());
    let j = judge(other_method(&[9.8, 9.8], 0));
    assert_eq!(
        (j.verdict, j.score),
        (Verdict::Pass, Some(1.0)),
        "{}",
        j.message
    );
    assert!(
        j.message.starts_with("IA3 adapter: 2 tensors"),
        "{}",
        j.message
    );
    assert_eq!(j.evidence.get("peft_type"), Some(&Value::from("IA3")));
    let j = judge(other_method(&[9.8, 0.0], 0));
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(j.message.contains("1 of 2 tensors") && j.message.contains("h.1.attn.ia3_l"));
    let j = judge(other_method(&[0.0, 0.0], 0));
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert!(j.message.starts_with("zero_weights"));
    let j = judge(other_method(&[f64::NAN, 1.0], 3));
    assert_eq!(j.verdict, Verdict::Fail);
    assert!(j.message.starts_with("nonfinite_weights"), "{}", j.message);
    let j = judge(other_method(&[], 0));
    assert_eq!(j.verdict, Verdict::Skip);
}

/// PEFT's frozen `original_module` copy of a `modules_to_save` head (saved
/// with the whole `PeftModel.state_dict()`) keeps the base model's zero
/// bias: it is not a dead adapter tensor.
#[test]
fn a_frozen_original_module_is_not_judged_as_the_adapter() {
    let mut w = other_method(&[9.8, 9.8], 0);
    let head = |name: &str, norm: f64| TensorStats {
        name: format!("base_model.model.classifier.{name}.bias"),
        dtype: "F32".into(),
        shape: vec![3],
        numel: 3,
        norm,
        max_abs: norm,
        nonfinite: 0,
    };
    w.other_tensors.push(head("original_module", 0.0));
    w.other_tensors.push(head("modules_to_save.default", 0.03));
    let j = judge_weights(&input(Some(w.clone())), None, &options());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert!(
        j.message.starts_with("IA3 adapter: 3 tensors"),
        "{}",
        j.message
    );
    assert_eq!(
        j.evidence.get("frozen_originals"),
        Some(&Value::from(vec![
            "base_model.model.classifier.original_module.bias"
        ]))
    );
    // The trained copy is still judged: zeros there are a finding.
    w.other_tensors.last_mut().unwrap().norm = 0.0;
    let j = judge_weights(&input(Some(w)), None, &options());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(
        j.message.contains("modules_to_save.default.bias"),
        "{}",
        j.message
    );
    assert!(!j.message.contains("original_module"), "{}", j.message);
}

/// An adapter whose every A factor has `ratio` times PEFT's initial norm
/// (rank 8: sqrt(8/3)), initialised as `init` says.
fn scaled_a(ratio: f64, init: &str) -> AdapterWeights {
    let mut w = weights(&[1.0, 2.0, 2.0, 3.0]);
    for m in &mut w.modules {
        m.norm_a = ratio * (8.0f64 / 3.0).sqrt();
    }
    if let Some(c) = w.config.as_mut() {
        c.init_lora_weights = init.into();
    }
    w
}

#[test]
fn a_factors_far_above_their_initial_scale_warn() {
    let j = judge(scaled_a(46.0, "true"));
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(j
        .message
        .starts_with("factors_blown_up: the LoRA A factors sit 46.0x above"));
    assert_eq!(
        j.evidence.get("factor_init"),
        Some(&Value::Text("true".into()))
    );
    // Healthy adapters move A a few times at most.
    let j = judge(scaled_a(4.0, "true"));
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    // Other inits start A elsewhere: a gaussian init's norm is sqrt(in/r)
    // (sqrt(64/8) = 2.83, so 46x sqrt(8/3) is 26.6x it), and PiSSA's is
    // the base weights' scale, which the adapter does not carry.
    let j = judge(scaled_a(46.0, "gaussian"));
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    let j = judge(scaled_a(46.0, "pissa"));
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert!(j.evidence.get("factor_scale_median").is_none());
}
