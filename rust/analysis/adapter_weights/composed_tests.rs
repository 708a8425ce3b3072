//! LyCORIS LoHa and LoKr files written byte by byte, their update read
//! against the dense ΔW computed here from the same numbers.

use std::path::{Path, PathBuf};

use nalgebra::DMatrix;

use super::super::foreign::tests::values;
use super::super::{read_adapter_factors, read_adapter_weights};
use crate::error::Area;

/// A safetensors file of f32 tensors `(name, shape, values)`.
fn write(path: &Path, tensors: &[(&str, Vec<u64>, Vec<f32>)]) {
    super::super::foreign::tests::write(path, tensors, &[]);
}

fn mat(rows: usize, cols: usize, v: &[f32]) -> DMatrix<f64> {
    DMatrix::from_row_iterator(rows, cols, v.iter().map(|&x| f64::from(x)))
}

fn file() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("lycoris.safetensors");
    (d, p)
}

/// ‖ΔW‖_F, rank and singular values of the module read, against `dense`.
fn check(path: &Path, name: &str, dense: &DMatrix<f64>, kind: &str) {
    let w = read_adapter_weights(path).unwrap();
    let m = w.modules.iter().find(|m| m.name == name).unwrap();
    assert_eq!(m.kind, kind);
    assert_eq!(
        (m.out_features, m.in_features),
        (dense.nrows() as u64, dense.ncols() as u64)
    );
    let want = dense.norm();
    let got = m.delta_fro.unwrap();
    assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
    let mut sv: Vec<f64> = dense
        .clone()
        .svd(false, false)
        .singular_values
        .iter()
        .copied()
        .collect();
    sv.sort_by(|a, b| b.total_cmp(a));
    for (i, want) in sv.iter().enumerate().take(m.singular_values.len().min(4)) {
        let got = m.singular_values[i];
        assert!((got - want).abs() <= 1e-7 * sv[0], "σ{i}: {got} vs {want}");
    }
    let rank = sv.iter().filter(|&&s| s > 1e-6 * sv[0]).count() as u64;
    assert_eq!(m.rank_used, Some(rank));
    // The factors a comparison reads multiply back to the same update.
    let f = read_adapter_factors(path).unwrap();
    let fm = f.modules.iter().find(|m| m.name == name).unwrap();
    let b = DMatrix::from_row_slice(fm.out_features, fm.rank, &fm.b);
    let a = DMatrix::from_row_slice(fm.rank, fm.in_features, &fm.a);
    let diff = (b * a * fm.scale - dense).norm();
    assert!(diff <= 1e-9 * want, "formed factors differ by {diff}");
}

#[test]
fn loha_is_the_hadamard_product_scaled_by_alpha_over_the_rank() {
    let (_d, path) = file();
    let (out, inp, r) = (7, 9, 3);
    let (w1a, w1b) = (values(out * r, 1.0), values(r * inp, 2.0));
    let (w2a, w2b) = (values(out * r, 3.0), values(r * inp, 4.0));
    let n = "lora_unet_mid_proj";
    write(
        &path,
        &[
            (
                &format!("{n}.hada_w1_a"),
                vec![out as u64, r as u64],
                w1a.clone(),
            ),
            (
                &format!("{n}.hada_w1_b"),
                vec![r as u64, inp as u64],
                w1b.clone(),
            ),
            (
                &format!("{n}.hada_w2_a"),
                vec![out as u64, r as u64],
                w2a.clone(),
            ),
            (
                &format!("{n}.hada_w2_b"),
                vec![r as u64, inp as u64],
                w2b.clone(),
            ),
            (&format!("{n}.alpha"), vec![], vec![2.0]),
        ],
    );
    let dense = (mat(out, r, &w1a) * mat(r, inp, &w1b))
        .component_mul(&(mat(out, r, &w2a) * mat(r, inp, &w2b)))
        * (2.0 / 3.0);
    check(&path, n, &dense, "loha");
    let w = read_adapter_weights(&path).unwrap();
    let m = &w.modules[0];
    assert_eq!((m.rank, m.scale), (9, Some(2.0 / 3.0)));
    assert!(w.unformed_modules.is_empty());
    assert!(w.other_tensors.is_empty(), "alpha is the module's");
    let c = w.config.unwrap();
    assert_eq!((c.format.as_str(), c.r), ("lycoris-loha", 3));
}

