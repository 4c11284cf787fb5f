// memra kernels: y = W x for decode, every weight dtype, for one activation row (matvec_*) or
// a batch of rows (matvec_rows8_*: rows of several sequences of a batched decode step). A
// persistent grid (a few blocks per SM) splits the weight rows into contiguous runs of work
// items (4 rows); each block walks its run in rounds of items, and its warps take the (item,
// chunk) pieces of work of a round in turn, so every warp streams the rows of one item over
// one chunk at a time whatever the chunk count. A batched launch gives each run one block per
// tile of MATVEC_TILE activation rows, neighbours in the grid so they meet the run's weights
// in L2 together; a warp loads each weight piece once and dots it with every row of its tile.
// A plain f32 product of few rows (matvec_thin_f32) gives each (row, chunk) piece a warp of its
// own instead, with the same per-row bits.
//
// Quantized weights multiply an 8-bit copy of x, made once per block in shared memory before
// the rows start: per 32 values (q8_0, q4_0, q4_1) or 256 values (q4_k, q6_k) a scale
// d = amax / 127 and quants round(x * 127 / amax), half to even, exactly as the CPU backend
// (executor/src/cpu/kernels/act.rs) quantizes, so both see the same activations. Weight quants
// then meet activation quants in __dp4a integer dots, exact, and only the scales are float.
// Float weights (f32, f16, bf16) multiply x itself, read through L1.
//
// Numerics contract (DESIGN.md "Numerics"): K is cut into `chunks` equal, block-aligned chunks
// (a power of two, at most 32). Inside a chunk every lane accumulates a fixed, chunk-relative
// set of elements in a fixed order, then the warp (or half-warp) sums the lanes with a fixed
// xor butterfly; the chunk values are then combined in a balanced binary tree. The activation
// quantization of a block depends on that block's values alone. So the bits of one chunk depend only on the
// chunk's weight bytes, its x values and its length (not on which warp or block computes it),
// a tensor-parallel rank with K/d columns and chunks/d chunks computes exactly one subtree of
// the 1-rank result, and tree_sum (reduce.cu) completes it bit for bit. A row of a batch
// takes exactly the lane partition, the per-lane order, the butterfly and the tree of a launch
// for that row alone (the tile only adds a loop over rows inside each lane's step), so its
// bits are those of matvec_* on it, whatever the batch and its place in it.
#include "common.cuh"
#include "route.cuh"

#define MATVEC_THREADS 512
#define MATVEC_WARPS (MATVEC_THREADS / WARP)
#define MATVEC_ROWS 4
#define MATVEC_ROUND 8
// activation rows of a batched launch's tile, and its items per round (the chunk values of a
// round take as much shared memory as MATVEC_ROUND items of one row, twice)
#define MATVEC_TILE 8
#define MATVEC_TILE_ROUND 2
#define MATVEC_MAX_CHUNKS 32
#define MATVEC_MAX_SEGS 3  // the fields of MatvecJob; must match MATVEC_MAX_SEGS in ops.rs
// quant bytes of each weight of its run a block asks L2 for before it starts
#define MATVEC_PREFETCH 16384

__device__ __forceinline__ void load8(const float* x, float* v) {
    float4 a = *(const float4*)x;
    float4 b = *(const float4*)(x + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}


// ---- activation quantization (shared memory): quants `q[K]`, then per block `scales` ----

// Quantizes x[0..K) into blocks of `B` values (32 or 256): q = round_half_even(x * id) with
// d = amax / 127 and id = 127 / amax (0 for an all-zero block). For B = 32, scale b is the pair
// (d, d * sum of the quants); for B = 256 it is d. Warp w takes blocks w, w + warps, ...; each
// lane 4 values per 32-block (8 lanes a block, 4 blocks per warp pass), or 8 per 256-block.
template <int B>
__device__ void quantize_x(const float* x, int cols, i8* q, float* scales) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (B == 32) {
        const int nb = cols / 32, sub = lane >> 3, l = lane & 7;
        for (int b0 = 4 * warp; b0 < nb; b0 += 4 * MATVEC_WARPS) {
            const int b = b0 + sub;
            float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f);
            if (b < nb) v4 = *(const float4*)(x + 32 * b + 4 * l);
            const float v[4] = {v4.x, v4.y, v4.z, v4.w};
            const Q8Block qb = quantize_block32(v);
            if (b < nb) {
                ((u32*)q)[8 * b + l] = qb.quants;
                if (l == 0) ((float2*)scales)[b] = qb.pair;
            }
        }
    } else {
        for (int b = warp; b < cols / 256; b += MATVEC_WARPS) {
            float v[8];
            load8(x + 256 * b + 8 * lane, v);
            float amax = 0.f;
#pragma unroll
            for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(v[k]));
            amax = warp_max(amax);
            const float id = amax != 0.f ? __fdiv_rn(127.f, amax) : 0.f;
            u32 w[2] = {0, 0};
#pragma unroll
            for (int k = 0; k < 8; ++k) w[k / 4] |= (u32)(__float2int_rn(__fmul_rn(v[k], id)) & 255) << (8 * (k % 4));
            *(uint2*)(q + 256 * b + 8 * lane) = make_uint2(w[0], w[1]);
            if (lane == 0) scales[b] = __fdiv_rn(amax, 127.f);
        }
    }
}

// One value of rms_norm_f32's output: x by the row's scale (block_rms_scale), then by the
// norm's weight.
__device__ __forceinline__ float normed(float x, float scale, float w) { return __fmul_rn(__fmul_rn(x, scale), w); }

// rms_norm(x) * norm of one row of `cols` values into `out` (shared or device memory), with the
// bits of rms_norm_f32, for every thread of the block (all must call it); returns out.
__device__ const float* normed_row(const float* x, const float* norm, int cols, float eps, float* out) {
    const float scale = block_rms_scale(x, cols, eps);
#pragma unroll 8
    for (int i = threadIdx.x; i < cols; i += MATVEC_THREADS) out[i] = normed(x[i], scale, norm[i]);
    // the block's own writes, read by its other threads
    __syncthreads();
    return out;
}

// Blocks of 32 values one quantize_rows_q8 block quantizes: one quantize_x<32> pass of its
// warps (QUANTIZE_SLICE in matvec_mma.rs).
#define QUANTIZE_SLICE (4 * MATVEC_WARPS)

