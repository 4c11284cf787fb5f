//! The CUDA engine: every rank of a plan on its device, driven by one host thread that
//! enqueues each decode step's rank programs in plan order, exactly the order the compiler's
//! verify pass replays, so every event wait binds to the record verify proved it binds to.
//!
//! - `run`: a CUDA graph per phase (phase = step % phases): the first time a phase comes up
//!   its ops run eagerly (warm-up), the second time they are captured on the rank's stream,
//!   from then on replayed. A capture or instantiate failure latches that run to eager with
//!   one message; the launches are the same, so the logits are too.
//! - `island`: eager launches. `copy`: a device copy, or a peer copy between devices, on the
//!   receiver's stream. `wait`/`record`: one CUDA event per (event, slot) with the plan's slot
//!   rules. `readback`: logits and token into a pinned host ring of `runtime.in_flight` slots.
//! - Inputs: each rank's position, and a prompt step's token on the ranks that embed, go up
//!   through small pinned rings in stream order; a generated step's token never leaves the
//!   device (the sampler writes it, token boundaries carry it back to the embedding ranks).
//!
//! The host only waits on the readback ring: serially after every step, pipelined once the
//! plan's `in_flight` steps are enqueued.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::result as cu;
use cudarc::driver::{CudaEvent, CudaStream, DeviceSlice, PinnedHostSlice};
use memra_compiler::plan::{event_slot, Boundary, Collective, Op, Plan, Step};

use super::device::CudaDevice;
use super::graph::{capture, Graph};
use super::nccl;
use super::ops::{MAX_HEAD_DIM, MAX_TOP_K};
use super::rank::{copy, RankDevice};
use super::span::Span;
use crate::engine::{Arm, Decoder, EngineOptions, StepInput, StepOutput};
use crate::plan_load::LoadedPlan;
use crate::program::{
    run_block, walk, Binder, Block, Cursor, Entered, Entry, Program, RankOps, Work,
};
use crate::reduce::{ReduceOrder, Tree};
use crate::weights::RankWeights;

/// Graph state of one `run` step.
struct RunGraphs {
    phases: u64,
    warmed: Vec<bool>,
    graphs: Vec<Option<Graph>>,
    latched: bool,
}

/// Pinned host memory a rank's step inputs go up from; a slot is rewritten only after the
/// copies that read it finished (its event is recorded after them). The pinned slices' own
/// events are not recorded with cudarc's event tracking off, so the ring keeps its own.
struct InputRing {
    pos: Vec<PinnedHostSlice<u32>>,
    token: Vec<PinnedHostSlice<u32>>,
    done: Vec<CudaEvent>,
}

/// The readback ring on the sampler rank's device; `done[slot]` is recorded after a step's
/// copies into the slot, and the host waits on it before reading.
struct Readback {
    rank: usize,
    logits: Vec<PinnedHostSlice<f32>>,
    token: Vec<PinnedHostSlice<u32>>,
    done: Vec<CudaEvent>,
    /// Submitted steps not yet returned: (step, position).
    pending: VecDeque<(u64, u32)>,
}

/// A plan loaded onto CUDA devices, ready to decode.
pub struct Engine {
    // graphs go before the buffers they reference (fields drop in order)
    runs: Vec<Vec<Option<RunGraphs>>>,
    ranks: Vec<RankDevice>,
    programs: Vec<Program>,
    boundaries: Vec<Boundary>,
    events: BTreeMap<String, Vec<CudaEvent>>,
    inputs: Vec<InputRing>,
    readback: Readback,
    arm: Arm,
    next_step: u64,
    max_context: u32,
    failed: bool,
    report: Vec<String>,
}

fn pinned<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    len: usize,
) -> Result<PinnedHostSlice<T>> {
    // SAFETY: the memory is written (by the host or a copy) before anything reads it
    unsafe { dev.context().alloc_pinned_with_flags::<T>(len, 0) }
        .map_err(|e| anyhow!("cuda backend: allocating pinned host memory: {e:?}"))
}

