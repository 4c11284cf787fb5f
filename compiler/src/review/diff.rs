//! A semantic diff of two execution plans, for people: which layers moved between ranks, how
//! each rank's runs and islands changed (and why islands appeared), boundaries and transports,
//! all-reduce groups, and bytes per device. Empty when the plans are the same.

use crate::plan::{Boundary, Plan, Rank, Step, TpGroup};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The semantic diff of `old` and `new`; an empty string when they are identical.
pub fn semantic_diff(old: &Plan, new: &Plan) -> String {
    if old == new {
        return String::new();
    }
    let mut out = String::new();
    let mut section = |title: &str, lines: Vec<String>| {
        if !lines.is_empty() {
            let _ = writeln!(out, "{title}:");
            for line in lines {
                let _ = writeln!(out, "  {line}");
            }
        }
    };
    section("plan", header(old, new));
    section("layers", layers(old, new));
    section("ranks", ranks(old, new));
    section("programs", programs(old, new));
    section("boundaries", boundaries(old, new));
    section("all-reduce groups", groups(old, new));
    section("bytes per device", devices(old, new));
    if out.is_empty() {
        out = "plans differ only in weight shards or buffer details; see the text diff\n".into();
    }
    out
}

fn changed<T: PartialEq + std::fmt::Display>(name: &str, a: T, b: T, out: &mut Vec<String>) {
    if a != b {
        out.push(format!("{name}: {a} -> {b}"));
    }
}

fn header(old: &Plan, new: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    changed(
        "format version",
        old.format_version,
        new.format_version,
        &mut out,
    );
    changed(
        "placement hash",
        &old.placement_hash,
        &new.placement_hash,
        &mut out,
    );
    changed("model", &old.model.name, &new.model.name, &mut out);
    changed(
        "model fingerprint",
        &old.model.fingerprint,
        &new.model.fingerprint,
        &mut out,
    );
    let (a, b) = (&old.runtime, &new.runtime);
    changed("max_context", a.max_context, b.max_context, &mut out);
    changed("max_sequences", a.max_sequences, b.max_sequences, &mut out);
    changed("kv_dtype", &a.kv_dtype, &b.kv_dtype, &mut out);
    changed("in_flight", a.in_flight, b.in_flight, &mut out);
    changed("prefill_chunk", a.prefill_chunk, b.prefill_chunk, &mut out);
    changed(
        "capture",
        format!("{:?}", a.capture),
        format!("{:?}", b.capture),
        &mut out,
    );
    out
}

/// Who runs a layer: `rank 1 (stage 1, device 0)`, or a TP group's ranks.
fn owners(plan: &Plan, layer: u32) -> String {
    let ranks: Vec<&Rank> = plan
        .ranks
        .iter()
        .filter(|r| r.layers.contains(layer))
        .collect();
    match ranks.as_slice() {
        [] => "nobody".into(),
        [r] => format!("rank {} (stage {}, device {})", r.rank, r.stage, r.device),
        many => {
            let ids: Vec<String> = many.iter().map(|r| r.rank.to_string()).collect();
            let devs: Vec<String> = many.iter().map(|r| r.device.to_string()).collect();
            format!(
                "ranks {} (stage {}, devices {})",
                ids.join(","),
                many[0].stage,
                devs.join(",")
            )
        }
    }
}

fn layers(old: &Plan, new: &Plan) -> Vec<String> {
    let n = old.model.layers.max(new.model.layers);
    let mut out = Vec::new();
    let mut start = 0;
    while start < n {
        let key = (owners(old, start), owners(new, start));
        let mut end = start + 1;
        while end < n && (owners(old, end), owners(new, end)) == key {
            end += 1;
        }
        if key.0 != key.1 {
            let what = if end - start == 1 {
                format!("layer {start}")
            } else {
                format!("layers {start}..{end}")
            };
            out.push(format!("{what} moved: {} -> {}", key.0, key.1));
        }
        start = end;
    }
    out
}

fn rank_line(r: &Rank) -> String {
    format!(
        "rank {} (stage {}, device {}, tp {}/{}, layers {})",
        r.rank, r.stage, r.device, r.tp_index, r.tp_degree, r.layers
    )
}

fn ranks(old: &Plan, new: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for r in &old.ranks {
        match new.rank(r.rank) {
            None => out.push(format!("removed {}", rank_line(r))),
            Some(n) if n.device != r.device => out.push(format!(
                "rank {} moved: device {} -> {}",
                r.rank, r.device, n.device
            )),
            _ => {}
        }
    }
    for r in new.ranks.iter().filter(|r| old.rank(r.rank).is_none()) {
        out.push(format!("added {}", rank_line(r)));
    }
    out
}