// The 8-bit copies of a batched step's activation rows for the tensor-core products
// (matvec_mma.cu), each 32-value block made by quantize_x<32> as a matvec block makes its own
// (the blocks are independent, so any split of a row gives the same bits): block (r, s) takes
// blocks QUANTIZE_SLICE s .. of row r of x (`cols` values) and writes their quants and their
// (d, d * sum) pairs where the row's copy at out + r * (cols + cols / 4) bytes has them (its
// quants, then its pairs). With `norm`, the row is rms_norm(x) * norm first (the bits of
// rms_norm_f32; every block of the row computes its scale over the whole row), the slice's
// values left in xn too and quantized from shared memory, in the same launch.
extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)
    quantize_rows_q8(const float* x, int cols, i8* out, const float* norm, float eps, float* xn) {
    __shared__ __align__(16) float part[32 * QUANTIZE_SLICE];
    i8* q = out + (size_t)blockIdx.x * (cols + cols / 4);
    float* scales = (float*)(q + cols);
    overlap_with_neighbours();
    const float* row = x + (size_t)blockIdx.x * cols;
    const int lo = 32 * QUANTIZE_SLICE * blockIdx.y, n = min(32 * QUANTIZE_SLICE, cols - lo);
    const float* values = row + lo;
    if (norm) {
        const float scale = block_rms_scale(row, cols, eps);
        float* xn_row = xn + (size_t)blockIdx.x * cols + lo;
        for (int i = threadIdx.x; i < n; i += MATVEC_THREADS) {
            const float v = normed(values[i], scale, norm[lo + i]);
            part[i] = v;
            xn_row[i] = v;
        }
        __syncthreads();
        values = part;
    }
    quantize_x<32>(values, n, q + lo, scales + lo / 16);
}

// The activations a quantized policy reads: quants and per-block scales in shared memory.
struct Act {
    const i8* q;
    const float* s;
    // the copy of activation row b of a tile, `stride` bytes after the one before it
    __device__ __forceinline__ Act row(int b, int stride) const {
        return {q + b * stride, (const float*)((const i8*)s + b * stride)};
    }
};

// The weight rows of one work item: quant rows (the whole row, except in planar layouts), and
// for planar layouts the scale rows. Rows past the segment's end repeat its last row, so that
// no load waits on a branch.
struct Rows {
    const u8* w;     // the item's first row
    const u8* s;     // its first scale row (planar layouts)
    size_t rb, sb;   // bytes per row in each plane
    int last;        // the item's last row that exists, 0-based
    __device__ __forceinline__ const u8* quants(int r) const { return w + (size_t)min(r, last) * rb; }
    __device__ __forceinline__ const u8* scales(int r) const { return s + (size_t)min(r, last) * sb; }
};

// ---- float weights: lane l takes 8-value groups l, l + 32, ... (or single values when the
// chunk length is not a multiple of 8 or shorter than a group per lane, so that more lanes
// have work); the choice depends on the chunk length alone ----

struct F32 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)cols * 4; }
    static __device__ __forceinline__ void widen8(const u8* p, float* w) {
        load8((const float*)p, w);
    }
    static __device__ __forceinline__ float one(const u8* row, int i) { return deq_f32({row, nullptr}, i); }
};

struct F16 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)cols * 2; }
    static __device__ __forceinline__ void widen8(const u8* p, float* w) {
        uint4 v = *(const uint4*)p;
        u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[2 * k] = f16_to_f32((u16)(u[k] & 0xffff));
            w[2 * k + 1] = f16_to_f32((u16)(u[k] >> 16));
        }
    }
    static __device__ __forceinline__ float one(const u8* row, int i) { return deq_f16({row, nullptr}, i); }
};

struct BF16 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)cols * 2; }
    static __device__ __forceinline__ void widen8(const u8* p, float* w) {
        uint4 v = *(const uint4*)p;
        u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[2 * k] = __uint_as_float(u[k] << 16);
            w[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ float one(const u8* row, int i) { return deq_bf16({row, nullptr}, i); }
};

// Whole-row layouts (float, k-quants): every lane takes all four rows of a work item.
#define WHOLE_ROW_POINTERS(rw, row)                                                            \
    const u8* row[MATVEC_ROWS];                                                                \
    _Pragma("unroll") for (int r = 0; r < MATVEC_ROWS; ++r) row[r] = rw.quants(r)

template <class T>
struct FloatPolicy {
    static constexpr int ACT_BLOCK = 0, SPLIT = 0;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return T::row_bytes(cols); }
    static __device__ __forceinline__ size_t scale_row_bytes(int) { return 0; }
    // acc[b * MATVEC_ROWS + r]: weight row r against activation row b of the tile's nb
    template <int NB>
    static __device__ __forceinline__ void lane_chunk(const Rows& rw, const float* x, int x_stride, Act, int, int nb, int c0, int len, int lane, float* acc) {
        WHOLE_ROW_POINTERS(rw, row);
        const int esize = (int)T::row_bytes(1);
        if (len % 8 == 0 && len >= 8 * WARP) {
            // one pass keeps 4 rows x 16 bytes in flight per lane within 64 registers
#pragma unroll 1
            for (int g = lane; g < len / 8; g += WARP) {
                const int e = c0 + 8 * g;
                float v[8];
                if (NB == 1) {
                    load8(x + e, v);
#pragma unroll
                    for (int r = 0; r < MATVEC_ROWS; ++r) {
                        float w[8];
                        T::widen8(row[r] + (size_t)e * esize, w);
#pragma unroll
                        for (int k = 0; k < 8; ++k) acc[r] = fmaf(w[k], v[k], acc[r]);
                    }
                } else {
                    // a tile: the 4 rows' weights once, then each activation row once
                    float w[MATVEC_ROWS][8];
#pragma unroll
                    for (int r = 0; r < MATVEC_ROWS; ++r) T::widen8(row[r] + (size_t)e * esize, w[r]);
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        if (b >= nb) break;
                        load8(x + (size_t)b * x_stride + e, v);
#pragma unroll
                        for (int r = 0; r < MATVEC_ROWS; ++r)
#pragma unroll
                            for (int k = 0; k < 8; ++k) acc[b * MATVEC_ROWS + r] = fmaf(w[r][k], v[k], acc[b * MATVEC_ROWS + r]);
                    }
                }
            }
        } else {
            for (int e = lane; e < len; e += WARP) {
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    if (NB > 1 && b >= nb) break;
                    const float v = x[(size_t)b * x_stride + c0 + e];
#pragma unroll
                    for (int r = 0; r < MATVEC_ROWS; ++r) acc[b * MATVEC_ROWS + r] = fmaf(T::one(row[r], c0 + e), v, acc[b * MATVEC_ROWS + r]);
                }
            }
        }
    }
};

