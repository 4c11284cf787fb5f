//! The host weights of the layer parts whose shards both engines read the same way: mHC's
//! mixing parameters (glm5-next's residual streams), the DSA indexer and KDA's projections,
//! convolutions and gates. Each is taken out of a rank's shards by name and checked for the
//! shapes the kernels need, so a bad file fails at load naming the tensor; the CPU reference
//! computes with them and the CUDA backend uploads them.

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::Plan;
use memra_gguf::GgmlType;

use crate::weights::{Matrix, RankWeights};

/// mHC streams (llama.cpp supports 4 only).
pub const STREAMS: usize = 4;

/// Mixes per token: pre and post weights, then the combination.
pub const MIXES: usize = (2 + STREAMS) * STREAMS;

/// One sublayer's mHC parameters: the mixes' projection of the normed streams and its
/// affine map.
pub(crate) struct HcWeights {
    pub mixes: Matrix,
    pub scale: Vec<f32>,
    pub base: Vec<f32>,
}

/// The DSA indexer (whole on every rank): its query from the q-LoRA activations, its key
/// (layer-normed) and pool gate from the normed input, the per-head weights and the pools'
/// position terms (`kpool` rows of the head width).
pub(crate) struct IndexerWeights {
    pub q_b: Matrix,
    pub k: Matrix,
    pub k_norm: (Vec<f32>, Vec<f32>),
    pub gate: Matrix,
    pub ape: Vec<f32>,
    pub proj: Matrix,
}

/// Kimi delta attention over this rank's heads: q/k/v projections and their depthwise
/// convolutions (`taps` f32 weights per channel), the low-rank decay gate (`f_a` whole, `f_b`
/// rows of the held channels) with `dt_bias` and the per-head `a`, beta per head, the
/// low-rank output gate, the per-head output norm and the output projection's columns.
pub(crate) struct KdaWeights {
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub conv: [Vec<f32>; 3],
    pub taps: usize,
    pub f_a: Matrix,
    pub f_b: Matrix,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub beta: Matrix,
    pub g_a: Matrix,
    pub g_b: Matrix,
    pub o_norm: Vec<f32>,
    pub o: Matrix,
    /// The bounded decay's lower bound (glm5-next), else softplus decay.
    pub bound: Option<f32>,
    /// The q/k L2 norms' epsilon when not the RMS epsilon.
    pub l2_eps: Option<f32>,
}

impl KdaWeights {
    /// Heads held.
    pub fn heads(&self) -> usize {
        self.a.len()
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.o_norm.len()
    }

    /// Takes layer `l`'s KDA shards (`attn_output` included) out of `w`, checked to agree on
    /// the held heads; the CUDA backend uploads what this loads.
    pub(crate) fn take(plan: &Plan, l: u32, w: &mut RankWeights) -> Result<KdaWeights> {
        let facts = plan.model.kda.as_ref();
        let name = |s: &str| format!("blk.{l}.{s}");
        let mut conv = |p: &str| w.take_f32_rows(&name(&format!("ssm_conv1d_{p}.weight")));
        let (cq, taps) = conv("q")?;
        let (ck, _) = conv("k")?;
        let (cv, _) = conv("v")?;
        let k = KdaWeights {
            q: w.take_matrix(&name("attn_q.weight"))?,
            k: w.take_matrix(&name("attn_k.weight"))?,
            v: w.take_matrix(&name("attn_v.weight"))?,
            conv: [cq, ck, cv],
            taps,
            f_a: w.take_matrix(&name("ssm_f_a.weight"))?,
            f_b: w.take_matrix(&name("ssm_f_b.weight"))?,
            dt_bias: w.take_vector(&name("ssm_dt.bias"))?,
            a: w.take_vector(&name("ssm_a"))?,
            beta: w.take_matrix(&name("ssm_beta.weight"))?,
            g_a: w.take_matrix(&name("ssm_g_a.weight"))?,
            g_b: w.take_matrix(&name("ssm_g_b.weight"))?,
            o_norm: w.take_vector(&name("ssm_norm.weight"))?,
            o: w.take_matrix(&name("attn_output.weight"))?,
            bound: facts.and_then(|f| f.gate_lower_bound).map(|b| b as f32),
            l2_eps: facts.and_then(|f| f.l2_eps).map(|e| e as f32),
        };
        k.check(l)?;
        Ok(k)
    }

