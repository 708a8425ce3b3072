//! adapter_weights' rules (both rule sets): a LoRA adapter's weights
//! judged from a [`WeightsInput`] and, where there is one, the version
//! before it.

use crate::store::probe_inputs::WeightsInput;
use crate::verdicts::{Judged, Verdict};

pub const KIND: &str = "adapter_weights";

/// The resolved options (Python's `WeightsOptions`, read by attribute).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsOptions {
    pub rules: String,
}

/// The verdict for one adapter version (`previous`: the version before it).
pub fn judge_weights(
    _input: &WeightsInput,
    _previous: Option<&WeightsInput>,
    _o: &WeightsOptions,
) -> Judged {
    Judged::bare(
        KIND,
        Verdict::Error,
        "adapter_weights' rules are not ported yet",
    )
}
