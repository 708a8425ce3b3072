//! Unit tests of the TensorBoard event-file reader.

use super::*;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("rust/testdata/logs")
        .join(rel)
}

/// Frame `data` as one record.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = len.to_vec();
    out.extend(masked_crc32c(&len).to_le_bytes());
    out.extend(data);
    out.extend(masked_crc32c(data).to_le_bytes());
    out
}

/// The records of a well-formed file: (start offset, data).
fn records_of(bytes: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let mut out = vec![];
    let mut at = 0;
    while at < bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        out.push((at, bytes[at + 12..at + 12 + len].to_vec()));
        at += 16 + len;
    }
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_bytes(number: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend(payload);
}

/// An Event with one `simple_value` scalar.
fn simple_event(step: i64, tag: &str, value: f32) -> Vec<u8> {
    let mut v = vec![];
    field_bytes(1, tag.as_bytes(), &mut v);
    v.push(2 << 3 | 5);
    v.extend(value.to_le_bytes());
    let mut summary = vec![];
    field_bytes(1, &v, &mut summary);
    let mut event = vec![];
    event.push(1 << 3 | 1);
    event.extend(1.0f64.to_le_bytes());
    event.push(2 << 3);
    varint(step as u64, &mut event);
    field_bytes(5, &summary, &mut event);
    event
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn read_one(path: &Path, tag: Option<&str>) -> Result<ScalarSeries> {
    read_scalar_series(&[path.to_path_buf()], tag)
}

/// `{file name: {tag: [[step, "repr"], ...]}}` written by tensorboard's own loader.
type TagPoints = Vec<(String, Vec<(i64, f64)>)>;

fn expected(dir: &str) -> Vec<(String, TagPoints)> {
    let text = std::fs::read_to_string(fixture(dir).join("events.expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(file, tags)| {
            let tags = tags
                .as_object()
                .unwrap()
                .iter()
                .map(|(tag, points)| {
                    let points = points
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| {
                            (
                                p[0].as_i64().unwrap(),
                                p[1].as_str().unwrap().parse().unwrap(),
                            )
                        })
                        .collect();
                    (tag.clone(), points)
                })
                .collect();
            (file.clone(), tags)
        })
        .collect()
}

/// Equal points; NaN matches NaN (its payload may differ), else bit-exact.
fn same_points(a: &[(i64, f64)], b: &[(i64, f64)]) -> bool {
    let same = |x: f64, y: f64| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits();
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && same(x.1, y.1))
}

#[test]
fn crc32c_known_answers() {
    assert_eq!(crc32c(b""), 0);
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
}

