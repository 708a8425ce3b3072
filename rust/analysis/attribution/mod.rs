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
//!
//! A full fine-tune's optimizer holds every tensor of the model, and its
//! final norm is shaped like each layer's norms, so shapes alone leave two
//! placements; [`attribute_model`] then takes the one HF models' module
//! registration order gives (input embeddings, the layers, the rest), and
//! only when the shapes before the stack are the embeddings'.

use std::collections::{BTreeMap, BTreeSet};

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

fn is_layer_index(part: &str) -> bool {
    !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit())
}

/// The layer index in a key or module name: the first `<marker>.<digits>`
/// pair (so T5's `encoder.block.4.layer.1` is layer 4); an index too large
/// for u64 is passed over.
pub fn layer_number(key: &str) -> Option<u64> {
    let parts: Vec<&str> = key.split('.').collect();
    parts.windows(2).find_map(|pair| match pair {
        [marker, index] if LAYER_MARKERS.contains(marker) && is_layer_index(index) => {
            index.parse().ok()
        }
        _ => None,
    })
}

/// `(stack, index, suffix)` of a key: the text before the layer index
/// (`base_model.model.model.layers`), the index, and the rest without a
/// trailing `.weight` (`self_attn.q_proj.lora_A`). None for a key without
/// a layer index; the index must fit in u64.
pub fn split_layer_key(key: &str) -> Option<(&str, u64, &str)> {
    let parts: Vec<&str> = key.split('.').collect();
    for i in 1..parts.len().saturating_sub(1) {
        let is_marker = LAYER_MARKERS.contains(&parts[i - 1]);
        let is_index = is_layer_index(parts[i]);
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
/// An adapter key: tensor name and shape.
type Key = (String, Shape);

fn sorted_shapes<'a>(shapes: impl Iterator<Item = &'a Shape>) -> Vec<&'a Shape> {
    let mut v: Vec<&Shape> = shapes.collect();
    v.sort();
    v
}

/// HF Trainer's rule (`Trainer.get_decay_parameter_names`) for the
/// parameters it puts in its no-weight-decay group, by name: the
/// lower-cased name contains `bias`, `layernorm` or `rmsnorm`, or has a
/// component `norm` or ending in `_norm` (its regexes
/// `(?:^|\.)norm(?:$|\.)` and `_norm(?:$|\.)`). HF also exempts every
/// parameter inside an `nn.LayerNorm`, which a name cannot show (GPT-2's
/// `ln_1`, `ln_2`, `ln_f`): see [`layer_norm_modules`].
pub fn is_no_decay_name(name: &str) -> bool {
    let lower = name.to_lowercase();
    lower.contains("bias")
        || lower.contains("layernorm")
        || lower.contains("rmsnorm")
        || lower
            .split('.')
            .any(|part| part == "norm" || part.ends_with("_norm"))
}

/// The modules that look like an `nn.LayerNorm` from their tensors alone:
/// a 1-D `weight` and, if `with_bias_only`, a 1-D `bias` of the same
/// length; otherwise a bias is optional. Nothing else may sit in the
/// module. Linear, Conv1D and embedding weights are 2-D, so among a
/// model's tensors only norms have this shape.
pub fn layer_norm_modules<'a>(
    keys: impl Iterator<Item = &'a Key>,
    with_bias_only: bool,
) -> BTreeSet<&'a str> {
    let mut modules: BTreeMap<&str, (Option<&Shape>, Option<&Shape>, bool)> = BTreeMap::new();
    for (name, shape) in keys {
        let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name.as_str()));
        let entry = modules.entry(module).or_insert((None, None, false));
        match leaf {
            "weight" => entry.0 = Some(shape),
            "bias" => entry.1 = Some(shape),
            _ => entry.2 = true,
        }
    }
    modules
        .into_iter()
        .filter(|(_, (weight, bias, other))| match (weight, bias) {
            (Some(w), None) => w.len() == 1 && !other && !with_bias_only,
            (Some(w), Some(b)) => w.len() == 1 && w == b && !other,
            _ => false,
        })
        .map(|(module, _)| module)
        .collect()
}

