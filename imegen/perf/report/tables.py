"""Text tables and the short config labels every bench table uses."""

from __future__ import annotations

from ...ir import KernelSpec
from ..search.settings import settings_of


def format_table(head: list[str], body: list[list[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(head)))
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def millions(v: float) -> str:
    return f"{v / 1e6:.3f}"


def short_config(spec: KernelSpec) -> str:
    s = settings_of(spec)
    extra = ((f" v{s['vlen']}" if "vlen" in s else "") + (" staged" if "stage_b" in s else "") + (" spread/reg" if "spread" in s else "")
             + (" a16" if "a_scale_type" in s else ""))
    return f"{s['target']}/{s['compute']} {s['op']} {s['tile']} k{s['k_unroll']} {s['unpack'][:5]} p{s['panel']} {s['scales'][:3]}{extra}"
