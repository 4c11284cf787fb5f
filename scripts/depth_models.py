#!/usr/bin/env python3
"""memra's depth cuts for speed work, written with llama.cpp's own Python library.

`scripts/gpu.sh depth` times memra against llama.cpp on the same GGUF files (issue 36). So
that no convention of memra's own writer (memra-synth) can hide in them, the files come from
here: llama.cpp's gguf-py (the PyPI package `gguf`) writes each architecture as llama.cpp's
converter (convert_hf_to_gguf.py at llama.cpp 0c1e570) would write the checkpoint, cut to a
few layers: the converter's metadata keys and values for the model's config.json, its tensor
names, shapes and storage types (F16 matrices with `--outtype f16`, F32 for 1-d tensors, norms,
routers, KDA convolutions, biases and the tensors the converter keeps exact), and a byte-level
BPE vocabulary so that llama.cpp (llama-bench) and memra both load the file. Weights are
seeded random values; only the values are synthetic.

    depth_models.py write MODEL... --out DIR [--tiny] [--outtype f16|f32] [--layers N]
                          [--no-indexer-types] [--sparse] [--seed S]
    depth_models.py cut IN OUT --layers N [--from F]
    depth_models.py size MODEL... [--tiny]

`write` makes DIR/depth-MODEL-lN-OUTTYPE.gguf for each MODEL (N: the model's default cut, or
--layers): llama8b (Llama-3-8B, all 32 layers), qwen3moe (Qwen3-30B-A3B, 4 layers), deepseek2
(DeepSeek-V2-Lite, 4 layers), kimi-linear (Kimi-Linear-48B-A3B, 4 layers: KDA, KDA, KDA, MLA)
and glm5-next (GLM-5.3-Flash, 4 layers: KDA, KDA, KDA, MLA+DSA, in mHC streams). --tiny keeps
every layer kind at small widths, for checks on a CPU. `cut` keeps N of a file's blocks, the
first N or the N from block F, renumbered from 0 (any storage type: a quantized file stays
quantized), so that two layer counts of one file give the time a layer adds. `size` prints the bytes `write` would make. --sparse writes the header and
the tensor table only, the data a hole of its size: what a loader makes of a real-width header,
at no disk cost. glm5-next carries `attention.indexer.types` as the converter writes a config's
`indexer_types` (KDA layers false, DSA layers alternating full and shared, the first full);
--no-indexer-types writes the file of a config without them.

Where a depth cut cannot be the converter's file as is, the file says what llama.cpp needs:
deepseek2 writes `attention.q_lora_rank` 0 (V2-Lite's config has none, the converter then
writes no key, and llama.cpp infers "no q-LoRA" from 26 or 27 layers only); glm5-next is
converted without its NextN block (the converter's --no-mtp).

Values: a tensor walks a pool of 2^22 + 15 seeded uniform values (zero mean, unit standard
deviation) from an offset drawn from its name and the seed, scaled to a standard deviation of
1/sqrt(its row length) (projections that write into the residual stream further by
1/sqrt(2 * layers)); norms lie near 1. Walking one pool, rather than drawing every value,
keeps writing tens of gigabytes a memory copy: at real widths the weights repeat after 4M
values, which decode speed cannot see. With --tiny no tensor is longer than the pool.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T

POOL = (1 << 22) + 15

# ---- the models: each config.json's numbers (the real ones, then --tiny's)

REAL = {
    # meta-llama/Meta-Llama-3-8B (no rope scaling, so the converter writes no rope_freqs), with
    # Llama-3.1-8B's context length (the same widths), so that the depth-long suite's 32768
    # tokens of context are within it
    "llama8b": dict(
        arch="llama", layers=32, dim=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256,
        context=131072, rope_theta=500000.0, rms_eps=1e-5,
    ),
    # Qwen/Qwen3-30B-A3B
    "qwen3moe": dict(
        arch="qwen3moe", layers=4, dim=2048, ffn=6144, heads=32, kv_heads=4, head_dim=128,
        experts=128, experts_used=8, expert_ffn=768, vocab=151936, context=40960,
        rope_theta=1000000.0, rms_eps=1e-6,
    ),
    # deepseek-ai/DeepSeek-V2-Lite: MLA without q-LoRA, softmax routing, YaRN
    "deepseek2": dict(
        arch="deepseek2", layers=4, dim=2048, ffn=10944, heads=16, kv_lora=512, qk_nope=128,
        qk_rope=64, v_head=128, dense_layers=1, experts=64, experts_used=6, expert_ffn=1408,
        shared=2, vocab=102400, context=163840, rope_theta=10000.0, rms_eps=1e-6,
        yarn_factor=40.0, yarn_orig=4096, yarn_beta_fast=32.0, yarn_beta_slow=1.0,
        mscale_all_dim=0.707, groups=1, groups_used=1, weights_scale=1.0,
    ),
    # moonshotai/Kimi-Linear-48B-A3B: KDA layers, MLA (no q-LoRA, no rope) at every 4th
    "kimi-linear": dict(
        arch="kimi-linear", layers=4, dim=2304, ffn=9216, heads=32, kda_head=128, conv=4,
        full_attn_every=4, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, dense_layers=1,
        experts=256, experts_used=8, expert_ffn=1024, shared=1, vocab=163840,
        context=1048576, rms_eps=1e-5, weights_scale=2.446,
    ),
    # GLM-5.3-Flash (plans/models/glm-5.3-flash.json): KDA, nope-MLA with the k-pool DSA
    # indexer at every 4th layer, mHC, clamped SwiGLU; converted with --no-mtp
    "glm5-next": dict(
        arch="glm5-next", layers=4, dim=6144, ffn=12288, heads=32, kda_head=128, conv=4,
        gate_lower_bound=-5.0, full_attn_every=4, q_lora=1536, kv_lora=512, qk_nope=192,
        v_head=128, index_heads=32, index_head=128, index_topk=2048, index_kpool=4,
        hc_mult=4, hc_iters=20, hc_eps=1e-6, dense_layers=1, experts=256, experts_used=8,
        expert_ffn=1536, shared=1, weights_scale=2.5, swiglu_limit=10.0, vocab=151552,
        context=131072, rms_eps=1e-5,
    ),
}

# every width a multiple of 256 (so every quantized type applies) and of the heads
TINY = {
    "llama8b": dict(layers=2, dim=256, ffn=768, heads=4, kv_heads=2, vocab=512),
    "qwen3moe": dict(layers=2, dim=256, ffn=768, heads=8, kv_heads=2, head_dim=64, experts=8,
                     experts_used=4, expert_ffn=256, vocab=512),
    "deepseek2": dict(layers=3, dim=256, ffn=512, heads=4, kv_lora=256, qk_nope=64,
                      qk_rope=32, v_head=64, experts=8, experts_used=2, expert_ffn=256,
                      vocab=512),
    "kimi-linear": dict(layers=4, dim=256, ffn=512, heads=4, kda_head=64, full_attn_every=2,
                        kv_lora=256, qk_nope=64, qk_rope=32, v_head=64, experts=8,
                        experts_used=2, expert_ffn=256, vocab=512, context=4096),
    "glm5-next": dict(layers=4, dim=256, ffn=512, heads=4, kda_head=64, full_attn_every=2,
                      q_lora=256, kv_lora=256, qk_nope=64, v_head=64, index_heads=2,
                      index_head=64, index_topk=8, experts=8, experts_used=2, expert_ffn=256,
                      vocab=512, context=4096, swiglu_limit=2.0),
}

MODELS = list(REAL)


def config(model: str, tiny: bool, layers: int | None) -> dict:
    c = dict(REAL[model])
    if tiny:
        c.update(TINY[model])
    if layers is not None:
        c["layers"] = layers
    c["dense_layers"] = min(c.get("dense_layers", 0), c["layers"])
    return c


# ---- the tensors: names, ggml shapes (innermost first) and how values are drawn


@dataclass
class Tensor:
    name: str
    ne: list[int]  # ggml order: ne[0] is the row length
    init: tuple  # ("w", extra divisor) | ("norm",) | ("uniform", a) | ("around", c, h)
    qtype: T | None = None  # set by storage_type


@dataclass
class Model:
    arch: str
    meta: list = field(default_factory=list)  # (gguf-py writer method or key, value, kind)
    tensors: list = field(default_factory=list)


def is_attention(c: dict, il: int) -> bool:
    """Layer `il` is a full-attention (MLA) layer of a hybrid model: every
    `full_attn_every`-th layer, counting from 1, as the checkpoints' layer lists say."""
    return (il + 1) % c["full_attn_every"] == 0


