//! The CUDA self-test: every kernel and every weight dtype against a CPU reference at awkward
//! sizes with per-op tolerances, tensor-parallel subtree bit-exactness (the full-K matvec equals
//! the tree-combine of d column-shard matvecs, bit for bit), determinism (the same launch twice
//! gives the same bits), graph capture and replay against the eager result, the device sampler
//! token for token against the CPU one, MoE routing and experts against the CPU kernels (and
//! an MoE layer's graph replay), MLA's rope and latent attention against the CPU kernels (and
//! their graph replay), KDA's convolution and delta rule against the CPU kernels over several
//! tokens (and their graph replay), mHC's mixing weights, collapse, expand, mean and
//! embedding copies against the CPU kernels (and their graph replay), the DSA indexer's
//! key norm and selected cells token by token against the CPU's (ggml's tie order included;
//! and their graph replay), the prefill kernels over token rows (the tensor-core
//! product per dtype, its chunks' tensor-parallel bit-exactness, attention rows bit for bit
//! against decode steps), the batched decode kernels bit for bit against the one-row decode
//! (the matvec over several rows per dtype and form, attention over rows of several sequence
//! slots), and optionally the achieved bandwidth of the matvec kernels on llama-8B shapes
//! next to a device copy, and their throughput over batches of rows; `collective` times the all-reduce alone. Run by
//! `cargo run --release --example cuda_selftest`; it needs a GPU and is never part of
//! `cargo test`.

mod batch;
mod bench;
mod checks;
pub mod collective;
mod dsa;
mod exact;
mod kda;
mod mhc;
mod mla;
mod moe;
mod rows;
mod sampling;
mod synth;

use std::sync::Arc;

use anyhow::Result;
use memra_gguf::rng::Rng;
use memra_gguf::GgmlType;

use super::ops::AttentionForm;
use super::{device_count, CudaDevice, CudaStream, DeviceBuffer, DeviceKv, RopeStyle, Span};

/// What the self-test runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Device ordinal.
    pub device: usize,
    /// Run the numerics, bit-exactness and graph checks.
    pub checks: bool,
    /// Also time the matvec kernels on llama-8B shapes.
    pub bench: bool,
    /// Also time the prefill products on llama-8B shapes, in every tile.
    pub prefill_bench: bool,
    /// Random seed for the inputs.
    pub seed: u64,
}

/// What every check needs: the device, a stream, the input generator and the report.
pub(crate) struct Ctx<'a> {
    dev: &'a CudaDevice,
    s: &'a Arc<CudaStream>,
    rng: Rng,
    report: Report,
}

/// One row of the result table.
struct Row {
    op: String,
    case: String,
    /// Largest error in the check's own unit (see `unit`); 0 for bit-exact checks that passed.
    err: f64,
    tol: f64,
    unit: &'static str,
    pass: bool,
}

/// The collected results.
#[derive(Default)]
pub(crate) struct Report {
    rows: Vec<Row>,
}

impl Report {
    /// Records a tolerance check: passes when `err <= tol` (a NaN error fails).
    pub(crate) fn tol(&mut self, op: &str, case: String, err: f64, tol: f64, unit: &'static str) {
        let pass = err <= tol;
        self.rows.push(Row {
            op: op.to_string(),
            case,
            err,
            tol,
            unit,
            pass,
        });
    }

    /// Records a bit-exact check; `mismatches` counts differing values.
    pub(crate) fn exact(&mut self, op: &str, case: String, mismatches: usize) {
        self.rows.push(Row {
            op: op.to_string(),
            case,
            err: mismatches as f64,
            tol: 0.0,
            unit: "bits",
            pass: mismatches == 0,
        });
    }

    fn failures(&self) -> usize {
        self.rows.iter().filter(|r| !r.pass).count()
    }

    fn print(&self) {
        println!(
            "{:<16} {:<40} {:>10} {:>9} {:<6} result",
            "op", "case", "max err", "tol", "unit"
        );
        for r in &self.rows {
            let verdict = if r.pass { "PASS" } else { "FAIL" };
            println!(
                "{:<16} {:<40} {:>10.2e} {:>9.1e} {:<6} {verdict}",
                r.op, r.case, r.err, r.tol, r.unit
            );
        }
    }

