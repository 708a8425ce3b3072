//! adapterprobe's Rust core: pure-Rust kernels with no Python in them.
//!
//! Every module here is plain Rust with its own unit tests; `py.rs` (built
//! only with the `python` feature) is the one thin layer that converts
//! types and errors for Python.

pub mod error;

#[cfg(feature = "python")]
mod py;

pub use error::{Area, Error, Result};
pub mod analysis;
pub mod formats;
pub mod io;
pub mod store;

// Old flat paths, kept for one commit so the moves above change no file's content.
pub use analysis::{
    adapter_weights, attribution, float_reduce, layers, metrics, robust_curve, second_moment,
};
pub use formats::logs::{csv_log, json_line, loss_log, tfevents, trainer_state};
pub use formats::{adapter_config, pickle, safetensors_header, tensor_data, torch_save};
pub use io::{files, json_text, sidecar, zip_archive};
pub use store::{layout, optimizer_state, probe_inputs, scan, torch_state};
