// memra kernels: the products of a batched decode step on tensor cores, for weights of
// 32-value blocks with 4-bit quants (q4_0, q4_1), with the bits of matvec.cu's one-row
// kernel on every row, whatever the batch.
//
// Why the bits agree: the one-row kernel (matvec.cu, Planar) gives chain v of a K chunk the
// blocks v, v + 16, v + 32, ... (lane v of a half-warp, or of a smaller group of lanes for a
// chunk of fewer blocks) and adds, block by block, (d_w * d_x) * dot (+ m_w * s_x for q4_1)
// into one f32 accumulator with fmaf (a lane's chain); the butterfly (lanes_sum: offsets 1, 2,
// 4, 8) then sums the sixteen chains, which is the fixed tree (S0 + S1) + (S2 + S3) with S_g = (c_4g + c_4g+1) + (c_4g+2 + c_4g+3), and the
// chunk values meet in the balanced tree ((k0 + k1) + (k2 + k3)) + .... The dot of a block's
// weight quants with its 8-bit activation quants is an exact integer. Here an integer mma
// (m16n8k32, s8 x s8 -> s32) computes that same integer for 16 weight rows x 8 activation rows
// of one block at once, exactly (the order of an integer sum does not matter), and each thread
// runs, for each of its outputs, the chains with the same fmaf expressions in the same order
// and sums them in the same trees. The activation quants are the one-row kernel's too:
// quantize_rows_q8 (matvec.cu) makes them with the same quantize_x<32>.
//
// The order of work: the chains of a chunk fall into four groups of four neighbours, group g
// the chains 4g .. 4g + 3, and K is walked chunk by chunk, group by group, and within a group
// in steps of 16 blocks, each step bringing one block to each of the group's chains (blocks 16
// s + 4g .. 16 s + 4g + 3 of the chunk: 64 contiguous bytes of every weight row). A group
// takes as many steps as its chains have blocks, and ends with S_g; S0 + S1 and S2 wait for
// S3, then the chunk joins the chunk tree (its pending subtrees in shared memory). So a thread
// keeps four chain accumulators per output and two pending values. Every step's blocks are
// copied to shared memory with cp.async, STAGES - 1 steps ahead, and blocks past a chunk's end
// as zeros; ldmatrix brings a warp's fragments from there.
//
// Layout: a block of 8 warps, WM x WN x KW, takes a tile of 16 WM weight rows (an item: 16 WM
// rows of one weight, or for SwiGLU 8 WM rows of gate and the same rows of up) and 8 NT WN
// activation rows; warp (m, n, kz) computes weight rows 16 m .. of the tile against its NT
// tiles of 8 activation rows over part kz of K (KW parts of whole chunks, each a subtree of the
// chunk tree, joined at the end). The grid's x walks the batch in tiles (neighbours share the
// item's weight bytes in L2), its y the items of the job's weights (q, k, v in one launch).
#include "common.cuh"

#define MMA_MAX_SEGS 3  // the fields of MmaJob; must match MMA_MAX_SEGS in matvec_mma.rs
#define MMA_THREADS 256 // must match MMA_THREADS in matvec_mma.rs
#define MMA_GROUP 4     // blocks of a step per part of K: one per chain of a group
#define MMA_LEVELS 5    // levels of the chunk stack: parts of up to 32 chunks

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
};

__device__ __forceinline__ const u8* mma_w(const MmaJob& j, int s) { return s == 0 ? j.w0 : s == 1 ? j.w1 : j.w2; }
__device__ __forceinline__ float* mma_y(const MmaJob& j, int s) { return s == 0 ? j.y0 : s == 1 ? j.y1 : j.y2; }
__device__ __forceinline__ int mma_rows(const MmaJob& j, int s) { return s == 0 ? j.rows0 : s == 1 ? j.rows1 : j.rows2; }

