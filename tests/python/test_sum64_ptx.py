"""The checksum kernel's PTX (mlafuzz._sum64_ptx) assembles for the GPUs mlafuzz targets.

The driver JIT-compiles it on the GPU machine (test_torch_worker.py checks its sums against
torch.sum there); here ptxas, where the CUDA toolkit is installed, refuses it if it is not valid
PTX for sm_90 (H200) or sm_120 (RTX PRO 6000 Blackwell).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from mlafuzz._sum64_ptx import SUM64_ENTRY, SUM64_PTX


def _ptxas() -> str:
    found = shutil.which("ptxas")
    if found:
        return found
    default = "/usr/local/cuda/bin/ptxas"
    return default if os.access(default, os.X_OK) else ""


PTXAS = _ptxas()
if not PTXAS:  # every test skipped: pytest exits 5, ctest says skipped
    pytest.skip("no ptxas (CUDA toolkit) here", allow_module_level=True)


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_the_checksum_ptx_assembles(arch: str, tmp_path) -> None:
    src = tmp_path / "sum64.ptx"
    src.write_text(SUM64_PTX)
    proc = subprocess.run([PTXAS, f"-arch={arch}", "-v", str(src), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"Compiling entry function '{SUM64_ENTRY}' for '{arch}'" in proc.stderr, proc.stderr
    assert "0 bytes spill" in proc.stderr, proc.stderr
