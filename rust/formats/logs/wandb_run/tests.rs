use super::framing::{frame, Records, HEADER, MAX_RECORD_BYTES};
use super::wire::{encode_bytes as bytes_field, encode_varint as varint};
use super::*;

/// Protobuf encoding for test records (the writer side of `wire`).
fn key(field: u64, wire: u64) -> Vec<u8> {
    varint(field << 3 | wire)
}

fn item_json(name: &str, json: &str) -> Vec<u8> {
    let mut item = bytes_field(2, name.as_bytes());
    item.extend(bytes_field(16, json.as_bytes()));
    bytes_field(1, &item)
}

fn history(items: &[(&str, &str)], step: Option<u64>) -> Vec<u8> {
    let mut row: Vec<u8> = items.iter().flat_map(|(k, v)| item_json(k, v)).collect();
    if let Some(s) = step {
        let mut st = key(1, 0);
        st.extend(varint(s));
        row.extend(bytes_field(2, &st));
    }
    bytes_field(RECORD_HISTORY, &row)
}

fn run_record(id: &str, project: &str, name: &str) -> Vec<u8> {
    let mut meta = bytes_field(1, id.as_bytes());
    meta.extend(bytes_field(3, project.as_bytes()));
    meta.extend(bytes_field(8, name.as_bytes()));
    bytes_field(RECORD_RUN, &meta)
}

fn parse(bytes: &[u8]) -> WandbRun {
    assert_eq!(&bytes[..7], &HEADER);
    let (run, io_error) = parse_run(&bytes[7..]);
    assert!(!io_error);
    run
}

#[test]
fn rows_step_by_the_trainers_own_step() {
    // HF's callback: W&B's step counts log calls; train/global_step is the
    // optimizer step, shared by a train row and an eval row.
    let log = frame(&[
        run_record("abc123", "demo", "tiny-lora"),
        history(
            &[("train/loss", "2.5"), ("train/global_step", "10")],
            Some(0),
        ),
        history(
            &[("eval/loss", "2.7"), ("train/global_step", "10")],
            Some(1),
        ),
        history(
            &[
                ("train/loss", "NaN"),
                ("train/global_step", "20"),
                ("_runtime", "1.5"),
            ],
            Some(2),
        ),
    ]);
    let run = parse(&log);
    assert_eq!(run.label(), "demo/tiny-lora (abc123)");
    assert_eq!(run.rows, 3);
    let loss = &run.series["train/loss"];
    assert_eq!(loss[0], (10, 2.5));
    assert_eq!(loss[1].0, 20);
    assert!(loss[1].1.is_nan(), "a NaN loss is kept");
    assert_eq!(run.series["eval/loss"], vec![(10, 2.7)]);
    assert!(!run.series.contains_key("_runtime"));
    assert!(!run.series.contains_key("train/global_step"));
    assert!(!run.torn);
}

#[test]
fn without_a_trainer_step_the_wandb_step_is_used() {
    let log = frame(&[
        history(&[("loss", "1.0")], Some(3)),
        history(&[("loss", "Infinity"), ("_step", "9")], None),
        history(
            &[("loss", "\"text\""), ("acc", "{\"_type\": \"histogram\"}")],
            Some(5),
        ),
    ]);
    let run = parse(&log);
    assert_eq!(run.series["loss"][0], (3, 1.0));
    assert_eq!(run.series["loss"][1].0, 9);
    assert!(run.series["loss"][1].1.is_infinite());
    assert_eq!(run.series["loss"].len(), 2, "a string is no point");
    assert!(!run.series.contains_key("acc"), "a histogram is no series");
}

#[test]
fn typed_values_of_older_releases_are_read() {
    let mut item = bytes_field(1, b"loss");
    item.extend(key(6, 1));
    item.extend(0.75f64.to_le_bytes());
    let mut other = bytes_field(1, b"tokens");
    other.extend(key(5, 0));
    other.extend(varint(7)); // zigzag(7) = -4
    let mut row = bytes_field(1, &item);
    row.extend(bytes_field(1, &other));
    let run = parse(&frame(&[bytes_field(RECORD_HISTORY, &row)]));
    assert_eq!(run.series["loss"], vec![(1, 0.75)]);
    assert_eq!(run.series["tokens"], vec![(1, -4.0)]);
}

