// memra kernels: single-token attention over an f16 KV cache, fused with the rotary position
// embedding of q and k and the cache write of the current position. The position comes from
// device memory, so captured graphs replay at every step: attention_f16 attends over positions
// 0..=*pos (clamped to the capacity). A prefill step's token rows are grid rows: row y attends
// over 0..=*pos + y, each row with the bits of the decode step at its position. A batched
// decode step's rows belong to different sequences: with `slots` given, row y sits at pos[y]
// in sequence slot slots[y], whose cache is `capacity` positions from slot * capacity on; a
// pad row (slots[y] == ATTN_PAD_SLOT, a batched step padded to its graph's row count) writes
// no cache and reads none, and its output is zeros, so it touches no sequence.
//
// Cache layout: `capacity` positions of `n_kv_heads * head_dim` halves (K and V separately).
// Grouped-query attention: query head h reads KV head h / (n_heads / n_kv_heads). One block
// per query head (attention_f16), or per ATTN_GROUP_HEADS heads of a KV head
// (attention_group_f16, each head with the bits it has in a block of its own). A block rotates
// its q heads (written back to q), and the rotated k and the v of its KV head at the current
// position, narrowed to f16, serve it from shared memory; the block of each group's first
// head also writes them to the cache slot *pos (k itself stays as it is).
// No block reads that slot from the cache, so the write needs no ordering, and the bits are
// those of a cache write followed by attention. Rotation: the angle of pair i is
// pos * theta_scale^i reached by repeated f32 multiplication, as llama.cpp and the CPU backend
// do (theta_scale = theta^(-2 / head_dim), computed on the host so the angles match to the
// bit); `neox` = 0 rotates adjacent pairs (2i, 2i + 1) (llama), 1 rotates (i, i + head_dim / 2)
// (GPT-NeoX, qwen2, qwen3). Scores are scaled by `scale` (1 / sqrt(head_dim)), softmax
// subtracts the max; every reduction has a fixed order, so the result is deterministic. The
// scores live in dynamic shared memory when the launch gives it (capacity values), else in a
// caller-given f32 scratch of n_heads * capacity values. With `xq`, every row's output also
// goes into its 8-bit copy there (the bits quantize_rows_q8 makes of it; head_dim a multiple
// of 32, so a warp's lanes hold whole blocks): the input of the o product on tensor cores,
// which then needs no launch of its own to quantize it.
#include "common.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / WARP)
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_UNROLL 8
// 128-value slices of the largest head (a lane takes 4 values of each)
#define ATTN_SLICES (ATTN_MAX_HEAD_DIM / 128)
// the slot of a pad row (PAD_SLOT in executor/src/cuda/ops.rs): no sequence has it
#define ATTN_PAD_SLOT 0xffffffffu

