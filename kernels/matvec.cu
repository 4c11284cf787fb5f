// memra kernels: y = W x for batch-1 decode, every weight dtype. A persistent grid (a few
// blocks per SM) splits the rows into contiguous runs of 4-row quads; each block walks its run
// in rounds of MATVEC_ROUND quads, and its warps take the (quad, chunk) items of a round in
// turn, so every warp streams 4 rows of one chunk at a time whatever the chunk count.
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
// set of elements in a fixed order, then the warp sums the lanes with a fixed xor butterfly; the
// chunk values are then combined in a balanced binary tree. The activation quantization of a
// block depends on that block's values alone. So the bits of one chunk depend only on the
// chunk's weight bytes, its x values and its length (not on which warp or block computes it),
// a tensor-parallel rank with K/d columns and chunks/d chunks computes exactly one subtree of
// the 1-rank result, and tree_sum (reduce.cu) completes it bit for bit.
#include "common.cuh"

#define MATVEC_THREADS 512
#define MATVEC_WARPS (MATVEC_THREADS / WARP)
#define MATVEC_ROWS 4
#define MATVEC_ROUND 8
#define MATVEC_MAX_CHUNKS 32
#define MATVEC_MAX_SEGS 3  // the fields of MatvecJob; must match MATVEC_MAX_SEGS in ops.rs
// weight bytes of its first round a block asks L2 for while it quantizes x
#define MATVEC_PREFETCH 16384

__device__ __forceinline__ void load8(const float* x, float* v) {
    float4 a = *(const float4*)x;
    float4 b = *(const float4*)(x + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// An exact i32 -> f32 for |v| < 2^22 without the slow I2F: 1.5 * 2^23 + v has the integer in
// its mantissa, and subtracting 1.5 * 2^23 leaves v exactly.
__device__ __forceinline__ float int_to_f32(int v) {
    return __int_as_float(0x4B400000 + v) - 12582912.0f;
}

#define ONES 0x01010101
#define NIB 0x0f0f0f0f

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
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (b < nb) v = *(const float4*)(x + 32 * b + 4 * l);
            float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, off));
            const float d = __fdiv_rn(amax, 127.f);
            const float id = amax != 0.f ? __fdiv_rn(127.f, amax) : 0.f;
            const int q0 = __float2int_rn(__fmul_rn(v.x, id)), q1 = __float2int_rn(__fmul_rn(v.y, id));
            const int q2 = __float2int_rn(__fmul_rn(v.z, id)), q3 = __float2int_rn(__fmul_rn(v.w, id));
            int sum = q0 + q1 + q2 + q3;
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, off);
            if (b < nb) {
                ((u32*)q)[8 * b + l] = (u32)(q0 & 255) | (u32)(q1 & 255) << 8 | (u32)(q2 & 255) << 16 | (u32)q3 << 24;
                // d and d * sum as the f16 values the q8_1 block format stores (as the CPU does)
                if (l == 0) ((float2*)scales)[b] = make_float2(round_f16(d), round_f16(__fmul_rn(d, (float)sum)));
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

// The activations a quantized policy reads: quants and per-block scales in shared memory.
struct Act {
    const i8* q;
    const float* s;
};

// ---- float weights: lane l takes 8-value groups l, l + 32, ... (or single values when the
// chunk length is not a multiple of 8); the choice depends on the chunk length alone ----

struct F32 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)cols * 4; }
    static __device__ __forceinline__ void widen8(const u8* p, float* w) {
        load8((const float*)p, w);
    }
    static __device__ __forceinline__ float one(const u8* row, int i) { return deq_f32(row, i); }
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
    static __device__ __forceinline__ float one(const u8* row, int i) { return deq_f16(row, i); }
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
    static __device__ __forceinline__ float one(const u8* row, int i) { return deq_bf16(row, i); }
};

