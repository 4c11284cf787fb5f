//! One rank of a plan on a CUDA device: its weight shards (uploaded to that device only), its
//! activations, KV cache (f16) of its layers, static IO buffers (position, tokens, logits),
//! its boundary slot buffers and its collective exchange; everything mutable is its own, also
//! when several ranks share a device. `work` launches the kernels of one work item of a run
//! or island on a stream, reading every per-step value (position, token, collective sequence)
//! from device memory, so the same launches can be captured once and replayed. The math
//! mirrors the CPU backend's `compute` (same chunk counts, same operations per value) so plans
//! agree bit for bit. A decode step's layer segments are in `decode`, a prefill step's in
//! `prefill`, a batched decode step's (a plan of several sequence slots) in `batched`; the op
//! families in `moe` (dense or MoE FFN), `mla` (deepseek2's latent
//! attention) and `kda` (kimi-linear's recurrent state). Its construction (weights uploaded,
//! buffers allocated) is in `load.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::result as cu;
use cudarc::driver::{CudaStream, DeviceSlice};
use memra_compiler::plan::{
    reduction_chunks, Boundary, Carries, Collective as PlanCollective, Mixer, Plan,
};

use super::collective::{Collective, Exchange, Oneshot, Placement, Reduce};
use super::device::{CudaDevice, DeviceBuffer};
use super::dsa::{Cells, DsaState, IndexerWeights};
use super::kda::{KdaState, KdaWeights};
use super::matvec::Norm;
use super::mhc::{HcState, HcWeights};
use super::mla::{MlaState, MlaWeights};
use super::moe::{FfnWeights, MoeState};
use super::ops::{attention_parts_len, DeviceKv, ATTN_SPLIT_ROWS};
use super::rows::FLASH_HEAD_DIMS;
use super::span::Span;
use super::weights::{device_matrix, DeviceWeight};
use crate::geometry::RankGeometry;
use crate::program::Work;
use crate::sample::SamplerConfig;
use crate::weights::RankWeights;

mod load;

/// One GQA layer's attention weights on the device.
pub(super) struct GqaWeights {
    pub q: DeviceWeight,
    pub k: DeviceWeight,
    pub v: DeviceWeight,
    pub biases: Option<[DeviceBuffer<f32>; 3]>,
    pub qk_norm: Option<[DeviceBuffer<f32>; 2]>,
}

impl GqaWeights {
    /// The biases and the q/k norms on the projected q, k and v of any number of token rows.
    pub fn finish_qkv(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        [q, k, v]: [&Span<f32>; 3],
        eps: f32,
    ) -> Result<()> {
        if let Some([bq, bk, bv]) = &self.biases {
            for (y, bias) in [(q, bq), (k, bk), (v, bv)] {
                dev.add_rows(s, &mut y.clone(), bias)?;
            }
        }
        if let Some([nq, nk]) = &self.qk_norm {
            dev.rms_norm_pair(s, (q, nq), (k, nk), eps)?;
        }
        Ok(())
    }
}

/// A layer's attention weights besides the norm and the output projection.
pub(super) enum MixerWeights {
    Gqa(Box<GqaWeights>),
    Mla(Box<MlaWeights>),
    Kda(Box<KdaWeights>),
}

/// One layer's weights on the device.
pub(super) struct LayerWeights {
    pub attn_norm: DeviceBuffer<f32>,
    pub mixer: MixerWeights,
    pub o: DeviceWeight,
    pub ffn_norm: DeviceBuffer<f32>,
    pub ffn: FfnWeights,
    /// mHC's weights of the mixer and the FFN sublayer (glm5-next).
    pub hc: Option<[HcWeights; 2]>,
}

/// What the pending partial sum holds (the CPU backend's `segments::Pending`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Pending {
    /// A partial of the residual update in `partial`.
    Hidden,
    /// The MoE rows in `MoeState::rows`.
    Experts,
}

/// Where the head's vocab rows live.
enum HeadRows {
    /// Its own upload (`output.weight` rows, or a slice of a tied table).
    Own(DeviceWeight),
    /// The whole embedding table this rank already holds (tied, one rank's full vocab).
    Embedding,
}

