//! The statistics of one LoRA module, read in bounded chunks: factor
//! norms, the two r×r Gram matrices, the spectrum of ΔW from them (never
//! forming the out×in product), ranks, and energy per layer.

use std::collections::BTreeMap;

use nalgebra::{Cholesky, DMatrix, SymmetricEigen};

use super::plan::ModulePlan;
use super::{LayerEnergy, LoraModuleStats, RANK_CUT_FLOOR};
use crate::error::Result;
use crate::formats::tensor_data::{Moments, TensorReader};

pub(super) fn reduce_module(reader: &mut TensorReader, m: &ModulePlan) -> Result<LoraModuleStats> {
    // G = A·Aᵀ and H = Bᵀ·B; stored transposed (mlx-lm), A·Aᵀ is the
    // column Gram of Aᵀ and Bᵀ·B the row Gram of Bᵀ.
    let ((g, ma), (h, mb)) = if m.transposed {
        (reader.column_gram(&m.a)?, reader.row_gram(&m.b)?)
    } else {
        (reader.row_gram(&m.a)?, reader.column_gram(&m.b)?)
    };
    let magnitude: Option<Moments> = m
        .magnitude
        .as_ref()
        .map(|t| reader.moments(t))
        .transpose()?;

    let s = spectral_stats(SpectralInput {
        g: &g,
        h: &h,
        finite: ma.nonfinite == 0 && mb.nonfinite == 0,
        epsilon: m.a.kind.epsilon().max(m.b.kind.epsilon()),
        scale: m.scale,
    });
    Ok(LoraModuleStats {
        name: m.name.clone(),
        layer: m.layer,
        kind: m.kind.name().to_string(),
        rank: m.rank,
        in_features: m.in_features,
        out_features: m.out_features,
        dtype_a: m.a.kind.safetensors_name().to_string(),
        dtype_b: m.b.kind.safetensors_name().to_string(),
        alpha: m.alpha,
        scale: m.scale,
        norm_a: ma.norm(),
        norm_b: mb.norm(),
        max_abs_a: ma.max_abs,
        max_abs_b: mb.max_abs,
        nonfinite_a: ma.nonfinite,
        nonfinite_b: mb.nonfinite,
        delta_fro: s.delta_fro,
        singular_values: s.singular_values,
        stable_rank: s.stable_rank,
        effective_rank: s.effective_rank,
        rank_used: s.rank_used,
        magnitude_norm: magnitude.map(|x| x.norm()),
        magnitude_nonfinite: magnitude.map_or(0, |x| x.nonfinite),
    })
}

/// What the spectral statistics of `ΔW = scale·B·A` are taken from:
/// `G = A·Aᵀ` and `H = Bᵀ·B`, whether the factors were all finite, and the
/// machine epsilon of the coarsest factor dtype (for the rank cut).
pub(super) struct SpectralInput<'a> {
    pub(super) g: &'a DMatrix<f64>,
    pub(super) h: &'a DMatrix<f64>,
    pub(super) finite: bool,
    pub(super) epsilon: f64,
    pub(super) scale: Option<f64>,
}

/// ‖ΔW‖_F, its singular values and rank measures (see the module docs of
/// `adapter_weights`); shared by LoRA modules and LyCORIS's composed ones.
pub(super) struct Spectral {
    pub(super) delta_fro: Option<f64>,
    pub(super) singular_values: Vec<f64>,
    pub(super) stable_rank: f64,
    pub(super) effective_rank: f64,
    pub(super) rank_used: Option<u64>,
}

pub(super) fn spectral_stats(x: SpectralInput) -> Spectral {
    let (g, h) = (x.g, x.h);
    let finite = x.finite && g.iter().all(|v| v.is_finite()) && h.iter().all(|v| v.is_finite());
    let spectrum = if finite { product_spectrum(g, h) } else { None };
    let ba_fro_sq = if finite {
        h.component_mul(g).sum().max(0.0)
    } else {
        f64::NAN
    };
    let cut = RANK_CUT_FLOOR.max(x.epsilon);
    let ranks = spectrum.as_deref().map(|l| SpectrumRanks::of(l, cut));
    let singular_values = match (x.scale, &spectrum) {
        (Some(s), Some(l)) => l.iter().map(|&v| s.abs() * v.sqrt()).collect(),
        _ => Vec::new(),
    };
    Spectral {
        delta_fro: x.scale.map(|s| s.abs() * ba_fro_sq.sqrt()),
        singular_values,
        stable_rank: ranks.map_or(f64::NAN, |r| r.stable),
        effective_rank: ranks.map_or(f64::NAN, |r| r.effective),
        rank_used: ranks.map(|r| r.used),
    }
}