def add(ts: list, name: str, ne: list[int], init: tuple = ("w", 1.0)) -> None:
    ts.append(Tensor(name, [int(x) for x in ne], init))


def blk(il: int, suffix: str) -> str:
    return f"blk.{il}.{suffix}"


def dense_ffn(ts: list, il: int, dim: int, ffn: int, res: float, suffix: str = "") -> None:
    add(ts, blk(il, f"ffn_gate{suffix}.weight"), [dim, ffn])
    add(ts, blk(il, f"ffn_up{suffix}.weight"), [dim, ffn])
    add(ts, blk(il, f"ffn_down{suffix}.weight"), [ffn, dim], ("w", res))


def experts(ts: list, il: int, c: dict, res: float, probs_bias: bool) -> None:
    dim, e, f = c["dim"], c["experts"], c["expert_ffn"]
    add(ts, blk(il, "ffn_gate_inp.weight"), [dim, e])
    if probs_bias:
        add(ts, blk(il, "exp_probs_b.bias"), [e], ("uniform", 0.1))
    add(ts, blk(il, "ffn_gate_exps.weight"), [dim, f, e])
    add(ts, blk(il, "ffn_up_exps.weight"), [dim, f, e])
    add(ts, blk(il, "ffn_down_exps.weight"), [f, dim, e], ("w", res))


