//! The torch side of the allow-list: calls (`REDUCE`) of allowed globals,
//! tensor views from `_rebuild_tensor_v2/v3`, and storages from persistent
//! ids, each a pure data transformation over the arena.

use super::machine::{Machine, NONE_ID};
use super::{DType, Global, Id, PResult, Storage, Tensor, Value};

impl Machine<'_> {
    pub(super) fn reduce(&mut self) -> PResult<()> {
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
                self.alloc(Value::Tensor(Box::new(t)))?
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
                self.alloc(Value::Tensor(Box::new(t)))?
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
    pub(super) fn tensor(&self, args: &[Id], dtype: Option<DType>) -> PResult<Tensor> {
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

    pub(super) fn dims(&self, id: Id, what: &str) -> PResult<Vec<u64>> {
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

    pub(super) fn persistent_load(&mut self, pid: Id) -> PResult<Id> {
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
}
