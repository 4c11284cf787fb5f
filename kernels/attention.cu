// memra kernels: single-token attention over an f16 KV cache, fused with the rotary position
// embedding of q and k and the cache write of the current position. The position comes from
// device memory, so captured graphs replay at every step: a row attends over positions
// 0..=*pos (clamped to the capacity). A prefill step's token rows are grid rows: row y attends
// over 0..=*pos + y, each row with the bits of the decode step at its position. A batched
// decode step's rows belong to different sequences: with `slots` given, row y sits at pos[y]
// in sequence slot slots[y], whose cache is `capacity` positions from slot * capacity on; a
// pad row (slots[y] == ATTN_PAD_SLOT, a batched step padded to its graph's row count) writes
// no cache and reads none, and its output is zeros, so it touches no sequence.
//
// Cache layout: `capacity` positions of `n_kv_heads * head_dim` halves (K and V separately).
// Grouped-query attention: query head h reads KV head h / (n_heads / n_kv_heads).
//
// The canonical order (what fixes the bits): a row's positions fall into chunks of ATTN_CHUNK
// (positions c * ATTN_CHUNK ..), each of sub-chunks of ATTN_SUB, fixed by the position alone.
// A sub-chunk gives, per head, its max m, the sum l of exp(s - m) over its scores s and
// o = sum of exp(s - m) v (f32 weights), each in a fixed order; its chunk's sub-chunks merge in
// order into the chunk's (m_c, l_c, o_c): (M, L, O) starts at the first's and takes the next as
// M' = max(M, m), L' = L e^(M - M') + l e^(m - M'), O' likewise (merge_chunk). The chunks then
// merge in chunk order the same way; the output is O / L. Two forms compute exactly this:
// - the walk (attention_f16, attention_group_f16): a block takes a row's head(s) over all its
//   chunks and merges as it goes; for steps of many rows, whose grid fills the device;
// - the split (attention_split_f16, attention_split_group_f16): a block per chunk writes
//   (m_c, l_c, o_c) to `parts`, and the last of a row's chunk blocks to finish merges them in
//   chunk order (flash-decoding); for steps of few rows, where a long context would leave one
//   block per head walking thousands of positions.
// Either form, a block per query head or per ATTN_GROUP_HEADS heads of a KV head (each head
// with the bits it has in a block of its own: the heads only share the loads of k and v), a
// walk or a split: the same bits, so the launch may pick by occupancy alone.
//
// A block rotates its q heads (the walk writes them back rotated, as does a split's merging
// block), and the rotated k and the v of its KV head at the current position,
// narrowed to f16, serve it from shared memory; the block of each group's first head whose
// chunk holds the current position also writes them to the cache slot *pos (k itself stays as
// it is). No block reads that slot from the cache, so the write needs no ordering, and the
// bits are those of a cache write followed by attention. Rotation: the angle of pair i is
// pos * theta_scale^i reached by repeated f32 multiplication, as llama.cpp and the CPU backend
// do (theta_scale = theta^(-2 / head_dim), computed on the host so the angles match to the
// bit); `neox` = 0 rotates adjacent pairs (2i, 2i + 1) (llama), 1 rotates (i, i + head_dim / 2)
// (GPT-NeoX, qwen2, qwen3). Scores are scaled by `scale` (1 / sqrt(head_dim)); q is narrowed to
// the f16 cache's dtype, as the CPU backend does. With `xq`, every row's output also goes into
// its 8-bit copy there (the bits quantize_rows_q8 makes of it; head_dim a multiple of 32, so a
// warp's lanes hold whole blocks): the input of the o product on tensor cores, which then
// needs no launch of its own to quantize it.
#include "common.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / WARP)
#define ATTN_MAX_HEAD_DIM 256
// positions of a sub-chunk (a warp's, a lane each) and 16-byte loads of a k row in flight
#define ATTN_SUB 32
#define ATTN_AHEAD 4
// value rows of a sub-chunk loaded at once
#define ATTN_VROWS 4
// positions of a chunk (ATTN_CHUNK in executor/src/cuda/ops.rs)
#define ATTN_CHUNK 256
// most rows a split takes (ATTN_SPLIT_ROWS in executor/src/cuda/ops.rs)
#define ATTN_SPLIT_ROWS 16
// 128-value slices of the largest head (a lane takes 4 values of each)
#define ATTN_SLICES (ATTN_MAX_HEAD_DIM / 128)
// the slot of a pad row (PAD_SLOT in executor/src/cuda/ops.rs): no sequence has it
#define ATTN_PAD_SLOT 0xffffffffu

