//! adapter_weights' rules (both rule sets): a LoRA adapter's weights
//! judged from a [`WeightsInput`] and, where there is one, the version
//! before it.
//!
//! dlm-sway has no weight-space probe, so `rules="sway"` and `"robust"`
//! run the same checks. Worst first: unreadable weights or no config
//! (ERROR), non-finite values (FAIL), every module's dW zero (FAIL), then
//! WARN findings (dead modules, dW energy in a few modules, a version
//! identical to the one before, A factors far above their initial scale),
//! else PASS.

pub mod factor_scale;
#[cfg(test)]
mod tests;

use crate::analysis::adapter_weights::{
    is_frozen_original, AdapterWeights, LoraModuleStats, TensorStats,
};
use crate::analysis::numerics::{count_median, fsum, median, CountMedian};
use crate::io::excerpt::excerpt;
use crate::io::path_text;
use crate::store::probe_inputs::WeightsInput;
use crate::verdicts::number_text::{percent, significant};
use crate::verdicts::{
    error_text, findings_value, worst, Evidence, Finding, Judged, Value, Verdict,
};

pub const KIND: &str = "adapter_weights";

/// The resolved options (Python's `WeightsOptions`, read by attribute).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsOptions {
    pub rules: String,
    /// A module whose ||dW|| is at most this fraction of the median
    /// module's is dead (0: exactly zero only).
    pub dead_relative_norm: f64,
    /// WARN when the top 5% of modules hold more than this share of the
    /// dW energy.
    pub max_top_share: f64,
    /// Adapters with fewer modules are not judged on energy concentration.
    pub min_modules_for_share: i64,
}

/// How many names a message lists before "and N more".
const NAMES_SHOWN: usize = 6;

/// Names from the file for a message: the first few, each an excerpt.
pub(crate) fn names_text(names: &[&str]) -> String {
    let shown: Vec<String> = names.iter().take(NAMES_SHOWN).map(|n| excerpt(n)).collect();
    let mut text = shown.join(", ");
    if names.len() > NAMES_SHOWN {
        text.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN));
    }
    text
}

/// Python's `m.delta_fro or 0.0`: None and zero are 0.0.
fn norm_of(m: &LoraModuleStats) -> f64 {
    match m.delta_fro {
        Some(x) if x != 0.0 => x,
        _ => 0.0,
    }
}

/// What identifies a version's training state: each module's name and
/// factor norms, in order.
fn same_fingerprint(a: &AdapterWeights, b: &AdapterWeights) -> bool {
    a.modules.len() == b.modules.len()
        && a.modules
            .iter()
            .zip(&b.modules)
            .all(|(x, y)| x.name == y.name && x.norm_a == y.norm_a && x.norm_b == y.norm_b)
}

fn base_evidence(o: &WeightsOptions, w: &AdapterWeights) -> Evidence {
    let mut base = Evidence::new();
    base.put("rules", o.rules.as_str());
    base.put("num_modules", w.modules.len());
    base.put("num_other_tensors", w.other_tensors.len());
    base.put("tensor_bytes", w.tensor_bytes);
    if let Some(c) = &w.config {
        let mut config = Evidence::new();
        config.put("r", c.r);
        config.put("lora_alpha", c.lora_alpha);
        config.put("use_rslora", c.use_rslora);
        config.put("use_dora", c.use_dora);
        config.put("target_modules", c.target_modules.clone());
        config.put("modules_to_save", c.modules_to_save.clone());
        config.put("format", c.format.as_str());
        base.put("config", config);
    }
    base
}

/// The factor a method starts at zero (ΔW = 0 until it moves).
fn zero_init_factor(format: &str) -> &'static str {
    match format {
        "lycoris-loha" => "hada_w2_a",
        "lycoris-lokr" => "lokr_w2 or lokr_w2_b",
        "kohya" => "lora_up",
        "mlx" => "lora_b",
        _ => "lora_B",
    }
}

/// What a message calls the modules of an adapter of `format`.
fn method_noun(format: &str) -> &'static str {
    match format {
        "lycoris-loha" => "LyCORIS LoHa",
        "lycoris-lokr" => "LyCORIS LoKr",
        _ => "LoRA",
    }
}

