//! training_drift's rules (both rule sets): the loss curve and its side
//! series judged from a [`DriftInput`].

use crate::store::probe_inputs::DriftInput;
use crate::verdicts::{Judged, Verdict};

pub const KIND: &str = "training_drift";

/// The resolved options (Python's `DriftOptions`, read by attribute).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct DriftOptions {
    pub rules: String,
}

/// The verdict for one store.
pub fn judge_drift(_input: &DriftInput, _o: &DriftOptions) -> Judged {
    Judged::bare(
        KIND,
        Verdict::Error,
        "training_drift's rules are not ported yet",
    )
}
