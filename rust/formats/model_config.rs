//! Read a Hugging Face model's `config.json` for the one thing the drift
//! rules ask of it: how many outputs the loss is a cross-entropy over.
//!
//! Why: a mean cross-entropy over K outputs starts near ln(K) for a model
//! that knows nothing (a uniform guess) and only falls from there. A loss
//! far above ln(K) says the weights blew up, whatever the curve's shape;
//! a loss flat at ln(K) says the model never learned. Without K a loss of
//! 300 could be a regression loss in raw units, so the rules only use it
//! where the saved config names the head:
//!
//! - a language-model head (`architectures` ending in `ForCausalLM`,
//!   `LMHeadModel`, `ForConditionalGeneration`, `ForMaskedLM`): K is
//!   `vocab_size` (top level, else `text_config.vocab_size` as multimodal
//!   models keep it);
//! - a classification head (`For*Classification`, `ForMultipleChoice`):
//!   K is `num_labels` (else the size of `id2label`), unless `problem_type`
//!   is `regression` or `multi_label_classification` (no softmax over K);
//! - anything else, or a K below 2: nothing.
//!
//! The file is untrusted: read with a size cap, every field type-checked;
//! a file that cannot be read or parsed is no evidence (None), never an
//! error of the run's log.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::Area;
use crate::io::files;

/// The file name the Trainer's `save_model` writes beside the weights.
pub const CONFIG_JSON: &str = "config.json";
/// Largest `config.json` read (real ones are a few KiB; `id2label` of a
/// large label set can make one a few hundred KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Largest K believed: above the biggest vocabularies in use (256Ki).
pub const MAX_OUTPUTS: u64 = 1 << 24;

/// What the loss of a saved model is a cross-entropy over.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputClasses {
    /// K: the vocabulary's size or the number of labels.
    pub count: u64,
    /// `vocabulary` or `labels`.
    pub kind: String,
    /// The file K was read from.
    pub path: PathBuf,
    /// Where K was read, in words: `config.json`, `the base model's
    /// config.json`, `W&B's config record`, `MLflow's params`, `the
    /// TensorBoard model_config text`, `hparams.yaml`.
    pub source: String,
}

/// The output classes named by the first readable `config.json` in `dirs`.
pub fn output_classes_in<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Option<OutputClasses> {
    dirs.into_iter().find_map(|dir| {
        let path = dir.join(CONFIG_JSON);
        let bytes = files::read_small(&path, Area::LogFormat, MAX_CONFIG_BYTES).ok()?;
        let (count, kind) = output_classes(&bytes)?;
        Some(OutputClasses {
            count,
            kind: kind.to_string(),
            path,
            source: CONFIG_JSON.to_string(),
        })
    })
}

/// K for a run whose logs lie in `dirs`, from the first place that says
/// it: a `config.json` in one of them; else the config of the base model a
/// LoRA (`adapter_config.json`) or a training config (LLaMA-Factory's
/// `model_name_or_path`, axolotl's `base_model`, in a YAML file there)
/// names, when that model is a local folder or sits in the Hugging Face
/// cache; else a Lightning `hparams.yaml`'s `vocab_size` (as the Lightning
/// guard reads its module's hparams; see [`HPARAM_CLASSES`]).
pub fn output_classes_near(dirs: &[&Path]) -> Option<OutputClasses> {
    output_classes_in(dirs.iter().copied())
        .or_else(|| dirs.iter().find_map(|d| base_model_classes(d)))
        .or_else(|| dirs.iter().find_map(|d| hparams_classes(d)))
}

/// Largest YAML file read for a model path or hparams (real ones are a
/// few KiB).
pub const MAX_YAML_BYTES: u64 = 1 << 20;
/// Most YAML files of one folder read for a model path.
pub const MAX_YAML_FILES: usize = 16;
/// Keys that name the model a run trained from: PEFT's adapter config,
/// LLaMA-Factory's and the Trainer's argument files, axolotl's config.
const MODEL_PATH_KEYS: [&str; 3] = [
    "base_model_name_or_path",
    "model_name_or_path",
    "base_model",
];
/// A Lightning `hparams.yaml`'s keys for K: only a vocabulary. A module
/// with `vocab_size` in its hparams is trained on next-token cross-entropy;
/// `num_classes` also sizes detectors and segmenters whose loss is no
/// softmax over K (a healthy YOLO of 20 classes in the shared corpora logs
/// 45 early on, 15x ln 20), so a classifier's K comes from an HF config.
const HPARAM_CLASSES: [(&str, &str); 1] = [("vocab_size", "vocabulary")];

