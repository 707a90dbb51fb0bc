"""The riscv64 onnxruntime runner (imegen.ort.riscv) on Debian's real ORT builds under QEMU."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from imegen.ort import sysroot
from imegen.ort.riscv import OrtError, RiscvSession

VERSIONS = ["1.21", "1.23"]


def _concat_model(path, elem):
    node = helper.make_node("Concat", ["a", "b"], ["y"], axis=0)
    vi = lambda n: helper.make_tensor_value_info(n, elem, [None, 3])  # noqa: E731
    graph = helper.make_graph([node], "concat", [vi("a"), vi("b")], [vi("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_sysroot_records_its_version_and_is_cached(version):
    root = sysroot.ensure(version)
    assert sysroot.full_version(root).startswith(version + ".")
    assert sysroot.ensure(version) == root and (root / "lib").is_symlink()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype,elem", [(np.float32, TensorProto.FLOAT), (np.int64, TensorProto.INT64),
                                        (np.int32, TensorProto.INT32)])
def test_runner_round_trips_tensors_including_empty_ones(tmp_path, version, dtype, elem):
    model = _concat_model(tmp_path / "m.onnx", elem)
    a = np.arange(6, dtype=dtype).reshape(2, 3)
    with RiscvSession(model, version=version) as s:
        assert s.input_names == ["a", "b"] and s.output_names == ["y"]
        y = s.run({"a": a, "b": np.zeros((0, 3), dtype)})["y"]
        np.testing.assert_array_equal(y, a)
        y = s.run({"a": a, "b": a + 1}, outputs=["y"])["y"]
        assert y.dtype == dtype
        np.testing.assert_array_equal(y, np.concatenate([a, a + 1]))


def test_runner_surfaces_ort_errors(tmp_path):
    model = _concat_model(tmp_path / "m.onnx", TensorProto.FLOAT)
    with RiscvSession(model, version="1.21") as s:
        with pytest.raises(OrtError, match="invalid dimensions for input: a"):
            s.run({"a": np.ones((2, 4), np.float32), "b": np.ones((1, 3), np.float32)})
        # the session survives a failed run
        assert s.run({"a": np.ones((1, 3), np.float32), "b": np.ones((1, 3), np.float32)})["y"].shape == (2, 3)
        assert s.stats() == ""
    with pytest.raises(OrtError, match="doesn't exist"):
        RiscvSession(tmp_path / "missing.onnx", version="1.21")


def test_sid_moving_on_fails_with_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached sysroot: ensure must resolve
    monkeypatch.delenv("IMEGEN_CACHE_DIR", raising=False)  # (it would override XDG_CACHE_HOME)
    monkeypatch.setattr(sysroot, "_update", lambda suite: None)
    served = {"libonnxruntime1.23": None, "libonnxruntime-dev": "1.24.1+dfsg-1"}
    monkeypatch.setattr(sysroot, "_candidate", lambda suite, pkg: served[pkg])
    with pytest.raises(sysroot.SysrootError, match="no longer serves libonnxruntime1.23 .*1.24.1"):
        sysroot.ensure("1.23")
    served.update({"libonnxruntime1.23": "1.23.3+dfsg-1", "libonnxruntime-dev": "1.24.1+dfsg-1"})
    with pytest.raises(sysroot.SysrootError, match="not a matching 1.23.x pair"):
        sysroot.ensure("1.23")


def _neg_model(path):
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Neg", ["a"], ["y"]), helper.make_node("Abs", ["a"], ["z"])], "neg",
                              [vi("a")], [vi("y"), vi("z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_runner_binds_an_output_to_an_input_buffer(tmp_path, version):
    """share={output: input}: an IoBinding writes the output into the input's own buffer (the runner fails the
    Run if ORT wrote it elsewhere); the other outputs come back as usual."""
    a = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    with RiscvSession(_neg_model(tmp_path / "m.onnx"), version=version) as s:
        out = s.run({"a": a}, share={"y": "a"})
        np.testing.assert_array_equal(out["y"], -a)
        np.testing.assert_array_equal(out["z"], np.abs(a))
        with pytest.raises(OrtError, match="shared output is not run: y"):
            s.run({"a": a}, outputs=["z"], share={"y": "a"})
        with pytest.raises(ValueError, match="shared input 'b' is not among the feeds"):
            s.run({"a": a}, share={"y": "b"})
        np.testing.assert_array_equal(s.run({"a": a})["y"], -a)  # unbound again