// ---- 32-value blocks, stored in planes (DeviceWeight::upload, executor/src/cuda/ops.rs): all
// of a matrix's quant bytes, QS per block, in (row, block) order, then all its scale bytes, S
// per block, in the same order. A row's quants are 16-byte aligned and contiguous, so a lane
// loads 16 quant bytes (a "piece": one q4 block, half a q8_0 block) at once. Half-warp h takes
// rows h and h + 2 of a work item, and lane t of the half takes pieces t, t + 16, ... of the
// chunk in each, adding (d_w * d_x) * its dot per piece; q4_1 also adds m_w * (d_x * sum of
// the block's activation quants) per block. A chunk of fewer than sixteen pieces (K < 4096 for
// q4, 2048 for q8_0) can take matvec_l8_* or matvec_l4_*: its pieces go to the first lanes of a
// group of 8 or 4, and the half-warp takes 2 or 4 chunks at once, one a group, instead of
// leaving most lanes idle (lanes_sum says why the bits stay).
// ----

// Four unsigned bytes of a (0..255) dotted with four signed bytes of b, plus c.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The high nibbles of the words of q dotted with the bytes of x, as 16 times their dot: each
// nibble stays in place (q & 0xf0f0f0f0), which saves the shift before the mask. The sum is
// exact (16 products of at most 240 x 128 in size) and a multiple of 16, so a caller's one
// arithmetic shift by 4 at the end gives the dot itself, negative or not.
#define HI_NIB 0xf0f0f0f0u

// 16 quant bytes = 32 values: low nibbles x[0..16), high nibbles x[16..32).
__device__ __forceinline__ int dot_nibbles(uint4 q, uint4 lo, uint4 hi) {
    int d = __dp4a((int)(q.x & NIB), (int)lo.x, 0);
    d = __dp4a((int)(q.y & NIB), (int)lo.y, d);
    d = __dp4a((int)(q.z & NIB), (int)lo.z, d);
    d = __dp4a((int)(q.w & NIB), (int)lo.w, d);
    int h = dp4a_us(q.x & HI_NIB, (int)hi.x, 0);
    h = dp4a_us(q.y & HI_NIB, (int)hi.y, h);
    h = dp4a_us(q.z & HI_NIB, (int)hi.z, h);
    h = dp4a_us(q.w & HI_NIB, (int)hi.w, h);
    return d + (h >> 4);
}

__device__ __forceinline__ int dot_bytes(uint4 q, uint4 x) {
    int d = __dp4a((int)q.x, (int)x.x, 0);
    d = __dp4a((int)q.y, (int)x.y, d);
    d = __dp4a((int)q.z, (int)x.z, d);
    return __dp4a((int)q.w, (int)x.w, d);
}

__device__ __forceinline__ int sum_bytes(uint4 x) { return dot_bytes(make_uint4(ONES, ONES, ONES, ONES), x); }

// The block kinds: quant bytes and scale bytes per block, and a piece's contribution.
struct PQ8_0 {
    static constexpr int QS = 32, S = 2;
    // piece p is half h = p % 2 of block p / 2: its quants meet activation quants 16p ..
    static __device__ __forceinline__ float piece(uint4 q, u32 sc, Act a, int p, float acc) {
        const uint4 x = *(const uint4*)(a.q + 16 * p);
        return fmaf(f16_to_f32((u16)sc) * a.s[2 * (p >> 1)], int_to_f32(dot_bytes(q, x)), acc);
    }
};

template <bool MIN>
struct PQ4 {
    static constexpr int QS = 16, S = MIN ? 4 : 2;
    // piece b is block b
    static __device__ __forceinline__ float piece(uint4 q, u32 sc, Act a, int b, float acc) {
        const uint4 lo = *(const uint4*)(a.q + 32 * b), hi = *(const uint4*)(a.q + 32 * b + 16);
        const float2 ds = *(const float2*)(a.s + 2 * b);
        if (MIN) {
            acc = fmaf(f16_to_f32((u16)(sc & 0xffff)) * ds.x, int_to_f32(dot_nibbles(q, lo, hi)), acc);
            return fmaf(f16_to_f32((u16)(sc >> 16)), ds.y, acc);
        }
        // q4_0 quants carry an offset of 8: subtract it through the activation sum, exactly
        const int off = 8 * (sum_bytes(lo) + sum_bytes(hi));
        return fmaf(f16_to_f32((u16)sc) * ds.x, int_to_f32(dot_nibbles(q, lo, hi) - off), acc);
    }
};

template <class B>
struct Planar {
    static constexpr int ACT_BLOCK = 32, SPLIT = 1;
    static constexpr int PIECES = B::QS / 16;
    // pieces one lane loads before it multiplies, per row
    static constexpr int DEPTH = 2;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * B::QS; }
    static __device__ __forceinline__ size_t scale_row_bytes(int cols) { return (size_t)(cols / 32) * B::S; }
    static __device__ __forceinline__ u32 scale(const u8* srow, int b) {
        return B::S == 4 ? *(const u32*)(srow + 4 * b) : (u32)ld_u16(srow + 2 * b);
    }
    // acc[b * 2 + i]: row 2i + (lane / 16) against activation row b of the tile's nb; lane t of
    // its chunk's group of LANES (matvec_run gives each group its chunk's c0) takes pieces t,
    // t + LANES, ... (a chunk of fewer than sixteen pieces: piece t alone)
    template <int NB, int LANES>
    static __device__ __forceinline__ void lane_chunk(const Rows& rw, Act act, int a_stride, int nb, int c0, int len, int lane, float* acc) {
        const int h = lane >> 4, t = lane & (LANES - 1);
        const int p0 = (c0 >> 5) * PIECES, np = (len >> 5) * PIECES;
        const u8* q[MATVEC_ROWS / 2];
        const u8* s[MATVEC_ROWS / 2];
#pragma unroll
        for (int i = 0; i < MATVEC_ROWS / 2; ++i) {
            q[i] = rw.quants(2 * i + h) + (size_t)p0 * 16;
            s[i] = rw.scales(2 * i + h);
        }
        for (int p = t; p < np; p += LANES * DEPTH) {
            uint4 w[DEPTH][MATVEC_ROWS / 2];
            u32 sc[DEPTH][MATVEC_ROWS / 2];
#pragma unroll
            for (int u = 0; u < DEPTH; ++u)
#pragma unroll
                for (int i = 0; i < MATVEC_ROWS / 2; ++i)
                    if (p + LANES * u < np) {
                        w[u][i] = *(const uint4*)(q[i] + (size_t)(p + LANES * u) * 16);
                        sc[u][i] = scale(s[i], (p0 + p + LANES * u) / PIECES);
                    }
#pragma unroll
            for (int u = 0; u < DEPTH; ++u)
                if (p + LANES * u < np) {
                    // activation row outermost: its quants are read once for both weight rows
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        if (NB > 1 && b >= nb) break;
#pragma unroll
                        for (int i = 0; i < MATVEC_ROWS / 2; ++i)
                            acc[b * 2 + i] = B::piece(w[u][i], sc[u][i], act.row(b, a_stride), p0 + p + LANES * u, acc[b * 2 + i]);
                    }
                }
        }
    }
};
// ---- 256-value super-blocks: q4_k gives each eight or sixteen lanes (by the chunk length), q6_k sixteen ----

