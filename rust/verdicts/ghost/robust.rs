//! rules="robust": the step floor, NaN/inf and all-zero second moments,
//! then each layer against the same tensors in the other layers (outlier
//! layers, exploding layers, dead tensors), where ids are attributed to
//! layers exactly.

use std::collections::BTreeMap;

use crate::analysis::attribution::Attribution;
use crate::analysis::numerics::{mean, median};
use crate::io::excerpt::excerpt;
use crate::store::probe_inputs::GhostInput;
use crate::store::torch_state::{ParamStat, TrainingState};
use crate::verdicts::ghost::{finite_or_none, values_by_id, GhostOptions, KIND};
use crate::verdicts::layer_lift::{
    layer_lifts, slot_name, LayerLift, FIRST_LAYER, PEERS, SET_ASIDE,
};
use crate::verdicts::number_text::{fixed, percent, setting, significant};
use crate::verdicts::{findings_value, worst, Evidence, Finding, Judged, Value, Verdict};

/// The robust rule set's thresholds, defaults filled in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub outlier_ratio: f64,
    pub min_layers: i64,
    pub lift_decades: f64,
    pub first_lift_decades: f64,
    pub lift_share: f64,
}

impl Limits {
    pub(super) fn of(o: &GhostOptions) -> Limits {
        Limits {
            outlier_ratio: o.layer_outlier_ratio.unwrap_or(1000.0),
            min_layers: o.min_layers_compared.unwrap_or(3),
            lift_decades: o.layer_lift_decades.unwrap_or(1.0),
            first_lift_decades: o.first_layer_lift_decades.unwrap_or(1.5),
            lift_share: o.layer_lift_share.unwrap_or(0.9),
        }
    }

    /// The lift above which `layer` is exploding.
    fn lift_limit(&self, layer: u64) -> f64 {
        if layer == FIRST_LAYER {
            self.first_lift_decades
        } else {
            self.lift_decades
        }
    }

    fn lifted_count(&self, lift: &LayerLift) -> usize {
        let limit = self.lift_limit(lift.layer);
        lift.by_tensor.iter().filter(|(_, d)| *d > limit).count()
    }
}

/// `10^x`; past f64's range it is inf.
fn pow10(x: f64) -> f64 {
    10f64.powf(x)
}

/// The first `limit` ids, then how many more.
fn ids_text(ids: &[i64], limit: usize) -> String {
    let shown: Vec<String> = ids.iter().take(limit).map(i64::to_string).collect();
    let mut text = shown.join(", ");
    if ids.len() > limit {
        text.push_str(&format!(" and {} more", ids.len() - limit));
    }
    text
}

pub(super) fn judge(input: &GhostInput, state: &TrainingState, o: &GhostOptions) -> Judged {
    let per_param = &state.per_param;
    let step = state.global_step;
    let mut base = Evidence::new();
    base.put("rules", "robust");
    base.put("optimizer", input.optimizer.clone());
    base.put("global_step", step);
    base.put("epoch", state.epoch);
    base.put("num_params", per_param.len());
    base.put("best_val_loss", finite_or_none(state.best_val_loss));
    base.put("use_qlora", state.use_qlora);
    if let Some(err) = &input.weights_error {
        let message = format!("cannot read the adapter weights beside the optimizer state: {err}");
        return Judged::bare(KIND, Verdict::Error, message).with_evidence(base);
    }
    let min_steps = o.min_steps();
    if step < min_steps {
        let mut e = base;
        e.put("min_steps_threshold", min_steps);
        let message = format!(
            "too_few_steps: global_step={step} is below {min_steps}: a smoke-test-length run, \
             not a trained adapter"
        );
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_raw(step as f64)
            .with_evidence(e);
    }
    let bad: Vec<i64> = per_param
        .iter()
        .filter(|p| p.nonfinite > 0 || !p.exp_avg_sq_mean.is_finite())
        .map(|p| p.param_id)
        .collect();
    if !bad.is_empty() {
        let message = format!(
            "nonfinite_second_moments: exp_avg_sq of {} of {} parameters holds NaN/inf (param \
             ids {}): NaN or inf gradients reached the optimizer",
            bad.len(),
            per_param.len(),
            ids_text(&bad, 8)
        );
        let mut e = base;
        e.put("nonfinite_param_ids", bad);
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_evidence(e);
    }
    if !per_param.is_empty() && per_param.iter().all(|p| p.exp_avg_sq_mean == 0.0) {
        let message = format!(
            "no_gradients: every exp_avg_sq is exactly zero after {step} steps: no gradient \
             ever reached the optimizer, so the adapter never trained (a dead adapter, e.g. \
             lora_B frozen at its zero init)"
        );
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_evidence(base);
    }
    per_layer_verdict(input, state, o, base)
}

