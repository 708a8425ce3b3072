//! What a log reader passed over: the parts of a log it could not read and
//! went on past, counted against the parts it met.
//!
//! Why: a reader that skips what it cannot read keeps a scan going on a log
//! with one bad line, but a log that lost most of its records still reads
//! as a curve, and a verdict on that fraction of the run would look like a
//! verdict on the run. Each reader counts in its own unit (a W&B log's
//! bytes, a JSON-lines log's lines), and the drift verdict says the
//! count and refuses to pass a run judged on too little of its log.
//! A torn last record (a run still writing) is not damage: it is counted
//! apart, in the curve's `torn_files`.

/// Parts passed over and parts met, in one unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Damage {
    /// What is counted, plural (`"bytes of the W&B log"`, `"JSON lines"`).
    pub unit: String,
    /// Parts that did not read and were passed over.
    pub passed_over: u64,
    /// Parts met, those passed over included.
    pub seen: u64,
}

impl Damage {
    /// `passed_over` of `seen` parts counted as `unit`.
    pub fn of(unit: &str, passed_over: u64, seen: u64) -> Damage {
        Damage {
            unit: unit.to_string(),
            passed_over,
            seen: seen.max(passed_over),
        }
    }

    /// Whether anything was passed over.
    pub fn any(&self) -> bool {
        self.passed_over > 0
    }

    /// The share of parts passed over (0 when none were met).
    pub fn share(&self) -> f64 {
        if self.seen == 0 {
            0.0
        } else {
            self.passed_over as f64 / self.seen as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares() {
        let none = Damage::default();
        assert!(!none.any() && none.share() == 0.0);
        let d = Damage::of("JSON lines", 1, 40);
        assert!(d.any() && (d.share() - 0.025).abs() < 1e-12);
        // never more passed over than seen
        assert_eq!(Damage::of("x", 5, 2).seen, 5);
    }
}
