//! LyCORIS LoHa and LoKr modules: their update `ΔW` written as one
//! low-rank product `B'·A'`, so the LoRA statistics, `compare` and
//! `similar` judge them by the same code as a `lora_up·lora_down` pair.
//!
//! Why a product and not the dense `ΔW`: the product is exact, its size is
//! bounded by the factors (not by out × in), and every reader of factors
//! already takes one.
//!
//! - LoHa (`hada_w1_a` out × r₁, `hada_w1_b` r₁ × in, `hada_w2_a`,
//!   `hada_w2_b` likewise with r₂): LyCORIS applies
//!   `ΔW = s·(w1a·w1b) ⊙ (w2a·w2b)`. A Hadamard product of a rank-r₁ and a
//!   rank-r₂ product is the rank-(r₁·r₂) product whose columns are
//!   `w1a[:, i] ⊙ w2a[:, j]` and rows `w1b[i, :] ⊙ w2b[j, :]`.
//! - LoKr (`lokr_w1` a × c or `lokr_w1_a`·`lokr_w1_b`, `lokr_w2` b × d or
//!   `lokr_w2_a`·`lokr_w2_b`): `ΔW = s·kron(W1, W2)`. With `W = U·V` for
//!   each half (a full half is `I·W` or `W·I`, whichever is narrower),
//!   `kron(U₁V₁, U₂V₂) = kron(U₁, U₂)·kron(V₁, V₂)` (mixed product).
//! - The scale is LyCORIS's: `alpha / r` with `r` the rows of `hada_w1_b`
//!   (LoHa) or the columns of `lokr_w1_a`, else of `lokr_w2_a` (LoKr);
//!   `alpha` missing or 0 means `alpha = r`; a LoKr module whose two halves
//!   are both full matrices has scale 1 (LyCORIS sets alpha to its rank).
//!   (`get_diff_weight()` of lycoris-lora 4.1 multiplies by the scale a
//!   second time; the forward pass and the saved-file loaders of kohya and
//!   ComfyUI apply it once, which is the update judged here.)
//! - Conv modules are judged as their weight flattened to out × (in·kh·kw),
//!   as for kohya's conv LoRA. The Tucker variants (`hada_t1`/`hada_t2`,
//!   `lokr_t1`/`lokr_t2`) are not formed: their modules are read as plain
//!   tensors and named, with the reason, in the report.
//! - The product's rank `r₁·r₂` (LoHa) or `k₁·k₂` (LoKr) is capped at the
//!   LoRA rank cap, and its factors at the module value cap; past either the
//!   module is not formed, and says so.

use std::path::Path;

use nalgebra::DMatrixView;

use super::factors::{read_all, ModuleFactors, MAX_MODULE_VALUES};
use super::stats::{spectral_stats, SpectralInput};
use super::{LoraModuleStats, MAX_RANK};

/// The largest rank of a composed update that is formed. A LoHa of dim r
/// composes to rank r², judged through an r² x r² eigenproblem per module:
/// at dim 16 (256) a module costs about 40 ms, at dim 32 (1024) about
/// 1.5 s, which would make a 700-module SDXL LoHa take minutes to scan.
/// Past it the module is named, with why, and its tensors read as plain
/// ones.
pub const MAX_COMPOSED_RANK: u64 = 256;
const _: () = assert!(MAX_COMPOSED_RANK <= MAX_RANK);
use crate::analysis::attribution::layer_number;
use crate::error::{Area, Error, Result};
use crate::formats::safetensors_header::TensorInfo;
use crate::formats::tensor_data::{moments_of, FloatTensor, Moments, TensorReader};
use crate::io::claims::claimed_vec;

/// The method of a composed module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    LoHa,
    LoKr,
}

impl Method {
    /// The module kind records carry.
    pub(super) fn kind(self) -> &'static str {
        match self {
            Method::LoHa => "loha",
            Method::LoKr => "lokr",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Method::LoHa => "LoHa",
            Method::LoKr => "LoKr",
        }
    }
}

/// One half of a LoKr update: a full matrix, or `a·b`.
#[derive(Debug, Clone)]
pub(super) enum Half {
    Full(FloatTensor),
    Product(FloatTensor, FloatTensor),
}

