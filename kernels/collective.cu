// memra kernels: the tensor-parallel collectives, one-shot and capturable. Every member of a
// group owns an inbox area in its own device memory: one inbox per sending member, two sets by
// the parity of the collective's sequence number, u64 words data[2][members][cap], and the
// sequence words seq[blocks]. A collective PUSHES each value of the member's vector into every
// member's inbox for it (remote stores over NVLink when the recipient lives on another
// device) as one 8-byte word: the value's bits in the low half, the collective's sequence
// number in the high half. A recipient polls each word of its OWN inboxes, in local memory,
// until the high half shows this collective: the data carries its own flag, so there is no
// fence and no flag store, one one-way trip over the link, no remote read. An aligned 8-byte
// store is seen whole or not at all, so a word that shows the sequence number holds its value.
// The sequence number lives on the device (seq[b] + 1, stored back at the end), so a replayed
// graph keeps counting. Two inbox sets by parity: a member pushes collective s + 2 only after
// its collective s + 1 saw every member's s + 1 words, and each member pushes s + 1 only after
// its collective s finished reading (stream order; every kernel waits for its predecessor
// before it ends, so completion is ordered), so nobody overwrites an inbox still being read.
// A wait that outlasts `timeout_ns` traps (a launch failure the host reports) instead of
// hanging the GPU. Block b takes slices b, b + grid, ...: members on their own devices launch
// a block per slice; members sharing a device launch few blocks (collective.rs), because
// their spinning blocks hold registers that the peers' kernels they wait for need, and
// enough of them starve those kernels of every SM (a deadlock the timeout turns into a trap).
#include "common.cuh"

#define COLL_THREADS 256
#define COLL_SLICE 256       // values per block; must match SLICE in collective.rs
#define COLL_MAX_MEMBERS 8   // must match MAX_MEMBERS in collective.rs
#define COLL_MAX_TREE 16
// Words a thread of all_reduce_rows_f32 pushes, or polls, at once (held in registers).
#define COLL_WORDS 32

