// memra kernels: mixture-of-experts routing and the combine, on the device so that an MoE layer
// needs no host round trip and sits inside a captured graph. moe_route_f32 turns the router
// logits into the top-k expert ids and their weights with the semantics of the CPU backend's
// `Router::route` (executor/src/cpu/kernels/moe.rs): softmax or sigmoid probabilities, an
// optional selection bias, optional group selection (a group scores the sum of its two best
// biased probabilities), the top-k best first with ties to the lower index, weights optionally
// normalized by their sum (clamped below at 2^-14) and scaled. The expert matvecs
// (matvec.cu, expert mode) read the ids and weights from device memory. A prefill step routes
// every token row in one launch, a block per row (row blockIdx.x of the logits, ids and
// weights); a decode step's one row is block 0.
//
// moe_combine_f32 adds the `rows` weighted expert rows (then the shared experts' row, if any)
// in one fixed order, ((r0 + r1) + r2) + ..., and the total to the residual: every plan's
// rank holds the same rows after its group's all-reduce (experts held elsewhere are -0.0), so
// every plan gives the 1-rank bits. A prefill step's rows are slot-major (slot s of token row
// t at (s * rows + t) * hidden), so the same kernel combines all token rows at once.
//
// A prefill step runs each expert this rank holds once over the token rows routed to it
// (cuda/moe_rows.rs): the rows are named by assignments a = row * k + slot, grouped by expert.
// moe_gather_f16 narrows the assigned rows of the normalized input to f16 for the tensor-core
// GEMM, moe_scatter_f32 writes each product row, times its routing weight, into its slot's
// block, and moe_unheld_f32 first fills the blocks with -0.0 for the experts held elsewhere.
#include "common.cuh"

#define MOE_MAX_EXPERTS 512
#define MOE_PER_LANE (MOE_MAX_EXPERTS / WARP)
#define MOE_MAX_GROUPS 32
#define NEG_INF __int_as_float(0xff800000)

// Whether (va, ia) goes before (vb, ib): larger value first, then the lower index.
__device__ __forceinline__ bool before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// The best (value, index) over the warp; every lane gets it.
__device__ __forceinline__ void warp_best(float* v, int* i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, *v, off);
        const int oi = __shfl_xor_sync(FULL_MASK, *i, off);
        if (before(ov, oi, *v, *i)) {
            *v = ov;
            *i = oi;
        }
    }
}

// One warp. Lane l holds experts l, l + 32, ...; `ids` and `weights` get k values each.
extern "C" __global__ void moe_route_f32(const float* logits, const float* bias, int n, int k, int sigmoid, int groups,
                                         int groups_used, int norm, float scale, int* ids, float* weights) {
    __shared__ float probs[MOE_MAX_EXPERTS];
    __shared__ float select[MOE_MAX_EXPERTS];
    overlap_with_neighbours();
    const int lane = threadIdx.x;
    logits += (size_t)blockIdx.x * n;
    ids += (size_t)blockIdx.x * k;
    weights += (size_t)blockIdx.x * k;
    if (sigmoid) {
        for (int e = lane; e < n; e += WARP) probs[e] = rcp_rn(1.0f + expf(-logits[e]));
    } else {
        float m = NEG_INF;
        for (int e = lane; e < n; e += WARP) m = fmaxf(m, logits[e]);
        m = warp_max(m);
        double sum = 0.0;
        for (int e = lane; e < n; e += WARP) {
            const float v = expf(logits[e] - m);
            probs[e] = v;
            sum += (double)v;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, off);
        const float inv = (float)(1.0 / sum);
        for (int e = lane; e < n; e += WARP) probs[e] *= inv;
    }
    __syncwarp();
    for (int e = lane; e < n; e += WARP) select[e] = bias ? probs[e] + bias[e] : probs[e];
    __syncwarp();
    if (groups > 1) {
        // lane g scores group g by its two best values, then the best `groups_used` groups stay
        const int per = n / groups;
        float score = NEG_INF;
        if (lane < groups) {
            float b0 = NEG_INF, b1 = NEG_INF;
            int i0 = -1;
            for (int e = lane * per; e < (lane + 1) * per; ++e)
                if (i0 < 0 || select[e] > b0) {
                    b1 = b0;
                    b0 = select[e];
                    i0 = e;
                } else if (select[e] > b1) {
                    b1 = select[e];
                }
            score = b0 + b1;
        }
        bool kept = false;
        float s = lane < groups ? score : NEG_INF;
        for (int r = 0; r < groups_used; ++r) {
            float v = s;
            int i = lane < groups ? lane : MOE_MAX_GROUPS + lane;
            warp_best(&v, &i);
            if (i == lane) {
                kept = true;
                s = NEG_INF;
            }
        }
        __syncwarp();
        if (lane < groups && !kept)
            for (int e = lane * per; e < (lane + 1) * per; ++e) select[e] = NEG_INF;
        __syncwarp();
    }
    float mine[MOE_PER_LANE];
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + WARP * j;
        mine[j] = e < n ? select[e] : NEG_INF;
    }
    u32 taken = 0;  // bit j: expert lane + 32 j is picked already
    float w = 0.f;  // lane r keeps the weight of pick r
    int picked = 0;
    for (int r = 0; r < k; ++r) {
        float v = NEG_INF;
        int i = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < MOE_PER_LANE; ++j) {
            const int e = lane + WARP * j;
            if (e < n && !(taken >> j & 1) && (i == 0x7fffffff || before(mine[j], e, v, i))) {
                v = mine[j];
                i = e;
            }
        }
        warp_best(&v, &i);
        if (i % WARP == lane) taken |= 1u << (i / WARP);
        if (lane == r) {
            picked = i;
            w = probs[i];
        }
    }
    if (norm) {
        double sum = 0.0;
        for (int r = 0; r < k; ++r) sum += (double)__shfl_sync(FULL_MASK, w, r);
        w = w / fmaxf((float)sum, 6.103515625e-5f);
    }
    if (scale != 0.f && scale != 1.f) w = w * scale;
    if (lane < k) {
        ids[lane] = picked;
        weights[lane] = w;
    }
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
