//! The rules' branches, one input each (the Hypothesis tests in
//! `tests/test_ghost_kernel.py` compare every branch with the Python
//! reference on arbitrary inputs).

use std::path::PathBuf;

use super::*;
use crate::analysis::attribution::{Attribution, ParamSlot};
use crate::analysis::layers::LayerGrouping;
use crate::error::Error;
use crate::store::torch_state::TrainingState;

fn stat(param_id: i64, exp_avg_sq_mean: f64) -> ParamStat {
    ParamStat {
        param_id,
        numel: 4,
        shape: vec![2, 2],
        exp_avg_sq_mean,
        nonfinite: 0,
    }
}

fn state(step: i64, means: &[f64]) -> TrainingState {
    TrainingState {
        path: PathBuf::from("training_state.pt"),
        global_step: step,
        epoch: Some(1.0),
        best_val_loss: f64::NAN,
        use_qlora: false,
        per_param: means
            .iter()
            .enumerate()
            .map(|(i, &m)| stat(i64::try_from(i).unwrap_or(0), m))
            .collect(),
        implausible: vec![],
    }
}

/// `layers` layers (0, 1, ...) of `slots` tensors, ids layer-major.
fn input(step: i64, means: &[f64], layers: u64, slots: u64) -> GhostInput {
    let n = layers * slots;
    let params = (0..n)
        .map(|i| ParamSlot {
            param_id: i64::try_from(i).unwrap_or(0),
            layer: i / slots,
            slot: i % slots,
        })
        .collect();
    GhostInput {
        adapter: PathBuf::from("v0001"),
        layout: "dlm".into(),
        checkpoint_kind: "adapter".into(),
        state: Some(state(step, means)),
        error: None,
        grouping: Some(LayerGrouping {
            layer_indices: (0..layers).collect(),
            params_per_layer: slots,
            layer_of: (0..n).map(|i| i / slots).collect(),
        }),
        grouping_error: None,
        attribution: Some(Attribution {
            layer_indices: (0..layers).collect(),
            params,
            slot_names: (0..slots).map(|s| format!("mlp.proj{s}.lora_A")).collect(),
            unattributed: vec![],
        }),
        attribution_error: None,
        weights_error: None,
        optimizer: Some("adam".into()),
        note: None,
    }
}

fn text<'a>(j: &'a Judged, key: &str) -> Option<&'a Value> {
    j.evidence.get(key)
}

#[test]
fn note_and_missing_state_are_skips_and_unreadable_is_an_error() {
    let o = GhostOptions::defaults("robust");
    let mut i = input(100, &[1.0; 4], 2, 2);
    i.note = Some("bare adapter".into());
    let j = judge_ghost(&i, &o);
    assert_eq!(
        (j.verdict, j.message.as_str()),
        (Verdict::Skip, "bare adapter")
    );
    assert_eq!(text(&j, "optimizer"), Some(&Value::from("adam")));
    i.note = None;
    i.state = None;
    i.error = Some(Error::new(
        Area::Missing,
        "/x/training_state.pt",
        "not found",
    ));
    let j = judge_ghost(&i, &o);
    assert_eq!(j.verdict, Verdict::Skip);
    assert_eq!(j.message, "/x/training_state.pt: not found");
    i.error = Some(Error::new(Area::TrainingState, "", "corrupt"));
    assert_eq!(judge_ghost(&i, &o).verdict, Verdict::Error);
}

#[test]
fn implausible_values_fail_under_both_rule_sets() {
    let mut i = input(100, &[1.0; 4], 2, 2);
    if let Some(s) = i.state.as_mut() {
        s.implausible = (0..4).map(|k| format!("bad {k}")).collect();
    }
    for rules in ["robust", "sway"] {
        let j = judge_ghost(&i, &GhostOptions::defaults(rules));
        assert_eq!(j.verdict, Verdict::Fail);
        assert_eq!(j.message, format!("{TAMPERED}: bad 0; bad 1; bad 2; ..."));
        assert_eq!(j.score, Some(0.0));
    }
}

