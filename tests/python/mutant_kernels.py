"""A kernel whose planted bugs crash or raise (tests/python/test_mutants.py): `mlafuzz mutants`
must score them as kills (a fault or error outcome of the "run" property) and go on.

``decode`` is the correct numpy kernel; each mutant misbehaves from two heads on, so that the
shrinker has a passing neighbour (one head) to stop at.
"""

from __future__ import annotations

import os
import sys

import mlafuzz

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402

MUTANTS = {
    "exits": "os._exit(3) from two heads on (the worker dies: a fault)",
    "raises": "raises ValueError from two heads on (an error outcome)",
}


@mlafuzz.kernel(name="mutant-host", precision="fp32_simt")
def decode(call: mlafuzz.DecodeCall) -> None:
    """The correct kernel (numpy_decode's fp32 pipeline)."""
    numpy_decode.attend(call)


@mlafuzz.kernel(name="mutant-host.exits", precision="fp32_simt")
def mutant_exits(call: mlafuzz.DecodeCall) -> None:
    """Planted bug: the worker exits."""
    if call.heads >= 2:
        os._exit(3)
    numpy_decode.attend(call)


@mlafuzz.kernel(name="mutant-host.raises", precision="fp32_simt")
def mutant_raises(call: mlafuzz.DecodeCall) -> None:
    """Planted bug: an exception."""
    if call.heads >= 2:
        raise ValueError("planted exception")
    numpy_decode.attend(call)
