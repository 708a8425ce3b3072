//! `mlx-lm`'s `adapter_config.json`: the training arguments `mlx_lm.lora`
//! saves beside `adapters.safetensors`.
//!
//! Why its own reader: it shares PEFT's file name but not its fields. The
//! rank and scale sit in `lora_parameters` (`rank`, `scale`), and the
//! scale is applied as it is (`y + scale · (x·a)·b`), not as alpha / rank;
//! `num_layers` says how many of the last layers were adapted and `iters`
//! how many steps the run was set for. A PEFT config read for an MLX
//! adapter would give the wrong scale, so the two are told apart by
//! `lora_parameters`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Area, Error, Result};
use crate::io::files::read_small;

/// The weights file `mlx_lm.lora` writes (and its `NNNNNNN_adapters.safetensors` saves).
pub const MLX_WEIGHTS: &str = "adapters.safetensors";
/// Largest config read; `mlx_lm` writes about 1-2 KB.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// What an MLX adapter's config says.
#[derive(Debug, Clone, PartialEq)]
pub struct MlxConfig {
    pub path: PathBuf,
    /// `fine_tune_type`: `lora`, `dora` or `full` (`lora` when absent).
    pub fine_tune_type: String,
    pub rank: u64,
    /// The scale applied to `(x·a)·b`.
    pub scale: f64,
    pub num_layers: Option<i64>,
    /// Steps the run was set for (`iters`).
    pub iters: Option<i64>,
    pub learning_rate: Option<f64>,
    /// The base model named (`model`), as written.
    pub model: Option<String>,
}

/// mlx-lm's defaults for an absent rank and scale (`CONFIG_DEFAULTS`).
const DEFAULT_RANK: u64 = 8;
const DEFAULT_SCALE: f64 = 20.0;

/// Whether the JSON text is an MLX adapter config (`lora_parameters`).
/// Every PEFT `adapter_config.json` a scan reads is asked this first, so
/// text that cannot name the key (neither spelled plainly nor with a
/// `\u` escape) is answered without building its JSON tree.
pub fn is_mlx_config(bytes: &[u8]) -> bool {
    let may_name_it = memchr::memmem::find(bytes, b"lora_parameters").is_some()
        || memchr::memmem::find(bytes, b"\\u").is_some();
    may_name_it
        && serde_json::from_slice::<Value>(bytes)
            .ok()
            .is_some_and(|v| v.get("lora_parameters").is_some_and(Value::is_object))
}

impl MlxConfig {
    /// Read the config at `path`; an error where it is no MLX config or a
    /// field it uses has the wrong type.
    pub fn read(path: &Path) -> Result<MlxConfig> {
        let bytes = read_small(path, Area::Weights, MAX_CONFIG_BYTES)?;
        Self::parse(path, &bytes)
    }

    pub fn parse(path: &Path, bytes: &[u8]) -> Result<MlxConfig> {
        let err = |msg: String| Error::new(Area::Weights, path, msg);
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let params = v
            .get("lora_parameters")
            .and_then(Value::as_object)
            .ok_or_else(|| err("no lora_parameters object: not an mlx-lm adapter config".into()))?;
        let rank = match params.get("rank") {
            None | Some(Value::Null) => DEFAULT_RANK,
            Some(r) => r.as_u64().filter(|r| *r > 0).ok_or_else(|| {
                err(format!(
                    "lora_parameters.rank is {r}, not a positive integer"
                ))
            })?,
        };
        let scale = match params.get("scale") {
            None | Some(Value::Null) => DEFAULT_SCALE,
            Some(s) => s
                .as_f64()
                .filter(|s| s.is_finite())
                .ok_or_else(|| err(format!("lora_parameters.scale is {s}, not a finite number")))?,
        };
        let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
        Ok(MlxConfig {
            path: path.to_path_buf(),
            fine_tune_type: text("fine_tune_type").unwrap_or_else(|| "lora".to_string()),
            rank,
            scale,
            num_layers: v.get("num_layers").and_then(Value::as_i64),
            iters: v.get("iters").and_then(Value::as_i64).filter(|n| *n >= 0),
            learning_rate: v
                .get("learning_rate")
                .and_then(Value::as_f64)
                .filter(|x| x.is_finite()),
            model: text("model").map(|m| m.chars().take(200).collect()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_scale_and_plan_are_read_and_defaults_fill_the_rest() {
        let text = br#"{"fine_tune_type": "lora", "iters": 12, "num_layers": 2,
            "learning_rate": 0.01, "model": "tiny",
            "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 10.0}}"#;
        assert!(is_mlx_config(text));
        let c = MlxConfig::parse(Path::new("c.json"), text).expect("parses");
        assert_eq!((c.rank, c.scale), (4, 10.0));
        assert_eq!((c.num_layers, c.iters), (Some(2), Some(12)));
        assert_eq!(c.model.as_deref(), Some("tiny"));
        let c = MlxConfig::parse(Path::new("c.json"), br#"{"lora_parameters": {}}"#).unwrap();
        assert_eq!((c.rank, c.scale), (DEFAULT_RANK, DEFAULT_SCALE));
    }

    /// The key found however JSON spells it, and only as a key to an object.
    #[test]
    fn the_key_is_found_however_it_is_spelled() {
        assert!(is_mlx_config(br#"{"lora\u005fparameters": {"rank": 4}}"#));
        assert!(is_mlx_config(br#"{"\u006cora_parameters": {}}"#));
        for not in [
            &br#"{"lora_parameters": 8}"#[..],
            br#"{"note": "lora_parameters"}"#,
            br#"{"note": "\u006c", "lora_parameter": {}}"#,
            b"",
        ] {
            assert!(!is_mlx_config(not), "{}", String::from_utf8_lossy(not));
        }
    }

    #[test]
    fn a_peft_config_or_a_bad_field_is_refused() {
        let peft = br#"{"peft_type": "LORA", "r": 8, "lora_alpha": 16}"#;
        assert!(!is_mlx_config(peft));
        assert!(MlxConfig::parse(Path::new("c.json"), peft).is_err());
        for bad in [
            &br#"{"lora_parameters": {"rank": -1}}"#[..],
            br#"{"lora_parameters": {"rank": "8"}}"#,
            br#"{"lora_parameters": {"scale": "big"}}"#,
            b"{",
        ] {
            let e = MlxConfig::parse(Path::new("c.json"), bad).unwrap_err();
            assert_eq!(e.area, Area::Weights);
        }
    }
}
