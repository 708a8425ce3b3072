//! Near-duplicate adapters across a store: every pair whose updates have
//! an energy-weighted cosine at or above a threshold.
//!
//! Why: a team with thousands of adapters keeps retraining the same one;
//! comparing every pair exactly costs `r²·(in + out)` per module pair, far
//! too much for half a million pairs. So two passes:
//!
//! 1. Read each adapter once (in parallel, one adapter's factors per
//!    thread at a time) and keep a small sketch of its whole update: for
//!    every module, `Z += (Cₒ·s·B)·(A·Cᵢᵀ)` where `Cₒ` and `Cᵢ` are
//!    CountSketch maps (each row or column hashed to one of `side` buckets
//!    with a random sign) seeded by the module's name, so every adapter of
//!    a group uses the same maps. `⟨Z(x), Z(y)⟩` is an unbiased estimate of
//!    `⟨ΔW(x), ΔW(y)⟩` summed over modules (the cross terms of different
//!    modules have mean zero). Cost per module `r·(in + out) + side²·r`;
//!    memory `side²` values per adapter.
//! 2. Pairs of the same group (same module names and shapes) whose sketch
//!    cosine is at least `threshold − margin` are candidates, and each
//!    candidate's similarity is computed exactly in r×r space
//!    ([`crate::analysis::update_similarity`]). Only exact values are
//!    reported: the `max_pairs` most similar (a store of a thousand copies
//!    of one adapter has half a million alike pairs); every pair found is
//!    counted. Pairs are held as indices until those few are named.
//!
//! The margin is `max(4·(1 − threshold), 0.25)`: with `side = 32` (1,024
//! sketch values) the sketch cosine of unrelated updates has a spread of a
//! few hundredths, and a pair whose true cosine is `c` has a sketch
//! distance `1 − ĉ` that exceeds `(1 − c)` by a factor of 4 only with a
//! vanishing probability, so a pair at or above the threshold is all but
//! never screened out. `exhaustive` skips the screen and computes every
//! pair of a group exactly, for when "all but never" is not enough.
//!
//! Adapters that cannot be read, hold non-finite values or have a zero
//! update are skipped with the reason; they never abort the search.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use nalgebra::{DMatrixView, DMatrixViewMut};
use rayon::prelude::*;

use crate::analysis::adapter_weights::{
    read_adapter_factors, stream_adapter_factors, AdapterFactors, FactorFile, ModuleFactors,
    ModuleSource,
};
use crate::analysis::layers::{ADAPTER_WEIGHTS, PICKLED_ADAPTER_WEIGHTS};
use crate::analysis::update_similarity::{compare_adapters, UpdateComparison};
use crate::error::{Area, Error, Result};
use crate::io::walk::files_under;
use crate::store::layout;

/// Sketch buckets per side (the sketch holds `SKETCH_SIDE²` values).
pub const SKETCH_SIDE: usize = 32;
/// Factor bytes held at once in the exact pass before it reads per pair.
const EXACT_CACHE_BYTES: usize = 256 << 20;
/// Pairs reported by default: the most similar ones; the others are
/// counted in [`SimilarReport::pairs_found`]. (The binding's signature
/// spells it as a literal, which stubtest reads.)
pub const DEFAULT_MAX_PAIRS: usize = 10_000;

/// Two adapters whose updates are alike.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct SimilarPair {
    pub a: PathBuf,
    pub b: PathBuf,
    pub similarity: f64,
}

/// An adapter left out of the search, and why.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedAdapter {
    pub path: PathBuf,
    pub reason: String,
}

/// The outcome of one search.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct SimilarReport {
    /// Pairs at or above the threshold, most similar first: at most
    /// `max_pairs` of them.
    pub pairs: Vec<SimilarPair>,
    /// Pairs at or above the threshold, reported or not.
    pub pairs_found: u64,
    /// The cap on `pairs` (the search's `max_pairs`).
    pub max_pairs: u64,
    /// Adapters read and sketched.
    pub adapters: u64,
    /// Groups of adapters with the same modules and shapes.
    pub groups: u64,
    /// Pairs within groups (the pairs that could be alike).
    pub pairs_considered: u64,
    /// Pairs computed exactly.
    pub pairs_exact: u64,
    pub skipped: Vec<SkippedAdapter>,
    pub threshold: f64,
    pub exhaustive: bool,
    /// Adapters found but not compared: checkpoints of a run whose final
    /// (or newest) adapter stood for it (`runs::one_per_run`).
    pub left_out: u64,
}

