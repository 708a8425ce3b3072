//! Read scalar series from TensorBoard event files (`events.out.tfevents.*`).
//!
//! An event file is a sequence of records, `u64 length | u32 masked
//! crc32c(length bytes) | data | u32 masked crc32c(data)`, each `data` a
//! protobuf `Event`. Both checksums are verified: a mismatch is corruption
//! and an error naming the record's byte offset. A file that ends inside a
//! record is a torn write (a run killed mid-flush, or one still running) and
//! is read up to that record, like a torn last log line.
//!
//! Scalars come in two shapes: `simple_value` (torch's `SummaryWriter`,
//! Lightning, HF Trainer) and a one-element DT_FLOAT/DT_DOUBLE `tensor`
//! (TF2 writers and torch's `new_style`), whose value sits in
//! `tensor_content`, `float_val` or `double_val`. A tag whose plugin
//! metadata names another plugin (text, histograms...) is not a scalar.
//!
//! The protobuf decoding is hand-written: we need a dozen fields of five
//! messages, and a decoder that skips every other field of every wire type
//! with explicit bounds is smaller than a code-generation dependency. Files
//! stream through a buffer; memory is bounded by the largest record, which
//! is capped and never allowed past the end of the file.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::io::files::open_regular;
use crate::io::walk::files_under;

/// Largest record accepted (TensorBoard's own reader has no cap; real
/// scalar, histogram and text events are far below this).
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

/// Loss tags tried, in order, when the caller names none: HF Trainer,
/// Lightning (`self.log("train_loss")`), the same logged with
/// on_step+on_epoch, a bare `loss`, and the step series of a `train/loss`
/// logged by Lightning with on_step+on_epoch.
pub const DEFAULT_LOSS_TAGS: [&str; 5] = [
    "train/loss",
    "train_loss",
    "train_loss_step",
    "loss",
    "train/loss_step",
];

/// Most distinct tags (scalar, and non-scalar ones) remembered across the
/// files of one read; more is a corrupt or hostile file.
pub const MAX_TAGS: usize = 100_000;

/// Deepest nesting of (deprecated) protobuf groups skipped.
const MAX_GROUP_DEPTH: usize = 32;

/// One record's framing: length, its checksum, and the data checksum.
const HEADER_BYTES: u64 = 12;
const FOOTER_BYTES: u64 = 4;

/// DataType enum values of TensorFlow's `types.proto`.
const DT_FLOAT: u64 = 1;
const DT_DOUBLE: u64 = 2;

/// The points of one scalar tag, read from one or more event files.
// `skip_from_py_object`: a result is only handed to Python, never taken
// back, and pyo3 0.29 asks Clone types to choose.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScalarSeries {
    /// The tag read (the caller's, or the first of `DEFAULT_LOSS_TAGS` present).
    pub tag: String,
    /// `(step, value)` in reading order: files by name, records in file
    /// order. Not deduplicated; NaN and infinities kept as logged.
    pub points: Vec<(i64, f64)>,
    /// Every scalar tag seen, sorted.
    pub tags: Vec<String>,
    /// The files read, in reading order.
    pub files: Vec<PathBuf>,
    /// Files that ended inside a record (read up to it).
    pub torn_files: Vec<PathBuf>,
}

/// Whether a file name is a TensorBoard event file's.
pub fn is_event_file_name(name: &str) -> bool {
    name.starts_with("events.out.tfevents.")
}

/// Event files at `source`: the file itself, or those found up to
/// [`MAX_SEARCH_DEPTH`](crate::io::walk::MAX_SEARCH_DEPTH) directories below it (HF writes
/// `runs/<date>_<host>/`, Lightning `lightning_logs/version_N/`), sorted by
/// file name, which starts with the creation time.
pub fn event_files(source: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(source).map_err(|e| Error::io(Area::LogFormat, source, &e))?;
    if !meta.is_dir() {
        return Ok(vec![source.to_path_buf()]);
    }
    files_under(source, Area::LogFormat, is_event_file_name)
}

/// The scalar tags present in `files`, sorted.
pub fn scalar_tags(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut collector = Collector::new(&[]);
    for path in by_name(files) {
        read_file(path, &mut collector)?;
    }
    Ok(collector.tags.into_iter().collect())
}

/// Read the points of `tag` (or of the first `DEFAULT_LOSS_TAGS` entry
/// present) from `files`, read in file-name order.
pub fn read_scalar_series(files: &[PathBuf], tag: Option<&str>) -> Result<ScalarSeries> {
    let wanted: Vec<&str> = match tag {
        Some(tag) => vec![tag],
        None => DEFAULT_LOSS_TAGS.to_vec(),
    };
    let ordered = by_name(files);
    let mut collector = Collector::new(&wanted);
    let mut torn_files = vec![];
    for path in &ordered {
        if read_file(path, &mut collector)? == Ending::Torn {
            torn_files.push(path.to_path_buf());
        }
    }
    let chosen = collector.points.iter().position(|p| !p.is_empty());
    let Some(index) = chosen else {
        return Err(missing_tag_error(files, tag, &collector.tags));
    };
    Ok(ScalarSeries {
        tag: wanted[index].to_string(),
        points: std::mem::take(&mut collector.points[index]),
        tags: collector.tags.into_iter().collect(),
        files: ordered.into_iter().cloned().collect(),
        torn_files,
    })
}

