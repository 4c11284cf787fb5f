// memra kernels: the tensor-parallel combine. tree_sum_f32 adds `d` partial vectors (d a power
// of two, at most 32; partial k at parts + k * n) in the balanced binary tree ((p0 + p1) +
// (p2 + p3)) + ..., the same tree matvec uses over its chunks, so combining the outputs of d
// column-shard matvecs reproduces the 1-rank matvec bit for bit.
#include "common.cuh"

#define TREE_MAX 32

extern "C" __global__ void tree_sum_f32(const float* parts, int d, int n, float* out) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v[TREE_MAX];
#pragma unroll
    for (int k = 0; k < TREE_MAX; ++k) v[k] = k < d ? parts[(size_t)k * n + i] : 0.f;
#pragma unroll
    for (int s = 1; s < TREE_MAX; s <<= 1) {
#pragma unroll
        for (int k = 0; k + s < TREE_MAX; k += 2 * s) {
            if (k + s < d) v[k] = v[k] + v[k + s];
        }
    }
    out[i] = v[0];
}
