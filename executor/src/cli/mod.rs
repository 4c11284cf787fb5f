//! The `memra-run` command line: argument definitions, shared setup (plan, model, engine,
//! tokenizer) and dispatch to the subcommands in `text` (generate, chat), `tools`
//! (perplexity, gate, compare, bench), `batched` (bench --batch), `launch` (one process per
//! device) and `serve` (the HTTP server).
//!
//! A subcommand given `--process P --processes W --rendezvous ADDR` joins the world of W
//! processes first and runs the ranks of its device; only the process holding the plan's
//! readback rank prints the command's output. It ends by waiting for every process to
//! finish, or, when its command fails, by telling the others why.

mod batched;
mod launch;
mod serve;
mod speculation;
mod text;
mod tools;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use memra_compiler::passes::verify::launched_overflows;
use memra_compiler::plan::Plan;
use memra_gguf::output::escaped_lines;

use crate::cpu::ReduceOrder;
use crate::dist::{ProcessMap, World, PEER_FAILED};
use crate::engine::{open, Arm, Backend, Decoder, EngineOptions, PromptMode};
use crate::plan_load::{load, load_synthetic, LoadedPlan};
use crate::sample::{Sampler, SamplerConfig};
use crate::session::Session;
use crate::speculate::Drafts;
use crate::text::Tokenizer;

