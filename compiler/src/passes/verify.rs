//! Pass 7, verify. Two halves:
//!
//! - `verify_graph`, before partition: the decode graph is acyclic, each rank's schedule is a
//!   topological order, each rank holds exactly its stage's layers, cross-rank edges are only
//!   boundaries, all-reduces and gathers inside one group.
//! - `verify_plan`, on the finished plan (the executor can run it too): memory fit per
//!   device, buffer ownership (no scratch, cache, state or IO buffer is shared by two ranks),
//!   the boundary communicators `launch` takes counted per device, KDA state sized to the
//!   layers and heads it serves, and happens-before (the KV cache and the KDA state, which
//!   every token reads and rewrites, are accesses like any other). The schedule is replayed
//!   for several decode steps in the host's enqueue order with CUDA's event semantics (a
//!   wait binds to the latest record enqueued before it), tracking a vector clock per stream.
//!   Every pair of accesses to one buffer from two streams, at least one a write, must be
//!   ordered; a slot rewritten before its reader has copied it away is the same check (write
//!   after read).

use super::allocate::{crossing_ends, NCCL_COMMUNICATOR_BYTES};
use super::build::layer_segments;
use super::shard::ends_partial;
use crate::graph::{DecodeGraph, NodeKind};
use crate::model::ModelMeta;
use crate::plan::{
    event_slot, AttentionSplit, BufferKind, Carries, Mixer, Op, Plan, Segment, Step,
};
use petgraph::algo::is_cyclic_directed;
use std::collections::BTreeMap;

/// Structural checks of the sharded, placed graph; each string is one violation.
pub fn verify_graph(
    g: &DecodeGraph,
    model: &ModelMeta,
    topo: &super::Topology,
    attention: AttentionSplit,
) -> Vec<String> {
    let mut errors = Vec::new();
    if is_cyclic_directed(&g.graph) {
        errors.push("the decode graph has a cycle".to_string());
    }
    for rank in &topo.ranks {
        let nodes = &g.schedule[rank.rank as usize];
        let position: BTreeMap<_, _> = nodes.iter().enumerate().map(|(i, &ix)| (ix, i)).collect();
        for (i, &ix) in nodes.iter().enumerate() {
            for e in g.graph.edges_directed(ix, petgraph::Direction::Incoming) {
                use petgraph::visit::EdgeRef;
                if let Some(&j) = position.get(&e.source()) {
                    if j >= i {
                        errors.push(format!(
                            "{} reads from {}, which is scheduled after it",
                            DecodeGraph::label(&g.graph[ix]),
                            DecodeGraph::label(&g.graph[e.source()])
                        ));
                    }
                }
            }
        }
        for layer in rank.layers.start..rank.layers.end {
            let mut want = layer_segments(model, layer);
            if rank.tp_degree > 1 {
                want = with_reduces(want, attention);
            }
            let have: Vec<Segment> = g
                .rank_nodes(rank.rank)
                .filter_map(|n| match n.kind {
                    NodeKind::Layer { layer: l, segment } if l == layer => Some(segment),
                    _ => None,
                })
                .collect();
            if have != want {
                errors.push(format!(
                    "rank {} layer {layer} has segments {have:?}, expected {want:?}",
                    rank.rank
                ));
            }
        }
    }
    for (from, to, tensor) in g.edges() {
        if from.rank == to.rank {
            continue;
        }
        let (a, b) = (
            &topo.ranks[from.rank as usize],
            &topo.ranks[to.rank as usize],
        );
        let allowed = match (&from.kind, &to.kind) {
            (NodeKind::Send { boundary: x }, NodeKind::Recv { boundary: y }) => x == y,
            (
                _,
                NodeKind::Layer {
                    segment: Segment::AllReduce,
                    ..
                },
            )
            | (_, NodeKind::GatherLogits) => a.stage == b.stage,
            _ => false,
        };
        if !allowed {
            errors.push(format!(
                "{} hands `{}` to {} on another rank outside a boundary or collective",
                DecodeGraph::label(from),
                tensor.name,
                DecodeGraph::label(to)
            ));
        }
        if tensor.name == "hidden" && tensor.elems != model.residual_width() {
            errors.push(format!(
                "hidden state of {} elements, expected {}",
                tensor.elems,
                model.residual_width()
            ));
        }
    }
    errors
}

