//! Validation of a parsed placement against its model: every rule checked, every error
//! recorded with its span, the field and what is allowed.

use super::{
    Collective, ForcedEager, Placement, RawCapture, RawParallel, RawPipeline, RawPlacement,
    RawTransport, Stage, TransportChoice, DEFAULT_PREFILL_CHUNK,
};
use crate::diag::Collector;
use crate::model::{Dtype, Mixer, ModelMeta};
use crate::plan::{AttentionSplit, CaptureMode, LayerRange};
use std::collections::BTreeMap;
use std::ops::Range;
use toml::Spanned;

/// Largest accepted values; beyond them a number is a typo, not a plan.
pub(crate) const MAX_CONTEXT: i64 = 1 << 24;
pub(crate) const MAX_SEQUENCES: i64 = 4096;
pub(crate) const MAX_IN_FLIGHT: i64 = 64;
/// Largest prefill chunk: a chunk's rows are counted in 16 bits by the executors.
pub(crate) const MAX_PREFILL_CHUNK: i64 = 32768;
const MAX_DEVICE_ID: i64 = 1023;
const MAX_MEMORY_GIB: f64 = 1_048_576.0;
/// The most bytes of KV cache and KDA state, over all layers, a placement may ask for: 1024
/// devices (ids go to 1023) of the most memory one may declare (2^20 GiB), 2^60 bytes. Past it
/// no placement can hold the cache, and its byte counts (layers, times the context, times the
/// sequences, times a token's bytes) would leave 64 bits.
const MAX_CACHE_BYTES: u128 = 1 << 60;
/// Context used when the placement names none (capped by the model's own).
const DEFAULT_CONTEXT: u32 = 4096;

/// An integer field checked against `lo..=hi`.
pub(super) fn int_in(
    c: &mut Collector,
    v: &Spanned<i64>,
    field: &str,
    lo: i64,
    hi: i64,
) -> Option<u32> {
    let x = *v.get_ref();
    if (lo..=hi).contains(&x) {
        Some(x as u32)
    } else {
        c.error(
            v.span(),
            field,
            format!("{x} is out of range; allowed: {lo}..={hi}"),
        );
        None
    }
}

/// Bytes of the KV caches (and KDA states) of all the model's layers, unsplit, in u128: the
/// model's bounds keep a token's bytes small, but the placement's context and sequences
/// multiply them.
fn cache_bytes(model: &ModelMeta, context: u32, sequences: u32, kv: Dtype) -> u128 {
    let kda_layers = model.kda_layers_in(0..model.layers);
    // the latent or K/V rows of every attention layer, the indexer rows of full DSA layers
    let per_token = u128::from(model.layers - kda_layers)
        * u128::from(model.kv_bytes_per_token_layer(kv))
        + u128::from(model.indexer_bytes_per_token(0..model.layers));
    let attention = per_token * u128::from(context) * u128::from(sequences);
    let state = model.kda.as_ref().map_or(0, |k| {
        u128::from(kda_layers) * u128::from(sequences) * u128::from(k.state_elems(model.heads)) * 4
    });
    attention + state
}

