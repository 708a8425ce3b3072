//! Unit tests of the near-duplicate search on adapters written as PEFT
//! lays them out (keys, shapes, config), in a temporary directory.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::formats::tensor_data::tests::{encode, safetensors_bytes};
use crate::formats::tensor_data::FloatKind;

fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = splitmix(state);
            (state >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

const MODULES: [&str; 2] = ["q_proj", "v_proj"];

/// An adapter of two layers × two modules (out = in = `dim`, rank 4) whose
/// factors come from `seed`, plus `noise` times other values.
fn write_adapter(root: &Path, name: &str, seed: u64, noise: f64, dim: u64) -> PathBuf {
    let dir = root.join(name);
    fs::create_dir_all(&dir).unwrap();
    let r = 4u64;
    let mut entries = Vec::new();
    let mut k = 0u64;
    for layer in 0..2 {
        for m in MODULES {
            k += 1;
            let base = format!("base_model.model.model.layers.{layer}.self_attn.{m}");
            for (suffix, shape) in [("lora_A", vec![r, dim]), ("lora_B", vec![dim, r])] {
                let n = (shape[0] * shape[1]) as usize;
                let clean = values(seed * 1000 + k * 10 + shape[0], n);
                let jitter = values(seed * 7777 + k, n);
                let vals: Vec<f64> = clean
                    .iter()
                    .zip(&jitter)
                    .map(|(c, j)| c + noise * j)
                    .collect();
                entries.push((
                    format!("{base}.{suffix}.weight"),
                    shape,
                    encode(FloatKind::F32, &vals),
                ));
            }
        }
    }
    let borrowed: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = entries
        .iter()
        .map(|(n, s, b)| (n.as_str(), "F32", s.clone(), b.clone()))
        .collect();
    fs::write(
        dir.join("adapter_model.safetensors"),
        safetensors_bytes(&borrowed),
    )
    .unwrap();
    fs::write(
        dir.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}"#,
    )
    .unwrap();
    dir
}

#[test]
fn a_perturbed_copy_is_found_and_unrelated_adapters_are_not() {
    let tmp = tempfile::tempdir().unwrap();
    let orig = write_adapter(tmp.path(), "orig", 1, 0.0, 24);
    let copy = write_adapter(tmp.path(), "copy", 1, 1e-3, 24);
    for s in 2..6 {
        write_adapter(tmp.path(), &format!("other{s}"), s, 0.0, 24);
    }
    let report = similar_under(tmp.path(), 0.99, false, DEFAULT_MAX_PAIRS, true).unwrap();
    assert_eq!(report.adapters, 6);
    assert_eq!(report.groups, 1);
    assert_eq!(report.pairs_considered, 15);
    assert_eq!(report.pairs.len(), 1, "{:?}", report.pairs);
    let p = &report.pairs[0];
    assert_eq!((&p.a, &p.b), (&copy, &orig));
    assert!(p.similarity > 0.999 && p.similarity <= 1.0);
    // The screen let through fewer pairs than all of them.
    assert!(report.pairs_exact < report.pairs_considered);
}

#[test]
fn the_screen_agrees_with_the_exhaustive_search_and_both_exact_routes_agree() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, noise) in [0.0, 0.05, 0.2, 0.5, 1.0].iter().enumerate() {
        write_adapter(tmp.path(), &format!("a{i}"), 3, *noise, 16);
    }
    let paths = find_adapters(tmp.path()).unwrap();
    for threshold in [0.0, 0.5, 0.9, 0.99] {
        let screened = similar_pairs(&paths, threshold, false, DEFAULT_MAX_PAIRS).unwrap();
        let all = similar_pairs(&paths, threshold, true, DEFAULT_MAX_PAIRS).unwrap();
        let per_pair = similar_pairs_with(&paths, threshold, true, DEFAULT_MAX_PAIRS, 0).unwrap();
        assert_eq!(screened.pairs, all.pairs, "threshold {threshold}");
        assert_eq!(all.pairs, per_pair.pairs);
        assert_eq!(all.pairs_exact, 10);
    }
}

