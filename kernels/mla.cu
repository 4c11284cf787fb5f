// memra kernels: multi-head latent attention at decode and prefill (DeepSeek's MLA with absorbed
// projections, as the CPU backend's cpu::kernels::mla runs it). The per-head products through
// attn_k_b and attn_v_b are ordinary matvecs; these kernels do what has no equivalent:
//
// mla_rope_f32 rotates the rope part of n_vecs vectors from src into dst (both strided), vector
// v at position pos[v / per_pos] (a prefill step's rows: each row's heads at the row's
// position; a decode step: all at pos[0]), with YaRN when `yarn` is set: pair i's angle is
// pos * theta_scale^i by repeated f32 multiplication, interpolated by freq_scale outside the
// corrected dims and cos/sin scaled by mscale, step by step as rope.rs's Yarn::cos_sin. With
// `rotate` 0 it copies them unrotated (kimi-linear's MLA layers use no rope).
//
// mla_attention_f16 attends each head's latent-space query (kv_lora + rope values) over the
// f16 latent cache rows 0..=*pos, or with `cells` set (DSA's sparse attention,
// kernels/dsa.cu's selection: the count, then the positions) over those rows in that order.
// The canonical order is attention.cu's, on the tensor cores: the attended rows fall into
// chunks of MLA_CHUNK by their index, each of MLA_WARPS warp slices of 16 rows. Per head, a
// chunk gives its scores (q and the rows in f16, mma.sync m16n8k16 with f32 accumulation, the
// dimensions in attention.cu's k order: a lane's 16-byte load of 8 values feeds two k steps,
// then scaled), its max m_c, the weights exp(s - m_c) narrowed to f16, their sum l_c (each
// slice's in a fixed lane order, then the slices in order) and the weighted latents o_c
// (p v on the tensor cores over the chunk's rows in k steps of 16). Block (head tile, chunk)
// takes up to 16 heads (the rows of a tile; each head's bits depend on its own query and the
// rows alone) and writes its chunk's partials to `parts`; mla_merge_f16 (block per head)
// merges them in chunk order (merge_chunk) into `out`. The current position's row
// (`row_now`, the normalized latent then the roped key) is narrowed to f16, written to the
// cache by block (0, 0) and read by every block from shared memory, so no block reads the
// slot being written. A prefill step's rows are grid z (the merge's grid y): row z's queries,
// position pos[z], partials and (DSA) cells row, `cells_stride` ints past the previous row's,
// over a cache mla_store_rows_f16 already wrote (`row_now` null), so each row has the bits of
// a decode step at its position with the same queries and cells.
//
// A batched decode step's rows (`slots` set) sit in sequence slots: row z attends over slot
// slots[z]'s cache (`capacity` rows from slot * capacity on), a pad row (PAD_SLOT) over slot
// 0's, its output unused.
//
// mla_store_rows_f16 narrows a prefill step's cache rows to f16 and writes row r at position
// pos[0] + r (a batched step's: at pos[r] of its slot). mla_heads_f16 narrows each head's slice of every row into a head-major block
// (the rows of head h together: the per-head absorbed products run as one grouped GEMM, a
// group per head), and mla_heads_f32 writes such a product's head-major rows back into each
// row's head slices.
#include "common.cuh"

#define MLA_THREADS 256
#define MLA_WARPS (MLA_THREADS / WARP)

