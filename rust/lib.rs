//! adapterprobe's Rust core: pure-Rust kernels with no Python in them.
//!
//! Every module here is plain Rust with its own unit tests; `py.rs` (built
//! only with the `python` feature) is the one thin layer that converts
//! types and errors for Python.

pub mod adapter_config;
pub mod adapter_weights;
pub mod error;

#[cfg(feature = "python")]
mod py;

pub use error::{Area, Error, Result};
pub mod files;
pub mod json_line;
pub mod layers;
pub mod loss_log;
pub mod metrics;
pub mod pickle;
pub mod safetensors_header;
pub mod scan;
pub mod tensor_data;
pub mod torch_state;
