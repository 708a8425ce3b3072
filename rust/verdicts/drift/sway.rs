//! `rules="sway"`: dlm-sway's training_drift rule. Smoothness, convergence
//! ratio and the MAD spike count against fixed thresholds; PASS needs all
//! three.

use std::cmp::Ordering;

use super::{curve_sampled, need, DriftOptions, KIND};
use crate::analysis::metrics;
use crate::formats::logs::curve::LossCurve;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{number_text, Judged, Value, Verdict};

pub(super) fn judge(curve: &LossCurve, o: &DriftOptions) -> Result<Judged, String> {
    let rules = o.rules.as_str();
    let window = need(o.rolling_window, "rolling_window", rules)?;
    let sigma = need(o.spike_sigma, "spike_sigma", rules)?;
    let smooth_gte = need(o.assert_smoothness_gte, "assert_smoothness_gte", rules)?;
    let conv_lte = need(
        o.assert_convergence_ratio_lte,
        "assert_convergence_ratio_lte",
        rules,
    )?;
    let events_lte = need(
        o.assert_instability_events_lte,
        "assert_instability_events_lte",
        rules,
    )?;
    metrics::check_spike_params(window, sigma).map_err(|e| e.to_string())?;

    let m = metrics::curve_metrics(&curve.losses, window, sigma);
    let (smooth, conv, events) = (m.smoothness, m.convergence_ratio, m.instability_events);

    let mut shortfalls: Vec<String> = Vec::new();
    if matches!(smooth.partial_cmp(&smooth_gte), None | Some(Ordering::Less)) {
        shortfalls.push(format!(
            "smoothness {} is below {}",
            number_text::fixed(smooth, 2),
            number_text::setting(smooth_gte)
        ));
    }
    if matches!(conv.partial_cmp(&conv_lte), None | Some(Ordering::Greater)) {
        shortfalls.push(format!(
            "convergence_ratio {} is above {}",
            number_text::fixed(conv, 2),
            number_text::setting(conv_lte)
        ));
    }
    if events > events_lte {
        shortfalls.push(format!(
            "{events} instability events, more than {events_lte}"
        ));
    }
    let summary = format!(
        "smoothness={}, convergence_ratio={}, instability_events={events}, final_loss={}",
        number_text::fixed(smooth, 2),
        number_text::fixed(conv, 2),
        number_text::fixed(m.final_loss, 3)
    );
    let (verdict, score, message) = if shortfalls.is_empty() {
        (Verdict::Pass, unit_score(smooth), summary)
    } else {
        let message = format!("{summary}; {}", shortfalls.join("; "));
        (Verdict::Warn, unit_score(smooth * 0.5), message)
    };

    let mut thresholds = Evidence::new();
    thresholds.put("smoothness_gte", smooth_gte);
    thresholds.put("convergence_ratio_lte", conv_lte);
    thresholds.put("instability_events_lte", events_lte);
    let mut e = Evidence::new();
    e.put("rules", "sway");
    e.put("final_loss", m.final_loss);
    e.put("initial_loss", m.initial_loss);
    e.put("convergence_ratio", conv);
    e.put("smoothness", smooth);
    e.put("instability_events", events);
    e.put("spike_steps", Value::from(curve.steps_at(&m.spike_points)));
    e.put(
        "nonfinite_steps",
        Value::from(curve.steps_at(&m.nonfinite_points)),
    );
    e.put("num_steps", curve.steps.len());
    e.put("num_log_files", curve.num_files);
    e.put("curve_sampled", curve_sampled(curve));
    e.put("thresholds", thresholds);
    Ok(Judged::bare(KIND, verdict, message)
        .with_score(score)
        .with_raw(smooth)
        .with_evidence(e))
}

/// `x` held to `[0, 1]`; a NaN `x` (a curve with no smoothness to speak
/// of) scores 0, as the seeds' `min(1, max(0, x))` scores it.
fn unit_score(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}
