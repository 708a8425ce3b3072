//! What a pickle may name: the allow-list and the stand-ins for the rest.
//!
//! The allow-list is short (tensor rebuilders, storage classes, dtypes,
//! `OrderedDict`, `_codecs.encode`) and each entry is implemented in `torch`
//! as a pure data transformation. Outside it, the strict policy refuses the
//! global by name; the placeholder policy (Lightning's user classes in parts
//! no reader needs) makes an opaque value instead.

use std::sync::Arc;

use super::machine::{Machine, FALSE_ID};
use super::{clip, Id, PResult, PickleError, UnknownGlobals, Value};
use crate::error::Area;

/// Element type of a storage or tensor, as torch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DType {
    pub name: &'static str,
    /// Bytes per element.
    pub size: usize,
}

impl DType {
    pub const FLOAT32: DType = DType {
        name: "float32",
        size: 4,
    };
    pub const FLOAT64: DType = DType {
        name: "float64",
        size: 8,
    };
    pub const FLOAT16: DType = DType {
        name: "float16",
        size: 2,
    };
    pub const BFLOAT16: DType = DType {
        name: "bfloat16",
        size: 2,
    };
    pub const UINT8: DType = DType {
        name: "uint8",
        size: 1,
    };
}

/// Legacy typed storage classes (`torch.FloatStorage`, ...) and the dtype
/// of their elements.
const STORAGE_TYPES: &[(&str, DType)] = &[
    ("FloatStorage", DType::FLOAT32),
    ("DoubleStorage", DType::FLOAT64),
    ("HalfStorage", DType::FLOAT16),
    ("BFloat16Storage", DType::BFLOAT16),
    ("ByteStorage", DType::UINT8),
    (
        "CharStorage",
        DType {
            name: "int8",
            size: 1,
        },
    ),
    (
        "ShortStorage",
        DType {
            name: "int16",
            size: 2,
        },
    ),
    (
        "IntStorage",
        DType {
            name: "int32",
            size: 4,
        },
    ),
    (
        "LongStorage",
        DType {
            name: "int64",
            size: 8,
        },
    ),
    (
        "BoolStorage",
        DType {
            name: "bool",
            size: 1,
        },
    ),
    (
        "ComplexFloatStorage",
        DType {
            name: "complex64",
            size: 8,
        },
    ),
    (
        "ComplexDoubleStorage",
        DType {
            name: "complex128",
            size: 16,
        },
    ),
    (
        "QUInt8Storage",
        DType {
            name: "quint8",
            size: 1,
        },
    ),
    (
        "QInt8Storage",
        DType {
            name: "qint8",
            size: 1,
        },
    ),
    (
        "QInt32Storage",
        DType {
            name: "qint32",
            size: 4,
        },
    ),
    (
        "QUInt4x2Storage",
        DType {
            name: "quint4x2",
            size: 1,
        },
    ),
    (
        "QUInt2x4Storage",
        DType {
            name: "quint2x4",
            size: 1,
        },
    ),
    // Byte-addressed storage used by `_rebuild_tensor_v3`; its numel is bytes.
    ("UntypedStorage", DType::UINT8),
];

/// `torch.<dtype>` objects, which `_rebuild_tensor_v3` receives as an
/// argument for dtypes that have no legacy storage class.
const DTYPES: &[DType] = &[
    DType::FLOAT32,
    DType::FLOAT64,
    DType::FLOAT16,
    DType::BFLOAT16,
    DType::UINT8,
    DType {
        name: "int8",
        size: 1,
    },
    DType {
        name: "int16",
        size: 2,
    },
    DType {
        name: "int32",
        size: 4,
    },
    DType {
        name: "int64",
        size: 8,
    },
    DType {
        name: "uint16",
        size: 2,
    },
    DType {
        name: "uint32",
        size: 4,
    },
    DType {
        name: "uint64",
        size: 8,
    },
    DType {
        name: "bool",
        size: 1,
    },
    DType {
        name: "complex32",
        size: 4,
    },
    DType {
        name: "complex64",
        size: 8,
    },
    DType {
        name: "complex128",
        size: 16,
    },
    DType {
        name: "float8_e4m3fn",
        size: 1,
    },
    DType {
        name: "float8_e5m2",
        size: 1,
    },
    DType {
        name: "float8_e4m3fnuz",
        size: 1,
    },
    DType {
        name: "float8_e5m2fnuz",
        size: 1,
    },
    DType {
        name: "float8_e8m0fnu",
        size: 1,
    },
];

/// The globals a pickle may name. Each is implemented here; none is ever
/// looked up in Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Global {
    /// `torch._utils._rebuild_tensor_v2`
    RebuildTensorV2,
    /// `torch._utils._rebuild_tensor_v3`
    RebuildTensorV3,
    /// `torch._utils._rebuild_parameter`
    RebuildParameter,
    /// `collections.OrderedDict`
    OrderedDict,
    /// `_codecs.encode`, which protocol 2 uses to pickle `bytes`.
    CodecsEncode,
    /// A `torch.*Storage` class; only meaningful inside a persistent id.
    StorageType(DType),
    /// A `torch.<dtype>` object.
    DTypeObj(DType),
}

