use std::path::PathBuf;

use super::*;
use crate::analysis::adapter_weights::TensorStats;
use crate::analysis::full_weights::LayerWeights;

fn tensor(name: &str, nonfinite: u64) -> TensorStats {
    TensorStats {
        name: name.to_string(),
        dtype: "F32".into(),
        shape: vec![4],
        numel: 4,
        norm: 2.0,
        max_abs: 1.0,
        nonfinite,
    }
}

fn input(tensors: Vec<TensorStats>, layers: Vec<LayerWeights>) -> FullWeightsInput {
    let nonfinite_total = tensors.iter().map(|t| t.nonfinite).sum();
    FullWeightsInput {
        adapter: PathBuf::from("/run/checkpoint-10"),
        layout: "hf".into(),
        checkpoint_kind: "full".into(),
        model_file: Some(PathBuf::from("/run/checkpoint-10/./model.safetensors")),
        weights: Some(FullWeights {
            path: PathBuf::from("/run/checkpoint-10/model.safetensors"),
            files: vec![PathBuf::from("/run/checkpoint-10/model.safetensors")],
            tensors,
            layers,
            skipped: vec![("step".into(), "I64".into())],
            other_norm: 1.0,
            total_norm: 12345.678,
            tensor_bytes: 64,
            nonfinite_total,
        }),
        error: None,
        note: None,
    }
}

fn layer(layer: u64, norm: f64, nonfinite: u64) -> LayerWeights {
    LayerWeights {
        layer,
        tensors: 1,
        numel: 4,
        norm,
        nonfinite,
    }
}

fn options(max_listed: i64) -> FullWeightsOptions {
    FullWeightsOptions {
        rules: "sway".into(),
        max_listed,
    }
}

#[test]
fn finite_model_passes_with_layer_norms() {
    let i = input(
        vec![tensor("a", 0), tensor("b", 0)],
        vec![
            layer(0, 3.5, 0),
            layer(1, f64::INFINITY, 0),
            layer(2, 0.25, 0),
        ],
    );
    let j = judge_full_weights(&i, &options(6));
    assert_eq!(j.verdict, Verdict::Pass);
    assert_eq!(j.score, Some(1.0));
    assert_eq!(
        j.message,
        "2 tensors in 1 file(s), all finite; ||W|| 1.235e4, layer norms 0.25-inf over 3 layers"
    );
    assert_eq!(
        j.evidence.get("model_file"),
        Some(&Value::from("/run/checkpoint-10/model.safetensors"))
    );
    let Some(Value::Map(norms)) = j.evidence.get("layer_l2_norm") else {
        panic!("no layer_l2_norm")
    };
    assert_eq!(norms.get("1"), Some(&Value::Null));
    assert_eq!(j.evidence.len(), 11);
}

#[test]
fn nonfinite_tensors_fail_listing_a_few() {
    let i = input(
        vec![
            tensor("a", 2),
            tensor("b", 0),
            tensor("c\n", 1),
            tensor("d", 5),
        ],
        vec![layer(0, f64::NAN, 2), layer(1, 1.0, 0)],
    );
    let j = judge_full_weights(&i, &options(2));
    assert_eq!(j.verdict, Verdict::Fail);
    assert_eq!(
        j.message,
        "nonfinite_weights: 8 NaN/inf values in 3 of 4 tensors (a (2), c\\n (1) and 1 more): \
         the model is corrupt and produces NaN outputs"
    );
    assert_eq!(
        j.evidence.get("nonfinite_layers"),
        Some(&Value::List(vec![Value::Int(0)]))
    );
    let keys: Vec<&str> = j.evidence.0.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(
        keys.get(11..),
        Some(&["nonfinite_tensors", "nonfinite_layers"][..])
    );
}

#[test]
fn notes_errors_and_empty_models() {
    let mut i = input(vec![], vec![]);
    let j = judge_full_weights(&i, &options(6));
    assert_eq!(j.verdict, Verdict::Skip);
    assert_eq!(
        j.message,
        "no float tensors in /run/checkpoint-10/model.safetensors (1 of other dtypes), so there \
         are no weights to check"
    );
    i.weights = None;
    i.error = Some(crate::Error::new(crate::Area::Header, "", "bad header"));
    let j = judge_full_weights(&i, &options(6));
    assert_eq!(
        (j.verdict, j.message.as_str()),
        (Verdict::Error, "full_weights: bad header")
    );
    i.note = Some("log-only checkpoint: no weights".into());
    let j = judge_full_weights(&i, &options(6));
    assert_eq!(j.verdict, Verdict::Skip);
    assert!(j.evidence.is_empty());
}
