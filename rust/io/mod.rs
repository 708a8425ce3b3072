//! Opening inputs safely and cheaply, before any format is known.
//!
//! What belongs here: finding and opening files (regular files only, no
//! walking out of a root), bounded positioned reads, memory for sizes a
//! file claims, the zip container that `torch.save` uses, checksum
//! sidecars, Git LFS pointers (what a clone without `git lfs pull` holds
//! instead of a file), a store's small files read once for all its
//! readers (`read_once`), the hook through which files staged from remote
//! storage are fetched on first read (`staged`), and writing JSON text.
//! Nothing here knows a file format beyond its container, and nothing knows
//! a probe.

pub mod claims;
pub mod confine;
pub mod excerpt;
pub mod files;
pub mod json_text;
pub mod lfs;
pub mod path_text;
pub mod read_once;
pub mod sidecar;
pub mod sqlite;
pub mod staged;
pub mod walk;
pub mod zip_archive;
