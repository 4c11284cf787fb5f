//! The CPU engine: every rank of a plan with its own state, joined by the wire, driven one
//! decode step at a time by the host. Two arms run the same rank programs:
//!
//! - serial: one thread steps the ranks in plan order, each until it finishes the step or
//!   would wait (a tensor-parallel collective waits for the group's later ranks);
//! - pipelined: one thread per rank, blocking on the wire; the host enqueues steps ahead and
//!   reads results back from the sampler rank's readback channel.
//!
//! Both give the same bits: the ranks' arithmetic does not depend on who runs it when.
//!
//! With a world of processes in the options (one process per device, `crate::dist`), the
//! engine runs only the ranks on this process's device; the wire reaches the others. The
//! serial arm then waits for a message from another process where the in-process engine
//! would call a round without progress a deadlock, and a process without the readback rank
//! returns each step's token, sent by the readback process, with no logits.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{Plan, Step};

use super::compute::RankCompute;
use super::kernels::Pool;
use super::rank::RankRunner;
use super::wire::{Remote, Wire};
use crate::dist::{ProcessMap, Routes};
use crate::engine::{
    rewinds, Arm, Decoder, EngineOptions, PromptMode, StepInput, StepLimits, StepOutput,
};
use crate::plan_load::LoadedPlan;
use crate::program::Binder;
use crate::synthetic::BlocksDrawn;
use crate::weights::RankWeights;

enum Ranks {
    Serial(Vec<RankRunner>),
    Pipelined {
        inputs: Vec<Sender<(u64, StepInput)>>,
        threads: Vec<JoinHandle<()>>,
    },
}

/// A plan loaded onto the CPU, ready to decode.
pub struct Engine {
    ranks: Ranks,
    wire: Arc<Wire>,
    outputs: Receiver<Result<StepOutput>>,
    next_step: u64,
    in_flight: u64,
    /// What a step may take (`StepInput::check`).
    limits: StepLimits,
    prompt_mode: PromptMode,
    failed: bool,
    rewinds: bool,
}

impl Engine {
    /// Loads every rank's shards of `loaded` and starts the engine.
    pub fn new(loaded: &LoadedPlan, options: EngineOptions) -> Result<Engine> {
        let plan = &loaded.plan;
        let readers = plan
            .ranks
            .iter()
            .filter(|r| r.program.iter().any(|s| matches!(s, Step::Readback { .. })))
            .count();
        if readers != 1 {
            bail!("the plan reads back from {readers} ranks; the cpu engine needs exactly one");
        }
        let binder = Arc::new(Binder::new(plan)?);
        let map = ProcessMap::of(plan);
        let (local, link) = match options.world {
            None => (plan.ranks.iter().map(|r| r.rank).collect(), None),
            Some(world) => {
                map.check(world.processes())?;
                let link = world.open(plan)?;
                (map.ranks(plan, world.process()), Some(link))
            }
        };
        let boundaries = plan.boundaries.iter().map(|b| (b.boundary, b.slots));
        let (out_tx, outputs) = channel();
        let wire = match link {
            None => Arc::new(Wire::new(boundaries)),
            Some(link) => {
                let routes = Routes::of(plan, &map, link.process());
                let outputs = out_tx.clone();
                Wire::connected(
                    boundaries,
                    Remote {
                        link,
                        routes,
                        outputs,
                    },
                )
            }
        };
        loaded.load_ranks(&local);
        let n = local.len();
        let shared_pool = Arc::new(Pool::new(options.threads.max(1)));
        let mut runners = Vec::with_capacity(n);
        for r in plan.ranks.iter().filter(|r| local.contains(&r.rank)) {
            let pool = match options.arm {
                Arm::Serial => shared_pool.clone(),
                Arm::Pipelined => Arc::new(Pool::new((options.threads / n).max(1))),
            };
            let weights = RankWeights::load(loaded, r, BlocksDrawn::OnHost)?;
            let compute = RankCompute::new(plan, r.rank, weights, pool, options.sampler)
                .map_err(|e| anyhow!("rank {}: {e:#}", r.rank))?
                .perturbed(options.perturb);
            runners.push(RankRunner::new(
                plan,
                r.rank,
                compute,
                binder.clone(),
                wire.clone(),
                options.reduce_order,
                out_tx.clone(),
            )?);
        }
        let ranks = match options.arm {
            Arm::Serial => Ranks::Serial(runners),
            Arm::Pipelined => spawn(runners, &wire, &out_tx)?,
        };
        Ok(Engine {
            ranks,
            wire,
            outputs,
            next_step: 0,
            in_flight: 0,
            limits: StepLimits::of(plan, prompt_mode(plan).rows()),
            prompt_mode: prompt_mode(plan),
            failed: false,
            rewinds: rewinds(plan),
        })
    }
}

