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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::series_names;
use crate::formats::model_config::MAX_CONFIG_BYTES;
use crate::io::files::open_regular;
use crate::io::lfs;
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

/// Tags of the model's config as a text summary: the HF Trainer's
/// `add_text("model_config", ...)` (torch's writer appends
/// `/text_summary`).
pub const MODEL_CONFIG_TAGS: [&str; 2] = ["model_config/text_summary", "model_config"];

/// DataType enum values of TensorFlow's `types.proto`.
const DT_FLOAT: u64 = 1;
const DT_STRING: u64 = 7;
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
    /// The text of the `model_config` text summary the HF Trainer's
    /// TensorBoard callback writes (the model's `config.json`), and the
    /// file that holds it; the last one read wins.
    pub model_config: Option<(PathBuf, Vec<u8>)>,
}

/// Whether a file name is a TensorBoard event file's.
pub fn is_event_file_name(name: &str) -> bool {
    // CatBoost's TensorBoard writer names its file without the suffix.
    name.starts_with("events.out.tfevents.") || name == "events.out.tfevents"
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
    let mut collector = Collector::new(&[], &|_| false);
    for path in by_name(files) {
        read_file(path, &mut collector)?;
    }
    Ok(collector.tags.into_iter().collect())
}

/// Read the points of `tag` (or of the first `DEFAULT_LOSS_TAGS` entry
/// present) from `files`, read in file-name order.
pub fn read_scalar_series(files: &[PathBuf], tag: Option<&str>) -> Result<ScalarSeries> {
    read_scalar_series_and(files, tag, &|_| false).map(|(series, _)| series)
}

/// Points of several scalar tags, by tag.
pub type TagPoints = BTreeMap<String, Vec<(i64, f64)>>;

