//! A pickle reader for `torch.save` payloads that never runs anything.
//!
//! Python's unpickler resolves every `GLOBAL` by importing it and calls
//! whatever `REDUCE` hands it, which is why loading an untrusted `.pt` file
//! is code execution. This interpreter instead knows a short allow-list of
//! globals (tensor rebuilders, storage classes, dtypes, `OrderedDict`,
//! `_codecs.encode`) and implements each of them itself as a pure data
//! transformation. Any other global fails the read with an error naming it.
//!
//! Lightning checkpoints also pickle user classes in parts no reader needs
//! (`hyper_parameters`, `callbacks`, ...). For them there is a second
//! policy, [`UnknownGlobals::Placeholder`]: a global outside the allow-list
//! becomes an [`Value::Opaque`] stand-in, calling or building it gives more
//! opaque values, and the caller refuses the file only when an opaque value
//! sits in the part it reads ([`Unpickled::find_opaque`]). Nothing is ever
//! imported or called in either policy; strict refusal is the default.
//!
//! Values live in an arena and are referred to by index, so shared and
//! cyclic memo references are just repeated indices: nothing recurses over
//! the object graph. Every size a hostile file controls (pickle length,
//! stack, marks, memo, values, container lengths, string bytes, tensor
//! rank) is capped before anything is allocated for it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Area;

/// Pickle opcodes by name (protocols 0-5), as the `pickle` module calls them.
pub mod op {
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const NONE: u8 = b'N';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG: u8 = b'L';
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const FLOAT: u8 = b'F';
    pub const BINFLOAT: u8 = b'G';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const BINBYTES8: u8 = 0x8e;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const EMPTY_TUPLE: u8 = b')';
    pub const TUPLE: u8 = b't';
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const EMPTY_LIST: u8 = b']';
    pub const LIST: u8 = b'l';
    pub const APPEND: u8 = b'a';
    pub const APPENDS: u8 = b'e';
    pub const EMPTY_DICT: u8 = b'}';
    pub const DICT: u8 = b'd';
    pub const SETITEM: u8 = b's';
    pub const SETITEMS: u8 = b'u';
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const MEMOIZE: u8 = 0x94;
    pub const GLOBAL: u8 = b'c';
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const INST: u8 = b'i';
    pub const OBJ: u8 = b'o';
    pub const NEWOBJ: u8 = 0x81;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const REDUCE: u8 = b'R';
    pub const BUILD: u8 = b'b';
    pub const BINPERSID: u8 = b'Q';
    pub const PERSID: u8 = b'P';
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// Index of a value in the arena.
pub type Id = u32;

/// Hard caps on what one pickle may make the interpreter hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_pickle_bytes: usize,
    pub max_stack: usize,
    pub max_marks: usize,
    pub max_memo: usize,
    pub max_values: usize,
    pub max_container_len: usize,
    /// Total bytes of all strings and byte strings created.
    pub max_string_bytes: usize,
    pub max_tensor_dims: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pickle_bytes: 64 << 20,
            max_stack: 1 << 20,
            max_marks: 4096,
            max_memo: 4 << 20,
            max_values: 4 << 20,
            max_container_len: 4 << 20,
            max_string_bytes: 256 << 20,
            max_tensor_dims: 64,
        }
    }
}

/// What a global outside the allow-list does to a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownGlobals {
    /// Fail the read with `Area::UnsafePickle` naming the global.
    #[default]
    Refuse,
    /// Stand an opaque value in for it. Calling it (REDUCE, NEWOBJ, OBJ,
    /// INST), building it (BUILD) or filling it (APPEND(S), SETITEM(S))
    /// gives or keeps opaque values; an allowed callable given an opaque
    /// argument returns an opaque value too. No code runs either way.
    Placeholder,
}

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
    fn describe(self) -> String {
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

/// A storage named by a persistent id: the bytes live in the archive entry
/// `<prefix>/data/<key>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storage {
    /// Id of the `Str` value holding the key.
    pub key: Id,
    pub dtype: DType,
    /// Elements of `dtype` the pickle claims the storage holds.
    pub numel: u64,
}

/// A tensor view onto a storage, as `_rebuild_tensor_v2/v3` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub storage: Storage,
    pub dtype: DType,
    /// Offset into the storage, in elements of `dtype`.
    pub offset: u64,
    pub size: Vec<u64>,
    pub stride: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer that does not fit in i64; kept only so it can be reported.
    BigInt,
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    /// Entries in insertion order; a repeated key appears twice and the
    /// later entry wins on lookup, as in Python.
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    Global(Global),
    Storage(Storage),
    Tensor(Tensor),
    /// A stand-in for a global outside the allow-list, or for whatever
    /// calling or building one would have made (placeholder policy only).
    /// Holds the global's `module.name` (at most 200 characters).
    Opaque(Arc<str>),
}

impl Value {
    /// Short type name for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::Global(_) => "global",
            Value::Storage(_) => "storage",
            Value::Tensor(_) => "tensor",
            Value::Opaque(_) => "opaque placeholder",
        }
    }
}

/// Why a pickle was refused. `area` is `UnsafePickle` for a global outside
/// the allow-list and `TrainingState` for everything malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickleError {
    pub area: Area,
    /// Byte offset of the opcode that failed.
    pub offset: usize,
    pub message: String,
    /// `module.name` of a refused global, when that is the reason.
    pub global: Option<String>,
}

impl std::fmt::Display for PickleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pickle byte {})", self.message, self.offset)
    }
}

type PResult<T> = std::result::Result<T, PickleError>;

/// The result of unpickling: the arena and the id of the top-level value.
#[derive(Debug)]
pub struct Unpickled {
    values: Vec<Value>,
    pub root: Id,
}

impl Unpickled {
    /// The value with this id. Ids only come from this arena, but a bad id
    /// reads as `None` rather than panicking.
    pub fn get(&self, id: Id) -> &Value {
        self.values.get(id as usize).unwrap_or(&Value::None)
    }