/// A rank's activation and IO buffers: the activations, tokens and logits hold `rows` token
/// rows (a prefill step's; one when prompts run token by token), the rest one row.
pub(super) struct Buffers {
    pub x: DeviceBuffer<f32>,
    pub xn: DeviceBuffer<f32>,
    pub q: DeviceBuffer<f32>,
    pub k: DeviceBuffer<f32>,
    pub v: DeviceBuffer<f32>,
    pub att: DeviceBuffer<f32>,
    pub partial: DeviceBuffer<f32>,
    pub gate: DeviceBuffer<f32>,
    /// Scratch of a split attention's chunk partials (`ops::attention_parts_len`).
    pub attn_parts: DeviceBuffer<f32>,
    pub logits: DeviceBuffer<f32>,
    full_logits: Option<DeviceBuffer<f32>>,
    /// The step's position (one; a batched step's: one per row).
    pub pos: DeviceBuffer<u32>,
    /// A batched step's sequence slot of every row.
    pub slots: DeviceBuffer<u32>,
    token: DeviceBuffer<u32>,
    /// A prefill step's f16 activation rows, the up projection's rows and the chunk partials
    /// of a row-parallel product (empty when prompts run token by token).
    pub rows: Option<super::prefill::RowBuffers>,
    /// The sampler's draw counter, advanced by the sampling kernel.
    step: DeviceBuffer<u64>,
}

/// A rank's state on its device.
pub struct RankDevice {
    /// The rank's id.
    pub rank: u32,
    /// The device the plan puts it on.
    pub dev: CudaDevice,
    /// The rank's streams by plan name.
    pub streams: BTreeMap<String, Arc<CudaStream>>,
    pub(super) layers: Vec<LayerWeights>,
    /// By layer index; `None` for MLA and KDA layers (their caches and states are in `mla`
    /// and `kda`).
    pub(super) kv: Vec<Option<DeviceKv>>,
    pub(super) mla: Option<MlaState>,
    /// The DSA indexer caches of the rank's sparse MLA layers.
    pub(super) dsa: Option<DsaState>,
    pub(super) kda: Option<KdaState>,
    /// mHC's residual streams (glm5-next): the residual is these, `x` a sublayer's input.
    pub(super) hc: Option<HcState>,
    embed: Option<DeviceWeight>,
    head: Option<(DeviceBuffer<f32>, HeadRows)>,
    pub(super) geo: RankGeometry,
    sampler: SamplerConfig,
    pub(super) buf: Buffers,
    /// Token rows a step may have: the prefill chunk, or 1.
    pub(super) max_rows: usize,
    /// Sequence slots of the caches: the plan's `runtime.max_sequences`. With more than one,
    /// every step is a batched decode step (`batched`).
    pub(super) sequences: usize,
    /// The rows of the step being enqueued whose logits come back (a batched step's).
    pub(super) logit_rows: Vec<usize>,
    /// Vocab rows of this rank's head (one row of `logits`).
    vocab_rows: usize,
    tx: BTreeMap<u32, DeviceBuffer<u8>>,
    rx: BTreeMap<u32, DeviceBuffer<u8>>,
    outgoing: Vec<Boundary>,
    incoming: Vec<Boundary>,
    exchange: Option<Exchange>,
    collective: Option<Collective>,
    pub(super) moe: Option<MoeState>,
    /// Set as segments are enqueued, read by the all-reduce that follows them.
    pub(super) pending: Pending,
}

/// The token rows of the step being enqueued: `rows` rows, logits from row `logits_from`;
/// the first `padding` rows are a padded decode step's pad rows (`super::buckets`). In a
/// `decode` step every row is a different sequence's next token, so no row reads a cache
/// entry another row of the step writes. A `decode_bits` step (a speculative verify step,
/// `StepInput::decode_bits`) runs the batched decode kernels on a plan of one sequence slot
/// too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    pub rows: usize,
    pub logits_from: usize,
    pub padding: usize,
    pub decode: bool,
    pub decode_bits: bool,
}

impl Rows {
    /// Rows whose logits the head computes (pad rows included).
    pub fn out(self) -> usize {
        self.rows - self.logits_from
    }

    /// Rows whose logits come back: the head's rows after the pad rows.
    pub fn returned(self) -> usize {
        self.out() - self.padding
    }
}

impl RankDevice {
    /// The address of this rank's exchange, if it is in a group.
    pub fn exchange_address(&self) -> Option<u64> {
        self.exchange.as_ref().map(Exchange::address)
    }