pub(super) fn validate(raw: &RawPlacement, model: &ModelMeta, c: &mut Collector) -> Placement {
    let m = raw.model.get_ref();
    let model_source = m
        .gguf
        .as_ref()
        .or(m.config.as_ref())
        .map(|s| s.get_ref().clone())
        .unwrap_or_default();
    let (devices, device_spans, hosts) = validate_devices(raw, c);
    let rt = raw.runtime.as_ref();
    let model_ctx = i64::from(model.context_length);
    let max_context = match rt.and_then(|r| r.max_context.as_ref()) {
        Some(v) => int_in(c, v, "runtime.max_context", 1, MAX_CONTEXT.min(model_ctx)),
        None => Some(DEFAULT_CONTEXT.min(model.context_length)),
    };
    let max_sequences = rt
        .and_then(|r| r.max_sequences.as_ref())
        .map_or(Some(1), |v| {
            int_in(c, v, "runtime.max_sequences", 1, MAX_SEQUENCES)
        });
    let in_flight = rt.and_then(|r| r.in_flight.as_ref()).map_or(Some(1), |v| {
        int_in(c, v, "runtime.in_flight", 1, MAX_IN_FLIGHT)
    });
    // a chunk longer than the context could never be filled
    let chunk_cap = i64::from(max_context.unwrap_or(1)).min(MAX_PREFILL_CHUNK);
    let prefill_chunk = rt
        .and_then(|r| r.prefill_chunk.as_ref())
        .map_or(Some(DEFAULT_PREFILL_CHUNK.min(chunk_cap as u32)), |v| {
            int_in(c, v, "runtime.prefill_chunk", 1, chunk_cap)
        });
    let kv_dtype = match rt.and_then(|r| r.kv_dtype.as_ref()) {
        None => Dtype::F16,
        Some(v) => match Dtype::from_name(v.get_ref()) {
            Some(d @ (Dtype::F32 | Dtype::F16 | Dtype::Bf16)) => d,
            _ => {
                c.error(
                    v.span(),
                    "runtime.kv_dtype",
                    format!(
                        "unknown kv dtype `{}`; allowed: f32, f16, bf16",
                        v.get_ref()
                    ),
                );
                Dtype::F16
            }
        },
    };
    if let (Some(context), Some(sequences)) = (max_context, max_sequences) {
        let cache = cache_bytes(model, context, sequences, kv_dtype);
        if cache > MAX_CACHE_BYTES {
            let (span, field) = match rt.and_then(|r| r.max_context.as_ref()) {
                Some(v) => (v.span(), "runtime.max_context"),
                None => (
                    rt.and_then(|r| r.max_sequences.as_ref())
                        .map_or(0..0, |v| v.span()),
                    "runtime.max_sequences",
                ),
            };
            c.error(
                span,
                field,
                format!(
                    "the KV cache of {context} tokens of context times {sequences} sequences over the model's {} layers is {cache} bytes; allowed: at most {MAX_CACHE_BYTES} bytes (2^60, what 1024 devices of {MAX_MEMORY_GIB} GiB hold); lower runtime.max_context or runtime.max_sequences",
                    model.layers
                ),
            );
        }
    }
    let attention = validate_parallel(raw.parallel.as_ref(), model, c);
    let stages = validate_stages(raw.pipeline.get_ref(), model, attention, &devices, c);
    let (capture, forced_eager) = validate_capture(raw.capture.as_ref(), model, c);
    let (transport, collective) = validate_transport(raw.transport.as_ref(), &stages, c);
    let speculative = raw
        .speculative
        .as_ref()
        .and_then(|sp| super::speculative::validate(sp, prefill_chunk.unwrap_or(1), c));
    Placement {
        model_source,
        devices,
        device_spans,
        hosts,
        max_context: max_context.unwrap_or(1),
        max_sequences: max_sequences.unwrap_or(1),
        kv_dtype,
        in_flight: in_flight.unwrap_or(1),
        prefill_chunk: prefill_chunk.unwrap_or(1),
        stages,
        capture,
        forced_eager,
        transport,
        collective,
        attention,
        speculative,
    }
}

fn validate_parallel(
    raw: Option<&RawParallel>,
    model: &ModelMeta,
    c: &mut Collector,
) -> AttentionSplit {
    let Some(v) = raw.and_then(|p| p.attention.as_ref()) else {
        return AttentionSplit::Heads;
    };
    match v.get_ref().as_str() {
        "heads" => AttentionSplit::Heads,
        "replicated" if model.moe.is_some() => AttentionSplit::Replicated,
        "replicated" => {
            c.error(
                v.span(),
                "parallel.attention",
                "`replicated` is expert parallelism and this model has no experts; allowed: heads",
            );
            AttentionSplit::Heads
        }
        other => {
            c.error(
                v.span(),
                "parallel.attention",
                format!("unknown attention split `{other}`; allowed: heads, replicated"),
            );
            AttentionSplit::Heads
        }
    }
}

/// Memory per device, where each was declared, and the hosts named.
type DeviceTable = (
    BTreeMap<u32, u64>,
    BTreeMap<u32, Range<usize>>,
    BTreeMap<u32, String>,
);

/// Longest host name (DNS's limit).
const MAX_HOST_LEN: usize = 253;

