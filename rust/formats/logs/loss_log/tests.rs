//! Unit tests of the loss-log reader.

use super::*;
use crate::formats::logs::curve::by_step;
use crate::formats::logs::dlm_log::tests::step;
use crate::formats::logs::dlm_log::{read_steps_from, resolve_source, StepsWithExtras};
fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("rust/testdata/logs")
        .join(rel)
}

/// Copy a fixture tree into a temporary directory.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn an_hf_output_dir_prefers_its_final_state_then_tensorboard_then_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    copy_tree(&fixture("hf_run"), &out);

    let from_state = read_curve_from(&out, None).unwrap();
    assert_eq!(from_state.source, LogSource::TrainerState.name());
    assert_eq!(from_state.files, vec![out.join("trainer_state.json")]);
    assert_eq!(from_state.series, "loss");
    assert_eq!(from_state.steps, (1..=30).collect::<Vec<i64>>());
    assert_eq!(from_state.num_files, 1);
    // Step 27 diverged (inf), NaN after it: all stored as +inf.
    assert!(from_state.losses[..26].iter().all(|l| l.is_finite()));
    assert!(from_state.losses[26..].iter().all(|&l| l == f64::INFINITY));

    std::fs::remove_file(out.join("trainer_state.json")).unwrap();
    let from_events = read_curve_from(&out, None).unwrap();
    assert_eq!(from_events.source, LogSource::TensorBoard.name());
    assert_eq!(from_events.series, "train/loss");
    // TensorBoard stores float32; HF logged float32 values too: identical curves.
    assert_eq!(from_events.steps, from_state.steps);
    assert_eq!(from_events.losses, from_state.losses);

    std::fs::remove_dir_all(out.join("runs")).unwrap();
    let from_checkpoint = read_curve_from(&out, None).unwrap();
    assert_eq!(from_checkpoint.source, LogSource::TrainerState.name());
    assert_eq!(
        from_checkpoint.files,
        vec![out.join("checkpoint-20").join("trainer_state.json")]
    );
    assert_eq!(from_checkpoint.steps, (1..=20).collect::<Vec<i64>>());
    // A lower checkpoint loses to a higher one (numerically, not by name).
    std::fs::create_dir(out.join("checkpoint-3")).unwrap();
    std::fs::write(
        out.join("checkpoint-3/trainer_state.json"),
        r#"{"global_step": 3, "log_history": []}"#,
    )
    .unwrap();
    let again = detect_log_source(&out).unwrap();
    assert_eq!(
        again.1,
        vec![out.join("checkpoint-20").join("trainer_state.json")]
    );

    let eval = read_curve_from(&fixture("hf_run/trainer_state.json"), Some("eval/loss")).unwrap();
    assert_eq!(
        (eval.series.as_str(), eval.steps.clone()),
        ("eval_loss", vec![10, 20, 30])
    );
    let e = read_curve_from(&fixture("hf_run"), Some("grad_norm")).unwrap_err();
    assert_eq!(e.area, Area::Usage);
    assert!(e.message.contains("\"loss\" and \"eval_loss\""), "{e}");
}

#[test]
fn tensorboard_sources_dedupe_with_the_later_file_winning() {
    let curve = read_curve_from(&fixture("torch_writer"), None).unwrap();
    assert_eq!(curve.source, LogSource::TensorBoard.name());
    assert_eq!(curve.series, "loss");
    assert_eq!(curve.files.len(), 2);
    assert_eq!(curve.num_files, 2);
    assert_eq!(curve.steps, (0..16).collect::<Vec<i64>>());
    assert_eq!(curve.losses[5], f64::INFINITY); // NaN
    assert_eq!(curve.losses[8], f64::INFINITY);
    // Steps 9..11 were logged again by the resumed run: 0.5 + 0.01 * step.
    for step in 9..16 {
        let want = (0.5 + 0.01 * step as f64) as f32 as f64;
        assert_eq!(curve.losses[step], want, "step {step}");
    }
    let one = read_curve_from(
        &fixture("torch_writer/events.out.tfevents.1700001000.fixturehost.1000.0"),
        Some("tensor_loss_f64"),
    )
    .unwrap();
    assert_eq!(
        (one.series.as_str(), one.steps.len()),
        ("tensor_loss_f64", 12)
    );
    let tf2 = read_curve_from(&fixture("tf2"), Some("content_loss")).unwrap();
    assert_eq!(tf2.steps, (0..10).collect::<Vec<i64>>());
}