    /// The held heads agree across every tensor (one error naming the first that does not).
    fn check(&self, l: u32) -> Result<()> {
        let (h, hd) = (self.heads(), self.head_dim());
        let width = h * hd;
        let rows = [
            ("attn_q.weight", self.q.rows, width),
            ("attn_k.weight", self.k.rows, width),
            ("attn_v.weight", self.v.rows, width),
            ("ssm_conv1d_q.weight", self.conv[0].len(), width * self.taps),
            ("ssm_conv1d_k.weight", self.conv[1].len(), width * self.taps),
            ("ssm_conv1d_v.weight", self.conv[2].len(), width * self.taps),
            ("ssm_f_a.weight", self.f_a.rows, hd),
            ("ssm_f_b.weight", self.f_b.rows, width),
            ("ssm_f_b.weight columns", self.f_b.cols, hd),
            ("ssm_dt.bias", self.dt_bias.len(), width),
            ("ssm_beta.weight", self.beta.rows, h),
            ("ssm_g_a.weight", self.g_a.rows, hd),
            ("ssm_g_b.weight", self.g_b.rows, width),
            ("ssm_g_b.weight columns", self.g_b.cols, hd),
            ("attn_output.weight columns", self.o.cols, width),
        ];
        if self.taps < 2 {
            bail!(
                "layer {l}: blk.{l}.ssm_conv1d_q.weight has {} taps; at least 2 are needed",
                self.taps
            );
        }
        for (what, got, want) in rows {
            if got != want {
                bail!("layer {l}: blk.{l}.{what} is {got} long, expected {want} for {h} held heads of {hd} (from ssm_a and ssm_norm)");
            }
        }
        Ok(())
    }
}

impl HcWeights {
    /// `blk.{l}.hc_{which}_{fn,scale,base}`, checked against the 24 mixes of 4 streams.
    pub(crate) fn take(l: u32, which: &str, w: &mut RankWeights) -> Result<HcWeights> {
        let name = |s: &str| format!("blk.{l}.hc_{which}_{s}.weight");
        let h = HcWeights {
            mixes: w.take_matrix(&name("fn"))?,
            scale: w.take_vector(&name("scale"))?,
            base: w.take_vector(&name("base"))?,
        };
        if h.mixes.rows != MIXES || h.base.len() != MIXES || h.scale.len() != 3 {
            bail!(
                "layer {l}: {} has {} rows, {} {} values and {} {}; mHC of {STREAMS} streams needs {MIXES}, {MIXES} and 3",
                name("fn"),
                h.mixes.rows,
                name("base"),
                h.base.len(),
                name("scale"),
                h.scale.len()
            );
        }
        Ok(h)
    }
}

impl IndexerWeights {
    /// Layer `l`'s indexer, checked against the plan's `model.dsa`.
    pub(crate) fn take(plan: &Plan, l: u32, w: &mut RankWeights) -> Result<IndexerWeights> {
        let dsa = plan
            .model
            .dsa
            .as_ref()
            .ok_or_else(|| anyhow!("layer {l} is a DSA layer but the plan has no model.dsa"))?;
        let name = |s: &str| format!("blk.{l}.{s}");
        let x = IndexerWeights {
            q_b: w.take_matrix(&name("indexer.attn_q_b.weight"))?,
            k: w.take_matrix(&name("indexer.attn_k.weight"))?,
            k_norm: (
                w.take_vector(&name("indexer.k_norm.weight"))?,
                w.take_vector(&name("indexer.k_norm.bias"))?,
            ),
            gate: w.take_matrix(&name("indexer_compressor_gate.weight"))?,
            ape: f32_values(
                w.take_matrix(&name("indexer_compressor_ape.weight"))?,
                &name("indexer_compressor_ape.weight"),
            )?,
            proj: w.take_matrix(&name("indexer.proj.weight"))?,
        };
        let (ih, id, kp) = (
            dsa.heads as usize,
            dsa.head_dim as usize,
            dsa.kpool as usize,
        );
        let sizes = [
            ("indexer.attn_q_b.weight rows", x.q_b.rows, ih * id),
            ("indexer.attn_k.weight rows", x.k.rows, id),
            ("indexer.k_norm.weight", x.k_norm.0.len(), id),
            ("indexer.k_norm.bias", x.k_norm.1.len(), id),
            ("indexer_compressor_gate.weight rows", x.gate.rows, id),
            ("indexer_compressor_ape.weight", x.ape.len(), kp * id),
            ("indexer.proj.weight rows", x.proj.rows, ih),
        ];
        for (what, got, want) in sizes {
            if got != want {
                bail!("layer {l}: blk.{l}.{what} is {got}, expected {want} for {ih} indexer heads of {id} and pools of {kp}");
            }
        }
        Ok(x)
    }
}

/// The values of an f32 matrix `t`.
fn f32_values(m: Matrix, t: &str) -> Result<Vec<f32>> {
    if m.dtype != GgmlType::F32 {
        bail!("tensor `{t}` is stored as {}; f32 is expected", m.dtype);
    }
    Ok(m.data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