/// Segments with an all-reduce after each partial sum.
fn with_reduces(segments: Vec<Segment>, attention: AttentionSplit) -> Vec<Segment> {
    let mut out = Vec::new();
    for &segment in &segments {
        out.push(segment);
        if ends_partial(&segments, segment, attention) {
            out.push(Segment::AllReduce);
        }
    }
    out
}

/// A device over its declared memory: `(device, message)`.
pub fn memory_overflows(plan: &Plan) -> Vec<(u32, String)> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    plan.devices
        .iter()
        .filter(|u| u.total_bytes > u.memory_bytes)
        .map(|u| {
            (
                u.device,
                format!(
                    "device {} needs {:.2} GiB (weights {:.2}, kv {:.2}, buffers {:.2}, cuda runtime {:.2}, transport {:.2}) but declares {:.2} GiB; lower runtime.max_context, runtime.max_sequences or runtime.prefill_chunk, or spread the model over more devices",
                    u.device,
                    gib(u.total_bytes),
                    gib(u.weight_bytes),
                    gib(u.kv_bytes),
                    gib(u.buffer_bytes),
                    gib(u.runtime_bytes),
                    gib(u.transport_bytes),
                    gib(u.memory_bytes)
                ),
            )
        })
        .collect()
}

/// A device over its declared memory once launched one process per device (its
/// `launch_bytes` on top of `total_bytes`): `launch` refuses such a plan on cuda.
pub fn launched_overflows(plan: &Plan) -> Vec<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    plan.devices
        .iter()
        .filter(|u| u.total_bytes.saturating_add(u.launch_bytes) > u.memory_bytes)
        .map(|u| {
            format!(
                "device {} needs {:.2} GiB launched one process per device ({:.2} in one process and {:.2} for its boundary communicators) but declares {:.2} GiB; run the plan in one process (memra-run without launch), lower runtime.max_context, runtime.max_sequences or runtime.prefill_chunk, or spread the model over more devices",
                u.device,
                gib(u.total_bytes.saturating_add(u.launch_bytes)),
                gib(u.total_bytes),
                gib(u.launch_bytes),
                gib(u.memory_bytes)
            )
        })
        .collect()
}

/// The runtime settings the placement allows (a plan edited by hand may hold others).
fn runtime_ranges(plan: &Plan) -> Vec<String> {
    use crate::placement::validate::{MAX_CONTEXT, MAX_IN_FLIGHT, MAX_SEQUENCES};
    let rt = &plan.runtime;
    // as the placement's validation: no context past the model's own
    let model_ctx = i64::from(plan.model.context_length);
    let context = match MAX_CONTEXT.min(model_ctx) {
        max if max < MAX_CONTEXT => (max, " (the model's context_length)"),
        max => (max, ""),
    };
    [
        ("max_context", rt.max_context, context),
        ("max_sequences", rt.max_sequences, (MAX_SEQUENCES, "")),
        ("in_flight", rt.in_flight, (MAX_IN_FLIGHT, "")),
    ]
    .into_iter()
    .filter(|&(_, v, (max, _))| v == 0 || i64::from(v) > max)
    .map(|(name, v, (max, why))| format!("runtime.{name} {v} must be in 1..={max}{why}"))
    .collect()
}

/// A hidden-state boundary carries a DSA selection exactly when a shared-indexer layer at or
/// after the receiver's first layer reads a full layer before it (the receiving stage could
/// not select again: the full layer's indexer cache is on the sender's side), and its row is
/// the residual then that selection.
fn selections(plan: &Plan) -> Vec<String> {
    let m = &plan.model;
    let residual = u64::from(m.embedding) * m.mhc.as_ref().map_or(1, |h| u64::from(h.streams));
    let mut errors = Vec::new();
    for b in plan
        .boundaries
        .iter()
        .filter(|b| b.carries == Carries::Hidden)
    {
        let Some(to) = plan.rank(b.to_rank) else {
            continue;
        };
        let cut = to.layers.start;
        let want = match m.selection_crosses(cut) {
            true => m
                .dsa
                .as_ref()
                .map_or(0, |d| d.selection_values(plan.runtime.max_context)),
            false => 0,
        };
        if b.selection != want {
            errors.push(format!(
                "boundary {} carries {} selection values per row; the cut before layer {cut} needs {want} (a shared-indexer layer after a cut that reads a full layer before it receives its selection; none otherwise)",
                b.boundary, b.selection
            ));
        }
        let row = 4 * (residual + u64::from(b.selection));
        if b.bytes != row {
            errors.push(format!(
                "boundary {} carries rows of {} bytes; a hidden-state row is {row} bytes (the residual, then {} selection values)",
                b.boundary, b.bytes, b.selection
            ));
        }
    }
    errors
}

