"""Writes tiny glm5-next GGUFs with gguf-py (the PyPI package `gguf`), the writer llama.cpp's
own converter uses, so the oracle has one model per architecture that memra's writer did not
make (docs/arch-glm5-next.md). The model: 8 trunk layers, KDA and nope-MLA alternating
(layers 1, 3, 5, 7 are MLA), whose MLA layers alternate a full DSA indexer and a shared one
(`glm5-next.attention.indexer.types` = false, false, false, false ... with layers 1 and 5
true): layers 3 and 7 carry no indexer tensors and reuse the selection of layers 1 and 5.
The KDA layers' entries are false, as the converter writes them for a config whose
`indexer_types` marks them "shared"; llama.cpp never reads them. Everything else follows
memra-synth's tiny-glm5-next (widths, seeds aside): four mHC streams, a leading dense FFN,
8 routed experts (top 2, sigmoid, selection bias) with a shared expert, SwiGLU clamped at 2.

Values are drawn from numpy's PCG64 with a fixed seed, uniform with standard deviation
1/sqrt(row length) (divided by sqrt(2 * layers) for the projections that write into the
residual); norms in [0.9, 1.1). With `--dtype q8_0` the tensors llama.cpp's quantizer
quantizes for glm5-next are q8_0 (gguf-py's own quantizer), the others f32, as a file
quantized from an f32 conversion.

usage: python3 tiny_glm5_shared.py --dtype f32|q8_0 --seed N -o OUT.gguf
"""

import argparse
import sys

import numpy as np

import gguf

ARCH = "glm5-next"
LAYERS = 8
DIM = 256
HEADS = 4
KDA_HEAD = 32
CONV = 4
Q_LORA = 128
KV_LORA = 128
QK_NOPE = 64
V_HEAD = 64
INDEXER_HEADS = 2
INDEXER_HEAD = 32
TOP_K = 8
KPOOL = 4
HC = 4
MIX = (2 + HC) * HC
FFN = 512
EXPERTS = 8
EXPERTS_USED = 2
EXPERT_FFN = 256
VOCAB = 256
CONTEXT = 4096


def is_attention(layer):
    return layer % 2 == 1


