//! One layer's weights on a CPU rank, by the layer schema (`ModelSummary::layer_kind`): a
//! mixer (GQA: q/k/v with optional biases and q/k norms; MLA: the query path, the latent and
//! rope-key projection, the per-head k/v up-projections, and for DSA the indexer; KDA: q/k/v
//! with their convolutions, the decay and output gates, beta and the output norm), an FFN
//! (dense, or a router with stacked experts and optional shared experts) and, with mHC
//! streams, each sublayer's mixing parameters; each taken out of the rank's shards by name
//! and checked for the shapes the kernels need, so a bad file fails at load naming the tensor.
//! The parts the CUDA backend reads too (the indexer, KDA, mHC) are in `crate::layer_weights`.

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{ClampedFfn, FfnKind, Mixer, Plan};

use super::kernels::Weight;
use crate::layer_weights::{HcWeights, IndexerWeights, KdaWeights};
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
