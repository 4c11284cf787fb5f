// memra kernels: the products of a batched decode step on tensor cores, for weights of
// 32-value blocks with 4-bit quants (q4_0, q4_1), with the bits of matvec.cu's one-row
// kernel on every row, whatever the batch.
//
// Why the bits agree: the one-row kernel (matvec.cu, Planar) gives lane t of a half-warp the
// blocks t, t + 16, t + 32, ... of each K chunk and adds, block by block, (d_w * d_x) * dot
// (+ m_w * s_x for q4_1) into one f32 accumulator with fmaf; the dot of a block's weight
// quants with its 8-bit activation quants is an exact integer. Here an integer mma
// (m16n8k32, s8 x s8 -> s32) computes that same integer for 16 weight rows x 8 activation
// rows of one block at once, exactly (the order of an integer sum does not matter), and each
// thread runs, for each of its four outputs, the sixteen per-lane chains of the one-row
// kernel (chain v: the blocks whose index in the chunk is v mod 16, in increasing order, with
// the same fmaf expressions), four chains side by side, combining them as the half-warp
// butterfly (offsets 8, 4, 2, 1) does; the chunk tree ((c0 + c1) + (c2 + c3)) + ... then runs
// over the chunk values in the one-row kernel's order. The activation quants are the one-row
// kernel's too: quantize_rows_q8 (matvec.cu) makes them with the same quantize_x<32>.
//
// Layout: a block takes one item of 16 weight rows and up to `tiles` tiles of 8 activation
// rows; its warps take the (weight, tile, chunk) pieces of work in turn, a piece being one
// chunk of K for the item's 16 rows x the tile's 8 rows (one mma per 32-value block), and
// leave each output's chunk value in shared memory; after a barrier the block's threads
// combine the chunk values of each output in the tree and store it. The grid's x walks the
// items of the job's weights (q, k, v in one launch), its y the batch in groups of tiles.
#include "common.cuh"

#define MMA_MAX_SEGS 3  // the fields of MmaJob; must match MMA_MAX_SEGS in matvec_mma.rs

struct MmaJob {
    const u8 *w0, *w1, *w2;
    float *y0, *y1, *y2;
    int rows0, rows1, rows2;
    int segs;
    int cols;
    int chunks;
    // gate and up (two segments of equal rows): y0 = swiglu_limited(gate, up, limit)
    int swiglu;
    float limit;
    // row b's quants at xq + b * (cols + cols / 4), its (d, d * sum) pairs right after them
    const i8* xq;
    // with one segment: y0 = residual + W x (y0 may be residual)
    const float* residual;
    int batch;
    // activation tiles of 8 rows per block (grid y: the batch in groups of `tiles`)
    int tiles;
};

__device__ __forceinline__ const u8* mma_w(const MmaJob& j, int s) { return s == 0 ? j.w0 : s == 1 ? j.w1 : j.w2; }
__device__ __forceinline__ float* mma_y(const MmaJob& j, int s) { return s == 0 ? j.y0 : s == 1 ? j.y1 : j.y2; }
__device__ __forceinline__ int mma_rows(const MmaJob& j, int s) { return s == 0 ? j.rows0 : s == 1 ? j.rows1 : j.rows2; }

