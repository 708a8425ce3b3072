//! Stores: walking scan roots and gathering what each probe needs.
//!
//! What belongs here: recognising a run directory's layout (dlm store, HF
//! Trainer output, Lightning run, bare adapter), finding its optimizer
//! states and logs, and the parallel scan that reads every probe's inputs
//! with the GIL released. This is the top of the core: it may use
//! `analysis`, `formats` and `io`; nothing below depends on it.

pub mod layout;
pub mod model_files;
pub mod optimizer_state;
pub mod plausibility;
pub mod probe_inputs;
pub mod scan;
pub mod similar;
pub mod torch_state;

#[cfg(test)]
mod attribution_on_real_runs;
#[cfg(test)]
mod lfs_on_real_files;
