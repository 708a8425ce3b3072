//! Read PEFT's `adapter_config.json`: the few fields that decide a LoRA
//! module's rank and scale, and which modules the adapter targets.
//!
//! Why its own module: the scale `s` of `ΔW = s·B·A` is not in the weights.
//! PEFT 0.21 sets it per module as `alpha / r` (`alpha / sqrt(r)` with
//! `use_rslora`), where `r` and `alpha` come from `rank_pattern` /
//! `alpha_pattern` when a pattern key matches the module's name, else from
//! `r` / `lora_alpha`.
//!
//! Pattern rule, as in PEFT 0.21 `peft.utils.other.get_pattern_key`: the
//! keys are tried in the file's order and the first key `k` for which
//! `re.match(rf"(.*\.)?({k})$", module_name)` succeeds wins. The key is a
//! regex matched against the whole module name, optionally preceded by any
//! prefix that ends in a dot. We compile `^(?:.*\.)?(?:k)$` with the `regex`
//! crate (linear time, so a hostile key cannot make matching blow up; keys
//! are capped in length and number). A key that Python accepts but `regex`
//! does not (look-around, backreferences) is an error naming the key.
//! PEFT writes the config with `sort_keys=True`, so the file's order is the
//! sorted order; it is also the order PEFT's loader tries the keys in, which
//! can differ from the dict the adapter was trained with (a rank mismatch
//! that `adapter_weights` then reports).
//!
//! `target_modules` follows `check_target_module_exists`: a list matches a
//! module whose name equals an entry or ends with `.entry`; a string is a
//! regex that must match the whole name (`re.fullmatch`); the string
//! `all-linear` (any case) matches every module.
//!
//! Decisions:
//! - `peft_type` absent or null is read as LoRA (the tensor names say
//!   LoRA; some exporters omit the field); any value other than `"LORA"` is
//!   refused, because e.g. AdaLoRA also writes `lora_A`/`lora_B` but its
//!   update is not `s·B·A`.
//! - Absent fields take PEFT 0.21's defaults (`r` 8, `lora_alpha` 8,
//!   booleans false); `null` counts as absent except for `r` and
//!   `lora_alpha`, which must be numbers when present.
//! - Fields we do not use are skipped unread; any field we use with the
//!   wrong type is an `Area::Weights` error naming the field.

use std::io::Read;
use std::path::{Path, PathBuf};

use regex::{Regex, RegexBuilder};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Area, Error, Result};
use crate::io::files::open_regular;
use crate::io::lfs;

/// File name of the config beside the weights.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// Largest config we read; PEFT writes about 1-2 KB.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Longest pattern key (or `target_modules` regex) we compile.
pub const MAX_PATTERN_LEN: usize = 1024;
/// Most keys in `rank_pattern` or `alpha_pattern`.
pub const MAX_PATTERNS: usize = 1024;
/// Compiled size limit for one pattern (the regex crate's own guard).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// PEFT 0.21's defaults for an absent `r` and `lora_alpha`.
const DEFAULT_R: u64 = 8;
const DEFAULT_ALPHA: f64 = 8.0;

/// Which modules the adapter says it targets.
#[derive(Debug, Clone)]
pub enum TargetModules {
    /// Module names (or name suffixes after a dot).
    Names(Vec<String>),
    /// A regex the whole module name must match.
    Regex { source: String, regex: Regex },
    /// PEFT's `all-linear` shorthand.
    AllLinear,
}

impl TargetModules {
    /// Whether `module` (a module name as PEFT sees it) is targeted.
    pub fn matches(&self, module: &str) -> bool {
        match self {
            TargetModules::Names(names) => names.iter().any(|n| {
                module == n
                    || module
                        .strip_suffix(n.as_str())
                        .is_some_and(|head| head.ends_with('.'))
            }),
            TargetModules::Regex { regex, .. } => regex.is_match(module),
            TargetModules::AllLinear => true,
        }
    }

    /// The entries as written: the names, or the one regex string.
    pub fn entries(&self) -> Vec<String> {
        match self {
            TargetModules::Names(names) => names.clone(),
            TargetModules::Regex { source, .. } => vec![source.clone()],
            TargetModules::AllLinear => vec!["all-linear".into()],
        }
    }

