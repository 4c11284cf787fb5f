//! Opening a GGUF file: maps it, parses the header, every metadata key/value and every tensor
//! info, and validates tensor ranges, without reading a single weight byte.
//!
//! Invariant: every count read from the file is checked against the bytes left before anything
//! is allocated for it, so a corrupt header can neither panic nor blow up memory; after `open`
//! succeeds every tensor's byte range lies inside the mapping.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;

use crate::output::escaped;
use crate::value::{min_encoded_len, type_id};
use crate::{GgmlType, TensorInfo, Value};

/// "GGUF" read as a little-endian u32.
const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dims.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are rejected (guards the recursion).
const MAX_ARRAY_DEPTH: u32 = 8;
/// At most this many validation errors are listed.
const MAX_LISTED_ERRORS: usize = 20;

/// An opened GGUF file: parsed header and a memory map for the weights.
pub struct GgufFile {
    mmap: Mmap,
    path: PathBuf,
    by_name: HashMap<String, usize>,
    /// Format version (2 or 3).
    pub version: u32,
    /// All metadata key/values, sorted by key.
    pub metadata: BTreeMap<String, Value>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses `path`; errors name the file and what is wrong with it.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // a directory opens, but maps as "No such device"
        if file.metadata().is_ok_and(|m| m.is_dir()) {
            bail!(
                "{}: is a directory; a GGUF model file is expected",
                path.display()
            );
        }
        // SAFETY: the map is read-only; like every mmap reader we rely on nobody truncating
        // the model file while it is open.
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        let parsed = parse(&mmap).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let by_name = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            mmap,
            path: path.to_path_buf(),
            by_name,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            data_offset: parsed.data_offset,
        })
    }

    /// The header: magic, metadata and tensor infos, up to the data section (no weights).
    pub fn header_bytes(&self) -> &[u8] {
        &self.mmap[..(self.data_offset as usize).min(self.mmap.len())]
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// The tensor info with this name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of a tensor of this file (range validated at open).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_offset + t.offset;
        self.mmap
            .get(start as usize..(start + t.n_bytes()) as usize)
            .expect("invariant: tensor info belongs to this file, whose ranges were checked")
    }

    /// The stored bytes of rows `rows` of tensor `t`.
    pub fn tensor_rows(&self, t: &TensorInfo, rows: std::ops::Range<u64>) -> Result<&[u8]> {
        if rows.start > rows.end || rows.end > t.rows() {
            bail!(
                "{}: rows {}..{} out of range for tensor `{}` with {} rows",
                self.path.display(),
                rows.start,
                rows.end,
                escaped(&t.name),
                t.rows()
            );
        }
        let rb = t.row_bytes() as usize;
        let all = self.tensor_bytes(t);
        Ok(&all[rows.start as usize * rb..rows.end as usize * rb])
    }

    /// Dequantizes a whole tensor to f32.
    pub fn dequantize_tensor(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let mut out = vec![0f32; t.n_elements() as usize];
        crate::dequantize(t.dtype, self.tensor_bytes(t), &mut out).map_err(|e| {
            anyhow!(
                "{}: tensor `{}`: {e}",
                self.path.display(),
                escaped(&t.name)
            )
        })?;
        Ok(out)
    }
}

struct Parsed {
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

/// A bounds-checked little-endian reader; errors carry the byte offset.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            bail!(
                "truncated at byte {}: {what} needs {n} bytes but only {} are left",
                self.pos,
                self.left()
            );
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        Ok(s.try_into().expect("invariant: take returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 count of items, each at least `min_each` bytes, checked against the bytes left.
    fn count(&mut self, what: &str, min_each: u64) -> Result<u64> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n.checked_mul(min_each)
            .is_none_or(|need| need > self.left())
        {
            bail!(
                "at byte {at}: {what} {n} is impossible: {} bytes are left in the file",
                self.left()
            );
        }
        Ok(n)
    }

    fn bytes_str(&mut self, what: &str) -> Result<&'a [u8]> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.left() {
            bail!(
                "at byte {at}: {what} has length {len} but only {} bytes are left",
                self.left()
            );
        }
        self.take(len, what)
    }

    /// A length-prefixed string that must be valid UTF-8 (a metadata key, a tensor name).
    fn utf8_str(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let bytes = self.bytes_str(what)?;
        let text = std::str::from_utf8(bytes)
            .map_err(|_| anyhow!("at byte {at}: {what} is not valid utf-8"))?;
        Ok(text.to_string())
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value> {
        let v = match ty {
            type_id::U8 => Value::U8(self.array::<1>(key)?[0]),
            type_id::I8 => Value::I8(self.array::<1>(key)?[0] as i8),
            type_id::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            type_id::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            type_id::U32 => Value::U32(self.u32(key)?),
            type_id::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            type_id::U64 => Value::U64(self.u64(key)?),
            type_id::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            type_id::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            type_id::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            type_id::BOOL => {
                let at = self.pos;
                match self.array::<1>(key)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => bail!("at byte {at}: key `{key}`: bool byte is {b}, expected 0 or 1"),
                }
            }
            type_id::STR => Value::Str(String::from_utf8_lossy(self.bytes_str(key)?).into_owned()),
            type_id::ARRAY => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    bail!("at byte {at}: key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}");
                }
                let elem = self.u32(key)?;
                let Some(min) = min_encoded_len(elem) else {
                    bail!("at byte {at}: key `{key}`: unknown array element type {elem}");
                };
                let n = self.count(&format!("key `{key}`: array length"), min)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            _ => bail!(
                "before byte {}: key `{key}`: unknown value type {ty}",
                self.pos
            ),
        };
        Ok(v)
    }
}

fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if &magic != MAGIC {
        bail!(
            "not a gguf file: magic is \"{}\", expected \"GGUF\"",
            magic.escape_ascii()
        );
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => bail!("gguf version 1 is not supported; supported: 2, 3"),
        v if v.swap_bytes() <= 3 => {
            bail!("big-endian gguf files are not supported (version reads as {v:#x})")
        }
        v => bail!("unknown gguf version {v}; supported: 2, 3"),
    }
    // each tensor info takes at least 24 bytes, each key/value at least 13
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata count", 13)?;
    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let at = c.pos;
        let key = c.utf8_str("metadata key")?;
        // the key as messages quote it (a crafted key's escape sequences escaped)
        let shown = escaped(&key).to_string();
        let ty = c.u32(&shown)?;
        let v = c.value(ty, &shown, 0)?;
        if metadata.insert(key, v).is_some() {
            bail!("at byte {at}: duplicate metadata key `{shown}`");
        }
    }
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        tensors.push(tensor_info(&mut c)?);
    }
    let alignment = alignment(&metadata)?;
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    validate_tensors(&tensors, alignment, data_offset, buf.len() as u64)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        data_offset,
    })
}

fn tensor_info(c: &mut Cursor) -> Result<TensorInfo> {
    let name = c.utf8_str("tensor name")?;
    let shown = escaped(&name).to_string();
    let n_dims = c.u32(&shown)?;
    if n_dims > MAX_DIMS {
        bail!("tensor `{shown}`: {n_dims} dims, at most {MAX_DIMS} are allowed");
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&shown)?);
    }
    let id = c.u32(&shown)?;
    let dtype = GgmlType::from_id(id)
        .ok_or_else(|| anyhow!("tensor `{shown}`: unknown ggml type id {id}"))?;
    let offset = c.u64(&shown)?;
    Ok(TensorInfo {
        name,
        dims,
        dtype,
        offset,
    })
}

fn alignment(metadata: &BTreeMap<String, Value>) -> Result<u64> {
    let Some(v) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_int() {
        Some(a) if a > 0 && a <= u32::MAX.into() && (a as u64).is_power_of_two() => Ok(a as u64),
        _ => bail!(
            "general.alignment must be a power of two that fits uint32, found {} {v}",
            v.type_name()
        ),
    }
}

/// Checks every tensor and fails with all problems found.
fn validate_tensors(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<()> {
    let mut errors = Vec::new();
    let mut seen = HashMap::new();
    let mut ranges = Vec::new();
    for t in tensors {
        if seen.insert(t.name.as_str(), ()).is_some() {
            errors.push(format!("duplicate tensor name `{}`", escaped(&t.name)));
        }
        match tensor_range(t, alignment, data_offset, file_len) {
            Ok(r) => ranges.push((r, t.name.as_str())),
            Err(e) => errors.push(format!("tensor `{}`: {e}", escaped(&t.name))),
        }
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[0].0 .1 > w[1].0 .0 {
            errors.push(format!(
                "tensors `{}` and `{}` overlap",
                escaped(w[0].1),
                escaped(w[1].1)
            ));
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let n = errors.len();
    errors.truncate(MAX_LISTED_ERRORS);
    if n > MAX_LISTED_ERRORS {
        errors.push(format!("... and {} more", n - MAX_LISTED_ERRORS));
    }
    bail!("{}", errors.join("\n"))
}

/// The absolute byte range of one tensor, after checking shape, alignment and bounds.
fn tensor_range(
    t: &TensorInfo,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<(u64, u64)> {
    if let Some(i) = t.dims.iter().position(|&d| d == 0) {
        bail!("dimension {i} is 0 in {}", t.dims_string());
    }
    let n = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| anyhow!("dims {} overflow the element count", t.dims_string()))?;
    let bs = t.dtype.block_size() as u64;
    if !t.row_len().is_multiple_of(bs) {
        bail!(
            "row length {} is not a multiple of the {} block size {bs}",
            t.row_len(),
            t.dtype
        );
    }
    let bytes = t
        .dtype
        .bytes_for(n)
        .ok_or_else(|| anyhow!("dims {} overflow the byte size", t.dims_string()))?;
    if !t.offset.is_multiple_of(alignment) {
        bail!(
            "offset {} is not a multiple of the alignment {alignment}",
            t.offset
        );
    }
    let start = data_offset.checked_add(t.offset);
    match start.and_then(|s| s.checked_add(bytes).map(|e| (s, e))) {
        Some((s, e)) if e <= file_len => Ok((s, e)),
        _ => bail!(
            "{bytes} bytes at data offset {} run past the end of the file ({file_len} bytes, data section at {data_offset})",
            t.offset
        ),
    }
}
