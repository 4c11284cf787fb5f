// memra kernels: the products of a prefill step's token rows, on the tensor cores.
//
// gemm_<dtype>: y[z][t][n] = sum over k in chunk z of a[t][k] * w[n][k], for the `t < m`
// token rows of the f16 activations `a` (row-major, `k` values a row) and the `n` rows of a
// weight in the device layout of DeviceWeight::upload. Chunk z covers k in
// [z * k / chunks, (z + 1) * k / chunks): a row-parallel product's chunks are the plan's
// canonical reduction chunks, so the chunks a tensor-parallel rank holds give the same bits as
// on one rank and `tree_sum_f32` combines them in the canonical tree. Every output's chunk is
// a sequence of 16-deep f16 tensor-core products accumulated in f32 in k order, whatever its
// tile: the same rows and weights give the same bits on any rank.
//
// A block computes a 64 x 128 tile (8 warps as 2 x 4, each 32 x 32: two m16 by four n8
// mma tiles) over 64-deep k steps: the activations go to shared memory as they are, the weight
// rows are dequantized there to f16 (the value of memra_gguf::dequantize, rounded to f16), then
// ldmatrix feeds the mma.sync.m16n8k16 products; the next step's loads and dequantization go
// to registers while the products run. Rows past m and weight rows past n read as
// zero and are not stored.
//
// to_f16_f32: the activations narrowed to f16 (round to nearest even).
// swiglu_rows_f32: out = silu(gate) * up, elementwise (swiglu_limited: clamped when limit > 0).
// add_rows_f32: x[t][i] += b[i] for every row t.
#include "common.cuh"

#define GEMM_BM 64
#define GEMM_BN 128
#define GEMM_BK 64
#define GEMM_THREADS 256
// shared-memory row stride in halves: 64 values and 8 of padding keep ldmatrix's eight rows
// on distinct banks and every row 16-byte aligned
#define GEMM_LD 72

// Each policy's load16: values k .. k + 15 (k a multiple of 16) of weight row r as f16.
struct GemmF16 {
    static __device__ __forceinline__ void load16(const u8* w, int rows, int cols, int r, int k, u16* out) {
        const uint4* p = (const uint4*)(w + ((size_t)r * cols + k) * 2);
        *(uint4*)out = p[0];
        *(uint4*)(out + 8) = p[1];
    }
};

struct GemmQ8_0 {
    static __device__ __forceinline__ void load16(const u8* w, int rows, int cols, int r, int k, u16* out) {
        const WeightRow row = weight_row<32, 32, 2>(w, rows, cols, r);
        const float d = f16_to_f32(ld_u16(row.s + 2 * (k / 32)));
        const uint4 qv = *(const uint4*)(row.q + k);
        const i8* q = (const i8*)&qv;
#pragma unroll
        for (int j = 0; j < 16; ++j) out[j] = f32_to_f16((float)q[j] * d);
    }
};

template <bool MIN>
struct GemmQ4 {
    static __device__ __forceinline__ void load16(const u8* w, int rows, int cols, int r, int k, u16* out) {
        const WeightRow row = weight_row<32, 16, MIN ? 4 : 2>(w, rows, cols, r);
        const u8* sc = row.s + (MIN ? 4 : 2) * (k / 32);
        const float d = f16_to_f32(ld_u16(sc));
        const float m = MIN ? f16_to_f32(ld_u16(sc + 2)) : 0.f;
        const uint4 qv = *(const uint4*)(row.q + 16 * (k / 32));
        const u8* q = (const u8*)&qv;
        const int shift = (k % 32) ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int v = (q[j] >> shift) & 15;
            out[j] = f32_to_f16(MIN ? __fadd_rn(__fmul_rn((float)v, d), m) : (float)(v - 8) * d);
        }
    }
};

// Every other layout: per-value dequantization (common.cuh), 16 at a time.
#define GEMM_GENERIC(name, deq, BLOCK, QS, S)                                                      \
    struct name {                                                                                  \
        static __device__ __forceinline__ void load16(const u8* w, int rows, int cols, int r, int k, \
                                                      u16* out) {                                  \
            const WeightRow row = weight_row<BLOCK, QS, S>(w, rows, cols, r);                      \
            _Pragma("unroll") for (int j = 0; j < 16; ++j) out[j] = f32_to_f16(deq(row, k + j));   \
        }                                                                                          \
    };
