//! How alike two LoRA updates are, computed from the factors alone.
//!
//! Why: retrains, seed sweeps and copies of an adapter are compared by their
//! updates `ΔW = s·B·A` (out × in), which are far too large to form for a
//! whole store. Every quantity here lives in r×r space:
//!
//! - `⟨B₁A₁, B₂A₂⟩_F = tr((B₁ᵀB₂)(A₂A₁ᵀ)) = Σᵢⱼ (B₁ᵀB₂)ᵢⱼ·(A₁A₂ᵀ)ᵢⱼ`, which
//!   costs `r₁·r₂·(in + out)` instead of `out·in·(r₁ + r₂)`; ranks may
//!   differ, shapes may not;
//! - `‖BA‖_F² = Σ (BᵀB)∘(AAᵀ)` the same way;
//! - the module's cosine `⟨ΔW₁, ΔW₂⟩ / (‖ΔW₁‖·‖ΔW₂‖)` (scales included, so a
//!   negative scale flips the sign);
//! - the adapter's similarity: the cosine of the whole update over the
//!   modules both adapters have with the same shape, i.e. the module cosines
//!   weighted by energy, `Σ ‖ΔW₁ₘ‖‖ΔW₂ₘ‖·cosₘ / √(Σ‖ΔW₁ₘ‖²·Σ‖ΔW₂ₘ‖²)`, which
//!   lies in [-1, 1];
//! - the principal angles between the column spaces of `ΔW₁` and `ΔW₂`:
//!   `B = QR` (thin), the left singular vectors of `R·A` with
//!   `σ > 1e-6·σ_max` give an orthonormal basis `U` of `col(ΔW)`, and the
//!   angles are the arc-cosines of the singular values of `U₁ᵀU₂`.
//!
//! Decisions: modules are matched by PEFT name and must have the same
//! (in, out); the others are listed as left out with the reason. A module
//! with non-finite factors has no cosine and is left out of the combined
//! similarity; a zero update (B never trained) has no cosine but counts in
//! the energies (it makes two adapters less alike). Pure computation over a
//! [`ModuleSource`]: this room never finds or walks a store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use nalgebra::DMatrix;

use crate::analysis::adapter_weights::{ModuleFactors, ModuleShape, ModuleSource};
use crate::error::Result;

/// Relative cut under which a singular value of ΔW is not part of its
/// column space.
const SPAN_CUT: f64 = 1e-6;

/// The comparison of one module present in both adapters.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleSimilarity {
    pub module: String,
    pub layer: Option<u64>,
    pub rank_a: usize,
    pub rank_b: usize,
    pub in_features: usize,
    pub out_features: usize,
    /// ‖ΔW‖_F of each side (scale included).
    pub norm_a: f64,
    pub norm_b: f64,
    /// ⟨ΔW_a, ΔW_b⟩_F.
    pub inner: f64,
    /// inner / (norm_a·norm_b); NaN when a side is zero or not finite.
    pub cosine: f64,
    /// Principal angles between the column spaces, in degrees, ascending;
    /// empty when a side is zero or not finite.
    pub principal_angles_deg: Vec<f64>,
}

/// A module that is not compared, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    pub module: String,
    pub reason: String,
}

/// Two adapters compared module by module.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateComparison {
    pub path_a: PathBuf,
    pub path_b: PathBuf,
    /// Energy-weighted cosine over the shared finite modules, in [-1, 1];
    /// NaN when nothing is shared or either side's shared update is zero.
    pub similarity: f64,
    /// Shared modules, in adapter A's order (layer, name).
    pub modules: Vec<ModuleSimilarity>,
    pub left_out: Vec<LeftOut>,
    /// Σ‖ΔW‖² over the modules that entered `similarity`.
    pub energy_a: f64,
    pub energy_b: f64,
    /// Whether both adapters had a config (else scales are taken as 1).
    pub scaled: bool,
}

/// `M = Xᵀ·Y` for X (rows × p) and Y (rows × q), both row-major: p × q,
/// row-major.
pub fn cross_columns(x: &[f64], p: usize, y: &[f64], q: usize, rows: usize) -> Vec<f64> {
    let mut m = vec![0.0; p * q];
    if p == 0 || q == 0 {
        return m;
    }
    for (xr, yr) in x.chunks_exact(p).zip(y.chunks_exact(q)).take(rows) {
        for (i, &xi) in xr.iter().enumerate() {
            if xi == 0.0 {
                continue;
            }
            let row = &mut m[i * q..(i + 1) * q];
            for (acc, &yj) in row.iter_mut().zip(yr) {
                *acc += xi * yj;
            }
        }
    }
    m
}