    /// True for a regex (or `all-linear`) string rather than a list.
    pub fn is_pattern(&self) -> bool {
        !matches!(self, TargetModules::Names(_))
    }
}

/// One `rank_pattern` / `alpha_pattern` entry.
#[derive(Debug, Clone)]
pub struct PatternEntry<T> {
    pub key: String,
    pub value: T,
    regex: Regex,
}

/// The parts of a LoRA `adapter_config.json` the weight probe uses.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    pub path: PathBuf,
    /// As written (None when absent). Another method than "LORA" (IA3,
    /// prompt tuning, ...) leaves every LoRA field at zero or empty.
    pub peft_type: Option<String>,
    pub r: u64,
    pub lora_alpha: f64,
    pub use_rslora: bool,
    pub use_dora: bool,
    pub fan_in_fan_out: bool,
    pub target_modules: Option<TargetModules>,
    pub modules_to_save: Vec<String>,
    pub base_model_name_or_path: Option<String>,
    /// In the file's order (the first matching key wins).
    pub rank_pattern: Vec<PatternEntry<u64>>,
    pub alpha_pattern: Vec<PatternEntry<f64>>,
    /// How PEFT initialised the factors: `true` (its default: A Kaiming-
    /// uniform, B zero; also when absent or null), `false`, or the method
    /// named (`gaussian`, `pissa`, `olora`, `loftq`, ...). A value of
    /// another type is `unknown` (only the factor-scale rule reads it).
    pub init_lora_weights: String,
    /// Whether the config has `enable_lora` (the alpaca-lora era's
    /// `MergedLinear`: one LoRA over a fused projection such as BLOOM's
    /// `query_key_value`, its `lora_A` stacking a rank-`r` factor per
    /// enabled part and its `lora_B` a grouped 1-D convolution). Its
    /// factors are not `B·A` matrices of one module.
    pub merged_linear: bool,
}

/// A module's rank, alpha and the scale PEFT applies to `B·A`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModuleScale {
    pub r: u64,
    pub alpha: f64,
    pub scale: f64,
}

impl AdapterConfig {
    /// The config of a PEFT method other than LoRA: its type and nothing
    /// LoRA-specific.
    fn other_method(path: &Path, peft_type: &str) -> AdapterConfig {
        AdapterConfig {
            path: path.to_path_buf(),
            peft_type: Some(peft_type.to_string()),
            r: 0,
            lora_alpha: 0.0,
            use_rslora: false,
            use_dora: false,
            fan_in_fan_out: false,
            init_lora_weights: "true".into(),
            target_modules: None,
            modules_to_save: Vec::new(),
            base_model_name_or_path: None,
            rank_pattern: Vec::new(),
            alpha_pattern: Vec::new(),
            merged_linear: false,
        }
    }

    /// Whether the adapter is a LoRA one (`peft_type` "LORA" or absent).
    pub fn is_lora(&self) -> bool {
        self.peft_type.as_deref().is_none_or(|t| t == "LORA")
    }

    /// Read and check the config file at `path`.
    pub fn read(path: &Path) -> Result<AdapterConfig> {
        let file = open_regular(path, Area::Weights)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(Area::Weights, path, &e))?
            .len();
        if len > MAX_CONFIG_BYTES {
            return Err(Error::new(
                Area::Weights,
                path,
                format!(
                    "{len} bytes is over the {MAX_CONFIG_BYTES}-byte limit for an adapter config"
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(Area::Weights, path, &e))?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(Error::new(
                Area::Weights,
                path,
                "grew past the size limit while being read",
            ));
        }
        AdapterConfig::parse(path, &bytes)
    }

    /// Parse config bytes; `path` only names the file in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<AdapterConfig> {
        let err = |msg: String| Error::new(Area::Weights, path, msg);
        let text = std::str::from_utf8(bytes)
            .map_err(|e| err(format!("adapter config is not UTF-8: {e}")))?;
        let mut de = serde_json::Deserializer::from_str(text);
        let raw = RawConfig::deserialize(&mut de)
            .and_then(|raw| de.end().map(|()| raw))
            .map_err(|e| {
                lfs::pointer_error(Area::Weights, path, bytes).unwrap_or_else(|| {
                    err(format!("adapter config is not a valid JSON object: {e}"))
                })
            })?;
        raw.check(path).map_err(err)
    }

