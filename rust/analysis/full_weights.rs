//! Weight-space health of a full fine-tune's checkpoint: every value of
//! every float tensor of `model.safetensors` (or of its shards).
//!
//! Why: a full fine-tune has no LoRA factors to judge, but a bad step that
//! left NaN or inf in the weights breaks it just the same, and per-layer L2
//! norms show a layer that blew up or collapsed. Tensors are streamed in
//! bounded chunks (`tensor_data`), each chunk a work item on the rayon pool
//! (so one large tensor is spread over every core), and memory stays at a
//! chunk per thread whatever the model's size.
//!
//! Decisions:
//! - Float tensors (F32/F16/BF16/F64) are read; any other dtype (int
//!   buffers, quantized U8/I8 weights) is listed in `skipped`, not read.
//! - A tensor belongs to the layer its name carries
//!   (`attribution::layer_number`: `layers.N`, `h.N`, `block.N`, ...);
//!   the rest (embeddings, final norm, head) is `other`.
//! - Norms accumulate Σv² in f64; a non-finite value makes its tensor's and
//!   its layer's norm NaN or inf, and is counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::analysis::adapter_weights::TensorStats;
use crate::analysis::attribution::layer_number;
use crate::error::Result;
use crate::formats::tensor_data::{
    FloatKind, FloatTensor, Moments, SafetensorsData, DEFAULT_CHUNK_ELEMS,
};

/// The weights of one transformer layer, together.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    pub layer: u64,
    /// Float tensors of the layer.
    pub tensors: u64,
    pub numel: u64,
    /// L2 norm over all the layer's values (NaN/inf with a non-finite one).
    pub norm: f64,
    pub nonfinite: u64,
}

/// The report of one full checkpoint's weights.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct FullWeights {
    /// The checkpoint directory or the file given.
    pub path: PathBuf,
    /// The safetensors files read, in order (one, or the shards).
    pub files: Vec<PathBuf>,
    /// Every float tensor, by (layer, name); tensors without a layer first.
    pub tensors: Vec<TensorStats>,
    /// Per layer, by layer index.
    pub layers: Vec<LayerWeights>,
    /// (name, dtype) of the tensors not read (not a float dtype).
    pub skipped: Vec<(String, String)>,
    /// L2 norm of the tensors outside the layers (embeddings, head, final norm).
    pub other_norm: f64,
    /// L2 norm of all float values.
    pub total_norm: f64,
    /// Bytes of float tensor data read.
    pub tensor_bytes: u64,
    pub nonfinite_total: u64,
}

/// Read every float tensor of the safetensors `files` (a model or its
/// shards); `path` names the checkpoint in the report.
pub fn read_full_weights(path: &Path, files: &[PathBuf]) -> Result<FullWeights> {
    read_full_weights_chunked(path, files, DEFAULT_CHUNK_ELEMS)
}

pub(crate) fn read_full_weights_chunked(
    path: &Path,
    files: &[PathBuf],
    chunk_elems: usize,
) -> Result<FullWeights> {
    let mut tensors = vec![];
    let mut skipped = vec![];
    let mut tensor_bytes = 0u64;
    for file in files {
        let data = SafetensorsData::open(file)?;
        let mut floats = vec![];
        for info in &data.header().tensors {
            if FloatKind::from_safetensors(&info.dtype).is_none() {
                skipped.push((info.name.clone(), info.dtype.clone()));
            } else {
                floats.push(data.float_tensor(info)?);
            }
        }
        tensor_bytes += floats.iter().map(|t| t.byte_len).sum::<u64>();
        let moments = chunked_moments(&data, &floats, chunk_elems)?;
        tensors.extend(
            floats
                .iter()
                .zip(&moments)
                .map(|(t, m)| TensorStats::of(t, m)),
        );
    }
    tensors.sort_by(|a, b| (layer_number(&a.name), &a.name).cmp(&(layer_number(&b.name), &b.name)));
    let mut per_layer: BTreeMap<u64, LayerWeights> = BTreeMap::new();
    let (mut other_sq, mut total_sq, mut nonfinite_total) = (0.0f64, 0.0f64, 0u64);
    for t in &tensors {
        let sq = t.norm * t.norm;
        total_sq += sq;
        nonfinite_total += t.nonfinite;
        match layer_number(&t.name) {
            Some(layer) => {
                let l = per_layer.entry(layer).or_insert(LayerWeights {
                    layer,
                    tensors: 0,
                    numel: 0,
                    norm: 0.0,
                    nonfinite: 0,
                });
                l.tensors += 1;
                l.numel += t.numel;
                l.norm += sq; // a sum of squares until the end
                l.nonfinite += t.nonfinite;
            }
            None => other_sq += sq,
        }
    }
    let layers = per_layer
        .into_values()
        .map(|l| LayerWeights {
            norm: l.norm.sqrt(),
            ..l
        })
        .collect();
    Ok(FullWeights {
        path: path.to_path_buf(),
        files: files.to_vec(),
        tensors,
        layers,
        skipped,
        other_norm: other_sq.sqrt(),
        total_norm: total_sq.sqrt(),
        tensor_bytes,
        nonfinite_total,
    })
}

