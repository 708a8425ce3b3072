//! LoRA files of other tools than PEFT, planned as PEFT adapters are: kohya
//! and LyCORIS (`lora_down`/`lora_up`/`alpha`), diffusers (PEFT's naming
//! under a component prefix, its config in the header's
//! `lora_adapter_metadata`), and mlx-lm (`lora_a`/`lora_b`, transposed,
//! with its own `adapter_config.json`).
//!
//! Why here and not in a converter: every reader of factors (the health
//! statistics, `compare`, `similar`) goes through the one module plan, so
//! a kohya file is judged by the same rules as a PEFT adapter once its
//! modules, ranks and scales are known:
//!
//! - kohya: `ΔW = (alpha / r)·up·down`; without an `alpha` tensor alpha is
//!   the rank (sd-scripts' loader does the same). A conv LoRA's factors are
//!   4-D: `down` (r, in, kh, kw) is read as the r × (in·kh·kw) matrix it is
//!   in memory and `up` (out, r, 1, 1) as out × r, so `up·down` is the
//!   update of the conv weight flattened the same way.
//! - diffusers: the PEFT config of each component (`unet.r`,
//!   `unet.lora_alpha`, ... in `lora_adapter_metadata`) gives the scale;
//!   a file without it is scaled as diffusers loads it, alpha = r.
//! - mlx-lm: `y = x·Wᵀ + scale·(x·a)·b` with `a` (in × r) and `b`
//!   (r × out), so `A = aᵀ`, `B = bᵀ` and the scale is the config's as it
//!   is. The factors are read transposed, never copied.
//! - LyCORIS LoHa and LoKr have no `B·A` of their own: `composed` writes
//!   their update as one low-rank product; a module it does not form
//!   (Tucker conv factors) is read as plain tensors and named.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;

use super::composed::{self, Method, Planned};
use super::plan::{matrix, ModuleKind, ModulePlan, Plan};
use super::{ConfigSummary, MAX_RANK};
use crate::analysis::attribution::layer_number;
use crate::error::{Area, Error, Result};
use crate::formats::adapter_config::AdapterConfig;
use crate::formats::kohya_metadata::KohyaRun;
use crate::formats::lora_keys::{self, KeyRole, LoraFormat, DIFFUSERS_METADATA};
use crate::formats::mlx_config::MlxConfig;
use crate::formats::safetensors_header::TensorInfo;
use crate::formats::tensor_data::{decode, FloatTensor, SafetensorsData};

/// Largest `lora_adapter_metadata` parsed.
const MAX_METADATA_BYTES: usize = 1 << 20;

/// How a file's modules are scaled.
pub(super) enum Scaling<'a> {
    /// kohya: each module's `alpha` tensor over its rank.
    KohyaAlpha,
    /// diffusers: each component's PEFT config, else alpha = r.
    Diffusers(BTreeMap<String, AdapterConfig>),
    /// mlx-lm: the config's scale, as it is, at the config's rank.
    Mlx(&'a MlxConfig),
}

/// The format of a weights file opened without a PEFT config, when it is a
/// LoRA file of another tool (`lora_keys::file_format`).
pub(super) fn foreign_format(data: &SafetensorsData) -> Option<LoraFormat> {
    lora_keys::file_format(data.header())
}

