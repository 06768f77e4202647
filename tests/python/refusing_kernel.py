"""A kernel whose supports() refuses every case (tests/python/test_pytest_helpers.py)."""

from __future__ import annotations

from typing import Optional

import mlafuzz


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    return "this kernel takes nothing (a test of 'nothing was tested')"


@mlafuzz.kernel(name="refuses-all", precision="fp32_simt")
def decode(call: mlafuzz.DecodeCall) -> None:
    """Never runs: supports() refuses every case."""
    raise AssertionError("supports() refuses every case")