/// Run memra execution plans: generate text, chat, measure perplexity and speed, and check
/// that a plan's logits are bit-identical to the 1-rank plan's.
#[derive(Parser)]
#[command(name = "memra-run", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Continue a prompt, streaming the text to stdout; stops at end of generation or -n.
    Generate {
        /// The execution plan (e.g. plans/smollm2.plan.toml).
        plan: PathBuf,
        /// Text to continue.
        #[arg(short, long)]
        prompt: String,
        /// Most tokens to generate.
        #[arg(short = 'n', long, default_value_t = 128)]
        n_predict: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Chat with the model through its chat template: one turn with --prompt, or turns read
    /// from stdin, one line per user message (an empty line or end of input quits).
    Chat {
        /// The execution plan.
        plan: PathBuf,
        /// A single user message; without it, chat interactively.
        #[arg(short, long, value_parser = message)]
        prompt: Option<String>,
        /// A system message to start the conversation with.
        #[arg(long)]
        system: Option<String>,
        /// Most tokens per reply.
        #[arg(short = 'n', long, default_value_t = 512)]
        n_predict: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Perplexity of a text file, computed as llama-perplexity does (chunks of --ctx tokens,
    /// the second half of each chunk scored).
    Perplexity {
        /// The execution plan.
        plan: PathBuf,
        /// The text file.
        file: PathBuf,
        /// Tokens per chunk (at least 4, at most the plan's runtime.max_context).
        #[arg(long, default_value_t = 512, value_parser = at_least::<4>)]
        ctx: usize,
        /// Score at most this many chunks.
        #[arg(long, value_parser = at_least::<1>)]
        chunks: Option<usize>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Decode a prompt plus -n greedy tokens with the plan (serial and pipelined arms) and the
    /// reference plan (the 1-rank plan, or for a model larger than one device a pipeline of
    /// whole layers); fail on the first logit whose bits differ. With --batch: decode
    /// sequences together with the plan and each alone with the reference instead.
    Gate {
        /// The execution plan to check.
        plan: PathBuf,
        /// The 1-rank plan of the same model, or a plan of pipeline stages without tensor- or
        /// expert-parallel groups (each layer whole on one rank, so the same bits).
        #[arg(long)]
        reference: PathBuf,
        /// Prompt text.
        #[arg(short, long, default_value = "The capital of France is")]
        prompt: String,
        /// The prompt as comma-separated token ids instead of text (no tokenizer needed, as
        /// with --weights synthetic).
        #[arg(
            long,
            value_name = "IDS",
            value_delimiter = ',',
            conflicts_with = "prompt"
        )]
        tokens: Option<Vec<u32>>,
        /// Tokens to generate after the prompt.
        #[arg(short = 'n', long, default_value_t = 16)]
        n_predict: usize,
        /// Decode the plan this many times against the one reference run (a soak test);
        /// every mismatch is counted and the first of each run printed.
        #[arg(long, default_value_t = 1, value_parser = at_least::<1>)]
        repeat: usize,
        /// Continuous batching: the plan (several sequence slots) decodes two more sequences
        /// than its slots together (prompts of 1 to 7 tokens, joining at different steps,
        /// leaving early, one reusing a cached prefix), the reference each alone; every
        /// generated token's logits must be bit-identical (the prompt options do not apply).
        #[arg(long, conflicts_with_all = ["tokens", "repeat"])]
        batch: bool,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Decode a prompt plus -n greedy tokens with the plan on --backend and on the CPU
    /// reference; report whether the tokens agree and the largest relative logit error
    /// (max |a - b| over max |b| of the step); fail above --tolerance.
    Compare {
        /// The execution plan.
        plan: PathBuf,
        /// Prompt text.
        #[arg(short, long, default_value = "The capital of France is")]
        prompt: String,
        /// Tokens to generate after the prompt.
        #[arg(short = 'n', long, default_value_t = 64)]
        n_predict: usize,
        /// Largest relative logit error accepted.
        #[arg(long, default_value_t = 1e-3, value_parser = non_negative)]
        tolerance: f64,
        /// Feed the CPU's tokens to both backends (the CPU's greedy run is the reference
        /// sequence), so every step's logits are compared on the same history even where the
        /// two backends would pick different tokens; tokens then need not agree.
        #[arg(long)]
        teacher_forced: bool,
        /// Print every compared step's relative logit error before the summary: a lone step
        /// far above its neighbours is a discrete flip (e.g. an MoE top-k near-tie), not drift.
        #[arg(long)]
        per_step: bool,
        /// With --teacher-forced: run the CPU reference again with every layer's input
        /// multiplied by 1 + R u (u uniform in [-1, 1)); a step whose logits move past the
        /// tolerance under that noise is ill-conditioned (e.g. an MoE top-k near-tie), and
        /// its error is reported apart, not judged. 1e-6 is about f32 rounding.
        #[arg(long, value_name = "R", value_parser = positive)]
        conditioning: Option<f32>,
        /// Judge this quantile (nearest rank) of the compared steps' errors against
        /// --tolerance instead of the largest (ill-conditioned steps set apart as before): a
        /// bound on most steps where rare discrete flips are expected (prefill's f16
        /// activations at MoE or DSA near-ties). 1 judges the largest.
        #[arg(long, value_name = "Q", default_value_t = 1.0, value_parser = quantile)]
        quantile: f64,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Run a subcommand as one process per device of the plan (this host's devices), e.g.
    /// `memra-run launch PLAN -- gate --reference REF`; each process runs
    /// `memra-run SUBCOMMAND PLAN ARGS --process P --processes W --rendezvous ADDR`. Under a
    /// site's launcher (srun, mpirun, torchrun: their rank and world size in the environment)
    /// it runs the subcommand as that one process instead.
    Launch {
        /// The execution plan; the subcommand gets it as its first argument.
        plan: PathBuf,
        /// Run as process P (over the launcher's rank).
        #[arg(long, value_name = "P")]
        process: Option<u32>,
        /// The number of processes (over the launcher's world size).
        #[arg(long, value_name = "W")]
        processes: Option<u32>,
        /// HOST:PORT where process 0 listens (over MASTER_ADDR, MASTER_PORT and SLURM's node
        /// list).
        #[arg(long, value_name = "HOST:PORT", conflicts_with = "port")]
        rendezvous: Option<String>,
        /// The rendezvous port, the host coming from the launcher (over MASTER_PORT and the
        /// default 29500).
        #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
        port: Option<u16>,
        /// The subcommand and its arguments without the plan, after `--`.
        #[arg(last = true, required = true, value_name = "SUBCOMMAND [ARGS]")]
        command: Vec<String>,
    },
    /// Serve the plan over HTTP with the OpenAI API: /v1/completions, /v1/chat/completions
    /// (streamed or not), /v1/models, /health and /metrics; up to runtime.max_sequences
    /// sequences decode together.
    Serve {
        /// The execution plan.
        plan: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on; 0 picks a free one (the address is printed).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Most requests waiting for a sequence slot; past it a request gets a 503 with
        /// Retry-After.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        max_queue: u64,
        /// Seconds the requests decoding at SIGINT or SIGTERM may go on before they end with
        /// finish_reason length; a second signal exits at once.
        #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = grace)]
        shutdown_grace: f64,
        /// Every /v1/ request must send `Authorization: Bearer KEY` (401 without it);
        /// /health and /metrics stay open.
        #[arg(long, value_name = "KEY", value_parser = api_key)]
        api_key: Option<String>,
        /// As --api-key, the key read from the file PATH (its one line), so that it does not
        /// show in the process list.
        #[arg(long, value_name = "PATH", conflicts_with = "api_key")]
        api_key_file: Option<PathBuf>,
        /// Web origins (e.g. https://app.example) whose pages may call the server,
        /// comma-separated; `*` allows every origin. Default: none (a browser request that
        /// carries an Origin header is refused).
        #[arg(long, value_name = "ORIGINS", value_delimiter = ',')]
        allowed_origins: Vec<String>,
        /// Seconds a connection may go without progress while none of its requests is in
        /// flight (idle keep-alive, a stalled header), a write may stall, and a body may take
        /// to come whole (llama-server's --timeout).
        #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout: u64,
        /// Most connections open at once; past it a new connection gets a 503 and is closed.
        #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        max_connections: u64,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Speed: a --prompt of N tokens (prefill tok/s and time to first token, like
    /// `llama-bench -p N`), then -n decoded tokens (decode tok/s), --reps times after a warm-up.
    Bench {
        /// The execution plan.
        plan: PathBuf,
        /// Prompt tokens per repetition (0: a one-token prompt, decode speed only).
        #[arg(long, default_value_t = 0)]
        prompt: usize,
        /// Tokens generated per repetition (at least 2: decode speed is timed from the first).
        #[arg(short = 'n', long, default_value_t = 128, value_parser = at_least::<2>)]
        n_predict: usize,
        /// Timed repetitions.
        #[arg(long, default_value_t = 3, value_parser = at_least::<1>)]
        reps: usize,
        /// Decode B sequences together (at most the plan's runtime.max_sequences), each a
        /// --prompt then -n tokens: aggregate tok/s and each sequence's ms per token.
        #[arg(long, value_name = "B", value_parser = at_least::<1>)]
        batch: Option<usize>,
        /// Print one JSON object instead of the line (and one more for a speculative plan).
        #[arg(long)]
        json: bool,
        /// The prompt: this text file's tokens (instead of --prompt N synthetic ones).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "batch"])]
        text: Option<PathBuf>,
        /// On a plan with [speculative]: draft the plain runs' own greedy continuation, at
        /// most N tokens a step (acceptance 100%), to measure the verify step's cost.
        #[arg(long, value_name = "N", value_parser = at_least::<1>, conflicts_with = "batch")]
        draft_replay: Option<usize>,
        #[command(flatten)]
        run: RunArgs,
    },
}

/// Which backend executes the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The CPU reference backend.
    Cpu,
    /// NVIDIA GPUs.
    Cuda,
}

/// How ranks are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ArmArg {
    /// One thread steps the ranks in plan order.
    Serial,
    /// One thread per rank, connected by the plan's boundaries.
    Pipelined,
}

/// Where the weights come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WeightsArg {
    /// The plan's GGUF file (or --model).
    File,
    /// Seeded pseudo-random values of each shard's dtype and shape, drawn from the plan
    /// alone: no model file, so plans compiled from a config.json run; no tokenizer either.
    Synthetic,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Use this GGUF instead of the model the plan names; its fingerprint must match.
    #[arg(long)]
    model: Option<PathBuf>,
    /// file: read the model's tensors; synthetic: fill every shard with seeded values of the
    /// dtype and shape the plan lists (the same values for a tensor in every plan of a
    /// model, whatever the sharding), without opening a model file. Text commands need the
    /// file's tokenizer; bench and gate --tokens run without one.
    #[arg(long, value_enum, default_value = "file")]
    weights: WeightsArg,
    /// Kernel threads in total, 1..=1024 [default: all cores].
    #[arg(short, long, value_parser = threads)]
    threads: Option<usize>,
    /// Backend to run on.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendArg,
    /// Serial (one step at a time) or pipelined (cpu: one thread per rank; cuda: up to the
    /// plan's runtime.in_flight steps enqueued ahead).
    #[arg(long, value_enum, default_value = "pipelined")]
    arm: ArmArg,
    /// This process's index with one process per device: it runs the ranks of the P-th
    /// device the plan's ranks use (`launch` passes it).
    #[arg(long, value_name = "P", requires_all = ["processes", "rendezvous"])]
    process: Option<u32>,
    /// Number of processes: the devices the plan's ranks use.
    #[arg(long, value_name = "W", requires_all = ["process", "rendezvous"])]
    processes: Option<u32>,
    /// HOST:PORT where process 0 listens and the other processes connect.
    #[arg(long, value_name = "HOST:PORT", requires_all = ["process", "processes"])]
    rendezvous: Option<String>,
    /// The world joined with the three options above.
    #[arg(skip)]
    world: Option<&'static World>,
}

#[derive(Args, Clone)]
struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the k most likely tokens; 0 disables.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample among the most likely tokens holding this probability mass; 1 disables.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Random seed [default: from the clock, printed so the run can be repeated].
    #[arg(long)]
    seed: Option<u64>,
}

/// Most kernel threads `--threads` takes.
const MAX_THREADS: usize = 1024;

/// A count of at least `MIN`, for clap: the error names the allowed range.
fn at_least<const MIN: usize>(s: &str) -> Result<usize, String> {
    count_in(s, MIN, usize::MAX)
}

/// `--threads`: 1..=MAX_THREADS.
fn threads(s: &str) -> Result<usize, String> {
    count_in(s, 1, MAX_THREADS)
}

/// A count in `min..=max` (no upper bound when `max` is `usize::MAX`), for clap.
fn count_in(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let bounded = max < usize::MAX;
    let allowed = if bounded {
        format!("{min}..={max}")
    } else {
        format!("{min} or more")
    };
    match s.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(n) if bounded => Err(format!("{n} is out of range; allowed: {allowed}")),
        Ok(n) => Err(format!("{n} is too small; allowed: {allowed}")),
        Err(e) => Err(format!("{e}; allowed: an integer, {allowed}")),
    }
}

