//! A rank's compute state and its ops: embedding, the layer segments of llama-family blocks
//! (llama; qwen2 with q/k/v biases and NeoX rope; qwen3 with per-head q/k norms and NeoX
//! rope), the vocab-parallel head and sampling. Everything here belongs to one rank: its
//! weight shards, activations, KV cache of its layers, logits, token and received slots.
//!
//! Row-parallel products (attention output, FFN down) leave a partial sum in `partial`; on a
//! tensor-parallel rank the all-reduce adds the group's sum to the residual, on a single rank
//! the product adds it at once. Their K is reduced in the canonical chunk count divided by the
//! TP degree when the group is exact, so each rank computes one subtree of the 1-rank sum.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{reduction_chunks, Plan, Segment};

use super::kernels::{self, attention, rms_norm, rope, silu_mul, KvCache, KvDtype, Pool, Weight};
use super::wire::Payload;
use crate::geometry::RankGeometry;
use crate::sample::{Sampler, SamplerConfig};
use crate::weights::{Matrix, RankWeights};

/// One layer's weights on this rank.
struct LayerWeights {
    attn_norm: Vec<f32>,
    q: Matrix,
    k: Matrix,
    v: Matrix,
    biases: Option<[Vec<f32>; 3]>,
    qk_norm: Option<[Vec<f32>; 2]>,
    o: Matrix,
    ffn_norm: Vec<f32>,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
}

/// Where the head's vocab rows come from.
enum HeadRows {
    /// `output.weight` rows of this rank.
    Own(Matrix),
    /// Rows `start..end` of the tied `token_embd.weight`.
    Tied { start: usize, end: usize },
}

/// Activations of one rank.
#[derive(Default)]
struct Activations {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    partial: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    full_logits: Option<Vec<f32>>,
}

/// A rank's weights and state.
pub struct RankCompute {
    pool: Arc<Pool>,
    layers: Vec<LayerWeights>,
    kv: Vec<KvCache>,
    embed: Option<Matrix>,
    head: Option<(Vec<f32>, HeadRows)>,
    geo: RankGeometry,
    act: Activations,
    token: u32,
    sampler: Sampler,
    rx: BTreeMap<u32, Vec<Option<Payload>>>,
}