template <class T>
struct FloatPolicy {
    static constexpr int ACT_BLOCK = 0;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return T::row_bytes(cols); }
    static __device__ __forceinline__ void lane_chunk(const u8* const* row, const float* x, Act, int c0, int len, int lane, float* acc) {
        const int esize = (int)T::row_bytes(1);
        if (len % 8 == 0) {
            // one pass keeps 4 rows x 16 bytes in flight per lane within 64 registers
#pragma unroll 1
            for (int g = lane; g < len / 8; g += WARP) {
                const int e = c0 + 8 * g;
                float v[8];
                load8(x + e, v);
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r) {
                    float w[8];
                    T::widen8(row[r] + (size_t)e * esize, w);
#pragma unroll
                    for (int k = 0; k < 8; ++k) acc[r] = fmaf(w[k], v[k], acc[r]);
                }
            }
        } else {
            for (int e = lane; e < len; e += WARP) {
                const float v = x[c0 + e];
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r) acc[r] = fmaf(T::one(row[r], c0 + e), v, acc[r]);
            }
        }
    }
};

// ---- 32-value blocks: block b of the chunk goes to lanes 4(b % 8) .. 4(b % 8) + 3, lane p
// of the four takes quants 8p .. 8p + 7 (q8_0), or quant bytes 4p .. 4p + 3, that is values
// 4p .. 4p + 3 and 16 + 4p .. 16 + 4p + 3 (q4_0, q4_1). A lane adds (d_w * d_x) * its dot; for
// q4_1 lane 0 of the four also adds m_w * (d_x * sum of the block's activation quants). ----

struct Q8_0 {
    static constexpr int ACT_BLOCK = 32;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * 34; }
    static __device__ __forceinline__ void lane_chunk(const u8* const* row, const float*, Act a, int c0, int len, int lane, float* acc) {
        const int p = lane & 3;
#pragma unroll 2
        for (int b = (c0 >> 5) + (lane >> 2); b < (c0 + len) >> 5; b += 8) {
            const uint2 xq = *(const uint2*)(a.q + 32 * b + 8 * p);
            const float dx = a.s[2 * b];
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const u8* blk = row[r] + (size_t)b * 34;
                const u16* qs = (const u16*)(blk + 2 + 8 * p);
                const u32 q0 = __byte_perm(qs[0], qs[1], 0x5410), q1 = __byte_perm(qs[2], qs[3], 0x5410);
                const int dot = __dp4a((int)q1, (int)xq.y, __dp4a((int)q0, (int)xq.x, 0));
                acc[r] = fmaf(f16_to_f32(ld_u16(blk)) * dx, int_to_f32(dot), acc[r]);
            }
        }
    }
};

template <bool MIN>
struct Q4 {
    static constexpr int ACT_BLOCK = 32;
    static constexpr int BYTES = MIN ? 20 : 18;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * BYTES; }
    static __device__ __forceinline__ void lane_chunk(const u8* const* row, const float*, Act a, int c0, int len, int lane, float* acc) {
        const int p = lane & 3;
#pragma unroll 2
        for (int b = (c0 >> 5) + (lane >> 2); b < (c0 + len) >> 5; b += 8) {
            const int xlo = *(const int*)(a.q + 32 * b + 4 * p), xhi = *(const int*)(a.q + 32 * b + 16 + 4 * p);
            const float2 ds = *(const float2*)(a.s + 2 * b);
            // q4_0 quants carry an offset of 8: subtract it through the activation sum, exactly
            const int off = MIN ? 0 : 8 * __dp4a(ONES, xhi, __dp4a(ONES, xlo, 0));
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const u8* blk = row[r] + (size_t)b * BYTES;
                if (MIN) {
                    const u32 q = *(const u32*)(blk + 4 + 4 * p);
                    const u32 dm = *(const u32*)blk;
                    const int dot = __dp4a((int)((q >> 4) & NIB), xhi, __dp4a((int)(q & NIB), xlo, 0));
                    acc[r] = fmaf(f16_to_f32((u16)(dm & 0xffff)) * ds.x, int_to_f32(dot), acc[r]);
                    acc[r] = fmaf(p == 0 ? f16_to_f32((u16)(dm >> 16)) : 0.f, ds.y, acc[r]);
                } else {
                    const u32 q = ld_u32_a2(blk + 2 + 4 * p);
                    const int dot = __dp4a((int)((q >> 4) & NIB), xhi, __dp4a((int)(q & NIB), xlo, 0));
                    acc[r] = fmaf(f16_to_f32(ld_u16(blk)) * ds.x, int_to_f32(dot - off), acc[r]);
                }
            }
        }
    }
};