#[test]
fn adapters_of_other_shapes_are_never_paired_and_bad_ones_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    write_adapter(tmp.path(), "small", 1, 0.0, 16);
    write_adapter(tmp.path(), "wide", 1, 0.0, 24);
    let zero = write_adapter(tmp.path(), "zero", 1, 0.0, 16);
    let st = zero.join("adapter_model.safetensors");
    let bytes = fs::read(&st).unwrap();
    // Zero every value (the header is kept): an untrained adapter.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize + 8;
    let mut zeroed = bytes.clone();
    zeroed[header_len..].iter_mut().for_each(|b| *b = 0);
    fs::write(&st, zeroed).unwrap();
    let broken = write_adapter(tmp.path(), "broken", 1, 0.0, 16);
    let st = broken.join("adapter_model.safetensors");
    let bytes = fs::read(&st).unwrap();
    fs::write(&st, &bytes[..bytes.len() - 5]).unwrap();

    let report = similar_under(tmp.path(), -1.0, false, DEFAULT_MAX_PAIRS, true).unwrap();
    assert_eq!(report.adapters, 2);
    assert_eq!(report.groups, 2);
    assert!(report.pairs.is_empty());
    let reasons: Vec<(&Path, &str)> = report
        .skipped
        .iter()
        .map(|s| (s.path.as_path(), s.reason.as_str()))
        .collect();
    assert!(reasons
        .iter()
        .any(|(p, r)| *p == zero && r.contains("zero")));
    assert!(reasons.iter().any(|(p, _)| *p == broken));
}

#[test]
fn a_threshold_outside_the_cosine_range_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let err = similar_under(tmp.path(), 1.5, false, DEFAULT_MAX_PAIRS, true).unwrap_err();
    assert_eq!(err.area, Area::Usage);
    let err = similar_under(
        &tmp.path().join("nope"),
        0.9,
        false,
        DEFAULT_MAX_PAIRS,
        true,
    )
    .unwrap_err();
    assert_eq!(err.area, Area::Missing);
}

#[test]
fn the_sketch_inner_product_is_unbiased_over_module_names() {
    // Averaged over many independent hash seeds (module names), the sketch
    // inner product approaches the exact one.
    let dim = 12;
    let mk = |seed: u64, name: &str| ModuleFactors {
        name: name.into(),
        layer: None,
        rank: 2,
        in_features: dim,
        out_features: dim,
        scale: 1.0,
        a: values(seed, 2 * dim),
        b: values(seed + 1, 2 * dim),
        nonfinite: 0,
    };
    let x = mk(1, "m");
    let y = mk(5, "m");
    let exact = crate::analysis::update_similarity::factor_inner(&x, &y);
    let trials = 4000;
    let mut total = 0.0;
    for t in 0..trials {
        let name = format!("m{t}");
        let (mut xs, mut ys) = (x.clone(), y.clone());
        xs.name.clone_from(&name);
        ys.name = name;
        let (mut zx, mut zy) = (vec![0.0; 16], vec![0.0; 16]);
        add_module_sketch(&xs, 4, &mut zx);
        add_module_sketch(&ys, 4, &mut zy);
        total += zx.iter().zip(&zy).map(|(a, b)| a * b).sum::<f64>();
    }
    let mean = total / f64::from(trials);
    let scale = crate::analysis::update_similarity::factor_energy(&x).sqrt()
        * crate::analysis::update_similarity::factor_energy(&y).sqrt();
    assert!((mean - exact).abs() < 0.1 * scale, "{mean} vs {exact}");
}

#[test]
fn the_streamed_sketch_equals_the_sketch_of_the_whole_factors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_adapter(tmp.path(), "a", 4, 0.0, 40);
    // A chunk of 7 values: several blocks per factor, none of them whole.
    let streamed = sketch_adapter(&dir, 8, 7).unwrap();
    let f = read_adapter_factors(&dir).unwrap();
    let mut z = vec![0.0; 64];
    for m in &f.modules {
        add_module_sketch(m, 8, &mut z);
    }
    let norm = z.iter().map(|v| v * v).sum::<f64>().sqrt();
    for (x, y) in streamed.unit.iter().zip(&z) {
        assert!((x - y / norm).abs() < 1e-12);
    }
    assert_eq!(streamed.signature.len(), 4);
    assert_eq!(streamed.bytes, f.value_bytes());
}

