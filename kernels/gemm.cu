// memra kernels: the products of a prefill step's token rows, on the tensor cores.
//
// gemm128_<dtype>, gemm64_<dtype>: y[z][t][n] = sum over k in chunk z of a[t][k] * w[n][k],
// for the `t < m` token rows of the f16 activations `a` (row-major, `k` values a row) and the
// `n` rows of a weight in the device layout of DeviceWeight::upload; for each of up to three
// weights of one input in one launch (q, k and v; gate and up), so small products share the
// device's waves; the blocks of one weight tile's token-row tiles are neighbours (gemm_part).
// Chunk z covers k in [z * k / chunks, (z + 1) * k / chunks): a row-parallel product's chunks
// are the plan's canonical reduction chunks, so the chunks a tensor-parallel rank holds give
// the same bits as on one rank and `tree_sum_f32` combines them in the canonical tree. Every
// output's chunk is a sequence of 16-deep f16 tensor-core products accumulated in f32 in k
// order, whatever its tile or launch: the same rows and weights give the same bits on any
// rank.
//
// A block computes a GEMM_BM x 128 tile (GEMM_BM = 128, or 64 where the larger tiles would not
// fill the device; 8 warps as 2 x 4, each (GEMM_BM / 2) x 32) over 64-deep k steps, with
// GEMM_STAGES steps in flight: the activations and the weights' stored bytes of a step are
// copied to shared memory asynchronously (cp.async) GEMM_STAGES - 1 steps ahead; f16 weights
// feed ldmatrix from there, the quantized planar layouts (q8_0, q4_0, q4_1) are dequantized
// from there into an f16 tile (the value of memra_gguf::dequantize, rounded to f16), and
// every other layout is dequantized from global memory into that tile when its step comes.
// ldmatrix then feeds the mma.sync.m16n8k16 products. Rows past m and weight rows past n
// read as zero and are not stored. The host sizes the dynamic shared memory with the same
// numbers (GemmTile::shared_bytes in executor/src/cuda/rows.rs).
//
// gemm_wg128_<dtype> (q8_0, q4_0, q4_1) and gemm_tma<BN>_f16: the same products with Hopper's
// warpgroup instructions (sm_90a only; see their sections below).
//
// to_f16_f32: the activations narrowed to f16 (round to nearest even).
// swiglu_rows_f32: out = silu(gate) * up, elementwise (swiglu_limited: clamped when limit > 0);
// with `out16`, also narrowed to f16 there (to_f16_f32's bits), the down projection's input.
// add_rows_f32: x[t][i] += b[i] for every row t.
// row_positions_u32: out[t] = pos[0] + t, the position of each token row of the step.
#include "common.cuh"

#define GEMM_BN 128
#define GEMM_BK 64
#define GEMM_STAGES 3
#define GEMM_THREADS 256
// shared-memory row stride of an f16 tile in halves: 64 values and 8 of padding keep
// ldmatrix's eight rows on distinct banks and every row 16-byte aligned
#define GEMM_LD 72

// A weight layout's policy. RAW: the bytes of one weight row's k step kept in a stage (0:
// the layout is dequantized from global memory, not staged); copy: thread `half` (0 or 1) of
// the pair that serves weight row r issues its share of the asynchronous copies of step k0
// (`valid` false: zeros); dequant32: values 32 * half .. 32 * half + 31 of the staged row (or,
// unstaged, of row r at step k0) as f16.
struct GemmF16 {
    static constexpr int RAW = 2 * GEMM_LD;  // the staged row is the f16 tile's row
    static __device__ __forceinline__ void copy(const u8* w, int rows, int cols, int r, int k0, u8* dst,
                                                int half, bool valid) {
        const u8* src = w + ((size_t)r * cols + k0) * 2;
#pragma unroll
        for (int j = half; j < 8; j += 2) cp_async16(dst + 16 * j, valid ? src + 16 * j : w, valid);
    }
};

// q8_0, q4_0 and q4_1 in their two planes: a step's quant bytes (QB, 16-byte aligned) then its
// two blocks' scale bytes (SB)
template <int QS, int S>
struct GemmPlanar {
    static constexpr int QB = 2 * QS, SB = 2 * S;
    static constexpr int RAW = (QB + SB + 15) / 16 * 16;
    static __device__ __forceinline__ void copy(const u8* w, int rows, int cols, int r, int k0, u8* dst,
                                                int half, bool valid) {
        const WeightRow row = weight_row<32, QS, S>(w, rows, cols, r);
        const u8* q = row.q + (k0 / 32) * QS;
#pragma unroll
        for (int j = half; j < QB / 16; j += 2) cp_async16(dst + 16 * j, valid ? q + 16 * j : w, valid);
        if (half == 1) {
            const u8* sc = valid ? row.s + (k0 / 32) * S : w;
            if (SB == 8) cp_async8(dst + QB, sc, valid);
            else cp_async4(dst + QB, sc, valid);
        }
    }
};

