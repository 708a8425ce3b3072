//! Unit tests of `store::layout` (beside it: layout.rs is near the line limit).
use super::*;

fn touch(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, b"x").unwrap();
}

#[test]
fn hf_checkpoints_are_ordered_numerically() {
    let tmp = tempfile::tempdir().unwrap();
    for n in [10, 2, 100] {
        touch(&tmp.path().join(format!("checkpoint-{n}/{TRAINER_STATE}")));
    }
    fs::create_dir_all(tmp.path().join("checkpoint-x")).unwrap();
    fs::create_dir_all(tmp.path().join("checkpoint-7")).unwrap(); // empty: not one
    let t = classify(tmp.path(), false).unwrap();
    assert_eq!(t.layout, HF_TRAINER);
    assert_eq!(t.versions, vec![tmp.path().join("checkpoint-100")]);
    let every = classify(tmp.path(), true).unwrap();
    let names: Vec<_> = every
        .versions
        .iter()
        .map(|p| p.file_name().unwrap())
        .collect();
    assert_eq!(names, ["checkpoint-2", "checkpoint-10", "checkpoint-100"]);
    let one = version_root(&tmp.path().join("checkpoint-10")).unwrap();
    assert_eq!(one.store.as_path(), tmp.path());
    assert_eq!(one.log_root, Some(tmp.path().join("checkpoint-10")));
}

/// A copy of a real HF `trainer_state.json` (global_step 20 or 30).
fn trainer_state(dir: &Path, step: u64) {
    let rel = match step {
        20 => "rust/testdata/logs/hf_run/checkpoint-20/trainer_state.json",
        30 => "rust/testdata/logs/hf_run/trainer_state.json",
        _ => unreachable!(),
    };
    fs::create_dir_all(dir).unwrap();
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    fs::copy(real, dir.join(TRAINER_STATE)).unwrap();
}

fn names(t: &Target) -> Vec<String> {
    t.versions
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn last_checkpoint_is_a_version_at_its_step() {
    let tmp = tempfile::tempdir().unwrap();
    for n in [10, 25, 40] {
        touch(&tmp.path().join(format!("checkpoint-{n}/{HF_OPTIMIZER}")));
    }
    let last = tmp.path().join(LAST_CHECKPOINT);
    trainer_state(&last, 20);
    let every = classify(tmp.path(), true).unwrap();
    assert_eq!(
        names(&every),
        [
            "checkpoint-10",
            LAST_CHECKPOINT,
            "checkpoint-25",
            "checkpoint-40"
        ]
    );
    assert_eq!(classify(tmp.path(), false).unwrap().versions.len(), 1);
    fs::remove_dir_all(tmp.path().join("checkpoint-25")).unwrap();
    fs::remove_dir_all(tmp.path().join("checkpoint-40")).unwrap();
    trainer_state(&tmp.path().join("checkpoint-20"), 20);
    // Same step: last-checkpoint is the newer copy.
    assert_eq!(
        classify(tmp.path(), false).unwrap().versions,
        vec![last.clone()]
    );
    // Its state unreadable: taken as the newest, never as another store.
    fs::write(last.join(TRAINER_STATE), b"{").unwrap();
    touch(&tmp.path().join("checkpoint-900/optimizer.pt"));
    let t = classify(tmp.path(), false).unwrap();
    assert_eq!(
        (t.layout.as_str(), t.versions.clone()),
        (HF_TRAINER, vec![last.clone()])
    );
    let alone = version_root(&last).unwrap();
    assert_eq!(
        (alone.store.as_path(), alone.versions),
        (tmp.path(), vec![last])
    );
}

#[test]
fn checkpoint_kinds() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("checkpoint-10");
    touch(&full.join("model.safetensors"));
    touch(&full.join("config.json"));
    let sharded = tmp.path().join("checkpoint-20");
    touch(&sharded.join("model.safetensors.index.json"));
    let logs = tmp.path().join("checkpoint-30");
    trainer_state(&logs, 30);
    let adapter = tmp.path().join("checkpoint-40");
    touch(&adapter.join(ADAPTER_CONFIG));
    let kinds: Vec<&str> = [&full, &sharded, &logs, &adapter]
        .iter()
        .map(|v| checkpoint_kind(v, HF_TRAINER))
        .collect();
    assert_eq!(kinds, [FULL, FULL, LOGS, ADAPTER]);
    let t = classify(tmp.path(), true).unwrap();
    assert_eq!(t.versions.len(), 4);
    assert_eq!(t.checkpoint_kind.as_deref(), Some(ADAPTER));
    fs::remove_dir_all(&adapter).unwrap();
    let t = classify(tmp.path(), false).unwrap();
    assert_eq!(t.checkpoint_kind.as_deref(), Some(LOGS));
    assert_eq!(checkpoint_kind(Path::new("x.ckpt"), LIGHTNING), FULL);
}

