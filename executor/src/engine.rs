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
use memra_compiler::plan::{Carries, Plan};

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

impl Arm {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Serial => "serial",
            Arm::Pipelined => "pipelined",
        }
    }
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
    /// CPU backend only, for `compare --conditioning`: every layer's mixer input multiplied
    /// by `1 + r u`, `u` in [-1, 1) seeded by the row's position, the layer and the element,
    /// so a step whose logits move past a tolerance under noise of rounding size is known to
    /// be ill-conditioned. The CUDA backend refuses it.
    pub perturb: Option<f32>,
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
            perturb: None,
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

/// One sequence's rows in a step: consecutive positions of the sequence in KV slot `slot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The sequence's slot: its region of every KV cache and recurrent state, below the
    /// plan's `runtime.max_sequences`.
    pub slot: u32,
    /// Position of the span's first row (its KV-cache row); row `i` sits at `pos + i`. A span
    /// at position 0 starts a new sequence in its slot.
    pub pos: u32,
    /// The tokens to embed, one per row; empty: one row that embeds the token sampled at the
    /// previous step (only in a step of this one span).
    pub tokens: Vec<u32>,
    /// The first row of the span whose logits come back (the last row's always do).
    pub logits_from: u32,
}

impl Span {
    /// Rows of the span.
    pub fn rows(&self) -> u32 {
        (self.tokens.len() as u32).max(1)
    }
}

/// What the host feeds one step: the spans of the sequences it advances, their rows one
/// after another. A decode step of one sequence is one span of one row, a prefill step one
/// span of a prompt chunk (up to the plan's `runtime.prefill_chunk` rows), a batched step one
/// span per sequence (a generated token, or a prompt chunk of a joining sequence). Every row
/// is computed as it would be alone, so a sequence's logits do not depend on its company.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInput {
    /// The spans, in row order; at least one.
    pub spans: Arc<[Span]>,
    /// What comes back of the logit rows.
    pub readback: Readback,
    /// Whether every row must have the bits of a one-row decode step at its position: a
    /// speculative verify step, whose accepted rows stand for decode steps. An engine whose
    /// prompt rows have those bits anyway (the CPU's) takes it as any step; the cuda engine
    /// runs it through its batched decode kernels instead of the prefill GEMMs.
    pub decode_bits: bool,
}

/// What a step brings back to the host of its logit rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Readback {
    /// Their logits.
    #[default]
    Logits,
    /// Only each row's argmax (the first index of its largest logit), or `sample::NOT_FINITE`
    /// for a row holding a NaN or an infinite logit: a batch of greedy sequences, whose logits
    /// stay where the engine computed them.
    Argmax,
}

impl StepInput {
    /// A step of sequence slot 0 that embeds the token sampled at the previous step.
    pub fn sampled(pos: u32) -> StepInput {
        StepInput::of(vec![Span {
            slot: 0,
            pos,
            tokens: Vec::new(),
            logits_from: 0,
        }])
    }

    /// A step of prompt `tokens` of sequence slot 0 from `pos` on, returning the logits of
    /// rows `logits_from..`.
    pub fn prompt(pos: u32, tokens: &[u32], logits_from: u32) -> StepInput {
        StepInput::of(vec![Span {
            slot: 0,
            pos,
            tokens: tokens.to_vec(),
            logits_from,
        }])
    }

    /// A step of `spans`.
    pub fn of(spans: Vec<Span>) -> StepInput {
        StepInput {
            spans: Arc::from(spans),
            readback: Readback::Logits,
            decode_bits: false,
        }
    }

    /// A speculative verify step of sequence slot 0: `tokens` (the last emitted token, then
    /// the drafts) from `pos` on, every row's logits with the bits of a decode step of its
    /// own (`decode_bits`).
    pub fn verify(pos: u32, tokens: &[u32]) -> StepInput {
        StepInput {
            decode_bits: true,
            ..StepInput::prompt(pos, tokens, 0)
        }
    }

    /// The same step, bringing back `readback` of its logit rows.
    pub fn reading(self, readback: Readback) -> StepInput {
        StepInput { readback, ..self }
    }

    /// Position of the step's first row.
    pub fn pos(&self) -> u32 {
        self.spans.first().map_or(0, |s| s.pos)
    }

    /// Rows of the step.
    pub fn rows(&self) -> u32 {
        self.spans.iter().map(Span::rows).sum()
    }

    /// The prompt token of a one-row step; `None` when it embeds the sampled token.
    pub fn token(&self) -> Option<u32> {
        self.spans.first().and_then(|s| s.tokens.first().copied())
    }

