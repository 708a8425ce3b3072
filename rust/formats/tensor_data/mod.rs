//! Stream the float data of safetensors tensors in bounded chunks.
//!
//! Why: a weight probe has to look at every value (one NaN or an all-zero
//! `lora_B` can sit anywhere) while its memory stays bounded whatever the
//! file claims. So tensors are never loaded whole: their bytes are read
//! with positioned reads (`pread`; a seek + read under a lock off unix) of
//! at most [`MAX_CHUNK_BYTES`], decoded to f64 block by block and reduced on
//! the fly. Nothing is allocated from a size in the file before that size
//! has been checked against the file's length and against a cap.
//!
//! [`SafetensorsData`] opens and checks a file (or takes the tensor spans
//! of a `torch.save` state dict, [`SafetensorsData::from_spans`]); a
//! [`TensorReader`] (one per thread) streams its tensors, reusing its buffers. Besides sums of squares
//! ([`Moments`]) it gives the two Gram matrices a LoRA factor pair needs
//! without forming the factor product: `X·Xᵀ` of a short wide matrix, read
//! in column blocks ([`TensorReader::for_each_column_block`]), and `Xᵀ·X` of
//! a tall narrow one, read in row blocks. Both are accumulated in f64 by
//! register-tiled kernels ([`Gram`]) that compute the upper triangle only.
//!
//! The float decoders are shared with `torch_state` (same bytes, same IEEE
//! formats) so there is one copy of them in the crate.

mod widest;
pub(crate) use widest::widest;

use std::fs::File;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nalgebra::DMatrix;

use crate::error::{Area, Error, Result};
use crate::formats::safetensors_header::{shared_header_of, Header, TensorInfo};
use crate::io::files::{open_sized, Opened};
use crate::io::read_once::{self, Content};
use crate::io::staged;

/// Largest single read (and largest decoded buffer) this module makes.
pub const MAX_CHUNK_BYTES: usize = 8 << 20;
/// Elements per read by default: 2 MiB of f64 (less for narrower dtypes),
/// large enough that a read costs far more copying than syscall.
pub const DEFAULT_CHUNK_ELEMS: usize = 1 << 18;
/// Largest Gram matrix side: 1024² f64 is 8 MiB. Also the most rows a column
/// block (or columns a row block) may have.
pub const MAX_GRAM_DIM: usize = 1024;
/// Values decoded at once when only statistics are wanted (stays in L1).
const STAT_BLOCK: usize = 256;

// ---------------------------------------------------------------------------
// dtypes and decoders

/// The float dtypes whose values we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatKind {
    F32,
    F64,
    F16,
    BF16,
}

impl FloatKind {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatKind::F32 => 4,
            FloatKind::F64 => 8,
            FloatKind::F16 | FloatKind::BF16 => 2,
        }
    }

    /// The kind of a safetensors dtype name, or None for any other dtype.
    pub fn from_safetensors(dtype: &str) -> Option<FloatKind> {
        match dtype {
            "F32" => Some(FloatKind::F32),
            "F64" => Some(FloatKind::F64),
            "F16" => Some(FloatKind::F16),
            "BF16" => Some(FloatKind::BF16),
            _ => None,
        }
    }

    /// The safetensors name of this dtype.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            FloatKind::F32 => "F32",
            FloatKind::F64 => "F64",
            FloatKind::F16 => "F16",
            FloatKind::BF16 => "BF16",
        }
    }

    /// Machine epsilon of the stored format (spacing of values near 1).
    pub fn epsilon(self) -> f64 {
        match self {
            FloatKind::F32 => f64::from(f32::EPSILON),
            FloatKind::F64 => f64::EPSILON,
            FloatKind::F16 => 1.0 / 1024.0,
            FloatKind::BF16 => 1.0 / 128.0,
        }
    }
}

#[inline(always)]
pub(crate) fn dec_f32(a: [u8; 4]) -> (f64, bool) {
    let b = u32::from_le_bytes(a);
    (f64::from(f32::from_bits(b)), b & 0x7f80_0000 == 0x7f80_0000)
}

#[inline(always)]
pub(crate) fn dec_f64(a: [u8; 8]) -> (f64, bool) {
    let b = u64::from_le_bytes(a);
    (
        f64::from_bits(b),
        b & 0x7ff0_0000_0000_0000 == 0x7ff0_0000_0000_0000,
    )
}

#[inline(always)]
pub(crate) fn dec_bf16(a: [u8; 2]) -> (f64, bool) {
    let h = u32::from(u16::from_le_bytes(a));
    (f64::from(f32::from_bits(h << 16)), h & 0x7f80 == 0x7f80)
}

