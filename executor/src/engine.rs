//! The one interface every backend's engine offers the host: submit decode steps, take their
//! results in order. Sessions, the gate, perplexity and bench drive a `Decoder` and never know
//! which backend runs the plan; `open` picks the backend from the options.
//!
//! With a world of processes in the options, an engine runs only the ranks on its process's
//! device. Every process's host drives its engine with the same steps: the process holding
//! the readback rank gets the logits, the others each step's token (so their sessions take
//! the same stop decisions) and empty logits.

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

/// What the host feeds one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInput {
    /// Position of the token in the sequence (its KV-cache row).
    pub pos: u32,
    /// The token to embed (a prompt token), or `None` to embed the token sampled at the
    /// previous step.
    pub token: Option<u32>,
}

impl StepInput {
    /// Refuses a step an engine cannot take: after an earlier failure, at a position past the
    /// plan's `max_context`, or a first step without a prompt token.
    pub fn check(&self, failed: bool, next_step: u64, max_context: u32) -> Result<()> {
        if failed {
            bail!("the engine stopped after an earlier error");
        }
        if self.pos >= max_context {
            bail!(
                "position {} is beyond the plan's runtime.max_context {max_context}",
                self.pos
            );
        }
        if next_step == 0 && self.token.is_none() {
            bail!("the first decode step needs a prompt token");
        }
        Ok(())
    }
}

/// What one decode step gives back to the host.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Decode step number, counting from 0.
    pub step: u64,
    /// Position the step decoded.
    pub pos: u32,
    /// The token sampled from the logits.
    pub token: u32,
    /// Logits over the whole vocabulary; empty in a process without the readback rank.
    pub logits: Vec<f32>,
}

/// A plan loaded onto a backend, decoding one step per `submit`.
pub trait Decoder {
    /// Enqueues one decode step; its result comes from `next_output`, in order.
    fn submit(&mut self, input: StepInput) -> Result<()>;
    /// The result of the oldest submitted step not yet returned.
    fn next_output(&mut self) -> Result<StepOutput>;
    /// Number of submitted steps whose results have not been taken.
    fn in_flight(&self) -> u64;
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
    fn report(&self) -> Vec<String> {
        (**self).report()
    }
}