/// Which tensors a Trainer put in its no-decay group. HF exempts biases
/// and norms by name and every `nn.LayerNorm` by module type; the type is
/// not in a checkpoint, so a full model's split is one of these, each
/// putting more tensors on the no-decay side than the one before. The
/// optimizer's group sizes therefore fit at most one of them (or several
/// that are the same split), and [`align`] then checks every shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoDecayRule {
    /// [`is_no_decay_name`] alone (Llama, Qwen, Mistral, BERT: their norms
    /// are named so).
    Names,
    /// Names, and modules with a 1-D weight and bias of one length
    /// (GPT-2's `ln_1`, `ln_2`, `ln_f`; GPT-Neo, GPT-J, BLOOM, Falcon).
    NamesAndLayerNorms,
    /// Names, and every module whose weight is 1-D (a LayerNorm without
    /// bias, such as MPT's `norm_1`).
    NamesAndAllNorms,
}

impl NoDecayRule {
    /// The keys split as (no decay, decay).
    fn split(self, keys: &[Key]) -> (Vec<&Key>, Vec<&Key>) {
        let norms = match self {
            NoDecayRule::Names => BTreeSet::new(),
            NoDecayRule::NamesAndLayerNorms => layer_norm_modules(keys.iter(), true),
            NoDecayRule::NamesAndAllNorms => layer_norm_modules(keys.iter(), false),
        };
        keys.iter().partition(|(name, _)| {
            is_no_decay_name(name)
                || name
                    .rsplit_once('.')
                    .is_some_and(|(module, _)| norms.contains(module))
        })
    }
}

/// Whether a key outside the layers is an input embedding, which every HF
/// model registers before its layer stack (`embed_tokens`, `embed_in`,
/// `wte`, `wpe`, `embeddings.*`, `embed_positions`); the other loose
/// tensors (final norm, `lm_head`, GPT-NeoX's `embed_out`) come after it.
pub fn is_input_embedding_name(name: &str) -> bool {
    name.split('.').any(|part| {
        let part = part.to_lowercase();
        part == "wte" || part == "wpe" || (part.contains("embed") && part != "embed_out")
    })
}

/// How `align` treats several placements of the layered block that fit
/// the shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ties {
    /// Refuse: attribution would be a guess (adapters).
    Refuse,
    /// Take the one that puts the input embeddings before the layers and
    /// every other loose tensor after them, the order in which HF models
    /// register their modules; refuse when that one does not fit (a full
    /// model, whose final norm is shaped like every layer's norms).
    ModelOrder,
}

/// Adapter keys sorted into layers.
struct KeyLayout<'k> {
    /// The text before the layer index of every layered key.
    stacks: BTreeMap<&'k str, ()>,
    /// Per layer index, the key suffixes and shapes.
    layers: BTreeMap<u64, Vec<(&'k str, &'k Shape)>>,
    /// Shapes of the keys without a layer index.
    loose: Vec<&'k Shape>,
    /// Shapes of the loose keys that are input embeddings.
    loose_before: Vec<&'k Shape>,
    keys: usize,
}

