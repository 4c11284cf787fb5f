//! Synthetic llama-architecture models with seeded random weights, for tests and benchmarks
//! without downloads. Tensor names and metadata keys follow llama.cpp. Weights are uniform
//! with a standard deviation of 1/sqrt(fan-in) (residual projections further divided by
//! sqrt(2 * layers)) so activations stay in range through every layer; norms are near 1.
//! Tensors are generated in fixed-size row chunks, each from its own seeded stream, so the
//! output depends only on the seed, never on the thread count.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{anyhow, Context, Result};

use crate::progress::{Progress, Unit};
use crate::rng::Rng;
use crate::{quantize, GgmlType, GgufWriter, Value};

/// A model shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Embedding width.
    pub dim: u64,
    /// Feed-forward hidden width.
    pub ffn: u64,
    /// Number of transformer blocks.
    pub layers: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Vocabulary size.
    pub vocab: u64,
    /// Whether the output projection reuses `token_embd.weight`.
    pub tied: bool,
    /// `llama.context_length`.
    pub context: u32,
    /// `llama.rope.freq_base`.
    pub rope_base: f32,
}

/// The known shapes. `tiny` is 256 wide so every k-quant applies to every matrix.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny",
        dim: 256,
        ffn: 768,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        vocab: 256,
        tied: false,
        context: 512,
        rope_base: 10000.0,
    },
    Shape {
        name: "tiny-tp",
        dim: 256,
        ffn: 512,
        layers: 2,
        heads: 32,
        kv_heads: 8,
        vocab: 512,
        tied: false,
        context: 512,
        rope_base: 10000.0,
    },
    Shape {
        name: "smol135m",
        dim: 576,
        ffn: 1536,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        vocab: 49152,
        tied: true,
        context: 8192,
        rope_base: 100000.0,
    },
    Shape {
        name: "llama1b",
        dim: 2048,
        ffn: 8192,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        vocab: 128256,
        tied: true,
        context: 131072,
        rope_base: 500000.0,
    },
    Shape {
        name: "llama8b",
        dim: 4096,
        ffn: 14336,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        vocab: 128256,
        tied: false,
        context: 131072,
        rope_base: 500000.0,
    },
];

/// The shape called `name`; the error lists the known names.
pub fn shape(name: &str) -> Result<Shape> {
    SHAPES
        .iter()
        .find(|s| s.name == name)
        .copied()
        .ok_or_else(|| {
            let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
            anyhow!("unknown shape `{name}`; known shapes: {}", names.join(", "))
        })
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// Uniform in [-a, a).
    Uniform(f32),
    /// Uniform in [0.9, 1.1): RMS-norm weights.
    Norm,
}

/// One tensor to generate.
#[derive(Debug)]
struct Planned {
    name: String,
    dims: [u64; 2],
    dtype: GgmlType,
    init: Init,
}

/// Rows per generation chunk are chosen so a chunk holds about this many values.
const CHUNK_VALUES: u64 = 1 << 20;

/// The tensors of `shape` with matrices in `dtype`, in file order.
fn plan(s: &Shape, dtype: GgmlType) -> Vec<Planned> {
    let hd = s.dim / u64::from(s.heads);
    let kv = hd * u64::from(s.kv_heads);
    let residual = (2.0 * s.layers as f32).sqrt();
    let matrix = |name: String, inp: u64, out: u64, extra: f32, dtype: GgmlType| {
        let a = 3f32.sqrt() / (inp as f32).sqrt() / extra;
        Planned {
            name,
            dims: [inp, out],
            dtype,
            init: Init::Uniform(a),
        }
    };
    let embd = if dtype.block_size() > 1 {
        GgmlType::Q8_0
    } else {
        dtype
    };
    let mut p = vec![matrix(
        "token_embd.weight".into(),
        s.dim,
        s.vocab,
        1.0,
        embd,
    )];
    let mut names = Vec::new();
    for l in 0..s.layers {
        let b = format!("blk.{l}");
        names.push((format!("{b}.attn_norm.weight"), None));
        names.push((format!("{b}.attn_q.weight"), Some((s.dim, s.dim, 1.0))));
        names.push((format!("{b}.attn_k.weight"), Some((s.dim, kv, 1.0))));
        names.push((format!("{b}.attn_v.weight"), Some((s.dim, kv, 1.0))));
        names.push((
            format!("{b}.attn_output.weight"),
            Some((s.dim, s.dim, residual)),
        ));
        names.push((format!("{b}.ffn_norm.weight"), None));
        names.push((format!("{b}.ffn_gate.weight"), Some((s.dim, s.ffn, 1.0))));
        names.push((format!("{b}.ffn_up.weight"), Some((s.dim, s.ffn, 1.0))));
        names.push((
            format!("{b}.ffn_down.weight"),
            Some((s.ffn, s.dim, residual)),
        ));
    }
    names.push(("output_norm.weight".into(), None));
    if !s.tied {
        names.push(("output.weight".into(), Some((s.dim, s.vocab, 1.0))));
    }
    for (name, m) in names {
        match m {
            Some((inp, out, extra)) => p.push(matrix(name, inp, out, extra, fallback(dtype, inp))),
            None => p.push(Planned {
                name,
                dims: [s.dim, 1],
                dtype: GgmlType::F32,
                init: Init::Norm,
            }),
        }
    }
    p
}

/// `dtype`, or Q8_0 (then F16) when rows of length `row` do not fill its blocks, as
/// llama.cpp's quantizer falls back for such tensors.
fn fallback(dtype: GgmlType, row: u64) -> GgmlType {
    [dtype, GgmlType::Q8_0, GgmlType::F16]
        .into_iter()
        .find(|t| row.is_multiple_of(t.block_size() as u64))
        .expect("invariant: f16 fits every row")
}

