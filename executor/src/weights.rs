//! A rank's weights: exactly the shards its plan lists, copied out of the mapped GGUF (or
//! drawn by `synthetic`) into buffers the rank owns. Matrices keep their stored (quantized) bytes; a column split copies
//! each row's block-aligned column range. Vectors (norms, biases) are dequantized to f32.
//! Three-dimensional tensors (stacked experts, MLA's per-head matrices) are stacks of
//! matrices; an `experts a..b` or `heads a..b` split keeps matrices `a..b`.
//!
//! Progress: a matrix counts half its bytes when read out of the file and half when taken by
//! the backend, which for CUDA uploads it right then; so one report covers reading and
//! uploading without the backends reporting anything. Vectors are small and count when read.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{Rank, Split, WeightShard};
use memra_gguf::progress::Progress;
use memra_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::plan_load::{LoadedPlan, Weights};
use crate::synthetic::{self, BlocksDrawn, DrawnBlocks};

/// A matrix shard in its stored type: `rows` outputs of `cols` inputs, row-major.
#[derive(Debug)]
pub struct Matrix {
    /// Stored element type.
    pub dtype: GgmlType,
    /// The rows' stored bytes, back to back.
    pub data: Vec<u8>,
    /// Output rows held.
    pub rows: usize,
    /// Inputs per row.
    pub cols: usize,
}

impl Matrix {
    /// Stored bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.block_bytes()
    }

    /// The stored bytes of rows `start..end`.
    pub fn rows_bytes(&self, start: usize, end: usize) -> &[u8] {
        &self.data[start * self.row_bytes()..end * self.row_bytes()]
    }
}

/// Matrices `first..first + count` of a stack of equally shaped matrices, in their stored
/// type, back to back: the experts of an expert tensor, or the heads of a per-head tensor.
#[derive(Debug)]
pub struct Stack {
    /// Stored element type.
    pub dtype: GgmlType,
    /// The matrices' stored bytes, back to back.
    pub data: Vec<u8>,
    /// Index of the first matrix held in the whole tensor.
    pub first: usize,
    /// Matrices held.
    pub count: usize,
    /// Output rows of each matrix.
    pub rows: usize,
    /// Inputs per row.
    pub cols: usize,
}

impl Stack {
    /// Stored bytes of one matrix.
    pub fn matrix_bytes(&self) -> usize {
        self.rows * (self.cols / self.dtype.block_size() * self.dtype.block_bytes())
    }

    /// The stored bytes of matrix `index` of the whole tensor, if this stack holds it.
    pub fn matrix(&self, index: usize) -> Option<&[u8]> {
        let i = index.checked_sub(self.first).filter(|&i| i < self.count)?;
        let n = self.matrix_bytes();
        Some(&self.data[i * n..(i + 1) * n])
    }
}

/// One shard as a rank holds it.
#[derive(Debug)]
pub(crate) enum Shard {
    /// A vector's values (norms, biases), dequantized.
    Vector(Vec<f32>),
    /// A matrix in its stored type.
    Matrix(Matrix),
    /// A stack of matrices in their stored type.
    Stack(Stack),
    /// A synthetic matrix of quantized blocks, for the backend to draw on its device.
    DrawnMatrix(DrawnBlocks),
    /// A synthetic stack of quantized blocks, for the backend to draw on its device.
    DrawnStack(DrawnBlocks),
}

/// The shards one rank holds, by tensor name.
#[derive(Debug)]
pub struct RankWeights {
    matrices: BTreeMap<String, Matrix>,
    vectors: BTreeMap<String, Vec<f32>>,
    progress: Progress,
    stacks: BTreeMap<String, Stack>,
    /// Synthetic quantized shards not drawn yet (loaded with `BlocksDrawn::OnDevice`): the
    /// backend draws them on its device (`take_drawn_*`), or a host take draws them here.
    drawn_matrices: BTreeMap<String, DrawnBlocks>,
    drawn_stacks: BTreeMap<String, DrawnBlocks>,
}

impl RankWeights {
    /// Loads every shard `rank` lists from the model of `loaded`: read from its file, or
    /// drawn from the plan alone when it runs on synthetic weights (quantized blocks only
    /// described, `OnDevice`, for a backend that draws them on its device).
    pub fn load(loaded: &LoadedPlan, rank: &Rank, drawn: BlocksDrawn) -> Result<RankWeights> {
        let mut out = RankWeights {
            matrices: BTreeMap::new(),
            vectors: BTreeMap::new(),
            progress: loaded.weights_progress(rank.rank),
            stacks: BTreeMap::new(),
            drawn_matrices: BTreeMap::new(),
            drawn_stacks: BTreeMap::new(),
        };
        for shard in &rank.weights {
            let taken = match &loaded.weights {
                Weights::File(gguf) => read_shard(gguf, shard),
                Weights::Synthetic => synthetic::shard(shard, loaded.plan.model.layers, drawn),
            };
            taken
                .and_then(|taken| out.insert(shard, taken))
                .map_err(|e| anyhow!("rank {}: tensor `{}`: {e}", rank.rank, shard.tensor))?;
        }
        Ok(out)
    }

