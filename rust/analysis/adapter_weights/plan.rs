//! Which tensors make up each LoRA module: keys grouped into modules, each
//! factor checked to be a matrix of the rank the config says, and the
//! config's `target_modules` checked against what the file holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::composed::ComposedPlan;
use super::foreign::{self, Scaling};
use super::{locate, ConfigSummary, KEY_PREFIX, MAX_RANK};
use crate::analysis::attribution::layer_number;
use crate::error::{Area, Error, Result};
use crate::formats::adapter_config::{AdapterConfig, TargetModules};
use crate::formats::lora_keys::LoraFormat;
use crate::formats::mlx_config::{is_mlx_config, MlxConfig};
use crate::formats::safetensors_header::TensorInfo;
use crate::formats::tensor_data::{FloatTensor, SafetensorsData};
use crate::formats::torch_state_dict::open_tensor_file;
use crate::io::files::read_small;
use crate::io::read_once;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    A,
    B,
    Magnitude,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ModuleKind {
    Linear,
    Embedding,
}

impl ModuleKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            ModuleKind::Linear => "linear",
            ModuleKind::Embedding => "embedding",
        }
    }
}

/// (module name, role, kind) of a LoRA tensor key; None for other tensors,
/// and for the LoRA factors of PEFT's frozen `original_module` copy (a
/// layer both targeted and in `modules_to_save` keeps them there, never
/// trained: they are the copy's, not the adapter's).
pub(super) fn classify(key: &str) -> Option<(&str, Role, Option<ModuleKind>)> {
    if is_frozen_original(key) {
        return None;
    }
    const SUFFIXES: [(&str, Role, Option<ModuleKind>); 6] = [
        (".lora_A.weight", Role::A, Some(ModuleKind::Linear)),
        (".lora_B.weight", Role::B, Some(ModuleKind::Linear)),
        (".lora_embedding_A", Role::A, Some(ModuleKind::Embedding)),
        (".lora_embedding_B", Role::B, Some(ModuleKind::Embedding)),
        (".lora_magnitude_vector", Role::Magnitude, None),
        (".lora_magnitude_vector.weight", Role::Magnitude, None),
    ];
    SUFFIXES.iter().find_map(|&(suffix, role, kind)| {
        let module = key.strip_suffix(suffix)?;
        let module = module.strip_prefix(KEY_PREFIX).unwrap_or(module);
        (!module.is_empty()).then_some((module, role, kind))
    })
}

/// Whether `key` is PEFT's frozen copy of a `modules_to_save` module
/// (`<module>.original_module.<param>`). `PeftModel.state_dict()` holds it
/// beside the trained copy (`<module>.modules_to_save.<adapter>.<param>`),
/// and so does a save that keeps it; it is the base model's weight as it
/// was, not something the adapter trained, so no rule may judge it as one.
pub fn is_frozen_original(key: &str) -> bool {
    key.starts_with("original_module.") || key.contains(".original_module.")
}

