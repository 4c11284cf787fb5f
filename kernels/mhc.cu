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
// round-to-nearest intrinsics so that no multiply-add is contracted into an FMA. The mixing
// weights are computed by one thread per block (24 values and a few 4x4 passes, in registers),
// so every block holds the same bits. They match the CPU's except where expf (CUDA's, within
// 2 ulp) rounds differently from the host libm's: the sigmoids and the combination's softmax.
#include "common.cuh"

#define HC_STREAMS 4
#define HC_MIXES ((2 + HC_STREAMS) * HC_STREAMS)
// pre, post, then comb[dst + HC_STREAMS * src]
#define HC_MIX_LEN (2 * HC_STREAMS + HC_STREAMS * HC_STREAMS)

__device__ __forceinline__ float hc_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// The CPU's Sinkhorn normalization of c: over_src divides each dst's values (over src) by
// their sum plus eps, else each src's values (over dst). Fully unrolled, so that c stays in
// registers.
__device__ __forceinline__ void hc_norm(float (&c)[HC_STREAMS * HC_STREAMS], bool over_src, float eps) {
#pragma unroll
    for (int i = 0; i < HC_STREAMS; ++i) {
        float sum = eps;
#pragma unroll
        for (int j = 0; j < HC_STREAMS; ++j) sum = __fadd_rn(sum, c[over_src ? i + HC_STREAMS * j : j + HC_STREAMS * i]);
        const float inv = __fdiv_rn(1.0f, sum);
#pragma unroll
        for (int j = 0; j < HC_STREAMS; ++j) {
            float& v = c[over_src ? i + HC_STREAMS * j : j + HC_STREAMS * i];
            v = __fmul_rn(v, inv);
        }
    }
}

// The CPU's hc_mix: mixes (HC_MIXES), scale (3), base (HC_MIXES) into m (HC_MIX_LEN). The inputs
// are loaded before the arithmetic and every loop but the Sinkhorn iterations is unrolled, so
// that the values live in registers; m is written once at the end.
__device__ __forceinline__ void hc_mix(const float* mixes, const float* scale, const float* base, float eps, int iters,
                                       float* m) {
    float mx_in[HC_MIXES], base_in[HC_MIXES], sc[3];
#pragma unroll
    for (int k = 0; k < HC_MIXES; ++k) {
        mx_in[k] = mixes[k];
        base_in[k] = base[k];
    }
#pragma unroll
    for (int k = 0; k < 3; ++k) sc[k] = scale[k];
    float pre[HC_STREAMS], post[HC_STREAMS], c[HC_STREAMS * HC_STREAMS];
#pragma unroll
    for (int s = 0; s < HC_STREAMS; ++s) {
        pre[s] = __fadd_rn(hc_sigmoid(__fadd_rn(__fmul_rn(mx_in[s], sc[0]), base_in[s])), eps);
        const int p = HC_STREAMS + s;
        post[s] = __fmul_rn(2.0f, hc_sigmoid(__fadd_rn(__fmul_rn(mx_in[p], sc[1]), base_in[p])));
    }
    const int off = 2 * HC_STREAMS;
#pragma unroll
    for (int src = 0; src < HC_STREAMS; ++src) {
        float mx = -__int_as_float(0x7f800000);
#pragma unroll
        for (int dst = 0; dst < HC_STREAMS; ++dst) {
            const int at = dst + HC_STREAMS * src;
            const float v = __fadd_rn(__fmul_rn(mx_in[off + at], sc[2]), base_in[off + at]);
            c[at] = v;
            mx = fmaxf(mx, v);
        }
        float sum = 0.0f;
#pragma unroll
        for (int dst = 0; dst < HC_STREAMS; ++dst) {
            const int at = dst + HC_STREAMS * src;
            c[at] = expf(__fsub_rn(c[at], mx));
            sum = __fadd_rn(sum, c[at]);
        }
        const float inv = __fdiv_rn(1.0f, sum);
#pragma unroll
        for (int dst = 0; dst < HC_STREAMS; ++dst) {
            const int at = dst + HC_STREAMS * src;
            c[at] = __fadd_rn(__fmul_rn(c[at], inv), eps);
        }
    }
    hc_norm(c, true, eps);
    for (int i = 1; i < iters; ++i) {
        hc_norm(c, false, eps);
        hc_norm(c, true, eps);
    }
#pragma unroll
    for (int s = 0; s < HC_STREAMS; ++s) {
        m[s] = pre[s];
        m[HC_STREAMS + s] = post[s];
    }
#pragma unroll
    for (int k = 0; k < HC_STREAMS * HC_STREAMS; ++k) m[2 * HC_STREAMS + k] = c[k];
}

// mixes: HC_MIXES per row; streams: HC_STREAMS * d per row; mix: HC_MIX_LEN per row (out);
// x: d per row (out).
extern "C" __global__ void hc_pre_f32(const float* mixes, const float* scale, const float* base, float eps,
                                      int iters, const float* streams, float* mix, float* x, int d) {
    overlap_with_neighbours();
    __shared__ float m[HC_MIX_LEN];
    const size_t row = blockIdx.y;
    if (threadIdx.x == 0) hc_mix(mixes + row * HC_MIXES, scale, base, eps, iters, m);
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