def deepseek_ffn(ts: list, il: int, c: dict, res: float, probs_bias: bool) -> None:
    """A DeepSeek-style FFN: dense in the leading layers, else routed plus shared experts."""
    add(ts, blk(il, "ffn_norm.weight"), [c["dim"]], ("norm",))
    if il < c["dense_layers"]:
        dense_ffn(ts, il, c["dim"], c["ffn"], res)
    else:
        experts(ts, il, c, res, probs_bias)
        dense_ffn(ts, il, c["dim"], c["expert_ffn"] * c["shared"], res, "_shexp")


def mla(ts: list, il: int, c: dict, res: float, rope: int) -> None:
    """MLA as the converter splits it for absorbed decode: kv_b_proj becomes attn_k_b
    (transposed per head) and attn_v_b."""
    dim, h, kv = c["dim"], c["heads"], c["kv_lora"]
    k_head = c["qk_nope"] + rope
    if c.get("q_lora"):
        add(ts, blk(il, "attn_q_a.weight"), [dim, c["q_lora"]])
        add(ts, blk(il, "attn_q_a_norm.weight"), [c["q_lora"]], ("norm",))
        add(ts, blk(il, "attn_q_b.weight"), [c["q_lora"], h * k_head])
    else:
        add(ts, blk(il, "attn_q.weight"), [dim, h * k_head])
    add(ts, blk(il, "attn_kv_a_mqa.weight"), [dim, kv + rope])
    add(ts, blk(il, "attn_kv_a_norm.weight"), [kv], ("norm",))
    add(ts, blk(il, "attn_k_b.weight"), [c["qk_nope"], kv, h])
    add(ts, blk(il, "attn_v_b.weight"), [kv, c["v_head"], h])
    add(ts, blk(il, "attn_output.weight"), [h * c["v_head"], dim], ("w", res))


def kda(ts: list, il: int, c: dict, res: float, a_ne: list[int]) -> None:
    """A KDA layer's mixer. The converter reshapes each short convolution to ggml
    [d_conv, 1, d_inner, 1] and stores -exp(A_log) as `ssm_a` in the checkpoint's shape."""
    dim, h, hd = c["dim"], c["heads"], c["kda_head"]
    inner = h * hd
    for x in "qkv":
        add(ts, blk(il, f"attn_{x}.weight"), [dim, inner])
    for x in "qkv":
        add(ts, blk(il, f"ssm_conv1d_{x}.weight"), [c["conv"], 1, inner, 1],
            ("uniform", (3.0 / c["conv"]) ** 0.5))
    add(ts, blk(il, "ssm_f_a.weight"), [dim, hd])
    add(ts, blk(il, "ssm_f_b.weight"), [hd, inner])
    add(ts, blk(il, "ssm_beta.weight"), [dim, h])
    # decays of e^-0.2 to e^-1 per token: the state carries several tokens
    add(ts, blk(il, "ssm_a"), a_ne, ("around", -0.6, 0.4))
    add(ts, blk(il, "ssm_dt.bias"), [inner], ("uniform", 0.5))
    add(ts, blk(il, "ssm_g_a.weight"), [dim, hd])
    add(ts, blk(il, "ssm_g_b.weight"), [hd, inner])
    add(ts, blk(il, "ssm_norm.weight"), [hd], ("norm",))
    add(ts, blk(il, "attn_output.weight"), [inner, dim], ("w", res))


def head_and_tail(ts: list, c: dict, body) -> None:
    add(ts, "token_embd.weight", [c["dim"], c["vocab"]])
    for il in range(c["layers"]):
        body(il)
    add(ts, "output_norm.weight", [c["dim"]], ("norm",))
    add(ts, "output.weight", [c["dim"], c["vocab"]])