    /// Whether the step embeds the token sampled at the previous step.
    pub fn embeds_sampled(&self) -> bool {
        self.spans.iter().any(|s| s.tokens.is_empty())
    }

    /// The tokens of every span, in row order (none for a step that embeds the sampled token).
    pub fn tokens(&self) -> Vec<u32> {
        self.spans
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect()
    }

    /// (slot, position) of every row, in row order.
    pub fn rows_at(&self) -> impl Iterator<Item = RowAt> + '_ {
        self.spans.iter().flat_map(|s| {
            (0..s.rows()).map(move |i| RowAt {
                slot: s.slot as usize,
                pos: (s.pos + i) as usize,
            })
        })
    }

    /// The rows of the step whose logits come back, in row order: each span's rows from its
    /// `logits_from` on.
    pub fn logit_rows(&self) -> Vec<usize> {
        let mut rows = Vec::new();
        let mut first = 0usize;
        for s in self.spans.iter() {
            let n = s.rows() as usize;
            rows.extend(first + s.logits_from as usize..first + n);
            first += n;
        }
        rows
    }

    /// Refuses a step an engine cannot take: after an earlier failure, no spans, more rows
    /// than the engine takes at once, a slot outside the plan's `runtime.max_sequences` or
    /// twice in one step, a row past the plan's `max_context`, logits from a row a span does
    /// not have, a row that embeds the sampled token beside other rows, a first step without
    /// a prompt token, or a step that embeds the sampled token where it comes back late.
    pub fn check(&self, failed: bool, next_step: u64, limits: StepLimits) -> Result<()> {
        if failed {
            bail!("the engine stopped after an earlier error");
        }
        if self.spans.is_empty() {
            bail!("a step of no rows; at least one span is needed");
        }
        if self.rows() > limits.max_rows {
            bail!(
                "a step of {} rows; this engine takes at most {} per step",
                self.rows(),
                limits.max_rows
            );
        }
        for (i, s) in self.spans.iter().enumerate() {
            if s.slot >= limits.sequences {
                bail!(
                    "sequence slot {} is not below the plan's runtime.max_sequences {}",
                    s.slot,
                    limits.sequences
                );
            }
            if self.spans[..i].iter().any(|e| e.slot == s.slot) {
                bail!("sequence slot {} has two spans in one step", s.slot);
            }
            let last = u64::from(s.pos) + u64::from(s.rows()) - 1;
            if last >= u64::from(limits.max_context) {
                bail!(
                    "position {last} is beyond the plan's runtime.max_context {}",
                    limits.max_context
                );
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t >= limits.vocab) {
                bail!(
                    "token {bad} is outside the vocabulary of {} tokens",
                    limits.vocab
                );
            }
            if s.logits_from >= s.rows() {
                bail!(
                    "logits from row {} of a span of {} rows",
                    s.logits_from,
                    s.rows()
                );
            }
        }
        if self.embeds_sampled() && self.spans.len() > 1 {
            bail!("a row that embeds the sampled token must be alone in its step");
        }
        if next_step == 0 && self.embeds_sampled() {
            bail!("the first decode step needs a prompt token");
        }
        if self.embeds_sampled() && !limits.feeds_sampled {
            bail!(
                "a step that embeds the sampled token on a plan whose token crosses stages {} steps later (runtime.max_sequences); feed every row its token",
                limits.sequences
            );
        }
        Ok(())
    }
}

/// Where a row of a step sits: its sequence's slot and its position there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowAt {
    /// The sequence slot.
    pub slot: usize,
    /// The position in the slot's caches.
    pub pos: usize,
}

/// What one engine takes per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// The plan's `runtime.max_context`.
    pub max_context: u32,
    /// Most rows of one step.
    pub max_rows: u32,
    /// Sequence slots: the plan's `runtime.max_sequences`.
    pub sequences: u32,
    /// Whether a step may embed the token sampled at the previous step (`feeds_sampled`).
    pub feeds_sampled: bool,
    /// Tokens of the model's vocabulary (the plan's `model.vocab`): a token id past it is
    /// refused before any rank embeds it.
    pub vocab: u32,
}

impl StepLimits {
    /// What an engine of `plan` taking at most `max_rows` rows per step takes.
    pub fn of(plan: &Plan, max_rows: u32) -> StepLimits {
        StepLimits {
            max_context: plan.runtime.max_context,
            max_rows,
            sequences: plan.runtime.max_sequences.max(1),
            feeds_sampled: feeds_sampled(plan),
            vocab: plan.model.vocab,
        }
    }
}

/// Whether a sequence's state on `plan` can be cut back to any earlier position
/// (`Decoder::rewinds`): a KV cache can, a KDA recurrent state cannot.
pub fn rewinds(plan: &Plan) -> bool {
    plan.model.kda.is_none()
}

