//! Bit identity of MoE, MLA and KDA plans on the CPU: every plan of the synthetic
//! tiny-qwen3moe (GQA + softmax-routed experts), tiny-deepseek2 (MLA + sigmoid, grouped
//! routing with a selection bias, shared experts and a leading dense layer) and
//! tiny-kimi-linear (KDA layers with their convolution windows and recurrent states between
//! MLA layers, + MoE) and tiny-glm5-next (KDA and MLA over the DSA indexer's selection in
//! mHC streams, + clamped MoE; tiny-glm5-next-shared with its MLA layers alternating full and
//! shared indexers, the selection crossing PP cuts) models gives logits bit-identical to the model's 1-rank plan, in both
//! arms: tensor parallelism (heads and experts split, kv heads copied where ranks outnumber
//! them, KDA heads split with their state), expert parallelism (attention replicated, experts
//! split), pipeline cuts. The committed plans are checked against a fresh
//! compile, since the compiler's golden test cannot write the synthetic models. The cpu runs
//! every model's prompts as prefill steps (glm5-next's DSA selection row by row inside the
//! step), so these gates hold every plan's prefill logits to the 1-rank plan's; prefill gives
//! the bits of token-by-token decoding, and a prompt cut into chunks of 4 the bits of one
//! chunk in every plan.

mod common;

use common::{
    assert_bit_identical, assert_plan_up_to_date, compile_scratch, reversed_fold_mismatch, root,
    synth_model, synthetic_variant,
};
use memra_compiler::passes::verify::verify_plan;
use memra_compiler::plan::Carries;
use memra_executor::cpu::Arm;
use memra_executor::engine::{open, PromptMode};
use memra_executor::gate::GateReport;
use memra_executor::plan_load::{load, LoadedPlan};

/// Prompt tokens (the synthetic models have no tokenizer).
const PROMPT: [u32; 6] = [254, 72, 101, 108, 108, 111];
/// Generated steps after the prompt.
const GENERATED: usize = 10;

/// The synthetic models of the gates: (plan name prefix, memra-synth shape, seed), longest
/// prefix first; the seeds are the oracle's.
const MODELS: [(&str, &str, u64); 6] = [
    ("tiny-kimi-linear", "tiny-kimi-linear", 16),
    ("tiny-glm5-next-shared", "tiny-glm5-next-shared", 8),
    ("tiny-glm5-next", "tiny-glm5-next", 8),
    ("tiny-qwen3moe", "tiny-qwen3moe", 9),
    ("tiny-deepseek2-lite", "tiny-deepseek2-lite", 8),
    ("tiny-deepseek2", "tiny-deepseek2", 9),
];

/// `plans/synthetic/{name}.plan.toml`, its model written first.
fn synthetic(name: &str) -> LoadedPlan {
    let (prefix, shape, seed) = MODELS
        .iter()
        .find(|(prefix, ..)| name == *prefix || name.starts_with(&format!("{prefix}-")))
        .unwrap_or_else(|| panic!("no synthetic model for plan {name}"));
    synth_model(shape, "q8_0", *seed, &format!("models/{prefix}-q8_0.gguf"));
    load(
        &root().join(format!("plans/synthetic/{name}.plan.toml")),
        None,
    )
    .unwrap()
}

const PLANS: [&str; 29] = [
    "tiny-qwen3moe",
    "tiny-qwen3moe-tp2",
    "tiny-qwen3moe-tp4",
    "tiny-qwen3moe-ep4",
    "tiny-qwen3moe-pp2",
    "tiny-deepseek2",
    "tiny-deepseek2-tp2",
    "tiny-deepseek2-tp4",
    "tiny-deepseek2-ep2",
    "tiny-deepseek2-pp3",
    "tiny-deepseek2-pp2",
    "tiny-deepseek2-lite",
    "tiny-deepseek2-lite-tp2",
    "tiny-kimi-linear",
    "tiny-kimi-linear-tp2",
    "tiny-kimi-linear-tp4",
    "tiny-kimi-linear-pp2",
    "tiny-kimi-linear-ep2",
    "tiny-kimi-linear-mla-eager",
    "tiny-glm5-next",
    "tiny-glm5-next-tp2",
    "tiny-glm5-next-tp4",
    "tiny-glm5-next-ep2",
    "tiny-glm5-next-pp2",
    "tiny-glm5-next-shared",
    "tiny-glm5-next-shared-tp2",
    "tiny-glm5-next-shared-ep2",
    "tiny-glm5-next-shared-pp2",
    "tiny-glm5-next-shared-pp4",
];

#[test]
fn synthetic_plans_are_up_to_date() {
    for name in PLANS {
        synthetic(name);
        assert_plan_up_to_date(name);
    }
}

