// memra kernels: single-token attention over an f16 KV cache, fused with the rotary position
// embedding of q and k and the cache write of the current position. The position comes from
// device memory, so captured graphs replay at every step: a row attends over positions
// 0..=*pos (clamped to the capacity). A prefill step's token rows are grid rows: row y attends
// over 0..=*pos + y, each row with the bits of the decode step at its position. A batched
// decode step's rows belong to different sequences: with `slots` given, row y sits at pos[y]
// in sequence slot slots[y], whose cache is `capacity` positions from slot * capacity on; a
// pad row (slots[y] == PAD_SLOT, a batched step padded to its graph's row count) writes
// no cache and reads none, and its output is zeros, so it touches no sequence.
//
// Cache layout: `capacity` positions of `n_kv_heads * head_dim` halves (K and V separately).
// Grouped-query attention: query head h reads KV head h / (n_heads / n_kv_heads). A block
// takes up to ATTN_TILE_HEADS query heads of one KV head (the 16 rows of the tensor cores'
// tiles; a larger group takes several blocks), so each k and v row is read once for them all.
//
// The canonical order (what fixes the bits): a row's positions fall into chunks of ATTN_CHUNK
// (positions c * ATTN_CHUNK ..), fixed by the position alone, each of ATTN_WARPS warp slices
// of ATTN_SUB positions. Per head, a chunk gives:
// - the scores s = q k * scale, q and k in f16, the dot product on the tensor cores
//   (mma.sync m16n8k16, f32 accumulation, the head's dimensions in the fixed k order of
//   attn_chunk: a thread's 16-byte load of 8 dimensions feeds two k steps);
// - m_c, the largest score of the chunk;
// - the weights p = exp(s - m_c) narrowed to f16 (llama.cpp's decode kernels narrow them too);
// - l_c, the sum of the weights: each warp slice's in a fixed lane order, then the slices in
//   order;
// - o_c, the weighted values: each slice's p v on the tensor cores (two k steps of 16
//   positions), then the slices added in order.
// The chunks then merge in chunk order: (M, L, O) starts at the first's and takes the next as
// M' = max(M, m), L' = L e^(M - M') + l e^(m - M'), O' likewise (merge_chunk); the output is
// O / L. A head's bits depend on its own q and cache alone (the tensor cores compute each
// output of a tile from its own row and column), never on the heads or rows beside it. Two
// forms compute exactly this:
// - the walk (attention_f16_D): a block takes a row's heads over all its chunks and merges as
//   it goes; for steps of many rows, whose grid fills the device;
// - the split (attention_split_f16_D): a block per chunk writes (m_c, l_c, o_c) to `parts`,
//   and the last of a row's chunk blocks to finish merges them in chunk order
//   (flash-decoding); for steps of few rows, where a long context would leave one block per
//   KV head walking thousands of positions.
// D, the padded head width (32, 64, 128 or 256), sizes the registers; a narrower head is
// zero-padded, which adds nothing to a product.
//
// A block rotates its q heads (the walk writes them back rotated, as does a split's merging
// block), and the rotated k and the v of its KV head at the current position,
// narrowed to f16, serve it from shared memory; the first block of the KV head whose chunk
// holds the current position also writes them to the cache slot *pos (k itself stays as
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
// positions of a warp's slice of a chunk
#define ATTN_SUB 32
// positions of a chunk (ATTN_CHUNK in executor/src/cuda/ops.rs)
#define ATTN_CHUNK (ATTN_WARPS * ATTN_SUB)
// most rows a split takes (ATTN_SPLIT_ROWS in executor/src/cuda/ops.rs)
#define ATTN_SPLIT_ROWS 16
// Whether the split of heads up to D wide loads a chunk's v rows only after the chunk's max
// (each lane asks L2 for one v row with the k loads, so the later loads find them there): k
// and v together would hold too many registers for two blocks an SM, and a long context is
// hundreds of chunk blocks, which two blocks an SM keep the memory busy through. The values
// and the arithmetic are the same either way, so are the bits.
#define ATTN_SPLIT_LATE_V(D) ((D) <= 128)
// query heads of a block: the rows of an mma tile (ATTN_TILE_HEADS in executor/src/cuda/ops.rs)
#define ATTN_TILE_HEADS 16

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
    r.pad = slots && slots[y] == PAD_SLOT;
    r.p_now = r.pad ? 0 : slots ? pos[y] : *pos + y;
    r.n_ctx = min((int)r.p_now + 1, capacity);
    r.now = r.p_now < (u32)capacity ? (int)r.p_now : -1;
    const size_t base = slots && !r.pad ? (size_t)slots[y] * capacity * kv_row : 0;
    r.k_cache = k_cache + base;
    r.v_cache = v_cache + base;
    return r;
}