extern "C" __global__ void mla_rope_f32(const float* src, int src_stride, float* dst, int dst_stride,
                                        int n_vecs, int n_rot, const u32* pos, int per_pos, float theta_scale, int rotate,
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
    float angle = (float)pos[vec / per_pos];
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

// rows of a chunk (MLA_CHUNK in executor/src/cuda/mla.rs): a warp slice of 16 each
#define MLA_CHUNK (16 * MLA_WARPS)
// query heads of a block: the rows of an mma tile (MLA_TILE_HEADS in executor/src/cuda/mla.rs)
#define MLA_TILE_HEADS 16
// 32-value blocks of a row whose k loads a warp keeps in flight at once
#define MLA_AHEAD 9
// the weights' row stride in halves: the lanes' reads of a fragment on distinct banks
#define MLA_P_STRIDE (MLA_CHUNK + 8)

// The i-th attended position: i itself, or the i-th of `cells`.
__device__ __forceinline__ int mla_position(const int* cells, int i) { return cells ? cells[1 + i] : i; }

// The rows attended at position *pos: all of 0..=*pos, or the count of `cells`.
__device__ __forceinline__ int mla_attended(const int* cells, u32 p_now, int capacity) {
    return cells ? min(cells[0], capacity) : min((int)p_now + 1, capacity);
}

// Where chunk c of head h keeps its partials in `parts`: its kv_lora latent sums from
// index * kv_lora, its (max, sum) pair at 2 * index past all heads' sums.
__device__ __forceinline__ size_t mla_part(int h, int c, int chunks) { return (size_t)h * chunks + c; }

// Dynamic shared memory of a block (mla_smem_bytes in executor/src/cuda/mla.rs), for rows of
// `width`: the q fragments (per 32-value block, per k step, per lane: four f16 pairs), the
// current row in f16, the weights in f16 ([head][row]), and each warp slice's max and sum per
// head.
struct MlaSmem {
    uint4* qf;
    u16* now_row;
    u16* p;
    float* wm;
    float* wl;
};
__device__ __forceinline__ MlaSmem mla_smem(int width) {
    extern __shared__ __align__(16) unsigned char mla_shared[];
    const int blocks = (width + 31) / 32;
    MlaSmem sm;
    sm.qf = (uint4*)mla_shared;
    sm.now_row = (u16*)(sm.qf + (size_t)blocks * 2 * WARP);
    sm.p = sm.now_row + ((width + 7) & ~7);
    sm.wm = (float*)(sm.p + MLA_TILE_HEADS * MLA_P_STRIDE);
    sm.wl = sm.wm + MLA_WARPS * MLA_TILE_HEADS;
    return sm;
}

// Block (head tile, chunk): heads h0 = 16 * blockIdx.x .., rows c * MLA_CHUNK .. of the
// attended ones. Lane (g = lane / 4, t = lane % 4) of warp w scores rows 16w + 8n + g
// (n = 0, 1) against heads g and g + 8 (their q fragments: values 32s + 8t .. + 7 of each
// 32-value block s, as in attention.cu), holding the scores of rows 16w + 8n + 2t, + 1; the
// weights then go through shared memory, and warp w takes the latent's 32-value blocks w,
// w + MLA_WARPS, ... of p v, lane g loading values 32b + 4g .. + 3 of rows 2t, 2t + 1, 2t + 8,
// 2t + 9 of each k step, so that output tile (b, e) holds value 32b + 4n + e in its column n.
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1)
    mla_attention_f16(const float* q_lat, const float* row_now, u16* cache, float* parts, const u32* pos,
                      const u32* slots, int n_heads, int kv_lora, int width, int capacity, float scale,
                      const int* cells, int cells_stride) {
    overlap_with_neighbours();
    if (cells) cells += (size_t)blockIdx.z * cells_stride;
    if (slots && slots[blockIdx.z] != PAD_SLOT) cache += (size_t)slots[blockIdx.z] * capacity * width;
    const MlaSmem sm = mla_smem(width);
    const int h0 = blockIdx.x * MLA_TILE_HEADS, c = blockIdx.y, chunks = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    q_lat += (size_t)blockIdx.z * n_heads * width;
    parts += (size_t)blockIdx.z * n_heads * chunks * (kv_lora + 2);
    const u32 p_now = pos[blockIdx.z];
    const int n_ctx = mla_attended(cells, p_now, capacity);
    const int now = row_now && p_now < (u32)capacity ? (int)p_now : -1;
    const bool writer = blockIdx.x == 0 && c == 0 && now >= 0;
    if (c * MLA_CHUNK >= n_ctx && !writer) return;
    const int blocks = (width + 31) / 32;
    if (row_now) {
        for (int d = threadIdx.x; d < width; d += MLA_THREADS) {
            const u16 r = f32_to_f16(row_now[d]);
            sm.now_row[d] = r;
            if (writer) cache[(size_t)now * width + d] = r;
        }
    }
    // fragment (b, k step j, lane l), pair i: head g + 8 (i % 2), values 32b + 8t + 4j + 2 (i / 2)
    // and the next (zero past the heads and the row)
    for (int f = threadIdx.x; f < blocks * 2 * WARP; f += MLA_THREADS) {
        const int b = f / (2 * WARP), j = (f / WARP) % 2, l = f % WARP;
        u32 pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int h = h0 + (l >> 2) + 8 * (i & 1), d = 32 * b + 8 * (l & 3) + 4 * j + 2 * (i >> 1);
            const bool in = h < n_heads && d < width;
            const float* qr = q_lat + (size_t)min(h, n_heads - 1) * width;
            pr[i] = in ? f16_pair(qr[d], qr[d + 1]) : 0u;
        }
        sm.qf[f] = make_uint4(pr[0], pr[1], pr[2], pr[3]);
    }
    __syncthreads();
    const int i0 = c * MLA_CHUNK, n = min(MLA_CHUNK, n_ctx - i0);
    if (n <= 0) return;
    const auto row_of = [&](int i) -> const u16* {
        const int p = mla_position(cells, i0 + min(i, n - 1));
        return p == now ? sm.now_row : cache + (size_t)p * width;
    };
    const float neg_inf = -__int_as_float(0x7f800000);
    const int slices = (n + 15) / 16;

    // scores of the warp's slice
    float sc[2][4];
    if (warp < slices) {
        const u16* kr[2] = {row_of(16 * warp + g), row_of(16 * warp + 8 + g)};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int x = 0; x < 4; ++x) sc[nt][x] = 0.f;
        for (int b0 = 0; b0 < blocks; b0 += MLA_AHEAD) {
            uint4 kw[2][MLA_AHEAD];
#pragma unroll
            for (int u = 0; u < MLA_AHEAD; ++u)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) kw[nt][u] = f16x8_at(kr[nt], 32 * (b0 + u) + 8 * t, width);
