//! The four rules of `gap_monitor` (see the module doc of `gap`).

use super::series::{nonfinite_names, size_stat, KindSeries};
use super::Resolved;
use crate::analysis::numerics::median;
use crate::formats::logs::gap_log::GapRecord;
use crate::verdicts::number_text::{setting, significant};
use crate::verdicts::{Evidence, Finding, Verdict};

/// Names shown in a message.
const SHOWN: usize = 4;
/// Earlier samples a layer's jump is measured against (its recent level).
const WINDOW: usize = 8;

fn listed(names: &[String], total: usize) -> String {
    let shown: Vec<&str> = names.iter().take(SHOWN).map(String::as_str).collect();
    let more = total.saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Whether NaN/inf reached `kind` at this record, and the names it gives.
fn bad_at(record: &GapRecord, kind: &str) -> Option<(Vec<String>, usize)> {
    let prefix = format!("gap/summary/{kind}s/");
    let stat = size_stat(kind);
    let global = record.stats.iter().any(|(k, v)| {
        k.strip_prefix(&prefix).is_some_and(|rest| {
            (rest == "nonfinite" && *v > 0.0) || (rest == stat && !v.is_finite())
        })
    });
    let (names, total) = nonfinite_names(record, kind, 64);
    (global || total > 0).then_some((names, total))
}

/// NaN/inf in any kind; FAIL unless it is one isolated step of gradients.
/// `online` (the guard, mid-run): non-finite gradients at the newest record
/// alone are not yet a FAIL, since the next record may be finite again.
pub fn nonfinite(records: &[GapRecord], e: &mut Evidence, online: bool) -> Option<Finding> {
    let mut first: Option<(usize, &str, Vec<String>, usize)> = None;
    let mut bad_steps = 0usize;
    let mut bad = vec![false; records.len()];
    let mut severe = false; // params or activations: the model itself is broken
    for (t, record) in records.iter().enumerate() {
        // upstream first: NaN weights make NaN activations, then NaN gradients
        for kind in ["param", "activation", "activation_grad", "grad"] {
            if let Some((names, total)) = bad_at(record, kind) {
                bad[t] = true;
                severe |= matches!(kind, "param" | "activation");
                if first.is_none() {
                    first = Some((t, kind, names, total));
                }
            }
        }
        bad_steps += usize::from(bad[t]);
    }
    let (t, kind, names, total) = first?;
    let last = records.len() - 1;
    let persists = bad.windows(2).any(|w| w[0] && w[1]) || (bad[last] && !online);
    let step = records[t].step;
    e.put("nonfinite_step", step);
    e.put("nonfinite_kind", format!("{kind}s"));
    e.put("nonfinite_tensors", names.clone());
    e.put("nonfinite_steps", bad_steps);
    let named = if total > 0 {
        format!(" in {}", listed(&names, total))
    } else {
        String::new()
    };
    let kind_text = kind.replace('_', " ");
    if severe || persists {
        Some(Finding::new(
            Verdict::Fail,
            "nonfinite",
            format!(
                "NaN/inf {kind_text}s at step {step}{named} ({bad_steps} of {} sampled steps hold NaN/inf)",
                records.len()
            ),
        ))
    } else {
        Some(Finding::new(
            Verdict::Warn,
            "nonfinite",
            format!(
                "NaN/inf {kind_text}s at step {step} only{named}, finite after it (a loss \
                 scaler's overflow, which skips the step, looks like this)"
            ),
        ))
    }
}

/// One layer's gradient norm far above its own recent level and its usual
/// ratio to the other layers. `online`: a jump still high at the newest
/// record is not yet "never came back".
pub fn exploding_layer(
    records: &[GapRecord],
    grads: &KindSeries,
    r: &Resolved,
    e: &mut Evidence,
    online: bool,
) -> Option<Finding> {
    let n = records.len();
    if grads.layers.len() < 3 {
        return None;
    }
    let level = |t: usize| {
        median(
            grads
                .layers
                .iter()
                .map(|(_, v)| v[t])
                .filter(|x| x.is_finite() && *x > 0.0),
        )
    };
    let peers: Vec<Option<f64>> = (0..n).map(level).collect();
    // The worst event: (jump, layer, sample, own jump, peer jump, still high)
    let mut worst: Option<(f64, usize, usize, f64, f64, bool)> = None;
    for (l, (_, values)) in grads.layers.iter().enumerate() {
        let mut own: Vec<f64> = Vec::new(); // recent levels
        let mut ratio: Vec<f64> = Vec::new(); // recent ratios to the peers
                                              // this layer's worst: (jump, sample, own, peer, baseline level, baseline ratio)
        let mut top: Option<(f64, usize, f64, f64, f64, f64)> = None;
        let mut last: Option<(f64, f64)> = None; // its last (level, ratio)
        for t in 0..n {
            let (g, Some(p)) = (values[t], peers[t]) else {
                continue;
            };
            if !(g.is_finite() && g > 0.0) {
                continue;
            }
            let q = g / p;
            if own.len() >= r.min_history {
                let base = median(own.iter().copied()).unwrap_or(g);
                let base_ratio = median(ratio.iter().copied()).unwrap_or(q);
                let (own_jump, peer_jump) = (g / base, q / base_ratio);
                let jump = own_jump.min(peer_jump);
                if jump >= r.explode_ratio && top.is_none_or(|w| jump > w.0) {
                    top = Some((jump, t, own_jump, peer_jump, base, base_ratio));
                }
            }
            last = Some((g, q));
            own.push(g);
            ratio.push(q);
            if own.len() > WINDOW {
                own.remove(0);
                ratio.remove(0);
            }
        }
        if let (Some((jump, t, own_jump, peer_jump, base, base_ratio)), Some((g, q))) = (top, last)
        {
            // never back: its last sample is still that far above the level before the jump
            let still = (g / base).min(q / base_ratio) >= r.explode_ratio;
            if worst.is_none_or(|w| jump > w.0) {
                worst = Some((jump, l, t, own_jump, peer_jump, still));
            }
        }
    }
    let (jump, l, t, own_jump, peer_jump, still_high) = worst?;
    let layer = &grads.layers[l].0;
    let step = records[t].step;
    e.put("exploding_layer", layer.as_str());
    e.put("exploding_step", step);
    e.put("exploding_ratio", jump);
    let still_high = still_high && !online;
    let fail = jump >= r.explode_fail_ratio || still_high;
    let tail = if still_high {
        " and it had not come back by the last sampled step"
    } else {
        ""
    };
    Some(Finding::new(
        if fail { Verdict::Fail } else { Verdict::Warn },
        "exploding_layer",
        format!(
            "layer {layer}'s gradient norm jumped at step {step}: {}x its recent level and {}x its \
             usual ratio to the other layers (>= {}x){tail}",
            significant(own_jump, 3),
            significant(peer_jump, 3),
            setting(r.explode_ratio),
        ),
    ))
}

/// Layers whose gradient is exactly zero at most sampled steps.
pub fn vanishing(grads: &KindSeries, r: &Resolved, e: &mut Evidence) -> Option<Finding> {
    let live: Vec<bool> = grads.size.iter().map(|g| !g.is_nan() && *g > 0.0).collect();
    let mut dead: Vec<(String, usize, usize)> = Vec::new();
    for (layer, values) in &grads.layers {
        let seen: Vec<f64> = values
            .iter()
            .zip(&live)
            .filter(|(v, alive)| **alive && v.is_finite())
            .map(|(v, _)| *v)
            .collect();
        let zeros = seen.iter().filter(|v| **v == 0.0).count();
        if seen.len() >= r.min_samples && zeros as f64 > r.vanish_share * seen.len() as f64 {
            dead.push((layer.clone(), zeros, seen.len()));
        }
    }
    // The whole model: no gradient at most steps.
    let counted = grads.size.iter().filter(|g| g.is_finite()).count();
    let zero = grads.size.iter().filter(|g| **g == 0.0).count();
    if counted >= r.min_samples && zero as f64 > r.vanish_share * counted as f64 {
        dead.insert(0, ("(all layers)".to_string(), zero, counted));
    }
    let (first, zeros, seen) = dead.first()?.clone();
    let names: Vec<String> = dead.iter().map(|d| d.0.clone()).collect();
    e.put("vanishing_layers", names.clone());
    Some(Finding::new(
        Verdict::Warn,
        "vanishing_grads",
        format!(
            "zero gradient in {} at most sampled steps ({first}: {zeros} of {seen}): those \
             weights do not learn",
            listed(&names, names.len()),
        ),
    ))
}

/// `log10(end / start)` of a series: medians of its first and last three
/// positive finite values; None with fewer than `need` of them.
fn growth(values: &[f64], need: usize) -> Option<f64> {
    let kept: Vec<f64> = values
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if kept.len() < need.max(6) {
        return None;
    }
    let start = median(kept[..3].iter().copied())?;
    let end = median(kept[kept.len() - 3..].iter().copied())?;
    Some((end / start).log10())
}

/// Activations whose RMS grew by orders of magnitude over the run.
pub fn activations_growing(
    activations: &KindSeries,
    r: &Resolved,
    e: &mut Evidence,
) -> Option<Finding> {
    let mut worst: Option<(String, f64)> =
        growth(&activations.size, r.min_samples).map(|d| ("all layers".to_string(), d));
    for (layer, values) in &activations.layers {
        if let Some(d) = growth(values, r.min_samples) {
            if worst.as_ref().is_none_or(|w| d > w.1) {
                worst = Some((layer.clone(), d));
            }
        }
    }
    let (layer, decades) = worst?;
    e.put("activation_growth_decades", decades);
    (decades >= r.growth_decades).then(|| {
        e.put("activation_growth_layer", layer.as_str());
        Finding::new(
            Verdict::Warn,
            "activations_growing",
            format!(
                "activations ({layer}) grew {}x over the run ({} orders of magnitude, >= {}): \
                 a precursor of overflow and divergence",
                significant(10f64.powf(decades), 3),
                significant(decades, 2),
                setting(r.growth_decades),
            ),
        )
    })
}
