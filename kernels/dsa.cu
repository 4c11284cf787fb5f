// memra kernels: the DSA indexer with k-pool compression (glm5-next), a decode token or every
// token row of a prefill step (grid row y for the row at pos[y]), with the semantics of the
// CPU backend's cpu::kernels::dsa (llama.cpp's build_kpool_select and its CPU top_k). The
// indexer's projections are ordinary products; these kernels do the rest, reading the
// positions from device memory so that a step is capturable:
//
// dsa_write_f32 layer-norms each row's indexer key and stores key and pool gate in the layer's
// indexer cache (per position: id key values, then id gate values); a one-row step pools in
// the same launch, a step of several rows in dsa_pool_f32 after it: when a row completes a
// pool of kp tokens, per channel, a softmax over the members of gate plus the position term
// ape weighs the members' keys.
// dsa_score_f32 scores every pool complete at a row's position, sum_h w_h relu(q_h . pool),
// the row padded to a multiple of 64 (at least 64) with -inf as llama.cpp pads it.
// dsa_select_f32 picks the best top_k / kp pools with ggml's choice among equal scores
// (libstdc++'s partial_sort heap over the padded row, then ggml's swap of the first two, then
// a stable descending sort; a parallel sort gives the same where no scores tie) and writes the cells the MLA softmax runs over: the chosen pools'
// members, best first, then (select_tail) the incomplete pool's tokens from the position
// down. cells[0] holds their count, cells[1..] the positions (the sparse form of mla.cu's latent attention).
//
// A row's cells depend on its own inputs and the cache rows at or before its position only, so
// a prefill step's rows select what their decode steps would from the same inputs. A batched
// step's rows (`slots` set) each sit in a sequence slot whose cache (rows, then pooled keys) is
// rows_len and pooled_len values past the previous slot's; a pad row (PAD_SLOT) writes and
// pools nothing and scores over slot 0's pools at position 0 (there are none).
//
// Every value is computed with the CPU loops' float operations in their order, with explicit
// round-to-nearest intrinsics so that no multiply-add is contracted into an FMA, and the f64
// sums taken sequentially by one thread as the CPU does. The bits match the CPU's except where
// expf (CUDA's, within 2 ulp) rounds differently from the host libm's in the pooling softmax.
#include "common.cuh"

// The widest indexer key (threads of dsa_write_f32's block) and the largest pool.
#define DSA_MAX_DIM 1024
#define DSA_MAX_POOL 64
// dsa_score_f32's loads ahead of the dependent adds, and dsa_select_f32's threads.
#define DSA_AHEAD 32
#define DSA_SELECT_THREADS 256

// Where row y's cache starts in a batched step (`slots` set): its slot's offsets into the rows
// and the pooled keys; false for a pad row, which has none.
struct DsaAt {
    size_t rows, pooled;
};
__device__ __forceinline__ bool dsa_slot(const u32* slots, int y, long long rows_len, long long pooled_len,
                                         DsaAt& at) {
    at.rows = at.pooled = 0;
    if (!slots) return true;
    const u32 slot = slots[y];
    if (slot == PAD_SLOT) return false;
    at.rows = (size_t)slot * (size_t)rows_len;
    at.pooled = (size_t)slot * (size_t)pooled_len;
    return true;
}

// Channel d of the pool that position p completes (nothing where p completes none): per
// channel, a softmax over the members of gate plus the position term ape weighs the members'
// keys, read from `rows` (every member written before).
__device__ __forceinline__ void dsa_pool_channel(const float* rows, float* pooled, const float* ape, u32 p, int id,
                                                 int kp, int d) {
    if ((p + 1) % kp != 0) return;
    const size_t first = (size_t)(p / kp) * kp;
    float probs[DSA_MAX_POOL];
    float mx = -__int_as_float(0x7f800000);
    for (int m = 0; m < kp; ++m) {
        probs[m] = __fadd_rn(rows[2 * id * (first + m) + id + d], ape[(size_t)m * id + d]);
        mx = fmaxf(mx, probs[m]);
    }
    double total = 0.0;
    for (int m = 0; m < kp; ++m) {
        probs[m] = expf(__fsub_rn(probs[m], mx));
        total += (double)probs[m];
    }
    const float inv = (float)(1.0 / total);
    float sum = 0.0f;
    for (int m = 0; m < kp; ++m) sum = __fadd_rn(sum, __fmul_rn(__fmul_rn(probs[m], inv), rows[2 * id * (first + m) + d]));
    pooled[(size_t)(p / kp) * id + d] = sum;
}