#[test]
fn matches_tensorboards_own_loader_on_every_fixture() {
    for (dir, run) in [
        ("hf_run/runs", "hf_run/runs/Jan01_00-00-00_fixturehost"),
        ("torch_writer", "torch_writer"),
        ("tf2", "tf2"),
        ("lightning/tb", "lightning/tb"),
    ] {
        for (file, tags) in expected(dir) {
            let path = fixture(run).join(&file);
            let names: Vec<String> = tags.iter().map(|t| t.0.clone()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(
                scalar_tags(std::slice::from_ref(&path)).unwrap(),
                sorted,
                "{file}"
            );
            for (tag, want) in tags {
                let got = read_one(&path, Some(&tag)).unwrap();
                assert!(
                    same_points(&got.points, &want),
                    "{file} {tag}: {:?}",
                    got.points
                );
                assert!(got.torn_files.is_empty());
            }
        }
    }
}

#[test]
fn default_tags_of_real_writers() {
    let hf = event_files(&fixture("hf_run")).unwrap();
    assert_eq!(hf.len(), 1);
    let series = read_scalar_series(&hf, None).unwrap();
    assert_eq!(series.tag, "train/loss");
    assert_eq!(series.points.len(), 30);
    assert_eq!(series.points[26], (27, f64::INFINITY));
    assert!(series.points[27].1.is_nan());
    assert!(series.tags.contains(&"eval/loss".to_string()));
    // Text summaries (args, model_config) are not scalars.
    assert!(!series.tags.iter().any(|t| t.contains("args")));

    let lightning = event_files(&fixture("lightning")).unwrap();
    assert_eq!(
        read_scalar_series(&lightning, None).unwrap().tag,
        "train_loss_step"
    );

    let tf2 = event_files(&fixture("tf2")).unwrap();
    let series = read_scalar_series(&tf2, None).unwrap();
    assert_eq!(series.tag, "train_loss");
    assert_eq!(series.tags, ["content_loss", "train_loss", "val_loss_f64"]);
}

#[test]
fn a_resumed_run_is_read_in_file_name_order() {
    let files = event_files(&fixture("torch_writer")).unwrap();
    assert_eq!(files.len(), 2);
    let reversed: Vec<PathBuf> = files.iter().rev().cloned().collect();
    let series = read_scalar_series(&reversed, None).unwrap();
    assert_eq!(series.tag, "loss");
    assert_eq!(series.files, files);
    let steps: Vec<i64> = series.points.iter().map(|p| p.0).collect();
    let want: Vec<i64> = (0..12).chain(9..16).collect();
    assert_eq!(steps, want);
    assert!(series.points[5].1.is_nan());
    assert_eq!(series.points[8].1, f64::INFINITY);
}

#[test]
fn every_truncation_is_torn_not_an_error() {
    let bytes = std::fs::read(fixture(
        "tf2/events.out.tfevents.1700002000.fixturehost.1000.0",
    ))
    .unwrap();
    let records = records_of(&bytes);
    let full = {
        let dir = tempfile::tempdir().unwrap();
        read_one(&write(dir.path(), "e", &bytes), Some("train_loss"))
            .unwrap()
            .points
    };
    let dir = tempfile::tempdir().unwrap();
    for cut in 0..bytes.len() {
        let path = write(dir.path(), "events.out.tfevents.1", &bytes[..cut]);
        let whole = records
            .iter()
            .filter(|(at, data)| at + data.len() + 16 <= cut)
            .count();
        let boundary = cut == 0 || records.iter().any(|(at, _)| *at == cut);
        match read_one(&path, Some("train_loss")) {
            Ok(series) => {
                assert_eq!(series.torn_files.is_empty(), boundary, "cut {cut}");
                assert!(same_points(&series.points, &full[..series.points.len()]));
            }
            // Before the first train_loss record nothing is found.
            Err(e) => assert!(
                whole < 2 && e.message.contains("no scalar tagged"),
                "cut {cut}: {e}"
            ),
        }
    }
}

#[test]
fn checksum_mismatches_name_the_record() {
    let path = fixture("torch_writer/events.out.tfevents.1700001100.fixturehost.1000.1");
    let bytes = std::fs::read(&path).unwrap();
    let records = records_of(&bytes);
    let (at, data) = &records[3];
    let dir = tempfile::tempdir().unwrap();
    for (offset, want) in [
        (at + 2, "length checksum"),
        (at + 9, "length checksum"),
        (at + 12 + data.len() / 2, "data checksum"),
        (at + 12 + data.len() + 1, "data checksum"),
    ] {
        let mut bad = bytes.clone();
        bad[offset] ^= 0x10;
        let e = read_one(&write(dir.path(), "events.out.tfevents.x", &bad), None).unwrap_err();
        assert_eq!(e.area, Area::LogFormat);
        assert!(e.message.contains(&format!("record at byte {at}")), "{e}");
        assert!(e.message.contains(want), "{e}");
    }
    // Even in the last record: a complete record with a bad checksum is corrupt.
    let mut bad = bytes.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let e = read_one(&write(dir.path(), "events.out.tfevents.x", &bad), None).unwrap_err();
    assert!(e.message.contains("data checksum"), "{e}");
}

#[test]
fn lying_lengths() {
    let bytes = std::fs::read(fixture(
        "tf2/events.out.tfevents.1700002000.fixturehost.1000.0",
    ))
    .unwrap();
    let records = records_of(&bytes);
    let (at, data) = records[2].clone();
    let dir = tempfile::tempdir().unwrap();
    let with_len = |len: u64| {
        let mut bad = bytes.clone();
        bad[at..at + 8].copy_from_slice(&len.to_le_bytes());
        bad[at + 8..at + 12].copy_from_slice(&masked_crc32c(&len.to_le_bytes()).to_le_bytes());
        write(dir.path(), "events.out.tfevents.x", &bad)
    };
    // Huge: refused before any allocation.
    for len in [MAX_RECORD_BYTES + 1, u64::MAX, 1 << 62] {
        let e = read_one(&with_len(len), None).unwrap_err();
        assert!(e.message.contains("more than the 64 MiB limit"), "{e}");
        assert!(e.message.contains(&format!("record at byte {at}")), "{e}");
    }
    // Past the end of the file but under the cap: indistinguishable from a torn write.
    let series = read_one(&with_len((bytes.len() - at) as u64), Some("train_loss")).unwrap();
    assert_eq!(series.torn_files.len(), 1);
    assert_eq!(series.points.len(), 1); // record 0 is the file_version event
                                        // Shorter or longer than the real data: the data checksum catches it.
    for len in [data.len() as u64 - 1, data.len() as u64 + 1, 0] {
        let e = read_one(&with_len(len), None).unwrap_err();
        assert!(e.message.contains("checksum"), "{len}: {e}");
    }
}

#[test]
fn hostile_protobuf_payloads_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut deep_groups = vec![];
    for _ in 0..10_000 {
        deep_groups.push(7 << 3 | 3);
    }
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            vec![
                2 << 3,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0x01,
            ],
            "varint",
        ),
        (
            vec![
                2 << 3,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0x02,
            ],
            "overflows",
        ),
        (vec![2 << 3, 0x80], "truncated varint"),
        (vec![5 << 3 | 2, 0x05, 1, 2], "past the end"),
        (
            vec![
                5 << 3 | 2,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0x7f,
            ],
            "past the end",
        ),
        (vec![1 << 3 | 1, 0, 0], "past the end"),
        (vec![0x00, 0x01], "field number 0"),
        (vec![3 << 3 | 4], "end-group"),
        (vec![3 << 3 | 6], "wire type"),
        (vec![3 << 3 | 3, 4 << 3 | 4], "mismatched"),
        (vec![3 << 3 | 3, 4 << 3], "truncated varint"),
        (deep_groups, "nested too deep"),
    ];
    for (event, want) in cases {
        let path = write(dir.path(), "events.out.tfevents.x", &frame(&event));
        let e = read_one(&path, None).unwrap_err();
        assert!(
            e.message.contains("not a valid Event protobuf"),
            "{want}: {e}"
        );
        assert!(e.message.contains(want), "{want}: {e}");
    }
    // The same damage inside a Summary.Value is found too.
    let mut value = vec![];
    field_bytes(1, b"loss", &mut value);
    value.extend([9 << 3 | 2, 0x03, 0x0a, 0x05, 0x00]);
    let mut summary = vec![];
    field_bytes(1, &value, &mut summary);
    let mut event = vec![];
    field_bytes(5, &summary, &mut event);
    let e = read_one(
        &write(dir.path(), "events.out.tfevents.x", &frame(&event)),
        None,
    )
    .unwrap_err();
    assert!(e.message.contains("past the end"), "{e}");
}

