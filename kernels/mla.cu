// memra kernels: multi-head latent attention at decode (DeepSeek's MLA with absorbed
// projections, as the CPU backend's cpu::kernels::mla runs it). The per-head products through
// attn_k_b and attn_v_b are ordinary matvecs; these kernels do what has no equivalent:
//
// mla_rope_f32 rotates the rope part of n_vecs vectors from src into dst (both strided), at
// the position in device memory, with YaRN when `yarn` is set: pair i's angle is
// pos * theta_scale^i by repeated f32 multiplication, interpolated by freq_scale outside the
// corrected dims and cos/sin scaled by mscale, step by step as rope.rs's Yarn::cos_sin. With
// `rotate` 0 it copies them unrotated (kimi-linear's MLA layers use no rope).
//
// mla_attention_split_f16 attends each head's latent-space query (kv_lora + rope values) over
// the f16 latent cache rows 0..=*pos, or with `cells` set (DSA's sparse attention,
// kernels/dsa.cu's selection: the count, then the positions) over those rows in that order.
// The canonical order is attention.cu's: the attended rows fall into chunks of MLA_CHUNK by
// their index, each chunk gives per head its max, its sum of exponentials and its
// exponential-weighted sum of latents (f32 weights), and the chunks merge in chunk order
// (merge_chunk). Block (head block, chunk) takes MLA_HPB heads h0 .. (each with the bits it
// has in any block: the heads share the loads of the cache rows), and writes its chunk's
// partials to `parts`; mla_merge_f16 (block per head) merges them into `out`. The current
// position's row (`row_now`, the normalized latent then the roped key) is narrowed to f16,
// written to the cache by block (0, 0) and read by every block from shared memory, so no block
// reads the slot being written. Queries are narrowed to f16 as the CPU backend does; scores
// are scaled after the dot product.
#include "common.cuh"

#define MLA_THREADS 256
#define MLA_WARPS (MLA_THREADS / WARP)
// the widest cache row (kv_lora_rank + qk_rope_head_dim; DeepSeek's is 512 + 64)
#define MLA_MAX_WIDTH 1024

#define MLA_ARGS                                                                                                 \
    const float *q_lat, const float *row_now, u16 *cache, float *parts, const u32 *pos, int n_heads, int kv_lora, \
        int width, int capacity, float scale, const int *cells
#define MLA_PASS q_lat, row_now, cache, parts, pos, n_heads, kv_lora, width, capacity, scale, cells

extern "C" __global__ void mla_rope_f32(const float* src, int src_stride, float* dst, int dst_stride,
                                        int n_vecs, int n_rot, const u32* pos, float theta_scale, int rotate,
                                        int neox, int yarn, float freq_scale, float corr_low, float corr_high,
                                        float mscale) {
    overlap_with_neighbours();
    const int half = n_rot / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vecs * half) return;
    const int vec = t / half, i = t % half;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float* x = src + (size_t)vec * src_stride;
    float* y = dst + (size_t)vec * dst_stride;
    const float x0 = x[a], x1 = x[b];
    if (!rotate) {
        y[a] = x0;
        y[b] = x1;
        return;
    }
    float angle = (float)*pos;
    for (int k = 0; k < i; ++k) angle = __fmul_rn(angle, theta_scale);
    float s, c;
    if (yarn) {
        const float y = __fdiv_rn(__fsub_rn((float)i, corr_low), fmaxf(__fsub_rn(corr_high, corr_low), 0.001f));
        const float ramp_mix = __fsub_rn(1.0f, fminf(fmaxf(y, 0.0f), 1.0f));
        const float interp = __fmul_rn(freq_scale, angle);
        const float theta = __fadd_rn(__fmul_rn(interp, __fsub_rn(1.0f, ramp_mix)), __fmul_rn(angle, ramp_mix));
        sincosf(theta, &s, &c);
        c = __fmul_rn(c, mscale);
        s = __fmul_rn(s, mscale);
    } else {
        sincosf(angle, &s, &c);
    }
    y[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// positions of a chunk (MLA_CHUNK in executor/src/cuda/mla.rs)
#define MLA_CHUNK 128
#define MLA_MAX_HPB 8

// The i-th attended position: i itself, or the i-th of `cells`.
__device__ __forceinline__ int mla_position(const int* cells, int i) { return cells ? cells[1 + i] : i; }

// The rows attended at position *pos: all of 0..=*pos, or the count of `cells`.
__device__ __forceinline__ int mla_attended(const int* cells, u32 p_now, int capacity) {
    return cells ? min(cells[0], capacity) : min((int)p_now + 1, capacity);
}

// Where chunk c of head h keeps its partials in `parts`: its kv_lora latent sums from
// index * kv_lora, its (max, sum) pair at 2 * index past all heads' sums.
__device__ __forceinline__ size_t mla_part(int h, int c, int chunks) { return (size_t)h * chunks + c; }

// Each head's max (is_max) or sum of the warps' values v[j], in warp order, into to[j] (every
// thread calls it; `to` is read after the next barrier).
template <int HPB>
__device__ __forceinline__ void mla_heads_combine(float (&red)[HPB][MLA_WARPS], const float (&v)[HPB], float* to,
                                                  bool is_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < HPB; ++j)
        if (lane == 0) red[j][warp] = v[j];
    __syncthreads();
    if (threadIdx.x < HPB) {
        float r = red[threadIdx.x][0];
        for (int w = 1; w < MLA_WARPS; ++w) r = is_max ? fmaxf(r, red[threadIdx.x][w]) : r + red[threadIdx.x][w];
        to[threadIdx.x] = r;
    }
    __syncthreads();
}