/// Chunks read in one parallel window: bounds the list of work and of
/// results, whatever the file's size.
const WINDOW: usize = 1024;

/// Moments of each of `floats`, read chunk by chunk on the rayon pool (a
/// large tensor spread over every core, each reader with its own
/// positioned reads) and merged per tensor in chunk order: bit for bit
/// what reading each tensor in turn gives.
fn chunked_moments(
    data: &SafetensorsData,
    floats: &[FloatTensor],
    chunk_elems: usize,
) -> Result<Vec<Moments>> {
    let probe = data.reader(chunk_elems);
    let mut chunks = floats
        .iter()
        .enumerate()
        .flat_map(|(i, t)| (0..t.byte_len.div_ceil(probe.chunk_bytes(t))).map(move |c| (i, c)));
    let mut out = vec![Moments::default(); floats.len()];
    loop {
        let window: Vec<(usize, u64)> = chunks.by_ref().take(WINDOW).collect();
        if window.is_empty() {
            return Ok(out);
        }
        let got: Vec<Moments> = window
            .par_iter()
            .map_init(
                || data.reader(chunk_elems),
                |reader, &(i, c)| reader.chunk_moments(&floats[i], c),
            )
            .collect::<Result<_>>()?;
        for (&(i, _), m) in window.iter().zip(&got) {
            out[i].merge(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::tensor_data::tests::encode;

    /// A safetensors file of `tensors` (name, dtype, shape, values).
    fn write(path: &Path, tensors: &[(&str, FloatKind, Vec<u64>, Vec<f64>)]) {
        let mut header = serde_json::Map::new();
        let mut data = vec![];
        for (name, kind, shape, vals) in tensors {
            let bytes = encode(*kind, vals);
            let begin = data.len();
            data.extend(bytes);
            header.insert(
                (*name).to_string(),
                serde_json::json!({"dtype": kind.safetensors_name(), "shape": shape,
                    "data_offsets": [begin, data.len()]}),
            );
        }
        header.insert(
            "model.buf".into(),
            serde_json::json!({"dtype": "I64", "shape": [0], "data_offsets": [data.len(), data.len()]}),
        );
        let text = serde_json::to_vec(&header).unwrap();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text);
        out.extend(data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn layer_norms_and_nonfinite_values_across_shards() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("model-00001-of-00002.safetensors");
        let b = dir.path().join("model-00002-of-00002.safetensors");
        write(
            &a,
            &[
                (
                    "model.embed_tokens.weight",
                    FloatKind::F32,
                    vec![2, 2],
                    vec![1.0, 1.0, 1.0, 1.0],
                ),
                (
                    "model.layers.10.mlp.weight",
                    FloatKind::BF16,
                    vec![2],
                    vec![3.0, 4.0],
                ),
            ],
        );
        write(
            &b,
            &[
                (
                    "model.layers.2.q.weight",
                    FloatKind::F32,
                    vec![3],
                    vec![2.0, f64::NAN, 1.0],
                ),
                (
                    "model.layers.10.q.weight",
                    FloatKind::F16,
                    vec![1],
                    vec![0.0],
                ),
            ],
        );
        for chunk in [1, DEFAULT_CHUNK_ELEMS] {
            let w = read_full_weights_chunked(dir.path(), &[a.clone(), b.clone()], chunk).unwrap();
            let names: Vec<&str> = w.tensors.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "model.embed_tokens.weight",
                    "model.layers.2.q.weight",
                    "model.layers.10.mlp.weight",
                    "model.layers.10.q.weight"
                ]
            );
            assert_eq!(
                w.layers.iter().map(|l| l.layer).collect::<Vec<_>>(),
                [2, 10]
            );
            assert_eq!((w.layers[1].norm, w.layers[1].tensors), (5.0, 2));
            assert!(w.layers[0].norm.is_nan() && w.layers[0].nonfinite == 1);
            assert_eq!((w.other_norm, w.nonfinite_total), (2.0, 1));
            assert_eq!(w.skipped.len(), 2);
            assert_eq!(w.tensor_bytes, 16 + 4 + 12 + 2);
        }
    }
}
