//! full_weights' rules: a full fine-tune's weights judged from a
//! [`FullWeightsInput`].

use crate::store::probe_inputs::FullWeightsInput;
use crate::verdicts::{Judged, Verdict};

pub const KIND: &str = "full_weights";

/// The resolved options (Python's `FullWeightsOptions`, read by attribute).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct FullWeightsOptions {
    pub rules: String,
}

/// The verdict for one full-model version.
pub fn judge_full_weights(_input: &FullWeightsInput, _o: &FullWeightsOptions) -> Judged {
    Judged::bare(
        KIND,
        Verdict::Error,
        "full_weights' rules are not ported yet",
    )
}
