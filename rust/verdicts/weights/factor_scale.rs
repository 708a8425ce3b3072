//! `factors_blown_up`: LoRA A factors far above the scale PEFT gave them.
//!
//! What the failure is: a learning rate far too high for LoRA. The loss
//! falls a little and then oscillates at a level a sane run goes below, so
//! its curve reads as a slow fine-tune; the factors tell it. PEFT starts
//! A at a known scale and B at zero, and a healthy run moves A little
//! (Adam's steps are about the learning rate, and A's gradients change
//! sign from batch to batch). With a learning rate 500x too high every
//! entry is pushed by the whole step: A ends tens of times its start.
//!
//! The start is known from `init_lora_weights`: PEFT's default
//! (Kaiming-uniform, a = sqrt 5) gives each entry a variance of
//! 1 / (3 in), so ||A||_F = sqrt(r / 3); `gaussian` (std 1 / r) gives
//! sqrt(in / r). Other methods (PiSSA, OLoRA, LoftQ, EVA, ...) start A from
//! the base weights, whose scale the adapter does not carry: not judged,
//! and neither are embedding factors (PEFT starts their A at zero).
//!
//! False alarms it is built for: none at `FACTOR_BLOWUP`. The median
//! module's ratio of healthy adapters is at most 2.3 on the 5 real public
//! adapters of the shared corpora (up to 6,000 steps) and at most 3.7 on
//! the 37 runs of the field corpus (tiny models at a high 2e-3); a tiny
//! Llama at lr 0.1 ends at 6.9 and at lr 1.0 at 46
//! (`tests/test_run_faults.py`).

use crate::analysis::adapter_weights::ConfigSummary;
use crate::analysis::adapter_weights::LoraModuleStats;
use crate::analysis::numerics::median;
use crate::verdicts::number_text::{fixed, significant};
use crate::verdicts::{Evidence, Finding, Verdict};

/// The median module's ||A|| over its initial norm beyond which the
/// factors blew up.
pub const FACTOR_BLOWUP: f64 = 20.0;

/// ||A||_F at initialisation for a module of rank `r` and `in_features`,
/// where the init method says.
fn initial_norm(init: &str, r: f64, in_features: f64) -> Option<f64> {
    match init {
        "true" => Some((r / 3.0).sqrt()),
        "gaussian" => Some((in_features / r).sqrt()),
        _ => None,
    }
}

/// The finding, if the factors blew up, and the evidence of the measure.
pub(super) fn factor_scale(
    config: &ConfigSummary,
    modules: &[LoraModuleStats],
    evidence: &mut Evidence,
) -> Option<Finding> {
    let ratios: Vec<f64> = modules
        .iter()
        .filter(|m| m.kind == "linear" && m.rank > 0 && m.in_features > 0)
        .filter_map(|m| {
            let init = initial_norm(
                &config.init_lora_weights,
                m.rank as f64,
                m.in_features as f64,
            )?;
            let ratio = m.norm_a / init;
            ratio.is_finite().then_some(ratio)
        })
        .collect();
    let scale = median(ratios.iter().copied())?;
    evidence.put("factor_scale_median", scale);
    evidence.put("factor_init", config.init_lora_weights.as_str());
    (scale > FACTOR_BLOWUP).then(|| {
        Finding::new(
            Verdict::Warn,
            "factors_blown_up",
            format!(
                "the LoRA A factors sit {}x above the scale PEFT initialised them at (median of \
                 {} modules; healthy adapters stay within about 4x, the limit is {}x): the \
                 learning rate was far too high for LoRA",
                fixed(scale, 1),
                ratios.len(),
                significant(FACTOR_BLOWUP, 3)
            ),
        )
    })
}
