//! Unit tests of the loss-log reader.

use super::*;

/// A reader that returns one byte at a time exercises every boundary.
struct Trickle<'a>(&'a [u8]);
impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.is_empty() || buf.is_empty() {
            return Ok(0);
        }
        buf[0] = self.0[0];
        self.0 = &self.0[1..];
        Ok(1)
    }
}

fn step(s: i64, l: f64) -> String {
    format!(r#"{{"loss": {l}, "step": {s}, "type": "step"}}"#)
}

#[test]
fn universal_newlines_and_blank_lines() {
    let data = format!(
        "\r\n{}\r{}\n\n  \r\n{}",
        step(1, 1.0),
        step(2, 2.0),
        step(3, 3.0)
    );
    for trickle in [false, true] {
        let mut out = vec![];
        if trickle {
            read_steps_from(Trickle(data.as_bytes()), 0, &mut out).unwrap();
        } else {
            read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
        }
        assert_eq!(out, vec![(1, 1.0), (2, 2.0), (3, 3.0)], "trickle={trickle}");
    }
}

#[test]
fn a_lone_cr_splits_the_first_line() {
    // Python reads "{...}\r garbage" as two lines: a valid first line.
    let data = format!("{}\rgarbage\n", step(1, 1.0));
    let mut out = vec![];
    read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
    assert_eq!(out, vec![(1, 1.0)]);
    let mut out = vec![];
    assert!(read_steps_from(&b"garbage\r{}"[..], 0, &mut out).is_err());
}

#[test]
fn many_batches_keep_order() {
    let body: String = (0..200_000).map(|i| step(i, i as f64) + "\n").collect();
    let mut out = vec![];
    read_steps_from(body.as_bytes(), 0, &mut out).unwrap();
    assert_eq!(out.len(), 200_000);
    assert!(out.iter().enumerate().all(|(i, &(s, _))| s == i as i64));
}

#[test]
fn dedupe_keeps_the_last_record() {
    let c = assemble(
        vec![(1, 5.0), (2, 4.0), (3, f64::NAN), (2, 9.0), (0, 1.0)],
        vec![PathBuf::from("a"), PathBuf::from("b")],
    );
    assert_eq!(c.steps, vec![0, 1, 2, 3]);
    assert_eq!(c.losses, vec![1.0, 5.0, 9.0, f64::INFINITY]);
}

#[test]
fn reads_files_in_name_order_with_torn_lines() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let banner = r#"{"type": "banner", "run_id": 1}"#;
    let step = |s: i64, l: f64| format!(r#"{{"loss": {l}, "step": {s}, "type": "step"}}"#);
    let a = format!("{banner}\n{}\n{}\n", step(1, 3.0), step(2, 2.0));
    let b = format!(
        "{banner}\r\n{}\r\n{}\r\n{{\"loss\": 1.",
        step(2, 2.5),
        step(3, 1.0)
    );
    std::fs::write(logs.join("train-000002-20250101T000001.jsonl"), b).unwrap();
    std::fs::write(logs.join("train-000001-20250101T000000.jsonl"), a).unwrap();
    std::fs::write(logs.join("other.jsonl"), "garbage").unwrap();
    let files = resolve_source(dir.path()).unwrap();
    assert_eq!(files.len(), 2);
    let c = read_loss_curve(&files).unwrap();
    assert_eq!(c.steps, vec![1, 2, 3]);
    assert_eq!(c.losses, vec![3.0, 2.5, 1.0]);
    assert_eq!(c.num_files, 2);
}

#[test]
fn bad_first_line_is_an_error_but_a_blank_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("train-1.jsonl");
    std::fs::write(&p, "{oops\n").unwrap();
    let e = read_loss_curve(std::slice::from_ref(&p)).unwrap_err();
    assert_eq!(e.area, Area::LogFormat);
    assert!(e.message.contains("first line"), "{e}");
    std::fs::write(&p, "\n{oops\n{\"type\":\"step\",\"step\":1,\"loss\":1}\n").unwrap();
    assert_eq!(read_loss_curve(&[p]).unwrap().steps, vec![1]);
    let e = read_loss_curve(&[dir.path().to_path_buf()]).unwrap_err();
    assert_eq!(e.area, Area::LogFormat);
}