    /// Rank, alpha and scale PEFT gives the module named `module` (e.g.
    /// `model.layers.0.self_attn.q_proj`).
    pub fn scale_for(&self, module: &str) -> ModuleScale {
        let r = first_match(&self.rank_pattern, module).unwrap_or(self.r);
        let alpha = first_match(&self.alpha_pattern, module).unwrap_or(self.lora_alpha);
        // r >= 1: the config's r and every rank_pattern value are checked.
        let denom = if self.use_rslora {
            (r as f64).sqrt()
        } else {
            r as f64
        };
        ModuleScale {
            r,
            alpha,
            scale: alpha / denom,
        }
    }

    /// The `rank_pattern` key that sets the module's rank, if any.
    pub fn rank_pattern_key(&self, module: &str) -> Option<&str> {
        self.rank_pattern
            .iter()
            .find(|p| p.regex.is_match(module))
            .map(|p| p.key.as_str())
    }
}

fn first_match<T: Copy>(patterns: &[PatternEntry<T>], module: &str) -> Option<T> {
    patterns
        .iter()
        .find(|p| p.regex.is_match(module))
        .map(|p| p.value)
}

/// How a pattern string is anchored.
#[derive(Clone, Copy)]
enum Anchor {
    /// The whole name (`re.fullmatch`).
    Whole,
    /// The whole name after an optional prefix ending in a dot
    /// (`re.match(rf"(.*\.)?({key})$", name)`).
    AfterDot,
}

/// Compile `source` anchored as `anchor` says, mimicking Python exactly:
/// PEFT inserts a pattern key into its regex textually (so a key holding
/// `)|(` changes the regex's structure, and `re.match` anchors only the
/// start), while `re.fullmatch` takes the pattern as one whole regex.
fn compile(source: &str, anchor: Anchor, what: &str) -> std::result::Result<Regex, String> {
    if source.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "{what}: pattern of {} bytes is over the {MAX_PATTERN_LEN}-byte limit",
            source.len()
        ));
    }
    let build = |text: &str| {
        RegexBuilder::new(text)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| {
                format!(
                    "{what}: cannot use {source:?} as a regular expression (Rust regex \
                     syntax: no look-around or backreferences): {e}"
                )
            })
    };
    match anchor {
        Anchor::Whole => {
            build(source)?;
            build(&format!("^(?:{source})$"))
        }
        Anchor::AfterDot => build(&format!(r"^(?:(?:.*\.)?(?:{source})$)")),
    }
}

// ---- raw deserialization: only the fields we use, in file order ----

#[derive(Default)]
struct RawConfig {
    peft_type: Option<Value>,
    r: Option<Value>,
    lora_alpha: Option<Value>,
    use_rslora: Option<Value>,
    use_dora: Option<Value>,
    fan_in_fan_out: Option<Value>,
    init_lora_weights: Option<Value>,
    target_modules: Option<Value>,
    modules_to_save: Option<Value>,
    base_model_name_or_path: Option<Value>,
    rank_pattern: Option<OrderedObject>,
    alpha_pattern: Option<OrderedObject>,
    enable_lora: Option<Value>,
}