impl RankCompute {
    /// Builds rank `rank`'s state from its weight shards.
    pub fn new(
        plan: &Plan,
        rank: u32,
        mut w: RankWeights,
        pool: Arc<Pool>,
        sampler: SamplerConfig,
    ) -> Result<RankCompute> {
        let r = plan.rank(rank).expect("invariant: a rank of the plan");
        let m = &plan.model;
        let hd = m.head_dim as usize;
        let (qkv_bias, qk_norm) = (m.qkv_bias, m.qk_norm);
        let mut layers = Vec::new();
        for l in r.layers.start..r.layers.end {
            let name = |s: &str| format!("blk.{l}.{s}");
            let take3 = |w: &mut RankWeights, kind: &str| -> Result<[Vec<f32>; 3]> {
                Ok([
                    w.take_vector(&name(&format!("attn_q.{kind}")))?,
                    w.take_vector(&name(&format!("attn_k.{kind}")))?,
                    w.take_vector(&name(&format!("attn_v.{kind}")))?,
                ])
            };
            layers.push(LayerWeights {
                attn_norm: w.take_vector(&name("attn_norm.weight"))?,
                q: w.take_matrix(&name("attn_q.weight"))?,
                k: w.take_matrix(&name("attn_k.weight"))?,
                v: w.take_matrix(&name("attn_v.weight"))?,
                biases: if qkv_bias {
                    Some(take3(&mut w, "bias")?)
                } else {
                    None
                },
                qk_norm: if qk_norm {
                    Some([
                        w.take_vector(&name("attn_q_norm.weight"))?,
                        w.take_vector(&name("attn_k_norm.weight"))?,
                    ])
                } else {
                    None
                },
                o: w.take_matrix(&name("attn_output.weight"))?,
                ffn_norm: w.take_vector(&name("ffn_norm.weight"))?,
                gate: w.take_matrix(&name("ffn_gate.weight"))?,
                up: w.take_matrix(&name("ffn_up.weight"))?,
                down: w.take_matrix(&name("ffn_down.weight"))?,
            });
        }
        let needs_embd = r.embed || (r.head && m.tied_embeddings);
        let embed = if needs_embd {
            Some(w.take_matrix("token_embd.weight")?)
        } else {
            None
        };
        let head = if r.head {
            let norm = w.take_vector("output_norm.weight")?;
            let rows = if m.tied_embeddings {
                let per = (m.vocab / r.tp_degree) as usize;
                // a head-only rank of a tensor-parallel group holds just its vocab rows
                let held = embed.as_ref().map_or(0, |e| e.rows);
                let start = if held == per {
                    0
                } else {
                    r.tp_index as usize * per
                };
                HeadRows::Tied {
                    start,
                    end: start + per,
                }
            } else {
                HeadRows::Own(w.take_matrix("output.weight")?)
            };
            Some((norm, rows))
        } else {
            None
        };
        let left = w.remaining();
        if !left.is_empty() {
            bail!(
                "rank {rank} holds shards it never uses: {}",
                left.join(", ")
            );
        }
        let kv_dtype = match plan.runtime.kv_dtype.as_str() {
            "f32" => KvDtype::F32,
            "f16" => KvDtype::F16,
            "bf16" => KvDtype::BF16,
            other => bail!("runtime.kv_dtype `{other}` is not supported by the cpu backend; supported: f32, f16, bf16"),
        };
        let kv = layers
            .iter()
            .map(|lw| {
                KvCache::new(
                    kv_dtype,
                    lw.k.rows / hd,
                    hd,
                    plan.runtime.max_context as usize,
                )
            })
            .collect();
        let mut c = RankCompute {
            pool,
            layers,
            kv,
            embed,
            head,
            geo: RankGeometry::of(plan, rank),
            act: Activations::default(),
            token: 0,
            sampler: Sampler::new(sampler),
            rx: BTreeMap::new(),
        };
        c.size_buffers(m.embedding as usize)?;
        Ok(c)
    }

    fn size_buffers(&mut self, d: usize) -> Result<()> {
        for lw in &self.layers {
            for mat in [&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down] {
                Weight::new(mat.dtype, &mat.data, mat.rows, mat.cols)?;
            }
            if lw.q.rows % self.geo.head_dim != 0 || lw.k.rows % self.geo.head_dim != 0 {
                bail!(
                    "q/k shards are not whole heads of {} values",
                    self.geo.head_dim
                );
            }
        }
        let a = &mut self.act;
        a.x = vec![0.0; d];
        a.xn = vec![0.0; d];
        a.partial = vec![0.0; d];
        if let Some(lw) = self.layers.first() {
            a.q = vec![0.0; lw.q.rows];
            a.k = vec![0.0; lw.k.rows];
            a.v = vec![0.0; lw.v.rows];
            a.att = vec![0.0; lw.q.rows];
            a.gate = vec![0.0; lw.gate.rows];
            a.up = vec![0.0; lw.up.rows];
        }
        if let Some((_, rows)) = &self.head {
            let n = match rows {
                HeadRows::Own(m) => m.rows,
                HeadRows::Tied { start, end } => end - start,
            };
            a.logits = vec![0.0; n];
        }
        Ok(())
    }

    /// The token sampled last (or embedded, on a rank that does not sample).
    pub fn token(&self) -> u32 {
        self.token
    }

    /// The residual stream.
    pub fn hidden(&self) -> &[f32] {
        &self.act.x
    }

    /// The pending partial sum of the last row-parallel product.
    pub fn partial(&self) -> &[f32] {
        &self.act.partial
    }

    /// The logits: the gathered vocabulary on a group's first rank, else this rank's slice.
    pub fn logits(&self) -> &[f32] {
        self.act.full_logits.as_deref().unwrap_or(&self.act.logits)
    }

