// memra kernels: y = W x for batch-1 decode, every weight dtype. A block of 4 warps owns 4 rows;
// its warps split the K chunks between them and every warp computes its chunks for all 4 rows,
// so each activation value read serves 4 rows and a row's bytes are fetched by 4 warps at once.
//
// Numerics contract (DESIGN.md "Numerics"): K is cut into `chunks` equal, block-aligned chunks
// (a power of two, at most 32). Inside a chunk every lane accumulates a fixed, chunk-relative
// set of elements in a fixed order, then the warp sums the lanes with a fixed xor butterfly; the
// chunk values are then combined in a balanced binary tree. The bits of one chunk depend only
// on that chunk's bytes and its length (not on which warp computes it or on the row grouping),
// so a tensor-parallel rank with K/d columns and chunks/d chunks computes exactly one subtree of
// the 1-rank result, and tree_sum (reduce.cu) completes it bit for bit.
//
// Each policy reads its quant blocks with coalesced loads: 4 lanes per 32-value block (q8_0,
// q4_0, q4_1), 16 lanes per 256-value super-block (q4_k, q6_k), 8 consecutive values per lane
// for the float types when the chunk length allows it. Quants become floats through
// small_to_f32 (common.cuh), which avoids the slow integer-to-float conversion.
#include "common.cuh"

#define MATVEC_WARPS 4
#define MATVEC_ROWS 4
#define MATVEC_MAX_CHUNKS 32

__device__ __forceinline__ void load8(const float* x, float* v) {
    float4 a = *(const float4*)x;
    float4 b = *(const float4*)(x + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void load4(const float* x, float* v) {
    float4 a = *(const float4*)x;
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}

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
    static __device__ __forceinline__ size_t row_bytes(int cols) { return T::row_bytes(cols); }
    static __device__ __forceinline__ void lane_chunk(const u8* w0, size_t rb, int nr, const float* x, int c0, int len, int lane, float* acc) {
        const int esize = (int)T::row_bytes(1);
        if (len % 8 == 0) {
#pragma unroll 2
            for (int g = lane; g < len / 8; g += WARP) {
                const int e = c0 + 8 * g;
                float v[8];
                load8(x + e, v);
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r) {
                    if (r < nr) {
                        float w[8];
                        T::widen8(w0 + r * rb + (size_t)e * esize, w);
#pragma unroll
                        for (int k = 0; k < 8; ++k) acc[r] = fmaf(w[k], v[k], acc[r]);
                    }
                }
            }
        } else {
            for (int e = lane; e < len; e += WARP) {
                const float v = x[c0 + e];
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r)
                    if (r < nr) acc[r] = fmaf(T::one(w0 + r * rb, c0 + e), v, acc[r]);
            }
        }
    }
};

// ---- 32-value blocks: block b of the chunk goes to lanes 4(b % 8) .. 4(b % 8) + 3 ----

struct Q8_0 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * 34; }
    static __device__ __forceinline__ void lane_chunk(const u8* w0, size_t rb, int nr, const float* x, int c0, int len, int lane, float* acc) {
        const int p = lane & 3;
#pragma unroll 2
        for (int b = lane >> 2; b < len / 32; b += 8) {
            const int e = c0 + 32 * b;
            float v[8];
            load8(x + e + 8 * p, v);
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                if (r >= nr) continue;
                const u8* blk = w0 + r * rb + (size_t)(e / 32) * 34;
                const u16* qs = (const u16*)(blk + 2 + 8 * p);
                const u16 q[4] = {qs[0], qs[1], qs[2], qs[3]};
                const float d = f16_to_f32(ld_u16(blk));
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    s = fmaf(small_to_f32((q[k] & 0xff) ^ 0x80, BIAS128), v[2 * k], s);
                    s = fmaf(small_to_f32((q[k] >> 8) ^ 0x80, BIAS128), v[2 * k + 1], s);
                }
                acc[r] = fmaf(d, s, acc[r]);
            }
        }
    }
};

