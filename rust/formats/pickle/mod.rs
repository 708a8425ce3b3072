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
//!
//! The room: [`op`] names the opcodes, `machine` runs them over the value
//! arena, `policy` is the allow-list and the stand-ins for everything else,
//! and `torch` rebuilds the tensors and storages `torch.save` pickles. This
//! file holds the values a caller reads and the entry points.

use std::sync::Arc;

use crate::error::Area;

mod machine;
pub mod op;
mod policy;
mod torch;

#[cfg(test)]
mod tests;

use machine::{Machine, Memo};
pub use policy::{resolve_global, DType, Global};

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
    /// Boxed: a tensor is several times the size of every other value, and
    /// a state's pickle makes hundreds of small values to one tensor each.
    Tensor(Box<Tensor>),
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

/// Most values reserved before a pickle runs (a larger one grows as it goes).
const VALUES_RESERVED_MAX: usize = 4096;

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
        // About one value per four bytes of pickle (a dlm state's: 2.6 KB,
        // ~1,000 opcodes); reserved up front, not grown a doubling at a time.
        values: Vec::with_capacity((data.len() / 4).min(VALUES_RESERVED_MAX)),
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

/// At most 200 characters of a name a hostile file chose, for messages.
fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", s.get(..i).unwrap_or_default()),
        None => s.to_owned(),
    }
}