/// A prefill step runs the decode program on up to `runtime.prefill_chunk` token rows: every
/// buffer holds at most that many, a hidden-state boundary exactly that many (a chunk's rows
/// all cross it), a token boundary one, and a boundary's slot buffers as many as it carries.
fn token_rows(plan: &Plan) -> Vec<String> {
    use crate::placement::validate::MAX_PREFILL_CHUNK;
    let chunk = plan.runtime.prefill_chunk;
    let mut errors = Vec::new();
    let most = i64::from(plan.runtime.max_context).min(MAX_PREFILL_CHUNK);
    if chunk == 0 || i64::from(chunk) > most {
        errors.push(format!(
            "runtime.prefill_chunk {chunk} must be in 1..={most}"
        ));
    }
    for b in &plan.boundaries {
        let want = match b.carries {
            Carries::Hidden => chunk,
            Carries::Token => 1,
        };
        if b.tokens != want {
            errors.push(format!(
                "boundary {} carries {} token rows of {}; it must carry {want}",
                b.boundary,
                b.tokens,
                b.carries.name()
            ));
        }
        for r in &plan.ranks {
            for buf in r
                .buffers
                .iter()
                .filter(|x| x.name == b.tx() || x.name == b.rx())
            {
                if buf.tokens != b.tokens || buf.bytes != b.bytes {
                    errors.push(format!(
                        "rank {} buffer `{}` holds {} rows of {} bytes but boundary {} carries {} rows of {}",
                        r.rank, buf.name, buf.tokens, buf.bytes, b.boundary, b.tokens, b.bytes
                    ));
                }
            }
        }
    }
    for r in &plan.ranks {
        for buf in r
            .buffers
            .iter()
            .filter(|x| x.tokens == 0 || x.tokens > chunk)
        {
            errors.push(format!(
                "rank {} buffer `{}` holds {} token rows; allowed: 1..={chunk} (runtime.prefill_chunk)",
                r.rank, buf.name, buf.tokens
            ));
        }
    }
    errors
}

/// One access of a step to a buffer.
struct Access {
    buffer: String,
    slot: u32,
    write: bool,
}

/// An earlier access to a buffer: its stream, that stream's clock tick, its kind, its step.
struct PastAccess {
    stream: usize,
    tick: u64,
    write: bool,
    label: String,
}

