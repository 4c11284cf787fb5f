// memra kernels: causal attention of a prefill step's token rows on the tensor cores, after
// kv_store_rows_f16 (gemm.cu) has written every row's rotated k and its v to the f16 cache.
// Row t of the step sits at position *pos + t and attends over cache positions 0..=*pos + t.
//
// flash_attention_hd<D>: grid (row tiles of 64, query heads), 4 warps, each warp 16 query rows
// of one head. The block rotates its q rows (attention_f16's rope: the pair angles by repeated
// f32 multiplication, theta_scale from the host) and narrows them to f16, then walks the keys
// 64 positions at a time: S = q k^T by mma.sync.m16n8k16 (f16 in, f32 accumulation), scaled,
// masked past each row's position, an online softmax per row (running max and sum, the
// accumulated output rescaled when the max grows), the probabilities narrowed to f16 and
// O += P v by mma again; at the end O / sum. Query head h reads KV head h / (n_heads /
// n_kv_heads). The bits depend only on the head's rows and cache, never on the rank: a
// tensor-parallel rank computing its heads gets one rank's bits for them. They are not the
// decode kernel's (f16 probabilities and a different summation order); a prefill row differs
// from its token-by-token decode in the last bits.
#include "common.cuh"

#define FA_ROWS 64
#define FA_KEYS 64
#define FA_THREADS 128

template <int D>
__device__ __forceinline__ void flash_run(const float* q, const u16* k_cache, const u16* v_cache,
                                          float* out, const u32* pos, int rows, int n_heads,
                                          int n_kv_heads, float scale, float theta_scale, int neox) {
    constexpr int LD = D + 8;  // shared row stride in halves: ldmatrix rows on distinct banks
    __shared__ __align__(16) u16 ks[FA_KEYS * LD];
    __shared__ __align__(16) u16 vs[FA_KEYS * LD];
    overlap_with_neighbours();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = blockIdx.x * FA_ROWS, h = blockIdx.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const u32 p0 = *pos;
    const size_t q_row = (size_t)n_heads * D, kv_row = (size_t)n_kv_heads * D;

    // the block's q rows, rotated and narrowed, staged in `ks`
    constexpr int HALF = D / 2;
    for (int i = threadIdx.x; i < FA_ROWS * HALF; i += FA_THREADS) {
        const int r = i / HALF, j = i % HALF, t = t0 + r;
        const int a = neox ? j : 2 * j, b = neox ? j + HALF : 2 * j + 1;
        float2 v = make_float2(0.f, 0.f);
        if (t < rows) {
            const float* qr = q + (size_t)t * q_row + (size_t)h * D;
            v = rope_pair(qr[a], qr[b], j, (float)(p0 + (u32)t), theta_scale);
        }
        ks[r * LD + a] = f32_to_f16(v.x);
        ks[r * LD + b] = f32_to_f16(v.y);
    }
    __syncthreads();
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int row = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4(qf[kk], ks + row * LD + kk * 16 + 8 * (lane / 16));
    }

    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    // this thread's two rows (lane / 4 and lane / 4 + 8 of the warp's 16)
    float mx[2] = {-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)}, sum[2] = {0.f, 0.f};
    const int my_t[2] = {t0 + warp * 16 + lane / 4, t0 + warp * 16 + lane / 4 + 8};
    const int last = (int)p0 + min(t0 + FA_ROWS, rows) - 1;  // the block's last key position
    for (int kt = 0; kt <= last; kt += FA_KEYS) {
        __syncthreads();  // the previous tile (or the staged q) is read
        for (int i = threadIdx.x; i < FA_KEYS * (D / 8); i += FA_THREADS) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8, p = kt + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (p <= last) {
                kv = *(const uint4*)(k_cache + (size_t)p * kv_row + (size_t)kvh * D + c);
                vv = *(const uint4*)(v_cache + (size_t)p * kv_row + (size_t)kvh * D + c);
            }
            *(uint4*)(ks + r * LD + c) = kv;
            *(uint4*)(vs + r * LD + c) = vv;
        }
        __syncthreads();
        // S = q k^T over this tile: 16 rows x 64 keys per warp
        float sc[FA_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int j = 0; j < FA_KEYS / 16; ++j) {
                u32 bf[4];
                const int row = j * 16 + (lane % 8) + 8 * (lane / 16);
                ldmatrix_x4(bf, ks + row * LD + kk * 16 + 8 * ((lane / 8) % 2));
                mma_f16(sc[2 * j], qf[kk], bf[0], bf[1]);
                mma_f16(sc[2 * j + 1], qf[kk], bf[2], bf[3]);
            }
        // scale, mask, online softmax per row
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int limit = (int)p0 + my_t[r];
            float m = mx[r];
#pragma unroll
            for (int j = 0; j < FA_KEYS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int p = kt + j * 8 + 2 * (lane % 4) + e;
                    float s = sc[j][2 * r + e] * scale;
                    if (p > limit) s = -__int_as_float(0x7f800000);
                    sc[j][2 * r + e] = s;
                    m = fmaxf(m, s);
                }
            m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 1));
            m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 2));
            // a row with no key yet keeps max -inf: its factors are 0 and its sum stays 0
            const float base = m == -__int_as_float(0x7f800000) ? 0.f : m;
            const float rescale = expf(mx[r] - base);
            float part = 0.f;
#pragma unroll
            for (int j = 0; j < FA_KEYS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pe = expf(sc[j][2 * r + e] - base);
                    sc[j][2 * r + e] = pe;
                    part += pe;
                }
            part += __shfl_xor_sync(FULL_MASK, part, 1);
            part += __shfl_xor_sync(FULL_MASK, part, 2);
            sum[r] = sum[r] * rescale + part;
            mx[r] = m;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                o[j][2 * r] *= rescale;
                o[j][2 * r + 1] *= rescale;
            }
        }
        // O += P v: the probabilities' accumulator layout is the A operand's, two key tiles
        // of 8 per 16-deep step
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            const u32 pa[4] = {f16_pair(sc[2 * kk][0], sc[2 * kk][1]), f16_pair(sc[2 * kk][2], sc[2 * kk][3]),
                               f16_pair(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               f16_pair(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
            for (int j = 0; j < D / 16; ++j) {
                u32 bf[4];
                const int row = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                ldmatrix_x4_trans(bf, vs + row * LD + j * 16 + 8 * (lane / 16));
                mma_f16(o[2 * j], pa, bf[0], bf[1]);
                mma_f16(o[2 * j + 1], pa, bf[2], bf[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int t = my_t[r];
        if (t >= rows) continue;
        const float inv = 1.f / sum[r];
        float* orow = out + (size_t)t * q_row + (size_t)h * D;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            const int c = j * 8 + 2 * (lane % 4);
            orow[c] = o[j][2 * r] * inv;
            orow[c + 1] = o[j][2 * r + 1] * inv;
        }
    }
}

#define FLASH(name, D)                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                    \
        name(const float* q, const u16* k_cache, const u16* v_cache, float* out, const u32* pos, \
             int rows, int n_heads, int n_kv_heads, float scale, float theta_scale, int neox) {  \
        flash_run<D>(q, k_cache, v_cache, out, pos, rows, n_heads, n_kv_heads, scale,            \
                     theta_scale, neox);                                                         \
    }

FLASH(flash_attention_hd64, 64)
FLASH(flash_attention_hd128, 128)