fn by_name(files: &[PathBuf]) -> Vec<&PathBuf> {
    let mut ordered: Vec<&PathBuf> = files.iter().collect();
    ordered.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    ordered
}

/// The path an error about several files names: their common directory.
fn common_path(files: &[PathBuf]) -> PathBuf {
    let Some(first) = files.first() else {
        return PathBuf::new();
    };
    if files.len() == 1 {
        return first.clone();
    }
    let mut common: PathBuf = first.parent().map(Path::to_path_buf).unwrap_or_default();
    while !files.iter().all(|f| f.starts_with(&common)) {
        if !common.pop() {
            break;
        }
    }
    common
}

fn missing_tag_error(files: &[PathBuf], tag: Option<&str>, tags: &BTreeSet<String>) -> Error {
    let path = common_path(files);
    const SHOWN: usize = 30;
    let mut present: Vec<&str> = tags.iter().map(String::as_str).take(SHOWN).collect();
    if tags.len() > SHOWN {
        present.push("...");
    }
    let present = if tags.is_empty() {
        "none".to_string()
    } else {
        present.join(", ")
    };
    let where_ = match files.len() {
        0 => "no TensorBoard event files found".to_string(),
        1 => "the event file".to_string(),
        n => format!("{n} event files"),
    };
    let message = match tag {
        Some(tag) => format!("no scalar tagged {tag:?} in {where_}; scalar tags present: {present}"),
        None => format!(
            "none of the loss tags {} in {where_}; scalar tags present: {present}; name the tag to read",
            DEFAULT_LOSS_TAGS.join(", ")
        ),
    };
    Error::new(Area::LogFormat, path, message)
}

// ---- CRC32C (Castagnoli), table-driven ----

const CRC32C_POLY_REFLECTED: u32 = 0x82F6_3B78;

static CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut crc = n as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ CRC32C_POLY_REFLECTED
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[n] = crc;
        n += 1;
    }
    table
};

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc = CRC32C_TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The masked CRC32C TensorFlow's record format stores.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    // ((crc >> 15) | (crc << 17)) + 0xa282ead8, wrapping
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

// ---- record framing ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Complete,
    Torn,
}

enum Next {
    Record,
    End(Ending),
}

/// Reads records one at a time into a reused buffer.
struct Records<R> {
    reader: R,
    /// Byte offset of the next record.
    offset: u64,
    /// Byte offset of the record in `data`.
    start: u64,
    /// Bytes of the file when opened; anything appended later is ignored.
    file_len: u64,
    data: Vec<u8>,
}

/// Fill `buf`; false when the input ends first.
fn fill<R: Read>(reader: &mut R, buf: &mut [u8]) -> std::result::Result<bool, String> {
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

impl<R: Read> Records<R> {
    fn new(reader: R, file_len: u64) -> Self {
        Records {
            reader,
            offset: 0,
            start: 0,
            file_len,
            data: Vec::new(),
        }
    }

    fn next(&mut self) -> std::result::Result<Next, String> {
        let at = self.offset;
        let remaining = self.file_len.saturating_sub(at);
        if remaining == 0 {
            return Ok(Next::End(Ending::Complete));
        }
        let torn = Ok(Next::End(Ending::Torn));
        let mut header = [0u8; HEADER_BYTES as usize];
        if remaining < HEADER_BYTES || !fill(&mut self.reader, &mut header)? {
            return torn;
        }
        let (len_bytes, len_crc) = header.split_at(8);
        if masked_crc32c(len_bytes) != le_u32(len_crc) {
            return Err(format!(
                "record at byte {at}: the length checksum does not match (corrupt file)"
            ));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().map_err(|_| "short header")?);
        if len > MAX_RECORD_BYTES {
            return Err(format!(
                "record at byte {at} claims {len} bytes, more than the {} MiB limit (corrupt or hostile file)",
                MAX_RECORD_BYTES >> 20
            ));
        }
        if HEADER_BYTES + len + FOOTER_BYTES > remaining {
            return torn;
        }
        self.data.clear();
        self.data.resize(len as usize, 0);
        let mut data_crc = [0u8; FOOTER_BYTES as usize];
        if !fill(&mut self.reader, &mut self.data)? || !fill(&mut self.reader, &mut data_crc)? {
            return torn; // the file shrank while we read it
        }
        if masked_crc32c(&self.data) != le_u32(&data_crc) {
            return Err(format!(
                "record at byte {at}: the data checksum does not match (corrupt file)"
            ));
        }
        self.start = at;
        self.offset = at + HEADER_BYTES + len + FOOTER_BYTES;
        Ok(Next::Record)
    }
}

fn le_u32(b: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&b[..4]);
    u32::from_le_bytes(word)
}

// ---- protobuf wire format ----

/// One field's payload.
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
    /// A skipped (deprecated) group.
    Group,
}