struct GemmQ8_0 : GemmPlanar<32, 2> {
    static __device__ __forceinline__ void dequant32(const u8* raw, int half, u16* out) {
        const float d = f16_to_f32(*(const u16*)(raw + QB + 2 * half));
        const uint4 q0 = *(const uint4*)(raw + 32 * half), q1 = *(const uint4*)(raw + 32 * half + 16);
        const i8* a = (const i8*)&q0;
        const i8* b = (const i8*)&q1;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            out[j] = f32_to_f16((float)a[j] * d);
            out[16 + j] = f32_to_f16((float)b[j] * d);
        }
    }
};

template <bool MIN>
struct GemmQ4 : GemmPlanar<16, MIN ? 4 : 2> {
    using Base = GemmPlanar<16, MIN ? 4 : 2>;
    static __device__ __forceinline__ void dequant32(const u8* raw, int half, u16* out) {
        const u8* sc = raw + Base::QB + (MIN ? 4 : 2) * half;
        const float d = f16_to_f32(*(const u16*)sc);
        const float m = MIN ? f16_to_f32(*(const u16*)(sc + 2)) : 0.f;
        const uint4 qv = *(const uint4*)(raw + 16 * half);
        const u8* q = (const u8*)&qv;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const int v = j < 16 ? (q[j] & 15) : (q[j - 16] >> 4);
            out[j] = f32_to_f16(MIN ? __fadd_rn(__fmul_rn((float)v, d), m) : (float)(v - 8) * d);
        }
    }
};

// Every other layout: per-value dequantization from global memory (common.cuh).
template <int BLOCK, int QS, int S, float (*DEQ)(WeightRow, int)>
struct GemmUnstaged {
    static constexpr int RAW = 0;
    static __device__ __forceinline__ void load32(const u8* w, int rows, int cols, int r, int k, u16* out) {
        const WeightRow row = weight_row<BLOCK, QS, S>(w, rows, cols, r);
#pragma unroll
        for (int j = 0; j < 32; ++j) out[j] = f32_to_f16(DEQ(row, k + j));
    }
};
using GemmF32 = GemmUnstaged<1, 4, 0, deq_f32>;
using GemmBF16 = GemmUnstaged<1, 2, 0, deq_bf16>;
using GemmQ4_K = GemmUnstaged<256, 144, 0, deq_q4_k>;
using GemmQ6_K = GemmUnstaged<256, 210, 0, deq_q6_k>;

// Whether policy P's staged row is itself the f16 tile row.
template <class P>
__device__ constexpr bool gemm_direct_f16() { return P::RAW == 2 * GEMM_LD; }

// The weights of one launch (every one `k` columns, in one dtype) and their outputs: block
// column x of the grid covers the weights' tiles of GEMM_BN rows in order. A grouped launch
// (`spans` set; the mma.sync kernels, one chunk) runs a product per group, grid row y for
// group y: rows spans[2y] .. spans[2y] + spans[2y + 1] of `a` and of each output, times each
// weight's matrix y * w_stride bytes past its first (the experts a prefill chunk routed to, a
// stack's matrices); every group has up to `row_tiles` token-row tiles, and the blocks past
// its rows do nothing. A row's product does not depend on the other rows of its tile, so it
// has the bits of the same product alone.
#define GEMM_MAX_WEIGHTS 3
struct GemmJob {
    const u8* w[GEMM_MAX_WEIGHTS];
    float* y[GEMM_MAX_WEIGHTS];
    int n[GEMM_MAX_WEIGHTS];
    int count;
    const int* spans;
    unsigned long long w_stride;
    int row_tiles;
};

// This block's weight of the job, its output and rows, its tile column there and its first
// token row, for tiles of BM token rows and TILE weight rows. Blocks go token-row tile first
// (block x is row tile x % row tiles of tile column x / row tiles, the columns covering the
// weights' tiles in order), so the blocks that share a weight tile run side by side and read
// it from DRAM once, the activation rows staying in L2.
struct GemmPart {
    const u8* w;
    float* y;
    int n, bx, t0, index;
};
template <int BM, int TILE>
__device__ __forceinline__ GemmPart gemm_part(const GemmJob& job, int row_tiles) {
    GemmPart p{job.w[0], job.y[0], job.n[0], (int)blockIdx.x / row_tiles, (int)blockIdx.x % row_tiles * BM, 0};
#pragma unroll
    for (int i = 1; i < GEMM_MAX_WEIGHTS; ++i) {
        const int tiles = (p.n + TILE - 1) / TILE;
        if (i < job.count && p.bx >= tiles) {
            p = GemmPart{job.w[i], job.y[i], job.n[i], p.bx - tiles, p.t0, i};
        }
    }
    return p;
}