def residual(c: dict) -> float:
    return (2.0 * c["layers"]) ** 0.5


def build_llama(c: dict) -> Model:
    m = Model("llama")
    dim, hd = c["dim"], c["dim"] // c["heads"]
    res = residual(c)

    def body(il):
        ts = m.tensors
        add(ts, blk(il, "attn_norm.weight"), [dim], ("norm",))
        add(ts, blk(il, "attn_q.weight"), [dim, dim])
        add(ts, blk(il, "attn_k.weight"), [dim, hd * c["kv_heads"]])
        add(ts, blk(il, "attn_v.weight"), [dim, hd * c["kv_heads"]])
        add(ts, blk(il, "attn_output.weight"), [dim, dim], ("w", res))
        add(ts, blk(il, "ffn_norm.weight"), [dim], ("norm",))
        dense_ffn(ts, il, dim, c["ffn"], res)

    head_and_tail(m.tensors, c, body)
    m.meta = common(c) + [
        ("add_head_count_kv", c["kv_heads"]),
        ("add_rope_freq_base", c["rope_theta"]),
        ("add_layer_norm_rms_eps", c["rms_eps"]),
        ("add_vocab_size", c["vocab"]),
        ("add_rope_dimension_count", hd),
    ]
    return m


def build_qwen3moe(c: dict) -> Model:
    m = Model("qwen3moe")
    dim, hd = c["dim"], c["head_dim"]
    res = residual(c)

    def body(il):
        ts = m.tensors
        add(ts, blk(il, "attn_norm.weight"), [dim], ("norm",))
        add(ts, blk(il, "attn_q.weight"), [dim, c["heads"] * hd])
        add(ts, blk(il, "attn_q_norm.weight"), [hd], ("norm",))
        add(ts, blk(il, "attn_k.weight"), [dim, c["kv_heads"] * hd])
        add(ts, blk(il, "attn_k_norm.weight"), [hd], ("norm",))
        add(ts, blk(il, "attn_v.weight"), [dim, c["kv_heads"] * hd])
        add(ts, blk(il, "attn_output.weight"), [c["heads"] * hd, dim], ("w", res))
        add(ts, blk(il, "ffn_norm.weight"), [dim], ("norm",))
        experts(ts, il, c, res, probs_bias=False)

    head_and_tail(m.tensors, c, body)
    # the config's head_dim becomes key_length and value_length; no rope.dimension_count
    m.meta = common(c) + [
        ("add_head_count_kv", c["kv_heads"]),
        ("add_rope_freq_base", c["rope_theta"]),
        ("add_layer_norm_rms_eps", c["rms_eps"]),
        ("add_expert_count", c["experts"]),
        ("add_expert_used_count", c["experts_used"]),
        ("add_key_length", hd),
        ("add_value_length", hd),
        ("add_expert_feed_forward_length", c["expert_ffn"]),
    ]
    return m


def build_deepseek2(c: dict) -> Model:
    m = Model("deepseek2")
    res = residual(c)

    def body(il):
        add(m.tensors, blk(il, "attn_norm.weight"), [c["dim"]], ("norm",))
        mla(m.tensors, il, c, res, rope=c["qk_rope"])
        deepseek_ffn(m.tensors, il, c, res, probs_bias=False)

    head_and_tail(m.tensors, c, body)
    kv = c["kv_lora"]
    m.meta = common(c) + [
        ("add_head_count_kv", 1),  # MLA becomes MQA over the latent
        ("add_rope_scaling_type", gguf.RopeScalingType.YARN),
        ("add_rope_scaling_factor", c["yarn_factor"]),
        ("add_rope_scaling_orig_ctx_len", c["yarn_orig"]),
        ("add_rope_scaling_yarn_beta_fast", c["yarn_beta_fast"]),
        ("add_rope_scaling_yarn_beta_slow", c["yarn_beta_slow"]),
        ("add_rope_freq_base", c["rope_theta"]),
        ("add_layer_norm_rms_eps", c["rms_eps"]),
        ("add_expert_count", c["experts"]),
        ("add_expert_used_count", c["experts_used"]),
        ("add_expert_group_count", c["groups"]),
        ("add_expert_group_used_count", c["groups_used"]),
        ("add_expert_gating_func", gguf.ExpertGatingFuncType.SOFTMAX),
        ("add_leading_dense_block_count", c["dense_layers"]),
        ("add_vocab_size", c["vocab"]),
        # V2-Lite's config has no q-LoRA and the converter then writes no q_lora_rank;
        # llama.cpp infers "no q-LoRA" from 26 or 27 layers only, so a depth cut says it
        ("add_q_lora_rank", 0),
        ("add_kv_lora_rank", kv),
        ("add_key_length", kv + c["qk_rope"]),
        ("add_value_length", kv),
        ("add_key_length_mla", c["qk_nope"] + c["qk_rope"]),
        ("add_value_length_mla", c["v_head"]),
        ("add_expert_feed_forward_length", c["expert_ffn"]),
        ("add_expert_shared_count", c["shared"]),
        ("add_expert_weights_scale", c["weights_scale"]),
        ("add_rope_dimension_count", c["qk_rope"]),
        # 0.1 * mscale_all_dim, computed in Python's double then stored as f32, as the
        # converter does
        ("add_rope_scaling_yarn_log_mul", 0.1 * c["mscale_all_dim"]),
    ]
    return m


