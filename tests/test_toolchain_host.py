"""Which compilers and which launcher imegen picks on which machine (imegen/toolchain.py).

This machine is x86: the cross flow is checked for real (its exact commands, which every cache key
hashes); the native riscv64 flow is checked by simulation only (toolchain.current_host replaced by a
riscv64 Host), asserting the commands chosen and the refusals, not running them on a riscv64 hart.
The VLEN probe program itself runs for real under QEMU.
"""

import re
from dataclasses import replace
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from imegen import check, toolchain, verify
from imegen import load_spec
from imegen.plan import plan_kernel
from imegen.toolchain import Host, HostError

NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
EXE = "/work/driver"
K1 = Host("riscv64", vlen=256, ime_harts=(0, 1, 2, 3), qemu=True)


def cpuinfo(marchids):
    """/proc/cpuinfo as a K1's kernel (Bianbu) prints it, with these marchids, one hart each."""
    return "\n".join(
        f"processor\t: {i}\nhart\t\t: {i}\nmodel name\t: Spacemit(R) X60\n"
        f"isa\t\t: rv64imafdcv_zicbom_zicboz_zicntr_zicond_zicsr_zifencei_zihintpause_zihpm_zfh_zfhmin_zca_zcd_zba\n"
        f"mmu\t\t: sv39\nuarch\t\t: spacemit,x60\nmvendorid\t: 0x710\nmarchid\t\t: {m}\n"
        f"mimpid\t\t: 0x1000000049772200\n" for i, m in enumerate(marchids))


X60, A60 = "0x8000000058000001", "0x8000000041000001"
K1_CPUINFO = cpuinfo([X60] * 8)  # the K1's eight harts all report the X60's marchid
QEMU_CPUINFO = "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdcvh_zicbom_zicboz\nmmu\t\t: sv57\n\n"


@pytest.fixture
def on(monkeypatch):
    """on(host): simulate `host` for everything in imegen.toolchain that asks current_host()."""
    return lambda host: monkeypatch.setattr(toolchain, "current_host", lambda: host)


@pytest.fixture
def spawned(monkeypatch):
    """The commands toolchain would have spawned (none is run)."""
    cmds = []

    def fake(cmd, **kwargs):
        cmds.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, b"", b"")

    monkeypatch.setattr(toolchain, "_spawn", fake)
    return cmds


# ------------------------------------------------------------------------------------- the x86 cross flow
def test_this_machine_is_not_riscv64_and_cross_compiles():
    assert not toolchain.current_host().native  # what the rest of this file's "x86" checks assume


def test_cross_commands_are_unchanged(on, spawned, tmp_path):
    on(Host("x86_64"))
    toolchain.compile_c([tmp_path / "k.c"], tmp_path / "k.o", march="rv64gcv", extra_flags=["-fPIC"])
    toolchain.compile_c([tmp_path / "k.c"], tmp_path / "k", compiler="gcc", march="rv64gc")
    toolchain.compile_c([tmp_path / "k.c"], tmp_path / "h", host=True)
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"]
    assert spawned == [
        ["clang-19", "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr", "-march=rv64gcv", *flags, "-fPIC", "-c",
         "-o", str(tmp_path / "k.o"), str(tmp_path / "k.c")],
        ["riscv64-linux-gnu-gcc", "-march=rv64gc", *flags, "-o", str(tmp_path / "k"), str(tmp_path / "k.c"), "-lm"],
        ["cc", *flags, "-o", str(tmp_path / "h"), str(tmp_path / "k.c"), "-lm"],
    ]
    qemu = ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu"]
    assert toolchain.launch(EXE, vlen=256) == qemu + ["rv64,v=true,Zfh=true,vlen=256", EXE]
    assert toolchain.launch(EXE, vlen=128, ime=True) == qemu + ["rv64,v=true,Zfh=true,vlen=128", EXE]
    assert toolchain.launch(EXE, vlen=None) == qemu + ["rv64,v=true,Zfh=true", EXE]
    assert toolchain.launch(EXE, host=True) == [EXE]
    assert toolchain.compiler_tool("clang") == "clang-19"


