// The bench's restatement of llama.cpp's SpacemiT Q4_0 matmul loop (llama_loop.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

struct LlamaSplit {
    int64_t m_stride, n_stride, tasks_m, tasks;
};

int64_t llama_q8_row_stride(int64_t K);  // bytes of one A row quantized to Q8 blocks
int64_t llama_q4_col_stride(int64_t K);  // bytes of one weight row (output column) in Q4_0
LlamaSplit llama_split(int nth, int64_t M, int64_t N);
void llama_quantize_a(int ith, int nth, int64_t M, int64_t K, const float *A, uint8_t *qa);
void llama_task(int64_t M, int64_t N, int64_t K, int64_t m_start, int64_t m_count, int64_t n_start, int64_t n_count,
                const uint8_t *w, const uint8_t *qa, float *C);
void llama_gemm(int ith, int nth, int64_t M, int64_t N, int64_t K, const uint8_t *w, const uint8_t *qa, float *C);
