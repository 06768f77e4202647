"""mlafuzz for kernels written in Python (numpy, PyTorch, Triton, CuPy).

A kernel is a function decorated with :func:`kernel`; the ``mlafuzz`` executable runs it in a
worker process (``python -m mlafuzz._worker``) as the backend ``python:path/to/file.py:func`` or
``python:package.module:func``, with every property, shrinking, corpus and repro::

    import mlafuzz

    @mlafuzz.kernel(name="my-mma", precision="bf16_mma", device="cuda")
    def decode(call):
        ...  # computes call.out and call.lse in place; returns None

The call's fields mirror ``MlafuzzDecodeCall`` of include/mlafuzz/plugin.h (see
:class:`DecodeCall`). Only numpy is needed; torch is imported by the worker when a kernel
declares ``device="cuda"``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Dict, Optional, Union

import numpy as np

__version__ = "0.1.0"

#: Version of the protocol between the mlafuzz executable and the worker
#: (docs/WORKER_PROTOCOL.md). Both ends refuse a peer of another version.
PROTOCOL_VERSION = 2

__all__ = [
    "DecodeCall",
    "Dump",
    "KernelInfo",
    "PROTOCOL_VERSION",
    "Tolerance",
    "bf16_to_float32",
    "float32_to_bf16",
    "kernel",
    "load_dump",
]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Explicit tolerances (the plugin ABI's custom precision).

    An element passes when ``|a - r| <= abs`` or ``|a - r| <= rel * |r|``.
    """

    abs: float
    rel: float

    def __post_init__(self) -> None:
        ok = self.abs >= 0 and self.rel >= 0 and self.abs + self.rel > 0
        if not ok:  # also rejects NaN
            raise ValueError(
                f"mlafuzz.Tolerance(abs={self.abs!r}, rel={self.rel!r}): both must be >= 0 and "
                "not both 0; e.g. mlafuzz.Tolerance(abs=1e-3, rel=1e-2)"
            )


_PRECISIONS = ("bf16_mma", "fp32_simt")
_DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """What :func:`kernel` records on the decorated function (``func.__mlafuzz_kernel__``)."""

    name: str
    precision: str  # "bf16_mma", "fp32_simt" or "custom"
    abs_tol: float
    rel_tol: float
    device: str  # "cpu" or "cuda"
    description: str


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


def kernel(
    *,
    name: str,
    precision: Union[str, Tolerance] = "fp32_simt",
    device: str = "cpu",
    description: Optional[str] = None,
) -> Callable[[Callable[["DecodeCall"], None]], Callable[["DecodeCall"], None]]:
    """Declares a function as an mlafuzz kernel; returns the function unchanged.

    Args:
        name: short name, letters, digits, ``.``, ``_`` and ``-`` (shown by list-backends).
        precision: ``"bf16_mma"`` (bf16 q and K, fp32 accumulation, bf16 p for P*V),
            ``"fp32_simt"`` (fp32 throughout) or ``mlafuzz.Tolerance(abs=..., rel=...)``. It
            selects the per-element error bound the tolerance property applies.
        device: ``"cpu"`` (the call's arrays are numpy arrays) or ``"cuda"`` (torch tensors on
            the current device; torch is imported only then).
        description: one line for list-backends (default: the docstring's first line).
    """
    if not _valid_name(name):
        raise ValueError(
            f"mlafuzz.kernel(name={name!r}): use letters, digits, '.', '_' and '-' only"
        )
    if isinstance(precision, Tolerance):
        prec, abs_tol, rel_tol = "custom", float(precision.abs), float(precision.rel)
    elif precision in _PRECISIONS:
        prec, abs_tol, rel_tol = str(precision), 0.0, 0.0
    else:
        raise ValueError(
            f"mlafuzz.kernel(precision={precision!r}): use 'bf16_mma', 'fp32_simt' or "
            "mlafuzz.Tolerance(abs=..., rel=...)"
        )
    if device not in _DEVICES:
        raise ValueError(f"mlafuzz.kernel(device={device!r}): use 'cpu' or 'cuda'")

    def wrap(func: Callable[["DecodeCall"], None]) -> Callable[["DecodeCall"], None]:
        if not callable(func):
            raise TypeError("@mlafuzz.kernel(...) decorates a function taking one call argument")
        doc = description
        if doc is None:
            lines = (func.__doc__ or "").strip().splitlines()
            doc = lines[0].strip() if lines else ""
        func.__mlafuzz_kernel__ = KernelInfo(  # type: ignore[attr-defined]
            name, prec, abs_tol, rel_tol, device, doc
        )
        return func

    return wrap


