// Stand-in for onnxruntime/core/common/common.h in imegen's build of MLAS alone (no onnxruntime_common):
// MLAS's q4 quantizer (q4common.h) uses only these two macros from it.
#pragma once
#include <sstream>
#include <stdexcept>

template <typename... Args>
[[noreturn]] inline void imegen_ort_shim_throw(const Args&... args)
{
    std::ostringstream msg;
    (msg << ... << args);
    throw std::runtime_error(msg.str());
}
#define ORT_THROW(...) imegen_ort_shim_throw(__VA_ARGS__)
#define ORT_ENFORCE(condition, ...) \
    do {                            \
        if (!(condition)) imegen_ort_shim_throw("ORT_ENFORCE(" #condition ") failed: ", __VA_ARGS__); \
    } while (0)
