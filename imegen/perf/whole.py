"""The whole model in `imegen bench` (full runs): onnxruntime-genai's export form of Qwen2.5-0.5B counted node by
node in stock ORT, ORT + imegen's MatMulNBits and ORT + imegen's whole decoder (baselines/onnxruntime/per_node.py;
GroupQueryAttention in genai's shared KV buffer, present written into past, as genai runs it on CPU),
and llama.cpp's own whole program on the same architecture (baselines/llama_cpp/whole_model.py), both cached.
report/whole_model.py turns it into the table, whole_model.csv/.txt and the plot's whole-model panels."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WholeAccount:
    accounts: tuple  # per_node.Account per engine x phase
    llama: tuple  # llama.cpp's rows (llama_cpp.whole_model.results()["rows"]); () when it could not be counted
    llama_note: str  # why llama.cpp is missing ("" when present)
    version: str  # the ORT the engines ran in

    def rows(self) -> list:
        from .report import whole_model as wm

        return [wm.row_of(a) for a in self.accounts] + [wm.llama_row(r) for r in self.llama]


def run(log=None) -> WholeAccount:
    from ..toolchain import ToolchainError
    from .baselines.llama_cpp import whole_model as llama_whole
    from .baselines.llama_cpp.source import LlamaUnavailable
    from .baselines.onnxruntime import per_node as pn

    with pn.setup(log=log) as s:
        accounts = tuple(pn.accounts(s, log=log))
    try:
        llama, note = tuple(llama_whole.results(log)["rows"]), ""
    except (ToolchainError, LlamaUnavailable, OSError) as e:
        llama, note = (), f"llama.cpp's whole model was not counted: {str(e).splitlines()[0] if str(e) else e}"
    return WholeAccount(accounts, llama, note, accounts[0].version if accounts else "")
