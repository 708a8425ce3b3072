//! Every reader names a Git LFS pointer as such. Each real fixture (written
//! by the real libraries) is replaced by the pointer git-lfs writes for it,
//! as a clone without `git lfs pull` has it, and read with the reader a scan
//! uses for that file. It sits in `store` because it drives readers from
//! every room.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};

use crate::analysis::adapter_weights::read_adapter_weights;
use crate::error::{Area, Error, Result};
use crate::formats::adapter_config::AdapterConfig;
use crate::formats::logs::dlm_log::read_loss_curve;
use crate::formats::logs::loss_log::read_curve;
use crate::formats::logs::{csv_log, tfevents, trainer_state};
use crate::formats::safetensors_header::read_header;
use crate::formats::tensor_data::SafetensorsData;
use crate::io::lfs::tests::{assert_names_pointer, cloned_without_lfs};
use crate::store::optimizer_state::read_optimizer_state;
use crate::store::torch_state::read_training_state;

fn real(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `read` on the pointer of the real file `rel` fails in `area`, naming the
/// pointer (the real file reads fine).
fn check<T: std::fmt::Debug>(rel: &str, area: Area, read: impl Fn(&Path) -> Result<T>) -> Error {
    let source = real(rel);
    read(&source).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pointer, size) = cloned_without_lfs(&source, dir.path());
    let e = read(&pointer).unwrap_err();
    assert_eq!(e.area, area, "{e}");
    assert_names_pointer(&e, &pointer, size);
    e
}

const WEIGHTS: &str = "rust/testdata/weights/llama_trained/adapter_model.safetensors";

#[test]
fn safetensors_header_and_tensor_data() {
    check(WEIGHTS, Area::Header, read_header);
    check(WEIGHTS, Area::Header, |p| {
        SafetensorsData::open(p).map(|_| ())
    });
}

#[test]
fn adapter_weights_and_their_config() {
    let e = check(WEIGHTS, Area::Header, read_adapter_weights);
    assert!(e.details.contains(&("lfs_pointer", "true".to_string())));
    check(
        "rust/testdata/weights/llama_trained/adapter_config.json",
        Area::Weights,
        AdapterConfig::read,
    );
}

#[test]
fn torch_zip_files() {
    check(
        "rust/testdata/optim/hf_lora/checkpoint-3/optimizer.pt",
        Area::TrainingState,
        read_optimizer_state,
    );
    check(
        "rust/testdata/optim/lightning/last.ckpt",
        Area::TrainingState,
        read_optimizer_state,
    );
}

#[test]
fn a_dlm_state_whose_sha256_sidecar_was_kept() {
    let source = real("rust/testdata/optim/dlm_bnb8/training_state.pt");
    read_training_state(&source).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pointer, size) = cloned_without_lfs(&source, dir.path());
    let sidecar = real("rust/testdata/optim/dlm_bnb8/training_state.pt.sha256");
    std::fs::copy(&sidecar, dir.path().join("training_state.pt.sha256")).unwrap();
    let e = read_training_state(&pointer).unwrap_err();
    assert_eq!(e.area, Area::TrainingState, "{e}");
    assert_names_pointer(&e, &pointer, size);
}

#[test]
fn logs() {
    check(
        "rust/testdata/logs/hf_run/trainer_state.json",
        Area::LogFormat,
        trainer_state::read_trainer_state,
    );
    check(
        "rust/testdata/logs/lightning/version_0/metrics.csv",
        Area::LogFormat,
        |p| csv_log::read_csv_series(p, None),
    );
    check(
        "rust/testdata/logs/torch_writer/events.out.tfevents.1700001000.fixturehost.1000.0",
        Area::LogFormat,
        |p| tfevents::read_scalar_series(&[p.to_path_buf()], None),
    );
    check(
        "python/adapterprobe/demo_store/healthy/logs/train-000001-20250301T090000.jsonl",
        Area::LogFormat,
        |p| read_loss_curve(&[p.to_path_buf()]),
    );
    // The same through the format-detecting entry point Python calls.
    check(
        "rust/testdata/logs/lightning/version_0/metrics.csv",
        Area::LogFormat,
        |p| read_curve(p, None),
    );
}
