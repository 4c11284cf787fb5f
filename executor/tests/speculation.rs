//! Speculative decoding's gates on the CPU backend: a plan with `[speculative]` generates,
//! greedy, exactly the tokens of plain decoding with the plain plan, and every generated
//! token's logits bit for bit: on the real SmolLM2 with prompt-lookup drafts (two turns, the
//! second reusing the first's cache), and on the tiny models with drafts that are partly
//! rejected (a replayed sequence with wrong tokens in it) through a KDA state (kimi-linear),
//! the DSA indexer's keys and pools (glm5-next, full and shared indexers across a pipeline
//! cut), tensor-parallel and pipeline plans, in both arms; and two KDA sequences verifying
//! their drafts in the same batched steps (the server's way), each with its plain tokens
//! and logits. Sampled, `Sampler::verify` keeps the
//! sampler's distribution (chi-square over seeds, against the exact probabilities and
//! against a rule that is known wrong). `generate` and `bench` run a speculative plan, and
//! the cuda engine refuses one of layers its batched decode kernels do not cover (the cuda
//! runs of dense plans are in `tests/gpu.rs`). A KDA chat whose reply stops with a step still in flight
//! takes its next turn with a fresh run's bits.

mod common;

use common::{
    assert_same, compile_scratch, decode_turns, garbled, options, root, smollm2, synth_model,
    synthetic_variant, tiny_deepseek2_model, tiny_kimi_linear_model, tiny_qwen3moe_model,
    tiny_tp_model,
};
use memra_executor::batch::Batch;
use memra_executor::cpu::Arm;
use memra_executor::engine::open;
use memra_executor::plan_load::LoadedPlan;
use memra_executor::sample::{greedy, Sampler, SamplerConfig};
use memra_executor::session::{Flow, Session};
use memra_executor::speculate::Drafts;

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
    let want = decode_turns(&plain, options(Arm::Serial), &turns, 12, None);
    let (tokens, logits, tally) = decode_turns(
        &spec,
        options(Arm::Serial),
        &turns,
        12,
        Some(Drafts::Lookup),
    );
    assert_same("smollm2 lookup", &(want.0, want.1), &(tokens, logits));
    let tally = tally.unwrap();
    assert!(
        tally.accepted > 0,
        "no lookup draft was accepted: {tally:?}"
    );
}