// Block y (a token row at pos[y]) of id threads (rounded up to a warp), thread d channel d.
// key, gate: each row's raw indexer key and pool gate (id each); norm_w, norm_b: the key norm
// (id each); ape: kp rows of id; rows: capacity rows of 2 * id; pooled: capacity / kp rows of
// id. With `pool` (a step of one row) the block also pools the pool its token completes; a
// step of several rows pools in dsa_pool_f32 after every row is written.
extern "C" __global__ void __launch_bounds__(DSA_MAX_DIM)
    dsa_write_f32(const float* key, const float* norm_w, const float* norm_b, float norm_eps, const float* gate,
                  const float* ape, float* rows, float* pooled, const u32* pos, int id, int kp, int capacity,
                  int pool, const u32* slots, long long rows_len, long long pooled_len) {
    overlap_with_neighbours();
    __shared__ float mean_s, scale_s;
    const u32 p = pos[blockIdx.y];
    if (p >= (u32)capacity) return;
    DsaAt at;
    if (!dsa_slot(slots, blockIdx.y, rows_len, pooled_len, at)) return;
    rows += at.rows;
    pooled += at.pooled;
    key += (size_t)blockIdx.y * id;
    gate += (size_t)blockIdx.y * id;
    const int d = threadIdx.x;
    if (d == 0) {
        double sum = 0.0;
        for (int i = 0; i < id; ++i) sum += (double)key[i];
        const float mean = (float)(sum / (double)id);
        double var = 0.0;
        for (int i = 0; i < id; ++i) {
            const float o = __fsub_rn(key[i], mean);
            var += (double)__fmul_rn(o, o);
        }
        mean_s = mean;
        scale_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(var / (double)id), norm_eps)));
    }
    __syncthreads();
    if (d >= id) return;
    const float normed = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(key[d], mean_s), scale_s), norm_w[d]), norm_b[d]);
    float* row = rows + (size_t)2 * id * p;
    row[d] = normed;
    row[id + d] = gate[d];
    // channel d of the pool's members was written by this thread
    if (pool) dsa_pool_channel(rows, pooled, ape, p, id, kp, d);
}

// Block y pools the pool that the token row at pos[y] completes (dsa_write_f32 wrote every
// row of the step before), thread d channel d.
extern "C" __global__ void __launch_bounds__(DSA_MAX_DIM)
    dsa_pool_f32(const float* ape, const float* rows, float* pooled, const u32* pos, int id, int kp, int capacity,
                 const u32* slots, long long rows_len, long long pooled_len) {
    overlap_with_neighbours();
    const u32 p = pos[blockIdx.y];
    const int d = threadIdx.x;
    if (p >= (u32)capacity || d >= id) return;
    DsaAt at;
    if (!dsa_slot(slots, blockIdx.y, rows_len, pooled_len, at)) return;
    rows += at.rows;
    pooled += at.pooled;
    dsa_pool_channel(rows, pooled, ape, p, id, kp, d);
}

// The padded length of the pool score row at position p.
__device__ __forceinline__ int dsa_padded(u32 p, int kp) {
    const int complete = (int)((p + 1) / kp);
    return max(1, (complete + 1 + 63) / 64) * 64;
}