#[test]
fn copies_beyond_max_pairs_are_counted_and_the_most_similar_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    // Six near-copies (noise grows with the index) and one unrelated.
    for i in 0..6u32 {
        write_adapter(tmp.path(), &format!("c{i}"), 9, 1e-4 * f64::from(i), 16);
    }
    write_adapter(tmp.path(), "other", 4, 0.0, 16);
    let paths = find_adapters(tmp.path()).unwrap();
    let all = similar_pairs(&paths, 0.99, false, DEFAULT_MAX_PAIRS).unwrap();
    assert_eq!(all.pairs_found, 15);
    assert_eq!(all.pairs.len(), 15);
    for cap in [0, 1, 4, 15, 40] {
        let few = similar_pairs(&paths, 0.99, false, cap).unwrap();
        assert_eq!(few.pairs_found, 15, "cap {cap}");
        assert_eq!(few.max_pairs, cap as u64);
        assert_eq!(few.pairs[..], all.pairs[..cap.min(15)], "cap {cap}");
    }
}

#[test]
fn a_module_claiming_more_than_the_cap_is_an_error_before_any_allocation() {
    use crate::analysis::adapter_weights::{FactorFile, ModuleSource};
    let tmp = tempfile::tempdir().unwrap();
    // A 1 × 2^25 F16 lora_A over a file of that length made of one hole
    // (nothing written): sparse, 2^26 bytes long.
    let dir = sparse_huge_adapter(tmp.path(), "huge", false);
    let path = dir.join("adapter_model.safetensors");
    let file = FactorFile::open(&dir).unwrap();
    let err = file.module(0).unwrap_err();
    assert!(err.message.contains("more than the"), "{}", err.message);
    assert_eq!(err.path, path);
    let cmp = compare_adapters(&file, &file, false).unwrap_err();
    assert!(cmp.message.contains("claims"), "{}", cmp.message);
}

/// An adapter whose one module claims a 1 × `MAX_MODULE_VALUES` F16 lora_A
/// over a sparse file; with `ones`, one non-zero value in A and in B (its
/// update is not zero: streamed into a sketch, refused whole by the exact
/// pass), else nothing written at all.
fn sparse_huge_adapter(root: &Path, name: &str, ones: bool) -> PathBuf {
    use std::io::{Seek, SeekFrom, Write};

    use crate::analysis::adapter_weights::MAX_MODULE_VALUES;
    let dir = root.join(name);
    fs::create_dir_all(&dir).unwrap();
    let n = MAX_MODULE_VALUES;
    let header = format!(
        r#"{{"base_model.model.layers.0.q_proj.lora_A.weight":{{"dtype":"F16","shape":[1,{n}],"data_offsets":[0,{}]}},"base_model.model.layers.0.q_proj.lora_B.weight":{{"dtype":"F16","shape":[8,1],"data_offsets":[{},{}]}}}}"#,
        2 * n,
        2 * n,
        2 * n + 16
    );
    let path = dir.join("adapter_model.safetensors");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    fs::write(&path, &bytes).unwrap();
    let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let data = bytes.len() as u64;
    f.set_len(data + 2 * n + 16).unwrap();
    let one = 0x3c00u16.to_le_bytes(); // 1.0 in F16
    for at in [data, data + 2 * n].into_iter().filter(|_| ones) {
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&one).unwrap();
    }
    fs::write(
        dir.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"]}"#,
    )
    .unwrap();
    dir
}

#[test]
fn each_adapter_of_a_pair_the_exact_pass_cannot_read_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = vec![
        sparse_huge_adapter(tmp.path(), "a", true),
        sparse_huge_adapter(tmp.path(), "b", true),
    ];
    // Both routes: the adapters read once (they fit the cache), and each
    // pair read per pair (they do not): a pair's first failure must not
    // leave its other adapter unread and unnamed.
    for cache in [usize::MAX, 0] {
        let report = similar_pairs_with(&paths, 0.5, false, 10, cache).unwrap();
        assert_eq!(report.pairs_exact, 1, "cache {cache}");
        let mut skipped: Vec<PathBuf> = report.skipped.iter().map(|s| s.path.clone()).collect();
        skipped.sort();
        assert_eq!(skipped, paths, "cache {cache}: {:?}", report.skipped);
        assert!(report
            .skipped
            .iter()
            .all(|s| s.reason.contains("read at once")));
    }
}