    /// Values per inbox of the rank's exchange.
    pub fn exchange_cap(&self) -> Option<usize> {
        self.exchange.as_ref().map(Exchange::cap)
    }

    /// Joins the group: `all` are the members' exchange addresses in member order.
    pub fn connect(
        &mut self,
        all: &[u64],
        me: usize,
        tree: &crate::reduce::Tree,
        placement: Placement,
    ) -> Result<()> {
        let exchange = self
            .exchange
            .take()
            .ok_or_else(|| anyhow!("rank {} is in no tensor-parallel group", self.rank))?;
        let s = self.work_stream();
        let oneshot = Oneshot::connect(&self.dev, &s, exchange, all, me, tree, placement)?;
        self.collective = Some(Collective::Oneshot(oneshot));
        Ok(())
    }

    /// Joins an NCCL group as the member NCCL set up for it.
    pub fn join_nccl(&mut self, member: super::nccl::NcclMember) {
        self.collective = Some(Collective::Nccl(member));
    }

    /// The longest vector this rank's collectives carry (the hidden state of every row, one
    /// row's logits slice or the MoE rows).
    pub fn collective_len(&self) -> usize {
        let moe = self.moe.as_ref().map_or(0, |e| e.rows.len());
        self.buf.x.len().max(self.vocab_rows).max(moe)
    }

    /// The rank's first stream: buffers are allocated on it and its work runs on it (the
    /// plan's compute stream; a readback stream comes after it).
    pub fn work_stream(&self) -> Arc<CudaStream> {
        self.streams
            .values()
            .next()
            .cloned()
            .expect("invariant: checked in new")
    }

    /// The stream named `name` in the plan.
    pub fn stream(&self, name: &str) -> Result<&Arc<CudaStream>> {
        self.streams
            .get(name)
            .ok_or_else(|| anyhow!("rank {} has no stream `{name}`", self.rank))
    }

    /// The position input: one value, or one per row of a batched step (`rows`).
    pub fn pos(&self, rows: usize) -> Span<u32> {
        Span::of(&self.buf.pos).sub(0, rows)
    }

    /// The sequence slot of each of a batched step's `rows`.
    pub fn slots(&self, rows: usize) -> Span<u32> {
        Span::of(&self.buf.slots).sub(0, rows)
    }

    /// Whether every step is a batched decode step: the plan has several sequence slots.
    pub fn batched(&self) -> bool {
        self.sequences > 1
    }

    /// Whether a step of `rows` runs the batched decode kernels (`batched`): every step of
    /// a plan of several sequence slots, and a step whose rows must have decode's bits.
    pub fn batch_step(&self, rows: Rows) -> bool {
        self.batched() || rows.decode_bits
    }

    /// The tokens of the step's rows: embed reads them, sample writes the first.
    pub fn tokens(&self, rows: usize) -> Span<u32> {
        Span::of(&self.buf.token).sub(0, rows)
    }

    /// The sampled token (the first of the token rows).
    pub fn token(&self) -> Span<u32> {
        self.tokens(1)
    }

    /// The logits the host reads back, `rows` rows of the whole vocabulary: the gathered
    /// vocabulary on a group's first rank.
    pub fn logits(&self, rows: usize) -> Span<f32> {
        let all = Span::of(self.buf.full_logits.as_ref().unwrap_or(&self.buf.logits));
        let per = all.len() / self.max_rows;
        all.sub(0, rows * per)
    }

    /// The first `rows` token rows of slot `slot` of boundary `boundary`'s send buffer on
    /// this rank.
    pub fn tx_slot(&self, b: &Boundary, slot: u32, rows: usize) -> Span<u8> {
        slot_span(&self.tx[&b.boundary], b, slot, self.max_rows, rows)
    }

    /// The first `rows` token rows of slot `slot` of boundary `boundary`'s receive buffer on
    /// this rank.
    pub fn rx_slot(&self, b: &Boundary, slot: u32, rows: usize) -> Span<u8> {
        slot_span(&self.rx[&b.boundary], b, slot, self.max_rows, rows)
    }

    /// The incoming token boundary, if the rank embeds tokens fed back from a later stage.
    pub fn token_input(&self) -> Option<&Boundary> {
        self.incoming.iter().find(|b| b.carries == Carries::Token)
    }