// The 6-bit scales and minimums of q4_k sub-blocks 2j and 2j + 1 (as q4k_scale_min in
// common.cuh), byte 0 the first and byte 1 the second, from the 12 scale bytes as three words,
// without a branch: sub-blocks 0..3 keep their bytes whole, 4..7 gather nibbles and top bits.
__device__ __forceinline__ void q4k_scale_min_pair(int j, uint3 s, u32* sc, u32* m) {
    const int sh = 16 * (j & 1);
    const u32 a = (s.x >> sh) & 0xffff, b = (s.y >> sh) & 0xffff, c = (s.z >> sh) & 0xffff;
    if (j < 2) {
        *sc = a & 0x3f3f;
        *m = b & 0x3f3f;
    } else {
        *sc = (c & 0x0f0f) | ((a >> 2) & 0x3030);
        *m = ((c >> 4) & 0x0f0f) | ((b >> 2) & 0x3030);
    }
}

// The W words of qs bytes or activation quants a q4_k lane takes at p (16-byte aligned).
template <int W>
__device__ __forceinline__ void load_words(const i8* p, u32* out);
template <>
__device__ __forceinline__ void load_words<2>(const i8* p, u32* out) {
    const uint2 v = *(const uint2*)p;
    out[0] = v.x, out[1] = v.y;
}
template <>
__device__ __forceinline__ void load_words<4>(const i8* p, u32* out) {
    const uint4 v = *(const uint4*)p;
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}
struct Q4_K {
    static constexpr int ACT_BLOCK = 256, SPLIT = 0;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 256) * 144; }
    static __device__ __forceinline__ size_t scale_row_bytes(int) { return 0; }
    // L lanes per super-block, 32 / L super-blocks per warp pass: lane t takes super-blocks
    // t / L, t / L + 32 / L, ... of the chunk, and in each the 4W qs bytes 32j + 4Wq .. +4W
    // (u = t % L, j = u / (L / 4), q = u % (L / 4)): 4W values of sub-block 2j (low nibbles)
    // and 4W of sub-block 2j + 1 (high nibbles); it adds
    // (d * d_x) * (sc0 * dot0 + sc1 * dot1) - (dmin * d_x) * (m0 * sum0 + m1 * sum1)
    template <int L, int NB>
    static __device__ __forceinline__ void sweep(const Rows& rw, Act act, int a_stride, int nb, int c0, int len, int lane, float* acc) {
        constexpr int W = 32 / L;
        WHOLE_ROW_POINTERS(rw, row);
        const int u = lane % L, j = u / (L / 4), at = 32 * j + 4 * W * (u % (L / 4));
        for (int b = (c0 >> 8) + lane / L; b < (c0 + len) >> 8; b += 32 / L) {
            // the 4 rows' quants, scales and minimums once, then each activation row once
            u32 qv[MATVEC_ROWS][W];
            float d[MATVEC_ROWS], dmin[MATVEC_ROWS];
            int sc0[MATVEC_ROWS], sc1[MATVEC_ROWS], m0[MATVEC_ROWS], m1[MATVEC_ROWS];
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const u8* blk = row[r] + (size_t)b * 144;
                load_words<W>((const i8*)blk + 16 + at, qv[r]);
                const u32 dm = *(const u32*)blk;
                const uint3 sw = *(const uint3*)(blk + 4);
                u32 sc, m;
                q4k_scale_min_pair(j, sw, &sc, &m);
                sc0[r] = sc & 0xff, sc1[r] = sc >> 8, m0[r] = m & 0xff, m1[r] = m >> 8;
                d[r] = f16_to_f32((u16)(dm & 0xffff));
                dmin[r] = f16_to_f32((u16)(dm >> 16));
            }
#pragma unroll
            for (int x = 0; x < NB; ++x) {
                if (NB > 1 && x >= nb) break;
                const Act a = act.row(x, a_stride);
                u32 xlo[W], xhi[W];
                load_words<W>(a.q + 256 * b + 32 * j + at, xlo);
                load_words<W>(a.q + 256 * b + 32 * j + at + 32, xhi);
                const float dx = a.s[b];
                int s0 = 0, s1 = 0;
#pragma unroll
                for (int w = 0; w < W; ++w) s0 = __dp4a(ONES, (int)xlo[w], s0), s1 = __dp4a(ONES, (int)xhi[w], s1);
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r) {
                    int d0 = 0, d1 = 0;
#pragma unroll
                    for (int w = 0; w < W; ++w) {
                        d0 = __dp4a((int)(qv[r][w] & NIB), (int)xlo[w], d0);
                        d1 = dp4a_us(qv[r][w] & HI_NIB, (int)xhi[w], d1);
                    }
                    d1 >>= 4;
                    // |sc0 * d0 + sc1 * d1| <= 2 * 63 * 16 * 15 * 127 < 2^22: int_to_f32 is exact
                    float& o = acc[x * MATVEC_ROWS + r];
                    o = fmaf(d[r] * dx, int_to_f32(sc0[r] * d0 + sc1[r] * d1), o);
                    o = fmaf(-dmin[r] * dx, int_to_f32(m0[r] * s0 + m1[r] * s1), o);
                }
            }
        }
    }
    // chunks of three super-blocks or more: eight lanes each (four at a time; 6144 columns in
    // 8 chunks take one pass, where sixteen lanes each would leave half the warp idle in the
    // second); shorter ones sixteen (two at a time)
    template <int NB>
    static __device__ __forceinline__ void lane_chunk(const Rows& rw, const float*, int, Act act, int a_stride, int nb, int c0, int len, int lane, float* acc) {
        if (len >= 3 * 256) {
            sweep<8, NB>(rw, act, a_stride, nb, c0, len, lane, acc);
        } else {
            sweep<16, NB>(rw, act, a_stride, nb, c0, len, lane, acc);
        }
    }
};