def test_cross_cache_inputs_hash_the_sysroot_libc(on):
    on(Host("x86_64"))
    inputs = toolchain.inputs("clang")
    assert inputs.strings == ("clang-19 --target=riscv64-linux-gnu --gcc-toolchain=/usr -march=rv64gcv -O2 -Wall "
                              "-Wextra -Werror -std=c11",)
    assert inputs.tools == ("clang-19",)
    libc = toolchain.SYSROOT / "lib" / "libc.a"
    assert (libc in inputs.files) == libc.exists()


# ----------------------------------------------------------------------------- the native flow, simulated
def test_native_compilers_have_no_cross_settings(on, spawned, tmp_path):
    on(K1)
    toolchain.compile_c([tmp_path / "k.c"], tmp_path / "k.o", march="rv64gcv", extra_flags=["-fPIC"])
    toolchain.compile_c([tmp_path / "k.c"], tmp_path / "k", compiler="gcc", march="rv64gc")
    clang, gcc = spawned
    assert clang[:2] == ["clang", "-march=rv64gcv"] and gcc[:2] == ["gcc", "-march=rv64gc"]
    assert not [a for a in clang + gcc if a.startswith(("--target", "--gcc-toolchain", "--sysroot"))]
    assert toolchain.compiler_tool("clang") == "clang" and toolchain.compiler_tool("gcc") == "gcc"


def test_native_cache_inputs_skip_the_cross_sysroot(on):
    on(Host("x86_64"))
    cross = toolchain.inputs("clang")
    on(K1)
    native = toolchain.inputs("clang")
    assert native.files == () and native.tools == ("clang",)
    assert native.strings == ("clang -march=rv64gcv -O2 -Wall -Wextra -Werror -std=c11",)
    assert native.key() != cross.key()  # a native build never reuses a cross one


def test_native_needs_no_qemu(on, monkeypatch):
    on(K1)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "qemu-riscv64" else f"/usr/bin/{tool}")
    assert toolchain.missing_tools() == []
    on(Host("x86_64"))
    assert toolchain.missing_tools() == ["qemu-riscv64"]


QEMU_AT = lambda vlen: ["qemu-riscv64", "-cpu", f"rv64,v=true,Zfh=true,vlen={vlen}", EXE]  # noqa: E731


@pytest.mark.parametrize("host, vlen, ime, expected", [
    (K1, 256, False, [EXE]),                                              # the hart's own VLEN: natively
    (K1, None, False, [EXE]),                                             # any VLEN will do
    (K1, 256, True, ["taskset", "-c", "0-3", EXE]),                       # IME: on the IME harts
    (K1, 128, False, QEMU_AT(128)),                                       # another VLEN: QEMU, the host's own libc
    (K1, 512, False, QEMU_AT(512)),
    (Host("riscv64", 256, (), True), 256, True, QEMU_AT(256)),            # IME on a hart without it
    (Host("riscv64", 256, (0, 2), True), 256, True, ["taskset", "-c", "0,2", EXE]),
    (Host("riscv64", None, (), True), 128, False, QEMU_AT(128)),          # no V at all
], ids=["own-vlen", "any-vlen", "ime", "vlen128", "vlen512", "ime-missing", "ime-0,2", "no-v"])
def test_native_launch(on, host, vlen, ime, expected):
    on(host)
    assert toolchain.launch(EXE, vlen=vlen, ime=ime) == expected
    assert toolchain.launch(EXE, vlen=vlen, ime=ime, host=True) == [EXE]


@pytest.mark.parametrize("host, vlen, ime, reason", [
    (Host("riscv64", 256, (0, 1, 2, 3), False), 128, False, "needs a hart with VLEN 128 and this machine's has VLEN 256"),
    (Host("riscv64", 128, (), False), 256, True, "uses IME (vmadot) and no hart of this machine has it"),
    (Host("riscv64", None, (), False), 128, False, "this machine's has no vector unit"),
])
def test_native_refuses_what_the_hart_cannot_run_without_qemu(on, spawned, host, vlen, ime, reason):
    on(host)
    with pytest.raises(HostError, match=re.escape(reason)) as e:
        toolchain.run(Path(EXE), ["in", "out"], vlen=vlen, ime=ime)
    assert str(e.value).startswith("not run on this machine: ") and "qemu-riscv64 is not installed" in str(e.value)
    assert spawned == []  # nothing ran
    assert isinstance(e.value, toolchain.ToolchainError)  # the CLI's one-line error, check's failed row