/// An adapter of another PEFT method (IA3, prompt tuning, LoHa, ...): it
/// has no ΔW = B·A, so what is judged is what breaks any adapter. Non-finite
/// values FAILed above; here, tensors that are all zeros: every one of them
/// (IA3 vectors of zeros silence the activations they scale; zero prompt
/// embeddings carry nothing) FAILs, some of them WARN.
///
/// PEFT's frozen copies of `modules_to_save` modules (`original_module`,
/// kept by a save of the whole `PeftModel.state_dict()`) are the base
/// model's weights, not the adapter's: they are left out (and named in the
/// evidence), so a base bias initialised to zeros is not taken for a dead
/// adapter tensor.
fn judge_other_method(w: &AdapterWeights, method: &str, mut evidence: Evidence) -> Judged {
    let (frozen, tensors): (Vec<&TensorStats>, Vec<&TensorStats>) = w
        .other_tensors
        .iter()
        .partition(|t| is_frozen_original(&t.name));
    let zero: Vec<&str> = tensors
        .iter()
        .filter(|t| t.numel > 0 && t.norm == 0.0)
        .map(|t| t.name.as_str())
        .collect();
    evidence.put("peft_type", method);
    evidence.put("zero_tensors", zero.clone());
    let frozen: Vec<&str> = frozen.iter().map(|t| t.name.as_str()).collect();
    evidence.put("frozen_originals", frozen);
    let n = tensors.len();
    let (verdict, score, message) = if n == 0 {
        (
            Verdict::Skip,
            None,
            format!("{method} adapter with no tensors: nothing to judge"),
        )
    } else if zero.len() == n {
        (
            Verdict::Fail,
            Some(0.0),
            format!(
                "zero_weights: all {n} tensors of this {method} adapter are zeros: it silences \
                 or carries nothing"
            ),
        )
    } else if !zero.is_empty() {
        (
            Verdict::Warn,
            Some(0.5),
            format!(
                "zero_tensors: {} of {n} tensors of this {method} adapter are all zeros ({})",
                zero.len(),
                names_text(&zero)
            ),
        )
    } else if let Some(first) = w.unformed_modules.first() {
        // A LyCORIS file none of whose modules' dW could be formed.
        (
            Verdict::Skip,
            None,
            format!(
                "dW not judged: {} modules of this {method} file are not formed (e.g. {}); its \
                 {n} tensors are finite and none all zeros",
                w.unformed_modules.len(),
                excerpt(first)
            ),
        )
    } else {
        (
            Verdict::Pass,
            Some(1.0),
            format!(
                "{method} adapter: {n} tensors, all finite and none all zeros (the dW rules are \
                 LoRA's; a {method} adapter is judged on these two)"
            ),
        )
    };
    let judged = Judged::bare(KIND, verdict, message).with_evidence(evidence);
    match score {
        Some(s) => judged.with_score(s),
        None => judged,
    }
}

/// A note the gatherer left (SKIP), or what stops any judgement (ERROR).
fn unjudgeable(input: &WeightsInput) -> Option<Judged> {
    if let Some(note) = &input.note {
        return Some(Judged::bare(KIND, Verdict::Skip, note.clone()));
    }
    let Some(w) = &input.weights else {
        // The table already names the probe: the message starts with the file.
        let message = error_text(input.error.as_ref());
        return Some(Judged::bare(KIND, Verdict::Error, message));
    };
    if w.config.is_none() {
        let message = format!(
            "no adapter_config.json beside {}, so the scale of \
             dW = (alpha / r) * B @ A is unknown and the adapter cannot be loaded as is",
            path_text::display(&w.path)
        );
        return Some(Judged::bare(KIND, Verdict::Error, message));
    }
    None
}