template <class P, int BM>
__device__ __forceinline__ void gemm_run(const u16* a, const GemmJob& job, int m, int k, int chunks) {
    // the weights are constant, but the copies are issued together: the activations (and a
    // grouped launch's spans) wait for the previous kernel
    overlap_with_neighbours();
    GemmPart part = gemm_part<BM, GEMM_BN>(job, job.spans ? job.row_tiles : (m + BM - 1) / BM);
    if (job.spans) {
        const int g = blockIdx.y, first = job.spans[2 * g];
        m = job.spans[2 * g + 1];
        if (part.t0 >= m) return;
        a += (size_t)first * k;
        part.w += g * job.w_stride;
        part.y += (size_t)first * part.n;
    }
    const u8* w = part.w;
    float* y = part.y;
    const int n = part.n, bx = part.bx;
    constexpr int MI = BM / 32;  // m16 tiles of a warp
    constexpr int RAW = P::RAW;
    constexpr bool DIRECT = gemm_direct_f16<P>();
    extern __shared__ __align__(16) u8 smem[];
    u16* as = (u16*)smem;                                                     // [STAGES][BM][LD]
    u8* raw = smem + GEMM_STAGES * BM * GEMM_LD * 2;                          // [STAGES][BN][RAW]
    u16* bt = (u16*)(raw + GEMM_STAGES * GEMM_BN * RAW);                      // [BN][LD]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / 4, wn = warp % 4;
    const int t0 = part.t0, n0 = bx * GEMM_BN;
    const int len = k / chunks, z = blockIdx.z;
    const int k_begin = z * len, steps = len / GEMM_BK;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    // weight row br is served by threads 2 br and 2 br + 1
    const int br = threadIdx.x / 2, bhalf = threadIdx.x % 2;
    const bool brow_valid = n0 + br < n;
    // the copies of step s into its stage: activation rows in 16-byte pieces, then the weights'
    // stored bytes
    const auto issue = [&](int s) {
        const int slot = s % GEMM_STAGES, k0 = k_begin + s * GEMM_BK;
        u16* ad = as + slot * BM * GEMM_LD;
#pragma unroll
        for (int p = threadIdx.x; p < BM * 8; p += GEMM_THREADS) {
            const int r = p / 8, c = (p % 8) * 8;
            const bool valid = t0 + r < m;
            cp_async16(ad + r * GEMM_LD + c, valid ? a + (size_t)(t0 + r) * k + k0 + c : a, valid);
        }
        if constexpr (RAW > 0) P::copy(w, n, k, n0 + br, k0, raw + (slot * GEMM_BN + br) * RAW, bhalf, brow_valid);
    };
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < steps) issue(s);
        cp_async_commit();
    }
    for (int s = 0; s < steps; ++s) {
        const int slot = s % GEMM_STAGES;
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();  // step s is in its stage; every warp is done with step s - 1
        const u16* bs;
        if constexpr (DIRECT) {
            bs = (const u16*)(raw + slot * GEMM_BN * RAW);
        } else {
            __align__(16) u16 v[32];
            if constexpr (RAW > 0) {
                P::dequant32(raw + (slot * GEMM_BN + br) * RAW, bhalf, v);
            } else if (brow_valid) {
                P::load32(w, n, k, n0 + br, k_begin + s * GEMM_BK + 32 * bhalf, v);
            } else {
#pragma unroll
                for (int j = 0; j < 32; ++j) v[j] = 0;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) *(uint4*)(bt + br * GEMM_LD + 32 * bhalf + 8 * j) = *(const uint4*)(v + 8 * j);
            __syncthreads();
            bs = bt;
        }
        if (s + GEMM_STAGES - 1 < steps) issue(s + GEMM_STAGES - 1);
        cp_async_commit();
        const u16* at = as + slot * BM * GEMM_LD;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            u32 af[MI][4], bf[2][4];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int row = wm * (BM / 2) + i * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                ldmatrix_x4(af[i], at + row * GEMM_LD + kk + 8 * (lane / 16));
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int row = wn * 32 + j * 16 + (lane % 8) + 8 * (lane / 16);
                ldmatrix_x4(bf[j], bs + row * GEMM_LD + kk + 8 * ((lane / 8) % 2));
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_f16(acc[i][j], af[i], bf[j / 2][2 * (j % 2)], bf[j / 2][2 * (j % 2) + 1]);
        }
    }
    cp_async_wait<0>();
    float* out = y + (size_t)z * m * n;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + wm * (BM / 2) + i * 16 + lane / 4 + 8 * (e / 2);
                const int c = n0 + wn * 32 + j * 8 + 2 * (lane % 4) + (e % 2);
                if (t < m && c < n) out[(size_t)t * n + c] = acc[i][j][e];
            }
}

