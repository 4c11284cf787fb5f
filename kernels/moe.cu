// memra kernels: mixture-of-experts routing and the combine, on the device so that an MoE layer
// needs no host round trip and sits inside a captured graph. moe_route_f32 turns each row of
// a prefill step's router logits (a block per row) into the top-k expert ids and their
// weights (route.cuh); a decode step's router product picks them in its own launch
// (matvec.cu's moe_router_f32). The expert matvecs (matvec.cu, expert mode) read the ids and
// weights from device memory.
//
// moe_combine_f32 adds the `rows` weighted expert rows (then the shared experts' row, if any)
// in one fixed order, ((r0 + r1) + r2) + ..., and the total to the residual: every plan's
// rank holds the same rows after its group's all-reduce (experts held elsewhere are -0.0), so
// every plan gives the 1-rank bits. A prefill step's rows are slot-major (slot s of token row
// t at (s * rows + t) * hidden), so the same kernel combines all token rows at once.
//
// A prefill step runs each expert this rank holds once over the token rows routed to it
// (cuda/moe/rows.rs): the rows are named by assignments a = row * k + slot, grouped by expert.
// moe_gather_f16 narrows the assigned rows of the normalized input to f16 for the tensor-core
// GEMM, moe_scatter_f32 writes each product row, times its routing weight, into its slot's
// block, and moe_unheld_f32 first fills the blocks with -0.0 for the experts held elsewhere.
#include "common.cuh"
#include "route.cuh"

// A block per row of the logits (row blockIdx.x of the logits, ids and weights).
extern "C" __global__ void moe_route_f32(const float* logits, const Route r, int* ids, float* weights) {
    overlap_with_neighbours();
    const size_t row = blockIdx.x;
    route_row(logits + row * r.n, r, ids + row * r.k, weights + row * r.k);
}

// x[i] += ((rows[0][i] + rows[1][i]) + ...) for `count` rows of n; with `clear`, the rows are
// zeroed after they are read (the group's sum buffer, zero again for the next all-reduce).
extern "C" __global__ void moe_combine_f32(float* rows, int count, int n, float* x, int clear) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float total = rows[i];
    for (int r = 1; r < count; ++r) total = total + rows[(size_t)r * n + i];
    x[i] = x[i] + total;
    if (clear)
        for (int r = 0; r < count; ++r) rows[(size_t)r * n + i] = 0.f;
}

// out[j][c] = f16(x[assign[j] / k][c]) for the `count` assignments (rows of d values).
extern "C" __global__ void moe_gather_f16(const float* x, const int* assign, int k, int d, int count, u16* out) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count * d) return;
    const int j = i / d, c = i % d;
    out[i] = f32_to_f16(x[(size_t)(assign[j] / k) * d + c]);
}

// Block (slot, row) of `out` (slot-major, `rows` token rows of d) = y[j] * weights[a] for each
// assignment a = assign[j] = row * k + slot.
extern "C" __global__ void moe_scatter_f32(const float* y, const int* assign, const float* weights, int k, int rows,
                                           int d, int count, float* out) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count * d) return;
    const int j = i / d, c = i % d, a = assign[j];
    out[((size_t)(a % k) * rows + a / k) * d + c] = y[i] * weights[a];
}

// rows[i] = -0.0: the value of an expert held elsewhere (x + -0.0 == x for every x).
extern "C" __global__ void moe_unheld_f32(float* rows, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) rows[i] = -0.0f;
}