#pragma unroll
            for (int u = 0; u < MLA_AHEAD; ++u) {
                if (b0 + u >= blocks) break;
                const uint4 qa = sm.qf[((b0 + u) * 2) * WARP + lane], qb = sm.qf[((b0 + u) * 2 + 1) * WARP + lane];
                const u32 fa[4] = {qa.x, qa.y, qa.z, qa.w}, fb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    mma_f16(sc[nt], fa, kw[nt][u].x, kw[nt][u].y);
                    mma_f16(sc[nt], fb, kw[nt][u].z, kw[nt][u].w);
                }
            }
        }
        float mx[2] = {neg_inf, neg_inf};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) scale_masked(sc[nt], 16 * warp + 8 * nt + 2 * t, n, scale, mx);
        quad_max(mx);
        if (t == 0) {
            sm.wm[warp * MLA_TILE_HEADS + g] = mx[0];
            sm.wm[warp * MLA_TILE_HEADS + g + 8] = mx[1];
        }
    }
    __syncthreads();
    // the weights against the chunk's max, narrowed, and the slice's sums: the thread's in
    // (n, x) order, then lanes t ^ 1 and t ^ 2
    if (warp < slices) {
        float m[2] = {sm.wm[g], sm.wm[g + 8]};
        for (int w = 1; w < slices; ++w) {
            m[0] = fmaxf(m[0], sm.wm[w * MLA_TILE_HEADS + g]);
            m[1] = fmaxf(m[1], sm.wm[w * MLA_TILE_HEADS + g + 8]);
        }
        float l[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            float p[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                p[x] = sc[nt][x] == neg_inf ? 0.f : round_f16(expf(sc[nt][x] - m[x >> 1]));
                l[x >> 1] += p[x];
            }
            const int col = 16 * warp + 8 * nt + 2 * t;
            *(u32*)&sm.p[g * MLA_P_STRIDE + col] = f16_pair(p[0], p[1]);
            *(u32*)&sm.p[(g + 8) * MLA_P_STRIDE + col] = f16_pair(p[2], p[3]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
            l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
        }
        if (t == 0) {
            sm.wl[warp * MLA_TILE_HEADS + g] = l[0];
            sm.wl[warp * MLA_TILE_HEADS + g + 8] = l[1];
        }
    }
    __syncthreads();

    // o = p v, the warp's 32-value blocks of the latent
    const size_t sums = (size_t)n_heads * chunks * kv_lora;
    const int lat_blocks = (kv_lora + 31) / 32;
    for (int b = warp; b < lat_blocks; b += MLA_WARPS) {
        const int d = 32 * b + 4 * g;
        float o[4][4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int x = 0; x < 4; ++x) o[e][x] = 0.f;
        // every k step's pieces first (rows 2t, 2t + 1, 2t + 8, 2t + 9 of it), so the reads
        // overlap
        uint2 vv[MLA_WARPS][4];
#pragma unroll
        for (int kk = 0; kk < MLA_WARPS; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u16* vr = row_of(16 * kk + 2 * t + (i & 1) + 8 * (i >> 1));
                vv[kk][i] = kk < slices && d < kv_lora ? *(const uint2*)(vr + d) : make_uint2(0u, 0u);
            }
#pragma unroll
        for (int kk = 0; kk < MLA_WARPS; ++kk) {
            if (kk >= slices) break;
            const int col = 16 * kk + 2 * t;
            const u32 a[4] = {*(const u32*)&sm.p[g * MLA_P_STRIDE + col], *(const u32*)&sm.p[(g + 8) * MLA_P_STRIDE + col],
                              *(const u32*)&sm.p[g * MLA_P_STRIDE + col + 8],
                              *(const u32*)&sm.p[(g + 8) * MLA_P_STRIDE + col + 8]};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 sel = e & 1 ? 0x7632u : 0x5410u;
                const u32 b0 = __byte_perm(e < 2 ? vv[kk][0].x : vv[kk][0].y, e < 2 ? vv[kk][1].x : vv[kk][1].y, sel);
                const u32 b1 = __byte_perm(e < 2 ? vv[kk][2].x : vv[kk][2].y, e < 2 ? vv[kk][3].x : vv[kk][3].y, sel);
                mma_f16(o[e], a, b0, b1);
            }
        }
        // column n of tile e is value 32b + 4n + e; this lane holds columns 2t and 2t + 1
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int h = h0 + g + 8 * (x >> 1), v = 32 * b + 8 * t + 4 * (x & 1) + e;
                if (h < n_heads && v < kv_lora) parts[mla_part(h, c, chunks) * kv_lora + v] = o[e][x];
            }
    }
    if (threadIdx.x < MLA_TILE_HEADS && h0 + (int)threadIdx.x < n_heads) {
        const int j = threadIdx.x;
        float m = sm.wm[j], l = sm.wl[j];
        for (int w = 1; w < slices; ++w) {
            m = fmaxf(m, sm.wm[w * MLA_TILE_HEADS + j]);
            l = __fadd_rn(l, sm.wl[w * MLA_TILE_HEADS + j]);
        }
        const size_t at = mla_part(h0 + j, c, chunks);
        parts[sums + 2 * at] = m;
        parts[sums + 2 * at + 1] = l;
    }
}