// d = c + a b for every output, d's integers plain (c = 0) or biased (c = INT_BIAS).
__device__ __forceinline__ void mma_s8(int* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c));
}

// The pointer p, which the compiler may no longer take apart into a base and offsets that a
// loop adds again at every use: a loop's addresses stay one multiply-add from it.
template <typename T>
__device__ __forceinline__ T* whole(T* p) {
    asm("mov.b64 %0, %0;" : "+l"(p));
    return p;
}

// Adds chunk `c`'s values x (output i's pending subtrees at stack[i * MMA_THREADS]) into
// the pending subtrees of chunk_tree's balanced tree (level l at stack[l * stride] holds the
// sum of the 2^l chunks before the current one); after the last chunk of a power-of-two
// count, x holds the whole tree. A part of 2^L chunks touches levels below L only.
template <int N>
__device__ __forceinline__ void tree_push(float* stack, int stride, int c, float (&x)[N]) {
#pragma unroll
    for (int l = 0; l < MMA_LEVELS; ++l) {
        if (!(c & (1 << l))) {
#pragma unroll
            for (int i = 0; i < N; ++i) stack[l * stride + i * MMA_THREADS] = x[i];
            return;
        }
#pragma unroll
        for (int i = 0; i < N; ++i) x[i] = stack[l * stride + i * MMA_THREADS] + x[i];
    }
}

// Steps of group g in a chunk of bpc blocks: its chains' blocks, 16 apart; in the single form
// (chunks of at most 16 blocks) one, of zeros where the group's chains have no block.
template <bool SINGLE>
__device__ __forceinline__ int group_steps(int bpc, int g) { return SINGLE ? 1 : (bpc + 15 - 4 * g) >> 4; }

// The position of a step in the walk: chunk c, group g, step s of the group's.
template <bool SINGLE>
struct Walk {
    int c = 0, g = 0, s = 0;
    __device__ __forceinline__ void advance(int bpc) {
        // every group has a step in every chunk: the single form one, the other (chunks of
        // more than 16 blocks) at least one
        if (++s >= group_steps<SINGLE>(bpc, g)) {
            s = 0;
            if (++g == 4) g = 0, ++c;
        }
    }
    // the index of the step's first block in its chunk, and in its part
    __device__ __forceinline__ int rel() const { return 16 * s + 4 * g; }
    __device__ __forceinline__ u32 at(int bpc) const { return c * bpc + rel(); }
};

// Shared bytes of one step, as matvec_mma.rs's `Tile::shared_bytes` computes them: per weight
// row the quants of each part's 4 blocks (16 bytes of padding after them keep ldmatrix's rows
// on distinct banks), then their scales; per activation row the quants (padded too); then
// the activation rows' (d, d * sum) pairs, slot by slot (a thread's two rows side by side).
template <int KW>
struct StageLayout {
    static constexpr int WQ = KW * MMA_GROUP * 16 + 16, WS = KW * MMA_GROUP * 4;
    static constexpr int XQ = KW * MMA_GROUP * 32 + 16, XS = KW * MMA_GROUP * 8;
};

