/* The decoder-layer operators of imegen's custom-op library (decoder_ops.c): RVV fp32 kernels for the nodes around
 * MatMulNBits in an LLM decoder, in the forms onnxruntime-genai exports them. */
#ifndef IMEGEN_DECODER_OPS_H
#define IMEGEN_DECODER_OPS_H

#include <stddef.h>

#include "onnxruntime_c_api.h"

/* Fill the operator tables (once per process, before any registration). */
void imegen_decoder_ops_init(const OrtApi *api);
/* Add every decoder operator to `domain`. */
OrtStatus *imegen_decoder_ops_add(OrtCustomOpDomain *domain);
/* "decoder NAME nodes N calls N" lines for imegen_ort_stats(): the operators some live node uses. */
/* y = y * g * sigmoid(g) on a rows x cols block (a gated MLP's SiLU, applied to the up projection's output as the
 * MatMulNBits kernel finishes each block of it: the same formula and exp as SiluMul's). */
void imegen_silu_gate(float *y, size_t ldy, const float *g, size_t ldg, size_t rows, size_t cols);
typedef void (*imegen_append_fn)(size_t *at, const char *fmt, ...);
void imegen_decoder_ops_stats(imegen_append_fn append, size_t *at);

#endif