#[test]
fn records_spanning_blocks_are_reassembled() {
    // A row far larger than a block: pieces FIRST, MIDDLE..., LAST.
    let names: Vec<String> = (0..4000).map(|i| format!("metric/{i:05}")).collect();
    let items: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "0.5")).collect();
    let mut records = vec![history(&[("loss", "3.0")], Some(1))];
    records.push(history(&items, Some(2)));
    records.push(history(&[("loss", "2.0")], Some(3)));
    let log = frame(&records);
    assert!(log.len() > 2 * 32 * 1024);
    let run = parse(&log);
    assert_eq!(run.series["loss"], vec![(1, 3.0), (3, 2.0)]);
    assert_eq!(run.series.len(), 4001);
    assert_eq!(run.corrupt_blocks, 0);
}

#[test]
fn a_torn_tail_keeps_what_came_before() {
    let log = frame(&[
        history(&[("loss", "3.0")], Some(1)),
        history(&[("loss", "2.0")], Some(2)),
    ]);
    let cut = &log[..log.len() - 3];
    let run = parse(cut);
    assert_eq!(run.series["loss"], vec![(1, 3.0)]);
    assert!(run.torn);
}

#[test]
fn a_bad_checksum_loses_its_block_not_the_log() {
    let filler: Vec<Vec<u8>> = (0..4000)
        .map(|i| history(&[("loss", "1.0")], Some(i)))
        .collect();
    let mut log = frame(&filler);
    assert!(log.len() > 2 * 32 * 1024);
    log[7 + 7] ^= 0xff; // the first chunk's data
    let run = parse(&log);
    // The bad block, and the orphaned tail of the row it began, if any.
    assert!(
        (1..=2).contains(&run.corrupt_blocks),
        "{}",
        run.corrupt_blocks
    );
    let steps: Vec<i64> = run.series["loss"].iter().map(|p| p.0).collect();
    assert!(!steps.is_empty() && steps[0] > 100, "{steps:?}");
    assert!(steps.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn oversized_records_are_passed_over_whole() {
    let big = bytes_field(4, &vec![b'x'; MAX_RECORD_BYTES + 10]);
    let log = frame(&[
        history(&[("loss", "3.0")], Some(1)),
        big,
        history(&[("loss", "2.0")], Some(2)),
    ]);
    let mut records = Records::after_header(&log[7..]);
    let mut n = 0;
    while records.next_record().is_some() {
        n += 1;
    }
    assert_eq!((n, records.oversized, records.corrupt), (2, 1, 0));
}

#[test]
fn the_curve_takes_the_loss_by_its_meaning_and_the_side_series() {
    let log = frame(&[
        history(
            &[
                ("train/nll_loss", "2.0"),
                ("train/grad_norm", "1.0"),
                ("train/learning_rate", "1e-4"),
            ],
            Some(1),
        ),
        history(&[("train/nll_loss", "1.5"), ("eval/loss", "1.8")], Some(2)),
    ]);
    let run = parse(&log);
    let curve = curve_of(&run, Path::new("run-x.wandb"), None).unwrap();
    assert_eq!(curve.series, "train/nll_loss");
    assert_eq!(curve.source, "wandb");
    assert_eq!(curve.steps, vec![1, 2]);
    assert_eq!(curve.side.eval_loss, vec![(2, 1.8)]);
    assert_eq!(curve.side.grad_norm, vec![(1, 1.0)]);
    assert_eq!(curve.side.learning_rate, vec![(1, 1e-4)]);
    let other = curve_of(&run, Path::new("run-x.wandb"), Some("eval/loss")).unwrap();
    assert_eq!(other.series, "eval/loss");
    let e = curve_of(&run, Path::new("run-x.wandb"), Some("nope")).unwrap_err();
    assert_eq!(e.area, Area::Usage);
}

#[test]
fn a_run_without_a_loss_says_so() {
    let run = parse(&frame(&[history(&[("accuracy", "0.5")], Some(1))]));
    let e = curve_of(&run, Path::new("run-x.wandb"), None).unwrap_err();
    assert!(
        crate::formats::logs::loss_log::is_no_loss_series(&e),
        "{}",
        e.message
    );
    assert!(e.message.contains("accuracy"));
}

#[test]
fn files_that_are_no_run_log_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-x.wandb");
    for (bytes, says) in [
        (&b"hello world"[..], "does not start"),
        (&b":W&B\x00\x00\x09"[..], "version"),
        (&b""[..], "does not start"),
    ] {
        std::fs::write(&path, bytes).unwrap();
        let e = read_run(&path).unwrap_err();
        assert!(e.message.contains(says), "{}", e.message);
    }
    std::fs::write(&path, frame(&[history(&[("loss", "1")], Some(1))])).unwrap();
    assert_eq!(read_run(&path).unwrap().series["loss"], vec![(1, 1.0)]);
    assert!(
        !is_run_dir(dir.path()),
        "neither named as W&B names runs nor holding files/"
    );
    std::fs::create_dir(dir.path().join("files")).unwrap();
    assert!(is_run_dir(dir.path()));
    let named = dir.path().join("offline-run-20260101_000000-abc");
    std::fs::create_dir(&named).unwrap();
    assert!(!is_run_dir(&named), "no run log in it");
    std::fs::copy(&path, named.join("run-abc.wandb")).unwrap();
    assert!(is_run_dir(&named));
    assert!(!is_run_dir(&dir.path().join("missing")));
}

#[test]
fn keys_are_capped() {
    let names: Vec<String> = (0..MAX_KEYS + 5).map(|i| format!("m{i}")).collect();
    let rows: Vec<Vec<u8>> = names
        .chunks(1000)
        .map(|c| {
            let items: Vec<(&str, &str)> = c.iter().map(|n| (n.as_str(), "1")).collect();
            history(&items, Some(1))
        })
        .collect();
    let run = parse(&frame(&rows));
    assert_eq!(run.series.len(), MAX_KEYS);
    assert!(run.capped);
}

fn exit_record(code: i64) -> Vec<u8> {
    let mut exit = key(1, 0);
    // protobuf writes an int32 sign-extended to 64 bits
    exit.extend(varint(code as u64));
    bytes_field(RECORD_EXIT, &exit)
}

#[test]
fn the_exit_record_says_how_the_run_ended() {
    let rows = || {
        vec![
            history(&[("loss", "2.0")], Some(1)),
            history(&[("loss", "1.5")], Some(2)),
        ]
    };
    let ending = |extra: Option<Vec<u8>>| {
        let mut records = rows();
        records.extend(extra);
        let run = parse(&frame(&records));
        curve_of(&run, Path::new("run-x.wandb"), None)
            .unwrap()
            .side
            .ending
    };
    assert_eq!(ending(Some(exit_record(0))), Some(RunEnd::Finished));
    let Some(RunEnd::Crashed(why)) = ending(Some(exit_record(255))) else {
        panic!("not a crash")
    };
    assert!(why.contains("exit code 255"), "{why}");
    let Some(RunEnd::Crashed(why)) = ending(Some(exit_record(-9))) else {
        panic!("not a crash")
    };
    assert!(why.contains("exit code -9"), "{why}");
    assert!(matches!(ending(None), Some(RunEnd::Unfinished(_))));
}

fn config_record(items: &[(&str, &str)]) -> Vec<u8> {
    let mut update = Vec::new();
    for (k, json) in items {
        let mut item = bytes_field(1, k.as_bytes());
        item.extend(bytes_field(16, json.as_bytes()));
        update.extend(bytes_field(1, &item));
    }
    bytes_field(RECORD_CONFIG, &update)
}

#[test]
fn the_config_record_says_what_the_loss_is_over() {
    let log = frame(&[
        config_record(&[
            ("learning_rate", "10.0"),
            ("architectures", r#"["LlamaForCausalLM"]"#),
            ("vocab_size", "128"),
        ]),
        history(&[("train/loss", "600.0")], Some(1)),
        history(&[("train/loss", "500.0")], Some(2)),
    ]);
    let run = parse(&log);
    let curve = curve_of(&run, Path::new("run-x.wandb"), None).unwrap();
    let classes = curve.output_classes.unwrap();
    assert_eq!((classes.count, classes.kind.as_str()), (128, "vocabulary"));
    assert_eq!(classes.path, Path::new("run-x.wandb"));
    // A run whose config names no softmax head has none.
    let log = frame(&[
        config_record(&[("vocab_size", "128")]),
        history(&[("loss", "1.0")], Some(1)),
    ]);
    let curve = curve_of(&parse(&log), Path::new("run-x.wandb"), None).unwrap();
    assert_eq!(curve.output_classes, None);
}