// gemm<BM>_<dtype>: the product with GEMM_BM = BM
#define GEMM(name, P, BM)                                                                          \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                     \
        name(const u16* a, const GemmJob job, int m, int k, int chunks) {                          \
        gemm_run<P, BM>(a, job, m, k, chunks);                                                     \
    }

GEMM(gemm128_f32, GemmF32, 128)
GEMM(gemm128_f16, GemmF16, 128)
GEMM(gemm128_bf16, GemmBF16, 128)
GEMM(gemm128_q8_0, GemmQ8_0, 128)
GEMM(gemm128_q4_0, GemmQ4<false>, 128)
GEMM(gemm128_q4_1, GemmQ4<true>, 128)
GEMM(gemm128_q4_k, GemmQ4_K, 128)
GEMM(gemm128_q6_k, GemmQ6_K, 128)
GEMM(gemm64_f32, GemmF32, 64)
GEMM(gemm64_f16, GemmF16, 64)
GEMM(gemm64_bf16, GemmBF16, 64)
GEMM(gemm64_q8_0, GemmQ8_0, 64)
GEMM(gemm64_q4_0, GemmQ4<false>, 64)
GEMM(gemm64_q4_1, GemmQ4<true>, 64)
GEMM(gemm64_q4_k, GemmQ4_K, 64)
GEMM(gemm64_q6_k, GemmQ6_K, 64)

// ---- Hopper: warpgroup products (wgmma) from swizzled shared memory (sm_90a) ----
//
// gemm_wg128_<dtype>: the product of gemm128_<dtype> for the quantized planar layouts (q8_0,
// q4_0, q4_1; same job, same chunks, same per-output order: 16-deep f16 products accumulated
// in f32 in k order, so the same bits; the self-test checks every tile against gemm64) as
// Hopper's asynchronous warpgroup products. A block of two warpgroups computes a 128 x 128
// tile of every chunk, one chunk after the other in one pipeline (the grid has no chunk
// dimension); warpgroup g takes token rows 64 g .. 64 g + 63 and every weight row of the tile,
// a product of 64 x 128 per 16-deep slice, both operands read by the tensor cores from shared
// memory. A step's 64 values of a row are one 128-byte line; lines are stored with the
// 128-byte swizzle (16-byte piece c of line r at piece c ^ (r % 8)), which is what the operand
// descriptors say. Activation lines are copied so; the weights' stored bytes are copied, then
// dequantized (gemm128's values) into one of two swizzled f16 tiles. The copies run WG_AHEAD
// steps ahead of the products (cp.async, all 256 threads), and a step's products run while
// the next step's copies land; a stage (and a dequantized tile) is refilled once both
// warpgroups' products of it are done (the barrier of the step after). As a chunk ends, its
// partial is stored, or, for a row-parallel product, added into the chunks' canonical tree
// right there (`sum`), which saves tree_sum_f32's pass over every chunk. f16 weights need no
// dequantizing threads: they take gemm_tma (below).

// the tile's token rows and line bytes; WG_ROWS, WG_LINE and WG_STAGES in
// executor/src/cuda/rows.rs size the shared memory with the same numbers
#define WG_BM 128
#define WG_LINE 128
// steps in flight: 4 measured faster than 6 for 128-row tiles (bench/prefill-cuda.md)
#define WG_STAGES 4
#define WG_AHEAD (WG_STAGES - 2)

// A tensor map (CUtensorMap, made by the host's cuTensorMapEncodeTiled), passed by value: the
// activations' and each weight's of a gemm_tma launch.
struct __align__(64) TensorMap {
    unsigned long long word[16];
};
struct TmaMaps {
    TensorMap a;
    TensorMap w[GEMM_MAX_WEIGHTS];
};

// Everything below emits sm_90a instructions (wgmma, the proxy fence): it is compiled only
// there, and the kernels trap elsewhere (the host never launches them elsewhere), so every
// other architecture's PTX loads.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL

// The operand descriptor of a K-major tile at shared address `at` (1024-byte aligned at the
// tile, plus 32 bytes per 16-deep slice): lines of 128 bytes with the 128-byte swizzle, 8-line
// groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long wg_desc(u32 at) {
    return (unsigned long long)((at & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy writes of shared memory (cp.async, stores) visible to the
// tensor cores' reads (the async proxy).
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// d += a b over one 16-deep slice: a 64 x 16 (desc a), b 128 x 16 (desc b), both K-major.
__device__ __forceinline__ void wgmma_m64n128k16(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred keep;\nsetp.ne.b32 keep, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, keep, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b));
}

