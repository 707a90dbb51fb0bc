/* The ONNX Runtime C API glue imegen's two custom-op sources share (customop_lib.c: MatMulNBits; decoder_ops.c: the
 * decoder operators): one-line errors and TRY, input data, attributes with defaults, optional inputs, and the
 * OrtCustomOp callbacks whose answer is the same for every operator. Each source that includes it has its own `ort`,
 * the OrtApi ORT handed it at registration. */
#ifndef IMEGEN_ORT_GLUE_H
#define IMEGEN_ORT_GLUE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "onnxruntime_c_api.h"

static const OrtApi *ort;

#define TRY(call) do { OrtStatus *st_ = (call); if (st_) return st_; } while (0)

static inline OrtStatus *fail(OrtErrorCode code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline OrtStatus *fail(OrtErrorCode code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ort->CreateStatus(code, msg);
}

/* Read-only data of an input (the C API has only the mutable getter). */
static inline OrtStatus *tensor_data(const OrtValue *v, const void **out) {
    void *p;
    OrtStatus *st = ort->GetTensorMutableData((OrtValue *)v, &p);
    *out = p;
    return st;
}

/* A tensor's shape, rank at most IMEGEN_MAX_RANK (a refusal naming the node and the tensor beyond it). */
#define IMEGEN_MAX_RANK 8
struct shape {
    size_t rank, count;
    int64_t dims[IMEGEN_MAX_RANK];
};

static inline OrtStatus *shape_of(const OrtValue *v, const char *node, const char *what, struct shape *s) {
    OrtTensorTypeAndShapeInfo *info;
    TRY(ort->GetTensorTypeAndShape(v, &info));
    OrtStatus *st = ort->GetDimensionsCount(info, &s->rank);
    if (!st && s->rank > IMEGEN_MAX_RANK)
        st = fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': %s has rank %zu", node, what, s->rank);
    if (!st) st = ort->GetDimensions(info, s->dims, s->rank);
    if (!st) st = ort->GetTensorShapeElementCount(info, &s->count);
    ort->ReleaseTensorTypeAndShapeInfo(info);
    return st;
}

static inline int64_t attr_int(const OrtKernelInfo *info, const char *name, int64_t fallback) {
    int64_t v;
    OrtStatus *st = ort->KernelInfoGetAttribute_int64(info, name, &v);
    if (st) ort->ReleaseStatus(st), v = fallback;
    return v;
}

static inline float attr_float(const OrtKernelInfo *info, const char *name, float fallback) {
    float v;
    OrtStatus *st = ort->KernelInfoGetAttribute_float(info, name, &v);
    if (st) ort->ReleaseStatus(st), v = fallback;
    return v;
}

/* 1 when optional input i is wired (ORT gives absent optional inputs the name ""). */
static inline int input_wired(const OrtKernelInfo *info, size_t i) {
    size_t count = 0;
    char name[512];
    size_t size = sizeof name;
    OrtStatus *st = ort->KernelInfo_GetInputCount(info, &count);
    if (st) return ort->ReleaseStatus(st), 0;
    if (i >= count) return 0;
    st = ort->KernelInfo_GetInputName(info, i, name, &size);
    if (st) return ort->ReleaseStatus(st), 1; /* a name too long for the buffer is still a name */
    return name[0] != 0;
}

/* OrtCustomOp callbacks every imegen operator answers alike: ORT's CPU provider, inputs in CPU memory, variadic
 * arities of 1 (none is variadic), opset versions 1 and later. */
static inline const char *ORT_API_CALL op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static inline OrtMemType ORT_API_CALL input_mem(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return OrtMemTypeDefault;
}
static inline int ORT_API_CALL one(const OrtCustomOp *op) { (void)op; return 1; }
static inline int ORT_API_CALL start_version(const OrtCustomOp *op) { (void)op; return 1; }
static inline int ORT_API_CALL end_version(const OrtCustomOp *op) { (void)op; return 2147483647; }

#endif