// The block's heads: KV head kvh, query heads h0 .. h0 + heads - 1 (blockIdx.x counts the KV
// heads' tiles of ATTN_TILE_HEADS), and whether it is the KV head's first (its cache writer).
struct AttnHeads {
    int kvh, h0, heads;
    bool first;
};
__device__ __forceinline__ AttnHeads attn_heads(int n_heads, int n_kv_heads) {
    const int group = n_heads / n_kv_heads, tiles = (group + ATTN_TILE_HEADS - 1) / ATTN_TILE_HEADS;
    const int t = blockIdx.x % tiles;
    AttnHeads b;
    b.kvh = blockIdx.x / tiles;
    b.h0 = b.kvh * group + t * ATTN_TILE_HEADS;
    b.heads = min(ATTN_TILE_HEADS, group - t * ATTN_TILE_HEADS);
    b.first = t == 0;
    return b;
}

template <int D>
struct AttnSmem {
    // the block's q heads, rotated and narrowed, zero past the heads and past head_dim
    __align__(16) u16 q16[ATTN_TILE_HEADS][D];
    __align__(16) u16 k_now[D];
    __align__(16) u16 v_now[D];
    // each warp slice's max and weight sum per head
    float wm[ATTN_WARPS][ATTN_TILE_HEADS];
    float wl[ATTN_WARPS][ATTN_TILE_HEADS];
};
// each warp slice's weighted values, [warp][head][head_dim] (dynamic: attention_smem_bytes in
// executor/src/cuda/ops.rs)
extern __shared__ float attn_wo[];

// The block's q heads rotated (and narrowed) into shared memory, written back to q when
// `write_q`; the current position's k and v into shared memory, and into the cache when
// `write_kv`.
template <int D>
__device__ __forceinline__ void attn_prologue(AttnSmem<D>& sm, float* q, const float* k, const float* v,
                                              u16* k_cache, u16* v_cache, const AttnRow& r, const AttnHeads& b,
                                              int head_dim, size_t kv_row, float theta_scale, int neox, bool write_q,
                                              bool write_kv) {
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < ATTN_TILE_HEADS * D; i += ATTN_THREADS) {
        const int j = i / D, d = i % D;
        if (j >= b.heads || d >= head_dim) sm.q16[j][d] = 0;
    }
    for (int i = threadIdx.x; i < b.heads * half; i += ATTN_THREADS) {
        const int j = i / half, p = i % half;
        const int x0 = neox ? p : 2 * p, x1 = neox ? p + half : 2 * p + 1;
        float* qrow = q + (size_t)(b.h0 + j) * head_dim;
        const float2 rq = rope_pair(qrow[x0], qrow[x1], p, (float)r.p_now, theta_scale);
        sm.q16[j][x0] = f32_to_f16(rq.x);
        sm.q16[j][x1] = f32_to_f16(rq.y);
        if (write_q) {
            qrow[x0] = rq.x;
            qrow[x1] = rq.y;
        }
    }
    const float* krow = k + (size_t)b.kvh * head_dim;
    u16* k_slot = k_cache + (size_t)max(r.now, 0) * kv_row + (size_t)b.kvh * head_dim;
    u16* v_slot = v_cache + (size_t)max(r.now, 0) * kv_row + (size_t)b.kvh * head_dim;
    for (int i = threadIdx.x; i < half; i += ATTN_THREADS) {
        const int x0 = neox ? i : 2 * i, x1 = neox ? i + half : 2 * i + 1;
        const float2 rk = rope_pair(krow[x0], krow[x1], i, (float)r.p_now, theta_scale);
        sm.k_now[x0] = f32_to_f16(rk.x);
        sm.k_now[x1] = f32_to_f16(rk.y);
        if (write_kv) {
            k_slot[x0] = sm.k_now[x0];
            k_slot[x1] = sm.k_now[x1];
        }
    }
    for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
        sm.v_now[d] = f32_to_f16(v[(size_t)b.kvh * head_dim + d]);
        if (write_kv) v_slot[d] = sm.v_now[d];
    }
    __syncthreads();
}