// Keeps the compiler from moving accumulator registers across the asynchronous products.
__device__ __forceinline__ void wg_hold(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// One 64-deep step of a warpgroup's products, issued and committed (not waited for): acc[b]
// += the 64 token rows at `at` times the 128 weight rows at bt + b * 128 lines, both K-major
// 128-byte-swizzled tiles. The accumulators' last writes (a finished chunk's zeros) come
// before the fence.
template <int NB>
__device__ __forceinline__ void wg_step(float (&acc)[NB][64], u32 at, u32 bt) {
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int e = 0; e < 64; ++e) wg_hold(acc[b][e]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < GEMM_BK / 16; ++kk)
#pragma unroll
        for (int b = 0; b < NB; ++b)
            wgmma_m64n128k16(acc[b], wg_desc(at + 32 * kk), wg_desc(bt + b * 128 * WG_LINE + 32 * kk));
    wg_commit();
}

// Accumulator e of a thread: 8-column group e / 4 of its 128-row product b, token row
// row_base + 8 ((e / 2) % 2), columns col_base + b * 128 + 8 (e / 4) and the next. BODY runs
// for each pair (e, e + 1) inside the product (token row t, columns c and c + 1).
#define WG_EACH_PAIR(BODY)                                                                         \
    _Pragma("unroll") for (int b = 0; b < NB; ++b) _Pragma("unroll") for (int e = 0; e < 64; e += 2) { \
        const int t = row_base + 8 * ((e / 2) % 2);                                                \
        const int c = col_base + b * 128 + 8 * (e / 4);                                            \
        if (t < m && c < n) { BODY }                                                               \
    }

// Stores the accumulators of a warpgroup's 64 token rows to dst (rows of n) and sets them to 0.
template <int NB>
__device__ __forceinline__ void wg_store(float (&acc)[NB][64], float* dst, int m, int n, int row_base, int col_base) {
    const bool pairs = n % 2 == 0;
    WG_EACH_PAIR({
        float* d = dst + (size_t)t * n + c;
        if (pairs) {
            *(float2*)d = make_float2(acc[b][e], acc[b][e + 1]);
        } else {
            d[0] = acc[b][e];
            if (c + 1 < n) d[1] = acc[b][e + 1];
        }
    })
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[b][e] = 0.f;
}

// The accumulators of a warpgroup's 64 token rows as chunk z of the product ends: with
// `sum`, the partial joins the canonical tree (the left subtrees waiting beside it, each kept
// in y at its first chunk's place, are added in, in tree_sum_f32's order) and the whole tree
// goes to `sum`; else it is stored as chunk z. A thread reads back only values it wrote
// itself. The accumulators start again at 0.
template <int NB>
__device__ __forceinline__ void wg_finish(float (&acc)[NB][64], int z, int chunks, float* y, float* sum, int m, int n,
                                          int row_base, int col_base) {
    const bool pairs = n % 2 == 0;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int e = 0; e < 64; ++e) wg_hold(acc[b][e]);
    int at = z;
    for (int span = 1; sum && span < chunks && (z + 1) % (2 * span) == 0; span *= 2) {
        at -= span;
        const float* left = y + (size_t)at * m * n;
        WG_EACH_PAIR({
            const float* l = left + (size_t)t * n + c;
            if (pairs) {
                const float2 v = *(const float2*)l;
                acc[b][e] = v.x + acc[b][e];
                acc[b][e + 1] = v.y + acc[b][e + 1];
            } else {
                acc[b][e] = l[0] + acc[b][e];
                if (c + 1 < n) acc[b][e + 1] = l[1] + acc[b][e + 1];
            }
        })
    }
    wg_store<NB>(acc, sum && z == chunks - 1 ? sum : y + (size_t)at * m * n, m, n, row_base, col_base);
}
#undef WG_EACH_PAIR

