// memra kernels: RMS norm, one block per row: out = x / sqrt(mean(x^2) + eps) * weight, the sum
// of squares taken in f64 (as ggml and the CPU backend do) over a fixed thread order and a
// fixed reduction tree, so the result is deterministic. Several rows sharing one weight are
// one launch with one block per row; rms_norm_pair_f32 takes two such sets (the per-head q and
// k norms of qwen3) in one launch. With `out16`, each value also goes there narrowed to f16
// (round to nearest even: to_f16_f32's bits), the input of a prefill step's products.
#include "common.cuh"

// One row: yr = xr / sqrt(mean(xr^2) + eps) * weight (and its f16 copy into hr, if set).
__device__ __forceinline__ void norm_row(const float* xr, const float* weight, float* yr, u16* hr, int n, float eps) {
    const float s = block_rms_scale<NORM_UNROLL_WIDE>(xr, n, eps);
    // `yr` may alias `xr`: each thread reads its own terms before it writes them
    for (int i0 = threadIdx.x; i0 < n; i0 += NORM_UNROLL_WIDE * NORM_THREADS) {
        float v[NORM_UNROLL_WIDE], w[NORM_UNROLL_WIDE];
#pragma unroll
        for (int k = 0; k < NORM_UNROLL_WIDE; ++k) {
            const int i = i0 + k * NORM_THREADS;
            v[k] = i < n ? xr[i] : 0.f;
            w[k] = i < n ? weight[i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < NORM_UNROLL_WIDE; ++k) {
            const int i = i0 + k * NORM_THREADS;
            if (i >= n) continue;
            const float y = __fmul_rn(__fmul_rn(v[k], s), w[k]);
            yr[i] = y;
            if (hr) hr[i] = f32_to_f16(y);
        }
    }
}

// Row r of x and out starts at r * stride (rows of n values, stride >= n).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_f32(const float* x, const float* weight, float* out, u16* out16, int n, int stride, float eps) {
    overlap_with_neighbours();
    const size_t at = (size_t)blockIdx.x * stride;
    norm_row(x + at, weight, out + at, out16 ? out16 + at : nullptr, n, eps);
}

// Two sets of rows of n in one launch (qwen3's q and k head norms): blocks below `split` take
// the rows of (x, weight, out), the others those of (x2, weight2, out2).
extern "C" __global__ void __launch_bounds__(NORM_THREADS) rms_norm_pair_f32(const float* x, const float* weight, float* out, int split,
                                                                             const float* x2, const float* weight2, float* out2, int n,
                                                                             float eps) {
    overlap_with_neighbours();
    const bool first = (int)blockIdx.x < split;
    const size_t at = (size_t)(first ? blockIdx.x : blockIdx.x - split) * n;
    norm_row((first ? x : x2) + at, first ? weight : weight2, (first ? out : out2) + at, nullptr, n, eps);
}
