// memra kernels: multi-head latent attention at decode (DeepSeek's MLA with absorbed
// projections, as the CPU backend's cpu::kernels::mla runs it). The per-head products through
// attn_k_b and attn_v_b are ordinary matvecs; these kernels do what has no equivalent:
//
// mla_rope_f32 rotates the rope part of n_vecs vectors from src into dst (both strided), at
// the position in device memory, with YaRN when `yarn` is set: pair i's angle is
// pos * theta_scale^i by repeated f32 multiplication, interpolated by freq_scale outside the
// corrected dims and cos/sin scaled by mscale, step by step as rope.rs's Yarn::cos_sin. With
// `rotate` 0 it copies them unrotated (kimi-linear's MLA layers use no rope).
//
// mla_attention_f16 attends each head's latent-space query (kv_lora + rope values) over the
// f16 latent cache rows 0..=*pos: the current position's row (`row_now`, the normalized
// latent then the roped key) is narrowed to f16, written to the cache by block 0 and read by
// every block from shared memory, so no block reads the slot being written. Queries and
// probabilities are narrowed to f16 as the CPU backend does; scores are scaled after the dot
// product and softmaxed in f32; every reduction has a fixed order. With `cells` set (DSA's
// sparse attention, kernels/dsa.cu's selection: the count, then the positions), it attends
// over those cache rows only, in that order.
#include "common.cuh"

#define MLA_THREADS 256
#define MLA_WARPS (MLA_THREADS / WARP)
// the widest cache row (kv_lora_rank + qk_rope_head_dim; DeepSeek's is 512 + 64)
#define MLA_MAX_WIDTH 1024

extern "C" __global__ void mla_rope_f32(const float* src, int src_stride, float* dst, int dst_stride,
                                        int n_vecs, int n_rot, const u32* pos, float theta_scale, int rotate,
                                        int neox, int yarn, float freq_scale, float corr_low, float corr_high,
                                        float mscale) {
    overlap_with_neighbours();
    const int half = n_rot / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vecs * half) return;
    const int vec = t / half, i = t % half;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float* x = src + (size_t)vec * src_stride;
    float* y = dst + (size_t)vec * dst_stride;
    const float x0 = x[a], x1 = x[b];
    if (!rotate) {
        y[a] = x0;
        y[b] = x1;
        return;
    }
    float angle = (float)*pos;
    for (int k = 0; k < i; ++k) angle = __fmul_rn(angle, theta_scale);
    float s, c;
    if (yarn) {
        const float y = __fdiv_rn(__fsub_rn((float)i, corr_low), fmaxf(__fsub_rn(corr_high, corr_low), 0.001f));
        const float ramp_mix = __fsub_rn(1.0f, fminf(fmaxf(y, 0.0f), 1.0f));
        const float interp = __fmul_rn(freq_scale, angle);
        const float theta = __fadd_rn(__fmul_rn(interp, __fsub_rn(1.0f, ramp_mix)), __fmul_rn(angle, ramp_mix));
        sincosf(theta, &s, &c);
        c = __fmul_rn(c, mscale);
        s = __fmul_rn(s, mscale);
    } else {
        sincosf(angle, &s, &c);
    }
    y[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// One block per head. q_lat: n_heads rows of `width`; cache: capacity rows of `width` halves;
// out: n_heads rows of kv_lora; scores: n_heads * capacity scratch; cells: null, or a count
// (at most capacity) then that many positions up to *pos.
extern "C" __global__ void __launch_bounds__(MLA_THREADS)
    mla_attention_f16(const float* q_lat, const float* row_now, u16* cache, float* out, float* scores,
                      const u32* pos, int n_heads, int kv_lora, int width, int capacity, float scale,
                      const int* cells) {
    overlap_with_neighbours();
    __shared__ float qh[MLA_MAX_WIDTH];
    __shared__ u16 now_row[MLA_MAX_WIDTH];
    __shared__ float red[MLA_WARPS];
    __shared__ float stat;
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 p_now = *pos;
    const int n_ctx = cells ? min(cells[0], capacity) : min((int)p_now + 1, capacity);
    const int now = p_now < (u32)capacity ? (int)p_now : -1;
    float* sc = scores + (size_t)h * capacity;
    for (int d = threadIdx.x; d < width; d += MLA_THREADS) {
        qh[d] = round_f16(q_lat[(size_t)h * width + d]);
        const u16 r = f32_to_f16(row_now[d]);
        now_row[d] = r;
        if (h == 0 && now >= 0) cache[(size_t)now * width + d] = r;
    }
    __syncthreads();
    // the cache row of the i-th attended position
    const auto row_of = [&](int i) -> const u16* {
        const int p = cells ? cells[1 + i] : i;
        return p == now ? now_row : cache + (size_t)p * width;
    };

    // scores: warp w takes attended positions w, w + MLA_WARPS, ...; lane l values l, l + 32, ...
    float mx = -__int_as_float(0x7f800000);
    for (int i = warp; i < n_ctx; i += MLA_WARPS) {
        const u16* r = row_of(i);
        float acc = 0.f;
        for (int d = lane; d < width; d += WARP) acc = fmaf(qh[d], f16_to_f32(r[d]), acc);
        const float v = warp_sum(acc) * scale;
        if (lane == 0) sc[i] = v;
        mx = fmaxf(mx, v);
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = red[0];
        for (int w = 1; w < MLA_WARPS; ++w) m = fmaxf(m, red[w]);
        stat = m;
    }
    __syncthreads();
    mx = stat;

    const float sum = exp_in_place_warp_sum(sc, n_ctx, mx, MLA_THREADS);
    __syncthreads();
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = red[0];
        for (int w = 1; w < MLA_WARPS; ++w) t += red[w];
        stat = 1.0f / t;
    }
    __syncthreads();
    const float inv = stat;

    // weighted sum of the latents: thread d adds its value over the positions in order
    for (int d = threadIdx.x; d < kv_lora; d += MLA_THREADS) {
        float o = 0.f;
        for (int i = 0; i < n_ctx; ++i) o = fmaf(round_f16(sc[i] * inv), f16_to_f32(row_of(i)[d]), o);
        out[(size_t)h * kv_lora + d] = o;
    }
}