def has_indexer(layer):
    """MLA layers alternate a full indexer and a shared one, from a full one."""
    return is_attention(layer) and (layer // 2) % 2 == 0


class Weights:
    """Draws the tensors in file order from one seeded stream."""

    def __init__(self, seed, quantized):
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.quantized = quantized
        self.tensors = []

    def uniform(self, ne, a):
        # ne: ggml dims, innermost first; numpy takes them outermost first
        return self.rng.uniform(-a, a, size=tuple(reversed(ne))).astype(np.float32)

    def add(self, name, values, quantize):
        if quantize and self.quantized and values.shape[-1] % 32 == 0:
            data = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            self.tensors.append((name, data, gguf.GGMLQuantizationType.Q8_0))
        else:
            self.tensors.append((name, values, None))

    def matrix(self, name, ne, quantize=True, extra=1.0):
        a = np.sqrt(3.0) / np.sqrt(ne[0]) / extra
        self.add(name, self.uniform(ne, a), quantize)

    def f32(self, name, ne, a, center=0.0):
        self.add(name, self.uniform(ne, a) + np.float32(center), False)

    def norm(self, name, n):
        self.add(name, np.float32(1.0) + self.uniform([n], 0.1), False)


def block(w, layer, res):
    b = f"blk.{layer}."
    for which in ("attn", "ffn"):
        w.matrix(b + f"hc_{which}_fn.weight", [HC * DIM, MIX], quantize=False)
        w.f32(b + f"hc_{which}_base.weight", [MIX], 1.0)
        w.f32(b + f"hc_{which}_scale.weight", [3], 0.5, center=1.0)
    w.norm(b + "attn_norm.weight", DIM)
    if is_attention(layer):
        w.norm(b + "attn_q_a_norm.weight", Q_LORA)
        w.norm(b + "attn_kv_a_norm.weight", KV_LORA)
        w.matrix(b + "attn_q_a.weight", [DIM, Q_LORA])
        w.matrix(b + "attn_q_b.weight", [Q_LORA, HEADS * QK_NOPE])
        w.matrix(b + "attn_kv_a_mqa.weight", [DIM, KV_LORA], quantize=False)
        w.matrix(b + "attn_k_b.weight", [QK_NOPE, KV_LORA, HEADS], quantize=False)
        w.matrix(b + "attn_v_b.weight", [KV_LORA, V_HEAD, HEADS], quantize=False)
        w.matrix(b + "attn_output.weight", [HEADS * V_HEAD, DIM], extra=res)
        if has_indexer(layer):
            w.norm(b + "indexer.k_norm.weight", INDEXER_HEAD)
            w.f32(b + "indexer.k_norm.bias", [INDEXER_HEAD], 0.1)
            w.matrix(b + "indexer.proj.weight", [DIM, INDEXER_HEADS], quantize=False)
            w.matrix(b + "indexer.attn_k.weight", [DIM, INDEXER_HEAD], quantize=False)
            w.matrix(b + "indexer.attn_q_b.weight", [Q_LORA, INDEXER_HEADS * INDEXER_HEAD],
                     quantize=False)
            w.matrix(b + "indexer_compressor_gate.weight", [DIM, INDEXER_HEAD], quantize=False)
            w.f32(b + "indexer_compressor_ape.weight", [INDEXER_HEAD, KPOOL], 1.0)
    else:
        inner = HEADS * KDA_HEAD
        for x in "qkv":
            w.matrix(b + f"attn_{x}.weight", [DIM, inner])
        for x in "qkv":
            w.f32(b + f"ssm_conv1d_{x}.weight", [CONV, 1, inner], np.sqrt(3.0 / CONV))
        w.matrix(b + "ssm_f_a.weight", [DIM, KDA_HEAD], quantize=False)
        w.matrix(b + "ssm_f_b.weight", [KDA_HEAD, inner], quantize=False)
        w.matrix(b + "ssm_beta.weight", [DIM, HEADS], quantize=False)
        w.f32(b + "ssm_a", [HEADS], 0.4, center=-0.6)
        w.f32(b + "ssm_dt.bias", [inner], 0.5)
        w.matrix(b + "ssm_g_a.weight", [DIM, KDA_HEAD], quantize=False)
        w.matrix(b + "ssm_g_b.weight", [KDA_HEAD, inner], quantize=False)
        w.norm(b + "ssm_norm.weight", KDA_HEAD)
        w.matrix(b + "attn_output.weight", [inner, DIM], extra=res)
    w.norm(b + "ffn_norm.weight", DIM)
    if layer == 0:
        w.matrix(b + "ffn_gate.weight", [DIM, FFN])
        w.matrix(b + "ffn_up.weight", [DIM, FFN])
        w.matrix(b + "ffn_down.weight", [FFN, DIM], extra=res)
        return
    w.matrix(b + "ffn_gate_inp.weight", [DIM, EXPERTS], quantize=False)
    w.f32(b + "exp_probs_b.bias", [EXPERTS], 0.1)
    w.matrix(b + "ffn_gate_exps.weight", [DIM, EXPERT_FFN, EXPERTS])
    w.matrix(b + "ffn_up_exps.weight", [DIM, EXPERT_FFN, EXPERTS])
    w.matrix(b + "ffn_down_exps.weight", [EXPERT_FFN, DIM, EXPERTS], extra=res)
    w.matrix(b + "ffn_gate_shexp.weight", [DIM, EXPERT_FFN])
    w.matrix(b + "ffn_up_shexp.weight", [DIM, EXPERT_FFN])
    w.matrix(b + "ffn_down_shexp.weight", [EXPERT_FFN, DIM], extra=res)


def metadata(g, dtype):
    k = f"{ARCH}."
    g.add_name(f"tiny-glm5-next-shared {dtype} (gguf-py)")
    g.add_uint32(k + "block_count", LAYERS)
    g.add_uint32(k + "context_length", CONTEXT)
    g.add_uint32(k + "embedding_length", DIM)
    g.add_uint32(k + "feed_forward_length", FFN)
    g.add_uint32(k + "attention.head_count", HEADS)
    g.add_array(k + "attention.head_count_kv", [int(is_attention(l)) for l in range(LAYERS)])
    g.add_float32(k + "attention.layer_norm_rms_epsilon", 1e-6)
    g.add_uint32(k + "expert_count", EXPERTS)
    g.add_uint32(k + "expert_used_count", EXPERTS_USED)
    g.add_uint32(k + "vocab_size", VOCAB)
    g.add_float32(k + "attention.layer_norm_epsilon", 1e-6)
    g.add_uint32(k + "ssm.conv_kernel", CONV)
    g.add_uint32(k + "kda.head_dim", KDA_HEAD)
    g.add_float32(k + "kda.gate_lower_bound", -1.0)
    g.add_uint32(k + "attention.q_lora_rank", Q_LORA)
    g.add_uint32(k + "attention.kv_lora_rank", KV_LORA)
    g.add_uint32(k + "rope.dimension_count", 0)
    g.add_uint32(k + "attention.key_length", KV_LORA)
    g.add_uint32(k + "attention.value_length", KV_LORA)
    g.add_uint32(k + "attention.key_length_mla", QK_NOPE)
    g.add_uint32(k + "attention.value_length_mla", V_HEAD)
    g.add_uint32(k + "attention.indexer.head_count", INDEXER_HEADS)
    g.add_uint32(k + "attention.indexer.key_length", INDEXER_HEAD)
    g.add_uint32(k + "attention.indexer.top_k", TOP_K)
    g.add_uint32(k + "attention.indexer.kpool", KPOOL)
    g.add_bool(k + "attention.indexer.kpool_select_tail", True)
    g.add_array(k + "attention.indexer.types", [has_indexer(l) for l in range(LAYERS)])
    g.add_uint32(k + "hyper_connection.count", HC)
    g.add_uint32(k + "hyper_connection.sinkhorn_iterations", 20)
    g.add_float32(k + "hyper_connection.epsilon", 1e-6)
    g.add_uint32(k + "leading_dense_block_count", 1)
    g.add_uint32(k + "expert_feed_forward_length", EXPERT_FFN)
    g.add_uint32(k + "expert_shared_count", 1)
    g.add_float32(k + "expert_weights_scale", 2.5)
    g.add_bool(k + "expert_weights_norm", True)
    g.add_uint32(k + "expert_gating_func", 2)
    g.add_array(k + "swiglu_clamp_exp", [2.0] * LAYERS)
    g.add_array(k + "swiglu_clamp_shexp", [2.0] * LAYERS)


def tokenizer(g):
    """A byte-level gpt2 vocabulary of VOCAB tokens, begin and end of text last."""
    def printable(b):
        return 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255
    tokens, extra = [], 256
    for b in range(VOCAB - 2):
        if printable(b):
            tokens.append(chr(b))
        else:
            tokens.append(chr(extra))
            extra += 1
    tokens += ["<|begin_of_text|>", "<|end_of_text|>"]
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("default")
    g.add_token_list(tokens)
    g.add_token_types([1] * (VOCAB - 2) + [3, 3])
    # gguf-py writes no empty array, and llama.cpp's gpt2 vocabulary needs the key: one merge
    # (the oracle feeds token ids, so nothing is ever tokenized with it)
    g.add_token_merges(["\u0120 t"])
    g.add_bos_token_id(VOCAB - 2)
    g.add_eos_token_id(VOCAB - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["f32", "q8_0"], required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    quantized = args.dtype == "q8_0"
    w = Weights(args.seed, quantized)
    res = float(np.sqrt(2.0 * LAYERS))
    # the embedding stays q8_0 under a block-quantized dtype, as llama.cpp's quantizer keeps it
    w.matrix("token_embd.weight", [DIM, VOCAB])
    for layer in range(LAYERS):
        block(w, layer, res)
    w.norm("output_norm.weight", DIM)
    w.matrix("output.weight", [DIM, VOCAB])
    g = gguf.GGUFWriter(args.out, ARCH)
    metadata(g, args.dtype)
    tokenizer(g)
    for name, data, raw in w.tensors:
        if raw is None:
            g.add_tensor(name, data)
        else:
            g.add_tensor(name, data, raw_dtype=raw)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print(args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
