//! adapterprobe's Rust core: pure-Rust kernels with no Python in them.
//!
//! The core is six rooms, and dependencies point one way,
//! `records → verdicts → store → analysis → formats → io`:
//!
//! - [`io`]: opening inputs safely and cheaply (files, zip, sidecars);
//! - [`formats`]: one module per file format, bytes to typed values;
//! - [`analysis`]: pure computation on those values (curves, statistics);
//! - [`store`]: walking scan roots and gathering each probe's inputs;
//! - [`verdicts`]: the probes' rules, both rule sets, as pure functions
//!   from gathered inputs and options to verdicts with their evidence;
//! - [`records`]: the scan pass, gathering, judging and assembling each
//!   target's records (and their JSON text) on every core;
//! - [`remote`]: object-store roots staged locally and read by range
//!   (beside `store` at the top; it uses only `io`).
//!
//! [`error`] is the one error type every room returns. `py.rs` (built only
//! with the `python` feature) is the one thin layer that converts types and
//! errors for Python and releases the GIL around the heavy calls.

pub mod analysis;
pub mod error;
pub mod formats;
pub mod io;
pub mod records;
#[cfg(feature = "object-store")]
pub mod remote;
pub mod store;
pub mod verdicts;

#[cfg(feature = "python")]
mod py;

/// The readers' property tests (`rust/properties/`) run in the unit-test
/// binary: `cargo test` compiles the crate once, not a second time as the
/// library of a separate test target. They use the public paths only, as a
/// user of the crate would, through this alias of the crate's own name.
#[cfg(test)]
extern crate self as adapterprobe_core;
#[cfg(test)]
#[path = "properties/main.rs"]
mod properties;

/// The extension allocates through mimalloc: a scan makes millions of small
/// short-lived allocations on every core (pickle values, evidence, JSON
/// text), which glibc's allocator serves markedly slower. Local-dynamic TLS,
/// since the extension is loaded with `dlopen`.
#[cfg(feature = "python")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub use error::{Area, Error, Result};