struct Q4_0 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * 18; }
    static __device__ __forceinline__ void lane_chunk(const u8* w0, size_t rb, int nr, const float* x, int c0, int len, int lane, float* acc) {
        const int p = lane & 3;
#pragma unroll 2
        for (int b = lane >> 2; b < len / 32; b += 8) {
            const int e = c0 + 32 * b;
            float lo[4], hi[4];
            load4(x + e + 4 * p, lo);
            load4(x + e + 16 + 4 * p, hi);
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                if (r >= nr) continue;
                const u8* blk = w0 + r * rb + (size_t)(e / 32) * 18;
                const u32 q = ld_u32_a2(blk + 2 + 4 * p);
                const float d = f16_to_f32(ld_u16(blk));
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < 4; ++k) s = fmaf(small_to_f32((q >> (8 * k)) & 15, BIAS8), lo[k], s);
#pragma unroll
                for (int k = 0; k < 4; ++k) s = fmaf(small_to_f32((q >> (8 * k + 4)) & 15, BIAS8), hi[k], s);
                acc[r] = fmaf(d, s, acc[r]);
            }
        }
    }
};

struct Q4_1 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * 20; }
    static __device__ __forceinline__ void lane_chunk(const u8* w0, size_t rb, int nr, const float* x, int c0, int len, int lane, float* acc) {
        const int p = lane & 3;
#pragma unroll 2
        for (int b = lane >> 2; b < len / 32; b += 8) {
            const int e = c0 + 32 * b;
            float lo[4], hi[4];
            load4(x + e + 4 * p, lo);
            load4(x + e + 16 + 4 * p, hi);
            float sx = 0.f;
#pragma unroll
            for (int k = 0; k < 4; ++k) sx += lo[k];
#pragma unroll
            for (int k = 0; k < 4; ++k) sx += hi[k];
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                if (r >= nr) continue;
                const u8* blk = w0 + r * rb + (size_t)(e / 32) * 20;
                const u32 q = *(const u32*)(blk + 4 + 4 * p);
                const u32 dm = *(const u32*)blk;
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < 4; ++k) s = fmaf(small_to_f32((q >> (8 * k)) & 15, BIAS0), lo[k], s);
#pragma unroll
                for (int k = 0; k < 4; ++k) s = fmaf(small_to_f32((q >> (8 * k + 4)) & 15, BIAS0), hi[k], s);
                acc[r] = fmaf(f16_to_f32((u16)(dm & 0xffff)), s, acc[r]);
                acc[r] = fmaf(f16_to_f32((u16)(dm >> 16)), sx, acc[r]);
            }
        }
    }
};

// ---- 256-value super-blocks: super-block b of the chunk goes to lanes 16(b % 2) .. +15 ----

struct Q4_K {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 256) * 144; }
    // lane t of 16 takes qs bytes 32j + 8q .. +8 (j = t / 4, q = t % 4): 8 values of
    // sub-block 2j (low nibbles) and 8 of sub-block 2j + 1 (high nibbles)
    static __device__ __forceinline__ void lane_chunk(const u8* w0, size_t rb, int nr, const float* x, int c0, int len, int lane, float* acc) {
        const int t = lane & 15, j = t >> 2, qq = t & 3;
        for (int b = lane >> 4; b < len / 256; b += 2) {
            const int e = c0 + 256 * b;
            float lo[8], hi[8];
            load8(x + e + 64 * j + 8 * qq, lo);
            load8(x + e + 64 * j + 32 + 8 * qq, hi);
            float x0 = 0.f, x1 = 0.f;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                x0 += lo[k];
                x1 += hi[k];
            }
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                if (r >= nr) continue;
                const u8* blk = w0 + r * rb + (size_t)(e / 256) * 144;
                const uint2 qv = *(const uint2*)(blk + 16 + 32 * j + 8 * qq);
                const u32 dm = *(const u32*)blk;
                int sc0, m0, sc1, m1;
                q4k_scale_min(2 * j, blk + 4, &sc0, &m0);
                q4k_scale_min(2 * j + 1, blk + 4, &sc1, &m1);
                const u32 q[2] = {qv.x, qv.y};
                float s0 = 0.f, s1 = 0.f;
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    const u32 byte = (q[k / 4] >> (8 * (k % 4))) & 0xff;
                    s0 = fmaf(small_to_f32(byte & 15, BIAS0), lo[k], s0);
                    s1 = fmaf(small_to_f32(byte >> 4, BIAS0), hi[k], s1);
                }
                const float a = fmaf((float)sc1, s1, (float)sc0 * s0);
                const float mm = fmaf((float)m1, x1, (float)m0 * x0);
                acc[r] = fmaf(f16_to_f32((u16)(dm & 0xffff)), a, acc[r]);
                acc[r] = fmaf(-f16_to_f32((u16)(dm >> 16)), mm, acc[r]);
            }
        }
    }
};

