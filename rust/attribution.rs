//! Attribute optimizer param ids to (layer, slot) exactly, or refuse.
//!
//! An optimizer state knows its parameters only by id, in the order they
//! were registered: the model's `named_parameters()` order of the trainable
//! tensors. Without the model we know the adapter's keys (and shapes) from
//! its safetensors header and each state tensor's shape. Layers of one model
//! repeat the same modules in the same order, so the k-th trainable tensor
//! of every layer is the same kind of tensor (the same *slot*: e.g. `q_proj`'s
//! `lora_A`). We find where the layered block of ids sits among the others
//! (embedding or head copies before or after it) by matching shapes, check
//! that every layer's shapes agree slot by slot, and refuse whenever more
//! than one placement fits or the state and the adapter disagree. A refusal
//! is an answer too: the probe then reports the per-layer check as not done.

use std::collections::BTreeMap;

/// One attributed optimizer parameter.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSlot {
    pub param_id: i64,
    /// The layer index from the key (e.g. 3 in `model.layers.3.self_attn`).
    pub layer: u64,
    /// Position of the tensor within its layer, the same for every layer.
    pub slot: u64,
}

/// Exact attribution of a state's param ids to layers and slots.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    /// Sorted, distinct layer indices.
    pub layer_indices: Vec<u64>,
    /// The attributed params, in id order.
    pub params: Vec<ParamSlot>,
    /// What each slot is: the key suffixes (after the layer index) whose
    /// shape fits it, e.g. `self_attn.q_proj.lora_A`, or several joined by `|`.
    pub slot_names: Vec<String>,
    /// Param ids outside the layers (embedding, head or norm copies).
    pub unattributed: Vec<i64>,
}

/// Markers before a layer index in common model families: Llama/Mistral/
/// Qwen/GPT-NeoX `layers`, GPT-2/Falcon/BLOOM `h`, BERT `layer`, T5 `block`,
/// MPT-style `blocks`.
const LAYER_MARKERS: [&str; 5] = ["layers", "h", "layer", "block", "blocks"];

/// `(stack, index, suffix)` of a key: the text before the layer index
/// (`base_model.model.model.layers`), the index, and the rest without a
/// trailing `.weight` (`self_attn.q_proj.lora_A`). None for a key without
/// a layer index; the index must fit in u64.
pub fn split_layer_key(key: &str) -> Option<(&str, u64, &str)> {
    let parts: Vec<&str> = key.split('.').collect();
    for i in 1..parts.len().saturating_sub(1) {
        let is_marker = LAYER_MARKERS.contains(&parts[i - 1]);
        let is_index = !parts[i].is_empty() && parts[i].bytes().all(|b| b.is_ascii_digit());
        if is_marker && is_index {
            let index = parts[i].parse::<u64>().ok()?;
            let stack_len = parts[..i].iter().map(|p| p.len() + 1).sum::<usize>() - 1;
            let suffix_start = stack_len + 1 + parts[i].len() + 1;
            let suffix = key.get(suffix_start..)?;
            let suffix = suffix.strip_suffix(".weight").unwrap_or(suffix);
            return Some((key.get(..stack_len)?, index, suffix));
        }
    }
    None
}

type Shape = Vec<u64>;

fn sorted_shapes<'a>(shapes: impl Iterator<Item = &'a Shape>) -> Vec<&'a Shape> {
    let mut v: Vec<&Shape> = shapes.collect();
    v.sort();
    v
}

