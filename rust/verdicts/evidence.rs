//! A verdict's evidence: an ordered tree of plain values, written straight
//! to JSON text (as Python's `json.dumps` writes it, non-finite floats as
//! `null` as the records' `json_safe` does) or converted to Python dicts.
//!
//! Keys keep their insertion order, as Python dicts do, so the JSON of a
//! record is the same text whichever side built it.

use std::borrow::Cow;

use crate::io::json_text;

/// One evidence value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    /// NaN and infinities stay as they are in Python and become `null` in JSON.
    Float(f64),
    Text(String),
    List(Vec<Value>),
    Map(Evidence),
    /// `[[step, value], ...]`, a sampled series (Python: a list of
    /// `(int, float | None)` tuples, non-finite values as None).
    Points(Vec<(i64, f64)>),
}

/// An evidence key: a literal almost always, so it costs no allocation
/// (a store's records hold about a hundred keys, each made and freed).
pub type Key = Cow<'static, str>;

/// An ordered string-keyed map of values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Evidence(pub Vec<(Key, Value)>);

impl Evidence {
    pub fn new() -> Evidence {
        Evidence(Vec::new())
    }

    /// Set `key` to `value`: replaces the value in place when the key is
    /// there (keeping its position, as a Python dict does), else appends.
    pub fn put(&mut self, key: impl Into<Key>, value: impl Into<Value>) {
        let (key, value) = (key.into(), value.into());
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// Every entry of `other`, put in order (Python's `{**a, **b}`).
    pub fn extend(&mut self, other: Evidence) {
        for (k, v) in other.0 {
            self.put(k, v);
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Append this map as JSON text.
    pub fn write_json(&self, out: &mut String) {
        out.push('{');
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            json_text::push_str(out, k);
            out.push_str(": ");
            v.write_json(out);
        }
        out.push('}');
    }
}

/// A float as JSON: `repr(x)`, or `null` where it is not finite.
pub fn push_float(out: &mut String, x: f64) {
    if !json_text::push_f64(out, x) {
        out.push_str("null");
    }
}

impl Value {
    /// Append this value as JSON text.
    pub fn write_json(&self, out: &mut String) {
        match self {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(n) => json_text::push_i64(out, *n),
            Value::Float(x) => push_float(out, *x),
            Value::Text(s) => json_text::push_str(out, s),
            Value::List(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_json(out);
                }
                out.push(']');
            }
            Value::Map(map) => map.write_json(out),
            Value::Points(points) => {
                out.push('[');
                for (i, (step, y)) in points.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push('[');
                    json_text::push_i64(out, *step);
                    out.push_str(", ");
                    push_float(out, *y);
                    out.push(']');
                }
                out.push(']');
            }
        }
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}
impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Int(n)
    }
}
impl From<i32> for Value {
    fn from(n: i32) -> Value {
        Value::Int(n.into())
    }
}
impl From<u32> for Value {
    fn from(n: u32) -> Value {
        Value::Int(n.into())
    }
}
impl From<usize> for Value {
    fn from(n: usize) -> Value {
        Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Value {
        Value::Float(x)
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Text(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Text(s)
    }
}
impl From<Evidence> for Value {
    fn from(e: Evidence) -> Value {
        Value::Map(e)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}
impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(items: Vec<T>) -> Value {
        Value::List(items.into_iter().map(Into::into).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_is_python_json_dumps_with_nonfinite_as_null() {
        let mut inner = Evidence::new();
        inner.put("x", 1.5);
        let mut e = Evidence::new();
        e.put("rules", "robust");
        e.put("n", 3usize);
        e.put("nan", f64::NAN);
        e.put("flag", true);
        e.put("none", Option::<f64>::None);
        e.put("curve", Value::Points(vec![(1, 2.0), (2, f64::INFINITY)]));
        e.put("inner", inner);
        e.put("list", vec![1e-5, 1e16]);
        e.put("n", 4usize); // replaced in place
        let mut out = String::new();
        e.write_json(&mut out);
        assert_eq!(
            out,
            "{\"rules\": \"robust\", \"n\": 4, \"nan\": null, \"flag\": true, \"none\": null, \
             \"curve\": [[1, 2.0], [2, null]], \"inner\": {\"x\": 1.5}, \"list\": [1e-05, 1e+16]}"
        );
    }
}