/// Each component's PEFT config from diffusers' `lora_adapter_metadata`
/// (`{"unet.r": 4, "unet.lora_alpha": 8, ...}`); empty where there is none.
/// A config that cannot be read is an error naming the file.
pub(super) fn diffusers_configs(data: &SafetensorsData) -> Result<BTreeMap<String, AdapterConfig>> {
    let path = data.path();
    let Some(text) = data
        .header()
        .metadata
        .as_ref()
        .and_then(|m| m.iter().find(|(k, _)| k == DIFFUSERS_METADATA))
        .map(|(_, v)| v)
    else {
        return Ok(BTreeMap::new());
    };
    let err = |msg: String| Error::new(Area::Weights, path, msg);
    if text.len() > MAX_METADATA_BYTES {
        return Err(err(format!(
            "{DIFFUSERS_METADATA} is {} bytes, more than {MAX_METADATA_BYTES}",
            text.len()
        )));
    }
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| err(format!("{DIFFUSERS_METADATA} is not JSON: {e}")))?;
    let Some(map) = value.as_object() else {
        return Err(err(format!("{DIFFUSERS_METADATA} is not a JSON object")));
    };
    let mut parts: BTreeMap<String, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
    for (key, v) in map {
        let (component, field) = key.split_once('.').unwrap_or(("", key.as_str()));
        parts
            .entry(component.to_string())
            .or_default()
            .insert(field.to_string(), v.clone());
    }
    parts
        .into_iter()
        .map(|(component, fields)| {
            let bytes = serde_json::to_vec(&fields).unwrap_or_default();
            let config = AdapterConfig::parse(path, &bytes).map_err(|e| {
                err(format!(
                    "the {component} config in {DIFFUSERS_METADATA}: {}",
                    e.message
                ))
            })?;
            Ok((component, config))
        })
        .collect()
}

/// A module's tensors as the header names them.
#[derive(Default)]
struct Slots<'h> {
    down: Option<&'h TensorInfo>,
    up: Option<&'h TensorInfo>,
    alpha: Option<&'h TensorInfo>,
    /// Factors of a method with no `up·down` (LoCon's `lora_mid`).
    other: Vec<&'h TensorInfo>,
}

/// The value of a one-element tensor (kohya's `alpha`).
fn scalar(data: &SafetensorsData, info: &TensorInfo) -> Result<f64> {
    let t = data.float_tensor(info)?;
    if t.numel != 1 {
        return Err(Error::new(
            Area::Weights,
            data.path(),
            format!("{:?} has shape {:?}, expected one value", t.name, t.shape),
        ));
    }
    let mut value = f64::NAN;
    data.reader(1).for_each_raw_chunk(&t, |bytes| {
        let mut out = [0.0];
        decode(t.kind, bytes, &mut out);
        value = out[0];
        ControlFlow::Break(())
    })?;
    Ok(value)
}

/// `t` read as a matrix: its first dimension by the product of the rest (a
/// conv factor's row-major layout). The up factor of a conv LoRA must be
/// (out, r, 1, 1): a kernel there is no `up·down` of the flattened weight.
fn flattened(t: FloatTensor, up: bool, module: &str) -> std::result::Result<FloatTensor, String> {
    if t.shape.len() <= 2 {
        return Ok(t);
    }
    if up && t.shape[2..].iter().any(|&d| d != 1) {
        return Err(format!(
            "module {module:?}: the up factor {:?} has shape {:?}; a conv LoRA's up factor is \
             (out, r, 1, 1)",
            t.name, t.shape
        ));
    }
    let rest = t.shape[1..]
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("module {module:?}: {:?} has too large a shape", t.name))?;
    let shape = vec![t.shape[0], rest];
    Ok(FloatTensor { shape, ..t })
}