fn validate_devices(raw: &RawPlacement, c: &mut Collector) -> DeviceTable {
    let mut devices = BTreeMap::new();
    let mut spans = BTreeMap::new();
    let mut hosts = BTreeMap::new();
    let Some(list) = &raw.devices else {
        c.error(
            raw.pipeline.span(),
            "devices",
            "no devices are declared; add `[[devices]]` with `ids` and `memory_gib`",
        );
        return (devices, spans, hosts);
    };
    for (i, entry) in list.get_ref().iter().enumerate() {
        let d = entry.get_ref();
        let gib = *d.memory_gib.get_ref();
        let bytes = if gib.is_finite() && gib > 0.0 && gib <= MAX_MEMORY_GIB {
            (gib * 1024.0 * 1024.0 * 1024.0) as u64
        } else {
            c.error(
                d.memory_gib.span(),
                &format!("devices[{i}].memory_gib"),
                format!("{gib} is not a memory size; allowed: a number in (0, {MAX_MEMORY_GIB}]"),
            );
            0
        };
        if d.ids.get_ref().is_empty() {
            c.error(
                d.ids.span(),
                &format!("devices[{i}].ids"),
                "the list is empty",
            );
        }
        let host = d.host.as_ref().and_then(|h| {
            let name = h.get_ref();
            let ok = !name.is_empty()
                && name.len() <= MAX_HOST_LEN
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '.' | '_'));
            if !ok {
                c.error(
                    h.span(),
                    &format!("devices[{i}].host"),
                    format!("`{name}` is not a host name; allowed: 1 to {MAX_HOST_LEN} letters, digits, `-`, `.` and `_`"),
                );
            }
            ok.then(|| name.clone())
        });
        for id in d.ids.get_ref() {
            let field = format!("devices[{i}].ids");
            let Some(id_u) = int_in(c, id, &field, 0, MAX_DEVICE_ID) else {
                continue;
            };
            if devices.insert(id_u, bytes).is_some() {
                c.error(
                    id.span(),
                    &field,
                    format!("device {id_u} is declared twice"),
                );
            }
            spans.insert(id_u, entry.span());
            if let Some(h) = &host {
                hosts.insert(id_u, h.clone());
            }
        }
    }
    (devices, spans, hosts)
}

fn declared_list(devices: &BTreeMap<u32, u64>) -> String {
    let ids: Vec<String> = devices.keys().map(u32::to_string).collect();
    if ids.is_empty() {
        "none".into()
    } else {
        ids.join(", ")
    }
}

fn validate_stages(
    p: &RawPipeline,
    model: &ModelMeta,
    attention: AttentionSplit,
    devices: &BTreeMap<u32, u64>,
    c: &mut Collector,
) -> Vec<Stage> {
    let n = model.layers;
    let dev_lists = p.devices.get_ref();
    let count = dev_lists.len() as i64;
    if count == 0 {
        c.error(
            p.devices.span(),
            "pipeline.devices",
            "no stages: give one device list per stage, e.g. [[0], [1]]",
        );
        return Vec::new();
    }
    if let Some(s) = &p.stages {
        if *s.get_ref() != count {
            c.error(
                s.span(),
                "pipeline.stages",
                format!(
                    "{} stages, but pipeline.devices lists {count}; give one device list per stage",
                    s.get_ref()
                ),
            );
            return Vec::new();
        }
    }
    if count > i64::from(n) {
        c.error(
            p.devices.span(),
            "pipeline.devices",
            format!("{count} stages for a model of {n} layers; allowed: 1..={n} stages"),
        );
        return Vec::new();
    }
    let mut stage_devices = Vec::new();
    for (s, list) in dev_lists.iter().enumerate() {
        let field = format!("pipeline.devices[{s}]");
        if list.get_ref().is_empty() {
            c.error(list.span(), &field, "a stage needs at least one device");
        }
        let mut ids = Vec::new();
        for d in list.get_ref() {
            let Some(id) = int_in(c, d, &field, 0, MAX_DEVICE_ID) else {
                continue;
            };
            if !devices.contains_key(&id) {
                c.error(
                    d.span(),
                    &field,
                    format!(
                        "device {id} is not declared; declared devices: {}",
                        declared_list(devices)
                    ),
                );
            }
            ids.push(id);
        }
        check_tp_degree(model, ids.len() as u32, attention, list.span(), &field, c);
        stage_devices.push(ids);
    }
    let bounds = match &p.cuts {
        Some(cuts) => validate_cuts(cuts, n, count, c),
        None => even_split(n, count as u32),
    };
    bounds
        .windows(2)
        .zip(stage_devices)
        .map(|(w, devices)| Stage {
            layers: LayerRange {
                start: w[0],
                end: w[1],
            },
            devices,
        })
        .collect()
}

