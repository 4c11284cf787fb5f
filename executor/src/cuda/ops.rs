//! The device KV cache, and the typed launch helpers of every kernel family but the matvec's
//! (`matvec.rs`) and the layer kinds', mirroring the CPU kernels (the device weights and the
//! pieces every helper is made of are in `weights.rs`): argument checks on
//! the host (shape contracts are guaranteed by the plan compiler, so a violation is a bug and
//! panics, as on the CPU), then an asynchronous launch on the given stream. Every per-step
//! value (token, position) is read from device memory, so any sequence of these launches can
//! be captured into a CUDA graph and replayed. Buffers must stay alive until the stream has
//! finished with them.

use std::sync::Arc;

use anyhow::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig};

use super::device::{CudaDevice, DeviceBuffer, PLAIN_DYNAMIC_SHARED};
use super::matvec::MAX_CHUNKS;
use super::matvec_mma::quantized_bytes;
use super::span::Span;
use super::weights::{grid, int, ptr, ptr_mut, DeviceWeight};
use crate::sample::SamplerConfig;

/// head_dim` halves, K and V (slot `s` from position `s * capacity` on).
pub struct DeviceKv {
    /// Keys, position-major.
    pub k: DeviceBuffer<u16>,
    /// Values, position-major.
    pub v: DeviceBuffer<u16>,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Positions the cache holds per slot.
    pub capacity: usize,
    /// Sequence slots.
    pub slots: usize,
}

impl DeviceKv {
    /// A zero-filled cache of `slots` sequence slots.
    pub fn new(
        dev: &CudaDevice,
        stream: &Arc<CudaStream>,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        slots: usize,
    ) -> Result<DeviceKv> {
        let n = n_kv_heads * head_dim * capacity * slots;
        Ok(DeviceKv {
            k: dev.alloc(stream, n)?,
            v: dev.alloc(stream, n)?,
            n_kv_heads,
            head_dim,
            capacity,
            slots,
        })
    }
}

pub use crate::rope::RopeStyle;

/// Largest head dimension attention supports (the widest of its kernels, attention_f16_256 in
/// kernels/attention.cu).
pub const MAX_HEAD_DIM: usize = 256;
/// Positions of a chunk of attention's canonical order (ATTN_CHUNK in kernels/attention.cu):
/// a row's positions are scored and summed per chunk, and the chunks merge in chunk order.
pub const ATTN_CHUNK: usize = 256;
/// Most rows a step's attention splits across blocks per chunk (flash-decoding); steps of more
/// rows fill the device with a block per row and head tile, walking the chunks (the same
/// bits). ATTN_SPLIT_ROWS in kernels/attention.cu.
pub const ATTN_SPLIT_ROWS: usize = 16;
/// Query heads of one KV head an attention block takes at most: the 16 rows of a tensor-core
/// tile (ATTN_TILE_HEADS in kernels/attention.cu).
const ATTN_TILE_HEADS: usize = 16;
/// Warps of an attention block, each a slice of a chunk (ATTN_WARPS in kernels/attention.cu).
const ATTN_WARPS: usize = 8;
/// Attention's kernels by head width: the width, the walk and the split (attention_f16_D and
/// attention_split_f16_D in kernels/attention.cu); a head takes the narrowest that holds it.
const ATTN_KERNELS: [(usize, &str, &str); 4] = [
    (32, "attention_f16_32", "attention_split_f16_32"),
    (64, "attention_f16_64", "attention_split_f16_64"),
    (128, "attention_f16_128", "attention_split_f16_128"),
    (256, "attention_f16_256", "attention_split_f16_256"),
];

/// Values of the scratch the split attention of `rows` rows (at most `ATTN_SPLIT_ROWS`) of
/// `n_heads` heads over a cache of `capacity` positions needs: an arrival counter per row and
/// head for `ATTN_SPLIT_ROWS` rows (zero between launches: the scratch is allocated zeroed and
/// each launch's merging blocks set theirs back), then per row, head and chunk the chunk's
/// partial output, max and sum.
pub fn attention_parts_len(rows: usize, n_heads: usize, head_dim: usize, capacity: usize) -> usize {
    n_heads * (ATTN_SPLIT_ROWS + rows * capacity.div_ceil(ATTN_CHUNK) * (head_dim + 2))
}

