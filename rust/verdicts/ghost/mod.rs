//! gradient_ghost's rules (both rule sets): the optimizer state judged
//! from a [`GhostInput`].

use crate::store::probe_inputs::GhostInput;
use crate::verdicts::{Judged, Verdict};

pub const KIND: &str = "gradient_ghost";

/// The resolved options (Python's `GhostOptions`, read by attribute).
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct GhostOptions {
    pub rules: String,
}

/// The verdict for one adapter version.
pub fn judge_ghost(_input: &GhostInput, _o: &GhostOptions) -> Judged {
    Judged::bare(
        KIND,
        Verdict::Error,
        "gradient_ghost's rules are not ported yet",
    )
}