struct Q6_K {
    static constexpr int ACT_BLOCK = 256, SPLIT = 0;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 256) * 210; }
    static __device__ __forceinline__ size_t scale_row_bytes(int) { return 0; }
    // lane t of 16 takes half n = t / 8 and positions l0 .. l0 + 3 (l0 = 4 (t % 8)) of it:
    // values 128n + 32k + l for k = 0..3, each group of four under one scale; the offset 32
    // of the 6-bit quants comes off through the activation sums, exactly
    template <int NB>
    static __device__ __forceinline__ void lane_chunk(const Rows& rw, const float*, int, Act act, int a_stride, int nb, int c0, int len, int lane, float* acc) {
        WHOLE_ROW_POINTERS(rw, row);
        const int t = lane & 15, n = t >> 3, l0 = 4 * (t & 7);
        for (int b = (c0 >> 8) + (lane >> 4); b < (c0 + len) >> 8; b += 2) {
            // the 4 rows' quants and scales once, then each activation row once
            u32 q[MATVEC_ROWS][4];
            int sc[MATVEC_ROWS][4];
            float d[MATVEC_ROWS];
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const u8* blk = row[r] + (size_t)b * 210;
                const u32 qa = ld_u32_a2(blk + 64 * n + l0);
                const u32 qb = ld_u32_a2(blk + 64 * n + 32 + l0);
                const u32 qh = ld_u32_a2(blk + 128 + 32 * n + l0);
                const i8* s = (const i8*)(blk + 192 + 8 * n + l0 / 16);
                q[r][0] = (qa & NIB) | ((qh << 4) & 0x30303030u);
                q[r][1] = (qb & NIB) | ((qh << 2) & 0x30303030u);
                q[r][2] = ((qa >> 4) & NIB) | (qh & 0x30303030u);
                q[r][3] = ((qb >> 4) & NIB) | ((qh >> 2) & 0x30303030u);
#pragma unroll
                for (int k = 0; k < 4; ++k) sc[r][k] = (int)s[2 * k];
                d[r] = f16_to_f32(ld_u16(blk + 208));
            }
#pragma unroll
            for (int x = 0; x < NB; ++x) {
                if (NB > 1 && x >= nb) break;
                const Act a = act.row(x, a_stride);
                int xk[4], off[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    xk[k] = *(const int*)(a.q + 256 * b + 128 * n + 32 * k + l0);
                    off[k] = 32 * __dp4a(ONES, xk[k], 0);
                }
                const float dx = a.s[b];
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r) {
                    int isum = 0;
#pragma unroll
                    for (int k = 0; k < 4; ++k) isum += sc[r][k] * (__dp4a((int)q[r][k], xk[k], 0) - off[k]);
                    // |isum| can reach 2^23 here: the exact conversion, not int_to_f32
                    acc[x * MATVEC_ROWS + r] = fmaf(d[r] * dx, __int2float_rn(isum), acc[x * MATVEC_ROWS + r]);
                }
            }
        }
    }
};

// What one launch computes. `segs` weights (1..3) of the same dtype and K share x: segment s
// has rows[s] rows and writes y[s]; together they are one matrix whose quads the persistent
// grid splits (q/k/v in one launch). With `residual` set (one segment), y[0][r] = residual[r] +
// (W x)[r], the add after a row-parallel matvec (y may alias residual). With `swiglu` (two
// segments of equal rows, gate and up), a work item takes a quad of both and the launch
// writes y[0][r] = swiglu_limited(gate[r], up[r], limit) (limit 0: no clamp). Every row's value is the same chunk tree as a
// launch of its weight alone, so fusing changes no bits; so does a norm folded into the launch.
struct MatvecJob {
    // segment fields one by one, not arrays: an array indexed by the segment at run time would
    // copy the whole job to local memory
    const u8 *w0, *w1, *w2;
    float *y0, *y1, *y2;
    int rows0, rows1, rows2;
    int segs;
    int cols;
    int chunks;
    int swiglu;
    float limit;
    const float* x;
    const float* residual;
    // with `norm` set, the launch multiplies rms_norm(x) * norm (block_rms_scale, the bits of
    // rms_norm_f32), which every block of matvec_run computes into shared memory at byte
    // `xn_offset` (matvec_thin_f32 normalizes each value as it reads it)
    const float* norm;
    float eps;
    int xn_offset;
    // expert mode (`experts` set; moe.cu picks them): grid row y takes pick p = t * k + s,
    // pick s of token row t (k = gridDim.y / token_rows picks a token row of `token_rows`, as
    // the router writes them): p = expert_order[y] where an order is given (moe_order_i32),
    // else slot-major, y = s * token_rows + t (one token row: p = y). Its slot is
    // s * token_rows + t. It computes matrix experts[p] - expert_first of each weight's stack
    // (expert_bytes apart), over x + slot * x_stride + t * x_row_stride into
    // y + slot * y_stride; a plain job multiplies each row by expert_weights[p] (the CPU's
    // matvec then scale), and writes -0.0 for an expert this rank does not hold
    // (kernels/moe.cu's combine contract)
    const int* experts;
    const int* expert_order;
    const float* expert_weights;
    long long expert_bytes;
    int expert_first;
    int expert_count;
    int x_stride;
    int y_stride;
    int token_rows;
    int x_row_stride;
    // activation rows (matvec_rows8_*): row b reads x + b * cols and writes y[s] + b * rows[s]
    // (residual + b * rows0); every other mode has one
    int batch;
};

// Segment s's fields.
__device__ __forceinline__ const u8* job_w(const MatvecJob j, int s) { return s == 0 ? j.w0 : s == 1 ? j.w1 : j.w2; }
__device__ __forceinline__ float* job_y(const MatvecJob j, int s) { return s == 0 ? j.y0 : s == 1 ? j.y1 : j.y2; }
__device__ __forceinline__ int job_rows(const MatvecJob j, int s) { return s == 0 ? j.rows0 : s == 1 ? j.rows1 : j.rows2; }