def test_check_reports_rows_it_could_not_run_as_failed_not_run(on, monkeypatch):
    """A riscv64 host whose hart check cannot use (VLEN 1024, no IME) and no QEMU: every row, the refusal
    rows included, is a FAIL saying it was not run, never a PASS."""
    specs = load_spec("kernel v { op = gemv target = rvv vlen = 128 tile = 1x16 bits = 4 block = 32 "
                       "zero_point = asymmetric compute = fp32 }\n"
                       "kernel i { op = gemm target = ime tile = 4x16 bits = 4 block = 32 "
                       "zero_point = asymmetric compute = int8 }")
    if toolchain.missing_tools():
        pytest.skip("needs the cross toolchains to build the drivers")
    builds = {(s.name, c): verify.build(plan_kernel(s), compiler=c) for s in specs
              for c in verify.compilers_for(plan_kernel(s))}  # built by this machine's cross flow
    monkeypatch.setattr(check, "build", lambda plan, spec_file, compiler: builds[(plan.name, compiler)])
    on(Host("riscv64", vlen=1024, ime_harts=(), qemu=False))
    rows = [r for s in specs for r in check.check_kernel(plan_kernel(s), "<spec>")]
    assert {r.vlen for r in rows} == {"128", "256", "512", "128 (refuses)", "512 (refuses)"}
    assert rows and not [r for r in rows if r.ok or "not run on this machine" not in r.message], rows
    table = check.format_table(rows)
    assert "PASS" not in table and "FAIL: run failed: not run on this machine: the program uses IME" in table


# ----------------------------------------------------------------------------------- host detection
def test_isa_has_v():
    assert toolchain.isa_has_v(K1_CPUINFO) and toolchain.isa_has_v(QEMU_CPUINFO)
    assert not toolchain.isa_has_v("processor\t: 0\nisa\t\t: rv64imafdc_zicsr_zve32x\n")  # Zve32x is not V
    assert not toolchain.isa_has_v("")


def test_ime_harts_from_cpuinfo_and_override():
    assert toolchain.ime_harts(K1_CPUINFO) == (0, 1, 2, 3)
    assert toolchain.ime_harts(QEMU_CPUINFO) == ()  # QEMU reports no marchid: no hart has IME
    assert toolchain.ime_harts(cpuinfo([X60, X60, A60, A60])) == (2, 3)  # a kernel reporting the A60 cores apart
    assert toolchain.ime_harts(cpuinfo([X60] * 6)) == ()  # not a K1's eight harts: no guess
    assert toolchain.ime_harts(QEMU_CPUINFO, "0-3") == (0, 1, 2, 3)
    assert toolchain.ime_harts(K1_CPUINFO, "") == () and toolchain.ime_harts(K1_CPUINFO, "none") == ()
    assert toolchain.ime_harts(K1_CPUINFO, "0,2") == (0, 2)
    assert toolchain.ime_harts(K1_CPUINFO, "0-1,6") == (0, 1, 6)
    for bad in ("x", "3-1", "0-", "1;2", " 0-1, 6 "):  # as the library reads it: no spaces
        with pytest.raises(HostError, match="IMEGEN_IME_HARTS"):
            toolchain.ime_harts(K1_CPUINFO, bad)
    assert toolchain.hart_list((0, 1, 2, 3, 6)) == "0-3,6" and toolchain.hart_list((1,)) == "1"


def simulate_riscv64(monkeypatch, tmp_path, text: str) -> None:
    """current_host() on a riscv64 machine whose /proc/cpuinfo is `text` and whose VLEN probe answers 256."""
    probe = tmp_path / "probe"
    probe.write_text("#!/bin/sh\necho 256\n")
    probe.chmod(0o755)
    monkeypatch.setattr(toolchain.platform, "machine", lambda: "riscv64")
    monkeypatch.setattr(toolchain, "_read_cpuinfo", lambda: text)
    monkeypatch.setattr(toolchain, "_vlen_probe", lambda: probe)
    monkeypatch.delenv("IMEGEN_IME_HARTS", raising=False)
    toolchain.current_host.cache_clear()


