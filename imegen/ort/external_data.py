"""A model read without its external weights, and its external data files: which it references, and where
they may be (inside its folder).

ort-accelerate, ort-rewrite and ort-model-check read models and place those files through this module, which
imports none of them.
"""

from __future__ import annotations

from pathlib import Path


class ExternalDataError(ValueError):
    """A location outside the model's folder, or a file the model references that is not there."""


class ModelFileError(ValueError):
    """A model file that is missing or is not an ONNX model."""


def load_graph(path: str | Path):
    """The model's protobuf, its external weights left in their files (a real LLM's do not fit a protobuf, and
    rewriting or checking needs only the graph)."""
    import onnx

    if not Path(path).is_file():
        raise ModelFileError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelFileError(f"{path}: not an ONNX model ({why})") from None
    if not model.HasField("graph"):  # an empty file parses as an empty ModelProto
        raise ModelFileError(f"{path}: not an ONNX model (it holds no graph)")
    return model


def _tensors(graph):
    """Every TensorProto of a graph and its subgraphs (where external data can be referenced)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for g in a.graphs:
                yield from _tensors(g)


def external_files(model) -> list[str]:
    """The relative paths of the model's external data files, each once, as the model names them."""
    from onnx import TensorProto

    names = []
    for t in _tensors(model.graph):
        if t.data_location == TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if loc not in names:
                names.append(loc)
    return names


def checked_location(loc: str, model_dir: Path) -> Path:
    """`loc` as a path relative to the model's folder, checked to stay inside it and to exist there."""
    rel = Path(loc)
    if not loc or rel.is_absolute() or ".." in rel.parts:
        raise ExternalDataError(f"external data location {loc!r}: not a path inside the model's folder")
    src = model_dir / rel
    if not src.is_file():
        raise ExternalDataError(f"external data file {src} (which the model references) does not exist")
    return rel
