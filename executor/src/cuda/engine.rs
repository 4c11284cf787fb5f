//! The CUDA engine: every rank of a plan on its device, driven by one host thread that
//! enqueues each decode step's rank programs in plan order (the shared program walk over
//! `enqueue::CudaOps`), the members of a group in lockstep rounds, one per collective
//! (`walk_lockstep`), so every event wait binds to the record the compiler's verify pass
//! proved it binds to (`lockstep` tests it on every golden plan) and no member blocks the
//! host while a collective waits for a peer not yet enqueued. `setup` opens devices, groups
//! and events.
//!
//! - `run`: a CUDA graph per phase (step % the run's `phases`, the period of the boundary
//!   slots its work addresses, checked by `setup::check_phases`) and bucket of a decode
//!   step's rows (`buckets`): the first time a phase and bucket come up its ops run eagerly
//!   (warm-up), the second time they are captured on the rank's stream, from then on
//!   replayed. A capture or instantiate failure latches that run to eager with one message;
//!   the launches are the same, so the logits are too. Steps with prompt rows run eagerly.
//! - `island`: eager launches. `copy`: a device copy, or a peer copy between devices, on the
//!   receiver's stream. `wait`/`record`: one CUDA event per (event, slot) with the plan's slot
//!   rules. `readback`: logits and token into a pinned host ring of `runtime.in_flight` slots.
//! - Inputs: each rank's position, and a prompt step's token on the ranks that embed, go up
//!   through small pinned rings in stream order; a generated step's token never leaves the
//!   device (the sampler writes it, token boundaries carry it back to the embedding ranks).
//!
//! The host only waits on the readback ring: serially after every step, pipelined once the
//! plan's `in_flight` steps are enqueued.
//!
//! A plan of several sequence slots (`runtime.max_sequences`) runs every step as a batched
//! decode step (`batched`): the rows of all its spans through the decode kernels, every row
//! with the bits of the one-sequence decode; prompts are rows of those steps too (eager). A
//! step of generated tokens only is padded to its bucket and replayed from its graphs, which
//! the engine's `activity` line counts per bucket.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaEvent, DeviceSlice, PinnedHostSlice};
use memra_compiler::plan::{Boundary, Step};

use super::batched::check_batched;
use super::buckets::{Buckets, RunGraphs, Shape, Tally};
use super::device::CudaDevice;
use super::enqueue::{CudaOps, InputRing, ReadbackRing};
use super::graph::capture;
use super::lockstep::walk_sets;
use super::ops::{MAX_HEAD_DIM, MAX_TOP_K};
use super::p2p::{check_groups, Crossings};
use super::prefill::prefill_rows;
use super::rank::RankDevice;
use super::setup::{check_phases, connect_groups, make_events, memory_report, open_devices};
use crate::dist::{Link, ProcessMap, TokenInbox};
use crate::engine::{
    rewinds, Arm, Decoder, EngineOptions, PromptMode, Readback, StepInput, StepLimits, StepOutput,
};
use crate::plan_load::LoadedPlan;
use crate::program::{run_block, walk, Cursor, Entry, Lockstep, Program};
use crate::reduce::ReduceOrder;
use crate::synthetic::BlocksDrawn;
use crate::weights::RankWeights;

