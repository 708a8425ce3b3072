//! LoRA files of other tools, written byte by byte as their tools lay
//! them out, read against ‖s·B·A‖ computed here from the same numbers.

use std::path::{Path, PathBuf};

use super::super::{read_adapter_factors, read_adapter_weights};
use crate::error::Area;

/// A safetensors file of f32 tensors `(name, shape, values)` and metadata
/// (the LyCORIS tests write theirs with it too).
pub(in crate::analysis::adapter_weights) fn write(
    path: &Path,
    tensors: &[(&str, Vec<u64>, Vec<f32>)],
    metadata: &[(&str, &str)],
) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    if !metadata.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(m));
    }
    let text = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend_from_slice(&data);
    std::fs::write(path, bytes).unwrap();
}

pub(in crate::analysis::adapter_weights) fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
}

/// ‖s·B·A‖_F with B out × r and A r × in, row-major.
fn delta_fro(b: &[f32], a: &[f32], out: usize, r: usize, inp: usize, s: f64) -> f64 {
    let mut sum = 0.0;
    for i in 0..out {
        for j in 0..inp {
            let x: f64 = (0..r)
                .map(|k| f64::from(b[i * r + k]) * f64::from(a[k * inp + j]))
                .sum();
            sum += (s * x).powi(2);
        }
    }
    sum.sqrt()
}

fn close(got: Option<f64>, want: f64) {
    let got = got.expect("a scale, so a delta");
    assert!(
        (got - want).abs() <= 1e-9 * want.max(1.0),
        "{got} vs {want}"
    );
}

fn dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_path_buf();
    (d, p)
}

#[test]
fn a_kohya_file_is_scaled_by_alpha_over_rank_and_conv_factors_are_flattened() {
    let (_d, p) = dir();
    let file = p.join("my_lora.safetensors");
    let (down, up) = (values(4 * 16, 1.0), values(8 * 4, 2.0));
    let (cdown, cup) = (values(2 * 3 * 3 * 3, 3.0), values(5 * 2, 4.0));
    write(
        &file,
        &[
            (
                "lora_unet_mid_proj.lora_down.weight",
                vec![4, 16],
                down.clone(),
            ),
            ("lora_unet_mid_proj.lora_up.weight", vec![8, 4], up.clone()),
            ("lora_unet_mid_proj.alpha", vec![], vec![2.0]),
            (
                "lora_unet_conv_in.lora_down.weight",
                vec![2, 3, 3, 3],
                cdown.clone(),
            ),
            (
                "lora_unet_conv_in.lora_up.weight",
                vec![5, 2, 1, 1],
                cup.clone(),
            ),
        ],
        &[
            ("ss_network_dim", "4"),
            ("ss_network_alpha", "2"),
            ("ss_steps", "5"),
        ],
    );
    let w = read_adapter_weights(&file).expect("a kohya file reads");
    let c = w.config.as_ref().expect("the file stands in for a config");
    assert_eq!(
        (c.format.as_str(), c.peft_type.as_deref()),
        ("kohya", Some("LORA"))
    );
    assert_eq!((c.r, c.lora_alpha), (4, 2.0));
    let m = |name: &str| w.modules.iter().find(|m| m.name == name).unwrap();
    let linear = m("lora_unet_mid_proj");
    assert_eq!(
        (linear.rank, linear.in_features, linear.out_features),
        (4, 16, 8)
    );
    assert_eq!(linear.scale, Some(0.5));
    close(linear.delta_fro, delta_fro(&up, &down, 8, 4, 16, 0.5));
    let conv = m("lora_unet_conv_in");
    // No alpha tensor: alpha is the rank, scale 1.
    assert_eq!((conv.rank, conv.in_features, conv.out_features), (2, 27, 5));
    assert_eq!(conv.scale, Some(1.0));
    close(conv.delta_fro, delta_fro(&cup, &cdown, 5, 2, 27, 1.0));
    let f = read_adapter_factors(&file).expect("factors for compare");
    assert!(f.has_config);
    assert_eq!(f.modules.len(), 2);
}

#[test]
fn an_mlx_adapter_is_read_transposed_with_its_configs_scale() {
    let (_d, p) = dir();
    let (a, b) = (values(16 * 4, 5.0), values(4 * 8, 6.0));
    write(
        &p.join("adapters.safetensors"),
        &[
            (
                "model.layers.0.self_attn.q_proj.lora_a",
                vec![16, 4],
                a.clone(),
            ),
            (
                "model.layers.0.self_attn.q_proj.lora_b",
                vec![4, 8],
                b.clone(),
            ),
        ],
        &[],
    );
    std::fs::write(
        p.join("adapter_config.json"),
        r#"{"fine_tune_type": "lora", "num_layers": 1, "iters": 10,
            "lora_parameters": {"rank": 4, "scale": 20.0, "dropout": 0.0}}"#,
    )
    .unwrap();
    // A = aᵀ (4 × 16), B = bᵀ (8 × 4).
    let at: Vec<f32> = (0..4)
        .flat_map(|k| (0..16).map(move |j| (k, j)))
        .map(|(k, j)| a[j * 4 + k])
        .collect();
    let bt: Vec<f32> = (0..8)
        .flat_map(|i| (0..4).map(move |k| (i, k)))
        .map(|(i, k)| b[k * 8 + i])
        .collect();
    let w = read_adapter_weights(&p).expect("an MLX adapter dir reads");
    let c = w.config.as_ref().unwrap();
    assert_eq!((c.format.as_str(), c.r), ("mlx", 4));
    let m = &w.modules[0];
    assert_eq!(
        (m.rank, m.in_features, m.out_features, m.layer),
        (4, 16, 8, Some(0))
    );
    close(m.delta_fro, delta_fro(&bt, &at, 8, 4, 16, 20.0));
    let f = read_adapter_factors(&p).unwrap();
    let want_a: Vec<f64> = at.iter().map(|&v| f64::from(v)).collect();
    let want_b: Vec<f64> = bt.iter().map(|&v| f64::from(v)).collect();
    assert_eq!(
        (f.modules[0].a.clone(), f.modules[0].b.clone()),
        (want_a, want_b)
    );
    // A rank the config does not give is refused, naming the config.
    std::fs::write(
        p.join("adapter_config.json"),
        r#"{"lora_parameters": {"rank": 8}}"#,
    )
    .unwrap();
    let e = read_adapter_weights(&p).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(
        e.message.contains("lora_parameters.rank is 8"),
        "{}",
        e.message
    );
}

