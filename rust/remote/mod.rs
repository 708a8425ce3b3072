//! Remote roots: object stores (S3 and its compatibles, GCS, Azure) read
//! through the `object_store` crate, by range.
//!
//! What belongs here: turning a root URL into a client configured from the
//! standard environment (`connect`), and staging a remote prefix as a local
//! tree of sparse files whose byte ranges are fetched when a reader first
//! touches them (`stage`, through the `io::staged` hook). Everything else
//! (layouts, readers, probes) runs unchanged on the staged tree, so a bucket
//! gives the verdicts the same tree gives on disk.
//!
//! This room sits beside `store` at the top: it uses `io` (the hook) and
//! nothing uses it but `py.rs`. No thread and no socket exists before the
//! first remote root is staged.

pub mod connect;
pub mod key_filter;
pub mod stage;

pub use stage::{fetched, release, stage, Fetched, Summary};
