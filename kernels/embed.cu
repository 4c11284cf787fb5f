// memra kernels: embedding lookup: grid row y dequantizes row `token[y]` of a table (in the
// device layout of DeviceWeight::upload) into row y of `out` as f32, bit-exact with
// memra_gguf::dequantize; a decode step has one row, a prefill step one per prompt token. The
// tokens are read from device memory (written by the sampler or a boundary copy), so a
// captured graph embeds whatever token the previous step chose. A token outside the table
// writes NaNs rather than reading out of bounds.
#include "common.cuh"

#define EMBED(name, deq, BLOCK, QS, S)                                                         \
    extern "C" __global__ void name(const u8* table, const u32* token, float* out, int cols,   \
                                    int rows) {                                                \
        overlap_with_neighbours();                                                             \
        const int i = blockIdx.x * blockDim.x + threadIdx.x;                                   \
        if (i >= cols) return;                                                                 \
        const u32 t = token[blockIdx.y];                                                       \
        out[(size_t)blockIdx.y * cols + i] = t < (u32)rows ? deq(weight_row<BLOCK, QS, S>(table, rows, cols, (int)t), i)   \
                               : __int_as_float(0x7fc00000);                                   \
    }

EMBED(embed_f32, deq_f32, 1, 4, 0)
EMBED(embed_f16, deq_f16, 1, 2, 0)
EMBED(embed_bf16, deq_bf16, 1, 2, 0)
EMBED(embed_q8_0, deq_q8_0, 32, 32, 2)
EMBED(embed_q4_0, deq_q4_0, 32, 16, 2)
EMBED(embed_q4_1, deq_q4_1, 32, 16, 4)
EMBED(embed_q4_k, deq_q4_k, 256, 144, 0)
EMBED(embed_q6_k, deq_q6_k, 256, 210, 0)
