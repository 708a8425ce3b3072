//! Unit tests of the LoRA weight reader and its statistics.

use nalgebra::DMatrix;

use super::stats::SpectrumRanks;
use super::*;
use crate::analysis::attribution::layer_number;
use serde_json::Value;
use std::io::Write;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/testdata/weights")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

fn all_fixtures() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join(ADAPTER_WEIGHTS).exists())
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 6);
    dirs
}

fn expected(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap()
}

/// A JSON number, or the generator's "NaN"/"Infinity" strings.
fn num(v: &Value) -> f64 {
    match v {
        Value::String(s) if s == "NaN" => f64::NAN,
        Value::String(s) if s == "Infinity" => f64::INFINITY,
        Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
        _ => v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")),
    }
}

/// |got - want| / max(|want|, floor), NaN-aware (NaN == NaN is 0).
fn rel_err(got: f64, want: f64, floor: f64) -> f64 {
    if got.is_nan() && want.is_nan() || got == want {
        0.0
    } else {
        (got - want).abs() / want.abs().max(floor)
    }
}

/// Compare one reading of a fixture with torch's numbers; returns the
/// largest relative error seen on norms/ΔW and on singular values.
fn compare(dir: &Path, got: &AdapterWeights) -> (f64, f64) {
    let want = expected(dir);
    let mods = want["modules"].as_object().unwrap();
    assert_eq!(got.modules.len(), mods.len(), "{dir:?}");
    let (mut worst_norm, mut worst_sigma) = (0.0f64, 0.0f64);
    for m in &got.modules {
        let w = &mods[&m.name];
        let ctx = format!("{dir:?} {}", m.name);
        assert_eq!(m.kind, w["kind"].as_str().unwrap(), "{ctx}");
        assert_eq!(Some(m.rank), w["r"].as_u64(), "{ctx}");
        assert_eq!(Some(m.in_features), w["in_features"].as_u64(), "{ctx}");
        assert_eq!(Some(m.out_features), w["out_features"].as_u64(), "{ctx}");
        assert!(
            rel_err(m.scale.unwrap(), num(&w["scale"]), 1e-300) <= 1e-15,
            "{ctx}"
        );
        for (norm, max_abs, nonfinite, t) in [
            (m.norm_a, m.max_abs_a, m.nonfinite_a, &w["a"]),
            (m.norm_b, m.max_abs_b, m.nonfinite_b, &w["b"]),
        ] {
            worst_norm = worst_norm.max(rel_err(norm, num(&t["norm"]), 1e-300));
            // serde_json's default float parsing may be 1 ulp off.
            assert!(
                rel_err(max_abs, num(&t["max_abs"]), 1e-300) <= 1e-15,
                "{ctx}"
            );
            assert_eq!(Some(nonfinite), t["nonfinite"].as_u64(), "{ctx}");
        }
        let fro = m.delta_fro.unwrap();
        let want_fro = num(&w["delta_fro"]);
        worst_norm = worst_norm.max(rel_err(fro, want_fro, 1e-300));
        match w["singular_values"].as_array() {
            None => assert!(
                m.singular_values.is_empty() && m.rank_used.is_none(),
                "{ctx}"
            ),
            Some(sv) => {
                assert_eq!(m.singular_values.len(), sv.len(), "{ctx}");
                let top = num(&sv[0]);
                for (g, s) in m.singular_values.iter().zip(sv) {
                    // Relative to σ_max: the Gram route's accuracy.
                    worst_sigma = worst_sigma.max(rel_err(*g, num(s), top.max(1e-300)));
                }
            }
        }
        match (&w["magnitude"], m.magnitude_norm) {
            (Value::Null, None) => {}
            (mag, Some(norm)) => {
                worst_norm = worst_norm.max(rel_err(norm, num(&mag["norm"]), 1e-300));
                assert_eq!(Some(m.magnitude_nonfinite), mag["nonfinite"].as_u64());
            }
            (mag, None) => panic!("{ctx}: expected magnitude {mag}"),
        }
    }
    let others = want["other_tensors"].as_object().unwrap();
    assert_eq!(got.other_tensors.len(), others.len(), "{dir:?}");
    for t in &got.other_tensors {
        let w = &others[&t.name];
        worst_norm = worst_norm.max(rel_err(t.norm, num(&w["norm"]), 1e-300));
        assert!(rel_err(t.max_abs, num(&w["max_abs"]), 1e-300) <= 1e-15);
        assert_eq!(Some(t.nonfinite), w["nonfinite"].as_u64());
        assert_eq!(serde_json::json!(t.shape), w["shape"]);
    }
    assert_eq!(
        Some(got.tensor_bytes),
        want["tensor_bytes"].as_u64(),
        "{dir:?}"
    );
    assert_eq!(
        Some(got.nonfinite_total),
        want["nonfinite_total"].as_u64(),
        "{dir:?}"
    );
    (worst_norm, worst_sigma)
}