    /// The largest error per op, one line each, in first-seen order.
    fn print_summary(&self) {
        let mut ops: Vec<(&str, f64, &str, bool)> = Vec::new();
        for r in &self.rows {
            match ops.iter_mut().find(|o| o.0 == r.op && o.2 == r.unit) {
                Some(o) => {
                    o.1 = o.1.max(r.err);
                    o.3 &= r.pass;
                }
                None => ops.push((&r.op, r.err, r.unit, r.pass)),
            }
        }
        println!("\nper-op summary (max error over all cases)");
        for (op, err, unit, pass) in ops {
            println!(
                "  {op:<16} {err:>10.2e} {unit:<6} {}",
                if pass { "PASS" } else { "FAIL" }
            );
        }
    }
}

/// The dtypes every matvec and embed check covers: all that memra loads.
pub(crate) const DTYPES: &[GgmlType] = memra_gguf::SUPPORTED;

/// `n` values uniform in [-scale, scale).
/// `dev.attention` of a step without sequence slots or an 8-bit copy of its output, the form
/// most of the self-test's launches take: (device, stream), q, the step's (k, v), the cache, the position, rope,
/// the split's scratch, the output and the form (`None`: the launch picks).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    (dev, s): (&CudaDevice, &CudaStream),
    q: &mut DeviceBuffer<f32>,
    (k, v): (&DeviceBuffer<f32>, &DeviceBuffer<f32>),
    kv: &mut DeviceKv,
    pos: &DeviceBuffer<u32>,
    rope: (f32, RopeStyle),
    parts: &DeviceBuffer<f32>,
    out: &mut DeviceBuffer<f32>,
    form: Option<AttentionForm>,
) -> Result<()> {
    let parts = Span::of(parts);
    dev.attention(s, q, k, v, kv, pos, None, rope, &parts, out, None, form)
}

pub(crate) fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform() * scale).collect()
}

/// A random `rows x cols` weight of `dtype`: its bytes and their exact dequantization.
pub(crate) fn random_weight(
    rng: &mut Rng,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<f32>)> {
    let src = random(rng, rows * cols, 1.0);
    let mut bytes = vec![
        0u8;
        dtype
            .bytes_for((rows * cols) as u64)
            .expect("invariant: whole blocks") as usize
    ];
    memra_gguf::quantize(dtype, &src, &mut bytes)?;
    let mut deq = vec![0f32; rows * cols];
    memra_gguf::dequantize(dtype, &bytes, &mut deq)?;
    Ok((bytes, deq))
}

/// Number of values that differ in their bits.
pub(crate) fn bit_mismatches(a: &[f32], b: &[f32]) -> usize {
    if a.len() != b.len() {
        return a.len().max(b.len());
    }
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// Runs the self-test on `opts.device`, prints the tables and returns whether every check passed.
pub fn run(opts: &Options) -> Result<bool> {
    let count = device_count()?;
    let dev = CudaDevice::open(opts.device)?;
    let (free, total) = dev.memory()?;
    println!(
        "device {} of {count}: {} ({}, {} SMs, {:.1} of {:.1} GiB free)\n",
        dev.ordinal(),
        dev.name(),
        dev.arch(),
        dev.sm_count(),
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    );
    print_resources(&dev)?;
    let stream = dev.new_stream()?;
    let mut cx = Ctx {
        dev: &dev,
        s: &stream,
        rng: Rng::new(opts.seed),
        report: Report::default(),
    };
    if opts.checks {
        checks::run(&mut cx)?;
        exact::run(&mut cx)?;
        moe::run(&mut cx)?;
        mla::run(&mut cx)?;
        kda::run(&mut cx)?;
        mhc::run(&mut cx)?;
        dsa::run(&mut cx)?;
        rows::run(&mut cx)?;
        batch::run(&mut cx)?;
        sampling::run(&mut cx)?;
        synth::run(&mut cx)?;
    }
    if opts.bench {
        bench::run(&dev, &stream, &mut cx.rng)?;
        bench::attention(&dev, &stream, &mut cx.rng)?;
    }
    if opts.prefill_bench {
        bench::prefill(&dev, &stream, &mut cx.rng)?;
    }
    let report = cx.report;
    report.print_summary();
    println!();
    report.print();
    let failed = report.failures();
    println!("\n{} passed, {failed} failed", report.rows.len() - failed);
    Ok(failed == 0)
}

/// Registers, spill bytes and shared memory of every kernel (spills show up as local bytes).
fn print_resources(dev: &CudaDevice) -> Result<()> {
    println!(
        "{:<16} {:>5} {:>6} {:>7}",
        "kernel", "regs", "local", "shared"
    );
    for file in super::compile::FILES {
        for &entry in file.entries {
            let (regs, local, shared) = dev.kernel_resources(entry)?;
            println!("{entry:<16} {regs:>5} {local:>6} {shared:>7}");
        }
    }
    println!();
    Ok(())
}