/// Whether a step of `plan` may embed the token sampled at the previous step: not where the
/// token crosses stages with a lag of several steps (`runtime.max_sequences` > 1).
pub fn feeds_sampled(plan: &Plan) -> bool {
    plan.boundaries
        .iter()
        .all(|b| b.carries != Carries::Token || b.lag == 1)
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
    /// Logits over the whole vocabulary of the step's `logit_rows`, one row after another;
    /// empty in a process without the readback rank, and with `Readback::Argmax`.
    pub logits: Vec<f32>,
    /// With `Readback::Argmax`: each logit row's argmax (or `sample::NOT_FINITE`), in row
    /// order; else empty.
    pub argmax: Vec<u32>,
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
    /// Whether the state a sequence leaves can be cut back to any earlier position (a KV
    /// cache can, a recurrent state cannot): whether a new sequence may reuse a cached
    /// prefix shorter than what the cache holds.
    fn rewinds(&self) -> bool {
        true
    }
    /// Lines describing where the engine runs (devices, memory), for `bench`.
    fn report(&self) -> Vec<String> {
        Vec::new()
    }
    /// Lines on how the engine ran its steps so far (on CUDA: decode steps, pad rows and
    /// graphs captured per bucket), for `bench --batch` and `gate --batch` after their runs.
    fn activity(&self) -> Vec<String> {
        Vec::new()
    }
    /// Submits one step and waits for its result (nothing else may be in flight).
    fn step(&mut self, input: StepInput) -> Result<StepOutput> {
        self.submit(input)?;
        self.next_output()
    }
}

/// Loads `loaded` onto the backend `options` names. Both backends decode several sequences
/// together; the cuda backend refuses a plan of several sequence slots it cannot batch, and
/// a speculative plan whose verify step it cannot run on its batched decode kernels.
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
    fn rewinds(&self) -> bool {
        (**self).rewinds()
    }
    fn report(&self) -> Vec<String> {
        (**self).report()
    }
    fn activity(&self) -> Vec<String> {
        (**self).activity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(slot: u32, pos: u32, tokens: &[u32]) -> Span {
        Span {
            slot,
            pos,
            tokens: tokens.to_vec(),
            logits_from: tokens.len().max(1) as u32 - 1,
        }
    }

    const LIMITS: StepLimits = StepLimits {
        max_context: 64,
        max_rows: 8,
        sequences: 4,
        feeds_sampled: true,
        vocab: 256,
    };

    #[test]
    fn a_batched_step_lists_its_rows_and_logit_rows_span_after_span() {
        let step = StepInput::of(vec![span(2, 10, &[7]), span(0, 0, &[1, 2, 3])]);
        step.check(false, 5, LIMITS).unwrap();
        assert_eq!(step.rows(), 4);
        let at: Vec<(usize, usize)> = step.rows_at().map(|r| (r.slot, r.pos)).collect();
        assert_eq!(at, [(2, 10), (0, 0), (0, 1), (0, 2)]);
        assert_eq!(step.logit_rows(), [0, 3]);
        assert_eq!(step.tokens(), [7, 1, 2, 3]);
    }

    #[test]
    fn steps_an_engine_cannot_take_are_refused_by_name() {
        let refusal = |spans: Vec<Span>| {
            format!(
                "{:#}",
                StepInput::of(spans).check(false, 1, LIMITS).unwrap_err()
            )
        };
        assert_eq!(
            refusal(vec![span(4, 0, &[1])]),
            "sequence slot 4 is not below the plan's runtime.max_sequences 4"
        );
        assert_eq!(
            refusal(vec![span(1, 0, &[1]), span(1, 1, &[2])]),
            "sequence slot 1 has two spans in one step"
        );
        assert_eq!(
            refusal(vec![span(0, 3, &[]), span(1, 0, &[2])]),
            "a row that embeds the sampled token must be alone in its step"
        );
        assert_eq!(
            refusal(vec![span(0, 0, &[1; 5]), span(1, 0, &[2; 4])]),
            "a step of 9 rows; this engine takes at most 8 per step"
        );
        assert_eq!(
            refusal(vec![span(3, 63, &[1, 2])]),
            "position 64 is beyond the plan's runtime.max_context 64"
        );
        assert_eq!(
            refusal(Vec::new()),
            "a step of no rows; at least one span is needed"
        );
        assert_eq!(
            refusal(vec![span(0, 0, &[1, 255]), span(1, 0, &[7, 256])]),
            "token 256 is outside the vocabulary of 256 tokens"
        );
    }
}