    /// Keeps a copied boundary slot in this rank's `rx` buffer.
    pub fn receive(&mut self, boundary: u32, slot: u32, payload: Option<Payload>) {
        let slots = self.rx.entry(boundary).or_default();
        if slots.len() <= slot as usize {
            slots.resize(slot as usize + 1, None);
        }
        slots[slot as usize] = payload;
    }

    fn received(&self, boundary: u32, slot: u32) -> Option<&Payload> {
        self.rx.get(&boundary)?.get(slot as usize)?.as_ref()
    }

    /// The token in `rx[slot]` of `boundary`.
    pub fn received_token(&self, boundary: u32, slot: u32) -> Result<u32> {
        match self.received(boundary, slot) {
            Some(Payload::Token(t)) => Ok(*t),
            _ => bail!("no token arrived on boundary {boundary} slot {slot}; the first step needs a prompt token"),
        }
    }

    /// Loads the residual stream from `rx[slot]` of `boundary`.
    pub fn load_hidden(&mut self, boundary: u32, slot: u32) -> Result<()> {
        match self
            .rx
            .get(&boundary)
            .and_then(|s| s.get(slot as usize))
            .and_then(Option::as_ref)
        {
            Some(Payload::Hidden(h)) if h.len() == self.act.x.len() => {
                self.act.x.copy_from_slice(h);
                Ok(())
            }
            _ => bail!(
                "no hidden state of {} values arrived on boundary {boundary} slot {slot}",
                self.act.x.len()
            ),
        }
    }

    /// Looks up the embedding of `token`.
    pub fn embed(&mut self, token: u32) -> Result<()> {
        let e = self
            .embed
            .as_ref()
            .ok_or_else(|| anyhow!("embed on a rank without token_embd"))?;
        if token as usize >= e.rows {
            bail!(
                "token {token} is outside the vocabulary of {} tokens",
                e.rows
            );
        }
        self.token = token;
        kernels::embed_row(&view(e), token as usize, &mut self.act.x);
        Ok(())
    }

    /// Runs one segment of layer `layer` at sequence position `pos`.
    pub fn segment(&mut self, layer: u32, segment: Segment, pos: u32) -> Result<()> {
        let li = layer
            .checked_sub(self.geo.first_layer)
            .map(|i| i as usize)
            .filter(|&i| i < self.layers.len())
            .ok_or_else(|| anyhow!("layer {layer} is not held by this rank"))?;
        let lw = &self.layers[li];
        let a = &mut self.act;
        let pool = &*self.pool;
        let hd = self.geo.head_dim;
        match segment {
            Segment::AttnPre => {
                rms_norm(&a.x, &lw.attn_norm, self.geo.eps, &mut a.xn);
                for (m, out) in [(&lw.q, &mut a.q), (&lw.k, &mut a.k), (&lw.v, &mut a.v)] {
                    col_parallel(pool, m, &a.xn, out);
                }
                if let Some([bq, bk, bv]) = &lw.biases {
                    kernels::add(&mut a.q, bq);
                    kernels::add(&mut a.k, bk);
                    kernels::add(&mut a.v, bv);
                }
                if let Some([nq, nk]) = &lw.qk_norm {
                    per_head_norm(&mut a.q, nq, self.geo.eps, hd);
                    per_head_norm(&mut a.k, nk, self.geo.eps, hd);
                }
                let pos = pos as usize;
                let (nq, nk) = (a.q.len() / hd, a.k.len() / hd);
                rope(&mut a.q, nq, hd, pos, self.geo.theta, self.geo.rope);
                rope(&mut a.k, nk, hd, pos, self.geo.theta, self.geo.rope);
            }
            Segment::AttnCore => {
                let kv = &mut self.kv[li];
                if pos as usize >= kv.capacity() {
                    bail!(
                        "position {pos} is beyond runtime.max_context {}",
                        kv.capacity()
                    );
                }
                kv.write(pos as usize, &a.k, &a.v);
                attention(&a.q, kv, a.q.len() / hd, pos as usize + 1, &mut a.att);
            }
            Segment::AttnOut => {
                let chunks = self.geo.row_chunks.map(|c| c.0);
                row_parallel(pool, &lw.o, &a.att, chunks, &mut a.partial);
                if self.geo.tp_degree == 1 {
                    kernels::add(&mut a.x, &a.partial);
                }
            }
            Segment::Ffn => {
                rms_norm(&a.x, &lw.ffn_norm, self.geo.eps, &mut a.xn);
                col_parallel(pool, &lw.gate, &a.xn, &mut a.gate);
                col_parallel(pool, &lw.up, &a.xn, &mut a.up);
                silu_mul(&mut a.gate, &a.up);
                let chunks = self.geo.row_chunks.map(|c| c.1);
                row_parallel(pool, &lw.down, &a.gate, chunks, &mut a.partial);
                if self.geo.tp_degree == 1 {
                    kernels::add(&mut a.x, &a.partial);
                }
            }
            other => bail!(
                "segment `{}` is not supported by the cpu backend",
                other.name()
            ),
        }
        Ok(())
    }