impl Half {
    /// (rows, inner rank, cols) of the half as `U·V`.
    fn dims(&self) -> (u64, u64, u64) {
        match self {
            Half::Full(w) => {
                let (m, n) = (w.shape[0], w.shape[1]);
                (m, m.min(n), n)
            }
            Half::Product(a, b) => (a.shape[0], a.shape[1], b.shape[1]),
        }
    }
    fn tensors(&self) -> Vec<&FloatTensor> {
        match self {
            Half::Full(w) => vec![w],
            Half::Product(a, b) => vec![a, b],
        }
    }
}

/// The factors of a composed module, as matrices (conv factors flattened).
#[derive(Debug, Clone)]
pub(super) enum Parts {
    /// `(w1a, w1b, w2a, w2b)`.
    LoHa([FloatTensor; 4]),
    LoKr(Half, Half),
}

/// A LoHa or LoKr module whose update can be formed.
#[derive(Debug, Clone)]
pub(super) struct ComposedPlan {
    pub(super) name: String,
    pub(super) layer: Option<u64>,
    pub(super) method: Method,
    pub(super) parts: Parts,
    /// Rank of the product `B'·A'` (a bound on ΔW's rank).
    pub(super) rank: u64,
    pub(super) in_features: u64,
    pub(super) out_features: u64,
    /// The rank LyCORIS was set up with (`alpha / dim` is the scale).
    pub(super) dim: u64,
    pub(super) alpha: f64,
    pub(super) scale: f64,
}

/// What planning one module gives: a plan, or why its update is not formed.
pub(super) enum Planned {
    Formed(Box<ComposedPlan>),
    Unformed(String),
}

/// `t` as a matrix: its first dimension by the product of the rest.
fn as_matrix(t: FloatTensor) -> std::result::Result<FloatTensor, String> {
    if t.shape.len() == 2 {
        return Ok(t);
    }
    if t.shape.len() < 2 {
        return Err(format!(
            "{:?} has shape {:?}, not a matrix",
            t.name, t.shape
        ));
    }
    let rest = t.shape[1..]
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("{:?} has too large a shape", t.name))?;
    let shape = vec![t.shape[0], rest];
    Ok(FloatTensor { shape, ..t })
}

/// The scale LyCORIS applies for `alpha` (None: no alpha tensor) at rank `r`.
fn lycoris_scale(alpha: Option<f64>, r: u64) -> (f64, f64) {
    let r = r as f64;
    let alpha = match alpha {
        Some(a) if a != 0.0 => a,
        _ => r,
    };
    (alpha, alpha / r)
}

