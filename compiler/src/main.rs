//! `memra-compile`: compile a placement into an execution plan, print its per-rank summary,
//! or check that a committed plan is up to date.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use memra_compiler::passes::allocate::NCCL_COMMUNICATOR_BYTES;
use memra_compiler::passes::compile;
use memra_compiler::plan::{Plan, Step};
use memra_compiler::review::{load_plan_or_placement, semantic_diff, to_dot};
use memra_compiler::textdiff::unified;
use memra_gguf::output::{escaped, escaped_lines, write_atomically};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

/// Compile a placement plan (TOML) and its model's metadata into an execution plan.
#[derive(Parser)]
#[command(
    name = "memra-compile",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Placement files to compile (e.g. plans/smollm2-pp2.toml).
    placements: Vec<PathBuf>,
    /// Where to write the plan (default: beside the placement, `NAME.plan.toml`).
    #[arg(short, long, conflicts_with = "check")]
    output: Option<PathBuf>,
    /// Write nothing; fail with a semantic and a text diff when the committed plan is stale.
    #[arg(long)]
    check: bool,
    /// Print only errors.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Semantic diff of two plans; each side is a plan (a file with `format_version`) or a
    /// placement, which is compiled first. With one `NAME.plan.toml`, compares it with what
    /// its placement `NAME.toml` compiles to now.
    /// Exits 1 when they differ.
    Diff { old: PathBuf, new: Option<PathBuf> },
    /// Draw a plan: DOT text always; SVG or PNG through graphviz's `dot` when it is
    /// installed. Without --format (and without an --output ending in .svg or .png) it draws
    /// SVG, or writes DOT text with a note on how to draw it where graphviz is missing.
    Render {
        /// A plan (a file with `format_version`) or a placement.
        plan: PathBuf,
        /// Output file (default: the plan's name with the format's extension).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// dot, svg or png [default: the --output's extension, else svg, else dot].
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Dot,
    Svg,
    Png,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Dot => "dot",
            Format::Svg => "svg",
            Format::Png => "png",
        }
    }

    /// The format a file name's extension names, if any.
    fn of(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?;
        [Format::Dot, Format::Svg, Format::Png]
            .into_iter()
            .find(|f| f.extension().eq_ignore_ascii_case(ext))
    }

    /// Whether a file's first bytes are this format's, so that render may replace it.
    fn looks_like(self) -> fn(&[u8]) -> bool {
        match self {
            Format::Dot => |head| head.starts_with(b"digraph"),
            Format::Svg => |head| head.starts_with(b"<?xml") || head.starts_with(b"<svg"),
            Format::Png => |head| head.starts_with(b"\x89PNG"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Some(Command::Diff { old, new }) => diff(old, new.as_deref()),
        Some(Command::Render {
            plan,
            output,
            format,
        }) => render(plan, output.as_deref(), *format),
        None => compile_all(&cli),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", escaped_lines(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn compile_all(cli: &Cli) -> Result<bool> {
    if cli.placements.is_empty() {
        bail!(
            "give at least one placement file, e.g. memra-compile plans/smollm2.toml (see --help)"
        );
    }
    if cli.output.is_some() && cli.placements.len() > 1 {
        bail!(
            "--output takes one placement; {} were given",
            cli.placements.len()
        );
    }
    let mut ok = true;
    for placement in &cli.placements {
        if let Err(e) = compile_one(cli, placement) {
            eprintln!("error: {}", escaped_lines(&format!("{e:#}")));
            ok = false;
        }
    }
    Ok(ok)
}

/// `plans/x.toml` -> `plans/x.plan.toml`.
fn default_output(placement: &Path) -> PathBuf {
    let stem = placement.file_stem().unwrap_or_default().to_string_lossy();
    placement.with_file_name(format!("{stem}.plan.toml"))
}

/// `plans/x.plan.toml` -> `plans/x.toml`.
fn placement_of(plan: &Path) -> Option<PathBuf> {
    let name = plan.file_name()?.to_str()?;
    Some(plan.with_file_name(format!("{}.toml", name.strip_suffix(".plan.toml")?)))
}

fn diff(old: &Path, new: Option<&Path>) -> Result<bool> {
    let old_plan = load_plan_or_placement(old)?;
    let new_plan = match new {
        Some(new) => load_plan_or_placement(new)?,
        None => {
            let placement = placement_of(old).ok_or_else(|| {
                anyhow!(
                    "{}: with one argument, give a committed `*.plan.toml`",
                    old.display()
                )
            })?;
            load_plan_or_placement(&placement)?
        }
    };
    let text = semantic_diff(&old_plan, &new_plan);
    if text.is_empty() {
        println!("plans are identical");
        return Ok(true);
    }
    print!("{text}");
    Ok(false)
}

fn render(path: &Path, output: Option<&Path>, format: Option<Format>) -> Result<bool> {
    let plan = load_plan_or_placement(path)?;
    let dot = to_dot(&plan);
    let asked = format.or_else(|| output.and_then(Format::of));
    let named = |format: Format| {
        output.map(Path::to_path_buf).unwrap_or_else(|| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let stem = name.trim_end_matches(".toml").trim_end_matches(".plan");
            path.with_file_name(format!("{stem}.{}", format.extension()))
        })
    };
    let (format, bytes) = match asked.unwrap_or(Format::Svg) {
        Format::Dot => (Format::Dot, dot.into_bytes()),
        drawn => match graphviz(&dot, drawn)? {
            Some(bytes) => (drawn, bytes),
            None if asked.is_none() => {
                let (out, svg) = (named(Format::Dot), named(Format::Svg));
                eprintln!(
                    "note: graphviz's `dot` is not installed, so this wrote DOT text, not SVG, to {}; \
                     draw it with `dot -Tsvg {} -o {}` once graphviz is installed",
                    out.display(),
                    out.display(),
                    svg.display()
                );
                (Format::Dot, dot.into_bytes())
            }
            None => bail!(
                "graphviz's `dot` is needed for {} output and is not installed; install graphviz, or use --format dot for DOT text",
                drawn.extension()
            ),
        },
    };
    let out = named(format);
    let model = path.with_file_name(&plan.model.source);
    refuse_to_clobber(
        &out,
        format.looks_like(),
        &[(path, "plan or placement"), (&model, "model")],
    )?;
    write_atomically(&out, |f| Ok(f.write_all(&bytes)?))?;
    println!("{}", out.display());
    Ok(true)
}

/// `dot` drawn by graphviz as `format` (svg or png), or `None` where graphviz's `dot` is not
/// installed.
fn graphviz(dot: &str, format: Format) -> Result<Option<Vec<u8>>> {
    let ext = format.extension();
    let child = std::process::Command::new("dot")
        .arg(format!("-T{ext}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("graphviz's `dot` did not start: {e}"),
    };
    let mut stdin = child.stdin.take().expect("invariant: stdin is piped");
    // written from a thread of its own, so a picture larger than the pipe cannot stall both
    let fed = std::thread::scope(|s| {
        let feed = s.spawn(move || stdin.write_all(dot.as_bytes()));
        let out = child.wait_with_output();
        (
            feed.join()
                .expect("invariant: writing a pipe does not panic"),
            out,
        )
    });
    let out = match fed {
        (_, Err(e)) => bail!("graphviz's `dot` failed: {e}"),
        (Err(e), _) => bail!("graphviz's `dot` stopped reading the graph: {e}"),
        (Ok(()), Ok(out)) => out,
    };
    if !out.status.success() {
        bail!(
            "graphviz's `dot -T{ext}` failed ({}): {}",
            out.status,
            escaped(String::from_utf8_lossy(&out.stderr).trim())
        );
    }
    Ok(Some(out.stdout))
}

/// Refuses to write `out` over a file this run reads (`inputs`, each named for the message)
/// or over any file whose first bytes are not what this command writes there (`ours`): a
/// mistyped `--output` never replaces a placement, a model or another file of the user's.
fn refuse_to_clobber(out: &Path, ours: fn(&[u8]) -> bool, inputs: &[(&Path, &str)]) -> Result<()> {
    let Ok(target) = out.canonicalize() else {
        return Ok(()); // not there yet: nothing to lose (a missing folder fails at the write)
    };
    for (input, what) in inputs {
        if input.canonicalize().is_ok_and(|p| p == target) {
            bail!(
                "{}: is the {what} this reads, so writing there would replace it; give another --output",
                out.display()
            );
        }
    }
    if !target.is_file() {
        return Ok(()); // a folder: the write says so
    }
    let mut head = Vec::new();
    std::fs::File::open(&target)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 20), &mut head))
        .with_context(|| format!("{}: cannot read", out.display()))?;
    if !head.is_empty() && !ours(&head) {
        bail!(
            "{}: exists and is not a file this command writes, so writing there would replace it; \
             give another --output, or remove the file first",
            out.display()
        );
    }
    Ok(())
}

