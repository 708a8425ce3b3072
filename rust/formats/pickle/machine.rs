//! The opcode loop: a stack machine over a value arena, every size capped.
//!
//! Values are referred to by index, so shared and cyclic memo references are
//! repeated indices and nothing recurses over the object graph. Globals and
//! calls are handed to `policy` and `torch`; nothing is ever imported.

use std::collections::HashMap;

use super::op;
use super::{Id, Limits, PResult, PickleError, UnknownGlobals, Value};
use crate::error::Area;

/// The pickle memo. Writers number memo entries 0, 1, 2, ... so they live in
/// a vector; an index far past the end (only a hand-made pickle has one)
/// goes to a map, so no index can make the vector grow without bound.
#[derive(Default)]
pub(super) struct Memo {
    pub(super) dense: Vec<Option<Id>>,
    sparse: HashMap<u32, Id>,
    len: usize,
}

/// How far past the vector's end an index may land and still extend it.
const MEMO_DENSE_SLACK: usize = 64;

impl Memo {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, index: u32) -> Option<Id> {
        // An index stored sparsely stays there even once the vector grows past it.
        let dense = self.dense.get(index as usize).copied().flatten();
        dense.or_else(|| self.sparse.get(&index).copied())
    }

    pub(super) fn contains(&self, index: u32) -> bool {
        self.get(index).is_some()
    }

    pub(super) fn insert(&mut self, index: u32, id: Id) {
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

pub(super) const NONE_ID: Id = 0;
pub(super) const TRUE_ID: Id = 1;
pub(super) const FALSE_ID: Id = 2;

pub(super) struct Machine<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) op_start: usize,
    pub(super) limits: Limits,
    pub(super) values: Vec<Value>,
    pub(super) stack: Vec<Id>,
    /// Stack lengths at each MARK.
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) string_bytes: usize,
    pub(super) unknown: UnknownGlobals,
}

impl<'a> Machine<'a> {
    pub(super) fn err(&self, message: impl Into<String>) -> PickleError {
        PickleError {
            area: Area::TrainingState,
            offset: self.op_start,
            message: message.into(),
            global: None,
        }
    }

    // ---- input ----

    pub(super) fn take(&mut self, n: usize) -> PResult<&'a [u8]> {
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

    pub(super) fn fixed<const N: usize>(&mut self) -> PResult<[u8; N]> {
        let s = self.take(N)?;
        <[u8; N]>::try_from(s).map_err(|_| self.err("truncated pickle"))
    }

    pub(super) fn u8(&mut self) -> PResult<u8> {
        Ok(self.fixed::<1>()?[0])
    }

    /// A length prefix that must fit in the remaining input.
    pub(super) fn length(&mut self, n: u64) -> PResult<usize> {
        let remaining = self.data.len().saturating_sub(self.pos);
        match usize::try_from(n) {
            Ok(n) if n <= remaining => Ok(n),
            _ => Err(self.err(format!(
                "length {n} runs past the end of the pickle ({remaining} bytes left)"
            ))),
        }
    }

