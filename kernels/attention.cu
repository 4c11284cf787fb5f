// memra kernels: single-token attention over an f16 KV cache (rope_kv_f16 in rope.cu writes
// it). The position comes from device memory, so captured graphs replay at every step:
// attention_f16 attends over positions 0..=*pos (clamped to the capacity).
//
// Cache layout: `capacity` positions of `n_kv_heads * head_dim` halves (K and V separately).
// Grouped-query attention: query head h reads KV head h / (n_heads / n_kv_heads). Scores are
// scaled by `scale` (1 / sqrt(head_dim)), softmax subtracts the max; every reduction has a
// fixed order, so the result is deterministic. One block per query head; the scores live in a
// caller-given f32 scratch of n_heads * capacity values.
#include "common.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / WARP)
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_UNROLL 8

// Fixed-order block reduction of one value per warp (lane 0 of each warp wrote red[w]).
__device__ __forceinline__ float block_combine(const float* red, bool is_max) {
    float r = red[0];
    for (int w = 1; w < ATTN_WARPS; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attention_f16(const float* q, const u16* k_cache, const u16* v_cache, float* out, float* scores,
                  const u32* pos, int n_heads, int n_kv_heads, int head_dim, int capacity, float scale) {
    overlap_with_neighbours();
    __shared__ float qh[ATTN_MAX_HEAD_DIM];
    __shared__ float red[ATTN_THREADS];
    __shared__ float stat;
    const int h = blockIdx.x;
    const int kvh = h / (n_heads / n_kv_heads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_ctx = min((int)*pos + 1, capacity);
    const size_t row = (size_t)n_kv_heads * head_dim;
    float* sc = scores + (size_t)h * capacity;

    // q and the probabilities are narrowed to the f16 cache's dtype, as the CPU backend does
    for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS) qh[d] = round_f16(q[(size_t)h * head_dim + d]);
    __syncthreads();

    // scores: one warp per position, lanes over the head dimension; a warp takes ATTN_UNROLL of
    // its positions at once so their loads are in flight together (each position's sum keeps
    // its order; positions past the end read the last one and are dropped)
    float mx = -__int_as_float(0x7f800000);
    for (int p0 = warp; p0 < n_ctx; p0 += ATTN_WARPS * ATTN_UNROLL) {
        float s[ATTN_UNROLL];
        const u16* kr[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            s[u] = 0.f;
            kr[u] = k_cache + (size_t)min(p0 + u * ATTN_WARPS, n_ctx - 1) * row + (size_t)kvh * head_dim;
        }
        for (int d = lane; d < head_dim; d += WARP) {
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) s[u] = fmaf(qh[d], f16_to_f32(kr[u][d]), s[u]);
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int p = p0 + u * ATTN_WARPS;
            const float v = warp_sum(s[u]) * scale;
            if (p < n_ctx) {
                if (lane == 0) sc[p] = v;
                mx = fmaxf(mx, v);
            }
        }
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    if (threadIdx.x == 0) stat = block_combine(red, true);
    __syncthreads();
    mx = stat;

    // exponentials and their sum
    float sum = 0.f;
    for (int p = threadIdx.x; p < n_ctx; p += ATTN_THREADS) {
        float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    __syncthreads();
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) stat = 1.0f / block_combine(red, false);
    __syncthreads();
    const float inv = stat;

    // weighted sum of values: thread t takes dimension t % head_dim of positions g, g + G, ...
    // (g = t / head_dim, G = ATTN_THREADS / head_dim), then the G groups add in order
    const int groups = ATTN_THREADS / head_dim;
    const int d = threadIdx.x % head_dim, g = threadIdx.x / head_dim;
    float acc = 0.f;
    if (g < groups) {
        // ATTN_UNROLL positions' loads at once, then their products added in position order
        for (int p0 = g; p0 < n_ctx; p0 += groups * ATTN_UNROLL) {
            float w[ATTN_UNROLL], v[ATTN_UNROLL];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const int p = min(p0 + u * groups, n_ctx - 1);
                w[u] = sc[p];
                v[u] = f16_to_f32(v_cache[(size_t)p * row + (size_t)kvh * head_dim + d]);
            }
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u)
                if (p0 + u * groups < n_ctx) acc = fmaf(round_f16(w[u] * inv), v[u], acc);
        }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float o = red[threadIdx.x];
        for (int k = 1; k < groups; ++k) o += red[k * head_dim + threadIdx.x];
        out[(size_t)h * head_dim + threadIdx.x] = o;
    }
}
