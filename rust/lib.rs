//! adapterprobe's Rust core: pure-Rust kernels with no Python in them.
//!
//! Every module here is plain Rust with its own unit tests; `py.rs` (built
//! only with the `python` feature) is the one thin layer that converts
//! types and errors for Python.

pub mod error;

#[cfg(feature = "python")]
mod py;

pub use error::{Area, Error, Result};
pub mod adapter_config;
pub mod adapter_weights;
pub mod attribution;
pub mod csv_log;
pub mod files;
pub mod float_reduce;
pub mod json_line;
pub mod json_text;
pub mod layers;
pub mod layout;
pub mod loss_log;
pub mod metrics;
pub mod optimizer_state;
pub mod pickle;
pub mod probe_inputs;
pub mod robust_curve;
pub mod safetensors_header;
pub mod scan;
pub mod second_moment;
pub mod sidecar;
pub mod tensor_data;
pub mod tfevents;
pub mod torch_save;
pub mod torch_state;
pub mod trainer_state;
pub mod zip_archive;