#[test]
fn every_fixture_matches_torch_float64() {
    let (mut worst_norm, mut worst_sigma) = (0.0f64, 0.0f64);
    for dir in all_fixtures() {
        for (chunk, parallel) in [
            (DEFAULT_CHUNK_ELEMS, 0),
            (DEFAULT_CHUNK_ELEMS, u64::MAX),
            (1, 0),
            (3, u64::MAX),
            (50, 0),
        ] {
            let got = read_adapter_weights_chunked(&dir, chunk, parallel).unwrap();
            let (n, s) = compare(&dir, &got);
            worst_norm = worst_norm.max(n);
            worst_sigma = worst_sigma.max(s);
        }
    }
    assert!(worst_norm < 1e-13, "{worst_norm}");
    assert!(worst_sigma < 1e-11, "{worst_sigma}");
}

#[test]
fn an_untouched_adapter_has_zero_delta_and_rank() {
    let got = read_adapter_weights(&fixture("llama_untouched")).unwrap();
    assert_eq!(got.modules.len(), 6);
    for m in &got.modules {
        assert!(m.norm_a > 0.0, "{}", m.name);
        assert_eq!(m.norm_b, 0.0);
        assert_eq!(m.delta_fro, Some(0.0));
        assert_eq!(m.singular_values, vec![0.0; 8]);
        assert_eq!(
            (m.stable_rank, m.effective_rank, m.rank_used),
            (0.0, 0.0, Some(0))
        );
    }
    assert!(got
        .layers
        .iter()
        .all(|l| l.delta_fro_sq == 0.0 && l.modules == 3));
}

#[test]
fn a_trained_adapter_uses_its_whole_rank() {
    for name in [
        "llama_trained",
        "gpt2_fan_in_fan_out",
        "llama_patterns_rslora_bf16",
    ] {
        let got = read_adapter_weights(&fixture(name)).unwrap();
        for m in &got.modules {
            assert_eq!(m.rank_used, Some(m.rank), "{name} {}", m.name);
            assert!(m.stable_rank >= 1.0 && m.stable_rank <= m.rank as f64);
            assert!(m.effective_rank > 1.0 && m.effective_rank <= m.rank as f64 + 1e-9);
            let sum_sq: f64 = m.singular_values.iter().map(|s| s * s).sum();
            let fro = m.delta_fro.unwrap();
            assert!((sum_sq - fro * fro).abs() <= 1e-10 * fro * fro);
        }
    }
}

#[test]
fn a_nan_in_lora_b_is_counted_and_voids_the_spectrum() {
    let got = read_adapter_weights(&fixture("llama_nan")).unwrap();
    assert_eq!(got.nonfinite_total, 1);
    let bad: Vec<_> = got.modules.iter().filter(|m| m.nonfinite_b > 0).collect();
    assert_eq!(bad.len(), 1);
    let m = bad[0];
    assert_eq!(m.name, "model.layers.1.self_attn.v_proj");
    assert!(m.norm_b.is_nan() && m.delta_fro.unwrap().is_nan());
    assert!(m.singular_values.is_empty() && m.rank_used.is_none());
    assert!(m.stable_rank.is_nan() && m.effective_rank.is_nan());
    assert!(m.max_abs_b.is_finite());
    let layer1 = got.layers.iter().find(|l| l.layer == 1).unwrap();
    assert!(layer1.delta_fro_sq.is_nan());
    assert!(
        got.layers
            .iter()
            .find(|l| l.layer == 0)
            .unwrap()
            .delta_fro_sq
            > 0.0
    );
}

