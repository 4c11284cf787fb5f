// memra kernels: manifold-constrained hyper-connections (glm5-next's residual), with the
// semantics of the CPU backend's cpu::kernels::mhc (llama.cpp's dsv4_hc_comb, dsv4_hc_pre and
// dsv4_hc_post). The residual of a token row is HC_STREAMS rows of the embedding width d; the
// 24 mixes of a sublayer (the product of the RMS-normed streams by hc_*_fn) are an ordinary
// normed matvec. These kernels do the rest, each token row a grid row (blockIdx.y):
//
// hc_pre_f32 turns the mixes into the mixing weights (pre, post and the Sinkhorn-normalized
// combination, HC_MIX_LEN values, written by block 0 for hc_post_f32) and collapses the streams
// into the sublayer's input x = sum_s pre[s] * streams[s].
// hc_post_f32 spreads the sublayer's output f over the streams:
// new[dst] = f * post[dst] + sum_src streams[src] * comb[dst][src].
// hc_mean_f32 averages the streams for the head; hc_embed_f32 starts every stream as the
// embedding.
//
// Every value is computed with the CPU loops' float operations in their order, with explicit
// round-to-nearest intrinsics so that no multiply-add is contracted into an FMA; a reciprocal
// 1 / x is rcp_rn, correctly rounded as the CPU's division is, so the same bits. The mixing
// weights are computed by the first warp of every block (a lane a value), so every block holds
// the same bits. They match the CPU's except where expf (CUDA's, within 2 ulp) rounds
// differently from the host libm's: the sigmoids and the combination's softmax.
#include "common.cuh"

#define HC_STREAMS 4
#define HC_MIXES ((2 + HC_STREAMS) * HC_STREAMS)
// pre, post, then comb[dst + HC_STREAMS * src]
#define HC_MIX_LEN (2 * HC_STREAMS + HC_STREAMS * HC_STREAMS)

__device__ __forceinline__ float hc_sigmoid(float x) {
    return rcp_rn(__fadd_rn(1.0f, expf(-x)));
}

// One Sinkhorn normalization of the combination, held one value a lane (lane e < 16 holds
// c[e]): over_src divides each dst's values (over src) by their sum plus eps, else each src's
// values (over dst). Every lane gathers its line's four values and sums them in the CPU's
// order, so the four lines' reciprocals are taken at once, each lane the one of its line.
__device__ __forceinline__ float hc_norm(float v, int e, bool over_src, float eps) {
    const int i = over_src ? e % HC_STREAMS : e / HC_STREAMS;
    float sum = eps;
#pragma unroll
    for (int j = 0; j < HC_STREAMS; ++j)
        sum = __fadd_rn(sum, __shfl_sync(FULL_MASK, v, over_src ? i + HC_STREAMS * j : j + HC_STREAMS * i));
    return __fmul_rn(v, rcp_rn(sum));
}

// The CPU's hc_mix on one warp: mixes (HC_MIXES), scale (3), base (HC_MIXES) into m
// (HC_MIX_LEN). Lane k < HC_MIXES takes mix k: k < 4 a pre weight, k < 8 a post weight, else
// combination entry k - 8 (dst + 4 src), whose softmax over dst runs in its aligned group of
// four lanes; the entries then move to lanes 0..15 for the Sinkhorn iterations. Each value
// sees the CPU loop's operations in their order, so the per-lane form keeps its bits while the
// reciprocals, which bound the chain, run side by side instead of one after another.
__device__ __forceinline__ void hc_mix(const float* mixes, const float* scale, const float* base, float eps, int iters,
                                       float* m) {
    const int k = threadIdx.x & 31;
    const int part = k < HC_STREAMS ? 0 : k < 2 * HC_STREAMS ? 1 : 2;
    const float v = k < HC_MIXES ? __fadd_rn(__fmul_rn(mixes[k], scale[part]), base[k]) : 0.f;
    if (part == 0) m[k] = __fadd_rn(hc_sigmoid(v), eps);
    if (part == 1) m[k] = __fmul_rn(2.0f, hc_sigmoid(v));
    // the softmax over dst of each src: lanes 8 + 4 src .. + 3, dst in lane order
    const int group = k & ~(HC_STREAMS - 1);
    const float mx = fmaxf(fmaxf(__shfl_sync(FULL_MASK, v, group), __shfl_sync(FULL_MASK, v, group + 1)),
                           fmaxf(__shfl_sync(FULL_MASK, v, group + 2), __shfl_sync(FULL_MASK, v, group + 3)));
    const float ex = expf(__fsub_rn(v, mx));
    float sum = 0.0f;
#pragma unroll
    for (int dst = 0; dst < HC_STREAMS; ++dst) sum = __fadd_rn(sum, __shfl_sync(FULL_MASK, ex, group + dst));
    const float c0 = __fadd_rn(__fmul_rn(ex, rcp_rn(sum)), eps);
    float c = __shfl_sync(FULL_MASK, c0, (2 * HC_STREAMS + k) & 31);
    c = hc_norm(c, k, true, eps);
    for (int i = 1; i < iters; ++i) {
        c = hc_norm(c, k, false, eps);
        c = hc_norm(c, k, true, eps);
    }
    if (k < HC_STREAMS * HC_STREAMS) m[2 * HC_STREAMS + k] = c;
}

