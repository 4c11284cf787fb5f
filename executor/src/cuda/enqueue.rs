//! What each program entry does on CUDA (`RankOps` for the shared program walk): enqueue it on
//! the rank's stream. A run of a decode step replays its graph for the step's phase and bucket
//! once captured (eager the first time they come up, `buckets`); an island is eager; a copy
//! is a device copy, or a peer copy between devices, on the receiver's stream; waits and
//! records are CUDA events per (event, slot) with the plan's slot rules; the readback copies
//! the logits that come back (not a pad row's) and the token into the pinned host ring. The
//! rank's first block takes the step's inputs (position, and a prompt token on the ranks that
//! embed; a batched step's position, slot and token of every row, pad rows first) through a
//! small pinned ring in stream order.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::result as cu;
use cudarc::driver::{CudaEvent, CudaStream, DeviceSlice, PinnedHostSlice};
use memra_compiler::plan::{event_slot, Boundary, Carries};

use super::buckets::{Replay, RunGraphs};
use super::device::DeviceBuffer;
use super::ops::PAD_SLOT;
use super::p2p::Crossings;
use super::rank::{copy, RankDevice, Rows};
use super::span::Span;
use crate::engine::{self, StepInput};
use crate::program::{Block, Entered, RankOps, Work};

/// Pinned host memory a rank's step inputs go up from; a slot is rewritten only after the
/// copies that read it finished (its event is recorded after them). The pinned slices' own
/// events are not recorded with cudarc's event tracking off, so the ring keeps its own.
pub(super) struct InputRing {
    /// The step's position, or a batched step's position of every row.
    pub(super) pos: Vec<PinnedHostSlice<u32>>,
    /// A batched step's sequence slot of every row.
    pub(super) slots: Vec<PinnedHostSlice<u32>>,
    pub(super) token: Vec<PinnedHostSlice<u32>>,
    pub(super) done: Vec<CudaEvent>,
}

/// The readback ring on the sampler rank's device; `done[slot]` is recorded after a step's
/// copies into the slot, and the host waits on it before reading.
pub(super) struct ReadbackRing {
    pub(super) rank: usize,
    pub(super) logits: Vec<PinnedHostSlice<f32>>,
    pub(super) token: Vec<PinnedHostSlice<u32>>,
    /// With `engine::Readback::Argmax`: the logit rows' argmaxes, on the device, then in the
    /// ring slot.
    pub(super) argmax_rows: DeviceBuffer<u32>,
    pub(super) argmax: Vec<PinnedHostSlice<u32>>,
    pub(super) done: Vec<CudaEvent>,
}

/// What each program entry does on CUDA for one rank at one step: enqueue it on its stream.
pub(super) struct CudaOps<'a> {
    pub(super) ri: usize,
    pub(super) ranks: &'a mut [RankDevice],
    pub(super) runs: &'a mut [Option<RunGraphs>],
    pub(super) events: &'a BTreeMap<String, Vec<CudaEvent>>,
    pub(super) boundaries: &'a [Boundary],
    pub(super) inputs: &'a mut InputRing,
    /// The readback ring, in the process holding the readback rank.
    pub(super) readback: Option<&'a mut ReadbackRing>,
    /// Boundaries to ranks of other processes.
    pub(super) crossings: &'a Crossings,
    pub(super) inputs_sent: bool,
    /// The step's token rows.
    pub(super) rows: Rows,
    /// The bucket whose graphs replay the step's runs; `None`: a step with prompt rows, eager.
    pub(super) bucket: Option<usize>,
}

