//! Synthetic weights (`memra-run --weights synthetic`, like vLLM's dummy load format): every
//! shard a rank's plan lists is filled with seeded pseudo-random values of the shard's dtype
//! and shape, read from the plan alone, so a plan compiled from a `config.json` runs at full
//! size without a model file.
//!
//! Architecture Invariant: element `i` of a tensor (its row-major index in the plan's logical
//! shape) has one value, a hash of (seed, tensor name, `i`), whatever the sharding; a shard
//! draws only the elements it holds. Quantized shards quantize their own blocks, and every
//! split keeps blocks whole, so a shard's bytes are the matching slice of the whole tensor's
//! and every plan of a model runs on the 1-rank plan's bytes.
//!
//! Scales follow `memra_gguf::synth` (`gguf/src/synth/plan.rs`): a matrix is uniform with
//! standard deviation 1/sqrt(its row length), divided by sqrt(2 * layers) for projections that
//! write into the residual stream; norms lie in [0.9, 1.1), KDA's `ssm_a` (`-exp(A_log)`) in
//! [-1.0, -0.2), mHC scales in [0.5, 1.5), mHC bases in [-1, 1), other vectors (biases) in
//! [-0.1, 0.1). Vectors are handed to the backends as f32 values, as the file loader hands
//! them after dequantizing.

use anyhow::{bail, Result};
use memra_compiler::model::fnv1a;
use memra_compiler::plan::{Split, WeightShard};
use memra_gguf::{quantize, GgmlType};

use crate::weights::{Matrix, Shard, Stack};

/// The seed every synthetic load uses: the values are a function of the tensor name alone.
pub const SEED: u64 = 0x6d65_6d72_6100_0001;

/// How the values of one tensor are spread.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    center: f32,
    half: f32,
}

/// The spread of tensor `name` of logical `shape` in a model of `layers` layers.
fn spread(name: &str, shape: &[u64], layers: u32) -> Spread {
    let around = |center, half| Spread { center, half };
    if shape.len() == 1 {
        return match name {
            n if n.ends_with(".ssm_a") => around(-0.6, 0.4),
            n if n.ends_with("_scale.weight") => around(1.0, 0.5),
            n if n.ends_with("_base.weight") => around(0.0, 1.0),
            n if n.ends_with("norm.weight") => around(1.0, 0.1),
            _ => around(0.0, 0.1),
        };
    }
    let row = *shape.last().expect("invariant: matrices have a row length") as f32;
    let writes_residual = name.contains(".attn_output.") || name.contains(".ffn_down");
    let res = match writes_residual {
        true => (2.0 * layers as f32).sqrt(),
        false => 1.0,
    };
    around(0.0, 3f32.sqrt() / row.sqrt() / res)
}

