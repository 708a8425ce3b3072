//! What the reader passed over, said with the verdict (robust rules).
//!
//! The failure: a log that lost records (W&B blocks whose checksum fails,
//! JSON lines that do not parse) still reads as a curve, and the rules judge
//! what is left as if it were the run; a diverging run that lost most of
//! its blocks read as a clean PASS. What is left is still judged, and the
//! verdict says how much was passed over. Past [`MAX_DAMAGED_SHARE`] of the
//! log the record is an error instead, unless what is left already FAILs
//! (a NaN or a blow-up in the part read is a finding whatever was lost).
//!
//! False alarms it is built for: none on an intact log (the share is 0), and
//! a log with an odd bad line or block (a crashed writer's leftovers, a
//! sector lost) keeps its verdict. A torn last record is a run still
//! writing or cut short, not damage: it is said, never counted.

use crate::formats::logs::curve::LossCurve;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{number_text, Judged, Value, Verdict};

/// The share of a log's parts passed over past which a run the rest does
/// not FAIL gets no verdict: with a tenth of its records gone, a run's
/// trend may lie in what was lost.
pub const MAX_DAMAGED_SHARE: f64 = 0.1;

/// Put what was passed over and the torn tail in `judged`'s evidence and
/// message, and turn a verdict on too little of the log into an error.
pub(super) fn say_the_damage(judged: &mut Judged, curve: &LossCurve) {
    if !curve.torn_files.is_empty() {
        judged
            .evidence
            .put("torn_log_files", curve.torn_files.len());
        judged.message = format!(
            "{}; the log ends in a torn record, read up to it (a run still writing, or cut short)",
            judged.message
        );
    }
    let d = &curve.damage;
    if !d.any() {
        return;
    }
    let mut entry = Evidence::new();
    entry.put("unit", d.unit.as_str());
    entry.put("passed_over", d.passed_over);
    entry.put("seen", d.seen);
    entry.put("share", d.share());
    judged.evidence.put("damage", Value::Map(entry));
    let said = format!(
        "{} of {} {} could not be read and were passed over ({})",
        number_text::thousands(d.passed_over),
        number_text::thousands(d.seen),
        d.unit,
        number_text::percent(d.share(), 1),
    );
    if d.share() > MAX_DAMAGED_SHARE && judged.verdict != Verdict::Fail {
        judged.message = format!(
            "the log is damaged: {said}, more than the {} a verdict is given on; what could \
             be read says: {} {}",
            number_text::percent(MAX_DAMAGED_SHARE, 0),
            judged.verdict.as_str().to_uppercase(),
            judged.message
        );
        judged.verdict = Verdict::Error;
        judged.score = None;
    } else {
        judged.message = format!("{}; {said}", judged.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::logs::damage::Damage;

    fn judged(verdict: Verdict) -> Judged {
        Judged::bare("training_drift", verdict, "the loss fell").with_score(1.0)
    }

    fn curve(passed_over: u64, seen: u64) -> LossCurve {
        LossCurve {
            damage: Damage::of("bytes of the W&B log", passed_over, seen),
            ..LossCurve::default()
        }
    }

    #[test]
    fn an_intact_log_changes_nothing() {
        let mut j = judged(Verdict::Pass);
        say_the_damage(&mut j, &curve(0, 60));
        assert_eq!(
            (j.verdict, j.message.as_str()),
            (Verdict::Pass, "the loss fell")
        );
        assert!(j.evidence.get("damage").is_none());
    }

    #[test]
    fn a_little_damage_is_said_and_keeps_the_verdict() {
        let mut j = judged(Verdict::Pass);
        say_the_damage(&mut j, &curve(3, 60));
        assert_eq!(j.verdict, Verdict::Pass);
        assert!(
            j.message.ends_with(
                "3 of 60 bytes of the W&B log could not be read and were passed over (5.0%)"
            ),
            "{}",
            j.message
        );
        assert!(j.evidence.get("damage").is_some());
    }

    #[test]
    fn past_the_share_a_pass_is_an_error_and_a_fail_stays() {
        for verdict in [Verdict::Pass, Verdict::Warn, Verdict::Skip] {
            let mut j = judged(verdict);
            say_the_damage(&mut j, &curve(59, 60));
            assert_eq!(j.verdict, Verdict::Error, "{verdict:?}");
            assert!(j.score.is_none());
            assert!(
                j.message.starts_with("the log is damaged: 59 of 60"),
                "{}",
                j.message
            );
        }
        let mut j = judged(Verdict::Fail);
        say_the_damage(&mut j, &curve(59, 60));
        assert_eq!(j.verdict, Verdict::Fail);
        assert!(j.message.contains("59 of 60 bytes of the W&B log"));
    }

    #[test]
    fn a_torn_tail_is_said_not_counted() {
        let mut j = judged(Verdict::Pass);
        let c = LossCurve {
            torn_files: vec!["run.wandb".into()],
            ..LossCurve::default()
        };
        say_the_damage(&mut j, &c);
        assert_eq!(j.verdict, Verdict::Pass);
        assert!(j.message.contains("torn record"));
        assert!(j.evidence.get("damage").is_none());
    }
}