/// `name` against the 1-rank plan of its model, both arms, every logit bit.
fn assert_gate_passes(name: &str, reference: &str) {
    let report = assert_bit_identical(
        name,
        &synthetic(reference),
        &synthetic(name),
        &PROMPT,
        GENERATED,
    );
    assert_eq!(report.steps, PROMPT.len() + GENERATED - 1);
    assert_eq!(report.arms, [Arm::Serial, Arm::Pipelined]);
}

#[test]
fn qwen3moe_tp2_is_bit_identical() {
    assert_gate_passes("tiny-qwen3moe-tp2", "tiny-qwen3moe");
}

#[test]
fn qwen3moe_tp4_is_bit_identical() {
    assert_gate_passes("tiny-qwen3moe-tp4", "tiny-qwen3moe");
}

#[test]
fn qwen3moe_ep4_is_bit_identical() {
    assert_gate_passes("tiny-qwen3moe-ep4", "tiny-qwen3moe");
}

#[test]
fn qwen3moe_pp2_is_bit_identical() {
    assert_gate_passes("tiny-qwen3moe-pp2", "tiny-qwen3moe");
}

#[test]
fn deepseek2_tp2_is_bit_identical() {
    assert_gate_passes("tiny-deepseek2-tp2", "tiny-deepseek2");
}

#[test]
fn deepseek2_tp4_is_bit_identical() {
    assert_gate_passes("tiny-deepseek2-tp4", "tiny-deepseek2");
}

#[test]
fn deepseek2_ep2_is_bit_identical() {
    assert_gate_passes("tiny-deepseek2-ep2", "tiny-deepseek2");
}

#[test]
fn deepseek2_pp3_is_bit_identical() {
    assert_gate_passes("tiny-deepseek2-pp3", "tiny-deepseek2");
}

#[test]
fn deepseek2_pp2_uneven_is_bit_identical() {
    assert_gate_passes("tiny-deepseek2-pp2", "tiny-deepseek2");
}

#[test]
fn deepseek2_lite_tp2_is_bit_identical() {
    assert_gate_passes("tiny-deepseek2-lite-tp2", "tiny-deepseek2-lite");
}

#[test]
fn kimi_linear_tp2_is_bit_identical() {
    assert_gate_passes("tiny-kimi-linear-tp2", "tiny-kimi-linear");
}

#[test]
fn kimi_linear_tp4_is_bit_identical() {
    assert_gate_passes("tiny-kimi-linear-tp4", "tiny-kimi-linear");
}

#[test]
fn kimi_linear_ep2_is_bit_identical() {
    assert_gate_passes("tiny-kimi-linear-ep2", "tiny-kimi-linear");
}

#[test]
fn kimi_linear_with_eager_mla_layers_is_bit_identical() {
    assert_gate_passes("tiny-kimi-linear-mla-eager", "tiny-kimi-linear");
}

#[test]
fn kimi_linear_pp2_is_bit_identical() {
    assert_gate_passes("tiny-kimi-linear-pp2", "tiny-kimi-linear");
}

#[test]
fn glm5_next_tp2_is_bit_identical() {
    assert_gate_passes("tiny-glm5-next-tp2", "tiny-glm5-next");
}

#[test]
fn glm5_next_tp4_is_bit_identical() {
    assert_gate_passes("tiny-glm5-next-tp4", "tiny-glm5-next");
}

#[test]
fn glm5_next_ep2_is_bit_identical() {
    assert_gate_passes("tiny-glm5-next-ep2", "tiny-glm5-next");
}

#[test]
fn glm5_next_pp2_is_bit_identical() {
    assert_gate_passes("tiny-glm5-next-pp2", "tiny-glm5-next");
}

#[test]
fn glm5_next_shared_indexers_tp2_and_ep2_are_bit_identical() {
    assert_gate_passes("tiny-glm5-next-shared-tp2", "tiny-glm5-next-shared");
    assert_gate_passes("tiny-glm5-next-shared-ep2", "tiny-glm5-next-shared");
}

/// The selection values of `name`'s hidden-state boundaries, in boundary order.
fn selections(name: &str) -> Vec<u32> {
    let plan = synthetic(name).plan;
    let hidden = plan
        .boundaries
        .iter()
        .filter(|b| b.carries == Carries::Hidden);
    hidden.map(|b| b.selection).collect()
}

#[test]
fn glm5_next_shared_indexers_pp2_is_bit_identical_with_the_selection_crossing_the_cut() {
    // the count, then top_k 8 pool members and the 3 tail cells of pools of 4
    assert_eq!(selections("tiny-glm5-next-shared-pp2"), [12]);
    assert_gate_passes("tiny-glm5-next-shared-pp2", "tiny-glm5-next-shared");
}

#[test]
fn glm5_next_shared_indexers_pp4_passes_the_selection_through_a_kda_stage() {
    assert_eq!(selections("tiny-glm5-next-shared-pp4"), [12, 12, 12]);
    assert_gate_passes("tiny-glm5-next-shared-pp4", "tiny-glm5-next-shared");
}