/// The module plan of a LoRA file of `format` (kohya, diffusers' PEFT
/// naming, mlx-lm, LyCORIS): LoHa and LoKr modules are planned by
/// `composed`, those it does not form read as plain tensors.
pub(super) fn plan_file(
    data: &SafetensorsData,
    format: LoraFormat,
    scaling: &Scaling,
) -> Result<Plan> {
    let err = |msg: String| Error::new(Area::Weights, data.path(), msg);
    let mut slots: BTreeMap<&str, Slots> = BTreeMap::new();
    let mut others = Vec::new();
    for info in &data.header().tensors {
        let Some((module, _, role)) = lora_keys::classify(&info.name) else {
            others.push(data.float_tensor(info)?);
            continue;
        };
        let slot = slots.entry(module).or_default();
        let taken = match role {
            KeyRole::Down => slot.down.replace(info),
            KeyRole::Up => slot.up.replace(info),
            KeyRole::Alpha => slot.alpha.replace(info),
            KeyRole::Other => {
                slot.other.push(info);
                None
            }
        };
        if let Some(earlier) = taken {
            return Err(err(format!(
                "tensors {:?} and {:?} are both the {role:?} tensor of module {module:?}",
                earlier.name, info.name
            )));
        }
    }
    let transposed = format == LoraFormat::Mlx;
    let mut modules = Vec::with_capacity(slots.len());
    let (mut composed, mut unformed) = (Vec::new(), Vec::new());
    for (name, s) in slots {
        if let (None, None, Some(method)) = (s.down, s.up, lycoris_method(&s.other)) {
            let alpha = s.alpha.map(|info| scalar(data, info)).transpose()?;
            let tensors: Vec<(&str, &TensorInfo)> = s
                .other
                .iter()
                .map(|info| (info.name.get(name.len()..).unwrap_or_default(), *info))
                .collect();
            let read = |info: &TensorInfo| data.float_tensor(info);
            match composed::plan_module(&read, name, method, &tensors, alpha)?.map_err(err)? {
                Planned::Formed(p) => composed.push(*p),
                Planned::Unformed(why) => {
                    unformed.push(format!("{name}: {why}"));
                    for info in s.other.into_iter().chain(s.alpha) {
                        others.push(data.float_tensor(info)?);
                    }
                }
            }
            continue;
        }
        let (down, up) = match (s.down, s.up) {
            (Some(d), Some(u)) if s.other.is_empty() => (d, u),
            (None, None) | (Some(_), Some(_)) => {
                // An alpha alone, or a module of another method (LoCon's
                // CP decomposition): read as plain tensors.
                for info in s.down.into_iter().chain(s.up).chain(s.alpha).chain(s.other) {
                    others.push(data.float_tensor(info)?);
                }
                continue;
            }
            (Some(d), None) => {
                return Err(err(format!(
                    "module {name:?} has a down factor ({:?}) but no up factor",
                    d.name
                )))
            }
            (None, Some(u)) => {
                return Err(err(format!(
                    "module {name:?} has an up factor ({:?}) but no down factor",
                    u.name
                )))
            }
        };
        let (a, b) = (data.float_tensor(down)?, data.float_tensor(up)?);
        let (a, b) = if transposed {
            (a, b)
        } else {
            (
                flattened(a, false, name).map_err(err)?,
                flattened(b, true, name).map_err(err)?,
            )
        };
        // (rows, cols) as stored; mlx-lm's are the transposes of PEFT's.
        let (ra, ca) = matrix(&a, name, "the down factor").map_err(err)?;
        let (rb, cb) = matrix(&b, name, "the up factor").map_err(err)?;
        let (rank, in_features, out_features, rank_b) = if transposed {
            (ca, ra, cb, rb)
        } else {
            (ra, ca, rb, cb)
        };
        if rank != rank_b {
            return Err(err(format!(
                "module {name:?}: the down factor {:?} (shape {:?}) has rank {rank} but the up \
                 factor {:?} (shape {:?}) has rank {rank_b}",
                a.name, a.shape, b.name, b.shape
            )));
        }
        if rank == 0 || rank > MAX_RANK {
            return Err(err(format!(
                "module {name:?}: rank {rank} is outside 1..={MAX_RANK}"
            )));
        }
        let (alpha, scale) = match scaling {
            Scaling::KohyaAlpha => {
                let alpha = match s.alpha {
                    Some(info) => scalar(data, info)?,
                    None => rank as f64,
                };
                // sd-scripts reads an alpha of 0 as "alpha = rank".
                let alpha = if alpha == 0.0 { rank as f64 } else { alpha };
                (alpha, alpha / rank as f64)
            }
            Scaling::Diffusers(configs) => {
                let component = name.split('.').next().unwrap_or_default();
                match configs.get(component) {
                    Some(c) => {
                        let m = c.scale_for(name);
                        if m.r != rank {
                            return Err(err(format!(
                                "module {name:?} has rank {rank} but the {component} config in \
                                 {DIFFUSERS_METADATA} gives it rank {}",
                                m.r
                            )));
                        }
                        (m.alpha, m.scale)
                    }
                    None => (rank as f64, 1.0),
                }
            }
            Scaling::Mlx(c) => {
                if c.rank != rank {
                    return Err(Error::new(
                        Area::Weights,
                        &c.path,
                        format!(
                            "module {name:?} has rank {rank} in {} but lora_parameters.rank is {}",
                            data.path().display(),
                            c.rank
                        ),
                    ));
                }
                (c.scale * rank as f64, c.scale)
            }
        };
        if let Some(info) = s.alpha.filter(|_| !matches!(scaling, Scaling::KohyaAlpha)) {
            others.push(data.float_tensor(info)?);
        }
        modules.push(ModulePlan {
            name: name.to_string(),
            layer: layer_number(name),
            kind: ModuleKind::Linear,
            rank,
            in_features,
            out_features,
            a,
            b,
            magnitude: None,
            alpha: Some(alpha),
            scale: Some(scale),
            transposed,
        });
    }
    Ok(Plan {
        modules,
        composed,
        others,
        unformed,
    })
}

