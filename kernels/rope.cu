// memra kernels: rotary position embedding of q or k in place, at a position read from device
// memory (so a captured graph replays at every step). The angle of pair i is pos *
// theta_scale^i reached by repeated f32 multiplication, as llama.cpp and the CPU backend do;
// theta_scale = theta^(-2 / head_dim) is computed once on the host so the angles match to the
// bit. rope_f32 rotates adjacent pairs (2i, 2i + 1) (llama); rope_neox_f32 rotates
// (i, i + head_dim / 2) (GPT-NeoX, qwen2, qwen3).
#include "common.cuh"

__device__ __forceinline__ void rope_pair(float* x, int n_heads, int head_dim, const u32* pos, float theta_scale, bool neox) {
    const int half = head_dim / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_heads * half) return;
    const int head = t / half, i = t % half;
    float angle = (float)*pos;
    for (int k = 0; k < i; ++k) angle = __fmul_rn(angle, theta_scale);
    float s, c;
    sincosf(angle, &s, &c);
    float* h = x + (size_t)head * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    h[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

extern "C" __global__ void rope_f32(float* x, int n_heads, int head_dim, const u32* pos, float theta_scale) {
    rope_pair(x, n_heads, head_dim, pos, theta_scale, false);
}

extern "C" __global__ void rope_neox_f32(float* x, int n_heads, int head_dim, const u32* pos, float theta_scale) {
    rope_pair(x, n_heads, head_dim, pos, theta_scale, true);
}