/// `chat --prompt`: a message with text (a blank one would end the chat before it starts).
fn message(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the message is blank; allowed: a message with text (leave --prompt out to chat on stdin)".into());
    }
    Ok(s.to_string())
}

/// A finite number >= 0, for clap.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not allowed; allowed: a finite number >= 0")),
        Err(e) => Err(format!("{e}; allowed: a finite number >= 0")),
    }
}

/// `--quantile`: a number in (0, 1].
fn quantile(s: &str) -> Result<f64, String> {
    let allowed = "allowed: a number in (0, 1], e.g. 0.95";
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not allowed; {allowed}")),
        Err(e) => Err(format!("{e}; {allowed}")),
    }
}

/// A finite number > 0, for clap.
fn positive(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not allowed; allowed: a finite number > 0")),
        Err(e) => Err(format!("{e}; allowed: a finite number > 0")),
    }
}

/// `--shutdown-grace`: seconds in [0, 3600].
fn grace(s: &str) -> Result<f64, String> {
    let allowed = "allowed: a number of seconds in [0, 3600]";
    match s.parse::<f64>() {
        Ok(x) if (0.0..=3600.0).contains(&x) => Ok(x),
        Ok(x) => Err(format!("{x} is not allowed; {allowed}")),
        Err(e) => Err(format!("{e}; {allowed}")),
    }
}