/// LoHa or LoKr when every tensor of `other` is one of that method's.
fn lycoris_method(other: &[&TensorInfo]) -> Option<Method> {
    let format_of = |info: &&TensorInfo| lora_keys::classify(&info.name).map(|(_, f, _)| f);
    let first = format_of(other.first()?)?;
    if !other.iter().all(|info| format_of(info) == Some(first)) {
        return None;
    }
    match first {
        LoraFormat::LoHa => Some(Method::LoHa),
        LoraFormat::LoKr => Some(Method::LoKr),
        _ => None,
    }
}

/// What a LoRA file of another tool says in place of a PEFT config: its
/// format and method, the rank and alpha it was set up with (kohya's
/// `ss_network_dim`/`ss_network_alpha`, mlx-lm's `lora_parameters`, a
/// diffusers component's config, else its modules' largest rank and that
/// rank as alpha), and the base model named.
pub(super) fn summary_of(
    weights: &Path,
    data: &SafetensorsData,
    format: LoraFormat,
    plan: &Plan,
    mlx: Option<&MlxConfig>,
    diffusers: &BTreeMap<String, AdapterConfig>,
) -> ConfigSummary {
    let max_rank = plan
        .modules
        .iter()
        .map(|m| m.rank)
        .chain(plan.composed.iter().map(|m| m.dim))
        .max()
        .unwrap_or(0);
    let kohya = data.header().metadata.as_deref().and_then(KohyaRun::of);
    let first = diffusers.values().next();
    let (r, alpha) = match (mlx, &kohya, first) {
        (Some(c), _, _) => (c.rank, c.scale * c.rank as f64),
        (None, Some(k), _) if k.network_dim.is_some() => {
            let dim = k.network_dim.unwrap_or_default();
            (dim as u64, k.network_alpha.unwrap_or(dim))
        }
        (None, _, Some(c)) => (c.r, c.lora_alpha),
        _ => (max_rank, max_rank as f64),
    };
    let base = match (mlx, &kohya) {
        (Some(c), _) => c.model.clone(),
        (None, Some(k)) => k
            .settings
            .iter()
            .find(|(key, _)| key == "sd_model_name")
            .map(|(_, v)| v.clone()),
        _ => first.and_then(|c| c.base_model_name_or_path.clone()),
    };
    ConfigSummary {
        path: mlx.map_or_else(|| weights.to_path_buf(), |c| c.path.clone()),
        peft_type: Some(format.method().to_string()),
        r,
        lora_alpha: alpha,
        use_rslora: first.is_some_and(|c| c.use_rslora),
        use_dora: mlx.is_some_and(|c| c.fine_tune_type == "dora"),
        fan_in_fan_out: false,
        target_modules: Vec::new(),
        target_modules_is_regex: false,
        modules_to_save: Vec::new(),
        base_model_name_or_path: base,
        rank_pattern: Vec::new(),
        alpha_pattern: Vec::new(),
        init_lora_weights: "unknown".to_string(),
        merged_linear: false,
        format: format.name().to_string(),
    }
}

#[cfg(test)]
#[path = "foreign_tests.rs"]
pub(super) mod tests;