/// Attribute `params` (param id and state shape, in id order) to the layers
/// of an adapter with `keys` (name and shape). Err(reason) when it cannot
/// be done exactly.
pub fn attribute(
    keys: &[(String, Shape)],
    params: &[(i64, Shape)],
) -> std::result::Result<Attribution, String> {
    let mut stacks: BTreeMap<&str, ()> = BTreeMap::new();
    let mut layers: BTreeMap<u64, Vec<(&str, &Shape)>> = BTreeMap::new();
    let mut loose: Vec<&Shape> = Vec::new();
    for (name, shape) in keys {
        match split_layer_key(name) {
            Some((stack, index, suffix)) => {
                stacks.insert(stack, ());
                layers.entry(index).or_default().push((suffix, shape));
            }
            None => loose.push(shape),
        }
    }
    if layers.is_empty() {
        return Err(
            "no adapter key carries a layer index (e.g. `.layers.N.`, `.h.N.`), \
                    so no tensor can be attributed to a layer"
                .into(),
        );
    }
    if stacks.len() > 1 {
        let names: Vec<&str> = stacks.keys().copied().collect();
        return Err(format!(
            "the adapter spans several layer stacks ({}); their order in the optimizer \
             is not known without the model",
            names.join(", ")
        ));
    }
    let per_layer: Vec<usize> = layers.values().map(Vec::len).collect();
    let slots = per_layer[0];
    if per_layer.iter().any(|&n| n != slots) {
        return Err(format!(
            "layers carry different numbers of tensors ({}); slots cannot be matched across layers",
            describe_counts(&per_layer)
        ));
    }
    let layer_count = layers.len();
    let block = slots * layer_count;
    if params.len() != keys.len() {
        return Err(format!(
            "the optimizer state has {} parameters but the adapter {} tensors: they do not \
             belong together (or the optimizer also trains tensors the adapter does not save)",
            params.len(),
            keys.len()
        ));
    }
    let layer_shapes: Vec<Vec<&Shape>> = layers
        .values()
        .map(|ts| sorted_shapes(ts.iter().map(|(_, s)| *s)))
        .collect();
    let loose_shapes = sorted_shapes(loose.iter().copied());
    let fits = |offset: usize| -> bool {
        let shape = |i: usize| &params[i].1;
        for (l, want) in layer_shapes.iter().enumerate() {
            let start = offset + l * slots;
            let got = sorted_shapes((start..start + slots).map(shape));
            if &got != want {
                return false;
            }
            if (0..slots).any(|j| shape(start + j) != shape(offset + j)) {
                return false;
            }
        }
        let outside = (0..offset).chain(offset + block..params.len()).map(shape);
        sorted_shapes(outside) == loose_shapes
    };
    let placements: Vec<usize> = (0..=params.len() - block).filter(|&o| fits(o)).collect();
    let offset = match placements.as_slice() {
        [one] => *one,
        [] => {
            return Err(
                "the optimizer state's tensor shapes do not line up with the adapter's \
                        layers, so ids cannot be attributed exactly"
                    .into(),
            )
        }
        many => {
            return Err(format!(
                "the layered tensors could sit at {} places among the optimizer ids \
                 (embedding or head copies of the same shapes); attribution would be a guess",
                many.len()
            ))
        }
    };
    let layer_indices: Vec<u64> = layers.keys().copied().collect();
    let first_layer = layers
        .values()
        .next()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let slot_names = (0..slots)
        .map(|j| {
            let want = &params[offset + j].1;
            let mut fitting: Vec<&str> = first_layer
                .iter()
                .filter(|(_, s)| *s == want)
                .map(|(name, _)| *name)
                .collect();
            fitting.sort_unstable();
            fitting.dedup();
            fitting.join(" | ")
        })
        .collect();
    let attributed = (0..block)
        .map(|i| ParamSlot {
            param_id: params[offset + i].0,
            layer: layer_indices[i / slots],
            slot: (i % slots) as u64,
        })
        .collect();
    let unattributed = (0..offset)
        .chain(offset + block..params.len())
        .map(|i| params[i].0)
        .collect();
    Ok(Attribution {
        layer_indices,
        params: attributed,
        slot_names,
        unattributed,
    })
}

