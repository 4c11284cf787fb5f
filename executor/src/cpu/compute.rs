//! A rank's compute state and its ops: embedding, the layer segments of every layer kind of
//! the schema (GQA for llama, qwen2 with q/k/v biases, qwen3 and qwen3moe with per-head q/k
//! norms; MLA for deepseek2; KDA and MLA for kimi-linear; KDA and MLA over the DSA indexer's
//! selection, in mHC streams, for glm5-next; dense or MoE FFNs, with shared experts), the
//! vocab-parallel head and sampling. Everything here belongs to one rank: its weight shards, activations, caches of
//! its layers, logits, token and received slots. The segment bodies live in `segments`.
//!
//! A step holds one token row (decode) or a prompt chunk's rows (prefill): every op works on
//! all rows, each row computed as it would be alone, so prefill logits are decode's bits.
//! KDA runs its convolutions and delta rule row after row inside the segment (the products
//! over all rows); the DSA selection takes one row (the engine runs DSA models' prompts
//! token by token).
//!
//! Row-parallel products (attention output, FFN down) and the routed experts leave a partial
//! sum in `partial`; on a tensor-parallel rank the all-reduce adds the group's sum to the
//! residual, on a single rank the segment adds it at once. Row-parallel K is reduced in the
//! canonical chunk count divided by the TP degree when the group is exact, so each rank
//! computes one subtree of the 1-rank sum; experts are whole on one rank (`kernels::moe`).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{reduction_chunks, Plan, Segment};

use super::kernels::{
    self, hc_mean, rms_norm, IndexerCache, KdaState, KvCache, KvDtype, LatentCache, Pool, Router,
    Selection, Weight, STREAMS,
};
use super::layer::{FfnWeights, LayerWeights, MixerWeights};
use super::mhc::{self, HcParams, HcState};
use super::segments::{self, view, Activations, Cache, Ctx};
use super::wire::Payload;
use crate::engine::RowAt;
use crate::geometry::RankGeometry;
use crate::rope::mla_kq_scale;
use crate::sample::{Sampler, SamplerConfig};
use crate::weights::{Matrix, RankWeights};

/// Where the head's vocab rows come from.
enum HeadRows {
    /// `output.weight` rows of this rank.
    Own(Matrix),
    /// Rows `start..end` of the tied `token_embd.weight`.
    Tied { start: usize, end: usize },
}

/// A rank's weights and state.
pub struct RankCompute {
    pool: Arc<Pool>,
    layers: Vec<LayerWeights>,
    caches: Vec<Cache>,
    router: Option<Router>,
    /// MLA's attention scale (YaRN's mscale squared over the head size).
    kq_scale: f32,
    /// DSA's selection and the indexer key norm's epsilon.
    dsa: Option<(Selection, f32)>,
    /// mHC's Sinkhorn iterations and epsilon.
    mhc: Option<HcParams>,
    embed: Option<Matrix>,
    head: Option<(Vec<f32>, HeadRows)>,
    geo: RankGeometry,
    /// Values of one row of the residual stream.
    hidden: usize,
    act: Activations,
    token: u32,
    sampler: Sampler,
    rx: BTreeMap<u32, Vec<Option<Payload>>>,
    /// `EngineOptions::perturb`.
    perturb: Option<f32>,
}

