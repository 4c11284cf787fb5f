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
// Where members share a device, collectives of more values than those blocks' slices
// (a prefill or batched step's rows) have the members read each other's parts in place
// instead (all_reduce_rows_f32, through a mailbox per block after the inboxes).
#include "common.cuh"

#define COLL_THREADS 256
#define COLL_SLICE 256       // values per block; must match SLICE in collective.rs
#define COLL_MAX_MEMBERS 8   // must match MAX_MEMBERS in collective.rs
#define COLL_MAX_TREE 16

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

__device__ __forceinline__ u64 load_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Waits until the word at p holds s (acquired), trapping past the timeout.
__device__ __forceinline__ void await_word(const u64* p, u64 s, u64 start, u64 timeout_ns) {
    while (load_acquire(p) != s)
        if (globaltimer() - start > timeout_ns) __trap();
}

#define COLL_ROWS_THREADS 512 // must match ROWS_THREADS in collective.rs
// Vectors of 4 values a thread of all_reduce_rows_f32 loads from each of MM members at once.
#define COLL_ROWS_BATCH(MM) (8 / (MM))

// The group's tree (postfix, as all_reduce_f32 takes it) over the members' values v.
template <int MM>
__device__ __forceinline__ float tree_value(const int* tree, int ntree, const float (&v)[MM]) {
    float stack[MM];
    int sp = 0;
#pragma unroll 1
    for (int k = 0; k < ntree; ++k) {
        const int op = tree[k];
        if (op >= 0) {
            float w = 0.f;
#pragma unroll
            for (int m = 0; m < MM; ++m)
                if (m == op) w = v[m];
            stack[sp++] = w;
        } else {
            --sp;
            stack[sp - 1] = stack[sp - 1] + stack[sp];
        }
    }
    return stack[0];
}

// x[i] += the tree of the members' values i, for this block's values: vectors of 4 where every
// pointer allows, else single values; each thread loads COLL_ROWS_BATCH(MM) of each member's
// and of x before it combines any. Peer values go through L2 (an earlier collective's lines of the
// same addresses may sit in this SM's L1).
template <int MM>
__device__ __forceinline__ void reduce_parts(const float* const* parts, const int* tree, int ntree, int members,
                                             int n, float* x) {
    bool vec = n % 4 == 0 && (size_t)x % 16 == 0;
    for (int m = 0; m < members; ++m) vec = vec && (size_t)parts[m] % 16 == 0;
    const int stride = gridDim.x * COLL_ROWS_THREADS;
    if (vec) {
        constexpr int BATCH = COLL_ROWS_BATCH(MM);
        const int n4 = n / 4;
        for (int i0 = blockIdx.x * COLL_ROWS_THREADS + threadIdx.x; i0 < n4; i0 += BATCH * stride) {
            float4 v[BATCH][MM], xv[BATCH];
#pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                const int i = i0 + b * stride;
                if (i >= n4) break;
                xv[b] = ((const float4*)x)[i];
#pragma unroll
                for (int m = 0; m < MM; ++m)
                    if (m < members) v[b][m] = __ldcg((const float4*)parts[m] + i);
            }
#pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                const int i = i0 + b * stride;
                if (i >= n4) break;
                float c[4][MM];
#pragma unroll
                for (int m = 0; m < MM; ++m)
                    c[0][m] = v[b][m].x, c[1][m] = v[b][m].y, c[2][m] = v[b][m].z, c[3][m] = v[b][m].w;
                float4 out = xv[b];
                out.x = out.x + tree_value<MM>(tree, ntree, c[0]);
                out.y = out.y + tree_value<MM>(tree, ntree, c[1]);
                out.z = out.z + tree_value<MM>(tree, ntree, c[2]);
                out.w = out.w + tree_value<MM>(tree, ntree, c[3]);
                ((float4*)x)[i] = out;
            }
        }
        return;
    }
    for (int i = blockIdx.x * COLL_ROWS_THREADS + threadIdx.x; i < n; i += stride) {
        float v[MM];
#pragma unroll
        for (int m = 0; m < MM; ++m)
            if (m < members) v[m] = __ldcg(parts[m] + i);
        x[i] = x[i] + tree_value<MM>(tree, ntree, v);
    }
}

// all_reduce_f32 for groups where members share a device, over vectors of more values than
// their few blocks' slices (a prefill or batched step's rows): no words and inboxes; the
// members read each other's parts in place (members on other devices of the group through
// peer access; the flags are system-scoped). Block b of each member publishes its part's address and the collective's sequence
// number in its mailbox (4 words per block past the inboxes: sequence, address, done), waits
// for block b of every member to publish, adds the tree of their values of its slices to x
// (the same additions on the same values as all_reduce_f32, so the same bits), then says it
// is done and waits for every member's block b to be done too: a member's part is rewritten
// only after its kernel ends, by then nobody reads it.
extern "C" __global__ void __launch_bounds__(COLL_ROWS_THREADS)
    all_reduce_rows_f32(const u64* peers, const int* tree, int ntree, int members, int me, int n,
                        int cap, const float* part, float* x, u64* seq, int early, u64 timeout_ns) {
    const u64 s = begin(seq, early);
    const size_t mail_at = (size_t)2 * members * cap + 4 * blockIdx.x;
    __shared__ const float* parts[COLL_MAX_MEMBERS];
    const u64 start = globaltimer();
    if (threadIdx.x == 0) {
        u64* mine = (u64*)peers[me] + mail_at;
        store_relaxed(mine + 1, (u64)part);
        store_release(mine, s);
    }
    if (threadIdx.x < members) {
        const u64* theirs = (const u64*)peers[threadIdx.x] + mail_at;
        await_word(theirs, s, start, timeout_ns);
        parts[threadIdx.x] = (const float*)load_relaxed(theirs + 1);
    }
    __syncthreads();
    if (members <= 2) reduce_parts<2>(parts, tree, ntree, members, n, x);
    else if (members <= 4) reduce_parts<4>(parts, tree, ntree, members, n, x);
    else reduce_parts<COLL_MAX_MEMBERS>(parts, tree, ntree, members, n, x);
    __syncthreads();
    if (threadIdx.x == 0) store_release((u64*)peers[me] + mail_at + 2, s);
    if (threadIdx.x < members) await_word((const u64*)peers[threadIdx.x] + mail_at + 2, s, start, timeout_ns);
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
