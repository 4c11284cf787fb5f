//! The compiler's passes, run in order by `compile`. Each pass is one file.

pub mod allocate;
pub mod build;
pub mod emit;
pub mod partition;
pub mod place;
pub mod recompile;
pub mod shard;
pub mod verify;

use crate::diag::{Collector, Diagnostics};
use crate::graph::DecodeGraph;
use crate::model::ModelMeta;
use crate::placement::{self, Placement};
use crate::plan::{Boundary, LayerRange, Plan};
use std::path::Path;

/// Facts of one rank, decided by `shard` and read by every later pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    pub rank: u32,
    pub stage: u32,
    pub device: u32,
    pub tp_index: u32,
    pub tp_degree: u32,
    pub layers: LayerRange,
    pub embed: bool,
    pub head: bool,
    /// The last stage's first rank: it samples and reads back.
    pub sampler: bool,
}

/// Ranks and boundaries of a placement.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    pub ranks: Vec<RankInfo>,
    pub boundaries: Vec<Boundary>,
}

/// Everything a compile produces: the plan, and the graph for those who want to look at it.
pub struct Compiled {
    pub plan: Plan,
    pub graph: DecodeGraph,
    pub model: ModelMeta,
}

/// Compile a placement file into an execution plan.
pub fn compile(path: &Path) -> Result<Compiled, Diagnostics> {
    // 1-3. parse the TOML, read the model's metadata, validate every rule at once.
    let (placement, model) = placement::load(path)?;
    compile_placement(path, &placement, model)
}

/// Passes 4-10 on a validated placement.
pub fn compile_placement(
    path: &Path,
    placement: &Placement,
    model: ModelMeta,
) -> Result<Compiled, Diagnostics> {
    let file = path.display().to_string();
    let internal = |errors: Vec<String>| Diagnostics {
        file: file.clone(),
        items: errors
            .into_iter()
            .map(|message| crate::diag::Diagnostic {
                line: 1,
                col: 1,
                field: "(compiler bug)".into(),
                message,
            })
            .collect(),
    };
    // 4. build: the one-rank graph of a decode step.
    let logical = build::build(&model);
    // 5. shard: ranks per stage, all-reduces after partial sums, vocab-parallel head.
    let (mut graph, mut topo) = shard::shard(&logical, &model, placement);
    // 6. place: boundaries between stages, the token's way back, the readback.
    place::place(&mut graph, &mut topo, &model, placement);
    // 7. verify the graph's structure (the schedule is verified on the plan below).
    let errors = verify::verify_graph(&graph, &model, &topo, placement.attention);
    if !errors.is_empty() {
        return Err(internal(errors));
    }
    // 8. partition: capture classes, then runs, islands, boundary steps per rank.
    partition::mark_capture(&mut graph, placement);
    let programs = partition::partition(&graph, &topo);
    // 9. allocate: weights, buffers, bytes per device.
    // 10. emit: the plan.
    let plan = emit::emit(&model, placement, &topo, programs);
    // 7 (again). verify memory fit and happens-before on the final schedule.
    let overflows = verify::memory_overflows(&plan);
    if !overflows.is_empty() {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut c = Collector::new(&file, &text);
        for (device, message) in overflows {
            let span = placement.device_spans.get(&device).cloned().unwrap_or(0..0);
            c.error(span, "devices", message);
        }
        c.finish()?;
    }
    let errors = verify::verify_plan(&plan);
    if !errors.is_empty() {
        return Err(internal(errors));
    }
    Ok(Compiled { plan, graph, model })
}