// ---- 256-value super-blocks: super-block b of the chunk goes to lanes 16(b % 2) .. +15 ----

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

struct Q4_K {
    static constexpr int ACT_BLOCK = 256;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 256) * 144; }
    // lane t of 16 takes qs bytes 32j + 8q .. +8 (j = t / 4, q = t % 4): 8 values of
    // sub-block 2j (low nibbles) and 8 of sub-block 2j + 1 (high nibbles); it adds
    // (d * d_x) * (sc0 * dot0 + sc1 * dot1) - (dmin * d_x) * (m0 * sum0 + m1 * sum1)
    static __device__ __forceinline__ void lane_chunk(const u8* const* row, const float*, Act a, int c0, int len, int lane, float* acc) {
        const int t = lane & 15, j = t >> 2, qq = t & 3;
        for (int b = (c0 >> 8) + (lane >> 4); b < (c0 + len) >> 8; b += 2) {
            const uint2 xlo = *(const uint2*)(a.q + 256 * b + 64 * j + 8 * qq);
            const uint2 xhi = *(const uint2*)(a.q + 256 * b + 64 * j + 32 + 8 * qq);
            const float dx = a.s[b];
            const int s0 = __dp4a(ONES, (int)xlo.y, __dp4a(ONES, (int)xlo.x, 0));
            const int s1 = __dp4a(ONES, (int)xhi.y, __dp4a(ONES, (int)xhi.x, 0));
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const u8* blk = row[r] + (size_t)b * 144;
                const uint2 qv = *(const uint2*)(blk + 16 + 32 * j + 8 * qq);
                const u32 dm = *(const u32*)blk;
                const uint3 sw = *(const uint3*)(blk + 4);
                u32 sc, m;
                q4k_scale_min_pair(j, sw, &sc, &m);
                const int sc0 = sc & 0xff, sc1 = sc >> 8, m0 = m & 0xff, m1 = m >> 8;
                const int d0 = __dp4a((int)(qv.y & NIB), (int)xlo.y, __dp4a((int)(qv.x & NIB), (int)xlo.x, 0));
                const int d1 = __dp4a((int)((qv.y >> 4) & NIB), (int)xhi.y, __dp4a((int)((qv.x >> 4) & NIB), (int)xhi.x, 0));
                acc[r] = fmaf(f16_to_f32((u16)(dm & 0xffff)) * dx, int_to_f32(sc0 * d0 + sc1 * d1), acc[r]);
                acc[r] = fmaf(-f16_to_f32((u16)(dm >> 16)) * dx, int_to_f32(m0 * s0 + m1 * s1), acc[r]);
            }
        }
    }
};

struct Q6_K {
    static constexpr int ACT_BLOCK = 256;
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 256) * 210; }
    // lane t of 16 takes half n = t / 8 and positions l0 .. l0 + 3 (l0 = 4 (t % 8)) of it:
    // values 128n + 32k + l for k = 0..3, each group of four under one scale; the offset 32
    // of the 6-bit quants comes off through the activation sums, exactly
    static __device__ __forceinline__ void lane_chunk(const u8* const* row, const float*, Act a, int c0, int len, int lane, float* acc) {
        const int t = lane & 15, n = t >> 3, l0 = 4 * (t & 7);
        for (int b = (c0 >> 8) + (lane >> 4); b < (c0 + len) >> 8; b += 2) {
            int xk[4], off[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                xk[k] = *(const int*)(a.q + 256 * b + 128 * n + 32 * k + l0);
                off[k] = 32 * __dp4a(ONES, xk[k], 0);
            }
            const float dx = a.s[b];
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const u8* blk = row[r] + (size_t)b * 210;
                const u32 qa = ld_u32_a2(blk + 64 * n + l0);
                const u32 qb = ld_u32_a2(blk + 64 * n + 32 + l0);
                const u32 qh = ld_u32_a2(blk + 128 + 32 * n + l0);
                const i8* sc = (const i8*)(blk + 192 + 8 * n + l0 / 16);
                const u32 q[4] = {
                    (qa & NIB) | ((qh << 4) & 0x30303030u),
                    (qb & NIB) | ((qh << 2) & 0x30303030u),
                    ((qa >> 4) & NIB) | (qh & 0x30303030u),
                    ((qb >> 4) & NIB) | ((qh >> 2) & 0x30303030u),
                };
                int isum = 0;
#pragma unroll
                for (int k = 0; k < 4; ++k) isum += (int)sc[2 * k] * (__dp4a((int)q[k], xk[k], 0) - off[k]);
                // |isum| can reach 2^23 here: the exact conversion, not int_to_f32
                acc[r] = fmaf(f16_to_f32(ld_u16(blk + 208)) * dx, __int2float_rn(isum), acc[r]);
            }
        }
    }
};

