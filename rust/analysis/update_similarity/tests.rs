//! Unit tests: every r×r-space quantity against the dense out × in product.

use std::path::PathBuf;

use super::*;
use crate::analysis::adapter_weights::AdapterFactors;

/// Deterministic values in [-1, 1) (splitmix64).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

fn module(name: &str, seed: u64, rank: usize, out: usize, inp: usize, scale: f64) -> ModuleFactors {
    ModuleFactors {
        name: name.into(),
        layer: None,
        rank,
        in_features: inp,
        out_features: out,
        scale,
        a: values(seed, rank * inp),
        b: values(seed ^ 0xABCD, out * rank),
        nonfinite: 0,
    }
}

/// Dense ΔW = s·B·A, row-major out × in.
fn dense(m: &ModuleFactors) -> Vec<f64> {
    let mut w = vec![0.0; m.out_features * m.in_features];
    for o in 0..m.out_features {
        for i in 0..m.in_features {
            let mut acc = 0.0;
            for k in 0..m.rank {
                acc += m.b[o * m.rank + k] * m.a[k * m.in_features + i];
            }
            w[o * m.in_features + i] = m.scale * acc;
        }
    }
    w
}

fn dense_dot(x: &[f64], y: &[f64]) -> f64 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

fn adapter(modules: Vec<ModuleFactors>) -> AdapterFactors {
    AdapterFactors {
        path: PathBuf::from("x"),
        has_config: true,
        modules,
    }
}

#[test]
fn inner_and_cosine_match_dense_products_with_different_ranks() {
    for (r1, r2, out, inp) in [(1, 1, 3, 5), (4, 8, 17, 9), (16, 3, 33, 64), (8, 8, 1, 1)] {
        let x = module("m", 1 + r1 as u64, r1, out, inp, 0.5);
        let y = module("m", 99 + r2 as u64, r2, out, inp, -2.0);
        let (dx, dy) = (dense(&x), dense(&y));
        let s = compare_modules(&x, &y, false);
        let want = dense_dot(&dx, &dy);
        assert!(
            (s.inner - want).abs() <= 1e-10 * (1.0 + want.abs()),
            "{} vs {want}",
            s.inner
        );
        let (nx, ny) = (dense_dot(&dx, &dx).sqrt(), dense_dot(&dy, &dy).sqrt());
        assert!((s.norm_a - nx).abs() <= 1e-10 * nx);
        assert!((s.norm_b - ny).abs() <= 1e-10 * ny);
        assert!((s.cosine - want / (nx * ny)).abs() <= 1e-10);
    }
}

#[test]
fn an_update_is_its_own_twin_and_its_negation_is_opposite() {
    let x = module("m", 5, 4, 12, 10, 1.0);
    assert!((compare_modules(&x, &x, false).cosine - 1.0).abs() < 1e-12);
    let mut neg = x.clone();
    neg.scale = -1.0;
    assert!((compare_modules(&x, &neg, false).cosine + 1.0).abs() < 1e-12);
}

#[test]
fn the_combined_similarity_is_the_cosine_of_the_concatenated_updates() {
    let xs = vec![module("p", 1, 4, 6, 7, 1.0), module("q", 2, 2, 5, 3, 3.0)];
    let ys = vec![module("p", 3, 8, 6, 7, 1.0), module("q", 4, 2, 5, 3, 0.1)];
    let dx: Vec<f64> = xs.iter().flat_map(dense).collect();
    let dy: Vec<f64> = ys.iter().flat_map(dense).collect();
    let want = dense_dot(&dx, &dy) / (dense_dot(&dx, &dx) * dense_dot(&dy, &dy)).sqrt();
    let c = compare_adapters(&adapter(xs), &adapter(ys), false).unwrap();
    assert!(
        (c.similarity - want).abs() < 1e-12,
        "{} vs {want}",
        c.similarity
    );
    assert!(c.left_out.is_empty());
}

