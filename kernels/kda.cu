// memra kernels: Kimi delta attention (KDA), a decode step's token or a prefill step's tokens
// in order, with the semantics of the CPU backend's cpu::kernels::kda (llama.cpp's ssm_conv
// and gated_delta_net). The projections around them are ordinary matvecs (GEMMs over a prefill
// step's rows); these kernels do the rest:
//
// kda_conv_f32 runs the depthwise causal convolution of q, k and v (stored one after the other:
// 3 * heads heads of hd channels, their windows and tap weights in the same order) and SiLU,
// moves each channel's window on by the new input, and L2-normalizes the q and k heads.
//
// kda_delta_f32 turns the raw decay and rate into g = a * softplus(f + dt_bias) (or, with a
// lower bound lb as glm5-next has, g = lb * sigmoid(-(f + dt_bias) * a)) and
// beta = sigmoid(b), runs the gated delta rule on each head's d x d state (in place) and
// writes rms_norm(o) * w * sigmoid(gate).
//
// Every value is computed with the CPU loops' float operations in their order, with explicit
// round-to-nearest intrinsics so that no multiply-add is contracted into an FMA, and the f64
// sums of the norms taken sequentially by one thread as the CPU does. The bits match the CPU's
// except where expf and logf (CUDA's, within 2 ulp) round differently from the host libm's:
// SiLU, softplus, the decay exp and the sigmoids; a differing exp then moves the state by an
// ulp, which later tokens carry. Division and sqrt are IEEE (NVRTC's default -prec-div and
// -prec-sqrt), and so are reciprocals (rcp_rn).
//
// The recurrent state is kept key-major on the device: S[j][i] (value row j, key column i) at
// i * d + j, so that thread j, which owns value row j, reads and writes coalesced. Its address
// never changes, and the per-step values are all in device memory, so a step is capturable.
// A step whose first token is at position 0 (pos[0], the step's position) starts a sequence:
// both kernels read the windows and the state as zeros then, as the CPU's KdaState::begin
// resets them, whatever an earlier sequence left.
//
// A batched step (`slots` set) holds several sequences' rows, each row at pos[r] in sequence
// slot slots[r], whose windows and state sit slot_len values past the previous slot's: a
// sequence's rows are a span of consecutive rows of one slot at consecutive positions (one row
// at decode, a joining prompt's chunk). Grid row y takes the span that starts at row y (none
// when row y continues a span) and runs its rows in order, as a step of that sequence alone
// would; a span at position 0 starts from zeros. A pad row (PAD_SLOT) touches no state and
// gets zeros.
//
// A speculative plan's KDA layers (`track` set) keep, as the CPU's KdaState::begin does, the
// state after each row but the last of a span of 2 to `keeps` rows (a verify step's), so that
// a later span may start again after any of them: per slot, track holds the positions taken
// in, the position after the span's first row and the rows kept, and `kept` holds keeps - 1
// states a slot, each laid out as the live one. A span at a position the state has gone past
// starts from the kept state there (a span anywhere else before it cannot be honoured: it
// starts from NaN, so its outputs and those after it are NaN until the sequence starts again
// at position 0). kda_track_u32 records each span once both kernels have run.
#include "common.cuh"

// The widest head (threads of a block).
#define KDA_MAX_DIM 256
// The most convolution taps (KDA_MAX_TAPS in executor/src/cuda/kda.rs), and the tokens a block
// of kda_conv_f32 takes (KDA_CONV_ROWS there).
#define KDA_MAX_TAPS 8
#define KDA_CONV_ROWS 8
// kda_delta_f32: the state entries of its row a thread holds in registers (KDA_HELD in
// executor/src/cuda/kda.rs); the rest sit in shared memory
#define KDA_HELD 64
// no block of kda_conv_f32 but the first reads a window
static_assert(KDA_CONV_ROWS >= KDA_MAX_TAPS - 1, "a later block's tokens start past the window");