/// How an attention launch lays out its blocks (both give the same bits): each row's chunks
/// split across blocks and merged after, or walked by one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionForm {
    Walk,
    Split,
}

/// The sequence slot of a pad row of a batched step (`super::buckets`), which no sequence
/// has: `attention` and `kv_store_rows` write no cache for it and give it a zero output
/// (PAD_SLOT in kernels/common.cuh).
pub const PAD_SLOT: u32 = u32::MAX;
/// The most candidates the device sampler keeps (`SAMPLE_MAX_K` in kernels/sample.cu).
pub const MAX_TOP_K: usize = 256;

impl CudaDevice {
    /// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for each of `rows` rows of `n`.
    pub fn rms_norm(
        &self,
        stream: &CudaStream,
        x: &impl DevicePtr<f32>,
        weight: &impl DevicePtr<f32>,
        eps: f32,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        self.rms_norm_narrowing(stream, x, weight, eps, out, None)
    }

    /// [`Self::rms_norm`], with `out16` also receiving `out` narrowed to f16 (the bits of
    /// [`Self::to_f16`] of `out`): the input of a prefill step's products, in the same launch.
    pub fn rms_norm_narrowing(
        &self,
        stream: &CudaStream,
        x: &impl DevicePtr<f32>,
        weight: &impl DevicePtr<f32>,
        eps: f32,
        out: &mut impl DevicePtrMut<f32>,
        out16: Option<&Span<u16>>,
    ) -> Result<()> {
        let n = weight.len();
        assert!(
            n > 0 && x.len().is_multiple_of(n) && out.len() == x.len(),
            "rms_norm: x and out must hold whole rows of the weight's length"
        );
        assert!(
            out16.is_none_or(|h| h.len() >= x.len()),
            "rms_norm: out16 is shorter than x"
        );
        let rows = x.len() / n;
        let (xp, wp, op, hp, n) = (
            ptr(stream, x),
            ptr(stream, weight),
            ptr_mut(stream, out),
            out16.map_or(0, Span::addr),
            int(n),
        );
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "rms_norm_f32", cfg, |a| {
            a.arg(&xp)
                .arg(&wp)
                .arg(&op)
                .arg(&hp)
                .arg(&n)
                .arg(&n)
                .arg(&eps);
        })
    }

    /// [`Self::rms_norm`] of the first `weight.len()` values of each of `rows` rows that
    /// start `stride` values apart in `x` and in `out` (the rest of each row untouched).
    pub fn rms_norm_strided(
        &self,
        stream: &CudaStream,
        x: &Span<f32>,
        weight: &impl DevicePtr<f32>,
        eps: f32,
        out: &Span<f32>,
        (rows, stride): (usize, usize),
    ) -> Result<()> {
        let n = weight.len();
        assert!(
            n > 0
                && rows > 0
                && stride >= n
                && x.len() >= (rows - 1) * stride + n
                && out.len() >= (rows - 1) * stride + n,
            "rms_norm_strided: {rows} rows of {n} values {stride} apart"
        );
        let (xp, wp, op, n, st) = (
            x.addr(),
            ptr(stream, weight),
            out.addr(),
            int(n),
            int(stride),
        );
        let no_out16 = 0u64;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "rms_norm_f32", cfg, |a| {
            a.arg(&xp)
                .arg(&wp)
                .arg(&op)
                .arg(&no_out16)
                .arg(&n)
                .arg(&st)
                .arg(&eps);
        })
    }

    /// [`Self::rms_norm`] in place over two sets of rows in one launch: `a` by the weight
    /// `wa`, `b` by `wb` (of equal length: the row length of both).
    pub fn rms_norm_pair(
        &self,
        stream: &CudaStream,
        (a, wa): (&Span<f32>, &impl DevicePtr<f32>),
        (b, wb): (&Span<f32>, &impl DevicePtr<f32>),
        eps: f32,
    ) -> Result<()> {
        let n = wa.len();
        assert!(
            n > 0 && wb.len() == n && a.len().is_multiple_of(n) && b.len().is_multiple_of(n),
            "rms_norm_pair: both sets must hold whole rows of the weights' common length"
        );
        let split = int(a.len() / n);
        let (ap, wap, bp, wbp) = (a.addr(), ptr(stream, wa), b.addr(), ptr(stream, wb));
        let (n, rows) = (int(n), a.len() / n + b.len() / wb.len());
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "rms_norm_pair_f32", cfg, |l| {
            l.arg(&ap).arg(&wap).arg(&ap).arg(&split);
            l.arg(&bp).arg(&wbp).arg(&bp).arg(&n).arg(&eps);
        })
    }

    /// Attention of the query heads in `q` (heads of `kv.head_dim`) over positions `0..=pos[0]`
    /// of `kv` (with several token rows in k, v, q and out: row `r` over `0..=pos[0] + r`, its
    /// earlier rows already in the cache by `kv_store_rows`), scale `1 / sqrt(head_dim)`, into
    /// `out`, with the rotary embedding and the cache write in the same launch: q and k are
    /// rotated to position `pos[0]` (q in place; k is left as it is), and the rotated k and v
    /// are stored as f16 at that position of `kv` (nothing is stored at a position past the
    /// capacity). With `slots` (a batched decode step), row `r` sits at position `pos[r]` of
    /// sequence slot `slots[r]` instead, each over its own slot; a row of slot `PAD_SLOT`
    /// touches no cache and its output is zeros. Steps of up to `ATTN_SPLIT_ROWS` rows whose
    /// cache holds several chunks split each row's chunks across blocks, the last of them to
    /// finish merging them, where `parts` holds `attention_parts_len` values; otherwise a block
    /// walks a row's chunks. `form` picks the layout instead (`None`: the launch picks); every
    /// form gives the same bits, which the self-test checks. With `quantized`, each row of
    /// `out` is also left there as `quantize_rows` would make its 8-bit copy, bit for bit
    /// (head_dim a multiple of 32).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        stream: &CudaStream,
        q: &mut impl DevicePtrMut<f32>,
        k: &impl DevicePtr<f32>,
        v: &impl DevicePtr<f32>,
        kv: &mut DeviceKv,
        pos: &impl DevicePtr<u32>,
        slots: Option<&Span<u32>>,
        rope: (f32, RopeStyle),
        parts: &Span<f32>,
        out: &mut impl DevicePtrMut<f32>,
        quantized: Option<&Span<u8>>,
        form: Option<AttentionForm>,
    ) -> Result<()> {
        let (hd, row) = (kv.head_dim, kv.n_kv_heads * kv.head_dim);
        assert!(
            hd <= MAX_HEAD_DIM && hd.is_multiple_of(4),
            "attention: head_dim {hd} is not a multiple of 4 up to {MAX_HEAD_DIM}"
        );
        let rows = k.len() / row;
        assert!(
            rows > 0 && k.len() == rows * row && v.len() == k.len(),
            "attention: k and v must hold whole rows of {row} values"
        );
        let n_heads = q.len() / (rows * hd);
        assert!(
            q.len() == rows * n_heads * hd && out.len() == q.len() && !pos.is_empty(),
            "attention: q and out must hold whole heads of {hd} per row; pos must hold a position"
        );
        assert!(
            n_heads.is_multiple_of(kv.n_kv_heads),
            "attention: {n_heads} heads do not group over {} kv heads",
            kv.n_kv_heads
        );
        assert!(
            slots.is_none_or(|sl| sl.len() >= rows && pos.len() >= rows),
            "attention: slots and pos must name every row's slot and position"
        );
        let scale = 1.0 / (hd as f32).sqrt();
        let (theta, style) = rope;
        // computed on the host exactly as the CPU backend does, so the angles match bit for bit
        let theta_scale = theta.powf(-2.0 / hd as f32);
        let neox = i32::from(style == RopeStyle::Neox);
        let (qp, kp, vp, pp) = (
            ptr_mut(stream, q),
            ptr(stream, k),
            ptr(stream, v),
            ptr(stream, pos),
        );
        let (kc, vc) = (ptr_mut(stream, &mut kv.k), ptr_mut(stream, &mut kv.v));
        let slp = slots.map_or(0, Span::addr);
        let op = ptr_mut(stream, out);
        assert!(
            quantized.is_none_or(|xq| hd.is_multiple_of(32)
                && xq.len() >= quantized_bytes(rows, n_heads * hd)),
            "attention: an 8-bit copy of the output needs heads of whole 32-value blocks and room for its rows"
        );
        let xqp = quantized.map_or(0, Span::addr);
        let chunks = kv.capacity.div_ceil(ATTN_CHUNK);
        let room = parts.len() >= attention_parts_len(rows, n_heads, hd, kv.capacity);
        let split = match form {
            Some(form) => form == AttentionForm::Split,
            None => chunks > 1 && rows <= ATTN_SPLIT_ROWS && room,
        };
        assert!(
            !split || (room && rows <= ATTN_SPLIT_ROWS),
            "attention: a split needs attention_parts_len values of parts and at most \
             {ATTN_SPLIT_ROWS} rows"
        );
        let pap = parts.addr();
        let group = n_heads / kv.n_kv_heads;
        let (tiles, heads) = (group.div_ceil(ATTN_TILE_HEADS), group.min(ATTN_TILE_HEADS));
        let (width, walk, split_name) = ATTN_KERNELS
            .into_iter()
            .find(|&(w, _, _)| w >= hd)
            .expect("invariant: head_dim is checked against MAX_HEAD_DIM above");
        let name = if split { split_name } else { walk };
        // each warp slice's weighted values of the block's heads
        let smem = ATTN_WARPS * heads * hd * 4;
        // the kernel's static shared memory: its q heads, the current k and v, the slices'
        // maxima and sums (AttnSmem), and the split's flag
        let static_bytes =
            (ATTN_TILE_HEADS + 2) * width * 2 + 2 * ATTN_WARPS * ATTN_TILE_HEADS * 4 + 16;
        if static_bytes + smem > PLAIN_DYNAMIC_SHARED {
            self.allow_dynamic_shared(name, static_bytes, smem)?;
        }
        let (nh, nkv, hd, cap) = (int(n_heads), int(kv.n_kv_heads), int(hd), int(kv.capacity));
        let z = if split { chunks } else { 1 };
        let cfg = LaunchConfig {
            grid_dim: ((kv.n_kv_heads * tiles) as u32, rows as u32, z as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch(stream, name, cfg, |a| {
            for p in [&qp, &kp, &vp, &kc, &vc, &op, &xqp, &pap, &pp, &slp] {
                a.arg(p);
            }
            a.arg(&nh).arg(&nkv).arg(&hd).arg(&cap);
            a.arg(&scale).arg(&theta_scale).arg(&neox);
        })
    }

    /// `out = a + b`.
    pub fn add(
        &self,
        stream: &CudaStream,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        self.binary(stream, "add_f32", a, b, out)
    }

    fn binary(
        &self,
        stream: &CudaStream,
        name: &str,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        assert!(
            a.len() == b.len() && a.len() == out.len(),
            "{name}: lengths differ"
        );
        let (ap, bp, op, n) = (
            ptr(stream, a),
            ptr(stream, b),
            ptr_mut(stream, out),
            int(a.len()),
        );
        self.launch(stream, name, grid(a.len(), 256), |l| {
            l.arg(&ap).arg(&bp).arg(&op).arg(&n);
        })
    }

    /// Dequantizes row `token[r]` of the embedding table into row `r` of `out` (NaNs if out of
    /// range), for each row of `out`.
    pub fn embed(
        &self,
        stream: &CudaStream,
        table: &DeviceWeight,
        token: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let tokens = out.len() / table.cols;
        assert!(
            tokens > 0 && out.len() == tokens * table.cols && token.len() >= tokens,
            "embed: out has {} values for {} columns and {} tokens",
            out.len(),
            table.cols,
            token.len()
        );
        let name = format!("embed_{}", table.dtype.name());
        let (tp, kp, op) = (
            ptr(stream, &table.data),
            ptr(stream, token),
            ptr_mut(stream, out),
        );
        let (cols, rows) = (int(table.cols), int(table.rows));
        let mut cfg = grid(table.cols, 256);
        cfg.grid_dim.1 = tokens as u32;
        self.launch(stream, &name, cfg, |a| {
            a.arg(&tp).arg(&kp).arg(&op).arg(&cols).arg(&rows);
        })
    }

    /// Greedy sampling: the index of the largest value of `x` (first on ties) into `token[0]`.
    pub fn argmax(
        &self,
        stream: &CudaStream,
        x: &impl DevicePtr<f32>,
        token: &mut impl DevicePtrMut<u32>,
    ) -> Result<()> {
        assert!(!token.is_empty(), "argmax: empty token buffer");
        let (xp, tp) = (ptr(stream, x), ptr_mut(stream, token));
        self.argmax_launch(stream, xp, x.len(), tp, 1, false)
    }

    /// `out[r]` = the argmax of row r of `x` (rows of `x.len() / out.len()` values), as
    /// `argmax` picks it, or `sample::NOT_FINITE` where the row holds a NaN or an infinity,
    /// for every row at once (a greedy batch's readback, `sample::greedy` on the host).
    pub fn argmax_rows(&self, stream: &CudaStream, x: &Span<f32>, out: &Span<u32>) -> Result<()> {
        let rows = out.len();
        assert!(
            rows > 0 && x.len().is_multiple_of(rows),
            "argmax_rows: {} values are not {rows} rows",
            x.len()
        );
        self.argmax_launch(stream, x.addr(), x.len() / rows, out.addr(), rows, true)
    }

    /// `argmax_f32` over `rows` rows of `n` values at `x`, a block per row, into `token`;
    /// with `flag`, `sample::NOT_FINITE` for a row holding a NaN or an infinity.
    fn argmax_launch(
        &self,
        stream: &CudaStream,
        x: u64,
        n: usize,
        token: u64,
        rows: usize,
        flag: bool,
    ) -> Result<()> {
        let (n, rows, flag) = (int(n), rows as u32, i32::from(flag));
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "argmax_f32", cfg, |a| {
            a.arg(&x).arg(&n).arg(&token).arg(&flag);
        })
    }

    /// How many of the 32-bit patterns `lo .. lo + count`, as floats, get other bits from
    /// `rcp_rn` (kernels/common.cuh) than from `__frcp_rn` (kernels/check.cu; the self-test's).
    pub fn rcp_rn_mismatches(&self, stream: &Arc<CudaStream>, lo: u32, count: u32) -> Result<u64> {
        let mut out = self.alloc::<u64>(stream, 1)?;
        let op = ptr_mut(stream, &mut out);
        let cfg = LaunchConfig {
            grid_dim: (4 * self.sm_count() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "rcp_rn_mismatches", cfg, |a| {
            a.arg(&lo).arg(&count).arg(&op);
        })?;
        Ok(self.download(stream, &out)?[0])
    }

    /// Temperature sampling with top-k and top-p (`config` not greedy, `top_k` in
    /// 1..=`MAX_TOP_K`) into `token[0]`, the same token as `crate::sample::Sampler` for the same
    /// logits, seed and draw number; `step[0]` holds the draw number and the kernel advances it.
    pub fn sample(
        &self,
        stream: &CudaStream,
        x: &impl DevicePtr<f32>,
        config: &SamplerConfig,
        step: &mut impl DevicePtrMut<u64>,
        token: &mut impl DevicePtrMut<u32>,
    ) -> Result<()> {
        assert!(
            !token.is_empty() && !step.is_empty(),
            "sample: empty buffer"
        );
        assert!(!x.is_empty(), "sample: no logits");
        assert!(
            (1..=MAX_TOP_K).contains(&config.top_k),
            "sample: top-k {} outside 1..={MAX_TOP_K}",
            config.top_k
        );
        let (xp, sp, tp) = (
            ptr(stream, x),
            ptr_mut(stream, step),
            ptr_mut(stream, token),
        );
        let (n, k) = (int(x.len()), int(config.top_k));
        let (temp, top_p, seed) = (config.temperature, config.top_p, config.seed);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "sample_f32", cfg, |a| {
            a.arg(&xp).arg(&n).arg(&k).arg(&temp).arg(&top_p).arg(&seed);
            a.arg(&sp).arg(&tp);
        })
    }

    /// Tensor-parallel combine: `out[i]` = balanced-tree sum over the `d` partials
    /// `parts[k * n + i]` (d a power of two up to `MAX_CHUNKS`, n = `out.len()`).
    pub fn tree_sum(
        &self,
        stream: &CudaStream,
        parts: &impl DevicePtr<f32>,
        d: usize,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let n = out.len();
        assert!(
            d.is_power_of_two() && d <= MAX_CHUNKS,
            "tree_sum: d must be a power of two up to {MAX_CHUNKS}, got {d}"
        );
        assert_eq!(parts.len(), d * n, "tree_sum: parts must hold d * n values");
        let (pp, op, di, ni) = (ptr(stream, parts), ptr_mut(stream, out), int(d), int(n));
        self.launch(stream, "tree_sum_f32", grid(n, 256), |a| {
            a.arg(&pp).arg(&di).arg(&ni).arg(&op);
        })
    }
}