// The thread's q fragments: for each 32 dimensions s, the A operands of k steps 2s and 2s + 1.
// Lane (g = lane / 4, t = lane % 4) holds dimensions 32s + 8t .. 32s + 8t + 7 of heads g and
// g + 8: k step 2s takes the first four as its k indices (2t, 2t + 1, 2t + 8, 2t + 9), k step
// 2s + 1 the last four. attn_chunk loads k in the same order, so the pairing is exact.
template <int D>
__device__ __forceinline__ void attn_q_fragments(const AttnSmem<D>& sm, u32 (&qf)[D / 32][8]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int s = 0; s < D / 32; ++s) {
        const uint4 a = *(const uint4*)&sm.q16[g][32 * s + 8 * t];
        const uint4 b = *(const uint4*)&sm.q16[g + 8][32 * s + 8 * t];
        const u32 f[8] = {a.x, b.x, a.y, b.y, a.z, b.z, a.w, b.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) qf[s][i] = f[i];
    }
}

// Elements of the block's output a thread holds: element e = threadIdx.x + ATTN_THREADS * j is
// value e % head_dim of head e / head_dim (of the block's heads).
#define ATTN_ELEMS(D) (ATTN_TILE_HEADS * (D) / ATTN_THREADS)

// Chunk c of the row's positions for the block's heads, in the canonical order above:
// res[j] gets the (m_c, l_c, o_c) of the thread's element j. Every thread of the block calls it.
// Warp w takes positions w * ATTN_SUB .. of the chunk: lane (g, t) loads k rows 8n + g
// (n = 0..3) and holds the scores of positions 8n + 2t, 8n + 2t + 1 of heads g and g + 8
// (the mma's accumulator layout), which are also the A operands of the weighted values' k
// steps; the v rows come as 4-value pieces, lane g taking dimensions 32s + 4g .. 32s + 4g + 3,
// so that output tile (s, e) holds dimension 32s + 4n + e in its column n.
template <int D, bool LATE_V>
__device__ __forceinline__ void attn_chunk(AttnSmem<D>& sm, const u32 (&qf)[D / 32][8], const AttnRow& r, int c,
                                           const AttnHeads& b, int head_dim, size_t kv_row, float scale,
                                           Merged (&res)[ATTN_ELEMS(D)]) {
    constexpr int S = D / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int p_begin = c * ATTN_CHUNK, n = min(ATTN_CHUNK, r.n_ctx - p_begin);
    const int subs = (n + ATTN_SUB - 1) / ATTN_SUB;
    const int i0 = warp * ATTN_SUB, nv = min(ATTN_SUB, n - i0);
    const float neg_inf = -__int_as_float(0x7f800000);
    // position i0 + i's k or v row of this block's KV head (a slot past the end reads the last
    // position, and its weight is zero): shared memory for the current position
    const auto cache_row = [&](const u16* cache, const u16* now_row, int i) -> const u16* {
        const int p = p_begin + i0 + min(i, nv - 1);
        return p == r.now ? now_row : cache + (size_t)p * kv_row + (size_t)b.kvh * head_dim;
    };
    float sc[4][4];
    // the slice's v pieces: k step kk (positions 16kk .. 16kk + 15), this lane's rows 2t, 2t + 1,
    // 2t + 8 and 2t + 9 of it, loaded with the k rows (neither depends on the scores, so the
    // two reads of the cache overlap), or with LATE_V after the chunk's max (ATTN_SPLIT_LATE_V)
    uint2 vv[2][S][4];
    const auto load_v = [&]() {
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u16* vr = cache_row(r.v_cache, sm.v_now, 16 * kk + 2 * t + (i & 1) + 8 * (i >> 1));
#pragma unroll
                for (int s = 0; s < S; ++s) {
                    const int d = 32 * s + 4 * g;
                    vv[kk][s][i] = d < head_dim ? *(const uint2*)(vr + d) : make_uint2(0u, 0u);
                }
            }
    };
    if (warp < subs) {
        uint4 kw[4][S];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const u16* kr = cache_row(r.k_cache, sm.k_now, 8 * nt + g);
#pragma unroll
            for (int s = 0; s < S; ++s) kw[nt][s] = f16x8_at(kr, 32 * s + 8 * t, head_dim);
        }
        if (LATE_V) {
            // lane i asks L2 for the v row of position i0 + i now, so that the loads after the
            // chunk's max find it there
            const u16* vr = cache_row(r.v_cache, sm.v_now, lane);
            if (vr != sm.v_now)
                for (int d = 0; d < head_dim; d += 64) asm volatile("prefetch.global.L2 [%0];" ::"l"(vr + d));
        } else {
            load_v();
        }
        float mx[2] = {neg_inf, neg_inf};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int x = 0; x < 4; ++x) sc[nt][x] = 0.f;