// A block of 8 warps, WM x WN x KW: warp (m, n, kz) computes weight rows 16 m .. 16 m + 15 of
// the tile against its NT tiles of 8 activation rows, over part kz of the K chunks (chunks /
// KW consecutive ones: a subtree of the chunk tree); the parts' subtrees meet in shared memory
// at the end. STAGES steps are in flight; the chunk stack ([level][output][thread]) follows
// their buffers. SINGLE (chunks of at most 16 blocks): a chunk is four steps, one per group,
// in the four buffers, so the kernel unrolls them with constant buffers.
template <bool MIN, int NT, int WN, int KW, bool SINGLE>
__device__ __forceinline__ void matvec_mma_run(const MmaJob& j) {
    constexpr int STAGES = 4;
    constexpr int WM = 8 / (WN * KW), BM = 16 * WM, BN = 8 * NT * WN;
    using L = StageLayout<KW>;
    constexpr int WS_AT = BM * L::WQ, XQ_AT = WS_AT + BM * L::WS, XS_AT = XQ_AT + BN * L::XQ;
    constexpr int STAGE = XS_AT + BN * L::XS;
    // each thread's copies per step: weight pieces (a block's quants and scale) of one row and
    // slot in WCOPIES consecutive parts; activation quant halves of one row, slot and half in
    // XCOPIES consecutive parts; an activation scale pair
    constexpr int WCOPIES = BM * KW * MMA_GROUP / MMA_THREADS;
    constexpr int XQ_PIECES = BN * KW * MMA_GROUP * 2, XS_PIECES = BN * KW * MMA_GROUP;
    constexpr int XCOPIES = (XQ_PIECES + MMA_THREADS - 1) / MMA_THREADS;
    constexpr int S = MIN ? 4 : 2;
    // a level of the chunk stack: a float per output and thread
    constexpr int SIDE = NT * 4 * MMA_THREADS;
    // every piece of a step has its thread, each thread's pieces one part and slot
    static_assert(WM * WN * KW == 8 && WM >= 2, "8 warps, at least 2 along the weight rows");
    static_assert(WCOPIES >= 1 && BM * KW * MMA_GROUP % MMA_THREADS == 0 && KW % WCOPIES == 0, "whole weight pieces per thread");
    static_assert(KW % XCOPIES == 0 && (XCOPIES == 1 || XQ_PIECES % MMA_THREADS == 0), "whole activation pieces per thread");
    static_assert(XS_PIECES <= MMA_THREADS && MMA_THREADS % (8 * KW) == 0, "activation pieces per thread");
    static_assert(NT == 1 || NT == 2, "one ldmatrix per slot brings the warp's activation tiles");
    static_assert(STAGES * STAGE >= 4 * BM / 2 * BN, "the buffers hold SwiGLU's up values at the end");
    extern __shared__ __align__(16) u8 smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm_i = warp % WM, wn_i = (warp / WM) % WN, kz = warp / (WM * WN);
    const int nb = j.cols / 32, bpc = nb / j.chunks, parts = j.chunks / KW;
    int steps = 0;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) steps += group_steps<SINGLE>(bpc, gi);
    steps *= parts;
    const int item_rows = j.swiglu ? BM / 2 : BM;
    // the item's segment and first row
    int seg = 0, r0 = blockIdx.y * item_rows;
    for (; seg + 1 < j.segs && !j.swiglu; ++seg) {
        const int n = (mma_rows(j, seg) + BM - 1) / BM * BM;
        if (r0 < n) break;
        r0 -= n;
    }
    const int seg_rows = mma_rows(j, seg), n_first = blockIdx.x * BN;
    const size_t wrow = (size_t)nb * 16, xstride = (size_t)j.cols + j.cols / 4;

    // this thread's weight row, slot and first part
    const int wi = tid & 3, wkz = (tid >> 2) % (KW / WCOPIES) * WCOPIES, wr = tid / (MMA_GROUP * KW / WCOPIES);
    // this thread's activation row, slot, half and first part
    const int xi = (tid >> 1) & 3, xh = tid & 1, xkz = (tid >> 3) % (KW / XCOPIES) * XCOPIES;
    const int xr = tid / (8 * KW / XCOPIES);
    // this thread's activation scale pair: row sr, slot wi, part skz
    const int skz = (tid >> 2) % KW, sr = tid / (4 * KW);
    const u32 part_blocks = parts * bpc;
    // the thread's sources at its slot's block of chunk 0 of its first part (a step adds its
    // block's index in the part, `at`, and a further copy whole parts) and its destinations
    // in buffer 0
    const u8 *wq_src, *ws_src;
    {
        const int half = j.swiglu && wr >= BM / 2 ? 1 : 0;
        const u8* w = mma_w(j, seg + half);
        const int row = min(r0 + wr - half * (BM / 2), seg_rows - 1);
        const size_t first = (size_t)wkz * part_blocks + wi;
        wq_src = w + (size_t)row * wrow + first * 16;
        ws_src = w + (size_t)seg_rows * wrow + ((size_t)row * nb + first) * S;
    }
    const i8 *xq_src = j.xq + (size_t)min(n_first + xr, j.batch - 1) * xstride + 16 * xh + ((size_t)xkz * part_blocks + xi) * 32;
    const i8 *xs_src = j.xq + (size_t)min(n_first + sr, j.batch - 1) * xstride + j.cols + ((size_t)skz * part_blocks + wi) * 8;
    wq_src = whole(wq_src), ws_src = whole(ws_src), xq_src = whole(xq_src), xs_src = whole(xs_src);
    const u32 w_dst = smem_addr(smem) + wr * L::WQ + 64 * wkz + 16 * wi;
    const u32 ws_dst = smem_addr(smem) + WS_AT + wr * L::WS + 16 * wkz + 4 * wi;
    const u32 xq_dst = smem_addr(smem) + XQ_AT + xr * L::XQ + 128 * xkz + 32 * xi + 16 * xh;
    const u32 xs_dst = smem_addr(smem) + XS_AT + ((skz * MMA_GROUP + wi) * BN + sr) * 8;
    // copies the step whose first block is `rel` in its chunk and `at` in its part into
    // buffer buf
    auto issue_weights = [&](int buf, u32 at, int rel) {
        const u32 st = buf * STAGE;
        const bool w_in = rel + wi < bpc;
#pragma unroll
        for (int k = 0; k < WCOPIES; ++k) {
            const u32 blk = at + k * part_blocks;
            cp_async16_at(w_dst + st + 64 * k, wq_src + (size_t)blk * 16, w_in);
            // q4_0's 2-byte scale: the aligned word holding it (compute picks the half)
            const u8* sc = ws_src + (size_t)blk * S;
            cp_async4_at(ws_dst + st + 16 * k, MIN ? sc : (const u8*)((size_t)sc & ~(size_t)3), w_in);
        }
    };
    auto issue_activations = [&](int buf, u32 at, int rel) {
        const u32 st = buf * STAGE;
        if (XQ_PIECES / XCOPIES >= MMA_THREADS || tid < XQ_PIECES / XCOPIES) {
#pragma unroll
            for (int k = 0; k < XCOPIES; ++k)
                cp_async16_at(xq_dst + st + 128 * k, xq_src + (size_t)(at + k * part_blocks) * 32, rel + xi < bpc);
        }
        if (XS_PIECES >= MMA_THREADS || tid < XS_PIECES) cp_async8_at(xs_dst + st, xs_src + (size_t)at * 8, rel + wi < bpc);
    };
    auto issue = [&](int buf, u32 at, int rel) {
        issue_weights(buf, at, rel);
        issue_activations(buf, at, rel);
    };

    // this lane's ldmatrix rows: weight rows 16 m + 8 (l / 8 % 2) + l % 8 of slot l / 16 (plus
    // the pair's first slot); activation row l % 8 of tile l / 16 (NT = 2), bytes 16 (l / 8 %
    // 2) of the slot's block
    const int lr = lane & 7, lm = lane >> 3;
    const u32 a_at = smem_addr(smem) + (16 * wm_i + 8 * (lm & 1) + lr) * L::WQ + 64 * kz + 16 * (lm >> 1);
    const u32 b_at = smem_addr(smem) + XQ_AT + ((wn_i * NT + (NT == 2 ? lm >> 1 : 0)) * 8 + lr) * L::XQ + 128 * kz + 16 * (lm & 1);
    const int ra = 16 * wm_i + g;
    // one step's blocks of slots 2p and 2p + 1 (chains 4g + 2p and 4g + 2p + 1) from buffer
    // `buf` into their accumulators acc[0] and acc[1], chunk c of K (its first block's parity
    // places q4_0's scales). A slot past the chunk's end was copied as zeros: its terms are
    // fmaf(0, 0, acc) = acc exactly (an accumulator that starts at +0 never holds -0), as if it
    // were skipped.
    auto step_pair = [&](int buf, int c, int p, float (&acc)[2][NT][4]) {
        const u8* sg = smem + buf * STAGE;
        const int odd = (c * bpc) & 1;
        const uint2 sv0 = *(const uint2*)(sg + WS_AT + ra * L::WS + 16 * kz + 8 * p);
        const uint2 sv1 = *(const uint2*)(sg + WS_AT + (ra + 8) * L::WS + 16 * kz + 8 * p);
        u32 wf[4];
        ldmatrix_x4_at(wf, a_at + buf * STAGE + 32 * p);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int i = 2 * p + q;
            const u32 w0 = wf[2 * q], w1 = wf[2 * q + 1], s0 = q ? sv0.y : sv0.x, s1 = q ? sv1.y : sv1.x;
            u32 a0 = w0 & NIB, a1 = w1 & NIB, a2 = (w0 >> 4) & NIB, a3 = (w1 >> 4) & NIB;
            float d0, d1, m0 = 0.f, m1 = 0.f;
            if (MIN) {
                d0 = f16_to_f32((u16)(s0 & 0xffff)), m0 = f16_to_f32((u16)(s0 >> 16));
                d1 = f16_to_f32((u16)(s1 & 0xffff)), m1 = f16_to_f32((u16)(s1 >> 16));
            } else {
                // q4_0's quants carry an offset of 8: the mma takes q - 8 itself; an odd block's
                // scale is the high half of its word
                a0 = __vsub4(a0, 0x08080808u), a1 = __vsub4(a1, 0x08080808u);
                a2 = __vsub4(a2, 0x08080808u), a3 = __vsub4(a3, 0x08080808u);
                const int sh = ((odd + i) & 1) ? 16 : 0;
                d0 = f16_to_f32((u16)(s0 >> sh)), d1 = f16_to_f32((u16)(s1 >> sh));
            }
            u32 bf[2 * NT];
            if (NT == 2) ldmatrix_x4_at(bf, b_at + buf * STAGE + 32 * i);
            else ldmatrix_x2_at(bf, b_at + buf * STAGE + 32 * i);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int nr = (wn_i * NT + n) * 8;
                const float4 xv = *(const float4*)(sg + XS_AT + ((kz * MMA_GROUP + i) * BN + nr + 2 * t) * 8);
                // the mma adds the dots to int_to_f32's bias, so each float is one subtraction
                int d[4];
                mma_s8(d, a0, a1, a2, a3, bf[2 * n], bf[2 * n + 1], INT_BIAS);
                float* a = acc[q][n];
                a[0] = fmaf(d0 * xv.x, biased_to_f32(d[0]), a[0]);
                a[1] = fmaf(d0 * xv.z, biased_to_f32(d[1]), a[1]);
                a[2] = fmaf(d1 * xv.x, biased_to_f32(d[2]), a[2]);
                a[3] = fmaf(d1 * xv.z, biased_to_f32(d[3]), a[3]);
                if (MIN) {
                    a[0] = fmaf(m0, xv.y, a[0]);
                    a[1] = fmaf(m0, xv.w, a[1]);
                    a[2] = fmaf(m1, xv.y, a[2]);
                    a[3] = fmaf(m1, xv.w, a[3]);
                }
            }
        }
    };

    // the first steps' weights, which no kernel writes, while the previous kernel drains; then
    // their activations, each step's in a group of its own (the first group with all the
    // weights)
    launch_dependents();
    Walk<SINGLE> ahead;
    {
        Walk<SINGLE> first;
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {
            if (st < steps) issue_weights(st, first.at(bpc), first.rel());
            first.advance(bpc);
        }
    }
    wait_for_predecessor();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < steps) issue_activations(st, ahead.at(bpc), ahead.rel());
        ahead.advance(bpc);
        cp_async_commit();
    }
    // the chunk stack's levels below log2(parts), then the part's value (level `top`)
    float* stack = (float*)(smem + STAGES * STAGE) + tid;
    const int top = 31 - __clz(parts);
    int buf = 0, ahead_buf = STAGES - 1, step = 0;
    for (int c = 0; c < parts; ++c) {
        // per output: S0 + S1 (then S0 + S1 waits beside S2)
        float pend[NT][4], pend2[NT][4];
#pragma unroll
        for (int gi = 0; gi < 4; ++gi) {
            // acc[p][q]: the chain 4 gi + 2 p + q
            float acc[2][2][NT][4];
#pragma unroll
            for (int p = 0; p < 2; ++p)
#pragma unroll
                for (int q = 0; q < 2; ++q)
#pragma unroll
                    for (int n = 0; n < NT; ++n)
#pragma unroll
                        for (int o = 0; o < 4; ++o) acc[p][q][n][o] = 0.f;
            for (int s = group_steps<SINGLE>(bpc, gi); s > 0; --s, ++step) {
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                const int at = SINGLE ? gi : buf, next = SINGLE ? (gi + STAGES - 1) % STAGES : ahead_buf;
                if (step + STAGES - 1 < steps) issue(next, ahead.at(bpc), ahead.rel());
                ahead.advance(bpc);
                ahead_buf = ahead_buf == STAGES - 1 ? 0 : ahead_buf + 1;
                cp_async_commit();
                step_pair(at, kz * parts + c, 0, acc[0]);
                step_pair(at, kz * parts + c, 1, acc[1]);
                buf = buf == STAGES - 1 ? 0 : buf + 1;
            }
            // the group's chains are done: S_g joins the chunk's tree, and after the last group
            // the chunk joins the part's subtree of the chunk tree
            float chunk[NT * 4];
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int o = 0; o < 4; ++o) {
                    const float sg = (acc[0][0][n][o] + acc[0][1][n][o]) + (acc[1][0][n][o] + acc[1][1][n][o]);
                    if (gi == 0) pend[n][o] = sg;
                    else if (gi == 1) pend[n][o] = pend[n][o] + sg;
                    else if (gi == 2) pend2[n][o] = sg;
                    else chunk[n * 4 + o] = pend[n][o] + (pend2[n][o] + sg);
                }
            if (gi == 3) {
                tree_push(stack, SIDE, c, chunk);
                if (c == parts - 1) {
#pragma unroll
                    for (int i = 0; i < NT * 4; ++i) stack[top * SIDE + i * MMA_THREADS] = chunk[i];
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    // the parts' subtrees, in a balanced tree over the parts (in the warps of part 0)
    const float* parts_at = (const float*)(smem + STAGES * STAGE) + top * SIDE + warp % (WM * WN) * 32 + lane;
    float total[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int o = 0; o < 4; ++o) {
            float v[KW];
#pragma unroll
            for (int p = 0; p < KW; ++p) v[p] = parts_at[(n * 4 + o) * MMA_THREADS + p * WM * WN * 32];
#pragma unroll
            for (int w = 1; w < KW; w *= 2)
#pragma unroll
                for (int p = 0; p < KW; p += 2 * w) v[p] = v[p] + v[p + w];
            total[n][o] = v[0];
        }
    if (kz > 0) return;
    // SwiGLU: the up warps leave their values in shared memory for the gate warps
    float* up = (float*)smem;
    constexpr int GATE_WARPS = WM / 2;
    if (j.swiglu && wm_i >= GATE_WARPS) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int o = 0; o < 4; ++o) {
                const int row = ra - 16 * GATE_WARPS + 8 * (o >> 1), col = (wn_i * NT + n) * 8 + 2 * t + (o & 1);
                up[row * BN + col] = total[n][o];
            }
    }
    if (j.swiglu) {
        // only the warps of part 0 meet here
        asm volatile("bar.sync 1, %0;" ::"r"(WM * WN * 32) : "memory");
        if (wm_i >= GATE_WARPS) return;
    }
    float* y = mma_y(j, seg);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int o = 0; o < 4; ++o) {
            const int rl = ra + 8 * (o >> 1), col = (wn_i * NT + n) * 8 + 2 * t + (o & 1);
            const int row = r0 + rl, b = n_first + col;
            if (row >= seg_rows || b >= j.batch) continue;
            const size_t i = (size_t)b * seg_rows + row;
            if (j.swiglu) y[i] = swiglu_limited(total[n][o], up[rl * BN + col], j.limit);
            else y[i] = j.residual ? j.residual[i] + total[n][o] : total[n][o];
        }
}