/// Eigenvalues (descending, clamped at 0) of `H^½·G·H^½` (computed as
/// those of `Lᵀ·G·L` when `H = L·Lᵀ`): the squared singular values of B·A when `G = A·Aᵀ` and `H = Bᵀ·B`. None if the
/// solver does not converge or the product overflows.
pub fn product_spectrum(g: &DMatrix<f64>, h: &DMatrix<f64>) -> Option<Vec<f64>> {
    let n = g.nrows();
    if n == 0 || g.shape() != (n, n) || h.shape() != (n, n) {
        return Some(Vec::new());
    }
    let max_iter = 30 * n + 30;
    // A matrix with the spectrum of G·H: Lᵀ·G·L when H = L·Lᵀ (Cholesky,
    // which holds when B has full column rank: the usual trained adapter),
    // else H^½·G·H^½ from H's eigen-decomposition (an untouched B is zero).
    // The first costs a fraction of the second's solve.
    let m = match Cholesky::new(h.clone()) {
        Some(c) => {
            let l = c.unpack();
            l.transpose() * g * &l
        }
        None => {
            let eh = SymmetricEigen::try_new(h.clone(), f64::EPSILON, max_iter)?;
            // H^½ = V·diag(sqrt(max(d, 0)))·Vᵀ; PSD up to rounding, so clamp.
            let mut vd = eh.eigenvectors.clone();
            for (mut col, &d) in vd.column_iter_mut().zip(eh.eigenvalues.iter()) {
                col *= d.max(0.0).sqrt();
            }
            let root = &vd * eh.eigenvectors.transpose();
            &root * g * &root
        }
    };
    let m = (&m + m.transpose()) * 0.5;
    if !m.iter().all(|v| v.is_finite()) {
        return None;
    }
    let em = SymmetricEigen::try_new(m, f64::EPSILON, max_iter)?;
    let mut lambda: Vec<f64> = em.eigenvalues.iter().map(|&l| l.max(0.0)).collect();
    lambda.sort_unstable_by(|x, y| y.total_cmp(x));
    Some(lambda)
}

/// Scale-free rank measures of a spectrum of squared singular values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct SpectrumRanks {
    pub(super) stable: f64,
    pub(super) effective: f64,
    pub(super) used: u64,
}

impl SpectrumRanks {
    /// `lambda`: squared singular values, descending, non-negative.
    pub(super) fn of(lambda: &[f64], cut: f64) -> SpectrumRanks {
        let top = lambda.first().copied().unwrap_or(0.0);
        if top <= 0.0 {
            return SpectrumRanks {
                stable: 0.0,
                effective: 0.0,
                used: 0,
            };
        }
        let sigma: Vec<f64> = lambda.iter().map(|l| l.sqrt()).collect();
        let sigma_max = top.sqrt();
        let total: f64 = sigma.iter().sum();
        let entropy: f64 = sigma
            .iter()
            .filter(|&&s| s > 0.0)
            .map(|&s| {
                let p = s / total;
                -p * p.ln()
            })
            .sum();
        SpectrumRanks {
            stable: lambda.iter().sum::<f64>() / top,
            effective: entropy.exp(),
            used: sigma.iter().filter(|&&s| s > cut * sigma_max).count() as u64,
        }
    }
}

/// Σ‖ΔW‖_F² per layer over the modules that have a layer and a scale.
pub(super) fn layer_energy(modules: &[LoraModuleStats]) -> Vec<LayerEnergy> {
    let mut by_layer: BTreeMap<u64, LayerEnergy> = BTreeMap::new();
    for m in modules {
        let (Some(layer), Some(fro)) = (m.layer, m.delta_fro) else {
            continue;
        };
        let e = by_layer.entry(layer).or_insert(LayerEnergy {
            layer,
            modules: 0,
            delta_fro_sq: 0.0,
        });
        e.modules += 1;
        e.delta_fro_sq += fro * fro;
    }
    by_layer.into_values().collect()
}

/// Sort key: layer-less modules first, then by layer, then by name.
pub(super) fn module_order(a: &LoraModuleStats, b: &LoraModuleStats) -> std::cmp::Ordering {
    (a.layer, &a.name).cmp(&(b.layer, &b.name))
}