// The work items of the job's combined matrix: a swiglu item covers gate and up rows together.
__device__ __forceinline__ int job_items(const MatvecJob j) {
    int n = 0;
    for (int s = 0; s < (j.swiglu ? 1 : j.segs); ++s) n += (job_rows(j, s) + MATVEC_ROWS - 1) / MATVEC_ROWS;
    return n;
}

// Segment and first row of global item `g` (plain jobs; a swiglu job has segment 0 only).
__device__ __forceinline__ int job_seg(const MatvecJob j, int g, int* row0) {
    int s = 0;
    for (; s + 1 < j.segs && !j.swiglu; ++s) {
        const int n = (job_rows(j, s) + MATVEC_ROWS - 1) / MATVEC_ROWS;
        if (g < n) break;
        g -= n;
    }
    *row0 = g * MATVEC_ROWS;
    return s;
}

// Asks L2 for up to `bytes` bytes at `from` in one bulk prefetch, its ends rounded down to the
// instruction's 16-byte unit (so it never reaches past the end of a weight).
__device__ __forceinline__ void prefetch_l2(const u8* from, size_t bytes) {
#if __CUDA_ARCH__ >= 900
    const u64 a = (u64)from & ~15ull, e = ((u64)from + bytes) & ~15ull;
    if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((u32)(e - a)) : "memory");
#endif
}

// Prefetches the weight rows of items [i0, i1) to L2, up to MATVEC_PREFETCH quant bytes per
// weight, with their scale rows (planar layouts).
__device__ __noinline__ void prefetch_run(const MatvecJob j, int i0, int i1, size_t rb, size_t sb) {
    for (int g = i0; g < i1;) {
        int row0;
        const int s = job_seg(j, g, &row0);
        const int seg_rows = job_rows(j, s);
        const int n = min(i1 - g, (seg_rows - row0 + MATVEC_ROWS - 1) / MATVEC_ROWS);
        const int rows = min((int)(MATVEC_PREFETCH / rb) + 1, min(seg_rows, row0 + n * MATVEC_ROWS) - row0);
        for (int h = 0; h < (j.swiglu ? 2 : 1); ++h) {
            const u8* w = job_w(j, s + h);
            prefetch_l2(w + (size_t)row0 * rb, (size_t)rows * rb);
            if (sb) prefetch_l2(w + (size_t)seg_rows * rb + (size_t)row0 * sb, (size_t)rows * sb);
        }
        g += n;
    }
}

// Shared bytes of one activation row's 8-bit copy (quants, then scales), 16-byte aligned;
// matvec_act_bytes in matvec.rs is the same without the alignment.
template <class P>
__device__ __forceinline__ int act_row_bytes(int cols) {
    if (P::ACT_BLOCK == 0) return 0;
    const int bytes = cols + cols / P::ACT_BLOCK * (P::ACT_BLOCK == 32 ? 8 : 4);
    return (bytes + 15) & ~15;
}