impl RankCompute {
    /// This rank with `EngineOptions::perturb`'s noise on every layer's mixer input.
    pub fn perturbed(mut self, relative: Option<f32>) -> RankCompute {
        self.perturb = relative;
        self
    }

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
        let layers = (r.layers.start..r.layers.end)
            .map(|l| LayerWeights::take(plan, l, &mut w))
            .collect::<Result<Vec<_>>>()?;
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
        let capacity = plan.runtime.max_context as usize;
        let hd = m.head_dim as usize;
        let slots = plan.runtime.max_sequences as usize;
        let caches = layers
            .iter()
            .map(|lw| match &lw.mixer {
                MixerWeights::Gqa(g) => {
                    if g.q.rows % hd != 0 || g.k.rows % hd != 0 {
                        bail!("q/k shards are not whole heads of {hd} values");
                    }
                    let kv = || KvCache::new(kv_dtype, g.k.rows / hd, hd, capacity);
                    Ok(Cache::Kv((0..slots).map(|_| kv()).collect()))
                }
                MixerWeights::Mla(mla) => {
                    let kvl = mla.k_b.rows;
                    let rope = mla.kv_a.rows - kvl;
                    let latent = || LatentCache::new(kv_dtype, kvl, rope, capacity);
                    // DSA's indexer rows beside the latent ones, one cache per slot
                    let indexers = mla.indexer.as_ref().map_or_else(Vec::new, |x| {
                        let id = x.k.rows;
                        (0..slots)
                            .map(|_| IndexerCache::new(id, x.ape.len() / id, capacity))
                            .collect()
                    });
                    Ok(Cache::Latent(
                        (0..slots).map(|_| latent()).collect(),
                        indexers,
                    ))
                }
                MixerWeights::Kda(k) => {
                    // a verify step of speculative decoding is its drafts and the token before
                    let keeps = plan.speculative.map_or(0, |sp| sp.tokens as usize + 1);
                    let state = || KdaState::new(k.heads(), k.head_dim(), k.taps).keeping(keeps);
                    Ok(Cache::Kda((0..slots).map(|_| state()).collect(), capacity))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let router = m.moe.as_ref().map(Router::of);
        let d = m.embedding as usize;
        let mhc = m.mhc.as_ref().map(|h| HcParams {
            iters: h.sinkhorn_iters,
            eps: h.eps as f32,
        });
        if m.mhc
            .as_ref()
            .is_some_and(|h| h.streams as usize != STREAMS)
        {
            bail!("model.mhc.streams must be {STREAMS} on the cpu");
        }
        let dsa = m.dsa.as_ref().map(|x| {
            let how = Selection {
                top_k: x.top_k as usize,
                select_tail: x.select_tail,
            };
            (how, x.norm_eps as f32)
        });
        let mut c = RankCompute {
            pool,
            layers,
            caches,
            router,
            kq_scale: mla_kq_scale(m.rope_yarn.as_ref(), hd),
            dsa,
            embed,
            head,
            geo: RankGeometry::of(plan, rank),
            hidden: d * if mhc.is_some() { STREAMS } else { 1 },
            mhc,
            act: Activations::default(),
            token: 0,
            sampler: Sampler::new(sampler),
            rx: BTreeMap::new(),
            perturb: None,
        };
        c.act.rows = 1;
        c.act.x = vec![0.0; d];
        c.act.xn = vec![0.0; d];
        c.act.partial = vec![0.0; d];
        if c.mhc.is_some() {
            c.act.hc = Some(HcState::default());
        }
        if let Some((_, rows)) = &c.head {
            let n = match rows {
                HeadRows::Own(m) => m.rows,
                HeadRows::Tied { start, end } => end - start,
            };
            c.act.logits = vec![0.0; n];
        }
        Ok(c)
    }

    /// The token sampled last (or embedded, on a rank that does not sample).
    pub fn token(&self) -> u32 {
        self.token
    }

    /// The residual stream (mHC's streams), every row.
    pub fn hidden(&self) -> &[f32] {
        match &self.act.hc {
            Some(hc) => &hc.streams,
            None => &self.act.x,
        }
    }

    /// The pending partial sum of the last row-parallel product.
    pub fn partial(&self) -> &[f32] {
        &self.act.partial
    }

    /// The logits of the rows the head ran on, one row after another: the gathered vocabulary
    /// on a group's first rank, else this rank's slice.
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

    /// The payload of a hidden-state boundary whose rows carry `selection` values of DSA
    /// selection besides the residual (`Boundary::selection`): every residual row, then per
    /// row the cell count and the cells (i32 bits in f32 values), zero-padded.
    pub fn hidden_payload(&self, selection: u32) -> Result<Vec<f32>> {
        let mut out = self.hidden().to_vec();
        if selection == 0 {
            return Ok(out);
        }
        let (per, a) = (selection as usize, &self.act);
        if a.cell_ends.len() != a.rows.max(1) {
            bail!("the boundary carries a DSA selection, but this step made none for its rows");
        }
        let mut start = 0;
        for &end in &a.cell_ends {
            let cells = &a.cells[start..end];
            if cells.len() >= per {
                bail!("a DSA selection of {} cells does not fit the boundary's {per} selection values", cells.len());
            }
            let bits = |v: usize| f32::from_bits(v as u32);
            out.push(bits(cells.len()));
            out.extend(cells.iter().map(|&c| bits(c)));
            out.extend(std::iter::repeat_n(0.0, per - 1 - cells.len()));
            start = end;
        }
        Ok(out)
    }

    /// Loads the residual stream (every row the sender held) from `rx[slot]` of `boundary`,
    /// and the DSA selection after it when its rows carry `selection` values
    /// (`hidden_payload`); without one, the step starts with no selection.
    pub fn load_hidden(&mut self, boundary: u32, slot: u32, selection: u32) -> Result<()> {
        let d = self.hidden;
        let per = d + selection as usize;
        let h = match self
            .rx
            .get(&boundary)
            .and_then(|s| s.get(slot as usize))
            .and_then(Option::as_ref)
        {
            Some(Payload::Hidden(h)) if !h.is_empty() && h.len() % per == 0 => h,
            _ => bail!(
                "no hidden state of rows of {d} values (and {selection} selection values) arrived on boundary {boundary} slot {slot}"
            ),
        };
        let rows = h.len() / per;
        let (residual, sel) = h.split_at(rows * d);
        self.act.rows = rows;
        let x = match &mut self.act.hc {
            Some(hc) => &mut hc.streams,
            None => &mut self.act.x,
        };
        x.clear();
        x.extend_from_slice(residual);
        self.act.cells.clear();
        self.act.cell_ends.clear();
        for block in sel.chunks_exact(selection.max(1) as usize) {
            let count = block[0].to_bits() as usize;
            let cells = block.get(1..1 + count).ok_or_else(|| {
                anyhow!("boundary {boundary} slot {slot}: a DSA selection of {count} cells in {selection} values")
            })?;
            self.act
                .cells
                .extend(cells.iter().map(|c| c.to_bits() as usize));
            self.act.cell_ends.push(self.act.cells.len());
        }
        Ok(())
    }

    /// Looks up the embeddings of `tokens`, one row each.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<()> {
        let e = self
            .embed
            .as_ref()
            .ok_or_else(|| anyhow!("embed on a rank without token_embd"))?;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= e.rows) {
            bail!("token {bad} is outside the vocabulary of {} tokens", e.rows);
        }
        let &last = tokens.last().ok_or_else(|| anyhow!("embed of no tokens"))?;
        self.token = last;
        // a new step: no DSA selection yet
        self.act.cells.clear();
        self.act.cell_ends.clear();
        let d = e.cols;
        self.act.rows = tokens.len();
        self.act.x.resize(tokens.len() * d, 0.0);
        for (row, &t) in self.act.x.chunks_exact_mut(d).zip(tokens) {
            kernels::embed_row(&view(e), t as usize, row);
        }
        // mHC: every stream starts as the embedding
        if let Some(hc) = &mut self.act.hc {
            hc.streams.clear();
            for row in self.act.x.chunks_exact(d) {
                for _ in 0..STREAMS {
                    hc.streams.extend_from_slice(row);
                }
            }
        }
        Ok(())
    }