/// IEEE half → f32 with integer ops and selects only (no subnormal float
/// arithmetic, which is slow on x86), so the loop vectorizes.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let em = h & 0x7fff;
    let sign = (h & 0x8000) << 16;
    // Normal: rebias the exponent from 15 to 127.
    let normal = (em << 13) + ((127 - 15) << 23);
    // Subnormal: value is mantissa * 2^-24, exact in f32.
    let sub = ((em as i32) as f32 * f32::from_bits(0x3380_0000)).to_bits();
    // Inf/NaN: all-ones exponent, mantissa kept.
    let special = (em << 13) | 0x7f80_0000;
    // Branch-free blend with all-ones/all-zeros masks.
    let is_sub = u32::from(em < 0x0400).wrapping_neg();
    let is_special = u32::from(em >= 0x7c00).wrapping_neg();
    let mag = (sub & is_sub) | (special & is_special) | (normal & !(is_sub | is_special));
    f32::from_bits(mag | sign)
}

#[inline(always)]
pub(crate) fn dec_f16(a: [u8; 2]) -> (f64, bool) {
    let h = u16::from_le_bytes(a);
    (f64::from(f16_to_f32(h)), h & 0x7c00 == 0x7c00)
}

#[inline(always)]
fn decode_with<const N: usize>(
    bytes: &[u8],
    out: &mut [f64],
    dec: impl Fn([u8; N]) -> (f64, bool),
) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
        *o = dec(<[u8; N]>::try_from(c).unwrap_or([0; N])).0;
    }
}

/// Decode little-endian values of `kind` from `bytes` into `out`, one f64
/// per element, as many as both hold.
pub fn decode(kind: FloatKind, bytes: &[u8], out: &mut [f64]) {
    match kind {
        FloatKind::F32 => decode_with::<4>(bytes, out, dec_f32),
        FloatKind::F64 => decode_with::<8>(bytes, out, dec_f64),
        FloatKind::F16 => decode_with::<2>(bytes, out, dec_f16),
        FloatKind::BF16 => decode_with::<2>(bytes, out, dec_bf16),
    }
}

// ---------------------------------------------------------------------------
// statistics

/// Sum of squares, non-finite count and largest magnitude of some values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    pub numel: u64,
    /// Σ v² in f64: NaN when a value is NaN, inf when one is infinite.
    pub sum_sq: f64,
    /// Values that are NaN or ±inf.
    pub nonfinite: u64,
    /// Largest |v| over the values that are not NaN (inf counts); 0 if none.
    pub max_abs: f64,
}

impl Moments {
    /// Frobenius (L2) norm.
    pub fn norm(&self) -> f64 {
        self.sum_sq.sqrt()
    }

    pub fn merge(&mut self, other: &Moments) {
        self.numel += other.numel;
        self.sum_sq += other.sum_sq;
        self.nonfinite += other.nonfinite;
        self.max_abs = self.max_abs.max(other.max_abs);
    }
}

/// Moments of decoded values, with 8 independent lanes so it vectorizes.
///
/// The maximum is a compare-and-select (not `f64::max`, whose NaN rules
/// block vectorization): `a > m` is false for a NaN `a`, so NaN is never a
/// maximum. Non-finite values are counted only when the sum of squares is
/// not finite, which any NaN or ±inf makes it: the common clean case costs
/// one multiply-add and one compare per value.
pub fn moments_of(values: &[f64]) -> Moments {
    const LANES: usize = 8;
    let mut sq = [0.0f64; LANES];
    let mut big = [0.0f64; LANES];
    let mut blocks = values.chunks_exact(LANES);
    for block in &mut blocks {
        for ((s, m), &v) in sq.iter_mut().zip(&mut big).zip(block) {
            let a = v.abs();
            *s += v * v;
            *m = if a > *m { a } else { *m };
        }
    }
    for ((s, m), &v) in sq.iter_mut().zip(&mut big).zip(blocks.remainder()) {
        let a = v.abs();
        *s += v * v;
        *m = if a > *m { a } else { *m };
    }
    let sum_sq = ((sq[0] + sq[4]) + (sq[1] + sq[5])) + ((sq[2] + sq[6]) + (sq[3] + sq[7]));
    let nonfinite = if sum_sq.is_finite() {
        0
    } else {
        values.iter().filter(|v| !v.is_finite()).count() as u64
    };
    Moments {
        numel: values.len() as u64,
        sum_sq,
        nonfinite,
        max_abs: big.iter().fold(0.0, |a, &b| if b > a { b } else { a }),
    }
}