GEMM_GENERIC(GemmF32, deq_f32, 1, 4, 0)
GEMM_GENERIC(GemmBF16, deq_bf16, 1, 2, 0)
GEMM_GENERIC(GemmQ4_K, deq_q4_k, 256, 144, 0)
GEMM_GENERIC(GemmQ6_K, deq_q6_k, 256, 210, 0)

template <class P>
__device__ __forceinline__ void gemm_run(const u16* a, const u8* w, float* y, int m, int n, int k,
                                         int chunks) {
    __shared__ __align__(16) u16 as[GEMM_BM * GEMM_LD];
    __shared__ __align__(16) u16 bs[GEMM_BN * GEMM_LD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / 4, wn = warp % 4;
    const int t0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int len = k / chunks, z = blockIdx.z;
    const int k_begin = z * len, k_end = k_begin + len;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    // the loads of one k step: thread i copies 16 activations of row i / 4 and dequantizes 32
    // weights of row i / 2, into registers while the previous step's products run
    const int ar = threadIdx.x / 4, ak = (threadIdx.x % 4) * 16;
    const int br = threadIdx.x / 2, bk = (threadIdx.x % 2) * 32;
    uint4 av[2];
    __align__(16) u16 wv[32];
    const auto load = [&](int k0) {
        av[0] = av[1] = make_uint4(0, 0, 0, 0);
        if (t0 + ar < m) {
            const uint4* p = (const uint4*)(a + (size_t)(t0 + ar) * k + k0 + ak);
            av[0] = p[0];
            av[1] = p[1];
        }
        if (n0 + br < n) {
            P::load16(w, n, k, n0 + br, k0 + bk, wv);
            P::load16(w, n, k, n0 + br, k0 + bk + 16, wv + 16);
        } else {
#pragma unroll
            for (int j = 0; j < 32; ++j) wv[j] = 0;
        }
    };
    // the weights are constant: only the activations wait for the previous kernel
    overlap_with_neighbours();
    load(k_begin);
    for (int k0 = k_begin; k0 < k_end; k0 += GEMM_BK) {
        __syncthreads();  // the previous step's fragments are read
        *(uint4*)(as + ar * GEMM_LD + ak) = av[0];
        *(uint4*)(as + ar * GEMM_LD + ak + 8) = av[1];
#pragma unroll
        for (int j = 0; j < 4; ++j) *(uint4*)(bs + br * GEMM_LD + bk + 8 * j) = *(const uint4*)(wv + 8 * j);
        __syncthreads();
        if (k0 + GEMM_BK < k_end) load(k0 + GEMM_BK);
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            u32 af[2][4], bf[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int row = wm * 32 + i * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                ldmatrix_x4(af[i], as + row * GEMM_LD + kk + 8 * (lane / 16));
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int row = wn * 32 + j * 16 + (lane % 8) + 8 * (lane / 16);
                ldmatrix_x4(bf[j], bs + row * GEMM_LD + kk + 8 * ((lane / 8) % 2));
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_f16(acc[i][j], af[i], bf[j / 2][2 * (j % 2)], bf[j / 2][2 * (j % 2) + 1]);
        }
    }
    float* out = y + (size_t)z * m * n;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + wm * 32 + i * 16 + lane / 4 + 8 * (e / 2);
                const int c = n0 + wn * 32 + j * 8 + 2 * (lane % 4) + (e % 2);
                if (t < m && c < n) out[(size_t)t * n + c] = acc[i][j][e];
            }
}

#define GEMM(name, P)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                     \
        name(const u16* a, const u8* w, float* y, int m, int n, int k, int chunks) {               \
        gemm_run<P>(a, w, y, m, n, k, chunks);                                                     \
    }

GEMM(gemm_f32, GemmF32)
GEMM(gemm_f16, GemmF16)
GEMM(gemm_bf16, GemmBF16)
GEMM(gemm_q8_0, GemmQ8_0)
GEMM(gemm_q4_0, GemmQ4<false>)
GEMM(gemm_q4_1, GemmQ4<true>)
GEMM(gemm_q4_k, GemmQ4_K)
GEMM(gemm_q6_k, GemmQ6_K)

extern "C" __global__ void to_f16_f32(const float* x, u16* out, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_f16(x[i]);
}

extern "C" __global__ void swiglu_rows_f32(const float* gate, const float* up, float* out, int n,
                                           float limit) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = swiglu_limited(gate[i], up[i], limit);
}

extern "C" __global__ void add_rows_f32(float* x, const float* b, int cols, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + b[i % cols];
}
