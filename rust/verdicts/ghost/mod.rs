//! gradient_ghost's rules (both rule sets): the optimizer state judged
//! from a [`GhostInput`].
//!
//! What the rules mean is told in `python/adapterprobe/probes/ghost.py`'s
//! module doc. This is their one implementation: unit tests per rule here,
//! and `tests/test_ghost_kernel.py` holds the verdicts to their properties
//! (storage order, scale, both sides of each threshold) and to real runs.

mod robust;
mod sway;

use crate::analysis::second_moment::ParamStat;
use crate::error::Area;
use crate::store::probe_inputs::GhostInput;
use crate::verdicts::{Evidence, Judged, Value, Verdict};

pub const KIND: &str = "gradient_ghost";
/// How a state holding values no optimizer writes is reported.
pub const TAMPERED: &str = "corrupted or tampered optimizer state";

/// The resolved options (Python's `GhostOptions`, read by attribute).
/// Options a rule set does not use are None; one it uses that is None
/// takes the rule set's default (Python's options object never leaves it so).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct GhostOptions {
    pub rules: String,
    pub min_steps_threshold: Option<i64>,
    // rules="sway"
    pub undertrained_layer_ratio: Option<f64>,
    pub layer_failure_frac: Option<f64>,
    // rules="robust"
    pub layer_outlier_ratio: Option<f64>,
    pub min_layers_compared: Option<i64>,
    pub layer_lift_decades: Option<f64>,
    pub first_layer_lift_decades: Option<f64>,
    pub layer_lift_share: Option<f64>,
}

impl GhostOptions {
    /// The defaults of `rules` (`"robust"` or `"sway"`), as Python resolves them.
    pub fn defaults(rules: &str) -> GhostOptions {
        let sway = rules == "sway";
        let robust = |x| (!sway).then_some(x);
        GhostOptions {
            rules: rules.to_string(),
            min_steps_threshold: Some(if sway { 50 } else { 20 }),
            undertrained_layer_ratio: sway.then_some(2.0),
            layer_failure_frac: sway.then_some(0.3),
            layer_outlier_ratio: robust(1000.0),
            min_layers_compared: (!sway).then_some(3),
            layer_lift_decades: robust(1.0),
            first_layer_lift_decades: robust(1.5),
            layer_lift_share: robust(0.9),
        }
    }

    fn min_steps(&self) -> i64 {
        let default = if self.rules == "sway" { 50 } else { 20 };
        self.min_steps_threshold.unwrap_or(default)
    }

    /// `to_dict()`: `rules` and the options the rule set uses, in field order.
    pub fn to_evidence(&self) -> Evidence {
        let mut e = Evidence::new();
        e.put("rules", self.rules.as_str());
        e.put("min_steps_threshold", self.min_steps());
        if self.rules == "sway" {
            e.put("undertrained_layer_ratio", sway::ratio(self));
            e.put("layer_failure_frac", sway::failure_frac(self));
        } else {
            let r = robust::Limits::of(self);
            e.put("layer_outlier_ratio", r.outlier_ratio);
            e.put("min_layers_compared", r.min_layers);
            e.put("layer_lift_decades", r.lift_decades);
            e.put("first_layer_lift_decades", r.first_lift_decades);
            e.put("layer_lift_share", r.lift_share);
        }
        e
    }
}

/// The verdict for one adapter version.
pub fn judge_ghost(input: &GhostInput, o: &GhostOptions) -> Judged {
    if let Some(note) = &input.note {
        let mut e = Evidence::new();
        e.put("optimizer", input.optimizer.clone());
        return Judged::bare(KIND, Verdict::Skip, note.as_str()).with_evidence(e);
    }
    let Some(state) = &input.state else {
        return match &input.error {
            Some(err) if err.area == Area::Missing => {
                Judged::bare(KIND, Verdict::Skip, err.to_string())
            }
            Some(err) => Judged::bare(KIND, Verdict::Error, err.to_string()),
            None => Judged::bare(KIND, Verdict::Error, "None"),
        };
    };
    let implausible = &state.implausible;
    if !implausible.is_empty() {
        // Under every rule set: nothing judged from such a file means anything.
        let mut shown = implausible
            .iter()
            .take(3)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("; ");
        if implausible.len() > 3 {
            shown.push_str("; ...");
        }
        let mut e = Evidence::new();
        e.put("rules", o.rules.as_str());
        e.put("optimizer", input.optimizer.clone());
        e.put("implausible", implausible.clone());
        return Judged::bare(KIND, Verdict::Fail, format!("{TAMPERED}: {shown}"))
            .with_score(0.0)
            .with_evidence(e);
    }
    if o.rules == "sway" {
        sway::judge(input, state, o)
    } else {
        robust::judge(input, state, o)
    }
}

/// Python's `x if math.isfinite(x) else None`.
fn finite_or_none(x: f64) -> Value {
    if x.is_finite() {
        Value::Float(x)
    } else {
        Value::Null
    }
}

/// The value of each param id (the last one where an id repeats, as a dict).
fn values_by_id(per_param: &[ParamStat]) -> std::collections::HashMap<i64, f64> {
    per_param
        .iter()
        .map(|p| (p.param_id, p.exp_avg_sq_mean))
        .collect()
}

#[cfg(test)]
mod tests;
