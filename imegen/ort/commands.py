"""The stock-ORT commands: `imegen ort-accelerate`, `imegen ort-model-check`, `imegen ort-library`, `imegen ort-rewrite`."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import cli_types
from .sysroot import RELEASES as ORT_RELEASES  # Debian's riscv64 onnxruntime packages ort-model-check runs in

COMMANDS = ("ort-accelerate", "ort-model-check", "ort-library", "ort-rewrite")


class UsageError(Exception):
    """A user error (exit status 2)."""


def add_commands(sub) -> None:
    """ort-accelerate first (the one a model's owner needs), then the check and the two steps it is made of."""
    from .accelerate import add_matmul_only
    from .accelerate import add_parser as add_accelerate

    add_accelerate(sub)
    mc = cli_types.add_command(sub, "ort-model-check", "a model in stock riscv64 ORT vs ORT + imegen, under QEMU")
    mc.add_argument("spec", help="the kernel spec (.imegen) whose kernels the model is rewritten to")
    mc.add_argument("model", help="the ONNX model (int4/int8 MatMulNBits nodes)")
    version = mc.add_argument("--ort-version", choices=sorted(ORT_RELEASES), default="1.23",
                              help="the onnxruntime both sides run in: Debian's riscv64 package (default 1.23)")
    cli_types.add_renamed(mc, "--ort", version)
    mc.add_argument("--inputs", metavar="NPZ", help=".npz of inputs (default: random, seeded)")
    mc.add_argument("--seed", type=cli_types.seed, default=0, help="seed of the random inputs (default 0)")
    mc.add_argument("--dim", type=cli_types.name_value, action="append", default=[], metavar="NAME=VALUE",
                    help="a symbolic input dimension's size (repeatable; default 1)")
    mc.add_argument("--threads", type=cli_types.at_least(1), default=1,
                    help="ORT's intra_op_num_threads, at least 1 (default 1)")
    mc.add_argument("--seq", type=cli_types.at_least(1), default=5,
                    help="decoders: tokens in the prefill step (M = seq on the gemm kernels; default 5)")
    mc.add_argument("--past", type=cli_types.at_least(0), default=7,
                    help="decoders: KV-cache positions before the prefill (default 7); decode steps follow (M = 1)")
    mc.add_argument("--generate", type=cli_types.at_least(0), default=0, metavar="N",
                    help="decoders: greedy-decode N tokens on both sides; the tokens must be identical")
    mc.add_argument("--compute", choices=("fp32", "int8"), default=None,
                    help="as ort-accelerate --compute: int8 moves accuracy_level 0-3 nodes as level 4, fp32 runs "
                         "level-4 nodes as level 0 (default: each node's own level)")
    add_matmul_only(mc)
    lib = cli_types.add_command(sub, "ort-library", "build the ORT custom-op library for SPEC's imegen-ABI kernels")
    lib.add_argument("spec", help="the kernel spec (.imegen)")
    lib.add_argument("--flavour", choices=("hardware", "qemu"), default="hardware",
                     help="hardware (a K1) or qemu (IME emulated; for QEMU only)")
    lib.add_argument("-o", "--output", metavar="FILE", help="copy the library here (default: print its cached path)")
    lib.add_argument("--ort-include", metavar="DIR",
                     help="build against this folder's onnxruntime_c_api.h (ORT 1.21 or newer; the library then "
                          "loads in that ORT version and newer), e.g. /usr/include/onnxruntime on the board "
                          "(default: a riscv64 machine's own, else Debian's ORT 1.21 header)")
    rw = cli_types.add_command(sub, "ort-rewrite", "move the MatMulNBits nodes SPEC serves into imegen's ORT domain")
    rw.add_argument("spec", help="the kernel spec (.imegen) whose kernels serve the nodes")
    rw.add_argument("model", help="the ONNX model to rewrite")
    rw.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the rewritten model")
    add_matmul_only(rw)


def _load_model(path: str):
    from .external_data import ModelFileError, load_graph

    try:
        return load_graph(path)
    except ModelFileError as e:
        raise UsageError(str(e)) from None


def _save_rewritten(model, source: Path, output: Path) -> None:
    """The rewritten graph at `output`, the source's external data files placed next to it under their names."""
    from .accelerate import place_file
    from .external_data import ExternalDataError, checked_location, external_files

    try:
        files = [checked_location(loc, source.parent) for loc in external_files(model)]
    except ExternalDataError as e:
        raise UsageError(str(e)) from None
    output.write_bytes(model.SerializeToString())
    for rel in files:
        (output.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        place_file(source.parent / rel, output.parent / rel)


def run_command(args) -> int:
    if args.command == "ort-accelerate":
        from .accelerate import run_command as run_accelerate

        return run_accelerate(args)
    from ..ir import load_attention_specs, load_specs
    from .customop import CustomOpError, build_library
    from .riscv import OrtError

    try:
        specs = load_specs(args.spec)
        attention = load_attention_specs(args.spec)
        if args.command == "ort-library":
            lib = build_library(specs, args.spec, flavour=args.flavour, ort_include=args.ort_include,
                                attention=attention)
            if args.output:
                Path(args.output).write_bytes(lib.read_bytes())
            print(args.output or lib)
            return 0
        if args.command == "ort-rewrite":
            from .rewrite import rewrite

            model = _load_model(args.model)
            from .decoder_ops import rewrite_decoder_ops

            from .rewrite import fold_bias_adds

            fold_bias_adds(model, specs)
            decisions = rewrite(model, specs)
            moved = sum(d.moved for d in decisions)
            decoder = rewrite_decoder_ops(model, attention=bool(attention)) if moved and not args.matmul_only else []
            _save_rewritten(model, Path(args.model), Path(args.output))
            for d in [*decisions, *decoder]:
                print(d)
            more = f", {sum(d.moved for d in decoder)} of {len(decoder)} other decoder nodes" if decoder else ""
            print(f"{moved} of {len(decisions)} MatMulNBits nodes moved{more}; wrote {args.output}")
            return 0
        from .model_check import ModelCheckError, model_check

        inputs = None
        if args.inputs:
            import numpy as np

            try:
                inputs = dict(np.load(args.inputs))
            except (OSError, ValueError) as e:
                raise UsageError(f"--inputs {args.inputs}: not a readable .npz ({e})") from None
        dims = dict(args.dim)  # NAME=VALUE pairs, checked by argparse
        try:
            check = model_check(specs, args.model, spec_file=args.spec, version=args.ort_version, inputs=inputs,
                                seed=args.seed, dims=dims, threads=args.threads, seq=args.seq, past=args.past,
                                generate=args.generate, compute=args.compute, decoder=not args.matmul_only,
                                attention=attention)
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
