// memra kernels: the element-wise residual (and bias) add. Out of place; `out` may alias an
// input. (The SiLU-gated product of the FFN is fused into the gate/up matvec, matvec.cu.)
#include "common.cuh"

// out = a + b.
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] + b[i];
}
