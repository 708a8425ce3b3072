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
    let mut decay: Vec<(String, Shape)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
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