/// Plan the module `name` of `method` from its tensors (`suffix`, header
/// entry; suffixes such as `.hada_w1_a`) and its `alpha`. A malformed
/// module (missing factor, shapes that do not chain) is an error; a valid
/// one this reader does not form (Tucker, too large) is `Unformed`.
pub(super) fn plan_module(
    read: &dyn Fn(&TensorInfo) -> Result<FloatTensor>,
    name: &str,
    method: Method,
    tensors: &[(&str, &TensorInfo)],
    alpha: Option<f64>,
) -> Result<std::result::Result<Planned, String>> {
    let get = |suffix: &str| tensors.iter().find(|(s, _)| *s == suffix).map(|(_, t)| *t);
    let label = method.label();
    let tucker: Vec<&str> = tensors
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| matches!(*s, ".hada_t1" | ".hada_t2" | ".lokr_t1" | ".lokr_t2"))
        .collect();
    if !tucker.is_empty() {
        return Ok(Ok(Planned::Unformed(format!(
            "{label} with Tucker conv factors ({}): its update is not formed",
            tucker.join(", ").replace('.', "")
        ))));
    }
    let need = |suffix: &str| -> std::result::Result<&TensorInfo, String> {
        get(suffix).ok_or_else(|| {
            format!(
                "{label} module {name:?} has no {}",
                suffix.trim_start_matches('.')
            )
        })
    };
    let matrix = |info: &TensorInfo| -> Result<std::result::Result<FloatTensor, String>> {
        Ok(as_matrix(read(info)?).map_err(|e| format!("{label} module {name:?}: {e}")))
    };
    macro_rules! tri {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(msg) => return Ok(Err(msg)),
            }
        };
    }
    let chain = |what: &str, x: u64, y: u64| -> std::result::Result<(), String> {
        if x == y {
            Ok(())
        } else {
            Err(format!(
                "{label} module {name:?}: {what} do not chain ({x} vs {y})"
            ))
        }
    };
    let (parts, rank, in_features, out_features, dim, alpha, scale) = match method {
        Method::LoHa => {
            let w1a = tri!(matrix(tri!(need(".hada_w1_a")))?);
            let w1b = tri!(matrix(tri!(need(".hada_w1_b")))?);
            let w2a = tri!(matrix(tri!(need(".hada_w2_a")))?);
            let w2b = tri!(matrix(tri!(need(".hada_w2_b")))?);
            let (out, r1) = (w1a.shape[0], w1a.shape[1]);
            let (r2, inp) = (w2b.shape[0], w2b.shape[1]);
            tri!(chain(
                "hada_w1_a's columns and hada_w1_b's rows",
                r1,
                w1b.shape[0]
            ));
            tri!(chain(
                "hada_w2_a's columns and hada_w2_b's rows",
                w2a.shape[1],
                r2
            ));
            tri!(chain("hada_w1_a's and hada_w2_a's rows", out, w2a.shape[0]));
            tri!(chain(
                "hada_w1_b's and hada_w2_b's columns",
                w1b.shape[1],
                inp
            ));
            let (alpha, scale) = lycoris_scale(alpha, r1);
            let rank = r1.saturating_mul(r2);
            (
                Parts::LoHa([w1a, w1b, w2a, w2b]),
                rank,
                inp,
                out,
                r1,
                alpha,
                scale,
            )
        }
        Method::LoKr => {
            let half =
                |full: &str, a: &str, b: &str| -> Result<std::result::Result<Half, String>> {
                    if let Some(w) = get(full) {
                        return Ok(matrix(w)?.map(Half::Full));
                    }
                    let (Some(ia), Some(ib)) = (get(a), get(b)) else {
                        return Ok(Err(format!(
                            "LoKr module {name:?} has neither {} nor both {} and {}",
                            full.trim_start_matches('.'),
                            a.trim_start_matches('.'),
                            b.trim_start_matches('.')
                        )));
                    };
                    let (ta, tb) = (matrix(ia)?, matrix(ib)?);
                    let (ta, tb) = match (ta, tb) {
                        (Ok(x), Ok(y)) => (x, y),
                        (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
                    };
                    if ta.shape[1] != tb.shape[0] {
                        return Ok(Err(format!(
                            "LoKr module {name:?}: {:?} {:?} and {:?} {:?} do not chain",
                            ta.name, ta.shape, tb.name, tb.shape
                        )));
                    }
                    Ok(Ok(Half::Product(ta, tb)))
                };
            let w1 = tri!(half(".lokr_w1", ".lokr_w1_a", ".lokr_w1_b")?);
            let w2 = tri!(half(".lokr_w2", ".lokr_w2_a", ".lokr_w2_b")?);
            let lora_dim = match (&w1, &w2) {
                (Half::Product(a, _), _) | (Half::Full(_), Half::Product(a, _)) => Some(a.shape[1]),
                (Half::Full(_), Half::Full(_)) => None,
            };
            let (alpha, scale) = match lora_dim {
                Some(r) => lycoris_scale(alpha, r),
                None => (alpha.unwrap_or(1.0), 1.0),
            };
            let ((a, k1, c), (b, k2, d)) = (w1.dims(), w2.dims());
            let overflow = || format!("LoKr module {name:?}: its shape overflows");
            let out = tri!(a.checked_mul(b).ok_or_else(overflow));
            let inp = tri!(c.checked_mul(d).ok_or_else(overflow));
            let dim = lora_dim.unwrap_or(1);
            (
                Parts::LoKr(w1, w2),
                k1.saturating_mul(k2),
                inp,
                out,
                dim,
                alpha,
                scale,
            )
        }
    };
    if rank == 0 || rank > MAX_COMPOSED_RANK {
        return Ok(Ok(Planned::Unformed(format!(
            "{label} whose update has rank up to {rank}, outside 1..={MAX_COMPOSED_RANK}: its \
             update is not formed (its spectrum would cost a rank-{rank} eigenproblem per module)"
        ))));
    }
    let values = rank.saturating_mul(in_features.saturating_add(out_features));
    if values > MAX_MODULE_VALUES {
        return Ok(Ok(Planned::Unformed(format!(
            "{label} whose update as a rank-{rank} product takes {values} values, more than the \
             {MAX_MODULE_VALUES} read at once: its update is not formed"
        ))));
    }
    Ok(Ok(Planned::Formed(Box::new(ComposedPlan {
        name: name.to_string(),
        layer: layer_number(name),
        method,
        parts,
        rank,
        in_features,
        out_features,
        dim,
        alpha,
        scale,
    }))))
}