    /// The string with this id, if it is one.
    pub fn str_of(&self, id: Id) -> Option<&str> {
        match self.get(id) {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Entries of the dict `id` (None when it is not a dict).
    pub fn dict_entries(&self, id: Id) -> Option<&[(Id, Id)]> {
        match self.get(id) {
            Value::Dict(e) => Some(e),
            _ => None,
        }
    }

    /// Value stored under the string key `key` in dict `id`; the last of
    /// repeated keys wins.
    pub fn dict_get(&self, id: Id, key: &str) -> Option<Id> {
        self.dict_entries(id)?
            .iter()
            .rev()
            .find(|(k, _)| self.str_of(*k) == Some(key))
            .map(|(_, v)| *v)
    }

    /// The `module.name` behind the first opaque placeholder reachable from
    /// `id` through tuples, lists, sets and dict keys and values; None when
    /// there is none. Shared and cyclic references are visited once.
    pub fn find_opaque(&self, id: Id) -> Option<&str> {
        let mut seen = vec![false; self.values.len()];
        let mut todo = Vec::new();
        let mut visit = |at: Id, todo: &mut Vec<Id>| {
            if let Some(s) = seen.get_mut(at as usize) {
                if !*s {
                    *s = true;
                    todo.push(at);
                }
            }
        };
        visit(id, &mut todo);
        while let Some(at) = todo.pop() {
            match self.get(at) {
                Value::Opaque(name) => return Some(name),
                Value::Tuple(items) | Value::List(items) | Value::Set(items) => {
                    for &item in items {
                        visit(item, &mut todo);
                    }
                }
                Value::Dict(entries) => {
                    for &(k, v) in entries {
                        visit(k, &mut todo);
                        visit(v, &mut todo);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// The `module.name` behind some opaque placeholder anywhere in the
    /// pickle, if it holds one.
    pub fn any_opaque(&self) -> Option<&str> {
        self.values.iter().find_map(|v| match v {
            Value::Opaque(name) => Some(&**name),
            _ => None,
        })
    }

    /// Up to 50 distinct keys of dict `id` in first-seen order, for error
    /// messages (non-string keys appear as their type).
    pub fn dict_str_keys(&self, id: Id) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        let mut keys: Vec<String> = Vec::new();
        for (k, _) in self.dict_entries(id).unwrap_or(&[]) {
            let name = match self.get(*k) {
                Value::Str(s) => clip(s),
                other => format!("<{}>", other.kind()),
            };
            if seen.insert(name.clone()) {
                keys.push(name);
                if keys.len() == 50 {
                    break;
                }
            }
        }
        keys
    }
}

/// Unpickle `data` with the default limits.
pub fn unpickle(data: &[u8]) -> PResult<Unpickled> {
    unpickle_with(data, Limits::default())
}

/// Unpickle `data`, refusing anything outside the allow-list or the limits.
pub fn unpickle_with(data: &[u8], limits: Limits) -> PResult<Unpickled> {
    unpickle_with_policy(data, limits, UnknownGlobals::Refuse)
}

/// Unpickle `data` within `limits`, treating globals outside the
/// allow-list as `unknown` says.
pub fn unpickle_with_policy(
    data: &[u8],
    limits: Limits,
    unknown: UnknownGlobals,
) -> PResult<Unpickled> {
    if data.len() > limits.max_pickle_bytes {
        return Err(PickleError {
            area: Area::TrainingState,
            offset: 0,
            message: format!(
                "pickle is {} bytes, more than the {} byte limit",
                data.len(),
                limits.max_pickle_bytes
            ),
            global: None,
        });
    }
    let mut m = Machine {
        data,
        pos: 0,
        op_start: 0,
        limits,
        values: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        string_bytes: 0,
        unknown,
    };
    let root = m.run()?;
    Ok(Unpickled {
        values: m.values,
        root,
    })
}

/// The pickle memo. Writers number memo entries 0, 1, 2, ... so they live in
/// a vector; an index far past the end (only a hand-made pickle has one)
/// goes to a map, so no index can make the vector grow without bound.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Id>>,
    sparse: HashMap<u32, Id>,
    len: usize,
}

/// How far past the vector's end an index may land and still extend it.
const MEMO_DENSE_SLACK: usize = 64;

impl Memo {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: u32) -> Option<Id> {
        // An index stored sparsely stays there even once the vector grows past it.
        let dense = self.dense.get(index as usize).copied().flatten();
        dense.or_else(|| self.sparse.get(&index).copied())
    }

    fn contains(&self, index: u32) -> bool {
        self.get(index).is_some()
    }

    fn insert(&mut self, index: u32, id: Id) {
        let at = index as usize;
        if at < self.dense.len() + MEMO_DENSE_SLACK && !self.sparse.contains_key(&index) {
            if at >= self.dense.len() {
                self.dense.resize(at + 1, None);
            }
            if let Some(slot) = self.dense.get_mut(at) {
                if slot.replace(id).is_none() {
                    self.len += 1;
                }
            }
        } else if self.sparse.insert(index, id).is_none() {
            self.len += 1;
        }
    }
}

const NONE_ID: Id = 0;
const TRUE_ID: Id = 1;
const FALSE_ID: Id = 2;

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    op_start: usize,
    limits: Limits,
    values: Vec<Value>,
    stack: Vec<Id>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    memo: Memo,
    string_bytes: usize,
    unknown: UnknownGlobals,
}

impl<'a> Machine<'a> {
    fn err(&self, message: impl Into<String>) -> PickleError {
        PickleError {
            area: Area::TrainingState,
            offset: self.op_start,
            message: message.into(),
            global: None,
        }
    }

    fn unsafe_global(&self, module: &str, name: &str) -> PickleError {
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

    // ---- input ----

    fn take(&mut self, n: usize) -> PResult<&'a [u8]> {
        let data = self.data;
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| self.err(format!("truncated pickle: needs {n} more bytes")))?;
        let out = data
            .get(self.pos..end)
            .ok_or_else(|| self.err("truncated pickle"))?;
        self.pos = end;
        Ok(out)
    }

    fn fixed<const N: usize>(&mut self) -> PResult<[u8; N]> {
        let s = self.take(N)?;
        <[u8; N]>::try_from(s).map_err(|_| self.err("truncated pickle"))
    }

    fn u8(&mut self) -> PResult<u8> {
        Ok(self.fixed::<1>()?[0])
    }

    /// A length prefix that must fit in the remaining input.
    fn length(&mut self, n: u64) -> PResult<usize> {
        let remaining = self.data.len().saturating_sub(self.pos);
        match usize::try_from(n) {
            Ok(n) if n <= remaining => Ok(n),
            _ => Err(self.err(format!(
                "length {n} runs past the end of the pickle ({remaining} bytes left)"
            ))),
        }
    }

    /// A newline-terminated argument of a text opcode, without the newline.
    fn line(&mut self) -> PResult<&'a [u8]> {
        let data = self.data;
        let rest = data.get(self.pos..).unwrap_or(&[]);
        let n = memchr::memchr(b'\n', rest)
            .ok_or_else(|| self.err("truncated pickle: text argument has no newline"))?;
        let out = rest.get(..n).unwrap_or(&[]);
        self.pos += n + 1;
        Ok(out)
    }

    fn line_str(&mut self) -> PResult<&'a str> {
        let line = self.line()?;
        std::str::from_utf8(line).map_err(|_| PickleError {
            area: Area::TrainingState,
            offset: self.op_start,
            message: "text argument is not UTF-8".into(),
            global: None,
        })
    }

    // ---- arena and stack ----