struct Q6_K {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 256) * 210; }
    // lane t of 16 takes half n = t / 8 and positions l0 .. l0 + 3 (l0 = 4 (t % 8)) of it:
    // values 128n + 32k + l for k = 0..3, each group of four under one scale
    static __device__ __forceinline__ void lane_chunk(const u8* w0, size_t rb, int nr, const float* x, int c0, int len, int lane, float* acc) {
        const int t = lane & 15, n = t >> 3, l0 = 4 * (t & 7);
        for (int b = lane >> 4; b < len / 256; b += 2) {
            const int e = c0 + 256 * b;
            float v[4][4];
#pragma unroll
            for (int k = 0; k < 4; ++k) load4(x + e + 128 * n + 32 * k + l0, v[k]);
#pragma unroll
            for (int r = 0; r < MATVEC_ROWS; ++r) {
                if (r >= nr) continue;
                const u8* blk = w0 + r * rb + (size_t)(e / 256) * 210;
                const u32 qa = ld_u32_a2(blk + 64 * n + l0);
                const u32 qb = ld_u32_a2(blk + 64 * n + 32 + l0);
                const u32 qh = ld_u32_a2(blk + 128 + 32 * n + l0);
                const i8* sc = (const i8*)(blk + 192 + 8 * n + l0 / 16);
                float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const u32 lo = (k & 1) ? qb : qa;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const u32 byte = (lo >> (8 * i)) & 0xff;
                        const u32 ql = (k & 2) ? (byte >> 4) : (byte & 15);
                        const u32 qhi = (qh >> (8 * i + 2 * k)) & 3;
                        s[k] = fmaf(small_to_f32(ql | (qhi << 4), BIAS32), v[k][i], s[k]);
                    }
                }
                float a = (float)sc[0] * s[0];
                a = fmaf((float)sc[2], s[1], a);
                a = fmaf((float)sc[4], s[2], a);
                a = fmaf((float)sc[6], s[3], a);
                acc[r] = fmaf(f16_to_f32(ld_u16(blk + 208)), a, acc[r]);
            }
        }
    }
};

// One block: rows row0 .. row0 + 3; warp w computes chunks w, w + 4, ... for all of them, the
// chunk values meet in shared memory and warp 0 combines them in the tree.
template <class P>
__device__ __forceinline__ void matvec_rows(const u8* w, const float* x, float* y, int rows, int cols, int chunks) {
    __shared__ float part[MATVEC_ROWS][MATVEC_MAX_CHUNKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MATVEC_ROWS;
    const int nr = min(MATVEC_ROWS, rows - row0);
    const size_t rb = P::row_bytes(cols);
    const u8* w0 = w + (size_t)row0 * rb;
    const int len = cols / chunks;
    for (int c = warp; c < chunks; c += MATVEC_WARPS) {
        float acc[MATVEC_ROWS];
#pragma unroll
        for (int r = 0; r < MATVEC_ROWS; ++r) acc[r] = 0.f;
        P::lane_chunk(w0, rb, nr, x, c * len, len, lane, acc);
#pragma unroll
        for (int r = 0; r < MATVEC_ROWS; ++r) {
            const float s = warp_sum(acc[r]);
            if (lane == 0) part[r][c] = s;
        }
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < MATVEC_ROWS; ++r) {
            const float total = chunk_tree(lane < chunks ? part[r][lane] : 0.f, chunks);
            if (lane == 0 && r < nr) y[row0 + r] = total;
        }
    }
}

#define MATVEC(name, P)                                                                        \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * WARP)                          \
        name(const u8* w, const float* x, float* y, int rows, int cols, int chunks) {          \
        matvec_rows<P>(w, x, y, rows, cols, chunks);                                           \
    }

MATVEC(matvec_f32, FloatPolicy<F32>)
MATVEC(matvec_f16, FloatPolicy<F16>)
MATVEC(matvec_bf16, FloatPolicy<BF16>)
MATVEC(matvec_q8_0, Q8_0)
MATVEC(matvec_q4_0, Q4_0)
MATVEC(matvec_q4_1, Q4_1)
MATVEC(matvec_q4_k, Q4_K)
MATVEC(matvec_q6_k, Q6_K)