#[test]
fn unknown_fields_of_every_wire_type_are_skipped() {
    let key = |number: u64, wire: u64, out: &mut Vec<u8>| varint(number << 3 | wire, out);
    let mut event = vec![];
    key(20, 0, &mut event);
    varint(u64::MAX, &mut event);
    key(21, 1, &mut event);
    event.extend([0u8; 8]);
    field_bytes(22, b"\xff\xfe", &mut event);
    // A group holding a varint and a nested empty group.
    key(23, 3, &mut event);
    key(1, 0, &mut event);
    event.push(5);
    key(24, 3, &mut event);
    key(24, 4, &mut event);
    key(23, 4, &mut event);
    key(25, 5, &mut event);
    event.extend([0u8; 4]);
    event.extend(simple_event(-3, "loss", 0.25));
    // Wrong wire type for a known field: skipped like an unknown one.
    event.extend([2 << 3 | 5, 0, 0, 0, 0]);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "events.out.tfevents.x", &frame(&event));
    let series = read_one(&path, None).unwrap();
    assert_eq!(series.points, vec![(-3, 0.25)]);
}

#[test]
fn tensor_shapes_and_dtypes() {
    // TensorProto bytes -> a Summary.Value, then an Event at step 1.
    let value_event = |tensor: &[u8], plugin: Option<&str>| {
        let mut value = vec![];
        field_bytes(1, b"t", &mut value);
        field_bytes(8, tensor, &mut value);
        if let Some(p) = plugin {
            let mut name = vec![];
            field_bytes(1, p.as_bytes(), &mut name);
            let mut meta = vec![];
            field_bytes(1, &name, &mut meta);
            field_bytes(9, &meta, &mut value);
        }
        let mut summary = vec![];
        field_bytes(1, &value, &mut summary);
        let mut event = vec![2 << 3, 1];
        field_bytes(5, &summary, &mut event);
        frame(&event)
    };
    let dims = |sizes: &[u64]| {
        let mut shape = vec![];
        for &s in sizes {
            let mut dim = vec![1 << 3];
            varint(s, &mut dim);
            field_bytes(2, &dim, &mut shape);
        }
        shape
    };
    let tensor = |dtype: u64, shape: &[u8], rest: &[u8]| {
        let mut t = vec![1 << 3];
        varint(dtype, &mut t);
        field_bytes(2, shape, &mut t);
        t.extend(rest);
        t
    };
    let mut packed_f32 = vec![];
    field_bytes(
        5,
        &[1.5f32.to_le_bytes(), 9.0f32.to_le_bytes()].concat(),
        &mut packed_f32,
    );
    let mut unpacked_f64 = vec![6 << 3 | 1];
    unpacked_f64.extend(2.25f64.to_le_bytes());
    let mut content_f64 = vec![];
    field_bytes(4, &(-0.5f64).to_le_bytes(), &mut content_f64);
    let mut bad_content = vec![];
    field_bytes(4, &[1, 2, 3], &mut bad_content);
    let cases: Vec<(Vec<u8>, Option<f64>)> = vec![
        (value_event(&tensor(1, &[], &packed_f32), None), Some(1.5)),
        (
            value_event(&tensor(1, &dims(&[1, 1]), &packed_f32), Some("scalars")),
            Some(1.5),
        ),
        (
            value_event(&tensor(2, &[], &unpacked_f64), None),
            Some(2.25),
        ),
        (value_event(&tensor(2, &[], &content_f64), None), Some(-0.5)),
        (
            value_event(&tensor(1, &dims(&[2]), &packed_f32), None),
            None,
        ),
        (
            value_event(&tensor(1, &dims(&[0]), &packed_f32), None),
            None,
        ),
        (
            value_event(&tensor(1, &[], &packed_f32), Some("histograms")),
            None,
        ),
        (value_event(&tensor(19, &[], &packed_f32), None), None), // DT_HALF
        (value_event(&tensor(1, &[], &bad_content), None), None),
        (value_event(&tensor(1, &[], &[]), None), None), // no value at all
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (bytes, want)) in cases.into_iter().enumerate() {
        let path = write(dir.path(), "events.out.tfevents.x", &bytes);
        let got = read_one(&path, Some("t")).ok().map(|s| s.points[0].1);
        assert_eq!(got, want, "case {i}");
    }
}

