//! Each rule on records shaped like the monitor's, both sides of its
//! threshold, and what must not move a verdict.

use super::*;
use crate::formats::logs::gap_log::{GapLog, GapRecord};

const LAYERS: [&str; 4] = ["embed", "layers.0", "layers.1", "layers.2"];

/// A healthy run: per-layer gradient norms at their own levels (the
/// embeddings 5x the rest), a little noise, activations steady.
fn healthy(n: usize) -> Vec<GapRecord> {
    (0..n)
        .map(|t| {
            let wobble = 1.0 + 0.2 * ((t * 7 % 5) as f64 - 2.0) / 2.0;
            let mut stats = vec![];
            let mut total = 0.0;
            for (i, layer) in LAYERS.iter().enumerate() {
                let g = if i == 0 { 5.0 } else { 1.0 } * wobble * (1.0 + 0.1 * i as f64);
                total += g * g;
                stats.push((format!("gap/summary/grads/layers/{layer}/l2_norm"), g));
                stats.push((
                    format!("gap/summary/activations/layers/{layer}/rms"),
                    0.5 * wobble,
                ));
            }
            stats.push(("gap/summary/grads/l2_norm".into(), f64::sqrt(total)));
            stats.push(("gap/summary/grads/nonfinite".into(), 0.0));
            stats.push(("gap/summary/activations/rms".into(), 0.5 * wobble));
            stats.push(("gap/summary/activations/nonfinite".into(), 0.0));
            GapRecord {
                step: 10 * t as i64,
                stats,
            }
        })
        .collect()
}

fn set(r: &mut GapRecord, key: &str, value: f64) {
    match r.stats.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => r.stats.push((key.to_string(), value)),
    }
}

fn scale(r: &mut GapRecord, key_part: &str, by: f64) {
    for (k, v) in &mut r.stats {
        if k.contains(key_part) {
            *v *= by;
        }
    }
}

fn judge(records: Vec<GapRecord>) -> Judged {
    let input = GapInput {
        log: Some(GapLog {
            records,
            files: vec![],
            thinned: 1,
            cut_records: 0,
        }),
        error: None,
    };
    judge_gap(&input, &GapOptions::defaults("robust"))
}

fn rules_of(j: &Judged) -> Vec<String> {
    match j.evidence.get("findings") {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|f| match f {
                Value::Map(m) => match m.get("rule") {
                    Some(Value::Text(t)) => Some(t.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

#[test]
fn a_healthy_run_passes_and_no_records_is_a_skip() {
    let j = judge(healthy(30));
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    let empty = judge_gap(&GapInput::default(), &GapOptions::defaults("robust"));
    assert_eq!(empty.verdict, Verdict::Skip);
}

#[test]
fn a_hard_batch_lifting_every_layer_is_not_an_exploding_layer() {
    let mut rs = healthy(30);
    scale(&mut rs[15], "gap/summary/grads/", 50.0);
    let j = judge(rs);
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
}

#[test]
fn one_layer_jumping_warns_then_fails_by_size_and_when_it_stays_up() {
    let layer = "gap/summary/grads/layers/layers.1/l2_norm";
    let mut rs = healthy(30);
    scale(&mut rs[15], layer, 30.0);
    let j = judge(rs);
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(
        j.message.contains("layers.1") && j.message.contains("step 150"),
        "{}",
        j.message
    );
    // just under the threshold: not flagged
    let mut rs = healthy(30);
    scale(&mut rs[15], layer, 8.0);
    assert_eq!(judge(rs).verdict, Verdict::Pass);
    // far above: FAIL
    let mut rs = healthy(30);
    scale(&mut rs[15], layer, 300.0);
    assert_eq!(judge(rs).verdict, Verdict::Fail);
    // 30x from step 150 to the end: FAIL (it never came back)
    let mut rs = healthy(30);
    for r in &mut rs[15..] {
        scale(r, layer, 30.0);
    }
    let j = judge(rs);
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert!(rules_of(&j).contains(&"exploding_layer".to_string()));
}

#[test]
fn a_layer_that_is_always_large_is_not_exploding() {
    let mut rs = healthy(30);
    for r in &mut rs {
        scale(r, "layers/embed/", 1000.0);
    }
    assert_eq!(judge(rs).verdict, Verdict::Pass);
}

#[test]
fn layer_order_does_not_change_the_verdict() {
    let mut rs = healthy(30);
    scale(
        &mut rs[15],
        "gap/summary/grads/layers/layers.2/l2_norm",
        30.0,
    );
    let a = judge(rs.clone());
    for r in &mut rs {
        r.stats.reverse();
    }
    let b = judge(rs);
    assert_eq!((a.verdict, a.message), (b.verdict, b.message));
}

#[test]
fn nonfinite_gradients_once_warn_twice_in_a_row_fail_and_name_the_tensors() {
    let mut rs = healthy(20);
    set(&mut rs[5], "gap/summary/grads/nonfinite", 3.0);
    set(
        &mut rs[5],
        "gap/summary/grads/layers/layers.0/nonfinite",
        3.0,
    );
    set(&mut rs[5], "gap/summary/grads/l2_norm", f64::INFINITY);
    let j = judge(rs.clone());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    set(&mut rs[6], "gap/summary/grads/nonfinite", 1.0);
    let j = judge(rs);
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert!(
        j.message.contains("step 50") && j.message.contains("layers.0"),
        "{}",
        j.message
    );
}

#[test]
fn nonfinite_activations_fail_at_once_naming_the_tensor() {
    let mut rs = healthy(20);
    set(&mut rs[7], "gap/summary/activations/nonfinite", 8.0);
    set(
        &mut rs[7],
        "gap/summary/activations/top_max_abs/model.layers.2.mlp",
        f64::NAN,
    );
    let j = judge(rs);
    assert_eq!(j.verdict, Verdict::Fail);
    assert!(
        j.message.contains("model.layers.2.mlp") && j.message.contains("step 70"),
        "{}",
        j.message
    );
}

#[test]
fn a_layer_with_zero_gradient_at_most_steps_warns() {
    let mut rs = healthy(10);
    for r in &mut rs[..6] {
        set(r, "gap/summary/grads/layers/layers.2/l2_norm", 0.0);
    }
    let j = judge(rs.clone());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(j.message.contains("layers.2"));
    let mut rs = healthy(10);
    for r in &mut rs[..4] {
        set(r, "gap/summary/grads/layers/layers.2/l2_norm", 0.0);
    }
    assert_eq!(judge(rs).verdict, Verdict::Pass); // half is not most
}

#[test]
fn activations_growing_three_orders_warn_not_one() {
    let grow = |by: f64| {
        let mut rs = healthy(30);
        for (t, r) in rs.iter_mut().enumerate() {
            scale(r, "gap/summary/activations/", by.powf(t as f64 / 29.0));
        }
        judge(rs)
    };
    let j = grow(5000.0);
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(rules_of(&j).contains(&"activations_growing".to_string()));
    assert_eq!(grow(50.0).verdict, Verdict::Pass);
}

#[test]
fn a_scaled_run_is_judged_alike() {
    let mut rs = healthy(30);
    scale(
        &mut rs[15],
        "gap/summary/grads/layers/layers.1/l2_norm",
        30.0,
    );
    let a = judge(rs.clone());
    for r in &mut rs {
        scale(r, "gap/summary/", 1e-4);
    }
    let b = judge(rs);
    assert_eq!(a.verdict, b.verdict);
}
