//! Attribute optimizer param ids to transformer layers from adapter keys.
//!
//! PEFT registers trainable LoRA tensors layer-major, so with K layered keys
//! per layer, param id `p` belongs to the `p / K`-th layer index present in
//! the adapter. We only need key names (from the safetensors header), never
//! the weights. Irregular adapters are refused rather than guessed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::analysis::attribution::split_layer_key;
use crate::error::{Area, Error, Result};
use crate::formats::torch_state_dict::read_tensor_header;
use crate::io::read_once;

pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// PEFT's `save_pretrained(safe_serialization=False)`: the same state dict,
/// written by `torch.save` (read by `formats::torch_state_dict`).
pub const PICKLED_ADAPTER_WEIGHTS: &str = "adapter_model.bin";

/// Layer attribution of optimizer param ids (see `group_layers`).
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerGrouping {
    /// Sorted, distinct layer indices the adapter touches.
    pub layer_indices: Vec<u64>,
    /// Layered keys per layer (the same for every layer).
    pub params_per_layer: u64,
    /// layer_of[p] is the layer of optimizer param id p, for the layered ids.
    pub layer_of: Vec<u64>,
}

/// The layer index in a key, found as the first `.layers.<digits>.` in it.
pub fn layer_index(key: &str) -> Option<std::result::Result<u64, ()>> {
    const MARK: &str = ".layers.";
    let mut from = 0;
    while let Some(pos) = key[from..].find(MARK) {
        let start = from + pos + MARK.len();
        let rest = &key.as_bytes()[start..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 && rest.get(digits) == Some(&b'.') {
            // Digits only: the parse fails only on overflow.
            return Some(key[start..start + digits].parse::<u64>().map_err(|_| ()));
        }
        // Overlapping matches: the next candidate may start inside this one.
        from += pos + 1;
    }
    None
}

/// Where the adapter weights are: a weights file as is, or a dir's
/// `adapter_model.safetensors`, or its `adapter_model.bin` when only that
/// one is there (the safetensors path when neither is, for messages).
pub fn adapter_weights_path(adapter: &Path) -> PathBuf {
    if !read_once::is_dir(adapter) {
        return adapter.to_path_buf();
    }
    let safetensors = adapter.join(ADAPTER_WEIGHTS);
    let pickled = adapter.join(PICKLED_ADAPTER_WEIGHTS);
    if !read_once::exists(&safetensors) && read_once::is_file(&pickled) {
        pickled
    } else {
        safetensors
    }
}

/// Which keys carry a layer index, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKeys {
    /// dlm-sway's rule: the first `.layers.N.` in a key.
    Sway,
    /// The rule `adapter_weights` and the exact attribution use: the first
    /// `<marker>.N` with a marker of the common model families (`layers`,
    /// GPT-2's `h`, `layer`, `block`, `blocks`; `attribution::layer_number`),
    /// all layered keys in one layer stack.
    Robust,
}

/// Group the layered keys of `keys` under dlm-sway's rule; `num_params`
/// cross-checks the optimizer.
pub fn group_keys<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    num_params: Option<u64>,
) -> std::result::Result<LayerGrouping, String> {
    group_keys_by(keys, num_params, LayerKeys::Sway)
}

/// Group the layered keys of `keys` under `rule`; `num_params` cross-checks
/// the optimizer.
pub fn group_keys_by<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    num_params: Option<u64>,
    rule: LayerKeys,
) -> std::result::Result<LayerGrouping, String> {
    let mut per_layer: BTreeMap<u64, u64> = BTreeMap::new();
    let mut stacks: BTreeMap<&str, ()> = BTreeMap::new();
    let mut any_key = false;
    for key in keys {
        any_key = true;
        let index = match rule {
            LayerKeys::Sway => match layer_index(key) {
                Some(Ok(idx)) => Some(idx),
                Some(Err(())) => return Err(format!("layer index in {key:?} is too large")),
                None => None,
            },
            LayerKeys::Robust => split_layer_key(key).map(|(stack, idx, _)| {
                stacks.insert(stack, ());
                idx
            }),
        };
        if let Some(idx) = index {
            *per_layer.entry(idx).or_insert(0) += 1;
        }
    }
    if !any_key {
        return Err("no tensor keys found".into());
    }
    if per_layer.is_empty() {
        let marks = match rule {
            LayerKeys::Sway => "a `.layers.N.` index",
            LayerKeys::Robust => "a layer index (`.layers.N.`, `.h.N.`, `.layer.N.`, `.block.N.`)",
        };
        return Err(format!(
            "no key carries {marks} (the adapter may target only embeddings or lm_head), so \
             params cannot be attributed to layers"
        ));
    }
    if stacks.len() > 1 {
        let names: Vec<&str> = stacks.into_keys().collect();
        return Err(format!(
            "the adapter spans several layer stacks ({}); which comes first in the optimizer \
             is not known without the model",
            names.join(", ")
        ));
    }
    let mut counts: Vec<u64> = per_layer.values().copied().collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() != 1 {
        return Err(format!(
            "layers carry different numbers of keys {counts:?}; layer-major attribution \
             would be a guess, so it is refused"
        ));
    }
    let params_per_layer = counts[0];
    let layer_indices: Vec<u64> = per_layer.into_keys().collect();
    let expected = params_per_layer * layer_indices.len() as u64;
    if let Some(n) = num_params {
        if n < expected {
            return Err(format!(
                "the optimizer state has {n} params but the adapter has {expected} layered \
                 keys: adapter and state do not match"
            ));
        }
    }
    let layer_of = (0..expected)
        .map(|p| layer_indices[(p / params_per_layer) as usize])
        .collect();
    Ok(LayerGrouping {
        layer_indices,
        params_per_layer,
        layer_of,
    })
}