impl ComposedPlan {
    /// The tensors on the input side (norm_a) and the output side (norm_b):
    /// LoHa's `hada_w*_b` and `hada_w*_a`, LoKr's W1 and W2 halves.
    pub(super) fn sides(&self) -> (Vec<&FloatTensor>, Vec<&FloatTensor>) {
        match &self.parts {
            Parts::LoHa([w1a, w1b, w2a, w2b]) => (vec![w1b, w2b], vec![w1a, w2a]),
            Parts::LoKr(w1, w2) => (w1.tensors(), w2.tensors()),
        }
    }

    /// Values the product's factors take (`rank·(in + out)`).
    pub(super) fn values(&self) -> u64 {
        self.rank
            .saturating_mul(self.in_features.saturating_add(self.out_features))
    }
}

/// A zeroed buffer of `n` values, bounded.
fn zeros(n: u64, what: &str, file: &Path) -> Result<Vec<f64>> {
    let mut v: Vec<f64> =
        claimed_vec(n, MAX_MODULE_VALUES, what).map_err(|e| Error::new(Area::Weights, file, e))?;
    v.resize(n as usize, 0.0);
    Ok(v)
}

/// A half `U·V` as row-major `U` (rows × k) and `V` (k × cols).
fn half_factors(
    reader: &mut TensorReader,
    half: &Half,
    file: &Path,
) -> Result<(Vec<f64>, Vec<f64>, Moments)> {
    let (rows, k, cols) = half.dims();
    match half {
        Half::Product(a, b) => {
            let (u, v) = (read_all(reader, a, file)?, read_all(reader, b, file)?);
            let mut m = moments_of(&u);
            m.merge(&moments_of(&v));
            Ok((u, v, m))
        }
        Half::Full(w) => {
            let values = read_all(reader, w, file)?;
            let m = moments_of(&values);
            let mut eye = zeros(k.saturating_mul(k), "an identity factor", file)?;
            for i in 0..k as usize {
                eye[i * k as usize + i] = 1.0;
            }
            if rows <= cols {
                Ok((eye, values, m))
            } else {
                Ok((values, eye, m))
            }
        }
    }
}

/// Row-major `kron(x, y)` of `x` (xr × xc) and `y` (yr × yc).
fn kron(x: &[f64], (xr, xc): (usize, usize), y: &[f64], (yr, yc): (usize, usize)) -> Vec<f64> {
    let cols = xc * yc;
    let mut out = vec![0.0; xr * yr * cols];
    for i in 0..xr {
        for j in 0..xc {
            let s = x[i * xc + j];
            for p in 0..yr {
                let row = (i * yr + p) * cols + j * yc;
                out[row..row + yc]
                    .iter_mut()
                    .zip(&y[p * yc..(p + 1) * yc])
                    .for_each(|(o, &v)| *o = s * v);
            }
        }
    }
    out
}

/// The module's update as `scale·B'·A'`: `(A'` rank × in, `B'` out × rank,
/// both row-major, moments of the input-side and output-side tensors).
pub(super) struct Formed {
    pub(super) a: Vec<f64>,
    pub(super) b: Vec<f64>,
    pub(super) down: Moments,
    pub(super) up: Moments,
}