/// GPT-2's byte-to-printable-character map, so every byte is a visible token.
fn byte_tokens() -> Vec<String> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c)
                .expect("invariant: below the surrogates")
                .to_string()
        })
        .collect()
}

/// Adds llama metadata and a byte-level gpt2 tokenizer sized to the vocabulary.
fn add_metadata(w: &mut GgufWriter, s: &Shape) -> Result<()> {
    let hd = s.dim / u64::from(s.heads);
    let kv: [(&str, Value); 12] = [
        ("general.architecture", Value::Str("llama".into())),
        (
            "general.name",
            Value::Str(format!("memra-synth {}", s.name)),
        ),
        ("llama.block_count", Value::U32(s.layers)),
        ("llama.context_length", Value::U32(s.context)),
        ("llama.embedding_length", Value::U32(s.dim as u32)),
        ("llama.feed_forward_length", Value::U32(s.ffn as u32)),
        ("llama.attention.head_count", Value::U32(s.heads)),
        ("llama.attention.head_count_kv", Value::U32(s.kv_heads)),
        ("llama.rope.freq_base", Value::F32(s.rope_base)),
        ("llama.rope.dimension_count", Value::U32(hd as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", Value::U32(s.vocab as u32)),
    ];
    for (k, v) in kv {
        w.add(k, v)?;
    }
    let n = s.vocab as usize;
    let (bos, eos) = (n - 2, n - 1);
    let mut tokens: Vec<String> = byte_tokens().into_iter().take(n - 2).collect();
    let mut types = vec![1i32; tokens.len()];
    while tokens.len() < bos {
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
        types.push(3);
    }
    tokens.push("<|begin_of_text|>".into());
    tokens.push("<|end_of_text|>".into());
    types.extend([3, 3]);
    w.add("tokenizer.ggml.model", Value::Str("gpt2".into()))?;
    w.add("tokenizer.ggml.pre", Value::Str("default".into()))?;
    w.add(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::Str).collect()),
    )?;
    w.add(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    )?;
    w.add("tokenizer.ggml.merges", Value::Array(Vec::new()))?;
    w.add("tokenizer.ggml.bos_token_id", Value::U32(bos as u32))?;
    w.add("tokenizer.ggml.eos_token_id", Value::U32(eos as u32))?;
    Ok(())
}

/// Generates one chunk of rows of tensor `ti` and returns its stored bytes.
fn chunk_bytes(p: &Planned, seed: u64, ti: usize, chunk: u64, rows: u64) -> Result<Vec<u8>> {
    let mut rng = Rng::stream(seed, ti as u64, chunk);
    let n = (rows * p.dims[0]) as usize;
    let values: Vec<f32> = match p.init {
        Init::Uniform(a) => (0..n).map(|_| a * rng.uniform()).collect(),
        Init::Norm => (0..n).map(|_| 1.0 + 0.1 * rng.uniform()).collect(),
    };
    let mut out = vec![
        0u8;
        p.dtype
            .bytes_for(n as u64)
            .expect("invariant: planned shapes fit") as usize
    ];
    quantize(p.dtype, &values, &mut out)?;
    Ok(out)
}

/// Writes the model for `shape` with matrices in `dtype` to `path`; notes and progress (see
/// `progress`) go to stderr when `progress` is set.
pub fn write_model(
    s: &Shape,
    dtype: GgmlType,
    seed: u64,
    path: &Path,
    progress: bool,
) -> Result<()> {
    dtype.check_supported()?;
    let planned = plan(s, dtype);
    let mut w = GgufWriter::new();
    add_metadata(&mut w, s)?;
    for p in &planned {
        if progress && p.dtype != dtype && p.dims[1] > 1 && p.name != "token_embd.weight" {
            eprintln!(
                "note: {} uses {} (row length {} is not a multiple of the {dtype} block)",
                p.name, p.dtype, p.dims[0]
            );
        }
        // norms are 1-d in llama.cpp files
        let dims = match p.init {
            Init::Norm => &p.dims[..1],
            Init::Uniform(_) => &p.dims[..],
        };
        w.declare_tensor(&p.name, dims, p.dtype)?;
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut stream = w.start(BufWriter::with_capacity(1 << 22, file))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = if progress {
        let bytes = w.tensors().iter().map(|t| t.n_bytes()).sum();
        Progress::new(&format!("writing {}", path.display()), bytes, Unit::Bytes)
    } else {
        Progress::silent()
    };
    for (ti, p) in planned.iter().enumerate() {
        let rows_per_chunk = (CHUNK_VALUES / p.dims[0]).max(1);
        let n_chunks = p.dims[1].div_ceil(rows_per_chunk);
        let mut next = 0;
        while next < n_chunks {
            let batch: Vec<u64> = (next..n_chunks.min(next + 2 * threads as u64)).collect();
            next += batch.len() as u64;
            let results: Vec<Result<Vec<u8>>> = std::thread::scope(|sc| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|&c| {
                        let rows = rows_per_chunk.min(p.dims[1] - c * rows_per_chunk);
                        sc.spawn(move || chunk_bytes(p, seed, ti, c, rows))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("invariant: generation does not panic"))
                    .collect()
            });
            for r in results {
                let bytes = r?;
                stream
                    .write(&bytes)
                    .with_context(|| format!("writing {}", path.display()))?;
                report.inc(bytes.len() as u64);
            }
        }
    }
    let mut file = stream.finish()?;
    file.flush()
        .with_context(|| format!("cannot flush {}", path.display()))?;
    report.finish();
    Ok(())
}