fn per_layer_verdict(
    input: &GhostInput,
    state: &TrainingState,
    o: &GhostOptions,
    base: Evidence,
) -> Judged {
    let per_param = &state.per_param;
    let limits = Limits::of(o);
    let mut checked: Vec<&str> = vec![
        "global_step",
        "finite second moments",
        "gradients reached the optimizer",
    ];
    let mut not_checked: Vec<(&str, String)> = Vec::new();
    let mut findings: Vec<Finding> = Vec::new();
    let mut layer_values: Vec<(u64, f64)> = Vec::new();
    let mut outliers: Vec<Outlier> = Vec::new();
    let mut lifts: Vec<LayerLift> = Vec::new();
    let mut exploding: Vec<LayerLift> = Vec::new();
    let attribution = input.attribution.as_ref();
    match attribution {
        None => {
            let why = input.attribution_error.as_deref().unwrap_or("None");
            not_checked.push((
                "per_layer",
                format!("optimizer ids cannot be attributed to layers exactly: {why}"),
            ));
        }
        Some(a) if (a.layer_indices.len() as i128) < i128::from(limits.min_layers) => {
            not_checked.push((
                "per_layer",
                format!(
                    "only {} layer(s); a layer is compared with its peers, which needs at least \
                     {} (between two layers, which one is the outlier cannot be told)",
                    a.layer_indices.len(),
                    limits.min_layers
                ),
            ));
        }
        Some(a) => {
            checked.push("per-layer second moments");
            let (found, dead, values) = layer_comparison(per_param, a, limits.outlier_ratio);
            outliers = found;
            layer_values = values;
            let min_layers = usize::try_from(limits.min_layers).unwrap_or(usize::MAX);
            lifts = layer_lifts(per_param, a, limits.lift_share, min_layers);
            exploding = lifts
                .iter()
                .filter(|x| x.decades > limits.lift_limit(x.layer))
                .cloned()
                .collect();
            let layers = a.layer_indices.len();
            if !outliers.is_empty() {
                let mut ranked: Vec<&Outlier> = outliers.iter().collect();
                ranked.sort_by(|x, y| y.ratio.total_cmp(&x.ratio));
                let parts: Vec<String> = ranked
                    .iter()
                    .take(6)
                    .map(|x| {
                        format!(
                            "layer {} {}x {}",
                            x.layer,
                            significant(x.ratio, 3),
                            excerpt(&x.tensor)
                        )
                    })
                    .collect();
                findings.push(Finding::new(
                    Verdict::Warn,
                    "layer_outliers",
                    format!(
                        "{} of {layers} layers have second moments typically more than {}x \
                         those of the same tensors in the other layers (exploding gradients \
                         there): {}",
                        outliers.len(),
                        setting(limits.outlier_ratio),
                        parts.join("; ")
                    ),
                ));
            }
            if !exploding.is_empty() {
                let mut ranked: Vec<&LayerLift> = exploding.iter().collect();
                ranked.sort_by(|x, y| y.decades.total_cmp(&x.decades));
                let parts: Vec<String> = ranked
                    .iter()
                    .take(6)
                    .map(|x| {
                        format!(
                            "layer {} +{} decades ({}x) in {}/{} tensors",
                            x.layer,
                            fixed(x.decades, 2),
                            significant(pow10(x.decades), 3),
                            limits.lifted_count(x),
                            x.tensors
                        )
                    })
                    .collect();
                findings.push(Finding::new(
                    Verdict::Warn,
                    "exploding_layers",
                    format!(
                        "{} of {layers} layers have second moments more than {} decades ({}x; \
                         layer 0: {}) above the same tensors in their nearest {PEERS} layers \
                         (the median, the {SET_ASIDE} highest set aside) in at least {} of \
                         their tensors (exploding gradients there, a precursor of \
                         instability): {}",
                        exploding.len(),
                        setting(limits.lift_decades),
                        significant(pow10(limits.lift_decades), 3),
                        setting(limits.first_lift_decades),
                        percent(limits.lift_share, 0),
                        parts.join("; ")
                    ),
                ));
            }
            if !dead.is_empty() {
                let parts: Vec<String> = dead
                    .iter()
                    .take(6)
                    .map(|x| format!("layer {} {}", x.layer, excerpt(&x.tensor)))
                    .collect();
                findings.push(Finding::new(
                    Verdict::Warn,
                    "dead_tensors",
                    format!(
                        "{} tensors got no gradient (exp_avg_sq exactly zero) while the same \
                         tensor in other layers did: {}",
                        dead.len(),
                        parts.join("; ")
                    ),
                ));
            }
        }
    }
    let mut layer_means = Evidence::new();
    if let Some(a) = attribution {
        // Each layer's mean second moment: worth drawing whether compared or not.
        let value = values_by_id(per_param);
        let mut per_layer: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for ps in &a.params {
            if let Some(&v) = value.get(&ps.param_id) {
                per_layer.entry(ps.layer).or_default().push(v);
            }
        }
        for (layer, v) in &per_layer {
            layer_means.put(layer.to_string(), mean(v));
        }
    }

    let mut e = base;
    e.put(
        "checked",
        checked.iter().map(|c| Value::from(*c)).collect::<Vec<_>>(),
    );
    let mut unchecked_map = Evidence::new();
    for (k, v) in &not_checked {
        unchecked_map.put(*k, v.as_str());
    }
    e.put("not_checked", unchecked_map);
    e.put("findings", findings_value(&findings));
    e.put(
        "num_layers",
        attribution.map_or(0, |a| a.layer_indices.len()),
    );
    e.put("layer_exp_avg_sq", layer_means);
    let mut ratios = Evidence::new();
    for (layer, score) in &layer_values {
        ratios.put(layer.to_string(), *score);
    }
    e.put("layer_ratio_to_peers", ratios);
    let mut log_lift = Evidence::new();
    for x in &lifts {
        log_lift.put(x.layer.to_string(), x.decades);
    }
    e.put("layer_log_lift", log_lift);
    let mut exploding_layers: Vec<u64> = exploding.iter().map(|x| x.layer).collect();
    exploding_layers.sort_unstable();
    e.put("exploding_layers", exploding_layers.clone());
    let mut by_layer: Vec<&LayerLift> = exploding.iter().collect();
    by_layer.sort_by_key(|x| x.layer);
    let mut tensors = Vec::new();
    for x in by_layer {
        let limit = limits.lift_limit(x.layer);
        for (tensor, lift) in x.by_tensor.iter().filter(|(_, d)| *d > limit) {
            let mut t = Evidence::new();
            t.put("layer", x.layer);
            t.put("tensor", tensor.as_str());
            t.put("lift_decades", *lift);
            tensors.push(Value::Map(t));
        }
    }
    e.put("exploding_tensors", Value::List(tensors));
    let mut flagged: Vec<u64> = outliers.iter().map(|x| x.layer).collect();
    flagged.extend(exploding_layers);
    flagged.sort_unstable();
    flagged.dedup();
    e.put("flagged_layers", flagged);
    e.put(
        "outliers",
        Value::List(outliers.iter().map(Outlier::to_value).collect()),
    );
    e.put("thresholds", o.to_evidence());

    let unchecked: String = not_checked
        .iter()
        .map(|(k, v)| format!("; {} check not done: {v}", k.replace('_', "-")))
        .collect();
    if !findings.is_empty() {
        let message: Vec<String> = findings
            .iter()
            .map(|f| format!("{}: {}", f.rule, f.message))
            .collect();
        return Judged::bare(KIND, worst(&findings), message.join("; ") + &unchecked)
            .with_score(0.5)
            .with_evidence(e);
    }
    let done = match attribution {
        Some(a) if not_checked.iter().all(|(k, _)| *k != "per_layer") => format!(
            "; per-layer check: {} tensors in {} layers, no layer above {}x its peers, none \
             exploding ({}x its nearest layers)",
            a.params.len(),
            a.layer_indices.len(),
            setting(limits.outlier_ratio),
            significant(pow10(limits.lift_decades), 3)
        ),
        _ => String::new(),
    };
    let score = if not_checked.is_empty() { 0.9 } else { 0.8 };
    Judged::bare(
        KIND,
        Verdict::Pass,
        format!(
            "global_step={}; second moments finite and non-zero{done}{unchecked}",
            state.global_step
        ),
    )
    .with_score(score)
    .with_evidence(e)
}