#[test]
fn log_only_runs_are_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("lightning_logs/version_0");
    touch(&csv.join("metrics.csv"));
    let tb = tmp.path().join("tb");
    touch(&tb.join("events.out.tfevents.1700000000.host.1.0"));
    let hf = tmp.path().join("hf");
    let events = hf.join("runs/Jan01_host");
    touch(&events.join("events.out.tfevents.1700000000.host.1.0"));
    let t = classify(&csv, false).unwrap();
    assert_eq!(
        (t.layout.as_str(), t.checkpoint_kind.as_deref()),
        (LIGHTNING, Some(LOGS))
    );
    assert!(t.versions.is_empty() && t.with_logs);
    let t = classify(&tb, false).unwrap();
    assert_eq!(
        (t.layout.as_str(), t.checkpoint_kind.as_deref()),
        (TENSORBOARD, Some(LOGS))
    );
    // Only runs/: not an HF output dir (it could hold other stores), but
    // its events are a store of their own.
    assert!(classify(&hf, false).is_none());
    assert_eq!(classify(&events, false).unwrap().layout, TENSORBOARD);
    touch(&hf.join(TRAINING_ARGS));
    assert_eq!(classify(&hf, false).unwrap().layout, HF_TRAINER);
    assert!(classify(&tmp.path().join("lightning_logs"), false).is_none());
}

#[test]
fn lightning_newest_is_last_then_highest_step() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("checkpoints");
    touch(&ck.join("epoch=0-step=50.ckpt"));
    touch(&ck.join("epoch=1-step=100.ckpt"));
    assert_eq!(
        classify(tmp.path(), false).unwrap().versions,
        vec![ck.join("epoch=1-step=100.ckpt")]
    );
    touch(&ck.join("last.ckpt"));
    let t = classify(tmp.path(), false).unwrap();
    assert_eq!(
        (t.layout.as_str(), t.versions[0].clone()),
        (LIGHTNING, ck.join("last.ckpt"))
    );
    assert_eq!(classify(tmp.path(), true).unwrap().versions.len(), 3);
}

#[test]
fn bare_peft_and_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(classify(tmp.path(), false).is_none());
    touch(&tmp.path().join(ADAPTER_CONFIG));
    assert!(classify(tmp.path(), false).is_none());
    touch(&tmp.path().join(ADAPTER_WEIGHTS));
    let t = classify(tmp.path(), false).unwrap();
    assert_eq!((t.layout.as_str(), t.versions.len()), (PEFT, 1));
}

/// A PEFT multi-adapter save: the default adapter at the top, each other
/// one in `<name>/` with its own config and weights.
fn multi_adapter_save(dir: &Path, others: &[&str]) {
    for sub in std::iter::once("").chain(others.iter().copied()) {
        touch(&dir.join(sub).join(ADAPTER_CONFIG));
        touch(&dir.join(sub).join(ADAPTER_WEIGHTS));
    }
}

#[test]
fn every_adapter_of_a_multi_adapter_save_is_a_version() {
    let tmp = tempfile::tempdir().unwrap();
    let bare = tmp.path().join("bare");
    multi_adapter_save(&bare, &["zeta", "alpha"]);
    touch(&bare.join("notes/readme.txt"));
    touch(&bare.join("half/adapter_config.json"));
    let t = classify(&bare, false).unwrap();
    assert_eq!(t.layout, PEFT);
    assert_eq!(
        t.versions,
        [bare.clone(), bare.join("alpha"), bare.join("zeta")]
    );
    let skipped = unclaimed(&t);
    let why: Vec<(&str, &str)> = skipped
        .iter()
        .map(|(p, w)| (p.file_name().unwrap().to_str().unwrap(), w.as_str()))
        .collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why[0].0 == "half" && why[0].1.contains("without adapter weights"));
    assert!(why[1].0 == "notes" && why[1].1.contains("no part of its layout"));

    let out = tmp.path().join("out");
    for n in [40, 120, 80] {
        let ck = out.join(format!("checkpoint-{n}"));
        multi_adapter_save(&ck, &["second"]);
        touch(&ck.join(HF_OPTIMIZER));
    }
    let newest = classify(&out, false).unwrap();
    assert_eq!(names(&newest), ["checkpoint-120", "second"]);
    assert_eq!(newest.versions[1], out.join("checkpoint-120/second"));
    assert_eq!(newest.checkpoint_kind.as_deref(), Some(ADAPTER));
    let every = classify(&out, true).unwrap();
    let rel: Vec<_> = every
        .versions
        .iter()
        .map(|v| v.strip_prefix(&out).unwrap().to_path_buf())
        .collect();
    let want = [
        "checkpoint-40",
        "checkpoint-40/second",
        "checkpoint-80",
        "checkpoint-80/second",
        "checkpoint-120",
        "checkpoint-120/second",
    ];
    assert_eq!(rel, want.map(PathBuf::from));
    // One checkpoint given alone: its adapters, and its own log.
    let one = version_root(&out.join("checkpoint-80")).unwrap();
    assert_eq!(one.versions.len(), 2);
    assert_eq!(
        one.log_root.as_deref(),
        Some(out.join("checkpoint-80").as_path())
    );
    assert!(one.with_logs);
}

