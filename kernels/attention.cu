// memra kernels: single-token attention over an f16 KV cache, fused with the rotary position
// embedding of q and k and the cache write of the current position. The position comes from
// device memory, so captured graphs replay at every step: attention_f16 attends over positions
// 0..=*pos (clamped to the capacity).
//
// Cache layout: `capacity` positions of `n_kv_heads * head_dim` halves (K and V separately).
// Grouped-query attention: query head h reads KV head h / (n_heads / n_kv_heads). One block
// per query head. It rotates its q head (written back to q), and the rotated k and the v of
// its KV head at the current position, narrowed to f16, serve it from shared memory; the first
// block of each group also writes them to the cache slot *pos (and the rotated k back to k).
// No block reads that slot from the cache, so the write needs no ordering, and the bits are
// those of a cache write followed by attention. Rotation: the angle of pair i is
// pos * theta_scale^i reached by repeated f32 multiplication, as llama.cpp and the CPU backend
// do (theta_scale = theta^(-2 / head_dim), computed on the host so the angles match to the
// bit); `neox` = 0 rotates adjacent pairs (2i, 2i + 1) (llama), 1 rotates (i, i + head_dim / 2)
// (GPT-NeoX, qwen2, qwen3). Scores are scaled by `scale` (1 / sqrt(head_dim)), softmax
// subtracts the max; every reduction has a fixed order, so the result is deterministic. The
// scores live in dynamic shared memory when the launch gives it (capacity values), else in a
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

// Pair (x0, x1) of pair index i rotated to the angle `angle0 * theta_scale^i`.
__device__ __forceinline__ float2 rotate(float x0, float x1, int i, float angle0, float theta_scale) {
    float angle = angle0;
    for (int k = 0; k < i; ++k) angle = __fmul_rn(angle, theta_scale);
    float s, c;
    sincosf(angle, &s, &c);
    return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attention_f16(float* q, const float* k, const float* v, u16* k_cache, u16* v_cache, float* out,
                  float* scores, const u32* pos, int n_heads, int n_kv_heads, int head_dim,
                  int capacity, float scale, float theta_scale, int neox) {
    overlap_with_neighbours();
    extern __shared__ float smem_scores[];
    __shared__ float qh[ATTN_MAX_HEAD_DIM];
    __shared__ u16 k_now[ATTN_MAX_HEAD_DIM], v_now[ATTN_MAX_HEAD_DIM];
    __shared__ float red[ATTN_THREADS];
    __shared__ float stat;
    const int h = blockIdx.x, group = n_heads / n_kv_heads;
    const int kvh = h / group;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 p_now = *pos;
    const int n_ctx = min((int)p_now + 1, capacity);
    // the current position is in the window unless the cache is full
    const int now = p_now < (u32)capacity ? (int)p_now : -1;
    const bool writer = h % group == 0 && now >= 0;
    const size_t row = (size_t)n_kv_heads * head_dim;
    float* sc = scores ? scores + (size_t)h * capacity : smem_scores;

    // rotate q and k; q and the probabilities are narrowed to the f16 cache's dtype, as the CPU
    // backend does. The block owns its q head and writes it back rotated; k stays as it is
    // (the other blocks of the group read it).
    const int half = head_dim / 2;
    float* qrow = q + (size_t)h * head_dim;
    const float* krow = k + (size_t)kvh * head_dim;
    u16* k_slot = k_cache + (size_t)max(now, 0) * row + (size_t)kvh * head_dim;
    for (int i = threadIdx.x; i < half; i += ATTN_THREADS) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float2 rq = rotate(qrow[a], qrow[b], i, (float)p_now, theta_scale);
        const float2 rk = rotate(krow[a], krow[b], i, (float)p_now, theta_scale);
        qrow[a] = rq.x;
        qrow[b] = rq.y;
        qh[a] = round_f16(rq.x);
        qh[b] = round_f16(rq.y);
        k_now[a] = f32_to_f16(rk.x);
        k_now[b] = f32_to_f16(rk.y);
        if (writer) {
            k_slot[a] = k_now[a];
            k_slot[b] = k_now[b];
        }
    }
    for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
        v_now[d] = f32_to_f16(v[(size_t)kvh * head_dim + d]);
        if (writer) v_cache[(size_t)max(now, 0) * row + (size_t)kvh * head_dim + d] = v_now[d];
    }
    __syncthreads();

    // scores: one warp per position, lanes over the head dimension; a warp takes ATTN_UNROLL of
    // its positions at once so their loads are in flight together (each position's sum keeps
    // its order; positions past the end read the last one and are dropped; the current
    // position's k comes from shared memory)
    float mx = -__int_as_float(0x7f800000);
    for (int p0 = warp; p0 < n_ctx; p0 += ATTN_WARPS * ATTN_UNROLL) {
        float s[ATTN_UNROLL];
        const u16* kr[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            s[u] = 0.f;
            const int p = min(p0 + u * ATTN_WARPS, n_ctx - 1);
            kr[u] = p == now ? k_now : k_cache + (size_t)p * row + (size_t)kvh * head_dim;
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
                v[u] = f16_to_f32(p == now ? v_now[d] : v_cache[(size_t)p * row + (size_t)kvh * head_dim + d]);
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
