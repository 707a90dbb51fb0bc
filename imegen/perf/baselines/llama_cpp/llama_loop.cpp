// llama.cpp's Q4_0 matmul loop for the SpacemiT IME1 kernels, as the bench runs it.
//
// A restatement (not a copy) of tensor_traits<block_q4_0, 32, 16>::forward_mul_mat in
// ggml/src/ggml-cpu/spacemit/ime.cpp (llama-cpp-python 0.3.36 sdist), IME1 branch, no TCM buffer
// (the generic task split; the TCM branches only add copies into the TCM around the same calls):
//   phase 1 (before ggml_barrier): thread ith quantizes A to Q8 blocks [f32 scale][32 x int8] with
//           ime1::quantize_a_row_i8 (M == 1: a range of K blocks) or quantize_a_4row_i8 (4-row groups);
//   phase 2: the (M stride x N stride) tasks are split evenly over the threads in index order; a task
//           calls ime1::gemm_kernel_i8i4 per 16-column block (M > 1) or once for all its columns (M == 1),
//           4 rows at a time (M4 kernel) or 1 row (M1 kernel).
// The kernels and Q8 helpers come from the downloaded sources; this file is counted with them as
// llama.cpp's code (imegen/perf/baselines/llama_cpp/).
#include "llama_loop.h"

#include <algorithm>

#include "ime_kernels.h"
#include "rvv_kernels.h"

namespace sk = spacemit_kernels;

static constexpr int64_t kBlk = 32;     // INTER_SIZE: Q4_0 and Q8 block length
static constexpr int64_t kCols = 16;    // NB_COLS of the 16x32 repack
static constexpr int64_t kRowAlign = 4;

int64_t llama_q8_row_stride(int64_t K)
{
    return sk::div_round_up(K, kBlk) * (int64_t)sk::q8_blk_size(kBlk);
}

int64_t llama_q4_col_stride(int64_t K)
{
    return sk::div_round_up(K, kBlk) * (int64_t)(sizeof(uint16_t) + kBlk / 2);  // block_q4_0 per K block
}

void llama_quantize_a(int ith, int nth, int64_t M, int64_t K, const float *A, uint8_t *qa)
{
    const int64_t kb = sk::div_round_up(K, kBlk), row_stride = llama_q8_row_stride(K);
    if (M == 1) {
        const int64_t per = sk::div_round_up(kb, (int64_t)nth), lo = ith * per, hi = std::min(lo + per, kb);
        if (lo < hi)
            sk::ime1::quantize_a_row_i8(kBlk, A + lo * kBlk, (hi - lo) * kBlk, qa + lo * sk::q8_blk_size(kBlk));
        return;
    }
    const int64_t row_blks = sk::div_round_up(M, kRowAlign), per = sk::div_round_up(row_blks, (int64_t)nth);
    for (int64_t rb = ith * per; rb < std::min((ith + 1) * per, row_blks); rb++) {
        int64_t m = rb * kRowAlign, rows = std::min(M - m, kRowAlign);
        if (rows == kRowAlign) {
            sk::ime1::quantize_a_4row_i8(kBlk, A + m * K, K, qa + m * row_stride);
        } else {
            for (; rows; rows--, m++)
                sk::ime1::quantize_a_row_i8(kBlk, A + m * K, K, qa + m * row_stride);
        }
    }
}

LlamaSplit llama_split(int nth, int64_t M, int64_t N)
{
    LlamaSplit s;
    s.m_stride = N / M > 64 ? M : 16;
    const int64_t m_blocked = sk::div_round_up(M, s.m_stride);
    const int64_t max_n_stride = sk::div_round_up(N * m_blocked, (int64_t)nth);
    s.n_stride = max_n_stride < N ? std::min(N, sk::div_round_up(max_n_stride, kCols) * kCols) : N;
    s.tasks_m = sk::div_round_up(M, s.m_stride);
    s.tasks = s.tasks_m * sk::div_round_up(N, s.n_stride);
    return s;
}

void llama_task(int64_t M, int64_t N, int64_t K, int64_t m_start, int64_t m_count, int64_t n_start, int64_t n_count,
                const uint8_t *w, const uint8_t *qa, float *C)
{
    const int64_t kb = sk::div_round_up(K, kBlk), row_stride_a = llama_q8_row_stride(K);
    const int64_t col_stride_b = llama_q4_col_stride(K);
    const int64_t n_blk = m_count == 1 ? n_count : kCols;
    const uint8_t *b_col = w + n_start * col_stride_b;
    int64_t n_real = 0;
    for (int64_t ni = 0; ni < n_count; ni += n_real, b_col += n_real * col_stride_b) {
        n_real = std::min(n_count - ni, n_blk);
        const uint8_t *a_row = qa + m_start * row_stride_a;
        float *c_blk = C + m_start * N + n_start + ni;
        for (int64_t rows = m_count; rows > 0;) {
            const size_t done = sk::ime1::gemm_kernel_i8i4(kBlk, a_row, b_col, nullptr, c_blk, rows, n_real, kb, N);
            c_blk += done * N;
            a_row += done * row_stride_a;
            rows -= done;
        }
    }
    (void)M;
}

void llama_gemm(int ith, int nth, int64_t M, int64_t N, int64_t K, const uint8_t *w, const uint8_t *qa, float *C)
{
    const LlamaSplit s = llama_split(nth, M, N);
    const int64_t per = (s.tasks + nth - 1) / nth;
    for (int64_t t = ith * per; t < std::min((ith + 1) * per, s.tasks); t++) {
        const int64_t tid_n = t / s.tasks_m, tid_m = t % s.tasks_m;
        const int64_t m_start = tid_m * s.m_stride, n_start = tid_n * s.n_stride;
        llama_task(M, N, K, m_start, std::min(M - m_start, s.m_stride), n_start, std::min(N - n_start, s.n_stride),
                   w, qa, C);
    }
}
