"""mlafuzz.replay (a kernel run in the test's process on a finding or a dump), the reference,
the decoding helpers and the guarded out array."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import mlafuzz
import mlafuzz.testing
from conftest import ROOT, SMALL_CASE, describe, mlafuzz_cmd

sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faulty_kernels  # noqa: E402
import numpy_decode  # noqa: E402

CASES = os.path.join(ROOT, "corpus", "cases")


def _dump(tmp_path, case: str, backends: str = "oracle") -> str:
    folder = str(tmp_path / os.path.basename(case).replace(".json", ""))
    proc = mlafuzz_cmd("run", "--case", case, "--backends", backends, "--dump", folder)
    assert proc.returncode in (0, 1), describe(proc)
    return folder


# The element `mlafuzz repro` reports: "out[b=0,h=0,d=76] value 2 (bf16 0x4000) ... error/bound X"
_REPORTED = re.compile(r"(out|lse)\[b=(\d+),h=(\d+)(?:,d=(\d+))?\] value \S+ \((?:bf16|fp32) "
                       r"0x([0-9a-f]+)\).* error/bound (\S+)")


def test_a_finding_replayed_in_process_fails_where_repro_says(tmp_path) -> None:
    corpus = str(tmp_path / "corpus")
    with pytest.raises(AssertionError):
        mlafuzz.testing.fuzz(numpy_decode.decode_planted_bug, cases=16, seed=3, jobs=2,
                             properties=["tolerance"], corpus=corpus)
    entries = sorted(os.path.join(corpus, n) for n in os.listdir(corpus))
    assert entries
    backend = mlafuzz.testing.backend_name(numpy_decode.decode_planted_bug)
    for entry in entries[:3]:
        proc = mlafuzz_cmd("repro", entry, "--backends", backend)
        assert proc.returncode == 1, describe(proc)
        reported = _REPORTED.search(proc.stdout)
        assert reported, describe(proc)
        with pytest.raises(mlafuzz.ReplayFailure) as failure:
            mlafuzz.replay(entry, numpy_decode.decode_planted_bug)
        e = failure.value
        worst = e.worst
        assert worst is not None and e.first is not None, str(e)
        array, b, h, d, bits, ratio = reported.groups()
        assert (worst["array"], worst["b"], worst["h"]) == (array, int(b), int(h)), str(e)
        assert worst["d"] == (int(d) if d is not None else None), str(e)
        assert worst["bits"] == int(bits, 16), str(e)
        assert f"{worst['ratio']:.9g}" == ratio, (str(e), proc.stdout)
        # The worker's run of the case (in the dump) gave the same bits as this process, so the
        # first failing element is the same there too; it fails, and comes no later than the
        # worst in the check's order.
        assert e.result.worker_same_bits is True, str(e)
        assert e.first["ratio"] is None or e.first["ratio"] > 1, str(e)

        def order(x: dict) -> tuple:  # a row's out elements, then its lse
            return (x["row"], x["h"], x["d"] if x["d"] is not None else 1 << 30)

        assert order(e.first) <= order(worst), str(e)
        assert "first failing element: out[b=" in str(e) or "first failing element: lse[" in \
            str(e), str(e)


def test_a_dump_folder_replays_and_the_correct_kernel_passes(tmp_path) -> None:
    folder = _dump(tmp_path, SMALL_CASE)  # the oracle only: the kernel's bound is computed again
    result = mlafuzz.replay(folder, numpy_decode.decode)
    assert result.failing == 0 and result.first is None and 0 <= result.tightness < 1
    assert result.out.shape == result.dump["out64"].shape
    with pytest.raises(mlafuzz.ReplayFailure, match="first failing element: "):
        mlafuzz.replay(folder, numpy_decode.decode_planted_bug)


def test_an_exception_in_the_kernel_reaches_the_test(tmp_path) -> None:
    with pytest.raises(ValueError, match="planted exception at heads=3") as failure:
        mlafuzz.replay(SMALL_CASE, faulty_kernels.decode_raises)
    assert str(failure.traceback[-1].path).endswith("faulty_kernels.py")  # pdb stops there


def test_writes_outside_the_outputs_are_reported() -> None:
    with pytest.raises(mlafuzz.ReplayFailure, match="wrote outside its outputs: out"):
        mlafuzz.replay(SMALL_CASE, faulty_kernels.decode_writes_between_heads)


@pytest.mark.parametrize("case", [
    "edge_v32.json", "edge_sink_inf.json", "edge_any_negative.json", "edge_head_padding.json",
    "edge_p61_padded_permuted.json", "edge_topk_length.json", "edge_all_invalid.json",
    "edge_extra_shared_and_empty.json", "production_v4flash_s3_extra512.json"])
def test_reference_decode_is_the_oracle(tmp_path, case: str) -> None:
    folder = _dump(tmp_path, os.path.join(CASES, case))
    dump = mlafuzz.load_dump(folder)
    call = mlafuzz.load_call(folder)
    out, lse = mlafuzz.reference_decode(call)
    ref_out, ref_lse = dump["out64"], dump["lse64"]
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    for mine, ref in ((out, ref_out), (lse, ref_lse)):
        finite = np.isfinite(ref)
        assert np.array_equal(np.isfinite(mine), finite)
        assert np.array_equal(mine[~finite], ref[~finite], equal_nan=True)
        scale = max(float(np.abs(ref[finite]).max(initial=0)), 1.0)
        assert np.abs(mine[finite] - ref[finite]).max(initial=0) <= 1e-12 * scale, case


def test_dequantize_gives_the_keys_the_output_is_made_of(tmp_path) -> None:
    folder = _dump(tmp_path, os.path.join(CASES, "model1_b1_topk128.json"))
    dump, call = mlafuzz.load_dump(folder), mlafuzz.load_call(folder)
    k = mlafuzz.dequantize(call).astype(np.float64)  # [B, topk, d_qk]; exact: 2^e scales
    valid = mlafuzz.valid_entries(call)
    assert k.shape == (call.batch, call.topk, call.d_qk) and valid.shape == (call.batch, call.topk)
    assert not k[~valid].any()
    q = mlafuzz.bf16_to_float32(call.q).astype(np.float64)
    for b in range(call.batch):
        x = float(np.float32(call.sm_scale)) * (q[b] @ k[b][valid[b]].T)  # [H, n]
        w = np.exp(x - x.max(axis=1, keepdims=True))
        out = (w @ k[b][valid[b]][:, : call.d_v]) / w.sum(axis=1, keepdims=True)
        assert np.allclose(out, dump["out64"][b], rtol=1e-12, atol=1e-12)


def test_format_helpers() -> None:
    codes = np.array([0x00, 0x80, 0x01, 0x08, 0x38, 0x7E, 0xFE, 0x7F, 0xFF], dtype=np.uint8)
    got = mlafuzz.e4m3_to_float32(codes)
    want = [0.0, -0.0, 2.0**-9, 2.0**-6, 1.0, 448.0, -448.0]
    assert got.dtype == np.float32 and got[:7].tolist() == want and np.isnan(got[7:]).all()
    assert np.signbit(got[1])
    scales = mlafuzz.ue8m0_to_float32(np.array([127, 128, 0, 254, 255], dtype=np.uint8))
    assert scales[:4].tolist() == [1.0, 2.0, 2.0**-127, 2.0**127] and np.isnan(scales[4])


def test_out_takes_bf16_bits_only(tmp_path) -> None:
    call = mlafuzz.load_call(_dump(tmp_path, SMALL_CASE))
    call.out[...] = mlafuzz.float32_to_bf16(np.ones(call.out.shape, dtype=np.float32))
    call.out[0] = 0
    assert call.out[1, 0, 0] == 0x3F80 and call.out[0, 0, 0] == 0
    for write in (lambda: call.out.__setitem__(Ellipsis, np.zeros(call.out.shape)),
                  lambda: call.out[0].__setitem__(0, np.float32(1.5)),
                  lambda: call.out.fill(0.5)):
        with pytest.raises(TypeError, match=r"bf16 bit patterns \(uint16\).*float32_to_bf16"):
            write()
    with pytest.raises(ValueError, match="read-only"):
        call.q[0, 0, 0] = 1