// The tiles (must match the `Tile`s of matvec_mma.rs): over more than 16 activation rows 64
// weight rows x 32 activation rows, or 32 x 32 with K in two parts where the launch has few
// tiles; over 9 to 16 rows 32 x 16, K in four parts; up to 8 rows 32 x 8, K in four parts.
// Each in two forms: `_single` for chunks of up to 16 blocks, the other for any chunks.
#define MMA_ENTRY extern "C" __global__ void __launch_bounds__(MMA_THREADS, 2)
MMA_ENTRY matvec_mma_q4_0(const MmaJob job) { matvec_mma_run<false, 2, 2, 1, false>(job); }
MMA_ENTRY matvec_mma_k2_q4_0(const MmaJob job) { matvec_mma_run<false, 2, 2, 2, false>(job); }
MMA_ENTRY matvec_mma16_q4_0(const MmaJob job) { matvec_mma_run<false, 2, 1, 4, false>(job); }
MMA_ENTRY matvec_mma8_q4_0(const MmaJob job) { matvec_mma_run<false, 1, 1, 4, false>(job); }
MMA_ENTRY matvec_mma_single_q4_0(const MmaJob job) { matvec_mma_run<false, 2, 2, 1, true>(job); }
MMA_ENTRY matvec_mma_k2_single_q4_0(const MmaJob job) { matvec_mma_run<false, 2, 2, 2, true>(job); }
MMA_ENTRY matvec_mma16_single_q4_0(const MmaJob job) { matvec_mma_run<false, 2, 1, 4, true>(job); }
MMA_ENTRY matvec_mma8_single_q4_0(const MmaJob job) { matvec_mma_run<false, 1, 1, 4, true>(job); }
MMA_ENTRY matvec_mma_q4_1(const MmaJob job) { matvec_mma_run<true, 2, 2, 1, false>(job); }
MMA_ENTRY matvec_mma_k2_q4_1(const MmaJob job) { matvec_mma_run<true, 2, 2, 2, false>(job); }
MMA_ENTRY matvec_mma16_q4_1(const MmaJob job) { matvec_mma_run<true, 2, 1, 4, false>(job); }
MMA_ENTRY matvec_mma8_q4_1(const MmaJob job) { matvec_mma_run<true, 1, 1, 4, false>(job); }
MMA_ENTRY matvec_mma_single_q4_1(const MmaJob job) { matvec_mma_run<true, 2, 2, 1, true>(job); }
MMA_ENTRY matvec_mma_k2_single_q4_1(const MmaJob job) { matvec_mma_run<true, 2, 2, 2, true>(job); }
MMA_ENTRY matvec_mma16_single_q4_1(const MmaJob job) { matvec_mma_run<true, 2, 1, 4, true>(job); }
MMA_ENTRY matvec_mma8_single_q4_1(const MmaJob job) { matvec_mma_run<true, 1, 1, 4, true>(job); }