#[test]
fn a_diffusers_file_takes_each_components_config_from_its_header() {
    let (_d, p) = dir();
    let file = p.join("pytorch_lora_weights.safetensors");
    let (a, b) = (values(4 * 8, 7.0), values(8 * 4, 8.0));
    let tensors = [
        ("unet.down.attn1.to_q.lora_A.weight", vec![4, 8], a.clone()),
        ("unet.down.attn1.to_q.lora_B.weight", vec![8, 4], b.clone()),
    ];
    let meta = r#"{"unet.r": 4, "unet.lora_alpha": 8, "unet.peft_type": "LORA"}"#;
    write(&file, &tensors, &[("lora_adapter_metadata", meta)]);
    let w = read_adapter_weights(&file).expect("reads");
    assert_eq!(w.modules[0].scale, Some(2.0));
    close(w.modules[0].delta_fro, delta_fro(&b, &a, 8, 4, 8, 2.0));
    // Without the metadata, alpha is the rank (how diffusers loads it).
    write(&file, &tensors, &[]);
    let w = read_adapter_weights(&file).expect("reads");
    assert_eq!(w.modules[0].scale, Some(1.0));
    // A PEFT adapter that lost its config is still one (no component prefix).
    let peft = p.join("adapter_model.safetensors");
    write(
        &peft,
        &[
            ("base_model.model.q_proj.lora_A.weight", vec![4, 8], a),
            ("base_model.model.q_proj.lora_B.weight", vec![8, 4], b),
        ],
        &[],
    );
    assert!(read_adapter_weights(&peft).unwrap().config.is_none());
}

#[test]
fn a_loha_file_is_named_by_method_and_its_lora_modules_are_judged_beside_it() {
    let (_d, p) = dir();
    let file = p.join("loha.safetensors");
    write(
        &file,
        &[
            ("lycoris_fc.hada_w1_a", vec![8, 2], values(16, 1.0)),
            ("lycoris_fc.hada_w1_b", vec![2, 4], values(8, 2.0)),
            ("lycoris_fc.hada_w2_a", vec![8, 2], values(16, 3.0)),
            ("lycoris_fc.hada_w2_b", vec![2, 4], values(8, 4.0)),
            ("lycoris_fc.alpha", vec![], vec![2.0]),
            ("lycoris_conv.lora_down.weight", vec![2, 4], values(8, 5.0)),
            ("lycoris_conv.lora_up.weight", vec![3, 2], values(6, 6.0)),
            ("lycoris_conv.alpha", vec![], vec![1.0]),
        ],
        &[],
    );
    let w = read_adapter_weights(&file).expect("reads");
    let c = w.config.as_ref().unwrap();
    assert_eq!(
        (c.peft_type.as_deref(), c.format.as_str()),
        (Some("LOHA"), "lycoris-loha")
    );
    let kinds: Vec<&str> = w.modules.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(kinds, ["linear", "loha"]);
    assert!(w.other_tensors.is_empty());
    let f = read_adapter_factors(&file).expect("compared as formed updates");
    assert_eq!(f.modules.len(), 2);
}

#[test]
fn unpaired_or_misshapen_kohya_factors_are_errors_not_panics() {
    let (_d, p) = dir();
    let file = p.join("bad.safetensors");
    write(
        &file,
        &[("m.lora_down.weight", vec![4, 16], values(64, 1.0))],
        &[],
    );
    let e = read_adapter_weights(&file).unwrap_err();
    assert!(e.message.contains("no up factor"), "{}", e.message);
    write(
        &file,
        &[
            ("m.lora_down.weight", vec![2, 3, 3, 3], values(54, 1.0)),
            ("m.lora_up.weight", vec![5, 2, 3, 3], values(90, 1.0)),
        ],
        &[],
    );
    let e = read_adapter_weights(&file).unwrap_err();
    assert!(e.message.contains("(out, r, 1, 1)"), "{}", e.message);
    write(
        &file,
        &[
            ("m.lora_down.weight", vec![4, 16], values(64, 1.0)),
            ("m.lora_up.weight", vec![8, 3], values(24, 1.0)),
        ],
        &[],
    );
    let e = read_adapter_weights(&file).unwrap_err();
    assert!(e.message.contains("has rank 4"), "{}", e.message);
}
