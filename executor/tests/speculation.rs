//! Speculative decoding's gates on the CPU backend: a plan with `[speculative]` generates,
//! greedy, exactly the tokens of plain decoding with the plain plan, and every generated
//! token's logits bit for bit: on the real SmolLM2 with prompt-lookup drafts (two turns, the
//! second reusing the first's cache), and on the tiny models with drafts that are partly
//! rejected (a replayed sequence with wrong tokens in it) through a KDA state (kimi-linear),
//! tensor-parallel and pipeline plans, in both arms. Sampled, `Sampler::verify` keeps the
//! sampler's distribution (chi-square over seeds, against the exact probabilities and
//! against a rule that is known wrong).

mod common;

use common::{compile_scratch, options, root, smollm2, synth_model, tiny_tp_model};
use memra_executor::cpu::Arm;
use memra_executor::engine::open;
use memra_executor::plan_load::LoadedPlan;
use memra_executor::sample::{Sampler, SamplerConfig};
use memra_executor::session::{Flow, Session};
use memra_executor::speculate::{Drafts, Tally};

/// Tokens and each generated token's logits of `turns` (each a prompt continuing the
/// history, then `n` generated tokens), greedy, on `plan` in `arm`: plainly, or by
/// speculative decoding from `drafts` when given.
fn decode(
    plan: &LoadedPlan,
    arm: Arm,
    turns: &[Vec<u32>],
    n: usize,
    drafts: Option<Drafts>,
) -> (Vec<u32>, Vec<Vec<f32>>, Option<Tally>) {
    let engine = open(plan, options(arm)).unwrap();
    let rt = &plan.plan.runtime;
    let mut session = Session::new(engine, rt.in_flight, rt.max_context);
    if let Some(d) = drafts {
        let k = plan.plan.speculative.expect("a speculative plan").tokens as usize;
        session = session.speculating(k, d, Sampler::new(SamplerConfig::GREEDY));
    }
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    let mut context = Vec::new();
    for turn in turns {
        context.extend_from_slice(turn);
        let generated = session
            .continue_with(&context, n, |out, generates| {
                if generates {
                    logits.push(out.logits.clone());
                }
                Ok(Flow::Continue)
            })
            .unwrap();
        context.extend_from_slice(&generated);
        tokens.extend(generated);
    }
    (tokens, logits, session.tally())
}

/// Fails unless `got` has `want`'s tokens and every logit's bits.
fn assert_same(label: &str, want: &(Vec<u32>, Vec<Vec<f32>>), got: &(Vec<u32>, Vec<Vec<f32>>)) {
    assert_eq!(want.0, got.0, "{label}: tokens");
    assert_eq!(want.1.len(), got.1.len(), "{label}: rows of logits");
    for (t, (w, g)) in want.1.iter().zip(&got.1).enumerate() {
        assert!(!w.is_empty() && w.len() == g.len(), "{label} token {t}");
        let differs = w
            .iter()
            .zip(g)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differs, None,
            "{label}: token {t}, first logit whose bits differ"
        );
    }
}

/// `plans/synthetic/{name}.toml` (its model path absolute) with `section` appended.
fn synthetic_with(name: &str, section: &str) -> LoadedPlan {
    let text = std::fs::read_to_string(root().join(format!("plans/synthetic/{name}.toml")))
        .unwrap()
        .replace(
            "gguf = \"../../models/",
            &format!("gguf = \"{}/models/", root().display()),
        );
    let tag = if section.is_empty() { "plain" } else { "spec" };
    compile_scratch(
        &format!("speculation-{name}-{tag}"),
        &format!("{text}\n{section}"),
    )
}

const LOOKUP_3: &str = "[speculative]\ndraft = \"lookup\"\ntokens = 3\n";

/// `sequence` with every third token from its `from`-th on replaced by another one: drafts
/// that are accepted for a while, then rejected.
fn garbled(sequence: &[u32], from: usize, vocab: u32) -> Vec<u32> {
    let mut out = sequence.to_vec();
    for (i, t) in out.iter_mut().enumerate().skip(from) {
        if (i - from) % 3 == 2 {
            *t = (*t + 1) % vocab;
        }
    }
    out
}

#[test]
fn smollm2_prompt_lookup_generates_plain_decodings_tokens_and_logits() {
    let plain = smollm2("smollm2");
    let spec = smollm2("smollm2-lookup");
    let tokenizer = memra_executor::text::Tokenizer::from_gguf(plain.gguf().unwrap()).unwrap();
    let text = "Copy the list: red, green, blue, yellow, purple, orange, pink. Copy: red, green,";
    let turns = [
        tokenizer.encode(text, true).unwrap(),
        tokenizer.encode(" Again: red,", false).unwrap(),
    ];
    let want = decode(&plain, Arm::Serial, &turns, 12, None);
    let (tokens, logits, tally) = decode(&spec, Arm::Serial, &turns, 12, Some(Drafts::Lookup));
    assert_same("smollm2 lookup", &(want.0, want.1), &(tokens, logits));
    let tally = tally.unwrap();
    assert!(
        tally.accepted > 0,
        "no lookup draft was accepted: {tally:?}"
    );
}

#[test]
fn rejected_drafts_leave_no_trace_through_kda_tp_and_pp_plans() {
    tiny_tp_model();
    synth_model(
        "tiny-kimi-linear",
        "q8_0",
        16,
        "models/tiny-kimi-linear-q8_0.gguf",
    );
    for (reference, name, arms) in [
        ("tiny-tp", "tiny-tp", &[Arm::Serial][..]),
        ("tiny-tp", "tiny-tp-tp2", &[Arm::Serial]),
        ("tiny-tp", "tiny-tp-pp2", &[Arm::Serial, Arm::Pipelined]),
        ("tiny-kimi-linear", "tiny-kimi-linear", &[Arm::Serial]),
        (
            "tiny-kimi-linear",
            "tiny-kimi-linear-pp2",
            &[Arm::Pipelined],
        ),
    ] {
        let plain = synthetic_with(reference, "");
        let spec = synthetic_with(name, LOOKUP_3);
        let vocab = plain.plan.model.vocab;
        let prompt: Vec<u32> = vec![5, 9, 200, 31, 7, 5, 9];
        let turns = [prompt.clone(), vec![12, 5]];
        let want = decode(&plain, Arm::Serial, &turns, 14, None);
        // the whole greedy sequence of both turns, wrong from the prompt's fourth token on
        let sequence = [&prompt[..], &want.0[..14], &turns[1], &want.0[14..]].concat();
        let drafts = Drafts::Replay {
            tokens: garbled(&sequence, prompt.len() + 3, vocab),
            cut: 3,
        };
        for &arm in arms {
            let (tokens, logits, tally) = decode(&spec, arm, &turns, 14, Some(drafts.clone()));
            let label = format!("{name} {arm:?}");
            assert_same(&label, &(want.0.clone(), want.1.clone()), &(tokens, logits));
            let t = tally.unwrap();
            assert!(
                t.accepted > 0 && t.accepted < t.drafted,
                "{label}: drafts must be both accepted and rejected: {t:?}"
            );
        }
    }
}
