//! Whether to apply an optimizer step, from its loss, before it is applied
//! (the guard's `skip_batch_above`).
//!
//! What the failure is: one batch whose loss is far above the run's level
//! (a corrupt sample, a sequence of garbage tokens, a mislabelled shard)
//! gives a gradient that can throw a run off in one step; metaseq and
//! OLMo-core skip such a step instead of applying it. Far above is measured
//! against the losses of the steps applied recently, robustly: their median
//! plus `sigmas` times their scale (1.4826 x the median absolute deviation,
//! the standard deviation of a normal sample, floored at 1% of the median so
//! a near-constant loss does not make every wiggle an outlier).
//!
//! False alarms it is built for: at 6 sigmas a normal loss series is past
//! the bar about once in 10^9 steps; a heavy-tailed one (small noisy
//! batches) more often, which costs one batch each time. A loss that moved
//! to a new level for good (a curriculum's next stage) is not fought: after
//! `MAX_SKIPS_IN_A_ROW` skips in a row the next step is applied and the
//! level is learned again from it (no step is judged until `MIN_STEPS`
//! more are applied). A non-finite loss is always skipped, and does not count
//! towards that limit.

use std::collections::VecDeque;

use crate::analysis::numerics::median;

/// Applied steps whose losses make the level.
pub const WINDOW: usize = 64;
/// Applied steps needed before any step is judged.
pub const MIN_STEPS: usize = 16;
/// Skips in a row after which the next step is applied whatever its loss.
pub const MAX_SKIPS_IN_A_ROW: u32 = 4;

/// The level of the recent applied steps, and the bar a step must stay under.
#[derive(Debug, Clone)]
pub struct BatchGate {
    sigmas: f64,
    recent: VecDeque<f64>,
    skips_in_a_row: u32,
    skipped: u64,
}

impl BatchGate {
    /// A gate skipping steps more than `sigmas` robust deviations above the
    /// recent level.
    pub fn new(sigmas: f64) -> BatchGate {
        BatchGate {
            sigmas,
            recent: VecDeque::with_capacity(WINDOW),
            skips_in_a_row: 0,
            skipped: 0,
        }
    }

    /// The loss above which a step is skipped now; None while fewer than
    /// `MIN_STEPS` steps were applied.
    pub fn bar(&self) -> Option<f64> {
        if self.recent.len() < MIN_STEPS {
            return None;
        }
        let level = median(self.recent.iter().copied())?;
        let spread = median(self.recent.iter().map(|v| (v - level).abs()))?;
        let scale = (1.4826 * spread)
            .max(0.01 * level.abs())
            .max(f64::MIN_POSITIVE);
        Some(level + self.sigmas * scale)
    }

    /// Whether to apply the step whose loss is `loss` (false: skip it).
    pub fn admit(&mut self, loss: f64) -> bool {
        if !loss.is_finite() {
            self.skipped += 1;
            return false;
        }
        let above = self.bar().is_some_and(|bar| loss > bar);
        if above && self.skips_in_a_row < MAX_SKIPS_IN_A_ROW {
            self.skips_in_a_row += 1;
            self.skipped += 1;
            return false;
        }
        if above {
            // The level moved for good: learn it again from here.
            self.recent.clear();
        }
        self.skips_in_a_row = 0;
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(loss);
        true
    }

    /// Steps skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(i: u64) -> f64 {
        2.0 + 0.1 * ((i * 7919 % 13) as f64 / 6.0 - 1.0)
    }

    #[test]
    fn nothing_is_judged_before_the_level_is_known() {
        let mut gate = BatchGate::new(6.0);
        for i in 0..(MIN_STEPS as u64 - 1) {
            assert!(gate.admit(noisy(i)));
        }
        assert!(
            gate.admit(1e6),
            "the 16th step sets the level, it is not judged"
        );
        assert!(gate.bar().is_some());
    }

    #[test]
    fn one_far_step_is_skipped_and_the_run_goes_on() {
        let mut gate = BatchGate::new(6.0);
        for i in 0..100 {
            assert!(gate.admit(noisy(i)), "step {i}");
        }
        assert!(!gate.admit(50.0));
        assert!(!gate.admit(f64::NAN));
        assert!(gate.admit(noisy(101)));
        assert_eq!(gate.skipped(), 2);
        // The level was not moved by what was skipped.
        assert!(gate.bar().unwrap() < 3.0);
    }

    #[test]
    fn a_level_that_moved_for_good_is_not_fought() {
        let mut gate = BatchGate::new(6.0);
        for i in 0..100 {
            gate.admit(noisy(i));
        }
        let applied: Vec<bool> = (0..40).map(|i| gate.admit(10.0 + noisy(i))).collect();
        assert_eq!(applied[..MAX_SKIPS_IN_A_ROW as usize], [false; 4]);
        assert!(applied[MAX_SKIPS_IN_A_ROW as usize]);
        // The level is learned again: the new level's steps are applied.
        assert!(applied[5..].iter().all(|&a| a), "{applied:?}");
    }

    #[test]
    fn a_constant_loss_tolerates_small_moves() {
        let mut gate = BatchGate::new(6.0);
        for _ in 0..50 {
            gate.admit(1.0);
        }
        assert!(gate.admit(1.05), "5% above a flat level is within 6 x 1%");
        assert!(!gate.admit(1.2));
    }
}
