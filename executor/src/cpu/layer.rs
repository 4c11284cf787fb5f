//! One layer's weights on a CPU rank, by the layer schema (`ModelSummary::layer_kind`): a
//! mixer (GQA: q/k/v with optional biases and q/k norms; MLA: the query path, the latent and
//! rope-key projection, the per-head k/v up-projections, and for DSA the indexer; KDA: q/k/v
//! with their convolutions, the decay and output gates, beta and the output norm), an FFN
//! (dense, or a router with stacked experts and optional shared experts) and, with mHC
//! streams, each sublayer's mixing parameters; each taken out of the rank's shards by name
//! and checked for the shapes the kernels need, so a bad file fails at load naming the tensor.

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{ClampedFfn, FfnKind, Mixer, Plan};
use memra_gguf::GgmlType;

use super::kernels::{Weight, MIXES, STREAMS};
use crate::weights::{Matrix, RankWeights, Stack};

/// One layer's weights on this rank.
pub(super) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub mixer: MixerWeights,
    pub ffn_norm: Vec<f32>,
    pub ffn: FfnWeights,
    /// mHC's mixing before the mixer and before the FFN.
    pub hc: Option<[HcWeights; 2]>,
}

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

/// The token mixer's weights.
pub(super) enum MixerWeights {
    Gqa(GqaWeights),
    Mla(MlaWeights),
    Kda(Box<KdaWeights>),
}

impl MixerWeights {
    /// The output projection.
    pub fn o(&self) -> &Matrix {
        match self {
            MixerWeights::Gqa(g) => &g.o,
            MixerWeights::Mla(m) => &m.o,
            MixerWeights::Kda(k) => &k.o,
        }
    }
}

/// Grouped-query attention.
pub(super) struct GqaWeights {
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub biases: Option<[Vec<f32>; 3]>,
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub o: Matrix,
}

/// How an MLA layer makes its query.
pub(super) enum QueryPath {
    /// `attn_q` (no q-LoRA, DeepSeek-V2-Lite).
    Direct(Matrix),
    /// `attn_q_b . norm(attn_q_a . x)`.
    LowRank {
        a: Matrix,
        norm: Vec<f32>,
        b: Matrix,
    },
}

/// Multi-head latent attention: this rank's heads of `q`, `k_b`, `v_b` and `o`, and the whole
/// (replicated) latent projection.
pub(super) struct MlaWeights {
    pub q: QueryPath,
    pub kv_a: Matrix,
    pub kv_a_norm: Vec<f32>,
    pub k_b: Stack,
    pub v_b: Stack,
    pub o: Matrix,
    /// Whether the rope parts are rotated (not for kimi-linear and glm5-next).
    pub rope: bool,
    /// DSA: the indexer whose selection the softmax runs over (a full DSA layer's own).
    pub indexer: Option<Box<IndexerWeights>>,
    /// Whether the softmax runs over a DSA selection: the layer's own indexer's, or (a
    /// shared-indexer layer) the closest full DSA layer's before it.
    pub sparse: bool,
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

/// A gated SiLU FFN (a dense layer, or the shared experts).
pub(super) struct Gated {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    /// The SwiGLU clamp limit (glm5-next).
    pub clamp: Option<f32>,
}

/// Routed experts: the router (whole on every rank) and this rank's experts.
pub(super) struct MoeWeights {
    pub router: Matrix,
    pub bias: Option<Vec<f32>>,
    pub gate: Stack,
    pub up: Stack,
    pub down: Stack,
    pub shared: Option<Gated>,
    /// The routed experts' SwiGLU clamp limit (glm5-next).
    pub clamp: Option<f32>,
}

/// The FFN's weights.
pub(super) enum FfnWeights {
    Dense(Gated),
    Moe(Box<MoeWeights>),
}

impl LayerWeights {
    /// Takes layer `l`'s shards out of `w`, as the plan's layer schema says it is made.
    pub fn take(plan: &Plan, l: u32, w: &mut RankWeights) -> Result<LayerWeights> {
        let m = &plan.model;
        let name = |s: &str| format!("blk.{l}.{s}");
        let kind = m.layer_kind(l);
        let mixer = match kind.mixer {
            Mixer::Gqa => {
                let mut three = |kind: &str| -> Result<[Vec<f32>; 3]> {
                    Ok([
                        w.take_vector(&name(&format!("attn_q.{kind}")))?,
                        w.take_vector(&name(&format!("attn_k.{kind}")))?,
                        w.take_vector(&name(&format!("attn_v.{kind}")))?,
                    ])
                };
                let biases = if m.qkv_bias {
                    Some(three("bias")?)
                } else {
                    None
                };
                MixerWeights::Gqa(GqaWeights {
                    q: w.take_matrix(&name("attn_q.weight"))?,
                    k: w.take_matrix(&name("attn_k.weight"))?,
                    v: w.take_matrix(&name("attn_v.weight"))?,
                    biases,
                    qk_norm: if m.qk_norm {
                        Some([
                            w.take_vector(&name("attn_q_norm.weight"))?,
                            w.take_vector(&name("attn_k_norm.weight"))?,
                        ])
                    } else {
                        None
                    },
                    o: w.take_matrix(&name("attn_output.weight"))?,
                })
            }
            Mixer::Mla | Mixer::Dsa | Mixer::DsaShared => {
                let mla = m.mla.as_ref().ok_or_else(|| {
                    anyhow!("layer {l} is an MLA layer but the plan has no model.mla")
                })?;
                let q = if mla.q_lora_rank > 0 {
                    QueryPath::LowRank {
                        a: w.take_matrix(&name("attn_q_a.weight"))?,
                        norm: w.take_vector(&name("attn_q_a_norm.weight"))?,
                        b: w.take_matrix(&name("attn_q_b.weight"))?,
                    }
                } else {
                    QueryPath::Direct(w.take_matrix(&name("attn_q.weight"))?)
                };
                MixerWeights::Mla(MlaWeights {
                    q,
                    kv_a: w.take_matrix(&name("attn_kv_a_mqa.weight"))?,
                    kv_a_norm: w.take_vector(&name("attn_kv_a_norm.weight"))?,
                    k_b: w.take_stack(&name("attn_k_b.weight"))?,
                    v_b: w.take_stack(&name("attn_v_b.weight"))?,
                    o: w.take_matrix(&name("attn_output.weight"))?,
                    rope: mla.rope,
                    indexer: match kind.mixer {
                        Mixer::Dsa => Some(Box::new(IndexerWeights::take(plan, l, w)?)),
                        _ => None,
                    },
                    sparse: kind.mixer.is_sparse(),
                })
            }
            Mixer::Kda => MixerWeights::Kda(Box::new(KdaWeights::take(plan, l, w)?)),
        };
        let limit = |which| m.moe.as_ref().and_then(|moe| moe.swiglu_limit(which));
        let (clamp_experts, clamp_shared) = (limit(ClampedFfn::Experts), limit(ClampedFfn::Shared));
        let mut gated = |suffix: &str| -> Result<Gated> {
            Ok(Gated {
                gate: w.take_matrix(&name(&format!("ffn_gate{suffix}.weight")))?,
                up: w.take_matrix(&name(&format!("ffn_up{suffix}.weight")))?,
                down: w.take_matrix(&name(&format!("ffn_down{suffix}.weight")))?,
                clamp: clamp_shared,
            })
        };
        let ffn = match kind.ffn {
            FfnKind::Dense => FfnWeights::Dense(gated("")?),
            FfnKind::Moe { shared } => {
                let shared = if shared { Some(gated("_shexp")?) } else { None };
                let probs_bias = m.moe.as_ref().is_some_and(|moe| moe.probs_bias);
                FfnWeights::Moe(Box::new(MoeWeights {
                    router: w.take_matrix(&name("ffn_gate_inp.weight"))?,
                    bias: if probs_bias {
                        Some(w.take_vector(&name("exp_probs_b.bias"))?)
                    } else {
                        None
                    },
                    gate: w.take_stack(&name("ffn_gate_exps.weight"))?,
                    up: w.take_stack(&name("ffn_up_exps.weight"))?,
                    down: w.take_stack(&name("ffn_down_exps.weight"))?,
                    shared,
                    clamp: clamp_experts,
                }))
            }
        };
        let hc = match &m.mhc {
            Some(_) => Some([
                HcWeights::take(l, "attn", w)?,
                HcWeights::take(l, "ffn", w)?,
            ]),
            None => None,
        };
        let lw = LayerWeights {
            attn_norm: w.take_vector(&name("attn_norm.weight"))?,
            mixer,
            ffn_norm: w.take_vector(&name("ffn_norm.weight"))?,
            ffn,
            hc,
        };
        lw.check(l)?;
        Ok(lw)
    }

