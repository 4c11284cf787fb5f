//! The continuous-batching gate on the CPU backend: sequences decoded together (different
//! prompts, joining at different steps, leaving early, their slots taken again by later
//! sequences, every row at a different place in its step) get, at every generated token,
//! the logits of their run alone with the one-sequence plan, bit for bit: the real SmolLM2,
//! and the tiny synthetic models through pipeline stages, tensor-parallel groups, MLA's
//! latent cache and KDA's recurrent state, in both arms.

mod common;

use common::{
    options, smollm2, synth_model, synthetic_variant, tiny_deepseek2_model, tiny_glm5_next_model,
    tiny_kimi_linear_model, tiny_tp_model,
};
use memra_executor::batch::window;
use memra_executor::batch_gate::{batch_gate, sequences, Sequence};
use memra_executor::cpu::Arm;
use memra_executor::engine::{open, Backend, EngineOptions, StepInput};
use memra_executor::plan_load::LoadedPlan;

/// Fails unless every sequence decoded together by `batched` has, at every generated token,
/// the logits it has alone with `reference`, in both arms; `least` is the fewest sequences
/// some step must have carried.
fn assert_alone_equals_together(
    label: &str,
    reference: &LoadedPlan,
    batched: &LoadedPlan,
    sequences: &[Sequence],
    least: usize,
) {
    let arms = [Arm::Serial, Arm::Pipelined];
    let report = batch_gate(reference, batched, sequences, options(Arm::Serial), &arms).unwrap();
    for (arm, widest) in arms.iter().zip(&report.widest) {
        assert!(
            *widest >= least,
            "{label} {arm:?}: at most {widest} sequences decoded together"
        );
    }
    assert!(
        report.mismatch.is_none(),
        "{label}: {}",
        report.mismatch.unwrap()
    );
}

#[test]
fn smollm2_sequences_decoded_together_equal_their_runs_alone() {
    let reference = smollm2("smollm2");
    let batched = smollm2("smollm2-batch8");
    assert_eq!(batched.plan.runtime.max_sequences, 8);
    let texts = [
        "The capital of France is",
        "One, two, three,",
        "def add(a, b):",
        "The sky is",
        "Once upon a time",
    ];
    let tokenizer = memra_executor::text::Tokenizer::from_gguf(reference.gguf().unwrap()).unwrap();
    let mut all = sequences(49152, 8, 0);
    for (s, text) in all.iter_mut().zip(texts) {
        s.prompt = tokenizer.encode(text, false).unwrap();
    }
    assert_alone_equals_together("smollm2-batch8", &reference, &batched, &all, 5);
}

/// `plans/synthetic/{name}.toml` with `runtime` lines added, compiled in a scratch directory.
fn variant(name: &str, runtime: &str) -> LoadedPlan {
    synthetic_variant("batch-", name, runtime)
}

#[test]
fn synthetic_sequences_decoded_together_equal_their_runs_alone_in_every_plan_kind() {
    tiny_tp_model();
    tiny_deepseek2_model();
    tiny_kimi_linear_model();
    tiny_glm5_next_model();
    // the gates' seed for the shared-indexer model (executor/tests/moe_gates.rs)
    synth_model(
        "tiny-glm5-next-shared",
        "q8_0",
        8,
        "models/tiny-glm5-next-shared-q8_0.gguf",
    );
    // (reference plan, plan decoding together, its other runtime lines): PP with the token
    // crossing stages, TP, PP x TP, MLA's latent cache with experts, KDA's state of each
    // row's slot, DSA's indexer cache of each row's slot in mHC streams (and a shared-indexer
    // layer's selection across a PP cut); every PP plan with two steps in flight in the
    // pipelined arm, each over its own group of sequences
    for (reference, name, more) in [
        ("tiny-tp", "tiny-tp", ""),
        ("tiny-tp", "tiny-tp-pp2", ""),
        ("tiny-tp", "tiny-tp-tp2", ""),
        ("tiny-tp", "tiny-tp-pp2-tp2", ""),
        ("tiny-deepseek2", "tiny-deepseek2-pp2", "in_flight = 2"),
        ("tiny-kimi-linear", "tiny-kimi-linear-pp2", "in_flight = 2"),
        ("tiny-glm5-next", "tiny-glm5-next", ""),
        ("tiny-glm5-next", "tiny-glm5-next-tp2", ""),
        (
            "tiny-glm5-next-shared",
            "tiny-glm5-next-shared-pp2",
            "in_flight = 2",
        ),
    ] {
        let reference = variant(reference, "");
        let batched = variant(
            name,
            &format!("max_sequences = 4\nprefill_chunk = 6\n{more}"),
        );
        let stages = if name.contains("-pp2") { 2 } else { 1 };
        assert_eq!(window(&batched.plan, Arm::Pipelined), stages, "{name}");
        let vocab = reference.plan.model.vocab;
        assert_alone_equals_together(name, &reference, &batched, &sequences(vocab, 4, 0), 4);
    }
}