/// A plan loaded onto CUDA devices, ready to decode.
pub struct Engine {
    // graphs go before the buffers they reference (fields drop in order)
    runs: Vec<Vec<Option<RunGraphs>>>,
    ranks: Vec<RankDevice>,
    /// Shared so a step can walk them while the engine lends its state to the walk.
    programs: Arc<[Program]>,
    /// The local ranks (indices into `ranks`) in plan order, in the sets a step walks in
    /// lockstep (`walk_sets`).
    walk_sets: Arc<[Vec<usize>]>,
    boundaries: Vec<Boundary>,
    events: BTreeMap<String, Vec<CudaEvent>>,
    inputs: Vec<InputRing>,
    /// The readback ring, in the process holding the readback rank.
    readback: Option<ReadbackRing>,
    /// With a world: the engine's link and, without the readback rank, the tokens it sends.
    remote: Option<(Link, Option<Arc<TokenInbox>>)>,
    crossings: Crossings,
    /// Submitted steps not yet returned: (step, position, logit rows, what comes back of them).
    pending: VecDeque<(u64, u32, usize, Readback)>,
    /// How the engine takes prompts: chunks of token rows, or token by token and why.
    prompt: PromptMode,
    arm: Arm,
    next_step: u64,
    /// What a step may take (`StepInput::check`).
    limits: StepLimits,
    /// Steps that may be in flight: the plan's `runtime.in_flight`.
    ring: usize,
    /// The row counts decode steps are padded to, a graph of each run per phase and bucket.
    buckets: Buckets,
    /// The steps so far, per bucket, for `activity`.
    tally: Tally,
    /// Whether the caches can be cut back to any position (no KDA state): `Decoder::rewinds`.
    rewinds: bool,
    failed: bool,
    report: Vec<String>,
}