impl<'k> KeyLayout<'k> {
    fn of(keys: impl Iterator<Item = &'k Key>) -> KeyLayout<'k> {
        let mut layout = KeyLayout {
            stacks: BTreeMap::new(),
            layers: BTreeMap::new(),
            loose: Vec::new(),
            loose_before: Vec::new(),
            keys: 0,
        };
        for (name, shape) in keys {
            layout.keys += 1;
            match split_layer_key(name) {
                Some((stack, index, suffix)) => {
                    layout.stacks.insert(stack, ());
                    layout
                        .layers
                        .entry(index)
                        .or_default()
                        .push((suffix, shape));
                }
                None => {
                    layout.loose.push(shape);
                    if is_input_embedding_name(name) {
                        layout.loose_before.push(shape);
                    }
                }
            }
        }
        layout
    }

    /// The refusals that hold for a whole adapter: no layered key, or
    /// layers from several stacks.
    fn check_whole(&self) -> std::result::Result<(), String> {
        if self.layers.is_empty() {
            return Err(
                "no adapter key carries a layer index (e.g. `.layers.N.`, `.h.N.`), \
                 so no tensor can be attributed to a layer"
                    .into(),
            );
        }
        if self.stacks.len() > 1 {
            let names: Vec<&str> = self.stacks.keys().copied().collect();
            return Err(format!(
                "the adapter spans several layer stacks ({}); their order in the optimizer \
                 is not known without the model",
                names.join(", ")
            ));
        }
        Ok(())
    }
}

/// Attribute `params` (param id and state shape, in id order) to the layers
/// of an adapter with `keys` (name and shape). Err(reason) when it cannot
/// be done exactly. This is the one-param-group case of
/// [`attribute_grouped`].
pub fn attribute(
    keys: &[(String, Shape)],
    params: &[(i64, Shape)],
) -> std::result::Result<Attribution, String> {
    attribute_with(keys, params, Ties::Refuse)
}

fn attribute_with(
    keys: &[(String, Shape)],
    params: &[(i64, Shape)],
    ties: Ties,
) -> std::result::Result<Attribution, String> {
    let layout = KeyLayout::of(keys.iter());
    layout.check_whole()?;
    align(&layout, params, ties)
}

/// Attribute `params` (param id and state shape) to the layers of an
/// adapter with `keys`, given the optimizer's param `groups` (the ids of
/// each group, in group order).
///
/// With at most one non-empty group, ids follow `named_parameters()` order
/// and this is [`attribute`]. With two, they are taken as HF Trainer's
/// weight-decay and no-decay groups: the adapter's keys are split by
/// [`is_no_decay_name`], the split must match the groups' sizes, and each
/// group is aligned against its own keys (its own layered block, its own
/// embedding/head copies); the no-decay group's slots follow the decay
/// group's. Anything else is refused with the reason.
pub fn attribute_grouped(
    keys: &[(String, Shape)],
    params: &[(i64, Shape)],
    groups: &[Vec<i64>],
) -> std::result::Result<Attribution, String> {
    attribute_grouped_with(keys, params, groups, Ties::Refuse, &[NoDecayRule::Names])
}

/// [`attribute_grouped`] for a whole model's tensors (a full fine-tune):
/// `keys` are every trainable tensor of the model (a tied weight once).
/// Where the shapes leave several placements of the layer stack (the final
/// norm is shaped like each layer's norms), the model's registration order
/// decides: input embeddings before the stack, everything else after it.
///
/// The Trainer's no-decay group also holds every `nn.LayerNorm` by module
/// type, which no name shows: those are inferred from the shapes (see
/// [`NoDecayRule`]).
pub fn attribute_model(
    keys: &[(String, Shape)],
    params: &[(i64, Shape)],
    groups: &[Vec<i64>],
) -> std::result::Result<Attribution, String> {
    let rules = [
        NoDecayRule::Names,
        NoDecayRule::NamesAndLayerNorms,
        NoDecayRule::NamesAndAllNorms,
    ];
    attribute_grouped_with(keys, params, groups, Ties::ModelOrder, &rules)
}

fn attribute_grouped_with(
    keys: &[(String, Shape)],
    params: &[(i64, Shape)],
    groups: &[Vec<i64>],
    ties: Ties,
    rules: &[NoDecayRule],
) -> std::result::Result<Attribution, String> {
    let non_empty: Vec<&Vec<i64>> = groups.iter().filter(|g| !g.is_empty()).collect();
    let (decay_ids, no_decay_ids) = match non_empty.as_slice() {
        [] | [_] => return attribute_with(keys, params, ties),
        [decay, no_decay] => (*decay, *no_decay),
        many => {
            return Err(format!(
                "the optimizer has {} non-empty param groups; ids can be matched to tensor \
                 names only for one group or for HF Trainer's weight-decay/no-decay pair",
                many.len()
            ))
        }
    };
    let whole = KeyLayout::of(keys.iter());
    whole.check_whole()?;
    let fits = |(no_decay, decay): &(Vec<&Key>, Vec<&Key>)| {
        decay.len() == decay_ids.len() && no_decay.len() == no_decay_ids.len()
    };
    let Some((no_decay_keys, decay_keys)) = rules.iter().map(|rule| rule.split(keys)).find(fits)
    else {
        let (no_decay, decay) = NoDecayRule::Names.split(keys);
        let whose = match ties {
            Ties::Refuse => "the adapter's keys",
            Ties::ModelOrder => "the model's tensors",
        };
        return Err(format!(
            "the optimizer's two param groups hold {} and {} ids, but HF Trainer's rule (no \
             decay for biases and norms) splits {whose} {} with decay and {} without: the \
             groups were made another way, so ids cannot be placed",
            decay_ids.len(),
            no_decay_ids.len(),
            decay.len(),
            no_decay.len()
        ));
    };
    let shapes: BTreeMap<i64, &Shape> = params.iter().map(|(id, s)| (*id, s)).collect();
    if shapes.len() != params.len() {
        return Err("the optimizer state lists a param id twice".into());
    }
    let listed = decay_ids.len() + no_decay_ids.len();
    let distinct: std::collections::BTreeSet<&i64> = decay_ids.iter().chain(no_decay_ids).collect();
    if distinct.len() != listed {
        return Err("the optimizer's param groups list a param id twice".into());
    }
    if listed != params.len() {
        return Err(format!(
            "the optimizer state has {} parameters with state but its groups list {listed} \
             ids: some parameters never received a gradient, or the groups do not belong to \
             the state",
            params.len()
        ));
    }
    let group_params =
        |ids: &[i64], which: &str| -> std::result::Result<Vec<(i64, Shape)>, String> {
            ids.iter()
                .map(|id| match shapes.get(id) {
                    Some(shape) => Ok((*id, (*shape).clone())),
                    None => Err(format!(
                        "param {id} of the {which} group has no optimizer state, so the group's \
                     ids cannot be aligned with its keys"
                    )),
                })
                .collect()
        };
    let decay = align(
        &KeyLayout::of(decay_keys.into_iter()),
        &group_params(decay_ids, "weight-decay")?,
        ties,
    )
    .map_err(|why| format!("weight-decay group: {why}"))?;
    let no_decay = align(
        &KeyLayout::of(no_decay_keys.into_iter()),
        &group_params(no_decay_ids, "no-decay")?,
        ties,
    )
    .map_err(|why| format!("no-decay group: {why}"))?;
    merge(decay, no_decay)
}

/// One attribution after the other in slot order: the second's slots
/// follow the first's. Both must cover the same layers (or one none).
fn merge(first: Attribution, second: Attribution) -> std::result::Result<Attribution, String> {
    if first.slot_names.is_empty() {
        return Ok(merge_loose(second, first.unattributed));
    }
    if second.slot_names.is_empty() {
        return Ok(merge_loose(first, second.unattributed));
    }
    if first.layer_indices != second.layer_indices {
        return Err(format!(
            "the weight-decay group covers layers {:?} but the no-decay group layers {:?}; \
             slots cannot be matched across layers",
            first.layer_indices, second.layer_indices
        ));
    }
    let offset = first.slot_names.len() as u64;
    let mut params = first.params;
    params.extend(second.params.into_iter().map(|p| ParamSlot {
        slot: p.slot + offset,
        ..p
    }));
    params.sort_by_key(|p| p.param_id);
    let mut slot_names = first.slot_names;
    slot_names.extend(second.slot_names);
    let mut unattributed = first.unattributed;
    unattributed.extend(second.unattributed);
    unattributed.sort_unstable();
    Ok(Attribution {
        layer_indices: first.layer_indices,
        params,
        slot_names,
        unattributed,
    })
}

fn merge_loose(mut a: Attribution, loose: Vec<i64>) -> Attribution {
    a.unattributed.extend(loose);
    a.unattributed.sort_unstable();
    a
}

/// Align `params` (in registration order) with the keys of `layout`: find
/// the one placement of the layered block among the loose copies. A layout
/// without layered keys leaves every param unattributed after checking
/// that the shapes agree.
fn align(
    layout: &KeyLayout<'_>,
    params: &[(i64, Shape)],
    ties: Ties,
) -> std::result::Result<Attribution, String> {
    let layers = &layout.layers;
    let per_layer: Vec<usize> = layers.values().map(Vec::len).collect();
    let slots = per_layer.first().copied().unwrap_or(0);
    if per_layer.iter().any(|&n| n != slots) {
        return Err(format!(
            "layers carry different numbers of tensors ({}); slots cannot be matched across layers",
            describe_counts(&per_layer)
        ));
    }
    let layer_count = layers.len();
    let block = slots * layer_count;
    if params.len() != layout.keys {
        return Err(format!(
            "the optimizer state has {} parameters but the adapter {} tensors: they do not \
             belong together (or the optimizer also trains tensors the adapter does not save)",
            params.len(),
            layout.keys
        ));
    }
    let layer_shapes: Vec<Vec<&Shape>> = layers
        .values()
        .map(|ts| sorted_shapes(ts.iter().map(|(_, s)| *s)))
        .collect();
    let loose_shapes = sorted_shapes(layout.loose.iter().copied());
    let shape = |i: usize| &params[i].1;
    let fits = |offset: usize| -> bool {
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
    let placements: Vec<usize> = if block == 0 {
        // No layered keys: one placement, the loose shapes must agree.
        (0..1).filter(|&o| fits(o)).collect()
    } else {
        (0..=params.len() - block).filter(|&o| fits(o)).collect()
    };
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
            // Registration order: the input embeddings, the stack, the rest.
            let before = layout.loose_before.len();
            let in_order = ties == Ties::ModelOrder
                && many.contains(&before)
                && sorted_shapes((0..before).map(shape))
                    == sorted_shapes(layout.loose_before.iter().copied());
            if !in_order {
                return Err(format!(
                    "the layered tensors could sit at {} places among the optimizer ids \
                     (embedding or head copies of the same shapes); attribution would be a \
                     guess",
                    many.len()
                ));
            }
            before
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

    /// Ids in HF Trainer's order (the decay group, then the no-decay
    /// group), and the keys as a header sorts them.
    fn trainer_grouped(decay: Keys, no_decay: Keys) -> (Keys, Params, Vec<Vec<i64>>) {
        let ordered: Keys = decay.iter().chain(&no_decay).cloned().collect();
        let params = ordered
            .iter()
            .enumerate()
            .map(|(i, (_, s))| (i as i64, s.clone()))
            .collect();
        let groups = vec![
            (0..decay.len() as i64).collect(),
            (decay.len() as i64..ordered.len() as i64).collect(),
        ];
        let mut keys = ordered;
        keys.sort();
        (keys, params, groups)
    }

    /// A tiny Llama's whole parameter list as HF Trainer groups it (decay:
    /// embedding, each layer's projections, head; no decay: each layer's two
    /// norms, then the final norm), and its keys as a header sorts them.
    fn llama_model(layers: u64, tied: bool) -> (Keys, Params, Vec<Vec<i64>>) {
        let (h, f, v) = (8u64, 16u64, 32u64);
        let mut decay: Vec<(String, Shape)> =
            vec![("model.embed_tokens.weight".into(), vec![v, h])];
        let mut no_decay: Vec<(String, Shape)> = vec![];
        for l in 0..layers {
            for (m, shape) in [
                ("self_attn.q_proj", vec![h, h]),
                ("self_attn.k_proj", vec![h, h]),
                ("mlp.gate_proj", vec![f, h]),
                ("mlp.down_proj", vec![h, f]),
            ] {
                decay.push((format!("model.layers.{l}.{m}.weight"), shape));
            }
            for n in ["input_layernorm", "post_attention_layernorm"] {
                no_decay.push((format!("model.layers.{l}.{n}.weight"), vec![h]));
            }
        }
        no_decay.push(("model.norm.weight".into(), vec![h]));
        if !tied {
            decay.push(("lm_head.weight".into(), vec![v, h]));
        }
        trainer_grouped(decay, no_decay)
    }

    #[test]
    fn a_full_model_in_registration_order() {
        for tied in [false, true] {
            let (keys, params, groups) = llama_model(3, tied);
            let refused = attribute_grouped(&keys, &params, &groups).unwrap_err();
            assert!(refused.contains("2 places"), "{refused}");
            let a = attribute_model(&keys, &params, &groups).unwrap();
            assert_eq!(a.layer_indices, [0, 1, 2]);
            assert_eq!(a.slot_names.len(), 6);
            // Layer 1's first projection is id 1 + 4 (embedding, layer 0).
            let p = a.params.iter().find(|p| p.param_id == 5).unwrap();
            assert_eq!((p.layer, p.slot), (1, 0));
            // The final norm is the last id and no layer's.
            let last = params.len() as i64 - 1;
            assert!(a.unattributed.contains(&last) && a.unattributed.contains(&0));
            let norm = a.params.iter().find(|p| p.param_id == last - 1).unwrap();
            assert_eq!(norm.layer, 2);
        }
        // An embedding's bias registered after the stack, against the
        // names' order: the shapes before the stack disagree, so refused.
        let (mut keys, mut params, mut groups) = llama_model(2, true);
        keys.push(("model.embed_tokens.bias".into(), vec![32]));
        params.push((params.len() as i64, vec![32]));
        groups[1].push(params.len() as i64 - 1);
        let e = attribute_model(&keys, &params, &groups).unwrap_err();
        assert!(e.contains("places"), "{e}");
    }

    /// A tiny GPT-2's parameters as HF Trainer groups them: its LayerNorms
    /// (`ln_1`, `ln_2`, `ln_f`) go to no decay by module type, not name.
    fn gpt2_model(layers: u64) -> (Keys, Params, Vec<Vec<i64>>) {
        let (h, v, p) = (8u64, 32u64, 16u64);
        let named = |l: u64, m: &str| format!("transformer.h.{l}.{m}");
        let mut all: Vec<(String, Shape)> = vec![
            ("transformer.wte.weight".into(), vec![v, h]),
            ("transformer.wpe.weight".into(), vec![p, h]),
        ];
        for l in 0..layers {
            for (m, shape) in [
                ("ln_1.weight", vec![h]),
                ("ln_1.bias", vec![h]),
                ("attn.c_attn.weight", vec![h, 3 * h]),
                ("attn.c_attn.bias", vec![3 * h]),
                ("attn.c_proj.weight", vec![h, h]),
                ("attn.c_proj.bias", vec![h]),
                ("ln_2.weight", vec![h]),
                ("ln_2.bias", vec![h]),
                ("mlp.c_fc.weight", vec![h, 4 * h]),
                ("mlp.c_fc.bias", vec![4 * h]),
                ("mlp.c_proj.weight", vec![4 * h, h]),
                ("mlp.c_proj.bias", vec![h]),
            ] {
                all.push((named(l, m), shape));
            }
        }
        all.push(("transformer.ln_f.weight".into(), vec![h]));
        all.push(("transformer.ln_f.bias".into(), vec![h]));
        let is_norm = |n: &str| n.contains(".ln_");
        let (no_decay, decay): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|(n, _)| is_no_decay_name(n) || is_norm(n));
        trainer_grouped(decay, no_decay)
    }

    #[test]
    fn gpt2_layer_norms_are_no_decay_by_type() {
        let (keys, params, groups) = gpt2_model(3);
        let a = attribute_model(&keys, &params, &groups).unwrap();
        assert_eq!(a.layer_indices, [0, 1, 2]);
        // wte, wpe and ln_f's two tensors are no layer's.
        assert_eq!(a.unattributed.len(), 4);
        let ln_1 = a.slot_names.iter().filter(|s| s.contains("ln_1")).count();
        assert!(ln_1 >= 1, "{:?}", a.slot_names);
        // The name rule alone misplaces ln_1, ln_2 and ln_f.
        let e = attribute_grouped(&keys, &params, &groups).unwrap_err();
        assert!(e.contains("HF Trainer's rule"), "{e}");
    }

    #[test]
    fn layer_norm_modules_by_shape() {
        let key = |n: &str, s: &[u64]| (n.to_string(), s.to_vec());
        let keys = vec![
            key("h.0.ln_1.weight", &[8]),
            key("h.0.ln_1.bias", &[8]),
            key("h.0.rms.weight", &[8]),
            key("h.0.fc.weight", &[8, 8]),
            key("h.0.fc.bias", &[8]),
            key("h.0.odd.weight", &[8]),
            key("h.0.odd.bias", &[4]),
            key("h.0.extra.weight", &[8]),
            key("h.0.extra.bias", &[8]),
            key("h.0.extra.scale", &[8]),
            key("h.0.only.bias", &[8]),
        ];
        let paired: Vec<&str> = layer_norm_modules(keys.iter(), true).into_iter().collect();
        assert_eq!(paired, ["h.0.ln_1"]);
        let all: Vec<&str> = layer_norm_modules(keys.iter(), false).into_iter().collect();
        assert_eq!(all, ["h.0.ln_1", "h.0.rms"]);
    }

    #[test]
    fn the_group_sizes_pick_the_split() {
        // A weight-only 1-D module named `scale`: an RMSNorm the Trainer
        // decays, or an nn.LayerNorm without bias that it does not.
        let (mut keys, mut params, mut groups) = llama_model(2, true);
        let n = params.len() as i64;
        keys.push(("model.scale.weight".into(), vec![8]));
        params.push((n, vec![8]));
        for group in [0, 1] {
            let mut groups = groups.clone();
            groups[group].push(n);
            let a = attribute_model(&keys, &params, &groups).unwrap();
            assert!(a.unattributed.contains(&n), "group {group}");
        }
        // Sizes that fit no split are refused, naming the model's
        // tensors, not an adapter's keys.
        groups[0].push(n);
        let moved = groups[1].remove(0);
        groups[0].push(moved);
        let e = attribute_model(&keys, &params, &groups).unwrap_err();
        assert!(e.contains("the model's tensors"), "{e}");
    }

    #[test]
    fn input_embedding_names() {
        for name in [
            "model.embed_tokens.weight",
            "gpt_neox.embed_in.weight",
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "bert.embeddings.word_embeddings.weight",
        ] {
            assert!(is_input_embedding_name(name), "{name}");
        }
        for name in ["lm_head.weight", "embed_out.weight", "model.norm.weight"] {
            assert!(!is_input_embedding_name(name), "{name}");
        }
    }

    #[test]
    fn hf_no_decay_names() {
        for name in [
            "base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias",
            "base_model.model.model.layers.0.input_layernorm.weight",
            "model.norm.weight",
            "model.layers.1.post_attention_layernorm.weight",
            "transformer.h.0.ln_1.bias",
            "encoder.layer.0.attention.output.LayerNorm.weight",
            "model.layers.0.q_norm.weight",
            "model.final_RMSNorm.weight",
        ] {
            assert!(is_no_decay_name(name), "{name}");
        }
        for name in [
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.lm_head.weight",
            "transformer.ln_f.weight", // an nn.LayerNorm: HF knows by type, not name
            "model.normalizer.weight",
            "model.layers.0.norm_out.weight",
        ] {
            assert!(!is_no_decay_name(name), "{name}");
        }
    }

    /// LoRA on q and v of `layers` layers plus the q/v biases, in HF
    /// Trainer's order: all LoRA factors (layer-major), then the biases.
    fn lora_with_biases(layers: u64) -> (Keys, Params, Vec<Vec<i64>>) {
        let (mut keys, mut params) = lora(layers, 16, 8, 4);
        let decay: Vec<i64> = params.iter().map(|p| p.0).collect();
        let mut no_decay = vec![];
        for l in 0..layers {
            for (m, out) in [("q_proj", 16), ("v_proj", 8)] {
                keys.push((
                    format!("base_model.model.model.layers.{l}.self_attn.{m}.base_layer.bias"),
                    vec![out],
                ));
                no_decay.push(params.len() as i64);
                params.push((params.len() as i64, vec![out]));
            }
        }
        (keys, params, vec![decay, no_decay])
    }

    #[test]
    fn grouped_ids_are_attributed_per_group() {
        let (keys, params, groups) = lora_with_biases(3);
        let a = attribute_grouped(&keys, &params, &groups).unwrap();
        assert_eq!(a.slot_names.len(), 6);
        assert_eq!(a.slot_names[4], "self_attn.q_proj.base_layer.bias");
        assert_eq!(a.slot_names[5], "self_attn.v_proj.base_layer.bias");
        // Id 12 is layer 0's q bias, id 17 layer 2's v bias.
        let slot = |id| a.params.iter().find(|p| p.param_id == id).cloned();
        assert_eq!(slot(12).map(|p| (p.layer, p.slot)), Some((0, 4)));
        assert_eq!(slot(17).map(|p| (p.layer, p.slot)), Some((2, 5)));
        assert_eq!(a.params.len(), 18);
        // Read as one group, the same ids cannot be placed.
        assert!(attribute(&keys, &params).is_err());
        // One non-empty group is today's attribution.
        let (keys, params) = lora(2, 16, 8, 4);
        let one = vec![(0..8).collect(), vec![]];
        assert_eq!(
            attribute_grouped(&keys, &params, &one),
            attribute(&keys, &params)
        );
    }

    #[test]
    fn grouped_attribution_refuses_what_it_cannot_place() {
        let (keys, params, groups) = lora_with_biases(2);
        // Sizes that are not the name-rule split.
        let mut shifted = groups.clone();
        let moved = shifted[1].remove(0);
        shifted[0].push(moved);
        let e = attribute_grouped(&keys, &params, &shifted).unwrap_err();
        assert!(
            e.contains("splits the adapter's keys 8 with decay and 4 without"),
            "{e}"
        );
        // Three groups.
        let three = vec![groups[0].clone(), vec![8, 9], vec![10, 11]];
        assert!(attribute_grouped(&keys, &params, &three)
            .unwrap_err()
            .contains("3 non-empty"));
        // An id listed twice, and a state entry no group lists.
        let mut twice = groups.clone();
        twice[1][0] = 0;
        assert!(attribute_grouped(&keys, &params, &twice)
            .unwrap_err()
            .contains("twice"));
        let missing = &params[..params.len() - 1];
        assert!(attribute_grouped(&keys, missing, &groups)
            .unwrap_err()
            .contains("never received a gradient"));
        // Biases on layers the LoRA factors do not cover.
        let mut keys2 = keys.clone();
        for k in keys2.iter_mut().filter(|(n, _)| n.ends_with(".bias")) {
            k.0 = k.0.replace("layers.1.", "layers.7.");
        }
        assert!(attribute_grouped(&keys2, &params, &groups)
            .unwrap_err()
            .contains("layers"));
    }
}