impl Engine {
    /// Uploads every rank's shards to its device and prepares streams, events and rings.
    pub fn new(loaded: &LoadedPlan, options: EngineOptions) -> Result<Engine> {
        let plan = &loaded.plan;
        let s = options.sampler;
        if !s.is_greedy() && !(1..=MAX_TOP_K).contains(&s.top_k) {
            bail!(
                "the cuda backend samples among at most {MAX_TOP_K} candidates; pass --top-k between 1 and {MAX_TOP_K} (got {}), --temp 0, or use --backend cpu",
                s.top_k
            );
        }
        let hd = plan.model.head_dim as usize;
        if hd > MAX_HEAD_DIM || !hd.is_multiple_of(4) {
            bail!(
                "the cuda backend's attention takes heads of a multiple of 4 values up to {MAX_HEAD_DIM}; this model's head_dim is {hd} (use --backend cpu)"
            );
        }
        if options.reduce_order != ReduceOrder::Tree {
            bail!("the cuda backend combines all-reduce partials in the plan's tree only");
        }
        let readers: Vec<usize> = plan
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| r.program.iter().any(|s| matches!(s, Step::Readback { .. })))
            .map(|(i, _)| i)
            .collect();
        if readers.len() != 1 {
            bail!(
                "the plan reads back from {} ranks; the cuda engine needs exactly one",
                readers.len()
            );
        }
        check_phases(plan)?;
        let devices = open_devices(plan)?;
        let free_before: BTreeMap<u32, usize> = devices
            .iter()
            .map(|(&d, dev)| Ok((d, dev.memory()?.0)))
            .collect::<Result<_>>()?;
        let mut ranks = Vec::new();
        for r in &plan.ranks {
            let weights = RankWeights::load(loaded, r)?;
            let dev = devices[&r.device].clone();
            ranks.push(
                RankDevice::new(plan, r.rank, dev, weights, s)
                    .map_err(|e| anyhow!("rank {} on device {}: {e:#}", r.rank, r.device))?,
            );
        }
        connect_groups(plan, &mut ranks)?;
        let events = make_events(plan, &ranks)?;
        let ring = plan.runtime.in_flight.max(1) as usize;
        let mut inputs = Vec::new();
        for rank in &ranks {
            let n = ring + 2;
            inputs.push(InputRing {
                pos: (0..n)
                    .map(|_| pinned(&rank.dev, 1))
                    .collect::<Result<_>>()?,
                token: (0..n)
                    .map(|_| pinned(&rank.dev, 1))
                    .collect::<Result<_>>()?,
                done: (0..n)
                    .map(|_| rank.dev.new_event(false))
                    .collect::<Result<_>>()?,
            });
        }
        let reader = &ranks[readers[0]];
        let vocab = reader.logits().len();
        let readback = Readback {
            rank: readers[0],
            logits: (0..ring)
                .map(|_| pinned(&reader.dev, vocab))
                .collect::<Result<_>>()?,
            token: (0..ring)
                .map(|_| pinned(&reader.dev, 1))
                .collect::<Result<_>>()?,
            done: (0..ring)
                .map(|_| reader.dev.new_event(false))
                .collect::<Result<_>>()?,
            pending: VecDeque::new(),
        };
        let runs = plan
            .ranks
            .iter()
            .map(|r| {
                r.program
                    .iter()
                    .map(|step| match step {
                        Step::Run { phases, .. } => {
                            let p = (*phases).max(1) as usize;
                            Some(RunGraphs {
                                phases: p as u64,
                                warmed: vec![false; p],
                                graphs: (0..p).map(|_| None).collect(),
                                latched: false,
                            })
                        }
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        for rank in &ranks {
            for s in rank.streams.values() {
                s.synchronize()
                    .map_err(|e| anyhow!("cuda backend: rank {} setup: {e:?}", rank.rank))?;
            }
        }
        let report = memory_report(plan, &devices, &free_before)?;
        Ok(Engine {
            runs,
            programs: plan
                .ranks
                .iter()
                .map(|r| Program::of(plan, r.rank))
                .collect(),
            boundaries: plan.boundaries.clone(),
            ranks,
            events,
            inputs,
            readback,
            arm: options.arm,
            next_step: 0,
            max_context: plan.runtime.max_context,
            failed: false,
            report,
        })
    }

    /// The walk's view of rank `ri` for one step.
    fn ops(&mut self, ri: usize) -> CudaOps<'_> {
        CudaOps {
            ri,
            ranks: &mut self.ranks,
            runs: &mut self.runs[ri],
            events: &self.events,
            boundaries: &self.boundaries,
            inputs: &mut self.inputs[ri],
            readback: &mut self.readback,
            inputs_sent: false,
        }
    }

    /// Captures every run whose phase comes up warmed but not yet captured at step `t`, for
    /// all ranks, before any rank enqueues the step, and uploads the graphs with the device
    /// idle. Capturing inline would end a capture and instantiate while earlier ranks' replayed
    /// collectives spin for a member that the host has not enqueued yet; the driver may
    /// synchronize the device there, and the collectives would wait on the host forever.
    fn capture_due(&mut self, t: u64, input: StepInput) -> Result<()> {
        let due: Vec<(usize, usize)> = (0..self.ranks.len())
            .flat_map(|ri| (0..self.programs[ri].entries.len()).map(move |i| (ri, i)))
            .filter(|&(ri, i)| {
                self.runs[ri][i].as_ref().is_some_and(|run| {
                    let p = (t % run.phases) as usize;
                    !run.latched && run.warmed[p] && run.graphs[p].is_none()
                })
            })
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        self.synchronize_all()?;
        let programs = std::mem::take(&mut self.programs);
        for &(ri, i) in &due {
            let (stream_name, Entry::Block(block)) = &programs[ri].entries[i] else {
                unreachable!("invariant: only blocks have graphs");
            };
            let stream = self.ranks[ri].stream(stream_name)?.clone();
            let rank = self.ranks[ri].rank;
            let mut ops = self.ops(ri);
            let graph = capture(&stream, || {
                run_block(&mut ops, stream_name, block, t, input)
            })
            .and_then(|g| g.upload().map(|()| g));
            let run = self.runs[ri][i]
                .as_mut()
                .expect("invariant: filtered above");
            let p = (t % run.phases) as usize;
            match graph {
                Ok(g) => run.graphs[p] = Some(g),
                Err(e) => {
                    eprintln!("cuda backend: rank {rank} run {}: {e}; running it eagerly from now on (logits are unchanged)", block.id);
                    run.latched = true;
                }
            }
        }
        self.programs = programs;
        self.synchronize_all()
    }

    fn synchronize_all(&self) -> Result<()> {
        for rank in &self.ranks {
            for s in rank.streams.values() {
                s.synchronize()
                    .map_err(|e| anyhow!("cuda backend: rank {}: {e:?}", rank.rank))?;
            }
        }
        Ok(())
    }

    fn take(&mut self) -> Result<StepOutput> {
        let (step, pos) = self
            .readback
            .pending
            .pop_front()
            .ok_or_else(|| anyhow!("no decode step is in flight"))?;
        let slot = (step % self.readback.logits.len() as u64) as usize;
        let wait = |e| {
            anyhow!("cuda backend: step {step}: the device failed before its readback: {e:?} (a collective traps after 30 s without its peers)")
        };
        self.readback.done[slot].synchronize().map_err(wait)?;
        let logits = self.readback.logits[slot]
            .as_slice()
            .map_err(wait)?
            .to_vec();
        let token = self.readback.token[slot].as_slice().map_err(wait)?[0];
        Ok(StepOutput {
            step,
            pos,
            token,
            logits,
        })
    }
}

impl Decoder for Engine {
    fn submit(&mut self, input: StepInput) -> Result<()> {
        input.check(self.failed, self.next_step, self.max_context)?;
        if self.readback.pending.len() >= self.readback.logits.len() {
            bail!(
                "{} steps are in flight, the plan's runtime.in_flight; take an output first",
                self.readback.pending.len()
            );
        }
        let t = self.next_step;
        self.next_step += 1;
        let mut result = self.capture_due(t, input);
        let programs = std::mem::take(&mut self.programs);
        for (ri, program) in programs.iter().enumerate() {
            if result.is_err() {
                break;
            }
            let mut cursor = Cursor::default();
            result = walk(
                program,
                &mut self.ops(ri),
                &mut cursor,
                t,
                input,
                true,
                &mut false,
            )
            .map(|_| ())
            .map_err(|e| anyhow!("rank {} step {t}: {e:#}", program.rank));
        }
        self.programs = programs;
        self.readback.pending.push_back((t, input.pos));
        if result.is_ok() && self.arm == Arm::Serial {
            let slot = (t % self.readback.logits.len() as u64) as usize;
            result = self.readback.done[slot]
                .synchronize()
                .map_err(|e| anyhow!("cuda backend: step {t}: {e:?}"));
        }
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn next_output(&mut self) -> Result<StepOutput> {
        let out = self.take();
        if out.is_err() {
            self.failed = true;
        }
        out
    }

    fn in_flight(&self) -> u64 {
        self.readback.pending.len() as u64
    }

    fn report(&self) -> Vec<String> {
        self.report.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for rank in &self.ranks {
            for s in rank.streams.values() {
                // a failed device reports its error where the step was taken; nothing to add
                let _ = s.synchronize();
            }
        }
    }
}

/// What each program entry does on CUDA for one rank at one step: enqueue it on its stream.
struct CudaOps<'a> {
    ri: usize,
    ranks: &'a mut [RankDevice],
    runs: &'a mut [Option<RunGraphs>],
    events: &'a BTreeMap<String, Vec<CudaEvent>>,
    boundaries: &'a [Boundary],
    inputs: &'a mut InputRing,
    readback: &'a mut Readback,
    inputs_sent: bool,
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

    /// Writes the step's position, and the token when the block embeds, in stream order.
    fn send_inputs(
        &mut self,
        t: u64,
        input: StepInput,
        embeds: bool,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = &self.ranks[self.ri];
        let ring = &mut *self.inputs;
        let slot = (t % ring.pos.len() as u64) as usize;
        let host = |e| anyhow!("cuda backend: input ring: {e:?}");
        ring.done[slot].synchronize().map_err(host)?;
        let up = |h: &mut PinnedHostSlice<u32>, value: u32, dst: Span<u32>| -> Result<()> {
            h.as_mut_slice().map_err(host)?[0] = value;
            s.memcpy_htod(h, &mut dst.clone())
                .map_err(|e| anyhow!("cuda backend: host to device copy: {e:?}"))
        };
        up(&mut ring.pos[slot], input.pos, rank.pos())?;
        if embeds {
            match (input.token, rank.token_input()) {
                (Some(token), _) => up(&mut ring.token[slot], token, rank.token())?,
                (None, Some(b)) => copy(s, &rank.rx_slot(b, b.recv_slot(t)), &rank.token().cast())?,
                // the rank samples the token it embeds next: it is already in place
                (None, None) => {}
            }
        }
        ring.done[slot].record(s).map_err(host)
    }
}

impl RankOps for CudaOps<'_> {
    fn wait(&mut self, stream: &str, event: &str, _: usize, t: u64, _: bool) -> Result<bool> {
        self.stream(stream)?
            .wait(self.event(event, t)?)
            .map_err(|e| anyhow!("waiting for `{event}`: {e:?}"))?;
        Ok(true)
    }

    fn record(&mut self, stream: &str, event: &str, t: u64) -> Result<()> {
        self.event(event, t)?
            .record(&*self.stream(stream)?)
            .map_err(|e| anyhow!("recording `{event}`: {e:?}"))
    }

    fn copy(&mut self, stream: &str, id: u32, t: u64) -> Result<()> {
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
        let (src, dst) = (from.tx_slot(b, slot), to.rx_slot(b, slot));
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

    fn readback(&mut self, stream: &str, t: u64, _: StepInput) -> Result<()> {
        if self.ri != self.readback.rank {
            bail!("invariant: readback on the reading rank");
        }
        let s = self.stream(stream)?;
        let rank = &self.ranks[self.ri];
        let rb = &mut *self.readback;
        let slot = (t % rb.logits.len() as u64) as usize;
        s.memcpy_dtoh(&rank.logits(), &mut rb.logits[slot])
            .and_then(|_| s.memcpy_dtoh(&rank.token(), &mut rb.token[slot]))
            .and_then(|_| rb.done[slot].record(&s))
            .map_err(|e| anyhow!("cuda backend: readback: {e:?}"))
    }

    /// The rank's first block takes the step's inputs; a run replays its graph once captured.
    fn enter(
        &mut self,
        stream: &str,
        at: usize,
        b: &Block,
        t: u64,
        input: StepInput,
    ) -> Result<Entered> {
        let embeds = b.work.contains(&Work::Embed);
        if !self.inputs_sent {
            let s = self.stream(stream)?;
            self.send_inputs(t, input, embeds, &s)?;
            self.inputs_sent = true;
        } else if embeds {
            bail!("embed after the rank's first run or island is not supported");
        }
        let Some(run) = self.runs[at].as_mut() else {
            return Ok(Entered::Walk);
        };
        let p = (t % run.phases) as usize;
        if run.latched || !run.warmed[p] {
            run.warmed[p] = true;
            return Ok(Entered::Walk);
        }
        let rank = self.ranks[self.ri].rank;
        run.graphs[p]
            .as_ref()
            .ok_or_else(|| {
                anyhow!(
                    "invariant: rank {rank} run {} phase {p} captured before its step",
                    b.id
                )
            })?
            .replay()
            .map_err(|e| anyhow!("rank {rank}: {e}"))?;
        Ok(Entered::Done)
    }

    fn work(&mut self, stream: &str, work: Work, t: u64, _: StepInput, _: bool) -> Result<bool> {
        let s = self.stream(stream)?;
        self.ranks[self.ri].work(work, t, &s)?;
        Ok(true)
    }
}

/// Every run that touches a boundary slot must have a phase per slot pattern: the slots a
/// step uses repeat with the boundary's slot count, the graphs with the run's phases.
fn check_phases(plan: &Plan) -> Result<()> {
    for r in &plan.ranks {
        for step in &r.program {
            let Step::Run {
                id, phases, ops, ..
            } = step
            else {
                continue;
            };
            for b in &plan.boundaries {
                let touches = ops.iter().any(|op| match op {
                    Op::LoadHidden => b.to_rank == r.rank && b.carries.name() == "hidden",
                    Op::StoreHidden => b.from_rank == r.rank && b.carries.name() == "hidden",
                    Op::StoreToken => b.from_rank == r.rank && b.carries.name() == "token",
                    _ => false,
                });
                if touches && !phases.is_multiple_of(b.slots) {
                    bail!(
                        "run {id} touches boundary {} of {} slots but has {phases} phases; the cuda engine needs a multiple",
                        b.boundary,
                        b.slots
                    );
                }
            }
        }
    }
    Ok(())
}

/// Opens every device the plan uses and enables peer access between each pair that a
/// boundary or a tensor-parallel group connects; a pair without P2P is refused by name.
fn open_devices(plan: &Plan) -> Result<BTreeMap<u32, CudaDevice>> {
    let mut devices = BTreeMap::new();
    for r in &plan.ranks {
        if let std::collections::btree_map::Entry::Vacant(e) = devices.entry(r.device) {
            e.insert(CudaDevice::open(r.device as usize)?);
        }
    }
    let device_of = |rank: u32| plan.rank(rank).map(|r| r.device);
    let mut pairs = BTreeSet::new();
    for b in &plan.boundaries {
        if let (Some(a), Some(c)) = (device_of(b.from_rank), device_of(b.to_rank)) {
            pairs.insert((a.min(c), a.max(c)));
        }
    }
    for g in &plan.groups {
        for &x in &g.ranks {
            for &y in &g.ranks {
                if let (Some(a), Some(c)) = (device_of(x), device_of(y)) {
                    pairs.insert((a.min(c), a.max(c)));
                }
            }
        }
    }
    for (a, c) in pairs.into_iter().filter(|(a, c)| a != c) {
        let (da, dc) = (&devices[&a], &devices[&c]);
        if !da.can_access_peer(dc)? || !dc.can_access_peer(da)? {
            bail!("cuda backend: devices {a} and {c} have no peer-to-peer access, which the plan needs between them (a boundary or a tensor-parallel group spans them); place those ranks on devices with p2p");
        }
        da.enable_peer_access(dc)?;
        dc.enable_peer_access(da)?;
    }
    Ok(devices)
}

/// Connects every group over its transport: the one-shot exchange addresses of all members to
/// each member, or one NCCL communicator for the group.
fn connect_groups(plan: &Plan, ranks: &mut [RankDevice]) -> Result<()> {
    for g in &plan.groups {
        let tree = Tree::parse(&g.tree, &g.ranks)
            .map_err(|e| anyhow!("group {}: tree `{}`: {e}", g.group, g.tree))?;
        let members = g
            .ranks
            .iter()
            .map(|&m| {
                ranks.iter().position(|r| r.rank == m).ok_or_else(|| {
                    anyhow!("group {} names rank {m}, which is not declared", g.group)
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let devices: BTreeSet<usize> = members.iter().map(|&i| ranks[i].dev.ordinal()).collect();
        let own_devices = devices.len() == members.len();
        if g.collective == Collective::Nccl {
            if !own_devices {
                bail!(
                    "group {}: collective = \"nccl\" needs one device per rank",
                    g.group
                );
            }
            let devs: Vec<CudaDevice> = members.iter().map(|&i| ranks[i].dev.clone()).collect();
            let streams: Vec<Arc<CudaStream>> =
                members.iter().map(|&i| ranks[i].work_stream()).collect();
            let cap = members
                .iter()
                .map(|&i| ranks[i].collective_len())
                .max()
                .unwrap_or(1);
            let joined = nccl::connect(&devs, &streams, &tree, cap)
                .map_err(|e| anyhow!("group {}: {e:#}", g.group))?;
            for (member, &i) in joined.into_iter().zip(&members) {
                ranks[i].join_nccl(member);
            }
            continue;
        }
        let mut all = Vec::new();
        for (&i, &m) in members.iter().zip(&g.ranks) {
            all.push(ranks[i].exchange_address().ok_or_else(|| {
                anyhow!("rank {m} is listed by group {} but names no group", g.group)
            })?);
        }
        for (me, &i) in members.iter().enumerate() {
            ranks[i].connect(&all, me, &tree, own_devices)?;
        }
    }
    Ok(())
}

/// One event per (event, slot), on the device of the rank that records it; the plan's events
/// are checked first (one record each, every wait bound to one) as both engines check them.
fn make_events(plan: &Plan, ranks: &[RankDevice]) -> Result<BTreeMap<String, Vec<CudaEvent>>> {
    Binder::new(plan)?;
    let mut events = BTreeMap::new();
    for (r, rank) in plan.ranks.iter().zip(ranks) {
        for step in &r.program {
            let Step::Record { event, .. } = step else {
                continue;
            };
            let slots = plan
                .boundaries
                .iter()
                .find(|b| *event == b.ready() || *event == b.consumed())
                .map_or(1, |b| b.slots);
            let list = (0..slots)
                .map(|_| rank.dev.new_event(false))
                .collect::<Result<Vec<_>>>()?;
            events.insert(event.clone(), list);
        }
    }
    Ok(events)
}

fn memory_report(
    plan: &Plan,
    devices: &BTreeMap<u32, CudaDevice>,
    free_before: &BTreeMap<u32, usize>,
) -> Result<Vec<String>> {
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let mut lines = Vec::new();
    for (&d, dev) in devices {
        let taken = free_before[&d].saturating_sub(dev.memory()?.0);
        let ranks: Vec<String> = plan
            .ranks
            .iter()
            .filter(|r| r.device == d)
            .map(|r| r.rank.to_string())
            .collect();
        let planned = plan
            .devices
            .iter()
            .find(|u| u.device == d)
            .map_or(0, |u| u.total_bytes);
        lines.push(format!(
            "device {d} ({}, {}): ranks {}: {:.1} MiB taken, plan {:.1} MiB",
            dev.name(),
            dev.arch(),
            ranks.join(", "),
            mib(taken as f64),
            mib(planned as f64)
        ));
    }
    Ok(lines)
}