#[test]
fn sway_ladder() {
    let o = GhostOptions::defaults("sway");
    let j = judge_ghost(&input(10, &[1.0; 4], 2, 2), &o);
    assert_eq!((j.verdict, j.raw), (Verdict::Fail, Some(10.0)));
    let j = judge_ghost(&input(100, &[f64::NAN; 4], 2, 2), &o);
    assert_eq!((j.verdict, j.raw), (Verdict::Fail, Some(0.0)));
    // Layer 1 at 10x layer 0 in a 2-layer model: half the layers flagged.
    let j = judge_ghost(&input(100, &[1.0, 1.0, 10.0, 10.0], 2, 2), &o);
    assert_eq!(
        (j.verdict, j.score, j.raw),
        (Verdict::Fail, Some(0.3), Some(0.5))
    );
    assert!(j.message.starts_with("50% of layers (1/2) still show"));
    // One of four layers flagged: 25%, under the 30% allowed.
    let j = judge_ghost(&input(100, &[1.0, 1.0, 1.0, 5.0], 4, 1), &o);
    assert_eq!((j.verdict, j.score), (Verdict::Warn, Some(0.7)));
    let j = judge_ghost(&input(100, &[1.0, 1.5, 1.2, 1.0], 4, 1), &o);
    assert_eq!((j.verdict, j.score), (Verdict::Pass, Some(0.9)));
    assert_eq!(
        j.message,
        "global_step=100; no layer's exp_avg_sq exceeds 2.0x the calmest layer: training \
         looks converged"
    );
}

#[test]
fn robust_fails_before_comparing_layers() {
    let o = GhostOptions::defaults("robust");
    let mut i = input(100, &[1.0; 4], 2, 2);
    i.weights_error = Some(Error::new(Area::Weights, "a.safetensors", "bad header"));
    assert_eq!(judge_ghost(&i, &o).verdict, Verdict::Error);
    let j = judge_ghost(&input(5, &[1.0; 4], 2, 2), &o);
    assert!(j
        .message
        .starts_with("too_few_steps: global_step=5 is below 20"));
    let mut means = vec![1.0; 12];
    means[3] = f64::INFINITY;
    let j = judge_ghost(&input(100, &means, 4, 3), &o);
    assert!(j
        .message
        .contains("of 12 parameters holds NaN/inf (param ids 3)"));
    let j = judge_ghost(&input(100, &[0.0, -0.0, 0.0, 0.0], 2, 2), &o);
    assert!(j.message.starts_with("no_gradients: "));
}

#[test]
fn robust_per_layer_findings_and_pass() {
    let o = GhostOptions::defaults("robust");
    // Two layers: not compared.
    let j = judge_ghost(&input(100, &[1.0, 2.0, 1.0, 2.0], 2, 2), &o);
    assert_eq!((j.verdict, j.score), (Verdict::Pass, Some(0.8)));
    assert!(j
        .message
        .contains("; per-layer check not done: only 2 layer(s)"));
    // Five calm layers.
    let calm = vec![1e-6; 10];
    let j = judge_ghost(&input(100, &calm, 5, 2), &o);
    assert_eq!((j.verdict, j.score), (Verdict::Pass, Some(0.9)));
    assert!(j.message.ends_with(
        "per-layer check: 10 tensors in 5 layers, no layer above 1000x its peers, none \
         exploding (10x its nearest layers)"
    ));
    // Layer 3 at 1e4x (4 decades) in both tensors, a dead tensor in layer 4.
    let mut hot = calm.clone();
    hot[6] = 1e-2;
    hot[7] = 1e-2;
    hot[9] = 0.0;
    let j = judge_ghost(&input(100, &hot, 5, 2), &o);
    assert_eq!((j.verdict, j.score), (Verdict::Warn, Some(0.5)));
    assert!(j.message.starts_with("layer_outliers: 1 of 5 layers"));
    assert!(j.message.contains("exploding_layers: 1 of 5 layers"));
    assert!(j
        .message
        .contains("layer 3 +4.00 decades (1e4x) in 2/2 tensors"));
    assert!(j
        .message
        .contains("dead_tensors: 1 tensors got no gradient (exp_avg_sq exactly zero) while the same tensor in other layers did: layer 4 mlp.proj1.lora_A"));
    assert_eq!(text(&j, "flagged_layers"), Some(&Value::from(vec![3u64])));
    // Without an attribution: said, not silently passed.
    let mut i = input(100, &calm, 5, 2);
    i.attribution = None;
    i.attribution_error = Some("shapes disagree".into());
    let j = judge_ghost(&i, &o);
    assert!(j
        .message
        .ends_with("; per-layer check not done: optimizer ids cannot be attributed to layers exactly: shapes disagree"));
}