// mixes: HC_MIXES per row; streams: HC_STREAMS * d per row; mix: HC_MIX_LEN per row (out);
// x: d per row (out).
extern "C" __global__ void hc_pre_f32(const float* mixes, const float* scale, const float* base, float eps,
                                      int iters, const float* streams, float* mix, float* x, int d) {
    overlap_with_neighbours();
    __shared__ float m[HC_MIX_LEN];
    const size_t row = blockIdx.y;
    if (threadIdx.x < WARP) hc_mix(mixes + row * HC_MIXES, scale, base, eps, iters, m);
    __syncthreads();
    if (blockIdx.x == 0)
        for (int k = threadIdx.x; k < HC_MIX_LEN; k += blockDim.x) mix[row * HC_MIX_LEN + k] = m[k];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const float* st = streams + row * HC_STREAMS * d;
    float sum = 0.0f;
    for (int s = 0; s < HC_STREAMS; ++s) sum = __fadd_rn(sum, __fmul_rn(st[(size_t)s * d + i], m[s]));
    x[row * d + i] = sum;
}

// f: d per row; mix: HC_MIX_LEN per row (hc_pre_f32's); streams: HC_STREAMS * d per row, in
// place (each thread reads its column of every stream before writing it).
extern "C" __global__ void hc_post_f32(const float* f, const float* mix, float* streams, int d) {
    overlap_with_neighbours();
    const size_t row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const float* m = mix + row * HC_MIX_LEN;
    const float* post = m + HC_STREAMS;
    const float* comb = m + 2 * HC_STREAMS;
    float* st = streams + row * HC_STREAMS * d;
    float old[HC_STREAMS];
    for (int s = 0; s < HC_STREAMS; ++s) old[s] = st[(size_t)s * d + i];
    const float fi = f[row * d + i];
    for (int dst = 0; dst < HC_STREAMS; ++dst) {
        float sum = __fmul_rn(fi, post[dst]);
        for (int src = 0; src < HC_STREAMS; ++src) sum = __fadd_rn(sum, __fmul_rn(old[src], comb[dst + HC_STREAMS * src]));
        st[(size_t)dst * d + i] = sum;
    }
}

// streams: HC_STREAMS * d per row; out: d per row, the streams' mean (summed in stream order,
// then scaled).
extern "C" __global__ void hc_mean_f32(const float* streams, float* out, int d) {
    overlap_with_neighbours();
    const size_t row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const float* st = streams + row * HC_STREAMS * d;
    float sum = st[i];
    for (int s = 1; s < HC_STREAMS; ++s) sum = __fadd_rn(sum, st[(size_t)s * d + i]);
    out[row * d + i] = __fmul_rn(sum, 1.0f / HC_STREAMS);
}

// x: d per row; streams: HC_STREAMS * d per row, every stream a copy of x.
extern "C" __global__ void hc_embed_f32(const float* x, float* streams, int d) {
    overlap_with_neighbours();
    const size_t row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const float v = x[row * d + i];
    for (int s = 0; s < HC_STREAMS; ++s) streams[(row * HC_STREAMS + s) * d + i] = v;
}