/// Decode `bytes` into `out` (as [`decode`]) and return the moments of the
/// values, a small block at a time so each block is still in L1 when its
/// statistics are taken.
pub fn decode_with_moments(kind: FloatKind, bytes: &[u8], out: &mut [f64]) -> Moments {
    let mut m = Moments::default();
    for (block, vals) in bytes
        .chunks(STAT_BLOCK * kind.size())
        .zip(out.chunks_mut(STAT_BLOCK))
    {
        let n = (block.len() / kind.size()).min(vals.len());
        decode(kind, block, &mut vals[..n]);
        m.merge(&moments_of(&vals[..n]));
    }
    m
}

/// Moments of raw little-endian values, a block of [`STAT_BLOCK`] values
/// at a time (their sums merged in order).
///
/// Float32, float16 and bfloat16 go straight from the bytes to the sums
/// ([`moments_of_narrow`]), with no buffer of decoded f64; float64 is
/// decoded first. Either way the result is bit for bit what decoding each
/// block and taking [`moments_of`] gives.
pub fn moments_of_bytes(kind: FloatKind, bytes: &[u8]) -> Moments {
    widest(
        #[inline(always)]
        || match kind {
            FloatKind::F32 => moments_of_narrow::<4>(bytes, narrow_f32),
            FloatKind::BF16 => moments_of_narrow::<2>(bytes, narrow_bf16),
            FloatKind::F16 => moments_of_narrow::<2>(bytes, narrow_f16),
            FloatKind::F64 => moments_of_decoded(kind, bytes),
        },
    )
}

/// [`moments_of_bytes`] by decoding each block to f64 first.
pub(crate) fn moments_of_decoded(kind: FloatKind, bytes: &[u8]) -> Moments {
    let mut tmp = [0.0f64; STAT_BLOCK];
    let mut out = Moments::default();
    for block in bytes.chunks(STAT_BLOCK * kind.size()) {
        let n = block.len() / kind.size();
        let vals = &mut tmp[..n];
        decode(kind, block, vals);
        out.merge(&moments_of(vals));
    }
    out
}

#[inline(always)]
fn narrow_f32(a: [u8; 4]) -> f32 {
    f32::from_le_bytes(a)
}

#[inline(always)]
fn narrow_bf16(a: [u8; 2]) -> f32 {
    // bfloat16 is the top half of a float32: an integer shift, no rounding.
    f32::from_bits(u32::from(u16::from_le_bytes(a)) << 16)
}

#[inline(always)]
fn narrow_f16(a: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(a))
}

/// Moments of values of `N` bytes that `dec` widens exactly to f32, in
/// blocks of [`STAT_BLOCK`] with the lanes of [`moments_of`]: element `i`
/// of a block goes to lane `i % 8`, squares summed in f64 (each value is
/// exact in f64, so every product and sum is the one [`moments_of`]
/// makes). The largest magnitude is kept in f32 (widening to f64 is exact
/// and keeps order, and a NaN never wins either compare); non-finite
/// values are counted only in a block whose sum is not finite.
#[inline(always)]
fn moments_of_narrow<const N: usize>(bytes: &[u8], dec: impl Fn([u8; N]) -> f32 + Copy) -> Moments {
    const LANES: usize = 8;
    let mut out = Moments::default();
    for block in bytes.chunks(STAT_BLOCK * N) {
        let mut sq = [0.0f64; LANES];
        let mut big = [0.0f32; LANES];
        let mut groups = block.chunks_exact(LANES * N);
        for group in &mut groups {
            let mut v = [0.0f32; LANES];
            for (x, c) in v.iter_mut().zip(group.chunks_exact(N)) {
                *x = dec(<[u8; N]>::try_from(c).unwrap_or([0; N]));
            }
            for (s, &x) in sq.iter_mut().zip(&v) {
                let w = f64::from(x);
                *s += w * w;
            }
            for (m, &x) in big.iter_mut().zip(&v) {
                let a = x.abs();
                *m = if a > *m { a } else { *m };
            }
        }
        let rest = groups.remainder();
        for ((s, m), c) in sq.iter_mut().zip(&mut big).zip(rest.chunks_exact(N)) {
            let x = dec(<[u8; N]>::try_from(c).unwrap_or([0; N]));
            let w = f64::from(x);
            *s += w * w;
            let a = x.abs();
            *m = if a > *m { a } else { *m };
        }
        let sum_sq = ((sq[0] + sq[4]) + (sq[1] + sq[5])) + ((sq[2] + sq[6]) + (sq[3] + sq[7]));
        let nonfinite = if sum_sq.is_finite() {
            0
        } else {
            block
                .chunks_exact(N)
                .filter(|c| !dec(<[u8; N]>::try_from(*c).unwrap_or([0; N])).is_finite())
                .count() as u64
        };
        out.merge(&Moments {
            numel: (block.len() / N) as u64,
            sum_sq,
            nonfinite,
            max_abs: f64::from(big.iter().fold(0.0f32, |a, &b| if b > a { b } else { a })),
        });
    }
    out
}