/// Group the keys of an adapter dir or `.safetensors` file by layer, under
/// dlm-sway's rule.
pub fn group_layers(adapter: &Path, num_params: Option<u64>) -> Result<LayerGrouping> {
    group_layers_by(adapter, num_params, LayerKeys::Sway)
}

/// Group the keys of an adapter dir or weights file by layer, under `rule`.
pub fn group_layers_by(
    adapter: &Path,
    num_params: Option<u64>,
    rule: LayerKeys,
) -> Result<LayerGrouping> {
    let weights = adapter_weights_path(adapter);
    if !weights.exists() {
        return Err(Error::new(
            Area::LayerGrouping,
            &weights,
            "adapter weights not found; layer indices cannot be recovered",
        ));
    }
    let header = read_tensor_header(&weights)?;
    group_keys_by(
        header.tensors.iter().map(|t| t.name.as_str()),
        num_params,
        rule,
    )
    .map_err(|msg| Error::new(Area::LayerGrouping, &weights, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lora_keys(layers: &[u64], modules: &[&str]) -> Vec<String> {
        let mut keys = vec![];
        for l in layers {
            for m in modules {
                for f in ["lora_A", "lora_B"] {
                    keys.push(format!(
                        "base_model.model.model.layers.{l}.self_attn.{m}.{f}.weight"
                    ));
                }
            }
        }
        keys
    }

    #[test]
    fn finds_the_first_layer_index() {
        assert_eq!(layer_index("m.layers.12.q.weight"), Some(Ok(12)));
        assert_eq!(layer_index("m.layers.x.layers.3.q"), Some(Ok(3)));
        assert_eq!(layer_index("m.layers.3"), None);
        assert_eq!(layer_index("layers.3.q"), None);
        assert_eq!(layer_index("m.layers..layers.7.q"), Some(Ok(7)));
        assert_eq!(
            layer_index("m.layers.99999999999999999999999.q"),
            Some(Err(()))
        );
    }

    #[test]
    fn groups_layer_major() {
        let keys = lora_keys(&[0, 1, 2], &["q_proj", "v_proj"]);
        let mut all: Vec<&str> = keys.iter().map(String::as_str).collect();
        all.push("base_model.model.lm_head.weight");
        let g = group_keys(all, Some(13)).unwrap();
        assert_eq!(g.layer_indices, vec![0, 1, 2]);
        assert_eq!(g.params_per_layer, 4);
        assert_eq!(g.layer_of.len(), 12);
        assert_eq!(g.layer_of[3], 0);
        assert_eq!(g.layer_of[4], 1);
        assert_eq!(g.layer_of[11], 2);
    }

    #[test]
    fn robust_rule_reads_gpt2_and_t5_markers() {
        let gpt2: Vec<String> = (0..3)
            .flat_map(|l| {
                ["lora_A", "lora_B"]
                    .map(|f| format!("base_model.model.transformer.h.{l}.attn.c_attn.{f}.weight"))
            })
            .collect();
        let refs: Vec<&str> = gpt2.iter().map(String::as_str).collect();
        assert!(group_keys(refs.clone(), None)
            .unwrap_err()
            .contains("`.layers.N.`"));
        let g = group_keys_by(refs.clone(), Some(6), LayerKeys::Robust).unwrap();
        assert_eq!((g.layer_indices, g.params_per_layer), (vec![0, 1, 2], 2));
        assert_eq!(g.layer_of, vec![0, 0, 1, 1, 2, 2]);
        // Llama keys group the same under both rules.
        let llama = lora_keys(&[0, 1, 2], &["q_proj", "v_proj"]);
        let refs: Vec<&str> = llama.iter().map(String::as_str).collect();
        assert_eq!(
            group_keys_by(refs.clone(), None, LayerKeys::Robust),
            group_keys(refs, None)
        );
        // Encoder and decoder blocks are two stacks: refused, not merged.
        let t5 = [
            "base_model.model.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight",
            "base_model.model.decoder.block.0.layer.0.SelfAttention.q.lora_A.weight",
        ];
        let err = group_keys_by(t5, None, LayerKeys::Robust).unwrap_err();
        assert!(err.contains("several layer stacks"), "{err}");
    }

    #[test]
    fn refusals() {
        let keys = lora_keys(&[0, 1], &["q_proj"]);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert!(group_keys(refs.clone(), Some(3))
            .unwrap_err()
            .contains("do not match"));
        assert!(group_keys(["lm_head.weight"], None)
            .unwrap_err()
            .contains("no key"));
        assert!(group_keys([], None).unwrap_err().contains("no tensor"));
        let mut uneven = refs.clone();
        uneven.push("x.layers.1.mlp.weight");
        assert!(group_keys(uneven, None).unwrap_err().contains("different"));
    }
}
