"""The stock-ORT commands: `imegen ort-library`, `imegen ort-rewrite`, `imegen ort-model-check`, `imegen ort-accelerate`."""

from __future__ import annotations

import sys
from pathlib import Path

COMMANDS = ("ort-library", "ort-rewrite", "ort-model-check", "ort-accelerate")


class UsageError(Exception):
    """A user error (exit status 2)."""


def add_commands(sub) -> None:
    from .accelerate import add_parser as add_accelerate

    lib = sub.add_parser("ort-library", help="build the ORT custom-op library for SPEC's imegen-ABI kernels")
    lib.add_argument("spec")
    lib.add_argument("--flavour", choices=("hardware", "qemu"), default="hardware",
                     help="hardware (a K1) or qemu (IME emulated; for QEMU only)")
    lib.add_argument("-o", "--output", help="copy the library here")
    lib.add_argument("--ort-include", metavar="DIR",
                     help="build against this folder's onnxruntime_c_api.h (ORT 1.21 or newer; the library then "
                          "loads in that ORT version and newer), e.g. /usr/include/onnxruntime on the board "
                          "(default: a riscv64 machine's own, else Debian's ORT 1.21 header)")
    rw = sub.add_parser("ort-rewrite", help="move the MatMulNBits nodes SPEC serves into imegen's ORT domain")
    rw.add_argument("spec")
    rw.add_argument("model")
    rw.add_argument("-o", "--output", required=True)
    mc = sub.add_parser("ort-model-check", help="a model in stock riscv64 ORT vs ORT + imegen, under QEMU")
    mc.add_argument("spec")
    mc.add_argument("model")
    mc.add_argument("--ort", choices=("1.21", "1.23"), default="1.23", help="onnxruntime version (Debian riscv64)")
    mc.add_argument("--inputs", help=".npz of inputs (default: random, seeded)")
    mc.add_argument("--seed", type=int, default=0)
    mc.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="a symbolic input dimension")
    mc.add_argument("--threads", type=int, default=1, help="intra_op_num_threads")
    mc.add_argument("--seq", type=int, default=5,
                    help="decoders: tokens in the prefill step (M = seq on the gemm kernels; default 5)")
    mc.add_argument("--past", type=int, default=7,
                    help="decoders: KV-cache positions before the prefill (default 7); decode steps follow (M = 1)")
    mc.add_argument("--generate", type=int, default=0, metavar="N",
                    help="decoders: greedy-decode N tokens on both sides; the tokens must be identical")
    add_accelerate(sub)  # ort-accelerate


def _load_model(path: str):
    import onnx

    if not Path(path).is_file():
        raise UsageError(f"{path}: no such model file")
    try:
        return onnx.load(path)
    except Exception as e:  # onnx raises DecodeError and friends
        raise UsageError(f"{path}: not an ONNX model ({e})") from None


def run_command(args) -> int:
    if args.command == "ort-accelerate":
        from .accelerate import run_command as run_accelerate

        return run_accelerate(args)
    from ..ir import load_specs
    from .customop import CustomOpError, build_library
    from .riscv import OrtError

    try:
        specs = load_specs(args.spec)
        if args.command == "ort-library":
            lib = build_library(specs, args.spec, flavour=args.flavour, ort_include=args.ort_include)
            if args.output:
                Path(args.output).write_bytes(lib.read_bytes())
            print(args.output or lib)
            return 0
        if args.command == "ort-rewrite":
            import onnx

            from .rewrite import rewrite

            model = _load_model(args.model)
            decisions = rewrite(model, specs)
            onnx.save(model, args.output)
            for d in decisions:
                print(d)
            print(f"{sum(d.moved for d in decisions)} of {len(decisions)} MatMulNBits nodes moved; wrote {args.output}")
            return 0
        from .model_check import ModelCheckError, model_check

        inputs = None
        if args.inputs:
            import numpy as np

            try:
                inputs = dict(np.load(args.inputs))
            except (OSError, ValueError) as e:
                raise UsageError(f"--inputs {args.inputs}: not a readable .npz ({e})") from None
        dims = {}
        for d in args.dim:
            name, _, value = d.partition("=")
            if not value.isdigit():
                raise UsageError(f"--dim {d}: expected NAME=VALUE")
            dims[name] = int(value)
        try:
            check = model_check(specs, args.model, spec_file=args.spec, version=args.ort, inputs=inputs,
                                seed=args.seed, dims=dims, threads=args.threads, seq=args.seq, past=args.past,
                                generate=args.generate)
        except ModelCheckError as e:
            raise UsageError(str(e)) from None
        print(check.report())
        return 0 if check.ok else 1
    except (UsageError, CustomOpError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OrtError as e:
        print(f"error: onnxruntime: {e}", file=sys.stderr)
        return 1