fn describe_counts(counts: &[usize]) -> String {
    let mut c = counts.to_vec();
    c.sort_unstable();
    c.dedup();
    c.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    type Keys = Vec<(String, Shape)>;
    type Params = Vec<(i64, Shape)>;

    /// Keys and shapes of a LoRA adapter on q and v of `layers` layers, in
    /// a header's (name-sorted) order, and the optimizer's params in PEFT's
    /// registration order (layer-major, q before v, A before B).
    fn lora(layers: u64, hidden: u64, kv: u64, r: u64) -> (Keys, Params) {
        let mut keys = vec![];
        let mut params = vec![];
        for l in 0..layers {
            for (m, out) in [("q_proj", hidden), ("v_proj", kv)] {
                for (f, shape) in [("lora_A", vec![r, hidden]), ("lora_B", vec![out, r])] {
                    keys.push((
                        format!("base_model.model.model.layers.{l}.self_attn.{m}.{f}.weight"),
                        shape.clone(),
                    ));
                    params.push((params.len() as i64, shape));
                }
            }
        }
        keys.sort();
        (keys, params)
    }

    #[test]
    fn splits_keys_of_common_families() {
        let k = "base_model.model.model.layers.12.self_attn.q_proj.lora_A.weight";
        assert_eq!(
            split_layer_key(k),
            Some((
                "base_model.model.model.layers",
                12,
                "self_attn.q_proj.lora_A"
            ))
        );
        let g = split_layer_key("base_model.model.transformer.h.3.attn.c_attn.lora_B.weight");
        assert_eq!(g.map(|t| t.1), Some(3));
        assert_eq!(
            split_layer_key("bert.encoder.layer.0.attention.q.weight").map(|t| t.1),
            Some(0)
        );
        assert_eq!(
            split_layer_key("encoder.block.5.layer.0.SelfAttention.q").map(|t| (t.0, t.1)),
            Some(("encoder.block", 5))
        );
        assert_eq!(split_layer_key("base_model.model.lm_head.weight"), None);
        assert_eq!(split_layer_key("model.layers.x.q"), None);
        assert_eq!(
            split_layer_key("model.layers.99999999999999999999999.q"),
            None
        );
    }

    #[test]
    fn attributes_layer_major_slots() {
        let (keys, params) = lora(3, 16, 8, 4);
        let a = attribute(&keys, &params).unwrap();
        assert_eq!(a.layer_indices, vec![0, 1, 2]);
        assert_eq!(a.params.len(), 12);
        assert_eq!(
            a.params[5],
            ParamSlot {
                param_id: 5,
                layer: 1,
                slot: 1
            }
        );
        // q.A and v.A share a shape; q.B (16x4) and v.B (8x4) do not.
        assert_eq!(
            a.slot_names[0],
            "self_attn.q_proj.lora_A | self_attn.v_proj.lora_A"
        );
        assert_eq!(a.slot_names[1], "self_attn.q_proj.lora_B");
        assert_eq!(a.slot_names[3], "self_attn.v_proj.lora_B");
        assert!(a.unattributed.is_empty());
    }

    #[test]
    fn finds_the_block_between_embedding_and_head_copies() {
        let (mut keys, layered) = lora(2, 16, 8, 4);
        keys.push((
            "base_model.model.model.embed_tokens.weight".into(),
            vec![50, 16],
        ));
        keys.push(("base_model.model.lm_head.weight".into(), vec![50, 17]));
        let mut params = vec![(0, vec![50, 16])];
        params.extend(layered.into_iter().map(|(i, s)| (i + 1, s)));
        params.push((9, vec![50, 17]));
        let a = attribute(&keys, &params).unwrap();
        assert_eq!(a.unattributed, vec![0, 9]);
        assert_eq!(a.params[0].param_id, 1);
    }

    #[test]
    fn refuses_what_it_cannot_do_exactly() {
        let (keys, params) = lora(2, 16, 8, 4);
        assert!(attribute(&keys, &params[..7])
            .unwrap_err()
            .contains("do not belong"));
        let mut shuffled = params.clone();
        shuffled.swap(0, 1);
        assert!(attribute(&keys, &shuffled).unwrap_err().contains("line up"));
        let mut uneven = keys.clone();
        uneven.pop();
        assert!(attribute(&uneven, &params[..7])
            .unwrap_err()
            .contains("different numbers"));
        let loose = vec![("lm_head.weight".to_string(), vec![3, 3])];
        assert!(attribute(&loose, &[(0, vec![3, 3])])
            .unwrap_err()
            .contains("no adapter key"));
        // A head copy shaped like a layer tensor: two placements fit.
        let (mut keys, layered) = lora(1, 4, 4, 4);
        keys.push(("base_model.model.lm_head.weight".into(), vec![4, 4]));
        let mut params: Vec<(i64, Shape)> = layered;
        params.push((4, vec![4, 4]));
        assert!(attribute(&keys, &params).unwrap_err().contains("places"));
        let two_stacks = vec![
            ("encoder.block.0.q.weight".to_string(), vec![2, 2]),
            ("decoder.block.0.q.weight".to_string(), vec![2, 2]),
        ];
        let p = vec![(0, vec![2, 2]), (1, vec![2, 2])];
        assert!(attribute(&two_stacks, &p).unwrap_err().contains("stacks"));
    }
}