    /// Runs one segment of layer `layer` over the step's rows, row `i` at `at[i]`.
    pub fn segment(&mut self, layer: u32, segment: Segment, at: &[RowAt]) -> Result<()> {
        let li = self.geo.layer_index(layer, self.layers.len())?;
        let lw = &self.layers[li];
        let cache = &mut self.caches[li];
        let a = &mut self.act;
        if at.len() != a.rows.max(1) {
            bail!(
                "a step of {} rows reached layer {layer} with {} rows",
                at.len(),
                a.rows
            );
        }
        for row in at {
            if row.pos >= cache.capacity() {
                bail!(
                    "position {} is beyond runtime.max_context {}",
                    row.pos,
                    cache.capacity()
                );
            }
            if row.slot >= cache.slots() {
                bail!(
                    "sequence slot {} is not below runtime.max_sequences {}",
                    row.slot,
                    cache.slots()
                );
            }
        }
        if let Some(r) = self.perturb {
            if matches!(
                segment,
                Segment::AttnPre | Segment::MlaPre | Segment::KdaPre
            ) {
                perturb_rows(&mut a.x, at, layer, r);
            }
        }
        let c = Ctx {
            pool: &self.pool,
            geo: &self.geo,
            at,
        };
        match (segment, &lw.mixer, &lw.ffn, cache) {
            (Segment::AttnPre, MixerWeights::Gqa(g), ..) => {
                segments::gqa_pre(&c, &lw.attn_norm, g, a)
            }
            (Segment::AttnCore, MixerWeights::Gqa(g), _, Cache::Kv(kv)) => {
                segments::gqa_core(&c, kv, g.q.rows, a)
            }
            (Segment::MlaPre, MixerWeights::Mla(m), ..) => {
                segments::mla_pre(&c, &lw.attn_norm, m, a)
            }
            (Segment::MlaCore, MixerWeights::Mla(m), _, Cache::Latent(lc, _)) => {
                if m.sparse && a.cell_ends.len() != at.len() {
                    bail!("layer {layer} attends over a DSA selection, but this step made or received none for its {} rows (a shared-indexer layer needs a full DSA layer before it, on this rank or across the boundary)", at.len());
                }
                segments::mla_core(&c, m, lc, self.kq_scale, a)
            }
            (Segment::DsaSelect, MixerWeights::Mla(m), _, Cache::Latent(_, ic))
                if !ic.is_empty() =>
            {
                let (how, eps) = self
                    .dsa
                    .as_ref()
                    .ok_or_else(|| anyhow!("dsa_select without model.dsa in the plan"))?;
                segments::dsa_select(&c, m, ic, (how, *eps), a)?
            }
            (Segment::HcAttnPre | Segment::HcFfnPre, ..) => {
                let (Some(hc), Some(p)) = (&lw.hc, self.mhc) else {
                    bail!(
                        "segment `{}` without mHC in the plan's model",
                        segment.name()
                    );
                };
                let w = &hc[usize::from(segment == Segment::HcFfnPre)];
                mhc::hc_pre(&c, w, p, a)?
            }
            (Segment::KdaPre, MixerWeights::Kda(k), _, Cache::Kda(st, _)) => {
                segments::kda_pre(&c, &lw.attn_norm, k, st, a)?
            }
            (Segment::KdaCore, MixerWeights::Kda(k), _, Cache::Kda(st, _)) => {
                segments::kda_core(&c, k, st, a)
            }
            (Segment::AttnOut, mixer, ..) => segments::attn_out(&c, mixer.o(), a),
            (Segment::Ffn, _, FfnWeights::Dense(g), _) => {
                segments::dense_ffn(&c, &lw.ffn_norm, g, a)
            }
            (Segment::MoeRouter, _, FfnWeights::Moe(e), _) => {
                let router = self
                    .router
                    .as_ref()
                    .ok_or_else(|| anyhow!("moe_router without model.moe in the plan"))?;
                segments::moe_router(&c, &lw.ffn_norm, e, router, a)
            }
            (Segment::MoeExperts, _, FfnWeights::Moe(e), _) => segments::moe_experts(&c, e, a)?,
            (Segment::MoeShared, _, FfnWeights::Moe(e), _) => segments::moe_shared(&c, e, a)?,
            (other, ..) => bail!(
                "segment `{}` does not fit layer {layer}'s kind in this plan's model",
                other.name()
            ),
        }
        Ok(())
    }

