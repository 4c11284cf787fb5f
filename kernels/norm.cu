// memra kernels: RMS norm, one block per row: out = x / sqrt(mean(x^2) + eps) * weight, the sum
// of squares taken in f64 (as ggml and the CPU backend do) over a fixed thread order and a
// fixed reduction tree, so the result is deterministic. Several rows sharing one weight (the
// per-head q/k norms of qwen3) are one launch with one block per row. With `out16`, each value
// also goes there narrowed to f16 (round to nearest even: to_f16_f32's bits), the input of a
// prefill step's products.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_f32(const float* x, const float* weight, float* out, u16* out16, int n, float eps) {
    overlap_with_neighbours();
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = out + (size_t)blockIdx.x * n;
    u16* hr = out16 ? out16 + (size_t)blockIdx.x * n : nullptr;
    const float s = block_rms_scale<NORM_UNROLL_WIDE>(xr, n, eps);
    // `out` may alias `x`: each thread reads its own terms before it writes them
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