// Value `col` of row `row` of the output, v, into the row's 8-bit copy at xq
// (quantize_rows_q8's layout: `cols` quants, then a (d, d * sum) pair per 32 values); a warp's
// lanes hold one 32-value block (every lane of the warp calls this).
__device__ __forceinline__ void quantized_out(i8* xq, int cols, int row, int col, float v) {
    const float vs[1] = {v};
    const Q8Block b = quantize_block32(vs);
    i8* r = xq + (size_t)row * (cols + cols / 4);
    r[col] = (i8)b.quants;
    if (col % 32 == 0) ((float2*)(r + cols))[col / 32] = b.pair;
}

#define ATTN_ARGS                                                                                          \
    float *q, const float *k, const float *v, u16 *k_cache, u16 *v_cache, float *out, i8 *xq, float *parts, \
        const u32 *pos, const u32 *slots, int n_heads, int n_kv_heads, int head_dim, int capacity, float scale, \
        float theta_scale, int neox
#define ATTN_PASS q, k, v, k_cache, v_cache, out, xq, parts, pos, slots, n_heads, n_kv_heads, head_dim, capacity, scale, theta_scale, neox

// Where row `y` of a step sits: its position, how many positions it attends over, the
// current position's index in the window (-1 when the cache is full), and its slot's caches.
struct AttnRow {
    u32 p_now;
    int n_ctx, now;
    const u16* k_cache;
    const u16* v_cache;
    bool pad;
};
__device__ __forceinline__ AttnRow attn_row(const u32* pos, const u32* slots, int y, int capacity, size_t kv_row,
                                            const u16* k_cache, const u16* v_cache) {
    AttnRow r;
    r.pad = slots && slots[y] == ATTN_PAD_SLOT;
    r.p_now = r.pad ? 0 : slots ? pos[y] : *pos + y;
    r.n_ctx = min((int)r.p_now + 1, capacity);
    r.now = r.p_now < (u32)capacity ? (int)r.p_now : -1;
    const size_t base = slots && !r.pad ? (size_t)slots[y] * capacity * kv_row : 0;
    r.k_cache = k_cache + base;
    r.v_cache = v_cache + base;
    return r;
}

template <int HPB>
struct AttnSmem {
    float qh[HPB][ATTN_MAX_HEAD_DIM];
    __align__(16) u16 k_now[ATTN_MAX_HEAD_DIM];
    __align__(16) u16 v_now[ATTN_MAX_HEAD_DIM];
    // each warp's sub-chunk: its max, sum and weighted values per head
    float wm[HPB][ATTN_WARPS];
    float wl[HPB][ATTN_WARPS];
    float wo[HPB][ATTN_WARPS][ATTN_MAX_HEAD_DIM];
};

