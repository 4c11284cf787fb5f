//! Tensor-parallel bit identity on the synthetic tiny-tp model (32 heads, 8 KV heads, q8_0):
//! TP-2, TP-4 and PP-2 x TP-2 give logits bit-identical to the 1-rank plan in both arms, and
//! a deliberately wrong all-reduce order is caught. The prompt runs as prefill steps, so these
//! gates hold the prefill logits of every plan to the 1-rank plan's; prefill gives the bits of
//! token-by-token decoding, and a prompt cut into several chunks (a cached prefix before each)
//! the bits of one chunk, in TP, PP and eager plans. The committed plans are checked against a
//! fresh compile, since the compiler's golden test cannot write the synthetic model.

mod common;

use common::{
    assert_bit_identical, assert_plan_up_to_date, compile_scratch, reversed_fold_mismatch, tiny_tp,
    tiny_tp_model,
};
use memra_executor::cpu::Arm;
use memra_executor::engine::{open, PromptMode};
use memra_executor::plan_load::LoadedPlan;

/// Prompt tokens (the synthetic model has no tokenizer).
const PROMPT: [u32; 6] = [1, 17, 300, 5, 42, 511];
/// Generated steps after the prompt.
const GENERATED: usize = 10;

#[test]
fn synthetic_plans_are_up_to_date() {
    tiny_tp_model();
    for name in [
        "tiny-tp",
        "tiny-tp-tp2",
        "tiny-tp-tp4",
        "tiny-tp-tp8",
        "tiny-tp-pp2-tp2",
        "tiny-tp-pp2",
        "tiny-tp-pp2-tp2-2dev",
        "tiny-tp-pp2-hosts",
    ] {
        assert_plan_up_to_date(name);
    }
}

fn assert_gate_passes(name: &str) {
    let reference = tiny_tp("tiny-tp");
    let candidate = tiny_tp(name);
    let report = assert_bit_identical(name, &reference, &candidate, &PROMPT, GENERATED);
    assert_eq!(report.steps, PROMPT.len() + GENERATED - 1);
    assert_eq!(report.vocab, 512);
    assert_eq!(report.arms, [Arm::Serial, Arm::Pipelined]);
}

#[test]
fn tp2_is_bit_identical() {
    assert_gate_passes("tiny-tp-tp2");
}

#[test]
fn tp4_is_bit_identical() {
    assert_gate_passes("tiny-tp-tp4");
}

#[test]
fn tp8_is_bit_identical() {
    assert_gate_passes("tiny-tp-tp8");
}

#[test]
fn pp2_tp2_is_bit_identical() {
    assert_gate_passes("tiny-tp-pp2-tp2");
}

#[test]
fn a_wrong_reduction_order_fails_the_gate() {
    let reference = tiny_tp("tiny-tp");
    let candidate = tiny_tp("tiny-tp-tp4");
    // A reversed fold moves sums by a last bit; the 8-bit activations (with f16 scales, as the
    // q8_1 format stores them) absorb most such changes, so this gate decodes longer.
    let m = reversed_fold_mismatch(&reference, &candidate, &PROMPT, 40);
    assert_eq!(m.arm, Arm::Serial);
    let text = m.to_string();
    eprintln!("caught: {text}");
    assert!(text.starts_with("serial arm, step "), "{text}");
}

/// The tiny-tp model on `devices` (a `pipeline.devices` value) with `runtime` lines added and
/// `capture` as the capture mode, compiled in a scratch directory.
fn variant(name: &str, devices: &str, runtime: &str, capture: &str) -> LoadedPlan {
    let model = tiny_tp_model();
    let text = format!(
        "[model]\ngguf = {model:?}\n\n[[devices]]\nids = [0, 1, 2, 3]\nmemory_gib = 8\n\n[runtime]\nmax_context = 256\n{runtime}\n\n[pipeline]\ndevices = {devices}\n\n[capture]\nmode = {capture:?}\n"
    );
    compile_scratch(name, &text)
}

/// A prompt longer than the small chunks below, so it takes several prefill steps.
const LONG_PROMPT: [u32; 11] = [1, 17, 300, 5, 42, 511, 7, 99, 250, 3, 64];

#[test]
fn prefill_gives_the_bits_of_token_by_token_decoding() {
    let chunked = tiny_tp("tiny-tp");
    let one_by_one = variant("tt-chunk1", "[[0]]", "prefill_chunk = 1", "graphs");
    let mode = |p: &LoadedPlan| open(p, common::options(Arm::Serial)).unwrap().prompt_mode();
    assert_eq!(mode(&chunked), PromptMode::Chunks(256));
    assert_eq!(mode(&one_by_one), PromptMode::Chunks(1));
    assert_bit_identical("chunk 1", &chunked, &one_by_one, &LONG_PROMPT, GENERATED);
}

#[test]
fn prompts_in_several_chunks_are_bit_identical_in_every_plan() {
    let reference = tiny_tp("tiny-tp");
    for (name, devices, capture) in [
        ("tt-c4", "[[0]]", "graphs"),
        ("tt-c4-tp2", "[[0, 1]]", "graphs"),
        ("tt-c4-tp4-eager", "[[0, 1, 2, 3]]", "eager"),
        ("tt-c4-pp2", "[[0], [1]]", "graphs"),
        ("tt-c4-pp2-tp2", "[[0, 1], [2, 3]]", "eager"),
    ] {
        let candidate = variant(name, devices, "prefill_chunk = 4", capture);
        let report = assert_bit_identical(name, &reference, &candidate, &LONG_PROMPT, GENERATED);
        assert_eq!(report.steps, LONG_PROMPT.len() + GENERATED - 1, "{name}");
    }
}

#[test]
fn sampled_text_does_not_depend_on_how_the_prompt_is_cut() {
    use memra_executor::sample::SamplerConfig;
    use memra_executor::session::{Flow, Session};
    let sampled = |plan: &LoadedPlan| {
        let options = memra_executor::cpu::EngineOptions {
            sampler: SamplerConfig {
                temperature: 0.9,
                top_k: 40,
                top_p: 0.95,
                seed: 7,
            },
            ..common::options(Arm::Serial)
        };
        let max_context = plan.plan.runtime.max_context;
        let mut session = Session::new(open(plan, options).unwrap(), 1, max_context);
        let last = LONG_PROMPT.len() - 1;
        session
            .run(&LONG_PROMPT, 24, last, |_, _| Ok(Flow::Continue))
            .unwrap()
    };
    let chunked = sampled(&tiny_tp("tiny-tp"));
    let one_by_one = sampled(&variant(
        "tt-sampled-chunk1",
        "[[0]]",
        "prefill_chunk = 1",
        "graphs",
    ));
    assert_eq!(chunked.len(), 24);
    assert_eq!(chunked, one_by_one);
}