#[test]
fn a_cut_that_drops_the_selection_is_refused() {
    let mut plan = synthetic("tiny-glm5-next-shared-pp2").plan;
    let b = plan
        .boundaries
        .iter_mut()
        .find(|b| b.carries == Carries::Hidden)
        .unwrap();
    b.bytes -= 4 * u64::from(b.selection);
    b.selection = 0;
    let errors = verify_plan(&plan).join("\n");
    assert!(
        errors.contains(
            "boundary 0 carries 0 selection values per row; the cut before layer 3 needs 12"
        ),
        "{errors}"
    );
}

/// The f32 tiny-deepseek2 model in one rank and in `devices`: with q8_0 weights a last-bit
/// change of the residual rarely survives the 8-bit activations, with f32 weights it does.
fn f32_plan(name: &str, devices: &str, runtime: &str) -> LoadedPlan {
    let model = synth_model(
        "tiny-deepseek2",
        "f32",
        9,
        "models/oracle/tiny-deepseek2-f32-seed9.gguf",
    );
    let ids: Vec<u32> = (0..devices.matches(',').count() as u32 + 1).collect();
    let text = format!(
        "[model]\ngguf = {model:?}\n\n[[devices]]\nids = {ids:?}\nmemory_gib = 8\n\n[runtime]\nmax_context = 256\n{runtime}\n\n[pipeline]\ndevices = [{devices}]\n"
    );
    compile_scratch(name, &text)
}

#[test]
fn a_wrong_reduction_order_fails_the_moe_gate() {
    let reference = f32_plan("ds2-f32", "[0]", "");
    let candidate = f32_plan("ds2-f32-tp4", "[0, 1, 2, 3]", "");
    assert_bit_identical("ds2-f32-tp4", &reference, &candidate, &PROMPT, GENERATED);
    reversed_fold_mismatch(&reference, &candidate, &PROMPT, GENERATED);
}

/// A prompt longer than the small chunks below, so it takes several prefill steps.
const LONG_PROMPT: [u32; 11] = [254, 72, 101, 108, 108, 111, 7, 99, 250, 3, 64];

/// `candidate` gives `reference`'s bits over `LONG_PROMPT` and `GENERATED` tokens.
fn gate_long(label: &str, reference: &LoadedPlan, candidate: &LoadedPlan) -> GateReport {
    assert_bit_identical(label, reference, candidate, &LONG_PROMPT, GENERATED)
}

/// The committed placement `plans/synthetic/{name}.toml` with `runtime` lines added,
/// compiled in a scratch directory (its model written first).
fn variant(name: &str, runtime: &str) -> LoadedPlan {
    synthetic(name);
    synthetic_variant("", name, runtime)
}

fn mode(plan: &LoadedPlan) -> PromptMode {
    open(plan, common::options(Arm::Serial))
        .unwrap()
        .prompt_mode()
}

#[test]
fn moe_mla_and_kda_prefill_gives_the_bits_of_token_by_token_decoding() {
    for name in [
        "tiny-qwen3moe",
        "tiny-deepseek2",
        "tiny-deepseek2-lite",
        "tiny-kimi-linear",
        "tiny-glm5-next",
        "tiny-glm5-next-shared",
    ] {
        let chunked = synthetic(name);
        let one_by_one = variant(name, "prefill_chunk = 1");
        assert_eq!(mode(&chunked), PromptMode::Chunks(256), "{name}");
        assert_eq!(mode(&one_by_one), PromptMode::Chunks(1), "{name}");
        gate_long(name, &chunked, &one_by_one);
    }
    // f32 weights keep a last-bit change of any row (q8_0 activations may absorb it)
    let chunked = f32_plan("ds2-f32-c256", "[0]", "");
    let one_by_one = f32_plan("ds2-f32-c1", "[0]", "prefill_chunk = 1");
    gate_long("ds2-f32 chunk 1", &chunked, &one_by_one);
}

#[test]
fn moe_mla_and_kda_prompts_in_several_chunks_are_bit_identical_in_every_plan() {
    for name in PLANS {
        let reference = MODELS
            .iter()
            .map(|m| m.0)
            .find(|prefix| name == *prefix || name.starts_with(&format!("{prefix}-")))
            .unwrap();
        let candidate = variant(name, "prefill_chunk = 4");
        assert_eq!(mode(&candidate), PromptMode::Chunks(4), "{name}");
        let report = gate_long(name, &synthetic(reference), &candidate);
        assert_eq!(report.steps, LONG_PROMPT.len() + GENERATED - 1, "{name}");
    }
    let reference = f32_plan("ds2-f32-ref", "[0]", "");
    let candidate = f32_plan("ds2-f32-tp4-c4", "[0, 1, 2, 3]", "prefill_chunk = 4");
    gate_long("ds2-f32-tp4 chunk 4", &reference, &candidate);
}