    /// Enqueues the kernels of one work item of decode step `t` (its token `rows`) on `s`.
    pub fn work(&mut self, work: Work, t: u64, rows: Rows, s: &Arc<CudaStream>) -> Result<()> {
        if rows.rows > self.max_rows {
            bail!(
                "rank {}: a step of {} token rows; it holds {}",
                self.rank,
                rows.rows,
                self.max_rows
            );
        }
        self.launch(work, t, rows, s)
            .map_err(|e| anyhow!("rank {} {work}: {e:#}", self.rank))
    }

    /// The residual of the first `rows` token rows: mHC's streams, or the hidden state.
    fn residual(&self, rows: usize) -> Span<f32> {
        match &self.hc {
            Some(hc) => hc.streams(rows),
            None => Self::rows_of(&self.buf.x, rows, self.hidden_len()),
        }
    }

    /// Values of one token row of the hidden state (a sublayer's input under mHC).
    pub(super) fn hidden_len(&self) -> usize {
        self.buf.x.len() / self.max_rows
    }

    /// What the `dsa_select` segment of layer `layer` (index `li`) works with: the layer's
    /// MLA weights and indexer, and the rank's MLA and DSA states.
    pub(super) fn dsa_parts(
        &self,
        layer: u32,
        li: usize,
    ) -> Result<(&MlaWeights, &IndexerWeights, &MlaState, &DsaState)> {
        let (MixerWeights::Mla(m), Some(mla), Some(dsa)) =
            (&self.layers[li].mixer, &self.mla, &self.dsa)
        else {
            bail!("dsa_select on layer {layer}, not a DSA layer");
        };
        let Some(ix) = &m.indexer else {
            bail!("dsa_select on layer {layer}, an MLA layer without an indexer");
        };
        Ok((m, ix, mla, dsa))
    }

    /// The cells the first `rows` token rows of MLA layer `layer` (weights `m`) attend over:
    /// a DSA layer's selections (a shared-indexer layer's, left by its full layer on this rank
    /// or loaded with the hidden state), none for a dense MLA layer.
    pub(super) fn attended_cells(
        &self,
        layer: u32,
        m: &MlaWeights,
        rows: usize,
    ) -> Result<Option<Cells>> {
        match (m.sparse, &self.dsa) {
            (true, Some(dsa)) => Ok(Some(dsa.cells().rows(rows))),
            (true, None) => bail!("layer {layer}: a DSA layer without a DSA selection state"),
            (false, _) => Ok(None),
        }
    }

    /// The first `rows` rows of `buf`, rows of `per` values.
    pub(super) fn rows_of<T>(buf: &DeviceBuffer<T>, rows: usize, per: usize) -> Span<T> {
        Span::of(buf).sub(0, rows * per)
    }