#[test]
fn lightning_dirs_and_csv_files() {
    // The run logged to TensorBoard and CSV: the event files win.
    let both = read_curve_from(&fixture("lightning"), None).unwrap();
    assert_eq!(
        (both.source.as_str(), both.series.as_str()),
        (LogSource::TensorBoard.name(), "train_loss_step")
    );
    let csv = read_curve_from(&fixture("lightning/version_0/metrics.csv"), None).unwrap();
    assert_eq!(
        (csv.source.as_str(), csv.series.as_str()),
        (LogSource::Csv.name(), "train_loss_step")
    );
    assert_eq!(csv.steps, (0..18).collect::<Vec<i64>>());
    assert_eq!(csv.losses[6], f64::INFINITY); // the NaN the generator logged
                                              // Same run, same steps; CSV keeps float64 text, TensorBoard float32.
    assert_eq!(both.steps, csv.steps);
    for (a, b) in both.losses.iter().zip(&csv.losses) {
        assert!(a == b || (a - b).abs() < 1e-6 * b.abs(), "{a} {b}");
    }

    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &fixture("lightning/version_0"),
        &dir.path().join("lightning_logs/version_0"),
    );
    let only_csv = read_curve_from(dir.path(), Some("val_loss")).unwrap();
    assert_eq!(only_csv.source, LogSource::Csv.name());
    assert_eq!(only_csv.steps, vec![5, 11, 17]);
    copy_tree(
        &fixture("lightning/version_0"),
        &dir.path().join("lightning_logs/version_1"),
    );
    let e = read_curve_from(dir.path(), None).unwrap_err();
    assert!(e.message.contains("2 metrics.csv files"), "{e}");
}

#[test]
fn dlm_sources_behave_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let a = logs.join("train-000001-20250101T000000.jsonl");
    std::fs::write(&a, format!("{}\n{}\n", step(1, 2.0), step(2, f64::NAN))).unwrap();
    let b = logs.join("train-000002-20250101T000001.jsonl");
    std::fs::write(&b, format!("{}\n", step(2, 1.0))).unwrap();
    // A TensorBoard file in the store does not outrank dlm's own logs.
    std::fs::copy(
        fixture("tf2/events.out.tfevents.1700002000.fixturehost.1000.0"),
        dir.path().join("events.out.tfevents.1"),
    )
    .unwrap();
    let curve = read_curve_from(dir.path(), None).unwrap();
    assert_eq!(curve.source, LogSource::Dlm.name());
    assert_eq!(curve.files, vec![a.clone(), b.clone()]);
    assert_eq!(
        curve,
        read_loss_curve(&resolve_source(dir.path()).unwrap()).unwrap()
    );
    assert_eq!(curve.steps, vec![1, 2]);
    assert_eq!(curve.losses, vec![2.0, 1.0]);
    assert_eq!(
        read_curve_from(&logs, None).unwrap().files,
        vec![a.clone(), b]
    );
    assert_eq!(read_curve_from(&a, Some("loss")).unwrap().steps, vec![1, 2]);
    let e = read_curve_from(&a, Some("val_loss")).unwrap_err();
    assert_eq!(e.area, Area::Usage);
}

#[test]
fn unknown_and_missing_sources() {
    let dir = tempfile::tempdir().unwrap();
    let e = read_curve_from(dir.path(), None).unwrap_err();
    assert_eq!(e.area, Area::LogFormat);
    assert!(e.message.contains("holds no training log"), "{e}");
    assert!(
        e.message.contains("trainer_state.json") && e.message.contains("metrics.csv"),
        "{e}"
    );
    let odd = dir.path().join("weights.bin");
    std::fs::write(&odd, b"x").unwrap();
    let e = read_curve_from(&odd, None).unwrap_err();
    assert_eq!((e.area, e.path.clone()), (Area::LogFormat, odd));
    assert!(e.message.contains("unknown log format"), "{e}");
    assert!(e.message.contains("events.out.tfevents"), "{e}");
    let e = read_curve_from(&dir.path().join("gone"), None).unwrap_err();
    assert_eq!(e.area, Area::Missing);
    // Too deep to be found: four levels below is the limit.
    let deep = dir.path().join("a/b/c/d/e");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::copy(
        fixture("lightning/version_0/metrics.csv"),
        deep.join("metrics.csv"),
    )
    .unwrap();
    assert!(read_curve_from(dir.path(), None).is_err());
    assert!(read_curve_from(&dir.path().join("a"), None).is_ok());
}

#[cfg(unix)]
#[test]
fn the_search_does_not_follow_directory_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(dir.path(), dir.path().join("loop")).unwrap();
    let e = read_curve_from(dir.path(), None).unwrap_err();
    assert!(e.message.contains("holds no training log"), "{e}");
}

