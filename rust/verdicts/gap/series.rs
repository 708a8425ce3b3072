//! The GAP records as the rules read them: per kind, each sampled step's
//! global size and non-finite count, and each layer's size over the steps.
//!
//! Sizes are the monitor's `l2_norm` for parameters and gradients (the norm
//! clipping sees) and `rms` for activations and their gradients.

use crate::formats::logs::gap_log::GapRecord;

/// Layers kept per kind (a model has tens to a few hundred).
pub const MAX_LAYERS: usize = 4096;

/// The monitor's kinds, as its keys spell them (`gap/summary/{kind}s/`).
pub const KINDS: [&str; 4] = ["grad", "activation", "activation_grad", "param"];

/// The size statistic of a kind.
pub fn size_stat(kind: &str) -> &'static str {
    if matches!(kind, "grad" | "param") {
        "l2_norm"
    } else {
        "rms"
    }
}

/// One kind's series over the sampled steps (NaN where a record lacks it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindSeries {
    pub size: Vec<f64>,
    pub nonfinite: Vec<f64>,
    /// `(layer, size at each sampled step)`, layers in first-seen order.
    pub layers: Vec<(String, Vec<f64>)>,
}

impl KindSeries {
    /// The series of `kind` in `records`.
    pub fn of(kind: &str, records: &[GapRecord]) -> KindSeries {
        let prefix = format!("gap/summary/{kind}s/");
        let stat = size_stat(kind);
        let n = records.len();
        let mut out = KindSeries {
            size: vec![f64::NAN; n],
            nonfinite: vec![f64::NAN; n],
            layers: Vec::new(),
        };
        let mut index: std::collections::HashMap<String, usize> = Default::default();
        for (t, record) in records.iter().enumerate() {
            for (key, value) in &record.stats {
                let Some(rest) = key.strip_prefix(&prefix) else {
                    continue;
                };
                if rest == stat {
                    out.size[t] = *value;
                } else if rest == "nonfinite" {
                    out.nonfinite[t] = *value;
                } else if let Some(layer) = rest
                    .strip_prefix("layers/")
                    .and_then(|l| l.strip_suffix(stat))
                    .and_then(|l| l.strip_suffix('/'))
                {
                    let slot = match index.get(layer) {
                        Some(&i) => i,
                        None if out.layers.len() < MAX_LAYERS => {
                            index.insert(layer.to_string(), out.layers.len());
                            out.layers.push((layer.to_string(), vec![f64::NAN; n]));
                            out.layers.len() - 1
                        }
                        None => continue,
                    };
                    out.layers[slot].1[t] = *value;
                }
            }
        }
        out
    }

    /// Whether any record holds this kind at all.
    pub fn present(&self) -> bool {
        self.size.iter().any(|v| !v.is_nan()) || !self.layers.is_empty()
    }
}

/// The tensors and layers a record names as holding NaN/inf: per-layer
/// non-finite counts, top offenders whose statistic is not finite, and
/// inline per-tensor counts; at most `cap`, and how many in all.
pub fn nonfinite_names(record: &GapRecord, kind: &str, cap: usize) -> (Vec<String>, usize) {
    let summary = format!("gap/summary/{kind}s/");
    let tensor = format!("gap/{kind}s/");
    let mut names: Vec<String> = Vec::new();
    let mut seen: std::collections::HashSet<String> = Default::default();
    for (key, value) in &record.stats {
        let name = if let Some(rest) = key.strip_prefix(&summary) {
            if let Some(layer) = rest
                .strip_prefix("layers/")
                .and_then(|l| l.strip_suffix("/nonfinite"))
            {
                (*value > 0.0).then(|| layer.to_string())
            } else {
                rest.split_once('/')
                    .filter(|(head, _)| head.starts_with("top_") && !value.is_finite())
                    .map(|(_, name)| name.to_string())
            }
        } else {
            key.strip_prefix(&tensor)
                .and_then(|rest| rest.strip_suffix("/nonfinite"))
                .filter(|_| *value > 0.0)
                .map(str::to_string)
        };
        if let Some(name) = name {
            if names.len() < cap && !seen.contains(&name) {
                names.push(name.clone());
            }
            seen.insert(name);
        }
    }
    (names, seen.len())
}
