//! The probes' rules: pure functions from one target's gathered inputs and
//! the resolved options to a [`Judged`] (verdict, score, message, findings
//! and evidence), for both rule sets.
//!
//! They run inside the same GIL-free pass that gathers the inputs, so a scan
//! judges on every core; the Python probes call the same functions, so a
//! scan and a single probe cannot disagree. Each rule has one
//! implementation, here; the shared numerics are `analysis::numerics`, and
//! paths become text through `io::path_text`. Messages are written with
//! [`number_text`]. The tests hold the verdicts to what they must do
//! (`tests/test_*_kernel.py`), not to a second implementation.
//!
//! Room order: above `store` (whose gathered inputs they read), below
//! `records` (which turns verdicts into scan records).

pub mod batch_gate;
pub mod drift;
pub mod evidence;
pub mod full_weights;
pub mod gap;
pub mod ghost;
pub mod guard;
pub mod layer_lift;
pub mod number_text;
pub mod weights;

pub use evidence::{Evidence, Value};

use crate::io::path_text;
use crate::Error;

/// Outcome of a probe, ordered by severity (`Pass < Skip < Warn < Fail <
/// Error`), so the worst of several is their `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Pass,
    Skip,
    Warn,
    Fail,
    Error,
}

impl Verdict {
    /// The lower-case name Python and every output use (`"pass"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Skip => "skip",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
            Verdict::Error => "error",
        }
    }

    /// Parses [`Verdict::as_str`]'s names.
    pub fn parse(name: &str) -> Option<Verdict> {
        Some(match name {
            "pass" => Verdict::Pass,
            "skip" => Verdict::Skip,
            "warn" => Verdict::Warn,
            "fail" => Verdict::Fail,
            "error" => Verdict::Error,
            _ => return None,
        })
    }
}

/// One rule that fired: which, how bad, and why in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub verdict: Verdict,
    pub rule: &'static str,
    pub message: String,
}

impl Finding {
    pub fn new(verdict: Verdict, rule: &'static str, message: String) -> Finding {
        Finding {
            verdict,
            rule,
            message,
        }
    }

    /// `{"rule": ..., "verdict": ..., "message": ...}`, as evidence lists them.
    pub fn to_value(&self) -> Value {
        let mut e = Evidence::new();
        e.put("rule", self.rule);
        e.put("verdict", self.verdict.as_str());
        e.put("message", self.message.as_str());
        Value::Map(e)
    }
}

/// An error a gatherer left, as a message shows it: `"<path>: <reason>"`
/// (the path as Python shows it), the reason alone for an error without a
/// path, `"None"` for none.
pub fn error_text(error: Option<&Error>) -> String {
    match error {
        None => "None".to_string(),
        Some(e) if e.path.as_os_str().is_empty() => e.message.clone(),
        Some(e) => format!("{}: {}", path_text::display(&e.path), e.message),
    }
}

/// The evidence list of `findings`.
pub fn findings_value(findings: &[Finding]) -> Value {
    Value::List(findings.iter().map(Finding::to_value).collect())
}

/// What a probe answers about one store or adapter version.
///
/// `score` is in [0, 1] (higher is healthier) or None where the probe did
/// not reach a judgement; `raw` is the probe's headline number before
/// scoring. `kind` is the probe's name (`"training_drift"`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub kind: &'static str,
    pub verdict: Verdict,
    pub score: Option<f64>,
    pub raw: Option<f64>,
    pub message: String,
    pub evidence: Evidence,
}

impl Judged {
    /// A verdict with a message and nothing else (score, raw and evidence
    /// empty): the SKIP and ERROR answers.
    pub fn bare(kind: &'static str, verdict: Verdict, message: impl Into<String>) -> Judged {
        Judged {
            kind,
            verdict,
            score: None,
            raw: None,
            message: message.into(),
            evidence: Evidence::new(),
        }
    }

    pub fn with_score(mut self, score: f64) -> Judged {
        self.score = Some(score);
        self
    }

    pub fn with_raw(mut self, raw: f64) -> Judged {
        self.raw = Some(raw);
        self
    }

    pub fn with_evidence(mut self, evidence: Evidence) -> Judged {
        self.evidence = evidence;
        self
    }
}

/// The worst verdict of `findings`, PASS when there are none.
pub fn worst(findings: &[Finding]) -> Verdict {
    findings
        .iter()
        .map(|f| f.verdict)
        .max()
        .unwrap_or(Verdict::Pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_order_makes_max_the_worst() {
        let fs = [
            Finding::new(Verdict::Warn, "a", String::new()),
            Finding::new(Verdict::Fail, "b", String::new()),
            Finding::new(Verdict::Skip, "c", String::new()),
        ];
        assert_eq!(worst(&fs), Verdict::Fail);
        assert_eq!(worst(&[]), Verdict::Pass);
        assert!(Verdict::Error > Verdict::Fail && Verdict::Skip > Verdict::Pass);
        for v in [
            Verdict::Pass,
            Verdict::Skip,
            Verdict::Warn,
            Verdict::Fail,
            Verdict::Error,
        ] {
            assert_eq!(Verdict::parse(v.as_str()), Some(v));
        }
    }
}