#[test]
fn rejected_drafts_leave_no_trace_through_kda_dsa_tp_and_pp_plans() {
    tiny_tp_model();
    tiny_kimi_linear_model();
    tiny_qwen3moe_model();
    tiny_deepseek2_model();
    // the gates' seed (executor/tests/moe_gates.rs), so both write the same files
    for shape in ["tiny-glm5-next", "tiny-glm5-next-shared"] {
        synth_model(shape, "q8_0", 8, &format!("models/{shape}-q8_0.gguf"));
    }
    for (reference, name, arms) in [
        ("tiny-tp", "tiny-tp", &[Arm::Serial][..]),
        ("tiny-tp", "tiny-tp-tp2", &[Arm::Serial]),
        ("tiny-tp", "tiny-tp-pp2", &[Arm::Serial, Arm::Pipelined]),
        ("tiny-kimi-linear", "tiny-kimi-linear", &[Arm::Serial]),
        ("tiny-kimi-linear", "tiny-kimi-linear-tp2", &[Arm::Serial]),
        (
            "tiny-kimi-linear",
            "tiny-kimi-linear-pp2",
            &[Arm::Pipelined],
        ),
        // routed experts; MLA's latent cache with shared experts, across a PP cut
        ("tiny-qwen3moe", "tiny-qwen3moe", &[Arm::Serial]),
        (
            "tiny-deepseek2",
            "tiny-deepseek2-pp2",
            &[Arm::Serial, Arm::Pipelined],
        ),
        // KDA and DSA: the indexer's keys and pools past the accepted rows are written again
        ("tiny-glm5-next", "tiny-glm5-next", &[Arm::Serial]),
        (
            "tiny-glm5-next-shared",
            "tiny-glm5-next-shared-pp2",
            &[Arm::Serial, Arm::Pipelined],
        ),
    ] {
        let plain = synthetic_with(reference, "");
        let spec = synthetic_with(name, LOOKUP_3);
        let vocab = plain.plan.model.vocab;
        let prompt: Vec<u32> = vec![5, 9, 200, 31, 7, 5, 9];
        let turns = [prompt.clone(), vec![12, 5]];
        let want = decode_turns(&plain, options(Arm::Serial), &turns, 14, None);
        // the whole greedy sequence of both turns, wrong from the prompt's fourth token on
        let sequence = [&prompt[..], &want.0[..14], &turns[1], &want.0[14..]].concat();
        let drafts = Drafts::Replay {
            tokens: garbled(&sequence, prompt.len() + 3, vocab),
            cut: 3,
        };
        for &arm in arms {
            let (tokens, logits, tally) =
                decode_turns(&spec, options(arm), &turns, 14, Some(drafts.clone()));
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

#[test]
fn batched_verify_spans_leave_each_kda_sequence_its_plain_tokens_and_logits() {
    tiny_kimi_linear_model();
    let plain = synthetic_with("tiny-kimi-linear", "");
    let text = std::fs::read_to_string(root().join("plans/synthetic/tiny-kimi-linear.toml"))
        .unwrap()
        .replace(
            "gguf = \"../../models/",
            &format!("gguf = \"{}/models/", root().display()),
        )
        .replace("max_context = 256", "max_context = 256\nmax_sequences = 2");
    let spec = compile_scratch(
        "speculation-tiny-kimi-linear-batch2",
        &format!("{text}\n{LOOKUP_3}"),
    );
    let (k, vocab, n) = (3, plain.plan.model.vocab, 14);
    let prompts = [vec![5u32, 9, 200, 31, 7, 5, 9], vec![12, 5, 77, 3]];
    let want: Vec<_> = prompts
        .iter()
        .map(|p| {
            decode_turns(
                &plain,
                options(Arm::Serial),
                std::slice::from_ref(p),
                n,
                None,
            )
        })
        .collect();
    // drafts from each sequence's greedy continuation, wrong every third token
    let replays: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&want)
        .map(|(p, w)| garbled(&[&p[..], &w.0[..]].concat(), p.len() + 3, vocab))
        .collect();
    let mut batch = Batch::new(open(&spec, options(Arm::Serial)).unwrap(), 2, 1);
    let slots: Vec<usize> = prompts
        .iter()
        .map(|p| batch.join(p).unwrap().unwrap())
        .collect();
    let mut got = vec![(Vec::new(), Vec::new()); 2];
    let mut fed: Vec<Vec<u32>> = vec![Vec::new(); 2];
    let (mut drafted, mut accepted) = (0, 0);
    while batch.used() > 0 {
        let stepped = batch.step().unwrap();
        for d in &stepped.done {
            let i = slots.iter().position(|&s| s == d.slot).unwrap();
            let (tokens, logits) = &mut got[i];
            let mut taken = 0;
            let next = loop {
                let row = stepped.row_logits(d, taken).unwrap();
                let token = greedy(row);
                tokens.push(token);
                logits.push(row.to_vec());
                if fed[i].get(taken) != Some(&token) {
                    break token;
                }
                taken += 1;
            };
            drafted += fed[i].len();
            accepted += taken;
            if tokens.len() >= n {
                tokens.truncate(n);
                logits.truncate(n);
                batch.leave(d.slot).unwrap();
                continue;
            }
            batch.accept(d.slot, taken).unwrap();
            let at = prompts[i].len() + tokens.len();
            let room = k.min(n - tokens.len() - 1);
            fed[i] = replays[i][at.min(replays[i].len())..][..room].to_vec();
            batch.verify(d.slot, next, &fed[i]).unwrap();
        }
    }
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_same(
            &format!("batched sequence {i}"),
            &(w.0.clone(), w.1.clone()),
            &(g.0.clone(), g.1.clone()),
        );
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "drafts must be both accepted and rejected: {accepted} of {drafted}"
    );
}

#[test]
fn a_kda_reply_stopped_with_a_step_in_flight_leaves_no_trace_in_the_next_turn() {
    tiny_kimi_linear_model();
    // two steps in flight: when the first turn stops at its third token, the step after it is
    // already submitted and its row has gone into the KDA state, which cannot go back
    let plan = synthetic_variant("speculation-", "tiny-kimi-linear-pp2", "in_flight = 2");
    let rt = &plan.plan.runtime;
    assert_eq!(rt.in_flight, 2);
    let session = || {
        let engine = open(&plan, options(Arm::Pipelined)).unwrap();
        Session::new(engine, rt.in_flight, rt.max_context)
    };
    let prompt: Vec<u32> = vec![5, 9, 200, 31, 7];
    let mut chat = session();
    let mut taken = 0;
    let reply = chat
        .continue_with(&prompt, 12, |_, generates| {
            taken += usize::from(generates);
            Ok(if taken == 3 {
                Flow::Stop
            } else {
                Flow::Continue
            })
        })
        .unwrap();
    assert_eq!(reply.len(), 3);
    // the next turn, on the stopped chat and on a fresh session, bit for bit
    let context = [&prompt[..], &reply[..], &[12, 5][..]].concat();
    let next = |s: &mut Session| {
        let mut logits = Vec::new();
        let tokens = s
            .continue_with(&context, 6, |out, generates| {
                if generates {
                    logits.push(out.logits.clone());
                }
                Ok(Flow::Continue)
            })
            .unwrap();
        (tokens, logits)
    };
    let want = next(&mut session());
    assert_same("the turn after a stop", &want, &next(&mut chat));
}

/// Chi-square's value that `df` degrees of freedom exceed with the probability of a normal
/// variable exceeding `z` (Wilson-Hilferty); z = 4: about 3e-5.
fn chi2_critical(df: usize, z: f64) -> f64 {
    let df = df as f64;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Pearson's chi-square of `counts` against the probabilities `p`, categories expected fewer
/// than 5 times pooled into one; with its degrees of freedom.
fn chi2(counts: &[u64], p: &[f64]) -> (f64, usize) {
    let n = counts.iter().sum::<u64>() as f64;
    let (mut stat, mut cats, mut pooled) = (0.0, 0, (0.0, 0.0));
    for (&c, &q) in counts.iter().zip(p) {
        if n * q >= 5.0 {
            stat += (c as f64 - n * q).powi(2) / (n * q);
            cats += 1;
        } else {
            pooled = (pooled.0 + c as f64, pooled.1 + n * q);
        }
    }
    if pooled.1 > 0.0 {
        stat += (pooled.0 - pooled.1).powi(2) / pooled.1;
        cats += 1;
    }
    (stat, cats - 1)
}

#[test]
fn speculative_sampling_keeps_the_samplers_distribution() {
    // 24 logits a few units apart, temperature 0.8, nothing truncated: p = softmax(l / 0.8)
    let logits: Vec<f32> = (0..24).map(|i| (i * 7 % 24) as f32 * 0.2 - 2.0).collect();
    let max = logits.iter().fold(f64::MIN, |m, &l| m.max(f64::from(l)));
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| ((f64::from(l) - max) / 0.8).exp())
        .collect();
    let p: Vec<f64> = e.iter().map(|x| x / e.iter().sum::<f64>()).collect();
    let config = |seed| SamplerConfig {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed,
    };
    const DRAWS: u64 = 20_000;
    let likeliest = (0..24).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap() as u32;
    let unlikely = (0..24).min_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap() as u32;
    for draft in [likeliest, 5, unlikely] {
        let mut counts = vec![0u64; 24];
        let mut wrong = vec![0u64; 24];
        for seed in 0..DRAWS {
            let token = Sampler::new(config(seed)).verify(&logits, draft);
            counts[token as usize] += 1;
            // a known wrong rule: on rejection, a token drawn from p itself (the draft not
            // removed), which the test must tell apart
            let redrawn = match token == draft {
                true => draft,
                false => Sampler::new(config(seed + DRAWS)).sample(&logits),
            };
            wrong[redrawn as usize] += 1;
        }
        let (stat, df) = chi2(&counts, &p);
        let limit = chi2_critical(df, 4.0);
        assert!(
            stat < limit,
            "draft {draft}: chi-square {stat:.1} over {df} degrees of freedom, limit {limit:.1}"
        );
        if draft == likeliest {
            let (stat, df) = chi2(&wrong, &p);
            assert!(
                stat > chi2_critical(df, 4.0),
                "the wrong rule passed: chi-square {stat:.1} over {df}"
            );
        }
    }
}

#[test]
fn sampled_speculative_decoding_draws_what_plain_sampling_draws_on_a_tiny_model() {
    tiny_tp_model();
    let plain = synthetic_with("tiny-tp", "");
    let spec = synthetic_with("tiny-tp", LOOKUP_3);
    let sampling = |seed| SamplerConfig {
        temperature: 1.5,
        top_k: 3,
        top_p: 1.0,
        seed,
    };
    let prompt: Vec<u32> = vec![5, 9, 200, 31, 7];
    // three generated tokens of plain runs (the engine samples) and of speculative runs (the
    // host verifies a draft of the greedy sequence's second token against the first token's
    // row, then takes the bonus token or decodes the third alone): among 3 x 3 x 3 triples
    const RUNS: usize = 3000;
    let greedy = decode_turns(
        &plain,
        options(Arm::Serial),
        std::slice::from_ref(&prompt),
        3,
        None,
    )
    .0;
    let mut opts = options(Arm::Serial);
    opts.sampler = sampling(11);
    let rt = &plain.plan.runtime;
    let mut plain_session = Session::new(open(&plain, opts).unwrap(), rt.in_flight, rt.max_context);
    let drafts = Drafts::Replay {
        tokens: [&prompt[..], &greedy].concat(),
        cut: 3,
    };
    let engine = open(&spec, options(Arm::Serial)).unwrap();
    let mut spec_session = Session::new(engine, rt.in_flight, rt.max_context).speculating(
        3,
        drafts,
        Sampler::new(sampling(12)),
    );
    let mut triples = std::collections::BTreeMap::<Vec<u32>, (u64, u64)>::new();
    for _ in 0..RUNS {
        for (session, plain) in [(&mut plain_session, true), (&mut spec_session, false)] {
            session.reset();
            let g = session
                .continue_with(&prompt, 3, |_, _| Ok(Flow::Continue))
                .unwrap();
            let entry = triples.entry(g).or_default();
            if plain {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    let tally = spec_session.tally().unwrap();
    assert!(
        tally.accepted > 0 && tally.accepted < tally.drafted,
        "{tally:?}"
    );
    // two samples of equal size: sum (a - b)^2 / (a + b) over the triples seen 10 times or more
    let (mut stat, mut cats) = (0.0, 0usize);
    for &(a, b) in triples.values().filter(|(a, b)| a + b >= 10) {
        stat += (a as f64 - b as f64).powi(2) / (a + b) as f64;
        cats += 1;
    }
    let limit = chi2_critical(cats - 1, 4.0);
    assert!(cats >= 4, "{triples:?}");
    assert!(
        stat < limit,
        "chi-square {stat:.1} over {} degrees of freedom, limit {limit:.1}: {triples:?}",
        cats - 1
    );
}

/// `memra-run ARGS` in the repository root; its stdout and stderr, failing on an error.
fn memra_run(args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

#[test]
fn generate_with_a_lookup_plan_prints_plain_decodings_text_and_its_acceptance() {
    smollm2("smollm2");
    smollm2("smollm2-lookup");
    let prompt = "Copy: one two three four five six. Copy: one two three";
    let run = |plan: &str| {
        let plan = format!("plans/{plan}.plan.toml");
        memra_run(&[
            "generate", &plan, "-p", prompt, "-n", "10", "--temp", "0", "-t", "1",
        ])
    };
    let (plain, plain_err) = run("smollm2");
    let (spec, spec_err) = run("smollm2-lookup");
    assert_eq!(plain, spec);
    assert!(!plain_err.contains("speculative"), "{plain_err}");
    assert!(
        spec_err.contains("speculative: ") && spec_err.contains("lookup drafts"),
        "{spec_err}"
    );
}

#[test]
fn bench_of_replayed_drafts_accepts_every_draft_and_refuses_a_plain_plan() {
    smollm2("smollm2-lookup");
    // 5 tokens: the first plainly, the second from the step that embeds the first, then one
    // verify step of 2 replayed drafts and the bonus token
    let args = [
        "bench",
        "plans/smollm2-lookup.plan.toml",
        "-n",
        "5",
        "--reps",
        "1",
        "-t",
        "1",
        "--draft-replay",
        "2",
        "--json",
    ];
    let (out, _) = memra_run(&args);
    let line = out.lines().find(|l| l.contains("speculative")).expect(&out);
    let json: serde_json::Value = serde_json::from_str(line).unwrap();
    let s = &json["speculative"];
    assert_eq!(s["drafts"], "replay cut at 2", "{json}");
    assert_eq!(
        (s["steps"].as_u64(), s["accepted"].as_u64()),
        (Some(1), Some(2)),
        "{json}"
    );
    assert_eq!(s["acceptance_length"].as_f64(), Some(2.0), "{json}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args([
            "bench",
            "plans/smollm2.plan.toml",
            "--draft-replay",
            "2",
            "-n",
            "2",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has no [speculative] section"),
        "{err}"
    );
}
