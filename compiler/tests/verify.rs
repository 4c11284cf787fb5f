//! The verify pass rejects each race class the env-var runtime found only by soak tests:
//! a cross-stream read without an event, a boundary slot rewritten before its reader copied
//! it away, a readback overrun, and scratch shared by two ranks. Each test breaks one thing
//! in a correct compiled plan and checks the verifier names it.

use memra_compiler::passes::allocate::NCCL_COMMUNICATOR_BYTES;
use memra_compiler::passes::compile;
use memra_compiler::passes::verify::verify_plan;
use memra_compiler::plan::{Plan, Step};
use std::path::Path;

fn plan(name: &str) -> Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plans")
        .join(name);
    compile(&path).unwrap_or_else(|e| panic!("{e}")).plan
}

/// Remove the first `wait` for `event` from `rank`'s program.
fn drop_wait(plan: &mut Plan, rank: u32, event: &str) {
    let program = &mut plan.ranks[rank as usize].program;
    let at = program
        .iter()
        .position(|s| matches!(s, Step::Wait { event: e, .. } if e == event))
        .unwrap_or_else(|| panic!("rank {rank} has no wait for {event}"));
    program.remove(at);
}

fn expect_error(plan: &Plan, needle: &str) {
    let errors = verify_plan(plan);
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "expected an error containing `{needle}`, got {errors:#?}"
    );
}

#[test]
fn correct_plans_verify_clean() {
    for name in [
        "llama3-8b-pp4.toml",
        "llama3-8b-pp2-tp2.toml",
        "llama3.1-70b-tp8.toml",
        "deepseek-v3-pp8.toml",
        "kimi-linear-48b-a3b-pp2-tp2.toml",
    ] {
        assert_eq!(verify_plan(&plan(name)), Vec::<String>::new(), "{name}");
    }
}

#[test]
fn a_copy_without_the_ready_event_is_a_race() {
    let mut p = plan("llama3-8b-pp4.toml");
    // Rank 1 copies boundary 0's slot without waiting for rank 0 to have written it.
    drop_wait(&mut p, 1, "b0.ready");
    expect_error(&p, "race on `b0.tx[0]`: step 0 rank 1 copy b0 (read) is not ordered after step 0 rank 0 r0.run0 (write)");
}

#[test]
fn rewriting_a_slot_before_its_reader_copied_it_is_a_race() {
    let mut p = plan("llama3-8b-pp4.toml");
    // Rank 0 rewrites b0.tx[slot] two steps later without the write-after-read guard.
    drop_wait(&mut p, 0, "b0.consumed");
    expect_error(&p, "race on `b0.tx[0]`: step 2 rank 0 r0.run0 (write) is not ordered after step 0 rank 1 copy b0 (read)");
}

#[test]
fn the_token_feedback_needs_its_guard_too() {
    // Under TP the token's receiver is not upstream of the sampler through boundaries (the
    // all-reduce's device-side flags are not counted as ordering), so only the guard orders
    // the sampler's rewrite after the receiver's copy.
    let mut p = plan("llama3-8b-tp2.toml");
    let sampler = 0;
    let token = p
        .boundaries
        .iter()
        .find(|b| b.from_rank == sampler)
        .unwrap()
        .clone();
    drop_wait(&mut p, sampler, &token.consumed());
    expect_error(&p, &format!("race on `{}", token.tx()));
}

#[test]
fn overwriting_logits_before_the_readback_is_a_race() {
    let mut p = plan("llama3-8b-tp2.toml");
    drop_wait(&mut p, 0, "r0.readback_done");
    expect_error(&p, "race on `r0.logits[0]`: step 1 rank 0 r0.run0 (write) is not ordered after step 0 rank 0 readback (read)");
}

#[test]
fn scratch_shared_by_two_ranks_is_rejected() {
    let mut p = plan("llama3-8b-pp4.toml");
    // Rank 2 (stage 2) uses rank 0's scratch, as pooled scratch on one device once did.
    for b in &mut p.ranks[2].buffers {
        if b.name == "r2.act" {
            b.name = "r0.act".into();
        }
    }
    expect_error(
        &p,
        "buffer `r0.act` is declared by ranks [0, 2]; no buffer is shared between ranks",
    );
    // With four sequences in flight, stage 0 runs the next step while stage 2 runs this one.
    expect_error(
        &p,
        "rank 2 declares Scratch buffer `r0.act`, which belongs to another rank",
    );
    expect_error(&p, "race on `r0.act[0]`");
}