/// A layer whose tensors typically sit far above the same tensors elsewhere.
#[derive(Debug, Clone, PartialEq)]
struct Outlier {
    layer: u64,
    ratio: f64,
    /// `(top: <tensor> <ratio>x)`: its most lifted tensor.
    tensor: String,
}

impl Outlier {
    fn to_value(&self) -> Value {
        let mut e = Evidence::new();
        e.put("layer", self.layer);
        e.put("ratio", self.ratio);
        e.put("tensor", self.tensor.as_str());
        Value::Map(e)
    }
}

/// A tensor with no gradient in a layer while its peers had one.
#[derive(Debug, Clone, PartialEq)]
struct Dead {
    layer: u64,
    tensor: String,
}

/// Each layer against its peers, like with like: every tensor's second
/// moment over the median of the same tensor (slot) across layers; a
/// layer's score is the median of its tensors' ratios (1.0 is typical).
/// Returns the outlier layers, the dead tensors and each layer's score,
/// in layer order. Attributed ids the state does not hold are passed over.
fn layer_comparison(
    per_param: &[ParamStat],
    attribution: &Attribution,
    outlier_ratio: f64,
) -> (Vec<Outlier>, Vec<Dead>, Vec<(u64, f64)>) {
    let value = values_by_id(per_param);
    let mut by_slot: BTreeMap<u64, Vec<(u64, f64)>> = BTreeMap::new();
    for ps in &attribution.params {
        if let Some(&v) = value.get(&ps.param_id) {
            by_slot.entry(ps.slot).or_default().push((ps.layer, v));
        }
    }
    let mut dead = Vec::new();
    let mut ratios: BTreeMap<u64, Vec<(f64, String)>> = BTreeMap::new();
    for (&slot, entries) in &by_slot {
        let tensor = slot_name(attribution, slot);
        let mid = median(entries.iter().map(|&(_, v)| v)).unwrap_or(f64::NAN);
        for &(layer, v) in entries {
            if v == 0.0 && mid > 0.0 {
                dead.push(Dead {
                    layer,
                    tensor: tensor.clone(),
                });
            }
            if mid > 0.0 {
                ratios
                    .entry(layer)
                    .or_default()
                    .push((v / mid, tensor.clone()));
            }
        }
    }
    let mut outliers = Vec::new();
    let mut scores = Vec::new();
    for (&layer, rs) in &ratios {
        let score = median(rs.iter().map(|(r, _)| *r)).unwrap_or(f64::NAN);
        scores.push((layer, score));
        if score > outlier_ratio {
            // The largest ratio (ties: the largest tensor name, then the first).
            let mut top: Option<&(f64, String)> = None;
            for item in rs {
                let larger =
                    top.is_none_or(|best| item.0 > best.0 || (item.0 == best.0 && item.1 > best.1));
                if larger {
                    top = Some(item);
                }
            }
            if let Some((ratio, tensor)) = top {
                outliers.push(Outlier {
                    layer,
                    ratio: score,
                    tensor: format!("(top: {tensor} {}x)", significant(*ratio, 3)),
                });
            }
        }
    }
    (outliers, dead, scores)
}
