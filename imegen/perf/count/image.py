"""Where code lies in a static riscv64 executable: the code ranges of each object from a GNU ld link
map, the executable PT_LOAD segments of the ELF file, and the symbols nm lists. The counting plugin
tags instructions by these ranges (kernel, callee, excluded)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

from ...toolchain import ToolchainError

NM = "riscv64-linux-gnu-nm"


def exec_segments(exe: Path) -> list[tuple[int, int]]:
    """[vaddr, vaddr + memsz) of every executable PT_LOAD segment of an ELF64 file."""
    data = exe.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{exe} is not an ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segs = []
    for i in range(phnum):
        p_type, p_flags, _, p_vaddr, _, _, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_flags & 1:  # PT_LOAD, PF_X
            segs.append((p_vaddr, p_vaddr + p_memsz))
    return segs


_MAP_LINE = re.compile(r"^\s*(\.text\S*)?\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S.*)$")


def code_ranges_from_map(map_text: str, objects: dict[str, str]) -> list[tuple[int, int, str]]:
    """Address ranges of the `.text*` input sections of each object in a GNU ld map.

    `objects` maps an object path (as it appears in the map) to the tag of its code.
    A section name longer than the map's column is printed on its own line, with the
    address, size and file on the next line; both forms are handled.
    """
    ranges: list[tuple[int, int, str]] = []
    pending = None
    in_text_output = False
    for line in map_text.splitlines():
        if line.startswith("."):  # an output section
            in_text_output = line.split()[0] == ".text"
            pending = None
            continue
        if not in_text_output:
            continue
        stripped = line.strip()
        if re.fullmatch(r"\.text\S*", stripped):
            pending = stripped
            continue
        m = _MAP_LINE.match(line)
        if m and (m.group(1) or pending) and m.group(4).strip() in objects:
            lo, size = int(m.group(2), 16), int(m.group(3), 16)
            if size:
                ranges.append((lo, lo + size, objects[m.group(4).strip()]))
        pending = None
    return ranges


def symbols(exe: Path) -> dict[str, tuple[int, int, str]]:
    proc = subprocess.run([NM, "--print-size", "--defined-only", str(exe)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError("nm failed", [NM, str(exe)], proc.returncode, proc.stdout, proc.stderr)
    syms = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4:
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16), parts[2])
        elif len(parts) == 3:
            syms[parts[2]] = (int(parts[0], 16), 0, parts[1])
    return syms


def save_ranges(d: Path, ranges: list[tuple[int, int, str]]) -> None:
    """The link map names objects by their path at link time, a temporary directory that the
    cache renames: resolve the ranges then and keep them next to the executable."""
    (d / "ranges.json").write_text(json.dumps(ranges))


def load_ranges(d: Path) -> list[tuple[int, int, str]]:
    return [(lo, hi, tag) for lo, hi, tag in json.loads((d / "ranges.json").read_text())]