// What one launch computes. `segs` weights (1..3) of the same dtype and K share x: segment s
// has rows[s] rows and writes y[s]; together they are one matrix whose quads the persistent
// grid splits (q/k/v in one launch). With `residual` set (one segment), y[0][r] = residual[r] +
// (W x)[r], the add after a row-parallel matvec (y may alias residual). With `swiglu` (two
// segments of equal rows, gate and up), a work item takes a quad of both and the launch
// writes y[0][r] = silu_mul(gate[r], up[r]). Every row's value is the same chunk tree as a
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
    const float* x;
    const float* residual;
    // with `norm` set, the launch multiplies rms_norm(x) * norm (block_rms_scale, the bits of
    // rms_norm_f32), which every block computes into shared memory at byte `xn_offset`
    const float* norm;
    float eps;
    int xn_offset;
};

// Segment s's fields.
__device__ __forceinline__ const u8* job_w(const MatvecJob j, int s) { return s == 0 ? j.w0 : s == 1 ? j.w1 : j.w2; }
__device__ __forceinline__ float* job_y(const MatvecJob j, int s) { return s == 0 ? j.y0 : s == 1 ? j.y1 : j.y2; }
__device__ __forceinline__ int job_rows(const MatvecJob j, int s) { return s == 0 ? j.rows0 : s == 1 ? j.rows1 : j.rows2; }

// The quads of the job's combined matrix: a swiglu quad covers gate and up rows together.
__device__ __forceinline__ int job_quads(const MatvecJob j) {
    int n = 0;
    for (int s = 0; s < (j.swiglu ? 1 : j.segs); ++s) n += (job_rows(j, s) + MATVEC_ROWS - 1) / MATVEC_ROWS;
    return n;
}

// Segment and first row of global quad `g` (plain jobs; a swiglu job has segment 0 only).
__device__ __forceinline__ int job_seg(const MatvecJob j, int g, int* row0) {
    int s = 0;
    for (; s + 1 < j.segs && !j.swiglu; ++s) {
        const int q = (job_rows(j, s) + MATVEC_ROWS - 1) / MATVEC_ROWS;
        if (g < q) break;
        g -= q;
    }
    *row0 = g * MATVEC_ROWS;
    return s;
}

