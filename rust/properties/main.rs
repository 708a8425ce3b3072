//! Property tests of the readers' public APIs against hostile input.
//!
//! Why here and not in the modules: these treat each reader as a black box
//! fed by `proptest` (arbitrary bytes, and near-valid inputs that get past
//! the first checks), and assert what must hold for any input: no panic,
//! caps respected, offsets in bounds, reads inside the file, agreement with
//! a reference where one exists. The mutation fuzzer in `tests/fuzz/` does
//! the same end to end through Python; these run in `cargo test` in a few
//! seconds.

// All of this file is test code; clippy.toml's allow-*-in-tests settings
// cover only `#[test]` functions, not the helpers and strategies around them.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use adapterprobe_core::formats::logs::json_line::{classify, LineKind};
use adapterprobe_core::formats::pickle::{
    op, resolve_global, unpickle, unpickle_with, unpickle_with_policy, Id, Limits, UnknownGlobals,
    Unpickled, Value,
};
use adapterprobe_core::formats::safetensors_header::{
    dtype_bits, parse_header, read_header, Header,
};
use adapterprobe_core::formats::tensor_data::SafetensorsData;
use adapterprobe_core::io::zip_archive::Archive;
use adapterprobe_core::Area;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use serde_json::Value as Json;

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Shrunk failures are printed with their seed; nothing is written to the tree.
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

fn write_temp(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(bytes).unwrap();
    path
}

mod json_line;
mod mlflow_db;
mod pickle;
mod safetensors_header;
mod torch_state_dict;
mod trainer_log;
mod wandb_log;
mod zip_archive;