// Block (head block, row[, chunk]) of HPB query heads h0 = HPB * blockIdx.x .. of one KV head
// (HPB divides the group): the q heads rotated (and narrowed) into shared memory, written back
// to q when `write_q`; the current position's k and v into shared memory, and into the cache
// when `write_kv`.
template <int HPB>
__device__ __forceinline__ void attn_prologue(AttnSmem<HPB>& sm, float* q, const float* k, const float* v,
                                              u16* k_cache, u16* v_cache, const AttnRow& r, int h0, int kvh,
                                              int head_dim, size_t kv_row, float theta_scale, int neox, bool write_q,
                                              bool write_kv) {
    const int half = head_dim / 2;
    const float* krow = k + (size_t)kvh * head_dim;
    u16* k_slot = k_cache + (size_t)max(r.now, 0) * kv_row + (size_t)kvh * head_dim;
    u16* v_slot = v_cache + (size_t)max(r.now, 0) * kv_row + (size_t)kvh * head_dim;
    for (int i = threadIdx.x; i < half; i += ATTN_THREADS) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
#pragma unroll
        for (int j = 0; j < HPB; ++j) {
            float* qrow = q + (size_t)(h0 + j) * head_dim;
            const float2 rq = rope_pair(qrow[a], qrow[b], i, (float)r.p_now, theta_scale);
            sm.qh[j][a] = round_f16(rq.x);
            sm.qh[j][b] = round_f16(rq.y);
            if (write_q) {
                qrow[a] = rq.x;
                qrow[b] = rq.y;
            }
        }
        const float2 rk = rope_pair(krow[a], krow[b], i, (float)r.p_now, theta_scale);
        sm.k_now[a] = f32_to_f16(rk.x);
        sm.k_now[b] = f32_to_f16(rk.y);
        if (write_kv) {
            k_slot[a] = sm.k_now[a];
            k_slot[b] = sm.k_now[b];
        }
    }
    for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
        sm.v_now[d] = f32_to_f16(v[(size_t)kvh * head_dim + d]);
        if (write_kv) v_slot[d] = sm.v_now[d];
    }
    __syncthreads();
}

// Chunk c of the row's positions for the block's HPB heads: res[j] gets head j's (m_c, l_c)
// and, in the thread d = threadIdx.x < head_dim, o_c[d]. Every thread of the block calls it.
// Warp w takes the chunk's sub-chunk w (ATTN_SUB positions), lane l its position l: the lane's
// score is its dot product in dimension order; the warp's max, exp(s - max) per lane, their sum
// (warp_sum's order) and, per value, the weighted sum over the sub-chunk's positions in order
// (lane l holding values 4l .. 4l + 3 of each 128-value slice). The sub-chunks then merge in
// order (merge_chunk) into the chunk's (m_c, l_c, o_c).
template <int HPB>
__device__ __forceinline__ void attn_chunk(AttnSmem<HPB>& sm, const AttnRow& r, int c, int kvh, int head_dim,
                                           size_t kv_row, float scale, Merged (&res)[HPB]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p_begin = c * ATTN_CHUNK, n = min(ATTN_CHUNK, r.n_ctx - p_begin);
    const int subs = (n + ATTN_SUB - 1) / ATTN_SUB;
    // position p's k or v row of this block's KV head: shared memory for the current position
    const auto cache_row = [&](const u16* cache, const u16* now_row, int i) -> const u16* {
        const int p = p_begin + i;
        return p == r.now ? now_row : cache + (size_t)p * kv_row + (size_t)kvh * head_dim;
    };
    if (warp < subs) {
        const int i0 = warp * ATTN_SUB, nv = min(ATTN_SUB, n - i0);
        const bool valid = lane < nv;
        // a lane past the end scores the last position and drops it
        const u16* krow = cache_row(r.k_cache, sm.k_now, i0 + min(lane, nv - 1));
        float s[HPB];
#pragma unroll
        for (int j = 0; j < HPB; ++j) s[j] = 0.f;
        for (int d0 = 0; d0 < head_dim; d0 += 8 * ATTN_AHEAD) {
            uint4 kw[ATTN_AHEAD];
#pragma unroll
            for (int u = 0; u < ATTN_AHEAD; ++u)
                if (d0 + 8 * u < head_dim) kw[u] = *(const uint4*)(krow + d0 + 8 * u);
#pragma unroll
            for (int u = 0; u < ATTN_AHEAD; ++u) {
                const int d = d0 + 8 * u;
                if (d >= head_dim) break;
                const u32 w4[4] = {kw[u].x, kw[u].y, kw[u].z, kw[u].w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float k0 = f16_to_f32((u16)(w4[e] & 0xffff)), k1 = f16_to_f32((u16)(w4[e] >> 16));
#pragma unroll
                    for (int j = 0; j < HPB; ++j) {
                        s[j] = fmaf(sm.qh[j][d + 2 * e], k0, s[j]);
                        s[j] = fmaf(sm.qh[j][d + 2 * e + 1], k1, s[j]);
                    }
                }
            }
        }
        float e[HPB];
#pragma unroll
        for (int j = 0; j < HPB; ++j) {
            const float sv = s[j] * scale;
            float m = valid ? sv : -__int_as_float(0x7f800000);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, off));
            e[j] = valid ? expf(sv - m) : 0.f;
            const float l = warp_sum(e[j]);
            if (lane == 0) {
                sm.wm[j][warp] = m;
                sm.wl[j][warp] = l;
            }
        }
        // weighted values: the sub-chunk's positions in order, ATTN_VROWS rows loaded at once
        float acc[HPB][ATTN_SLICES][4];