/// A run or island as a reviewer reads it.
fn work(step: &Step) -> Option<String> {
    let ops = |ops: &[crate::plan::Op]| {
        ops.iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match step {
        Step::Run {
            id, phases, ops: o, ..
        } => {
            let ph = if *phases > 1 {
                format!(" ({phases} phases)")
            } else {
                String::new()
            };
            Some(format!("run {id}{ph}: {}", ops(o)))
        }
        Step::Island {
            id, reason, ops: o, ..
        } => Some(format!("island {id} ({reason}): {}", ops(o))),
        _ => None,
    }
}

fn programs(old: &Plan, new: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for n in &new.ranks {
        let Some(o) = old.rank(n.rank) else { continue };
        if o.program == n.program {
            continue;
        }
        let before: Vec<String> = o.program.iter().filter_map(work).collect();
        let after: Vec<String> = n.program.iter().filter_map(work).collect();
        let count = |p: &[Step], island: bool| {
            p.iter()
                .filter(|s| matches!(s, Step::Island { .. }) == island && work(s).is_some())
                .count()
        };
        let (runs_a, runs_b) = (count(&o.program, false), count(&n.program, false));
        let (isl_a, isl_b) = (count(&o.program, true), count(&n.program, true));
        let mut head = format!("rank {}:", n.rank);
        if runs_a != runs_b {
            let verb = if runs_b > runs_a { "split" } else { "merged" };
            head += &format!(" runs {verb} ({runs_a} -> {runs_b})");
        }
        if isl_a != isl_b {
            head += &format!(" islands {isl_a} -> {isl_b}");
        }
        out.push(head);
        for line in &before {
            if !after.contains(line) {
                out.push(format!("  - {line}"));
            }
        }
        for line in &after {
            if !before.contains(line) {
                out.push(format!("  + {line}"));
            }
        }
        if before == after {
            out.push("  ordering steps (waits, records, copies) changed".into());
        }
    }
    out
}

fn boundary_line(b: &Boundary) -> String {
    format!(
        "b{} {} rank {} -> rank {}, {}, {} slots of {} token rows, lag {}",
        b.boundary,
        b.carries.name(),
        b.from_rank,
        b.to_rank,
        b.transport.name(),
        b.slots,
        b.tokens,
        b.lag
    )
}

fn boundaries(old: &Plan, new: &Plan) -> Vec<String> {
    removed_and_added(&old.boundaries, &new.boundaries, boundary_line)
}

/// `- line` for each entry only in `old`, then `+ line` for each only in `new`.
fn removed_and_added<T>(old: &[T], new: &[T], line: fn(&T) -> String) -> Vec<String> {
    let a: Vec<String> = old.iter().map(line).collect();
    let b: Vec<String> = new.iter().map(line).collect();
    let mut out: Vec<String> = a
        .iter()
        .filter(|l| !b.contains(l))
        .map(|l| format!("- {l}"))
        .collect();
    out.extend(
        b.iter()
            .filter(|l| !a.contains(l))
            .map(|l| format!("+ {l}")),
    );
    out
}

fn group_line(g: &TpGroup) -> String {
    format!(
        "group {} (stage {}): ranks {:?}, tree {}, {}{}",
        g.group,
        g.stage,
        g.ranks,
        g.tree,
        if g.exact {
            "bit-exact"
        } else {
            "within tolerance"
        },
        if g.attention.is_heads() {
            ""
        } else {
            ", attention replicated"
        }
    )
}

fn groups(old: &Plan, new: &Plan) -> Vec<String> {
    removed_and_added(&old.groups, &new.groups, group_line)
}

fn size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

fn delta(a: u64, b: u64) -> String {
    let d = b as i128 - a as i128;
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{}", size(d.unsigned_abs() as u64))
}

fn devices(old: &Plan, new: &Plan) -> Vec<String> {
    let mut all: BTreeMap<u32, (Option<_>, Option<_>)> = BTreeMap::new();
    for d in &old.devices {
        all.entry(d.device).or_default().0 = Some(d);
    }
    for d in &new.devices {
        all.entry(d.device).or_default().1 = Some(d);
    }
    // the state's, the runtime's, the transport's and launch's bytes change with some plans
    // only
    let changed = |what: &str, a: u64, b: u64| {
        if a == b {
            String::new()
        } else {
            format!(", {what} {}", delta(a, b))
        }
    };
    let mut out = Vec::new();
    for (device, pair) in all {
        match pair {
            (Some(a), Some(b))
                if a.total_bytes != b.total_bytes || a.launch_bytes != b.launch_bytes =>
            {
                out.push(format!(
                    "device {device}: {} -> {} ({}; weights {}, kv {}{}, buffers {}{}{}{})",
                    size(a.total_bytes),
                    size(b.total_bytes),
                    delta(a.total_bytes, b.total_bytes),
                    delta(a.weight_bytes, b.weight_bytes),
                    delta(a.kv_bytes, b.kv_bytes),
                    changed("state", a.state_bytes, b.state_bytes),
                    delta(a.buffer_bytes, b.buffer_bytes),
                    changed("cuda runtime", a.runtime_bytes, b.runtime_bytes),
                    changed("transport", a.transport_bytes, b.transport_bytes),
                    changed("launched", a.launch_bytes, b.launch_bytes)
                ))
            }
            (Some(a), None) => out.push(format!(
                "device {device}: removed ({})",
                size(a.total_bytes)
            )),
            (None, Some(b)) => {
                out.push(format!("device {device}: added ({})", size(b.total_bytes)))
            }
            _ => {}
        }
    }
    out
}