/// Stage boundaries `[0, c1, .., n]` of an even split; the first `n % stages` stages get one
/// layer more.
pub fn even_split(n: u32, stages: u32) -> Vec<u32> {
    let (base, rem) = (n / stages, n % stages);
    let mut bounds = vec![0];
    for s in 0..stages {
        bounds.push(bounds[s as usize] + base + u32::from(s < rem));
    }
    bounds
}

fn validate_cuts(
    cuts: &Spanned<Vec<Spanned<i64>>>,
    n: u32,
    stages: i64,
    c: &mut Collector,
) -> Vec<u32> {
    let list = cuts.get_ref();
    if list.len() as i64 != stages - 1 {
        c.error(
            cuts.span(),
            "pipeline.cuts",
            format!(
                "{} cuts for {stages} stages; a plan of S stages needs S-1 cuts",
                list.len()
            ),
        );
        return even_split(n, stages as u32);
    }
    let mut bounds = vec![0u32];
    for (i, cut) in list.iter().enumerate() {
        let prev = i64::from(*bounds.last().expect("invariant: starts with 0"));
        let x = *cut.get_ref();
        if x <= prev || x >= i64::from(n) {
            c.error(
                cut.span(),
                &format!("pipeline.cuts[{i}]"),
                format!(
                    "cut {x} is not allowed; cuts must be strictly increasing inside (0, {n}), and this one must be in {}..={}",
                    prev + 1,
                    n - 1
                ),
            );
            return even_split(n, stages as u32);
        }
        bounds.push(x as u32);
    }
    bounds.push(n);
    bounds
}

fn check_tp_degree(
    model: &ModelMeta,
    tp: u32,
    attention: AttentionSplit,
    span: Range<usize>,
    field: &str,
    c: &mut Collector,
) {
    for message in tp_degree_errors(model, tp, attention) {
        c.error(span.clone(), field, message);
    }
}

/// Why `tp` ranks cannot split `model` (empty when they can): a degree must divide every
/// dimension it cuts and keep quantized blocks whole. Placements and plans are checked with it.
pub(crate) fn tp_degree_errors(
    model: &ModelMeta,
    tp: u32,
    attention: AttentionSplit,
) -> Vec<String> {
    let mut errors = Vec::new();
    if tp <= 1 {
        return errors;
    }
    let split_heads = attention == AttentionSplit::Heads;
    let mut dims = vec![("vocab", model.vocab)];
    if split_heads {
        dims.push(("attention heads", model.heads));
    }
    if model.moe.as_ref().is_none_or(|m| m.dense_layers > 0) {
        dims.push(("ffn width", model.ffn));
    }
    if let Some(moe) = &model.moe {
        dims.push(("experts", moe.experts));
        if moe.shared_expert_ffn > 0 {
            dims.push(("shared expert width", moe.shared_expert_ffn));
        }
    }
    for (what, value) in dims {
        if value % tp != 0 {
            errors.push(format!("tensor-parallel degree {tp} does not divide the model's {what} ({value}); allowed degrees divide it"));
        }
    }
    // kv heads are split when the degree divides them, copied when it is a multiple of them
    let kv = model.kv_heads;
    if split_heads && model.mla.is_none() && !kv.is_multiple_of(tp) && !tp.is_multiple_of(kv) {
        errors.push(format!("tensor-parallel degree {tp} neither divides the model's kv heads ({kv}) nor is a multiple of them; allowed degrees do one or the other"));
    }
    for t in &model.tensors {
        let split = t.rule == crate::model::ShardRule::Cols
            && (split_heads || !t.name.ends_with("attn_output.weight"));
        if split {
            let cols = t.shape[t.shape.len() - 1];
            if cols % u64::from(tp) == 0 && (cols / u64::from(tp)) % t.dtype.block_elems() != 0 {
                errors.push(format!(
                    "tensor-parallel degree {tp} cuts `{}` ({} columns, {}) inside a {}-element block; allowed degrees keep blocks whole",
                    t.name,
                    cols,
                    t.dtype.name(),
                    t.dtype.block_elems()
                ));
                break;
            }
        }
    }
    errors
}