// The rows a block takes: `first` .. `end` - 1 (indices into the step's rows), the offset of
// their sequence's windows and state, and whether they start the sequence or are pad rows.
struct KdaSpan {
    int first, end;
    size_t base;
    bool fresh, pad;
};

// The span of a batched step that starts at row y (`slots` set), or false when row y continues
// the span of the row before it.
__device__ __forceinline__ bool kda_span(const u32* pos, const u32* slots, int rows, int y, long long slot_len,
                                         KdaSpan& span) {
    const u32 slot = slots[y];
    // row r (> 0) of the span of row r - 1: the same slot (not a pad row's), the next position
    const auto continues = [&](int r) {
        return slots[r] == slots[r - 1] && slots[r] != PAD_SLOT && pos[r] == pos[r - 1] + 1;
    };
    if (y > 0 && continues(y)) return false;
    int end = y + 1;
    while (end < rows && continues(end)) ++end;
    span.first = y;
    span.end = end;
    span.pad = slot == PAD_SLOT;
    span.base = span.pad ? 0 : (size_t)slot * (size_t)slot_len;
    span.fresh = pos[y] == 0;
    return true;
}

// A span's keeping: the kept state it starts from (null: the live one), where row u's state is
// kept (into + u * state_len; null: not kept), and whether it starts where no state is kept.
struct KdaKeep {
    const float* restore;
    float* into;
    bool lost;
};

// The keeping of the span of `n` rows at position p in slot `slot` (`kept` is offset to the
// part of a state the kernel holds; a kept state is state_len values, keeps - 1 a slot).
__device__ __forceinline__ KdaKeep kda_keep(const u32* track, float* kept, int keeps, long long state_len, u32 slot,
                                            u32 p, int n, bool fresh) {
    KdaKeep k = {nullptr, nullptr, false};
    if (!track) return k;
    const u32* tr = track + 3 * (size_t)slot;
    float* mine = kept + (size_t)slot * (size_t)(keeps - 1) * (size_t)state_len;
    if (!fresh && p < tr[0]) {
        if (p >= tr[1] && p - tr[1] < tr[2])
            k.restore = mine + (size_t)(p - tr[1]) * (size_t)state_len;
        else
            k.lost = true;
    }
    if (n >= 2 && n <= keeps) k.into = mine;
    return k;
}

// Thread r: where row r starts a span (every row of a batched step may; without `slots`, row 0
// starts the one span of slot 0), that span's slot now has taken in its positions, and keeps
// its rows but the last where it has 2 to `keeps` rows.
extern "C" __global__ void kda_track_u32(const u32* pos, const u32* slots, int rows, u32* track, int keeps) {
    overlap_with_neighbours();
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    KdaSpan span = {0, rows, 0, pos[0] == 0, false};
    if (slots) {
        if (!kda_span(pos, slots, rows, r, 0, span) || span.pad) return;
    } else if (r > 0) {
        return;
    }
    const u32 slot = slots ? slots[r] : 0, p = pos[r];
    const int n = span.end - span.first;
    u32* tr = track + 3 * (size_t)slot;
    tr[0] = p + (u32)n;
    tr[1] = p + 1;
    tr[2] = n >= 2 && n <= keeps ? (u32)(n - 1) : 0;
}

__device__ __forceinline__ float kda_sigmoid(float x) {
    return rcp_rn(__fadd_rn(1.0f, expf(-x)));
}

// The f32 scale 1 / sqrt(mean(v^2) + eps) of v[0..n), the squares summed in f64 in order.
__device__ __forceinline__ float kda_rms_scale(const float* v, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += (double)__fmul_rn(v[i], v[i]);
    const float mean = (float)(sum / (double)n);
    return rcp_rn(__fsqrt_rn(__fadd_rn(mean, eps)));
}

