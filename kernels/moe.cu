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
// A batched decode step's expert products (matvec.cu, expert mode) take every (row, slot)
// pick as a grid row: moe_order_i32 first puts the picks in expert order, so the rows that
// chose one expert run side by side and read its weights from L2 after the first.
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

#define MOE_ORDER_THREADS 1024 // must match MOE_ORDER_THREADS in cuda/moe/mod.rs

// order[j] for j < count: the picks a = row * k + slot grouped by expert id, ascending (an id
// outside 0..n last), in pick order within an expert. One block of MOE_ORDER_THREADS; a warp per expert counts,
// the first warp scans the counts, then a warp per expert writes its picks.
extern "C" __global__ void __launch_bounds__(MOE_ORDER_THREADS) moe_order_i32(const int* ids, int count, int n, int* order) {
    __shared__ int start[MOE_MAX_EXPERTS + 2];
    overlap_with_neighbours();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    // bucket e of id: e itself, or n for an id out of range
    auto in = [&](int i, int e) {
        const int id = ids[i];
        return (id < 0 || id >= n ? n : id) == e;
    };
    for (int e = warp; e <= n; e += warps) {
        int c = 0;
        for (int i = lane; i - lane < count; i += WARP) c += __popc(__ballot_sync(~0u, i < count && in(i, e)));
        if (lane == 0) start[e + 1] = c;
    }
    __syncthreads();
    if (warp == 0) {
        // buckets 1..=n+1 in runs of `per` a lane, each run summed, the runs' sums scanned
        const int buckets = n + 1, per = (buckets + WARP - 1) / WARP, b0 = 1 + lane * per;
        int sum = 0;
        for (int b = b0; b < b0 + per && b <= buckets; ++b) sum += start[b];
        int before = sum;
        for (int o = 1; o < WARP; o <<= 1) {
            const int v = __shfl_up_sync(~0u, before, o);
            if (lane >= o) before += v;
        }
        before -= sum;
        for (int b = b0; b < b0 + per && b <= buckets; ++b) {
            before += start[b];
            start[b] = before;
        }
        if (lane == 0) start[0] = 0;
    }
    __syncthreads();
    for (int e = warp; e <= n; e += warps) {
        int at = start[e];
        for (int i = lane; i - lane < count; i += WARP) {
            const bool mine = i < count && in(i, e);
            const unsigned m = __ballot_sync(~0u, mine);
            if (mine) order[at + __popc(m & ((1u << lane) - 1))] = i;
            at += __popc(m);
        }
    }
}

// rows[i] = -0.0: the value of an expert held elsewhere (x + -0.0 == x for every x).
extern "C" __global__ void moe_unheld_f32(float* rows, int n) {
    overlap_with_neighbours();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) rows[i] = -0.0f;
}