def build_kimi_linear(c: dict) -> Model:
    m = Model("kimi-linear")
    res = residual(c)

    def body(il):
        add(m.tensors, blk(il, "attn_norm.weight"), [c["dim"]], ("norm",))
        if is_attention(c, il):
            mla(m.tensors, il, c, res, rope=c["qk_rope"])
        else:
            kda(m.tensors, il, c, res, a_ne=[1, c["heads"], 1, 1])
        deepseek_ffn(m.tensors, il, c, res, probs_bias=True)

    head_and_tail(m.tensors, c, body)
    kv = c["kv_lora"]
    kv_heads = [1 if is_attention(c, il) else 0 for il in range(c["layers"])]
    m.meta = common(c) + [
        ("add_head_count_kv", kv_heads),
        ("add_layer_norm_rms_eps", c["rms_eps"]),
        ("add_expert_count", c["experts"]),
        ("add_expert_used_count", c["experts_used"]),
        ("add_expert_gating_func", gguf.ExpertGatingFuncType.SIGMOID),
        ("add_vocab_size", c["vocab"]),
        ("add_ssm_conv_kernel", c["conv"]),
        ("add_kda_head_dim", c["kda_head"]),
        ("add_kv_lora_rank", kv),
        ("add_rope_dimension_count", c["qk_rope"]),
        # the converter writes key_length (the latent plus the rope part) but no
        # value_length for this architecture
        ("add_key_length", kv + c["qk_rope"]),
        ("add_key_length_mla", c["qk_nope"] + c["qk_rope"]),
        ("add_value_length_mla", c["v_head"]),
        ("add_expert_feed_forward_length", c["expert_ffn"]),
        ("add_expert_shared_count", c["shared"]),
        ("add_leading_dense_block_count", c["dense_layers"]),
        ("add_expert_weights_scale", c["weights_scale"]),
    ]
    return m