/// Iterates the fields of one message.
struct Fields<'a> {
    b: &'a [u8],
    i: usize,
}

type Decode<T> = std::result::Result<T, &'static str>;

impl<'a> Fields<'a> {
    fn new(b: &'a [u8]) -> Self {
        Fields { b, i: 0 }
    }

    fn varint(&mut self) -> Decode<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.i).ok_or("truncated varint")?;
            self.i += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                // The tenth byte may only carry the top bit of a u64.
                if shift == 63 && byte > 1 {
                    return Err("varint overflows 64 bits");
                }
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes")
    }

    fn take(&mut self, n: u64) -> Decode<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.i.checked_add(n))
            .filter(|&end| end <= self.b.len())
            .ok_or("a field runs past the end of its message")?;
        let bytes = &self.b[self.i..end];
        self.i = end;
        Ok(bytes)
    }

    fn fixed<const N: usize>(&mut self) -> Decode<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    /// A field key: (field number, wire type).
    fn key(&mut self) -> Decode<(u64, u8)> {
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 {
            return Err("field number 0");
        }
        Ok((number, (key & 7) as u8))
    }

    fn payload(&mut self, wire_type: u8, number: u64) -> Decode<Wire<'a>> {
        Ok(match wire_type {
            0 => Wire::Varint(self.varint()?),
            1 => Wire::Fixed64(self.fixed()?),
            2 => {
                let len = self.varint()?;
                Wire::Bytes(self.take(len)?)
            }
            3 => {
                self.skip_group(number)?;
                Wire::Group
            }
            5 => Wire::Fixed32(self.fixed()?),
            4 => return Err("an end-group marker without its start"),
            _ => return Err("an unknown wire type"),
        })
    }

    /// Skip a group's fields up to its matching end marker, without recursion.
    fn skip_group(&mut self, number: u64) -> Decode<()> {
        let mut open = vec![number];
        while let Some(&innermost) = open.last() {
            let (n, wire_type) = self.key()?;
            match wire_type {
                3 if open.len() >= MAX_GROUP_DEPTH => return Err("groups nested too deep"),
                3 => open.push(n),
                4 if n == innermost => {
                    open.pop();
                }
                4 => return Err("mismatched end-group marker"),
                _ => {
                    self.payload(wire_type, n)?;
                }
            }
        }
        Ok(())
    }

    fn next_field(&mut self) -> Decode<Option<(u64, Wire<'a>)>> {
        if self.i >= self.b.len() {
            return Ok(None);
        }
        let (number, wire_type) = self.key()?;
        Ok(Some((number, self.payload(wire_type, number)?)))
    }
}

// ---- Event / Summary / Value / TensorProto ----

/// How a value holds its scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reading {
    /// `simple_value`: always a scalar.
    Simple(f64),
    /// A one-element float tensor: a scalar unless its tag's metadata names
    /// another plugin.
    Tensor(f64),
}

/// One `Summary.Value` as far as scalars are concerned.
struct SummaryValue<'a> {
    tag: &'a [u8],
    plugin: Option<&'a [u8]>,
    reading: Option<Reading>,
}

/// What one `Summary.Value` holds.
struct ValueFields<'a> {
    tag: &'a [u8],
    /// The oneof `value`: the last of simple_value / tensor wins.
    kind: Option<Wire<'a>>,
    plugin: Option<&'a [u8]>,
}

