"""triton-simt / triton-mma without a GPU: what the modules declare, and what mlafuzz says.

Runs in CI (no torch, triton or GPU there): the kernel modules must import without triton,
supports() must give reasons, every declared mutant must be a kernel, and list-backends must
report the backends unavailable with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

import mlafuzz
import mlafuzz.testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KDIR = os.path.join(ROOT, "kernels", "triton")
CASE = os.path.join(ROOT, "tests", "plugins", "data", "small_case.json")


def _load(name: str):
    """kernels.triton.<name> (PYTHONPATH=python:<repository>, as docs/backends.md says)."""
    return importlib.import_module("kernels.triton." + name)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def mlafuzz_cmd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([mlafuzz.testing.find_mlafuzz(), *args], cwd="/", text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)


def _call(**kw) -> mlafuzz.DecodeCall:
    base = dict(layout="model1", nope_dim=448, rope_dim=64, scale_tile=64, page_size=61,
                num_pages=3, page_stride=61 * 584, kv_cache_bytes=3 * 61 * 584, token_bytes=584,
                d_qk=512, d_v=512, invalid_index_rule="minus_one_only", empty_row_lse="+inf",
                sink_in_lse=False, batch=2, heads=3, topk=5, sm_scale=512 ** -0.5)
    base.update(kw)
    return mlafuzz.DecodeCall(**base)


def test_modules_import_without_triton_and_declare_kernels():
    simt, mma = _load("triton_simt"), _load("triton_mma")
    assert simt.decode.__mlafuzz_kernel__.precision == "fp32_simt"
    assert simt.decode.__mlafuzz_kernel__.device == "cuda"
    assert mma.decode.__mlafuzz_kernel__.precision == "bf16_mma"
    assert mma.decode.__mlafuzz_kernel__.name == "triton-mma"


def test_the_kernels_are_a_package_importable_as_the_docs_say():
    # docs/backends.md: from the repository root, PYTHONPATH=python:. and import kernels.triton.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(["python", "."]))
    proc = subprocess.run(
        [sys.executable, "-c", "import kernels.triton.triton_mma as m, kernels.triton.triton_simt "
         "as s; print(m.decode.__mlafuzz_kernel__.name, s.decode.__mlafuzz_kernel__.name, "
         "m.unavailable() == s.unavailable())"],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        check=False)
    assert proc.returncode == 0 and proc.stdout == "triton-mma triton-simt True\n", proc.stdout
    # One mla_triton shared by both kernels, reached through relative imports.
    mma, simt = _load("triton_mma"), _load("triton_simt")
    assert mma.launch is simt.launch is _load("mla_triton").launch


def test_loaded_by_path_the_package_does_not_shadow_the_triton_library():
    # The worker imports kernels/triton/triton_mma.py as a module of its package under a private
    # name: `import triton` in mla_triton_jit must still mean the library.
    from mlafuzz.worker import loader  # noqa: PLC0415

    func, info, supports = loader.load_kernel(os.path.join(KDIR, "triton_mma.py") + ":decode")
    module = sys.modules[func.__module__]
    assert func.__module__.startswith("_mlafuzz_pkg_triton_"), func.__module__
    assert info.name == "triton-mma" and supports is not None
    assert module.launch is sys.modules[module.__package__ + ".mla_triton"].launch
    triton = sys.modules.get("triton")
    assert triton is None or KDIR not in os.path.abspath(getattr(triton, "__file__", "") or ""), \
        triton
    if not _has("triton"):
        assert "No module named 'triton'" in module.unavailable()


def test_each_kernel_declares_the_token_tile_it_runs():
    # The tolerance bound counts one softmax rescale per declared tile: triton-mma (mma2_kernel)
    # and its mutants 64 tokens, triton-mma-v1 (mma_kernel) 32, triton-simt 16.
    simt, mma, common = _load("triton_simt"), _load("triton_mma"), _load("mla_triton")
    assert mma.PATH == "mma2" and common.MMA2_BLOCK_N == 64 and common.MMA_BLOCK_N == 32
    for fn in (mma.decode, mma.decode_h16, mma.decode_h64, mma.mutant_no_rescale):
        assert fn.__mlafuzz_kernel__.token_tile == 64, fn.__name__
    assert mma.decode_v1.__mlafuzz_kernel__.token_tile == 32
    assert simt.decode.__mlafuzz_kernel__.token_tile == common.SIMT_BLOCK_N == 16
    proc = mlafuzz_cmd("plugin-info", f"python:{KDIR}/triton_mma.py:decode")
    assert "token tile:  64 tokens (declared)" in proc.stdout, proc.stdout


def test_supports_accepts_both_layouts_and_names_what_it_cannot_do():
    mma = _load("triton_mma")
    assert mma.supports(_call()) is None
    assert mma.supports(_call(layout="v32", nope_dim=512, scale_tile=128, d_qk=576, d_v=512,
                              token_bytes=656)) is None
    assert mma.supports(_call(nope_dim=192, d_qk=256, d_v=256)) is None  # padded to 256
    assert "multiple of scale_tile" in mma.supports(_call(nope_dim=100, d_qk=164, d_v=164))
    assert "outside" in mma.supports(_call(nope_dim=1024, d_qk=1088, d_v=1088))
    assert "d_v" in mma.supports(_call(d_v=448))
    assert "rope_dim" in mma.supports(_call(rope_dim=128, d_qk=576, d_v=576))


def test_every_declared_mutant_is_a_kernel_with_its_own_constexpr():
    mma = _load("triton_mma")
    assert len(mma.MUTANTS) >= 6
    ids = set()
    for name, what in mma.MUTANTS.items():
        fn = getattr(mma, "mutant_" + name.replace("-", "_"))
        info = fn.__mlafuzz_kernel__
        assert info.name == "triton-mma." + name and info.precision == "bf16_mma"
        assert what and what in info.description
        ids.add(mma._MUTANT_IDS[name])
    assert len(ids) == len(mma.MUTANTS) and 0 not in ids


def test_jit_module_names_every_mutant_id():
    # The MUTANT constants of the JIT module match the front module's ids (read as text: the
    # JIT module imports triton).
    mma = _load("triton_mma")
    text = open(os.path.join(KDIR, "mla_triton_jit.py"), encoding="utf-8").read()
    for name, mid in mma._MUTANT_IDS.items():
        const = "M_" + name.upper().replace("-", "_")
        assert f"{const} = tl.constexpr({mid})\n" in text, const
        assert f"MUTANT == {const}" in text, f"{const} is declared but never planted"


@pytest.mark.skipif(_has("triton"), reason="triton is installed here")
def test_unavailable_names_triton_when_it_is_missing():
    common = _load("mla_triton")
    why = common.unavailable()
    assert why is not None and "triton" in why


@pytest.mark.skipif(_has("torch") and _has("triton"), reason="torch and triton are installed")
def test_list_backends_says_why_triton_backends_are_unavailable():
    proc = mlafuzz_cmd("list-backends")
    assert proc.returncode == 0, proc.stdout
    for name in ("triton-simt", "triton-mma"):
        rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(name + " ")]
        assert rows and "unavailable" in rows[0], proc.stdout
    reasons = [ln.strip() for ln in proc.stdout.splitlines()
               if ln.strip().startswith("unavailable:")]
    joined = "\n".join(reasons)
    missing = [m for m in ("torch", "triton") if not _has(m)]
    for m in missing:
        assert m in joined, f"no reason names {m}:\n{proc.stdout}"
    # found relative to the mlafuzz tree, not the working directory (cwd is /)
    assert "not found" not in joined, proc.stdout


@pytest.mark.skipif(_has("torch") and _has("triton"), reason="torch and triton are installed")
def test_run_with_an_unavailable_triton_backend_fails_with_the_reason():
    proc = mlafuzz_cmd("run", "--case", CASE, "--backends", "triton-mma")
    assert proc.returncode == 1, proc.stdout
    assert "triton-mma" in proc.stdout and "not available" in proc.stdout, proc.stdout


def test_unknown_triton_mutant_is_refused_naming_the_declared_ones():
    proc = mlafuzz_cmd("run", "--case", CASE, "--backends", "triton-mma~no-such-bug")
    assert proc.returncode == 2, proc.stdout
    assert "declares no mutant 'no-such-bug'" in proc.stdout, proc.stdout
    assert "no-rescale" in proc.stdout and "sink-ignored" in proc.stdout, proc.stdout


def test_triton_mutant_resolves_to_the_shipped_file():
    proc = mlafuzz_cmd("list-backends", "--backends", "triton-mma~no-rescale")
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("triton-mma~no-rescale"), proc.stdout


STAND_IN = '''
import sys
sys.path.insert(0, {examples!r})
import mlafuzz
import numpy_decode

ENVELOPE = mlafuzz.Envelope(layouts=["model1"], nope_dim=[448], s_q=[1],
                            refuses=["extra_cache", "extra_topk_length"])
supports = numpy_decode.supports


@mlafuzz.kernel(name="stand-in", precision="fp32_simt", device="cpu", envelope=ENVELOPE)
def decode(call):
    numpy_decode.decode(call)
'''


def test_the_alias_carries_the_kernels_envelope_into_a_campaign(tmp_path):
    # A CPU stand-in for triton_mma.py (MLAFUZZ_TRITON_DIR): the campaign on the alias must
    # generate inside the envelope the module declares. (The H200 campaign on triton-mma drew
    # s_q > 1 and extra-cache cases it refuses when the alias dropped the envelope.)
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    (kdir / "triton_mma.py").write_text(
        STAND_IN.format(examples=os.path.join(ROOT, "examples", "python")))
    env = dict(os.environ, MLAFUZZ_TRITON_DIR=str(kdir))
    proc = subprocess.run(
        [mlafuzz.testing.find_mlafuzz(), "fuzz", "--backends", "triton-mma", "--cases", "6",
         "--jobs", "1", "--progress", "plain", "--corpus", str(tmp_path / "c"),
         "--report", str(tmp_path / "r")],
        cwd="/", env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    assert proc.returncode == 0, proc.stdout
    assert ("generating inside the envelope: layouts model1; nope_dim {448}; s_q {1}"
            in proc.stdout), proc.stdout
    run = [line.split() for line in proc.stdout.splitlines()
           if line.split()[:2] == ["triton-mma", "run"]]
    # backend, property, cases, n/a, failures: every case applicable and passing.
    assert run and run[0][2:5] == ["6", "0", "0"], proc.stdout


MUTANT_STAND_IN = '''
import sys
sys.path.insert(0, {examples!r})
import mlafuzz
import numpy_decode
from kernels.triton.mla_triton import ENVELOPE, supports  # triton-mma's envelope and refusals

MUTANTS = {{"wrong-scale-group": "the last nope tile takes the previous tile's scale"}}


@mlafuzz.kernel(name="triton-mma", precision="fp32_simt", device="cpu", envelope=ENVELOPE)
def decode(call):
    numpy_decode.decode(call)


@mlafuzz.kernel(name="triton-mma.wrong-scale-group", precision="fp32_simt", device="cpu",
                envelope=ENVELOPE)
def mutant_wrong_scale_group(call):
    numpy_decode.attend(call, mutant="wrong-scale-group")
'''


def test_wrong_scale_group_is_killed_within_the_h200_runs_case_budget(tmp_path):
    # The alias must forward the kernel's envelope: without it most cases are s_q > 1 or
    # extra-cache ones the kernel refuses, and wrong-scale-group survives the 24 cases of
    # `mlafuzz mutants --backends triton-mma` on the H200. Through the alias, with
    # triton-mma's real ENVELOPE and supports() and a numpy stand-in of the same bug, the same
    # seed and the same 24 cases must kill it (seed 1: the third case; seeds 1-8: 2-14 cases).
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    (kdir / "triton_mma.py").write_text(MUTANT_STAND_IN.format(
        examples=os.path.join(ROOT, "examples", "python")))
    env = dict(os.environ, MLAFUZZ_TRITON_DIR=str(kdir),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    report = tmp_path / "mutants.json"
    proc = subprocess.run(
        [mlafuzz.testing.find_mlafuzz(), "mutants", "--backends", "triton-mma", "--seed", "1",
         "--max-cases", "24", "--shrink-evals", "40", "--json", str(report)],
        cwd="/", env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        check=False)
    assert proc.returncode == 0, proc.stdout
    import json  # noqa: PLC0415

    (m,) = json.loads(report.read_text())["mutants"]
    assert m["mutant"] == "wrong-scale-group" and m["status"] == "killed", proc.stdout
    assert m["property"] == "tolerance" and m["case_index"] < 24, m


def test_split_plan_depends_on_topk_only_and_tiles_the_row():
    common = _load("mla_triton")
    assert common.split_plan(512, 128, 32) == (128, 4)
    assert common.split_plan(500, 100, 32) == (128, 4)  # rounded up to whole token tiles
    assert common.split_plan(77, 128, 32) == (96, 1)  # one split: no workspace, no combine
    assert common.split_plan(512, None, 32) == (512, 1)
    assert common.split_plan(1, 128, 16) == (16, 1)
    for topk in (1, 33, 128, 129, 512, 2048):
        for tile in (common.MMA_BLOCK_N, common.MMA2_BLOCK_N):
            split_len, n = common.split_plan(topk, common.SPLIT_TOKENS, tile)
            assert split_len % tile == 0 and (n - 1) * split_len < topk <= n * split_len


def test_fast_path_needs_16_byte_rows_and_a_power_of_two_scale_tile():
    common = _load("mla_triton")

    class Cache:
        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr

    ok = _call(page_size=64, page_stride=64 * 584, kv_cache=Cache(256))
    assert common.fast_path_ok(ok, 576)
    assert not common.fast_path_ok(dataclasses.replace(ok, page_stride=61 * 584), 576)
    assert not common.fast_path_ok(dataclasses.replace(ok, kv_cache=Cache(264)), 576)
    assert not common.fast_path_ok(ok, 584)  # row bytes
    assert not common.fast_path_ok(dataclasses.replace(ok, scale_tile=48, nope_dim=480), 608)