/// What pass 1 keeps of one adapter.
struct Sketched {
    path: PathBuf,
    /// (module name, in, out) of every module, in order.
    signature: Vec<(String, usize, usize)>,
    /// The sketch, scaled to unit norm.
    unit: Vec<f64>,
    bytes: usize,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a module name: the seed of its sketch maps.
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// (bucket, sign) of index `i` under the map seeded `seed`.
fn bucket(seed: u64, i: usize, side: usize) -> (usize, f64) {
    let h = splitmix(seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
    ((h as usize) % side, sign)
}

/// Values per read in pass 1: small buffers, reused from module to module.
const SKETCH_CHUNK: usize = 1 << 15;

/// The two CountSketch maps' seeds of the module named `name`.
fn module_seeds(name: &str) -> (u64, u64) {
    let seed = name_seed(name);
    (splitmix(seed), splitmix(seed ^ 0x5555))
}

/// `P += Cₒ·s·B` over rows `row0..row0 + rows` of B (values row-major,
/// rows × r); P is side × r.
fn sketch_b_rows(p: &mut [f64], seed_out: u64, row0: usize, vals: &[f64], r: usize, scale: f64) {
    let side = p.len() / r.max(1);
    for (o, row) in vals.chunks_exact(r.max(1)).enumerate() {
        let (k, sign) = bucket(seed_out, row0 + o, side);
        let sign = sign * scale;
        for (acc, &v) in p[k * r..(k + 1) * r].iter_mut().zip(row) {
            *acc += sign * v;
        }
    }
}

/// `Q += A·Cᵢᵀ` over `w` columns of A (values row-major, r × w); Q is
/// r × side, `maps` the (bucket, sign) of each of those columns.
fn sketch_a_columns(q: &mut [f64], maps: &[(usize, f64)], w: usize, vals: &[f64]) {
    if w == 0 || maps.len() != w {
        return;
    }
    let r = vals.len() / w;
    let side = q.len() / r.max(1);
    for (k, row) in vals.chunks_exact(w).enumerate() {
        let qk = &mut q[k * side..(k + 1) * side];
        for (&v, &(j, sign)) in row.iter().zip(maps) {
            qk[j] += sign * v;
        }
    }
}

/// `Z += P·Q` (side × r times r × side), all row-major. Read column-major,
/// the same buffers are `Zᵀ`, `Pᵀ` and `Qᵀ`, so this is `Zᵀ += Qᵀ·Pᵀ`,
/// one GEMM (nalgebra's, which picks the CPU's widest vector unit).
fn add_product(z: &mut [f64], p: &[f64], q: &[f64], r: usize, side: usize) {
    if r == 0 || p.len() != side * r || q.len() != r * side || z.len() != side * side {
        return;
    }
    let pt = DMatrixView::from_slice(p, r, side);
    let qt = DMatrixView::from_slice(q, side, r);
    let mut zt = DMatrixViewMut::from_slice(z, side, side);
    zt.gemm(1.0, &qt, &pt, 1.0);
}

/// The (bucket, sign) of columns `cols` (a block's: pass 1 never holds a
/// map as wide as the header says A is).
fn column_maps(
    seed_in: u64,
    cols: std::ops::Range<usize>,
    side: usize,
    maps: &mut Vec<(usize, f64)>,
) {
    maps.clear();
    maps.extend(cols.map(|i| bucket(seed_in, i, side)));
}

/// Add module `m`'s sketch `(Cₒ·s·B)·(A·Cᵢᵀ)` (side × side, row-major) to `z`.
pub fn add_module_sketch(m: &ModuleFactors, side: usize, z: &mut [f64]) {
    let r = m.rank;
    let (seed_out, seed_in) = module_seeds(&m.name);
    let mut p = vec![0.0; side * r];
    sketch_b_rows(&mut p, seed_out, 0, &m.b, r, m.scale);
    let mut q = vec![0.0; r * side];
    let mut maps = Vec::new();
    column_maps(seed_in, 0..m.in_features, side, &mut maps);
    sketch_a_columns(&mut q, &maps, m.in_features, &m.a);
    add_product(z, &p, &q, r, side);
}

/// Pass 1 for one adapter: its factors streamed once into the sketch.
fn sketch_adapter(path: &Path, side: usize, chunk: usize) -> std::result::Result<Sketched, String> {
    let mut z = vec![0.0; side * side];
    let mut signature = Vec::new();
    let (mut bytes, mut nonzero) = (0usize, false);
    let mut bad: Option<String> = None;
    let (mut p, mut q, mut maps) = (Vec::new(), Vec::new(), Vec::new());
    stream_adapter_factors(path, chunk, |m, stream| {
        let r = m.rank;
        let (seed_out, seed_in) = module_seeds(&m.name);
        p.clear();
        p.resize(side * r, 0.0);
        let mb = stream
            .b_rows(|row0, _, vals| sketch_b_rows(&mut p, seed_out, row0, vals, r, m.scale))?;
        q.clear();
        q.resize(r * side, 0.0);
        let ma = stream.a_columns(|col0, w, vals| {
            column_maps(seed_in, col0..col0 + w, side, &mut maps);
            sketch_a_columns(&mut q, &maps, w, vals);
        })?;
        if ma.nonfinite + mb.nonfinite > 0 && bad.is_none() {
            bad = Some(format!(
                "module {:?} has {} non-finite values",
                m.name,
                ma.nonfinite + mb.nonfinite
            ));
        }
        nonzero |= ma.sum_sq > 0.0 && mb.sum_sq > 0.0;
        add_product(&mut z, &p, &q, r, side);
        signature.push((m.name.clone(), m.in_features, m.out_features));
        bytes += r * (m.in_features + m.out_features) * std::mem::size_of::<f64>();
        Ok(())
    })
    .map_err(|e| e.message)?;
    if let Some(reason) = bad {
        return Err(reason);
    }
    if signature.is_empty() {
        return Err("no LoRA modules".into());
    }
    if !nonzero {
        return Err("its update is zero (lora_B or lora_A is all zeros)".into());
    }
    let norm = z.iter().map(|v| v * v).sum::<f64>().sqrt();
    if !(norm > 0.0 && norm.is_finite()) {
        return Err("its update sketch is zero or overflows".into());
    }
    z.iter_mut().for_each(|v| *v /= norm);
    Ok(Sketched {
        path: path.to_path_buf(),
        signature,
        unit: z,
        bytes,
    })
}

/// Adapters under `root` (up to the walk's depth), sorted: directories
/// holding `adapter_model.safetensors` or `adapter_model.bin` (PEFT) or
/// `adapters.safetensors` (mlx-lm), and LoRA files of other tools (kohya,
/// LyCORIS, diffusers: see `layout::is_lora_file`), each file an adapter.
pub fn find_adapters(root: &Path) -> Result<Vec<PathBuf>> {
    use crate::formats::mlx_config::MLX_WEIGHTS;
    if !root.is_dir() {
        return Err(Error::new(Area::Missing, root, "is not a directory"));
    }
    let files = files_under(root, Area::Missing, |n| {
        n == ADAPTER_WEIGHTS || n == PICKLED_ADAPTER_WEIGHTS || n.ends_with(".safetensors")
    })?;
    let mut found: Vec<PathBuf> = Vec::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let Some(dir) = f.parent() else { continue };
        if name == ADAPTER_WEIGHTS || name == PICKLED_ADAPTER_WEIGHTS {
            found.push(dir.to_path_buf());
        } else if name == MLX_WEIGHTS {
            if layout::is_mlx_dir(dir) {
                found.push(dir.to_path_buf());
            }
        } else if dir.join(ADAPTER_WEIGHTS).is_file() || layout::is_mlx_dir(dir) {
            // A PEFT or mlx-lm adapter's folder: its own file is the adapter.
        } else if layout::is_lora_file(&f) {
            found.push(f);
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// [`similar_pairs`] over the adapters found under `root`: one per run
/// (see `runs`), or every checkpoint too with `all_checkpoints`.
pub fn similar_under(
    root: &Path,
    threshold: f64,
    exhaustive: bool,
    max_pairs: usize,
    all_checkpoints: bool,
) -> Result<SimilarReport> {
    let found = find_adapters(root)?;
    let (chosen, left_out) = if all_checkpoints {
        (found, 0)
    } else {
        runs::one_per_run(found)
    };
    let mut report = similar_pairs(&chosen, threshold, exhaustive, max_pairs)?;
    report.left_out = left_out;
    Ok(report)
}

/// Every pair of `adapters` (directories or safetensors files) whose
/// similarity is at least `threshold` (see the module doc); the
/// `max_pairs` most similar are reported, all are counted.
pub fn similar_pairs(
    adapters: &[PathBuf],
    threshold: f64,
    exhaustive: bool,
    max_pairs: usize,
) -> Result<SimilarReport> {
    similar_pairs_with(
        adapters,
        threshold,
        exhaustive,
        max_pairs,
        EXACT_CACHE_BYTES,
    )
}

pub(crate) fn similar_pairs_with(
    adapters: &[PathBuf],
    threshold: f64,
    exhaustive: bool,
    max_pairs: usize,
    cache_bytes: usize,
) -> Result<SimilarReport> {
    if !(-1.0..=1.0).contains(&threshold) {
        return Err(Error::new(
            Area::Usage,
            "",
            format!("the similarity threshold must lie in [-1, 1], got {threshold}"),
        ));
    }
    let side = SKETCH_SIDE;
    let read: Vec<std::result::Result<Sketched, String>> = adapters
        .par_iter()
        .map(|p| sketch_adapter(p, side, SKETCH_CHUNK))
        .collect();
    let mut sketched = Vec::new();
    let mut skipped = Vec::new();
    for (p, r) in adapters.iter().zip(read) {
        match r {
            Ok(s) => sketched.push(s),
            Err(reason) => skipped.push(SkippedAdapter {
                path: p.clone(),
                reason,
            }),
        }
    }
    let mut groups: BTreeMap<&[(String, usize, usize)], Vec<usize>> = BTreeMap::new();
    for (i, s) in sketched.iter().enumerate() {
        groups.entry(&s.signature).or_default().push(i);
    }
    let margin = (4.0 * (1.0 - threshold)).max(0.25);
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    let mut pairs_considered = 0u64;
    for members in groups.values() {
        let n = members.len() as u64;
        pairs_considered += n * n.saturating_sub(1) / 2;
        let found: Vec<(usize, usize)> = members
            .par_iter()
            .enumerate()
            .flat_map_iter(|(pos, &i)| {
                let unit = &sketched[i].unit;
                let sketched = &sketched;
                members[pos + 1..].iter().filter_map(move |&j| {
                    let c: f64 = unit.iter().zip(&sketched[j].unit).map(|(x, y)| x * y).sum();
                    (exhaustive || c >= threshold - margin).then_some((i, j))
                })
            })
            .collect();
        candidates.extend(found);
    }
    let (mut found, lost) = exact_pairs(&sketched, &candidates, threshold, cache_bytes);
    skipped.extend(lost);
    let by_similarity = |x: &Found, y: &Found| {
        let path = |p: &Found| (&sketched[p.0].path, &sketched[p.1].path);
        y.2.total_cmp(&x.2).then_with(|| path(x).cmp(&path(y)))
    };
    let pairs_found = found.len() as u64;
    if found.len() > max_pairs {
        found.select_nth_unstable_by(max_pairs, by_similarity);
        found.truncate(max_pairs);
    }
    found.sort_by(by_similarity);
    let pairs = found
        .into_iter()
        .map(|(i, j, similarity)| SimilarPair {
            a: sketched[i].path.clone(),
            b: sketched[j].path.clone(),
            similarity,
        })
        .collect();
    Ok(SimilarReport {
        pairs,
        pairs_found,
        max_pairs: max_pairs as u64,
        adapters: sketched.len() as u64,
        groups: groups.len() as u64,
        pairs_considered,
        pairs_exact: candidates.len() as u64,
        skipped,
        threshold,
        exhaustive,
        left_out: 0,
    })
}

/// A pair found alike: the two adapters' indices and their similarity.
type Found = (usize, usize, f64);
/// The adapters of a pair that could not be read (indices), with why.
type Lost = Vec<(usize, String)>;

/// Exact similarities of the candidate pairs, kept as `(i, j, similarity)`
/// only when at or above `threshold` (so a store of copies holds its pairs
/// once, as indices). Adapters are read once when they fit in
/// `cache_bytes`, else each pair's two are read per pair, one module at a
/// time. An adapter that cannot be read again (it changed since pass 1) is
/// skipped.
fn exact_pairs(
    sketched: &[Sketched],
    candidates: &[(usize, usize)],
    threshold: f64,
    cache_bytes: usize,
) -> (Vec<Found>, Vec<SkippedAdapter>) {
    let involved: BTreeSet<usize> = candidates.iter().flat_map(|&(i, j)| [i, j]).collect();
    let bytes: usize = involved.iter().map(|&i| sketched[i].bytes).sum();
    let keep = |i: usize, j: usize, c: UpdateComparison| {
        (c.similarity >= threshold).then_some((i, j, c.similarity))
    };
    let mut failed: BTreeMap<usize, String> = BTreeMap::new();
    let pairs = if bytes <= cache_bytes {
        let mut loaded: BTreeMap<usize, AdapterFactors> = BTreeMap::new();
        let results: Vec<(usize, Result<AdapterFactors>)> = involved
            .par_iter()
            .map(|&i| (i, read_adapter_factors(&sketched[i].path)))
            .collect();
        for (i, r) in results {
            match r {
                Ok(f) => {
                    loaded.insert(i, f);
                }
                Err(e) => {
                    failed.insert(i, e.message);
                }
            }
        }
        candidates
            .par_iter()
            .filter_map(|&(i, j)| {
                let c = compare_adapters(loaded.get(&i)?, loaded.get(&j)?, false).ok()?;
                keep(i, j, c)
            })
            .collect()
    } else {
        let open = |i: usize| FactorFile::open(&sketched[i].path).map_err(|e| (i, e.message));
        let results: Vec<std::result::Result<Option<Found>, Lost>> = candidates
            .par_iter()
            .map(|&(i, j)| {
                let (x, y) = match (open(i), open(j)) {
                    (Ok(x), Ok(y)) => (x, y),
                    (x, y) => return Err([x.err(), y.err()].into_iter().flatten().collect()),
                };
                let c = compare_adapters(&x, &y, false).map_err(|e| {
                    // A module that cannot be read names its file; the other
                    // adapter is then read alone, one module at a time, so
                    // that its own failure is named too (else it would go
                    // unnamed when this was its only pair).
                    let (side, other, k) = if e.path == x.path() {
                        (i, &y, j)
                    } else {
                        (j, &x, i)
                    };
                    let mut lost = vec![(side, e.message)];
                    if let Err(e) =
                        (0..other.shapes().len()).try_for_each(|m| other.module(m).map(drop))
                    {
                        lost.push((k, e.message));
                    }
                    lost
                })?;
                Ok(keep(i, j, c))
            })
            .collect();
        let mut pairs = Vec::new();
        for r in results {
            match r {
                Ok(p) => pairs.extend(p),
                Err(lost) => failed.extend(lost),
            }
        }
        pairs
    };
    let skipped = failed
        .into_iter()
        .map(|(i, m)| SkippedAdapter {
            path: sketched[i].path.clone(),
            reason: format!("could not be read again for the exact pass: {m}"),
        })
        .collect();
    (pairs, skipped)
}

mod runs;

#[cfg(test)]
mod tests;