/// Uniform in [-1, 1) on a grid of 2^-23: SplitMix64 at counter `index` of stream `key`, so
/// any element is drawn without drawing the ones before it.
pub(crate) fn uniform(key: u64, index: u64) -> f32 {
    let mut z = key.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// The values of one tensor: element `i` is `center + half * uniform(key, i)`.
struct Tensor {
    key: u64,
    spread: Spread,
}

impl Tensor {
    fn new(name: &str, shape: &[u64], layers: u32) -> Tensor {
        Tensor {
            key: fnv1a(name.as_bytes(), SEED),
            spread: spread(name, shape, layers),
        }
    }

    /// Elements `start..end` of the flattened tensor.
    fn values(&self, start: u64, end: u64) -> Vec<f32> {
        let Spread { center, half } = self.spread;
        (start..end)
            .map(|i| center + half * uniform(self.key, i))
            .collect()
    }

    /// Columns `cols` of rows `rows` of a `[.., row_len]` tensor, stored as `dtype`. Large
    /// shards are drawn by several threads, each over its own rows: every row's bytes depend
    /// on the row alone, so the threads change nothing but the time.
    fn rows_bytes(
        &self,
        dtype: GgmlType,
        row_len: u64,
        rows: std::ops::Range<u64>,
        cols: std::ops::Range<u64>,
    ) -> Result<Vec<u8>> {
        let width = cols.end - cols.start;
        let row_bytes = dtype
            .bytes_for(width)
            .expect("invariant: splits keep blocks whole") as usize;
        let count = (rows.end - rows.start) as usize;
        let mut out = vec![0u8; row_bytes * count];
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(count * width as usize / THREAD_ELEMENTS).max(1);
        let per_thread = count.div_ceil(threads).max(1);
        let draw = |first_row: u64, part: &mut [u8]| -> Result<()> {
            for (r, chunk) in (first_row..).zip(part.chunks_exact_mut(row_bytes)) {
                let first = r * row_len + cols.start;
                quantize(dtype, &self.values(first, first + width), chunk)?;
            }
            Ok(())
        };
        std::thread::scope(|scope| {
            let parts: Vec<_> = (rows.start..)
                .step_by(per_thread)
                .zip(out.chunks_mut(per_thread * row_bytes))
                .map(|(first_row, part)| scope.spawn(move || draw(first_row, part)))
                .collect();
            parts.into_iter().try_for_each(|part| {
                part.join()
                    .expect("invariant: drawing and quantizing values does not panic")
            })
        })?;
        Ok(out)
    }
}

/// Elements a thread draws at least: smaller shards are drawn by fewer threads.
const THREAD_ELEMENTS: usize = 1 << 20;

/// The shard `shard` of a model of `layers` layers, drawn.
pub(crate) fn shard(shard: &WeightShard, layers: u32) -> Result<Shard> {
    let Some(dtype) = GgmlType::from_name(&shard.dtype) else {
        bail!(
            "the plan names dtype `{}`, which memra does not know",
            shard.dtype
        );
    };
    dtype.check_supported()?;
    let shape = &shard.shape;
    let tensor = Tensor::new(&shard.tensor, shape, layers);
    match (shape.as_slice(), shard.split) {
        (&[len], Split::Full) => Ok(Shard::Vector(tensor.values(0, len))),
        (&[len], Split::Rows { start, end }) if start <= end && end <= len => {
            Ok(Shard::Vector(tensor.values(start, end)))
        }
        (&[rows, cols], split) => {
            let (rows_held, cols_held) = match split {
                Split::Full => (0..rows, 0..cols),
                Split::Rows { start, end } if start <= end && end <= rows => {
                    (start..end, 0..cols)
                }
                Split::Cols { start, end } if whole_blocks(dtype, start, end, cols) => {
                    (0..rows, start..end)
                }
                other => bail!("split `{other}` does not apply to a {rows}x{cols} {dtype} matrix"),
            };
            let (held_rows, held_cols) = (
                rows_held.end - rows_held.start,
                cols_held.end - cols_held.start,
            );
            Ok(Shard::Matrix(Matrix {
                dtype,
                data: tensor.rows_bytes(dtype, cols, rows_held, cols_held)?,
                rows: held_rows as usize,
                cols: held_cols as usize,
            }))
        }
        (&[count, rows, cols], split) => {
            let (first, end) = match split {
                Split::Full => (0, count),
                Split::Experts { start, end } | Split::Heads { start, end }
                    if start < end && end <= count =>
                {
                    (start, end)
                }
                other => bail!("split `{other}` does not apply to a stack of {count} matrices"),
            };
            Ok(Shard::Stack(Stack {
                dtype,
                data: tensor.rows_bytes(dtype, cols, first * rows..end * rows, 0..cols)?,
                first: first as usize,
                count: (end - first) as usize,
                rows: rows as usize,
                cols: cols as usize,
            }))
        }
        (_, split) => bail!(
            "split `{split}` of a tensor of shape {shape:?}: only vectors, matrices and stacks of matrices are supported"
        ),
    }
}

/// Whether columns `start..end` of rows of `len` are whole blocks of `dtype`.
fn whole_blocks(dtype: GgmlType, start: u64, end: u64, len: u64) -> bool {
    let block = dtype.block_size() as u64;
    start <= end && end <= len && start.is_multiple_of(block) && end.is_multiple_of(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard_of(tensor: &str, dtype: &str, shape: &[u64], split: Split) -> WeightShard {
        WeightShard {
            tensor: tensor.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            split,
            bytes: 0,
        }
    }

    fn matrix(s: &WeightShard) -> Matrix {
        match shard(s, 4).unwrap() {
            Shard::Matrix(m) => m,
            _ => panic!("a matrix"),
        }
    }

    #[test]
    fn a_split_holds_the_whole_tensors_bytes() {
        for dtype in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"] {
            let name = "blk.1.ffn_down.weight";
            let full = matrix(&shard_of(name, dtype, &[6, 512], Split::Full));
            let rows = matrix(&shard_of(
                name,
                dtype,
                &[6, 512],
                Split::Rows { start: 2, end: 5 },
            ));
            assert_eq!(rows.data, full.rows_bytes(2, 5), "{dtype} rows");
            let cols = matrix(&shard_of(
                name,
                dtype,
                &[6, 512],
                Split::Cols {
                    start: 256,
                    end: 512,
                },
            ));
            let half = full.row_bytes() / 2;
            let want: Vec<u8> = full
                .data
                .chunks_exact(full.row_bytes())
                .flat_map(|row| row[half..].to_vec())
                .collect();
            assert_eq!(cols.data, want, "{dtype} cols");
        }
    }

    #[test]
    fn threads_draw_the_bytes_one_thread_draws() {
        // 4M elements: drawn whole by every core; 32-row shards (64K elements) by one thread
        let (rows, cols) = (2048, 2048);
        let name = "blk.0.attn_q.weight";
        let whole = matrix(&shard_of(name, "q4_0", &[rows, cols], Split::Full));
        for start in (0..rows).step_by(32) {
            let end = start + 32;
            let part = matrix(&shard_of(
                name,
                "q4_0",
                &[rows, cols],
                Split::Rows { start, end },
            ));
            assert_eq!(
                part.data,
                whole.rows_bytes(start as usize, end as usize),
                "rows {start}..{end}"
            );
        }
    }

    #[test]
    fn an_expert_split_holds_the_whole_stacks_matrices() {
        let stack = |split| match shard(
            &shard_of("blk.1.ffn_up_exps.weight", "q8_0", &[4, 3, 64], split),
            4,
        )
        .unwrap()
        {
            Shard::Stack(s) => s,
            _ => panic!("a stack"),
        };
        let full = stack(Split::Full);
        let part = stack(Split::Experts { start: 2, end: 4 });
        assert_eq!(part.matrix(3), full.matrix(3));
        assert_eq!(part.matrix(2), full.matrix(2));
        assert_eq!(part.matrix(1), None);
    }

    #[test]
    fn values_are_spread_by_name_and_differ_between_tensors() {
        let vector =
            |name: &str| match shard(&shard_of(name, "f32", &[64], Split::Full), 4).unwrap() {
                Shard::Vector(v) => v,
                _ => panic!("a vector"),
            };
        let norm = vector("blk.0.attn_norm.weight");
        assert!(norm.iter().all(|x| (0.9..1.1).contains(x)), "{norm:?}");
        assert!(vector("blk.0.ssm_a")
            .iter()
            .all(|x| (-1.0..-0.2).contains(x)));
        assert_ne!(vector("blk.0.ffn_norm.weight"), norm);
        let part = match shard(
            &shard_of(
                "blk.0.attn_norm.weight",
                "f32",
                &[64],
                Split::Rows { start: 8, end: 24 },
            ),
            4,
        )
        .unwrap()
        {
            Shard::Vector(v) => v,
            _ => panic!("a vector"),
        };
        assert_eq!(part, norm[8..24]);
        let wide = matrix(&shard_of(
            "blk.0.attn_q.weight",
            "f32",
            &[2, 256],
            Split::Full,
        ));
        let bound = 3f32.sqrt() / 16.0;
        let values: Vec<f32> = wide
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(values.iter().all(|x| x.abs() <= bound));
        assert!(values.iter().any(|x| x.abs() > bound / 2.0));
    }

    #[test]
    fn a_split_that_cuts_a_block_is_refused() {
        let err = shard(
            &shard_of(
                "blk.0.attn_output.weight",
                "q8_0",
                &[4, 64],
                Split::Cols { start: 16, end: 64 },
            ),
            4,
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "split `cols 16..64` does not apply to a 4x64 q8_0 matrix"
        );
    }
}
