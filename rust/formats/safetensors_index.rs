//! Read a sharded checkpoint's `model.safetensors.index.json`.
//!
//! `save_pretrained` splits a model larger than `max_shard_size` into
//! `model-0000i-of-0000n.safetensors` shards and writes this index beside
//! them: `{"metadata": {...}, "weight_map": {tensor name: shard file}}`. We
//! need only the weight map. A shard name must be a plain file name in the
//! same directory (a hostile index cannot point a reader elsewhere), and the
//! file is refused beyond a size cap.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Area, Error, Result};
use crate::io::files::open_regular;
use crate::io::lfs;

pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Largest index read (a 400B-parameter model's index is a few MiB).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;
/// Most shards an index may name.
pub const MAX_SHARDS: usize = 100_000;

/// The weight map of an index.
#[derive(Debug, Clone, PartialEq)]
pub struct SafetensorsIndex {
    pub path: PathBuf,
    /// Tensor name -> shard file name, sorted by tensor name.
    pub weight_map: Vec<(String, String)>,
    /// The distinct shard file names, sorted.
    pub shards: Vec<String>,
}

impl SafetensorsIndex {
    /// The shard files, beside the index.
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        let dir = self.path.parent().unwrap_or_else(|| Path::new(""));
        self.shards.iter().map(|s| dir.join(s)).collect()
    }
}

#[derive(Deserialize)]
struct Raw {
    weight_map: BTreeMap<String, String>,
}

/// Read and check the index at `path`.
pub fn read_index(path: &Path) -> Result<SafetensorsIndex> {
    let err = |msg: String| Error::new(Area::Weights, path, msg);
    let file = open_regular(path, Area::Weights)?;
    let mut bytes = Vec::new();
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(Area::Weights, path, &e))?;
    if bytes.len() as u64 > MAX_INDEX_BYTES {
        return Err(err(format!(
            "is larger than {} MiB; a safetensors index is never that big",
            MAX_INDEX_BYTES >> 20
        )));
    }
    parse_index(&bytes)
        .map_err(|msg| lfs::pointer_error(Area::Weights, path, &bytes).unwrap_or_else(|| err(msg)))
        .map(|(weight_map, shards)| SafetensorsIndex {
            path: path.to_path_buf(),
            weight_map,
            shards,
        })
}

type Parsed = (Vec<(String, String)>, Vec<String>);

/// The weight map and shard names of index text.
pub fn parse_index(bytes: &[u8]) -> std::result::Result<Parsed, String> {
    let raw: Raw = serde_json::from_slice(bytes)
        .map_err(|e| format!("is not a safetensors index (JSON with a weight_map): {e}"))?;
    if raw.weight_map.is_empty() {
        return Err("its weight_map is empty".into());
    }
    let mut shards: Vec<String> = raw.weight_map.values().cloned().collect();
    shards.sort();
    shards.dedup();
    if shards.len() > MAX_SHARDS {
        return Err(format!(
            "names {} shard files, more than {MAX_SHARDS}",
            shards.len()
        ));
    }
    if let Some(bad) = shards.iter().find(|s| !is_plain_file_name(s)) {
        return Err(format!(
            "names the shard {bad:?}, which is not a file name beside the index"
        ));
    }
    Ok((raw.weight_map.into_iter().collect(), shards))
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_weight_map() {
        let text = br#"{"metadata": {"total_size": 12}, "weight_map": {
            "model.layers.1.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"}}"#;
        let (map, shards) = parse_index(text).unwrap();
        assert_eq!(map[0].0, "lm_head.weight");
        assert_eq!(
            shards,
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
    }

    #[test]
    fn hostile_indexes_are_refused() {
        for (text, says) in [
            (
                &br#"{"weight_map": {"a": "../x.safetensors"}}"#[..],
                "not a file name",
            ),
            (
                br#"{"weight_map": {"a": "/etc/passwd"}}"#,
                "not a file name",
            ),
            (
                br#"{"weight_map": {"a": "sub/x.safetensors"}}"#,
                "not a file name",
            ),
            (br#"{"weight_map": {}}"#, "empty"),
            (br#"{"weight_map": {"a": 3}}"#, "not a safetensors index"),
            (br#"[1, 2]"#, "not a safetensors index"),
            (b"", "not a safetensors index"),
        ] {
            let e = parse_index(text).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
