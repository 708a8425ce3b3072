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
mod tests;
