// memra kernels: greedy sampling on the device. argmax_f32 writes the index of the largest
// logit into a device token buffer (the next step's embed reads it there), choosing the first
// index on ties and never a NaN, as the CPU backend's argmax does (0 if no value beats -inf).
#include "common.cuh"

#define ARGMAX_THREADS 1024

// (v, i) beats (bv, bi) when larger, or equal with a smaller index.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_f32(const float* x, int n, u32* token) {
    __shared__ float sv[ARGMAX_THREADS / WARP];
    __shared__ int si[ARGMAX_THREADS / WARP];
    float best = -__int_as_float(0x7f800000);
    int idx = n;
    for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        float v = x[i];
        if (v > best) {
            best = v;
            idx = i;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, best, off);
        int oi = __shfl_xor_sync(FULL_MASK, idx, off);
        if (beats(ov, oi, best, idx)) {
            best = ov;
            idx = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = best;
        si[threadIdx.x >> 5] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / WARP; ++w) {
            if (beats(sv[w], si[w], best, idx)) {
                best = sv[w];
                idx = si[w];
            }
        }
        *token = idx < n ? (u32)idx : 0u;
    }
}
