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
//! Two levels. Past `FACTOR_BLOWUP` (20x) it is a WARN: the run trained
//! with a learning rate far too high and its adapter is suspect. Past
//! `FACTOR_DEAD` (100x, 25 times what any healthy adapter measured) it is
//! a FAIL: every entry has been pushed by the whole step for the whole
//! run, and the guard, which runs this check on a live PEFT model at each
//! log (`verdicts::guard`), stops or rolls back such a run.
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
/// The median ratio beyond which the adapter is dead weight (FAIL).
pub const FACTOR_DEAD: f64 = 100.0;

/// One LoRA module's A factor as the rule reads it: its rank, its input
/// features and ||A||_F.
#[derive(Debug, Clone, Copy)]
pub struct FactorNorm {
    pub rank: u64,
    pub in_features: u64,
    pub norm_a: f64,
}

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
    let linear = modules
        .iter()
        .filter(|m| m.kind == "linear")
        .map(|m| FactorNorm {
            rank: m.rank,
            in_features: m.in_features,
            norm_a: m.norm_a,
        });
    let (scale, finding) = judge_factor_scale(&config.init_lora_weights, linear)?;
    evidence.put("factor_scale_median", scale);
    evidence.put("factor_init", config.init_lora_weights.as_str());
    finding
}

/// The median module's ratio of ||A|| to its initial norm, and the finding
/// it makes, for the linear modules of an adapter whose A started at
/// `init` (PEFT's `init_lora_weights`: `"true"`, `"gaussian"`, ...); None
/// when no module can be judged (an init that starts A from the base
/// weights, no module with a rank). The one implementation of the rule:
/// `adapter_weights` reads the norms from a file, the guard from a live
/// model.
pub fn judge_factor_scale(
    init: &str,
    modules: impl Iterator<Item = FactorNorm>,
) -> Option<(f64, Option<Finding>)> {
    let ratios: Vec<f64> = modules
        .filter(|m| m.rank > 0 && m.in_features > 0)
        .filter_map(|m| {
            let start = initial_norm(init, m.rank as f64, m.in_features as f64)?;
            let ratio = m.norm_a / start;
            ratio.is_finite().then_some(ratio)
        })
        .collect();
    let scale = median(ratios.iter().copied())?;
    let verdict = if scale > FACTOR_DEAD {
        Verdict::Fail
    } else if scale > FACTOR_BLOWUP {
        Verdict::Warn
    } else {
        return Some((scale, None));
    };
    let finding = Finding::new(
        verdict,
        "factors_blown_up",
        format!(
            "the LoRA A factors sit {}x above the scale PEFT initialised them at (median of \
             {} modules; healthy adapters stay within about 4x, the limit is {}x{}): the \
             learning rate was far too high for LoRA",
            fixed(scale, 1),
            ratios.len(),
            significant(FACTOR_BLOWUP, 3),
            if verdict == Verdict::Fail {
                format!(
                    ", past {}x the adapter is dead weight",
                    significant(FACTOR_DEAD, 3)
                )
            } else {
                String::new()
            }
        ),
    );
    Some((scale, Some(finding)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(ratio: f64, n: usize) -> impl Iterator<Item = FactorNorm> {
        // Kaiming init: ||A|| = sqrt(r / 3).
        (0..n).map(move |_| FactorNorm {
            rank: 8,
            in_features: 64,
            norm_a: ratio * (8.0f64 / 3.0).sqrt(),
        })
    }

    #[test]
    fn the_median_ratio_picks_the_level() {
        let (scale, none) = judge_factor_scale("true", modules(3.0, 4)).unwrap();
        assert!((scale - 3.0).abs() < 1e-9 && none.is_none());
        let (_, warn) = judge_factor_scale("true", modules(46.0, 4)).unwrap();
        assert_eq!(warn.unwrap().verdict, Verdict::Warn);
        let (_, fail) = judge_factor_scale("true", modules(788.0, 4)).unwrap();
        let fail = fail.unwrap();
        assert_eq!(fail.verdict, Verdict::Fail);
        assert!(fail.message.contains("dead weight"), "{}", fail.message);
    }

    #[test]
    fn inits_that_start_a_from_the_base_are_not_judged() {
        assert!(judge_factor_scale("pissa", modules(788.0, 4)).is_none());
        assert!(judge_factor_scale("true", modules(788.0, 0)).is_none());
        let no_rank = [FactorNorm {
            rank: 0,
            in_features: 64,
            norm_a: 1e9,
        }];
        assert!(judge_factor_scale("true", no_rank.into_iter()).is_none());
    }
}