// One warp per entry of the padded score row (a grid over the most pools there can be; grid
// row y for the token row at pos[y], its q, w and score row `scores_stride` apart). Lane l
// takes heads l, l + 32, ...: its q_h . pool is the CPU's sequential sum over d (the operands
// loaded DSA_AHEAD at a time before the dependent adds), and its term relu(qk) * (w_h * w_scale)
// goes through a shuffle to every lane, which all add the terms in head order as the CPU does.
// q: ih heads of id; w: ih raw head weights, times w_scale as the CPU scales them.
extern "C" __global__ void dsa_score_f32(const float* q, const float* w, float w_scale, const float* pooled,
                                         const u32* pos, int id, int ih, int kp, float* scores, int scores_stride,
                                         const u32* slots, long long pooled_len) {
    overlap_with_neighbours();
    const u32 p = pos[blockIdx.y];
    // a pad row (position 0) has no complete pool to read
    DsaAt at;
    if (dsa_slot(slots, blockIdx.y, 0, pooled_len, at)) pooled += at.pooled;
    q += (size_t)blockIdx.y * ih * id;
    w += (size_t)blockIdx.y * ih;
    scores += (size_t)blockIdx.y * scores_stride;
    const int j = (int)((blockIdx.x * blockDim.x + threadIdx.x) / WARP), lane = (int)(threadIdx.x % WARP);
    if (j >= dsa_padded(p, kp)) return;
    if (j >= (int)((p + 1) / kp)) {
        if (lane == 0) scores[j] = -__int_as_float(0x7f800000);
        return;
    }
    const float* pool = pooled + (size_t)j * id;
    float s = 0.0f;
    for (int h0 = 0; h0 < ih; h0 += WARP) {
        const int h = h0 + lane;
        float term = 0.0f;
        if (h < ih) {
            const float* qh = q + (size_t)h * id;
            float qk = 0.0f;
            int d = 0;
            for (; d + DSA_AHEAD <= id; d += DSA_AHEAD) {
                float qv[DSA_AHEAD], pv[DSA_AHEAD];
#pragma unroll
                for (int u = 0; u < DSA_AHEAD; ++u) {
                    qv[u] = qh[d + u];
                    pv[u] = pool[d + u];
                }
#pragma unroll
                for (int u = 0; u < DSA_AHEAD; ++u) qk = __fadd_rn(qk, __fmul_rn(qv[u], pv[u]));
            }
            for (; d < id; ++d) qk = __fadd_rn(qk, __fmul_rn(qh[d], pool[d]));
            term = __fmul_rn(fmaxf(qk, 0.0f), __fmul_rn(w[h], w_scale));
        }
        if (ih - h0 >= WARP) {
            // the shuffles do not wait on the sum: unrolled, they are issued ahead of the adds
#pragma unroll
            for (int l = 0; l < WARP; ++l) s = __fadd_rn(s, __shfl_sync(FULL_MASK, term, l));
        } else {
            for (int l = 0; l < ih - h0; ++l) s = __fadd_rn(s, __shfl_sync(FULL_MASK, term, l));
        }
    }
    if (lane == 0) scores[j] = s;
}

// A heap entry: a pool's score next to its index, so that a comparison reads the score with
// the entry instead of through it. Entries move whole, so score == the row's score of index.
struct DsaEntry {
    float score;
    int index;
};

