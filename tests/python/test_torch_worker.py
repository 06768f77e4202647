"""The device="cuda" worker with real torch on a GPU (skipped where torch or CUDA is missing).

test_device_cache.py drives the worker's copy logic with a fake torch; this file runs the same
paths for real: the device cache's checksums (a kernel writing its input is named, on the first
call and on a warm one), the outputs by DMA into fd 3, and the torch example under every
property. CI has no torch: scripts/gpu_python.sh runs it on the H200.
"""

from __future__ import annotations

import os

import pytest

import mlafuzz.testing
from conftest import ROOT, SMALL_CASE, describe, mlafuzz_cmd

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

KERNELS = "python:tests/python/torch_kernels.py"
EXAMPLE = "python:examples/python/torch_decode.py:decode"


# Inputs reach the device cache through the shared arena, which holds blocks of 64 KiB and more:
# this case's cache is 150 KB (small_case.json's would be copied on every call, never cached).
ARENA_CASE = os.path.join(ROOT, "corpus", "cases", "model1_b1_topk128.json")


def test_a_kernel_writing_its_cached_input_is_named() -> None:
    # The first call on a case: the "before" checksum is still a device tensor.
    proc = mlafuzz_cmd("run", "--case", ARENA_CASE, "--backends", f"{KERNELS}:decode_writes_cache")
    assert proc.returncode == 1, describe(proc)
    assert "wrote its input(s) kv_cache on the device" in proc.stdout, describe(proc)


def test_a_write_on_a_cache_hit_is_named_too(tmp_path) -> None:
    # determinism reruns the case: the second call hits the cache (its checksum an int by then).
    with pytest.raises(AssertionError) as failure:
        mlafuzz.testing.fuzz(f"{KERNELS}:decode_writes_cache_later", cases=1, seed=5, jobs=1,
                             properties=["determinism"], shrink_time="0",
                             report=str(tmp_path / "report"))
    assert "fails determinism" in str(failure.value), str(failure.value)
    report = (tmp_path / "report" / "report.json").read_text()
    assert "wrote its input(s) kv_cache on the device" in report, report[:2000]


def test_a_kernel_writing_nothing_but_outputs_passes() -> None:
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{KERNELS}:decode_zeros")
    assert "wrote its input" not in proc.stdout, describe(proc)
    assert "FAULT" not in proc.stdout, describe(proc)


def test_the_torch_example_passes_every_property() -> None:
    mlafuzz.testing.fuzz(EXAMPLE, time="60s", cases=60, seed=31, jobs=4)


@pytest.mark.parametrize("sizes", [[1], [7, 1000], [2_600_003, 300_000, 5], [3, 1, 4, 1, 5]])
def test_the_driver_checksum_kernel_sums_as_torch_does(sizes) -> None:
    from mlafuzz.worker.driver import CudaDriver  # noqa: PLC0415

    cu = CudaDriver.load()
    if cu is None:
        pytest.skip("no libcuda.so.1 or MLAFUZZ_CUDA_DRIVER=0")
    gen = torch.Generator(device="cuda").manual_seed(len(sizes))
    words = [torch.randint(-(1 << 62), 1 << 62, (n,), generator=gen, device="cuda",
                           dtype=torch.int64) * 3 for n in sizes]  # * 3: sums that wrap
    dst = torch.full((len(sizes) + 1,), 0x5A5A, dtype=torch.int64, device="cuda")
    stream = int(torch.cuda.current_stream().cuda_stream)
    assert cu.sum64([(w.data_ptr(), w.numel()) for w in words], dst.data_ptr(), stream), \
        cu.sum_error
    torch.cuda.synchronize()
    assert dst[:-1].tolist() == [int(torch.sum(w)) for w in words]
    assert int(dst[-1]) == 0x5A5A, "nothing past the sums written"
