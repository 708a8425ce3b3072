//! Unit tests of the safetensors tensor-data reader and its kernels.

use super::*;
use std::io::Write;

/// Bytes of `vals` in `kind` (f16 only for values it holds exactly).
pub(crate) fn encode(kind: FloatKind, vals: &[f64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in vals {
        match kind {
            FloatKind::F32 => out.extend((v as f32).to_le_bytes()),
            FloatKind::F64 => out.extend(v.to_le_bytes()),
            FloatKind::BF16 => out.extend((((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
            FloatKind::F16 => {
                let h = (0..=u16::MAX)
                    .find(|&h| {
                        let f = f64::from(f16_to_f32(h));
                        f == v || (v.is_nan() && f.is_nan())
                    })
                    .expect("value not exact in f16");
                out.extend(h.to_le_bytes());
            }
        }
    }
    out
}

/// A safetensors file of (name, dtype, shape, bytes) entries, laid out
/// in order.
pub(crate) fn safetensors_bytes(entries: &[(&str, &str, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let json = serde_json::Value::Object(header).to_string();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend(data);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

/// Deterministic values of all signs and magnitudes, exact in bf16/f16.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = ((x >> 40) % 255) as f64 - 127.0;
            m / 64.0
        })
        .collect()
}

fn naive_moments(vals: &[f64]) -> Moments {
    let mut m = Moments::default();
    for &v in vals {
        m.numel += 1;
        m.sum_sq += v * v;
        m.nonfinite += u64::from(!v.is_finite());
        if !v.is_nan() && v.abs() > m.max_abs {
            m.max_abs = v.abs();
        }
    }
    m
}

const KINDS: [FloatKind; 4] = [
    FloatKind::F32,
    FloatKind::F64,
    FloatKind::F16,
    FloatKind::BF16,
];

#[test]
fn moments_match_a_naive_loop_for_every_dtype() {
    for n in [0, 1, 7, 8, 9, 255, 256, 257, 1000] {
        let vals = values(n, n as u64);
        for kind in KINDS {
            let got = moments_of_bytes(kind, &encode(kind, &vals));
            let want = naive_moments(&vals);
            assert_eq!(got.numel, want.numel);
            assert_eq!(got.nonfinite, 0);
            assert_eq!(got.max_abs, want.max_abs, "{kind:?} {n}");
            assert!((got.sum_sq - want.sum_sq).abs() <= 1e-12 * want.sum_sq.max(1.0));
        }
    }
}

#[test]
fn nonfinite_values_are_counted_and_nan_is_no_maximum() {
    let vals = [
        1.0,
        f64::NAN,
        -2.0,
        f64::INFINITY,
        0.5,
        -f64::INFINITY,
        3.0,
        0.0,
        1.0,
    ];
    for kind in KINDS {
        let m = moments_of_bytes(kind, &encode(kind, &vals));
        assert_eq!(m.nonfinite, 3, "{kind:?}");
        assert!(m.norm().is_nan(), "{kind:?}");
        assert_eq!(m.max_abs, f64::INFINITY, "{kind:?}");
    }
    let m = moments_of(&[f64::NAN, -4.0, 2.0]);
    assert_eq!((m.max_abs, m.nonfinite), (4.0, 1));
    let m = moments_of(&[1.0, f64::INFINITY]);
    assert_eq!(m.norm(), f64::INFINITY);
}

#[test]
fn epsilon_is_the_spacing_above_one() {
    for kind in KINDS {
        let one_up = 1.0 + kind.epsilon();
        let bytes = encode(kind, &[1.0]);
        let mut next = bytes.clone();
        next[0] += 1; // the next representable value above 1.0
        let mut out = [0.0; 1];
        decode(kind, &next, &mut out);
        assert_eq!(out[0], one_up, "{kind:?}");
    }
    assert_eq!(FloatKind::from_safetensors("I32"), None);
    for kind in KINDS {
        assert_eq!(
            FloatKind::from_safetensors(kind.safetensors_name()),
            Some(kind)
        );
    }
}

fn naive_gram(x: &[f64], rows: usize, cols: usize, of_rows: bool) -> Vec<f64> {
    let n = if of_rows { rows } else { cols };
    let mut g = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            g[i * n + j] = if of_rows {
                (0..cols).map(|k| x[i * cols + k] * x[j * cols + k]).sum()
            } else {
                (0..rows).map(|k| x[k * cols + i] * x[k * cols + j]).sum()
            };
        }
    }
    g
}

#[test]
fn grams_match_naive_products_for_every_chunking() {
    let dir = tempfile::tempdir().unwrap();
    // Ranks around the 4x4 / 4x2 tiles, and a long side past a panel.
    for (r, wide, kind) in [
        (6usize, 37usize, FloatKind::F32),
        (6, 37, FloatKind::F64),
        (6, 37, FloatKind::F16),
        (6, 37, FloatKind::BF16),
        (1, 5, FloatKind::F32),
        (3, 600, FloatKind::F32),
        (4, 257, FloatKind::BF16),
        (9, 300, FloatKind::F64),
        (13, 11, FloatKind::F32),
    ] {
        let a = values(r * wide, r as u64);
        let b = values(wide * r, wide as u64);
        let bytes = safetensors_bytes(&[
            (
                "a",
                kind.safetensors_name(),
                vec![r as u64, wide as u64],
                encode(kind, &a),
            ),
            (
                "b",
                kind.safetensors_name(),
                vec![wide as u64, r as u64],
                encode(kind, &b),
            ),
        ]);
        let path = write(dir.path(), "g.safetensors", &bytes);
        let data = SafetensorsData::open(&path).unwrap();
        let ta = data.float_tensor(&data.header().tensors[0]).unwrap();
        let tb = data.float_tensor(&data.header().tensors[1]).unwrap();
        let want_g = naive_gram(&a, r, wide, true);
        let want_h = naive_gram(&b, wide, r, false);
        for chunk in [1, 5, 6, 7, 12, 100, 1000, r * wide, DEFAULT_CHUNK_ELEMS] {
            let (g, ma) = data.reader(chunk).row_gram(&ta).unwrap();
            let (h, mb) = data.reader(chunk).column_gram(&tb).unwrap();
            for i in 0..r {
                for j in 0..r {
                    assert!(
                        (g[(i, j)] - want_g[i * r + j]).abs() < 1e-12,
                        "{kind:?} {chunk}"
                    );
                    assert!(
                        (h[(i, j)] - want_h[i * r + j]).abs() < 1e-12,
                        "{kind:?} {chunk}"
                    );
                }
            }
            assert_eq!(ma, {
                let mut m = moments_of(&a);
                m.sum_sq = ma.sum_sq;
                m
            });
            assert!((ma.sum_sq - g.trace()).abs() < 1e-12);
            assert!((mb.sum_sq - h.trace()).abs() < 1e-12);
            assert_eq!(data.reader(chunk).moments(&ta).unwrap().max_abs, ma.max_abs);
        }
    }
}

#[test]
fn refuses_foreign_dtypes_overlaps_and_non_matrices() {
    let dir = tempfile::tempdir().unwrap();
    let ints = safetensors_bytes(&[("counts", "I32", vec![2], vec![0; 8])]);
    let path = write(dir.path(), "i.safetensors", &ints);
    let data = SafetensorsData::open(&path).unwrap();
    let e = data.float_tensor(&data.header().tensors[0]).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(e.message.contains("\"counts\" has dtype I32"), "{e}");

    let json = r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.extend([0u8; 12]);
    let path = write(dir.path(), "o.safetensors", &bytes);
    let e = SafetensorsData::open(&path).unwrap_err();
    assert!(e.message.contains("overlap"), "{e}");

    let vec1 = safetensors_bytes(&[("v", "F32", vec![3], encode(FloatKind::F32, &[1.0; 3]))]);
    let path = write(dir.path(), "v.safetensors", &vec1);
    let data = SafetensorsData::open(&path).unwrap();
    let t = data.float_tensor(&data.header().tensors[0]).unwrap();
    assert!(data
        .reader(8)
        .row_gram(&t)
        .unwrap_err()
        .message
        .contains("expected a matrix"));
    assert_eq!(data.reader(8).moments(&t).unwrap().sum_sq, 3.0);

    // A Gram side past the cap is refused before anything is allocated.
    let tall = safetensors_bytes(&[("t", "F32", vec![2000, 1], vec![0; 8000])]);
    let path = write(dir.path(), "t.safetensors", &tall);
    let data = SafetensorsData::open(&path).unwrap();
    let t = data.float_tensor(&data.header().tensors[0]).unwrap();
    assert!(data
        .reader(8)
        .row_gram(&t)
        .unwrap_err()
        .message
        .contains("exceeds 1024"));
    assert!(data.reader(8).column_gram(&t).is_ok());
}

#[test]
fn a_file_truncated_after_opening_is_an_error_not_a_panic() {
    // Larger than `read_once::WHOLE_MAX`, so it is read by ranges.
    let dir = tempfile::tempdir().unwrap();
    let n = 512 * 512;
    let bytes = safetensors_bytes(&[(
        "w",
        "F32",
        vec![512, 512],
        encode(FloatKind::F32, &vec![0.5; n]),
    )]);
    assert!(bytes.len() as u64 > crate::io::read_once::WHOLE_MAX);
    let path = write(dir.path(), "w.safetensors", &bytes);
    let data = SafetensorsData::open(&path).unwrap();
    let t = data.float_tensor(&data.header().tensors[0]).unwrap();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(bytes.len() as u64 - 10)
        .unwrap();
    for chunk in [1, 4, 100] {
        let e = data.reader(chunk).moments(&t).unwrap_err();
        assert_eq!(e.area, Area::Weights);
        assert!(
            e.message.contains("the data of tensor \"w\" ends early"),
            "{e}"
        );
        for e in [
            data.reader(chunk).row_gram(&t).unwrap_err(),
            data.reader(chunk).column_gram(&t).unwrap_err(),
        ] {
            assert!(e.message.contains("the data of tensor \"w\""), "{e}");
        }
    }
    // Reopening sees the short file in the header check.
    assert_eq!(SafetensorsData::open(&path).unwrap_err().area, Area::Header);
}

#[test]
fn a_small_file_is_read_as_it_was_when_opened() {
    // Held whole (`io::read_once`): truncating it later changes nothing read.
    let dir = tempfile::tempdir().unwrap();
    let bytes = safetensors_bytes(&[("w", "F32", vec![4, 4], encode(FloatKind::F32, &[0.5; 16]))]);
    let path = write(dir.path(), "w.safetensors", &bytes);
    let data = SafetensorsData::open(&path).unwrap();
    let t = data.float_tensor(&data.header().tensors[0]).unwrap();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(bytes.len() as u64 - 10)
        .unwrap();
    assert_eq!(data.reader(4).moments(&t).unwrap().numel, 16);
    assert_eq!(SafetensorsData::open(&path).unwrap_err().area, Area::Header);
}

#[test]
fn a_sparse_multi_gigabyte_tensor_streams_in_bounded_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let numel: u64 = 3 << 30; // 3 Gi f16 values: 6 GiB of data, all a hole
    let json = format!(
        r#"{{"huge":{{"dtype":"F16","shape":[{numel}],"data_offsets":[0,{}]}}}}"#,
        numel * 2
    );
    let path = dir.path().join("sparse.safetensors");
    let mut f = File::create(&path).unwrap();
    f.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
    f.write_all(json.as_bytes()).unwrap();
    f.set_len(8 + json.len() as u64 + numel * 2).unwrap();
    drop(f);
    let data = SafetensorsData::open(&path).unwrap();
    let t = data.float_tensor(&data.header().tensors[0]).unwrap();
    assert_eq!(t.byte_len, 6 << 30);
    // Walk the first chunks only (reading 6 GiB of holes takes seconds):
    // each read is bounded however large the tensor or the request.
    let (mut reads, mut largest) = (0u64, 0usize);
    data.reader(usize::MAX)
        .for_each_raw_chunk(&t, |bytes| {
            reads += 1;
            largest = largest.max(bytes.len());
            assert!(bytes.iter().all(|&b| b == 0));
            if reads == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(reads, 4);
    assert_eq!(largest, MAX_CHUNK_BYTES / 8 * 2);
    // The tail of the data section is read the same way.
    let tail = FloatTensor {
        offset: t.offset + t.byte_len - 3000,
        byte_len: 3000,
        numel: 1500,
        ..t.clone()
    };
    let m = data.reader(1000).moments(&tail).unwrap();
    assert_eq!((m.numel, m.sum_sq, m.nonfinite), (1500, 0.0, 0));
}

proptest::proptest! {
    /// The narrow kernels (bytes straight to sums) give bit for bit what
    /// decoding each block to f64 and taking `moments_of` gives, for any
    /// bit patterns (NaN, inf, subnormals) and lengths.
    #[test]
    fn narrow_moments_are_the_decoded_ones_bit_for_bit(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2200),
        kind in 0usize..3,
        tame in proptest::prelude::any::<bool>(),
    ) {
        let kind = [FloatKind::F32, FloatKind::F16, FloatKind::BF16][kind];
        let mut bytes = bytes;
        if tame {
            // Clear exponent top bits: mostly finite values, so the sums are compared too.
            for (i, b) in bytes.iter_mut().enumerate() {
                if i % kind.size() == kind.size() - 1 {
                    *b &= 0xbf;
                }
            }
        }
        let got = moments_of_bytes(kind, &bytes);
        let want = moments_of_decoded(kind, &bytes);
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        proptest::prop_assert_eq!(got.numel, want.numel);
        proptest::prop_assert_eq!(got.nonfinite, want.nonfinite);
        proptest::prop_assert!(same(got.sum_sq, want.sum_sq), "{} vs {}", got.sum_sq, want.sum_sq);
        proptest::prop_assert!(same(got.max_abs, want.max_abs), "{} vs {}", got.max_abs, want.max_abs);
    }
}