    /// Every matrix is one the matvec takes; stacked experts chain (gate/up rows feed down).
    fn check(&self, l: u32) -> Result<()> {
        let mut matrices: Vec<&Matrix> = Vec::new();
        let mut stacks: Vec<&Stack> = Vec::new();
        match &self.mixer {
            MixerWeights::Gqa(g) => matrices.extend([&g.q, &g.k, &g.v, &g.o]),
            MixerWeights::Mla(m) => {
                match &m.q {
                    QueryPath::Direct(q) => matrices.push(q),
                    QueryPath::LowRank { a, b, .. } => matrices.extend([a, b]),
                }
                matrices.extend([&m.kv_a, &m.o]);
                stacks.extend([&m.k_b, &m.v_b]);
                if let Some(x) = &m.indexer {
                    matrices.extend([&x.q_b, &x.k, &x.gate, &x.proj]);
                }
            }
            MixerWeights::Kda(k) => matrices.extend([
                &k.q, &k.k, &k.v, &k.f_a, &k.f_b, &k.beta, &k.g_a, &k.g_b, &k.o,
            ]),
        }
        match &self.ffn {
            FfnWeights::Dense(g) => matrices.extend([&g.gate, &g.up, &g.down]),
            FfnWeights::Moe(e) => {
                matrices.push(&e.router);
                if let Some(g) = &e.shared {
                    matrices.extend([&g.gate, &g.up, &g.down]);
                }
                stacks.extend([&e.gate, &e.up, &e.down]);
                if e.gate.rows != e.up.rows || e.down.cols != e.gate.rows {
                    bail!("layer {l}: expert gate/up rows ({}, {}) do not feed the down projection's {} columns", e.gate.rows, e.up.rows, e.down.cols);
                }
            }
        }
        for h in self.hc.iter().flatten() {
            matrices.push(&h.mixes);
        }
        for mat in matrices {
            Weight::new(mat.dtype, &mat.data, mat.rows, mat.cols)
                .map_err(|e| anyhow!("layer {l}: {e}"))?;
        }
        for s in stacks {
            let first = s
                .matrix(s.first)
                .ok_or_else(|| anyhow!("layer {l}: an empty stack of matrices"))?;
            Weight::new(s.dtype, first, s.rows, s.cols).map_err(|e| anyhow!("layer {l}: {e}"))?;
        }
        Ok(())
    }
}