// Block (head, y) of q, k and v (3 * heads heads, q heads first), thread i its channel i, over
// tokens y * KDA_CONV_ROWS .. + KDA_CONV_ROWS - 1 of the `rows` in order (a prefill step's; one
// at decode), or over the span that starts at row y of a batched step (`slots` set). x, out: q, k and v one after the other, each `rows` rows of heads * hd
// (x[(part * rows + r) * heads * hd + channel]); w: taps weights per channel; window: the
// taps - 1 inputs before the first token per channel, oldest first. A token's inputs are the
// window's and x's, which no block writes, so the blocks run apart; the blocks of y = 0 move
// each window on by the step's last inputs once they have read it. l2_eps is eps / hd and
// after 1 / sqrt(hd), both computed by the host as the CPU computes them.
extern "C" __global__ void __launch_bounds__(KDA_MAX_DIM)
    kda_conv_f32(const float* x, const float* w, float* window, float* out, int heads, int hd, int taps,
                 float l2_eps, float after, int rows, const u32* pos, const u32* slots, long long slot_len,
                 const u32* track, float* kept, int keeps, long long state_len) {
    overlap_with_neighbours();
    __shared__ float vals[KDA_MAX_DIM];
    __shared__ float scale;
    const int i = threadIdx.x;
    const size_t c = (size_t)blockIdx.x * hd + i, width = (size_t)heads * hd;
    const size_t part = blockIdx.x / heads, in_part = c - part * width;
    const int keep = taps - 1;
    // the sequence's rows first .. end - 1, of which this block takes r0 .. r1 - 1; the block
    // of its first rows (the only one that reads the window) moves the window on
    KdaSpan span = {0, rows, 0, pos[0] == 0, false};
    int r0 = blockIdx.y * KDA_CONV_ROWS, r1 = min(rows, r0 + KDA_CONV_ROWS);
    bool moves = blockIdx.y == 0;
    if (slots) {
        if (!kda_span(pos, slots, rows, blockIdx.y, slot_len, span)) return;
        if (span.pad) {
            for (int r = span.first; r < span.end && i < hd; ++r) out[(part * rows + r) * width + in_part] = 0.f;
            return;
        }
        window += span.base;
        r0 = span.first;
        r1 = span.end;
        moves = true;
    }
    const bool fresh = span.fresh;
    const int n = span.end - span.first;
    const u32 slot = slots ? slots[span.first] : 0;
    const KdaKeep kk = kda_keep(track, kept, keeps, state_len, slot, pos[span.first], n, fresh);
    // the window the span starts from: the kept one it returns to (only the blocks that move
    // the window read it; a thread its own channel's)
    if (kk.restore && moves && i < hd)
        for (int t = 0; t < keep; ++t) window[c * keep + t] = kk.restore[c * keep + t];
    // input t of the sequence's rows this step (t < 0: the window's, zeros at its start)
    const auto input = [&](int t) -> float {
        if (t >= 0) return x[(part * rows + span.first + t) * width + in_part];
        return fresh ? 0.f : window[c * keep + keep + t];
    };
    for (int r = r0; r < r1; ++r) {
        float v = 0.f;
        if (i < hd) {
            const float* wc = w + c * taps;
            const int u = r - span.first;
            float sum = 0.f;
            for (int t = 0; t < keep; ++t) sum = __fadd_rn(sum, __fmul_rn(input(u - keep + t), wc[t]));
            sum = __fadd_rn(sum, __fmul_rn(input(u), wc[keep]));
            v = __fdiv_rn(sum, __fadd_rn(1.0f, expf(-sum)));
            vals[i] = v;
        }
        // q and k heads are L2-normalized (a block-uniform branch); the next token's writes of
        // vals and scale come after this token's barriers, which follow every read of them
        if (blockIdx.x < 2 * heads) {
            __syncthreads();
            if (i == 0) scale = kda_rms_scale(vals, hd, l2_eps);
            __syncthreads();
            v = __fmul_rn(__fmul_rn(v, scale), after);
        }
        if (i < hd) out[(part * rows + r) * width + in_part] = v;
    }
    if (moves && i < hd) {
        // the window after each row but the last, where it is kept (by this block alone: a
        // kept window may be the one this span started from, read above by this thread)
        if (kk.into)
            for (int u = 0; u < n - 1; ++u)
                for (int t = 0; t < keep; ++t) kk.into[(size_t)u * state_len + c * keep + t] = input(u + 1 - keep + t);
        // the sequence's last keep inputs, oldest first: entry t is read from entry n + t of
        // the old window (or x) before that entry is written (n its rows this step)
        for (int t = 0; t < keep; ++t) window[c * keep + t] = input(n - keep + t);
    }
}

