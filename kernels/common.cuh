// memra kernels: shared definitions. The host prepends this header to every kernels/*.cu file
// before NVRTC compiles it (the `#include "common.cuh"` line is replaced by this text), so the
// files need no include path and no CUDA headers. It owns the scalar conversions, the fixed
// warp reduction order and the per-element dequantization of every GGUF block layout that
// memra supports; all of it must stay bit-exact with memra_gguf::dequantize.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// the sequence slot of a pad row of a batched step (PAD_SLOT in executor/src/cuda/ops.rs): no
// sequence has it, so attention and the cache writes skip it
#define PAD_SLOT 0xffffffffu

#define WARP 32
#define FULL_MASK 0xffffffffu

// f16 -> f32, exact.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 with round-to-nearest-even, as memra_gguf::f16::f32_to_f16.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// f32 rounded to the nearest f16 value (round to nearest even), kept as f32.
__device__ __forceinline__ float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// One 32-value block of an activation row's 8-bit copy (q8_1's layout), its values in 32 / N
// consecutive lanes aligned by that count, N values each (lane l the values N l .. N l + N -
// 1; every lane of the warp takes part, a lane without values with zeros). q =
// round_half_even(v * id) with d = amax / 127 and id = 127 / amax (0 for an all-zero block);
// the max and the integer sum are exact, so any lanes that hold a block's values make its bits.
// Returns the lane's N quants packed from the low byte and the block's (d, d * sum) as the f16
// values the format stores (as the CPU does).
struct Q8Block {
    u32 quants;
    float2 pair;
};
template <int N>
__device__ __forceinline__ Q8Block quantize_block32(const float (&v)[N]) {
    static_assert(N == 1 || N == 4, "a block's values in 32 or 8 lanes");
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int off = 16 / N; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, off));
    const float d = __fdiv_rn(amax, 127.f);
    const float id = amax != 0.f ? __fdiv_rn(127.f, amax) : 0.f;
    u32 quants = 0;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int q = __float2int_rn(__fmul_rn(v[i], id));
        quants |= (u32)(q & 255) << (8 * i);
        sum += q;
    }
#pragma unroll
    for (int off = 16 / N; off > 0; off >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, off);
    return {quants, make_float2(round_f16(d), round_f16(__fmul_rn(d, (float)sum)))};
}

// bf16 -> f32, exact.
__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// Unaligned-safe little-endian reads from a byte pointer with the given alignment.
__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return *(const u16*)p;
}

__device__ __forceinline__ u32 ld_u32_a2(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}

// The float of a small integer (q + 2^23 < 2^24 exactly, then minus the bias `off`): an integer
// op and an add instead of the slow I2F conversion. `off` must be 2^23 + k for the value q - k;
// the result is exact, so it equals (float)(q - k) bit for bit.
__device__ __forceinline__ float small_to_f32(u32 q, float off) {
    return __int_as_float(0x4B000000u | q) - off;
}
#define BIAS0 8388608.0f    // 2^23: q
#define BIAS8 8388616.0f    // 2^23 + 8: q - 8
#define BIAS32 8388640.0f   // 2^23 + 32: q - 32
#define BIAS128 8388736.0f  // 2^23 + 128: q - 128

// An exact i32 -> f32 for |v| < 2^22 without the slow I2F: 1.5 * 2^23 + v has the integer in
// its mantissa, and subtracting 1.5 * 2^23 leaves v exactly. An integer sum that starts from
// INT_BIAS (an mma's accumulator) is already biased: biased_to_f32 takes it.
#define INT_BIAS 0x4B400000
__device__ __forceinline__ float biased_to_f32(int biased) { return __int_as_float(biased) - 12582912.0f; }
__device__ __forceinline__ float int_to_f32(int v) { return biased_to_f32(INT_BIAS + v); }