/// `--api-key`: printable ASCII without spaces, so that it fits an `Authorization` header.
fn api_key(s: &str) -> Result<String, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(s.to_owned())
    } else {
        Err("allowed: a non-empty key of printable ASCII characters without spaces".into())
    }
}

/// The sampler settings of a run and whether its seed was drawn from the clock.
#[derive(Clone, Copy)]
struct Sampling {
    config: SamplerConfig,
    drawn_seed: bool,
}

impl Sampling {
    /// Greedy decoding, with no seed to announce.
    const GREEDY: Sampling = Sampling {
        config: SamplerConfig::GREEDY,
        drawn_seed: false,
    };

    /// Says on stderr which seed a sampled run drew, so it can be repeated; called once the
    /// run has started (a run that fails while loading has nothing to repeat).
    fn announce(&self, prints: bool) {
        let seed = self.config.seed;
        if self.drawn_seed && self.config.temperature > 0.0 && prints {
            eprintln!("seed: {seed} (pass --seed {seed} to repeat this run)");
        }
    }
}

impl SamplingArgs {
    fn config(&self) -> Result<Sampling> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64 & 0xffff_ffff)
        });
        let config = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed,
        };
        config.validate()?;
        Ok(Sampling {
            config,
            drawn_seed: self.seed.is_none(),
        })
    }
}

impl RunArgs {
    fn load(&self, plan: &Path) -> Result<LoadedPlan> {
        match (self.weights, &self.model) {
            (WeightsArg::File, model) => load(plan, model.as_deref()),
            (WeightsArg::Synthetic, None) => load_synthetic(plan),
            (WeightsArg::Synthetic, Some(_)) => {
                bail!("--model: synthetic weights read no model file; drop --model or --weights synthetic")
            }
        }
    }