// ---------------------------------------------------------------------------
// reading

/// One float tensor of a safetensors file, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatTensor {
    pub name: String,
    pub kind: FloatKind,
    pub shape: Vec<u64>,
    pub numel: u64,
    /// Absolute file offset of the tensor's first byte.
    pub offset: u64,
    pub byte_len: u64,
}

impl FloatTensor {
    /// (rows, cols) of a 2-D tensor, or None for another rank.
    pub fn matrix_dims(&self) -> Option<(u64, u64)> {
        match self.shape[..] {
            [rows, cols] => Some((rows, cols)),
            _ => None,
        }
    }
}

/// An open safetensors file whose header has been read and checked.
#[derive(Debug)]
pub struct SafetensorsData {
    path: PathBuf,
    /// Where the bytes come from: a small file is held whole (shared with
    /// the store's other readers, `io::read_once`), a larger one read by
    /// ranges.
    file: Option<File>,
    whole: Option<Arc<Vec<u8>>>,
    header: Arc<Header>,
    /// Absolute offset of the data section (8 + header length).
    data_start: u64,
    #[cfg(not(unix))]
    lock: std::sync::Mutex<()>,
}

/// What a tensor's read names in its errors, spelled only when one is
/// made (a scan reads thousands of tensors without one).
struct DataOf<'a>(&'a str);

impl std::fmt::Display for DataOf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the data of tensor {:?}", self.0)
    }
}

impl SafetensorsData {
    /// Open `path`, read its header (errors there are `Area::Header`) and
    /// check that the tensors' byte ranges do not overlap, so that reading
    /// every tensor reads each byte of the file at most once.
    pub fn open(path: &Path) -> Result<SafetensorsData> {
        // One open (or one whole read) serves the header and the data.
        let content = read_once::content(path, Area::Header)?;
        let header = shared_header_of(path, &content)?;
        let (file, whole, file_len) = match content {
            Content::Whole(bytes) => (None, Some(bytes.clone()), bytes.len() as u64),
            Content::Open(opened) => (Some(opened.file), None, opened.len),
        };
        let mut data = SafetensorsData {
            path: path.to_path_buf(),
            file,
            whole,
            header,
            data_start: 0,
            #[cfg(not(unix))]
            lock: std::sync::Mutex::new(()),
        };
        let mut len_bytes = [0u8; 8];
        data.read_at(&mut len_bytes, 0, "the header length")?;
        let data_start = u64::from_le_bytes(len_bytes).saturating_add(8);
        if file_len.checked_sub(data_start) != Some(data.header.data_len) {
            return Err(data.err(
                "the file changed while it was being read (header and data disagree)".into(),
            ));
        }
        data.data_start = data_start;
        data.check_no_overlap()?;
        Ok(data)
    }