#[test]
fn side_series_come_from_the_trainer_state_and_else_from_tensorboard() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    copy_tree(&fixture("hf_run"), &out);
    let from_state = read_curve(&out, None).unwrap();
    let side = &from_state.side;
    assert_eq!(
        side.eval_loss.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![10, 20, 30]
    );
    // One grad norm and learning rate per logged training step (this run's
    // NaN losses were logged with finite norms).
    assert_eq!(
        side.grad_norm.iter().map(|p| p.0).collect::<Vec<_>>(),
        from_state.steps
    );
    assert!(side.grad_norm.iter().all(|p| p.1.is_finite()));
    assert_eq!(side.learning_rate[0], (1, 0.003));

    // Without the trainer state, the same series come from the event files.
    std::fs::remove_file(out.join("trainer_state.json")).unwrap();
    let from_events = read_curve_from(&out, None).unwrap();
    let ev = &from_events.side;
    assert_eq!(ev.eval_loss.len(), 3);
    assert_eq!(ev.grad_norm.len(), side.grad_norm.len());
    // TensorBoard keeps float32: equal to the trainer state's at f32 precision.
    for (a, b) in ev.learning_rate.iter().zip(&side.learning_rate) {
        assert_eq!(a.0, b.0);
        assert_eq!(a.1 as f32, b.1 as f32);
    }
}

#[test]
fn side_series_keep_the_last_value_of_each_step_in_step_order() {
    let points = vec![(3, 1.0), (1, 2.0), (3, 5.0), (2, f64::NAN)];
    let sorted = by_step(points);
    assert_eq!(sorted.len(), 3);
    assert_eq!((sorted[0], sorted[2]), ((1, 2.0), (3, 5.0)));
    assert!(sorted[1].1.is_nan());
}

#[test]
fn dlm_step_lines_carry_their_side_values() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("train-000001-20250101T000000.jsonl");
    let lines = [
        r#"{"type": "banner", "run_id": 1}"#,
        r#"{"grad_norm": 1.5, "loss": 2.0, "lr": 0.001, "step": 1, "type": "step", "val_loss": null}"#,
        r#"{"grad_norm": NaN, "loss": 0.0, "lr": 0.0005, "step": 2, "type": "step", "val_loss": 2.5}"#,
        r#"{"grad_norm": null, "loss": 1.0, "step": 3, "type": "step"}"#,
        // A resumed run repeats step 2: the later line wins, extras included.
        r#"{"grad_norm": 0.9, "loss": 1.5, "lr": 0.0004, "step": 2, "type": "step", "val_loss": 2.4}"#,
    ];
    std::fs::write(&log, lines.join("\n")).unwrap();
    let curve = read_loss_curve(&[log]).unwrap();
    assert_eq!(curve.steps, vec![1, 2, 3]);
    assert_eq!(curve.side.grad_norm, vec![(1, 1.5), (2, 0.9)]);
    assert_eq!(curve.side.learning_rate, vec![(1, 0.001), (2, 0.0004)]);
    assert_eq!(curve.side.eval_loss, vec![(2, 2.4)]);
    // NaN norms are kept as evidence (here replaced by the later line).
    let mut out = StepsWithExtras::default();
    read_steps_from(lines[..3].join("\n").as_bytes(), 0, &mut out).unwrap();
    assert!(out.grad_norm[1].1.is_nan());
}

#[test]
fn side_series_come_from_a_lightning_metrics_csv() {
    let curve = read_curve_from(&fixture("lightning/version_0/metrics.csv"), None).unwrap();
    // Lightning logs val_loss once per validation run, on its own rows.
    assert!(!curve.side.eval_loss.is_empty());
    assert!(curve.side.eval_loss.iter().all(|p| p.1.is_finite()));
    assert!(curve.side.grad_norm.is_empty() && curve.side.learning_rate.is_empty());
}

#[test]
fn event_files_left_as_lfs_pointers_do_not_hide_a_readable_trainer_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    copy_tree(&fixture("hf_run"), &out);
    // A clone without `git lfs pull`: every event file is its pointer.
    for file in crate::formats::logs::tfevents::event_files(&out.join("runs")).unwrap() {
        let pointer = crate::io::lfs::tests::pointer_for(&file);
        std::fs::write(&file, pointer).unwrap();
    }
    let curve = read_curve(&out, None).unwrap();
    assert_eq!(curve.steps, (1..=30).collect::<Vec<i64>>());
    assert_eq!(curve.source, LogSource::TrainerState.name());
    // Without the trainer state the pointer is the error, named as such.
    std::fs::remove_file(out.join("trainer_state.json")).unwrap();
    std::fs::remove_dir_all(out.join("checkpoint-20")).unwrap();
    let e = read_curve(&out, None).unwrap_err();
    assert!(crate::io::lfs::is_pointer_error(&e), "{e}");
}
