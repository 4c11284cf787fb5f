// memra kernels: rotary position embedding of q and k in place, at a position read from device
// memory (so a captured graph replays at every step), fused with the KV cache write: the
// rotated k row and the v row are narrowed to f16 (round to nearest even) into slot *pos.
// The angle of pair i is pos * theta_scale^i reached by repeated f32 multiplication, as
// llama.cpp and the CPU backend do; theta_scale = theta^(-2 / head_dim) is computed once on the
// host so the angles match to the bit. `neox` = 0 rotates adjacent pairs (2i, 2i + 1) (llama);
// 1 rotates (i, i + head_dim / 2) (GPT-NeoX, qwen2, qwen3).
#include "common.cuh"

// Rotates pair i of `head` to `angle0 * theta_scale^i`; returns the rotated pair.
__device__ __forceinline__ float2 rope_pair(float* head, int half, int i, float angle0, float theta_scale, bool neox) {
    float angle = angle0;
    for (int k = 0; k < i; ++k) angle = __fmul_rn(angle, theta_scale);
    float s, c;
    sincosf(angle, &s, &c);
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = head[a], x1 = head[b];
    const float2 r = make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)),
                                 __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
    head[a] = r.x;
    head[b] = r.y;
    return r;
}

// One thread per rotated pair of q (n_q heads), then per pair of k (n_kv heads, also stored),
// then per value of v (stored). The caches hold `capacity` rows of n_kv * head_dim halves; a
// position at or past the capacity stores nothing.
extern "C" __global__ void rope_kv_f16(float* q, float* k, const float* v, u16* k_cache, u16* v_cache,
                                       const u32* pos, int n_q, int n_kv, int head_dim,
                                       float theta_scale, int neox, int capacity) {
    overlap_with_neighbours();
    const int half = head_dim / 2, row = n_kv * head_dim;
    const int qp = n_q * half, kp = n_kv * half;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 p = *pos;
    const bool store = p < (u32)capacity;
    if (t < qp) {
        rope_pair(q + (size_t)(t / half) * head_dim, half, t % half, (float)p, theta_scale, neox);
    } else if (t < qp + kp) {
        const int head = (t - qp) / half, i = (t - qp) % half;
        const float2 r = rope_pair(k + (size_t)head * head_dim, half, i, (float)p, theta_scale, neox);
        if (store) {
            u16* c = k_cache + (size_t)p * row + (size_t)head * head_dim;
            c[neox ? i : 2 * i] = f32_to_f16(r.x);
            c[neox ? i + half : 2 * i + 1] = f32_to_f16(r.y);
        }
    } else if (t < qp + kp + row && store) {
        const int i = t - qp - kp;
        v_cache[(size_t)p * row + i] = f32_to_f16(v[i]);
    }
}
