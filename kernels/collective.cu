// memra kernels: the tensor-parallel collectives, one-shot and capturable. Every member of a
// group owns an exchange area in its own device memory: data[2][cap] floats, flags[2][blocks]
// and seq[blocks] (u64). A collective's block b publishes the member's slice b into
// data[parity], raises flags[parity][b] to the collective's sequence number, waits until every
// member's flag for slice b shows that number, then reads the members' slices (peer memory when
// they live on other devices). The sequence number lives on the device (seq[b] + 1, stored back
// at the end), so a replayed graph keeps counting. Two buffers by sequence parity: a member can
// only publish collective s + 2 after every member joined s + 1, which each does only once it
// finished reading s, so no member overwrites a slice a slower member still reads. A wait that
// outlasts `timeout_ns` traps (a launch failure the host reports) instead of hanging the GPU.
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

// Publishes `part[lo..hi)` of this member and waits for every member's slice of this block.
// `peers[m]` is member m's data area, `peers[COLL_MAX_MEMBERS + m]` its flags. Returns the
// sequence number; the parity selects the buffer.
__device__ __forceinline__ u64 exchange(const u64* peers, int members, int me, int cap,
                                        int blocks, const float* part, int lo, int hi,
                                        const u64* seq, u64 timeout_ns) {
    __shared__ u64 s_seq;
    const int b = blockIdx.x;
    if (threadIdx.x == 0) s_seq = seq[b] + 1;
    __syncthreads();
    const u64 s = s_seq;
    const int par = (int)(s & 1);
    float* mine = (float*)peers[me] + (size_t)par * cap;
    for (int i = lo + threadIdx.x; i < hi; i += COLL_THREADS) mine[i] = part[i];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) store_release((u64*)peers[COLL_MAX_MEMBERS + me] + par * blocks + b, s);
    if (threadIdx.x < members) {
        const u64* flag = (const u64*)peers[COLL_MAX_MEMBERS + threadIdx.x] + par * blocks + b;
        const u64 start = globaltimer();
        while (load_acquire(flag) != s) {
            if (globaltimer() - start > timeout_ns) __trap();
            __nanosleep(64);
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
    const u64 s = exchange(peers, members, me, cap, blocks, part, lo, hi, seq, timeout_ns);
    const size_t off = (size_t)(s & 1) * cap;
    for (int i = lo + threadIdx.x; i < hi; i += COLL_THREADS) {
        float stack[COLL_MAX_MEMBERS];
        int sp = 0;
        for (int k = 0; k < ntree; ++k) {
            const int op = tree[k];
            if (op >= 0) {
                stack[sp++] = __ldcv((const float*)peers[op] + off + i);
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
// member 0; the other members only publish (and wait, so that every collective is a barrier).
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    gather_f32(const u64* peers, int members, int me, int n, int cap, int blocks,
               const float* part, float* full, u64* seq, u64 timeout_ns) {
    wait_for_predecessor();
    const int lo = blockIdx.x * COLL_SLICE;
    const int hi = min(n, lo + COLL_SLICE);
    const u64 s = exchange(peers, members, me, cap, blocks, part, lo, hi, seq, timeout_ns);
    if (me == 0) {
        const size_t off = (size_t)(s & 1) * cap;
        for (int m = 0; m < members; ++m) {
            const float* src = (const float*)peers[m] + off;
            for (int i = lo + threadIdx.x; i < hi; i += COLL_THREADS)
                full[(size_t)m * n + i] = __ldcv(src + i);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) seq[blockIdx.x] = s;
}
