// memra kernels: sampling on the device; both kernels write the next token into a device
// token buffer (the next step's embed reads it there; a batched step's argmax of every logit
// row, one block per row, goes back to the host instead of the logits). argmax_f32 picks the
// first index of the largest logit and never a NaN, as the host's sample::argmax does (0 if
// no value beats -inf); with `flag`, a row holding a NaN or an infinity gets 0xffffffff
// instead (sample::NOT_FINITE, the host's sample::greedy), which no token id reaches.
// sample_f32 mirrors executor/src/sample.rs operation by operation (temperature, top-k, top-p,
// the draw for (seed, step)) and must pick the same token: every f32 operation of the final
// selection is an explicit round-to-nearest intrinsic, so nothing is fused or reordered.
#include "common.cuh"

#define ARGMAX_THREADS 1024

// (v, i) beats (bv, bi) when larger, or equal with a smaller index.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Block b: the argmax of row b of x (n values) into token[b].
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_f32(const float* x, int n, u32* token, int flag) {
    overlap_with_neighbours();
    x += (size_t)blockIdx.x * n;
    token += blockIdx.x;
    __shared__ float sv[ARGMAX_THREADS / WARP];
    __shared__ int si[ARGMAX_THREADS / WARP];
    float best = -__int_as_float(0x7f800000);
    int idx = n;
    bool finite = true;
    for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        float v = x[i];
        finite &= isfinite(v);
        if (v > best) {
            best = v;
            idx = i;
        }
    }
    // every thread of the block takes part (the barrier inside), before any returns
    const bool flagged = flag && __syncthreads_or(!finite);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, best, off);
        int oi = __shfl_xor_sync(FULL_MASK, idx, off);
        if (beats(ov, oi, best, idx)) {
            best = ov;
            idx = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = best;
        si[threadIdx.x >> 5] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / WARP; ++w) {
            if (beats(sv[w], si[w], best, idx)) {
                best = sv[w];
                idx = si[w];
            }
        }
        *token = flagged ? 0xffffffffu : idx < n ? (u32)idx : 0u;
    }
}

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP)
// The most candidates sample_f32 keeps (top-k); the host refuses larger k.
#define SAMPLE_MAX_K 256

// The candidate order as one integer, larger first: the logit by total order in the high half,
// then the lower id (its complement in the low half); unique per id, as sample.rs rank_key.
__device__ __forceinline__ u64 rank_key(float logit, u32 id) {
    u32 b = __float_as_uint(logit);
    u32 ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)ordered << 32) | (u64)(~id);
}

// The uniform draw in [0, 1) for sampled token number `step`, as sample.rs draw.
__device__ __forceinline__ float sample_draw(u64 seed, u64 step) {
    u64 z = seed + (step + 1ull) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return __fmul_rn((float)(u32)(z >> 40), __uint_as_float(0x33800000u));
}

// e^x for x <= 0, as sample.rs exp_nonpositive.
__device__ __forceinline__ float exp_nonpositive(float x) {
    if (!(x >= -87.0f)) return 0.0f; // also NaN
    float k = floorf(__fadd_rn(__fmul_rn(x, __uint_as_float(0x3fb8aa3bu)), 0.5f));
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, __uint_as_float(0x3f317200u))),
                        __fmul_rn(k, __uint_as_float(0x35bfbe8eu)));
    const u32 c[6] = {0x3c088889u, 0x3d2aaaabu, 0x3e2aaaabu, 0x3f000000u, 0x3f800000u, 0x3f800000u};
    float p = __uint_as_float(0x3ab60b61u);
#pragma unroll
    for (int j = 0; j < 6; ++j) p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(c[j]));
    return __fmul_rn(p, __uint_as_float((u32)((int)k + 127) << 23));
}

