//! gap_monitor's rules: the GAP monitor's records (gradient, activation and
//! parameter statistics of sampled steps) judged after, or during, a run.
//!
//! Each rule is built from what the failure is, and from what a healthy run
//! does that looks like it:
//!
//! - `nonfinite` (FAIL): NaN/inf in the parameters or activations, or in
//!   the gradients at two sampled steps in a row or at the last one. One
//!   isolated step of non-finite gradients is a WARN: under fp16 a loss
//!   scaler overflows now and then by design and skips that step.
//! - `exploding_layer` (WARN; FAIL at `explode_fail_ratio` or when it never
//!   came back): one layer's gradient norm jumps `explode_ratio` above both
//!   its own recent level and its usual ratio to the other layers' median.
//!   A hard batch lifts every layer at once, which moves neither the ratio
//!   nor, being measured against peers, the verdict; layers that are
//!   simply larger than others (the embeddings, the head) are compared
//!   with their own usual ratio, not with their peers' level.
//! - `vanishing_grads` (WARN): a layer whose gradient is exactly zero at
//!   more than `vanish_share` of the sampled steps while the model's is not
//!   (frozen layers have no gradient at all and are not in the records).
//! - `activations_growing` (WARN): the activations' RMS (global or one
//!   layer's) ends `activation_growth_decades` orders of magnitude above
//!   where it started (medians of the first and last three samples).

mod rules;
pub mod series;
#[cfg(test)]
mod tests;

pub use crate::store::probe_inputs::GapInput;
use crate::verdicts::{findings_value, worst, Evidence, Finding, Judged, Value, Verdict};

pub const KIND: &str = "gap_monitor";

/// Layers and points the evidence's per-layer gradient norms keep (for
/// the report's plot).
const PLOT_LAYERS: usize = 64;
const PLOT_POINTS: usize = 256;

/// The resolved options (Python's `GapOptions`, read by attribute). Both
/// rule sets judge alike: the seeds never read the monitor's records.
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct GapOptions {
    pub rules: String,
    pub explode_ratio: Option<f64>,
    pub explode_fail_ratio: Option<f64>,
    pub min_history: Option<i64>,
    pub vanish_share: Option<f64>,
    pub min_samples: Option<i64>,
    pub activation_growth_decades: Option<f64>,
}

impl GapOptions {
    /// The defaults, as Python resolves them.
    pub fn defaults(rules: &str) -> GapOptions {
        GapOptions {
            rules: rules.to_string(),
            explode_ratio: Some(10.0),
            explode_fail_ratio: Some(100.0),
            min_history: Some(3),
            vanish_share: Some(0.5),
            min_samples: Some(4),
            activation_growth_decades: Some(3.0),
        }
    }

    fn resolved(&self) -> Resolved {
        let d = GapOptions::defaults(&self.rules);
        let count = |v: Option<i64>, d: Option<i64>| {
            usize::try_from(v.or(d).unwrap_or(1)).unwrap_or(1).max(1)
        };
        Resolved {
            explode_ratio: self.explode_ratio.or(d.explode_ratio).unwrap_or(10.0),
            explode_fail_ratio: self
                .explode_fail_ratio
                .or(d.explode_fail_ratio)
                .unwrap_or(100.0),
            min_history: count(self.min_history, d.min_history),
            vanish_share: self.vanish_share.or(d.vanish_share).unwrap_or(0.5),
            min_samples: count(self.min_samples, d.min_samples),
            growth_decades: self
                .activation_growth_decades
                .or(d.activation_growth_decades)
                .unwrap_or(3.0),
        }
    }
}

/// The options with every default filled in.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    explode_ratio: f64,
    explode_fail_ratio: f64,
    min_history: usize,
    vanish_share: f64,
    min_samples: usize,
    growth_decades: f64,
}

/// The verdict on a run's GAP records.
pub fn judge_gap(input: &GapInput, o: &GapOptions) -> Judged {
    judge_gap_records(input, o, false)
}

/// [`judge_gap`], or (`online`) as the guard judges a run still training:
/// only what no later record can undo is a FAIL.
pub fn judge_gap_records(input: &GapInput, o: &GapOptions, online: bool) -> Judged {
    let log = match (&input.log, &input.error) {
        (Some(log), _) if !log.records.is_empty() => log,
        (_, Some(e)) => return Judged::bare(KIND, Verdict::Error, e.to_string()),
        _ => return Judged::bare(KIND, Verdict::Skip, "no GAP monitor records in the logs"),
    };
    let r = o.resolved();
    // Each kind's series, built once: [grad, activation, activation_grad, param]
    let [grads, activations, activation_grads, params] =
        series::KINDS.map(|kind| series::KindSeries::of(kind, &log.records));
    let mut e = Evidence::new();
    e.put("rules", o.rules.as_str());
    e.put("records", log.records.len());
    e.put("first_step", log.records.first().map(|x| x.step));
    e.put("last_step", log.records.last().map(|x| x.step));
    e.put("thinned", log.thinned);
    let kinds: Vec<&str> = series::KINDS
        .iter()
        .zip([&grads, &activations, &activation_grads, &params])
        .filter(|(_, kind_series)| kind_series.present())
        .map(|(kind, _)| *kind)
        .collect();
    e.put(
        "kinds",
        kinds.iter().map(|k| format!("{k}s")).collect::<Vec<_>>(),
    );
    let mut findings: Vec<Finding> = Vec::new();
    findings.extend(rules::nonfinite(&log.records, &mut e, online));
    findings.extend(rules::exploding_layer(
        &log.records,
        &grads,
        &r,
        &mut e,
        online,
    ));
    findings.extend(rules::vanishing(&grads, &r, &mut e));
    findings.extend(rules::activations_growing(&activations, &r, &mut e));
    e.put("layer_grad_norms", plot_series(&log.records, &grads));
    let verdict = worst(&findings);
    let message = match findings.iter().filter(|f| f.verdict == verdict).count() {
        0 => format!(
            "{} sampled steps ({}-{}): gradients and activations finite, no layer out of line",
            log.records.len(),
            log.records.first().map_or(0, |x| x.step),
            log.records.last().map_or(0, |x| x.step),
        ),
        _ => findings
            .iter()
            .filter(|f| f.verdict == verdict)
            .map(|f| f.message.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    };
    e.put("findings", findings_value(&findings));
    let score = match verdict {
        Verdict::Pass => 1.0,
        Verdict::Warn => 0.5,
        _ => 0.0,
    };
    Judged::bare(KIND, verdict, message)
        .with_score(score)
        .with_evidence(e)
}

/// Per-layer gradient norms for the report's plot: at most `PLOT_LAYERS`
/// layers and `PLOT_POINTS` evenly spaced samples each.
fn plot_series(
    records: &[crate::formats::logs::gap_log::GapRecord],
    grads: &series::KindSeries,
) -> Value {
    let n = records.len();
    let stride = n.div_ceil(PLOT_POINTS).max(1);
    let mut out = Evidence::new();
    for (layer, values) in grads.layers.iter().take(PLOT_LAYERS) {
        let points: Vec<(i64, f64)> = (0..n)
            .step_by(stride)
            .filter(|&t| !values[t].is_nan())
            .map(|t| (records[t].step, values[t]))
            .collect();
        out.put(layer.to_owned(), Value::Points(points));
    }
    Value::Map(out)
}
