//! `loss_spikes`: records that stand out from the loss's trend by more
//! than its own noise allows.
//!
//! What the failure is: an instability that throws the loss far above its
//! trend for a while (a bad batch the optimizer overreacts to, a learning
//! rate at the edge of stability), more often than noise would.
//!
//! False alarms it is built for: the threshold in noise scales is set from
//! the curve's length for a stated false-alarm rate per run
//! (`spike_false_alarm`), and a few events are allowed
//! (`max_spike_events`); on a near-zero loss one hard batch is an outlier,
//! not a spike ([`is_batch_outlier`]). Curves shorter than
//! `min_spike_records` are not judged for spikes at all.

use crate::analysis::robust_curve::{RobustCurve, SpikeEvent};
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{number_text, Finding, Value, Verdict};

/// The spike events of one curve, judged or not.
pub(super) struct Spikes {
    /// Whether the curve was long enough to judge spikes on.
    pub judged: bool,
    pub events: Vec<Spike>,
    /// Steps of events that were one hard batch on a near-zero loss.
    pub outlier_steps: Vec<i64>,
}

impl Spikes {
    /// The events of `a`, split into spikes and batch outliers (none when
    /// the curve has fewer than `min_records` records).
    pub fn of(a: &RobustCurve, steps: &[i64], min_records: usize) -> Spikes {
        let step = |i: usize| steps.get(i).copied().unwrap_or(0);
        let judged = steps.len() >= min_records;
        let all: &[SpikeEvent] = if judged { &a.spikes } else { &[] };
        let (events, outliers): (Vec<&SpikeEvent>, Vec<&SpikeEvent>) = all
            .iter()
            .partition(|e| !is_batch_outlier(e, &a.trend, a.head_level));
        Spikes {
            judged,
            events: events
                .iter()
                .map(|e| Spike {
                    start_step: step(e.start),
                    end_step: step(e.end),
                    peak_step: step(e.peak),
                    rise: e.rise,
                    relative_rise: e.relative_rise,
                    z: e.z.is_finite().then_some(e.z),
                })
                .collect(),
            outlier_steps: outliers.iter().map(|e| step(e.peak)).collect(),
        }
    }

    /// WARN `loss_spikes` when there are more events than `max_events`.
    pub fn finding(
        &self,
        a: &RobustCurve,
        max_events: usize,
        false_alarm: f64,
        num_steps: usize,
    ) -> Option<Finding> {
        let n = self.events.len();
        if n <= max_events {
            return None;
        }
        let parts: Vec<String> = self
            .events
            .iter()
            .take(6)
            .map(|s| s.text(a.relative))
            .collect();
        let more = if n > 6 {
            format!(" and {} more", n - 6)
        } else {
            String::new()
        };
        Some(Finding::new(
            Verdict::Warn,
            "loss_spikes",
            format!(
                "{n} loss spike{} beyond {} noise scales (a {} false-alarm threshold for \
                 {num_steps} records): {}{more}",
                if n != 1 { "s" } else { "" },
                number_text::fixed(a.spike_threshold, 1),
                rate_text(false_alarm),
                parts.join("; ")
            ),
        ))
    }

    /// What the summary says of spikes when nothing else is found.
    pub fn note(&self, num_steps: usize, min_records: usize) -> String {
        if self.judged {
            "no spikes".to_string()
        } else {
            format!("spikes not judged ({num_steps} records, fewer than {min_records})")
        }
    }

    /// `spikes_judged`, `spike_threshold`, `spikes`, `spike_steps` and
    /// `batch_outlier_steps`.
    pub fn put_evidence(&self, e: &mut Evidence, a: &RobustCurve) {
        e.put("spikes_judged", self.judged);
        e.put("spike_threshold", a.spike_threshold);
        e.put(
            "spikes",
            Value::List(self.events.iter().map(Spike::to_value).collect()),
        );
        e.put(
            "spike_steps",
            Value::from(
                self.events
                    .iter()
                    .map(|s| s.peak_step)
                    .collect::<Vec<i64>>(),
            ),
        );
        e.put(
            "batch_outlier_steps",
            Value::from(self.outlier_steps.clone()),
        );
    }
}

/// A trend below this share of the start level has learned nearly every
/// example: see [`is_batch_outlier`].
pub const NEAR_ZERO_TREND: f64 = 0.05;
/// Records an event at a near-zero trend must span to be a spike.
pub const NEAR_ZERO_SPIKE_RECORDS: usize = 3;

/// Whether a spike event is one hard batch on a near-zero loss rather than
/// an instability.
///
/// Once a classifier fits nearly every example (its trend under
/// `NEAR_ZERO_TREND` of where it started), a record's loss is the error of
/// the few examples it still gets wrong, so one batch holding a hard or
/// mislabelled example sits at 100x the trend and the next is back on it:
/// heavy-tailed noise, not the run losing what it learned. An instability
/// at that level keeps the loss up while the optimizer recovers, over
/// several records; an event of fewer than `NEAR_ZERO_SPIKE_RECORDS` is
/// an outlier, listed in the evidence (`batch_outlier_steps`) but no
/// finding. Above the near-zero level every event that stands out counts.
fn is_batch_outlier(e: &SpikeEvent, trend: &[f64], head: f64) -> bool {
    let level = trend.get(e.peak).copied().unwrap_or(f64::NAN);
    let records = e.end.saturating_sub(e.start) + 1;
    level < NEAR_ZERO_TREND * head && records < NEAR_ZERO_SPIKE_RECORDS
}

/// A rate as a percentage with as many decimals as it needs, up to 2
/// (`1%`, `0.5%`, `0.25%`).
fn rate_text(rate: f64) -> String {
    let hundredths = (rate * 1e4).round();
    let decimals = if hundredths % 100.0 == 0.0 {
        0
    } else if hundredths % 10.0 == 0.0 {
        1
    } else {
        2
    };
    number_text::percent(rate, decimals)
}

/// One spike event as the evidence lists it.
pub(super) struct Spike {
    start_step: i64,
    end_step: i64,
    peak_step: i64,
    rise: f64,
    relative_rise: f64,
    /// None: a noise-free curve.
    z: Option<f64>,
}

impl Spike {
    /// `step 120 (+40% over trend, 9 noise scales)`.
    fn text(&self, relative: bool) -> String {
        let size = if relative {
            format!(
                "+{} over trend",
                number_text::percent(self.relative_rise, 0)
            )
        } else {
            format!("+{}", number_text::significant(self.rise, 3))
        };
        let scales = match self.z {
            Some(z) => format!(", {} noise scales)", number_text::fixed(z, 0)),
            None => ", noise-free curve)".to_string(),
        };
        format!("step {} ({size}{scales}", self.peak_step)
    }

    fn to_value(&self) -> Value {
        let mut e = Evidence::new();
        e.put("start_step", self.start_step);
        e.put("end_step", self.end_step);
        e.put("peak_step", self.peak_step);
        e.put("rise", self.rise);
        e.put("relative_rise", self.relative_rise);
        e.put("z", self.z);
        Value::Map(e)
    }
}