// libstdc++'s __adjust_heap then __push_heap with `greater` over heap[0..len) by score, the
// hole at `hole` (the CPU's adjust_heap).
__device__ void dsa_adjust_heap(DsaEntry* heap, int len, int hole, DsaEntry value) {
    const int top = hole;
    int child = hole;
    while (len >= 1 && child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (heap[child].score > heap[child - 1].score) child -= 1;
        heap[hole] = heap[child];
        hole = child;
    }
    if (len % 2 == 0 && len >= 2 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        heap[hole] = heap[child - 1];
        hole = child - 1;
    }
    while (hole > top) {
        const int parent = (hole - 1) / 2;
        if (!(heap[parent].score > value.score)) break;
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}

// One block. The fast path sorts the whole padded row (score, index) descending by a bitonic
// network in shared memory (sort_len entries fit: sort_len is a power of two at least the
// row's padded length at the capacity, or 0 where that does not fit) and takes the first
// pools: exactly ggml's choice and order wherever no two of the pools it emits, nor the last
// of them and the first it leaves out, score alike (the heap then picks the same set, and its
// sorts order it descending), and no score is NaN. Otherwise (ties, or no room) thread 0 runs
// libstdc++'s heap as the CPU does, over the row in place: the entries are its heap (top_k / kp
// of them); an entry i >= k that the scan reaches is still its own index i (the CPU's scan
// moves only entry i and the heap [0, k)), and the entries past k are read no more, so the
// heap is only the k best: the comparisons are the CPU's on the same scores. The threads then
// write the cells out. Block y selects for the token row at pos[y]. scores: dsa_score_f32's
// rows, `scores_stride` apart; cells: a row of `cells_stride` ints per token row (count, then
// positions: at most top_k plus kp - 1 of them).
extern "C" __global__ void __launch_bounds__(DSA_SELECT_THREADS)
    dsa_select_f32(const float* scores, const u32* pos, int kp, int top_k, int select_tail, int sort_len,
                   int* cells, int scores_stride, int cells_stride) {
    overlap_with_neighbours();
    extern __shared__ DsaEntry dsa_entries[];
    __shared__ int tied;
    const u32 p = pos[blockIdx.y];
    scores += (size_t)blockIdx.y * scores_stride;
    cells += (size_t)blockIdx.y * cells_stride;
    const int padded = dsa_padded(p, kp), complete = (int)((p + 1) / kp);
    const int k = min(top_k / kp, padded), emitted = min(complete, k);
    int n2 = 1;
    while (n2 < padded) n2 <<= 1;
    bool sorted = n2 <= sort_len;
    if (sorted) {
        if (threadIdx.x == 0) tied = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n2; i += blockDim.x) {
            const float v = i < padded ? scores[i] : -__int_as_float(0x7f800000);
            if (v != v) tied = 1;
            dsa_entries[i] = {v, i};
        }
        __syncthreads();
        for (int size = 2; size <= n2; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = threadIdx.x; i < n2 / 2; i += blockDim.x) {
                    const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                    const DsaEntry a = dsa_entries[lo], b = dsa_entries[hi];
                    // descending where bit `size` of lo is clear, ascending where set: the last
                    // merge (size n2) leaves the row descending
                    if ((lo & size) == 0 ? a.score < b.score : a.score > b.score) {
                        dsa_entries[lo] = b;
                        dsa_entries[hi] = a;
                    }
                }
                __syncthreads();
            }
        for (int i = threadIdx.x; i < emitted; i += blockDim.x)
            if (dsa_entries[i].score == dsa_entries[i + 1].score) tied = 1;
        __syncthreads();
        sorted = !tied;
    }
    if (!sorted && threadIdx.x == 0) {
        DsaEntry* heap = dsa_entries;
        for (int i = 0; i < k; ++i) heap[i] = {scores[i], i};
        if (k >= 2)
            for (int parent = (k - 2) / 2;; --parent) {
                dsa_adjust_heap(heap, k, parent, heap[parent]);
                if (parent == 0) break;
            }
        if (k > 0)
            for (int i = k; i < padded; ++i)
                if (scores[i] > heap[0].score) dsa_adjust_heap(heap, k, 0, {scores[i], i});
        for (int last = k; last > 1;) {
            --last;
            const DsaEntry value = heap[last];
            heap[last] = heap[0];
            dsa_adjust_heap(heap, last, 0, value);
        }
        if (k > 1) {
            const DsaEntry t = heap[0];
            heap[0] = heap[1];
            heap[1] = t;
        }
        // ggml's argsort of the chosen pools, descending and stable
        for (int i = 1; i < k; ++i) {
            const DsaEntry x = heap[i];
            int j = i;
            for (; j > 0 && x.score > heap[j - 1].score; --j) heap[j] = heap[j - 1];
            heap[j] = x;
        }
    }
    __syncthreads();
    const int chosen = emitted * kp, tail = select_tail ? (int)((p + 1) % kp) : 0;
    for (int c = threadIdx.x; c < chosen; c += blockDim.x) cells[1 + c] = dsa_entries[c / kp].index * kp + c % kp;
    for (int t = threadIdx.x; t < tail; t += blockDim.x) cells[1 + chosen + t] = (int)p - t;
    if (threadIdx.x == 0) cells[0] = chosen + tail;
}