// One block: quantize x (quantized policies), then the items of its run, a round at a time:
// warps take the round's (item, half, chunk) pieces of work in turn and leave each chunk value
// in shared memory; after a barrier, warp i combines item i's chunks in the tree.
// Two buffers of chunk values let the next round's work start while the tree reads the last
// round's: a buffer is written again only after the barrier that follows every warp's tree
// over it. With NB activation rows (a batched launch's tile), every piece of work and every
// tree is done for each row of the tile, with the one-row order.
template <class P, int NB, int LANES>
__device__ __forceinline__ void matvec_run(MatvecJob j) {
    constexpr int ROUND = NB == 1 ? MATVEC_ROUND : MATVEC_TILE_ROUND;
    extern __shared__ uint4 act_smem[];
    __shared__ float part[2][ROUND * MATVEC_ROWS * 2 * NB][MATVEC_MAX_CHUNKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cols = j.cols, chunks = j.chunks, halves = j.swiglu ? 2 : 1;
    const size_t rb = P::row_bytes(cols), sb = P::scale_row_bytes(cols);
    const int items = job_items(j);
    // a batched grid is runs x tiles, the tiles of a run neighbours
    const int tiles = NB == 1 ? 1 : (j.batch + NB - 1) / NB;
    const int run = NB == 1 ? blockIdx.x : blockIdx.x / tiles, tile = blockIdx.x - run * tiles;
    const int runs = NB == 1 ? gridDim.x : gridDim.x / tiles;
    // items x runs stays far below 2^32 (a run is a block of a grid of a few per SM), so the
    // split takes 32-bit divisions
    const int i0 = (int)((unsigned)items * (unsigned)run / (unsigned)runs);
    const int i1 = (int)((unsigned)items * (unsigned)(run + 1) / (unsigned)runs);
    const int nb = NB == 1 ? 1 : min(NB, j.batch - tile * NB);
    const int act_bytes = act_row_bytes<P>(cols);
    float expert_weight = 1.f;
    if (j.experts) {
        // the expert ids are the previous kernel's output: wait before the weights are known
        overlap_with_neighbours();
        const int k = gridDim.y / j.token_rows, y = blockIdx.y;
        const int pick = j.expert_order ? j.expert_order[y] : (y % j.token_rows) * k + y / j.token_rows;
        const int t = pick / k, slot = (pick - t * k) * j.token_rows + t;
        const int e = j.experts[pick] - j.expert_first;
        j.x += (size_t)slot * j.x_stride + (size_t)t * j.x_row_stride;
        j.y0 += (size_t)slot * j.y_stride;
        if (e < 0 || e >= j.expert_count) {
            if (!j.swiglu)
                for (int r = i0 * MATVEC_ROWS + threadIdx.x; r < min(i1 * MATVEC_ROWS, j.rows0); r += MATVEC_THREADS) j.y0[r] = -0.0f;
            return;
        }
        const size_t off = (size_t)e * (size_t)j.expert_bytes;
        j.w0 += off;
        if (j.swiglu) j.w1 += off;
        if (j.expert_weights) expert_weight = j.expert_weights[pick];
        if (threadIdx.x == 0) prefetch_run(j, i0, i1, rb, sb);
    } else {
        // the weights are constant: ask L2 for the run's first bytes while the previous kernel
        // finishes and x is quantized
        if (threadIdx.x == 0 && tile == 0) prefetch_run(j, i0, i1, rb, sb);
        // the weights are constant: only now does the block need the previous kernel's output
        overlap_with_neighbours();
    }
    // the tile's rows of x, `cols` apart, and their 8-bit copies, `act_bytes` apart
    const float* x = j.x + (size_t)tile * NB * cols;
    const Act act = {(const i8*)act_smem, (const float*)((const i8*)act_smem + cols)};
    if (NB == 1 && j.norm) {
        x = normed_row(j.x, j.norm, cols, j.eps, (float*)((u8*)act_smem + j.xn_offset));
    }
    if (P::ACT_BLOCK != 0) {
        for (int b = 0; b < nb; ++b) {
            const Act a = act.row(b, act_bytes);
            quantize_x<P::ACT_BLOCK>(x + (size_t)b * cols, cols, (i8*)a.q, (float*)a.s);
        }
        __syncthreads();
    }
    // SPLIT policies: a lane's value i belongs to row 2i + (lane / 16), summed over its group of
    // LANES lanes, whose chunk is the g-th of the `per` chunks a piece of work covers
    const int len = cols / chunks, per = LANES == 16 ? 1 : min(chunks, 16 / LANES);
    const int g = LANES == 16 ? 0 : (lane & 15) / LANES;
    constexpr int VALUES = P::SPLIT ? MATVEC_ROWS / 2 : MATVEC_ROWS;
    // chunks, per and halves are powers of two (halves 1 or 2): the pieces are indexed by
    // shifts and masks (for halves, shift and mask are both halves - 1)
    const int groups = chunks / per, group_shift = __ffs(groups) - 1, half_bit = halves - 1;
    int buf = 0;
    for (int round = i0; round < i1; round += ROUND, buf ^= 1) {
        const int ni = min(ROUND, i1 - round);
        for (int work = warp; work < ni * halves * groups; work += MATVEC_WARPS) {
            const int ih = work >> group_shift, c = (work & (groups - 1)) * per + g;
            const int item = ih >> half_bit, h = ih & half_bit;
            int row0;
            const int s = job_seg(j, round + item, &row0) + h;
            const int seg_rows = job_rows(j, s);
            const u8* w = job_w(j, s);
            const Rows rw = {w + (size_t)row0 * rb, w + (size_t)seg_rows * rb + (size_t)row0 * sb, rb, sb,
                             min(MATVEC_ROWS, seg_rows - row0) - 1};
            float acc[NB * VALUES];
#pragma unroll
            for (int r = 0; r < NB * VALUES; ++r) acc[r] = 0.f;
            if constexpr (P::SPLIT) {
                if (g < per) P::template lane_chunk<NB, LANES>(rw, act, act_bytes, nb, c * len, len, lane, acc);
            } else {
                P::template lane_chunk<NB>(rw, x, cols, act, act_bytes, nb, c * len, len, lane, acc);
            }
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                if (NB > 1 && b >= nb) break;
                float* at = &part[buf][(ih * NB + b) * MATVEC_ROWS][c];
#pragma unroll
                for (int r = 0; r < VALUES; ++r) {
                    if (P::SPLIT) {
                        const float v = lanes_sum(acc[b * VALUES + r], LANES);
                        if ((lane & (LANES - 1)) == 0 && g < per) at[(2 * r + (lane >> 4)) * MATVEC_MAX_CHUNKS] = v;
                    } else {
                        const float v = warp_sum(acc[b * VALUES + r]);
                        if (lane == 0) at[r * MATVEC_MAX_CHUNKS] = v;
                    }
                }
            }
        }
        __syncthreads();
        for (int task = warp; task < ni * nb; task += MATVEC_WARPS) {
            const int item = NB == 1 ? task : task / nb, b = task - item * nb;
            int row0;
            const int s = job_seg(j, round + item, &row0);
            const int seg_rows = job_rows(j, s), xrow = tile * NB + b;
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const int at = (item * halves * NB + b) * MATVEC_ROWS + r;
                const float total = chunk_tree(lane < chunks ? part[buf][at][lane] : 0.f, chunks);
                float out = total;
                if (j.swiglu) {
                    const float up = chunk_tree(lane < chunks ? part[buf][at + NB * MATVEC_ROWS][lane] : 0.f, chunks);
                    out = swiglu_limited(total, up, j.limit);
                }
                const int row = row0 + r;
                if (lane == 0 && row < seg_rows) {
                    if (j.residual) out = j.residual[(size_t)xrow * j.rows0 + row] + total;
                    if (j.expert_weights) out = total * expert_weight;
                    job_y(j, s)[(size_t)xrow * seg_rows + row] = out;
                }
            }
        }
    }
}