#[test]
fn kda_state_is_checked_like_any_buffer() {
    use memra_compiler::plan::BufferKind;
    let mut p = plan("kimi-linear-48b-a3b-pp2-tp2.toml");
    // Rank 2's KDA state one byte short: 9 KDA layers (14..27 less the MLA layers 15, 19, 23
    // and 26) of 16 heads.
    let state = p.ranks[2]
        .buffers
        .iter_mut()
        .find(|b| b.kind == BufferKind::State)
        .unwrap();
    state.bytes -= 1;
    expect_error(
        &p,
        "rank 2 holds 10100735 bytes of KDA state; its 9 KDA layers of 16 heads need 10100736",
    );
    // Without it, the KDA segments' accesses have nothing to name.
    p.ranks[2].buffers.retain(|b| b.kind != BufferKind::State);
    expect_error(
        &p,
        "rank 2 needs a State buffer `*.state` but declares none",
    );
}

/// Each committed plan's differences from what its recorded placement compiles to, with the
/// model read from the plan itself (its facts and weight shards).
fn recompiled(plan: &Plan) -> Vec<String> {
    use memra_compiler::model::model_of_plan;
    use memra_compiler::passes::recompile::recompile_differences;
    let model = model_of_plan(plan).unwrap_or_else(|e| panic!("{e:#?}"));
    recompile_differences(plan, Path::new("edited.plan.toml"), model)
}

#[test]
fn committed_plans_recompile_from_what_they_record() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let mut checked = 0;
    for sub in ["", "synthetic"] {
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".plan.toml") {
                continue;
            }
            let plan = Plan::from_toml(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(
                recompiled(&plan),
                Vec::<String>::new(),
                "{}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked}");
}

#[test]
fn an_edited_program_differs_from_its_recompile() {
    // llama3-8b PP-2 x TP-2: rank 3 (stage 1's second rank) runs its layers' segments out of
    // order, claims another degree, and its group swaps collective
    let mut p = plan("llama3-8b-pp2-tp2.toml");
    assert_eq!(recompiled(&p), Vec::<String>::new());
    let r = &mut p.ranks[3];
    r.tp_degree = 4;
    let Some(Step::Run { ops, .. }) = r.program.iter_mut().find(|s| matches!(s, Step::Run { .. }))
    else {
        panic!("rank 3 has a run");
    };
    let at = ops
        .iter()
        .position(|o| o.to_string().starts_with("layers "))
        .unwrap();
    let text = ops[at]
        .to_string()
        .replace("attn_core attn_out", "attn_out attn_core");
    ops[at] = text.parse().unwrap();
    let errors = recompiled(&p);
    assert!(
        errors
            .iter()
            .any(|e| e == "rank 3 tp_degree is 4; its placement compiles to 2"),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("rank 3 program step") && e.contains("attn_out attn_core")),
        "{errors:#?}"
    );
}

#[test]
fn stages_that_skip_or_repeat_layers_are_refused() {
    let mut p = plan("llama3-8b-pp4.toml");
    p.ranks[2].layers.start -= 1;
    let errors = recompiled(&p);
    assert!(
        errors.iter().any(|e| e.contains(
            "rank 2 layers is 15..24; stage 2 must start at layer 16, where stage 1 ends"
        )),
        "{errors:#?}"
    );
}

#[test]
fn every_placement_that_compiles_here_recompiles_from_its_plan() {
    // the uncommitted placements too (CUDA and multi-process ones: NCCL, hosts, peer copies,
    // forced-eager kinds); those whose model file is absent here are skipped
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
    let mut checked = 0;
    for sub in ["", "synthetic", "synthetic/cuda", "synthetic/multi"] {
        for entry in std::fs::read_dir(root.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.to_string_lossy().to_string();
            if !name.ends_with(".toml") || name.ends_with(".plan.toml") {
                continue;
            }
            let Ok(compiled) = compile(&path) else {
                continue;
            };
            assert_eq!(recompiled(&compiled.plan), Vec::<String>::new(), "{name}");
            checked += 1;
        }
    }
    // a clean clone has the config.json placements and SmolLM2's (26) before the executor's
    // tests write the synthetic models the others read
    assert!(checked >= 20, "{checked}");
}

#[test]
fn a_device_must_count_its_boundary_communicators() {
    // PP-4 on four devices: every stage ends two boundaries, the hidden state's in and out
    // or, at either end of the pipeline, one of those and the sampled token's way back
    let p = plan("llama3-8b-pp4.toml");
    let ends: Vec<u64> = p
        .devices
        .iter()
        .map(|d| d.launch_bytes / NCCL_COMMUNICATOR_BYTES)
        .collect();
    assert_eq!(ends, [2, 2, 2, 2]);
    let mut p = p;
    p.devices[1].launch_bytes = 0;
    expect_error(&p, "device 1 counts launch_bytes 0 but its 2 boundary ends to other devices take 1807745024 when launched one process per device (903872512 bytes per two-rank nccl communicator)");
    // one device for every stage: no boundary crosses, nothing to count
    let one = plan("smollm2-pp2.toml");
    assert!(one.devices.iter().all(|d| d.launch_bytes == 0));
}