#[test]
fn unicode_whitespace_is_stripped_like_python() {
    let line = format!("\u{a0}\u{3000}{}\u{2028}\u{205f} ", step(4, 0.5));
    let data = format!("{line}\n\u{3000}\n{}\n", step(5, 0.25));
    let mut out = vec![];
    read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
    assert_eq!(out, vec![(4, 0.5), (5, 0.25)]);
    assert_eq!(strip("\u{a0}x\u{a0}".as_bytes()), b"x");
    assert_eq!(strip("\u{a0}".as_bytes()), b"");
    // U+200B (zero width space) is not whitespace to Python.
    assert_eq!(strip("\u{200b}x".as_bytes()), "\u{200b}x".as_bytes());
    // Non-ASCII digits: Python's int("١٢") is 12, ours is not a step (documented).
    let arabic = r#"{"type": "step", "step": "١٢", "loss": 1.0}"#;
    let mut out = vec![];
    read_steps_from(
        format!("{}\n{arabic}\n", step(1, 1.0)).as_bytes(),
        0,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, vec![(1, 1.0)]);
}

#[test]
fn a_huge_whitespace_only_first_line_is_blank() {
    for pad in [" ", "\u{3000}", "\u{a0}"] {
        let mut data = pad.repeat(MAX_LINE / pad.len() + BATCH);
        data.push('\n');
        data.push_str("not json, not the first line\n");
        data.push_str(&step(3, 1.5));
        let mut out = vec![];
        read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
        assert_eq!(out, vec![(3, 1.5)], "{pad:?}");
    }
    let mut data = " ".repeat(MAX_LINE + BATCH);
    data.push('x');
    data.push('\n');
    let mut out = vec![];
    assert!(read_steps_from(data.as_bytes(), 0, &mut out).is_err());
}

#[test]
fn overlong_line_is_discarded() {
    let mut data = step(1, 1.0).into_bytes();
    data.push(b'\n');
    data.extend(std::iter::repeat_n(b'x', MAX_LINE + BATCH));
    data.push(b'\n');
    data.extend(step(2, 2.0).into_bytes());
    let mut out = vec![];
    read_steps_from(&data[..], 0, &mut out).unwrap();
    assert_eq!(out, vec![(1, 1.0), (2, 2.0)]);
    let mut out = vec![];
    let long_first = vec![b'x'; MAX_LINE + BATCH];
    assert!(read_steps_from(&long_first[..], 0, &mut out).is_err());
}

// ---- read_curve_from over the generated fixtures ----

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

/// Profiling aid: `ADAPTERPROBE_PROFILE_LOG=path cargo test --release
/// profile_read_loss_curve -- --ignored` reads that log ten times.
#[test]
#[ignore = "a profiling aid, not a test"]
fn profile_read_loss_curve() {
    let Ok(path) = std::env::var("ADAPTERPROBE_PROFILE_LOG") else {
        return;
    };
    for _ in 0..10 {
        let c = read_loss_curve(&[PathBuf::from(&path)]).unwrap();
        assert!(!c.steps.is_empty());
    }
}

/// A reader that hands out at most `n` bytes a call (a pipe, a network
/// file system), to move batch ends to odd places.
struct Chunked<'a>(&'a [u8], usize);

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.min(out.len()).min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn records_across_many_batches_are_all_read_in_order_while_the_next_batch_is_read() {
    // 2.5 batches of step lines of varied length, each batch read while
    // the one before is parsed: every record once, in file order.
    let mut text = String::new();
    let mut step = 0i64;
    while text.len() < 2 * BATCH + BATCH / 2 {
        let pad = "p".repeat((step % 97) as usize);
        text.push_str(&format!(
            "{{\"type\": \"step\", \"step\": {step}, \"loss\": {}.5, \"note\": \"{pad}\"}}\n",
            step % 7
        ));
        step += 1;
    }
    for chunk in [usize::MAX, 4096 + 17] {
        let mut out: Vec<(i64, f64)> = Vec::new();
        read_steps_from(Chunked(text.as_bytes(), chunk), 0, &mut out).unwrap();
        assert_eq!(out.len() as i64, step, "chunk {chunk}");
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, r)| r.0 == i as i64 && r.1 == (i % 7) as f64 + 0.5));
    }
}
