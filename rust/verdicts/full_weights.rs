//! full_weights' rules: a full fine-tune's weights judged from a
//! [`FullWeightsInput`].
//!
//! The rule sets do not differ: any non-finite value FAILs, naming the
//! tensors; a model with no float tensors, and a note from the gatherer
//! (pickled or log-only checkpoints), SKIP; an unreadable file is an
//! ERROR; otherwise PASS with per-layer norms as evidence.

use crate::analysis::full_weights::FullWeights;
use crate::analysis::numerics::extremes;
use crate::io::excerpt::excerpt;
use crate::io::path_text;
use crate::store::probe_inputs::FullWeightsInput;
use crate::verdicts::number_text::significant;
use crate::verdicts::{error_text, Evidence, Judged, Value, Verdict};

pub const KIND: &str = "full_weights";

/// The resolved options (Python's `FullWeightsOptions`, read by attribute).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct FullWeightsOptions {
    pub rules: String,
    /// Tensors named in a non-finite finding's message (all are in the
    /// evidence).
    pub max_listed: i64,
}

/// `x`, or None where it is not finite.
fn finite_or_none(x: f64) -> Value {
    if x.is_finite() {
        Value::Float(x)
    } else {
        Value::Null
    }
}

fn evidence_of(input: &FullWeightsInput, w: &FullWeights, o: &FullWeightsOptions) -> Evidence {
    let mut e = Evidence::new();
    e.put("rules", o.rules.as_str());
    e.put(
        "model_file",
        input.model_file.as_deref().map(path_text::display),
    );
    e.put(
        "files",
        w.files
            .iter()
            .map(|f| path_text::display(f))
            .collect::<Vec<_>>(),
    );
    e.put("num_tensors", w.tensors.len());
    e.put("num_layers", w.layers.len());
    e.put("tensor_bytes", w.tensor_bytes);
    let skipped: Vec<Value> = w
        .skipped
        .iter()
        .map(|(name, dtype)| {
            let mut s = Evidence::new();
            s.put("name", name.as_str());
            s.put("dtype", dtype.as_str());
            Value::Map(s)
        })
        .collect();
    e.put("skipped_tensors", Value::List(skipped));
    e.put("total_norm", finite_or_none(w.total_norm));
    e.put("other_norm", finite_or_none(w.other_norm));
    let mut layers = Evidence::new();
    for layer in &w.layers {
        layers.put(layer.layer.to_string(), finite_or_none(layer.norm));
    }
    e.put("layer_l2_norm", layers);
    e.put("nonfinite_total", w.nonfinite_total);
    e
}

/// The verdict for one full-model version.
pub fn judge_full_weights(input: &FullWeightsInput, o: &FullWeightsOptions) -> Judged {
    if let Some(note) = &input.note {
        return Judged::bare(KIND, Verdict::Skip, note.clone());
    }
    let Some(w) = &input.weights else {
        let why = error_text(input.error.as_ref());
        return Judged::bare(KIND, Verdict::Error, format!("full_weights: {why}"));
    };
    let mut evidence = evidence_of(input, w, o);
    if w.nonfinite_total != 0 {
        let bad: Vec<_> = w.tensors.iter().filter(|t| t.nonfinite != 0).collect();
        // Rule(int, low=1): at least one is listed.
        let listed = usize::try_from(o.max_listed).unwrap_or(0);
        let shown = bad
            .iter()
            .take(listed)
            .map(|t| format!("{} ({})", excerpt(&t.name), t.nonfinite))
            .collect::<Vec<_>>()
            .join(", ");
        let bad_len = i64::try_from(bad.len()).unwrap_or(i64::MAX);
        let more = if bad_len > o.max_listed {
            format!(
                " and {} more",
                i128::from(bad_len) - i128::from(o.max_listed)
            )
        } else {
            String::new()
        };
        let mut tensors = Evidence::new();
        for t in &bad {
            tensors.put(t.name.clone(), t.nonfinite);
        }
        evidence.put("nonfinite_tensors", tensors);
        let layers: Vec<u64> = w
            .layers
            .iter()
            .filter(|l| l.nonfinite != 0)
            .map(|l| l.layer)
            .collect();
        evidence.put("nonfinite_layers", layers);
        let message = format!(
            "nonfinite_weights: {} NaN/inf values in {} of {} tensors ({shown}{more}): the model \
             is corrupt and produces NaN outputs",
            w.nonfinite_total,
            bad.len(),
            w.tensors.len()
        );
        return Judged::bare(KIND, Verdict::Fail, message)
            .with_score(0.0)
            .with_evidence(evidence);
    }
    if w.tensors.is_empty() {
        let file = input
            .model_file
            .as_deref()
            .map_or_else(|| "None".to_string(), path_text::display);
        let message = format!(
            "no float tensors in {file} ({} of other dtypes), so there are no weights to check",
            w.skipped.len()
        );
        return Judged::bare(KIND, Verdict::Skip, message).with_evidence(evidence);
    }
    let norms: Vec<f64> = w.layers.iter().map(|l| l.norm).collect();
    let spread = match extremes(norms.iter().copied()) {
        None if norms.is_empty() => String::new(),
        None => format!(", layer norms NaN over {} layers", w.layers.len()),
        Some((lo, hi)) => format!(
            ", layer norms {}-{} over {} layers",
            significant(lo, 4),
            significant(hi, 4),
            w.layers.len()
        ),
    };
    let message = format!(
        "{} tensors in {} file(s), all finite; ||W|| {}{spread}",
        w.tensors.len(),
        w.files.len(),
        significant(w.total_norm, 4)
    );
    Judged::bare(KIND, Verdict::Pass, message)
        .with_score(1.0)
        .with_evidence(evidence)
}

#[cfg(test)]
mod tests;