def build_glm5_next(c: dict, indexer_types: bool) -> Model:
    m = Model("glm5-next")
    res = residual(c)
    dim, hc = c["dim"], c["hc_mult"]
    mix = (2 + hc) * hc

    def body(il):
        ts = m.tensors
        for which in ("attn", "ffn"):
            add(ts, blk(il, f"hc_{which}_fn.weight"), [hc * dim, mix])
            add(ts, blk(il, f"hc_{which}_base.weight"), [mix], ("uniform", 1.0))
            add(ts, blk(il, f"hc_{which}_scale.weight"), [3], ("around", 1.0, 0.5))
        add(ts, blk(il, "attn_norm.weight"), [dim], ("norm",))
        if is_attention(c, il):
            mla(ts, il, c, res, rope=0)
            ih, idim = c["index_heads"], c["index_head"]
            add(ts, blk(il, "indexer.k_norm.weight"), [idim], ("norm",))
            add(ts, blk(il, "indexer.k_norm.bias"), [idim], ("uniform", 0.1))
            add(ts, blk(il, "indexer.proj.weight"), [dim, ih])
            add(ts, blk(il, "indexer.attn_k.weight"), [dim, idim])
            add(ts, blk(il, "indexer.attn_q_b.weight"), [c["q_lora"], ih * idim])
            add(ts, blk(il, "indexer_compressor_gate.weight"), [dim, idim])
            add(ts, blk(il, "indexer_compressor_ape.weight"), [idim, c["index_kpool"]],
                ("uniform", 1.0))
        else:
            kda(ts, il, c, res, a_ne=[c["heads"]])  # glm5-next flattens A_log to [heads]
        deepseek_ffn(ts, il, c, res, probs_bias=True)

    head_and_tail(m.tensors, c, body)
    n = c["layers"]
    kv = c["kv_lora"]
    m.meta = common(c) + [
        ("add_layer_norm_rms_eps", c["rms_eps"]),
        ("add_expert_count", c["experts"]),
        ("add_expert_used_count", c["experts_used"]),
        ("add_head_count_kv", [1 if is_attention(c, il) else 0 for il in range(n)]),
        ("add_vocab_size", c["vocab"]),
        ("add_layer_norm_eps", 1e-6),
        ("add_ssm_conv_kernel", c["conv"]),
        ("add_kda_head_dim", c["kda_head"]),
        ("kda.gate_lower_bound", c["gate_lower_bound"], "f32"),
        ("add_q_lora_rank", c["q_lora"]),
        ("add_kv_lora_rank", kv),
        ("add_rope_dimension_count", 0),
        ("add_key_length", kv),
        ("add_value_length", kv),
        ("add_key_length_mla", c["qk_nope"]),
        ("add_value_length_mla", c["v_head"]),
        ("add_indexer_head_count", c["index_heads"]),
        ("add_indexer_key_length", c["index_head"]),
        ("add_indexer_top_k", c["index_topk"]),
        ("attention.indexer.kpool", c["index_kpool"], "u32"),
        ("attention.indexer.kpool_select_tail", True, "bool"),
    ]
    if indexer_types:
        # the converter writes `[t == "full" for t in indexer_types]` over every layer of the
        # config: KDA layers false (llama.cpp never reads theirs), DSA layers alternating
        # full and shared (a shared layer reuses the selection of the full layer before it),
        # the first one full
        types, full = [], True
        for il in range(n):
            types.append(is_attention(c, il) and full)
            if is_attention(c, il):
                full = not full
        m.meta.append(("attention.indexer.types", types, "bools"))
    m.meta += [
        ("hyper_connection.count", hc, "u32"),
        ("hyper_connection.sinkhorn_iterations", c["hc_iters"], "u32"),
        ("hyper_connection.epsilon", c["hc_eps"], "f32"),
        ("add_leading_dense_block_count", c["dense_layers"]),
        ("add_expert_feed_forward_length", c["expert_ffn"]),
        ("add_expert_shared_count", c["shared"]),
        ("add_expert_weights_scale", c["weights_scale"]),
        ("add_expert_weights_norm", True),
        ("add_swiglu_clamp_exp", [c["swiglu_limit"]] * n),
        ("add_swiglu_clamp_shexp", [c["swiglu_limit"]] * n),
    ]
    return m


def common(c: dict) -> list:
    """What the converter's TextModel writes for every architecture first."""
    return [
        ("add_block_count", c["layers"]),
        ("add_context_length", c["context"]),
        ("add_embedding_length", c["dim"]),
        ("add_feed_forward_length", c["ffn"]),
        ("add_head_count", c["heads"]),
    ]


def build(model: str, c: dict, indexer_types: bool) -> Model:
    if model == "llama8b":
        return build_llama(c)
    if model == "qwen3moe":
        return build_qwen3moe(c)
    if model == "deepseek2":
        return build_deepseek2(c)
    if model == "kimi-linear":
        return build_kimi_linear(c)
    return build_glm5_next(c, indexer_types)


def storage_type(arch: str, t: Tensor, outtype: T) -> T:
    """The converter's choice: F32 for 1-d tensors, norms, anything not named `.weight`,
    routers, KDA convolutions and the DSA indexer's head weights (and, for glm5-next, the
    small mHC, compressor, decay and bias tensors it keeps exact); `outtype` otherwise."""
    n = t.name
    keep = ("ffn_gate_inp.weight", "ssm_conv1d_q.weight", "ssm_conv1d_k.weight",
            "ssm_conv1d_v.weight", "indexer.proj.weight")
    if len(t.ne) <= 1 or n.endswith("_norm.weight") or not n.endswith(".weight") \
            or n.endswith(keep):
        return T.F32
    if arch == "glm5-next" and n.startswith("blk.") and any(
            k in n for k in ("hc_attn_", "hc_ffn_", "indexer_compressor_", "ssm_a", "ssm_dt",
                             "exp_probs_b")):
        return T.F32
    return outtype


# ---- the vocabulary: byte-level BPE, so that any text tokenizes


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte: printable bytes stand for themselves, the
    others take the code points from 256 up, in byte order."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, extra = [], 256
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(extra))
            extra += 1
    return out