/// Tensors of one module as found in the header.
#[derive(Default)]
pub(super) struct Found<'h> {
    pub(super) a: Option<(&'h TensorInfo, ModuleKind)>,
    pub(super) b: Option<(&'h TensorInfo, ModuleKind)>,
    pub(super) magnitude: Option<&'h TensorInfo>,
}

/// A module checked and ready to reduce.
pub(super) struct ModulePlan {
    pub(super) name: String,
    pub(super) layer: Option<u64>,
    pub(super) kind: ModuleKind,
    pub(super) rank: u64,
    pub(super) in_features: u64,
    pub(super) out_features: u64,
    pub(super) a: FloatTensor,
    pub(super) b: FloatTensor,
    pub(super) magnitude: Option<FloatTensor>,
    pub(super) alpha: Option<f64>,
    pub(super) scale: Option<f64>,
    /// Whether the factors are stored transposed (mlx-lm's `lora_a` is
    /// in × r, `lora_b` r × out): then `a` holds Aᵀ and `b` holds Bᵀ.
    pub(super) transposed: bool,
}

pub(super) struct Plan {
    pub(super) modules: Vec<ModulePlan>,
    /// LyCORIS LoHa/LoKr modules whose update is formed (`composed`).
    pub(super) composed: Vec<ComposedPlan>,
    pub(super) others: Vec<FloatTensor>,
    /// Modules whose update is not formed, each `name: reason`; their
    /// tensors are among `others`.
    pub(super) unformed: Vec<String>,
}

impl Plan {
    /// A plan of plain tensors only.
    pub(super) fn plain(others: Vec<FloatTensor>) -> Plan {
        Plan {
            modules: Vec::new(),
            composed: Vec::new(),
            others,
            unformed: Vec::new(),
        }
    }
}

/// One adapter opened for reading: where its weights are, its config (None
/// when no `adapter_config.json` sits beside them), the mapped tensor data
/// and the module plan. The one way in for every reader of an adapter's
/// weights (the health statistics, the factors a comparison needs, the
/// streamed factors of `similar`), so they agree on what a module is.
/// `adapter_model.bin` (a `torch.save` state dict) is opened as tensor
/// spans of its file (`formats::torch_state_dict`) and read by the same
/// streaming reader as safetensors, so both formats are judged alike.
pub(super) struct OpenAdapter {
    pub(super) weights_path: PathBuf,
    pub(super) config: Option<AdapterConfig>,
    pub(super) data: SafetensorsData,
    pub(super) plan: Plan,
    /// What a LoRA file of another tool (kohya, LyCORIS, diffusers,
    /// mlx-lm; see `foreign`) says in place of a PEFT config.
    pub(super) foreign: Option<ConfigSummary>,
}

impl OpenAdapter {
    /// [`OpenAdapter::open`] for readers of LoRA factors: another PEFT
    /// method has no `B·A` to read, and is an error here.
    pub(super) fn open_lora(path: &Path) -> Result<Self> {
        let open = Self::open(path)?;
        if let Some(f) = open
            .foreign
            .as_ref()
            .filter(|f| f.peft_type.as_deref() != Some("LORA"))
        {
            // LyCORIS LoHa/LoKr: compared as their formed updates, unless a
            // module's update is not formed (a comparison would leave it out).
            let method = f.peft_type.as_deref().unwrap_or_default();
            let why = if let Some(first) = open.plan.unformed.first() {
                Some(format!(
                    "{} of its modules are not formed (e.g. {first}), so it is not compared",
                    open.plan.unformed.len()
                ))
            } else if open.plan.modules.is_empty() && open.plan.composed.is_empty() {
                Some("it holds no module whose update can be formed, so it is not compared".into())
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::new(
                    Area::Weights,
                    &open.weights_path,
                    format!("a LyCORIS {method} file ({}): {why}", f.format),
                ));
            }
        }
        match &open.config {
            Some(c) if c.merged_linear => Err(Error::new(
                Area::Weights,
                &c.path,
                "an old PEFT MergedLinear adapter (enable_lora): its factors are stacked per \
                 part of a fused projection, not one B·A per module, so they are not compared",
            )),
            Some(c) if !c.is_lora() => Err(Error::new(
                Area::Weights,
                &c.path,
                format!(
                    "peft_type is {:?}: only LoRA adapters (\"LORA\") have factors to compare; \
                     other PEFT methods do not apply ΔW = scale·B·A",
                    c.peft_type.as_deref().unwrap_or_default()
                ),
            )),
            _ => Ok(open),
        }
    }

    /// Open the adapter at `path`: a directory or its weights file. A
    /// weights file with no PEFT config beside it may be a LoRA file of
    /// another tool (`foreign`), and an `adapter_config.json` may be
    /// mlx-lm's: both are planned with their own scales.
    pub(super) fn open(path: &Path) -> Result<Self> {
        let (weights_path, config_path) = locate(path)?;
        let (mlx, config) = read_configs(&config_path)?;
        let data = open_tensor_file(&weights_path)?;
        let format = match (&mlx, &config) {
            (Some(_), _) => Some(LoraFormat::Mlx),
            (None, None) => foreign::foreign_format(&data),
            (None, Some(_)) => None,
        };
        if let Some(format) = format {
            let diffusers = if format == LoraFormat::Peft {
                foreign::diffusers_configs(&data)?
            } else {
                BTreeMap::new()
            };
            let scaling = match (&mlx, format) {
                (Some(c), _) => Scaling::Mlx(c),
                (None, LoraFormat::Peft) => Scaling::Diffusers(diffusers.clone()),
                _ => Scaling::KohyaAlpha,
            };
            let plan = foreign::plan_file(&data, format, &scaling)?;
            let summary = foreign::summary_of(
                &weights_path,
                &data,
                format,
                &plan,
                mlx.as_ref(),
                &diffusers,
            );
            return Ok(Self {
                weights_path,
                config: None,
                data,
                plan,
                foreign: Some(summary),
            });
        }
        let plan = match &config {
            // Another PEFT method, or an old MergedLinear LoRA (grouped
            // factors, no B·A per module): every tensor is judged as a
            // plain tensor.
            Some(c) if !c.is_lora() || c.merged_linear => Plan::plain(
                data.header()
                    .tensors
                    .iter()
                    .map(|info| data.float_tensor(info))
                    .collect::<Result<_>>()?,
            ),
            _ => plan(&data, config.as_ref())?,
        };
        Ok(Self {
            weights_path,
            config,
            data,
            plan,
            foreign: None,
        })
    }

    /// Whether the modules' scales are known (a config, or a file that
    /// carries its own).
    pub(super) fn scaled(&self) -> bool {
        self.config.is_some() || self.foreign.is_some()
    }
}