#[test]
fn modules_not_shared_are_left_out_with_a_reason() {
    let xs = vec![
        module("p", 1, 4, 6, 7, 1.0),
        module("only_a", 2, 2, 5, 3, 1.0),
    ];
    let ys = vec![
        module("p", 3, 4, 6, 7, 1.0),
        module("only_b", 4, 2, 5, 3, 1.0),
    ];
    let mut wide = module("w", 5, 2, 5, 3, 1.0);
    let wide_b = module("w", 6, 2, 5, 4, 1.0);
    wide.layer = Some(1);
    let mut xa = adapter(xs);
    xa.modules.push(wide);
    let mut yb = adapter(ys);
    yb.modules.push(wide_b);
    let c = compare_adapters(&xa, &yb, false).unwrap();
    assert_eq!(c.modules.len(), 1);
    let reasons: Vec<(&str, &str)> = c
        .left_out
        .iter()
        .map(|l| (l.module.as_str(), l.reason.as_str()))
        .collect();
    assert!(reasons.contains(&("only_a", "only in A")));
    assert!(reasons.contains(&("only_b", "only in B")));
    assert!(reasons
        .iter()
        .any(|(m, r)| *m == "w" && r.contains("shapes differ")));
    let single = compare_modules(&xa.modules[0], &yb.modules[0], false).cosine;
    assert!((c.similarity - single).abs() < 1e-12);
}

#[test]
fn zero_and_non_finite_updates_have_no_cosine() {
    let x = module("m", 1, 2, 4, 4, 1.0);
    let mut zero = x.clone();
    zero.b.iter_mut().for_each(|v| *v = 0.0);
    assert!(compare_modules(&x, &zero, true).cosine.is_nan());
    let mut bad = x.clone();
    bad.a[0] = f64::NAN;
    bad.nonfinite = 1;
    let c = compare_adapters(&adapter(vec![x]), &adapter(vec![bad]), false).unwrap();
    assert!(c.similarity.is_nan());
    assert_eq!(c.left_out.len(), 1);
}

#[test]
fn principal_angles_are_zero_for_one_span_and_ninety_for_orthogonal_spans() {
    let x = module("m", 7, 3, 10, 6, 1.0);
    let mut same_span = x.clone();
    same_span.a = values(77, 3 * 6);
    let angles = principal_angles(&x, &same_span);
    assert_eq!(angles.len(), 3);
    assert!(angles.iter().all(|&d| d < 1e-5), "{angles:?}");

    // B columns on disjoint coordinates: orthogonal column spaces.
    let mut p = module("m", 8, 2, 6, 4, 1.0);
    let mut q = p.clone();
    p.b = vec![1., 0., 0., 1., 0., 0., 0., 0., 0., 0., 0., 0.];
    q.b = vec![0., 0., 0., 0., 1., 0., 0., 1., 0., 0., 0., 0.];
    q.a = values(9, 2 * 4);
    let angles = principal_angles(&p, &q);
    assert!(
        angles.iter().all(|&d| (d - 90.0).abs() < 1e-6),
        "{angles:?}"
    );
}

#[test]
fn cross_kernels_match_naive_loops() {
    let (p, q, rows) = (3, 5, 7);
    let x = values(1, rows * p);
    let y = values(2, rows * q);
    let m = cross_columns(&x, p, &y, q, rows);
    for i in 0..p {
        for j in 0..q {
            let want: f64 = (0..rows).map(|o| x[o * p + i] * y[o * q + j]).sum();
            assert!((m[i * q + j] - want).abs() < 1e-12);
        }
    }
    let cols = 9;
    let x = values(3, p * cols);
    let y = values(4, q * cols);
    let n = cross_rows(&x, p, &y, q, cols);
    for i in 0..p {
        for j in 0..q {
            let want: f64 = (0..cols).map(|k| x[i * cols + k] * y[j * cols + k]).sum();
            assert!((n[i * q + j] - want).abs() < 1e-12);
        }
    }
}

#[test]
fn factors_near_the_float_range_give_angles_in_bounded_time() {
    // 1e155: products overflow; an unbounded SVD on them never returned
    for scale in [1e155, 1e300, 1e-300] {
        let huge = |seed| {
            let mut m = module("m", seed, 4, 16, 12, 1.0);
            m.a.iter_mut()
                .chain(m.b.iter_mut())
                .for_each(|v| *v *= scale);
            m
        };
        let (x, y) = (huge(1), huge(2));
        let start = std::time::Instant::now();
        let angles = principal_angles(&x, &y);
        assert!(start.elapsed().as_secs() < 5, "{scale}");
        assert_eq!(angles.len(), 4, "{scale}");
        assert!(
            angles.iter().all(|a| (0.0..=90.0).contains(a)),
            "{scale}: {angles:?}"
        );
        assert!(
            principal_angles(&x, &x).iter().all(|a| *a < 1e-3),
            "{scale}"
        );
    }
}