/// K from the config of the model `dir`'s adapter or training config
/// names (see [`output_classes_near`]).
fn base_model_classes(dir: &Path) -> Option<OutputClasses> {
    let mut named: Vec<String> = Vec::new();
    if let Ok(bytes) = files::read_small(
        &dir.join("adapter_config.json"),
        Area::LogFormat,
        MAX_CONFIG_BYTES,
    ) {
        if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&bytes) {
            named.extend(
                map.get("base_model_name_or_path")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            );
        }
    }
    for path in yaml_files(dir) {
        let Ok(bytes) = files::read_small(&path, Area::LogFormat, MAX_YAML_BYTES) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        named.extend(
            yaml_scalars(&text)
                .filter(|(k, _)| MODEL_PATH_KEYS.contains(k))
                .map(|(_, v)| v.to_string()),
        );
    }
    named.iter().find_map(|name| {
        // The base model lies where the run was trained, seldom under the
        // scanned root (a sibling folder, the hub cache), so its config is
        // read outside the scan's confinement: a file named config.json,
        // parsed as a model config, of which one number (K) reaches the
        // record. /proc, /sys and non-regular files stay refused.
        let found = crate::io::confine::within(None, || {
            output_classes_in([model_folder(dir, name)?.as_path()])
        })?;
        Some(OutputClasses {
            source: format!(
                "the base model's config.json ({})",
                crate::io::excerpt::quoted(name)
            ),
            ..found
        })
    })
}

/// The `*.yaml` / `*.yml` files of `dir`, by name, at most
/// [`MAX_YAML_FILES`].
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut found: Vec<PathBuf> = entries
        .take(4096)
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    found.sort();
    found.truncate(MAX_YAML_FILES);
    found
}

/// `key: value` pairs of a YAML text's plain scalar lines, at any
/// indentation, quotes taken off; comments, lists and blocks passed over.
/// Enough for the flat keys read here; not a YAML parser.
fn yaml_scalars(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with('-') {
            return None;
        }
        let (key, value) = line.split_once(':')?;
        let value = value.split(" #").next().unwrap_or("").trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        (!value.is_empty()).then_some((key.trim(), value))
    })
}

/// The local folder a model name means: a path (absolute, or relative to
/// `dir`) holding a `config.json`, else a Hugging Face hub id's newest
/// snapshot in the local cache (`HF_HUB_CACHE`, `HF_HOME/hub`, or
/// `~/.cache/huggingface/hub`), read without a network.
fn model_folder(dir: &Path, name: &str) -> Option<PathBuf> {
    if name.is_empty() || name.len() > 1024 || name.contains('\0') {
        return None;
    }
    let path = Path::new(name);
    let local = if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    };
    if local.join(CONFIG_JSON).is_file() {
        return Some(local);
    }
    hub_snapshot(name)
}

/// The Hugging Face hub cache's folder, as `huggingface_hub` finds it.
fn hub_cache() -> Option<PathBuf> {
    std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
        })
}

/// The snapshot `refs/main` names for hub id `name` in the local cache.
fn hub_snapshot(name: &str) -> Option<PathBuf> {
    snapshot_in(&hub_cache()?, name)
}

/// [`hub_snapshot`] in the cache at `cache`.
fn snapshot_in(cache: &Path, name: &str) -> Option<PathBuf> {
    let parts: Vec<&str> = name.split('/').collect();
    let plain = |p: &&str| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    if !(1..=2).contains(&parts.len()) || !parts.iter().all(plain) {
        return None;
    }
    let repo = cache.join(format!("models--{}", parts.join("--")));
    let head = files::read_small(&repo.join("refs").join("main"), Area::LogFormat, 256).ok()?;
    let head = String::from_utf8(head).ok()?;
    let head = head.trim();
    if head.is_empty() || !head.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some(repo.join("snapshots").join(head))
}

/// K from a Lightning `hparams.yaml` in `dir` (`save_hyperparameters`).
fn hparams_classes(dir: &Path) -> Option<OutputClasses> {
    let path = dir.join("hparams.yaml");
    let bytes = files::read_small(&path, Area::LogFormat, MAX_YAML_BYTES).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let pairs: Vec<(&str, &str)> = yaml_scalars(&text).collect();
    HPARAM_CLASSES.iter().find_map(|&(key, kind)| {
        let count: u64 = pairs.iter().find(|(k, _)| *k == key)?.1.parse().ok()?;
        (2..=MAX_OUTPUTS).contains(&count).then(|| OutputClasses {
            count,
            kind: kind.to_string(),
            path: path.clone(),
            source: "hparams.yaml".to_string(),
        })
    })
}

/// K and its kind from the bytes of a `config.json`; None when the config
/// names no softmax head (see the module docs).
pub fn output_classes(bytes: &[u8]) -> Option<(u64, &'static str)> {
    let config: Value = serde_json::from_slice(bytes).ok()?;
    output_classes_of(&config)
}