    fn launch(&mut self, work: Work, t: u64, rows: Rows, s: &Arc<CudaStream>) -> Result<()> {
        let b = &self.buf;
        let dev = &self.dev;
        let d = self.hidden_len();
        let x = Self::rows_of(&b.x, rows.rows, d);
        match work {
            Work::Embed => {
                let table = self
                    .embed
                    .as_ref()
                    .ok_or_else(|| anyhow!("embed on a rank without token_embd"))?;
                dev.embed(s, table, &self.tokens(rows.rows), &mut x.clone())?;
                match &self.hc {
                    Some(hc) => hc.embed(dev, s, &x, rows.rows),
                    None => Ok(()),
                }
            }
            Work::Segment { layer, segment } if self.batch_step(rows) => {
                self.batch_segment(layer, segment, rows, s)
            }
            Work::Segment { layer, segment } if rows.rows > 1 => {
                self.prefill_segment(layer, segment, rows.rows, s)
            }
            Work::Segment { layer, segment } => self.segment(layer, segment, s),
            Work::AllReduce => {
                let c = self.collective(s)?;
                // with mHC the group's sum is the sublayer's output, spread over the streams
                let target = match &self.hc {
                    Some(hc) => hc.output(s, rows.rows * d, true)?,
                    None => x.clone(),
                };
                match (self.pending, &self.moe) {
                    (Pending::Experts, Some(e)) => {
                        // over the zeroed sum: each expert row is its holder's value plus -0.0s
                        let n = e.row_count() * rows.rows * d;
                        let sum = Span::of(&e.sum).sub(0, n);
                        c.run(Reduce::Sum, &Span::of(&e.rows).sub(0, n), &sum)?;
                        e.combine(dev, s, &target, true)?;
                    }
                    _ => c.run(
                        Reduce::Sum,
                        &Self::rows_of(&b.partial, rows.rows, d),
                        &target,
                    )?,
                }
                match &self.hc {
                    Some(hc) => hc.post(dev, s, &target),
                    None => Ok(()),
                }
            }
            Work::Head if self.batch_step(rows) => self.batch_head(rows.rows, s),
            Work::Head => {
                // mHC: the head reads the streams' mean
                if let Some(hc) = &self.hc {
                    hc.mean(dev, s, &x, rows.rows)?;
                }
                if rows.rows > 1 {
                    return self.prefill_head(rows, s);
                }
                let (norm, w) = self.head_weights()?;
                let chunks = reduction_chunks(w.cols as u64, w.dtype.block_size() as u64);
                let norm = Norm {
                    weight: norm,
                    eps: self.geo.eps,
                };
                dev.matvec_many(
                    s,
                    &[w],
                    &x,
                    Some(norm),
                    chunks as usize,
                    &[Self::rows_of(&b.logits, 1, self.vocab_rows)],
                )
            }
            Work::GatherLogits => {
                // a row at a time: member slices of one row are contiguous in the gathered row
                let c = self.collective(s)?;
                let (n, full) = (self.vocab_rows, self.logits(rows.out()));
                let per = full.len() / rows.out();
                for r in 0..rows.out() {
                    let part = Span::of(&b.logits).sub(r * n, n);
                    c.run(Reduce::Gather, &part, &full.sub(r * per, per))?;
                }
                Ok(())
            }
            Work::Sample => {
                let all = self.logits(rows.out());
                let per = all.len() / rows.out();
                let last = all.sub((rows.out() - 1) * per, per);
                if self.sampler.is_greedy() {
                    dev.argmax(s, &last, &mut self.token())
                } else {
                    dev.sample(
                        s,
                        &last,
                        &self.sampler,
                        &mut Span::of(&b.step),
                        &mut self.token(),
                    )
                }
            }
            Work::LoadHidden => {
                let bd = self.incoming_of(Carries::Hidden)?;
                let hidden: Span<u8> = self.residual(rows.rows).cast();
                let slot = self.rx_slot(bd, bd.recv_slot(t), rows.rows);
                copy(s, &slot.sub(0, hidden.len()), &hidden)?;
                self.copy_selection(bd, &slot, hidden.len(), rows.rows, false, s)
            }
            Work::StoreHidden | Work::StoreToken => {
                let (carries, src, n) = if work == Work::StoreHidden {
                    (Carries::Hidden, self.residual(rows.rows).cast(), rows.rows)
                } else {
                    (Carries::Token, self.token().cast(), 1)
                };
                let mut sent = false;
                for bd in self.outgoing.iter().filter(|x| x.carries == carries) {
                    let slot = self.tx_slot(bd, bd.send_slot(t), n);
                    copy(s, &src, &slot.sub(0, src.len()))?;
                    self.copy_selection(bd, &slot, src.len(), n, true, s)?;
                    sent = true;
                }
                if !sent {
                    bail!("store without an outgoing boundary");
                }
                Ok(())
            }
        }
    }

    /// Attention of layer `li` over the token rows of `[q, k, v, out]`: one row by the decode
    /// kernel (rope, the cache write and attention in one launch); several rows write every
    /// row's k and v to the cache first, then attend on the tensor cores (head dims of
    /// `FLASH_HEAD_DIMS`) or by the decode kernel with a grid row per token row (each row
    /// with its decode step's bits).
    pub(super) fn attend(
        &mut self,
        li: usize,
        [q, k, v, out]: [&Span<f32>; 4],
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let pos = Span::of(&self.buf.pos);
        let rope = (self.geo.theta, self.geo.rope);
        let kv = self.kv[li]
            .as_mut()
            .ok_or_else(|| anyhow!("attention on a layer that is not a GQA layer"))?;
        let rows = k.len() / (kv.n_kv_heads * kv.head_dim);
        if rows > 1 {
            self.dev.kv_store_rows(s, k, v, kv, &pos, None, rope)?;
            if FLASH_HEAD_DIMS.contains(&kv.head_dim) {
                return self
                    .dev
                    .flash_attention(s, q, kv, &pos, rows, rope, &mut out.clone());
            }
        }
        self.dev.attention(
            s,
            &mut q.clone(),
            k,
            v,
            kv,
            &pos,
            None,
            rope,
            &Span::of(&self.buf.attn_parts),
            &mut out.clone(),
            None,
            None,
        )
    }