    fn alloc(&mut self, v: Value) -> PResult<Id> {
        if self.values.len() >= self.limits.max_values {
            return Err(self.err(format!(
                "pickle creates more than {} values",
                self.limits.max_values
            )));
        }
        let id = Id::try_from(self.values.len()).map_err(|_| self.err("too many values"))?;
        self.values.push(v);
        Ok(id)
    }

    fn charge_string(&mut self, n: usize) -> PResult<()> {
        self.string_bytes = self.string_bytes.saturating_add(n);
        if self.string_bytes > self.limits.max_string_bytes {
            return Err(self.err(format!(
                "pickle strings exceed {} bytes in total",
                self.limits.max_string_bytes
            )));
        }
        Ok(())
    }

    fn push(&mut self, id: Id) -> PResult<()> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(self.err(format!(
                "pickle stack deeper than {} entries",
                self.limits.max_stack
            )));
        }
        self.stack.push(id);
        Ok(())
    }

    fn push_new(&mut self, v: Value) -> PResult<()> {
        let id = self.alloc(v)?;
        self.push(id)
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> PResult<Id> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn top(&self) -> PResult<Id> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.err("stack underflow"))
    }

    /// Pop everything down to the last MARK, and the mark itself.
    fn pop_mark(&mut self) -> PResult<Vec<Id>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        if mark > self.stack.len() {
            return Err(self.err("corrupt MARK"));
        }
        Ok(self.stack.split_off(mark))
    }

    fn value(&self, id: Id) -> &Value {
        self.values.get(id as usize).unwrap_or(&Value::None)
    }

    fn int_of(&self, id: Id, what: &str) -> PResult<i64> {
        match self.value(id) {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(i64::from(*b)),
            other => Err(self.err(format!("{what} should be an int, found {}", other.kind()))),
        }
    }

    fn check_len(&self, len: usize) -> PResult<()> {
        if len > self.limits.max_container_len {
            return Err(self.err(format!(
                "container longer than {} items",
                self.limits.max_container_len
            )));
        }
        Ok(())
    }

    // ---- memo ----

    fn memo_put(&mut self, index: u64) -> PResult<()> {
        let top = self.top()?;
        let index = u32::try_from(index).map_err(|_| self.err("memo index out of range"))?;
        if !self.memo.contains(index) && self.memo.len() >= self.limits.max_memo {
            return Err(self.err(format!(
                "pickle memo holds more than {} entries",
                self.limits.max_memo
            )));
        }
        self.memo.insert(index, top);
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> PResult<()> {
        let id = u32::try_from(index)
            .ok()
            .and_then(|i| self.memo.get(i))
            .ok_or_else(|| self.err(format!("memo entry {index} was never stored")))?;
        self.push(id)
    }

    // ---- containers ----

    fn extend_list(&mut self, target: Id, items: Vec<Id>) -> PResult<()> {
        let max = self.limits.max_container_len;
        let kind = self.value(target).kind();
        match self.values.get_mut(target as usize) {
            Some(Value::List(list)) | Some(Value::Set(list)) => {
                if list.len().saturating_add(items.len()) > max {
                    return Err(self.err(format!("container longer than {max} items")));
                }
                list.extend(items);
                Ok(())
            }
            // Python would call the object's append/extend; a placeholder
            // keeps nothing (the items stay counted in the arena).
            Some(Value::Opaque(_)) => Ok(()),
            _ => Err(self.err(format!("cannot append to a {kind}"))),
        }
    }

    fn set_items(&mut self, target: Id, items: Vec<Id>) -> PResult<()> {
        if items.len() % 2 != 0 {
            return Err(self.err("SETITEMS with an odd number of stack items"));
        }
        let max = self.limits.max_container_len;
        let kind = self.value(target).kind();
        match self.values.get_mut(target as usize) {
            Some(Value::Dict(entries)) => {
                if entries.len().saturating_add(items.len() / 2) > max {
                    return Err(self.err(format!("container longer than {max} items")));
                }
                entries.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            Some(Value::Opaque(_)) => Ok(()),
            _ => Err(self.err(format!("cannot set items on a {kind}"))),
        }
    }

    fn make_str(&mut self, bytes: Vec<u8>) -> PResult<Value> {
        self.charge_string(bytes.len())?;
        String::from_utf8(bytes)
            .map(Value::Str)
            .map_err(|_| self.err("string is not valid UTF-8"))
    }

    fn binary_str(&mut self, len: u64) -> PResult<()> {
        let n = self.length(len)?;
        let bytes = self.take(n)?.to_vec();
        let v = self.make_str(bytes)?;
        self.push_new(v)
    }

    fn binary_bytes(&mut self, len: u64) -> PResult<()> {
        let n = self.length(len)?;
        self.charge_string(n)?;
        let bytes = self.take(n)?.to_vec();
        self.push_new(Value::Bytes(bytes))
    }

    fn push_int_bytes(&mut self, bytes_len: u64) -> PResult<()> {
        let n = self.length(bytes_len)?;
        let bytes = self.take(n)?;
        let v = decode_long(bytes);
        self.push_new(v)
    }

    fn parse_int_text(&self, text: &str) -> PResult<Value> {
        let t = text.trim().trim_end_matches('L');
        if t.is_empty() || t.len() > 4096 {
            return Err(self.err("malformed integer literal"));
        }
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.err(format!("malformed integer literal {t:?}")));
        }
        Ok(t.parse::<i64>().map(Value::Int).unwrap_or(Value::BigInt))
    }

    /// Parse a quoted protocol-0 string; escapes are refused rather than
    /// half-interpreted.
    fn quoted(&self, line: &[u8]) -> PResult<Vec<u8>> {
        let inner = match line {
            [b'\'', inner @ .., b'\''] | [b'"', inner @ .., b'"'] => inner,
            _ => return Err(self.err("STRING argument is not quoted")),
        };
        if inner.contains(&b'\\') {
            return Err(self.err("STRING with escape sequences is not supported"));
        }
        Ok(inner.to_vec())
    }

    // ---- globals and calls ----

    fn global(&mut self, module: &str, name: &str) -> PResult<()> {
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
    fn placeholder(&mut self, module: &str, name: &str) -> PResult<Value> {
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
    fn opaque_name(&self, id: Id) -> Option<Arc<str>> {
        match self.value(id) {
            Value::Opaque(name) => Some(Arc::clone(name)),
            _ => None,
        }
    }

    /// What calling the placeholder `func` with `args` stands for: named
    /// after the class when `func` is copyreg's reconstructor (protocols
    /// 0-1 pickle plain objects that way), else after `func` itself.
    fn opaque_call(&self, func: Arc<str>, args: Id) -> Value {
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
    fn build_makes_opaque(&mut self, target: Id) -> PResult<bool> {
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
    fn instantiate(&mut self, class: Id, opcode: &str) -> PResult<()> {
        match self.opaque_name(class) {
            Some(name) => self.push_new(Value::Opaque(name)),
            None => Err(self.err(format!("{opcode}: instantiating classes is not supported"))),
        }
    }

    fn reduce(&mut self) -> PResult<()> {
        let args_id = self.pop()?;
        let func_id = self.pop()?;
        if let Some(name) = self.opaque_name(func_id) {
            let result = self.opaque_call(name, args_id);
            return self.push_new(result);
        }
        let func = match self.value(func_id) {
            Value::Global(g) => *g,
            other => {
                return Err(self.err(format!(
                    "REDUCE on a {}, not an allowed global",
                    other.kind()
                )))
            }
        };
        // Every allowed callable takes at most 8 arguments; check the
        // length before copying so a huge memoised tuple costs nothing.
        let args = match self.value(args_id) {
            Value::Tuple(items) if items.len() <= 8 => items.clone(),
            Value::Tuple(items) => {
                return Err(self.err(format!(
                    "{} called with {} arguments",
                    func.describe(),
                    items.len()
                )))
            }
            other => {
                return Err(self.err(format!(
                    "arguments of {} are a {}, not a tuple",
                    func.describe(),
                    other.kind()
                )))
            }
        };
        // An allowed callable fed a placeholder cannot be modelled: its
        // result is a placeholder too, named after the argument.
        if let Some(name) = args.iter().find_map(|&a| self.opaque_name(a)) {
            return self.push_new(Value::Opaque(name));
        }
        let result = match func {
            Global::RebuildTensorV2 => {
                if !(6..=7).contains(&args.len()) {
                    return Err(self.err(format!(
                        "_rebuild_tensor_v2 takes 6 or 7 arguments, got {}",
                        args.len()
                    )));
                }
                let t = self.tensor(&args, None)?;
                self.alloc(Value::Tensor(t))?
            }
            Global::RebuildTensorV3 => {
                if !(7..=8).contains(&args.len()) {
                    return Err(self.err(format!(
                        "_rebuild_tensor_v3 takes 7 or 8 arguments, got {}",
                        args.len()
                    )));
                }
                let dtype = match args.get(6).map(|&a| self.value(a)) {
                    Some(Value::Global(Global::DTypeObj(d))) => *d,
                    other => {
                        return Err(self.err(format!(
                            "_rebuild_tensor_v3 dtype argument is a {}",
                            other.map_or("nothing", Value::kind)
                        )))
                    }
                };
                let t = self.tensor(&args, Some(dtype))?;
                self.alloc(Value::Tensor(t))?
            }
            Global::RebuildParameter => {
                if args.len() != 3 {
                    return Err(self.err(format!(
                        "_rebuild_parameter takes 3 arguments, got {}",
                        args.len()
                    )));
                }
                let data = args.first().copied().unwrap_or(NONE_ID);
                if !matches!(self.value(data), Value::Tensor(_)) {
                    return Err(self.err("_rebuild_parameter data is not a tensor"));
                }
                data
            }
            Global::OrderedDict => {
                if !args.is_empty() {
                    return Err(self.err("OrderedDict called with arguments is not supported"));
                }
                self.alloc(Value::Dict(Vec::new()))?
            }
            Global::CodecsEncode => {
                let (text, encoding) = match args.as_slice() {
                    [t, e] => (*t, *e),
                    _ => return Err(self.err("_codecs.encode takes 2 arguments")),
                };
                if !matches!(self.value(encoding), Value::Str(e) if e == "latin1" || e == "latin-1")
                {
                    return Err(self.err("_codecs.encode is only allowed with 'latin1'"));
                }
                let text = match self.value(text) {
                    Value::Str(s) => s,
                    other => return Err(self.err(format!("_codecs.encode of a {}", other.kind()))),
                };
                let bytes: Option<Vec<u8>> = text
                    .chars()
                    .map(|c| u8::try_from(u32::from(c)).ok())
                    .collect();
                let bytes = bytes.ok_or_else(|| self.err("_codecs.encode: text is not latin-1"))?;
                self.charge_string(bytes.len())?;
                self.alloc(Value::Bytes(bytes))?
            }
            Global::StorageType(_) | Global::DTypeObj(_) => {
                return Err(self.err(format!(
                    "{} cannot be called from a pickle",
                    func.describe()
                )))
            }
        };
        self.push(result)
    }

    /// Build a tensor view from `_rebuild_tensor_v2/v3` arguments.
    fn tensor(&self, args: &[Id], dtype: Option<DType>) -> PResult<Tensor> {
        let arg = |i: usize| args.get(i).copied().unwrap_or(NONE_ID);
        let storage = match self.value(arg(0)) {
            Value::Storage(s) => *s,
            other => {
                return Err(self.err(format!(
                    "tensor storage argument is a {}, not a persistent storage",
                    other.kind()
                )))
            }
        };
        let offset = self.int_of(arg(1), "tensor storage offset")?;
        let offset =
            u64::try_from(offset).map_err(|_| self.err("negative tensor storage offset"))?;
        let size = self.dims(arg(2), "size")?;
        let stride = self.dims(arg(3), "stride")?;
        if size.len() != stride.len() {
            return Err(self.err(format!(
                "tensor size has {} dims but stride has {}",
                size.len(),
                stride.len()
            )));
        }
        Ok(Tensor {
            storage,
            dtype: dtype.unwrap_or(storage.dtype),
            offset,
            size,
            stride,
        })
    }

    fn dims(&self, id: Id, what: &str) -> PResult<Vec<u64>> {
        let items = match self.value(id) {
            Value::Tuple(items) | Value::List(items) => items,
            other => {
                return Err(self.err(format!("tensor {what} is a {}, not a tuple", other.kind())))
            }
        };
        if items.len() > self.limits.max_tensor_dims {
            return Err(self.err(format!(
                "tensor {what} has {} dims, more than {}",
                items.len(),
                self.limits.max_tensor_dims
            )));
        }
        items
            .iter()
            .map(|&i| {
                let v = self.int_of(i, &format!("tensor {what} entry"))?;
                u64::try_from(v).map_err(|_| self.err(format!("negative tensor {what} {v}")))
            })
            .collect()
    }

    fn persistent_load(&mut self, pid: Id) -> PResult<Id> {
        let items = match self.value(pid) {
            Value::Tuple(items) if items.len() == 5 => items.clone(),
            Value::Tuple(items) => {
                return Err(self.err(format!(
                    "persistent id has {} fields, expected 5",
                    items.len()
                )))
            }
            other => {
                return Err(self.err(format!("persistent id is a {}, not a tuple", other.kind())))
            }
        };
        let [tag, storage_type, key, location, numel] = items.as_slice() else {
            return Err(self.err(format!(
                "persistent id has {} fields, expected 5",
                items.len()
            )));
        };
        if !matches!(self.value(*tag), Value::Str(s) if s == "storage") {
            return Err(self.err("persistent id is not a ('storage', ...) record"));
        }
        let dtype = match self.value(*storage_type) {
            Value::Global(Global::StorageType(d)) => *d,
            other => {
                return Err(self.err(format!(
                    "persistent id storage type is a {}, not a torch storage class",
                    other.kind()
                )))
            }
        };
        match self.value(*key) {
            Value::Str(k) if !k.is_empty() && k.len() <= 256 => {}
            _ => return Err(self.err("persistent id storage key is not a short string")),
        }
        if !matches!(self.value(*location), Value::Str(_)) {
            return Err(self.err("persistent id location is not a string"));
        }
        let numel = self.int_of(*numel, "storage numel")?;
        let numel = u64::try_from(numel).map_err(|_| self.err("negative storage numel"))?;
        self.alloc(Value::Storage(Storage {
            key: *key,
            dtype,
            numel,
        }))
    }

    // ---- main loop ----

    fn run(&mut self) -> PResult<Id> {
        self.values.push(Value::None);
        self.values.push(Value::Bool(true));
        self.values.push(Value::Bool(false));
        loop {
            self.op_start = self.pos;
            let op = self
                .u8()
                .map_err(|_| self.err("pickle ends without a STOP opcode"))?;
            match op {
                op::PROTO => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return Err(self.err(format!("unsupported pickle protocol {proto}")));
                    }
                }
                op::FRAME => {
                    // FRAME: only a length hint for buffered readers.
                    self.fixed::<8>()?;
                }
                op::STOP => return self.pop(),
                op::MARK => {
                    if self.marks.len() >= self.limits.max_marks {
                        return Err(
                            self.err(format!("more than {} nested MARKs", self.limits.max_marks))
                        );
                    }
                    self.marks.push(self.stack.len());
                }
                op::POP => {
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else {
                        self.pop_mark()?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark()?;
                }
                op::DUP => {
                    let top = self.top()?;
                    self.push(top)?;
                }
                op::NONE => self.push(NONE_ID)?,
                op::NEWTRUE => self.push(TRUE_ID)?,
                op::NEWFALSE => self.push(FALSE_ID)?,
                op::INT => {
                    let text = self.line_str()?.to_owned();
                    match text.as_str() {
                        "00" => self.push(FALSE_ID)?,
                        "01" => self.push(TRUE_ID)?,
                        _ => {
                            let v = self.parse_int_text(&text)?;
                            self.push_new(v)?
                        }
                    }
                }
                op::BININT => {
                    let v = i32::from_le_bytes(self.fixed::<4>()?);
                    self.push_new(Value::Int(i64::from(v)))?
                }
                op::BININT1 => {
                    let v = self.u8()?;
                    self.push_new(Value::Int(i64::from(v)))?
                }
                op::BININT2 => {
                    let v = u16::from_le_bytes(self.fixed::<2>()?);
                    self.push_new(Value::Int(i64::from(v)))?
                }
                op::LONG => {
                    let text = self.line_str()?.to_owned();
                    let v = self.parse_int_text(&text)?;
                    self.push_new(v)?
                }
                op::LONG1 => {
                    let n = self.u8()?;
                    self.push_int_bytes(u64::from(n))?
                }
                op::LONG4 => {
                    let n = i32::from_le_bytes(self.fixed::<4>()?);
                    let n = u64::try_from(n).map_err(|_| self.err("negative LONG4 length"))?;
                    self.push_int_bytes(n)?
                }
                op::FLOAT => {
                    let text = self.line_str()?.trim().to_owned();
                    let v: f64 = text
                        .parse()
                        .map_err(|_| self.err(format!("malformed float literal {text:?}")))?;
                    self.push_new(Value::Float(v))?
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.fixed::<8>()?);
                    self.push_new(Value::Float(v))?
                }
                op::STRING => {
                    let line = self.line()?.to_vec();
                    let inner = self.quoted(&line)?;
                    let v = self.make_str(inner)?;
                    self.push_new(v)?
                }
                op::BINSTRING => {
                    let n = i32::from_le_bytes(self.fixed::<4>()?);
                    let n = u64::try_from(n).map_err(|_| self.err("negative BINSTRING length"))?;
                    self.binary_str(n)?
                }
                op::SHORT_BINSTRING => {
                    let n = self.u8()?;
                    self.binary_str(u64::from(n))?
                }
                op::UNICODE => {
                    let line = self.line()?.to_vec();
                    if line.contains(&b'\\') {
                        return Err(self.err("UNICODE with escape sequences is not supported"));
                    }
                    let v = self.make_str(line)?;
                    self.push_new(v)?
                }
                op::BINUNICODE => {
                    let n = u32::from_le_bytes(self.fixed::<4>()?);
                    self.binary_str(u64::from(n))?
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8()?;
                    self.binary_str(u64::from(n))?
                }
                op::BINUNICODE8 => {
                    let n = u64::from_le_bytes(self.fixed::<8>()?);
                    self.binary_str(n)?
                }
                op::BINBYTES => {
                    let n = u32::from_le_bytes(self.fixed::<4>()?);
                    self.binary_bytes(u64::from(n))?
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8()?;
                    self.binary_bytes(u64::from(n))?
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = u64::from_le_bytes(self.fixed::<8>()?);
                    self.binary_bytes(n)?
                }
                op::EMPTY_TUPLE => self.push_new(Value::Tuple(Vec::new()))?,
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    self.check_len(items.len())?;
                    self.push_new(Value::Tuple(items))?
                }
                op::TUPLE1..=op::TUPLE3 => {
                    let n = usize::from(op - op::TUPLE1) + 1;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push_new(Value::Tuple(items))?
                }
                op::EMPTY_LIST => self.push_new(Value::List(Vec::new()))?,
                op::LIST => {
                    let items = self.pop_mark()?;
                    self.check_len(items.len())?;
                    self.push_new(Value::List(items))?
                }
                op::APPEND => {
                    let item = self.pop()?;
                    let list = self.top()?;
                    self.extend_list(list, vec![item])?
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    self.extend_list(list, items)?
                }
                op::EMPTY_DICT => self.push_new(Value::Dict(Vec::new()))?,
                op::DICT => {
                    let items = self.pop_mark()?;
                    self.check_len(items.len() / 2)?;
                    let dict = self.alloc(Value::Dict(Vec::new()))?;
                    self.set_items(dict, items)?;
                    self.push(dict)?
                }
                op::SETITEM => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let dict = self.top()?;
                    self.set_items(dict, vec![key, value])?
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    let dict = self.top()?;
                    self.set_items(dict, items)?
                }
                op::EMPTY_SET => self.push_new(Value::Set(Vec::new()))?,
                op::ADDITEMS => {
                    let items = self.pop_mark()?;
                    let set = self.top()?;
                    self.extend_list(set, items)?
                }
                op::FROZENSET => {
                    let items = self.pop_mark()?;
                    self.check_len(items.len())?;
                    self.push_new(Value::Set(items))?
                }
                op::GET => {
                    let text = self.line_str()?.trim().to_owned();
                    let index: u64 = text
                        .parse()
                        .map_err(|_| self.err(format!("malformed memo index {text:?}")))?;
                    self.memo_get(index)?
                }
                op::BINGET => {
                    let i = self.u8()?;
                    self.memo_get(u64::from(i))?
                }
                op::LONG_BINGET => {
                    let i = u32::from_le_bytes(self.fixed::<4>()?);
                    self.memo_get(u64::from(i))?
                }
                op::PUT => {
                    let text = self.line_str()?.trim().to_owned();
                    let index: u64 = text
                        .parse()
                        .map_err(|_| self.err(format!("malformed memo index {text:?}")))?;
                    self.memo_put(index)?
                }
                op::BINPUT => {
                    let i = self.u8()?;
                    self.memo_put(u64::from(i))?
                }
                op::LONG_BINPUT => {
                    let i = u32::from_le_bytes(self.fixed::<4>()?);
                    self.memo_put(u64::from(i))?
                }
                op::MEMOIZE => {
                    let index = self.memo.len() as u64;
                    self.memo_put(index)?
                }
                op::GLOBAL => {
                    let module = self.line_str()?.to_owned();
                    let name = self.line_str()?.to_owned();
                    self.global(&module, &name)?
                }
                op::STACK_GLOBAL => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (m, n) = match (self.value(module), self.value(name)) {
                        (Value::Str(m), Value::Str(n)) => (m.clone(), n.clone()),
                        _ => return Err(self.err("STACK_GLOBAL needs two strings")),
                    };
                    self.global(&m, &n)?
                }
                op::INST => {
                    let module = self.line_str()?.to_owned();
                    let name = self.line_str()?.to_owned();
                    if resolve_global(&module, &name).is_some() {
                        return Err(self.err(format!(
                            "INST of {module}.{name}: instantiating classes is not supported"
                        )));
                    }
                    let placeholder = self.placeholder(&module, &name)?;
                    self.pop_mark()?;
                    self.push_new(placeholder)?
                }
                op::OBJ => {
                    // MARK class args... OBJ
                    let items = self.pop_mark()?;
                    let class = items.first().copied().unwrap_or(NONE_ID);
                    self.instantiate(class, "OBJ")?
                }
                op::NEWOBJ => {
                    self.pop()?; // args
                    let class = self.pop()?;
                    self.instantiate(class, "NEWOBJ")?
                }
                op::NEWOBJ_EX => {
                    self.pop()?; // kwargs
                    self.pop()?; // args
                    let class = self.pop()?;
                    self.instantiate(class, "NEWOBJ_EX")?
                }
                op::REDUCE => self.reduce()?,
                op::BUILD => {
                    let state = self.pop()?;
                    let target = self.top()?;
                    let empty = match self.value(state) {
                        Value::None => true,
                        Value::Dict(e) => e.is_empty(),
                        _ => false,
                    };
                    // A placeholder drops the state it is given.
                    if !empty
                        && self.opaque_name(target).is_none()
                        && !self.build_makes_opaque(target)?
                    {
                        return Err(self.err(format!(
                            "BUILD (setting object state) on a {} is not supported",
                            self.value(target).kind()
                        )));
                    }
                }
                op::BINPERSID => {
                    let pid = self.pop()?;
                    let storage = self.persistent_load(pid)?;
                    self.push(storage)?
                }
                op::PERSID => {
                    return Err(self.err("text persistent ids (PERSID) are not torch storages"))
                }
                op::EXT1..=op::EXT4 if self.unknown == UnknownGlobals::Placeholder => {
                    let code = match op {
                        op::EXT1 => u32::from(self.u8()?),
                        op::EXT2 => u32::from(u16::from_le_bytes(self.fixed::<2>()?)),
                        _ => u32::from_le_bytes(self.fixed::<4>()?),
                    };
                    let placeholder =
                        self.placeholder("copyreg._extension_registry", &code.to_string())?;
                    self.push_new(placeholder)?
                }
                op::EXT1..=op::EXT4 => {
                    return Err(PickleError {
                        area: Area::UnsafePickle,
                        offset: self.op_start,
                        message: "pickle names a global through the copyreg extension \
                                  registry (EXT opcode); refusing the file"
                            .into(),
                        global: None,
                    })
                }
                op::NEXT_BUFFER | op::READONLY_BUFFER => {
                    return Err(self.err("out-of-band pickle buffers are not supported"))
                }
                other => {
                    return Err(self.err(format!("unknown pickle opcode 0x{other:02x}")));
                }
            }
        }
    }
}