#pragma unroll
        for (int j = 0; j < HPB; ++j)
#pragma unroll
            for (int i = 0; i < ATTN_SLICES; ++i)
#pragma unroll
                for (int x = 0; x < 4; ++x) acc[j][i][x] = 0.f;
        for (int p0 = 0; p0 < nv; p0 += ATTN_VROWS) {
            uint2 vw[ATTN_VROWS][ATTN_SLICES];
#pragma unroll
            for (int u = 0; u < ATTN_VROWS; ++u) {
                const u16* vr = cache_row(r.v_cache, sm.v_now, i0 + min(p0 + u, nv - 1));
#pragma unroll
                for (int i = 0; i < ATTN_SLICES; ++i) {
                    const int d = 128 * i + 4 * lane;
                    if (d < head_dim) vw[u][i] = *(const uint2*)(vr + d);
                }
            }
#pragma unroll
            for (int u = 0; u < ATTN_VROWS; ++u) {
                // every lane takes part in the shuffles; positions past the end add nothing
                float pr[HPB];
#pragma unroll
                for (int j = 0; j < HPB; ++j) pr[j] = __shfl_sync(FULL_MASK, e[j], (p0 + u) & 31);
                if (p0 + u >= nv) break;
#pragma unroll
                for (int j = 0; j < HPB; ++j)
#pragma unroll
                    for (int i = 0; i < ATTN_SLICES; ++i) {
                        if (128 * i + 4 * lane >= head_dim) break;
                        acc[j][i][0] = fmaf(pr[j], f16_to_f32((u16)(vw[u][i].x & 0xffff)), acc[j][i][0]);
                        acc[j][i][1] = fmaf(pr[j], f16_to_f32((u16)(vw[u][i].x >> 16)), acc[j][i][1]);
                        acc[j][i][2] = fmaf(pr[j], f16_to_f32((u16)(vw[u][i].y & 0xffff)), acc[j][i][2]);
                        acc[j][i][3] = fmaf(pr[j], f16_to_f32((u16)(vw[u][i].y >> 16)), acc[j][i][3]);
                    }
            }
        }
#pragma unroll
        for (int j = 0; j < HPB; ++j)
#pragma unroll
            for (int i = 0; i < ATTN_SLICES; ++i) {
                const int d = 128 * i + 4 * lane;
                if (d < head_dim)
#pragma unroll
                    for (int x = 0; x < 4; ++x) sm.wo[j][warp][d + x] = acc[j][i][x];
            }
    }
    __syncthreads();
    // the sub-chunks in order: every thread the max and sum, thread d value d
    const int d = threadIdx.x;
