"""A real riscv64 onnxruntime session under qemu-riscv64, driven from Python.

RiscvSession starts imegen/ort/ort_runner.c (built with clang-19 against the sysroot's
onnxruntime_c_api.h, cached) under `qemu-riscv64 -L SYSROOT -cpu rv64,v=true,Zfh=true,vlen=VLEN` (toolchain.qemu_cpu); the
runner loads the model once (registering a custom-op library if given) and then serves run
requests over a small binary protocol on its stdin/stdout (documented in the C file).
"""

from __future__ import annotations

import struct
import subprocess
import threading
from pathlib import Path

import numpy as np

from .. import cache, toolchain
from . import sysroot

RUNNER_SOURCE = Path(__file__).parent / "ort_runner.c"
# Debian's ORT 1.21 prints one "Schema error: Trying to register schema ... already registered" line at load,
# 1.23 one per ONNX schema (its libonnx registers them twice); QEMU notes the default V version.
HARMLESS_STDERR = ("Schema error: Trying to register schema with name ", "vector version is not specified")

# ONNX TensorProto element types <-> NumPy
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
          10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
ONNX_TYPE = {np.dtype(v): k for k, v in DTYPES.items()}


class OrtError(RuntimeError):
    """An error onnxruntime reported (its message), from session creation or a run."""


def runner(version: str = "1.23") -> Path:
    """The runner executable for onnxruntime `version`, built once per (source, header, compiler)."""
    root = sysroot.ensure(version)
    header = sysroot.include_dir(root) / "onnxruntime_c_api.h"
    inputs = cache.Inputs(files=(RUNNER_SOURCE, header), strings=(repr(toolchain.COMMON_FLAGS),),
                          tools=(toolchain.CLANG,))

    def fill(d: Path) -> None:
        toolchain.compile_c([RUNNER_SOURCE], d / "ort_runner", march="rv64gc", include_dirs=[sysroot.include_dir(root)],
                            extra_flags=["-std=gnu11", "-ldl"])

    return cache.entry("ort-runner", inputs.key(), fill) / "ort_runner"


class RiscvSession:
    """An onnxruntime InferenceSession running as a riscv64 process under QEMU."""

    def __init__(self, model: Path | str, version: str = "1.23", custom_ops: Path | None = None,
                 threads: int = 1, vlen: int = 256):
        root = sysroot.ensure(version)
        self.version = sysroot.full_version(root)
        cmd = [toolchain.QEMU, "-L", str(root), "-cpu", toolchain.qemu_cpu(vlen), str(runner(version)),
               str(sysroot.library(root)), str(Path(model).resolve()),
               str(Path(custom_ops).resolve()) if custom_ops else "-", str(threads)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()
        try:
            self._check_status()
            self.input_names = [self._string() for _ in range(self._u32())]
            self.output_names = [self._string() for _ in range(self._u32())]
        except BaseException:
            self.close()
            raise

    # -- protocol ---------------------------------------------------------------------------
    def _drain_stderr(self) -> None:
        for line in self._proc.stderr:
            text = line.decode(errors="replace").rstrip("\n")
            if text.strip() and not text.startswith(HARMLESS_STDERR):
                self._stderr.append(text)

    @property
    def stderr(self) -> str:
        """What the riscv64 process printed on stderr so far (ORT's harmless schema line removed)."""
        return "\n".join(self._stderr)

    def _read(self, n: int) -> bytes:
        data = self._proc.stdout.read(n) if n else b""
        if len(data) != n:
            code = self._proc.wait()
            self._reader.join(timeout=5)
            raise OrtError(f"onnxruntime process exited ({toolchain._describe_status(code)})"
                           + (f":\n{self.stderr}" if self.stderr else ""))
        return data

    def _u32(self) -> int:
        return struct.unpack("<I", self._read(4))[0]

    def _string(self) -> str:
        return self._read(self._u32()).decode()

    def _check_status(self) -> None:
        if self._read(1) != b"\0":
            raise OrtError(self._string())

    @staticmethod
    def _pack_string(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<I", len(b)) + b

    def _send(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._read(1)  # raises with the exit status and stderr

    # -- API ----------------------------------------------------------------------------------
    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None,
            share: dict[str, str] | None = None) -> dict[str, np.ndarray]:
        """One Run; the outputs by name (all of the model's, or `outputs`). `share` {output: input} runs it as
        onnxruntime-genai does, through an IoBinding with each such output bound to that input's own buffer
        (genai's past_present_share_buffer: present.N.key written into past_key_values.N.key's max-length buffer);
        the output then holds that buffer after the Run. A shared output must be among those run."""
        share = dict(share or {})
        missing = [i for i in share.values() if i not in feeds]
        if missing:
            raise ValueError(f"shared input {missing[0]!r} is not among the feeds")
        msg = [b"R", struct.pack("<I", len(feeds))]
        for name, value in feeds.items():
            a = np.ascontiguousarray(value)
            if a.dtype not in ONNX_TYPE:
                raise TypeError(f"feed {name!r}: dtype {a.dtype} not supported")
            msg += [self._pack_string(name), struct.pack("<II", ONNX_TYPE[a.dtype], a.ndim),
                    struct.pack(f"<{a.ndim}q", *a.shape), struct.pack("<Q", a.nbytes), a.tobytes()]
        wanted = list(outputs or [])
        msg += [struct.pack("<I", len(wanted))] + [self._pack_string(n) for n in wanted]
        msg += [struct.pack("<I", len(share))] + [self._pack_string(s) for pair in share.items() for s in pair]
        self._send(b"".join(msg))
        self._check_status()
        result = {}
        for _ in range(self._u32()):
            name = self._string()
            etype, rank = struct.unpack("<II", self._read(8))
            dims = struct.unpack(f"<{rank}q", self._read(8 * rank))
            nbytes = struct.unpack("<Q", self._read(8))[0]
            result[name] = np.frombuffer(self._read(nbytes), dtype=DTYPES[etype]).reshape(dims).copy()
        return result

    def stats(self) -> str:
        """The custom-op library's imegen_ort_stats() text ("" when none is loaded)."""
        self._send(b"S")
        self._check_status()
        return self._string()

    def peak_rss(self) -> int:
        """The riscv64 process's peak resident memory so far, in bytes (the QEMU process's VmHWM: the
        guest's memory plus QEMU's own, which is the same for every model)."""
        status = Path(f"/proc/{self._proc.pid}/status").read_text()
        return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(timeout=5)

    def __enter__(self) -> "RiscvSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