// 1 / x correctly rounded, the bits of __frcp_rn (and so of the CPU's 1.0 / x, but for a
// NaN's payload), in three dependent instructions where the result is normal: the hardware's
// approximation (within an ulp), then one Newton step whose residual the FMA holds exactly.
// Elsewhere (zeros, subnormals, the largest and smallest exponents, inf, NaN) __frcp_rn
// itself. One Newton step from an approximation within an ulp is not correctly rounded in
// general; that it is from this hardware's is a measured fact, not a proof: the self-test
// (rcp_rn_mismatches in check.cu) compares it with __frcp_rn on every float, so it must pass
// on each GPU generation memra runs on (sm_90: 0 of 2^32 differ). A chain of divisions, as
// the Sinkhorn passes of mhc.cu are, waits on its reciprocals one after another; __frcp_rn's
// general routine made those chains the longest part of their kernels.
__device__ __forceinline__ float rcp_rn(float x) {
    const float ax = fabsf(x);
    if (ax >= 0x1p-125f && ax <= 0x1p125f) {
        float r;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
        return __fmaf_rn(r, __fmaf_rn(-x, r, 1.0f), r);
    }
    return __frcp_rn(x);
}

// Packed bytes: four ones (a __dp4a sum), four low nibbles.
#define ONES 0x01010101
#define NIB 0x0f0f0f0f

// Sum over the 32 lanes by a fixed xor butterfly; every lane gets the same bits, because each
// step adds the same two values on both partner lanes.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

// The same over each half-warp (lanes 0..15 and 16..31 separately).
// Replaces sc[p] (p < n, strided by the block's `threads`) by expf(sc[p] - mx) and returns
// the warp's sum of them; the callers combine the warps' sums in their own fixed orders.
__device__ __forceinline__ float exp_in_place_warp_sum(float* sc, int n, float mx, int threads) {
    float sum = 0.f;
    for (int p = threadIdx.x; p < n; p += threads) {
        const float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += e;
    }
    return warp_sum(sum);
}

// The sum of each group of `lanes` neighbouring lanes (a power of two up to 16), neighbours
// first; over sixteen lanes the tree (S0 + S1) + (S2 + S3) with S_g = (l_4g + l_4g+1) +
// (l_4g+2 + l_4g+3), which matvec_mma.cu builds four lanes' chains at a time. Values in the
// first lanes of a smaller group get the bits sixteen lanes give them when the others hold
// +0.0: the later steps only add those, and x + +0.0 == x for every x but -0.0 (which a chain
// of fmaf from +0.0 never yields).
__device__ __forceinline__ float lanes_sum(float v, int lanes) {
#pragma unroll
    for (int off = 1; off < 16; off <<= 1)
        if (off < lanes) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

// An mma m16n8 accumulator tile of scores (sc[x]: position pos0 + (x & 1) of the tile's row
// x >> 1) scaled, positions from `n` on set to -inf, and folded into the two rows' maxima.
__device__ __forceinline__ void scale_masked(float (&sc)[4], int pos0, int n, float scale, float (&mx)[2]) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        sc[x] = pos0 + (x & 1) < n ? sc[x] * scale : -__int_as_float(0x7f800000);
        mx[x >> 1] = fmaxf(mx[x >> 1], sc[x]);
    }
}

// The two rows' maxima over the four lanes of each quad, which share an accumulator row.
__device__ __forceinline__ void quad_max(float (&mx)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 2));
    }
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

// ---- programmatic dependent launch (sm_90 and up; a no-op elsewhere, and when the kernel
// was not launched as a programmatic dependent). The host launches every kernel so that it
// may start while the previous kernel on its stream drains; each kernel calls one of these
// before its first read or write of memory another kernel touches, and before any early
// return (so no grid completes before its predecessor did, and completion stays ordered). ----

