//! Tensor-parallel bit identity on the synthetic tiny-tp model (32 heads, 8 KV heads, q8_0):
//! TP-2, TP-4 and PP-2 x TP-2 give logits bit-identical to the 1-rank plan in both arms, and
//! a deliberately wrong all-reduce order is caught. The committed plans are checked against a
//! fresh compile, since the compiler's golden test cannot write the synthetic model.

mod common;

use common::{
    assert_bit_identical, assert_plan_up_to_date, reversed_fold_mismatch, tiny_tp, tiny_tp_model,
};
use memra_executor::cpu::Arm;

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
