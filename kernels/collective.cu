// memra kernels: the tensor-parallel collectives, one-shot and capturable. Every member of a
// group owns an exchange area in its own device memory with one inbox per member:
// data[2][members][cap] floats, flags[2][members][blocks] and seq[blocks] (u64). A
// collective's block b PUSHES the member's slice b into every recipient's inbox for it
// (remote stores over NVLink when the recipient lives on another device), raises the
// recipient's flag for (parity, sender, b) to the collective's sequence number, then waits on
// its OWN flags, in local memory, until every member's slice b has arrived, and reads the
// slices locally. One one-way trip over the link per collective, no remote read on the
// critical path. The sequence number lives on the device (seq[b] + 1, stored back at the
// end), so a replayed graph keeps counting. Two buffers by sequence parity: a member can only
// push collective s + 2 after every member's flag for s + 1 reached it, and each member raises
// s + 1 only once it has finished reading s, so nobody overwrites an inbox still being read.
// A wait that outlasts `timeout_ns` traps (a launch failure the host reports) instead of
// hanging the GPU.
#include "common.cuh"

#define COLL_THREADS 256
#define COLL_SLICE 1024      // values per block; must match COLLECTIVE_SLICE in collective.rs
#define COLL_MAX_MEMBERS 8   // must match MAX_MEMBERS in collective.rs
#define COLL_MAX_TREE 16

__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 load_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Pushes `part[lo..hi)` of this member into the inbox of every member `m` with
// `to_all || m == 0`, raises every member's flag (so each collective is a barrier for all),
// and waits until every member's flag for this block shows this collective in local memory.
// `peers[m]` is member m's data area, `peers[COLL_MAX_MEMBERS + m]` its flags. Returns the
// sequence number; the parity selects the inbox set.
__device__ __forceinline__ u64 exchange(const u64* peers, int members, int me, int cap,
                                        int blocks, const float* part, int lo, int hi,
                                        bool to_all, const u64* seq, u64 timeout_ns) {
    __shared__ u64 s_seq;
    const int b = blockIdx.x;
    if (threadIdx.x == 0) s_seq = seq[b] + 1;
    __syncthreads();
    const u64 s = s_seq;
    const int par = (int)(s & 1);
    const size_t inbox = ((size_t)par * members + me) * cap;
    for (int m = 0; m < (to_all ? members : 1); ++m) {
        float* dst = (float*)peers[m] + inbox;
        for (int i = lo + threadIdx.x; i < hi; i += COLL_THREADS) dst[i] = part[i];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x < members) {
        u64* theirs = (u64*)peers[COLL_MAX_MEMBERS + threadIdx.x];
        store_release(theirs + ((size_t)par * members + me) * blocks + b, s);
        const u64* mine = (const u64*)peers[COLL_MAX_MEMBERS + me] +
                          ((size_t)par * members + threadIdx.x) * blocks + b;
        const u64 start = globaltimer();
        while (load_acquire(mine) != s) {
            if (globaltimer() - start > timeout_ns) __trap();
        }
    }
    __syncthreads();
    return s;
}

// x += the members' partials combined in the group's tree. `tree` is the tree in postfix: a
// member index pushes that member's value, -1 adds the top two (left + right), so `(r0 r1)`
// is {0, 1, -1} and `((r0 r1) (r2 r3))` is {0, 1, -1, 2, 3, -1, -1}.
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    all_reduce_f32(const u64* peers, const int* tree, int ntree, int members, int me, int n,
                   int cap, int blocks, const float* part, float* x, u64* seq, u64 timeout_ns) {
    wait_for_predecessor();
    const int lo = blockIdx.x * COLL_SLICE;
    const int hi = min(n, lo + COLL_SLICE);
    const u64 s = exchange(peers, members, me, cap, blocks, part, lo, hi, true, seq, timeout_ns);
    const float* inbox = (const float*)peers[me] + (size_t)(s & 1) * members * cap;
    for (int i = lo + threadIdx.x; i < hi; i += COLL_THREADS) {
        float stack[COLL_MAX_MEMBERS];
        int sp = 0;
        for (int k = 0; k < ntree; ++k) {
            const int op = tree[k];
            if (op >= 0) {
                stack[sp++] = __ldcv(inbox + (size_t)op * cap + i);
            } else {
                --sp;
                stack[sp - 1] = stack[sp - 1] + stack[sp];
            }
        }
        x[i] = x[i] + stack[0];
    }
    __syncthreads();
    if (threadIdx.x == 0) seq[blockIdx.x] = s;
}

// The vocab-parallel logits of every member, concatenated in member order into `full` on
// member 0; the members push their slice to member 0 only (and wait, so that every collective
// is a barrier).
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    gather_f32(const u64* peers, int members, int me, int n, int cap, int blocks,
               const float* part, float* full, u64* seq, u64 timeout_ns) {
    wait_for_predecessor();
    const int lo = blockIdx.x * COLL_SLICE;
    const int hi = min(n, lo + COLL_SLICE);
    const u64 s = exchange(peers, members, me, cap, blocks, part, lo, hi, false, seq, timeout_ns);
    if (me == 0) {
        const float* inbox = (const float*)peers[me] + (size_t)(s & 1) * members * cap;
        for (int m = 0; m < members; ++m) {
            const float* src = inbox + (size_t)m * cap;
            for (int i = lo + threadIdx.x; i < hi; i += COLL_THREADS)
                full[(size_t)m * n + i] = __ldcv(src + i);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) seq[blockIdx.x] = s;
}