#[test]
fn modules_carry_layers_kinds_and_dtypes_in_order() {
    let got = read_adapter_weights(&fixture("llama_trained")).unwrap();
    let order: Vec<(Option<u64>, &str)> = got
        .modules
        .iter()
        .map(|m| (m.layer, m.name.as_str()))
        .collect();
    assert_eq!(order[0], (None, "model.embed_tokens"));
    assert_eq!(got.modules[0].kind, "embedding");
    assert!(order.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(order.iter().filter(|(l, _)| *l == Some(1)).count(), 4);
    assert_eq!(got.layers.len(), 2);
    let config = got.config.as_ref().unwrap();
    assert_eq!((config.r, config.lora_alpha), (4, 8.0));
    assert_eq!(
        got.other_tensors[0].name,
        "base_model.model.model.embed_tokens.base_layer.weight"
    );

    let gpt2 = read_adapter_weights(&fixture("gpt2_fan_in_fan_out")).unwrap();
    assert!(gpt2.config.as_ref().unwrap().fan_in_fan_out);
    let layers: Vec<_> = gpt2.modules.iter().map(|m| m.layer).collect();
    assert_eq!(layers, [Some(0), Some(0), Some(1), Some(1)]);
    assert_eq!(gpt2.modules[0].in_features, 32);
    assert_eq!(gpt2.modules[0].out_features, 96);

    let bf16 = read_adapter_weights(&fixture("llama_patterns_rslora_bf16")).unwrap();
    assert!(bf16
        .modules
        .iter()
        .all(|m| m.dtype_a == "BF16" && m.dtype_b == "BF16"));
    let c = bf16.config.unwrap();
    assert!(c.use_rslora);
    assert_eq!(
        c.rank_pattern[0],
        ("model.layers.1.self_attn.q_proj".to_string(), 2)
    );

    let dora = read_adapter_weights(&fixture("llama_dora_f16")).unwrap();
    assert!(dora.config.as_ref().unwrap().use_dora);
    assert!(dora.modules.iter().all(|m| m.magnitude_norm.unwrap() > 0.0));
    assert_eq!(
        dora.other_tensors[0].name,
        "base_model.model.lm_head.weight"
    );
}

#[test]
fn layer_indices_follow_the_common_families() {
    let cases = [
        ("model.layers.12.self_attn.q_proj", Some(12)),
        (
            "base_model.model.model.layers.3.mlp.up_proj.lora_A.weight",
            Some(3),
        ),
        ("transformer.h.7.attn.c_attn", Some(7)),
        ("gpt_neox.layers.2.attention.query_key_value", Some(2)),
        ("bert.encoder.layer.5.attention.self.query", Some(5)),
        ("encoder.block.4.layer.1.DenseReluDense.wi", Some(4)),
        ("layers.0.attn", Some(0)),
        ("model.layers.x.q_proj", None),
        ("model.layers.3x.q_proj", None),
        ("model.mylayers.3.q_proj", None),
        ("model.layers..3.q", None),
        ("model.layers.99999999999999999999999.q", None),
        ("model.layers.99999999999999999999999.h.2.q", Some(2)),
        ("model.embed_tokens", None),
        ("lm_head", None),
        ("model.layers.3", Some(3)),
    ];
    for (key, want) in cases {
        assert_eq!(layer_number(key), want, "{key}");
    }
}

#[test]
fn spectrum_measures_of_known_matrices() {
    // B·A with A = [I 0] and B = diag(3, 4, 0) pads: σ = 4, 3, 0.
    let g = DMatrix::<f64>::identity(3, 3);
    let h = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(vec![9.0, 16.0, 0.0]));
    let l = product_spectrum(&g, &h).unwrap();
    assert!((l[0] - 16.0).abs() < 1e-12 && (l[1] - 9.0).abs() < 1e-12 && l[2].abs() < 1e-12);
    let r = SpectrumRanks::of(&l, 1e-6);
    assert_eq!(r.used, 2);
    assert!((r.stable - 25.0 / 16.0).abs() < 1e-12);
    let (p, q) = (4.0 / 7.0, 3.0 / 7.0);
    let erank = (-(p * f64::ln(p)) - q * f64::ln(q)).exp();
    assert!((r.effective - erank).abs() < 1e-12);
    // Equal singular values: every measure equals the rank.
    let r = SpectrumRanks::of(&[2.0; 5], 1e-6);
    assert_eq!(r.used, 5);
    assert!((r.stable - 5.0).abs() < 1e-12 && (r.effective - 5.0).abs() < 1e-12);
    // A σ under the cut is not counted.
    assert_eq!(SpectrumRanks::of(&[1.0, 1e-14], 1e-6).used, 1);
    assert_eq!(SpectrumRanks::of(&[1.0, 1e-10], 1e-6).used, 2);
}