/// mlx-lm's config at `path`, when the file there is one (see
/// `formats::mlx_config`); None when it is missing or a PEFT config.
/// The adapter's `adapter_config.json` as mlx-lm's or PEFT's (neither when
/// there is none). A small one is read once per store (`read_once`: the
/// weights probe and the ghost probe's attribution both plan the adapter),
/// and both readers parse those bytes; any other case (large, missing,
/// unreadable) goes through the readers themselves, which say why.
fn read_configs(path: &Path) -> Result<(Option<MlxConfig>, Option<AdapterConfig>)> {
    if read_once::is_file(path) {
        if let Ok(read_once::Content::Whole(bytes)) = read_once::content(path, Area::Weights) {
            if is_mlx_config(&bytes) {
                return Ok((Some(MlxConfig::parse(path, &bytes)?), None));
            }
            return AdapterConfig::parse(path, &bytes).map(|c| (None, Some(c)));
        }
    }
    let mlx = read_mlx_config(path)?;
    if mlx.is_some() {
        return Ok((mlx, None));
    }
    match AdapterConfig::read(path) {
        Ok(c) => Ok((None, Some(c))),
        Err(e) if e.area == Area::Missing => Ok((None, None)),
        Err(e) => Err(e),
    }
}

fn read_mlx_config(path: &Path) -> Result<Option<MlxConfig>> {
    if !read_once::is_file(path) {
        return Ok(None);
    }
    let Ok(bytes) = read_small(path, Area::Weights, 1 << 20) else {
        return Ok(None); // too large or unreadable: the PEFT reader says why
    };
    if !is_mlx_config(&bytes) {
        return Ok(None);
    }
    MlxConfig::parse(path, &bytes).map(Some)
}

