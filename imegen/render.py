"""Stage 4: KernelPlan -> C source text, through the Jinja2 templates in templates/."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from . import __version__, cache
from .errors import SpecError
from .abi import imegen as imegen_abi
from .abi import mlas
from .names import dispatch_files, kernel_files
from .paths import shipped
from .plan import KernelPlan

TEMPLATES = shipped("templates")


@lru_cache(maxsize=1)
def env() -> jinja2.Environment:
    """The Jinja2 environment of every template imegen renders (kernels, dispatches, the custom-op
    library's kernel table, ORT patch hunks): strict about undefined names, with the version and
    templates hash the provenance headers show and imegen's status codes."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals["version"] = __version__
    env.globals["templates_hash"] = templates_hash()
    env.globals["status"] = imegen_abi.STATUS
    return env


@lru_cache(maxsize=1)
def templates_hash() -> str:
    """Identifies the templates in generated headers: the generator's output changes with them."""
    return cache.key(files=sorted(TEMPLATES.glob("*.j2")))


def _shown_name(spec_file: str) -> str:
    """The spec as headers name it: its file name only, so output does not depend on where it is built."""
    return Path(spec_file).name


def _render(template: str, plan: KernelPlan, spec_file: str) -> str:
    return env().get_template(template).render(plan=plan, P=f"{plan.name}_", spec_file=_shown_name(spec_file))


def render_kernel(plan: KernelPlan, spec_file: str) -> dict[str, str]:
    """File name -> contents for one kernel: its .h and .c."""
    header, source = kernel_files(plan.name)
    return {header: _render("kernel.h.j2", plan, spec_file), source: _render("kernel.c.j2", plan, spec_file)}


def render_attention(plan, spec_file: str) -> dict[str, str]:
    """File name -> contents for one attention kernel (an AttentionPlan): its .h and .c."""
    kw = dict(plan=plan, spec_file=_shown_name(spec_file))
    return {f"{plan.name}.h": env().get_template("attention.h.j2").render(**kw),
            f"{plan.name}.c": env().get_template(f"attention_{plan.spec.target}.c.j2").render(**kw)}


def render_attention_driver(plan, spec_file: str) -> str:
    return env().get_template("attention_driver.c.j2").render(plan=plan, spec_file=_shown_name(spec_file))


def render_driver(plan: KernelPlan, spec_file: str) -> str:
    """A test driver: reads cases from a file, runs pack + matmul, writes C (see verify.py)."""
    return _render("driver.c.j2", plan, spec_file)


def render_dispatch(d: mlas.DispatchPlan, spec_file: str) -> dict[str, str]:
    """The MLAS dispatch for a spec's abi=mlas kernels: C routing, its header, and ORT's C++ glue."""
    ctx = dict(
        d=d, spec_file=_shown_name(spec_file), entries=mlas.ENTRIES, E={e.member: e for e in mlas.ENTRIES},
        fp32=mlas.COMPUTE_FP32, int8=mlas.COMPUTE_INT8, slack=mlas.WORKSPACE_SLACK,
        alignment=mlas.WORKSPACE_ALIGNMENT, blksum_alignment=mlas.BLKSUM_ALIGNMENT,
        blksum_columns=mlas.BLKSUM_COLUMNS,
    )
    names = dispatch_files(d.prefix)
    templates = ("dispatch.h.j2", "dispatch.c.j2", "mlas_dispatch.cpp.j2")
    return {name: env().get_template(t).render(**ctx) for name, t in zip(names, templates)}


def march_for(plan: KernelPlan) -> str:
    """-march a kernel's .c needs (IME kernels carry vmadot as .word, so plain RVV suffices)."""
    return plan.target.march


def render_spec(plans: list[KernelPlan], spec_file: str, ort: str = mlas.DEFAULT_PIN) -> dict[str, str]:
    """Every file `imegen generate` writes for a spec: each kernel's .c/.h, plus the MLAS dispatch
    (its glue for ORT pin `ort`) when the spec has abi=mlas kernels."""
    parts = [render_kernel(plan, spec_file) for plan in plans]
    dispatch = mlas.plan_dispatch(plans, spec_file, ort)
    if dispatch:
        parts.append(render_dispatch(dispatch, spec_file))
    files: dict[str, str] = {}
    for part in parts:  # ir.py refuses colliding names; this guards that no output ever overwrites another
        for name, text in part.items():
            twin = next((n for n in files if n.lower() == name.lower()), None)
            if twin:
                raise SpecError(None, f"{spec_file}: generated files {twin} and {name} collide")
            files[name] = text
    return files