/// A pseudo-random orthogonal n x n matrix (Q of a QR).
fn orthogonal(n: usize, seed: u64) -> DMatrix<f64> {
    let mut x = seed;
    let m = DMatrix::from_fn(n, n, |_, _| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    });
    m.qr().q()
}

#[test]
fn spectrum_keeps_small_singular_values_to_1e8_of_the_largest() {
    // B·A = U·diag(σ)·Vᵀ with σ over seven decades, hidden behind
    // rotations: G = A·Aᵀ and H = Bᵀ·B are dense.
    let r = 12;
    let sigma: Vec<f64> = (0..r)
        .map(|i| 10f64.powf(-(i as f64) * 7.0 / 11.0))
        .collect();
    let (u, w) = (orthogonal(r, 1), orthogonal(r, 2));
    let a = &w * DMatrix::from_diagonal(&nalgebra::DVector::from_vec(sigma.clone())); // r x r
    let b = u.clone(); // B·A = U·W·Σ
    let g = &a * a.transpose();
    let h = b.transpose() * &b;
    let l = product_spectrum(&g, &h).unwrap();
    for (got, want) in l.iter().map(|x| x.sqrt()).zip(&sigma) {
        assert!((got - want).abs() <= 2e-8 * sigma[0], "{got} vs {want}");
    }
    // The decades above 1e-6 count as used rank, those under do not.
    assert_eq!(SpectrumRanks::of(&l, 1e-6).used, 10);
}

// ---- paths and configs ----

/// A copy of a fixture in a tempdir, to mutate.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in [ADAPTER_WEIGHTS, CONFIG_FILE] {
        std::fs::copy(fixture(name).join(file), dir.path().join(file)).unwrap();
    }
    dir
}

#[test]
fn a_file_path_finds_its_config_and_a_missing_config_drops_only_the_scale() {
    let file = fixture("llama_trained").join(ADAPTER_WEIGHTS);
    let by_file = read_adapter_weights(&file).unwrap();
    let by_dir = read_adapter_weights(&fixture("llama_trained")).unwrap();
    assert_eq!(by_file, by_dir);
    assert_eq!(by_file.path, file);

    let dir = copy_fixture("llama_trained");
    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    let bare = read_adapter_weights(dir.path()).unwrap();
    assert!(bare.config.is_none() && bare.layers.is_empty());
    for (m, full) in bare.modules.iter().zip(&by_dir.modules) {
        assert_eq!(m.name, full.name);
        assert!(m.scale.is_none() && m.delta_fro.is_none() && m.singular_values.is_empty());
        assert_eq!(
            (m.norm_a, m.norm_b, m.rank_used),
            (full.norm_a, full.norm_b, full.rank_used)
        );
        assert!((m.stable_rank - full.stable_rank).abs() < 1e-12);
    }
}

#[test]
fn missing_weights_are_a_missing_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert_eq!(e.area, Area::Missing);
    assert!(e.message.contains(ADAPTER_WEIGHTS), "{e}");
    // A directory with only adapter_model.bin reads that file.
    std::fs::write(dir.path().join("adapter_model.bin"), b"x").unwrap();
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(e.path.ends_with("adapter_model.bin"), "{e}");
    let e = read_adapter_weights(&dir.path().join("nope.safetensors")).unwrap_err();
    assert_eq!(e.area, Area::Missing);
}