impl Global {
    pub(super) fn describe(self) -> String {
        match self {
            Global::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2".into(),
            Global::RebuildTensorV3 => "torch._utils._rebuild_tensor_v3".into(),
            Global::RebuildParameter => "torch._utils._rebuild_parameter".into(),
            Global::OrderedDict => "collections.OrderedDict".into(),
            Global::CodecsEncode => "_codecs.encode".into(),
            Global::StorageType(d) => format!("torch storage class ({})", d.name),
            Global::DTypeObj(d) => format!("torch.{}", d.name),
        }
    }
}

/// Look up `module.name` in the allow-list.
pub fn resolve_global(module: &str, name: &str) -> Option<Global> {
    match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor_v3") => Some(Global::RebuildTensorV3),
        ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
        ("collections", "OrderedDict") => Some(Global::OrderedDict),
        ("_codecs", "encode") => Some(Global::CodecsEncode),
        ("torch.storage", "UntypedStorage") => Some(Global::StorageType(DType::UINT8)),
        ("torch", _) => STORAGE_TYPES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| Global::StorageType(*d))
            .or_else(|| {
                DTYPES
                    .iter()
                    .find(|d| d.name == name)
                    .map(|d| Global::DTypeObj(*d))
            }),
        _ => None,
    }
}

impl Machine<'_> {
    /// The refusal of a global outside the allow-list, naming it.
    pub(super) fn unsafe_global(&self, module: &str, name: &str) -> PickleError {
        let module = clip(module);
        let name = clip(name);
        PickleError {
            area: Area::UnsafePickle,
            offset: self.op_start,
            message: format!(
                "pickle names the global {module}.{name}, which is not on the allow-list; \
                 refusing the file (nothing was imported or executed)"
            ),
            global: Some(format!("{module}.{name}")),
        }
    }

    /// INST of `module.name`: an allowed global is never instantiated; an
    /// unknown one becomes a placeholder (or the refusal, when strict).
    pub(super) fn inst(&mut self, module: &str, name: &str) -> PResult<Value> {
        if resolve_global(module, name).is_some() {
            return Err(self.err(format!(
                "INST of {module}.{name}: instantiating classes is not supported"
            )));
        }
        self.placeholder(module, name)
    }

    pub(super) fn global(&mut self, module: &str, name: &str) -> PResult<()> {
        match resolve_global(module, name) {
            Some(g) => self.push_new(Value::Global(g)),
            None => {
                let placeholder = self.placeholder(module, name)?;
                self.push_new(placeholder)
            }
        }
    }

    /// The opaque stand-in for the unknown global `module.name`, or the
    /// refusal when the policy is strict.
    pub(super) fn placeholder(&mut self, module: &str, name: &str) -> PResult<Value> {
        match self.unknown {
            UnknownGlobals::Refuse => Err(self.unsafe_global(module, name)),
            UnknownGlobals::Placeholder => {
                let full = format!("{}.{}", clip(module), clip(name));
                self.charge_string(full.len())?;
                Ok(Value::Opaque(full.into()))
            }
        }
    }

    /// The name of the opaque value `id`, if it is one.
    pub(super) fn opaque_name(&self, id: Id) -> Option<Arc<str>> {
        match self.value(id) {
            Value::Opaque(name) => Some(Arc::clone(name)),
            _ => None,
        }
    }

    /// What calling the placeholder `func` with `args` stands for: named
    /// after the class when `func` is copyreg's reconstructor (protocols
    /// 0-1 pickle plain objects that way), else after `func` itself.
    pub(super) fn opaque_call(&self, func: Arc<str>, args: Id) -> Value {
        let class = match self.value(args) {
            Value::Tuple(items) if func.starts_with("copyreg.") => {
                items.first().and_then(|&c| self.opaque_name(c))
            }
            _ => None,
        };
        Value::Opaque(class.unwrap_or(func))
    }

    /// Under the placeholder policy, BUILD with state on a value we model
    /// (e.g. the `_metadata` attribute of a module's `state_dict`, an
    /// `OrderedDict`) turns it into a placeholder: what `__setstate__`
    /// would make of it is unknown, so it must not be read. Under the
    /// strict policy, and for the shared None/True/False values, false.
    pub(super) fn build_makes_opaque(&mut self, target: Id) -> PResult<bool> {
        if self.unknown != UnknownGlobals::Placeholder || target <= FALSE_ID {
            return Ok(false);
        }
        let name = format!("<{} given state by BUILD>", self.value(target).kind());
        self.charge_string(name.len())?;
        match self.values.get_mut(target as usize) {
            Some(slot) => {
                *slot = Value::Opaque(name.into());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// NEWOBJ/NEWOBJ_EX/OBJ on `class`: an opaque instance when `class` is a
    /// placeholder, else the refusal every policy gives.
    pub(super) fn instantiate(&mut self, class: Id, opcode: &str) -> PResult<()> {
        match self.opaque_name(class) {
            Some(name) => self.push_new(Value::Opaque(name)),
            None => Err(self.err(format!("{opcode}: instantiating classes is not supported"))),
        }
    }
}
