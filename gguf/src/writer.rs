//! Writing GGUF v3 files: metadata of every value type, tensor infos with aligned offsets, and
//! tensor data either held in memory or streamed tensor by tensor (multi-gigabyte synthetic
//! models never sit in memory whole). The writer validates what it is given with the same
//! rules the reader enforces, so whatever it writes opens.

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::reader::DEFAULT_ALIGNMENT;
use crate::value::type_id;
use crate::{GgmlType, TensorInfo, Value};

/// Builds a GGUF v3 file.
#[derive(Debug)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data: Vec<Option<Vec<u8>>>,
    next_offset: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
            data: Vec::new(),
            next_offset: 0,
        }
    }
}

impl GgufWriter {
    /// A writer with the default alignment of 32.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// A writer aligning tensor data to `alignment` (a power of two), recorded as
    /// `general.alignment`.
    pub fn with_alignment(alignment: u32) -> Result<GgufWriter> {
        if !alignment.is_power_of_two() {
            bail!("alignment {alignment} is not a power of two");
        }
        let mut w = GgufWriter {
            alignment: alignment.into(),
            ..GgufWriter::default()
        };
        w.add("general.alignment", Value::U32(alignment))?;
        Ok(w)
    }

    /// Adds a metadata key. Arrays must be homogeneous; an empty array is written as an array
    /// of strings.
    pub fn add(&mut self, key: &str, value: Value) -> Result<()> {
        if self.metadata.iter().any(|(k, _)| k == key) {
            bail!("duplicate metadata key `{key}`");
        }
        check_homogeneous(key, &value)?;
        self.metadata.push((key.to_string(), value));
        Ok(())
    }

    /// Declares a tensor whose data will be streamed later; returns its info (with offset).
    pub fn declare_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: GgmlType,
    ) -> Result<TensorInfo> {
        if self.tensors.iter().any(|t| t.name == name) {
            bail!("duplicate tensor name `{name}`");
        }
        if dims.is_empty() || dims.len() > 4 || dims.contains(&0) {
            bail!("tensor `{name}`: dims must be 1 to 4 nonzero sizes");
        }
        let t = TensorInfo {
            name: name.to_string(),
            dims: dims.to_vec(),
            dtype,
            offset: self.next_offset,
        };
        let n = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        if !t.row_len().is_multiple_of(dtype.block_size() as u64) {
            bail!(
                "tensor `{name}`: row length {} is not a multiple of the {dtype} block size {}",
                t.row_len(),
                dtype.block_size()
            );
        }
        let Some(bytes) = n.and_then(|n| dtype.bytes_for(n)) else {
            bail!("tensor `{name}`: dims {} overflow", t.dims_string());
        };
        self.next_offset = (t.offset + bytes).next_multiple_of(self.alignment);
        self.tensors.push(t.clone());
        self.data.push(None);
        Ok(t)
    }

    /// Adds a tensor with its data held in memory.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: GgmlType,
        data: Vec<u8>,
    ) -> Result<()> {
        let t = self.declare_tensor(name, dims, dtype)?;
        if data.len() as u64 != t.n_bytes() {
            self.tensors.pop();
            self.data.pop();
            self.next_offset = t.offset;
            bail!(
                "tensor `{name}`: {} {dtype} {} takes {} bytes, got {}",
                t.dims_string(),
                if t.n_elements() == 1 {
                    "value"
                } else {
                    "values"
                },
                t.n_bytes(),
                data.len()
            );
        }
        *self.data.last_mut().expect("invariant: just pushed") = Some(data);
        Ok(())
    }

    /// The declared tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Writes the header and returns a stream that takes the tensor data in declared order.
    pub fn start<W: Write>(&self, mut w: W) -> Result<TensorStream<'_, W>> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut h, k);
            h.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut h, v);
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.dtype.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        h.resize(
            (h.len() as u64).next_multiple_of(self.alignment) as usize,
            0,
        );
        w.write_all(&h).context("cannot write gguf header")?;
        Ok(TensorStream {
            w,
            tensors: &self.tensors,
            current: 0,
            pos: 0,
        })
    }

    /// Writes the whole file; every tensor must have been added with its data.
    pub fn write_to<W: Write>(&self, w: W) -> Result<W> {
        let mut s = self.start(w)?;
        for (t, d) in self.tensors.iter().zip(&self.data) {
            let Some(d) = d else {
                bail!("tensor `{}` was declared but has no data", t.name);
            };
            s.write(d)?;
        }
        s.finish()
    }

    /// The whole file as bytes (for tests and small files).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.write_to(Vec::new())
    }
}

/// Takes tensor data in declared order, in as many pieces as convenient, and inserts the
/// alignment padding between tensors.
pub struct TensorStream<'a, W: Write> {
    w: W,
    tensors: &'a [TensorInfo],
    current: usize,
    /// Bytes written so far into the data section.
    pos: u64,
}

impl<W: Write> TensorStream<'_, W> {
    /// Appends bytes to the current tensor; a piece may not cross into the next tensor.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(t) = self.tensors.get(self.current) else {
            bail!("{} bytes written after the last tensor", bytes.len());
        };
        if self.pos < t.offset {
            let pad = vec![0u8; (t.offset - self.pos) as usize];
            self.w
                .write_all(&pad)
                .context("cannot write gguf padding")?;
            self.pos = t.offset;
        }
        let end = t.offset + t.n_bytes();
        if self.pos + bytes.len() as u64 > end {
            bail!(
                "tensor `{}`: {} bytes written but it takes {}",
                t.name,
                self.pos + bytes.len() as u64 - t.offset,
                t.n_bytes()
            );
        }
        self.w
            .write_all(bytes)
            .with_context(|| format!("cannot write tensor `{}`", t.name))?;
        self.pos += bytes.len() as u64;
        if self.pos == end {
            self.current += 1;
        }
        Ok(())
    }

    /// Checks that every tensor is complete, flushes and returns the sink.
    pub fn finish(mut self) -> Result<W> {
        if let Some(t) = self.tensors.get(self.current) {
            bail!("tensor `{}` is incomplete", t.name);
        }
        self.w.flush().context("cannot flush gguf file")?;
        Ok(self.w)
    }
}

fn check_homogeneous(key: &str, v: &Value) -> Result<()> {
    if let Value::Array(items) = v {
        if let Some(first) = items.first() {
            if items.iter().any(|i| i.type_id() != first.type_id()) {
                bail!("key `{key}`: array elements must all have one type");
            }
        }
        for i in items {
            check_homogeneous(key, i)?;
        }
    }
    Ok(())
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::Str(s) => put_str(h, s),
        Value::Array(items) => {
            let elem = items.first().map_or(type_id::STR, Value::type_id);
            h.extend_from_slice(&elem.to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(h, i);
            }
        }
    }
}