fn value_fields(b: &[u8]) -> Decode<ValueFields<'_>> {
    let mut out = ValueFields {
        tag: &[],
        kind: None,
        plugin: None,
    };
    let mut fields = Fields::new(b);
    while let Some((number, wire)) = fields.next_field()? {
        match (number, wire) {
            (1, Wire::Bytes(tag)) => out.tag = tag,
            (2, Wire::Fixed32(_)) | (8, Wire::Bytes(_)) => out.kind = Some(wire),
            // The oneof's other members (image, histo, audio) clear it.
            (3..=6, _) => out.kind = None,
            (9, Wire::Bytes(metadata)) => {
                if let Some(name) = plugin_name(metadata)? {
                    out.plugin = Some(name);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `SummaryMetadata.plugin_data.plugin_name`, when present.
fn plugin_name(metadata: &[u8]) -> Decode<Option<&[u8]>> {
    let mut name = None;
    let mut fields = Fields::new(metadata);
    while let Some((number, wire)) = fields.next_field()? {
        if let (1, Wire::Bytes(plugin_data)) = (number, wire) {
            let mut inner = Fields::new(plugin_data);
            while let Some((number, wire)) = inner.next_field()? {
                if let (1, Wire::Bytes(n)) = (number, wire) {
                    name = Some(n);
                }
            }
        }
    }
    Ok(name)
}

/// Whether a `TensorShapeProto` describes exactly one element.
fn is_one_element(shape: &[u8]) -> Decode<bool> {
    let mut one = true;
    let mut fields = Fields::new(shape);
    while let Some((number, wire)) = fields.next_field()? {
        match (number, wire) {
            (2, Wire::Bytes(dim)) => {
                let mut size = 0u64; // an absent size is 0
                let mut dim_fields = Fields::new(dim);
                while let Some((n, w)) = dim_fields.next_field()? {
                    if let (1, Wire::Varint(s)) = (n, w) {
                        size = s;
                    }
                }
                one &= size == 1;
            }
            (3, Wire::Varint(unknown_rank)) => one &= unknown_rank == 0,
            _ => {}
        }
    }
    Ok(one)
}

/// The value of a one-element DT_FLOAT/DT_DOUBLE `TensorProto`, if it is one.
fn tensor_scalar(tensor: &[u8]) -> Decode<Option<f64>> {
    let (mut dtype, mut one_element) = (0u64, true);
    let (mut content, mut float_val, mut double_val) = (None, None, None);
    let mut fields = Fields::new(tensor);
    while let Some((number, wire)) = fields.next_field()? {
        match (number, wire) {
            (1, Wire::Varint(d)) => dtype = d,
            (2, Wire::Bytes(shape)) => one_element = is_one_element(shape)?,
            (4, Wire::Bytes(c)) => content = Some(c),
            // Repeated scalars: packed (bytes) or one per field; keep the first.
            (5, Wire::Bytes(packed)) if float_val.is_none() => {
                float_val = packed
                    .get(..4)
                    .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
            }
            (5, Wire::Fixed32(b)) if float_val.is_none() => {
                float_val = Some(f64::from(f32::from_le_bytes(b)));
            }
            (6, Wire::Bytes(packed)) if double_val.is_none() => {
                double_val = packed
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(f64::from_le_bytes);
            }
            (6, Wire::Fixed64(b)) if double_val.is_none() => {
                double_val = Some(f64::from_le_bytes(b));
            }
            _ => {}
        }
    }
    if !one_element {
        return Ok(None);
    }
    let content = content.filter(|c| !c.is_empty());
    Ok(match dtype {
        DT_FLOAT => match content {
            Some(c) => <[u8; 4]>::try_from(c)
                .ok()
                .map(|b| f64::from(f32::from_le_bytes(b))),
            None => float_val,
        },
        DT_DOUBLE => match content {
            Some(c) => <[u8; 8]>::try_from(c).ok().map(f64::from_le_bytes),
            None => double_val,
        },
        _ => None,
    })
}

/// Call `found` with the step and each value of one serialized `Event`.
fn event_values<'a>(event: &'a [u8], found: &mut impl FnMut(i64, SummaryValue<'a>)) -> Decode<()> {
    // `step` may follow `summary` on the wire: find it first.
    let mut step = 0i64;
    let mut fields = Fields::new(event);
    while let Some((number, wire)) = fields.next_field()? {
        if let (2, Wire::Varint(s)) = (number, wire) {
            step = s as i64; // int64 on the wire is two's complement
        }
    }
    let mut fields = Fields::new(event);
    while let Some((number, wire)) = fields.next_field()? {
        let (5, Wire::Bytes(summary)) = (number, wire) else {
            continue;
        };
        let mut values = Fields::new(summary);
        while let Some((number, wire)) = values.next_field()? {
            let (1, Wire::Bytes(value)) = (number, wire) else {
                continue;
            };
            let v = value_fields(value)?;
            let reading = match v.kind {
                Some(Wire::Fixed32(b)) => Some(Reading::Simple(f64::from(f32::from_le_bytes(b)))),
                Some(Wire::Bytes(tensor)) => tensor_scalar(tensor)?.map(Reading::Tensor),
                _ => None,
            };
            found(
                step,
                SummaryValue {
                    tag: v.tag,
                    plugin: v.plugin,
                    reading,
                },
            );
        }
    }
    Ok(())
}

// ---- collecting ----

struct Collector<'w> {
    /// Tags whose points are kept, in order of preference.
    wanted: &'w [&'w str],
    points: Vec<Vec<(i64, f64)>>,
    tags: BTreeSet<String>,
    /// Tags whose metadata names a plugin other than scalars.
    not_scalar: HashSet<Vec<u8>>,
}

impl<'w> Collector<'w> {
    fn new(wanted: &'w [&'w str]) -> Self {
        Collector {
            wanted,
            points: vec![Vec::new(); wanted.len()],
            tags: BTreeSet::new(),
            not_scalar: HashSet::new(),
        }
    }

    fn record(&mut self, step: i64, value: &SummaryValue) -> std::result::Result<(), String> {
        if let Some(plugin) = value.plugin {
            if !plugin.is_empty() && plugin != b"scalars" && !self.not_scalar.contains(value.tag) {
                if self.not_scalar.len() >= MAX_TAGS {
                    return Err(format!(
                        "more than {MAX_TAGS} distinct non-scalar tags (corrupt or hostile file)"
                    ));
                }
                self.not_scalar.insert(value.tag.to_vec());
            }
        }
        let number = match value.reading {
            None => return Ok(()),
            Some(Reading::Tensor(_)) if self.not_scalar.contains(value.tag) => return Ok(()),
            Some(Reading::Simple(x) | Reading::Tensor(x)) => x,
        };
        let tag = String::from_utf8_lossy(value.tag);
        if !self.tags.contains(tag.as_ref()) {
            if self.tags.len() >= MAX_TAGS {
                return Err(format!(
                    "more than {MAX_TAGS} distinct scalar tags (corrupt or hostile file)"
                ));
            }
            self.tags.insert(tag.to_string());
        }
        if let Some(i) = self.wanted.iter().position(|w| *w == tag) {
            self.points[i].push((step, number));
        }
        Ok(())
    }
}

/// Read one event file into `collector`.
fn read_file(path: &Path, collector: &mut Collector) -> Result<Ending> {
    let err = |msg: String| Error::new(Area::LogFormat, path, msg);
    let file = open_regular(path, Area::LogFormat)?;
    let file_len = file
        .metadata()
        .map_err(|e| Error::io(Area::LogFormat, path, &e))?
        .len();
    let mut records = Records::new(BufReader::with_capacity(64 << 10, file), file_len);
    loop {
        match records.next().map_err(err)? {
            Next::End(ending) => return Ok(ending),
            Next::Record => {}
        }
        let at = records.start;
        let mut failure = None;
        event_values(&records.data, &mut |step, value| {
            if failure.is_none() {
                failure = collector.record(step, &value).err();
            }
        })
        .map_err(|why| {
            err(format!(
                "record at byte {at}: not a valid Event protobuf ({why})"
            ))
        })?;
        if let Some(msg) = failure {
            return Err(err(msg));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("rust/testdata/logs")
            .join(rel)
    }

    /// Frame `data` as one record.
    fn frame(data: &[u8]) -> Vec<u8> {
        let len = (data.len() as u64).to_le_bytes();
        let mut out = len.to_vec();
        out.extend(masked_crc32c(&len).to_le_bytes());
        out.extend(data);
        out.extend(masked_crc32c(data).to_le_bytes());
        out
    }

    /// The records of a well-formed file: (start offset, data).
    fn records_of(bytes: &[u8]) -> Vec<(usize, Vec<u8>)> {
        let mut out = vec![];
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            out.push((at, bytes[at + 12..at + 12 + len].to_vec()));
            at += 16 + len;
        }
        out
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn field_bytes(number: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend(payload);
    }

    /// An Event with one `simple_value` scalar.
    fn simple_event(step: i64, tag: &str, value: f32) -> Vec<u8> {
        let mut v = vec![];
        field_bytes(1, tag.as_bytes(), &mut v);
        v.push(2 << 3 | 5);
        v.extend(value.to_le_bytes());
        let mut summary = vec![];
        field_bytes(1, &v, &mut summary);
        let mut event = vec![];
        event.push(1 << 3 | 1);
        event.extend(1.0f64.to_le_bytes());
        event.push(2 << 3);
        varint(step as u64, &mut event);
        field_bytes(5, &summary, &mut event);
        event
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn read_one(path: &Path, tag: Option<&str>) -> Result<ScalarSeries> {
        read_scalar_series(&[path.to_path_buf()], tag)
    }

    /// `{file name: {tag: [[step, "repr"], ...]}}` written by tensorboard's own loader.
    type TagPoints = Vec<(String, Vec<(i64, f64)>)>;

    fn expected(dir: &str) -> Vec<(String, TagPoints)> {
        let text = std::fs::read_to_string(fixture(dir).join("events.expected.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_object()
            .unwrap()
            .iter()
            .map(|(file, tags)| {
                let tags = tags
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(tag, points)| {
                        let points = points
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|p| {
                                (
                                    p[0].as_i64().unwrap(),
                                    p[1].as_str().unwrap().parse().unwrap(),
                                )
                            })
                            .collect();
                        (tag.clone(), points)
                    })
                    .collect();
                (file.clone(), tags)
            })
            .collect()
    }

    /// Equal points; NaN matches NaN (its payload may differ), else bit-exact.
    fn same_points(a: &[(i64, f64)], b: &[(i64, f64)]) -> bool {
        let same = |x: f64, y: f64| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits();
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && same(x.1, y.1))
    }

    #[test]
    fn crc32c_known_answers() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn matches_tensorboards_own_loader_on_every_fixture() {
        for (dir, run) in [
            ("hf_run/runs", "hf_run/runs/Jan01_00-00-00_fixturehost"),
            ("torch_writer", "torch_writer"),
            ("tf2", "tf2"),
            ("lightning/tb", "lightning/tb"),
        ] {
            for (file, tags) in expected(dir) {
                let path = fixture(run).join(&file);
                let names: Vec<String> = tags.iter().map(|t| t.0.clone()).collect();
                let mut sorted = names.clone();
                sorted.sort();
                assert_eq!(
                    scalar_tags(std::slice::from_ref(&path)).unwrap(),
                    sorted,
                    "{file}"
                );
                for (tag, want) in tags {
                    let got = read_one(&path, Some(&tag)).unwrap();
                    assert!(
                        same_points(&got.points, &want),
                        "{file} {tag}: {:?}",
                        got.points
                    );
                    assert!(got.torn_files.is_empty());
                }
            }
        }
    }

    #[test]
    fn default_tags_of_real_writers() {
        let hf = event_files(&fixture("hf_run")).unwrap();
        assert_eq!(hf.len(), 1);
        let series = read_scalar_series(&hf, None).unwrap();
        assert_eq!(series.tag, "train/loss");
        assert_eq!(series.points.len(), 30);
        assert_eq!(series.points[26], (27, f64::INFINITY));
        assert!(series.points[27].1.is_nan());
        assert!(series.tags.contains(&"eval/loss".to_string()));
        // Text summaries (args, model_config) are not scalars.
        assert!(!series.tags.iter().any(|t| t.contains("args")));

        let lightning = event_files(&fixture("lightning")).unwrap();
        assert_eq!(
            read_scalar_series(&lightning, None).unwrap().tag,
            "train_loss_step"
        );

        let tf2 = event_files(&fixture("tf2")).unwrap();
        let series = read_scalar_series(&tf2, None).unwrap();
        assert_eq!(series.tag, "train_loss");
        assert_eq!(series.tags, ["content_loss", "train_loss", "val_loss_f64"]);
    }

    #[test]
    fn a_resumed_run_is_read_in_file_name_order() {
        let files = event_files(&fixture("torch_writer")).unwrap();
        assert_eq!(files.len(), 2);
        let reversed: Vec<PathBuf> = files.iter().rev().cloned().collect();
        let series = read_scalar_series(&reversed, None).unwrap();
        assert_eq!(series.tag, "loss");
        assert_eq!(series.files, files);
        let steps: Vec<i64> = series.points.iter().map(|p| p.0).collect();
        let want: Vec<i64> = (0..12).chain(9..16).collect();
        assert_eq!(steps, want);
        assert!(series.points[5].1.is_nan());
        assert_eq!(series.points[8].1, f64::INFINITY);
    }

    #[test]
    fn every_truncation_is_torn_not_an_error() {
        let bytes = std::fs::read(fixture(
            "tf2/events.out.tfevents.1700002000.fixturehost.1000.0",
        ))
        .unwrap();
        let records = records_of(&bytes);
        let full = {
            let dir = tempfile::tempdir().unwrap();
            read_one(&write(dir.path(), "e", &bytes), Some("train_loss"))
                .unwrap()
                .points
        };
        let dir = tempfile::tempdir().unwrap();
        for cut in 0..bytes.len() {
            let path = write(dir.path(), "events.out.tfevents.1", &bytes[..cut]);
            let whole = records
                .iter()
                .filter(|(at, data)| at + data.len() + 16 <= cut)
                .count();
            let boundary = cut == 0 || records.iter().any(|(at, _)| *at == cut);
            match read_one(&path, Some("train_loss")) {
                Ok(series) => {
                    assert_eq!(series.torn_files.is_empty(), boundary, "cut {cut}");
                    assert!(same_points(&series.points, &full[..series.points.len()]));
                }
                // Before the first train_loss record nothing is found.
                Err(e) => assert!(
                    whole < 2 && e.message.contains("no scalar tagged"),
                    "cut {cut}: {e}"
                ),
            }
        }
    }

    #[test]
    fn checksum_mismatches_name_the_record() {
        let path = fixture("torch_writer/events.out.tfevents.1700001100.fixturehost.1000.1");
        let bytes = std::fs::read(&path).unwrap();
        let records = records_of(&bytes);
        let (at, data) = &records[3];
        let dir = tempfile::tempdir().unwrap();
        for (offset, want) in [
            (at + 2, "length checksum"),
            (at + 9, "length checksum"),
            (at + 12 + data.len() / 2, "data checksum"),
            (at + 12 + data.len() + 1, "data checksum"),
        ] {
            let mut bad = bytes.clone();
            bad[offset] ^= 0x10;
            let e = read_one(&write(dir.path(), "events.out.tfevents.x", &bad), None).unwrap_err();
            assert_eq!(e.area, Area::LogFormat);
            assert!(e.message.contains(&format!("record at byte {at}")), "{e}");
            assert!(e.message.contains(want), "{e}");
        }
        // Even in the last record: a complete record with a bad checksum is corrupt.
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let e = read_one(&write(dir.path(), "events.out.tfevents.x", &bad), None).unwrap_err();
        assert!(e.message.contains("data checksum"), "{e}");
    }

    #[test]
    fn lying_lengths() {
        let bytes = std::fs::read(fixture(
            "tf2/events.out.tfevents.1700002000.fixturehost.1000.0",
        ))
        .unwrap();
        let records = records_of(&bytes);
        let (at, data) = records[2].clone();
        let dir = tempfile::tempdir().unwrap();
        let with_len = |len: u64| {
            let mut bad = bytes.clone();
            bad[at..at + 8].copy_from_slice(&len.to_le_bytes());
            bad[at + 8..at + 12].copy_from_slice(&masked_crc32c(&len.to_le_bytes()).to_le_bytes());
            write(dir.path(), "events.out.tfevents.x", &bad)
        };
        // Huge: refused before any allocation.
        for len in [MAX_RECORD_BYTES + 1, u64::MAX, 1 << 62] {
            let e = read_one(&with_len(len), None).unwrap_err();
            assert!(e.message.contains("more than the 64 MiB limit"), "{e}");
            assert!(e.message.contains(&format!("record at byte {at}")), "{e}");
        }
        // Past the end of the file but under the cap: indistinguishable from a torn write.
        let series = read_one(&with_len((bytes.len() - at) as u64), Some("train_loss")).unwrap();
        assert_eq!(series.torn_files.len(), 1);
        assert_eq!(series.points.len(), 1); // record 0 is the file_version event
                                            // Shorter or longer than the real data: the data checksum catches it.
        for len in [data.len() as u64 - 1, data.len() as u64 + 1, 0] {
            let e = read_one(&with_len(len), None).unwrap_err();
            assert!(e.message.contains("checksum"), "{len}: {e}");
        }
    }

    #[test]
    fn hostile_protobuf_payloads_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep_groups = vec![];
        for _ in 0..10_000 {
            deep_groups.push(7 << 3 | 3);
        }
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                vec![
                    2 << 3,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0x01,
                ],
                "varint",
            ),
            (
                vec![
                    2 << 3,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0x02,
                ],
                "overflows",
            ),
            (vec![2 << 3, 0x80], "truncated varint"),
            (vec![5 << 3 | 2, 0x05, 1, 2], "past the end"),
            (
                vec![
                    5 << 3 | 2,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0xff,
                    0x7f,
                ],
                "past the end",
            ),
            (vec![1 << 3 | 1, 0, 0], "past the end"),
            (vec![0x00, 0x01], "field number 0"),
            (vec![3 << 3 | 4], "end-group"),
            (vec![3 << 3 | 6], "wire type"),
            (vec![3 << 3 | 3, 4 << 3 | 4], "mismatched"),
            (vec![3 << 3 | 3, 4 << 3], "truncated varint"),
            (deep_groups, "nested too deep"),
        ];
        for (event, want) in cases {
            let path = write(dir.path(), "events.out.tfevents.x", &frame(&event));
            let e = read_one(&path, None).unwrap_err();
            assert!(
                e.message.contains("not a valid Event protobuf"),
                "{want}: {e}"
            );
            assert!(e.message.contains(want), "{want}: {e}");
        }
        // The same damage inside a Summary.Value is found too.
        let mut value = vec![];
        field_bytes(1, b"loss", &mut value);
        value.extend([9 << 3 | 2, 0x03, 0x0a, 0x05, 0x00]);
        let mut summary = vec![];
        field_bytes(1, &value, &mut summary);
        let mut event = vec![];
        field_bytes(5, &summary, &mut event);
        let e = read_one(
            &write(dir.path(), "events.out.tfevents.x", &frame(&event)),
            None,
        )
        .unwrap_err();
        assert!(e.message.contains("past the end"), "{e}");
    }

    #[test]
    fn unknown_fields_of_every_wire_type_are_skipped() {
        let key = |number: u64, wire: u64, out: &mut Vec<u8>| varint(number << 3 | wire, out);
        let mut event = vec![];
        key(20, 0, &mut event);
        varint(u64::MAX, &mut event);
        key(21, 1, &mut event);
        event.extend([0u8; 8]);
        field_bytes(22, b"\xff\xfe", &mut event);
        // A group holding a varint and a nested empty group.
        key(23, 3, &mut event);
        key(1, 0, &mut event);
        event.push(5);
        key(24, 3, &mut event);
        key(24, 4, &mut event);
        key(23, 4, &mut event);
        key(25, 5, &mut event);
        event.extend([0u8; 4]);
        event.extend(simple_event(-3, "loss", 0.25));
        // Wrong wire type for a known field: skipped like an unknown one.
        event.extend([2 << 3 | 5, 0, 0, 0, 0]);
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "events.out.tfevents.x", &frame(&event));
        let series = read_one(&path, None).unwrap();
        assert_eq!(series.points, vec![(-3, 0.25)]);
    }

    #[test]
    fn tensor_shapes_and_dtypes() {
        // TensorProto bytes -> a Summary.Value, then an Event at step 1.
        let value_event = |tensor: &[u8], plugin: Option<&str>| {
            let mut value = vec![];
            field_bytes(1, b"t", &mut value);
            field_bytes(8, tensor, &mut value);
            if let Some(p) = plugin {
                let mut name = vec![];
                field_bytes(1, p.as_bytes(), &mut name);
                let mut meta = vec![];
                field_bytes(1, &name, &mut meta);
                field_bytes(9, &meta, &mut value);
            }
            let mut summary = vec![];
            field_bytes(1, &value, &mut summary);
            let mut event = vec![2 << 3, 1];
            field_bytes(5, &summary, &mut event);
            frame(&event)
        };
        let dims = |sizes: &[u64]| {
            let mut shape = vec![];
            for &s in sizes {
                let mut dim = vec![1 << 3];
                varint(s, &mut dim);
                field_bytes(2, &dim, &mut shape);
            }
            shape
        };
        let tensor = |dtype: u64, shape: &[u8], rest: &[u8]| {
            let mut t = vec![1 << 3];
            varint(dtype, &mut t);
            field_bytes(2, shape, &mut t);
            t.extend(rest);
            t
        };
        let mut packed_f32 = vec![];
        field_bytes(
            5,
            &[1.5f32.to_le_bytes(), 9.0f32.to_le_bytes()].concat(),
            &mut packed_f32,
        );
        let mut unpacked_f64 = vec![6 << 3 | 1];
        unpacked_f64.extend(2.25f64.to_le_bytes());
        let mut content_f64 = vec![];
        field_bytes(4, &(-0.5f64).to_le_bytes(), &mut content_f64);
        let mut bad_content = vec![];
        field_bytes(4, &[1, 2, 3], &mut bad_content);
        let cases: Vec<(Vec<u8>, Option<f64>)> = vec![
            (value_event(&tensor(1, &[], &packed_f32), None), Some(1.5)),
            (
                value_event(&tensor(1, &dims(&[1, 1]), &packed_f32), Some("scalars")),
                Some(1.5),
            ),
            (
                value_event(&tensor(2, &[], &unpacked_f64), None),
                Some(2.25),
            ),
            (value_event(&tensor(2, &[], &content_f64), None), Some(-0.5)),
            (
                value_event(&tensor(1, &dims(&[2]), &packed_f32), None),
                None,
            ),
            (
                value_event(&tensor(1, &dims(&[0]), &packed_f32), None),
                None,
            ),
            (
                value_event(&tensor(1, &[], &packed_f32), Some("histograms")),
                None,
            ),
            (value_event(&tensor(19, &[], &packed_f32), None), None), // DT_HALF
            (value_event(&tensor(1, &[], &bad_content), None), None),
            (value_event(&tensor(1, &[], &[]), None), None), // no value at all
        ];
        let dir = tempfile::tempdir().unwrap();
        for (i, (bytes, want)) in cases.into_iter().enumerate() {
            let path = write(dir.path(), "events.out.tfevents.x", &bytes);
            let got = read_one(&path, Some("t")).ok().map(|s| s.points[0].1);
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn random_damage_with_valid_checksums_never_panics() {
        let bytes = std::fs::read(fixture("hf_run/runs/Jan01_00-00-00_fixturehost/events.out.tfevents.1700000000.fixturehost.1000.0")).unwrap();
        let records = records_of(&bytes);
        let dir = tempfile::tempdir().unwrap();
        let mut state = 42u64;
        let mut rand = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let mut outcomes = [0usize; 2];
        for _ in 0..400 {
            let mut file = vec![];
            let damaged = rand() % records.len();
            for (i, (_, data)) in records.iter().enumerate() {
                let mut data = data.clone();
                if i == damaged && !data.is_empty() {
                    for _ in 0..1 + rand() % 4 {
                        let i = rand() % data.len();
                        data[i] = rand() as u8;
                    }
                }
                file.extend(frame(&data));
            }
            let path = write(dir.path(), "events.out.tfevents.x", &file);
            outcomes[usize::from(read_one(&path, Some("train/loss")).is_ok())] += 1;
        }
        assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
    }

    #[test]
    fn missing_tags_list_what_is_there() {
        let files = event_files(&fixture("torch_writer")).unwrap();
        let e = read_scalar_series(&files, Some("nope")).unwrap_err();
        assert_eq!(e.path, fixture("torch_writer"));
        assert!(
            e.message
                .contains("no scalar tagged \"nope\" in 2 event files"),
            "{e}"
        );
        assert!(
            e.message.contains("loss, lr, tensor_loss, tensor_loss_f64"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "events.out.tfevents.x",
            &frame(&simple_event(1, "acc", 1.0)),
        );
        let e = read_one(&path, None).unwrap_err();
        assert!(
            e.message
                .contains("none of the loss tags train/loss, train_loss"),
            "{e}"
        );
        assert!(e.message.contains("present: acc"), "{e}");
        let empty = write(dir.path(), "events.out.tfevents.y", b"");
        let e = read_one(&empty, None).unwrap_err();
        assert!(e.message.contains("present: none"), "{e}");
        let e = read_scalar_series(&[], None).unwrap_err();
        assert!(e.message.contains("no TensorBoard event files"), "{e}");
    }

    #[test]
    fn memory_follows_the_largest_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = vec![];
        for step in 0..2000 {
            file.extend(frame(&simple_event(step, "loss", step as f32)));
        }
        let path = write(dir.path(), "events.out.tfevents.x", &file);
        let mut collector = Collector::new(&["loss"]);
        let f = std::fs::File::open(&path).unwrap();
        let mut records = Records::new(BufReader::new(f), file.len() as u64);
        let mut n = 0;
        while let Next::Record = records.next().unwrap() {
            n += 1;
            assert!(records.data.capacity() < 256);
        }
        assert_eq!(n, 2000);
        assert_eq!(read_file(&path, &mut collector).unwrap(), Ending::Complete);
        assert_eq!(collector.points[0].len(), 2000);
    }
}