    /// The final norm and the head's vocab rows.
    pub(super) fn head_weights(&self) -> Result<(&DeviceBuffer<f32>, &DeviceWeight)> {
        let (norm, rows) = self
            .head
            .as_ref()
            .ok_or_else(|| anyhow!("head on a rank without the head"))?;
        let w = match rows {
            HeadRows::Own(w) => w,
            HeadRows::Embedding => self.embed.as_ref().expect("invariant: kept for the head"),
        };
        Ok((norm, w))
    }

    /// The rank's collectives, which were set up on its work stream: `s` must be that one.
    fn collective(&self, s: &Arc<CudaStream>) -> Result<&Collective> {
        if s.cu_stream() != self.work_stream().cu_stream() {
            bail!("a collective on a stream other than the rank's first; the cuda backend runs collectives on the compute stream");
        }
        self.collective
            .as_ref()
            .ok_or_else(|| anyhow!("a collective on a rank of no tensor-parallel group"))
    }

    /// A hidden-state slot's DSA selections (`Boundary::selection` values a token row, after
    /// the `at` bytes of residual rows) from the rank's selections of its `rows` rows
    /// (`store`) or into them.
    #[allow(clippy::too_many_arguments)]
    fn copy_selection(
        &self,
        b: &Boundary,
        slot: &Span<u8>,
        at: usize,
        rows: usize,
        store: bool,
        s: &CudaStream,
    ) -> Result<()> {
        if b.selection == 0 {
            return Ok(());
        }
        let dsa = self.dsa.as_ref().ok_or_else(|| {
            anyhow!(
                "boundary {} carries a DSA selection; this rank holds none",
                b.boundary
            )
        })?;
        let sel = dsa.selection_bytes(rows, b.selection as usize)?;
        if slot.len() != at + sel.len() {
            bail!(
                "boundary {}: a slot of {} bytes for {rows} rows of {at} bytes of residual and {} of selection",
                b.boundary,
                slot.len(),
                sel.len()
            );
        }
        let tail = slot.sub(at, sel.len());
        match store {
            true => copy(s, &sel, &tail),
            false => copy(s, &tail, &sel),
        }
    }

    fn incoming_of(&self, carries: Carries) -> Result<&Boundary> {
        self.incoming
            .iter()
            .find(|b| b.carries == carries)
            .ok_or_else(|| anyhow!("no incoming {} boundary", carries.name()))
    }
}

/// Bytes of one slot of `b` on an engine of steps of up to `max_rows` token rows: a hidden
/// state slot holds every row of a step (the plan's `tokens` rows at most), a token slot one.
fn slot_bytes(b: &Boundary, max_rows: usize) -> usize {
    b.bytes as usize * max_rows.min(b.tokens as usize).max(1)
}

fn slot_span(
    buf: &DeviceBuffer<u8>,
    b: &Boundary,
    slot: u32,
    max_rows: usize,
    rows: usize,
) -> Span<u8> {
    let size = slot_bytes(b, max_rows);
    let used = b.bytes as usize * rows;
    assert!(
        used <= size,
        "invariant: {rows} rows fit a slot of boundary {}",
        b.boundary
    );
    Span::of(buf).sub(slot as usize * size, used)
}

/// A device-to-device copy of `src` into `dst` (both on `s`'s device) in `s`'s order.
pub fn copy(s: &CudaStream, src: &Span<u8>, dst: &Span<u8>) -> Result<()> {
    assert_eq!(src.len(), dst.len(), "invariant: copy lengths");
    s.context().bind_to_thread()?;
    // SAFETY: both spans are live buffers of `len` bytes owned by ranks of this engine
    unsafe { cu::memcpy_dtod_async(dst.addr(), src.addr(), src.len(), s.cu_stream()) }
        .map_err(|e| anyhow!("cuda backend: device copy of {} bytes: {e:?}", src.len()))
}