def test_current_host_on_a_simulated_k1(monkeypatch, tmp_path):
    """The detection's wiring: machine, cpuinfo, the probe's answer, the env override, QEMU on PATH."""
    simulate_riscv64(monkeypatch, tmp_path, K1_CPUINFO)
    try:
        assert toolchain.current_host() == Host("riscv64", 256, (0, 1, 2, 3), shutil.which("qemu-riscv64") is not None)
        toolchain.current_host.cache_clear()
        monkeypatch.setenv("IMEGEN_IME_HARTS", "")
        monkeypatch.setattr(toolchain, "_read_cpuinfo", lambda: K1_CPUINFO.replace("rv64imafdcv_", "rv64imafdc_"))
        assert toolchain.current_host() == Host("riscv64", None, (), shutil.which("qemu-riscv64") is not None)
    finally:
        toolchain.current_host.cache_clear()
    monkeypatch.undo()
    assert not toolchain.current_host().native


@NEEDS_TOOLS
def test_vlen_probe_reads_the_harts_vlen(tmp_path):
    """The probe program hart_vlen runs natively, here cross-built and run under QEMU at three VLENs."""
    (tmp_path / "probe.c").write_text(toolchain.VLEN_PROBE)
    for compiler in ("clang", "gcc"):
        exe = toolchain.compile_c([tmp_path / "probe.c"], tmp_path / f"probe_{compiler}", compiler=compiler,
                                  march="rv64gc")  # the host compilers' default: no V needed to build it
        for vlen in (128, 256, 1024):
            assert toolchain.run(exe, vlen=vlen).stdout.decode().strip() == str(vlen)
    # a hart without V: SIGILL, which hart_vlen takes as "no V"
    proc = subprocess.run(["qemu-riscv64", "-L", str(toolchain.SYSROOT), "-cpu", "rv64,v=false", str(exe)],
                          capture_output=True)
    assert proc.returncode == -4 and proc.stdout == b""


def test_native_ime_runs_are_checked_without_the_emulators_vmadot_count(monkeypatch):
    """On a K1 a kernel's vmadots execute in hardware and never trap, so the driver's emulator counts none:
    check must not fail such a run for "executed 0 vmadot" (it still compares C with NumPy), while a run
    under QEMU keeps the count check. Simulated: the run goes through QEMU as here, but launch() says the
    program would run natively on an IME hart."""
    from imegen import verify
    from imegen.ir import specs_from_text
    from imegen.plan import plan_kernel

    plan = plan_kernel(specs_from_text("kernel k { op = gemv target = ime compute = int8 tile = 1x16 }")[0])
    build = verify.build(plan, "k.imegen")
    (case,) = check.make_cases(plan, np.random.default_rng(0), [(1, 40, 96)], exact=False)
    (emulated,) = verify.run_cases(build, [case])
    assert emulated.vmadots_counted and emulated.vmadots > 0 and verify.compare(plan, case, emulated).ok
    undercounted = verify.Result(emulated.status, 0, emulated.C, emulated.workspace_touched, True)
    assert "executed 0 vmadot" in verify.compare(plan, case, undercounted).message
    real_launch = toolchain.launch
    monkeypatch.setattr(toolchain, "launch", lambda exe, **kw: ["taskset", "-c", "0-3", exe] if kw.get("ime") else
                        real_launch(exe, **kw))
    monkeypatch.setattr(toolchain, "run", lambda exe, args, **kw: subprocess.run(
        real_launch(str(exe), vlen=kw.get("vlen", 256)) + list(args), check=True, capture_output=True))
    (native,) = verify.run_cases(build, [case])
    assert not native.vmadots_counted and verify.compare(plan, case, replace(native, vmadots=0)).ok


# ------------------------------------------------------------------------------------------- a K3, simulated
IME2_BOARD = next(b for b in toolchain.matrix_boards() if b.isa == "IME2")  # from target ime2's ImeHarts
A100_ID = IME2_BOARD.marchid
X100, A100 = "0x8000000058000002", f"{A100_ID:#x}"
K3_CPUINFO = cpuinfo([X100] * 8 + [A100] * 8)  # X100 harts 0-7 (VLEN 256), A100 harts 8-15 (IME2, VLEN 1024)
K3_IME2 = replace(IME2_BOARD, harts=tuple(range(8, 16)), vlen=1024, route_file="/nonexistent/set_ai_thread")
K3 = Host("riscv64", vlen=256, ime_harts=(), qemu=True, matrix=(K3_IME2,))


