//! The placement plan a person writes: TOML parsed into raw structs (spans kept), then
//! validated against the model into a typed `Placement`. Validation reports every error at
//! once, each with `file:line:col`, the field and what is allowed.

use crate::diag::{Collector, Diagnostics};
use crate::model::{read_config, read_gguf, Dtype, ModelMeta};
use crate::plan::{AttentionSplit, CaptureMode, LayerRange, Speculative};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

mod speculative;
pub(crate) mod validate;

/// Prompt tokens per prefill step when the placement names none (capped by the context).
pub const DEFAULT_PREFILL_CHUNK: u32 = 512;

pub(crate) use speculative::speculative_errors;
pub use validate::even_split;
use validate::validate;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    model: Spanned<RawModel>,
    devices: Option<Spanned<Vec<Spanned<RawDevices>>>>,
    runtime: Option<RawRuntime>,
    pipeline: Spanned<RawPipeline>,
    capture: Option<RawCapture>,
    transport: Option<RawTransport>,
    parallel: Option<RawParallel>,
    speculative: Option<Spanned<RawSpeculative>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpeculative {
    draft: Option<Spanned<String>>,
    tokens: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParallel {
    attention: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    gguf: Option<Spanned<String>>,
    config: Option<Spanned<String>>,
    weight_dtype: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevices {
    ids: Spanned<Vec<Spanned<i64>>>,
    memory_gib: Spanned<f64>,
    host: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    max_context: Option<Spanned<i64>>,
    max_sequences: Option<Spanned<i64>>,
    kv_dtype: Option<Spanned<String>>,
    in_flight: Option<Spanned<i64>>,
    prefill_chunk: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    stages: Option<Spanned<i64>>,
    cuts: Option<Spanned<Vec<Spanned<i64>>>>,
    devices: Spanned<Vec<Spanned<Vec<Spanned<i64>>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapture {
    mode: Option<Spanned<String>>,
    #[serde(default)]
    eager: Vec<Spanned<RawEager>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEager {
    layers: Option<Spanned<Vec<Spanned<i64>>>>,
    kinds: Option<Spanned<Vec<Spanned<String>>>>,
    reason: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransport {
    boundary: Option<Spanned<String>>,
    collective: Option<Spanned<String>>,
}

/// How boundaries move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// Same device: device copy; different devices: peer copy.
    Auto,
    DeviceCopy,
    PeerCopy,
}

pub use crate::plan::Collective;

/// One pipeline stage: its layers and its devices (several = a tensor-parallel group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub layers: LayerRange,
    pub devices: Vec<u32>,
}

/// A layer range forced eager, with the person's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedEager {
    pub layers: LayerRange,
    pub reason: String,
}

/// A validated placement, with the spans later passes need for their errors.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The model file as written in the placement.
    pub model_source: String,
    pub devices: BTreeMap<u32, u64>,
    /// Where each device was declared.
    pub device_spans: BTreeMap<u32, Range<usize>>,
    /// The host of each device whose declaration names one.
    pub hosts: BTreeMap<u32, String>,
    pub max_context: u32,
    pub max_sequences: u32,
    pub kv_dtype: Dtype,
    pub in_flight: u32,
    /// Most prompt tokens of one prefill step.
    pub prefill_chunk: u32,
    pub stages: Vec<Stage>,
    pub capture: CaptureMode,
    pub forced_eager: Vec<ForcedEager>,
    pub transport: TransportChoice,
    pub collective: Collective,
    /// How tensor-parallel groups run attention.
    pub attention: AttentionSplit,
    /// Speculative decoding, when the placement asks for it.
    pub speculative: Option<Speculative>,
}

impl Placement {
    /// A canonical text of the placement (independent of table order), for its hash.
    pub fn canonical(&self) -> String {
        let mut s = format!(
            "model={}\nctx={}\nseqs={}\nkv={}\nin_flight={}\ncapture={:?}\ntransport={:?}\n",
            self.model_source,
            self.max_context,
            self.max_sequences,
            self.kv_dtype.name(),
            self.in_flight,
            self.capture,
            self.transport
        );
        // only a non-default chunk enters the text, so older placements keep their hash
        if self.prefill_chunk != DEFAULT_PREFILL_CHUNK.min(self.max_context) {
            s += &format!("prefill_chunk={}\n", self.prefill_chunk);
        }
        // only a non-default collective enters the text, so older placements keep their hash
        if self.collective != Collective::Oneshot {
            s += &format!("collective={}\n", self.collective.name());
        }
        for (id, bytes) in &self.devices {
            s += &format!("device {id} {bytes}\n");
            // only a named host enters the text, so placements without hosts keep their hash
            if let Some(host) = self.hosts.get(id) {
                s += &format!("host {id} {host}\n");
            }
        }
        for st in &self.stages {
            s += &format!("stage {} {:?}\n", st.layers, st.devices);
        }
        for f in &self.forced_eager {
            s += &format!("eager {} {}\n", f.layers, f.reason);
        }
        // written only when set, so placements without it keep their hashes
        if self.attention == AttentionSplit::Replicated {
            s += "attention replicated\n";
        }
        if let Some(sp) = &self.speculative {
            s += &format!("speculative {} {}\n", sp.draft.name(), sp.tokens);
        }
        s
    }
}

/// Read, parse and validate a placement file, loading its model's metadata.
pub fn load(path: &Path) -> Result<(Placement, ModelMeta), Diagnostics> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| single(&file, format!("cannot read: {e}")))?;
    let text =
        String::from_utf8(bytes).map_err(|e| single(&file, format!("not utf-8 text: {e}")))?;
    let raw: RawPlacement = toml::from_str(&text).map_err(|e| {
        let mut span = e.span().unwrap_or(0..0);
        let mut message = e
            .message()
            .trim_end_matches('\n')
            .replace("expected i64", "expected an integer")
            .replace("expected f64", "expected a number");
        let mut field = field_at(&text, span.start);
        if let Some(key) = plan_version_key(&text) {
            (span, field) = (key, "format_version".to_string());
            message = format!(
                "this file is an execution plan written by memra-compile, not a placement; memra-run takes it (memra-run generate {file} --prompt TEXT){}",
                match placement_beside(path) {
                    Some(p) => format!(", and memra-compile takes its placement: memra-compile {}", p.display()),
                    None => String::new(),
                }
            );
        }
        let mut c = Collector::new(&file, &text);
        c.error(span, &field, message);
        c.finish().expect_err("invariant: one error was recorded")
    })?;
    let mut c = Collector::new(&file, &text);
    let model = load_model(&raw, path, &mut c);
    let placement = model.as_ref().map(|m| validate(&raw, m, &mut c));
    c.finish()?;
    match (placement, model) {
        (Some(p), Some(m)) => Ok((p, m)),
        _ => unreachable!("invariant: a missing model records an error"),
    }
}

