//! Tensor-parallel bit identity on the synthetic tiny-tp model (32 heads, 8 KV heads, q8_0):
//! TP-2, TP-4 and PP-2 x TP-2 give logits bit-identical to the 1-rank plan in both arms, and
//! a deliberately wrong all-reduce order is caught. The committed plans are checked against a
//! fresh compile, since the compiler's golden test cannot write the synthetic model.

mod common;

use common::{options, root, tiny_tp, tiny_tp_model};
use memra_compiler::passes::compile;
use memra_executor::cpu::{Arm, ReduceOrder};
use memra_executor::gate::{gate, Difference};

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
        let placement = root().join(format!("plans/synthetic/{name}.toml"));
        let compiled = compile(&placement).unwrap_or_else(|e| panic!("{name}: {e}"));
        let committed = std::fs::read_to_string(placement.with_extension("plan.toml")).unwrap();
        assert!(
            compiled.plan.to_toml() == committed,
            "plans/synthetic/{name}.plan.toml is stale; update it with: memra-compile plans/synthetic/{name}.toml"
        );
    }
}

fn assert_gate_passes(name: &str) {
    let reference = tiny_tp("tiny-tp");
    let candidate = tiny_tp(name);
    let report = gate(
        &reference,
        &candidate,
        &PROMPT,
        GENERATED,
        options(Arm::Serial),
    )
    .unwrap();
    assert_eq!(report.mismatch, None, "{name}");
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
    let broken = memra_executor::cpu::EngineOptions {
        reduce_order: ReduceOrder::ReversedFold,
        ..options(Arm::Serial)
    };
    // A reversed fold moves sums by a last bit; the 8-bit activations (with f16 scales, as the
    // q8_1 format stores them) absorb most such changes, so this gate decodes longer.
    let report = gate(&reference, &candidate, &PROMPT, 40, broken).unwrap();
    let m = report
        .mismatch
        .expect("the gate must catch a wrong all-reduce order");
    assert_eq!(m.arm, Arm::Serial);
    assert!(matches!(m.what, Difference::Logit { .. }), "{m}");
    let text = m.to_string();
    eprintln!("caught: {text}");
    assert!(text.starts_with("serial arm, step "), "{text}");
}