impl CudaOps<'_> {
    fn stream(&self, name: &str) -> Result<Arc<CudaStream>> {
        self.ranks[self.ri].stream(name).cloned()
    }

    fn event(&self, event: &str, t: u64) -> Result<&CudaEvent> {
        let slot = event_slot(self.boundaries, event, self.ranks[self.ri].rank, t) as usize;
        self.events
            .get(event)
            .and_then(|e| e.get(slot))
            .ok_or_else(|| anyhow!("event `{event}` slot {slot} is never recorded"))
    }

    /// Writes the step's position (a batched step's position and slot of every row, pad rows
    /// first at position 0 of `PAD_SLOT`), and the tokens when the block embeds (token 0 for
    /// a pad row), in stream order.
    fn send_inputs(
        &mut self,
        t: u64,
        input: &StepInput,
        embeds: bool,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = &self.ranks[self.ri];
        let ring = &mut *self.inputs;
        let slot = (t % ring.pos.len() as u64) as usize;
        let host = |e| anyhow!("cuda backend: input ring: {e:?}");
        ring.done[slot].synchronize().map_err(host)?;
        let up = |h: &mut PinnedHostSlice<u32>, values: &[u32], dst: Span<u32>| -> Result<()> {
            let staged = &mut h.as_mut_slice().map_err(host)?[..values.len()];
            staged.copy_from_slice(values);
            assert_eq!(dst.len(), values.len(), "invariant: one token a row");
            s.context().bind_to_thread()?;
            // SAFETY: `staged` is pinned host memory of dst.len() values that stays unwritten
            // until the ring slot's event (recorded after this copy) has completed
            unsafe { cu::memcpy_htod_async(dst.addr(), staged, s.cu_stream()) }
                .map_err(|e| anyhow!("cuda backend: host to device copy: {e:?}"))
        };
        let padding = self.rows.padding;
        if rank.batch_step(self.rows) {
            let (pos, slots): (Vec<u32>, Vec<u32>) = std::iter::repeat_n((0, PAD_SLOT), padding)
                .chain(input.rows_at().map(|r| (r.pos as u32, r.slot as u32)))
                .unzip();
            up(&mut ring.pos[slot], &pos, rank.pos(pos.len()))?;
            up(&mut ring.slots[slot], &slots, rank.slots(slots.len()))?;
        } else {
            up(&mut ring.pos[slot], &[input.pos()], rank.pos(1))?;
        }
        if embeds {
            let fed = input.tokens();
            match (fed.is_empty(), rank.token_input()) {
                (false, _) => {
                    let tokens: Vec<u32> = std::iter::repeat_n(0, padding).chain(fed).collect();
                    up(&mut ring.token[slot], &tokens, rank.tokens(tokens.len()))?
                }
                (true, Some(b)) => {
                    copy(s, &rank.rx_slot(b, b.recv_slot(t), 1), &rank.token().cast())?
                }
                // the rank samples the token it embeds next: it is already in place
                (true, None) => {}
            }
        }
        ring.done[slot].record(s).map_err(host)
    }
}