/// The line of a plan's top-level `format_version` in `text`, if it is a plan's (TOML with
/// that key): what tells an execution plan from a placement.
fn plan_version_key(text: &str) -> Option<Range<usize>> {
    #[derive(Deserialize)]
    struct Version {
        format_version: Option<Spanned<toml::Value>>,
    }
    let version: Version = toml::from_str(text).ok()?;
    let value = version.format_version?.span();
    let line = text[..value.start].rfind('\n').map_or(0, |i| i + 1);
    Some(line..value.end)
}

/// `NAME.toml` beside a `NAME.plan.toml`, where it exists: the placement a plan was likely
/// compiled from.
fn placement_beside(plan: &Path) -> Option<PathBuf> {
    let name = plan.file_name()?.to_str()?;
    let placement = plan.with_file_name(format!("{}.toml", name.strip_suffix(".plan.toml")?));
    placement.is_file().then_some(placement)
}

/// The dotted field a byte offset sits in, read off the text: the last `[section]` header
/// before it and the key on its line (empty where there is none).
fn field_at(text: &str, offset: usize) -> String {
    let before = text.get(..offset).unwrap_or("");
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = match line.split_once('=') {
        Some((k, _)) if !line.trim_start().starts_with('[') => k.trim(),
        _ => return String::new(),
    };
    let section = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']'));
    match section {
        Some(s) => format!("{s}.{key}"),
        None => key.to_string(),
    }
}

fn single(file: &str, message: String) -> Diagnostics {
    Diagnostics {
        file: file.to_string(),
        items: vec![crate::diag::Diagnostic {
            line: 1,
            col: 1,
            field: String::new(),
            message,
        }],
    }
}

fn load_model(raw: &RawPlacement, path: &Path, c: &mut Collector) -> Option<ModelMeta> {
    let m = raw.model.get_ref();
    let base = path.parent().unwrap_or(Path::new("."));
    let resolve = |p: &str| -> PathBuf { base.join(p) };
    match (&m.gguf, &m.config) {
        (Some(g), None) => {
            if let Some(dt) = &m.weight_dtype {
                c.error(
                    dt.span(),
                    "model.weight_dtype",
                    "a gguf file carries its own dtypes; weight_dtype is only for `config`",
                );
            }
            read_gguf(&resolve(g.get_ref()))
                .map_err(|e| c.error(g.span(), "model.gguf", format!("{e:#}")))
                .ok()
        }
        (None, Some(cfg)) => {
            let dtype = match &m.weight_dtype {
                None => Dtype::Bf16,
                Some(dt) => match Dtype::from_name(dt.get_ref()) {
                    Some(d) => d,
                    None => {
                        c.error(
                            dt.span(),
                            "model.weight_dtype",
                            format!(
                                "unknown dtype `{}`; allowed: {}",
                                dt.get_ref(),
                                Dtype::supported_list()
                            ),
                        );
                        return None;
                    }
                },
            };
            let model = read_config(&resolve(cfg.get_ref()), dtype)
                .map_err(|e| c.error(cfg.span(), "model.config", format!("{e:#}")))
                .ok()?;
            // Quantized rows must be whole blocks.
            let span = m.weight_dtype.as_ref().map_or(cfg.span(), |d| d.span());
            if let Some(t) = model
                .tensors
                .iter()
                .find(|t| t.shape[t.shape.len() - 1] % t.dtype.block_elems() != 0)
            {
                c.error(
                    span,
                    "model.weight_dtype",
                    format!(
                        "{} stores rows in blocks of {} elements, but `{}` has rows of {}; choose a dtype whose block divides the rows",
                        dtype.name(),
                        dtype.block_elems(),
                        t.name,
                        t.shape[t.shape.len() - 1]
                    ),
                );
                return None;
            }
            Some(model)
        }
        (Some(g), Some(_)) => {
            c.error(
                g.span(),
                "model",
                "give either `gguf` or `config`, not both",
            );
            None
        }
        (None, None) => {
            c.error(
                raw.model.span(),
                "model",
                "missing the model: give `gguf = \"path\"` or `config = \"path\"`",
            );
            None
        }
    }
}