    /// Refuses process options that cannot run `plan`: another number of processes than its
    /// devices, or on cuda a device that cannot hold its boundary communicators besides the
    /// plan's bytes.
    fn check_world(&self, plan: &Path) -> Result<()> {
        let Some(w) = self.processes else {
            return Ok(());
        };
        let parsed = Plan::read(plan)?;
        ProcessMap::of(&parsed)
            .check(w)
            .map_err(|e| anyhow!("{}: {e}", plan.display()))?;
        let over = launched_overflows(&parsed);
        if self.backend == BackendArg::Cuda && !over.is_empty() {
            bail!("{}: {}", plan.display(), over.join("\n"));
        }
        Ok(())
    }

    /// Joins the world the process options name, if they do; the world lives as long as the
    /// process.
    fn join(&mut self, plan: &Path) -> Result<Option<&'static World>> {
        self.check_world(plan)?;
        let (Some(p), Some(w), Some(at)) = (self.process, self.processes, &self.rendezvous) else {
            return Ok(None);
        };
        let world: &'static World = Box::leak(Box::new(World::join(p, w, at)?));
        self.world = Some(world);
        Ok(Some(world))
    }

    fn options(&self, sampler: SamplerConfig) -> EngineOptions {
        let defaults = EngineOptions::default();
        // The processes of one host share its cores.
        let share = defaults.threads / self.processes.unwrap_or(1).max(1) as usize;
        EngineOptions {
            backend: match self.backend {
                BackendArg::Cpu => Backend::Cpu,
                BackendArg::Cuda => Backend::Cuda,
            },
            threads: self.threads.unwrap_or(share).max(1),
            arm: match self.arm {
                ArmArg::Serial => Arm::Serial,
                ArmArg::Pipelined => Arm::Pipelined,
            },
            sampler,
            reduce_order: ReduceOrder::Tree,
            perturb: None,
            world: self.world,
        }
    }
}

/// A loaded plan with a session on it and the model's tokenizer.
struct Loaded {
    plan: LoadedPlan,
    session: Session,
    tokenizer: Tokenizer,
    /// Whether this process prints the command's output (it holds the readback rank).
    prints: bool,
}

/// Loads `plan` and opens its engine for a text command sampling as `sampling` says, then
/// announces the run's drawn seed (once the run has started).
fn start(plan: &Path, run: &RunArgs, sampling: Sampling) -> Result<Loaded> {
    let plan = run.load(plan)?;
    let tokenizer = Tokenizer::from_gguf(plan.gguf()?)?;
    // the host samples a speculative plan's tokens (`crate::speculate`), the engine none
    let engine_sampler = match plan.plan.speculative {
        Some(_) => SamplerConfig::GREEDY,
        None => sampling.config,
    };
    let options = run.options(engine_sampler);
    let engine = open(&plan, options)?;
    let prints = options.holds_readback(&plan.plan);
    notice_prompt_mode(&*engine, &plan.plan, prints);
    let runtime = &plan.plan.runtime;
    let mut session = Session::new(engine, runtime.in_flight, runtime.max_context);
    if let Some(sp) = plan.plan.speculative {
        let sampler = Sampler::new(sampling.config);
        session = session.speculating(sp.tokens as usize, Drafts::Lookup, sampler);
    }
    sampling.announce(prints);
    Ok(Loaded {
        prints,
        plan,
        session,
        tokenizer,
    })
}

/// Says on stderr when the engine runs prompts token by token although the plan has prefill
/// steps, and why: the difference in speed is never silent.
fn notice_prompt_mode(engine: &dyn Decoder, plan: &Plan, prints: bool) {
    if let PromptMode::TokenByToken(why) = engine.prompt_mode() {
        if prints && plan.runtime.prefill_chunk > 1 {
            eprintln!("notice: prompts run token by token ({why})");
        }
    }
}

impl Command {
    /// The plan and the run options of a subcommand that runs a plan.
    fn plan_and_run(&mut self) -> Option<(&Path, &mut RunArgs)> {
        match self {
            Command::Generate { plan, run, .. }
            | Command::Chat { plan, run, .. }
            | Command::Perplexity { plan, run, .. }
            | Command::Gate { plan, run, .. }
            | Command::Compare { plan, run, .. }
            | Command::Bench { plan, run, .. } => Some((plan, run)),
            // serve refuses process options itself: it runs in one process.
            Command::Launch { .. } | Command::Serve { .. } => None,
        }
    }