#[test]
fn random_damage_with_valid_checksums_never_panics() {
    let bytes = std::fs::read(fixture(
        "hf_run/runs/Jan01_00-00-00_fixturehost/events.out.tfevents.1700000000.fixturehost.1000.0",
    ))
    .unwrap();
    let records = records_of(&bytes);
    let dir = tempfile::tempdir().unwrap();
    let mut state = 42u64;
    let mut rand = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut outcomes = [0usize; 2];
    for _ in 0..400 {
        let mut file = vec![];
        let damaged = rand() % records.len();
        for (i, (_, data)) in records.iter().enumerate() {
            let mut data = data.clone();
            if i == damaged && !data.is_empty() {
                for _ in 0..1 + rand() % 4 {
                    let i = rand() % data.len();
                    data[i] = rand() as u8;
                }
            }
            file.extend(frame(&data));
        }
        let path = write(dir.path(), "events.out.tfevents.x", &file);
        outcomes[usize::from(read_one(&path, Some("train/loss")).is_ok())] += 1;
    }
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

#[test]
fn missing_tags_list_what_is_there() {
    let files = event_files(&fixture("torch_writer")).unwrap();
    let e = read_scalar_series(&files, Some("nope")).unwrap_err();
    assert_eq!(e.path, fixture("torch_writer"));
    assert!(
        e.message
            .contains("no scalar tagged \"nope\" in 2 event files"),
        "{e}"
    );
    assert!(
        e.message.contains("loss, lr, tensor_loss, tensor_loss_f64"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "events.out.tfevents.x",
        &frame(&simple_event(1, "acc", 1.0)),
    );
    let e = read_one(&path, None).unwrap_err();
    assert!(
        e.message
            .contains("none of the loss tags train/loss, train_loss"),
        "{e}"
    );
    assert!(e.message.contains("present: acc"), "{e}");
    let empty = write(dir.path(), "events.out.tfevents.y", b"");
    let e = read_one(&empty, None).unwrap_err();
    assert!(e.message.contains("present: none"), "{e}");
    let e = read_scalar_series(&[], None).unwrap_err();
    assert!(e.message.contains("no TensorBoard event files"), "{e}");
}

#[test]
fn memory_follows_the_largest_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = vec![];
    for step in 0..2000 {
        file.extend(frame(&simple_event(step, "loss", step as f32)));
    }
    let path = write(dir.path(), "events.out.tfevents.x", &file);
    let mut collector = Collector::new(&["loss"], &|_| false);
    let f = std::fs::File::open(&path).unwrap();
    let mut records = Records::new(BufReader::new(f), file.len() as u64);
    let mut n = 0;
    while let Next::Record = records.next().unwrap() {
        n += 1;
        assert!(records.data.capacity() < 256);
    }
    assert_eq!(n, 2000);
    assert_eq!(read_file(&path, &mut collector).unwrap(), Ending::Complete);
    assert_eq!(collector.points[0].len(), 2000);
}

#[test]
fn a_loss_tag_outside_the_defaults_is_read_by_its_meaning() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = Vec::new();
    for (step, loss) in [(1, 2.0f32), (2, 1.5), (3, 1.0)] {
        bytes.extend(frame(&simple_event(step, "Loss/train", loss)));
        bytes.extend(frame(&simple_event(step, "Loss/val", loss + 0.5)));
        bytes.extend(frame(&simple_event(step, "train/loss_scale", 65536.0)));
    }
    let path = write(tmp.path(), "events.out.tfevents.1.host", &bytes);
    let series = read_one(&path, None).unwrap();
    assert_eq!(series.tag, "Loss/train");
    assert_eq!(series.points, vec![(1, 2.0), (2, 1.5), (3, 1.0)]);

    // Only a held-out loss: that one.
    let mut bytes = Vec::new();
    for step in 1..4 {
        bytes.extend(frame(&simple_event(step, "Loss/val", 1.0)));
        bytes.extend(frame(&simple_event(step, "accuracy", 0.5)));
    }
    let path = write(tmp.path(), "events.out.tfevents.2.host", &bytes);
    assert_eq!(read_one(&path, None).unwrap().tag, "Loss/val");

    // No loss at all: the error names the tags there.
    let bytes = frame(&simple_event(1, "accuracy", 0.5));
    let path = write(tmp.path(), "events.out.tfevents.3.host", &bytes);
    let e = read_one(&path, None).unwrap_err();
    assert!(
        is_missing_loss_tags(&e) && e.message.contains("accuracy"),
        "{e}"
    );
}