# a few English merges, so the merge table is a real one (gguf-py drops an empty array, and
# llama.cpp refuses a gpt2 vocabulary without merges)
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "Ġ a", "o n", "r e", "Ġ s", "e n",
          "a t", "o r", "Ġ w", "e s", "Ġ o", "i s", "i t", "Ġ c", "Ġ b"]


def add_vocab(w: gguf.GGUFWriter, vocab: int) -> None:
    tokens = byte_symbols()
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
        types.append(gguf.TokenType.NORMAL)
    bos, eos = vocab - 2, vocab - 1
    while len(tokens) < bos:
        tokens.append(f"<|reserved_{len(tokens)}|>")
        types.append(gguf.TokenType.CONTROL)
    tokens += ["<|begin_of_text|>", "<|end_of_text|>"]
    types += [gguf.TokenType.CONTROL] * 2
    assert len(tokens) == vocab, (len(tokens), vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)


# ---- writing


def apply_meta(w: gguf.GGUFWriter, arch: str, meta: list) -> None:
    for item in meta:
        if len(item) == 2:
            getattr(w, item[0])(item[1])
            continue
        # keys the PyPI gguf 0.19.0 has no method for: llama.cpp's names (src/llama-arch.cpp)
        key, value, kind = item
        key = f"{arch}.{key}"
        if kind == "u32":
            w.add_uint32(key, value)
        elif kind == "f32":
            w.add_float32(key, value)
        elif kind == "bool":
            w.add_bool(key, value)
        elif kind == "bools":
            w.add_array(key, [bool(v) for v in value])
        else:
            raise ValueError(kind)


class Values:
    """Seeded values for every tensor, from one pool per (scale, storage type)."""

    def __init__(self, seed: int):
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.base = (rng.random(POOL, dtype=np.float32) * 2.0 - 1.0) * np.float32(3.0 ** 0.5)
        self.pools: dict = {}

    def pool(self, kind: tuple, dtype) -> np.ndarray:
        key = (kind, np.dtype(dtype).str)
        if key not in self.pools:
            if kind[0] == "scaled":
                p = self.base * np.float32(kind[1])
            elif kind[0] == "norm":
                p = 1.0 + 0.1 / 3.0 ** 0.5 * self.base
            elif kind[0] == "uniform":
                p = kind[1] / 3.0 ** 0.5 * self.base
            else:  # around
                p = kind[1] + kind[2] / 3.0 ** 0.5 * self.base
            self.pools[key] = p.astype(dtype)
        return self.pools[key]

    def pieces(self, t: Tensor, dtype) -> list[np.ndarray]:
        """The tensor's values in file order, as views into its pool."""
        n = int(np.prod(t.ne))
        if t.init[0] == "w":
            kind = ("scaled", 1.0 / (t.ne[0] ** 0.5) / t.init[1])
        else:
            kind = t.init
        pool = self.pool(kind, dtype)
        off = zlib.crc32(f"{self.seed}:{t.name}".encode()) % POOL
        out = [pool[off:off + n]]
        done = len(out[0])
        while done < n:
            out.append(pool[:min(POOL, n - done)])
            done += len(out[-1])
        return out


def write_pieces(w: gguf.GGUFWriter, pieces: list[np.ndarray]) -> None:
    """GGUFWriter.write_tensor_data for a tensor given as consecutive pieces (so that tens of
    gigabytes are never copied into one array first): the next tensor of the table, aligned
    and padded as gguf-py aligns and pads it."""
    fout = w.fout[0]
    name = next(iter(w.tensors[0]))
    info = w.tensors[0].pop(name)
    nbytes = sum(p.nbytes for p in pieces)
    assert info.nbytes == nbytes, (name, info.nbytes, nbytes)
    w.write_padding(fout, fout.tell())
    for p in pieces:
        p.tofile(fout)
    w.write_padding(fout, nbytes)
    w.state = gguf.gguf_writer.WriterState.WEIGHTS


def itemsize(q: T) -> int:
    return 4 if q == T.F32 else 2


def plan(model: str, c: dict, outtype: T, indexer_types: bool) -> Model:
    m = build(model, c, indexer_types)
    for t in m.tensors:
        t.qtype = storage_type(m.arch, t, outtype)
    return m


