//! Turning a planned model into a GGUF file: the architecture's metadata, a byte-level gpt2
//! tokenizer sized to the vocabulary (llama.cpp loads it for every architecture), then the
//! tensors streamed in file order. Tensors are generated in fixed-size row chunks, each from
//! its own seeded stream, so the bytes depend only on the seed, never on the thread count.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Result;

use super::plan::{Init, Planned};
use crate::output::write_atomically;
use crate::progress::{Progress, Unit};
use crate::rng::Rng;
use crate::{quantize, GgmlType, GgufWriter, Value};

/// Rows per generation chunk are chosen so a chunk holds about this many values.
const CHUNK_VALUES: u64 = 1 << 20;

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

/// Adds a byte-level gpt2 tokenizer of `vocab` tokens: bytes first, reserved tokens to fill,
/// then begin-of-text and end-of-text as the last two ids.
fn add_tokenizer(w: &mut GgufWriter, vocab: u64) -> Result<()> {
    let n = vocab as usize;
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
        Init::Around { center, half } => (0..n).map(|_| center + half * rng.uniform()).collect(),
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

/// The facts every synthetic model's metadata starts with.
pub(crate) struct Head<'a> {
    pub arch: &'static str,
    pub name: &'a str,
    pub layers: u32,
    pub context: u32,
    pub dim: u64,
    pub ffn: u64,
    pub heads: u32,
}

/// The [`Head`] of `s`, a shape with its fields (`name`, `layers`, `context`, `dim`, `ffn`,
/// `heads`), as architecture `arch` (`Head` in scope where it is used); with `ffn`, that FFN
/// width instead of `s.ffn`.
macro_rules! head_of {
    ($arch:expr, $s:expr) => {
        head_of!($arch, $s, $s.ffn)
    };
    ($arch:expr, $s:expr, $ffn:expr) => {
        Head {
            arch: $arch,
            name: $s.name,
            layers: $s.layers,
            context: $s.context,
            dim: $s.dim,
            ffn: $ffn,
            heads: $s.heads,
        }
    };
}
pub(crate) use head_of;

/// `h`'s entries (architecture, name, block count, context, width, FFN width, heads), then
/// `rest`, in file order (unprefixed, for `keyed`).
pub(crate) fn common_head<const N: usize>(
    h: Head,
    rest: [(&'static str, Value); N],
) -> Vec<(&'static str, Value)> {
    let mut kv = vec![
        ("general.architecture", Value::Str(h.arch.into())),
        (
            "general.name",
            Value::Str(format!("memra-synth {}", h.name)),
        ),
        ("block_count", Value::U32(h.layers)),
        ("context_length", Value::U32(h.context)),
        ("embedding_length", Value::U32(h.dim as u32)),
        ("feed_forward_length", Value::U32(h.ffn as u32)),
        ("attention.head_count", Value::U32(h.heads)),
    ];
    kv.extend(rest);
    kv
}

/// Metadata entries in the given order, `general.*` keys as given and the others as
/// `arch.key`.
pub(crate) fn keyed(arch: &str, kv: Vec<(&str, Value)>) -> Vec<(String, Value)> {
    kv.into_iter()
        .map(|(k, v)| match k.starts_with("general.") {
            true => (k.to_string(), v),
            false => (format!("{arch}.{k}"), v),
        })
        .collect()
}

/// A model ready to be written: metadata keys in file order, vocabulary size and tensors.
pub(crate) struct Spec {
    pub metadata: Vec<(String, Value)>,
    pub vocab: u64,
    pub tensors: Vec<Planned>,
}

/// Writes `spec` to `path`, drawing values from `seed`; notes (every tensor whose type fell
/// back from `dtype`) and progress (see `crate::progress`) go to stderr when `progress` is set.
pub(crate) fn write_spec(
    spec: &Spec,
    dtype: GgmlType,
    seed: u64,
    path: &Path,
    progress: bool,
) -> Result<()> {
    let mut w = GgufWriter::new();
    for (k, v) in &spec.metadata {
        w.add(k, v.clone())?;
    }
    add_tokenizer(&mut w, spec.vocab)?;
    for p in &spec.tensors {
        if progress && p.fell_back {
            eprintln!(
                "note: {} uses {} (row length {} is not a multiple of the {dtype} block)",
                p.name, p.dtype, p.dims[0]
            );
        }
        w.declare_tensor(&p.name, &p.dims, p.dtype)?;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = if progress {
        let bytes = w.tensors().iter().map(|t| t.n_bytes()).sum();
        Progress::new(&format!("writing {}", path.display()), bytes, Unit::Bytes)
    } else {
        Progress::silent()
    };
    write_atomically(path, |file| {
        let mut stream = w.start(BufWriter::with_capacity(1 << 22, file))?;
        for (ti, p) in spec.tensors.iter().enumerate() {
            let rows_per_chunk = (CHUNK_VALUES / p.dims[0]).max(1);
            let n_chunks = p.rows().div_ceil(rows_per_chunk);
            let mut next = 0;
            while next < n_chunks {
                let batch: Vec<u64> = (next..n_chunks.min(next + 2 * threads as u64)).collect();
                next += batch.len() as u64;
                let results: Vec<Result<Vec<u8>>> = std::thread::scope(|sc| {
                    let handles: Vec<_> = batch
                        .iter()
                        .map(|&c| {
                            let rows = rows_per_chunk.min(p.rows() - c * rows_per_chunk);
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
                    stream.write(&bytes)?;
                    report.inc(bytes.len() as u64);
                }
            }
        }
        Ok(stream.finish()?.flush()?)
    })?;
    report.finish();
    Ok(())
}