#[test]
fn leaves_that_are_no_store_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(why_not_a_store(tmp.path()), "empty directory");
    touch(&tmp.path().join("model.safetensors.bak"));
    assert!(why_not_a_store(tmp.path()).contains("nothing a layout recognises"));
    touch(&tmp.path().join("weights.safetensors"));
    assert!(why_not_a_store(tmp.path()).contains("holds weights.safetensors"));
    let ck = tmp.path().join("checkpoint-7");
    touch(&ck.join("scheduler.pt.tmp"));
    assert!(why_not_a_store(&ck).contains("checkpoint directory holding nothing"));
}

#[test]
fn hostile_dlm_pointers_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    touch(&tmp.path().join("adapter/versions/v0001").join(STATE_FILE));
    for bad in ["../../etc", "/etc", "", "versions/v0009"] {
        fs::write(tmp.path().join("adapter/current.txt"), bad).unwrap();
        let t = dlm_target(tmp.path(), false);
        assert!(t.versions.is_empty(), "{bad}");
        assert_eq!(t.broken.len(), 1, "{bad}");
    }
}

#[test]
fn a_trainer_checkpoint_without_its_adapter_weights_is_a_skip_not_an_error() {
    use crate::store::probe_inputs::weights_input;
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("run/checkpoint-300");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(
        ckpt.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 8}"#,
    )
    .unwrap();
    std::fs::write(ckpt.join("trainer_state.json"), r#"{"log_history": []}"#).unwrap();
    let input = weights_input(&ckpt);
    assert!(input.error.is_none(), "{:?}", input.error);
    let note = input.note.unwrap();
    assert!(
        note.contains("no adapter weights (adapter_model.safetensors)"),
        "{note}"
    );
    // A weights file that is there and broken is still an error.
    std::fs::write(ckpt.join("adapter_model.safetensors"), b"garbage").unwrap();
    let input = weights_input(&ckpt);
    assert!(input.note.is_none() && input.error.is_some());
}

/// A minimal safetensors file holding f32 zeros under `names`.
fn lora_like(path: &Path, names: &[&str]) {
    let mut header = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": [1], "data_offsets": [i * 4, i * 4 + 4]}),
        );
    }
    let text = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend(std::iter::repeat_n(0u8, names.len() * 4));
    fs::write(path, bytes).unwrap();
}

#[test]
fn lora_files_of_other_tools_are_stores_and_models_are_not() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    lora_like(
        &dir.join("style.safetensors"),
        &[
            "lora_unet_x.lora_down.weight",
            "lora_unet_x.lora_up.weight",
            "lora_unet_x.alpha",
        ],
    );
    lora_like(
        &dir.join("flux.safetensors"),
        &["transformer.a.lora_A.weight", "transformer.a.lora_B.weight"],
    );
    lora_like(&dir.join("plain.safetensors"), &["w.weight"]);
    lora_like(
        &dir.join("model.safetensors"),
        &["x.lora_down.weight", "x.lora_up.weight"],
    );
    fs::write(dir.join("broken.safetensors"), b"not a header").unwrap();
    touch(&dir.join("logs").join("events.out.tfevents.1.host"));
    let found = lora_files(dir);
    let names: Vec<&str> = found
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, ["flux.safetensors", "style.safetensors"]);
    // kohya's logs/ beside its files makes no dlm store.
    assert!(!is_dlm_store(dir));
    let t = lora_file_target(&found[1]);
    assert_eq!(
        (t.layout.as_str(), t.checkpoint_kind.as_deref()),
        (LORA_FILE, Some(ADAPTER))
    );
    assert_eq!(t.versions, [found[1].clone()]);
}

#[test]
fn an_mlx_adapter_folder_is_told_from_a_peft_one_by_its_config() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    lora_like(
        &dir.join("adapters.safetensors"),
        &["m.q.lora_a", "m.q.lora_b"],
    );
    fs::write(dir.join(ADAPTER_CONFIG), r#"{"peft_type": "LORA", "r": 8}"#).unwrap();
    assert!(!is_mlx_dir(dir));
    assert!(classify(dir, false).is_none());
    fs::write(
        dir.join(ADAPTER_CONFIG),
        r#"{"lora_parameters": {"rank": 8, "scale": 20.0}}"#,
    )
    .unwrap();
    assert!(is_mlx_dir(dir));
    let t = classify(dir, false).expect("an mlx-lm store");
    assert_eq!((t.layout.as_str(), t.versions.len()), (MLX, 1));
    // Its own weights file is no LoRA file of another tool beside it.
    assert!(lora_files(dir).is_empty());
}