/// A JSON object kept in file order (serde_json's map sorts its keys), or
/// `null`/another type, kept to report.
enum OrderedObject {
    Entries(Vec<(String, Value)>),
    Null,
    NotObject,
}

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<OrderedObject, E> {
                Ok(OrderedObject::Null)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<OrderedObject, E> {
                Ok(OrderedObject::NotObject)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<OrderedObject, E> {
                Ok(OrderedObject::NotObject)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<OrderedObject, E> {
                Ok(OrderedObject::NotObject)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<OrderedObject, E> {
                Ok(OrderedObject::NotObject)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<OrderedObject, E> {
                Ok(OrderedObject::NotObject)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<OrderedObject, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(OrderedObject::NotObject)
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<OrderedObject, A::Error> {
                let mut entries: Vec<(String, Value)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    // A repeated key keeps its first place and its last
                    // value, as a Python dict built from the JSON does.
                    match entries.iter_mut().find(|(seen, _)| *seen == k) {
                        Some(slot) => slot.1 = v,
                        None => entries.push((k, v)),
                    }
                    if entries.len() > MAX_PATTERNS {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_PATTERNS} pattern keys"
                        )));
                    }
                }
                Ok(OrderedObject::Entries(entries))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    PeftType,
    R,
    LoraAlpha,
    UseRslora,
    UseDora,
    FanInFanOut,
    InitLoraWeights,
    TargetModules,
    ModulesToSave,
    BaseModelNameOrPath,
    RankPattern,
    AlphaPattern,
    EnableLora,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for RawConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<RawConfig, A::Error> {
                let mut c = RawConfig::default();
                while let Some(field) = map.next_key::<Field>()? {
                    // A repeated field: the last value wins, as in Python.
                    match field {
                        Field::PeftType => c.peft_type = Some(map.next_value()?),
                        Field::R => c.r = Some(map.next_value()?),
                        Field::LoraAlpha => c.lora_alpha = Some(map.next_value()?),
                        Field::UseRslora => c.use_rslora = Some(map.next_value()?),
                        Field::UseDora => c.use_dora = Some(map.next_value()?),
                        Field::FanInFanOut => c.fan_in_fan_out = Some(map.next_value()?),
                        Field::InitLoraWeights => c.init_lora_weights = Some(map.next_value()?),
                        Field::TargetModules => c.target_modules = Some(map.next_value()?),
                        Field::ModulesToSave => c.modules_to_save = Some(map.next_value()?),
                        Field::BaseModelNameOrPath => {
                            c.base_model_name_or_path = Some(map.next_value()?)
                        }
                        Field::RankPattern => c.rank_pattern = Some(map.next_value()?),
                        Field::AlphaPattern => c.alpha_pattern = Some(map.next_value()?),
                        Field::EnableLora => c.enable_lora = Some(map.next_value()?),
                        Field::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(c)
            }
        }
        d.deserialize_map(V)
    }
}

type Checked<T> = std::result::Result<T, String>;

fn optional_bool(v: &Option<Value>, field: &str) -> Checked<bool> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "field \"{field}\" must be true or false, got {}",
            kind_of(other)
        )),
    }
}

fn optional_string(v: &Option<Value>, field: &str) -> Checked<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "field \"{field}\" must be a string, got {}",
            kind_of(other)
        )),
    }
}

fn string_list(v: &[Value], field: &str) -> Checked<Vec<String>> {
    v.iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(format!(
                "field \"{field}\" must list strings, found {}",
                kind_of(other)
            )),
        })
        .collect()
}

fn positive_int(v: &Value, what: &str) -> Checked<u64> {
    match v.as_u64() {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(format!("{what} must be a positive integer, got {v}")),
    }
}