// One block: quantize x (quantized policies), then the quads of its run, a round at a time:
// warps take the round's (quad, half, chunk) items in turn and leave each chunk value in
// shared memory; after a barrier, warp q combines quad q's chunks in the tree. Two buffers of
// chunk values let the next round's items start while the tree reads the last round's: a
// buffer is written again only after the barrier that follows every warp's tree over it.
template <class P>
__device__ __forceinline__ void matvec_run(const MatvecJob j) {
    extern __shared__ uint4 act_smem[];
    __shared__ float part[2][MATVEC_ROUND * MATVEC_ROWS * 2][MATVEC_MAX_CHUNKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cols = j.cols, chunks = j.chunks, halves = j.swiglu ? 2 : 1;
    const size_t rb = P::row_bytes(cols);
    const int quads = job_quads(j);
    const int q0 = (int)((long long)quads * blockIdx.x / gridDim.x);
    const int q1 = (int)((long long)quads * (blockIdx.x + 1) / gridDim.x);
    Act act = {(const i8*)act_smem, (const float*)((const i8*)act_smem + cols)};
    if (P::ACT_BLOCK != 0) {
        // start the first round's weight bytes towards L2 while x is quantized
        int row0;
        const int s = job_seg(j, q0, &row0);
        const u8* first = job_w(j, s) + (size_t)row0 * rb;
        const int first_rows = min(min(q1 - q0, MATVEC_ROUND) * MATVEC_ROWS, job_rows(j, s) - row0);
        const size_t bytes = min((size_t)max(first_rows, 0) * rb, (size_t)MATVEC_PREFETCH);
        for (size_t o = (size_t)threadIdx.x * 128; o < bytes; o += (size_t)MATVEC_THREADS * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(first + o));
    }
    // the weights are constant: only now does the block need the previous kernel's output
    overlap_with_neighbours();
    const float* x = j.x;
    if (j.norm) {
        float* xn = (float*)((u8*)act_smem + j.xn_offset);
        const float scale = block_rms_scale(j.x, cols, j.eps);
#pragma unroll 8
        for (int i = threadIdx.x; i < cols; i += MATVEC_THREADS) xn[i] = __fmul_rn(__fmul_rn(j.x[i], scale), j.norm[i]);
        __syncthreads();
        x = xn;
    }
    if (P::ACT_BLOCK != 0) {
        quantize_x<P::ACT_BLOCK>(x, cols, (i8*)act.q, (float*)act.s);
        __syncthreads();
    }
    const int len = cols / chunks;
    int buf = 0;
    for (int round = q0; round < q1; round += MATVEC_ROUND, buf ^= 1) {
        const int nq = min(MATVEC_ROUND, q1 - round);
        for (int item = warp; item < nq * halves * chunks; item += MATVEC_WARPS) {
            const int qh = item / chunks, c = item - qh * chunks;
            const int quad = qh / halves, h = qh - quad * halves;
            int row0;
            const int s = job_seg(j, round + quad, &row0) + h;
            const int nr = min(MATVEC_ROWS, job_rows(j, s) - row0);
            const u8* w = job_w(j, s);
            // rows past the end read the last row again, so that no load waits on a branch
            const u8* row[MATVEC_ROWS];
            float acc[MATVEC_ROWS];
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                row[r] = w + (size_t)(row0 + min(r, nr - 1)) * rb;
                acc[r] = 0.f;
            }
            P::lane_chunk(row, x, act, c * len, len, lane, acc);
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const float v = warp_sum(acc[r]);
                if (lane == 0) part[buf][qh * MATVEC_ROWS + r][c] = v;
            }
        }
        __syncthreads();
        for (int quad = warp; quad < nq; quad += MATVEC_WARPS) {
            int row0;
            const int s = job_seg(j, round + quad, &row0);
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                const int at = quad * halves * MATVEC_ROWS + r;
                const float total = chunk_tree(lane < chunks ? part[buf][at][lane] : 0.f, chunks);
                float out = total;
                if (j.swiglu) {
                    const float up = chunk_tree(lane < chunks ? part[buf][at + MATVEC_ROWS][lane] : 0.f, chunks);
                    out = silu_mul(total, up);
                }
                const int row = row0 + r;
                if (lane == 0 && row < job_rows(j, s)) {
                    if (j.residual) out = j.residual[row] + total;
                    job_y(j, s)[row] = out;
                }
            }
        }
    }
}

#define MATVEC(name, P)                                                                        \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, 2) name(const MatvecJob job) { \
        matvec_run<P>(job);                                                                    \
    }

MATVEC(matvec_f32, FloatPolicy<F32>)
MATVEC(matvec_f16, FloatPolicy<F16>)
MATVEC(matvec_bf16, FloatPolicy<BF16>)
MATVEC(matvec_q8_0, Q8_0)
MATVEC(matvec_q4_0, Q4<false>)
MATVEC(matvec_q4_1, Q4<true>)
MATVEC(matvec_q4_k, Q4_K)
MATVEC(matvec_q6_k, Q6_K)
