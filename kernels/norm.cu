// memra kernels: RMS norm, one block per row: out = x / sqrt(mean(x^2) + eps) * weight, the sum
// of squares taken in f64 (as ggml and the CPU backend do) over a fixed thread order and a
// fixed reduction tree, so the result is deterministic. Several rows sharing one weight (the
// per-head q/k norms of qwen3) are one launch with one block per row.
#include "common.cuh"

#define NORM_THREADS 256
#define NORM_UNROLL 8

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_f32(const float* x, const float* weight, float* out, int n, float eps) {
    __shared__ double partial[NORM_THREADS / WARP];
    __shared__ float scale;
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = out + (size_t)blockIdx.x * n;
    // thread t adds x[t]^2, x[t + T]^2, ... in that order; the loads of NORM_UNROLL terms are
    // issued before the first add, so the thread waits for memory once per NORM_UNROLL terms
    double sum = 0.0;
    for (int i0 = threadIdx.x; i0 < n; i0 += NORM_UNROLL * NORM_THREADS) {
        float v[NORM_UNROLL];
#pragma unroll
        for (int k = 0; k < NORM_UNROLL; ++k) {
            const int i = i0 + k * NORM_THREADS;
            v[k] = i < n ? xr[i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < NORM_UNROLL; ++k)
            if (i0 + k * NORM_THREADS < n) sum += (double)__fmul_rn(v[k], v[k]);
    }
    sum = warp_sum_f64(sum);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < NORM_THREADS / WARP; ++w) total += partial[w];
        float mean = (float)(total / (double)n);
        scale = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    const float s = scale;
    // `out` may alias `x`: each thread reads its own terms before it writes them
    for (int i0 = threadIdx.x; i0 < n; i0 += NORM_UNROLL * NORM_THREADS) {
        float v[NORM_UNROLL], w[NORM_UNROLL];
#pragma unroll
        for (int k = 0; k < NORM_UNROLL; ++k) {
            const int i = i0 + k * NORM_THREADS;
            v[k] = i < n ? xr[i] : 0.f;
            w[k] = i < n ? weight[i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < NORM_UNROLL; ++k) {
            const int i = i0 + k * NORM_THREADS;
            if (i < n) yr[i] = __fmul_rn(__fmul_rn(v[k], s), w[k]);
        }
    }
}