template <class P>
__device__ __forceinline__ void gemm_wg_run(const u16* a, const GemmJob& job, int m, int k, int chunks, float* sum) {
    // a dequantized tile has 128 weight rows, a pair of threads each
    constexpr int BN = 128, NB = 1;
    static_assert(P::RAW > 0 && !gemm_direct_f16<P>(), "a planar quantized layout");
    const GemmPart part = gemm_part<WG_BM, BN>(job, (m + WG_BM - 1) / WG_BM);
    const u8* w = part.w;
    float* y = part.y;
    const int n = part.n, bx = part.bx;
    constexpr int STAGE = WG_BM * WG_LINE + BN * P::RAW;  // bytes of one stage
    // the descriptors address tiles 1 KiB-aligned (the swizzle's period)
    static_assert(STAGE % 1024 == 0 && (BN * WG_LINE) % 1024 == 0, "stages and tiles on 1 KiB");
    extern __shared__ u8 smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;               // the swizzle repeats every 1 KiB
    u8* smem = smem_raw + (base - smem_addr(smem_raw));
    // dequantized weights: two f16 tiles after the stages, step s's in tile s % 2
    u8* tiles = smem + WG_STAGES * STAGE;
    const int tid = threadIdx.x, wg = tid / 128;
    const int t0 = part.t0, n0 = bx * BN;
    // the steps of every chunk in k order, one pipeline: chunk z's partial is finished as its
    // last step ends
    const int steps = k / GEMM_BK, chunk_steps = steps / chunks;
    // activation lines: thread tid copies piece tid % 8 of lines tid / 8 + 32 j; stored
    // bytes: weight row tid / 2 is served by threads 2 (tid / 2) and 2 (tid / 2) + 1
    const int piece = tid % 8, line0 = tid / 8;
    const int br = tid / 2, bhalf = tid % 2;
    const auto issue = [&](int s) {
        u8* st = smem + (s % WG_STAGES) * STAGE;
        const int k0 = s * GEMM_BK;
#pragma unroll
        for (int j = 0; j < WG_BM / 32; ++j) {
            const int r = line0 + 32 * j;
            const bool valid = t0 + r < m;
            cp_async16(st + r * WG_LINE + ((piece ^ (r % 8)) << 4), valid ? a + (size_t)(t0 + r) * k + k0 + 8 * piece : a,
                       valid);
        }
        P::copy(w, n, k, n0 + br, k0, st + WG_BM * WG_LINE + br * P::RAW, bhalf, n0 + br < n);
    };
    float acc[NB][64];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[b][e] = 0.f;
    // accumulator e of a thread: 8-column group e / 4, row lane / 4 + 8 ((e / 2) % 2), column
    // 2 (lane % 4) + e % 2, in the rows of its warp (16 per warp of the warpgroup)
    const int lane = tid % 32, row_base = t0 + wg * 64 + ((tid / 32) % 4) * 16 + lane / 4;
    const int col_base = n0 + 2 * (lane % 4);
    overlap_with_neighbours();
#pragma unroll
    for (int s = 0; s < WG_AHEAD; ++s) {
        if (s < steps) issue(s);
        cp_async_commit();
    }
    for (int z = 0, s = 0; z < chunks; ++z) {
        for (int end = s + chunk_steps; s < end; ++s) {
            cp_async_wait<WG_AHEAD - 1>();
            fence_async_shared();
            // step s is in its stage for every thread; both warpgroups' products of step s - 2
            // are done (each waited for them at the end of step s - 1), so its stage and its
            // dequantized tile are free
            __syncthreads();
            if (s + WG_AHEAD < steps) issue(s + WG_AHEAD);
            cp_async_commit();
            const u32 st = base + (s % WG_STAGES) * STAGE;
            // this thread's 32 values of row br as f16, swizzled like a copied line
            __align__(16) u16 v[32];
            P::dequant32(smem + (s % WG_STAGES) * STAGE + WG_BM * WG_LINE + br * P::RAW, bhalf, v);
            u8* line = tiles + (s % 2) * (BN * WG_LINE) + br * WG_LINE;
#pragma unroll
            for (int j = 0; j < 4; ++j)
                *(uint4*)(line + (((4 * bhalf + j) ^ (br % 8)) << 4)) = *(const uint4*)(v + 8 * j);
            fence_async_shared();
            __syncthreads();
            const u32 bt = base + WG_STAGES * STAGE + (s % 2) * (BN * WG_LINE);
            const u32 at = st + wg * 64 * WG_LINE;
            wg_step<NB>(acc, at, bt);
            wg_wait<1>();
        }
        // the chunk's products are done: its partial goes out, and the next chunk starts at 0
        wg_wait<0>();
        wg_finish<NB>(acc, z, chunks, y, sum, m, n, row_base, col_base);
    }
    cp_async_wait<0>();
}

// ---- Hopper: warp-specialized f16 products, tiles copied by the tensor memory accelerator ----
//
// gemm_tma<BN>_f16 (BN = 128 or 256): gemm128_f16's products (same job, chunks and per-output
// order, so the same bits) on gemm_wg's warpgroup products, chunk walk and chunk tree, with
// the copies taken off the product warps. A block has three warpgroups. Warpgroup 0 produces:
// one thread issues each step's two bulk tensor copies (the step's 64 values of the tile's 128
// token rows and of its BN weight rows, 128-byte lines with the 128-byte swizzle the operand
// descriptors name; rows past m or n arrive as zeros) into a ring of TMA_STAGES stages, each
// copy completing on its stage's `full` barrier. Warpgroups 1 and 2 take token rows 0..63 and
// 64..127 of the tile: each waits for a stage's `full`, issues its products and, once they are
// done (the next step's wait), releases the stage on its `empty` barrier (one arrival per
// product warp), which the producer waits for before it refills the stage. The producer gives
// its registers up (setmaxnreg: 40 a thread) so that the product warpgroups may use 232.