/// The model config's keys that say K (see the module docs).
pub const CLASS_KEYS: [&str; 6] = [
    "architectures",
    "vocab_size",
    "num_labels",
    "id2label",
    "problem_type",
    "text_config",
];

/// K and its kind from a tracker's record of the model config (W&B's
/// config record, MLflow's params, as HF's callbacks log them): `value`
/// gives the text logged under each of [`CLASS_KEYS`]. A text is read as
/// JSON, else as a Python literal's JSON twin (MLflow's `['GPT2LMHeadModel']`),
/// else as a string.
pub fn output_classes_logged(
    value: impl Fn(&str) -> Option<String>,
) -> Option<(u64, &'static str)> {
    let mut config = serde_json::Map::new();
    for key in CLASS_KEYS {
        let Some(text) = value(key) else { continue };
        let text = text.trim();
        let parsed = serde_json::from_str(text)
            .or_else(|_| serde_json::from_str(&text.replace('\'', "\"")))
            .unwrap_or_else(|_| Value::String(text.to_string()));
        config.insert(key.to_string(), parsed);
    }
    output_classes_of(&Value::Object(config))
}

/// K and its kind from a parsed model config.
fn output_classes_of(config: &Value) -> Option<(u64, &'static str)> {
    let architectures: Vec<&str> = config
        .get("architectures")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let any_ends = |suffixes: &[&str]| {
        architectures
            .iter()
            .any(|a| suffixes.iter().any(|s| a.ends_with(s)))
    };
    let (count, kind) = if any_ends(&["Classification", "ForMultipleChoice"]) {
        let problem = config.get("problem_type").and_then(Value::as_str);
        if matches!(problem, Some("regression" | "multi_label_classification")) {
            return None;
        }
        let labels = config
            .get("num_labels")
            .and_then(Value::as_u64)
            .or_else(|| {
                let map = config.get("id2label")?.as_object()?;
                u64::try_from(map.len()).ok()
            })?;
        (labels, "labels")
    } else if any_ends(&[
        "ForCausalLM",
        "LMHeadModel",
        "ForConditionalGeneration",
        "ForMaskedLM",
    ]) {
        let vocab = config
            .get("vocab_size")
            .and_then(Value::as_u64)
            .or_else(|| config.get("text_config")?.get("vocab_size")?.as_u64())?;
        (vocab, "vocabulary")
    } else {
        return None;
    };
    (2..=MAX_OUTPUTS).contains(&count).then_some((count, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(text: &str) -> Option<(u64, &'static str)> {
        output_classes(text.as_bytes())
    }

    #[test]
    fn a_trackers_record_of_the_config_gives_k() {
        let wandb = |key: &str| match key {
            "architectures" => Some(r#"["LlamaForCausalLM"]"#.to_string()),
            "vocab_size" => Some("32001".to_string()),
            _ => None,
        };
        assert_eq!(output_classes_logged(wandb), Some((32001, "vocabulary")));
        // MLflow logs each param as text: Python's repr of the list.
        let mlflow = |key: &str| match key {
            "architectures" => Some("['BertForSequenceClassification']".to_string()),
            "num_labels" => Some("7".to_string()),
            "problem_type" => Some("None".to_string()),
            _ => None,
        };
        assert_eq!(output_classes_logged(mlflow), Some((7, "labels")));
        assert_eq!(output_classes_logged(|_| None), None);
    }

    #[test]
    fn language_model_heads_give_the_vocabulary() {
        let gpt2 = r#"{"architectures": ["GPT2LMHeadModel"], "vocab_size": 50257}"#;
        assert_eq!(classes(gpt2), Some((50257, "vocabulary")));
        let llama = r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 32000}"#;
        assert_eq!(classes(llama), Some((32000, "vocabulary")));
        let vlm = r#"{"architectures": ["LlavaForConditionalGeneration"],
                      "text_config": {"vocab_size": 32064}}"#;
        assert_eq!(classes(vlm), Some((32064, "vocabulary")));
    }

    #[test]
    fn classification_heads_give_the_labels() {
        let bert = r#"{"architectures": ["BertForSequenceClassification"],
                       "id2label": {"0": "a", "1": "b", "2": "c"}, "vocab_size": 30522}"#;
        assert_eq!(classes(bert), Some((3, "labels")));
        let numbered = r#"{"architectures": ["RobertaForSequenceClassification"],
                           "num_labels": 5}"#;
        assert_eq!(classes(numbered), Some((5, "labels")));
    }

    #[test]
    fn no_softmax_head_gives_nothing() {
        for text in [
            // regression and multi-label heads are no cross-entropy over K
            r#"{"architectures": ["BertForSequenceClassification"], "num_labels": 1}"#,
            r#"{"architectures": ["BertForSequenceClassification"], "num_labels": 4,
                "problem_type": "regression"}"#,
            r#"{"architectures": ["BertForSequenceClassification"], "num_labels": 4,
                "problem_type": "multi_label_classification"}"#,
            // a backbone, no head; no architectures at all
            r#"{"architectures": ["BertModel"], "vocab_size": 30522}"#,
            r#"{"vocab_size": 30522}"#,
            // hostile or broken
            r#"{"architectures": "LlamaForCausalLM", "vocab_size": 32000}"#,
            r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": "32000"}"#,
            r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": -5}"#,
            r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 1e300}"#,
            r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 99999999999}"#,
            r#"[1, 2]"#,
            "not json",
        ] {
            assert_eq!(classes(text), None, "{text}");
        }
    }

    #[test]
    fn the_first_readable_config_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join(CONFIG_JSON), "{broken").unwrap();
        std::fs::write(
            b.join(CONFIG_JSON),
            r#"{"architectures": ["GPT2LMHeadModel"], "vocab_size": 50257}"#,
        )
        .unwrap();
        let found = output_classes_in([a.as_path(), b.as_path()]).unwrap();
        assert_eq!((found.count, found.kind.as_str()), (50257, "vocabulary"));
        assert_eq!(found.path, b.join(CONFIG_JSON));
        assert_eq!(output_classes_in([dir.path()]), None);
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const LM_128: &str = r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 128}"#;

    #[test]
    fn a_loras_base_model_on_disk_gives_k() {
        let dir = tempfile::tempdir().unwrap();
        let (run, base) = (dir.path().join("run"), dir.path().join("base"));
        write(&base.join(CONFIG_JSON), LM_128);
        let config = format!(
            r#"{{"peft_type": "LORA", "base_model_name_or_path": {}}}"#,
            serde_json::to_string(base.to_str().unwrap()).unwrap()
        );
        write(&run.join("adapter_config.json"), &config);
        let found = output_classes_near(&[run.as_path()]).unwrap();
        assert_eq!((found.count, found.kind.as_str()), (128, "vocabulary"));
        assert!(
            found.source.starts_with("the base model's config.json"),
            "{}",
            found.source
        );
        // A path relative to the run, as a YAML training config names it.
        std::fs::remove_file(run.join("adapter_config.json")).unwrap();
        write(
            &run.join("training_args.yaml"),
            "# LLaMA-Factory\nstage: sft\nmodel_name_or_path: '../base'\nfinetuning_type: lora\n",
        );
        assert_eq!(output_classes_near(&[run.as_path()]).unwrap().count, 128);
        // The run's own config.json comes first.
        write(
            &run.join(CONFIG_JSON),
            r#"{"architectures": ["GPT2LMHeadModel"], "vocab_size": 50257}"#,
        );
        assert_eq!(output_classes_near(&[run.as_path()]).unwrap().count, 50257);
    }

    #[test]
    fn a_hub_id_is_found_in_the_local_cache_only_by_a_plain_name() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        write(&repo.join("refs/main"), "0123abcd\n");
        write(&repo.join("snapshots/0123abcd").join(CONFIG_JSON), LM_128);
        let snap = snapshot_in(cache.path(), "org/tiny").unwrap();
        assert_eq!(output_classes_in([snap.as_path()]).unwrap().count, 128);
        for hostile in [
            "../org/tiny",
            "org/../tiny",
            "a/b/c",
            "",
            "org/tiny name",
            "/abs",
        ] {
            assert_eq!(snapshot_in(cache.path(), hostile), None, "{hostile}");
        }
        // A ref that is not a commit hash names no folder.
        write(&repo.join("refs/main"), "../../../etc\n");
        assert_eq!(snapshot_in(cache.path(), "org/tiny"), None);
    }

    #[test]
    fn lightning_hparams_give_a_vocabulary_only() {
        let dir = tempfile::tempdir().unwrap();
        let hp = dir.path().join("hparams.yaml");
        write(&hp, "lr: 10.0\nnum_classes: 5\nvocab_size: 128\n");
        let found = output_classes_near(&[dir.path()]).unwrap();
        assert_eq!(
            (found.count, found.kind.as_str(), found.source.as_str()),
            (128, "vocabulary", "hparams.yaml")
        );
        write(&hp, "model:\n  vocab_size: \"7\"  # quoted\n");
        assert_eq!(output_classes_near(&[dir.path()]).unwrap().count, 7);
        for says_nothing in [
            // a detector's classes are no cross-entropy over K
            "num_classes: 20\nloss_criterion: YoloLoss\n",
            "num_labels: 7\n",
            "vocab_size: 1\n",
            "vocab_size: -3\n",
            "vocab_size: 1e9\n",
            "- vocab_size: 9\n",
            "# vocab_size: 9\n",
            "\u{0}\u{ff}",
        ] {
            write(&hp, says_nothing);
            assert_eq!(output_classes_near(&[dir.path()]), None, "{says_nothing:?}");
        }
    }
}