// matvec_thin_f32: the plain one-row f32 product of a matrix with few rows (mHC mixes, KDA
// gates, routers), whose items would leave most SMs idle: one block per THIN_WARPS / chunks
// rows, each warp one (row, chunk) piece, loads THIN_AHEAD groups ahead of the arithmetic. A
// lane takes FloatPolicy's elements in FloatPolicy's order, the warp and the chunk tree are the
// generic kernel's, and a norm gives each x value the generic kernel's bits (without a shared
// copy of the normalized x), so every row has the bits of matvec_f32.
#define THIN_WARPS 8
#define THIN_AHEAD 4
// The segment of row *r of the job's combined matrix; *r becomes the row within it.
__device__ __forceinline__ int thin_seg(const MatvecJob j, int* r) {
    if (j.segs > 1 && *r >= j.rows0) {
        *r -= j.rows0;
        if (j.segs > 2 && *r >= j.rows1) {
            *r -= j.rows1;
            return 2;
        }
        return 1;
    }
    return 0;
}
// A lane's THIN_AHEAD groups of 8 weights from group g0 of its chunk (p), a warp apart.
__device__ __forceinline__ void thin_round(const float* p, int g0, int groups, float (&w)[THIN_AHEAD][8]) {
#pragma unroll
    for (int u = 0; u < THIN_AHEAD; ++u)
        if (g0 + u * WARP < groups) load8(p + 8 * (g0 + u * WARP), w[u]);
}
__device__ __forceinline__ void thin_product(const MatvecJob& j) {
    __shared__ float part[THIN_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cols = j.cols, chunks = j.chunks, per_block = THIN_WARPS / chunks;
    const int rows = j.rows0 + (j.segs > 1 ? j.rows1 : 0) + (j.segs > 2 ? j.rows2 : 0);
    const int g = blockIdx.x * per_block + warp / chunks, c = warp - (warp / chunks) * chunks;
    // row g of the combined matrix: segment s, row r of it
    int r = g;
    const int s = thin_seg(j, &r);
    const float* row = (const float*)job_w(j, s) + (size_t)r * cols;
    // the weights are constant: ask L2 for this block's rows while the previous kernel finishes
    if (threadIdx.x == 0) {
        const int last = min(rows, (int)(blockIdx.x + 1) * per_block);
        for (int k = blockIdx.x * per_block; k < last; ++k) {
            int kr = k;
            const int ks = thin_seg(j, &kr);
            prefetch_l2(job_w(j, ks) + (size_t)kr * cols * 4, (size_t)cols * 4);
        }
    }
    // and this warp's first round of them, before waiting for the previous kernel's x
    const int len = cols / chunks, c0 = c * len, groups = len / 8;
    const bool grouped = len % 8 == 0 && len >= 8 * WARP;
    float w[THIN_AHEAD][8];
    if (grouped && g < rows) thin_round(row + c0, lane, groups, w);
    overlap_with_neighbours();
    // with a norm, each warp normalizes the x values of its own chunk as it reads them: the
    // generic kernel's expression for its shared copy, x * scale * norm, so the same bits
    const float scale = j.norm ? block_rms_scale<NORM_UNROLL_WIDE>(j.x, cols, j.eps) : 1.f;
    float acc = 0.f;
    if (g < rows) {
        if (grouped) {
            for (int g0 = lane; g0 < groups; g0 += THIN_AHEAD * WARP) {
                if (g0 != lane) thin_round(row + c0, g0, groups, w);
#pragma unroll
                for (int u = 0; u < THIN_AHEAD; ++u)
                    if (g0 + u * WARP < groups) {
                        const int e = c0 + 8 * (g0 + u * WARP);
                        float v[8];
                        load8(j.x + e, v);
                        if (j.norm) {
                            float n[8];
                            load8(j.norm + e, n);
#pragma unroll
                            for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(__fmul_rn(v[k], scale), n[k]);
                        }
#pragma unroll
                        for (int k = 0; k < 8; ++k) acc = fmaf(w[u][k], v[k], acc);
                    }
            }
        } else {
            for (int e = c0 + lane; e < c0 + len; e += WARP) {
                const float v = j.norm ? __fmul_rn(__fmul_rn(j.x[e], scale), j.norm[e]) : j.x[e];
                acc = fmaf(row[e], v, acc);
            }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (c == 0 && g < rows) {
        const float total = chunk_tree(lane < chunks ? part[warp + lane] : 0.f, chunks);
        if (lane == 0) job_y(j, s)[r] = total;
    }
}
extern "C" __global__ void __launch_bounds__(THIN_WARPS * WARP) matvec_thin_f32(const MatvecJob j) { thin_product(j); }

// moe_router_f32: a decode step's router, the logits as matvec_thin_f32 makes them (the FFN
// norm folded in), then the top-k (route.cuh) by the launch's last block to finish, from the
// logits every block left: the blocks count themselves in `done`, which the last one sets to
// zero again for the next launch. One launch where the router and its pick took two.
extern "C" __global__ void __launch_bounds__(THIN_WARPS * WARP)
    moe_router_f32(const MatvecJob j, const Route rt, int* done, int* ids, float* weights) {
    __shared__ float logits[MOE_MAX_EXPERTS];
    __shared__ bool last;
    thin_product(j);
    // every thread's logits reach the device before its block counts itself
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    // from L2, where the other blocks' logits are, not from this SM's L1
    for (int e = threadIdx.x; e < rt.n; e += blockDim.x) logits[e] = __ldcg(j.y0 + e);
    __syncthreads();
    if (threadIdx.x < WARP) route_row(logits, rt, ids, weights);
    if (threadIdx.x == 0) *done = 0;
}

// matvec_<dtype>: one activation row; matvec_rows8_<dtype>: tiles of MATVEC_TILE rows, one
// block per SM (the tile's accumulators need the registers); matvec_l8_<dtype> and
// matvec_l4_<dtype> (32-value blocks): one row whose chunks have at most 8 or 4 pieces, groups
// of 8 or 4 lanes a chunk.
#define MATVEC(name, P)                                                                        \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, 2) name(const MatvecJob job) { \
        matvec_run<P, 1, 16>(job);                                                             \
    }
#define MATVEC_GROUPED(name, P, L)                                                             \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, 2) name(const MatvecJob job) { \
        matvec_run<P, 1, L>(job);                                                              \
    }
#define MATVEC_ROWS8(name, P)                                                                  \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, 1) name(const MatvecJob job) { \
        matvec_run<P, MATVEC_TILE, 16>(job);                                                   \
    }

MATVEC(matvec_f32, FloatPolicy<F32>)
MATVEC(matvec_f16, FloatPolicy<F16>)
MATVEC(matvec_bf16, FloatPolicy<BF16>)
MATVEC(matvec_q8_0, Planar<PQ8_0>)
MATVEC(matvec_q4_0, Planar<PQ4<false>>)
MATVEC(matvec_q4_1, Planar<PQ4<true>>)
MATVEC(matvec_q4_k, Q4_K)
MATVEC(matvec_q6_k, Q6_K)
MATVEC_GROUPED(matvec_l8_q8_0, Planar<PQ8_0>, 8)
MATVEC_GROUPED(matvec_l8_q4_0, Planar<PQ4<false>>, 8)
MATVEC_GROUPED(matvec_l8_q4_1, Planar<PQ4<true>>, 8)
MATVEC_GROUPED(matvec_l4_q8_0, Planar<PQ8_0>, 4)
MATVEC_GROUPED(matvec_l4_q4_0, Planar<PQ4<false>>, 4)
MATVEC_GROUPED(matvec_l4_q4_1, Planar<PQ4<true>>, 4)
MATVEC_ROWS8(matvec_rows8_f32, FloatPolicy<F32>)
MATVEC_ROWS8(matvec_rows8_f16, FloatPolicy<F16>)
MATVEC_ROWS8(matvec_rows8_bf16, FloatPolicy<BF16>)
MATVEC_ROWS8(matvec_rows8_q8_0, Planar<PQ8_0>)
MATVEC_ROWS8(matvec_rows8_q4_0, Planar<PQ4<false>>)
MATVEC_ROWS8(matvec_rows8_q4_1, Planar<PQ4<true>>)
MATVEC_ROWS8(matvec_rows8_q4_k, Q4_K)
MATVEC_ROWS8(matvec_rows8_q6_k, Q6_K)