    /// Adds the group's reduced sum to the residual stream.
    pub fn add_reduced(&mut self, sum: &[f32]) {
        kernels::add(&mut self.act.x, sum);
    }

    /// Final norm and this rank's vocab rows.
    pub fn head(&mut self) -> Result<()> {
        let (norm, rows) = self
            .head
            .as_ref()
            .ok_or_else(|| anyhow!("head on a rank without the head"))?;
        let a = &mut self.act;
        rms_norm(&a.x, norm, self.geo.eps, &mut a.xn);
        let w = match rows {
            HeadRows::Own(m) => view(m),
            HeadRows::Tied { start, end } => {
                let e = self
                    .embed
                    .as_ref()
                    .expect("invariant: tied heads keep token_embd");
                Weight {
                    dtype: e.dtype,
                    data: e.rows_bytes(*start, *end),
                    rows: end - start,
                    cols: e.cols,
                }
            }
        };
        let chunks = reduction_chunks(w.cols as u64, w.dtype.block_size() as u64) as usize;
        kernels::matvec(&self.pool, &w, &a.xn, chunks, &mut a.logits);
        a.full_logits = None;
        Ok(())
    }

    /// Concatenates the group's vocab slices (in member order) into the full logits.
    pub fn set_full_logits(&mut self, parts: &[Vec<f32>]) {
        self.act.full_logits = Some(parts.concat());
    }

    /// Picks the next token from the logits.
    pub fn sample(&mut self) -> Result<()> {
        let logits = self.act.full_logits.as_deref().unwrap_or(&self.act.logits);
        if logits.is_empty() {
            bail!("sample on a rank without logits");
        }
        self.token = self.sampler.sample(logits);
        Ok(())
    }
}

fn view(m: &Matrix) -> Weight<'_> {
    Weight {
        dtype: m.dtype,
        data: &m.data,
        rows: m.rows,
        cols: m.cols,
    }
}

/// A product whose K is the full input: every row computed as on one rank.
fn col_parallel(pool: &Pool, m: &Matrix, x: &[f32], y: &mut [f32]) {
    let chunks = reduction_chunks(m.cols as u64, m.dtype.block_size() as u64) as usize;
    kernels::matvec(pool, &view(m), x, chunks, y);
}

/// A product over this rank's share of K: the canonical subtree when `chunks` is given.
fn row_parallel(pool: &Pool, m: &Matrix, x: &[f32], chunks: Option<usize>, y: &mut [f32]) {
    let chunks = chunks
        .unwrap_or_else(|| reduction_chunks(m.cols as u64, m.dtype.block_size() as u64) as usize);
    kernels::matvec(pool, &view(m), x, chunks.max(1), y);
}

/// RMS norm of each `hd`-long head of `v` with the shared weight `w` (qwen3's q/k norms).
fn per_head_norm(v: &mut [f32], w: &[f32], eps: f32, hd: usize) {
    let mut out = vec![0.0; hd];
    for head in v.chunks_exact_mut(hd) {
        rms_norm(head, w, eps, &mut out);
        head.copy_from_slice(&out);
    }
}