template <int HPB>
__device__ __forceinline__ void mla_split(const float* q_lat, const float* row_now, u16* cache, float* parts,
                                          const u32* pos, int n_heads, int kv_lora, int width, int capacity,
                                          float scale, const int* cells) {
    overlap_with_neighbours();
    __shared__ float qh[HPB][MLA_MAX_WIDTH];
    __shared__ __align__(16) u16 now_row[MLA_MAX_WIDTH];
    __shared__ float sc[HPB][MLA_CHUNK];
    __shared__ float red[HPB][MLA_WARPS];
    __shared__ float stat[2][HPB];
    const int h0 = blockIdx.x * HPB, c = blockIdx.y, chunks = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 p_now = *pos;
    const int n_ctx = mla_attended(cells, p_now, capacity);
    const int now = p_now < (u32)capacity ? (int)p_now : -1;
    const bool writer = blockIdx.x == 0 && c == 0 && now >= 0;
    if (c * MLA_CHUNK >= n_ctx && !writer) return;
    // heads past the last load the last one's query and write nothing
    for (int d = threadIdx.x; d < width; d += MLA_THREADS) {
#pragma unroll
        for (int j = 0; j < HPB; ++j) qh[j][d] = round_f16(q_lat[(size_t)min(h0 + j, n_heads - 1) * width + d]);
        const u16 r = f32_to_f16(row_now[d]);
        now_row[d] = r;
        if (writer) cache[(size_t)now * width + d] = r;
    }
    __syncthreads();
    const int i0 = c * MLA_CHUNK, n = min(MLA_CHUNK, n_ctx - i0);
    if (n <= 0) return;
    const auto row_of = [&](int i) -> const u16* {
        const int p = mla_position(cells, i0 + i);
        return p == now ? now_row : cache + (size_t)p * width;
    };

    // scores: warp w takes the chunk's rows w, w + MLA_WARPS, ...; lane l the value pairs
    // 2l, 2l + 1, then 64 on, in order, then the warp adds its lanes
    float mx[HPB];
#pragma unroll
    for (int j = 0; j < HPB; ++j) mx[j] = -__int_as_float(0x7f800000);
    for (int i = warp; i < n; i += MLA_WARPS) {
        const u16* r = row_of(i);
        float acc[HPB];
#pragma unroll
        for (int j = 0; j < HPB; ++j) acc[j] = 0.f;
        for (int d = 2 * lane; d < width; d += 2 * WARP) {
            const u32 pair = *(const u32*)(r + d);
            const float r0 = f16_to_f32((u16)(pair & 0xffff)), r1 = f16_to_f32((u16)(pair >> 16));
#pragma unroll
            for (int j = 0; j < HPB; ++j) {
                acc[j] = fmaf(qh[j][d], r0, acc[j]);
                acc[j] = fmaf(qh[j][d + 1], r1, acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < HPB; ++j) {
            const float v = warp_sum(acc[j]) * scale;
            if (lane == 0) sc[j][i] = v;
            mx[j] = fmaxf(mx[j], v);
        }
    }
    mla_heads_combine<HPB>(red, mx, stat[0], true);
    float l[HPB];
#pragma unroll
    for (int j = 0; j < HPB; ++j) l[j] = exp_in_place_warp_sum(sc[j], n, stat[0][j], MLA_THREADS);
    __syncthreads();
    mla_heads_combine<HPB>(red, l, stat[1], false);

    // weighted sum of the latents: thread t the value pairs 2t, 2t + 1, then 2 * MLA_THREADS
    // on, over the chunk's rows in order
    const size_t sums = (size_t)n_heads * chunks * kv_lora;
    for (int d = 2 * threadIdx.x; d < kv_lora; d += 2 * MLA_THREADS) {
        float o0[HPB], o1[HPB];
#pragma unroll
        for (int j = 0; j < HPB; ++j) o0[j] = o1[j] = 0.f;
        for (int i = 0; i < n; ++i) {
            const u32 pair = *(const u32*)(row_of(i) + d);
            const float r0 = f16_to_f32((u16)(pair & 0xffff)), r1 = f16_to_f32((u16)(pair >> 16));
#pragma unroll
            for (int j = 0; j < HPB; ++j) {
                o0[j] = fmaf(sc[j][i], r0, o0[j]);
                o1[j] = fmaf(sc[j][i], r1, o1[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < HPB; ++j) {
            if (h0 + j >= n_heads) break;
            float* o = parts + mla_part(h0 + j, c, chunks) * kv_lora;
            o[d] = o0[j];
            o[d + 1] = o1[j];
        }
    }
    __syncthreads();
    if (threadIdx.x < HPB && h0 + (int)threadIdx.x < n_heads) {
        const size_t at = mla_part(h0 + threadIdx.x, c, chunks);
        parts[sums + 2 * at] = stat[0][threadIdx.x];
        parts[sums + 2 * at + 1] = stat[1][threadIdx.x];
    }
}

// a block per two heads (fewer heads: more blocks per row), or per eight (many heads: fewer
// reads of each row); the same bits either way
extern "C" __global__ void __launch_bounds__(MLA_THREADS) mla_attention_split2_f16(MLA_ARGS) { mla_split<2>(MLA_PASS); }
extern "C" __global__ void __launch_bounds__(MLA_THREADS) mla_attention_split8_f16(MLA_ARGS) { mla_split<8>(MLA_PASS); }

// Block per head: the head's chunk partials merged in chunk order into out (n_heads rows of
// kv_lora), `chunks` as the split's grid had them.
extern "C" __global__ void __launch_bounds__(MLA_THREADS)
    mla_merge_f16(const float* parts, float* out, const u32* pos, int n_heads, int kv_lora, int capacity,
                  const int* cells, int chunks) {
    overlap_with_neighbours();
    const int h = blockIdx.x;
    const int used = (mla_attended(cells, *pos, capacity) + MLA_CHUNK - 1) / MLA_CHUNK;
    const size_t sums = (size_t)n_heads * chunks * kv_lora;
    for (int d = threadIdx.x; d < kv_lora; d += MLA_THREADS) {
        Merged run{};
        for (int c = 0; c < used; ++c) {
            const size_t at = mla_part(h, c, chunks);
            run = merge_chunk(run, {parts[sums + 2 * at], parts[sums + 2 * at + 1], parts[at * kv_lora + d]}, c == 0);
        }
        out[(size_t)h * kv_lora + d] = __fdiv_rn(run.o, run.l);
    }
}
