//! `json_dumps`: JSON text of plain Python trees, written in Rust with the
//! same bytes as `json.dumps` (see `io::json_text`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::io::json_text;

/// `json.dumps(value)` with its defaults, for trees of dict (str, int, float,
/// bool or None keys), list, tuple, str, int, float, bool and None: the same
/// text, written in Rust. Anything else raises TypeError, NaN and infinities
/// ValueError (as `allow_nan=False` does), so a caller can fall back.
#[pyfunction]
fn json_dumps(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut out = String::with_capacity(256);
    write_json(&mut out, value, 0)?;
    Ok(out)
}

/// Deeper than this is not a record: refuse rather than recurse on.
const JSON_MAX_DEPTH: usize = 256;

fn write_json(out: &mut String, value: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    if let Ok(x) = value.cast::<PyFloat>() {
        if !json_text::push_f64(out, x.value()) {
            return Err(PyValueError::new_err("NaN and infinities are not JSON"));
        }
    } else if let Ok(list) = value.cast::<PyList>() {
        write_array(out, list.iter(), depth)?;
    } else if let Ok(text) = value.cast::<PyString>() {
        json_text::push_str(out, text.to_str()?);
    } else if let Ok(dict) = value.cast::<PyDict>() {
        if depth >= JSON_MAX_DEPTH {
            return Err(PyValueError::new_err("too deeply nested for JSON"));
        }
        out.push('{');
        for (i, (key, item)) in dict.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            write_key(out, &key)?;
            out.push_str(": ");
            write_json(out, &item, depth + 1)?;
        }
        out.push('}');
    } else if value.is_none() {
        out.push_str("null");
    } else if let Ok(flag) = value.cast::<PyBool>() {
        out.push_str(if flag.is_true() { "true" } else { "false" });
    } else if value.cast::<PyInt>().is_ok() {
        match value.extract::<i64>() {
            Ok(n) => json_text::push_i64(out, n),
            Err(_) => out.push_str(&value.str()?.to_string()),
        }
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        write_array(out, tuple.iter(), depth)?;
    } else {
        let kind = value.get_type().name()?;
        return Err(PyTypeError::new_err(format!("{kind} is not JSON")));
    }
    Ok(())
}

fn write_array<'py>(
    out: &mut String,
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<()> {
    if depth >= JSON_MAX_DEPTH {
        return Err(PyValueError::new_err("too deeply nested for JSON"));
    }
    out.push('[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_json(out, &item, depth + 1)?;
    }
    out.push(']');
    Ok(())
}

/// A dict key as `json.dumps` writes it: keys that are not strings become
/// their JSON text, quoted.
fn write_key(out: &mut String, key: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(text) = key.cast::<PyString>() {
        json_text::push_str(out, text.to_str()?);
        return Ok(());
    }
    let is_scalar = key.is_none()
        || key.cast::<PyFloat>().is_ok()
        || key.cast::<PyBool>().is_ok()
        || key.cast::<PyInt>().is_ok();
    if !is_scalar {
        let kind = key.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "keys must be str, int, float, bool or None, not {kind}"
        )));
    }
    let mut text = String::new();
    write_json(&mut text, key, 0)?;
    json_text::push_str(out, &text);
    Ok(())
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(json_dumps, m)?)?;
    Ok(())
}
