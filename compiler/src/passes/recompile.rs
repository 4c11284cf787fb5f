//! A plan edited by hand is refused: the executor recompiles it and compares.
//!
//! A plan records everything the compiler was given, except the placement file itself: the
//! model (its facts and weight shards, checked against the model file when there is one), the
//! runtime settings, the devices and their memory, the stages (each rank's stage, device and
//! layers), the groups' attention split and collective, the boundaries' transport and the
//! forced-eager islands with their reasons. `placement_of` rebuilds the placement from those
//! inputs, refusing what a placement's validation would refuse (stages that do not run every
//! layer of the model exactly once and in order, a group's ranks on different layers, a
//! tensor-parallel degree the model cannot split, an undeclared device); `recompile_differences`
//! compiles it with the compiler's own passes and names every field where the plan differs
//! from the result: each rank's program (its ops, segments, layer ranges and phases), its
//! tensor-parallel degree, group, buffers and weight shards, the bytes per device, the groups
//! and the boundaries. So every derived field is derived one way, by the compiler.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::compile_placement;
use crate::model::{Dtype, ModelMeta};
use crate::placement::speculative_errors;
use crate::placement::validate::{collective_errors, tp_degree_errors, transport_errors};
use crate::placement::{ForcedEager, Placement, Stage, TransportChoice};
use crate::plan::{AttentionSplit, Collective, IslandReason, Op, Plan, Rank, Step, Transport};

/// The most differences one error lists; the count of the rest follows.
const MOST_LISTED: usize = 12;