// gemm_tma128_tree_f16: gemm_tma128_f16 for a row-parallel product of up to 8 chunks into
// `sum`, with the chunks' tree kept on chip: a warpgroup holds the pending left subtree of
// one chunk in registers and those of two and of four in shared memory (each thread its own
// values), so no partial goes through y and a chunk's end costs a few adds. (The subtree of
// two in registers too spills: 192 values and the addresses exceed the 232 registers.)

// the tile's stages: TMA_STAGES, TMA_TREE_STAGES, WG_BM and WG_LINE in
// executor/src/cuda/rows.rs size the shared memory with the same numbers (192 KiB of stages
// for either tile; 96 KiB beside the tree's 128 KiB of subtrees)
#define TMA_STAGES(BN) ((BN) == 256 ? 4 : 6)
#define TMA_TREE_STAGES 3
#define TMA_THREADS 384

__device__ __forceinline__ void bar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Arrives on the barrier and adds `bytes` to the transfers its phase waits for.
__device__ __forceinline__ void bar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void bar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nretry:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra retry;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// The box of `map` at (x: the column, y: the row) to shared address dst, completing on `bar`.
__device__ __forceinline__ void tma_tile(u32 dst, const TensorMap* map, int x, int y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// The chunk tree of gemm_tma128_tree_f16 as chunk z (of `chunks`, a power of two up to 8)
// ends, tree_sum_f32's order: acc joins the pending left subtrees it completes (l1: one chunk;
// l2 and l4: two and four, in shared memory, value e at [128 e]); true when acc then holds the
// whole tree, else acc waits as the pending subtree of its size (and the caller zeroes it).
__device__ __forceinline__ bool tma_tree(float (&acc)[64], float (&l1)[64], float* l2, float* l4, int z, int chunks) {
    if (chunks == 1) return true;
    if (z % 2 == 0) {
#pragma unroll
        for (int e = 0; e < 64; ++e) l1[e] = acc[e];
        return false;
    }
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = l1[e] + acc[e];
    if (chunks == 2) return true;
    if ((z + 1) % 4 != 0) {
#pragma unroll
        for (int e = 0; e < 64; ++e) l2[128 * e] = acc[e];
        return false;
    }
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = l2[128 * e] + acc[e];
    if (chunks == 4) return true;
    if ((z + 1) % 8 != 0) {
#pragma unroll
        for (int e = 0; e < 64; ++e) l4[128 * e] = acc[e];
        return false;
    }
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = l4[128 * e] + acc[e];
    return true;
}

template <int BN, bool TREE>
__device__ __forceinline__ void gemm_tma_run(const TmaMaps& maps, const GemmJob& job, int m, int k, int chunks,
                                             float* sum) {
    constexpr int NB = BN / 128, STAGES = TREE ? TMA_TREE_STAGES : TMA_STAGES(BN);
    constexpr u32 A_BYTES = WG_BM * WG_LINE, STAGE = A_BYTES + BN * WG_LINE;
    static_assert(STAGE % 1024 == 0, "stages on 1 KiB, the swizzle's period");
    static_assert(!TREE || NB == 1, "the on-chip tree holds a 128-row tile's subtrees");
    const GemmPart part = gemm_part<WG_BM, BN>(job, (m + WG_BM - 1) / WG_BM);
    extern __shared__ u8 smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    u8* smem = smem_raw + (base - smem_addr(smem_raw));
    // after the stages: the tree's subtrees of two and of four chunks (TREE: a float per value
    // of the tile each), then the barriers full[STAGES] and empty[STAGES]
    float* twos = (float*)(smem + STAGES * STAGE);
    float* fours = twos + (TREE ? WG_BM * BN : 0);
    const u32 full = base + STAGES * STAGE + (TREE ? 2 * WG_BM * BN * 4 : 0), empty = full + 8 * STAGES;
    const int tid = threadIdx.x, wg = tid / 128;
    const int steps = k / GEMM_BK, chunk_steps = steps / chunks;
    if (tid == 0) {
        for (int i = 0; i < STAGES; ++i) {
            bar_init(full + 8 * i, 1);
            bar_init(empty + 8 * i, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    overlap_with_neighbours();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            const TensorMap* w = &maps.w[part.index];
            for (int s = 0; s < steps; ++s) {
                const int slot = s % STAGES;
                // the products of step s - STAGES, the stage's last, are done
                if (s >= STAGES) bar_wait(empty + 8 * slot, (s / STAGES - 1) & 1);
                const u32 st = base + slot * STAGE, bar = full + 8 * slot;
                bar_expect(bar, STAGE);
                tma_tile(st, &maps.a, s * GEMM_BK, part.t0, bar);
                tma_tile(st + A_BYTES, w, s * GEMM_BK, part.bx * BN, bar);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1, lane = tid % 32;
        const int row_base = part.t0 + cw * 64 + ((tid / 32) % 4) * 16 + lane / 4;
        const int col_base = part.bx * BN + 2 * (lane % 4);
        float acc[NB][64];
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[b][e] = 0.f;
        // TREE: the pending subtree of one chunk, and this thread's values of those of two and four
        float ones[TREE ? 64 : 1];
        const int mine = cw * 64 * 128 + tid % 128;
        for (int z = 0, s = 0; z < chunks; ++z) {
            for (const int first = s, end = s + chunk_steps; s < end; ++s) {
                const int slot = s % STAGES;
                bar_wait(full + 8 * slot, (s / STAGES) & 1);
                const u32 at = base + slot * STAGE + cw * 64 * WG_LINE, bt = base + slot * STAGE + A_BYTES;
                wg_step<NB>(acc, at, bt);
                wg_wait<1>();
                // this warp's products of step s - 1 are done: its share of that stage is free
                if (s > first && lane == 0) bar_arrive(empty + 8 * ((s - 1) % STAGES));
            }
            wg_wait<0>();
            if (lane == 0) bar_arrive(empty + 8 * ((s - 1) % STAGES));
            if constexpr (TREE) {
#pragma unroll
                for (int e = 0; e < 64; ++e) wg_hold(acc[0][e]);
                if (tma_tree(acc[0], ones, twos + mine, fours + mine, z, chunks)) {
                    wg_store<NB>(acc, sum, m, part.n, row_base, col_base);
                } else {
#pragma unroll
                    for (int e = 0; e < 64; ++e) acc[0][e] = 0.f;
                }
            } else {
                wg_finish<NB>(acc, z, chunks, part.y, sum, m, part.n, row_base, col_base);
            }
        }
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// gemm_wg128_<dtype>, gemm_tma<BN>_f16: with `sum` null, chunk z's partial to y[z] as gemm128 stores it; else
// the chunks' partials combined in the canonical tree (tree_sum_f32's) to `sum`, y holding the
// subtrees meanwhile (the job has one weight then)
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define WG_BODY(P) gemm_wg_run<P>(a, job, m, k, chunks, sum);
#else
#define WG_BODY(P) __trap();
#endif
#define GEMM_WG(name, P)                                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                              \
        name(const u16* a, const GemmJob job, int m, int k, int chunks, float* sum) {              \
        WG_BODY(P)                                                                                 \
    }

GEMM_WG(gemm_wg128_q8_0, GemmQ8_0)
GEMM_WG(gemm_wg128_q4_0, GemmQ4<false>)
GEMM_WG(gemm_wg128_q4_1, GemmQ4<true>)

// gemm_tma<BN>_f16 and gemm_tma128_tree_f16: f16 weights, the copies by the tensor memory
// accelerator
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define TMA_BODY(BN, TREE) gemm_tma_run<BN, TREE>(maps, job, m, k, chunks, sum);
#else
#define TMA_BODY(BN, TREE) __trap();
#endif
#define GEMM_TMA(name, BN, TREE)                                                                   \
    extern "C" __global__ void __launch_bounds__(TMA_THREADS, 1) name(                             \
        const __grid_constant__ TmaMaps maps, const GemmJob job, int m, int k, int chunks, float* sum) { \
        TMA_BODY(BN, TREE)                                                                         \
    }

GEMM_TMA(gemm_tma128_f16, 128, false)
GEMM_TMA(gemm_tma256_f16, 256, false)
GEMM_TMA(gemm_tma128_tree_f16, 128, true)

extern "C" __global__ void to_f16_f32(const float* x, u16* out, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_f16(x[i]);
}

extern "C" __global__ void swiglu_rows_f32(const float* gate, const float* up, float* out, u16* out16, int n,
                                           float limit) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float y = swiglu_limited(gate[i], up[i], limit);
    out[i] = y;
    if (out16) out16[i] = f32_to_f16(y);
}

extern "C" __global__ void add_rows_f32(float* x, const float* b, int cols, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + b[i % cols];
}

extern "C" __global__ void row_positions_u32(const u32* pos, u32* out, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = pos[0] + (u32)i;
}
