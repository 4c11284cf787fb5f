//! A picture of a plan in Graphviz DOT: one cluster per rank holding its program's runs (blue),
//! eager islands (orange, with their reason), boundary copies and the readback, in order;
//! boundaries are edges between ranks labelled with what they carry and how, and all-reduces
//! are dotted edges between the runs of a group's ranks.

use crate::plan::{Op, Plan, Segment, Step};
use std::fmt::Write;

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn node_id(rank: u32, i: usize) -> String {
    format!("r{rank}s{i}")
}

/// Ops shown on one line each, with layer ranges kept short.
fn ops_label(ops: &[Op]) -> String {
    ops.iter()
        .map(Op::to_string)
        .collect::<Vec<_>>()
        .join("\\l")
        + "\\l"
}

fn has_all_reduce(step: &Step) -> bool {
    step.ops().iter().any(|op| match op {
        Op::Layers { segments, .. } => segments.contains(&Segment::AllReduce),
        _ => false,
    })
}

/// The plan as DOT text.
pub fn to_dot(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "digraph plan {{");
    let _ = writeln!(s, "  rankdir=TB; compound=true; fontname=\"Helvetica\";");
    let _ = writeln!(
        s,
        "  node [fontname=\"Helvetica\", fontsize=10, shape=box, style=\"rounded,filled\"];"
    );
    let _ = writeln!(s, "  edge [fontname=\"Helvetica\", fontsize=9];");
    let _ = writeln!(
        s,
        "  label=\"{} — {} layers, placement {}, capture {:?}\"; labelloc=t;",
        escape(&plan.model.name),
        plan.model.layers,
        plan.placement_hash,
        plan.runtime.capture
    );
    for r in &plan.ranks {
        let _ = writeln!(s, "  subgraph cluster_r{} {{", r.rank);
        let _ = writeln!(
            s,
            "    label=\"rank {} · stage {} · device {} · tp {}/{} · layers {}\"; style=rounded; color=gray50;",
            r.rank, r.stage, r.device, r.tp_index, r.tp_degree, r.layers
        );
        let mut prev: Option<String> = None;
        for (i, step) in r.program.iter().enumerate() {
            let (label, color) = match step {
                Step::Run {
                    id, phases, ops, ..
                } => (
                    format!(
                        "graph run {id}{}\\l{}",
                        if *phases > 1 {
                            format!(" ({phases} phases)")
                        } else {
                            String::new()
                        },
                        ops_label(ops)
                    ),
                    "lightblue",
                ),
                Step::Island {
                    id, reason, ops, ..
                } => (
                    format!(
                        "eager island {id}\\lwhy: {}\\l{}",
                        escape(&reason.to_string()),
                        ops_label(ops)
                    ),
                    "orange",
                ),
                Step::Copy { boundary, .. } => (format!("copy b{boundary}"), "gray90"),
                Step::Readback { .. } => ("readback (logits, token)".to_string(), "palegreen"),
                Step::Record { .. } | Step::Wait { .. } => continue,
            };
            let id = node_id(r.rank, i);
            let _ = writeln!(
                s,
                "    {id} [label=\"{}\", fillcolor={color}];",
                label.replace('"', "\\\"")
            );
            if let Some(p) = prev {
                let _ = writeln!(s, "    {p} -> {id};");
            }
            prev = Some(id);
        }
        let _ = writeln!(s, "  }}");
    }
    // Boundaries: from the sender's step that stores into the slot to the receiver's copy.
    for b in &plan.boundaries {
        let store = match b.carries {
            crate::plan::Carries::Hidden => Op::StoreHidden,
            crate::plan::Carries::Token => Op::StoreToken,
        };
        let sender = plan
            .rank(b.from_rank)
            .and_then(|r| r.program.iter().position(|s| s.ops().contains(&store)));
        let receiver = plan.rank(b.to_rank).and_then(|r| {
            r.program
                .iter()
                .position(|s| matches!(s, Step::Copy { boundary, .. } if *boundary == b.boundary))
        });
        if let (Some(from), Some(to)) = (sender, receiver) {
            let style = match b.carries {
                crate::plan::Carries::Hidden => "bold",
                crate::plan::Carries::Token => "dashed",
            };
            let _ = writeln!(
                s,
                "  {} -> {} [label=\"b{} {} · {} · {} slots\", color=blue, style={style}, constraint={}];",
                node_id(b.from_rank, from),
                node_id(b.to_rank, to),
                b.boundary,
                b.carries.name(),
                b.transport.name(),
                b.slots,
                matches!(b.carries, crate::plan::Carries::Hidden)
            );
        }
    }
    // All-reduces: dotted edges between consecutive ranks of each group.
    for g in &plan.groups {
        let runs: Vec<String> = g
            .ranks
            .iter()
            .filter_map(|&r| {
                let rank = plan.rank(r)?;
                let i = rank.program.iter().position(has_all_reduce)?;
                Some(node_id(r, i))
            })
            .collect();
        for pair in runs.windows(2) {
            let _ = writeln!(
                s,
                "  {} -> {} [dir=both, style=dotted, color=purple, label=\"all_reduce {}\", constraint=false];",
                pair[0],
                pair[1],
                g.tree
            );
        }
    }
    let _ = writeln!(s, "}}");
    s
}