/// The model's path as a plan written at `out` names it (relative to the plan's folder, as
/// the executor reads it): the placement's `source` (relative to the placement's folder)
/// where the plan lands beside the placement, else the way from the plan's folder to the
/// model, or its absolute path where no relative way reaches it.
fn source_for(placement: &Path, source: &str, out: &Path) -> Result<String> {
    let folder = |p: &Path| -> Result<PathBuf> {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::canonicalize(&dir).with_context(|| format!("{}: cannot resolve", dir.display()))
    };
    let (from, to) = (folder(placement)?, folder(out)?);
    if from == to {
        return Ok(source.to_string());
    }
    let model = from.join(source);
    let model = std::fs::canonicalize(&model).unwrap_or(model);
    let (mut a, mut b) = (to.components().peekable(), model.components().peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        if x != y {
            break;
        }
        a.next();
        b.next();
    }
    let up = a.count();
    let rest: PathBuf = b.collect();
    if up == to.components().count() {
        // nothing in common (another drive): only the absolute path reaches it
        return Ok(model.display().to_string());
    }
    let mut way = PathBuf::new();
    for _ in 0..up {
        way.push("..");
    }
    Ok(way.join(rest).display().to_string())
}

fn compile_one(cli: &Cli, placement: &Path) -> Result<()> {
    let mut compiled = compile(placement).map_err(|d| anyhow!("{d}"))?;
    let out = cli
        .output
        .clone()
        .unwrap_or_else(|| default_output(placement));
    let source = source_for(placement, &compiled.plan.model.source, &out)?;
    let model = placement.with_file_name(&compiled.plan.model.source);
    compiled.plan.model.source = source;
    let text = compiled.plan.to_toml();
    if cli.check {
        let committed = std::fs::read_to_string(&out)
            .with_context(|| format!("{}: cannot read the committed plan", out.display()))?;
        if committed == text {
            if !cli.quiet {
                println!("{}: up to date", out.display());
            }
            return Ok(());
        }
        let semantic = match Plan::from_toml(&committed) {
            Ok(old) => semantic_diff(&old, &compiled.plan),
            Err(e) => format!("the committed plan does not parse: {e}\n"),
        };
        let text_diff = unified(
            &format!("{} (committed)", out.display()),
            &format!("{} (compiled now)", out.display()),
            &committed,
            &text,
            3,
        );
        bail!(
            "{} is stale\n{semantic}text diff:\n{text_diff}update it with: memra-compile {}",
            out.display(),
            placement.display()
        );
    }
    refuse_to_clobber(
        &out,
        |head| {
            String::from_utf8_lossy(head)
                .lines()
                .any(|l| l.starts_with("format_version"))
        },
        &[(placement, "placement"), (&model, "model")],
    )?;
    write_atomically(&out, |f| Ok(f.write_all(text.as_bytes())?))?;
    if !cli.quiet {
        print!("{}", summary(&compiled.plan, placement, &out));
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// The per-rank summary printed after a compile. A plan runs on either backend, so what
/// only a cuda run takes (its runtime, transport, graph capture) is said apart, as such.
fn summary(plan: &Plan, placement: &Path, out: &Path) -> String {
    let m = &plan.model;
    let mut s = format!(
        "{} -> {}\nmodel {} ({}, {} layers, fingerprint {}), placement {}, prefill chunk {}\n",
        placement.display(),
        out.display(),
        m.name,
        m.architecture,
        m.layers,
        m.fingerprint,
        plan.placement_hash,
        plan.runtime.prefill_chunk
    );
    for r in &plan.ranks {
        let runs = r
            .program
            .iter()
            .filter(|p| matches!(p, Step::Run { .. }))
            .count();
        let islands: Vec<String> = r
            .program
            .iter()
            .filter_map(|p| match p {
                Step::Island { id, reason, .. } => Some(format!("{id} ({reason})")),
                _ => None,
            })
            .collect();
        let weights: u64 = r.weights.iter().map(|w| w.bytes).sum();
        s += &format!(
            "rank {:<2} stage {:<2} device {:<2} tp {}/{} layers {:<7} runs {runs} islands {} weights {}\n",
            r.rank,
            r.stage,
            r.device,
            r.tp_index,
            r.tp_degree,
            r.layers.to_string(),
            islands.len(),
            mib(weights)
        );
        for island in islands {
            s += &format!("    eager {island}\n");
        }
    }
    for d in &plan.devices {
        if d.total_bytes > 0 {
            let state = match d.state_bytes {
                0 => String::new(),
                n => format!(", state {}", mib(n)),
            };
            let transport = match d.transport_bytes {
                0 => String::new(),
                n => format!(" and transport {}", mib(n)),
            };
            let launched = match d.launch_bytes {
                0 => String::new(),
                n => {
                    let comms = n / NCCL_COMMUNICATOR_BYTES;
                    let s = if comms == 1 { "" } else { "s" };
                    format!(
                        "; launched one process per device {} more for {comms} boundary communicator{s}",
                        mib(n)
                    )
                }
            };
            s += &format!(
                "device {}: {} (weights {}, kv {}{state}, buffers {}); on cuda {} of {} with the cuda runtime's {}{transport}{launched}\n",
                d.device,
                mib(d.total_bytes - d.runtime_bytes - d.transport_bytes),
                mib(d.weight_bytes),
                mib(d.kv_bytes),
                mib(d.buffer_bytes),
                mib(d.total_bytes),
                mib(d.memory_bytes),
                mib(d.runtime_bytes),
            );
        }
    }
    let capture = format!("{:?}", plan.runtime.capture).to_lowercase();
    s += &format!("on cuda: capture {capture}\n");
    s
}
