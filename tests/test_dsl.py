"""The DSL front end: syntax errors, setting validation and hardware refusals.

Every error must carry the exact file:line:col of the offending text and say why, in words a
user can act on; these tests pin both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from imegen.errors import SpecError
from imegen.ir import KernelSpec, load_specs, register_budget, specs_from_text

FILE = "t.imegen"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "qwen_mlp.imegen"


def error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        specs_from_text(text, FILE)
    return info.value


def assert_error(text: str, where: str, *words: str) -> SpecError:
    """`where` is "line:col"; every word must appear in the message."""
    e = error(text)
    assert str(e.span) == f"{FILE}:{where}", str(e)
    assert str(e) == f"{FILE}:{where}: error: {e.message}"
    for w in words:
        assert w in e.message, f"{w!r} not in {e.message!r}"
    return e


def kernel(*settings: str, name: str = "k") -> str:
    """A kernel block, one setting per line starting at line 2, column 3."""
    return f"kernel {name} {{\n" + "".join(f"  {s}\n" for s in settings) + "}\n"


IME = ("target = ime", "compute = int8")


# --- syntax ------------------------------------------------------------------------------

def test_missing_value():
    assert_error("kernel k {\n  bits = \n}\n", "3:1", "expected", "a name", "an integer", "a tile", "got '}'")


def test_missing_value_before_semicolon():
    assert_error("kernel k {\n  bits = ;\n}\n", "2:10", "expected", "an integer", "got ';'")


def test_missing_closing_brace_at_eof():
    # Reported where the file ends (just past its last character), not at the last token.
    assert_error("kernel k {\n  bits = 4\n", "2:11", "unexpected end of file, expected", "'}'")
    assert_error("kernel k {\n  bits = 4\n  # the end\n", "3:12", "unexpected end of file, expected", "'}'")
    assert_error("kernel k {", "1:11", "unexpected end of file, expected", "'}'")


def test_integer_literal_too_long():
    # int() refuses more than 4300 digits with a ValueError; the parser refuses long literals first.
    assert_error(kernel("panel = " + "9" * 5000), "2:11", "integer literal with 5000 digits")
    assert_error(kernel("tile = 1x" + "1" * 4400), "2:10", "integer literal with 4400 digits")
    assert_error(kernel("tile = " + "1" * 4400 + "x16"), "2:10", "integer literal with 4400 digits")


def test_stray_character():
    assert_error("kernel k {\n  bits = 4 @\n}\n", "2:12", "unexpected character '@'", "expected", "'}'")


def test_malformed_value_is_reported_whole_where_it_starts():
    # A number or tile runs into letters: one bad value at its own position, not a number followed by a
    # setting name that then lacks its '='.
    for value in ("8x", "4b", "8x12x4", "32_"):
        assert_error(kernel(f"tile = {value}"), "2:10", f"unexpected {value!r}", "a tile such as 4x16", "an integer")


def test_misspelled_kernel_keyword():
    assert_error("kernal k {\n  bits = 4\n}\n", "1:1", "expected", "'kernel'", "'defaults'", "got 'kernal'")


def test_missing_kernel_name():
    assert_error("\nkernel {\n  bits = 4\n}\n", "2:8", "expected a name", "got '{'")


# --- settings ----------------------------------------------------------------------------

def test_unknown_setting_lists_allowed_keys():
    e = assert_error(kernel("bits = 4", "bitz = 4"), "3:3", "unknown setting 'bitz'", "expected one of")
    for key in ("op", "bits", "block", "zero_point", "bias", "compute", "target", "vlen", "tile",
                "k_unroll", "unpack", "panel", "scales"):
        assert key in e.message


def test_bad_choice_lists_allowed_values():
    assert_error(kernel("bits = 5"), "2:10", "'bits' must be one of: 4, 8", "got 5")
    assert_error(kernel("target = gpu"), "2:12", "'target' must be one of: ime, ime2, rvv, scalar", "'gpu'")
    assert_error(kernel("block = 48"), "2:11", "16, 32, 64, 128, 256", "48")
    assert_error(kernel("op = gemm", "zero_point = zero"), "3:16", "symmetric, asymmetric", "'zero'")


def test_tile_with_zero():
    assert_error(kernel("tile = 0x16"), "2:10", "tile dimensions must be positive", "0x16")
    assert_error(kernel("op = gemm", "tile = 4x0"), "3:10", "tile dimensions must be positive", "4x0")


@pytest.mark.parametrize("value", [2**70, 2**40, 257, 4096])
def test_panel_range(value):
    assert_error(kernel(f"panel = {value}"), "2:11", "'panel' must be 1..256", f"got {value}", "pad N")


@pytest.mark.parametrize("tile", ["1x257", "257x1", f"1x{2**64}", f"{2**40}x{2**40}"])
def test_tile_range(tile):
    assert_error(kernel(f"tile = {tile}"), "2:10", "tile dimensions must be 1..256", f"got {tile}", "registers")


def test_numeric_range_edges_accepted():
    assert specs_from_text(kernel("tile = 1x256", "panel = 256"), FILE)[0].panel == 256
    assert specs_from_text(kernel("op = gemm", "tile = 256x1", "panel = 1"), FILE)[0].tile_m == 256


def test_every_numeric_setting_is_bounded():
    # Each number a spec can set is either a closed choice list or range-checked (none unbounded).
    from imegen import ir

    for key, (_, allowed) in ir._CHOICES.items():
        assert isinstance(allowed, tuple) or key in ("tile", "panel", "shapes", "min_rows"), key


def test_tile_needs_tile_syntax():
    assert_error(kernel("tile = 16"), "2:10", "'tile' expects a tile MxN", "4x16")


def test_setting_twice_in_a_block():
    assert_error(kernel("bits = 4", "block = 32", "bits = 8"), "4:3", "'bits' is set twice in this block")


def test_setting_twice_in_defaults():
    assert_error("defaults {\n  bits = 4\n  bits = 8\n}\n" + kernel(), "3:3", "'bits' is set twice")


def test_duplicate_kernel_names_first_definition():
    text = kernel("bits = 8", name="a") + "\n" + kernel(name="b") + "\n  " + kernel("bits = 4", name="a")
    assert_error(text, "8:3", "kernel 'a' is already defined at t.imegen:1:1")


def test_kernel_names_differing_only_in_case():
    text = kernel(name="foo") + kernel(name="bar") + kernel(name="Foo")
    assert_error(text, "5:1", "kernel 'Foo' differs from 'foo' (t.imegen:1:1) only in case")


@pytest.mark.parametrize("name, what", [("driver", "the test driver"), ("IME_emu", "ime_emu.h"),
                                        ("bench_markers", "bench_markers.h"), ("mlas_driver", "mlas_driver.c"),
                                        ("dispatch", "dispatch.o"), ("stdint", "shadow <stdint.h>"),
                                        ("Math", "shadow <math.h>")])
def test_kernel_names_the_harness_uses_are_reserved(name, what):
    # `imegen check` builds driver.c next to the kernel's files; runtime headers are on the include path
    assert_error(kernel(name=name), "1:1", f"kernel name '{name}' is reserved", what)


def test_kernel_name_length():
    assert specs_from_text(kernel(name="k" * 200), FILE)[0].name == "k" * 200
    assert_error(kernel(name="k" * 201), "1:1", "kernel name of 201 characters; at most 200")


MLAS_GEMV = ("abi = mlas", "compute = int8", "op = gemv", "tile = 1x16")


@pytest.mark.parametrize("name, clash", [("t_dispatch", "t_dispatch.h and t_dispatch.c"), ("T_Dispatch", "t_dispatch.h"),
                                         ("t_mlas_dispatch", "t_mlas_dispatch.cpp"),
                                         ("t", "C symbols (t_supported")])
def test_kernel_colliding_with_the_dispatch_outputs(name, clash):
    # The dispatch of t.imegen is t_dispatch.{h,c} and t_mlas_dispatch.cpp, its symbols t_*.
    assert_error(kernel(*MLAS_GEMV, name=name), "1:1", f"kernel '{name}' would collide with", clash, "rename")


def test_dispatch_names_are_free_without_mlas_kernels():
    assert specs_from_text(kernel(name="t_dispatch"), FILE)[0].name == "t_dispatch"


@pytest.mark.parametrize("file, prefix", [("2layer.imegen", "imegen_2layer_"), ("my-spec.imegen", "my_spec_"),
                                          ("dir/ort_mlas.imegen", "ort_mlas_"), ("_x.imegen", "imegen__x_"),
                                          ("sp\u00ebc.v2.imegen", "sp_c_v2_")])
def test_dispatch_prefix_is_a_c_identifier(file, prefix):
    from imegen.names import dispatch_prefix

    assert dispatch_prefix(file) == prefix


def test_empty_spec():
    assert_error("", "1:1", "defines no kernel")
    assert_error("# only a comment\n\n", "1:1", "defines no kernel")


def test_defaults_only_spec():
    assert_error("\n\ndefaults {\n  bits = 8\n}\n", "3:1", "defines no kernel")


# --- hardware refusals -------------------------------------------------------------------

def test_ime_needs_int8_compute():
    assert_error(kernel("target = ime", "compute = fp32"), "3:3", "vmadot", "int8", "compute = int8")


def test_ime_only_at_vlen_256():
    assert_error(kernel(*IME, "vlen = 128"), "4:3", "VLEN=256", "not 128")


def test_ime_tile_height():
    assert_error(kernel(*IME, "op = gemm", "tile = 3x16"), "5:3", "tile height 3", "multiple of vmadot's 4 rows")


def test_ime_tile_width():
    assert_error(kernel(*IME, "op = gemm", "tile = 4x6", "panel = 12"), "5:3",
                 "tile width 6", "multiple of vmadot's 4 output columns")


def test_ime_4bit_needs_even_k_unroll():
    assert_error(kernel(*IME, "bits = 4", "k_unroll = 1"), "5:3", "4-bit IME needs an even k_unroll")
    assert_error(kernel(*IME, "bits = 4", "k_unroll = 1", "block = 64"), "5:3", "even k_unroll")


def test_block_multiple_of_k_step():
    assert_error(kernel(*IME, "bits = 8", "block = 16", "k_unroll = 4"), "6:3",
                 "block 16 is not a multiple of the K step 8*k_unroll = 32")
    assert_error(kernel(*IME, "bits = 4", "block = 32", "k_unroll = 8"), "6:3", "8*k_unroll = 64")


def test_register_budget_over_32():
    e = assert_error(kernel(*IME, "op = gemm", "tile = 8x16", "k_unroll = 4"), "5:3",
                     "tile 8x16 with k_unroll 4", "needs 40 vector registers",
                     "(int32 accumulators 16, A tiles 8, B tiles 16, fold temporaries 0)")
    assert e.message.endswith("> 32")
    spec = KernelSpec("k", target="ime", compute="int8", op="gemm", tile_m=8, tile_n=16, k_unroll=4, vlen=256)
    assert sum(register_budget(spec).values()) == 40


def test_register_budget_over_32_rvv():
    assert_error(kernel("target = rvv", "compute = fp32", "op = gemm", "tile = 6x16"), "5:3",
                 "tile 6x16 with k_unroll 2 needs 37 vector registers",
                 "(fp32 accumulators 24, B codes 1, dequantized B 4, scales 4, zero points 4) > 32")


def test_rvv_tile_needing_lmul_over_8():
    assert_error(kernel("target = rvv", "compute = fp32", "vlen = 128", "tile = 1x64", "panel = 64"), "5:3",
                 "tile width 64 needs LMUL > 8 at VLEN=128")
    # Without vlen, rvv assumes the minimum of 128; the position is still the tile.
    assert_error(kernel("target = rvv", "tile = 1x128", "panel = 128"), "3:3", "LMUL > 8 at VLEN=128")


def test_gemv_tile_must_be_one_row():
    assert_error(kernel("op = gemv", "tile = 4x16"), "3:3", "gemv", "1xN", "not 4x16")


def test_panel_multiple_of_tile_width():
    assert_error(kernel("tile = 1x16", "panel = 24"), "3:3", "panel width 24", "multiple of the tile width 16")
    # With panel left at its default the tile is what was written: point there and say what to set.
    assert_error(kernel("op = gemm", "tile = 8x12"), "3:3", "default panel width 16", "panel = 12")


def test_scalar_has_no_vlen():
    assert_error(kernel("target = scalar", "vlen = 256"), "3:3", "target scalar uses no vector registers", "vlen")


def test_refusal_without_the_key_points_at_the_kernel():
    # ime + default compute (fp32): no 'compute' setting anywhere -> the kernel's own position.
    assert_error("\n  kernel k {\n  target = ime\n}\n", "2:3", "compute = int8")


# --- defaults ----------------------------------------------------------------------------

DEFAULTS = "defaults {\n  bits = 8\n  block = 64\n  compute = fp32\n}\n"


def test_defaults_apply_and_kernels_override():
    a, b = specs_from_text(DEFAULTS + kernel("block = 128", name="a") + kernel("bits = 4", "compute = int8", name="b"), FILE)
    assert (a.bits, a.block, a.compute) == (8, 128, "fp32")  # block overridden, rest defaulted
    assert (b.bits, b.block, b.compute) == (4, 64, "int8")
    assert a.source is not None and str(a.source) == f"{FILE}:6:1"


def test_defaults_apply_to_the_kernels_after_them():
    """A later defaults block replaces the keys it sets for the kernels after it (docs/dsl.md)."""
    text = (kernel(name="first") + DEFAULTS + kernel(name="second") + "defaults {\n  block = 32\n}\n"
            + kernel(name="third"))
    first, second, third = specs_from_text(text, FILE)
    assert (first.bits, first.block) == (4, 32)  # no defaults before it: the built-in ones
    assert (second.bits, second.block, second.compute) == (8, 64, "fp32")
    assert (third.bits, third.block, third.compute) == (8, 32, "fp32")  # block replaced, the rest kept


def test_kernel_override_lifts_a_default_refusal():
    (k,) = specs_from_text(DEFAULTS + kernel(*IME), FILE)
    assert (k.target, k.compute, k.vlen) == ("ime", "int8", 256)


def test_refused_default_points_at_defaults_setting():
    # compute = fp32 comes from the defaults block (line 4), not from the kernel.
    assert_error(DEFAULTS + kernel("target = ime"), "4:3", "kernel 'k'", "compute = int8")
    text = "defaults {\n  k_unroll = 8\n}\n" + kernel(*IME, "bits = 8", "block = 32")
    assert_error(text, "2:3", "block 32 is not a multiple of the K step 8*k_unroll = 64")


def test_defaults_values_are_checked_too():
    assert_error("defaults {\n  bits = 3\n}\n" + kernel(), "2:10", "'bits' must be one of: 4, 8")


# --- the example -------------------------------------------------------------------------

def test_example_validates():
    specs = load_specs(EXAMPLE)
    names = [s.name for s in specs]
    assert names == ["q4_prefill_ime", "q4_decode_ime", "q4_prefill_rvv", "q4_decode_scalar"]
    assert all(s.bits == 4 and s.zero_point == "asymmetric" for s in specs)  # from defaults
    assert {s.target for s in specs} == {"ime", "rvv", "scalar"}
    for s in specs:
        assert s.source is not None and s.source.file == str(EXAMPLE)
        assert sum(register_budget(s).values()) <= 32


def test_fp16_scales_need_int8_compute_and_imegen_abi():
    from imegen.errors import SpecError
    from imegen.ir import specs_from_text

    with pytest.raises(SpecError, match="outside ORT's accuracy_level 0/1 tolerance"):
        specs_from_text("kernel a { compute = fp32  scale_type = fp16 }")
    with pytest.raises(SpecError, match="fp16 scales need abi = imegen"):
        specs_from_text("kernel a { abi = mlas  compute = int8  scale_type = fp16 }")
    assert specs_from_text("kernel a { compute = int8  scale_type = fp16 }")[0].scale_type == "fp16"


def test_tile_values_are_shown_as_written():
    from imegen.errors import SpecError
    from imegen.ir import specs_from_text

    with pytest.raises(SpecError, match=r"'bits' must be one of: 4, 8; got 4x4$"):
        specs_from_text("kernel a { bits = 4x4 }")


# --- bytes that are not UTF-8 text -------------------------------------------------------

@pytest.mark.parametrize("data, where, words", [
    (b"kernel k {\n  bits = 4 \xff\n}\n", "2:12", ["byte 0xff is not UTF-8"]),
    ("kernel k { }".encode("utf-16"), "1:1", ["byte 0xff", "UTF-16"]),
    ("kernel k {\n  # caf\u00e9 \u00fc\n".encode() + b"\xc3(", "3:1", ["byte 0xc3"]),
    ("# \u00fcber\n kernel \u00e9".encode() + b"\x80", "2:10", ["byte 0x80"]),
    (b"\xef\xbb\xbf#\x80 comment\n", "1:2", ["byte 0x80"]),  # after a byte-order mark (found by CI's fuzzing)
    (b"\xef\xbb\xbf\xff", "1:1", ["byte 0xff"]),
])
def test_non_utf8_spec(tmp_path, data, where, words):
    path = tmp_path / "bin.imegen"
    path.write_bytes(data)
    with pytest.raises(SpecError) as info:
        load_specs(path)
    assert str(info.value).startswith(f"{path}:{where}: error: "), str(info.value)
    for w in words:
        assert w in info.value.message


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.imegen"
    path.write_bytes(b"\xef\xbb\xbf" + kernel().encode())
    assert [s.name for s in load_specs(path)] == ["k"]


# ------------------------------------------------------------------- routing keys (custom-op library)
def test_routing_keys_parse_and_show_in_describe():
    (s,) = specs_from_text(kernel("op = gemm", "target = rvv", "compute = int8", "tile = 2x16", "shapes = 1152x896, 896x4864",
                                  "min_rows = 256", "fallback = yes"), FILE)
    assert (s.shapes, s.min_rows, s.fallback) == (((1152, 896), (896, 4864)), 256, True)
    assert s.describe().endswith(" shapes=1152x896,896x4864 min_rows=256 fallback=yes")
    (plain,) = specs_from_text(kernel("op = gemm"), FILE)
    assert (plain.shapes, plain.min_rows, plain.fallback) == ((), 2, False) and "shapes" not in plain.describe()


@pytest.mark.parametrize("line, where, words", [
    ("shapes = 4", "2:12", "expects weight shapes NxK"),
    ("shapes = 0x5", "2:12", "N and K must be 1..16777216"),
    (f"shapes = {2**24 + 1}x8", "2:12", "N and K must be 1..16777216"),
    ("shapes = 8x8, 16x8, 8x8", "2:12", "shape 8x8 is listed twice"),
    ("tile = 4x16, 4x8", "2:10", "'tile' takes one value, got a list of 2"),
    ("min_rows = 1", "2:14", "'min_rows' must be 2..16777216"),
    ("min_rows = 4x4", "2:14", "expects a number of rows"),
])
def test_routing_key_values_are_checked(line, where, words):
    assert_error(kernel(line), where, words)


def test_routing_keys_refused_where_they_mean_nothing():
    assert_error(kernel("op = gemv", "min_rows = 4"), "3:3", "a gemv kernel serves M = 1")
    assert_error(kernel("op = gemm", "target = ime", "compute = int8", "tile = 4x16", "fallback = yes"), "6:3",
                 "its target must be rvv or scalar")
