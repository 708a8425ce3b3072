//! Where a full fine-tune's checkpoint keeps its model, and the model's
//! tensor names.
//!
//! `save_pretrained` (which HF Trainer calls for every checkpoint of a model
//! trained without PEFT) writes `model.safetensors`, or, past
//! `max_shard_size`, `model-0000i-of-0000n.safetensors` shards with a
//! `model.safetensors.index.json`; older saves and `safe_serialization=False`
//! write `pytorch_model.bin` (a pickled `torch.save`, whose tensor names sit
//! in the pickle), sharded as `pytorch_model.bin.index.json`. Recognising one
//! needs only names; the names of its tensors need the safetensors headers.

use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::safetensors_header::read_header;
use crate::formats::safetensors_index::{read_index, INDEX_FILE};

pub const MODEL_WEIGHTS: &str = "model.safetensors";
pub const PICKLED_WEIGHTS: &str = "pytorch_model.bin";
pub const PICKLED_INDEX: &str = "pytorch_model.bin.index.json";

/// A full model's weights in a checkpoint directory.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelFiles {
    /// One `model.safetensors`.
    Safetensors(PathBuf),
    /// `model.safetensors.index.json` and its shards.
    Sharded(PathBuf),
    /// `pytorch_model.bin` or its index: pickled, never unpickled here.
    Pickled(PathBuf),
}

impl ModelFiles {
    /// The file that names the weights (the one file, or the index).
    pub fn path(&self) -> &Path {
        match self {
            ModelFiles::Safetensors(p) | ModelFiles::Sharded(p) | ModelFiles::Pickled(p) => p,
        }
    }

    /// Its file name, for messages.
    pub fn name(&self) -> String {
        self.path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The safetensors files holding the tensors (the one file, or the
    /// index's shards); Err for pickled weights or an unreadable index.
    pub fn safetensors_files(&self) -> Result<Vec<PathBuf>> {
        match self {
            ModelFiles::Safetensors(p) => Ok(vec![p.clone()]),
            ModelFiles::Sharded(index) => Ok(read_index(index)?.shard_paths()),
            ModelFiles::Pickled(p) => Err(Error::new(
                Area::Weights,
                p,
                "pickled torch weights (pytorch_model.bin) are not read: unpickling runs \
                 code; save with safetensors to have them checked",
            )),
        }
    }
}

/// The model weights of `path`: a checkpoint directory, or one of the files
/// above given directly; None when it holds none.
pub fn locate(path: &Path) -> Option<ModelFiles> {
    if path.is_file() {
        let name = path.file_name()?.to_str()?;
        return if name == INDEX_FILE {
            Some(ModelFiles::Sharded(path.to_path_buf()))
        } else if name.ends_with(".safetensors") {
            Some(ModelFiles::Safetensors(path.to_path_buf()))
        } else if name == PICKLED_WEIGHTS || name == PICKLED_INDEX {
            Some(ModelFiles::Pickled(path.to_path_buf()))
        } else {
            None
        };
    }
    [
        (
            MODEL_WEIGHTS,
            ModelFiles::Safetensors as fn(PathBuf) -> ModelFiles,
        ),
        (INDEX_FILE, ModelFiles::Sharded),
        (PICKLED_WEIGHTS, ModelFiles::Pickled),
        (PICKLED_INDEX, ModelFiles::Pickled),
    ]
    .into_iter()
    .map(|(name, kind)| (path.join(name), kind))
    .find(|(p, _)| p.is_file())
    .map(|(p, kind)| kind(p))
}

/// Whether the directory `dir` holds a full model's weights (names only).
pub fn holds_model(dir: &Path) -> bool {
    locate(dir).is_some()
}

/// The model's tensors (name and shape) from the safetensors headers, each
/// once (a tied weight is saved once); Err(reason) when they cannot be had.
pub fn model_keys(files: &ModelFiles) -> std::result::Result<Vec<(String, Vec<u64>)>, String> {
    let shards = files.safetensors_files().map_err(|e| e.to_string())?;
    let mut keys = vec![];
    for shard in &shards {
        let header = read_header(shard).map_err(|e| e.to_string())?;
        keys.extend(header.tensors.into_iter().map(|t| (t.name, t.shape)));
    }
    let mut names: Vec<&str> = keys.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!(
            "tensor {:?} is in more than one shard of {}",
            pair[0],
            files.path().display()
        ));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_kind_of_save() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(locate(dir.path()), None);
        std::fs::write(dir.path().join(PICKLED_WEIGHTS), b"x").unwrap();
        assert!(matches!(locate(dir.path()), Some(ModelFiles::Pickled(_))));
        std::fs::write(dir.path().join(INDEX_FILE), b"{}").unwrap();
        assert!(matches!(locate(dir.path()), Some(ModelFiles::Sharded(_))));
        std::fs::write(dir.path().join(MODEL_WEIGHTS), b"x").unwrap();
        let found = locate(dir.path()).unwrap();
        assert_eq!(found.name(), MODEL_WEIGHTS);
        let e = ModelFiles::Pickled(dir.path().join(PICKLED_WEIGHTS))
            .safetensors_files()
            .unwrap_err();
        assert!(e.message.contains("not read"));
    }
}
