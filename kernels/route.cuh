// memra kernels: the top-k of a router's logits, with the semantics of the CPU backend's
// `Router::route` (executor/src/cpu/kernels/moe.rs): softmax or sigmoid probabilities, an
// optional selection bias, optional group selection (a group scores the sum of its two best
// biased probabilities), the top-k best first with ties to the lower index, weights optionally
// normalized by their sum (clamped below at 2^-14) and scaled. One warp a row: moe.cu's
// moe_route_f32 (a block per row of a prefill step's logits) and matvec.cu's moe_router_f32 (a
// decode step's router product, whose last block picks) run it.

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

// What the router of a model's MoE layers does with its logits (MoeSummary).
struct Route {
    const float* bias;  // the selection bias, one per expert, or null
    int n, k;           // experts, and those selected
    int sigmoid;        // sigmoid probabilities, else softmax
    int groups, groups_used;
    int norm;           // the weights normalized by their sum
    float scale;        // then scaled (0 or 1: not)
};

// The top-k of one row of n logits into k ids and weights, by the block's first warp (lane l
// holds experts l, l + 32, ...).
__device__ __forceinline__ void route_row(const float* logits, const Route rt, int* ids, float* weights) {
    __shared__ float probs[MOE_MAX_EXPERTS];
    __shared__ float select[MOE_MAX_EXPERTS];
    const float* bias = rt.bias;
    const int n = rt.n, k = rt.k, groups = rt.groups, groups_used = rt.groups_used;
    const int lane = threadIdx.x;
    if (rt.sigmoid) {
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
    if (rt.norm) {
        double sum = 0.0;
        for (int r = 0; r < k; ++r) sum += (double)__shfl_sync(FULL_MASK, w, r);
        w = w / fmaxf((float)sum, 6.103515625e-5f);
    }
    if (rt.scale != 0.f && rt.scale != 1.f) w = w * rt.scale;
    if (lane < k) {
        ids[lane] = picked;
        weights[lane] = w;
    }
}
