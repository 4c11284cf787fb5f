// memra kernels: synthetic weights drawn on the device (`--weights synthetic` on the cuda
// backend), byte for byte the blocks executor/src/synthetic/blocks.rs draws on the host, so
// a load copies nothing: quantized block b of a tensor is a function of (tensor key, b)
// alone, its f16 fields fixed per tensor (passed in), its integer codes the words
// wyrand(key, b * words + i). One thread draws one block and writes it in the device layout (GGUF's, or planar for
// the 32-value types: the matrix's quant bytes first, then its scale bytes).
#include "common.cuh"

// The block formats (SynthJob.format).
#define SYNTH_Q8_0 0
#define SYNTH_Q4_0 1
#define SYNTH_Q4_1 2
#define SYNTH_Q4_K 3
#define SYNTH_Q6_K 4

struct SynthJob {
    u8* dst;
    u64 key;
    // matrices drawn (a stack's experts, or 1), each `rows` x `col_blocks` blocks; matrix e
    // holds the tensor's rows first_row + e * rows .. and its column blocks first_col_block ..
    // of `row_blocks`, and starts `stride` bytes after matrix e - 1
    long long count, rows, col_blocks, row_blocks, first_row, first_col_block, stride;
    int format;
    int planar;
    // the f16 fields (d; q4_1's m, q4_k's dmin) and the codes' top and span
    u16 d, m;
    int top, span;
};

// wyrand's word `index` of stream `key` (blocks.rs `word`): its state after `index` steps,
// mixed by one 64 x 64 -> 128-bit product.
__device__ __forceinline__ u64 synth_word(u64 key, u64 index) {
    const u64 state = key + index * 0xa0761d6478bd642full;
    const u64 other = state ^ 0xe7037ed1a0b428dbull;
    return __umul64hi(state, other) ^ (state * other);
}

// One of the `span` codes up to `top`, from the `bits` low bits of `r` (blocks.rs `code`).
__device__ __forceinline__ u8 synth_code(int top, int span, u64 r, int bits) {
    const u64 offset = ((r & ((1ull << bits) - 1)) * (u64)span) >> bits;
    return (u8)(top + 1 - span + (int)offset);
}

__device__ __forceinline__ void put_u16(u8* p, u16 v) {
    p[0] = (u8)(v & 0xff);
    p[1] = (u8)(v >> 8);
}

__device__ __forceinline__ void put_u64(u8* p, u64 v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = (u8)(v >> (8 * i));
}

// Block `block` of the tensor into `out` (GGUF's layout, the format's bytes).
__device__ void synth_block(const SynthJob& j, u64 block, u8* out) {
    u64 counter;
    switch (j.format) {
        case SYNTH_Q8_0: {
            counter = block * 4;
            put_u16(out, j.d);
            // each byte to level b * levels / 256, then to the quant level - top (blocks.rs `q8_0`)
            const u64 lanes = 0x00ff00ff00ff00ffull, low7 = 0x7f7f7f7f7f7f7f7full, high = 0x8080808080808080ull;
            const u64 levels = 2 * (u64)j.top + 1;
            const u64 minus_top = 0x0101010101010101ull * (u64)(u8)(0 - j.top);
            for (int c = 0; c < 4; ++c) {
                const u64 word = synth_word(j.key, counter++);
                const u64 even = (((word & lanes) * levels) >> 8) & lanes;
                const u64 odd = (((word >> 8) & lanes) * levels) & ~lanes;
                const u64 level = even | odd;
                put_u64(out + 2 + 8 * c, ((level & low7) + (minus_top & low7)) ^ ((level ^ minus_top) & high));
            }
            break;
        }
        case SYNTH_Q4_0: {
            counter = block * 3;
            for (int c = 0; c < 2; ++c) put_u64(out + 2 + 8 * c, synth_word(j.key, counter++));
            put_u16(out, (u16)(j.d | (u16)((synth_word(j.key, counter) & 1) << 15)));
            break;
        }
        case SYNTH_Q4_1: {
            counter = block * 2;
            put_u16(out, j.d);
            put_u16(out + 2, j.m);
            for (int c = 0; c < 2; ++c) put_u64(out + 4 + 8 * c, synth_word(j.key, counter++));
            break;
        }
        case SYNTH_Q4_K: {
            counter = block * 17;
            put_u16(out, j.d);
            put_u16(out + 2, j.m);
            const u64 word = synth_word(j.key, counter++);
            u8 sc[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) sc[i] = synth_code(j.top, j.span, word >> (8 * i), 8);
            // the 12 packed bytes of eight 6-bit scales and minimums, the minimums equal
            u8* s = out + 4;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[i] = (u8)((sc[i] & 63) | ((sc[i + 4] >> 4) << 6));
                s[i + 4] = s[i];
                s[i + 8] = (u8)((sc[i + 4] & 15) | ((sc[i + 4] & 15) << 4));
            }
            for (int c = 0; c < 16; ++c) put_u64(out + 16 + 8 * c, synth_word(j.key, counter++));
            break;
        }
        default: {  // SYNTH_Q6_K
            counter = block * 26;
            for (int c = 0; c < 24; ++c) put_u64(out + 8 * c, synth_word(j.key, counter++));
            for (int c = 0; c < 2; ++c) {
                const u64 word = synth_word(j.key, counter++);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const u8 byte = (u8)(word >> (8 * i));
                    const u8 magnitude = synth_code(j.top, j.span, byte, 7);
                    const u8 negate = (u8)(0 - (byte >> 7));
                    out[192 + 8 * c + i] = (u8)((magnitude ^ negate) - negate);
                }
            }
            put_u16(out + 208, j.d);
            break;
        }
    }
}

// Bytes of a block of each format, and (planar formats) the scale bytes leading it.
__device__ __forceinline__ int synth_block_bytes(int format) {
    return format == SYNTH_Q8_0 ? 34 : format == SYNTH_Q4_0 ? 18 : format == SYNTH_Q4_1 ? 20 : format == SYNTH_Q4_K ? 144 : 210;
}

__device__ __forceinline__ int synth_scale_bytes(int format) { return format == SYNTH_Q4_1 ? 4 : 2; }

extern "C" __global__ void __launch_bounds__(256) synth_blocks(const SynthJob j) {
    const long long per_matrix = j.rows * j.col_blocks;
    const int bytes = synth_block_bytes(j.format), scale = synth_scale_bytes(j.format);
    u8 block[210];
    overlap_with_neighbours();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < j.count * per_matrix;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = i / per_matrix, local = i - e * per_matrix;
        const long long r = local / j.col_blocks, c = local - r * j.col_blocks;
        const u64 global = (u64)(j.first_row + e * j.rows + r) * (u64)j.row_blocks + (u64)(j.first_col_block + c);
        synth_block(j, global, block);
        u8* m = j.dst + e * j.stride;
        if (j.planar) {
            // quants at local * (bytes - scale), scales after all of the matrix's quants
            u8* q = m + local * (bytes - scale);
            u8* s = m + per_matrix * (bytes - scale) + local * scale;
            for (int k = 0; k < scale; ++k) s[k] = block[k];
            for (int k = scale; k < bytes; ++k) q[k - scale] = block[k];
        } else {
            u8* out = m + local * bytes;
            for (int k = 0; k < bytes; ++k) out[k] = block[k];
        }
    }
}
