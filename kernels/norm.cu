// memra kernels: RMS norm, one block per row: out = x / sqrt(mean(x^2) + eps) * weight, the sum
// of squares taken in f64 (as ggml and the CPU backend do) over a fixed thread order and a
// fixed reduction tree, so the result is deterministic. Several rows sharing one weight (the
// per-head q/k norms of qwen3) are one launch with one block per row.
#include "common.cuh"

#define NORM_THREADS 256

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_f32(const float* x, const float* weight, float* out, int n, float eps) {
    __shared__ double partial[NORM_THREADS / WARP];
    __shared__ float scale;
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = out + (size_t)blockIdx.x * n;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float v = xr[i];
        sum += (double)__fmul_rn(v, v);
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
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) yr[i] = __fmul_rn(__fmul_rn(xr[i], s), weight[i]);
}
