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
    /// The `config.json` read.
    pub path: PathBuf,
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
}