// Block per head (and per row, grid y): the head's chunk partials merged in chunk order into
// out (n_heads rows of kv_lora a token row), `chunks` as the split's grid had them.
extern "C" __global__ void __launch_bounds__(MLA_THREADS)
    mla_merge_f16(const float* parts, float* out, const u32* pos, int n_heads, int kv_lora, int capacity,
                  const int* cells, int cells_stride, int chunks) {
    overlap_with_neighbours();
    if (cells) cells += (size_t)blockIdx.y * cells_stride;
    const int h = blockIdx.x;
    parts += (size_t)blockIdx.y * n_heads * chunks * (kv_lora + 2);
    out += (size_t)blockIdx.y * n_heads * kv_lora;
    const int used = (mla_attended(cells, pos[blockIdx.y], capacity) + MLA_CHUNK - 1) / MLA_CHUNK;
    const size_t sums = (size_t)n_heads * chunks * kv_lora;
    for (int d = threadIdx.x; d < kv_lora; d += MLA_THREADS) {
        const Merged run = merge_in_order(used, [&](int c) -> Merged {
            const size_t at = mla_part(h, c, chunks);
            return {parts[sums + 2 * at], parts[sums + 2 * at + 1], parts[at * kv_lora + d]};
        });
        out[(size_t)h * kv_lora + d] = __fdiv_rn(run.o, run.l);
    }
}

// cache[(pos[0] + r) * width + d] = f16(rows[r * width + d]) for the n values of the rows, or
// with `slots` row r at pos[r] of slot slots[r]'s cache (`capacity` rows from slot * capacity
// on; a pad row's is not written); nothing past the capacity.
extern "C" __global__ void mla_store_rows_f16(const float* rows, u16* cache, const u32* pos, const u32* slots,
                                              int width, int n, int capacity) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int r = i / width;
    const u32 p = slots ? pos[r] : pos[0] + (u32)r;
    if (p >= (u32)capacity || (slots && slots[r] == PAD_SLOT)) return;
    const size_t base = slots ? (size_t)slots[r] * capacity * width : 0;
    cache[base + (size_t)p * width + i % width] = f32_to_f16(rows[i]);
}

// out[(h * rows + r) * len + i] = f16(x[r * row_stride + h * head_stride + i]) for the `rows`
// token rows and `heads` heads of len values.
extern "C" __global__ void mla_heads_f16(const float* x, int row_stride, int head_stride, int len, int rows,
                                         int heads, u16* out) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= heads * rows * len) return;
    const int h = i / (rows * len), r = i / len % rows;
    out[i] = f32_to_f16(x[(size_t)r * row_stride + (size_t)h * head_stride + i % len]);
}

// out[(h * rows + r) * len + i] = x[r * row_stride + h * head_stride + i]: mla_heads_f16's
// head-major blocks in f32 (a batched decode step's per-head products, expert-mode matvecs
// over slots h * rows + r).
extern "C" __global__ void mla_heads_gather_f32(const float* x, int row_stride, int head_stride, int len, int rows,
                                                int heads, float* out) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= heads * rows * len) return;
    const int h = i / (rows * len), r = i / len % rows;
    out[i] = x[(size_t)r * row_stride + (size_t)h * head_stride + i % len];
}

// out[r * row_stride + h * head_stride + i] = y[(h * rows + r) * len + i]: mla_heads_f16's
// layout back.
extern "C" __global__ void mla_heads_f32(const float* y, int len, int rows, int heads, float* out, int row_stride,
                                         int head_stride) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= heads * rows * len) return;
    const int h = i / (rows * len), r = i / len % rows;
    out[(size_t)r * row_stride + (size_t)h * head_stride + i % len] = y[i];
}