/// Read the module's tensors and form `A'` and `B'`.
pub(super) fn form(reader: &mut TensorReader, p: &ComposedPlan, file: &Path) -> Result<Formed> {
    let (k, inp, out) = (
        p.rank as usize,
        p.in_features as usize,
        p.out_features as usize,
    );
    match &p.parts {
        Parts::LoHa([t1a, t1b, t2a, t2b]) => {
            let mut a = zeros(
                p.rank.saturating_mul(p.in_features),
                "a formed factor",
                file,
            )?;
            let mut b = zeros(
                p.rank.saturating_mul(p.out_features),
                "a formed factor",
                file,
            )?;
            let (w1a, w1b) = (read_all(reader, t1a, file)?, read_all(reader, t1b, file)?);
            let (w2a, w2b) = (read_all(reader, t2a, file)?, read_all(reader, t2b, file)?);
            let (r1, r2) = (t1a.shape[1] as usize, t2a.shape[1] as usize);
            // B'[o, i·r2 + j] = w1a[o, i]·w2a[o, j]
            for o in 0..out {
                for i in 0..r1 {
                    let x = w1a[o * r1 + i];
                    for j in 0..r2 {
                        b[o * k + i * r2 + j] = x * w2a[o * r2 + j];
                    }
                }
            }
            // A'[i·r2 + j, c] = w1b[i, c]·w2b[j, c]
            for i in 0..r1 {
                let x = &w1b[i * inp..(i + 1) * inp];
                for j in 0..r2 {
                    let y = &w2b[j * inp..(j + 1) * inp];
                    let row = &mut a[(i * r2 + j) * inp..(i * r2 + j + 1) * inp];
                    row.iter_mut()
                        .zip(x.iter().zip(y))
                        .for_each(|(o, (&u, &v))| *o = u * v);
                }
            }
            let mut down = moments_of(&w1b);
            down.merge(&moments_of(&w2b));
            let mut up = moments_of(&w1a);
            up.merge(&moments_of(&w2a));
            Ok(Formed { a, b, down, up })
        }
        Parts::LoKr(h1, h2) => {
            let (u1, v1, m1) = half_factors(reader, h1, file)?;
            let (u2, v2, m2) = half_factors(reader, h2, file)?;
            let ((r1, k1, c1), (r2, k2, c2)) = (h1.dims(), h2.dims());
            let d = |x: u64| x as usize;
            let b = kron(&u1, (d(r1), d(k1)), &u2, (d(r2), d(k2)));
            let a = kron(&v1, (d(k1), d(c1)), &v2, (d(k2), d(c2)));
            Ok(Formed {
                a,
                b,
                down: m1,
                up: m2,
            })
        }
    }
}

/// The statistics of a composed module, as a LoRA module's.
pub(super) fn reduce_composed(
    reader: &mut TensorReader,
    p: &ComposedPlan,
    file: &Path,
) -> Result<LoraModuleStats> {
    let f = form(reader, p, file)?;
    let (k, inp, out) = (
        p.rank as usize,
        p.in_features as usize,
        p.out_features as usize,
    );
    // Row-major A' (k × in) read column-major is A'ᵀ (in × k), and B'
    // (out × k) is B'ᵀ (k × out).
    let at = DMatrixView::from_slice(&f.a, inp, k);
    let bt = DMatrixView::from_slice(&f.b, k, out);
    let g = at.tr_mul(&at);
    let h = bt * bt.transpose();
    let (down, up) = p.sides();
    let cut_eps = down
        .iter()
        .chain(&up)
        .map(|t| t.kind.epsilon())
        .fold(0.0, f64::max);
    let dtype = |ts: &[&FloatTensor]| {
        ts.first()
            .map_or("", |t| t.kind.safetensors_name())
            .to_string()
    };
    let s = spectral_stats(SpectralInput {
        g: &g,
        h: &h,
        finite: f.down.nonfinite == 0 && f.up.nonfinite == 0,
        epsilon: cut_eps,
        scale: Some(p.scale),
    });
    Ok(LoraModuleStats {
        name: p.name.clone(),
        layer: p.layer,
        kind: p.method.kind().to_string(),
        rank: p.rank,
        in_features: p.in_features,
        out_features: p.out_features,
        dtype_a: dtype(&down),
        dtype_b: dtype(&up),
        alpha: Some(p.alpha),
        scale: Some(p.scale),
        norm_a: f.down.norm(),
        norm_b: f.up.norm(),
        max_abs_a: f.down.max_abs,
        max_abs_b: f.up.max_abs,
        nonfinite_a: f.down.nonfinite,
        nonfinite_b: f.up.nonfinite,
        delta_fro: s.delta_fro,
        singular_values: s.singular_values,
        stable_rank: s.stable_rank,
        effective_rank: s.effective_rank,
        rank_used: s.rank_used,
        magnitude_norm: None,
        magnitude_nonfinite: 0,
    })
}

/// The module's factors for a comparison: `ΔW = scale·B'·A'`.
pub(super) fn composed_factors(
    reader: &mut TensorReader,
    p: &ComposedPlan,
    file: &Path,
) -> Result<ModuleFactors> {
    let f = form(reader, p, file)?;
    Ok(ModuleFactors {
        name: p.name.clone(),
        layer: p.layer,
        rank: p.rank as usize,
        in_features: p.in_features as usize,
        out_features: p.out_features as usize,
        scale: p.scale,
        a: f.a,
        b: f.b,
        nonfinite: f.down.nonfinite + f.up.nonfinite,
    })
}

#[cfg(test)]
#[path = "composed_tests.rs"]
mod tests;