#pragma unroll
            for (int s = 0; s < S; ++s) {
                mma_f16(sc[nt], &qf[s][0], kw[nt][s].x, kw[nt][s].y);
                mma_f16(sc[nt], &qf[s][4], kw[nt][s].z, kw[nt][s].w);
            }
            scale_masked(sc[nt], 8 * nt + 2 * t, nv, scale, mx);
        }
        quad_max(mx);
        if (t == 0) {
            sm.wm[warp][g] = mx[0];
            sm.wm[warp][g + 8] = mx[1];
        }
    }
    __syncthreads();
    if (warp < subs) {
        if (LATE_V) load_v();
        // the chunk's max of heads g and g + 8
        float m[2] = {sm.wm[0][g], sm.wm[0][g + 8]};
        for (int w = 1; w < subs; ++w) {
            m[0] = fmaxf(m[0], sm.wm[w][g]);
            m[1] = fmaxf(m[1], sm.wm[w][g + 8]);
        }
        // the weights, narrowed, and their sums: the thread's in (n, x) order, then lanes t ^ 1
        // and t ^ 2 (every lane of a head ends with the same sum)
        u32 pa[2][4];
        float l[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            float p[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const float e = sc[nt][x] == neg_inf ? 0.f : expf(sc[nt][x] - m[x >> 1]);
                p[x] = round_f16(e);
                l[x >> 1] += p[x];
            }
            pa[nt >> 1][(nt & 1) * 2] = f16_pair(p[0], p[1]);
            pa[nt >> 1][(nt & 1) * 2 + 1] = f16_pair(p[2], p[3]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
            l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
        }
        if (t == 0) {
            sm.wl[warp][g] = l[0];
            sm.wl[warp][g + 8] = l[1];
        }
        // o = p v over the v pieces loaded above
        float o[S][4][4];
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int x = 0; x < 4; ++x) o[s][e][x] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int s = 0; s < S; ++s) {
                const uint2* v4 = vv[kk][s];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 sel = e & 1 ? 0x7632u : 0x5410u;
                    const u32 b0 = __byte_perm(e < 2 ? v4[0].x : v4[0].y, e < 2 ? v4[1].x : v4[1].y, sel);
                    const u32 b1 = __byte_perm(e < 2 ? v4[2].x : v4[2].y, e < 2 ? v4[3].x : v4[3].y, sel);
                    mma_f16(o[s][e], pa[kk], b0, b1);
                }
            }
        // the slice's weighted values of the block's heads: column n of tile (s, e) is
        // dimension 32s + 4n + e, and this lane holds columns 2t and 2t + 1
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int h = g + 8 * (x >> 1), d = 32 * s + 8 * t + 4 * (x & 1) + e;
                    if (h < b.heads && d < head_dim) attn_wo[((size_t)warp * b.heads + h) * head_dim + d] = o[s][e][x];
                }
    }
    __syncthreads();
    // the slices in order: each element's max, weight sum and weighted value