/// At most 200 characters of a name a hostile file chose, for messages.
fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", s.get(..i).unwrap_or_default()),
        None => s.to_owned(),
    }
}

/// Decode a little-endian two's-complement integer (LONG1/LONG4).
fn decode_long(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Int(0);
    }
    if bytes.len() > 8 {
        return Value::BigInt;
    }
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let mut buf = if negative { [0xffu8; 8] } else { [0u8; 8] };
    for (dst, src) in buf.iter_mut().zip(bytes) {
        *dst = *src;
    }
    Value::Int(i64::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(bytes: &[u8]) -> PResult<Unpickled> {
        unpickle(bytes)
    }

    #[test]
    fn dict_of_scalars() {
        // {'a': 1, 'b': 2.5, 'c': None, 'd': True} at protocol 2
        let mut p = vec![0x80, 2, b'}', b'q', 0, b'('];
        p.extend_from_slice(b"X\x01\x00\x00\x00aK\x01");
        p.extend_from_slice(b"X\x01\x00\x00\x00bG");
        p.extend_from_slice(&2.5f64.to_be_bytes());
        p.extend_from_slice(b"X\x01\x00\x00\x00cN");
        p.extend_from_slice(b"X\x01\x00\x00\x00d\x88u.");
        let u = run(&p).unwrap();
        let get = |k| u.get(u.dict_get(u.root, k).unwrap()).clone();
        assert_eq!(get("a"), Value::Int(1));
        assert_eq!(get("b"), Value::Float(2.5));
        assert_eq!(get("c"), Value::None);
        assert_eq!(get("d"), Value::Bool(true));
        assert_eq!(u.dict_str_keys(u.root), ["a", "b", "c", "d"]);
    }

    #[test]
    fn later_duplicate_key_wins() {
        let p = b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00aK\x02u.";
        let u = run(p).unwrap();
        assert_eq!(u.get(u.dict_get(u.root, "a").unwrap()), &Value::Int(2));
        assert_eq!(u.dict_str_keys(u.root), ["a"]);
    }

    #[test]
    fn long1_signs() {
        assert_eq!(decode_long(&[0xff]), Value::Int(-1));
        assert_eq!(decode_long(&[0x00, 0x01]), Value::Int(256));
        assert_eq!(decode_long(&[0xff, 0x00]), Value::Int(255));
        assert_eq!(decode_long(&[0; 9]), Value::BigInt);
    }

    #[test]
    fn disallowed_global_is_named() {
        let p = b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R.";
        let e = run(p).unwrap_err();
        assert_eq!(e.area, Area::UnsafePickle);
        assert!(e.message.contains("posix.system"), "{e}");
        let p = b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.";
        let e = run(p).unwrap_err();
        assert_eq!(e.area, Area::UnsafePickle);
        assert!(e.message.contains("builtins.eval"), "{e}");
        let p = b"(cos\nsystem\nS'x'\ni.";
        assert_eq!(run(p).unwrap_err().area, Area::UnsafePickle);
    }

    #[test]
    fn unknown_opcode_is_named() {
        let e = run(b"\x80\x02\xff.").unwrap_err();
        assert!(e.message.contains("0xff"), "{e}");
        assert_eq!(e.offset, 2);
    }

    #[test]
    fn truncated_inputs_error() {
        let full = b"\x80\x02X\x05\x00\x00\x00hello.";
        for n in 0..full.len() {
            assert!(run(&full[..n]).is_err(), "prefix {n}");
        }
        // A length prefix far beyond the data must not allocate.
        assert!(run(b"\x80\x02X\xff\xff\xff\xff.").is_err());
        assert!(run(b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff.").is_err());
    }

    #[test]
    fn cyclic_list_is_fine() {
        // l = []; l.append(l)
        let u = run(b"\x80\x02]q\x00h\x00a.").unwrap();
        assert_eq!(u.get(u.root), &Value::List(vec![u.root]));
    }

    #[test]
    fn memo_dense_and_sparse_indices() {
        let mut memo = Memo::default();
        memo.insert(0, 10);
        memo.insert(1_000_000, 11); // far past the end: sparse
        memo.insert(5, 12); // within the slack: dense
        memo.insert(5, 13); // overwrite does not count twice
        assert_eq!(memo.len(), 3);
        assert!(memo.dense.len() < 100);
        for i in 6..2000u32 {
            memo.insert(i, i); // grow the vector past nothing sparse yet
        }
        assert_eq!(
            (memo.get(0), memo.get(5), memo.get(1_000_000)),
            (Some(10), Some(13), Some(11))
        );
        assert_eq!(memo.get(3), None);
        // a sparse index the vector later grows over is still found
        let mut memo = Memo::default();
        memo.insert(100, 1);
        for i in 0..200u32 {
            if i != 100 {
                memo.insert(i, i + 1000);
            }
        }
        assert_eq!(memo.get(100), Some(1));
        memo.insert(100, 2);
        assert_eq!((memo.get(100), memo.len()), (Some(2), 200));
    }

    #[test]
    fn memo_errors() {
        assert!(run(b"\x80\x02h\x05.").is_err());
        assert!(run(b"\x80\x02q\x00.").is_err());
        // huge memo index is fine as a hash key
        let u = run(b"\x80\x02Nr\xff\xff\xff\xffj\xff\xff\xff\xff.").unwrap();
        assert_eq!(u.get(u.root), &Value::None);
    }

    #[test]
    fn limits_hold() {
        let limits = Limits {
            max_marks: 8,
            ..Limits::default()
        };
        let p = [b'('; 9];
        assert!(unpickle_with(&p, limits)
            .unwrap_err()
            .message
            .contains("MARK"));
        let limits = Limits {
            max_stack: 4,
            ..Limits::default()
        };
        assert!(unpickle_with(b"NNNNN.", limits)
            .unwrap_err()
            .message
            .contains("stack"));
        let limits = Limits {
            max_values: 5,
            ..Limits::default()
        };
        assert!(unpickle_with(b"K\x01K\x01K\x01.", limits).is_err());
        let limits = Limits {
            max_container_len: 2,
            ..Limits::default()
        };
        assert!(unpickle_with(b"]NaNaNa.", limits).is_err());
        let limits = Limits {
            max_string_bytes: 4,
            ..Limits::default()
        };
        assert!(unpickle_with(b"X\x05\x00\x00\x00hello.", limits).is_err());
        let limits = Limits {
            max_pickle_bytes: 3,
            ..Limits::default()
        };
        assert!(unpickle_with(b"NNN.", limits).is_err());
    }

    #[test]
    fn stack_underflow_is_an_error() {
        for p in [
            &b"."[..],
            b"a.",
            b"s.",
            b"R.",
            b"t.",
            b"(\x85.",
            b"0.",
            b"2.",
            b"b.",
        ] {
            assert!(run(p).is_err(), "{p:?}");
        }
    }

    #[test]
    fn tensor_rebuild() {
        // _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 6), 1, (2, 2), (3, 1), False, OrderedDict())
        let p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x01K\x02K\x02\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtR.";
        let u = run(p).unwrap();
        let Value::Tensor(t) = u.get(u.root) else {
            panic!("not a tensor: {:?}", u.get(u.root))
        };
        assert_eq!(t.dtype, DType::FLOAT32);
        assert_eq!(t.offset, 1);
        assert_eq!(t.size, [2, 2]);
        assert_eq!(t.stride, [3, 1]);
        assert_eq!(t.storage.numel, 6);
        assert_eq!(u.str_of(t.storage.key), Some("0"));
    }

    #[test]
    fn calling_a_storage_class_is_refused() {
        let e = run(b"ctorch\nFloatStorage\n)R.").unwrap_err();
        assert_eq!(e.area, Area::TrainingState);
    }

    #[test]
    fn codecs_encode_makes_bytes() {
        let u = run(b"c_codecs\nencode\nX\x03\x00\x00\x00\xc3\xbfaX\x06\x00\x00\x00latin1\x86R.")
            .unwrap();
        assert_eq!(u.get(u.root), &Value::Bytes(vec![0xff, b'a']));
    }

    #[test]
    fn protocol_zero_text_opcodes() {
        let u = run(b"(dp0\nS'k'\np1\nI42\nsS'f'\nF1.5\nsS'l'\nL7L\ns.").unwrap();
        assert_eq!(u.get(u.dict_get(u.root, "k").unwrap()), &Value::Int(42));
        assert_eq!(u.get(u.dict_get(u.root, "f").unwrap()), &Value::Float(1.5));
        assert_eq!(u.get(u.dict_get(u.root, "l").unwrap()), &Value::Int(7));
    }

    #[test]
    fn never_panics_on_byte_soup() {
        // A cheap deterministic fuzz: every prefix and every single-byte
        // mutation of a valid tensor pickle must return, never panic.
        let base = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x01K\x02K\x02\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtR.";
        for_prefixes_and_byte_edits(base, 0x9e37_79b9_7f4a_7c15, |bytes| {
            let _ = run(bytes);
        });
    }

    /// Calls `check` on every prefix of `base` and on 16 single-byte
    /// mutations per position (xorshift from `seed`): a cheap, deterministic
    /// fuzz for "returns, never panics".
    fn for_prefixes_and_byte_edits(base: &[u8], seed: u64, mut check: impl FnMut(&[u8])) {
        let mut state = seed;
        for i in 0..base.len() {
            check(&base[..i]);
            for _ in 0..16 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let mut m = base.to_vec();
                m[i] = (state >> 32) as u8;
                check(&m);
            }
        }
    }

    fn lenient(bytes: &[u8]) -> PResult<Unpickled> {
        unpickle_with_policy(bytes, Limits::default(), UnknownGlobals::Placeholder)
    }

    fn opaque(u: &Unpickled) -> Option<&str> {
        match u.get(u.root) {
            Value::Opaque(name) => Some(name),
            _ => None,
        }
    }

    #[test]
    fn placeholders_stand_in_for_unknown_classes() {
        // Cfg() via NEWOBJ, given state by BUILD and items by SETITEMS.
        let p = b"\x80\x02c__main__\nCfg\n)\x81}X\x01\x00\x00\x00aK\x01sb(K\x01K\x02u.";
        assert_eq!(run(p).unwrap_err().area, Area::UnsafePickle);
        assert_eq!(opaque(&lenient(p).unwrap()), Some("__main__.Cfg"));
        // REDUCE on a placeholder, and protocol 0-1's copyreg reconstructor.
        let u = lenient(b"cfoo\nbar\nK\x01\x85R.").unwrap();
        assert_eq!(opaque(&u), Some("foo.bar"));
        let p = b"ccopyreg\n_reconstructor\n(c__main__\nCfg\ncbuiltins\nobject\nNtR.";
        assert_eq!(opaque(&lenient(p).unwrap()), Some("__main__.Cfg"));
        // STACK_GLOBAL, INST, OBJ, NEWOBJ_EX and EXT1.
        let u = lenient(b"\x80\x04\x8c\x03foo\x8c\x03Bar\x93.").unwrap();
        assert_eq!(opaque(&u), Some("foo.Bar"));
        assert_eq!(
            opaque(&lenient(b"(K\x01ifoo\nBar\n.").unwrap()),
            Some("foo.Bar")
        );
        assert_eq!(
            opaque(&lenient(b"(cfoo\nBar\nK\x01o.").unwrap()),
            Some("foo.Bar")
        );
        assert_eq!(
            opaque(&lenient(b"cfoo\nBar\n)}\x92.").unwrap()),
            Some("foo.Bar")
        );
        let u = lenient(b"\x82\x07.").unwrap();
        assert_eq!(opaque(&u), Some("copyreg._extension_registry.7"));
        assert_eq!(run(b"\x82\x07.").unwrap_err().area, Area::UnsafePickle);
        // An allowed callable fed a placeholder gives a placeholder.
        let p = b"ctorch._utils\n_rebuild_parameter\n(cfoo\nT\n)\x81\x89ccollections\nOrderedDict\n)RtR.";
        assert_eq!(opaque(&lenient(p).unwrap()), Some("foo.T"));
        // Instantiating an allowed class stays refused.
        assert!(lenient(b"ccollections\nOrderedDict\n)\x81.").is_err());
        assert!(lenient(b"(icollections\nOrderedDict\n.").is_err());
    }

    #[test]
    fn build_state_on_a_modelled_value() {
        // OrderedDict() given `_metadata` by BUILD, as a module state_dict is.
        let p = b"ccollections\nOrderedDict\n)R}X\x09\x00\x00\x00_metadataK\x01sb.";
        let e = run(p).unwrap_err();
        assert!(e.message.contains("BUILD"), "{e}");
        let u = lenient(p).unwrap();
        assert_eq!(opaque(&u), Some("<dict given state by BUILD>"));
        // The shared None is never turned into a placeholder.
        assert!(lenient(b"N}X\x01\x00\x00\x00aK\x01sb.").is_err());
    }

    #[test]
    fn placeholders_obey_the_caps() {
        let names: Vec<u8> = b"cfoo\nBar\n0"
            .repeat(20)
            .into_iter()
            .chain(*b"N.")
            .collect();
        let limits = Limits {
            max_values: 10,
            ..Limits::default()
        };
        let e = unpickle_with_policy(&names, limits, UnknownGlobals::Placeholder).unwrap_err();
        assert!(e.message.contains("values"), "{e}");
        let limits = Limits {
            max_string_bytes: 50,
            ..Limits::default()
        };
        let e = unpickle_with_policy(&names, limits, UnknownGlobals::Placeholder).unwrap_err();
        assert!(e.message.contains("strings"), "{e}");
        // A 10k-character class name is clipped in the placeholder.
        let mut long = b"c".to_vec();
        long.extend(vec![b'm'; 10_000]);
        long.extend(b"\nX\n.");
        let u = lenient(&long).unwrap();
        assert!(opaque(&u).is_some_and(|n| n.len() < 500));
    }

    #[test]
    fn find_opaque_walks_shared_and_cyclic_graphs() {
        // l = [l, {'k': (1, Cfg())}]
        let p = b"]q\x00(h\x00}X\x01\x00\x00\x00kK\x01cfoo\nCfg\n)\x81\x86se.";
        let u = lenient(p).unwrap();
        assert_eq!(u.find_opaque(u.root), Some("foo.Cfg"));
        assert_eq!(u.any_opaque(), Some("foo.Cfg"));
        let u = lenient(b"]q\x00(h\x00K\x01e.").unwrap();
        assert_eq!(u.find_opaque(u.root), None);
        assert_eq!(u.any_opaque(), None);
    }

    #[test]
    fn placeholder_mode_never_panics_on_byte_soup() {
        let base = b"\x80\x02}(X\x05\x00\x00\x00hparsc__main__\nCfg\n)\x81}X\x01\x00\x00\x00aK\x01sbX\x03\x00\x00\x00optccopyreg\n_reconstructor\n(cfoo\nBar\ncbuiltins\nobject\nNtR\x82\x01\x86u.";
        assert!(lenient(base).is_ok());
        for_prefixes_and_byte_edits(base, 0x2545_f491_4f6c_dd1d, |bytes| {
            let _ = lenient(bytes);
        });
    }
}
