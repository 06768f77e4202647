"""A kernel whose supports() logs every call (tests/python/test_supports_cache.py).

numpy_decode's fp32 pipeline; supports() appends every scalar field it was asked about (one
line per call) to the file named by SUPPORTS_LOG, and refuses cases of more than 4 heads, so
that the test sees how often mlafuzz asks and that a refusal is still a refusal.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import mlafuzz

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    with open(os.environ["SUPPORTS_LOG"], "a", encoding="utf-8") as log:
        fields = sorted((k, v) for k, v in vars(call).items() if isinstance(v, (int, float, str)))
        log.write(repr(fields) + "\n")
    if call.heads > 4:
        return f"this kernel takes at most 4 heads, not {call.heads}"
    return numpy_decode.supports(call)


@mlafuzz.kernel(name="logged-supports", precision="fp32_simt")
def decode(call: mlafuzz.DecodeCall) -> None:
    numpy_decode.attend(call)