#[test]
fn a_prompt_again_in_the_slot_that_holds_it_equals_its_run_alone() {
    tiny_tp_model();
    tiny_kimi_linear_model();
    // the second sequence takes the first one's slot, which holds its prompt and more: a KV
    // cache reuses the prompt, KDA's recurrent state cannot be cut back and starts over
    for name in ["tiny-tp", "tiny-kimi-linear"] {
        let reference = variant(name, "");
        let batched = variant(name, "max_sequences = 4\nprefill_chunk = 6");
        let prompt: Vec<u32> = vec![5, 9, 200, 31, 7];
        let again = |joins_at| Sequence {
            joins_at,
            prompt: prompt.clone(),
            generate: 5,
        };
        assert_alone_equals_together(name, &reference, &batched, &[again(0), again(40)], 1);
    }
}

#[test]
fn a_sampled_token_step_is_refused_where_the_token_crosses_stages_late() {
    tiny_tp_model();
    let plan = variant("tiny-tp-pp2", "max_sequences = 4");
    let mut engine = open(&plan, options(Arm::Serial)).unwrap();
    engine.step(StepInput::prompt(0, &[5, 9], 1)).unwrap();
    let err = engine.step(StepInput::sampled(2)).unwrap_err();
    assert!(
        format!("{err:#}").contains("feed every row its token"),
        "{err:#}"
    );
}

#[test]
fn a_plan_of_more_sequences_than_the_cuda_batch_takes_is_refused_by_name() {
    tiny_tp_model();
    let options = EngineOptions {
        backend: Backend::Cuda,
        ..options(Arm::Serial)
    };
    // the refusal comes before any device is opened, so it holds on a machine without one
    let plan = variant("tiny-tp", "max_sequences = 300");
    let err = open(&plan, options).err().expect("cuda must refuse it");
    let message = format!("{err:#}");
    assert!(
        message.contains(
            "runtime.max_sequences is 300; the cuda backend decodes up to 256 sequences together"
        ),
        "{message}"
    );
}

#[test]
fn greedy_sequences_whose_logits_turn_non_finite_end_with_an_error_not_a_token() {
    use memra_executor::batch::Batch;
    use memra_executor::batch_gate::{together, Marked};
    use std::io::{Seek, SeekFrom, Write};
    // f32 weights: 8-bit activations would round a NaN away (the product quantizes x)
    let clean = synth_model("tiny-tp", "f32", 0, "models/tiny-tp-f32.gguf");
    // the placement on a model file of its own, two sequences at once
    let plan_of = |model: &std::path::Path, tag: &str| {
        let text = std::fs::read_to_string(common::root().join("plans/synthetic/tiny-tp.toml"))
            .unwrap()
            .replace(
                "gguf = \"../../models/tiny-tp-q8_0.gguf\"",
                &format!("gguf = \"{}\"", model.display()),
            )
            .replace("[runtime]\n", "[runtime]\nmax_sequences = 2\n");
        common::compile_scratch(&format!("nan-{tag}"), &text)
    };
    let run = |plan: &LoadedPlan, generate: usize| {
        let mut batch = Batch::new(open(plan, options(Arm::Serial))?, 2, 1);
        let one = Sequence {
            joins_at: 0,
            prompt: vec![17, 42, 99],
            generate,
        };
        together(&mut batch, &[one], Marked::All)
    };
    let first = run(&plan_of(&clean, "clean"), 1).unwrap().tokens[0][0];
    // tiny-tp's head is a matrix of its own: a NaN in the embedding row of the first greedy
    // token leaves the first logits finite and makes every later step's NaN
    let broken = std::env::temp_dir().join(format!("memra-nan-embd-{}.gguf", std::process::id()));
    std::fs::copy(&clean, &broken).unwrap();
    let at = {
        let file = memra_gguf::GgufFile::open(&clean).unwrap();
        let embd = file.tensor("token_embd.weight").unwrap();
        assert_eq!(embd.dtype, memra_gguf::GgmlType::F32);
        let row = embd.dtype.bytes_for(embd.row_len()).unwrap();
        file.header_bytes().len() as u64 + embd.offset + u64::from(first) * row
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&broken)
        .unwrap();
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&f32::NAN.to_le_bytes()).unwrap();
    drop(file);
    let plan = plan_of(&broken, "broken");
    let one = run(&plan, 1).unwrap();
    assert_eq!(
        one.tokens[0],
        [first],
        "the first token must come before the NaN"
    );
    let err = run(&plan, 3).err().map(|e| format!("{e:#}"));
    std::fs::remove_file(&broken).unwrap();
    let err = err.expect("a greedy step over NaN logits gave a token");
    assert!(err.contains("logits are not finite"), "{err}");
}