def test_the_host_looks_for_the_harts_the_targets_name():
    """The K3's marchid and routing file, as the custom-op library reads them (the target) and as imegen check
    runs on a K3 (the host): one source, the ime2 target's ImeHarts; the K1's IME keeps its own rule."""
    from imegen import targets
    k3 = targets.get("ime2").ime_harts
    assert (IME2_BOARD.marchid, IME2_BOARD.route_file) == (k3.marchid, k3.route_file) == (0x8000000041000002,
                                                                                           "/proc/set_ai_thread")
    assert targets.get("ime").ime_harts.marchid == toolchain.MARCHID_A60
    assert [b.isa for b in toolchain.matrix_boards()] == ["IME2"]


@pytest.mark.parametrize("host, vlen, ime, marchid, expected", [
    (K3, 1024, True, A100_ID, ["taskset", "-c", "8-15", EXE]),        # IME2: on the A100 harts, natively
    (K3, 256, False, A100_ID, [EXE]),                                  # RVV at the X100s' VLEN: natively
    (K3, 1024, False, A100_ID, QEMU_AT(1024)),                         # VLEN 1024 without IME2: not guessed
    (K3, 256, True, toolchain.MARCHID_A60, QEMU_AT(256)),              # the K1's IME on a K3: emulated
    (K3, 256, True, A100_ID, QEMU_AT(256)),                            # IME2 at another VLEN than the A100s'
    (K1, 1024, True, A100_ID, QEMU_AT(1024)),                          # IME2 on a K1: emulated
], ids=["ime2", "rvv-x100", "vlen1024-no-ime", "ime1-on-k3", "ime2-vlen256", "ime2-on-k1"])
def test_k3_launch(on, host, vlen, ime, marchid, expected):
    on(host)
    assert toolchain.launch(EXE, vlen=vlen, ime=ime, marchid=marchid) == expected


def test_k3_launch_routes_through_the_kernels_file_where_it_exists(on, tmp_path):
    """Where the K3's kernel has its routing file, the program writes its own pid there, then execs: it becomes
    an A100 thread as llama.cpp's threads do; the arguments follow the program."""
    route = tmp_path / "set_ai_thread"
    route.write_text("")
    on(replace(K3, matrix=(replace(K3_IME2, route_file=str(route)),)))
    cmd = toolchain.launch(EXE, vlen=1024, ime=True, marchid=A100_ID) + ["in", "out"]
    assert cmd[:2] == ["sh", "-c"] and cmd[3:] == ["sh", EXE, "in", "out"]
    out = subprocess.run(["sh", "-c", cmd[2], "sh", "echo", "ran"], capture_output=True, text=True, check=True)
    assert out.stdout == "ran\n" and route.read_text().strip().isdigit()  # the pid that then became `echo`


@pytest.mark.parametrize("host, vlen, reason", [
    (replace(K3, qemu=False, matrix=()), 1024, "uses IME2 (vmadot) and no hart of this machine has it"),
    (replace(K3, qemu=False), 512, "needs a hart with VLEN 512 and this machine's IME2 harts have VLEN 1024"),
])
def test_k3_refuses_what_no_hart_can_run_without_qemu(on, spawned, host, vlen, reason):
    on(host)
    with pytest.raises(HostError, match=re.escape(reason)):
        toolchain.run(Path(EXE), ["in", "out"], vlen=vlen, ime=True, marchid=A100_ID)
    assert spawned == []


def test_current_host_on_a_simulated_k3(monkeypatch, tmp_path):
    """A K3's detection: the X100 harts' VLEN from the unpinned probe, the A100 harts from their marchid and
    their VLEN from the probe run on them (here a fake probe that answers by how it was started), no K1 IME."""
    simulate_riscv64(monkeypatch, tmp_path, K3_CPUINFO)
    absent = str(tmp_path / "absent")
    monkeypatch.setattr(toolchain, "matrix_boards", lambda: (replace(IME2_BOARD, route_file=absent),))
    real_run = subprocess.run
    monkeypatch.setattr(toolchain.subprocess, "run", lambda cmd, **kw: real_run(
        ["echo", "1024"] if cmd[:3] == ["taskset", "-c", "8-15"] else cmd, **kw))
    try:
        here = toolchain.current_host()
        assert (here.vlen, here.ime_harts) == (256, ())
        assert here.matrix == (replace(IME2_BOARD, harts=tuple(range(8, 16)), vlen=1024, route_file=absent),)
        assert here.cannot_run(1024, True, A100_ID) is None and here.cannot_run(256, True) is not None
    finally:
        toolchain.current_host.cache_clear()