fn validate_capture(
    raw: Option<&RawCapture>,
    model: &ModelMeta,
    c: &mut Collector,
) -> (CaptureMode, Vec<ForcedEager>) {
    let Some(raw) = raw else {
        return (CaptureMode::Graphs, Vec::new());
    };
    let modes = [
        ("graphs", CaptureMode::Graphs),
        ("eager", CaptureMode::Eager),
    ];
    let mode = validate_choice(
        raw.mode.as_ref(),
        "capture.mode",
        "mode",
        &modes,
        |_| vec![],
        c,
    );
    let n = model.layers;
    let mut forced: Vec<ForcedEager> = Vec::new();
    for (i, e) in raw.eager.iter().enumerate() {
        let entry = e;
        let e = e.get_ref();
        let (ranges, span, field) = match (&e.layers, &e.kinds) {
            (Some(layers), None) => {
                let field = format!("capture.eager[{i}].layers");
                let Some(r) = eager_range(layers, n, &field, c) else {
                    continue;
                };
                (vec![r], layers.span(), field)
            }
            (None, Some(kinds)) => {
                let field = format!("capture.eager[{i}].kinds");
                let Some(r) = eager_kinds(kinds, model, &field, c) else {
                    continue;
                };
                (r, kinds.span(), field)
            }
            _ => {
                let kinds: Vec<&str> = Mixer::ALL.iter().map(|m| m.name()).collect();
                c.error(
                    entry.span(),
                    &format!("capture.eager[{i}]"),
                    format!(
                        "give either `layers = [first, last]` or `kinds = [...]` (allowed kinds: {})",
                        kinds.join(", ")
                    ),
                );
                continue;
            }
        };
        if e.reason.get_ref().trim().is_empty() {
            c.error(
                e.reason.span(),
                &format!("capture.eager[{i}].reason"),
                "say why these layers stay eager",
            );
            continue;
        }
        for layers in ranges {
            if let Some(prev) = forced
                .iter()
                .find(|f| f.layers.start < layers.end && layers.start < f.layers.end)
            {
                c.error(
                    span.clone(),
                    &field,
                    format!(
                        "layers {layers} overlap the forced range {} given before",
                        prev.layers
                    ),
                );
                break;
            }
            forced.push(ForcedEager {
                layers,
                reason: e.reason.get_ref().trim().to_string(),
            });
        }
    }
    if mode == CaptureMode::Eager {
        if let Some(first) = raw.eager.first() {
            c.error(first.span(), "capture.eager", "capture.mode is `eager`, so every layer is eager already; remove the forced ranges or use mode = \"graphs\"");
        }
    }
    forced.sort_by_key(|f| f.layers);
    (mode, forced)
}

/// An inclusive `[first, last]` layer range of a forced-eager entry.
fn eager_range(
    l: &Spanned<Vec<Spanned<i64>>>,
    n: u32,
    field: &str,
    c: &mut Collector,
) -> Option<LayerRange> {
    if l.get_ref().len() != 2 {
        c.error(
            l.span(),
            field,
            "expected [first, last], an inclusive layer range",
        );
        return None;
    }
    let (first, last) = (
        int_in(c, &l.get_ref()[0], field, 0, i64::from(n) - 1),
        int_in(c, &l.get_ref()[1], field, 0, i64::from(n) - 1),
    );
    let (first, last) = (first?, last?);
    if first > last {
        c.error(
            l.span(),
            field,
            format!("range [{first}, {last}] ends before it starts"),
        );
        return None;
    }
    Some(LayerRange {
        start: first,
        end: last + 1,
    })
}

/// The runs of consecutive layers whose mixer is one of `kinds` (e.g. every MLA layer
/// between a hybrid model's KDA layers).
fn eager_kinds(
    kinds: &Spanned<Vec<Spanned<String>>>,
    model: &ModelMeta,
    field: &str,
    c: &mut Collector,
) -> Option<Vec<LayerRange>> {
    let present: Vec<Mixer> = Mixer::ALL
        .into_iter()
        .filter(|m| (0..model.layers).any(|l| model.layer_kind(l).mixer == *m))
        .collect();
    let names = |ms: &[Mixer]| ms.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ");
    let mut wanted = Vec::new();
    for k in kinds.get_ref() {
        match Mixer::ALL.into_iter().find(|m| m.name() == k.get_ref()) {
            Some(m) if present.contains(&m) => wanted.push(m),
            Some(m) => c.error(
                k.span(),
                field,
                format!(
                    "this model has no `{}` layers; its layers are: {}",
                    m.name(),
                    names(&present)
                ),
            ),
            None => c.error(
                k.span(),
                field,
                format!(
                    "unknown layer kind `{}`; allowed: {}",
                    k.get_ref(),
                    names(&Mixer::ALL)
                ),
            ),
        }
    }
    if wanted.len() != kinds.get_ref().len() {
        return None;
    }
    if wanted.is_empty() {
        c.error(kinds.span(), field, "name at least one layer kind");
        return None;
    }
    let mut ranges: Vec<LayerRange> = Vec::new();
    for l in (0..model.layers).filter(|&l| wanted.contains(&model.layer_kind(l).mixer)) {
        match ranges.last_mut() {
            Some(r) if r.end == l => r.end = l + 1,
            _ => ranges.push(LayerRange {
                start: l,
                end: l + 1,
            }),
        }
    }
    Some(ranges)
}