#pragma unroll
    for (int j = 0; j < ATTN_ELEMS(D); ++j) {
        const int e = threadIdx.x + ATTN_THREADS * j;
        if (e >= b.heads * head_dim) break;
        const int h = e / head_dim, d = e % head_dim;
        float m = sm.wm[0][h], l = sm.wl[0][h], o = attn_wo[(size_t)h * head_dim + d];
        for (int w = 1; w < subs; ++w) {
            m = fmaxf(m, sm.wm[w][h]);
            l = __fadd_rn(l, sm.wl[w][h]);
            o = __fadd_rn(o, attn_wo[((size_t)w * b.heads + h) * head_dim + d]);
        }
        res[j] = {m, l, o};
    }
    // the next chunk's writers of wm, wl and the values wait for this chunk's readers
    __syncthreads();
}

// Element j of the thread's (see ATTN_ELEMS) output of row y, o: out, and its 8-bit copy with
// `xq` (whole warps inside a head: head_dim a multiple of 32 with xq).
__device__ __forceinline__ void attn_out(float* out, i8* xq, int n_heads, int head_dim, int y, const AttnHeads& b,
                                         int j, float o) {
    const int e = threadIdx.x + ATTN_THREADS * j;
    if (e >= b.heads * head_dim) return;
    const int h = b.h0 + e / head_dim, d = e % head_dim;
    out[(size_t)y * n_heads * head_dim + (size_t)h * head_dim + d] = o;
    if (xq) quantized_out(xq, n_heads * head_dim, y, h * head_dim + d, o);
}