/// The buffers a step reads and writes on `rank` at decode step `t`.
fn accesses(plan: &Plan, rank: u32, step: &Step, t: u64) -> Result<Vec<Access>, String> {
    let r = plan.rank(rank).expect("invariant: rank exists");
    let find = |kind: BufferKind, suffix: &str| -> Result<String, String> {
        r.buffers
            .iter()
            .find(|b| b.kind == kind && b.name.ends_with(suffix))
            .map(|b| b.name.clone())
            .ok_or_else(|| {
                format!("rank {rank} needs a {kind:?} buffer `*{suffix}` but declares none")
            })
    };
    let acc = |buffer: String, write: bool| Access {
        buffer,
        slot: 0,
        write,
    };
    // The step's sequence picks its token slot.
    let seq = (t % u64::from(plan.runtime.max_sequences)) as u32;
    let token = |write: bool| {
        find(BufferKind::Io, ".token").map(|buffer| Access {
            buffer,
            slot: seq,
            write,
        })
    };
    let mut out = Vec::new();
    let boundaries = |carries: Carries, to_me: bool| {
        plan.boundaries.iter().filter(move |b| {
            b.carries == carries
                && if to_me {
                    b.to_rank == rank
                } else {
                    b.from_rank == rank
                }
        })
    };
    match step {
        Step::Record { .. } | Step::Wait { .. } => {}
        Step::Copy { boundary, .. } => {
            let b = plan.boundary(*boundary).ok_or_else(|| {
                format!("rank {rank} copies boundary {boundary}, which does not exist")
            })?;
            let slot = b.recv_slot(t);
            out.push(Access {
                buffer: b.tx(),
                slot,
                write: false,
            });
            out.push(Access {
                buffer: b.rx(),
                slot,
                write: true,
            });
        }
        Step::Readback { .. } => {
            out.push(acc(find(BufferKind::Io, ".logits")?, false));
            out.push(token(false)?);
        }
        Step::Run { ops, .. } | Step::Island { ops, .. } => {
            let act = find(BufferKind::Scratch, ".act")?;
            for op in ops {
                match op {
                    Op::Embed => {
                        match boundaries(Carries::Token, true).next() {
                            Some(b) => out.push(Access {
                                buffer: b.rx(),
                                slot: b.recv_slot(t),
                                write: false,
                            }),
                            None => out.push(token(false)?),
                        }
                        out.push(acc(act.clone(), true));
                    }
                    Op::Layers { segments, .. } => {
                        out.push(acc(act.clone(), true));
                        // DSA's indexer rows live beside the latent rows
                        if segments.contains(&Segment::AttnCore)
                            || segments.contains(&Segment::MlaCore)
                            || segments.contains(&Segment::DsaSelect)
                        {
                            out.push(acc(find(BufferKind::Kv, ".kv")?, true));
                        }
                        // KDA's windows and recurrent states: read and rewritten in place
                        if segments.contains(&Segment::KdaPre)
                            || segments.contains(&Segment::KdaCore)
                        {
                            out.push(acc(find(BufferKind::State, ".state")?, true));
                        }
                    }
                    Op::LoadHidden => {
                        for b in boundaries(Carries::Hidden, true) {
                            out.push(Access {
                                buffer: b.rx(),
                                slot: b.recv_slot(t),
                                write: false,
                            });
                        }
                        out.push(acc(act.clone(), true));
                    }
                    Op::StoreHidden => {
                        out.push(acc(act.clone(), false));
                        for b in boundaries(Carries::Hidden, false) {
                            out.push(Access {
                                buffer: b.tx(),
                                slot: b.send_slot(t),
                                write: true,
                            });
                        }
                    }
                    Op::StoreToken => {
                        out.push(token(false)?);
                        for b in boundaries(Carries::Token, false) {
                            out.push(Access {
                                buffer: b.tx(),
                                slot: b.send_slot(t),
                                write: true,
                            });
                        }
                    }
                    Op::Head | Op::GatherLogits => {
                        out.push(acc(act.clone(), false));
                        out.push(acc(find(BufferKind::Io, ".logits")?, true));
                    }
                    Op::Sample => {
                        out.push(acc(find(BufferKind::Io, ".logits")?, false));
                        out.push(token(true)?);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Ownership and happens-before checks of a plan's schedule; each string is one violation.
pub fn verify_plan(plan: &Plan) -> Vec<String> {
    let mut errors = runtime_ranges(plan);
    if !errors.is_empty() {
        // the replay below takes its steps and sequences from these settings
        return errors;
    }
    // Ownership: each buffer is declared by exactly one rank; slots by their boundary's ends.
    let mut owners: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for r in &plan.ranks {
        for b in &r.buffers {
            owners.entry(&b.name).or_default().push(r.rank);
            if b.kind != BufferKind::Slot && !b.name.starts_with(&format!("r{}.", r.rank)) {
                errors.push(format!(
                    "rank {} declares {:?} buffer `{}`, which belongs to another rank; scratch, caches and IO are never shared between ranks",
                    r.rank, b.kind, b.name
                ));
            }
        }
    }
    for (name, ranks) in &owners {
        if ranks.len() > 1 {
            errors.push(format!(
                "buffer `{name}` is declared by ranks {ranks:?}; no buffer is shared between ranks"
            ));
        }
    }
    errors.extend(state_sizes(plan));
    errors.extend(launch_transport(plan));
    errors.extend(token_rows(plan));
    errors.extend(selections(plan));
    // Happens-before, by vector clocks over every (rank, stream).
    let mut stream_ix: BTreeMap<(u32, &str), usize> = BTreeMap::new();
    for r in &plan.ranks {
        for s in &r.streams {
            let n = stream_ix.len();
            stream_ix.insert((r.rank, s.as_str()), n);
        }
    }
    let n = stream_ix.len();
    let mut clocks = vec![vec![0u64; n]; n];
    let mut events: BTreeMap<(String, u32), Vec<u64>> = BTreeMap::new();
    // Per (buffer, slot): earlier accesses as (stream, its clock tick, write, label).
    let mut history: BTreeMap<(String, u32), Vec<PastAccess>> = BTreeMap::new();
    // Enough decode steps for every slot and every sequence's turn to come round twice.
    let replay_steps = 2 * u64::from(plan.runtime.max_sequences + 2);
    for t in 0..replay_steps {
        for r in &plan.ranks {
            for step in &r.program {
                let Some(&s) = stream_ix.get(&(r.rank, step.stream())) else {
                    errors.push(format!(
                        "rank {} uses stream `{}`, which it does not declare",
                        r.rank,
                        step.stream()
                    ));
                    continue;
                };
                clocks[s][s] += 1;
                match step {
                    Step::Record { event, .. } => {
                        let key = (
                            event.clone(),
                            event_slot(&plan.boundaries, event, r.rank, t),
                        );
                        events.insert(key, clocks[s].clone());
                    }
                    Step::Wait { event, .. } => {
                        let key = (
                            event.clone(),
                            event_slot(&plan.boundaries, event, r.rank, t),
                        );
                        if let Some(c) = events.get(&key) {
                            for (mine, theirs) in clocks[s].iter_mut().zip(c) {
                                *mine = (*mine).max(*theirs);
                            }
                        }
                    }
                    _ => {
                        let list = match accesses(plan, r.rank, step, t) {
                            Ok(list) => list,
                            Err(e) => {
                                errors.push(e);
                                continue;
                            }
                        };
                        let label = format!("step {t} rank {} {}", r.rank, describe(step));
                        for a in list {
                            let past = history.entry((a.buffer.clone(), a.slot)).or_default();
                            for p in past.iter() {
                                let (ps, tick, pw, plabel) = (p.stream, p.tick, p.write, &p.label);
                                if ps != s && (a.write || pw) && clocks[s][ps] < tick {
                                    errors.push(format!(
                                        "race on `{}[{}]`: {} ({}) is not ordered after {} ({}); add an event from the first stream to the second",
                                        a.buffer,
                                        a.slot,
                                        label,
                                        if a.write { "write" } else { "read" },
                                        plabel,
                                        if pw { "write" } else { "read" }
                                    ));
                                }
                            }
                            past.push(PastAccess {
                                stream: s,
                                tick: clocks[s][s],
                                write: a.write,
                                label: label.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    errors.sort();
    errors.dedup();
    errors
}

/// Every device counts the two-rank NCCL communicators of its boundary ends to other
/// devices as `launch_bytes`: a plan cannot leave out what `launch` will take.
fn launch_transport(plan: &Plan) -> Vec<String> {
    let device_of = |rank: u32| plan.rank(rank).map(|r| r.device);
    plan.devices
        .iter()
        .filter_map(|u| {
            let ends = crossing_ends(u.device, &plan.boundaries, device_of);
            let want = ends * NCCL_COMMUNICATOR_BYTES;
            (u.launch_bytes != want).then(|| {
                format!(
                    "device {} counts launch_bytes {} but its {ends} boundary ends to other devices take {want} when launched one process per device ({NCCL_COMMUNICATOR_BYTES} bytes per two-rank nccl communicator)",
                    u.device, u.launch_bytes
                )
            })
        })
        .collect()
}

/// Every rank running KDA layers holds state buffers of exactly their convolution windows and
/// recurrent states (f32, per held head, layer and sequence): a plan cannot under-allocate the
/// state a token leaves for the next.
fn state_sizes(plan: &Plan) -> Vec<String> {
    let Some(kda) = &plan.model.kda else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    for r in &plan.ranks {
        let layers = (r.layers.start..r.layers.end)
            .filter(|&l| plan.model.layer_kind(l).mixer == Mixer::Kda)
            .count() as u64;
        let split = r
            .group
            .and_then(|g| plan.groups.iter().find(|x| x.group == g))
            .is_some_and(|g| g.attention == AttentionSplit::Heads);
        let heads = match split {
            true => plan.model.heads / r.tp_degree,
            false => plan.model.heads,
        };
        // a speculative plan keeps the state after each verify row but the last
        let copies = 1 + plan.speculative.map_or(0, |sp| u64::from(sp.tokens));
        let want =
            layers * u64::from(plan.runtime.max_sequences) * kda.state_elems(heads) * 4 * copies;
        let have: u64 = r
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::State)
            .map(|b| b.bytes * u64::from(b.slots))
            .sum();
        if have != want {
            errors.push(format!(
                "rank {} holds {have} bytes of KDA state; its {layers} KDA layers of {heads} heads need {want}",
                r.rank
            ));
        }
    }
    errors
}

fn describe(step: &Step) -> String {
    match step {
        Step::Run { id, .. } | Step::Island { id, .. } => id.clone(),
        Step::Copy { boundary, .. } => format!("copy b{boundary}"),
        Step::Readback { .. } => "readback".to_string(),
        Step::Record { event, .. } => format!("record {event}"),
        Step::Wait { event, .. } => format!("wait {event}"),
    }
}
