//! The one interface every backend's engine offers the host: submit decode steps, take their
//! results in order. Sessions, the gate, perplexity and bench drive a `Decoder` and never know
//! which backend runs the plan; `open` picks the backend from the options.
//!
//! With a world of processes in the options, an engine runs only the ranks on its process's
//! device. Every process's host drives its engine with the same steps: the process holding
//! the readback rank gets the logits, the others each step's token (so their sessions take
//! the same stop decisions) and empty logits.

use std::sync::Arc;

use anyhow::{bail, Result};
use memra_compiler::plan::Plan;

use crate::dist::World;
use crate::plan_load::LoadedPlan;
use crate::reduce::ReduceOrder;
use crate::sample::SamplerConfig;

/// Which backend executes a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The CPU reference backend.
    #[default]
    Cpu,
    /// NVIDIA GPUs: each rank on the CUDA device its plan names.
    Cuda,
}

impl Backend {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// How the ranks are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arm {
    /// One step at a time: on the CPU one thread steps the ranks in plan order; on CUDA the
    /// host waits for each step's readback before it enqueues the next.
    #[default]
    Serial,
    /// Steps overlap: on the CPU one thread per rank; on CUDA the host enqueues up to the
    /// plan's `runtime.in_flight` steps ahead of the readback it consumed.
    Pipelined,
}

/// Settings of an engine.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    /// The backend.
    pub backend: Backend,
    /// Kernel threads in total (CPU backend).
    pub threads: usize,
    /// Serial or pipelined.
    pub arm: Arm,
    /// How the sampler rank picks tokens.
    pub sampler: SamplerConfig,
    /// The all-reduce's combine order; only tests change it.
    pub reduce_order: ReduceOrder,
    /// The processes that run the plan together, one per device; `None`: this process runs
    /// every rank. A process joins one world for its whole life, hence `'static`.
    pub world: Option<&'static World>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            backend: Backend::Cpu,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            arm: Arm::Serial,
            sampler: SamplerConfig::GREEDY,
            reduce_order: ReduceOrder::Tree,
            world: None,
        }
    }
}

impl EngineOptions {
    /// Whether this process holds `plan`'s readback rank: it has the logits and prints the
    /// command's output. Always true without a world.
    pub fn holds_readback(&self, plan: &Plan) -> bool {
        self.world.is_none_or(|w| w.holds_readback(plan))
    }
}

/// What the host feeds one step: a decode step (one row) or a prefill step (a prompt chunk of
/// up to the plan's `runtime.prefill_chunk` rows of one sequence, at consecutive positions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInput {
    /// Position of the step's first row (its KV-cache row); row `i` sits at `pos + i`.
    pub pos: u32,
    /// The prompt tokens to embed, one per row; empty: one row that embeds the token sampled
    /// at the previous step.
    pub tokens: Arc<[u32]>,
    /// The first row whose logits come back (the last row's always do).
    pub logits_from: u32,
}

impl StepInput {
    /// A step that embeds the token sampled at the previous step.
    pub fn sampled(pos: u32) -> StepInput {
        StepInput {
            pos,
            tokens: Arc::from(Vec::new()),
            logits_from: 0,
        }
    }

    /// A step of prompt `tokens` from `pos` on, returning the logits of rows `logits_from..`.
    pub fn prompt(pos: u32, tokens: &[u32], logits_from: u32) -> StepInput {
        StepInput {
            pos,
            tokens: Arc::from(tokens),
            logits_from,
        }
    }

    /// Rows of the step.
    pub fn rows(&self) -> u32 {
        (self.tokens.len() as u32).max(1)
    }

    /// The prompt token of a one-row step; `None` when it embeds the sampled token.
    pub fn token(&self) -> Option<u32> {
        self.tokens.first().copied()
    }

    /// Refuses a step an engine cannot take: after an earlier failure, more rows than the
    /// engine takes at once, a row past the plan's `max_context`, logits from a row the step
    /// does not have, or a first step without a prompt token.
    pub fn check(
        &self,
        failed: bool,
        next_step: u64,
        max_context: u32,
        max_rows: u32,
    ) -> Result<()> {
        if failed {
            bail!("the engine stopped after an earlier error");
        }
        if self.rows() > max_rows {
            bail!(
                "a step of {} rows; this engine takes at most {max_rows} per step",
                self.rows()
            );
        }
        let last = u64::from(self.pos) + u64::from(self.rows()) - 1;
        if last >= u64::from(max_context) {
            bail!("position {last} is beyond the plan's runtime.max_context {max_context}");
        }
        if self.logits_from >= self.rows() {
            bail!(
                "logits from row {} of a step of {} rows",
                self.logits_from,
                self.rows()
            );
        }
        if next_step == 0 && self.tokens.is_empty() {
            bail!("the first decode step needs a prompt token");
        }
        Ok(())
    }
}

/// What one step gives back to the host.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Step number, counting from 0.
    pub step: u64,
    /// Position of the step's first row.
    pub pos: u32,
    /// The token sampled from the last row's logits.
    pub token: u32,
    /// Logits over the whole vocabulary of rows `logits_from..` of the step, one row after
    /// another; empty in a process without the readback rank.
    pub logits: Vec<f32>,
}

/// How an engine takes a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptMode {
    /// Prefill steps of up to this many rows.
    Chunks(u32),
    /// One row per step, and why.
    TokenByToken(&'static str),
}

impl PromptMode {
    /// Most rows of one step.
    pub fn rows(self) -> u32 {
        match self {
            PromptMode::Chunks(rows) => rows,
            PromptMode::TokenByToken(_) => 1,
        }
    }
}

/// A plan loaded onto a backend, decoding one step per `submit`.
pub trait Decoder {
    /// Enqueues one decode step; its result comes from `next_output`, in order.
    fn submit(&mut self, input: StepInput) -> Result<()>;
    /// The result of the oldest submitted step not yet returned.
    fn next_output(&mut self) -> Result<StepOutput>;
    /// Number of submitted steps whose results have not been taken.
    fn in_flight(&self) -> u64;
    /// How the engine takes a prompt.
    fn prompt_mode(&self) -> PromptMode;
    /// Lines describing where the engine runs (devices, memory), for `bench`.
    fn report(&self) -> Vec<String> {
        Vec::new()
    }
    /// Submits one step and waits for its result (nothing else may be in flight).
    fn step(&mut self, input: StepInput) -> Result<StepOutput> {
        self.submit(input)?;
        self.next_output()
    }
}

/// Loads `loaded` onto the backend `options` names.
pub fn open(loaded: &LoadedPlan, options: EngineOptions) -> Result<Box<dyn Decoder>> {
    Ok(match options.backend {
        Backend::Cpu => Box::new(crate::cpu::Engine::new(loaded, options)?),
        Backend::Cuda => Box::new(crate::cuda::Engine::new(loaded, options)?),
    })
}

impl<D: Decoder + ?Sized> Decoder for Box<D> {
    fn submit(&mut self, input: StepInput) -> Result<()> {
        (**self).submit(input)
    }
    fn next_output(&mut self) -> Result<StepOutput> {
        (**self).next_output()
    }
    fn in_flight(&self) -> u64 {
        (**self).in_flight()
    }
    fn prompt_mode(&self) -> PromptMode {
        (**self).prompt_mode()
    }
    fn report(&self) -> Vec<String> {
        (**self).report()
    }
}
