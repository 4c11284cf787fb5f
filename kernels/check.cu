// memra kernels the self-test runs to check device helpers of common.cuh over their whole
// input range, where a sampled test could miss the rare input that differs.
#include "common.cuh"

// Counts the 32-bit patterns lo, lo + 1, ..., lo + count - 1 (as floats) whose rcp_rn differs
// in any bit from __frcp_rn's, into *mismatches; a grid-stride loop (its index in 64 bits, so
// that no count wraps it), so any grid covers them once.
extern "C" __global__ void rcp_rn_mismatches(unsigned lo, unsigned count, unsigned long long* mismatches) {
    overlap_with_neighbours();
    unsigned long long wrong = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride) {
        const float x = __uint_as_float(lo + (unsigned)k);
        wrong += __float_as_uint(rcp_rn(x)) != __float_as_uint(__frcp_rn(x));
    }
    if (wrong) atomicAdd(mismatches, wrong);
}