#[test]
fn a_config_that_is_not_json_or_disagrees_with_the_weights_is_refused() {
    let dir = copy_fixture("llama_trained");
    let config_path = dir.path().join(CONFIG_FILE);
    let original: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let write_config = |v: &Value| std::fs::write(&config_path, v.to_string()).unwrap();

    std::fs::write(&config_path, b"{ not json").unwrap();
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(e.to_string().contains(CONFIG_FILE), "{e}");

    let mut c = original.clone();
    c["r"] = Value::from(8);
    write_config(&c);
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(
        e.message.contains("has rank 4") && e.message.contains("rank 8 (its r)"),
        "{e}"
    );

    let mut c = original.clone();
    c["rank_pattern"] = serde_json::json!({"q_proj": 2});
    write_config(&c);
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert!(e.message.contains("rank_pattern key \"q_proj\""), "{e}");

    let mut c = original.clone();
    c["target_modules"] = serde_json::json!(["query", "value"]);
    write_config(&c);
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert!(
        e.message.contains("names none of the 9 LoRA modules"),
        "{e}"
    );

    let mut c = original.clone();
    c["target_modules"] = Value::from(r".*\.(q|k|v|o)_proj");
    write_config(&c);
    assert!(read_adapter_weights(dir.path()).is_ok());
    // Another PEFT method: no LoRA modules, every tensor read as a plain
    // one (its finiteness and size judged), and no factors to compare.
    c["peft_type"] = Value::from("LOHA");
    write_config(&c);
    let w = read_adapter_weights(dir.path()).unwrap();
    assert!(
        w.modules.is_empty() && w.other_tensors.len() == 19,
        "{}",
        w.other_tensors.len()
    );
    assert_eq!(w.config.unwrap().peft_type.as_deref(), Some("LOHA"));
    let e = read_adapter_factors(dir.path()).unwrap_err();
    assert!(e.message.contains("LOHA"), "{e}");
}

// ---- hostile weights, made by mutating a real file ----

