//! Attribution of real optimizer states to layers: the HF Trainer + PEFT
//! runs written by `rust/testdata/make_optim_fixtures.py`, read with the
//! store's optimizer-state reader and the safetensors header, attributed by
//! `analysis::attribution`. It sits in `store` because that is where the
//! optimizer state and the adapter's tensor names meet.

#![allow(clippy::unwrap_used, clippy::panic)]

use crate::analysis::attribution::{attribute, attribute_grouped, Attribution};
use crate::formats::safetensors_header::read_header;
use crate::store::optimizer_state::read_optimizer_state;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn run_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("rust/testdata/optim")
        .join(name)
}

struct Run {
    keys: Vec<(String, Vec<u64>)>,
    params: Vec<(i64, Vec<u64>)>,
    groups: Vec<Vec<i64>>,
    expected: Json,
}

fn load(name: &str) -> Run {
    let ckpt = run_dir(name).join("checkpoint-3");
    let header = read_header(&ckpt.join("adapter_model.safetensors")).unwrap();
    let state = read_optimizer_state(&ckpt).unwrap();
    let text = std::fs::read_to_string(run_dir(name).join("expected.json")).unwrap();
    Run {
        keys: header
            .tensors
            .into_iter()
            .map(|t| (t.name, t.shape))
            .collect(),
        params: state
            .per_param
            .iter()
            .map(|p| (p.param_id, p.shape.clone()))
            .collect(),
        groups: state.param_groups,
        expected: serde_json::from_str(&text).unwrap(),
    }
}

/// Every id's layer and slot name against the parameter the
/// Trainer really registered under it.
fn check_exact(name: &str) -> Attribution {
    let run = load(name);
    let a = attribute_grouped(&run.keys, &run.params, &run.groups)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for want in run.expected["params"].as_array().unwrap() {
        let id = want["param_id"].as_i64().unwrap();
        match want["layer"].as_u64() {
            None => assert!(a.unattributed.contains(&id), "{name}: id {id}"),
            Some(layer) => {
                let got = a.params.iter().find(|p| p.param_id == id).unwrap();
                assert_eq!(got.layer, layer, "{name}: id {id} ({})", want["key"]);
                let suffix = want["suffix"].as_str().unwrap();
                let slot = &a.slot_names[got.slot as usize];
                assert!(
                    slot.split(" | ").any(|s| s == suffix),
                    "{name}: id {id} is {suffix}, attributed to slot {slot}"
                );
            }
        }
    }
    a
}

#[test]
fn lora_only_one_group() {
    let a = check_exact("hf_lora");
    assert_eq!(a.layer_indices, [0, 1]);
    assert!(a.unattributed.is_empty());
}

#[test]
fn bias_all_decay_and_no_decay_groups() {
    let run = load("hf_bias_all");
    assert_eq!(run.groups.len(), 2);
    assert!(run.expected["wrong_if_layer_major"].as_u64().unwrap() > 0);
    // Without the groups the ids cannot be placed.
    assert!(attribute(&run.keys, &run.params).is_err());
    let a = check_exact("hf_bias_all");
    assert_eq!(a.params.len(), run.params.len());
}

#[test]
fn modules_to_save_copies_sit_before_and_after_the_layers() {
    let a = check_exact("hf_modules_to_save");
    let run = load("hf_modules_to_save");
    let last = run.params.len() as i64 - 1;
    assert_eq!(a.unattributed, [0, last]);
}

#[test]
fn gpt2_conv1d_blocks() {
    let a = check_exact("hf_gpt2");
    assert_eq!(a.layer_indices, [0, 1]);
    assert!(a
        .slot_names
        .iter()
        .any(|s| s.contains("attn.c_attn.lora_B")));
}

#[test]
fn refusals_on_real_runs() {
    // GPT-2 with bias="all": the no-decay group holds layer biases
    // and ln_f.bias, all 32-wide; ln_f.bias fits before the layered
    // block as well as after it.
    let run = load("hf_gpt2_bias_all");
    let e = attribute_grouped(&run.keys, &run.params, &run.groups).unwrap_err();
    assert!(e.contains("no-decay group") && e.contains("places"), "{e}");
    // An optimizer state from another run.
    let lora = load("hf_lora");
    let other = load("hf_modules_to_save");
    let e = attribute_grouped(&lora.keys, &other.params, &other.groups).unwrap_err();
    assert!(e.contains("do not belong"), "{e}");
    // Groups that are not HF's split of these keys.
    let bias = load("hf_bias_all");
    let mut groups = bias.groups.clone();
    let moved = groups[0].pop().unwrap();
    groups[1].insert(0, moved);
    let e = attribute_grouped(&bias.keys, &bias.params, &groups).unwrap_err();
    assert!(e.contains("HF Trainer's rule"), "{e}");
}
