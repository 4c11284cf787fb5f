//! The `memra-run` command line: argument definitions, shared setup (plan, model, engine,
//! tokenizer) and dispatch to the subcommands in `text` (generate, chat) and `tools`
//! (perplexity, gate, compare, bench).

mod text;
mod tools;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::cpu::ReduceOrder;
use crate::engine::{open, Arm, Backend, EngineOptions};
use crate::plan_load::{load, LoadedPlan};
use crate::sample::SamplerConfig;
use crate::session::Session;
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
        #[arg(short, long)]
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
        /// Tokens per chunk.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// Score at most this many chunks.
        #[arg(long)]
        chunks: Option<usize>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Decode a prompt plus -n greedy tokens with the plan (serial and pipelined arms) and the
    /// 1-rank reference plan; fail on the first logit whose bits differ.
    Gate {
        /// The execution plan to check.
        plan: PathBuf,
        /// The 1-rank plan of the same model.
        #[arg(long)]
        reference: PathBuf,
        /// Prompt text.
        #[arg(short, long, default_value = "The capital of France is")]
        prompt: String,
        /// Tokens to generate after the prompt.
        #[arg(short = 'n', long, default_value_t = 16)]
        n_predict: usize,
        /// Decode the plan this many times against the one reference run (a soak test);
        /// every mismatch is counted and the first of each run printed.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
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
        #[arg(long, default_value_t = 1e-3)]
        tolerance: f64,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Decode speed: -n tokens after a one-token prompt, --reps times after a warm-up.
    Bench {
        /// The execution plan.
        plan: PathBuf,
        /// Tokens per repetition.
        #[arg(short = 'n', long, default_value_t = 128)]
        n_predict: usize,
        /// Timed repetitions.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Print one JSON object instead of the line.
        #[arg(long)]
        json: bool,
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

#[derive(Args, Clone)]
struct RunArgs {
    /// Use this GGUF instead of the model the plan names; its fingerprint must match.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Kernel threads in total [default: all cores].
    #[arg(short, long)]
    threads: Option<usize>,
    /// Backend to run on.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendArg,
    /// Serial (one step at a time) or pipelined (cpu: one thread per rank; cuda: up to the
    /// plan's runtime.in_flight steps enqueued ahead).
    #[arg(long, value_enum, default_value = "pipelined")]
    arm: ArmArg,
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

impl SamplingArgs {
    fn config(&self) -> Result<SamplerConfig> {
        let seed = self.seed.unwrap_or_else(|| {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64 & 0xffff_ffff);
            if self.temperature > 0.0 {
                eprintln!("seed: {seed} (pass --seed {seed} to repeat this run)");
            }
            seed
        });
        let config = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed,
        };
        config.validate()?;
        Ok(config)
    }
}

impl RunArgs {
    fn load(&self, plan: &Path) -> Result<LoadedPlan> {
        load(plan, self.model.as_deref())
    }

    fn options(&self, sampler: SamplerConfig) -> EngineOptions {
        let defaults = EngineOptions::default();
        EngineOptions {
            backend: match self.backend {
                BackendArg::Cpu => Backend::Cpu,
                BackendArg::Cuda => Backend::Cuda,
            },
            threads: self.threads.unwrap_or(defaults.threads).max(1),
            arm: match self.arm {
                ArmArg::Serial => Arm::Serial,
                ArmArg::Pipelined => Arm::Pipelined,
            },
            sampler,
            reduce_order: ReduceOrder::Tree,
        }
    }
}

/// A loaded plan with a session on it and the model's tokenizer.
struct Loaded {
    plan: LoadedPlan,
    session: Session,
    tokenizer: Tokenizer,
}

fn start(plan: &Path, run: &RunArgs, sampler: SamplerConfig) -> Result<Loaded> {
    let plan = run.load(plan)?;
    let tokenizer = Tokenizer::from_gguf(&plan.gguf)?;
    let engine = open(&plan, run.options(sampler))?;
    let session = Session::new(engine, plan.plan.runtime.in_flight);
    Ok(Loaded {
        plan,
        session,
        tokenizer,
    })
}

/// Parses the command line and runs it; errors go to stderr with exit status 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
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
            n_predict,
            repeat,
            run,
        } => tools::gate(&plan, &reference, &prompt, n_predict, repeat, &run),
        Command::Compare {
            plan,
            prompt,
            n_predict,
            tolerance,
            run,
        } => tools::compare(&plan, &prompt, n_predict, tolerance, &run),
        Command::Bench {
            plan,
            n_predict,
            reps,
            json,
            run,
        } => tools::bench(&plan, n_predict, reps, json, &run),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