// Temperature sampling among the top-k logits of x[0..n) with a top-p cut; k in
// [1, SAMPLE_MAX_K]. The step counter lives in device memory and the kernel advances it, so a
// captured launch replays correctly. One block: an exact radix select of the k largest rank
// keys (order-independent, as keys are unique), a bitonic sort of the candidates, then thread
// 0 does the softmax, the cut and the pick in the fixed order of sample.rs.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_f32(
    const float* x, int n, int k, float temp, float top_p, u64 seed, u64* step, u32* token) {
    overlap_with_neighbours();
    __shared__ u32 hist[SAMPLE_WARPS][256];
    __shared__ u32 total[256];
    __shared__ u64 cand[SAMPLE_MAX_K];
    __shared__ float wts[SAMPLE_MAX_K];
    __shared__ u64 s_prefix;
    __shared__ u32 s_count;
    __shared__ int s_done;
    const int tid = threadIdx.x, warp = tid >> 5;
    if (k > n) k = n;
    u64 prefix = 0, mask = 0;
    u32 need = (u32)k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int j = tid; j < SAMPLE_WARPS * 256; j += SAMPLE_THREADS) (&hist[0][0])[j] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += SAMPLE_THREADS) {
            u64 key = rank_key(x[i], (u32)i);
            if ((key & mask) == prefix) atomicAdd(&hist[warp][(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (tid < 256) {
            u32 sum = 0;
            for (int w = 0; w < SAMPLE_WARPS; ++w) sum += hist[w][tid];
            total[tid] = sum;
        }
        __syncthreads();
        if (tid == 0) {
            int b = 255;
            while (total[b] < need) need -= total[b--];
            s_prefix = prefix | ((u64)b << shift);
            // the whole bucket is taken: every key from the prefix up is a candidate
            s_done = total[b] == need;
            s_count = 0;
        }
        __syncthreads();
        prefix = s_prefix;
        mask |= 255ull << shift;
        if (s_done) break;
    }
    // exactly k keys are >= prefix
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        u64 key = rank_key(x[i], (u32)i);
        if (key >= prefix) cand[atomicAdd(&s_count, 1u)] = key;
    }
    __syncthreads();
    for (int j = k + tid; j < SAMPLE_MAX_K; j += SAMPLE_THREADS) cand[j] = 0;
    __syncthreads();
    for (int size = 2; size <= SAMPLE_MAX_K; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            int o = tid ^ stride;
            if (tid < SAMPLE_MAX_K && o > tid) {
                u64 a = cand[tid], b = cand[o];
                bool descending = (tid & size) == 0;
                if (descending ? a < b : a > b) {
                    cand[tid] = b;
                    cand[o] = a;
                }
            }
            __syncthreads();
        }
    }
    // each weight depends on its own logit and the top one only, so threads may share them out
    if (tid < k)
        wts[tid] = exp_nonpositive(__fdiv_rn(__fsub_rn(x[~(u32)cand[tid]], x[~(u32)cand[0]]), temp));
    __syncthreads();
    if (tid != 0) return;
    const float* w = wts;
    int keep = k;
    if (top_p < 1.0f) {
        float sum = 0.0f;
        for (int i = 0; i < k; ++i) sum = __fadd_rn(sum, w[i]);
        float cut = __fmul_rn(top_p, sum), acc = 0.0f;
        for (int i = 0; i < k; ++i) {
            acc = __fadd_rn(acc, w[i]);
            if (acc >= cut) {
                keep = i + 1;
                break;
            }
        }
    }
    u64 s = *step;
    *step = s + 1;
    float mass = 0.0f;
    for (int i = 0; i < keep; ++i) mass = __fadd_rn(mass, w[i]);
    float target = __fmul_rn(sample_draw(seed, s), mass), acc = 0.0f;
    int pick = keep - 1;
    for (int i = 0; i < keep; ++i) {
        acc = __fadd_rn(acc, w[i]);
        if (target < acc) {
            pick = i;
            break;
        }
    }
    *token = ~(u32)cand[pick];
}