__device__ __forceinline__ void mma_s8(int* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Adds chunk `c`'s value into the pending subtrees of chunk_tree's balanced tree (stack[l]
// holds the sum of the 2^l chunks before the current one at level l); after the last chunk
// of a power-of-two count, the returned value is the whole tree.
__device__ __forceinline__ float tree_push(float* stack, int c, float x) {
#pragma unroll
    for (int l = 0; l < 5; ++l) {
        if (!(c & (1 << l))) {
            stack[l] = x;
            break;
        }
        x = stack[l] + x;
    }
    return x;
}

// What one 32-value block brings to a thread: the weight quants of its two rows (4 bytes
// each: values 4t.. in the low nibbles, 16 + 4t.. in the high), the activation quants of its
// mma row, the scales of its two weight rows and of its two output activation rows.
struct Block {
    u32 w0, w1, b0, b1, sc0, sc1;
    float2 x0, x1;
};

// The addresses of one piece for this thread.
struct Piece {
    const u8 *q0, *q1, *s0, *s1;
    const i8* xb;
    const float2 *xs0, *xs1;
};

template <bool MIN>
__device__ __forceinline__ Block load_block(const Piece& pc, int p) {
    constexpr int S = MIN ? 4 : 2;
    Block b;
    b.w0 = *(const u32*)(pc.q0 + (size_t)p * 16);
    b.w1 = *(const u32*)(pc.q1 + (size_t)p * 16);
    b.b0 = *(const u32*)(pc.xb + 32 * p);
    b.b1 = *(const u32*)(pc.xb + 32 * p + 16);
    b.sc0 = MIN ? *(const u32*)(pc.s0 + S * p) : (u32)ld_u16(pc.s0 + S * p);
    b.sc1 = MIN ? *(const u32*)(pc.s1 + S * p) : (u32)ld_u16(pc.s1 + S * p);
    b.x0 = pc.xs0[p];
    b.x1 = pc.xs1[p];
    return b;
}

// The block's mma, then its terms added into the four outputs' accumulators of lane v, with
// the one-row kernel's expressions (PQ4::piece in matvec.cu).
template <bool MIN>
__device__ __forceinline__ void add_block(const Block& b, float* a0, float* a1, float* a2, float* a3) {
    u32 q0 = b.w0 & NIB, q1 = b.w1 & NIB, q2 = (b.w0 >> 4) & NIB, q3 = (b.w1 >> 4) & NIB;
    if (!MIN) {
        // q4_0's quants carry an offset of 8: the mma takes q - 8 itself
        q0 = __vsub4(q0, 0x08080808u), q1 = __vsub4(q1, 0x08080808u);
        q2 = __vsub4(q2, 0x08080808u), q3 = __vsub4(q3, 0x08080808u);
    }
    int d[4] = {0, 0, 0, 0};
    mma_s8(d, q0, q1, q2, q3, b.b0, b.b1);
    float* acc[4] = {a0, a1, a2, a3};
    const u32 sc[4] = {b.sc0, b.sc0, b.sc1, b.sc1};
    const float2 xs[4] = {b.x0, b.x1, b.x0, b.x1};
#pragma unroll
    for (int o = 0; o < 4; ++o) {
        float a = fmaf(f16_to_f32((u16)(sc[o] & 0xffff)) * xs[o].x, int_to_f32(d[o]), *acc[o]);
        if (MIN) a = fmaf(f16_to_f32((u16)(sc[o] >> 16)), xs[o].y, a);
        *acc[o] = a;
    }
}

// One piece: chunk `c` of weight `w` (planar q4: quants, then (d, m) or d per block) for the
// item's rows r0 .. r0 + 15 and the tile's activation rows n0 .. n0 + 7; out[o] is the chunk
// value of this thread's output o (o = 0, 1: weight row r0 + g, activation rows n0 + 2t,
// n0 + 2t + 1; o = 2, 3: weight row r0 + g + 8).
template <bool MIN>
__device__ __forceinline__ void piece_q4(const MmaJob& j, const u8* w, int seg_rows, int r0, int n0, int c, float* out) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nb = j.cols / 32, bpc = nb / j.chunks;
    const size_t rb = (size_t)nb * 16, xstride = (size_t)j.cols + j.cols / 4;
    constexpr int S = MIN ? 4 : 2;
    const int wr0 = min(r0 + g, seg_rows - 1), wr1 = min(r0 + g + 8, seg_rows - 1);
    const i8* xr0 = j.xq + (size_t)min(n0 + 2 * t, j.batch - 1) * xstride;
    const i8* xr1 = j.xq + (size_t)min(n0 + 2 * t + 1, j.batch - 1) * xstride;
    const Piece pc = {
        w + (size_t)wr0 * rb + 4 * t,
        w + (size_t)wr1 * rb + 4 * t,
        w + (size_t)seg_rows * rb + (size_t)wr0 * nb * S,
        w + (size_t)seg_rows * rb + (size_t)wr1 * nb * S,
        j.xq + (size_t)min(n0 + g, j.batch - 1) * xstride + 4 * t,
        (const float2*)(xr0 + j.cols),
        (const float2*)(xr1 + j.cols),
    };
    // the half-warp butterfly's first two levels, lane by lane: b[o][i] = (lane i + lane i + 8)
    // + (lane i + 4 + lane i + 12) of output o, the four lanes' chains run side by side (lane
    // v's chain: the chunk's blocks v, v + 16, v + 32, ... in order)
    const int first = c * bpc, end = first + bpc;
    float b[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        constexpr int LANE[4] = {0, 8, 4, 12};
        float acc[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int o = 0; o < 4; ++o) acc[q][o] = 0.f;
        for (int p = first + i; p < end; p += 16) {
            Block blk[4];
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (p + LANE[q] < end) blk[q] = load_block<MIN>(pc, p + LANE[q]);
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (p + LANE[q] < end) add_block<MIN>(blk[q], &acc[q][0], &acc[q][1], &acc[q][2], &acc[q][3]);
        }
#pragma unroll
        for (int o = 0; o < 4; ++o) b[o][i] = (acc[0][o] + acc[1][o]) + (acc[2][o] + acc[3][o]);
    }
#pragma unroll
    for (int o = 0; o < 4; ++o) out[o] = (b[o][0] + b[o][2]) + (b[o][1] + b[o][3]);
}

// Chunk values of a piece: 4 per thread, at [(half * tiles + tile) * chunks + chunk][lane * 4 + o].
#define MMA_PIECE_VALUES 128

template <bool MIN>
__device__ __forceinline__ void matvec_mma_run(const MmaJob& j) {
    extern __shared__ float part[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int halves = j.swiglu ? 2 : 1;
    const int n_first = blockIdx.y * j.tiles * 8;
    const int tiles = min(j.tiles, (j.batch - n_first + 7) / 8);
    // the item's segment and first row
    int s = 0, r0 = blockIdx.x * 16;
    for (; s + 1 < j.segs && !j.swiglu; ++s) {
        const int n = (mma_rows(j, s) + 15) / 16 * 16;
        if (r0 < n) break;
        r0 -= n;
    }
    const int seg_rows = mma_rows(j, s);
    overlap_with_neighbours();
    for (int work = warp; work < halves * tiles * j.chunks; work += warps) {
        const int ht = work / j.chunks, c = work - ht * j.chunks;
        const int h = ht / tiles, tile = ht - h * tiles;
        float out[4];
        piece_q4<MIN>(j, mma_w(j, s + h), seg_rows, r0, n_first + 8 * tile, c, out);
        float* at = part + (size_t)work * MMA_PIECE_VALUES + lane * 4;
#pragma unroll
        for (int o = 0; o < 4; ++o) at[o] = out[o];
    }
    __syncthreads();
    float* y = mma_y(j, s);
    for (int e = threadIdx.x; e < tiles * MMA_PIECE_VALUES; e += blockDim.x) {
        const int tile = e / MMA_PIECE_VALUES, v = e - tile * MMA_PIECE_VALUES;
        const int l = v >> 2, o = v & 3;
        const int row = r0 + (l >> 2) + 8 * (o >> 1), b = n_first + 8 * tile + 2 * (l & 3) + (o & 1);
        float total[2];
        for (int h = 0; h < halves; ++h) {
            float stack[5];
            const float* at = part + (size_t)(h * tiles + tile) * j.chunks * MMA_PIECE_VALUES + v;
            for (int c = 0; c < j.chunks; ++c) total[h] = tree_push(stack, c, at[(size_t)c * MMA_PIECE_VALUES]);
        }
        if (row < seg_rows && b < j.batch) {
            const size_t i = (size_t)b * seg_rows + row;
            if (j.swiglu) y[i] = swiglu_limited(total[0], total[1], j.limit);
            else y[i] = j.residual ? j.residual[i] + total[0] : total[0];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) matvec_mma_q4_0(const MmaJob job) { matvec_mma_run<false>(job); }
extern "C" __global__ void __launch_bounds__(256) matvec_mma_q4_1(const MmaJob job) { matvec_mma_run<true>(job); }
