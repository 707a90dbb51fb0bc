"""imegen's C ABI (NAME_matmul and friends, templates/kernel.h.j2): the status codes every entry point
returns. The header defines them from this table, and the checks read results with the same names."""

from __future__ import annotations

STATUS = {
    "IMEGEN_OK": 0,
    "IMEGEN_ERR_VLEN": 1,  # the running hart's VLEN is not one this kernel accepts
    "IMEGEN_ERR_ARG": 2,  # a bad argument (see kernel.h.j2)
    "IMEGEN_ERR_RANGE": 3,  # a_scale_type = fp16: an A block has no fp16 scale, or holds a NaN
}
IMEGEN_OK = STATUS["IMEGEN_OK"]
IMEGEN_ERR_VLEN = STATUS["IMEGEN_ERR_VLEN"]
