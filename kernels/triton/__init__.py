"""The shipped Triton kernels (triton-simt, triton-mma) as a package: ``kernels.triton``.

From the repository root, with the mlafuzz package importable::

    PYTHONPATH=python:. python3 -c "import kernels.triton.triton_mma"

The modules import each other relatively (``from .mla_triton import ...``). mlafuzz loads them
by path (``python:kernels/triton/triton_mma.py:decode``, the triton-* aliases): its worker
imports a file inside a package folder as a module of that package (python/mlafuzz/worker/
loader.py), under a private name, so this folder never shadows the ``triton`` library, and
without running this file. Keep it free of imports: loading one kernel does not load the other.
"""