// Fixed-order block reduction of one value per warp (lane 0 of each warp wrote red[w]).
__device__ __forceinline__ float block_combine(const float* red, bool is_max) {
    float r = red[0];
    for (int w = 1; w < ATTN_WARPS; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

// Value `col` of this block's row of the output, v, into the row's 8-bit copy at xq
// (quantize_rows_q8's layout: `cols` quants, then a (d, d * sum) pair per 32 values); a warp's
// lanes hold one 32-value block (every lane of the warp calls this).
__device__ __forceinline__ void quantized_out(i8* xq, int cols, int col, float v) {
    const float vs[1] = {v};
    const Q8Block b = quantize_block32(vs);
    i8* row = xq + (size_t)blockIdx.y * (cols + cols / 4);
    row[col] = (i8)b.quants;
    if (col % 32 == 0) ((float2*)(row + cols))[col / 32] = b.pair;
}

// Block (head block, row): the HPB query heads h0 = HPB * blockIdx.x .. of one KV head (HPB
// divides the group). Each head's values, and every reduction over them, are those of a block
// of its own (HPB = 1): the heads only share the block's loads of the KV head's k and v rows,
// so a batched step of many rows runs in fewer waves with the same bits. The scores of head j
// are at sc + j * capacity.
template <int HPB>
__device__ __forceinline__ void attention_run(float* q, const float* k, const float* v, u16* k_cache, u16* v_cache,
                                              float* out, i8* xq, float* scores, const u32* pos, const u32* slots,
                                              int n_heads, int n_kv_heads, int head_dim, int capacity, float scale,
                                              float theta_scale, int neox) {
    overlap_with_neighbours();
    extern __shared__ float smem_scores[];
    __shared__ float qh[HPB][ATTN_MAX_HEAD_DIM];
    __shared__ __align__(16) u16 k_now[ATTN_MAX_HEAD_DIM];
    __shared__ __align__(16) u16 v_now[ATTN_MAX_HEAD_DIM];
    __shared__ float red[HPB][ATTN_WARPS];
    __shared__ float part[ATTN_WARPS][ATTN_MAX_HEAD_DIM];
    __shared__ float stat[HPB];
    const int h0 = blockIdx.x * HPB, group = n_heads / n_kv_heads;
    const int kvh = h0 / group;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // token row blockIdx.y of a prefill step sits at *pos + blockIdx.y; kv_store_rows_f16 has
    // written the rows before it to the cache, with the bits this block writes for its own
    const size_t q_row = (size_t)n_heads * head_dim, kv_row = (size_t)n_kv_heads * head_dim;
    q += blockIdx.y * q_row;
    out += blockIdx.y * q_row;
    k += blockIdx.y * kv_row;
    v += blockIdx.y * kv_row;
    if (slots && slots[blockIdx.y] == ATTN_PAD_SLOT) {
        for (int d = threadIdx.x; d < HPB * head_dim; d += ATTN_THREADS) {
            out[(size_t)h0 * head_dim + d] = 0.f;
            if (xq) quantized_out(xq, n_heads * head_dim, h0 * head_dim + d, 0.f);
        }
        return;
    }
    const u32 p_now = slots ? pos[blockIdx.y] : *pos + blockIdx.y;
    if (slots) {
        const size_t base = (size_t)slots[blockIdx.y] * capacity * kv_row;
        k_cache += base;
        v_cache += base;
    }
    const int n_ctx = min((int)p_now + 1, capacity);
    // the current position is in the window unless the cache is full
    const int now = p_now < (u32)capacity ? (int)p_now : -1;
    const bool writer = h0 % group == 0 && now >= 0;
    const size_t row = (size_t)n_kv_heads * head_dim;
    float* sc = scores ? scores + (size_t)h0 * capacity : smem_scores;
    // position p's k or v row of this block's KV head: shared memory for the current position
    const auto cache_row = [&](const u16* cache, const u16* now_row, int p) -> const u16* {
        return p == now ? now_row : cache + (size_t)p * row + (size_t)kvh * head_dim;
    };

    // rotate q and k; q and the probabilities are narrowed to the f16 cache's dtype, as the CPU
    // backend does. The block owns its q heads and writes them back rotated; k stays as it is
    // (the other blocks of the group read it).
    const int half = head_dim / 2;
    const float* krow = k + (size_t)kvh * head_dim;
    u16* k_slot = k_cache + (size_t)max(now, 0) * row + (size_t)kvh * head_dim;
    for (int i = threadIdx.x; i < half; i += ATTN_THREADS) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
#pragma unroll
        for (int j = 0; j < HPB; ++j) {
            float* qrow = q + (size_t)(h0 + j) * head_dim;
            const float2 rq = rope_pair(qrow[a], qrow[b], i, (float)p_now, theta_scale);
            qrow[a] = rq.x;
            qrow[b] = rq.y;
            qh[j][a] = round_f16(rq.x);
            qh[j][b] = round_f16(rq.y);
        }
        const float2 rk = rope_pair(krow[a], krow[b], i, (float)p_now, theta_scale);
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

    // scores: warp w takes positions w, w + ATTN_WARPS, ..., ATTN_UNROLL of them at once so
    // their loads are in flight together; lane l takes values 4l .. 4l + 3 of each 128-value
    // slice of the head, in order, then the warp adds its lanes (positions past the end read
    // the last one and are dropped; the current position's k comes from shared memory)
    float mx[HPB];
#pragma unroll
    for (int j = 0; j < HPB; ++j) mx[j] = -__int_as_float(0x7f800000);
    for (int p0 = warp; p0 < n_ctx; p0 += ATTN_WARPS * ATTN_UNROLL) {
        float s[HPB][ATTN_UNROLL];
#pragma unroll
        for (int j = 0; j < HPB; ++j)
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) s[j][u] = 0.f;
        for (int d = 4 * lane; d < head_dim; d += 4 * WARP) {
            uint2 kw[ATTN_UNROLL];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) kw[u] = *(const uint2*)(cache_row(k_cache, k_now, min(p0 + u * ATTN_WARPS, n_ctx - 1)) + d);
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const float k0 = f16_to_f32((u16)(kw[u].x & 0xffff)), k1 = f16_to_f32((u16)(kw[u].x >> 16));
                const float k2 = f16_to_f32((u16)(kw[u].y & 0xffff)), k3 = f16_to_f32((u16)(kw[u].y >> 16));
#pragma unroll
                for (int j = 0; j < HPB; ++j) {
                    s[j][u] = fmaf(qh[j][d], k0, s[j][u]);
                    s[j][u] = fmaf(qh[j][d + 1], k1, s[j][u]);
                    s[j][u] = fmaf(qh[j][d + 2], k2, s[j][u]);
                    s[j][u] = fmaf(qh[j][d + 3], k3, s[j][u]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int p = p0 + u * ATTN_WARPS;
#pragma unroll
            for (int j = 0; j < HPB; ++j) {
                const float v = warp_sum(s[j][u]) * scale;
                if (p < n_ctx) {
                    if (lane == 0) sc[(size_t)j * capacity + p] = v;
                    mx[j] = fmaxf(mx[j], v);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < HPB; ++j)
        if (lane == 0) red[j][warp] = mx[j];
    __syncthreads();
    if (threadIdx.x < HPB) stat[threadIdx.x] = block_combine(red[threadIdx.x], true);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HPB; ++j) mx[j] = stat[j];

    // exponentials and their sums
    float inv[HPB];
#pragma unroll
    for (int j = 0; j < HPB; ++j) inv[j] = exp_in_place_warp_sum(sc + (size_t)j * capacity, n_ctx, mx[j], ATTN_THREADS);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HPB; ++j)
        if (lane == 0) red[j][warp] = inv[j];
    __syncthreads();
    if (threadIdx.x < HPB) stat[threadIdx.x] = 1.0f / block_combine(red[threadIdx.x], false);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HPB; ++j) inv[j] = stat[j];

    // weighted sum of values: warp w takes the positions it scored, ATTN_UNROLL at once, lane l
    // values 4l .. 4l + 3 of each 128-value slice; each value adds its positions in order, then
    // the warps' sums add in warp order
    float acc[HPB][ATTN_SLICES][4];
#pragma unroll
    for (int j = 0; j < HPB; ++j)
#pragma unroll
        for (int i = 0; i < ATTN_SLICES; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[j][i][c] = 0.f;
    for (int p0 = warp; p0 < n_ctx; p0 += ATTN_WARPS * ATTN_UNROLL) {
        uint2 vw[ATTN_UNROLL][ATTN_SLICES];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const u16* vr = cache_row(v_cache, v_now, min(p0 + u * ATTN_WARPS, n_ctx - 1));
#pragma unroll
            for (int i = 0; i < ATTN_SLICES; ++i) {
                const int d = 128 * i + 4 * lane;
                if (d < head_dim) vw[u][i] = *(const uint2*)(vr + d);
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int p = p0 + u * ATTN_WARPS;
            if (p >= n_ctx) break;
#pragma unroll
            for (int j = 0; j < HPB; ++j) {
                const float pr = round_f16(sc[(size_t)j * capacity + p] * inv[j]);
#pragma unroll
                for (int i = 0; i < ATTN_SLICES; ++i) {
                    if (128 * i + 4 * lane >= head_dim) break;
                    acc[j][i][0] = fmaf(pr, f16_to_f32((u16)(vw[u][i].x & 0xffff)), acc[j][i][0]);
                    acc[j][i][1] = fmaf(pr, f16_to_f32((u16)(vw[u][i].x >> 16)), acc[j][i][1]);
                    acc[j][i][2] = fmaf(pr, f16_to_f32((u16)(vw[u][i].y & 0xffff)), acc[j][i][2]);
                    acc[j][i][3] = fmaf(pr, f16_to_f32((u16)(vw[u][i].y >> 16)), acc[j][i][3]);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < HPB; ++j) {
        // the previous head's readers of `part` are done
        if (j > 0) __syncthreads();
#pragma unroll
        for (int i = 0; i < ATTN_SLICES; ++i) {
            const int d = 128 * i + 4 * lane;
            if (d < head_dim)
#pragma unroll
                for (int c = 0; c < 4; ++c) part[warp][d + c] = acc[j][i][c];
        }
        __syncthreads();
        for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
            float o = part[0][d];
            for (int w = 1; w < ATTN_WARPS; ++w) o += part[w][d];
            out[(size_t)(h0 + j) * head_dim + d] = o;
            if (xq) quantized_out(xq, n_heads * head_dim, (h0 + j) * head_dim + d, o);
        }
    }
}

#define ATTN_ARGS                                                                                          \
    float *q, const float *k, const float *v, u16 *k_cache, u16 *v_cache, float *out, i8 *xq, float *scores, \
        const u32 *pos, const u32 *slots, int n_heads, int n_kv_heads, int head_dim, int capacity, float scale, \
        float theta_scale, int neox
#define ATTN_PASS q, k, v, k_cache, v_cache, out, xq, scores, pos, slots, n_heads, n_kv_heads, head_dim, capacity, scale, theta_scale, neox
// a block per head, four per SM (64 registers, no spills; the batched step's launch of a
// block per head and row runs in fewer waves: 78 registers gave three)
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 4) attention_f16(ATTN_ARGS) { attention_run<1>(ATTN_PASS); }
// a block per ATTN_GROUP_HEADS heads of a KV head (ATTN_GROUP_HEADS in ops.rs)
#define ATTN_GROUP_HEADS 4
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) attention_group_f16(ATTN_ARGS) {
    attention_run<ATTN_GROUP_HEADS>(ATTN_PASS);
}

// kv_store_rows_f16, block (t, kv head): row t of a prefill step's k head rotated to position
// *pos + t and its v head, narrowed to f16, into the cache at that position (positions past
// the capacity are not written), with attention_f16's rotation and narrowing, so the step's
// attention (attention_f16 over the rows, or flash.cu) reads the cache decode steps would
// have written. With `slots` given, row t sits at pos[t] in slot slots[t] (as attention_f16);
// a pad row (ATTN_PAD_SLOT) is not written.
extern "C" __global__ void kv_store_rows_f16(const float* k, const float* v, u16* k_cache, u16* v_cache,
                                             const u32* pos, const u32* slots, int n_kv_heads, int head_dim,
                                             int capacity, float theta_scale, int neox) {
    overlap_with_neighbours();
    const int t = blockIdx.x, kvh = blockIdx.y;
    const u32 p = slots ? pos[t] : *pos + (u32)t;
    if (p >= (u32)capacity || (slots && slots[t] == ATTN_PAD_SLOT)) return;
    const size_t row = (size_t)n_kv_heads * head_dim;
    if (slots) {
        k_cache += (size_t)slots[t] * capacity * row;
        v_cache += (size_t)slots[t] * capacity * row;
    }
    const float* krow = k + (size_t)t * row + (size_t)kvh * head_dim;
    const float* vrow = v + (size_t)t * row + (size_t)kvh * head_dim;
    u16* kc = k_cache + (size_t)p * row + (size_t)kvh * head_dim;
    u16* vc = v_cache + (size_t)p * row + (size_t)kvh * head_dim;
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float2 rk = rope_pair(krow[a], krow[b], i, (float)p, theta_scale);
        kc[a] = f32_to_f16(rk.x);
        kc[b] = f32_to_f16(rk.y);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) vc[d] = f32_to_f16(vrow[d]);
}