    /// Finishes the pending partial with the group's reduced sum of it.
    pub fn add_reduced(&mut self, sum: &[f32]) {
        segments::finish_with(&mut self.act, sum);
    }

    /// Final norm and this rank's vocab rows, for the step's rows `which` (in order).
    pub fn head(&mut self, which: &[usize]) -> Result<()> {
        let (norm, rows) = self
            .head
            .as_ref()
            .ok_or_else(|| anyhow!("head on a rank without the head"))?;
        let a = &mut self.act;
        let d = norm.len();
        if let Some(&bad) = which.iter().find(|&&r| r >= a.rows) {
            bail!("logits of row {bad} of a step of {} rows", a.rows);
        }
        // mHC: the head reads the mean of the streams
        if let Some(hc) = &a.hc {
            a.x.resize(a.rows * d, 0.0);
            for (x, streams) in
                a.x.chunks_exact_mut(d)
                    .zip(hc.streams.chunks_exact(STREAMS * d))
            {
                hc_mean(streams, x);
            }
        }
        let n = which.len();
        a.xn.resize(n * d, 0.0);
        for (&row, xn) in which.iter().zip(a.xn.chunks_exact_mut(d)) {
            rms_norm(&a.x[row * d..(row + 1) * d], norm, self.geo.eps, xn);
        }
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
        a.logits.resize(n * w.rows, 0.0);
        kernels::matmul(&self.pool, &w, &a.xn, chunks, &mut a.logits);
        a.logits_rows = n;
        a.full_logits = None;
        Ok(())
    }