pub(super) fn plan(data: &SafetensorsData, config: Option<&AdapterConfig>) -> Result<Plan> {
    let err = |msg: String| Error::new(Area::Weights, data.path(), msg);
    let mut found: BTreeMap<&str, Found> = BTreeMap::new();
    let mut others = Vec::new();
    for info in &data.header().tensors {
        let Some((module, role, kind)) = classify(&info.name) else {
            others.push(data.float_tensor(info)?);
            continue;
        };
        let slot = found.entry(module).or_default();
        let taken = match role {
            Role::A => slot.a.replace((info, kind.unwrap_or(ModuleKind::Linear))),
            Role::B => slot.b.replace((info, kind.unwrap_or(ModuleKind::Linear))),
            Role::Magnitude => slot
                .magnitude
                .replace(info)
                .map(|t| (t, ModuleKind::Linear)),
        };
        if let Some((earlier, _)) = taken {
            return Err(err(format!(
                "tensors {:?} and {:?} are both the {role:?} tensor of module {module:?}",
                earlier.name, info.name
            )));
        }
    }

    let mut modules = Vec::with_capacity(found.len());
    for (name, f) in found {
        let ((a, kind_a), (b, kind_b)) = match (f.a, f.b) {
            (Some(a), Some(b)) => (a, b),
            (Some((a, _)), None) => {
                return Err(err(format!(
                    "module {name:?} has lora_A ({:?}) but no lora_B",
                    a.name
                )))
            }
            (None, Some((b, _))) => {
                return Err(err(format!(
                    "module {name:?} has lora_B ({:?}) but no lora_A",
                    b.name
                )))
            }
            (None, None) => {
                let m = f.magnitude.map_or("", |m| m.name.as_str());
                return Err(err(format!(
                    "module {name:?} has a DoRA magnitude ({m:?}) but no lora_A/lora_B"
                )));
            }
        };
        if kind_a != kind_b {
            return Err(err(format!(
                "module {name:?} mixes {:?} and {:?} (one embedding and one linear factor)",
                a.name, b.name
            )));
        }
        let ta = data.float_tensor(a)?;
        let tb = data.float_tensor(b)?;
        let (rank, in_features) = matrix(&ta, name, "lora_A").map_err(err)?;
        let (out_features, rank_b) = matrix(&tb, name, "lora_B").map_err(err)?;
        if rank != rank_b {
            return Err(err(format!(
                "module {name:?}: lora_A {:?} has rank {rank} (shape {:?}) but lora_B {:?} has \
                 rank {rank_b} (shape {:?})",
                a.name, ta.shape, b.name, tb.shape
            )));
        }
        if rank == 0 || rank > MAX_RANK {
            return Err(err(format!(
                "module {name:?}: rank {rank} is outside 1..={MAX_RANK}"
            )));
        }
        let magnitude = match f.magnitude {
            None => None,
            Some(m) => {
                let tm = data.float_tensor(m)?;
                if tm.shape != [out_features] {
                    return Err(err(format!(
                        "module {name:?}: DoRA magnitude {:?} has shape {:?}, expected [{out_features}] \
                         (one per output feature)",
                        m.name, tm.shape
                    )));
                }
                Some(tm)
            }
        };
        let (alpha, scale) = match config {
            None => (None, None),
            Some(c) => {
                let s = c.scale_for(name);
                if s.r != rank {
                    let source = c.rank_pattern_key(name).map_or_else(
                        || "its r".to_string(),
                        |k| format!("rank_pattern key {k:?}"),
                    );
                    return Err(Error::new(
                        Area::Weights,
                        &c.path,
                        format!(
                            "module {name:?} has rank {rank} in {} but the config gives it rank {} \
                             ({source})",
                            data.path().display(),
                            s.r
                        ),
                    ));
                }
                (Some(s.alpha), Some(s.scale))
            }
        };
        modules.push(ModulePlan {
            name: name.to_string(),
            layer: layer_number(name),
            kind: kind_a,
            rank,
            in_features,
            out_features,
            a: ta,
            b: tb,
            magnitude,
            alpha,
            scale,
            transposed: false,
        });
    }

    if let Some(c) = config {
        check_targets(c, &modules, data.path())?;
    }
    Ok(Plan {
        modules,
        others,
        ..Plan::plain(Vec::new())
    })
}

/// (rows, cols) of a LoRA factor, or why it is not a matrix.
pub(super) fn matrix(
    t: &FloatTensor,
    module: &str,
    role: &str,
) -> std::result::Result<(u64, u64), String> {
    t.matrix_dims().ok_or_else(|| {
        let hint = if t.shape.len() > 2 {
            " (LoRA factors of conv layers are not supported)"
        } else {
            ""
        };
        format!(
            "{role} of module {module:?} ({:?}) has shape {:?}: LoRA factors are matrices{hint}",
            t.name, t.shape
        )
    })
}

pub(super) fn check_targets(
    c: &AdapterConfig,
    modules: &[ModulePlan],
    weights: &Path,
) -> Result<()> {
    let Some(targets) = &c.target_modules else {
        return Ok(());
    };
    let applies = match targets {
        TargetModules::Names(names) => !names.is_empty(),
        TargetModules::Regex { .. } => true,
        TargetModules::AllLinear => false,
    };
    if !applies || modules.iter().any(|m| targets.matches(&m.name)) {
        return Ok(());
    }
    let shown: Vec<&str> = modules.iter().take(5).map(|m| m.name.as_str()).collect();
    Err(Error::new(
        Area::Weights,
        &c.path,
        format!(
            "target_modules {:?} names none of the {} LoRA modules in {}{}",
            targets.entries(),
            modules.len(),
            weights.display(),
            if shown.is_empty() {
                String::new()
            } else {
                format!(" (e.g. {})", shown.join(", "))
            }
        ),
    ))
}