    /// A newline-terminated argument of a text opcode, without the newline.
    pub(super) fn line(&mut self) -> PResult<&'a [u8]> {
        let data = self.data;
        let rest = data.get(self.pos..).unwrap_or(&[]);
        let n = memchr::memchr(b'\n', rest)
            .ok_or_else(|| self.err("truncated pickle: text argument has no newline"))?;
        let out = rest.get(..n).unwrap_or(&[]);
        self.pos += n + 1;
        Ok(out)
    }

    pub(super) fn line_str(&mut self) -> PResult<&'a str> {
        let line = self.line()?;
        std::str::from_utf8(line).map_err(|_| PickleError {
            area: Area::TrainingState,
            offset: self.op_start,
            message: "text argument is not UTF-8".into(),
            global: None,
        })
    }

    // ---- arena and stack ----

    pub(super) fn alloc(&mut self, v: Value) -> PResult<Id> {
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

    pub(super) fn charge_string(&mut self, n: usize) -> PResult<()> {
        self.string_bytes = self.string_bytes.saturating_add(n);
        if self.string_bytes > self.limits.max_string_bytes {
            return Err(self.err(format!(
                "pickle strings exceed {} bytes in total",
                self.limits.max_string_bytes
            )));
        }
        Ok(())
    }

    pub(super) fn push(&mut self, id: Id) -> PResult<()> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(self.err(format!(
                "pickle stack deeper than {} entries",
                self.limits.max_stack
            )));
        }
        self.stack.push(id);
        Ok(())
    }

    pub(super) fn push_new(&mut self, v: Value) -> PResult<()> {
        let id = self.alloc(v)?;
        self.push(id)
    }

    pub(super) fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    pub(super) fn pop(&mut self) -> PResult<Id> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    pub(super) fn top(&self) -> PResult<Id> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.err("stack underflow"))
    }

    /// Pop everything down to the last MARK, and the mark itself.
    pub(super) fn pop_mark(&mut self) -> PResult<Vec<Id>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        if mark > self.stack.len() {
            return Err(self.err("corrupt MARK"));
        }
        Ok(self.stack.split_off(mark))
    }

    pub(super) fn value(&self, id: Id) -> &Value {
        self.values.get(id as usize).unwrap_or(&Value::None)
    }

    pub(super) fn int_of(&self, id: Id, what: &str) -> PResult<i64> {
        match self.value(id) {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(i64::from(*b)),
            other => Err(self.err(format!("{what} should be an int, found {}", other.kind()))),
        }
    }

    pub(super) fn check_len(&self, len: usize) -> PResult<()> {
        if len > self.limits.max_container_len {
            return Err(self.err(format!(
                "container longer than {} items",
                self.limits.max_container_len
            )));
        }
        Ok(())
    }

    // ---- memo ----

    pub(super) fn memo_put(&mut self, index: u64) -> PResult<()> {
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

    pub(super) fn memo_get(&mut self, index: u64) -> PResult<()> {
        let id = u32::try_from(index)
            .ok()
            .and_then(|i| self.memo.get(i))
            .ok_or_else(|| self.err(format!("memo entry {index} was never stored")))?;
        self.push(id)
    }

    // ---- containers ----

    pub(super) fn extend_list(&mut self, target: Id, items: Vec<Id>) -> PResult<()> {
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

    pub(super) fn set_items(&mut self, target: Id, items: Vec<Id>) -> PResult<()> {
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

    pub(super) fn make_str(&mut self, bytes: Vec<u8>) -> PResult<Value> {
        self.charge_string(bytes.len())?;
        String::from_utf8(bytes)
            .map(Value::Str)
            .map_err(|_| self.err("string is not valid UTF-8"))
    }

    pub(super) fn binary_str(&mut self, len: u64) -> PResult<()> {
        let n = self.length(len)?;
        let bytes = self.take(n)?.to_vec();
        let v = self.make_str(bytes)?;
        self.push_new(v)
    }

    pub(super) fn binary_bytes(&mut self, len: u64) -> PResult<()> {
        let n = self.length(len)?;
        self.charge_string(n)?;
        let bytes = self.take(n)?.to_vec();
        self.push_new(Value::Bytes(bytes))
    }

    pub(super) fn push_int_bytes(&mut self, bytes_len: u64) -> PResult<()> {
        let n = self.length(bytes_len)?;
        let bytes = self.take(n)?;
        let v = decode_long(bytes);
        self.push_new(v)
    }

    pub(super) fn parse_int_text(&self, text: &str) -> PResult<Value> {
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
    pub(super) fn quoted(&self, line: &[u8]) -> PResult<Vec<u8>> {
        let inner = match line {
            [b'\'', inner @ .., b'\''] | [b'"', inner @ .., b'"'] => inner,
            _ => return Err(self.err("STRING argument is not quoted")),
        };
        if inner.contains(&b'\\') {
            return Err(self.err("STRING with escape sequences is not supported"));
        }
        Ok(inner.to_vec())
    }

    pub(super) fn run(&mut self) -> PResult<Id> {
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
                    let placeholder = self.inst(&module, &name)?;
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

/// Decode a little-endian two's-complement integer (LONG1/LONG4).
pub(super) fn decode_long(bytes: &[u8]) -> Value {
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