/// (header JSON, data section) of a safetensors file.
fn split(bytes: &[u8]) -> (serde_json::Map<String, Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

fn join(header: &serde_json::Map<String, Value>, data: &[u8]) -> Vec<u8> {
    let json = Value::Object(header.clone()).to_string();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Read a copy of `name` whose header `edit` changed.
fn read_edited(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>, &mut Vec<u8>),
) -> Result<AdapterWeights> {
    let dir = copy_fixture(name);
    let path = dir.path().join(ADAPTER_WEIGHTS);
    let (mut header, mut data) = split(&std::fs::read(&path).unwrap());
    edit(&mut header, &mut data);
    std::fs::write(&path, join(&header, &data)).unwrap();
    read_adapter_weights(dir.path())
}

const Q0: &str = "base_model.model.model.layers.0.self_attn.q_proj";

fn key(suffix: &str) -> String {
    format!("{Q0}.{suffix}")
}

fn assert_err(r: Result<AdapterWeights>, area: Area, needles: &[&str]) {
    let e = r.unwrap_err();
    assert_eq!(e.area, area, "{e}");
    for n in needles {
        assert!(e.to_string().contains(n), "{n:?} not in: {e}");
    }
}

#[test]
fn unchanged_round_trip_reads_the_same() {
    let got = read_edited("llama_trained", |_, _| {}).unwrap();
    let want = read_adapter_weights(&fixture("llama_trained")).unwrap();
    assert_eq!(got.modules, want.modules);
}

#[test]
fn lying_offsets_and_truncation_are_header_errors() {
    let a = key("lora_A.weight");
    let r = read_edited("llama_trained", |h, data| {
        let end = data.len() as u64;
        h[&a]["data_offsets"] = serde_json::json!([end - 64, end + 448]);
    });
    assert_err(r, Area::Header, &[&a, "outside"]);
    let r = read_edited("llama_trained", |_, data| data.truncate(data.len() - 100));
    assert_err(r, Area::Header, &["outside"]);
    // Two tensors claiming the same bytes.
    let b = key("lora_B.weight");
    let r = read_edited("llama_trained", |h, _| {
        let offsets = h[&a]["data_offsets"].clone();
        h[&b]["data_offsets"] = offsets;
        h[&b]["shape"] = serde_json::json!([4, 32]);
    });
    assert_err(r, Area::Header, &["overlap"]);
}

#[test]
fn dtype_and_shape_lies_are_refused() {
    let a = key("lora_A.weight");
    let r = read_edited("llama_trained", |h, _| h[&a]["dtype"] = Value::from("F16"));
    assert_err(r, Area::Header, &[&a, "needs 256 bytes"]);
    let r = read_edited("llama_trained", |h, _| h[&a]["dtype"] = Value::from("I32"));
    assert_err(r, Area::Weights, &[&a, "dtype I32"]);
    let r = read_edited("llama_trained", |h, _| {
        h[&a]["shape"] = serde_json::json!([128])
    });
    assert_err(
        r,
        Area::Weights,
        &[&a, "[128]", "LoRA factors are matrices"],
    );
    let r = read_edited("llama_trained", |h, _| {
        h[&a]["shape"] = serde_json::json!([4, 4, 8])
    });
    assert_err(r, Area::Weights, &[&a, "conv layers"]);
    let b = key("lora_B.weight");
    let r = read_edited("llama_trained", |h, _| {
        h[&b]["shape"] = serde_json::json!([16, 8])
    });
    assert_err(r, Area::Weights, &["rank 4", "rank 8", &b]);
    let r = read_edited("llama_dora_f16", |h, _| {
        h[&key("lora_magnitude_vector")]["shape"] = serde_json::json!([2, 16]);
    });
    assert_err(r, Area::Weights, &["magnitude", "expected [32]"]);
}

#[test]
fn unpaired_and_duplicate_factors_are_refused() {
    let r = read_edited("llama_trained", |h, _| {
        h.remove(&key("lora_B.weight"));
    });
    assert_err(r, Area::Weights, &["has lora_A", "but no lora_B"]);
    let r = read_edited("llama_trained", |h, _| {
        h.remove(&key("lora_A.weight"));
    });
    assert_err(r, Area::Weights, &["has lora_B", "but no lora_A"]);
    let r = read_edited("llama_dora_f16", |h, _| {
        h.remove(&key("lora_A.weight"));
        h.remove(&key("lora_B.weight"));
    });
    assert_err(r, Area::Weights, &["DoRA magnitude", "no lora_A/lora_B"]);
    let r = read_edited("llama_trained", |h, _| {
        let a = h.remove(&key("lora_A.weight")).unwrap();
        h.insert(key("lora_A.weight").replace(KEY_PREFIX, ""), a);
        let b = h[&key("lora_B.weight")].clone();
        h.insert(
            key("lora_B.weight").replace(KEY_PREFIX, ""),
            serde_json::json!({"dtype": "F32", "shape": [0, 4], "data_offsets": b["data_offsets"][0].as_u64().map(|x| [x, x])}),
        );
    });
    assert_err(r, Area::Weights, &["are both the B tensor"]);
    let r = read_edited("llama_trained", |h, _| {
        let emb = h
            .remove("base_model.model.model.embed_tokens.lora_embedding_B")
            .unwrap();
        h.insert(
            "base_model.model.model.embed_tokens.lora_B.weight".into(),
            emb,
        );
    });
    assert_err(r, Area::Weights, &["one embedding and one linear"]);
}

#[test]
fn a_huge_claim_is_refused_or_streamed_without_allocating_it() {
    // lora_A claims 4 x 2^30 floats (16 GiB) that the file lacks.
    let a = key("lora_A.weight");
    let r = read_edited("llama_trained", |h, data| {
        let end = data.len() as u64;
        h[&a]["shape"] = serde_json::json!([4, 1u64 << 30]);
        h[&a]["data_offsets"] = serde_json::json!([end, end + (16u64 << 30)]);
    });
    assert_err(r, Area::Header, &[&a, "outside"]);

    // The same claim backed by a sparse file: the shapes are checked
    // against the config before any data is read, so the rank lie is
    // found without touching (or allocating) the 16 GiB.
    let dir = copy_fixture("llama_trained");
    let path = dir.path().join(ADAPTER_WEIGHTS);
    let (mut h, data) = split(&std::fs::read(&path).unwrap());
    let end = data.len() as u64;
    h[&a]["shape"] = serde_json::json!([8, 1u64 << 29]);
    h[&a]["data_offsets"] = serde_json::json!([end, end + (16u64 << 30)]);
    let bytes = join(&h, &data);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&bytes).unwrap();
    f.set_len(bytes.len() as u64 + (16u64 << 30)).unwrap();
    drop(f);
    let e = read_adapter_weights(dir.path()).unwrap_err();
    assert!(
        e.message.contains("rank 8") && e.message.contains("rank 4"),
        "{e}"
    );

    // A sparse 16 MiB extra tensor (a modules_to_save copy) is streamed in
    // 32 reads.
    let dir = copy_fixture("llama_trained");
    let path = dir.path().join(ADAPTER_WEIGHTS);
    let (mut h, data) = split(&std::fs::read(&path).unwrap());
    let end = data.len() as u64;
    h.insert(
        "base_model.model.lm_head.weight".into(),
        serde_json::json!({"dtype": "BF16", "shape": [1u64 << 13, 1024], "data_offsets": [end, end + (16u64 << 20)]}),
    );
    let bytes = join(&h, &data);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&bytes).unwrap();
    f.set_len(bytes.len() as u64 + (16u64 << 20)).unwrap();
    drop(f);
    let got = read_adapter_weights(dir.path()).unwrap();
    let head = got
        .other_tensors
        .iter()
        .find(|t| t.name.ends_with("lm_head.weight"))
        .unwrap();
    assert_eq!((head.numel, head.norm, head.nonfinite), (1 << 23, 0.0, 0));
    assert_eq!(got.tensor_bytes, end + (16u64 << 20));
}