    /// Keeps `taken` as `shard`, after checking its size against the plan's.
    fn insert(&mut self, shard: &WeightShard, taken: Shard) -> Result<()> {
        let name = shard.tensor.clone();
        // a vector's bytes are its stored ones, dequantized on the way in
        let held = match &taken {
            Shard::Vector(_) => None,
            Shard::Matrix(m) => Some(m.data.len() as u64),
            Shard::Stack(s) => Some(s.data.len() as u64),
            Shard::DrawnMatrix(d) | Shard::DrawnStack(d) => {
                Some((d.matrix_bytes() * d.count as usize) as u64)
            }
        };
        if let Some(held) = held.filter(|&held| held != shard.bytes) {
            bail!(
                "the shard holds {held} bytes but the plan says {}",
                shard.bytes
            );
        }
        match taken {
            Shard::Vector(values) => {
                self.vectors.insert(name, values);
                self.progress.inc(shard.bytes);
            }
            Shard::Stack(stack) => {
                self.stacks.insert(name, stack);
                // no backend uploads a stack as it takes it yet: it counts whole when read
                self.progress.inc(shard.bytes);
            }
            Shard::Matrix(matrix) => {
                self.matrices.insert(name, matrix);
                self.progress.inc(shard.bytes / 2);
            }
            // described now, drawn as they are taken: half now, half then
            Shard::DrawnMatrix(blocks) => {
                self.drawn_matrices.insert(name, blocks);
                self.progress.inc(shard.bytes / 2);
            }
            Shard::DrawnStack(blocks) => {
                self.drawn_stacks.insert(name, blocks);
                self.progress.inc(shard.bytes / 2);
            }
        }
        Ok(())
    }

    /// Takes the matrix shard `name` out (drawn here if it waited to be drawn); an error
    /// names the missing tensor.
    pub fn take_matrix(&mut self, name: &str) -> Result<Matrix> {
        let matrix = match self.take_drawn_matrix(name) {
            Some(blocks) => Matrix {
                dtype: blocks.dtype(),
                data: blocks.bytes()?,
                rows: blocks.rows as usize,
                cols: blocks.cols() as usize,
            },
            None => {
                let matrix = self
                    .matrices
                    .remove(name)
                    .ok_or_else(|| anyhow!("the plan gives this rank no shard of `{name}`"))?;
                self.taken(matrix.data.len());
                matrix
            }
        };
        Ok(matrix)
    }

    /// Counts the second half of a matrix (or drawn stack) of `bytes` taken.
    fn taken(&mut self, bytes: usize) {
        let bytes = bytes as u64;
        self.progress.inc(bytes - bytes / 2);
        self.progress.finish_when_complete();
    }

    /// Takes the synthetic matrix `name` out undrawn, if it waits to be drawn (loaded
    /// `OnDevice`): the caller draws it.
    pub fn take_drawn_matrix(&mut self, name: &str) -> Option<DrawnBlocks> {
        let blocks = self.drawn_matrices.remove(name)?;
        self.taken(blocks.matrix_bytes());
        Some(blocks)
    }

    /// Takes the synthetic stack `name` out undrawn, if it waits to be drawn.
    pub fn take_drawn_stack(&mut self, name: &str) -> Option<DrawnBlocks> {
        let blocks = self.drawn_stacks.remove(name)?;
        self.taken(blocks.matrix_bytes() * blocks.count as usize);
        Some(blocks)
    }

    /// Takes the f32 matrix shard `name` out as its values, row after row, and its columns
    /// (the KDA convolutions, which are read as f32 only, as ggml's `ssm_conv`).
    pub fn take_f32_rows(&mut self, name: &str) -> Result<(Vec<f32>, usize)> {
        let m = self.take_matrix(name)?;
        if m.dtype != GgmlType::F32 {
            bail!(
                "tensor `{name}` is stored as {}; the convolution reads f32 only (as ggml's ssm_conv)",
                m.dtype
            );
        }
        let values = m
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((values, m.cols))
    }

    /// Takes the stack of matrices `name` out (drawn here if it waited to be drawn).
    pub fn take_stack(&mut self, name: &str) -> Result<Stack> {
        if let Some(blocks) = self.take_drawn_stack(name) {
            return Ok(Stack {
                dtype: blocks.dtype(),
                data: blocks.bytes()?,
                first: (blocks.first_row / blocks.rows) as usize,
                count: blocks.count as usize,
                rows: blocks.rows as usize,
                cols: blocks.cols() as usize,
            });
        }
        self.stacks
            .remove(name)
            .ok_or_else(|| anyhow!("the plan gives this rank no shard of `{name}`"))
    }

    /// Takes the vector `name` out.
    pub fn take_vector(&mut self, name: &str) -> Result<Vec<f32>> {
        self.vectors
            .remove(name)
            .ok_or_else(|| anyhow!("the plan gives this rank no shard of `{name}`"))
    }

    /// Takes the vector `name` out if the rank holds it (optional tensors such as biases).
    pub fn take_optional_vector(&mut self, name: &str) -> Option<Vec<f32>> {
        self.vectors.remove(name)
    }