/// `N = X·Yᵀ` for X (p × cols) and Y (q × cols), both row-major: p × q,
/// row-major.
pub fn cross_rows(x: &[f64], p: usize, y: &[f64], q: usize, cols: usize) -> Vec<f64> {
    let mut n = vec![0.0; p * q];
    if cols == 0 {
        return n;
    }
    for (i, xr) in x.chunks_exact(cols).take(p).enumerate() {
        for (j, yr) in y.chunks_exact(cols).take(q).enumerate() {
            n[i * q + j] = dot(xr, yr);
        }
    }
    n
}

/// Dot product with four accumulators (independent chains vectorise).
fn dot(x: &[f64], y: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (xc, xt) = x.split_at(x.len() - x.len() % 4);
    let (yc, yt) = y.split_at(xc.len().min(y.len()));
    for (a, b) in xc.chunks_exact(4).zip(yc.chunks_exact(4)) {
        for k in 0..4 {
            acc[k] += a[k] * b[k];
        }
    }
    let tail: f64 = xt.iter().zip(yt).map(|(a, b)| a * b).sum();
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// `⟨B₁A₁, B₂A₂⟩_F` (scales not applied) in r₁×r₂ space. Both modules must
/// have the same (in, out).
pub fn factor_inner(x: &ModuleFactors, y: &ModuleFactors) -> f64 {
    let m = cross_columns(&x.b, x.rank, &y.b, y.rank, x.out_features);
    let n = cross_rows(&x.a, x.rank, &y.a, y.rank, x.in_features);
    m.iter().zip(&n).map(|(p, q)| p * q).sum()
}

/// `‖B·A‖_F²` (scale not applied), never negative.
pub fn factor_energy(x: &ModuleFactors) -> f64 {
    factor_inner(x, x).max(0.0)
}

/// Whether two modules can be compared: same (in, out).
pub fn same_shape(x: &ModuleShape, y: &ModuleShape) -> bool {
    x.in_features == y.in_features && x.out_features == y.out_features
}

/// Compare one module of each adapter (same shape required).
pub fn compare_modules(x: &ModuleFactors, y: &ModuleFactors, angles: bool) -> ModuleSimilarity {
    let finite = x.nonfinite == 0 && y.nonfinite == 0;
    let (norm_a, norm_b, inner) = if finite {
        (
            x.scale.abs() * factor_energy(x).sqrt(),
            y.scale.abs() * factor_energy(y).sqrt(),
            x.scale * y.scale * factor_inner(x, y),
        )
    } else {
        (f64::NAN, f64::NAN, f64::NAN)
    };
    let defined = finite && norm_a > 0.0 && norm_b > 0.0;
    let cosine = if defined {
        (inner / (norm_a * norm_b)).clamp(-1.0, 1.0)
    } else {
        f64::NAN
    };
    let principal_angles_deg = if defined && angles {
        principal_angles(x, y)
    } else {
        Vec::new()
    };
    ModuleSimilarity {
        module: x.name.clone(),
        layer: x.layer,
        rank_a: x.rank,
        rank_b: y.rank,
        in_features: x.in_features,
        out_features: x.out_features,
        norm_a,
        norm_b,
        inner,
        cosine,
        principal_angles_deg,
    }
}

/// Compare two adapters over the modules they share (see the module doc),
/// reading one module pair at a time from each source.
pub fn compare_adapters<X, Y>(x: &X, y: &Y, angles: bool) -> Result<UpdateComparison>
where
    X: ModuleSource + ?Sized,
    Y: ModuleSource + ?Sized,
{
    let (ours, theirs) = (x.shapes(), y.shapes());
    let by_name: BTreeMap<&str, usize> = theirs
        .iter()
        .enumerate()
        .map(|(k, m)| (m.name, k))
        .collect();
    let mut modules = Vec::new();
    let mut left_out = Vec::new();
    let (mut inner, mut energy_a, mut energy_b) = (0.0, 0.0, 0.0);
    for (kx, ix) in ours.iter().enumerate() {
        let Some(&ky) = by_name.get(ix.name) else {
            left_out.push(LeftOut {
                module: ix.name.to_string(),
                reason: "only in A".into(),
            });
            continue;
        };
        let iy = &theirs[ky];
        if !same_shape(ix, iy) {
            left_out.push(LeftOut {
                module: ix.name.to_string(),
                reason: format!(
                    "shapes differ: A is {}x{}, B is {}x{} (out x in)",
                    ix.out_features, ix.in_features, iy.out_features, iy.in_features
                ),
            });
            continue;
        }
        let (mx, my) = (x.module(kx)?, y.module(ky)?);
        let s = compare_modules(&mx, &my, angles);
        if s.inner.is_finite() && s.norm_a.is_finite() && s.norm_b.is_finite() {
            inner += s.inner;
            energy_a += s.norm_a * s.norm_a;
            energy_b += s.norm_b * s.norm_b;
        } else {
            left_out.push(LeftOut {
                module: ix.name.to_string(),
                reason: "non-finite values in a factor".into(),
            });
        }
        modules.push(s);
    }
    let names: BTreeSet<&str> = ours.iter().map(|m| m.name).collect();
    for iy in &theirs {
        if !names.contains(iy.name) {
            left_out.push(LeftOut {
                module: iy.name.to_string(),
                reason: "only in B".into(),
            });
        }
    }
    let similarity = if energy_a > 0.0 && energy_b > 0.0 {
        (inner / (energy_a * energy_b).sqrt()).clamp(-1.0, 1.0)
    } else {
        f64::NAN
    };
    Ok(UpdateComparison {
        path_a: x.path().to_path_buf(),
        path_b: y.path().to_path_buf(),
        similarity,
        modules,
        left_out,
        energy_a,
        energy_b,
        scaled: x.has_config() && y.has_config(),
    })
}

/// Sweeps an SVD may take before it is given up (nalgebra's `0` means
/// "until convergence", which factors near the float range never reach).
const MAX_SVD_ITERATIONS: usize = 10_000;

/// `m` divided by its largest magnitude (its column space unchanged), or
/// None when that is not a finite positive number.
fn unit_scaled(m: DMatrix<f64>) -> Option<DMatrix<f64>> {
    let top = m.amax();
    (top.is_finite() && top > 0.0).then(|| m / top)
}

/// Orthonormal basis (out × k) of the column space of B·A. Each factor is
/// scaled to a largest magnitude of 1 first, so factors near the float
/// range (1e155) neither overflow nor keep the SVD from converging.
fn column_basis(m: &ModuleFactors) -> Option<DMatrix<f64>> {
    let b = unit_scaled(DMatrix::from_row_slice(m.out_features, m.rank, &m.b))?;
    let a = unit_scaled(DMatrix::from_row_slice(m.rank, m.in_features, &m.a))?;
    let qr = b.qr();
    let (q, r) = (qr.q(), qr.r());
    let product = unit_scaled(r * a)?;
    let svd = product.try_svd(true, false, f64::EPSILON, MAX_SVD_ITERATIONS)?;
    let u = svd.u?;
    let top = svd.singular_values.iter().copied().fold(0.0, f64::max);
    let keep: Vec<usize> = (0..svd.singular_values.len())
        .filter(|&i| svd.singular_values[i] > SPAN_CUT * top)
        .collect();
    if keep.is_empty() {
        return None;
    }
    Some(q * u.select_columns(keep.iter()))
}

/// Principal angles (degrees, ascending) between col(ΔW_x) and col(ΔW_y).
pub fn principal_angles(x: &ModuleFactors, y: &ModuleFactors) -> Vec<f64> {
    let (Some(ux), Some(uy)) = (column_basis(x), column_basis(y)) else {
        return Vec::new();
    };
    let c = ux.transpose() * uy;
    if !c.iter().all(|v| v.is_finite()) {
        return Vec::new();
    }
    let Some(svd) = c.try_svd(false, false, f64::EPSILON, MAX_SVD_ITERATIONS) else {
        return Vec::new();
    };
    let mut deg: Vec<f64> = svd
        .singular_values
        .iter()
        .map(|&s| s.clamp(-1.0, 1.0).acos().to_degrees())
        .collect();
    deg.sort_unstable_by(f64::total_cmp);
    deg
}

#[cfg(test)]
mod tests;