// The walk: block (head tile, row) over all the row's chunks, merged in chunk order.
template <int D>
__device__ __forceinline__ void attention_walk(ATTN_ARGS) {
    overlap_with_neighbours();
    __shared__ AttnSmem<D> sm;
    const AttnHeads b = attn_heads(n_heads, n_kv_heads);
    const int y = blockIdx.y;
    const size_t kv_row = (size_t)n_kv_heads * head_dim, q_row = (size_t)n_heads * head_dim;
    const AttnRow r = attn_row(pos, slots, y, capacity, kv_row, k_cache, v_cache);
    if (r.pad) {
#pragma unroll
        for (int j = 0; j < ATTN_ELEMS(D); ++j) attn_out(out, xq, n_heads, head_dim, y, b, j, 0.f);
        return;
    }
    // token row y of a prefill step sits at *pos + y; kv_store_rows_f16 has written the rows
    // before it to the cache, with the bits this block writes for its own
    attn_prologue<D>(sm, q + y * q_row, k + y * kv_row, v + y * kv_row, (u16*)r.k_cache, (u16*)r.v_cache, r, b,
                     head_dim, kv_row, theta_scale, neox, true, b.first && r.now >= 0);
    u32 qf[D / 32][8];
    attn_q_fragments<D>(sm, qf);
    Merged run[ATTN_ELEMS(D)];
    const int chunks = (r.n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    for (int c = 0; c < chunks; ++c) {
        Merged res[ATTN_ELEMS(D)];
        attn_chunk<D, false>(sm, qf, r, c, b, head_dim, kv_row, scale, res);
#pragma unroll
        for (int j = 0; j < ATTN_ELEMS(D); ++j) run[j] = merge_chunk(run[j], res[j], c == 0);
    }
#pragma unroll
    for (int j = 0; j < ATTN_ELEMS(D); ++j)
        attn_out(out, xq, n_heads, head_dim, y, b, j, __fdiv_rn(run[j].o, run[j].l));
}

// Where chunk c of head h of row y keeps its partial in `parts`: first ATTN_SPLIT_ROWS *
// n_heads arrival counters (u32, one per row and head, at the same place whatever the step's
// rows, so they stay zero between launches; a block counts at its first head's), then o_c at
// index * head_dim (head_dim values), then (m_c, l_c) at 2 * index past all the o values.
// `chunks` per row and head (capacity / ATTN_CHUNK, rounded up).
__device__ __forceinline__ size_t part_index(int y, int h, int c, int n_heads, int chunks) {
    return ((size_t)y * n_heads + h) * chunks + c;
}

// The block's q heads of a row rotated in place, as the walk leaves them (the prologue's
// rotation): the split's finishing block writes them once every block of the heads has read q.
__device__ __forceinline__ void attn_rotate_q(float* q, const AttnRow& r, const AttnHeads& b, int head_dim,
                                              float theta_scale, int neox) {
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < b.heads * half; i += ATTN_THREADS) {
        const int j = i / half, p = i % half;
        const int x0 = neox ? p : 2 * p, x1 = neox ? p + half : 2 * p + 1;
        float* qrow = q + (size_t)(b.h0 + j) * head_dim;
        const float2 rq = rope_pair(qrow[x0], qrow[x1], p, (float)r.p_now, theta_scale);
        qrow[x0] = rq.x;
        qrow[x1] = rq.y;
    }
}

