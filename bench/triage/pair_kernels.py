"""Two planted bugs of the numpy example in one kernel (bench/triage/measure_groups.py).

Backend ``python:bench/triage/pair_kernels.py:decode~<a>+<b>`` runs numpy_decode's fp32 pipeline
with both planted bugs ``a`` and ``b`` of its MUTANTS: two distinct bugs that a campaign must
report as two findings.
"""

from __future__ import annotations

import itertools
import os
import sys

import mlafuzz

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402


class _Both(str):
    """A mutant name equal to either of two: numpy_decode.attend tests ``mutant == name``."""

    names: frozenset

    def __new__(cls, a: str, b: str) -> "_Both":
        s = super().__new__(cls, f"{a}+{b}")
        s.names = frozenset((a, b))
        return s

    def __eq__(self, other: object) -> bool:
        return other in self.names

    def __ne__(self, other: object) -> bool:
        return other not in self.names

    __hash__ = str.__hash__


supports = numpy_decode.supports

MUTANTS = {
    f"{a}+{b}": f"{numpy_decode.MUTANTS[a]}; and {numpy_decode.MUTANTS[b]}"
    for a, b in itertools.combinations(numpy_decode.MUTANTS, 2)
}


@mlafuzz.kernel(name="numpy-fp32", precision="fp32_simt", device="cpu")
def decode(call: mlafuzz.DecodeCall) -> None:
    """The correct kernel."""
    numpy_decode.attend(call)


def _make(a: str, b: str):
    both = _Both(a, b)

    def run(call: mlafuzz.DecodeCall) -> None:
        numpy_decode.attend(call, mutant=both)

    return mlafuzz.kernel(name=f"numpy-fp32.{a}.{b}", precision="fp32_simt", device="cpu")(run)


for _a, _b in itertools.combinations(numpy_decode.MUTANTS, 2):
    globals()["mutant_" + f"{_a}+{_b}".replace("-", "_")] = _make(_a, _b)
del _a, _b