impl RankOps for CudaOps<'_> {
    fn wait(&mut self, stream: &str, event: &str, _: usize, t: u64, _: bool) -> Result<bool> {
        let s = self.stream(stream)?;
        match self.crossings.wait(&s, event, t) {
            Some(crossed) => crossed?,
            None => s
                .wait(self.event(event, t)?)
                .map_err(|e| anyhow!("waiting for `{event}`: {e:?}"))?,
        }
        Ok(true)
    }

    fn record(&mut self, stream: &str, event: &str, t: u64) -> Result<()> {
        self.event(event, t)?
            .record(&*self.stream(stream)?)
            .map_err(|e| anyhow!("recording `{event}`: {e:?}"))?;
        self.crossings
            .recorded(self.ranks, event, t, self.rows.rows)
    }

    fn copy(&mut self, stream: &str, id: u32, t: u64) -> Result<()> {
        if let Some(crossed) = self.crossings.copy(self.ranks, id, t, self.rows.rows) {
            return crossed;
        }
        let s = self.stream(stream)?;
        let b = self
            .boundaries
            .iter()
            .find(|b| b.boundary == id)
            .ok_or_else(|| anyhow!("copy of boundary {id}, which is not declared"))?;
        let to = &self.ranks[self.ri];
        let from = self
            .ranks
            .iter()
            .find(|r| r.rank == b.from_rank)
            .ok_or_else(|| {
                anyhow!(
                    "boundary {id} comes from rank {}, which is not declared",
                    b.from_rank
                )
            })?;
        let slot = b.recv_slot(t);
        let rows = if b.carries == Carries::Hidden {
            self.rows.rows
        } else {
            1
        };
        let (src, dst) = (from.tx_slot(b, slot, rows), to.rx_slot(b, slot, rows));
        if from.dev.ordinal() == to.dev.ordinal() {
            return copy(&s, &src, &dst);
        }
        s.context().bind_to_thread()?;
        // SAFETY: both spans are live slot buffers of `len` bytes; peer access between the two
        // devices was enabled when the engine was built
        unsafe {
            cu::memcpy_peer_async(
                to.dev.context().cu_ctx(),
                dst.addr(),
                from.dev.context().cu_ctx(),
                src.addr(),
                src.len(),
                s.cu_stream(),
            )
        }
        .map_err(|e| anyhow!("cuda backend: peer copy of boundary {id}: {e:?}"))
    }

    fn readback(&mut self, stream: &str, t: u64, input: &StepInput) -> Result<()> {
        let rb = match self.readback.as_deref_mut() {
            Some(rb) if rb.rank == self.ri => rb,
            _ => bail!("invariant: readback on the reading rank"),
        };
        let s = self.ranks[self.ri].stream(stream)?.clone();
        let rank = &self.ranks[self.ri];
        let slot = (t % rb.logits.len() as u64) as usize;
        // the head's rows after the pad rows
        let (rows, head_rows) = (self.rows.returned(), self.rows.out());
        let all = rank.logits(head_rows);
        let per = all.len() / head_rows;
        let logits = all.sub(self.rows.padding * per, rows * per);
        let err = |e| anyhow!("cuda backend: readback: {e:?}");
        s.context().bind_to_thread()?;
        match input.readback {
            engine::Readback::Logits => {
                let host = &mut rb.logits[slot].as_mut_slice().map_err(err)?[..logits.len()];
                // SAFETY: `host` is pinned memory of the ring slot, read by the host only after
                // the slot's event (recorded below) has completed; `logits` is a live device
                // span of its length
                unsafe { cu::memcpy_dtoh_async(host, logits.addr(), s.cu_stream()) }
                    .map_err(err)?;
            }
            engine::Readback::Argmax => {
                let argmax = Span::of(&rb.argmax_rows).sub(0, rows);
                rank.dev
                    .argmax_rows(&s, &logits, &argmax)
                    .map_err(|e| anyhow!("cuda backend: readback: {e:#}"))?;
                let host = &mut rb.argmax[slot].as_mut_slice().map_err(err)?[..rows];
                // SAFETY: as above, for the argmaxes
                unsafe { cu::memcpy_dtoh_async(host, argmax.addr(), s.cu_stream()) }
                    .map_err(err)?;
            }
        }
        s.memcpy_dtoh(&rank.token(), &mut rb.token[slot])
            .and_then(|_| rb.done[slot].record(&s))
            .map_err(err)
    }

    /// The rank's first block takes the step's inputs; a run of a decode step replays its
    /// graph once captured.
    fn enter(
        &mut self,
        stream: &str,
        at: usize,
        b: &Block,
        t: u64,
        input: &StepInput,
    ) -> Result<Entered> {
        let embeds = b.work.contains(&Work::Embed);
        if !self.inputs_sent {
            let s = self.stream(stream)?;
            self.send_inputs(t, input, embeds, &s)?;
            self.inputs_sent = true;
        } else if embeds {
            bail!("embed after the rank's first run or island is not supported");
        }
        // a run's graph holds a decode step's launches for its bucket's rows: a step with
        // prompt rows walks the run eagerly
        let (Some(run), Some(bucket)) = (self.runs[at].as_mut(), self.bucket) else {
            return Ok(Entered::Walk);
        };
        let rank = self.ranks[self.ri].rank;
        match run.enter(t, bucket) {
            Replay::Walk => Ok(Entered::Walk),
            Replay::Graph(g) => {
                g.replay().map_err(|e| anyhow!("rank {rank}: {e}"))?;
                Ok(Entered::Done)
            }
            Replay::Uncaptured => bail!(
                "invariant: rank {rank} run {} is captured for step {t}'s phase and bucket before its step",
                b.id
            ),
        }
    }

    fn work(&mut self, stream: &str, work: Work, t: u64, _: &StepInput, _: bool) -> Result<bool> {
        let s = self.stream(stream)?;
        self.ranks[self.ri].work(work, t, self.rows, &s)?;
        Ok(true)
    }
}