// One block per head, thread j its value row j, over `rows` tokens in order (a prefill step's;
// one at decode), each as a decode step alone computes it. The row's first KDA_HELD state
// entries are loaded once into registers and the rest (a head wider than KDA_HELD) into this
// thread's column of dynamic shared memory (kda_delta_smem_bytes in executor/src/cuda/kda.rs),
// read there by each token's first pass, updated there by its second, and stored after the
// last token. Steps past d are computed on zeros and selected away (their shared reads stay
// within the arrays), so that no branch holds the loads of the next steps behind the
// sequential sums. Each token's output before its norm goes to `out`; once every token is
// done, warp w normalizes tokens w, w + warps, ...: its lane 0 takes the f64 sum of squares
// in order (kda_rms_scale, the CPU's sequential sum), the lanes the gated values. qkv: the
// convolved q, k, v, each `rows` rows of heads * d (kda_conv_f32's layout); f: the raw decay
// (a row of heads * d per token) before dt_bias and softplus; a: per head; b: the raw rate
// (heads per token); gate: the output gate before its sigmoid (heads * d per token); norm_w:
// d weights; states: heads key-major d x d states; out: heads * d per token. scale is
// 1 / sqrt(d) computed by the host; bounded selects the bounded decay with lower bound lb.
// Block (head, y) of a batched step (`slots` set) takes the span that starts at row y.
extern "C" __global__ void __launch_bounds__(KDA_MAX_DIM)
    kda_delta_f32(float* states, const float* qkv, const float* f, const float* dt_bias, const float* a,
                  const float* b, const float* gate, const float* norm_w, float* out, int heads, int d,
                  float scale, float eps, int bounded, float lb, int rows, const u32* pos, const u32* slots,
                  long long slot_len, const u32* track, float* kept, int keeps, long long state_len) {
    overlap_with_neighbours();
    __shared__ float qs[KDA_MAX_DIM], ks[KDA_MAX_DIM], decay[KDA_MAX_DIM];
    extern __shared__ float kda_rest[];
    const int h = blockIdx.x, j = threadIdx.x;
    const size_t width = (size_t)heads * d, at = (size_t)h * d;
    KdaSpan span = {0, rows, 0, pos[0] == 0, false};
    if (slots) {
        if (!kda_span(pos, slots, rows, blockIdx.y, slot_len, span)) return;
        if (span.pad) {
            for (int r = span.first; r < span.end && j < d; ++r) out[(size_t)r * width + at + j] = 0.f;
            return;
        }
        states += span.base;
    }
    float* s = states + at * d + j;
    // entry i >= KDA_HELD of this thread's row, in its shared column
    const auto rest = [&](int i) -> float& { return kda_rest[(size_t)(i - KDA_HELD) * blockDim.x + j]; };
    // zeros at a sequence's start; a kept state where the span returns to one
    const bool fresh = span.fresh;
    const int n = span.end - span.first;
    const u32 slot = slots ? slots[span.first] : 0;
    const KdaKeep kk = kda_keep(track, kept, keeps, state_len, slot, pos[span.first], n, fresh);
    const float* from = kk.restore ? kk.restore + at * d + j : s;
    // a span the state cannot honour starts from NaN: its outputs, and every later span's
    // until the sequence starts again at position 0, are NaN, not another sequence's numbers
    const float nan = __int_as_float(0x7fc00000);
    const auto initial = [&](int i) -> float { return fresh ? 0.f : kk.lost ? nan : from[(size_t)i * d]; };
    float held[KDA_HELD];
#pragma unroll
    for (int i = 0; i < KDA_HELD; ++i) held[i] = j < d && i < d ? initial(i) : 0.f;
    if (j < d)
        for (int i = KDA_HELD; i < d; ++i) rest(i) = initial(i);
    for (int r = span.first; r < span.end; ++r) {
        const size_t row = (size_t)r * width + at;
        // every thread is done with the previous token's qs, ks and decay
        if (r > span.first) __syncthreads();
        if (j < d) {
            qs[j] = qkv[row + j];
            ks[j] = qkv[(size_t)rows * width + row + j];
            const float x = __fadd_rn(f[row + j], dt_bias[at + j]);
            float g;
            if (bounded) {
                g = __fmul_rn(kda_sigmoid(-__fmul_rn(x, a[h])), lb);
            } else {
                const float sp = x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
                g = __fmul_rn(sp, a[h]);
            }
            decay[j] = expf(g);
        }
        __syncthreads();
        if (j >= d) continue;
        const float beta = kda_sigmoid(b[(size_t)r * heads + h]);
        // delta = beta (v - (S decayed) . k); the decayed entry is recomputed below, same bits
        float sk = 0.f;
#pragma unroll
        for (int i = 0; i < KDA_HELD; ++i) {
            const float t = __fmul_rn(__fmul_rn(held[i], decay[i]), ks[i]);
            sk = i < d ? __fadd_rn(sk, t) : sk;
        }
        for (int i = KDA_HELD; i < d; ++i) sk = __fadd_rn(sk, __fmul_rn(__fmul_rn(rest(i), decay[i]), ks[i]));
        const float delta = __fmul_rn(__fsub_rn(qkv[2 * (size_t)rows * width + row + j], sk), beta);
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < KDA_HELD; ++i) {
            held[i] = __fadd_rn(__fmul_rn(held[i], decay[i]), __fmul_rn(ks[i], delta));
            o = i < d ? __fadd_rn(o, __fmul_rn(held[i], qs[i])) : o;
        }
        for (int i = KDA_HELD; i < d; ++i) {
            const float v = __fadd_rn(__fmul_rn(rest(i), decay[i]), __fmul_rn(ks[i], delta));
            rest(i) = v;
            o = __fadd_rn(o, __fmul_rn(v, qs[i]));
        }
        out[row + j] = __fmul_rn(o, scale);
        // the state after this row, where it is kept
        const int u = r - span.first;
        if (kk.into && u < n - 1) {
            float* to = kk.into + (size_t)u * state_len + at * d + j;
#pragma unroll
            for (int i = 0; i < KDA_HELD; ++i)
                if (i < d) to[(size_t)i * d] = held[i];
            for (int i = KDA_HELD; i < d; ++i) to[(size_t)i * d] = rest(i);
        }
    }
    if (j < d) {
#pragma unroll
        for (int i = 0; i < KDA_HELD; ++i)
            if (i < d) s[(size_t)i * d] = held[i];
        for (int i = KDA_HELD; i < d; ++i) s[(size_t)i * d] = rest(i);
    }
    // every token's output is in `out` (this block's writes, visible after the barrier)
    __syncthreads();
    const int lane = j & 31, warps = blockDim.x / 32;
    for (int r = span.first + j / 32; r < span.end; r += warps) {
        float* o = out + (size_t)r * width + at;
        float ns = lane == 0 ? kda_rms_scale(o, d, eps) : 0.f;
        ns = __shfl_sync(FULL_MASK, ns, 0);
        for (int i = lane; i < d; i += 32) {
            const float g = gate[(size_t)r * width + at + i];
            o[i] = __fmul_rn(__fmul_rn(__fmul_rn(o[i], ns), norm_w[i]), kda_sigmoid(g));
        }
    }
}