    /// Tensors of another container that lie as runs of bytes in one file
    /// (a `torch.save` state dict: `formats::torch_state_dict`), read like a
    /// safetensors file whose data section is the whole file: `tensors`'
    /// `data_offsets` are absolute file offsets, checked against the file's
    /// length when each tensor is taken ([`SafetensorsData::float_tensor`]).
    /// Spans may overlap (tensors sharing a storage): the caller has bounded
    /// the total.
    pub fn from_spans(path: &Path, tensors: Vec<TensorInfo>) -> Result<SafetensorsData> {
        let Opened {
            file,
            len: file_len,
        } = open_sized(path, Area::Weights)?;
        Ok(SafetensorsData {
            path: path.to_path_buf(),
            file: Some(file),
            whole: None,
            header: Arc::new(Header {
                tensors,
                metadata: None,
                data_len: file_len,
            }),
            data_start: 0,
            #[cfg(not(unix))]
            lock: std::sync::Mutex::new(()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    fn err(&self, message: String) -> Error {
        Error::new(Area::Weights, &self.path, message)
    }

    fn check_no_overlap(&self) -> Result<()> {
        let mut spans: Vec<(u64, u64, &str)> = self
            .header
            .tensors
            .iter()
            .filter(|t| t.data_offsets.1 > t.data_offsets.0)
            .map(|t| (t.data_offsets.0, t.data_offsets.1, t.name.as_str()))
            .collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            if let [(_, end, first), (begin, _, second)] = pair {
                if begin < end {
                    return Err(Error::new(
                        Area::Header,
                        &self.path,
                        format!("tensors {first:?} and {second:?} overlap in the data section"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Check one header entry as a float tensor we can read.
    pub fn float_tensor(&self, info: &TensorInfo) -> Result<FloatTensor> {
        let name = &info.name;
        let kind = FloatKind::from_safetensors(&info.dtype).ok_or_else(|| {
            self.err(format!(
                "tensor {name:?} has dtype {}; only F32, F16, BF16 and F64 weights are read",
                info.dtype
            ))
        })?;
        let numel = info
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                self.err(format!("tensor {name:?}: shape {:?} overflows", info.shape))
            })?;
        let (begin, end) = info.data_offsets;
        let byte_len = end.checked_sub(begin).ok_or_else(|| {
            self.err(format!(
                "tensor {name:?}: data_offsets [{begin}, {end}] are reversed"
            ))
        })?;
        if numel.checked_mul(kind.size() as u64) != Some(byte_len) {
            return Err(self.err(format!(
                "tensor {name:?}: {} shape {:?} needs {numel} x {} bytes but data_offsets span {byte_len}",
                info.dtype,
                info.shape,
                kind.size()
            )));
        }
        if end > self.header.data_len {
            return Err(self.err(format!(
                "tensor {name:?}: data_offsets [{begin}, {end}] run past the {}-byte data section",
                self.header.data_len
            )));
        }
        Ok(FloatTensor {
            name: name.clone(),
            kind,
            shape: info.shape.clone(),
            numel,
            offset: self.data_start.saturating_add(begin),
            byte_len,
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64, what: impl std::fmt::Display) -> Result<()> {
        let res = match (&self.whole, &self.file) {
            (Some(whole), _) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                match whole.get(start..start.saturating_add(buf.len())) {
                    Some(part) => {
                        buf.copy_from_slice(part);
                        Ok(())
                    }
                    None => Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
            (None, Some(file)) => {
                staged::fill(&self.path, Area::Weights, offset, buf.len() as u64)?;
                self.read_file_at(file, buf, offset)
            }
            (None, None) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        };
        res.map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.err(format!(
                    "{what} ends early: the file is shorter than its header says (truncated \
                     while being read?)"
                ))
            } else {
                self.err(format!("cannot read {what}: {e}"))
            }
        })
    }

    #[cfg(unix)]
    fn read_file_at(&self, file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }

    #[cfg(not(unix))]
    fn read_file_at(&self, mut file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }

    /// A reader of this file's tensors that reads at most `chunk_elems`
    /// elements (and [`MAX_CHUNK_BYTES`]) at a time and keeps its buffers
    /// from one tensor to the next.
    pub fn reader(&self, chunk_elems: usize) -> TensorReader<'_> {
        TensorReader {
            data: self,
            chunk_elems: chunk_elems.clamp(1, MAX_CHUNK_BYTES / 8),
            raw: Vec::new(),
            vals: Vec::new(),
        }
    }

    /// (rows, cols) of a 2-D tensor as usize, with the narrow side (rows
    /// when `narrow_rows`, else cols) at most [`MAX_GRAM_DIM`].
    fn narrow_dims(&self, t: &FloatTensor, narrow_rows: bool) -> Result<(usize, usize)> {
        let (rows, cols) = t.matrix_dims().ok_or_else(|| {
            self.err(format!(
                "tensor {:?} has shape {:?}, expected a matrix",
                t.name, t.shape
            ))
        })?;
        let narrow = if narrow_rows { rows } else { cols };
        if narrow > MAX_GRAM_DIM as u64 {
            return Err(self.err(format!(
                "tensor {:?} has shape {:?}: its {} side exceeds {MAX_GRAM_DIM}",
                t.name,
                t.shape,
                if narrow_rows { "row" } else { "column" }
            )));
        }
        // byte_len (= rows·cols·size) was checked against the file; on a
        // 32-bit target it may still not fit usize: refuse, never wrap.
        if usize::try_from(t.byte_len).is_err() {
            return Err(self.err(format!(
                "tensor {:?} is too large for this platform",
                t.name
            )));
        }
        Ok((rows as usize, cols as usize))
    }
}

/// Streams tensors of one [`SafetensorsData`] in bounded chunks. Its read
/// and decode buffers grow to at most one chunk and are reused across
/// tensors, so walking many small tensors neither allocates nor zeroes
/// memory per tensor. One per thread.
pub struct TensorReader<'a> {
    data: &'a SafetensorsData,
    /// Elements per read, already clamped to [1, MAX_CHUNK_BYTES / 8].
    chunk_elems: usize,
    raw: Vec<u8>,
    vals: Vec<f64>,
}

/// `buf[..len]`, growing (and zeroing) `buf` only when it is too short.
fn grown<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

impl TensorReader<'_> {
    /// Visit the raw bytes of `t` in order, one read per call of `f`; each
    /// slice holds whole elements. `f` may stop the walk early by returning
    /// `ControlFlow::Break`.
    pub fn for_each_raw_chunk(
        &mut self,
        t: &FloatTensor,
        mut f: impl FnMut(&[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let per_read = self.chunk_elems * t.kind.size();
        let buf = grown(&mut self.raw, bounded(t.byte_len, per_read));
        let what = DataOf(&t.name);
        let mut done = 0u64;
        while done < t.byte_len {
            let n = bounded(t.byte_len - done, per_read);
            let slice = &mut buf[..n];
            self.data.read_at(slice, t.offset + done, &what)?;
            if f(slice).is_break() {
                break;
            }
            done += n as u64;
        }
        Ok(())
    }

    /// Bytes of `t` read at once: what [`TensorReader::for_each_raw_chunk`]
    /// reads per call, and the size of the chunks
    /// [`TensorReader::chunk_moments`] numbers.
    pub fn chunk_bytes(&self, t: &FloatTensor) -> u64 {
        (self.chunk_elems * t.kind.size()) as u64
    }

    /// Moments of chunk `index` of `t` (chunks of
    /// [`TensorReader::chunk_bytes`], the last one shorter): merged in
    /// order over every chunk, they are [`TensorReader::moments`] bit for
    /// bit, so readers on several threads can share one tensor.
    pub fn chunk_moments(&mut self, t: &FloatTensor, index: u64) -> Result<Moments> {
        let per_read = self.chunk_bytes(t);
        let start = index.saturating_mul(per_read);
        if start >= t.byte_len {
            return Ok(Moments::default());
        }
        let n = bounded(t.byte_len - start, per_read as usize);
        let buf = grown(&mut self.raw, n);
        let what = DataOf(&t.name);
        self.data.read_at(buf, t.offset + start, &what)?;
        Ok(moments_of_bytes(t.kind, buf))
    }

    /// Moments of all values of `t`, streamed.
    pub fn moments(&mut self, t: &FloatTensor) -> Result<Moments> {
        let mut out = Moments::default();
        self.for_each_raw_chunk(t, |bytes| {
            out.merge(&moments_of_bytes(t.kind, bytes));
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Visit a 2-D tensor (rows, cols) in blocks of whole rows: `f(rows_in_block,
    /// values)` with the block's values decoded, row-major. `cols` must be at
    /// most [`MAX_GRAM_DIM`]. Returns the moments of the whole tensor.
    pub fn for_each_row_block(
        &mut self,
        t: &FloatTensor,
        mut f: impl FnMut(usize, &[f64]),
    ) -> Result<Moments> {
        let (rows, cols) = self.data.narrow_dims(t, false)?;
        if rows == 0 || cols == 0 {
            return Ok(Moments::default());
        }
        let es = t.kind.size();
        let rows_per = (self.chunk_elems / cols).max(1);
        let first = rows_per.min(rows);
        let raw = grown(&mut self.raw, first * cols * es);
        let vals = grown(&mut self.vals, first * cols);
        let what = DataOf(&t.name);
        let mut moments = Moments::default();
        let mut row = 0usize;
        while row < rows {
            let n = rows_per.min(rows - row);
            let raw = &mut raw[..n * cols * es];
            let vals = &mut vals[..n * cols];
            self.data
                .read_at(raw, t.offset + (row * cols) as u64 * es as u64, &what)?;
            moments.merge(&decode_with_moments(t.kind, raw, vals));
            f(n, vals);
            row += n;
        }
        Ok(moments)
    }

    /// Visit a 2-D tensor (rows, cols) in blocks of whole columns: `f(width,
    /// values)` with all rows over the block's `width` columns, decoded,
    /// row-major (rows x width). `rows` must be at most [`MAX_GRAM_DIM`]. A
    /// wide tensor that fits one chunk is read with one read; otherwise
    /// each block takes one read per row. Returns the whole tensor's moments.
    pub fn for_each_column_block(
        &mut self,
        t: &FloatTensor,
        mut f: impl FnMut(usize, &[f64]),
    ) -> Result<Moments> {
        let (rows, cols) = self.data.narrow_dims(t, true)?;
        if rows == 0 || cols == 0 {
            return Ok(Moments::default());
        }
        let es = t.kind.size();
        let width_per = (self.chunk_elems / rows).max(1).min(cols);
        let raw = grown(&mut self.raw, rows * width_per * es);
        let vals = grown(&mut self.vals, rows * width_per);
        let what = DataOf(&t.name);
        let mut moments = Moments::default();
        let mut col = 0usize;
        while col < cols {
            let w = width_per.min(cols - col);
            let raw = &mut raw[..rows * w * es];
            let vals = &mut vals[..rows * w];
            if w == cols {
                self.data.read_at(raw, t.offset, &what)?;
            } else {
                for (i, row_bytes) in raw.chunks_exact_mut(w * es).enumerate() {
                    let at = t.offset + (i * cols + col) as u64 * es as u64;
                    self.data.read_at(row_bytes, at, &what)?;
                }
            }
            moments.merge(&decode_with_moments(t.kind, raw, vals));
            f(w, vals);
            col += w;
        }
        Ok(moments)
    }

    /// `X·Xᵀ` (rows x rows) of a 2-D tensor with at most [`MAX_GRAM_DIM`]
    /// rows, accumulated in f64 over column blocks, and X's moments.
    pub fn row_gram(&mut self, t: &FloatTensor) -> Result<(DMatrix<f64>, Moments)> {
        let (rows, _) = self.data.narrow_dims(t, true)?;
        let mut g = Gram::new(rows);
        let m = self.for_each_column_block(t, |w, vals| g.add_rows(vals, w))?;
        Ok((g.finish(), m))
    }

    /// `Xᵀ·X` (cols x cols) of a 2-D tensor with at most [`MAX_GRAM_DIM`]
    /// columns, accumulated in f64 over row blocks, and X's moments.
    pub fn column_gram(&mut self, t: &FloatTensor) -> Result<(DMatrix<f64>, Moments)> {
        let (_, cols) = self.data.narrow_dims(t, false)?;
        let mut h = Gram::new(cols);
        let m = self.for_each_row_block(t, |n, vals| h.add_columns(vals, n))?;
        Ok((h.finish(), m))
    }
}

/// min(remaining, cap) as usize (cap is a usize, so this cannot overflow).
fn bounded(remaining: u64, cap: usize) -> usize {
    usize::try_from(remaining).map_or(cap, |r| r.min(cap))
}

// ---------------------------------------------------------------------------
// Gram kernel

/// Columns of a panel walked at once (for `add_rows`): the six rows a tile
/// reads (6 x 2 KiB) stay in L1.
const GRAM_PANEL: usize = 256;
/// Lanes per accumulator: two f64 fill an SSE2 register, and 4x2 tiles of
/// them (8 registers) plus their operands (6) fit the 16 of x86-64.
const GRAM_LANES: usize = 2;

/// An n x n Gram matrix being accumulated in f64, upper triangle only.
///
/// Why not a BLAS call: the matrices are thin (n = r, usually 4..256) and
/// long, where a general GEMM spends its time packing. Two register-tiled
/// kernels run several times faster here and do half the work by symmetry:
/// dot products along the long rows for `P·Pᵀ` (`lora_A`, r x in), and
/// sums of outer products of the short rows for `Xᵀ·X` (`lora_B`, out x r),
/// so neither layout is transposed.
pub struct Gram {
    n: usize,
    /// Row-major n x n; entries (i, j) with i <= j are meaningful.
    upper: Vec<f64>,
}

impl Gram {
    pub fn new(n: usize) -> Gram {
        Gram {
            n,
            upper: vec![0.0; n * n],
        }
    }

    /// Add P·Pᵀ for P (n x w) stored row-major in `p`.
    pub fn add_rows(&mut self, p: &[f64], w: usize) {
        gram_upper(p, self.n, w, &mut self.upper);
    }

    /// Add Xᵀ·X for X (rows x n) stored row-major in `x`.
    pub fn add_columns(&mut self, x: &[f64], rows: usize) {
        gram_upper_of_columns(x, rows, self.n, &mut self.upper);
    }

    /// The full symmetric matrix.
    pub fn finish(self) -> DMatrix<f64> {
        let n = self.n;
        DMatrix::from_fn(n, n, |i, j| {
            let (a, b) = if i <= j { (i, j) } else { (j, i) };
            self.upper[a * n + b]
        })
    }
}

/// upper += P·Pᵀ (entries i <= j) for P (n x w) row-major.
fn gram_upper(p: &[f64], n: usize, w: usize, upper: &mut [f64]) {
    debug_assert!(p.len() >= n * w && upper.len() >= n * n);
    if p.len() < n * w || upper.len() < n * n || w == 0 {
        return;
    }
    let mut k0 = 0;
    while k0 < w {
        let kw = GRAM_PANEL.min(w - k0);
        let row = |i: usize| &p[i * w + k0..i * w + k0 + kw];
        let mut i = 0;
        while i + 4 <= n {
            let xs = [row(i), row(i + 1), row(i + 2), row(i + 3)];
            let mut j = i;
            while j + 2 <= n {
                let t = tile(xs, [row(j), row(j + 1)]);
                for (a, ta) in t.iter().enumerate() {
                    for (b, &v) in ta.iter().enumerate() {
                        upper[(i + a) * n + j + b] += v;
                    }
                }
                j += 2;
            }
            if j < n {
                let t = tile(xs, [row(j)]);
                for (a, ta) in t.iter().enumerate() {
                    upper[(i + a) * n + j] += ta[0];
                }
            }
            i += 4;
        }
        for i in i..n {
            for j in i..n {
                upper[i * n + j] += tile([row(i)], [row(j)])[0][0];
            }
        }
        k0 += kw;
    }
}

/// upper += Xᵀ·X (entries i <= j) for X (rows x n) row-major, as sums of
/// outer products of X's rows: 4x4 tiles of (i, j) keep their 16 sums in
/// registers while the rows stream by, so no transpose is needed.
fn gram_upper_of_columns(x: &[f64], rows: usize, n: usize, upper: &mut [f64]) {
    debug_assert!(x.len() >= rows * n && upper.len() >= n * n);
    if n == 0 || x.len() < rows * n || upper.len() < n * n {
        return;
    }
    // Rows per pass: about 32 KiB of X, so a pass stays in L1 across tiles.
    let pass_rows = (4096 / n).max(8);
    let n4 = n - n % 4;
    for pass in x[..rows * n].chunks(pass_rows * n) {
        for i0 in (0..n4).step_by(4) {
            for j0 in (i0..n4).step_by(4) {
                let mut acc = [[0.0f64; 4]; 4];
                for row in pass.chunks_exact(n) {
                    let xi = &row[i0..i0 + 4];
                    let xj = &row[j0..j0 + 4];
                    for a in 0..4 {
                        for b in 0..4 {
                            acc[a][b] += xi[a] * xj[b];
                        }
                    }
                }
                for (a, acc_a) in acc.iter().enumerate() {
                    for (b, &v) in acc_a.iter().enumerate() {
                        upper[(i0 + a) * n + j0 + b] += v;
                    }
                }
            }
        }
        // Columns past the last full tile: plain sums.
        for j in n4..n {
            for i in 0..=j {
                let v: f64 = pass.chunks_exact(n).map(|row| row[i] * row[j]).sum();
                upper[i * n + j] += v;
            }
        }
    }
}

/// `out[a][b] = Σ_k xs[a][k]·ys[b][k]` over the common length, with
/// [`GRAM_LANES`] independent partial sums per entry. Indexing by one
/// counter over slices cut to one length lets the compiler drop the bounds
/// checks and keep the TI·TJ·LANES sums in registers.
#[inline(always)]
fn tile<const TI: usize, const TJ: usize>(xs: [&[f64]; TI], ys: [&[f64]; TJ]) -> [[f64; TJ]; TI] {
    let len = xs
        .iter()
        .chain(ys.iter())
        .map(|r| r.len())
        .min()
        .unwrap_or(0);
    let xs = xs.map(|r| &r[..len]);
    let ys = ys.map(|r| &r[..len]);
    let full = len - len % GRAM_LANES;
    let mut acc = [[[0.0f64; GRAM_LANES]; TJ]; TI];
    let mut k = 0;
    while k < full {
        for a in 0..TI {
            for b in 0..TJ {
                for l in 0..GRAM_LANES {
                    acc[a][b][l] += xs[a][k + l] * ys[b][k + l];
                }
            }
        }
        k += GRAM_LANES;
    }
    let mut out = [[0.0f64; TJ]; TI];
    for a in 0..TI {
        for b in 0..TJ {
            let tail: f64 = (full..len).map(|k| xs[a][k] * ys[b][k]).sum();
            out[a][b] = acc[a][b].iter().sum::<f64>() + tail;
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
