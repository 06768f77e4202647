"""The planted-bug kernel of the install test (install_test.sh): the numpy example's fp32
pipeline with its last nope tile scaled by its neighbour's scale."""

import mlafuzz
import numpy_decode


@mlafuzz.kernel(name="my-kernel", precision="fp32_simt", device="cpu")
def decode(call: mlafuzz.DecodeCall) -> None:
    """numpy fp32 kernel with a planted bug (the wrong scale group)."""
    numpy_decode.attend(call, bug=True)


supports = numpy_decode.supports