/// The adapter fixtures again, as `torch.save` wrote the same state dicts
/// (`rust/testdata/make_bin_fixtures.py`): every report and every factor
/// must be what the safetensors twin gives, but for the file read.
#[test]
fn pickled_twins_report_exactly_as_safetensors() {
    let twins = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/testdata/weights_bin");
    let mut seen = 0;
    for dir in all_fixtures() {
        let twin = twins.join(dir.file_name().unwrap());
        let from_bin = read_adapter_weights(&twin).unwrap();
        let mut from_st = read_adapter_weights(&dir).unwrap();
        assert_eq!(from_bin.path, twin.join("adapter_model.bin"));
        from_st.path = from_bin.path.clone();
        if let (Some(st), Some(bin)) = (&mut from_st.config, &from_bin.config) {
            st.path = bin.path.clone();
        }
        // Debug text, so that NaN statistics compare equal to NaN.
        assert_eq!(
            format!("{from_bin:?}"),
            format!("{from_st:?}"),
            "{}",
            dir.display()
        );
        // Through a small chunk and the parallel route too.
        let chunked = read_adapter_weights_chunked(&twin, 3, 0).unwrap();
        assert_eq!(chunked.modules.len(), from_bin.modules.len());
        for (a, b) in chunked.modules.iter().zip(&from_bin.modules) {
            assert_eq!(
                (&a.name, a.nonfinite_a, a.nonfinite_b),
                (&b.name, b.nonfinite_a, b.nonfinite_b)
            );
        }
        match (read_adapter_factors(&twin), read_adapter_factors(&dir)) {
            (Ok(bin), Ok(mut st)) => {
                st.path = bin.path.clone();
                assert_eq!(format!("{bin:?}"), format!("{st:?}"), "{}", dir.display());
            }
            (Err(bin), Err(st)) => assert_eq!(bin.message, st.message),
            (bin, st) => panic!("{}: {:?} vs {:?}", dir.display(), bin.err(), st.err()),
        }
        seen += 1;
    }
    assert_eq!(seen, 6);
}

/// A classifier both targeted and in `modules_to_save` (PEFT on a
/// sequence-classification head): the adapter's factors, the trained
/// copy's, and the frozen copy's that PEFT also saves.
#[test]
fn lora_factors_of_the_frozen_original_module_are_no_lora_module() {
    let key = |m: &str| format!("base_model.model.classifier.{m}lora_A.weight");
    assert_eq!(
        super::plan::classify(&key("")).map(|c| c.0),
        Some("classifier")
    );
    assert_eq!(
        super::plan::classify(&key("modules_to_save.")).map(|c| c.0),
        Some("classifier.modules_to_save")
    );
    assert!(super::plan::classify(&key("original_module.")).is_none());
}