/// The placement `plan` was compiled from, rebuilt from what the plan records, for `model`
/// (the model file's, or `model_of_plan` for synthetic weights). Each error names the plan
/// field and what is allowed.
pub fn placement_of(plan: &Plan, model: &ModelMeta) -> Result<Placement, Vec<String>> {
    let mut errors = Vec::new();
    let rt = &plan.runtime;
    let kv_dtype = match Dtype::from_name(&rt.kv_dtype) {
        Some(d @ (Dtype::F32 | Dtype::F16 | Dtype::Bf16)) => d,
        _ => {
            errors.push(format!(
                "runtime.kv_dtype `{}` is not allowed; allowed: f32, f16, bf16",
                rt.kv_dtype
            ));
            Dtype::F16
        }
    };
    let attention = plan
        .groups
        .first()
        .map_or(AttentionSplit::Heads, |g| g.attention);
    if attention == AttentionSplit::Replicated && model.moe.is_none() {
        errors.push("groups: attention `replicated` is expert parallelism and this model has no experts; allowed: heads".to_string());
    }
    let collective = plan
        .groups
        .first()
        .map_or(Collective::Oneshot, |g| g.collective);
    let mut devices = BTreeMap::new();
    let mut hosts = BTreeMap::new();
    for d in &plan.devices {
        if devices.insert(d.device, d.memory_bytes).is_some() {
            errors.push(format!(
                "devices: device {} is listed twice; each device once",
                d.device
            ));
        }
        if let Some(host) = &d.host {
            hosts.insert(d.device, host.clone());
        }
    }
    let stages = stages_of(plan, model, attention, &devices, &mut errors);
    let forced_eager = forced_eager_of(plan);
    let transport = transport_of(plan);
    for e in transport_errors(transport, &stages) {
        errors.push(format!("boundaries: {e}"));
    }
    for e in collective_errors(collective, &stages) {
        errors.push(format!("groups: {e}"));
    }
    if let Some(sp) = plan.speculative {
        for (field, e) in speculative_errors(sp, rt.prefill_chunk) {
            errors.push(format!("{field}: {e}"));
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Placement {
        model_source: plan.model.source.clone(),
        devices,
        device_spans: BTreeMap::new(),
        hosts,
        max_context: rt.max_context,
        max_sequences: rt.max_sequences,
        kv_dtype,
        in_flight: rt.in_flight,
        prefill_chunk: rt.prefill_chunk,
        stages,
        capture: rt.capture,
        forced_eager,
        transport,
        collective,
        attention,
        speculative: plan.speculative,
    })
}

/// The stages the ranks form: stage `s` runs the layers of its ranks on their devices, in plan
/// order. Every layer of the model runs exactly once: the stages' ranges follow each other
/// from layer 0 to the last, and a group's ranks run the same range.
fn stages_of(
    plan: &Plan,
    model: &ModelMeta,
    attention: AttentionSplit,
    devices: &BTreeMap<u32, u64>,
    errors: &mut Vec<String>,
) -> Vec<Stage> {
    let n = model.layers;
    let count = plan
        .ranks
        .iter()
        .map(|r| r.stage)
        .max()
        .map_or(0, |s| s + 1);
    if plan.ranks.is_empty() {
        errors.push("ranks: the plan has no ranks".to_string());
        return Vec::new();
    }
    if count as usize > plan.ranks.len() {
        let r = plan
            .ranks
            .iter()
            .max_by_key(|r| r.stage)
            .expect("invariant: ranks is not empty");
        errors.push(format!(
            "rank {} stage is {}, but the plan's {} ranks make at most {} stages; stages are numbered 0, 1, ... in rank order",
            r.rank,
            r.stage,
            plan.ranks.len(),
            plan.ranks.len()
        ));
        return Vec::new();
    }
    let declared: Vec<String> = devices.keys().map(u32::to_string).collect();
    let mut stages = Vec::new();
    let mut end = 0;
    for s in 0..count {
        let ranks: Vec<&Rank> = plan.ranks.iter().filter(|r| r.stage == s).collect();
        let Some(first) = ranks.first() else {
            errors.push(format!(
                "ranks: no rank runs stage {s}; the stages of a plan are 0..{count}, each run by at least one rank"
            ));
            continue;
        };
        let layers = first.layers;
        for r in &ranks[1..] {
            if r.layers != layers {
                errors.push(format!(
                    "rank {} layers is {}, but rank {} of stage {s} runs {layers}; the ranks of a stage (a tensor-parallel group) run the same layers",
                    r.rank, r.layers, first.rank
                ));
            }
        }
        let from = match s {
            0 => "the model's first".to_string(),
            _ => format!("where stage {} ends", s - 1),
        };
        if layers.start != end {
            errors.push(format!(
                "rank {} layers is {layers}; stage {s} must start at layer {end}, {from}: every layer of the model runs exactly once, the stages in order",
                first.rank
            ));
        } else if layers.end <= layers.start || layers.end > n {
            errors.push(format!(
                "rank {} layers is {layers}; stage {s} runs layers {end}..E with E in {}..={n} (model.layers is {n})",
                first.rank,
                end + 1
            ));
        } else if s + 1 == count && layers.end != n {
            errors.push(format!(
                "rank {} layers is {layers}; the last stage must end at layer {n} (model.layers is {n}): every layer of the model runs exactly once",
                first.rank
            ));
        }
        end = layers.end;
        for r in &ranks {
            if !devices.contains_key(&r.device) {
                errors.push(format!(
                    "rank {} device is {}, which [[devices]] does not list; listed: {}",
                    r.rank,
                    r.device,
                    declared.join(", ")
                ));
            }
        }
        for e in tp_degree_errors(model, ranks.len() as u32, attention) {
            errors.push(format!("stage {s} has {} ranks: {e}", ranks.len()));
        }
        stages.push(Stage {
            layers,
            devices: ranks.iter().map(|r| r.device).collect(),
        });
    }
    stages
}

/// The layer ranges the placement forced eager, with their reasons: the layers of the plan's
/// forced islands (each rank of a group has the same; adjacent ranges of one reason merge).
fn forced_eager_of(plan: &Plan) -> Vec<ForcedEager> {
    let mut ranges: Vec<ForcedEager> = Vec::new();
    for step in plan.ranks.iter().flat_map(|r| &r.program) {
        if let Step::Island {
            reason: IslandReason::Forced(reason),
            ops,
            ..
        } = step
        {
            for op in ops {
                if let Op::Layers { layers, .. } = op {
                    ranges.push(ForcedEager {
                        layers: *layers,
                        reason: reason.clone(),
                    });
                }
            }
        }
    }
    ranges.sort_by(|a, b| (a.layers, &a.reason).cmp(&(b.layers, &b.reason)));
    let mut merged: Vec<ForcedEager> = Vec::new();
    for f in ranges {
        match merged.last_mut() {
            Some(last) if last.reason == f.reason && f.layers.start <= last.layers.end => {
                last.layers.end = last.layers.end.max(f.layers.end);
            }
            _ => merged.push(f),
        }
    }
    merged
}

/// `peer_copy` when every boundary is a peer copy and some joins ranks on one device (which
/// `auto` copies on the device), else `auto`: the boundaries' transport as the placement chose it.
fn transport_of(plan: &Plan) -> TransportChoice {
    let one_device = |from: u32, to: u32| {
        plan.rank(from)
            .zip(plan.rank(to))
            .is_some_and(|(a, b)| a.device == b.device)
    };
    let all_peer = !plan.boundaries.is_empty()
        && plan
            .boundaries
            .iter()
            .all(|b| b.transport == Transport::PeerCopy);
    if all_peer
        && plan
            .boundaries
            .iter()
            .any(|b| one_device(b.from_rank, b.to_rank))
    {
        TransportChoice::PeerCopy
    } else {
        TransportChoice::Auto
    }
}

/// Every field where `plan` differs from what its placement (`placement_of`) compiles to for
/// `model`, as `FIELD is GOT; its placement compiles to WANT`, or why the placement cannot be
/// rebuilt or compiled. `path` is the plan's, for the compiler's diagnostics. Empty when the
/// plan is exactly what the compiler writes (up to its placement hash, which covers the
/// placement file's spelling too).
pub fn recompile_differences(plan: &Plan, path: &Path, model: ModelMeta) -> Vec<String> {
    let placement = match placement_of(plan, &model) {
        Ok(p) => p,
        Err(errors) => return errors,
    };
    let mut want = match compile_placement(path, &placement, model) {
        Ok(compiled) => compiled.plan,
        Err(diagnostics) => {
            return diagnostics
                .items
                .into_iter()
                .map(|d| format!("{}: {}", d.field, d.message))
                .collect()
        }
    };
    want.placement_hash = plan.placement_hash.clone();
    let to_value = |p: &Plan| serde_json::to_value(p).expect("invariant: plan types serialize");
    let mut out = value_differences(
        "",
        &to_value(&want),
        &to_value(plan),
        "; its placement compiles to",
    );
    if out.len() > MOST_LISTED {
        let rest = out.len() - MOST_LISTED;
        out.truncate(MOST_LISTED);
        out.push(format!("and {rest} more differences"));
    }
    out
}

/// The name of element `i` of the array at `key`: ranks, devices, buffers and weights by
/// their id or name, program steps by index and run id.
fn element(at: &str, key: &str, i: usize, got: &Value) -> String {
    let field = |k: &str| {
        got.get(k)
            .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
    };
    let join = |s: String| match at {
        "" => s,
        _ => format!("{at} {s}"),
    };
    match (
        key,
        field("rank"),
        field("device"),
        field("name"),
        field("tensor"),
    ) {
        ("ranks", Some(id), ..) => join(format!("rank {id}")),
        ("devices", _, Some(id), ..) => join(format!("device {id}")),
        ("buffers", .., Some(name), _) => join(format!("buffer `{name}`")),
        ("weights", .., Some(name)) => join(format!("weight `{name}`")),
        ("program", ..) => join(match field("id").or_else(|| field("step")) {
            Some(what) => format!("program step {i} ({what})"),
            None => format!("program step {i}"),
        }),
        _ => format!("{}[{i}]", member(at, key)),
    }
}

/// The path of `key` under `at`: dotted under a table, after a space under a named element
/// (`rank 0 tp_degree`).
fn member(at: &str, key: &str) -> String {
    match at {
        "" => key.to_string(),
        _ if key.is_empty() => at.to_string(),
        _ if at.ends_with(']') || !at.contains(' ') => format!("{at}.{key}"),
        _ => format!("{at} {key}"),
    }
}

/// Every leaf under `at` where `got` differs from `want`, as `PATH is GOT{SAYS} WANT`
/// (`SAYS`, e.g. `; its placement compiles to`, names where `want` comes from), descending objects and arrays; an array of
/// another length is named with its first differing element.
pub fn value_differences(at: &str, want: &Value, got: &Value, says: &str) -> Vec<String> {
    let mut out = Vec::new();
    differences(at, "", want, got, says, &mut out);
    out
}

fn differences(at: &str, key: &str, want: &Value, got: &Value, says: &str, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let keys: std::collections::BTreeSet<&String> = w.keys().chain(g.keys()).collect();
            for k in keys {
                let (w, g) = (
                    w.get(k).unwrap_or(&Value::Null),
                    g.get(k).unwrap_or(&Value::Null),
                );
                differences(&member(at, key), k, w, g, says, out);
            }
        }
        (Value::Array(w), Value::Array(g)) if w != g => {
            if w.len() != g.len() {
                out.push(format!(
                    "{} has {} entries{says} {}",
                    member(at, key),
                    g.len(),
                    w.len()
                ));
            }
            let first_only = w.len() != g.len();
            for (i, (w, g)) in w.iter().zip(g).enumerate() {
                if w != g {
                    let name = element(at, key, i, g);
                    differences(&name, "", w, g, says, out);
                    if first_only {
                        return;
                    }
                }
            }
            if first_only {
                let (i, extra) = match w.len() < g.len() {
                    true => (w.len(), &g[w.len()]),
                    false => (g.len(), &w[g.len()]),
                };
                let verb = match w.len() < g.len() {
                    true => "is extra",
                    false => "is missing:",
                };
                out.push(format!("{} {verb} {extra}", element(at, key, i, extra)));
            }
        }
        _ if want != got => out.push(format!("{} is {got}{says} {want}", member(at, key))),
        _ => {}
    }
}