// The split: block (head tile, row, chunk) writes its chunk's partials; the last of the row's
// chunk blocks of its heads to arrive (an arrival counter per row and head tile) merges them
// in chunk order, writes the output (and its 8-bit copy) and the q heads rotated (every other
// block of these heads has read q by then), and sets the counter back to zero. Which block is
// last does not change the bits: the merge reads every chunk's partial in chunk order.
template <int D>
__device__ __forceinline__ void attention_split(ATTN_ARGS) {
    overlap_with_neighbours();
    __shared__ AttnSmem<D> sm;
    __shared__ bool last;
    const AttnHeads b = attn_heads(n_heads, n_kv_heads);
    const int y = blockIdx.y, c = blockIdx.z;
    const size_t kv_row = (size_t)n_kv_heads * head_dim, q_row = (size_t)n_heads * head_dim;
    const AttnRow r = attn_row(pos, slots, y, capacity, kv_row, k_cache, v_cache);
    if (r.pad) {
        if (c == 0)
#pragma unroll
            for (int j = 0; j < ATTN_ELEMS(D); ++j) attn_out(out, xq, n_heads, head_dim, y, b, j, 0.f);
        return;
    }
    if (c * ATTN_CHUNK >= r.n_ctx) return;
    const bool writer = b.first && r.now >= 0 && r.now / ATTN_CHUNK == c;
    attn_prologue<D>(sm, q + y * q_row, k + y * kv_row, v + y * kv_row, (u16*)r.k_cache, (u16*)r.v_cache, r, b,
                     head_dim, kv_row, theta_scale, neox, false, writer);
    u32 qf[D / 32][8];
    attn_q_fragments<D>(sm, qf);
    Merged res[ATTN_ELEMS(D)];
    attn_chunk<D, ATTN_SPLIT_LATE_V(D)>(sm, qf, r, c, b, head_dim, kv_row, scale, res);
    const int chunks = gridDim.z, used = (r.n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    if (used == 1) {
        // a context of one chunk: its partial is the whole merge (merge_chunk takes the first
        // chunk as it is), so this block finishes the row without the partials' round trip
#pragma unroll
        for (int j = 0; j < ATTN_ELEMS(D); ++j)
            attn_out(out, xq, n_heads, head_dim, y, b, j, __fdiv_rn(res[j].o, res[j].l));
        attn_rotate_q(q + y * q_row, r, b, head_dim, theta_scale, neox);
        return;
    }
    u32* arrived = (u32*)parts + (size_t)y * n_heads + b.h0;
    parts += (size_t)ATTN_SPLIT_ROWS * n_heads;
    const size_t total = (size_t)gridDim.y * n_heads * chunks, stats = total * head_dim;
#pragma unroll
    for (int j = 0; j < ATTN_ELEMS(D); ++j) {
        const int e = threadIdx.x + ATTN_THREADS * j;
        if (e >= b.heads * head_dim) break;
        const int h = e / head_dim, d = e % head_dim;
        const size_t at = part_index(y, b.h0 + h, c, n_heads, chunks);
        parts[at * head_dim + d] = res[j].o;
        if (d == 0) {
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
    for (int j = 0; j < ATTN_ELEMS(D); ++j) {
        const int e = threadIdx.x + ATTN_THREADS * j;
        if (e >= b.heads * head_dim) break;
        const int h = e / head_dim, d = e % head_dim;
        const Merged run = merge_in_order(used, [&](int cc) -> Merged {
            const size_t at = part_index(y, b.h0 + h, cc, n_heads, chunks);
            return {__ldcg(parts + stats + 2 * at), __ldcg(parts + stats + 2 * at + 1),
                    __ldcg(parts + at * head_dim + d)};
        });
        attn_out(out, xq, n_heads, head_dim, y, b, j, __fdiv_rn(run.o, run.l));
    }
    attn_rotate_q(q + y * q_row, r, b, head_dim, theta_scale, neox);
}

// the walk and the split for heads up to 32, 64, 128 and 256 wide (`attention` in
// executor/src/cuda/ops.rs picks the narrowest that holds the head), BLOCKS an SM: two for a
// split whose v rows load late (ATTN_SPLIT_LATE_V), else one
#define ATTN_KERNEL(name, form, D, BLOCKS) \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, BLOCKS) name(ATTN_ARGS) { form<D>(ATTN_PASS); }
ATTN_KERNEL(attention_f16_32, attention_walk, 32, 1)
ATTN_KERNEL(attention_split_f16_32, attention_split, 32, 2)
ATTN_KERNEL(attention_f16_64, attention_walk, 64, 1)
ATTN_KERNEL(attention_split_f16_64, attention_split, 64, 2)
ATTN_KERNEL(attention_f16_128, attention_walk, 128, 1)
ATTN_KERNEL(attention_split_f16_128, attention_split, 128, 2)
ATTN_KERNEL(attention_f16_256, attention_walk, 256, 1)
ATTN_KERNEL(attention_split_f16_256, attention_split, 256, 1)

// kv_store_rows_f16, block (t, kv head): row t of a prefill step's k head rotated to position
// *pos + t and its v head, narrowed to f16, into the cache at that position (positions past
// the capacity are not written), with attention_f16's rotation and narrowing, so the step's
// attention (attention_f16 over the rows, or flash.cu) reads the cache decode steps would
// have written. With `slots` given, row t sits at pos[t] in slot slots[t] (as attention_f16);
// a pad row (PAD_SLOT) is not written.
extern "C" __global__ void kv_store_rows_f16(const float* k, const float* v, u16* k_cache, u16* v_cache,
                                             const u32* pos, const u32* slots, int n_kv_heads, int head_dim,
                                             int capacity, float theta_scale, int neox) {
    overlap_with_neighbours();
    const int t = blockIdx.x, kvh = blockIdx.y;
    const u32 p = slots ? pos[t] : *pos + (u32)t;
    if (p >= (u32)capacity || (slots && slots[t] == PAD_SLOT)) return;
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