#[test]
fn lokr_is_the_kronecker_product_with_a_low_rank_or_full_half() {
    let (_d, path) = file();
    // W1 full 2 × 3, W2 = w2_a (4 × 2)·w2_b (2 × 5): ΔW is 8 × 15.
    let (w1, w2a, w2b) = (values(6, 1.0), values(8, 2.0), values(10, 3.0));
    // Both halves full: scale 1 whatever alpha says.
    let (v1, v2) = (values(4, 4.0), values(9, 5.0));
    write(
        &path,
        &[
            ("a.lokr_w1", vec![2, 3], w1.clone()),
            ("a.lokr_w2_a", vec![4, 2], w2a.clone()),
            ("a.lokr_w2_b", vec![2, 5], w2b.clone()),
            ("a.alpha", vec![], vec![1.0]),
            ("b.lokr_w1", vec![2, 2], v1.clone()),
            ("b.lokr_w2", vec![3, 3], v2.clone()),
            ("b.alpha", vec![], vec![4.0]),
        ],
    );
    let dense_a = mat(2, 3, &w1).kronecker(&(mat(4, 2, &w2a) * mat(2, 5, &w2b))) * 0.5;
    check(&path, "a", &dense_a, "lokr");
    let dense_b = mat(2, 2, &v1).kronecker(&mat(3, 3, &v2));
    check(&path, "b", &dense_b, "lokr");
    let w = read_adapter_weights(&path).unwrap();
    assert_eq!(w.modules[0].rank, 4, "min(2, 3) · 2");
    assert_eq!(w.modules[1].scale, Some(1.0));
}

#[test]
fn a_conv_lokr_is_judged_as_its_flattened_weight() {
    let (_d, path) = file();
    // W1 (2 × 1) ⊗ W2 (3, 3, 3, 3): the conv weight (6, 3, 3, 3) flattened.
    let (w1, w2) = (values(2, 1.0), values(81, 2.0));
    write(
        &path,
        &[
            ("c.lokr_w1", vec![2, 1], w1.clone()),
            ("c.lokr_w2", vec![3, 3, 3, 3], w2.clone()),
        ],
    );
    let dense = mat(2, 1, &w1).kronecker(&mat(3, 27, &w2));
    check(&path, "c", &dense, "lokr");
}

#[test]
fn tucker_modules_are_named_and_read_as_plain_tensors() {
    let (_d, path) = file();
    let (out, inp, r) = (4, 5, 2);
    write(
        &path,
        &[
            ("t.hada_w1_a", vec![r, out], values(8, 1.0)),
            ("t.hada_w1_b", vec![r, inp], values(10, 2.0)),
            ("t.hada_w2_a", vec![r, out], values(8, 3.0)),
            ("t.hada_w2_b", vec![r, inp], values(10, 4.0)),
            ("t.hada_t1", vec![r, r, 3, 3], values(36, 5.0)),
            ("t.hada_t2", vec![r, r, 3, 3], values(36, 6.0)),
        ],
    );
    let w = read_adapter_weights(&path).unwrap();
    assert!(w.modules.is_empty());
    assert_eq!(w.other_tensors.len(), 6);
    assert_eq!(w.unformed_modules.len(), 1);
    assert!(
        w.unformed_modules[0].contains("LoHa with Tucker conv factors (hada_t1, hada_t2)"),
        "{:?}",
        w.unformed_modules
    );
    let e = read_adapter_factors(&path).unwrap_err();
    assert!(e.message.contains("not compared"), "{}", e.message);
}

#[test]
fn malformed_and_hostile_modules_are_errors_not_allocations() {
    let (_d, path) = file();
    // hada_w2_b's rows do not match hada_w2_a's columns.
    write(
        &path,
        &[
            ("m.hada_w1_a", vec![3, 2], values(6, 1.0)),
            ("m.hada_w1_b", vec![2, 4], values(8, 2.0)),
            ("m.hada_w2_a", vec![3, 2], values(6, 3.0)),
            ("m.hada_w2_b", vec![1, 4], values(4, 4.0)),
        ],
    );
    let e = read_adapter_weights(&path).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(e.message.contains("do not chain"), "{}", e.message);
    // A header claiming a huge factor over a few real bytes.
    write(
        &path,
        &[
            ("h.lokr_w1", vec![1 << 20, 1 << 20], values(4, 1.0)),
            ("h.lokr_w2", vec![2, 2], values(4, 2.0)),
        ],
    );
    assert!(read_adapter_weights(&path).is_err());
    // A LoKr half missing its second factor.
    write(
        &path,
        &[
            ("k.lokr_w1", vec![2, 2], values(4, 1.0)),
            ("k.lokr_w2_a", vec![2, 1], values(2, 2.0)),
        ],
    );
    let e = read_adapter_weights(&path).unwrap_err();
    assert!(e.message.contains("neither lokr_w2"), "{}", e.message);
}

#[test]
fn a_rank_past_the_cap_is_not_formed() {
    let (_d, path) = file();
    // LoHa at r = 17: r² = 289 > MAX_COMPOSED_RANK (256): dim 16 is
    // formed, dim 17 is not.
    let (out, inp, r) = (2u64, 2u64, 17u64);
    let n = (out * r) as usize;
    write(
        &path,
        &[
            ("p.hada_w1_a", vec![out, r], values(n, 1.0)),
            ("p.hada_w1_b", vec![r, inp], values(n, 2.0)),
            ("p.hada_w2_a", vec![out, r], values(n, 3.0)),
            ("p.hada_w2_b", vec![r, inp], values(n, 4.0)),
        ],
    );
    let w = read_adapter_weights(&path).unwrap();
    assert!(w.modules.is_empty());
    assert!(
        w.unformed_modules[0].contains("rank up to 289"),
        "{:?}",
        w.unformed_modules
    );
}