def write(model: str, c: dict, outtype: T, path: Path, seed: int, indexer_types: bool,
          tiny: bool, sparse: bool = False) -> None:
    m = plan(model, c, outtype, indexer_types)
    w = gguf.GGUFWriter(str(path), m.arch)
    scale = "tiny" if tiny else "real widths"
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"memra depth {model} l{c['layers']} ({scale}, seed {seed})")
    apply_meta(w, m.arch, m.meta)
    f32 = outtype == T.F32
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if f32 else gguf.LlamaFileType.MOSTLY_F16)
    add_vocab(w, c["vocab"])
    for t in m.tensors:
        dtype = np.float32 if t.qtype == T.F32 else np.float16
        n = int(np.prod(t.ne))
        w.add_tensor_info(t.name, list(reversed(t.ne)), np.dtype(dtype), n * itemsize(t.qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if sparse:
        # the header and the tensor table alone, the data a hole of its final size
        fout = w.fout[0]
        end = w.ggml_pad(fout.tell(), w.data_alignment)
        end += sum(w.ggml_pad(int(np.prod(t.ne)) * itemsize(t.qtype), w.data_alignment)
                   for t in m.tensors)
        fout.truncate(end)
        w.close()
        return
    values = Values(seed)
    for t in m.tensors:
        dtype = np.float32 if t.qtype == T.F32 else np.float16
        write_pieces(w, values.pieces(t, dtype))
    w.close()


def size(model: str, c: dict, outtype: T, indexer_types: bool) -> int:
    m = plan(model, c, outtype, indexer_types)
    return sum(int(np.prod(t.ne)) * itemsize(t.qtype) for t in m.tensors)


# ---- cutting a written (or quantized) file to its first blocks


def cut(src: Path, dst: Path, layers: int, first: int = 0) -> None:
    """Blocks first .. first + layers of src as blocks 0 .. layers of dst: their tensors
    renamed, the per-layer arrays sliced, the leading dense blocks counted anew."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    old = r.fields[f"{arch}.block_count"].contents()
    if not 0 <= first < old:
        raise SystemExit(f"cut: --from {first} is out of range 0..{old - 1} for {src}")
    if not 0 < layers <= old - first:
        raise SystemExit(f"cut: --layers {layers} is out of range 1..{old - first} for {src} from block {first}")
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = f.contents()
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if name == f"{arch}.block_count":
            value = layers
        elif name == f"{arch}.leading_dense_block_count":
            value = min(max(value - first, 0), layers)
        elif name.startswith(f"{arch}.") and sub is not None and len(value) == old:
            value = value[first:first + layers]  # a per-layer array
        w.add_key_value(name, value, vtype, sub_type=sub)
    kept = []
    for t in r.tensors:
        name = t.name
        if name.startswith("blk."):
            _, il, rest = name.split(".", 2)
            if not first <= int(il) < first + layers:
                continue
            name = f"blk.{int(il) - first}.{rest}"
        kept.append(t)
        w.add_tensor_info(name, list(reversed([int(x) for x in t.shape])), np.dtype(np.float32),
                          int(t.n_bytes), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in kept:
        w.write_tensor_data(t.data)
    w.close()


# ---- command line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("write", "size"):
        p = sub.add_parser(name)
        p.add_argument("models", nargs="+", choices=MODELS)
        p.add_argument("--tiny", action="store_true", help="small widths, every layer kind")
        p.add_argument("--layers", type=int, help="blocks (default: the model's cut)")
        p.add_argument("--outtype", choices=["f16", "f32"], default="f16")
        p.add_argument("--no-indexer-types", action="store_true",
                       help="glm5-next: no attention.indexer.types (a config without "
                            "indexer_types: every DSA layer has its own indexer)")
        if name == "write":
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--seed", type=int, default=36)
            p.add_argument("--sparse", action="store_true",
                           help="write the header and tensor table only, the data a hole "
                                "(what a loader makes of the header, at no disk cost)")
    p = sub.add_parser("cut")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--from", dest="first", type=int, default=0, metavar="F",
                   help="the first block kept (default 0)")
    a = ap.parse_args()

    if a.cmd == "cut":
        cut(a.src, a.dst, a.layers, a.first)
        print(f"{a.dst}: blocks {a.first} to {a.first + a.layers - 1} of {a.src}")
        return 0
    outtype = T.F32 if a.outtype == "f32" else T.F16
    for model in a.models:
        c = config(model, a.tiny, a.layers)
        types = not a.no_indexer_types
        if a.cmd == "size":
            print(f"{model} l{c['layers']} {a.outtype}: {size(model, c, outtype, types)} bytes")
            continue
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / f"depth-{model}-l{c['layers']}-{a.outtype}.gguf"
        write(model, c, outtype, path, a.seed, types, a.tiny, a.sparse)
        print(f"{path}: {os.path.getsize(path)} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