    /// Names of the shards not taken yet.
    pub fn remaining(&self) -> Vec<&str> {
        self.matrices
            .keys()
            .chain(self.vectors.keys())
            .chain(self.stacks.keys())
            .chain(self.drawn_matrices.keys())
            .chain(self.drawn_stacks.keys())
            .map(String::as_str)
            .collect()
    }
}

/// The shard `shard` read out of `gguf`, checked against the plan's dtype and shape.
fn read_shard(gguf: &GgufFile, shard: &WeightShard) -> Result<Shard> {
    let info = gguf
        .tensor(&shard.tensor)
        .ok_or_else(|| anyhow!("not found in {}", gguf.path().display()))?;
    if info.dtype.name() != shard.dtype {
        bail!(
            "the plan says {} but the model stores {}",
            shard.dtype,
            info.dtype
        );
    }
    info.dtype.check_supported()?;
    let logical = memra_compiler::plan::logical_shape(&shard.tensor, &info.dims);
    if logical != shard.shape {
        bail!(
            "the plan says shape {:?} but the model has {:?}",
            shard.shape,
            logical
        );
    }
    match shard.shape.len() {
        1 => {
            let all = gguf.dequantize_tensor(info)?;
            let values = match shard.split {
                Split::Full => all,
                Split::Rows { start, end } if end <= all.len() as u64 && start <= end => {
                    all[start as usize..end as usize].to_vec()
                }
                other => bail!("split `{other}` does not apply to a vector"),
            };
            Ok(Shard::Vector(values))
        }
        2 => Ok(Shard::Matrix(match shard.split {
            Split::Full => matrix_rows(gguf, info, 0, info.rows())?,
            Split::Rows { start, end } => matrix_rows(gguf, info, start, end)?,
            Split::Cols { start, end } => matrix_cols(gguf, info, start, end)?,
            other @ (Split::Experts { .. } | Split::Heads { .. }) => {
                bail!("split `{other}` applies to stacks of matrices, not to a matrix")
            }
        })),
        3 => Ok(Shard::Stack(stack(gguf, info, &shard.shape, shard.split)?)),
        n => bail!(
            "only vectors, matrices and stacks of matrices are supported, found {n} dimensions"
        ),
    }
}

fn matrix_rows(gguf: &GgufFile, info: &TensorInfo, start: u64, end: u64) -> Result<Matrix> {
    let bytes = gguf.tensor_rows(info, start..end)?;
    Ok(Matrix {
        dtype: info.dtype,
        data: bytes.to_vec(),
        rows: (end - start) as usize,
        cols: info.row_len() as usize,
    })
}

/// Whether columns `start..end` of rows of `len` are whole blocks of `dtype`.
pub(crate) fn whole_blocks(dtype: GgmlType, start: u64, end: u64, len: u64) -> bool {
    let block = dtype.block_size() as u64;
    start <= end && end <= len && start.is_multiple_of(block) && end.is_multiple_of(block)
}

/// The matrices a split holds of a stack of `count`: `full`, `experts a..b` or `heads a..b`.
pub(crate) fn stack_matrices(split: Split, count: u64) -> Result<(u64, u64)> {
    match split {
        Split::Full => Ok((0, count)),
        Split::Experts { start, end } | Split::Heads { start, end }
            if start < end && end <= count =>
        {
            Ok((start, end))
        }
        other => bail!("split `{other}` does not apply to a stack of {count} matrices"),
    }
}

/// Matrices `a..b` of a `[count, rows, cols]` tensor: `full`, `experts a..b` or `heads a..b`.
fn stack(gguf: &GgufFile, info: &TensorInfo, shape: &[u64], split: Split) -> Result<Stack> {
    let (count, rows) = (shape[0], shape[1]);
    let (start, end) = stack_matrices(split, count)?;
    let bytes = gguf.tensor_rows(info, start * rows..end * rows)?;
    Ok(Stack {
        dtype: info.dtype,
        data: bytes.to_vec(),
        first: start as usize,
        count: (end - start) as usize,
        rows: rows as usize,
        cols: info.row_len() as usize,
    })
}

fn matrix_cols(gguf: &GgufFile, info: &TensorInfo, start: u64, end: u64) -> Result<Matrix> {
    let block = info.dtype.block_size() as u64;
    if !whole_blocks(info.dtype, start, end, info.row_len()) {
        bail!(
            "columns {start}..{end} are not whole {}-element blocks of rows of length {}",
            block,
            info.row_len()
        );
    }
    let block_bytes = info.dtype.block_bytes() as u64;
    let (from, to) = (
        (start / block * block_bytes) as usize,
        (end / block * block_bytes) as usize,
    );
    let all = gguf.tensor_bytes(info);
    let row_bytes = info.row_bytes() as usize;
    let mut data = Vec::with_capacity((to - from) * info.rows() as usize);
    for row in all.chunks_exact(row_bytes) {
        data.extend_from_slice(&row[from..to]);
    }
    Ok(Matrix {
        dtype: info.dtype,
        data,
        rows: info.rows() as usize,
        cols: (end - start) as usize,
    })
}