/// An Event with one text summary, as torch's `SummaryWriter.add_text`
/// writes it (a DT_STRING tensor under the `text` plugin).
fn text_event(step: i64, tag: &str, text: &str) -> Vec<u8> {
    let mut plugin_data = vec![];
    field_bytes(1, b"text", &mut plugin_data);
    let mut metadata = vec![];
    field_bytes(1, &plugin_data, &mut metadata);
    let mut tensor = vec![];
    tensor.push(1 << 3);
    varint(DT_STRING, &mut tensor);
    field_bytes(8, text.as_bytes(), &mut tensor);
    let mut v = vec![];
    field_bytes(1, tag.as_bytes(), &mut v);
    field_bytes(8, &tensor, &mut v);
    field_bytes(9, &metadata, &mut v);
    let mut summary = vec![];
    field_bytes(1, &v, &mut summary);
    let mut event = vec![];
    event.push(2 << 3);
    varint(step as u64, &mut event);
    field_bytes(5, &summary, &mut event);
    event
}

#[test]
fn the_model_config_text_is_kept_beside_the_scalars() {
    // The HF Trainer's own event file: a config without `architectures`.
    let hf = fixture("hf_run/runs/Jan01_00-00-00_fixturehost");
    let series = read_scalar_series(&event_files(&hf).unwrap(), None).unwrap();
    let (path, text) = series.model_config.expect("the HF run's model_config text");
    assert!(path.starts_with(&hf));
    let config: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(config["vocab_size"], 64);
    // Written as add_text writes it, the last one read wins; other text
    // tags and a non-string tensor are not taken for it.
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = frame(&simple_event(1, "train/loss", 3.0));
    bytes.extend(frame(&text_event(
        0,
        "model_config/text_summary",
        "{\"old\": 1}",
    )));
    bytes.extend(frame(&text_event(
        0,
        "args/text_summary",
        "{\"vocab_size\": 9}",
    )));
    bytes.extend(frame(&text_event(
        0,
        "model_config/text_summary",
        "{\"vocab_size\": 128}",
    )));
    let path = write(dir.path(), "events.out.tfevents.1.host", &bytes);
    let series = read_one(&path, None).unwrap();
    assert_eq!(series.points, vec![(1, 3.0)]);
    assert_eq!(
        series.model_config.unwrap().1,
        b"{\"vocab_size\": 128}".to_vec()
    );
    let only_scalars = write(
        dir.path(),
        "events.out.tfevents.2.host",
        &frame(&simple_event(1, "loss", 2.0)),
    );
    assert_eq!(read_one(&only_scalars, None).unwrap().model_config, None);
}
