//! Read a safetensors header without touching the tensor data.
//!
//! The format is an 8-byte little-endian length N, N bytes of JSON, then the
//! data. We read exactly 8 + N bytes, refuse N beyond a cap or beyond the
//! file, and check every tensor's offsets against the data section.

use std::path::Path;
use std::sync::Arc;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Area, Error, Result};
use crate::io::files::Opened;
use crate::io::lfs;
use crate::io::read_once::{self, Content};
use crate::io::staged;

/// Largest header we accept (the reference implementation uses the same cap).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// One tensor entry of a safetensors header.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data_offsets: (u64, u64),
}

/// A parsed safetensors header (exposed to Python as `SafetensorsHeader`).
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(
        frozen,
        name = "SafetensorsHeader",
        skip_from_py_object,
        module = "adapterprobe._core"
    )
)]
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Tensors in the order the header lists them.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` map, when present.
    pub metadata: Option<Vec<(String, String)>>,
    /// Bytes of the data section (file size - 8 - N).
    pub data_len: u64,
}

/// Element width in bits of a safetensors dtype, or None for an unknown one.
pub fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        _ => return None,
    })
}

/// Read and validate the header of the safetensors file at `path`.
pub fn read_header(path: &Path) -> Result<Header> {
    let content = read_once::content(path, Area::Header)?;
    Ok(Header::clone(&*shared_header_of(path, &content)?))
}

/// [`header_of`], parsed once per store for a small file (see
/// `io::read_once`): the weights and gradient probes both read an adapter's
/// header.
pub fn shared_header_of(path: &Path, content: &Content) -> Result<Arc<Header>> {
    match content {
        Content::Whole(_) => {
            read_once::derived("safetensors header", path, || header_of(path, content))
        }
        Content::Open(_) => header_of(path, content).map(Arc::new),
    }
}

/// Read and validate the header of the safetensors file at `path` from its
/// opened `content`, which the caller goes on to read the data from.
pub fn header_of(path: &Path, content: &Content) -> Result<Header> {
    match content {
        Content::Whole(bytes) => header_in(path, bytes.len() as u64, |at, buf| {
            let start = usize::try_from(at).unwrap_or(usize::MAX);
            let part = bytes
                .get(start..start.saturating_add(buf.len()))
                .ok_or(ReadFail::Io(std::io::ErrorKind::UnexpectedEof.into()))?;
            buf.copy_from_slice(part);
            Ok(())
        }),
        Content::Open(Opened { file, len }) => header_in(path, *len, |at, buf| {
            // A staged remote file fetches the range before it is read.
            staged::fill(path, Area::Header, at, buf.len() as u64).map_err(ReadFail::Fetch)?;
            read_exact_at(file, buf, at).map_err(ReadFail::Io)
        }),
    }
}

#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(not(unix))]
fn read_exact_at(mut file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    file.seek(SeekFrom::Start(at))?;
    file.read_exact(buf)
}

/// Why a read of the header failed: the file, or fetching a staged range.
enum ReadFail {
    Io(std::io::Error),
    Fetch(Error),
}

/// The header of a safetensors file of `file_len` bytes whose bytes
/// `read(offset, buf)` fills.
fn header_in(
    path: &Path,
    file_len: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> std::result::Result<(), ReadFail>,
) -> Result<Header> {
    let err = |msg: String| Error::new(Area::Header, path, msg);
    let failed = |what: &str, fail: ReadFail| match fail {
        ReadFail::Io(e) => err(format!("cannot read {what}: {e}")),
        ReadFail::Fetch(e) => e,
    };
    if file_len < 8 {
        return Err(err(format!(
            "truncated: {file_len} bytes, a safetensors file starts with an 8-byte header length"
        )));
    }
    let mut len_bytes = [0u8; 8];
    read(0, &mut len_bytes).map_err(|f| failed("the header length", f))?;
    let n = u64::from_le_bytes(len_bytes);
    if n > file_len - 8 {
        // A Git LFS pointer's "version " reads as a length of 8e18.
        if let Some(e) = lfs::pointer_error_at(Area::Header, path, &len_bytes) {
            return Err(e);
        }
    }
    if n > MAX_HEADER_BYTES {
        return Err(err(format!(
            "header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit (corrupt or hostile file)"
        )));
    }
    if n > file_len - 8 {
        return Err(err(format!(
            "header length {n} runs past the end of the file ({file_len} bytes)"
        )));
    }
    let mut buf = vec![0u8; n as usize];
    read(8, &mut buf).map_err(|f| failed(&format!("the {n}-byte header"), f))?;
    parse_header(&buf, file_len - 8 - n).map_err(err)
}

/// Parse header JSON; `data_len` is the size of the data section that follows.
pub fn parse_header(json: &[u8], data_len: u64) -> std::result::Result<Header, String> {
    let text = std::str::from_utf8(json).map_err(|e| format!("header is not UTF-8: {e}"))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let top = TopLevel::deserialize(&mut de)
        .and_then(|top| de.end().map(|()| top))
        .map_err(|e| format!("header is not valid JSON: {e}"))?;
    let TopLevel::Object(entries) = top else {
        return Err("header is not a JSON object".into());
    };
    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = None;
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    for (name, entry) in entries {
        if !seen.insert(name.clone()) {
            return Err(format!("tensor {name:?} appears twice in the header"));
        }
        match entry {
            // mlx's `save_safetensors` writes `"__metadata__": null`, which
            // the safetensors library reads as no metadata.
            RawEntry::Metadata(serde_json::Value::Null) => metadata = None,
            RawEntry::Metadata(value) => metadata = Some(parse_metadata(&value)?),
            RawEntry::Tensor(fields) => tensors.push(parse_tensor(name, fields, data_len)?),
            RawEntry::NotObject => return Err(format!("tensor {name:?}: entry is not an object")),
        }
    }
    Ok(Header {
        tensors,
        metadata,
        data_len,
    })
}

// ---- one-pass deserialization: no generic map per entry, no key strings ----

/// The header document: an object of entries, or something else.
enum TopLevel {
    Object(Vec<(String, RawEntry)>),
    Other,
}

/// One entry's value: `__metadata__`, a tensor's three fields, or not an object.
enum RawEntry {
    Metadata(Value),
    Tensor(RawTensor),
    NotObject,
}

#[derive(Default)]
struct RawTensor {
    dtype: Option<Value>,
    shape: Option<Value>,
    data_offsets: Option<Value>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum TensorField {
    Dtype,
    Shape,
    DataOffsets,
    #[serde(other)]
    Other,
}

/// Accept any JSON value; maps are handed to `on_map`, anything else gives `other`.
macro_rules! non_map_visits {
    ($other:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            while seq.next_element::<de::IgnoredAny>()?.is_some() {}
            Ok($other)
        }
    };
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLevel;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            non_map_visits!(TopLevel::Other);
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<TopLevel, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(name) = map.next_key::<String>()? {
                    let entry = if name == "__metadata__" {
                        RawEntry::Metadata(map.next_value()?)
                    } else {
                        map.next_value()?
                    };
                    entries.push((name, entry));
                }
                Ok(TopLevel::Object(entries))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for RawEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a tensor entry")
            }
            non_map_visits!(RawEntry::NotObject);
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<RawEntry, A::Error> {
                let mut t = RawTensor::default();
                while let Some(field) = map.next_key::<TensorField>()? {
                    match field {
                        TensorField::Dtype => t.dtype = Some(map.next_value()?),
                        TensorField::Shape => t.shape = Some(map.next_value()?),
                        TensorField::DataOffsets => t.data_offsets = Some(map.next_value()?),
                        TensorField::Other => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(RawEntry::Tensor(t))
            }
        }
        d.deserialize_any(V)
    }
}

fn parse_metadata(entry: &Value) -> std::result::Result<Vec<(String, String)>, String> {
    let Value::Object(map) = entry else {
        return Err("__metadata__ is not an object of strings".into());
    };
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(format!("__metadata__[{k:?}] is not a string")),
        })
        .collect()
}

fn parse_tensor(
    name: String,
    fields: RawTensor,
    data_len: u64,
) -> std::result::Result<TensorInfo, String> {
    let bad = |what: &str| format!("tensor {name:?}: {what}");
    let dtype = match fields.dtype {
        Some(Value::String(s)) => s,
        _ => return Err(bad("missing or non-string \"dtype\"")),
    };
    let bits = dtype_bits(&dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype:?}")))?;
    let shape: Vec<u64> = match fields.shape {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| d.as_u64().ok_or_else(|| bad("shape holds a non-integer")))
            .collect::<std::result::Result<_, _>>()?,
        _ => return Err(bad("missing or non-list \"shape\"")),
    };
    let (begin, end) = match fields.data_offsets {
        Some(Value::Array(pair)) if pair.len() == 2 => match (pair[0].as_u64(), pair[1].as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => return Err(bad("data_offsets are not non-negative integers")),
        },
        _ => return Err(bad("missing \"data_offsets\" pair")),
    };
    if begin > end || end > data_len {
        return Err(bad(&format!(
            "data_offsets [{begin}, {end}] fall outside the {data_len}-byte data section"
        )));
    }
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("shape overflows"))?;
    let expected_bytes = numel
        .checked_mul(bits)
        .map(|b| b.div_ceil(8))
        .ok_or_else(|| bad("shape overflows"))?;
    if expected_bytes != end - begin {
        return Err(bad(&format!(
            "{dtype} shape {shape:?} needs {expected_bytes} bytes but data_offsets span {}",
            end - begin
        )));
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        data_offsets: (begin, end),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        path
    }

    fn safetensors(header: &str, data_len: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data_len));
        out
    }

    #[test]
    fn a_git_lfs_pointer_is_named() {
        use crate::io::lfs::tests::{assert_names_pointer, cloned_without_lfs};
        let real = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("rust/testdata/weights/llama_trained/adapter_model.safetensors");
        let dir = tempfile::tempdir().unwrap();
        let (pointer, size) = cloned_without_lfs(&real, dir.path());
        let e = read_header(&pointer).unwrap_err();
        assert_eq!(e.area, Area::Header);
        assert_names_pointer(&e, &pointer, size);
    }

    #[test]
    fn reads_a_valid_header() {
        let dir = tempfile::tempdir().unwrap();
        let h = r#"{"__metadata__":{"format":"pt"},"a.lora_A.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
        let path = write_file(&dir, "x.safetensors", &safetensors(h, 24));
        let header = read_header(&path).unwrap();
        assert_eq!(header.tensors.len(), 1);
        assert_eq!(header.tensors[0].shape, vec![2, 3]);
        assert_eq!(header.tensors[0].data_offsets, (0, 24));
        assert_eq!(
            header.metadata,
            Some(vec![("format".to_string(), "pt".to_string())])
        );
    }

    #[test]
    fn a_null_metadata_is_none_as_mlx_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let h = r#"{"__metadata__":null,"x.lora_a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
        let path = write_file(&dir, "adapters.safetensors", &safetensors(h, 24));
        assert_eq!(read_header(&path).unwrap().metadata, None);
        let h = r#"{"__metadata__":[1],"x.lora_a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
        let path = write_file(&dir, "bad.safetensors", &safetensors(h, 24));
        assert!(read_header(&path).is_err());
    }

    #[test]
    fn refuses_huge_header_length_without_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = (1u64 << 62).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let path = write_file(&dir, "huge.safetensors", &bytes);
        let e = read_header(&path).unwrap_err();
        assert_eq!(e.area, Area::Header);
        assert!(e.message.contains("limit"), "{e}");
    }

    #[test]
    fn refuses_length_past_end_of_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = 1000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let path = write_file(&dir, "short.safetensors", &bytes);
        assert!(read_header(&path)
            .unwrap_err()
            .message
            .contains("past the end"));
    }

    #[test]
    fn refuses_truncated_file_and_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(&dir, "t.safetensors", b"abc");
        assert!(read_header(&path)
            .unwrap_err()
            .message
            .contains("truncated"));
        assert!(read_header(dir.path())
            .unwrap_err()
            .message
            .contains("directory"));
    }

    #[test]
    fn refuses_bad_json_utf8_and_offsets() {
        assert!(parse_header(b"{not json", 0).unwrap_err().contains("JSON"));
        assert!(parse_header(b"{\"\xff\":1}", 0)
            .unwrap_err()
            .contains("UTF-8"));
        let out_of_range = br#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        assert!(parse_header(out_of_range, 8)
            .unwrap_err()
            .contains("outside"));
        let wrong_size = br#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}"#;
        assert!(parse_header(wrong_size, 8)
            .unwrap_err()
            .contains("needs 16 bytes"));
        let reversed = br#"{"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#;
        assert!(parse_header(reversed, 8).is_err());
        let twice = br#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(parse_header(twice, 8).unwrap_err().contains("twice"));
        let bad_dtype = br#"{"t":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(parse_header(bad_dtype, 8)
            .unwrap_err()
            .contains("unknown dtype"));
        assert!(parse_header(b"[]", 0).unwrap_err().contains("object"));
    }

    #[test]
    fn overflowing_shape_is_an_error() {
        let h = br#"{"t":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
        assert!(parse_header(h, 8).unwrap_err().contains("overflow"));
    }
}
