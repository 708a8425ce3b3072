//! rules="sway": dlm-sway's ladder, the step floor, all-NaN second
//! moments, then each layer's mean second moment against the calmest
//! layer's.

use crate::analysis::numerics::mean;
use crate::store::probe_inputs::GhostInput;
use crate::store::torch_state::TrainingState;
use crate::verdicts::ghost::{finite_or_none, GhostOptions, KIND};
use crate::verdicts::number_text::{fixed, percent};
use crate::verdicts::{Evidence, Judged, Value, Verdict};

pub(super) fn ratio(o: &GhostOptions) -> f64 {
    o.undertrained_layer_ratio.unwrap_or(2.0)
}

pub(super) fn failure_frac(o: &GhostOptions) -> f64 {
    o.layer_failure_frac.unwrap_or(0.3)
}

pub(super) fn judge(input: &GhostInput, state: &TrainingState, o: &GhostOptions) -> Judged {
    let grouping = input.grouping.as_ref();
    let num_layers = grouping.map_or(0, |g| g.layer_indices.len());
    let params_per_layer = grouping.map_or(0, |g| g.params_per_layer);
    let per_param = &state.per_param;
    let best_val_loss = finite_or_none(state.best_val_loss);
    let step = state.global_step;
    let min_steps = o.min_steps();

    if step < min_steps {
        let mut e = Evidence::new();
        e.put("global_step", step);
        e.put("min_steps_threshold", min_steps);
        e.put("epoch", state.epoch);
        e.put("num_params", per_param.len());
        e.put("num_layers", num_layers);
        e.put("best_val_loss", best_val_loss);
        e.put("primary_signal", "global_step_below_threshold");
        let message = format!(
            "severely undertrained: global_step={step} is below {min_steps}; scores measured \
             on this adapter mean little until it is trained further"
        );
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_raw(step as f64)
            .with_evidence(e);
    }

    let finite: Vec<f64> = per_param
        .iter()
        .map(|p| p.exp_avg_sq_mean)
        .filter(|v| v.is_finite())
        .collect();
    let nonfinite_count = per_param.len() - finite.len();
    if finite.is_empty() {
        let mut e = Evidence::new();
        e.put("global_step", step);
        e.put("num_params", per_param.len());
        e.put("num_nonfinite_exp_avg_sq", nonfinite_count);
        e.put("primary_signal", "all_optimizer_state_nan");
        let message = "no parameter has a finite exp_avg_sq mean: gradients did not flow in \
                       any useful way during training";
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_raw(0.0)
            .with_evidence(e);
    }

    let global_mean = mean(&finite);
    let limit = ratio(o);
    // (layer, mean) in the grouping's layer order, layers with values only.
    let mut layer_means: Vec<(u64, f64)> = Vec::new();
    let mut undertrained: Vec<u64> = Vec::new();
    let mut baseline = 0.0_f64;
    if let Some(g) = grouping.filter(|_| global_mean > 0.0) {
        let mut buckets: Vec<(u64, Vec<f64>)> = Vec::new();
        for &layer in &g.layer_indices {
            if !buckets.iter().any(|(l, _)| *l == layer) {
                buckets.push((layer, Vec::new()));
            }
        }
        for p in per_param {
            let layer = usize::try_from(p.param_id)
                .ok()
                .and_then(|i| g.layer_of.get(i));
            if let Some(&layer) = layer {
                if p.exp_avg_sq_mean.is_finite() {
                    if let Some((_, bucket)) = buckets.iter_mut().find(|(l, _)| *l == layer) {
                        bucket.push(p.exp_avg_sq_mean);
                    }
                }
            }
        }
        layer_means = buckets
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(layer, v)| (*layer, mean(v)))
            .collect();
        if let Some(&(_, first)) = layer_means.first() {
            // Ties: the first of the smallest wins.
            baseline = layer_means
                .iter()
                .fold(first, |m, &(_, v)| if v < m { v } else { m });
            if baseline > 0.0 {
                undertrained = layer_means
                    .iter()
                    .filter(|&&(_, m)| m > limit * baseline)
                    .map(|&(layer, _)| layer)
                    .collect();
            }
        }
    }

    let frac = if num_layers > 0 {
        undertrained.len() as f64 / num_layers as f64
    } else {
        0.0
    };
    let mut ranked = layer_means.clone();
    // Highest mean first, stable (Python sorts on the negated mean).
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let worst_layers: Vec<Value> = ranked
        .iter()
        .take(3)
        .map(|&(layer, m)| {
            let mut w = Evidence::new();
            w.put("layer", layer);
            w.put("ratio", (baseline > 0.0).then(|| m / baseline));
            Value::Map(w)
        })
        .collect();
    let share = format!(
        "{} of layers ({}/{num_layers})",
        percent(frac, 0),
        undertrained.len()
    );
    let failure = failure_frac(o);
    let (verdict, score, message) = if frac > failure {
        (
            Verdict::Fail,
            0.3,
            format!(
                "{share} still show high gradient variance, more than {} allowed: the loss has \
                 probably not flattened yet (global_step={step})",
                percent(failure, 0)
            ),
        )
    } else if !undertrained.is_empty() {
        (
            Verdict::Warn,
            0.7,
            format!(
                "{share} have exp_avg_sq above {}x the calmest layer: partly undertrained, \
                 other probes may still be informative (global_step={step})",
                fixed(limit, 1)
            ),
        )
    } else {
        (
            Verdict::Pass,
            0.9,
            format!(
                "global_step={step}; no layer's exp_avg_sq exceeds {}x the calmest layer: \
                 training looks converged",
                fixed(limit, 1)
            ),
        )
    };
    let mut means = Evidence::new();
    for &(layer, m) in &layer_means {
        means.put(layer.to_string(), m);
    }
    let mut e = Evidence::new();
    e.put("rules", "sway");
    e.put("global_step", step);
    e.put("epoch", state.epoch);
    e.put("num_params", per_param.len());
    e.put("num_layers", num_layers);
    e.put("params_per_layer", params_per_layer);
    e.put("layer_exp_avg_sq", means);
    e.put("flagged_layers", undertrained.clone());
    e.put("global_mean_exp_avg_sq", global_mean);
    e.put("frac_layers_undertrained", frac);
    e.put("num_layers_undertrained", undertrained.len());
    e.put("worst_layers", Value::List(worst_layers));
    e.put("num_nonfinite_exp_avg_sq", nonfinite_count);
    e.put("best_val_loss", best_val_loss);
    e.put("use_qlora", state.use_qlora);
    Judged::bare(KIND, verdict, message)
        .with_score(score)
        .with_raw(frac)
        .with_evidence(e)
}