/// [`read_scalar_series`], also keeping, in the same pass over the files,
/// the points of every other scalar tag that `also` accepts (by tag).
pub fn read_scalar_series_and(
    files: &[PathBuf],
    tag: Option<&str>,
    also: &dyn Fn(&str) -> bool,
) -> Result<(ScalarSeries, TagPoints)> {
    let wanted: Vec<&str> = match tag {
        Some(tag) => vec![tag],
        None => DEFAULT_LOSS_TAGS.to_vec(),
    };
    let ordered = by_name(files);
    let mut collector = Collector::new(&wanted, also);
    let mut torn_files = vec![];
    for path in &ordered {
        if read_file(path, &mut collector)? == Ending::Torn {
            torn_files.push(path.to_path_buf());
        }
    }
    let chosen = collector.points.iter().position(|p| !p.is_empty());
    let Some(index) = chosen else {
        // None of the usual names: the loss by its meaning, in a second pass.
        let by_meaning = tag
            .is_none()
            .then(|| series_names::choose_loss(collector.tags.iter().map(String::as_str)))
            .flatten();
        if let Some((name, _)) = by_meaning {
            return read_scalar_series_and(files, Some(name), also);
        }
        return Err(missing_tag_error(files, tag, &collector.tags));
    };
    let series = ScalarSeries {
        tag: wanted[index].to_string(),
        points: std::mem::take(&mut collector.points[index]),
        tags: collector.tags.into_iter().collect(),
        files: ordered.into_iter().cloned().collect(),
        torn_files,
        model_config: collector.model_config.take(),
    };
    Ok((series, collector.also_points))
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

/// The start of the message of a read that found none of the default loss
/// tags (see [`is_missing_loss_tags`]).
const NO_LOSS_TAGS: &str = "none of the loss tags";

/// Whether `e` says the event files hold none of the default loss tags (the
/// files are fine; they just log other things, e.g. only a final summary).
pub fn is_missing_loss_tags(e: &Error) -> bool {
    e.area == Area::LogFormat && e.message.starts_with(NO_LOSS_TAGS)
}

fn missing_tag_error(files: &[PathBuf], tag: Option<&str>, tags: &BTreeSet<String>) -> Error {
    let path = common_path(files);
    // Tags come from the file: short excerpts only.
    let present = if tags.is_empty() {
        "none".to_string()
    } else {
        crate::io::excerpt::listed(tags.iter().map(String::as_str))
    };
    let where_ = match files.len() {
        0 => "no TensorBoard event files found".to_string(),
        1 => "the event file".to_string(),
        n => format!("{n} event files"),
    };
    let message = match tag {
        Some(tag) => {
            let tag = crate::io::excerpt::quoted(tag);
            format!("no scalar tagged {tag} in {where_}; scalar tags present: {present}")
        }
        None => format!(
            "{NO_LOSS_TAGS} {} (nor any tag named as a loss) in {where_}; scalar tags present: \
             {present}; name the tag to read",
            DEFAULT_LOSS_TAGS.join(", ")
        ),
    };
    Error::new(Area::LogFormat, path, message)
}

// ---- CRC32C (Castagnoli) ----

/// CRC32C of `data` (the `crc32c` crate: SSE 4.2 / ARMv8 instructions where
/// the CPU has them, a table otherwise).
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
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
    /// The first record header's bytes (the file's first bytes).
    head: [u8; HEADER_BYTES as usize],
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
            head: [0; HEADER_BYTES as usize],
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
        if at == 0 {
            self.head = header;
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
    /// The text of a string tensor, read only for [`MODEL_CONFIG_TAGS`].
    text: Option<&'a [u8]>,
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

/// The first string of a DT_STRING `TensorProto` (a text summary's text).
fn tensor_text(tensor: &[u8]) -> Decode<Option<&[u8]>> {
    let (mut dtype, mut text) = (0u64, None);
    let mut fields = Fields::new(tensor);
    while let Some((number, wire)) = fields.next_field()? {
        match (number, wire) {
            (1, Wire::Varint(d)) => dtype = d,
            (8, Wire::Bytes(b)) if text.is_none() => text = Some(b),
            _ => {}
        }
    }
    Ok(text.filter(|_| dtype == DT_STRING))
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
            let is_config = MODEL_CONFIG_TAGS.iter().any(|t| t.as_bytes() == v.tag);
            let text = match v.kind {
                Some(Wire::Bytes(tensor)) if is_config => tensor_text(tensor)?,
                _ => None,
            };
            found(
                step,
                SummaryValue {
                    tag: v.tag,
                    plugin: v.plugin,
                    reading,
                    text,
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
    /// Other tags whose points are kept too, in the same pass.
    also: &'w dyn Fn(&str) -> bool,
    also_points: TagPoints,
    tags: BTreeSet<String>,
    /// Tags whose metadata names a plugin other than scalars.
    not_scalar: HashSet<Vec<u8>>,
    /// The file being read, and the model config text found (see
    /// [`ScalarSeries::model_config`]).
    file: PathBuf,
    model_config: Option<(PathBuf, Vec<u8>)>,
}

impl<'w> Collector<'w> {
    fn new(wanted: &'w [&'w str], also: &'w dyn Fn(&str) -> bool) -> Self {
        Collector {
            wanted,
            points: vec![Vec::new(); wanted.len()],
            also,
            also_points: BTreeMap::new(),
            tags: BTreeSet::new(),
            not_scalar: HashSet::new(),
            file: PathBuf::new(),
            model_config: None,
        }
    }

    fn record(&mut self, step: i64, value: &SummaryValue) -> std::result::Result<(), String> {
        if let Some(text) = value.text {
            // A record is capped at MAX_RECORD_BYTES; a config is far smaller.
            if text.len() as u64 <= MAX_CONFIG_BYTES {
                self.model_config = Some((self.file.clone(), text.to_vec()));
            }
        }
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
        if (self.also)(&tag) {
            // Bounded like `tags`: at most MAX_TAGS distinct keys.
            self.also_points
                .entry(tag.into_owned())
                .or_default()
                .push((step, number));
        }
        Ok(())
    }
}

/// Read one event file into `collector`.
fn read_file(path: &Path, collector: &mut Collector) -> Result<Ending> {
    let err = |msg: String| Error::new(Area::LogFormat, path, msg);
    collector.file = path.to_path_buf();
    let file = open_regular(path, Area::LogFormat)?;
    let file_len = file
        .metadata()
        .map_err(|e| Error::io(Area::LogFormat, path, &e))?
        .len();
    let mut records = Records::new(BufReader::with_capacity(64 << 10, file), file_len);
    loop {
        let next = records.next().map_err(|msg| {
            // A Git LFS pointer fails the first record's length checksum.
            let head = (records.offset == 0).then_some(&records.head[..]);
            head.and_then(|h| lfs::pointer_error_at(Area::LogFormat, path, h))
                .unwrap_or_else(|| err(msg))
        })?;
        match next {
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
mod tests;