    /// Joins the world the subcommand's options name.
    fn join(&mut self) -> Result<Option<&'static World>> {
        match self.plan_and_run() {
            Some((plan, run)) => run.join(plan),
            None => Ok(None),
        }
    }
}

/// Parses the command line and runs it; errors go to stderr with exit status 1.
pub fn main() -> ExitCode {
    execute(Cli::parse())
}

/// Runs a parsed command line, joining its world first when it names one.
fn execute(mut cli: Cli) -> ExitCode {
    let world = match cli.command.join() {
        Ok(world) => world,
        Err(e) => return fail(&e),
    };
    let result = run(cli.command);
    let Some(world) = world else {
        return result.unwrap_or_else(|e| fail(&e));
    };
    let result = result.and_then(|code| world.finish().map(|()| code));
    match result {
        Ok(code) => code,
        Err(e) if world.is_broken() => {
            world.abort(&format!("{e:#}"));
            fail(&e);
            ExitCode::from(PEER_FAILED)
        }
        Err(e) => {
            world.abort(&format!("{e:#}"));
            fail(&e)
        }
    }
}

/// Prints `e` and its causes (control characters a file slipped in escaped).
fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("error: {}", escaped_lines(&format!("{e:#}")));
    ExitCode::FAILURE
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Generate {
            plan,
            prompt,
            n_predict,
            sampling,
            run,
        } => sampling
            .config()
            .and_then(|s| text::generate(&plan, &prompt, n_predict, s, &run)),
        Command::Chat {
            plan,
            prompt,
            system,
            n_predict,
            sampling,
            run,
        } => sampling.config().and_then(|s| {
            text::chat(
                &plan,
                prompt.as_deref(),
                system.as_deref(),
                n_predict,
                s,
                &run,
            )
        }),
        Command::Perplexity {
            plan,
            file,
            ctx,
            chunks,
            run,
        } => tools::perplexity(&plan, &file, ctx, chunks, &run),
        Command::Gate {
            plan,
            reference,
            prompt,
            tokens,
            n_predict,
            repeat,
            batch,
            run,
        } => {
            if batch {
                return tools::gate_batch(&plan, &reference, &run);
            }
            let prompt = match &tokens {
                Some(ids) => tools::Prompt::Tokens(ids),
                None => tools::Prompt::Text(&prompt),
            };
            tools::gate(&plan, &reference, prompt, n_predict, repeat, &run)
        }
        Command::Compare {
            plan,
            prompt,
            n_predict,
            tolerance,
            teacher_forced,
            per_step,
            conditioning,
            quantile,
            run,
        } => {
            let how = tools::CompareHow {
                tolerance,
                teacher_forced,
                per_step,
                conditioning,
                quantile,
            };
            tools::compare(&plan, &prompt, n_predict, how, &run)
        }
        Command::Bench {
            plan,
            prompt,
            n_predict,
            reps,
            batch,
            json,
            text,
            draft_replay,
            run,
        } => {
            let bench = tools::Bench {
                plan: &plan,
                prompt,
                n: n_predict,
                reps,
                json,
                run: &run,
                text: text.as_deref(),
                draft_replay,
            };
            match batch {
                None => tools::bench(&bench),
                Some(batch) => batched::bench_batch(&bench, batch),
            }
        }
        Command::Serve {
            plan,
            host,
            port,
            max_queue,
            shutdown_grace,
            api_key,
            api_key_file,
            allowed_origins,
            timeout,
            max_connections,
            run,
        } => serve::serve(
            &plan,
            crate::serve::ServerOptions {
                host,
                port,
                max_queue: max_queue as usize,
                shutdown_grace: std::time::Duration::from_secs_f64(shutdown_grace),
                api_key: match api_key_file {
                    Some(path) => Some(serve::api_key_from(&path)?),
                    None => api_key,
                },
                allowed_origins,
                timeout: std::time::Duration::from_secs(timeout),
                max_connections: max_connections as usize,
            },
            &run,
        ),
        Command::Launch {
            plan,
            process,
            processes,
            rendezvous,
            port,
            command,
        } => {
            let flags = crate::dist::launcher::Flags {
                process,
                processes,
                rendezvous,
                port,
            };
            launch::launch(&plan, &command, &flags)
        }
    }
}