// Waits until the previous kernel on the stream has completed and its writes are visible.
__device__ __forceinline__ void wait_for_predecessor() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream begin launching (its blocks then wait in
// wait_for_predecessor). Before its own wait, a kernel may only read memory no kernel writes
// (the weights).
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Both: the next kernel may launch, then this one waits for the previous. Kernels that spin
// on other grids (the collectives) only wait: a dependent launched early could hold the SMs
// that the grids they wait for need.
__device__ __forceinline__ void overlap_with_neighbours() {
    launch_dependents();
    wait_for_predecessor();
}

// ---- RMS norm scale: shared by rms_norm_f32 (norm.cu) and the matvecs that normalize x
// themselves (matvec.cu), so both give the same bits ----

#define NORM_THREADS 256
#define NORM_UNROLL 8
// loads in flight per thread where the kernel's registers allow more: 24576 values (the mHC
// streams) in three rounds instead of twelve
#define NORM_UNROLL_WIDE 32

// 1 / sqrt(mean(x[0..n)^2) + eps) for every thread of a block of at least NORM_THREADS
// threads (all must call it). Thread t < NORM_THREADS adds x[t]^2, x[t + T]^2, ... in f64 (as
// ggml and the CPU backend do), issuing UNROLL loads before the first add (the order is the
// same for any UNROLL); the warps' sums are then added in warp order, so the result is
// deterministic.
template <int UNROLL = NORM_UNROLL>
__device__ float block_rms_scale(const float* x, int n, float eps) {
    __shared__ double partial[NORM_THREADS / WARP];
    __shared__ float scale;
    if (threadIdx.x < NORM_THREADS) {
        double sum = 0.0;
        for (int i0 = threadIdx.x; i0 < n; i0 += UNROLL * NORM_THREADS) {
            float v[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const int i = i0 + k * NORM_THREADS;
                v[k] = i < n ? x[i] : 0.f;
            }
#pragma unroll
            for (int k = 0; k < UNROLL; ++k)
                if (i0 + k * NORM_THREADS < n) sum += (double)__fmul_rn(v[k], v[k]);
        }
        sum = warp_sum_f64(sum);
        if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < NORM_THREADS / WARP; ++w) total += partial[w];
        float mean = (float)(total / (double)n);
        scale = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    return scale;
}

// Pair (x0, x1) of pair index i rotated to the angle `angle0 * theta_scale^i`.
__device__ __forceinline__ float2 rope_pair(float x0, float x1, int i, float angle0, float theta_scale) {
    float angle = angle0;
    for (int k = 0; k < i; ++k) angle = __fmul_rn(angle, theta_scale);
    float s, c;
    sincosf(angle, &s, &c);
    return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
}

// The SiLU-gated product of the FFN: silu(g) * u with silu(g) = g / (1 + exp(-g)).
__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// silu_mul after ggml's swiglu_clamp (glm5-next's FFNs) when limit > 0: the gate clamped from
// above, the up value into [-limit, limit] (the CPU's silu_mul_clamped).
__device__ __forceinline__ float swiglu_limited(float g, float u, float limit) {
    if (limit > 0.f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return silu_mul(g, u);
}

// Combines per-chunk partials held by lanes 0..chunks-1 (a power of two, at most 32) in a
// balanced binary tree ((c0 + c1) + (c2 + c3)) + ...; the result is valid in lane 0.
__device__ __forceinline__ float chunk_tree(float v, int chunks) {
    const int lane = threadIdx.x & 31;
    for (int s = 1; s < chunks; s <<= 1) {
        float other = __shfl_down_sync(FULL_MASK, v, s);
        if ((lane & (2 * s - 1)) == 0) v = v + other;
    }
    return v;
}

// ---- tensor cores (sm_80 and later): ldmatrix fragments from shared memory and the
// 16 x 8 x 16 f16 product with f32 accumulation, as kernels/gemm.cu and kernels/flash.cu use
// them ----

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Four 8 x 8 matrices of 16-bit values (or of 8 x 16 bytes: lane l gets bytes 4 (l % 4) ..
// of row l / 4); lanes 8i .. 8i + 7 give matrix i's row addresses, as shared addresses.
__device__ __forceinline__ void ldmatrix_x4_at(u32* r, u32 at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}
__device__ __forceinline__ void ldmatrix_x4(u32* r, const u16* p) { ldmatrix_x4_at(r, smem_addr(p)); }

// Two such matrices (lanes 0 .. 15 give the addresses).
__device__ __forceinline__ void ldmatrix_x2_at(u32* r, u32 at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// Asynchronous copies of 16, 8 or 4 bytes from global to shared memory (sm_80 and later), to
// a pointer or (`_at`) a shared address; with `valid` false the destination gets zeros and
// `src` is not read. A thread's copies since its last commit form a group; cp_async_wait<N>
// waits until at most N of its groups are in flight.
__device__ __forceinline__ void cp_async16_at(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8_at(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async4_at(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) { cp_async16_at(smem_addr(dst), src, valid); }
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) { cp_async8_at(smem_addr(dst), src, valid); }
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) { cp_async4_at(smem_addr(dst), src, valid); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Two f32 values as an f16 pair (the lower index in the low half): an mma operand register.
__device__ __forceinline__ u32 f16_pair(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}

// Halves d .. d + 7 of an f16 row of n values (zeros past n, a multiple of 4; a row whose n
// is not a multiple of 8 is only 8-byte aligned): a lane's k operands of two mma k steps.
__device__ __forceinline__ uint4 f16x8_at(const u16* row, int d, int n) {
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if ((n & 7) == 0) {
        if (d < n) w = *(const uint4*)(row + d);
    } else {
        if (d < n) {
            const uint2 lo = *(const uint2*)(row + d);
            w.x = lo.x;
            w.y = lo.y;
        }
        if (d + 4 < n) {
            const uint2 hi = *(const uint2*)(row + d + 4);
            w.z = hi.x;
            w.w = hi.y;
        }
    }
    return w;
}

// c += a b for a 16 x 16 row-major f16 fragment a and a 16 x 8 column-major one (b0, b1).
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- per-element dequantization, one value `i` of a row, in the device layout of
// DeviceWeight::upload (executor/src/cuda/ops.rs): ggml's block layout, except that q8_0,
// q4_0 and q4_1 matrices are stored in two planes, every block's quant bytes first (row-major
// over blocks), then every block's scale bytes in the same order ----

// One row of a weight: its quant bytes (the whole row for unsplit layouts) and, for planar
// layouts, its scale bytes.
struct WeightRow {
    const u8* q;
    const u8* s;
};

// Row `r` of a `rows` x `cols` weight of BLOCK-value blocks with QS quant bytes and S scale
// bytes each (S = 0: an unsplit layout, QS the whole block).
template <int BLOCK, int QS, int S>
__device__ __forceinline__ WeightRow weight_row(const u8* w, int rows, int cols, int r) {
    const size_t nb = (size_t)(cols / BLOCK);
    return {w + (size_t)r * nb * QS, S == 0 ? nullptr : w + (size_t)rows * nb * QS + (size_t)r * nb * S};
}

__device__ __forceinline__ float deq_f32(WeightRow row, int i) {
    return ((const float*)row.q)[i];
}

__device__ __forceinline__ float deq_f16(WeightRow row, int i) {
    return f16_to_f32(((const u16*)row.q)[i]);
}

__device__ __forceinline__ float deq_bf16(WeightRow row, int i) {
    return bf16_to_f32(((const u16*)row.q)[i]);
}

// q8_0: per 32 values i8 qs[32] and f16 d; value = q * d.
__device__ __forceinline__ float deq_q8_0(WeightRow row, int i) {
    return (float)(i8)row.q[i] * f16_to_f32(ld_u16(row.s + 2 * (i / 32)));
}

// q4_0: per 32 values qs[16] (low nibbles are values 0..15, high 16..31) and f16 d;
// value = (q - 8) * d.
__device__ __forceinline__ float deq_q4_0(WeightRow row, int i) {
    const int j = i % 32;
    const u8 byte = row.q[16 * (i / 32) + j % 16];
    const int q = j < 16 ? (byte & 15) : (byte >> 4);
    return (float)(q - 8) * f16_to_f32(ld_u16(row.s + 2 * (i / 32)));
}

// q4_1: per 32 values qs[16] and f16 d, f16 m; value = q * d + m.
__device__ __forceinline__ float deq_q4_1(WeightRow row, int i) {
    const int j = i % 32;
    const u8 byte = row.q[16 * (i / 32) + j % 16];
    const int q = j < 16 ? (byte & 15) : (byte >> 4);
    const u8* dm = row.s + 4 * (i / 32);
    return __fadd_rn(__fmul_rn((float)q, f16_to_f32(ld_u16(dm))), f16_to_f32(ld_u16(dm + 2)));
}

// q4_K sub-block scale and minimum (6 bits each) of sub-block j in 0..8.
__device__ __forceinline__ void q4k_scale_min(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// q4_K: 144 bytes per 256 values: f16 d, f16 dmin, scales[12], qs[128]; 32-byte groups of qs
// hold two sub-blocks (low nibbles, then high); value = d * sc * q - dmin * m.
__device__ __forceinline__ float deq_q4_k(WeightRow row, int i) {
    const u8* b = row.q + (i / 256) * 144;
    int j = i % 256;
    int sub = j / 32;
    int sc, m;
    q4k_scale_min(sub, b + 4, &sc, &m);
    u8 byte = b[16 + (sub / 2) * 32 + j % 32];
    int q = (sub & 1) ? (byte >> 4) : (byte & 15);
    float dl = __fmul_rn(f16_to_f32(ld_u16(b)), (float)sc);
    float ml = __fmul_rn(f16_to_f32(ld_u16(b + 2)), (float)m);
    return __fsub_rn(__fmul_rn(dl, (float)q), ml);
}

// q6_K: 210 bytes per 256 values: ql[128], qh[64], i8 scales[16], f16 d;
// value = d * scale * (q - 32).
__device__ __forceinline__ float deq_q6_k(WeightRow row, int i) {
    const u8* b = row.q + (i / 256) * 210;
    int j = i % 256;
    int n = j / 128, e = j % 128;
    int l = e % 32, k = e / 32;
    const u8* ql = b + 64 * n;
    u8 h = b[128 + 32 * n + l];
    u8 lo = (k & 1) ? ql[l + 32] : ql[l];
    int q = ((k & 2) ? (lo >> 4) : (lo & 15)) | (((h >> (2 * k)) & 3) << 4);
    float sc = (float)(i8)b[192 + 8 * n + e / 16];
    return __fmul_rn(__fmul_rn(f16_to_f32(ld_u16(b + 208)), sc), (float)(q - 32));
}

// ---- attention's chunk-order merge: shared by attention.cu and mla.cu ----

// One step of the chunk-order merge of a softmax-weighted sum: (m, l, o) of the next chunk (its
// max score, its sum of exp(s - m) and its sum of exp(s - m) v) into the running (M, L, O).
// Explicit roundings, so that every kernel that merges gives the same bits.
struct Merged {
    float m, l, o;
};
__device__ __forceinline__ Merged merge_chunk(Merged run, Merged c, bool first) {
    if (first) return c;
    const float mx = fmaxf(run.m, c.m);
    const float a = expf(__fsub_rn(run.m, mx)), b = expf(__fsub_rn(c.m, mx));
    return {mx, __fadd_rn(__fmul_rn(run.l, a), __fmul_rn(c.l, b)), __fadd_rn(__fmul_rn(run.o, a), __fmul_rn(c.o, b))};
}

// Chunk partials part(0) .. part(n - 1) merged in chunk order (merge_chunk); the loads of
// MERGE_AHEAD chunks are issued before their merges, so a long context's partials do not cost
// a memory round trip each.
#define MERGE_AHEAD 8
template <typename Part>
__device__ __forceinline__ Merged merge_in_order(int n, Part part) {
    Merged run{};
    for (int c0 = 0; c0 < n; c0 += MERGE_AHEAD) {
        Merged p[MERGE_AHEAD];
#pragma unroll
        for (int u = 0; u < MERGE_AHEAD; ++u)
            if (c0 + u < n) p[u] = part(c0 + u);
#pragma unroll
        for (int u = 0; u < MERGE_AHEAD; ++u)
            if (c0 + u < n) run = merge_chunk(run, p[u], c0 + u == 0);
    }
    return run;
}