/// The verdict for one adapter version (`previous`: the version before it).
pub fn judge_weights(
    input: &WeightsInput,
    previous: Option<&WeightsInput>,
    o: &WeightsOptions,
) -> Judged {
    if let Some(j) = unjudgeable(input) {
        return j;
    }
    let (Some(w), Some(config)) = (
        input.weights.as_ref(),
        input.weights.as_ref().and_then(|w| w.config.as_ref()),
    ) else {
        return Judged::bare(KIND, Verdict::Error, "no weights");
    };
    let modules = &w.modules;
    let base = base_evidence(o, w);
    if w.nonfinite_total != 0 {
        let mut bad: Vec<&str> = modules
            .iter()
            .filter(|m| m.nonfinite_a != 0 || m.nonfinite_b != 0 || m.magnitude_nonfinite != 0)
            .map(|m| m.name.as_str())
            .collect();
        bad.extend(
            w.other_tensors
                .iter()
                .filter(|t| t.nonfinite != 0)
                .map(|t| t.name.as_str()),
        );
        let message = format!(
            "nonfinite_weights: {} NaN/inf values in {} tensors ({}): the adapter is corrupt \
             and produces NaN outputs",
            w.nonfinite_total,
            bad.len(),
            names_text(&bad)
        );
        let mut evidence = base;
        evidence.put("nonfinite_total", w.nonfinite_total);
        evidence.put("nonfinite_modules", bad);
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_evidence(evidence);
    }
    let mut base = base;
    if !w.unformed_modules.is_empty() {
        base.put("unformed_modules", w.unformed_modules.clone());
    }
    if let Some(method) = config.peft_type.as_deref().filter(|t| *t != "LORA") {
        // LyCORIS LoHa/LoKr modules whose dW was formed are judged by the
        // dW rules below; a PEFT LOHA/LOKR/IA3/... adapter, or a LyCORIS
        // file with no formed module, by what breaks any adapter.
        base.put("peft_type", method);
        if !config.format.starts_with("lycoris") || modules.is_empty() {
            return judge_other_method(w, method, base);
        }
    }
    if config.merged_linear {
        // The non-finite check above read every tensor; the factors are
        // grouped per part of a fused projection, no B·A per module.
        let message = format!(
            "an old PEFT MergedLinear adapter (enable_lora in its config, alpaca-lora era): its \
             {} tensors are finite, but its factors are stacked per part of a fused projection \
             (lora_A one rank-{} block per enabled part, lora_B a grouped 1-D convolution), \
             not one B·A per module, so dW is not judged",
            w.other_tensors.len(),
            config.r
        );
        let mut evidence = base;
        evidence.put("merged_linear", true);
        return Judged::bare(KIND, Verdict::Skip, message).with_evidence(evidence);
    }
    if modules.is_empty() {
        let message = format!(
            "no LoRA factors in {} (only {} other tensors), so there is no dW to judge",
            path_text::display(&w.path),
            w.other_tensors.len()
        );
        return Judged::bare(KIND, Verdict::Skip, message).with_evidence(base);
    }

    let norms: Vec<f64> = modules.iter().map(norm_of).collect();
    let energy: Vec<f64> = norms.iter().map(|n| n * n).collect();
    // An overflow of finite squares is an infinite total, not an error.
    let total_energy = fsum(energy.iter().copied()).unwrap_or(f64::INFINITY);
    let mid = median(norms.iter().copied()).unwrap_or(0.0);
    let dead: Vec<&str> = modules
        .iter()
        .zip(&norms)
        .filter(|(_, &n)| n == 0.0 || (mid > 0.0 && n <= o.dead_relative_norm * mid))
        .map(|(m, _)| m.name.as_str())
        .collect();
    // Modules by dW energy, largest first; ties keep the file's order. NaN
    // (a NaN norm the reader could not count as non-finite) ranks last.
    let mut ranked: Vec<usize> = (0..energy.len()).collect();
    ranked.sort_by(|&a, &b| {
        let (x, y) = (energy.get(a), energy.get(b));
        let key = |e: Option<&f64>| e.copied().filter(|v| !v.is_nan());
        match (key(x), key(y)) {
            (Some(x), Some(y)) => y.total_cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        }
    });
    let top: Vec<Value> = ranked
        .iter()
        .take(5)
        .filter_map(|&i| Some((modules.get(i)?, *energy.get(i)?)))
        .map(|(m, e)| {
            let mut item = Evidence::new();
            item.put("module", m.name.as_str());
            item.put(
                "share",
                if total_energy > 0.0 {
                    e / total_energy
                } else {
                    0.0
                },
            );
            Value::Map(item)
        })
        .collect();
    let mut layer_energy = Evidence::new();
    for layer in &w.layers {
        layer_energy.put(layer.layer.to_string(), layer.delta_fro_sq);
    }
    let used: Vec<u64> = modules.iter().filter_map(|m| m.rank_used).collect();
    let used_min = used.iter().min().copied();
    let used_max = used.iter().max().copied();
    let mut rank_used = Evidence::new();
    rank_used.put("min", used_min);
    rank_used.put(
        "median",
        match count_median(&used) {
            None => Value::Null,
            Some(CountMedian::Count(n)) => Value::from(n),
            Some(CountMedian::Between(x)) => Value::Float(x),
        },
    );
    rank_used.put("max", used_max);
    let stable: Vec<f64> = modules.iter().map(|m| m.stable_rank).collect();
    let total_delta_fro = total_energy.sqrt();

    let mut evidence = base;
    evidence.put("total_delta_fro", total_delta_fro);
    evidence.put("layer_delta_energy", layer_energy);
    evidence.put("top_modules", Value::List(top));
    evidence.put("dead_modules", dead.clone());
    evidence.put("rank_configured", config.r);
    // Each module's own rank (its factors' shape): `rank_pattern` (PEFT,
    // AdaLoRA, our extractor) gives modules ranks other than `r`.
    let nominal_min = modules.iter().map(|m| m.rank).min();
    let nominal_max = modules.iter().map(|m| m.rank).max();
    let mut rank_nominal = Evidence::new();
    rank_nominal.put("min", nominal_min);
    rank_nominal.put("max", nominal_max);
    evidence.put("rank_nominal", rank_nominal);
    evidence.put("rank_used", rank_used);
    evidence.put(
        "stable_rank_median",
        median(stable.iter().copied()).unwrap_or(f64::NAN),
    );
    if dead.len() == modules.len() {
        let message = format!(
            "dead_adapter: every one of the {} LoRA modules has dW = 0 \
             ({} never moved from its zero init): the adapter changes nothing",
            modules.len(),
            zero_init_factor(&config.format)
        );
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_evidence(evidence);
    }

    let mut findings: Vec<Finding> = Vec::new();
    findings.extend(factor_scale::factor_scale(config, modules, &mut evidence));
    if !dead.is_empty() {
        findings.push(Finding::new(
            Verdict::Warn,
            "dead_modules",
            format!(
                "{} of {} modules have dW = 0: {}",
                dead.len(),
                modules.len(),
                names_text(&dead)
            ),
        ));
    }
    let n_modules = i64::try_from(modules.len()).unwrap_or(i64::MAX);
    if n_modules >= o.min_modules_for_share && total_energy > 0.0 {
        let k = (modules.len() / 20).max(1);
        let top_k = ranked.get(..k).unwrap_or(&ranked);
        let top_energy = fsum(top_k.iter().filter_map(|&i| energy.get(i).copied()));
        let share = top_energy.unwrap_or(f64::INFINITY) / total_energy;
        if share > o.max_top_share {
            let names: Vec<&str> = top_k
                .iter()
                .filter_map(|&i| modules.get(i).map(|m| m.name.as_str()))
                .collect();
            findings.push(Finding::new(
                Verdict::Warn,
                "concentrated",
                format!(
                    "{k} of {} modules hold {} of the dW energy (more than {}): {}",
                    modules.len(),
                    percent(share, 0),
                    percent(o.max_top_share, 0),
                    names_text(&names)
                ),
            ));
        }
    }
    if let Some((before_input, before)) = previous.and_then(|p| p.weights.as_ref().map(|w| (p, w)))
    {
        evidence.put(
            "previous_version",
            path_text::display(&before_input.adapter),
        );
        let squares = before.modules.iter().map(norm_of).map(|n| n * n);
        evidence.put(
            "total_delta_fro_previous",
            fsum(squares).unwrap_or(f64::INFINITY).sqrt(),
        );
        if same_fingerprint(before, w) {
            findings.push(Finding::new(
                Verdict::Warn,
                "unchanged",
                format!(
                    "identical to the previous version {}: no module's ||A|| or ||B|| changed, \
                     so this version trained nothing new",
                    path_text::last_name(&before_input.adapter)
                ),
            ));
        }
    }

    let layers = if w.layers.is_empty() {
        "no".to_string()
    } else {
        w.layers.len().to_string()
    };
    let or_none = |v: Option<u64>| v.map_or_else(|| "None".to_string(), |n| n.to_string());
    let lycoris = config.format.starts_with("lycoris");
    let of = match (nominal_min, nominal_max) {
        // A LyCORIS module's rank is its formed product's, per module.
        (Some(lo), Some(hi)) if lo != hi && lycoris => format!("{lo}-{hi}"),
        (Some(lo), Some(hi)) if lo != hi => format!("{lo}-{hi} (rank_pattern)"),
        (Some(rank), _) => rank.to_string(),
        _ => config.r.to_string(),
    };
    let summary = format!(
        "{} {} modules in {layers} layers, ||dW|| {}, rank used {}-{} of {of}{}",
        modules.len(),
        method_noun(&config.format),
        significant(total_delta_fro, 4),
        or_none(used_min),
        or_none(used_max),
        match w.unformed_modules.first() {
            Some(first) => format!(
                "; dW of {} more modules not formed (e.g. {})",
                w.unformed_modules.len(),
                excerpt(first)
            ),
            None => String::new(),
        },
    );
    evidence.put("findings", findings_value(&findings));
    if findings.is_empty() {
        return Judged::bare(KIND, Verdict::Pass, summary)
            .with_score(1.0)
            .with_evidence(evidence);
    }
    let message = findings
        .iter()
        .map(|f| format!("{}: {}", f.rule, f.message))
        .collect::<Vec<_>>()
        .join("; ");
    Judged::bare(KIND, worst(&findings), format!("{message} ({summary})"))
        .with_score(0.5)
        .with_evidence(evidence)
}
