// memra kernels: element-wise f32 steps of a decode step: the SiLU-gated product of the FFN
// and the residual add. Out of place; `out` may alias an input.
#include "common.cuh"

// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
extern "C" __global__ void silu_mul_f32(const float* gate, const float* up, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

// out = a + b.
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] + b[i];
}