/// A ring's `count` pinned host buffers of `len` values each.
fn pinned<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    count: usize,
    len: usize,
) -> Result<Vec<PinnedHostSlice<T>>> {
    (0..count)
        .map(|_| {
            // SAFETY: the memory is written (by the host or a copy) before anything reads it
            unsafe { dev.context().alloc_pinned_with_flags::<T>(len, 0) }
                .map_err(|e| anyhow!("cuda backend: allocating pinned host memory: {e:?}"))
        })
        .collect()
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
        if options.perturb.is_some() {
            bail!("perturbed runs (compare --conditioning) are a check of the cpu backend's conditioning; the cuda backend does not take them");
        }
        let readers: Vec<u32> = plan
            .ranks
            .iter()
            .filter(|r| r.program.iter().any(|s| matches!(s, Step::Readback { .. })))
            .map(|r| r.rank)
            .collect();
        if readers.len() != 1 {
            bail!(
                "the plan reads back from {} ranks; the cuda engine needs exactly one",
                readers.len()
            );
        }
        check_phases(plan)?;
        let map = ProcessMap::of(plan);
        let (local, link) = match options.world {
            None => (plan.ranks.iter().map(|r| r.rank).collect(), None),
            Some(world) => {
                map.check(world.processes())?;
                check_groups(plan, &map)?;
                let link = world.open(plan)?;
                (map.ranks(plan, world.process()), Some(link))
            }
        };
        let sequences = plan.runtime.max_sequences.max(1);
        let prompt = if sequences > 1 {
            check_batched(plan).map_err(|e| anyhow!("{}: {e:#}", loaded.path.display()))?;
            PromptMode::Chunks(plan.runtime.prefill_chunk.max(1))
        } else {
            match prefill_rows(plan) {
                Ok(rows) => PromptMode::Chunks(rows),
                Err(why) => PromptMode::TokenByToken(why),
            }
        };
        let max_rows = prompt.rows() as usize;
        // a decode step has a row per sequence; a verify step the token and its drafts
        let verify = plan
            .speculative
            .as_ref()
            .map_or(0, |sp| (sp.tokens as usize + 1).min(max_rows));
        let buckets = Buckets::new(max_rows.min(sequences as usize), verify);
        let devices = open_devices(plan, &local)?;
        let free_before: BTreeMap<u32, usize> = devices
            .iter()
            .map(|(&d, dev)| Ok((d, dev.memory()?.0)))
            .collect::<Result<_>>()?;
        let mut ranks = Vec::new();
        // how long each rank's weights took to read (or draw) on the host, then to reach its
        // device: the two halves of a load, for `bench`
        let mut load_times = Vec::new();
        for r in plan.ranks.iter().filter(|r| local.contains(&r.rank)) {
            let started = Instant::now();
            let weights = RankWeights::load(loaded, r, BlocksDrawn::OnDevice)?;
            let read = started.elapsed();
            let dev = devices[&r.device].clone();
            ranks.push(
                RankDevice::new(plan, r.rank, dev, weights, s, max_rows)
                    .map_err(|e| anyhow!("rank {} on device {}: {e:#}", r.rank, r.device))?,
            );
            let gib = r.weights.iter().map(|w| w.bytes).sum::<u64>() as f64 / f64::from(1u32 << 30);
            let set_up = started.elapsed() - read;
            load_times.push(format!(
                "rank {} (device {}): {gib:.2} GiB of weights read on the host in {:.1} s, on the device in {:.1} s more ({:.2} GiB/s)",
                r.rank,
                r.device,
                read.as_secs_f64(),
                set_up.as_secs_f64(),
                gib / set_up.as_secs_f64().max(1e-9)
            ));
        }
        connect_groups(plan, &mut ranks, options.world.map(|w| (w, &map)))?;
        let crossings = match options.world {
            Some(world) => Crossings::connect(plan, &map, world, &ranks)?,
            None => Crossings::default(),
        };
        let events = make_events(plan, &ranks)?;
        let ring = plan.runtime.in_flight.max(1) as usize;
        let mut inputs = Vec::new();
        for rank in &ranks {
            let n = ring + 2;
            inputs.push(InputRing {
                pos: pinned(&rank.dev, n, max_rows)?,
                slots: pinned(&rank.dev, n, max_rows)?,
                token: pinned(&rank.dev, n, max_rows)?,
                done: (0..n)
                    .map(|_| rank.dev.new_event(false))
                    .collect::<Result<_>>()?,
            });
        }
        let readback = match ranks.iter().position(|r| r.rank == readers[0]) {
            Some(ri) => {
                let reader = &ranks[ri];
                let vocab = reader.logits(max_rows).len();
                Some(ReadbackRing {
                    rank: ri,
                    logits: pinned(&reader.dev, ring, vocab)?,
                    token: pinned(&reader.dev, ring, 1)?,
                    argmax_rows: reader.dev.alloc(&reader.work_stream(), max_rows)?,
                    argmax: pinned(&reader.dev, ring, max_rows)?,
                    done: (0..ring)
                        .map(|_| reader.dev.new_event(false))
                        .collect::<Result<_>>()?,
                })
            }
            None => None,
        };
        let remote = link.map(|link| {
            let inbox = readback.is_none().then(|| TokenInbox::attached(&link));
            (link, inbox)
        });
        let runs = plan
            .ranks
            .iter()
            .filter(|r| local.contains(&r.rank))
            .map(|r| {
                r.program
                    .iter()
                    .map(|step| match step {
                        Step::Run { phases, .. } => Some(RunGraphs::new(*phases, buckets.len())),
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
        let mut report = memory_report(plan, &devices, &free_before, prompt.rows())?;
        report.extend(load_times);
        Ok(Engine {
            rewinds: rewinds(plan),
            runs,
            programs: local.iter().map(|&r| Program::of(plan, r)).collect(),
            walk_sets: walk_sets(plan, &local).into(),
            boundaries: plan.boundaries.clone(),
            ranks,
            events,
            inputs,
            readback,
            remote,
            crossings,
            pending: VecDeque::new(),
            prompt,
            arm: options.arm,
            next_step: 0,
            limits: StepLimits::of(plan, prompt.rows()),
            ring,
            buckets,
            tally: Tally::default(),
            failed: false,
            report,
        })
    }

    /// The walk's view of rank `ri` for one step of `shape`.
    fn ops(&mut self, ri: usize, shape: &Shape) -> CudaOps<'_> {
        CudaOps {
            ri,
            ranks: &mut self.ranks,
            runs: &mut self.runs[ri],
            events: &self.events,
            boundaries: &self.boundaries,
            inputs: &mut self.inputs[ri],
            readback: self.readback.as_mut(),
            crossings: &self.crossings,
            inputs_sent: false,
            rows: shape.rows,
            bucket: shape.bucket,
        }
    }

    /// Enqueues step `t` of every local rank in plan order, the members of a group in lockstep
    /// (`walk_lockstep`; a replayed graph is one turn, so decode steps keep plan order).
    fn enqueue_step(&mut self, t: u64, input: &StepInput, shape: &Shape) -> Result<()> {
        let (programs, sets) = (self.programs.clone(), self.walk_sets.clone());
        for set in sets.iter() {
            if set.len() > 1 {
                self.walk_lockstep(set, t, input, shape)?;
                continue;
            }
            for &ri in set {
                let mut cursor = Cursor::default();
                walk(
                    &programs[ri],
                    &mut self.ops(ri, shape),
                    &mut cursor,
                    t,
                    input,
                    true,
                    &mut false,
                )
                .map_err(|e| anyhow!("rank {} step {t}: {e:#}", programs[ri].rank))?;
            }
        }
        Ok(())
    }

    /// Walks the group members `set` through step `t` in `Lockstep` rounds. One host thread
    /// enqueues every rank, and enqueueing may block that thread on a rank's own progress: a
    /// prefill step's MoE rows read the routed ids back, its row-by-row MLA and KDA mixers
    /// (and a long eager block) enqueue enough launches to fill the launch queue. Walked in
    /// plan order, the blocked member's stream sits in a collective waiting for peers the
    /// host has not enqueued yet, until the collective's timeout traps
    /// (CUDA_ERROR_LAUNCH_FAILED). The members' boundaries never bind a wait to a record of
    /// the same step (`walk_sets`), so the rounds bind every wait as plan order does.
    fn walk_lockstep(
        &mut self,
        set: &[usize],
        t: u64,
        input: &StepInput,
        shape: &Shape,
    ) -> Result<()> {
        let programs = self.programs.clone();
        let mut lock = Lockstep::new(set.len());
        // a member's inputs go up once, as its first block is entered
        let mut sent = vec![false; set.len()];
        while !lock.finished() {
            let mut progressed = false;
            for (j, &ri) in set.iter().enumerate() {
                if lock.done(j) {
                    continue;
                }
                let program = &programs[ri];
                let mut ops = self.ops(ri, shape);
                ops.inputs_sent = sent[j];
                lock.turn(j, program, &mut ops, t, input, &mut progressed)
                    .map_err(|e| anyhow!("rank {} step {t}: {e:#}", program.rank))?;
                sent[j] = ops.inputs_sent;
            }
            if !progressed {
                bail!("invariant: a lockstep round of step {t} enqueues something");
            }
        }
        Ok(())
    }

    /// Captures every run whose phase and bucket come up warmed but not yet captured at
    /// decode step `t` of `shape`, for all ranks, before any rank enqueues the step, and
    /// uploads the graphs with the device idle. Capturing inline would end a capture and
    /// instantiate while earlier ranks' replayed collectives spin for a member that the host
    /// has not enqueued yet; the driver may synchronize the device there, and the collectives
    /// would wait on the host forever.
    fn capture_due(&mut self, t: u64, input: &StepInput, shape: &Shape) -> Result<()> {
        // a run's graph holds a decode step's launches: a step with prompt rows captures
        // nothing
        let Some(bucket) = shape.bucket else {
            return Ok(());
        };
        let due: Vec<(usize, usize)> = (0..self.ranks.len())
            .flat_map(|ri| (0..self.programs[ri].entries.len()).map(move |i| (ri, i)))
            .filter(|&(ri, i)| {
                self.runs[ri][i]
                    .as_ref()
                    .is_some_and(|run| run.due(t, bucket))
            })
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        self.synchronize_all()?;
        let programs = self.programs.clone();
        for &(ri, i) in &due {
            let (stream_name, Entry::Block(block)) = &programs[ri].entries[i] else {
                unreachable!("invariant: only blocks have graphs");
            };
            let stream = self.ranks[ri].stream(stream_name)?.clone();
            let rank = self.ranks[ri].rank;
            let mut ops = self.ops(ri, shape);
            let graph = capture(&stream, || {
                run_block(&mut ops, stream_name, block, t, input)
            })
            .and_then(|g| g.upload().map(|()| g));
            let run = self.runs[ri][i]
                .as_mut()
                .expect("invariant: filtered above");
            match graph {
                Ok(g) => run.captured(t, bucket, g),
                Err(e) => {
                    eprintln!("cuda backend: rank {rank} run {}: {e}; running it eagerly from now on (logits are unchanged)", block.id);
                    run.latch();
                }
            }
        }
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
        let (step, pos, rows, readback) = self
            .pending
            .pop_front()
            .ok_or_else(|| anyhow!("no decode step is in flight"))?;
        let Some(rb) = &self.readback else {
            let inbox = self.remote.as_ref().and_then(|(_, inbox)| inbox.as_ref());
            let out = inbox
                .ok_or_else(|| anyhow!("invariant: a process without the readback has an inbox"))?
                .next()?;
            if (out.step, out.pos) != (step, pos) {
                bail!("the readback process sent step {} (position {}) where this process waits for step {step} (position {pos}); every process must run the same command", out.step, out.pos);
            }
            return Ok(out);
        };
        let slot = (step % rb.logits.len() as u64) as usize;
        let wait = |e| {
            anyhow!("cuda backend: step {step}: the device failed before its readback: {e:?} (a collective traps after 30 s without its peers)")
        };
        rb.done[slot].synchronize().map_err(wait)?;
        let (logits, argmax) = match readback {
            Readback::Logits => {
                let all = rb.logits[slot].as_slice().map_err(wait)?;
                let logits = all[..all.len() / self.prompt.rows() as usize * rows].to_vec();
                (logits, Vec::new())
            }
            Readback::Argmax => {
                let all = rb.argmax[slot].as_slice().map_err(wait)?;
                (Vec::new(), all[..rows].to_vec())
            }
        };
        let token = rb.token[slot].as_slice().map_err(wait)?[0];
        let out = StepOutput {
            step,
            pos,
            token,
            logits,
            argmax,
        };
        if let Some((link, _)) = &self.remote {
            crate::dist::broadcast(link, &out)?;
        }
        Ok(out)
    }
}

impl Decoder for Engine {
    fn submit(&mut self, input: StepInput) -> Result<()> {
        input.check(self.failed, self.next_step, self.limits)?;
        // the logits of `logit_rows` come back as the last rows' would: one sequence's rows
        // are one span, its logits from a row on; a batched step's head gathers its rows (a
        // padded decode step's: all of them, the pad rows' never come back)
        let shape = self.buckets.shape(&input);
        // several sequence slots: every step is batched; so is a step of decode's bits
        if self.limits.sequences > 1 || shape.rows.decode_bits {
            for rank in &mut self.ranks {
                rank.logit_rows.clone_from(&shape.logit_rows);
            }
        }
        if self.pending.len() >= self.ring {
            bail!(
                "{} steps are in flight, the plan's runtime.in_flight; take an output first",
                self.pending.len()
            );
        }
        let t = self.next_step;
        self.next_step += 1;
        self.tally.count(&shape);
        let mut result = self
            .capture_due(t, &input, &shape)
            .and_then(|()| self.enqueue_step(t, &input, &shape));
        self.pending
            .push_back((t, input.pos(), shape.rows.returned(), input.readback));
        if result.is_ok() && self.arm == Arm::Serial {
            if let Some(rb) = &self.readback {
                let slot = (t % rb.logits.len() as u64) as usize;
                result = rb.done[slot]
                    .synchronize()
                    .map_err(|e| anyhow!("cuda backend: step {t}: {e:?}"));
            }
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
        self.pending.len() as u64
    }

    fn prompt_mode(&self) -> PromptMode {
        self.prompt
    }

    fn rewinds(&self) -> bool {
        self.rewinds
    }

    fn report(&self) -> Vec<String> {
        self.report.clone()
    }

    fn activity(&self) -> Vec<String> {
        let runs = || self.runs.iter().flatten().flatten();
        let graphs = |bucket| runs().map(|run| run.graphs(bucket)).sum();
        let latched = runs().filter(|run| run.latched()).count();
        vec![self.tally.line(&self.buckets, graphs, latched)]
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.failed {
            // an error here leaves a send waiting; the streams' synchronize below reports it
            let _ = self.crossings.drain(&self.ranks, self.next_step);
        }
        for rank in &self.ranks {
            for s in rank.streams.values() {
                // a failed device reports its error where the step was taken; nothing to add
                let _ = s.synchronize();
            }
        }
    }
}