__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 load_relaxed(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_relaxed(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The collective's sequence number for this block, and the start of its kernel: with `early`
// (every member on its own device), the next kernel on the stream may launch now and wait
// for this one; members sharing a device only wait, since a dependent launched early could
// hold the SMs that a co-resident member's grids need.
__device__ __forceinline__ u64 begin(const u64* seq, int early) {
#if __CUDA_ARCH__ >= 900
    if (early) asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    wait_for_predecessor();
    return seq[blockIdx.x] + 1;
}

// Pushes value i of `part` (i = this thread's value of this block) into every member's inbox
// for this member, tagged with `s`.
__device__ __forceinline__ void push(const u64* peers, int members, int me, int cap,
                                     const float* part, int i, u64 s) {
    const u64 word = (s << 32) | (u64)__float_as_uint(part[i]);
    const size_t at = ((size_t)(s & 1) * members + me) * cap + i;
    for (int m = 0; m < members; ++m) store_relaxed((u64*)peers[m] + at, word);
}

// Member m's value i of collective `s`, from this member's inbox, once it has arrived.
__device__ __forceinline__ float arrived(const u64* inbox, int members, int m, int cap, int i,
                                         u64 s, u64 start, u64 timeout_ns) {
    const u64* p = inbox + ((size_t)(s & 1) * members + m) * cap + i;
    const u32 tag = (u32)s;
    u64 w = load_relaxed(p);
    while ((u32)(w >> 32) != tag) {
        if (globaltimer() - start > timeout_ns) __trap();
        w = load_relaxed(p);
    }
    return __uint_as_float((u32)w);
}

__device__ __forceinline__ void end(u64* seq, u64 s) {
    __syncthreads();
    if (threadIdx.x == 0) seq[blockIdx.x] = s;
}

// x += the members' partials combined in the group's tree. `tree` is the tree in postfix: a
// member index pushes that member's value, -1 adds the top two (left + right), so `(r0 r1)`
// is {0, 1, -1} and `((r0 r1) (r2 r3))` is {0, 1, -1, 2, 3, -1, -1}.
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    all_reduce_f32(const u64* peers, const int* tree, int ntree, int members, int me, int n,
                   int cap, const float* part, float* x, u64* seq, int early, u64 timeout_ns) {
    const u64 s = begin(seq, early);
    const int stride = gridDim.x * COLL_SLICE;
    for (int i = blockIdx.x * COLL_SLICE + threadIdx.x; i < n; i += stride) push(peers, members, me, cap, part, i, s);
    const u64* inbox = (const u64*)peers[me];
    const u64 start = globaltimer();
    for (int i = blockIdx.x * COLL_SLICE + threadIdx.x; i < n; i += stride) {
        float stack[COLL_MAX_MEMBERS];
        int sp = 0;
        for (int k = 0; k < ntree; ++k) {
            const int op = tree[k];
            if (op >= 0) {
                stack[sp++] = arrived(inbox, members, op, cap, i, s, start, timeout_ns);
            } else {
                --sp;
                stack[sp - 1] = stack[sp - 1] + stack[sp];
            }
        }
        x[i] = x[i] + stack[0];
    }
    end(seq, s);
}

// all_reduce_rows_f32's push: this thread's values of `part` (its value of this block's
// slice, then one every grid's width of slices) into every member's inbox for this member,
// tagged with `s`. The
// values of a batch are all loaded before the first store (the stores are ordered), so with
// few blocks their loads' latencies overlap.
__device__ __forceinline__ void push_rows(const u64* peers, int members, int me, int cap, const float* part,
                                     int n, u64 s) {
    const int stride = gridDim.x * COLL_SLICE;
    u64* inbox[COLL_MAX_MEMBERS];
#pragma unroll
    for (int m = 0; m < COLL_MAX_MEMBERS; ++m)
        if (m < members) inbox[m] = (u64*)peers[m] + ((size_t)(s & 1) * members + me) * cap;
    for (int i0 = blockIdx.x * COLL_SLICE + threadIdx.x; i0 < n; i0 += COLL_WORDS * stride) {
        u32 v[COLL_WORDS];
#pragma unroll
        for (int b = 0; b < COLL_WORDS; ++b)
            if (i0 + b * stride < n) v[b] = __float_as_uint(part[i0 + b * stride]);
#pragma unroll
        for (int b = 0; b < COLL_WORDS; ++b)
            if (i0 + b * stride < n)
#pragma unroll
                for (int m = 0; m < COLL_MAX_MEMBERS; ++m)
                    if (m < members) store_relaxed(inbox[m] + i0 + b * stride, (s << 32) | (u64)v[b]);
    }
}

// The words of a batch: values i0, i0 + stride, ... (BATCH of them; those at or past n are
// not read) from members 0 .. MM - 1 (those below `members`) of collective `s`, from this
// member's inbox, once they have arrived. Every load of the batch is issued before any is
// checked, so their latencies overlap: with few blocks (members sharing a device), a thread
// polls many values and one load at a time would leave the collective latency-bound.
template <int BATCH, int MM>
__device__ __forceinline__ void arrived_batch(const u64* inbox, int members, int cap, int i0, int stride, int n,
                                        u64 s, u64 start, u64 timeout_ns, u64 (&w)[BATCH][MM]) {
    const u64* set = inbox + (size_t)(s & 1) * members * cap;
    const u32 tag = (u32)s;
#pragma unroll
    for (int b = 0; b < BATCH; ++b)
#pragma unroll
        for (int m = 0; m < MM; ++m)
            if (m < members && i0 + b * stride < n) w[b][m] = load_relaxed(set + (size_t)m * cap + i0 + b * stride);
#pragma unroll
    for (int b = 0; b < BATCH; ++b)
#pragma unroll
        for (int m = 0; m < MM; ++m)
            if (m < members && i0 + b * stride < n)
                while ((u32)(w[b][m] >> 32) != tag) {
                    if (globaltimer() - start > timeout_ns) __trap();
                    w[b][m] = load_relaxed(set + (size_t)m * cap + i0 + b * stride);
                }
}

// The value in word w[m] for the member index m (a tree operand).
template <int MM>
__device__ __forceinline__ float member_value(const u64 (&w)[MM], int m) {
    u32 v = 0;
#pragma unroll
    for (int j = 0; j < MM; ++j)
        if (j == m) v = (u32)w[j];
    return __uint_as_float(v);
}

// all_reduce_rows_f32's polling and combining for groups of at most MM members.
template <int MM>
__device__ __forceinline__ void reduce_arrived(const u64* inbox, const int* tree, int ntree, int members,
                                               int n, int cap, float* x, u64 s, u64 timeout_ns) {
    constexpr int BATCH = COLL_WORDS / MM;
    const int stride = gridDim.x * COLL_SLICE;
    const u64 start = globaltimer();
    for (int i0 = blockIdx.x * COLL_SLICE + threadIdx.x; i0 < n; i0 += BATCH * stride) {
        u64 w[BATCH][MM];
        arrived_batch<BATCH, MM>(inbox, members, cap, i0, stride, n, s, start, timeout_ns, w);
        float xv[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b)
            if (i0 + b * stride < n) xv[b] = x[i0 + b * stride];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            if (i0 + b * stride >= n) break;
            float stack[COLL_MAX_MEMBERS];
            int sp = 0;
            for (int k = 0; k < ntree; ++k) {
                const int op = tree[k];
                if (op >= 0) {
                    stack[sp++] = member_value<MM>(w[b], op);
                } else {
                    --sp;
                    stack[sp - 1] = stack[sp - 1] + stack[sp];
                }
            }
            x[i0 + b * stride] = xv[b] + stack[0];
        }
    }
}

// all_reduce_f32 for vectors of many values a thread (a prefill step's rows on members that
// share a device, whose few blocks each serve many slices): the same words, inboxes and tree,
// so the same bits, with a thread's loads batched (push_rows, arrived_batch).
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    all_reduce_rows_f32(const u64* peers, const int* tree, int ntree, int members, int me, int n,
                        int cap, const float* part, float* x, u64* seq, int early, u64 timeout_ns) {
    const u64 s = begin(seq, early);
    push_rows(peers, members, me, cap, part, n, s);
    const u64* inbox = (const u64*)peers[me];
    if (members <= 2) reduce_arrived<2>(inbox, tree, ntree, members, n, cap, x, s, timeout_ns);
    else if (members <= 4) reduce_arrived<4>(inbox, tree, ntree, members, n, cap, x, s, timeout_ns);
    else reduce_arrived<COLL_MAX_MEMBERS>(inbox, tree, ntree, members, n, cap, x, s, timeout_ns);
    end(seq, s);
}

// The vocab-parallel logits of every member, concatenated in member order into `full` on
// member 0. Every member pushes to every member and waits for all, so that each collective is
// a barrier and the parity rule above holds for the gather too. Its parameters are
// all_reduce_f32's (the tree is not used), so one launch helper serves both.
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    gather_f32(const u64* peers, const int* tree, int ntree, int members, int me, int n,
               int cap, const float* part, float* full, u64* seq, int early, u64 timeout_ns) {
    const u64 s = begin(seq, early);
    const int stride = gridDim.x * COLL_SLICE;
    for (int i = blockIdx.x * COLL_SLICE + threadIdx.x; i < n; i += stride) push(peers, members, me, cap, part, i, s);
    const u64* inbox = (const u64*)peers[me];
    const u64 start = globaltimer();
    for (int i = blockIdx.x * COLL_SLICE + threadIdx.x; i < n; i += stride)
        for (int m = 0; m < members; ++m) {
            const float v = arrived(inbox, members, m, cap, i, s, start, timeout_ns);
            if (me == 0) full[(size_t)m * n + i] = v;
        }
    end(seq, s);
}

#define COMBINE_THREADS 256  // must match COMBINE_THREADS in nccl.rs

// x += the members' partials, gathered member after member into `gathered` ([members][n], by
// NCCL), combined in the group's tree (postfix, as for all_reduce_f32): the same operations on
// the same values as all_reduce_f32, so the same bits.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    combine_f32(const float* gathered, const int* tree, int ntree, int n, float* x) {
    overlap_with_neighbours();
    const int i = blockIdx.x * COMBINE_THREADS + threadIdx.x;
    if (i >= n) return;
    float stack[COLL_MAX_MEMBERS];
    int sp = 0;
    for (int k = 0; k < ntree; ++k) {
        const int op = tree[k];
        if (op >= 0) {
            stack[sp++] = gathered[(size_t)op * n + i];
        } else {
            --sp;
            stack[sp - 1] = stack[sp - 1] + stack[sp];
        }
    }
    x[i] = x[i] + stack[0];
}