impl Decoder for Engine {
    /// Enqueues one decode step; its result comes from `next_output`, in order.
    fn submit(&mut self, input: StepInput) -> Result<()> {
        input.check(self.failed, self.next_step, self.limits)?;
        let t = self.next_step;
        self.next_step += 1;
        self.in_flight += 1;
        let result = match &mut self.ranks {
            Ranks::Serial(runners) => run_serial(runners, &self.wire, t, &input),
            Ranks::Pipelined { inputs, .. } => inputs
                .iter()
                .try_for_each(|tx| tx.send((t, input.clone())))
                .map_err(|_| anyhow!("a rank thread has stopped")),
        };
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// The result of the oldest submitted step not yet returned.
    fn next_output(&mut self) -> Result<StepOutput> {
        if self.in_flight == 0 {
            bail!("no decode step is in flight");
        }
        let out = self
            .outputs
            .recv()
            .map_err(|_| anyhow!("every rank has stopped"))
            .and_then(|r| r);
        match out {
            Ok(out) => {
                self.in_flight -= 1;
                Ok(out)
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    /// Number of submitted steps whose results have not been taken.
    fn in_flight(&self) -> u64 {
        self.in_flight
    }

    fn prompt_mode(&self) -> PromptMode {
        self.prompt_mode
    }

    /// KDA layers keep a recurrent state, which cannot be cut back.
    fn rewinds(&self) -> bool {
        self.rewinds
    }
}

/// Prefill steps of the plan's `runtime.prefill_chunk` rows, for every layer kind.
fn prompt_mode(plan: &Plan) -> PromptMode {
    PromptMode::Chunks(plan.runtime.prefill_chunk.max(1))
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Ranks::Pipelined { inputs, threads } = &mut self.ranks {
            inputs.clear();
            self.wire.fail("the engine was shut down");
            for t in threads.drain(..) {
                // A rank thread reports its errors through the readback channel; a panic
                // has already been printed by the panic hook.
                let _ = t.join();
            }
        }
    }
}

/// Runs step `t` on every rank: each in plan order until it finishes or would wait, round
/// after round, until all finish. A round in which no rank moves is a deadlock of the plan,
/// unless ranks of other processes have yet to send what this process's ranks wait for.
fn run_serial(runners: &mut [RankRunner], wire: &Wire, t: u64, input: &StepInput) -> Result<()> {
    for r in runners.iter_mut() {
        r.begin(t, input.clone());
    }
    loop {
        let seen = wire.generation();
        let mut progressed = false;
        let mut all_done = true;
        for r in runners.iter_mut() {
            if !r.advance(false, &mut progressed)? {
                all_done = false;
            }
        }
        if all_done {
            return Ok(());
        }
        if !progressed && wire.is_remote() {
            wire.await_change(seen)?;
        } else if !progressed {
            let stuck: Vec<String> = runners
                .iter()
                .filter(|r| r.busy())
                .map(|r| r.rank().to_string())
                .collect();
            bail!(
                "step {t}: the plan deadlocks; ranks {} wait for each other",
                stuck.join(", ")
            );
        }
    }
}

fn spawn(
    runners: Vec<RankRunner>,
    wire: &Arc<Wire>,
    out: &Sender<Result<StepOutput>>,
) -> Result<Ranks> {
    let mut inputs = Vec::new();
    let mut threads = Vec::new();
    for mut runner in runners {
        let (tx, rx) = channel::<(u64, StepInput)>();
        let wire = wire.clone();
        let out = out.clone();
        let handle = std::thread::Builder::new()
            .name(format!("memra-rank-{}", runner.rank()))
            .spawn(move || {
                for (t, input) in rx {
                    runner.begin(t, input);
                    let mut progressed = false;
                    if let Err(e) = runner.advance(true, &mut progressed) {
                        wire.fail(&format!("{e:#}"));
                        let _ = out.send(Err(e));
                        return;
                    }
                }
            })
            .map_err(|e| anyhow!("cannot start a rank thread: {e}"))?;
        inputs.push(tx);
        threads.push(handle);
    }
    Ok(Ranks::Pipelined { inputs, threads })
}