/// The choice of `choices` (name, value) that `field` names, the first when it is absent or
/// names none (an error at `key` naming the allowed ones, the value a `noun`); every message of
/// `errors` for the choice is an error at `key` too.
fn validate_choice<T: Copy>(
    field: Option<&Spanned<String>>,
    key: &str,
    noun: &str,
    choices: &[(&str, T)],
    errors: impl FnOnce(T) -> Vec<String>,
    c: &mut Collector,
) -> T {
    let Some(field) = field else {
        return choices[0].1;
    };
    let name = field.get_ref().as_str();
    let Some(&(_, choice)) = choices.iter().find(|(n, _)| *n == name) else {
        let allowed: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let message = format!("unknown {noun} `{name}`; allowed: {}", allowed.join(", "));
        c.error(field.span(), key, message);
        return choices[0].1;
    };
    for message in errors(choice) {
        c.error(field.span(), key, message);
    }
    choice
}

/// `[transport]`: how boundaries between stages move activations (`transport.boundary`), and
/// the tensor-parallel groups' transport (`transport.collective`). NCCL puts one communicator
/// rank on each device of a group, so a group whose stage lists a device twice cannot use it.
fn validate_transport(
    raw: Option<&RawTransport>,
    stages: &[Stage],
    c: &mut Collector,
) -> (TransportChoice, Collective) {
    let boundary = validate_choice(
        raw.and_then(|r| r.boundary.as_ref()),
        "transport.boundary",
        "transport",
        &[
            ("auto", TransportChoice::Auto),
            ("device_copy", TransportChoice::DeviceCopy),
            ("peer_copy", TransportChoice::PeerCopy),
        ],
        |choice| transport_errors(choice, stages),
        c,
    );
    let collective = validate_choice(
        raw.and_then(|r| r.collective.as_ref()),
        "transport.collective",
        "collective",
        &[("oneshot", Collective::Oneshot), ("nccl", Collective::Nccl)],
        |choice| collective_errors(choice, stages),
        c,
    );
    (boundary, collective)
}

/// Why boundaries between `stages` cannot use `choice` (empty when they can): a device copy
/// stays on one device, a peer copy needs two. Placements and plans are checked with it.
pub(crate) fn transport_errors(choice: TransportChoice, stages: &[Stage]) -> Vec<String> {
    let mut errors = Vec::new();
    for (i, pair) in stages.windows(2).enumerate() {
        let same = pair[0].devices == pair[1].devices;
        let all_same = pair[0]
            .devices
            .iter()
            .chain(&pair[1].devices)
            .all(|d| Some(d) == pair[0].devices.first());
        if choice == TransportChoice::DeviceCopy && !all_same {
            errors.push(format!("device_copy needs stages {i} and {} on one device; they use {:?} and {:?}; use auto or peer_copy", i + 1, pair[0].devices, pair[1].devices));
        }
        if choice == TransportChoice::PeerCopy && same && all_same {
            errors.push(format!("peer_copy needs two devices, but stages {i} and {} share device {}; use auto or device_copy", i + 1, pair[0].devices[0]));
        }
    }
    errors
}

/// Why the tensor-parallel groups of `stages` cannot use `choice` (empty when they can).
/// Placements and plans are checked with it.
pub(crate) fn collective_errors(choice: Collective, stages: &[Stage]) -> Vec<String> {
    let mut errors = Vec::new();
    if choice == Collective::Nccl {
        for (i, st) in stages.iter().enumerate() {
            let mut seen = st.devices.clone();
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                errors.push(format!("nccl needs every rank of a tensor-parallel group on its own device, but stage {i} puts two ranks on device {}; use oneshot or one device per rank", w[0]));
            }
        }
    }
    errors
}