@dataclasses.dataclass
class DecodeCall:
    """One decode call: the fields of ``MlafuzzDecodeCall`` (include/mlafuzz/plugin.h).

    Scalars keep the C names; enumerations are strings. Arrays are numpy arrays for
    ``device="cpu"`` and torch tensors on the current CUDA device for ``device="cuda"``; in
    ``supports(call)`` every array is None (decide from the sizes only).

    Arrays (B = batch, H = heads):
        q: ``[B, H, d_qk]`` bf16 bits, numpy uint16 (torch.bfloat16 on cuda); a strided view
            when the case pads heads (``q_head_stride > d_qk``).
        kv_cache: ``[num_pages, page_stride]`` uint8, the paged FP8 cache (SPEC.md section 2).
        indices: ``[B, topk]`` int32 global slots (page = idx // page_size).
        topk_length: ``[B]`` int32, or None (every top-k entry counts).
        sink: ``[H]`` float32 sink logits (may hold +inf or -inf), or None.
        The inputs (q, kv_cache, indices, topk_length, sink) are read-only.
        out: ``[B, H, d_v]`` bf16 bits, written; a view into the guarded output buffer (the
            elements between heads are canaries: never write them).
        lse: ``[B, H]`` float32 natural-log LSE, written.
    """

    layout: str  # "model1" or "v32"
    nope_dim: int
    rope_dim: int
    scale_tile: int
    page_size: int
    num_pages: int
    page_stride: int
    kv_cache_bytes: int
    token_bytes: int
    d_qk: int
    d_v: int
    invalid_index_rule: str  # "minus_one_only" or "any_negative"
    empty_row_lse: str  # "+inf" or "-inf"
    sink_in_lse: bool
    batch: int
    heads: int
    topk: int
    sm_scale: float  # the fp32 value, exactly
    memory: str = "host"  # "host" (numpy) or "device" (torch tensors on cuda)
    q_head_stride: int = 0  # elements
    q_batch_stride: int = 0
    indices_batch_stride: int = 0
    out_head_stride: int = 0
    out_batch_stride: int = 0
    lse_batch_stride: int = 0
    has_topk_length: bool = False
    has_sink: bool = False
    q: Any = None
    kv_cache: Any = None
    indices: Any = None
    topk_length: Any = None
    sink: Any = None
    out: Any = None
    lse: Any = None
    stream: Any = None  # torch.cuda.current_stream() on cuda, None on cpu


def bf16_to_float32(a: Any) -> np.ndarray:
    """bf16 bits -> float32, exactly.

    Args:
        a: uint16 (or int16) array of bf16 bit patterns, any shape.
    Returns:
        float32 array of the same shape.
    """
    bits = np.asarray(a).astype(np.uint32, copy=False)
    return (bits << np.uint32(16)).view(np.float32)


def float32_to_bf16(a: Any) -> np.ndarray:
    """float32 -> bf16 bits, rounding to nearest even (NaN stays a quiet NaN).

    Args:
        a: float array, any shape (converted to float32 first).
    Returns:
        uint16 array of the same shape holding bf16 bit patterns.
    """
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (u >> np.uint32(16)) | np.uint32(0x40)
    return np.where(nan, quiet, rounded).astype(np.uint16)


@dataclasses.dataclass
class Dump:
    """A ``mlafuzz run --dump DIR`` folder.

    Attributes:
        arrays: every ``*.npy`` by file stem: ``q`` uint16 ``[B, H, q_head_stride]`` (bf16
            bits), ``kv_cache`` uint8 ``[num_pages, page_stride]``, ``indices`` int32
            ``[B, topk]``, optional ``topk_length`` int32 ``[B]`` and ``sink`` float32 ``[H]``,
            ``out``/``lse`` float32 (the oracle, ``out64``/``lse64`` float64) and
            ``out_<backend>``/``lse_<backend>`` for every backend that ran.
        params: params.json (geometry with page_stride resolved, batch, heads, topk, d_qk,
            d_v, q_head_stride, sm_scale, conventions, content_hash).
        case: case.json, the recipe.
    """

    arrays: Dict[str, np.ndarray]
    params: Dict[str, Any]
    case: Dict[str, Any]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]


def load_dump(directory: Union[str, "os.PathLike[str]"]) -> Dump:
    """Reads a ``mlafuzz run --dump DIR`` folder as numpy arrays plus its params.

    Raises:
        FileNotFoundError: the folder has no params.json (write one with
            ``mlafuzz run --case CASE --dump DIR``).
    """
    d = os.fspath(directory)
    params_path = os.path.join(d, "params.json")
    if not os.path.isfile(params_path):
        raise FileNotFoundError(
            f"{d}: no params.json; write a dump with: mlafuzz run --case CASE.json --dump {d}"
        )
    with open(params_path, encoding="utf-8") as f:
        params = json.load(f)
    case: Dict[str, Any] = {}
    case_path = os.path.join(d, "case.json")
    if os.path.isfile(case_path):
        with open(case_path, encoding="utf-8") as f:
            case = json.load(f)
    arrays = {
        name[: -len(".npy")]: np.load(os.path.join(d, name))
        for name in sorted(os.listdir(d))
        if name.endswith(".npy")
    }
    return Dump(arrays, params, case)


def __getattr__(name: str) -> Any:
    # mlafuzz.testing on first use, so that importing mlafuzz stays cheap.
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'mlafuzz' has no attribute {name!r}")