fn finite_number(v: &Value, what: &str) -> Checked<f64> {
    match v.as_f64() {
        Some(x) if x.is_finite() => Ok(x),
        _ => Err(format!("{what} must be a number, got {v}")),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn patterns<T>(
    raw: &Option<OrderedObject>,
    field: &str,
    value_of: impl Fn(&Value, &str) -> Checked<T>,
) -> Checked<Vec<PatternEntry<T>>> {
    let entries = match raw {
        None | Some(OrderedObject::Null) => return Ok(Vec::new()),
        Some(OrderedObject::NotObject) => {
            return Err(format!(
                "field \"{field}\" must be an object mapping module-name patterns to numbers"
            ))
        }
        Some(OrderedObject::Entries(e)) => e,
    };
    entries
        .iter()
        .map(|(key, v)| {
            let what = format!("{field}[{key:?}]");
            Ok(PatternEntry {
                key: key.clone(),
                value: value_of(v, &what)?,
                regex: compile(key, Anchor::AfterDot, &what)?,
            })
        })
        .collect()
}

impl RawConfig {
    fn check(self, path: &Path) -> Checked<AdapterConfig> {
        let peft_type = optional_string(&self.peft_type, "peft_type")?;
        if let Some(t) = peft_type.as_ref().filter(|t| *t != "LORA") {
            // Another PEFT method (IA3, prompt tuning, ...): no ΔW = B·A to
            // plan, so none of LoRA's fields is read.
            return Ok(AdapterConfig::other_method(path, t));
        }
        let r = match &self.r {
            None => DEFAULT_R,
            Some(v) => positive_int(v, "field \"r\"")?,
        };
        let lora_alpha = match &self.lora_alpha {
            None => DEFAULT_ALPHA,
            Some(v) => finite_number(v, "field \"lora_alpha\"")?,
        };
        let target_modules = match &self.target_modules {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => {
                Some(TargetModules::Names(string_list(items, "target_modules")?))
            }
            Some(Value::String(s)) if s.eq_ignore_ascii_case("all-linear") => {
                Some(TargetModules::AllLinear)
            }
            Some(Value::String(s)) => Some(TargetModules::Regex {
                source: s.clone(),
                regex: compile(s, Anchor::Whole, "target_modules")?,
            }),
            Some(other) => {
                return Err(format!(
                    "field \"target_modules\" must be a list of names or a regex string, got {}",
                    kind_of(other)
                ))
            }
        };
        let modules_to_save = match &self.modules_to_save {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => string_list(items, "modules_to_save")?,
            Some(other) => {
                return Err(format!(
                    "field \"modules_to_save\" must be a list of names, got {}",
                    kind_of(other)
                ))
            }
        };
        Ok(AdapterConfig {
            path: path.to_path_buf(),
            peft_type,
            r,
            lora_alpha,
            use_rslora: optional_bool(&self.use_rslora, "use_rslora")?,
            use_dora: optional_bool(&self.use_dora, "use_dora")?,
            fan_in_fan_out: optional_bool(&self.fan_in_fan_out, "fan_in_fan_out")?,
            init_lora_weights: match &self.init_lora_weights {
                None | Some(Value::Null) | Some(Value::Bool(true)) => "true".into(),
                Some(Value::Bool(false)) => "false".into(),
                Some(Value::String(method)) => method.chars().take(64).collect(),
                Some(_) => "unknown".into(),
            },
            target_modules,
            modules_to_save,
            base_model_name_or_path: optional_string(
                &self.base_model_name_or_path,
                "base_model_name_or_path",
            )?,
            rank_pattern: patterns(&self.rank_pattern, "rank_pattern", positive_int)?,
            alpha_pattern: patterns(&self.alpha_pattern, "alpha_pattern", finite_number)?,
            merged_linear: matches!(&self.enable_lora, Some(Value::Array(parts)) if !parts.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/testdata/weights")
    }

    fn parse(text: &str) -> Result<AdapterConfig> {
        AdapterConfig::parse(Path::new("/x/adapter_config.json"), text.as_bytes())
    }

    fn json_file(path: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// Every fixture's per-module scale is the one PEFT set on the module.
    #[test]
    fn scales_match_what_peft_set_on_each_module() {
        let mut checked = 0;
        for entry in std::fs::read_dir(fixtures()).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            let config = AdapterConfig::read(&dir.join(CONFIG_FILE)).unwrap();
            let expected = json_file(&dir.join("expected.json"));
            assert_eq!(config.peft_type.as_deref(), Some("LORA"));
            let want = &expected["config"];
            assert_eq!(Some(config.r), want["r"].as_u64());
            assert_eq!(Some(config.lora_alpha), want["lora_alpha"].as_f64());
            assert_eq!(Some(config.use_rslora), want["use_rslora"].as_bool());
            assert_eq!(Some(config.use_dora), want["use_dora"].as_bool());
            assert_eq!(
                Some(config.fan_in_fan_out),
                want["fan_in_fan_out"].as_bool()
            );
            let mut targets = config.target_modules.as_ref().unwrap().entries();
            targets.sort();
            assert_eq!(serde_json::json!(targets), want["target_modules"]);
            assert_eq!(
                serde_json::json!(config.modules_to_save),
                want["modules_to_save"]
            );
            for (name, module) in expected["modules"].as_object().unwrap() {
                let s = config.scale_for(name);
                assert_eq!(Some(s.r), module["r"].as_u64(), "{dir:?} {name}");
                let peft_scale = module["scale"].as_f64().unwrap();
                assert!((s.scale - peft_scale).abs() <= 1e-15 * peft_scale, "{name}");
                assert!(config.target_modules.as_ref().unwrap().matches(name));
                checked += 1;
            }
        }
        assert!(checked >= 30, "{checked}");
    }

    /// The pattern and target rules agree with PEFT's own functions on the
    /// cases the fixture generator asked them.
    #[test]
    fn pattern_rules_agree_with_peft() {
        let cases = json_file(&fixtures().join("pattern_cases.json"));
        for case in cases["rank_pattern"].as_array().unwrap() {
            let keys: Vec<String> = serde_json::from_value(case["keys"].clone()).unwrap();
            let module = case["module"].as_str().unwrap();
            let pattern: serde_json::Map<String, Value> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), Value::from(i as u64 + 1)))
                .collect();
            // serde_json's map sorts keys: write the object in list order.
            let body: Vec<String> = keys
                .iter()
                .map(|k| format!("{}: {}", Value::from(k.clone()), pattern[k]))
                .collect();
            let config = parse(&format!(
                r#"{{"r": 64, "rank_pattern": {{{}}}}}"#,
                body.join(", ")
            ))
            .unwrap();
            let got = config.scale_for(module).r;
            let want = match case["match"].as_str() {
                Some(k) => pattern[k].as_u64().unwrap(),
                None => 64,
            };
            assert_eq!(got, want, "keys {keys:?} module {module}");
        }
        for case in cases["target_modules"].as_array().unwrap() {
            let module = case["module"].as_str().unwrap();
            let config = parse(&format!(
                r#"{{"target_modules": {}}}"#,
                case["target_modules"]
            ))
            .unwrap();
            let hit = config.target_modules.unwrap().matches(module);
            assert_eq!(Some(hit), case["match"].as_bool(), "{case}");
        }
    }

    #[test]
    fn first_matching_key_in_file_order_wins() {
        let c = parse(r#"{"r": 4, "rank_pattern": {"q_proj": 8, "layers.1.self_attn.q_proj": 2}}"#)
            .unwrap();
        assert_eq!(c.scale_for("model.layers.1.self_attn.q_proj").r, 8);
        let c = parse(r#"{"r": 4, "rank_pattern": {"layers.1.self_attn.q_proj": 2, "q_proj": 8}}"#)
            .unwrap();
        assert_eq!(c.scale_for("model.layers.1.self_attn.q_proj").r, 2);
        assert_eq!(c.scale_for("model.layers.0.self_attn.q_proj").r, 8);
        assert_eq!(c.scale_for("model.layers.0.self_attn.k_proj").r, 4);
        // A repeated key keeps its first place and takes its last value.
        let c = parse(r#"{"rank_pattern": {"q_proj": 8, ".*": 3, "q_proj": 16}}"#).unwrap();
        assert_eq!(c.scale_for("a.q_proj").r, 16);
    }

    #[test]
    fn scale_is_alpha_over_r_or_over_its_root() {
        let c = parse(r#"{"r": 16, "lora_alpha": 32}"#).unwrap();
        assert_eq!(c.scale_for("m").scale, 2.0);
        let c = parse(
            r#"{"r": 16, "lora_alpha": 32, "use_rslora": true, "alpha_pattern": {"k": 4.5}}"#,
        )
        .unwrap();
        assert_eq!(c.scale_for("m").scale, 8.0);
        assert_eq!(
            c.scale_for("x.k"),
            ModuleScale {
                r: 16,
                alpha: 4.5,
                scale: 4.5 / 4.0
            }
        );
    }

    #[test]
    fn absent_fields_take_peft_defaults() {
        let c = parse("{}").unwrap();
        assert_eq!(
            (c.r, c.lora_alpha, c.use_rslora, c.use_dora),
            (8, 8.0, false, false)
        );
        assert!(c.peft_type.is_none() && c.target_modules.is_none());
        let c = parse(
            r#"{"peft_type": null, "use_dora": null, "rank_pattern": null, "modules_to_save": null,
                "target_modules": "ALL-LINEAR", "base_model_name_or_path": "org/model"}"#,
        )
        .unwrap();
        assert!(c
            .target_modules
            .as_ref()
            .unwrap()
            .matches("anything.at_all"));
        assert!(c.target_modules.unwrap().is_pattern());
        assert_eq!(c.base_model_name_or_path.as_deref(), Some("org/model"));
    }

    #[test]
    fn other_peft_methods_read_as_such() {
        for (text, lora) in [
            (r#"{"peft_type": "IA3", "r": "not read"}"#, false),
            (r#"{"peft_type": "PROMPT_TUNING"}"#, false),
            (r#"{"peft_type": "LORA"}"#, true),
            ("{}", true),
        ] {
            let c = parse(text).unwrap();
            assert_eq!(c.is_lora(), lora, "{text}");
        }
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            ("not json", "not a valid JSON object"),
            ("[1, 2]", "not a valid JSON object"),
            (r#"{"r": 8} trailing"#, "not a valid JSON object"),
            (r#"{"peft_type": 3}"#, "\"peft_type\" must be a string"),
            (r#"{"r": "8"}"#, "field \"r\" must be a positive integer"),
            (r#"{"r": 0}"#, "field \"r\" must be a positive integer"),
            (r#"{"r": 8.5}"#, "field \"r\" must be a positive integer"),
            (r#"{"r": null}"#, "field \"r\" must be a positive integer"),
            (
                r#"{"lora_alpha": "16"}"#,
                "field \"lora_alpha\" must be a number",
            ),
            (
                r#"{"use_rslora": "yes"}"#,
                "\"use_rslora\" must be true or false",
            ),
            (r#"{"use_dora": 1}"#, "\"use_dora\" must be true or false"),
            (
                r#"{"fan_in_fan_out": []}"#,
                "\"fan_in_fan_out\" must be true or false",
            ),
            (
                r#"{"target_modules": 5}"#,
                "\"target_modules\" must be a list",
            ),
            (
                r#"{"target_modules": ["q", 5]}"#,
                "\"target_modules\" must list strings",
            ),
            (
                r#"{"target_modules": "(?<=x)q"}"#,
                "target_modules: cannot use",
            ),
            (
                r#"{"modules_to_save": "lm_head"}"#,
                "\"modules_to_save\" must be a list",
            ),
            (
                r#"{"base_model_name_or_path": {}}"#,
                "\"base_model_name_or_path\" must be a string",
            ),
            (
                r#"{"rank_pattern": [1]}"#,
                "\"rank_pattern\" must be an object",
            ),
            (
                r#"{"rank_pattern": {"q": 0}}"#,
                "rank_pattern[\"q\"] must be a positive integer",
            ),
            (
                r#"{"alpha_pattern": {"q": "x"}}"#,
                "alpha_pattern[\"q\"] must be a number",
            ),
            (
                r#"{"alpha_pattern": {"(?=q)": 1}}"#,
                "alpha_pattern[\"(?=q)\"]: cannot use",
            ),
            (r#"{"rank_pattern": {"(a": 1}}"#, "cannot use \"(a\""),
            (r#"{"rank_pattern": {"a{1000}{1000}": 1}}"#, "cannot use"),
        ];
        for (text, needle) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.area, Area::Weights, "{text}");
            assert!(e.message.contains(needle), "{text}: {e}");
            assert!(e.to_string().contains("adapter_config.json"), "{e}");
        }
        let long = format!(
            r#"{{"rank_pattern": {{"{}": 1}}}}"#,
            "a".repeat(MAX_PATTERN_LEN + 1)
        );
        assert!(parse(&long).unwrap_err().message.contains("limit"));
        let many: Vec<String> = (0..=MAX_PATTERNS)
            .map(|i| format!(r#""k{i}": 1"#))
            .collect();
        let many = format!(r#"{{"rank_pattern": {{{}}}}}"#, many.join(","));
        assert!(parse(&many).unwrap_err().message.contains("pattern keys"));
        assert!(AdapterConfig::parse(Path::new("c.json"), b"{\"r\": \xff}").is_err());
    }

    #[test]
    fn oversized_missing_and_non_regular_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CONFIG_FILE);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = AdapterConfig::read(&path).unwrap_err();
        assert!(e.message.contains("limit"), "{e}");
        assert_eq!(
            AdapterConfig::read(&dir.path().join("nope.json"))
                .unwrap_err()
                .area,
            Area::Missing
        );
        assert!(AdapterConfig::read(dir.path())
            .unwrap_err()
            .message
            .contains("directory"));
    }
}