#pragma unroll
    for (int j = 0; j < HPB; ++j) {
        Merged run{};
        for (int w = 0; w < subs; ++w)
            run = merge_chunk(run, {sm.wm[j][w], sm.wl[j][w], d < head_dim ? sm.wo[j][w][d] : 0.f}, w == 0);
        res[j] = run;
    }
    // the next chunk's writers of wm, wl and wo wait for this chunk's readers
    __syncthreads();
}

// Value d of head h's output of row y (every thread of the block calls it, d = threadIdx.x):
// out, and its 8-bit copy with `xq`.
__device__ __forceinline__ void attn_out(float* out, i8* xq, int n_heads, int head_dim, int y, int h, float o) {
    const int d = threadIdx.x;
    if (d < head_dim) out[(size_t)y * n_heads * head_dim + (size_t)h * head_dim + d] = o;
    // whole warps inside the head (head_dim a multiple of 32 with xq)
    if (xq && d < head_dim) quantized_out(xq, n_heads * head_dim, y, h * head_dim + d, o);
}

// The walk: block (head block, row) over all the row's chunks, merged in chunk order.
template <int HPB>
__device__ __forceinline__ void attention_walk(ATTN_ARGS) {
    overlap_with_neighbours();
    __shared__ AttnSmem<HPB> sm;
    const int h0 = blockIdx.x * HPB, group = n_heads / n_kv_heads, kvh = h0 / group, y = blockIdx.y;
    const size_t kv_row = (size_t)n_kv_heads * head_dim, q_row = (size_t)n_heads * head_dim;
    const AttnRow r = attn_row(pos, slots, y, capacity, kv_row, k_cache, v_cache);
    if (r.pad) {
#pragma unroll
        for (int j = 0; j < HPB; ++j) attn_out(out, xq, n_heads, head_dim, y, h0 + j, 0.f);
        return;
    }
    // token row y of a prefill step sits at *pos + y; kv_store_rows_f16 has written the rows
    // before it to the cache, with the bits this block writes for its own
    attn_prologue<HPB>(sm, q + y * q_row, k + y * kv_row, v + y * kv_row, (u16*)r.k_cache, (u16*)r.v_cache, r, h0,
                       kvh, head_dim, kv_row, theta_scale, neox, true, h0 % group == 0 && r.now >= 0);
    Merged run[HPB];
    const int chunks = (r.n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    for (int c = 0; c < chunks; ++c) {
        Merged res[HPB];
        attn_chunk<HPB>(sm, r, c, kvh, head_dim, kv_row, scale, res);
#pragma unroll
        for (int j = 0; j < HPB; ++j) run[j] = merge_chunk(run[j], res[j], c == 0);
    }
#pragma unroll
    for (int j = 0; j < HPB; ++j) attn_out(out, xq, n_heads, head_dim, y, h0 + j, __fdiv_rn(run[j].o, run[j].l));
}

// Where chunk c of head h of row y keeps its partial in `parts`: first ATTN_SPLIT_ROWS *
// n_heads arrival counters (u32, one per row and head, at the same place whatever the step's
// rows, so they stay zero between launches), then o_c at index * head_dim (head_dim values),
// then (m_c, l_c) at 2 * index past all the o values. `chunks` per row and head (capacity /
// ATTN_CHUNK, rounded up).
__device__ __forceinline__ size_t part_index(int y, int h, int c, int n_heads, int chunks) {
    return ((size_t)y * n_heads + h) * chunks + c;
}

// The split: block (head block, row, chunk) writes its chunk's partials; the last of the row's
// chunk blocks of its heads to arrive (an arrival counter per row and head block) merges them
// in chunk order, writes the output (and its 8-bit copy) and the q heads rotated (every other
// block of these heads has read q by then), and sets the counter back to zero. Which block is
// last does not change the bits: the merge reads every chunk's partial in chunk order.
template <int HPB>
__device__ __forceinline__ void attention_split(ATTN_ARGS) {
    overlap_with_neighbours();
    __shared__ AttnSmem<HPB> sm;
    __shared__ bool last;
    const int h0 = blockIdx.x * HPB, group = n_heads / n_kv_heads, kvh = h0 / group, y = blockIdx.y, c = blockIdx.z;
    const size_t kv_row = (size_t)n_kv_heads * head_dim, q_row = (size_t)n_heads * head_dim;
    const AttnRow r = attn_row(pos, slots, y, capacity, kv_row, k_cache, v_cache);
    if (r.pad) {
        if (c == 0)
#pragma unroll
            for (int j = 0; j < HPB; ++j) attn_out(out, xq, n_heads, head_dim, y, h0 + j, 0.f);
        return;
    }
    if (c * ATTN_CHUNK >= r.n_ctx) return;
    const bool writer = h0 % group == 0 && r.now >= 0 && r.now / ATTN_CHUNK == c;
    attn_prologue<HPB>(sm, q + y * q_row, k + y * kv_row, v + y * kv_row, (u16*)r.k_cache, (u16*)r.v_cache, r, h0,
                       kvh, head_dim, kv_row, theta_scale, neox, false, writer);
    Merged res[HPB];
    attn_chunk<HPB>(sm, r, c, kvh, head_dim, kv_row, scale, res);
    const int chunks = gridDim.z, used = (r.n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    u32* arrived = (u32*)parts + (size_t)y * n_heads + h0;
    parts += (size_t)ATTN_SPLIT_ROWS * n_heads;
    const size_t total = (size_t)gridDim.y * n_heads * chunks, stats = total * head_dim;
#pragma unroll
    for (int j = 0; j < HPB; ++j) {
        const size_t at = part_index(y, h0 + j, c, n_heads, chunks);
        if (threadIdx.x < head_dim) parts[at * head_dim + threadIdx.x] = res[j].o;
        if (threadIdx.x == 0) {
            parts[stats + 2 * at] = res[j].m;
            parts[stats + 2 * at + 1] = res[j].l;
        }
    }
    // the partials are visible device-wide before this block counts itself in
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(arrived, 1u) == (u32)used - 1;
        if (last) atomicExch(arrived, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int j = 0; j < HPB; ++j) {
        Merged run{};
        for (int cc = 0; cc < used; ++cc) {
            const size_t at = part_index(y, h0 + j, cc, n_heads, chunks);
            const Merged part = {__ldcg(parts + stats + 2 * at), __ldcg(parts + stats + 2 * at + 1),
                                 threadIdx.x < head_dim ? __ldcg(parts + at * head_dim + threadIdx.x) : 0.f};
            run = merge_chunk(run, part, cc == 0);
        }
        attn_out(out, xq, n_heads, head_dim, y, h0 + j, __fdiv_rn(run.o, run.l));
    }
    // q rotated, as the walk leaves it (the same rotation as the prologue's)
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < half; i += ATTN_THREADS) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
#pragma unroll
        for (int j = 0; j < HPB; ++j) {
            float* qrow = q + y * q_row + (size_t)(h0 + j) * head_dim;
            const float2 rq = rope_pair(qrow[a], qrow[b], i, (float)r.p_now, theta_scale);
            qrow[a] = rq.x;
            qrow[b] = rq.y;
        }
    }
}

// a block per head, four per SM
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 4) attention_f16(ATTN_ARGS) { attention_walk<1>(ATTN_PASS); }
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 4) attention_split_f16(ATTN_ARGS) {
    attention_split<1>(ATTN_PASS);
}
// a block per ATTN_GROUP_HEADS heads of a KV head (ATTN_GROUP_HEADS in ops.rs)
#define ATTN_GROUP_HEADS 4
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) attention_group_f16(ATTN_ARGS) {
    attention_walk<ATTN_GROUP_HEADS>(ATTN_PASS);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) attention_split_group_f16(ATTN_ARGS) {
    attention_split<ATTN_GROUP_HEADS>(ATTN_PASS);
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