    /// Joins the group's vocab slices (in member order) into the full logits, row by row.
    pub fn set_full_logits(&mut self, parts: &[Vec<f32>]) {
        let n = self.act.logits_rows.max(1);
        let mut full = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for row in 0..n {
            for p in parts {
                let w = p.len() / n;
                full.extend_from_slice(&p[row * w..(row + 1) * w]);
            }
        }
        self.act.full_logits = Some(full);
    }

    /// Picks the next token from the last row's logits. The draws token-by-token decoding
    /// would have taken at the step's earlier rows are skipped, so the sampled text does not
    /// depend on how the prompt was cut into steps.
    pub fn sample(&mut self) -> Result<()> {
        let logits = self.act.full_logits.as_deref().unwrap_or(&self.act.logits);
        if logits.is_empty() {
            bail!("sample on a rank without logits");
        }
        let vocab = logits.len() / self.act.logits_rows.max(1);
        self.sampler.skip(self.act.rows.max(1) as u64 - 1);
        self.token = self.sampler.sample(&logits[logits.len() - vocab..]);
        Ok(())
    }
}

/// `EngineOptions::perturb`: each row's values `x[i] *= 1 + r u`, `u` uniform in [-1, 1) drawn
/// from (layer, the row's position, i), so a run sees the same noise at the same place.
fn perturb_rows(x: &mut [f32], at: &[RowAt], layer: u32, r: f32) {
    let width = x.len() / at.len().max(1);
    let key = 0x7065_7274_7572_6200 ^ u64::from(layer);
    for (row, at) in x.chunks_exact_mut(width).zip(at) {
        let first = at.pos as u64 * width as u64;
        for (i, v) in (first..).zip(row.iter_mut()) {
            *v *= 1.0 + r * crate::synthetic::uniform(key, i);
        }
    }
}
