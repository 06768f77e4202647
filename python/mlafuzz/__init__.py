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
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

__version__ = "0.1.0"

#: Version of the protocol between the mlafuzz executable and the worker
#: (docs/WORKER_PROTOCOL.md). Both ends refuse a peer of another version.
PROTOCOL_VERSION = 3

__all__ = [
    "DecodeCall",
    "Dump",
    "Envelope",
    "KernelInfo",
    "Multiple",
    "PROTOCOL_VERSION",
    "Replay",
    "ReplayFailure",
    "Tolerance",
    "bf16_to_float32",
    "dequantize",
    "e4m3_to_float32",
    "float32_to_bf16",
    "kernel",
    "load_call",
    "load_dump",
    "reference_decode",
    "replay",
    "token_parts",
    "ue8m0_to_float32",
    "valid_entries",
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


@dataclasses.dataclass(frozen=True)
class Multiple:
    """The integers that are multiples of ``of`` (and within ``[min, max]`` when given).

    ``mlafuzz.Multiple(64)`` accepts 64, 128, 192, ...; ``mlafuzz.Multiple(16, max=64)`` accepts
    16, 32, 48 and 64.
    """

    of: int
    min: int = 0
    max: int = 0


#: What an integer field of an Envelope may be: one value, a list, a range or a Multiple.
IntSpec = Union[int, Sequence[int], range, Multiple]

_LAYOUTS = ("model1", "v32")
_INVALID_RULES = ("minus_one_only", "any_negative", "out_of_range")
_EMPTY_LSES = ("+inf", "-inf")
_V32_SCALES = ("power_of_two", "fp32")
_FEATURES = (
    "sink",
    "infinite_sink",
    "topk_length",
    "extra_cache",
    "extra_topk_length",
    "q_head_pad",
    "out_head_pad",
    "row_pad",
)
_INVARIANTS = ("batch", "head", "deterministic", "page_placement", "query")
_INT_FIELDS = (
    "nope_dim",
    "rope_dim",
    "scale_tile",
    "page_size",
    "batch",
    "heads",
    "topk",
    "s_q",
    "extra_topk",
    "extra_page_size",
)


def _int_set(field: str, v: IntSpec) -> Dict[str, Any]:
    """An IntSpec -> the envelope JSON's integer set (docs/WORKER_PROTOCOL.md)."""
    where = f"mlafuzz.Envelope({field}=...)"
    if isinstance(v, bool):
        raise TypeError(f"{where}: expected an int, a list, a range or mlafuzz.Multiple")
    if isinstance(v, int):
        v = [v]
    if isinstance(v, Multiple):
        if v.of < 1 or v.min < 0 or v.max < 0 or (v.max and v.min > v.max):
            raise ValueError(f"{where}: {v!r} needs of >= 1 and 0 <= min <= max")
        out: Dict[str, Any] = {"multiple_of": int(v.of)}
        if v.min:
            out["min"] = int(v.min)
        if v.max:
            out["max"] = int(v.max)
        return out
    if isinstance(v, range):
        if len(v) == 0 or v.step < 1 or v.start < 0:
            raise ValueError(f"{where}: {v!r} must be a non-empty ascending range of values >= 0")
        if v.step == 1 or v.start % v.step == 0:
            out = {"min": int(v.start), "max": int(v[-1])}
            if v.step > 1:
                out["multiple_of"] = int(v.step)
            return out
        v = list(v)
    values = [int(x) for x in v]
    if not values or any(x < 1 for x in values) or len(values) > 16:
        raise ValueError(f"{where}: a list of 1 to 16 values >= 1, got {values!r}")
    return {"values": values}


def _names(field: str, given: Iterable[str], known: Sequence[str]) -> List[str]:
    out = [str(x) for x in given]
    for x in out:
        if x not in known:
            raise ValueError(
                f"mlafuzz.Envelope({field}=...): unknown {x!r} (known: {', '.join(known)})"
            )
    if not out:
        raise ValueError(f"mlafuzz.Envelope({field}=[]) allows nothing; leave it out for 'any'")
    return out


@dataclasses.dataclass(frozen=True)
class Envelope:
    """What a kernel accepts; mlafuzz generates cases inside it (docs/plugins.md, "Envelopes").

    Every field left ``None`` accepts anything. Integer fields take an int, a list of ints, a
    ``range`` or :class:`Multiple`; e.g. a FlashMLA-like kernel::

        mlafuzz.Envelope(layouts=["model1"], nope_dim=[448], rope_dim=[64], heads=range(1, 65),
                         topk=mlafuzz.Multiple(64), page_stride_multiple=16,
                         invalid_index_rules=["minus_one_only"], empty_row_lses=["+inf"],
                         sink_in_lse=[False])

    ``invalid_index_rules`` left ``None`` means "minus_one_only" and "any_negative":
    "out_of_range" (any index outside the cache is an invalid entry, negative or >= the cache's
    slots) is offered only to a kernel that names it. ``v32_scales`` says which V32 scale
    conventions the kernel reads correctly ("power_of_two", "fp32": any positive finite float32,
    as vLLM writes amax / 448); ``None`` means both.

    ``refuses`` lists features the kernel cannot take: "sink", "infinite_sink", "topk_length",
    "extra_cache", "extra_topk_length", "q_head_pad", "out_head_pad", "row_pad". A kernel's
    ``supports()`` stays the final word.

    ``extra_cache=False`` is ``refuses=["extra_cache"]``; ``extra_cache=True`` says that the
    kernel takes one (nothing changes in what is generated, but ``mlafuzz.testing.fuzz`` then
    reports failures that need an extra cache as bugs, not as a missing declaration). ``s_q=1``
    declares a kernel that takes one query token per batch row.
    """

    layouts: Optional[Sequence[str]] = None
    nope_dim: Optional[IntSpec] = None
    rope_dim: Optional[IntSpec] = None
    scale_tile: Optional[IntSpec] = None
    page_size: Optional[IntSpec] = None
    page_stride_multiple: Optional[int] = None
    batch: Optional[IntSpec] = None
    heads: Optional[IntSpec] = None
    topk: Optional[IntSpec] = None
    s_q: Optional[IntSpec] = None
    extra_topk: Optional[IntSpec] = None
    extra_page_size: Optional[IntSpec] = None
    invalid_index_rules: Optional[Sequence[str]] = None
    empty_row_lses: Optional[Sequence[str]] = None
    sink_in_lse: Optional[Sequence[bool]] = None
    refuses: Optional[Sequence[str]] = None
    extra_cache: Optional[bool] = None
    v32_scales: Optional[Sequence[str]] = None

    def to_json(self) -> Dict[str, Any]:
        """The envelope JSON (the format of ``mlafuzz fuzz --envelope``); validates the fields."""
        j: Dict[str, Any] = {"format": "mlafuzz-envelope", "version": 1}
        if self.layouts is not None:
            j["layouts"] = _names("layouts", self.layouts, _LAYOUTS)
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if v is not None:
                j[f] = _int_set(f, v)
        if self.page_stride_multiple is not None:
            m = self.page_stride_multiple
            if isinstance(m, bool) or not isinstance(m, int) or m < 0:
                raise ValueError(f"mlafuzz.Envelope(page_stride_multiple={m!r}): an int >= 0")
            j["page_stride_multiple"] = m
        if self.invalid_index_rules is not None:
            j["invalid_index_rules"] = _names(
                "invalid_index_rules", self.invalid_index_rules, _INVALID_RULES
            )
        if self.empty_row_lses is not None:
            j["empty_row_lses"] = _names("empty_row_lses", self.empty_row_lses, _EMPTY_LSES)
        if self.v32_scales is not None:
            j["v32_scales"] = _names("v32_scales", self.v32_scales, _V32_SCALES)
        if self.sink_in_lse is not None:
            vals = list(self.sink_in_lse)
            if not vals or any(not isinstance(x, bool) for x in vals):
                raise ValueError(
                    f"mlafuzz.Envelope(sink_in_lse={self.sink_in_lse!r}): a list of booleans"
                )
            j["sink_in_lse"] = vals
        refuses = None if self.refuses is None else _names("refuses", self.refuses, _FEATURES)
        if self.extra_cache is not None and not isinstance(self.extra_cache, bool):
            raise ValueError(f"mlafuzz.Envelope(extra_cache={self.extra_cache!r}): True or False")
        if self.extra_cache is False:
            refuses = (refuses or []) + ([] if "extra_cache" in (refuses or [])
                                         else ["extra_cache"])
        elif self.extra_cache and refuses and "extra_cache" in refuses:
            raise ValueError("mlafuzz.Envelope(extra_cache=True, refuses=['extra_cache']) "
                             "contradicts itself")
        if refuses is not None:
            j["refuses"] = refuses
        return j


_PRECISIONS = ("bf16_mma", "fp32_simt")
_EXTRA_PIPELINES = ("joint", "lse_merged")
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
    envelope: Optional[Dict[str, Any]] = None  # Envelope.to_json(); None: accepts anything
    inexact: tuple = ()  # invariants not promised bit for bit ("batch", "head", ...)
    extra_pipeline: str = "joint"  # "joint" or "lse_merged" (how the extra cache is folded in)
    token_tile: int = 0  # tokens per online-softmax tile (BLOCK_N); 0: the precision's default
    extra_cache: Optional[bool] = None  # Envelope(extra_cache=...): declared either way, or None


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


def _kernel_precision(precision: Union[str, Tolerance]) -> Tuple[str, float, float]:
    """(precision name, abs_tol, rel_tol) of ``kernel(precision=...)``."""
    if isinstance(precision, Tolerance):
        return "custom", float(precision.abs), float(precision.rel)
    if precision in _PRECISIONS:
        return str(precision), 0.0, 0.0
    raise ValueError(
        f"mlafuzz.kernel(precision={precision!r}): use 'bf16_mma', 'fp32_simt' or "
        "mlafuzz.Tolerance(abs=..., rel=...)"
    )


def _check_pipeline_and_tile(extra_pipeline: str, token_tile: int) -> None:
    """Checks ``kernel(extra_pipeline=..., token_tile=...)``."""
    if extra_pipeline not in _EXTRA_PIPELINES:
        raise ValueError(
            f"mlafuzz.kernel(extra_pipeline={extra_pipeline!r}): use 'joint' or 'lse_merged'"
        )
    if isinstance(token_tile, bool) or not isinstance(token_tile, int) or token_tile < 0:
        raise ValueError(
            f"mlafuzz.kernel(token_tile={token_tile!r}): use a positive number of tokens, or 0 "
            "for the precision's default"
        )


def _kernel_inexact(inexact: Sequence[str]) -> Sequence[str]:
    """``kernel(inexact=...)`` as a sequence of known invariant names (one name alone too)."""
    if isinstance(inexact, str):
        inexact = [inexact]
    for inv in inexact:
        if inv not in _INVARIANTS:
            raise ValueError(
                f"mlafuzz.kernel(inexact=[{inv!r}]): unknown invariant (known: "
                f"{', '.join(_INVARIANTS)})"
            )
    return inexact


def _first_doc_line(func: Callable[..., Any]) -> str:
    """The first line of ``func``'s docstring ("" without one)."""
    lines = (func.__doc__ or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def kernel(
    *,
    name: str,
    precision: Union[str, Tolerance] = "fp32_simt",
    device: str = "cpu",
    description: Optional[str] = None,
    envelope: Optional[Envelope] = None,
    inexact: Sequence[str] = (),
    extra_pipeline: str = "joint",
    token_tile: int = 0,
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
        envelope: what the kernel accepts (:class:`Envelope`); cases are generated inside it.
        inexact: the invariants the kernel does NOT promise bit for bit: "batch" (a row alone
            gives the same bits), "head", "deterministic", "page_placement", "query". Those are
            checked within the tolerance bound instead (reported as bounded), never skipped.
        extra_pipeline: how the kernel folds the extra cache in (docs/SPEC.md section 8): "joint"
            (one online softmax over both lists, FlashMLA) or "lse_merged" (each list alone,
            stored in bf16 with its LSE, then merged and rounded again, SGLang's Triton path).
            It selects the extra-cache tolerance bound.
        token_tile: the tokens of one online-softmax tile of the kernel (its BLOCK_N): the
            tolerance bound counts one rescale of O and l per tile, so a kernel with shorter
            tiles than the precision's default (64 for "bf16_mma", 32 for "fp32_simt") declares
            its own. 0 keeps the default; ignored for a Tolerance.
    """
    if not _valid_name(name):
        raise ValueError(
            f"mlafuzz.kernel(name={name!r}): use letters, digits, '.', '_' and '-' only"
        )
    prec, abs_tol, rel_tol = _kernel_precision(precision)
    if device not in _DEVICES:
        raise ValueError(f"mlafuzz.kernel(device={device!r}): use 'cpu' or 'cuda'")
    if envelope is not None and not isinstance(envelope, Envelope):
        raise TypeError("mlafuzz.kernel(envelope=...): use mlafuzz.Envelope(...)")
    env_json = envelope.to_json() if envelope is not None else None
    _check_pipeline_and_tile(extra_pipeline, token_tile)
    inexact = _kernel_inexact(inexact)

    def wrap(func: Callable[["DecodeCall"], None]) -> Callable[["DecodeCall"], None]:
        if not callable(func):
            raise TypeError("@mlafuzz.kernel(...) decorates a function taking one call argument")
        doc = description if description is not None else _first_doc_line(func)
        func.__mlafuzz_kernel__ = KernelInfo(  # type: ignore[attr-defined]
            name, prec, abs_tol, rel_tol, device, doc, env_json, tuple(inexact), extra_pipeline,
            token_tile, envelope.extra_cache if envelope is not None else None,
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
        kv_cache: ``[num_pages, page_stride]`` uint8, the paged FP8 cache (docs/SPEC.md section 2).
        indices: ``[B, topk]`` int32 global slots (page = idx // page_size).
        topk_length: ``[B]`` int32, or None (every top-k entry counts).
        sink: ``[H]`` float32 sink logits (may hold +inf or -inf), or None.
        The inputs (q, kv_cache, indices, topk_length, sink) are read-only.
        out: ``[B, H, d_v]`` bf16 bits, written; a view into the guarded output buffer (the
            elements between heads are canaries: never write them).
        lse: ``[B, H]`` float32 natural-log LSE, written.

    The production decode (ABI version 2, docs/SPEC.md section 8): ``s_q`` query tokens per batch
    row and an optional extra cache, all in ONE softmax per (row, token, head) over the valid
    entries of both lists (a token in both counts twice). When ``s_q > 1``, q, indices, out and
    lse gain the token axis after the batch axis: ``[B, s_q, H, d_qk]``, ``[B, s_q, topk]``,
    ``[B, s_q, H, d_v]``, ``[B, s_q, H]`` (with ``s_q == 1`` they keep the shapes above);
    topk_length stays ``[B]``. With ``has_extra``: extra_kv_cache
    ``[extra_num_pages, extra_page_stride]`` uint8 (the main layout and dims, its own paging),
    extra_indices ``[B, (s_q,) extra_topk]`` int32 global slots of the extra cache
    (page = idx // extra_page_size), extra_topk_length ``[B]`` int32 or None. A kernel that
    handles neither returns a reason from ``supports(call)`` for ``call.s_q > 1`` or
    ``call.has_extra``.
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
    # "minus_one_only", "any_negative", or "out_of_range" (only where the envelope names it:
    # any index < 0 or >= page_size * num_pages of the list's cache is invalid)
    invalid_index_rule: str
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
    s_q: int = 1  # ABI version 2: query tokens per batch row
    q_token_stride: int = 0
    indices_token_stride: int = 0
    out_token_stride: int = 0
    lse_token_stride: int = 0
    has_extra: bool = False
    extra_page_size: int = 0
    extra_num_pages: int = 0
    extra_page_stride: int = 0
    extra_kv_cache_bytes: int = 0
    extra_topk: int = 0
    extra_indices_batch_stride: int = 0
    extra_indices_token_stride: int = 0
    has_extra_topk_length: bool = False
    q: Any = None
    kv_cache: Any = None
    indices: Any = None
    topk_length: Any = None
    sink: Any = None
    out: Any = None
    lse: Any = None
    extra_kv_cache: Any = None
    extra_indices: Any = None
    extra_topk_length: Any = None
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
            ``out_<backend>``/``lse_<backend>`` for every backend that ran, and
            ``bound_out_<backend>``/``bound_lse_<backend>`` float64, the tolerance property's
            bound of every listed backend ('/' in a name written '_'). With an extra cache
            also ``extra_kv_cache`` uint8 ``[pages, page_stride]``, ``extra_indices`` and
            optional ``extra_topk_length``. ``q_raw``, ``indices_raw`` (and
            ``extra_indices_raw``) are the whole buffers with their row gaps, as a kernel gets
            them (strides in params["call"]). When s_q > 1, q, indices, extra_indices, out and
            lse carry the token axis ``[B, s_q, ...]``; :meth:`tokens` gives it always.
        params: params.json (geometry with page_stride resolved, batch, s_q, heads, topk,
            d_qk, d_v, q_head_stride, sm_scale, conventions, content_hash; extra_geometry and
            extra_topk with an extra cache; ``call``: the scalar fields of a python: kernel's
            call, as the worker gets them).
        case: case.json, the recipe.
    """

    arrays: Dict[str, np.ndarray]
    params: Dict[str, Any]
    case: Dict[str, Any]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    @property
    def s_q(self) -> int:
        """Query tokens per batch row (1 for dumps of version-1 cases)."""
        return int(self.params.get("s_q", 1))

    def tokens(self, key: str) -> np.ndarray:
        """A [B, (s_q,) ...] array with the token axis always present: [B, s_q, ...]."""
        a = self.arrays[key]
        if self.s_q == 1 and key in _TOKEN_ARRAYS:
            return a.reshape((a.shape[0], 1) + a.shape[1:])
        return a


class _TokenNames:
    """Arrays of a dump with the token axis (when s_q > 1), every backend's outputs included."""

    def __contains__(self, key: object) -> bool:
        k = str(key)
        return k in ("q", "indices", "extra_indices") or k.startswith(("out", "lse", "bound_"))


_TOKEN_ARRAYS = _TokenNames()


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


# Helpers for kernel authors and the in-process replay (docs/python.md).
from mlafuzz._reference import (  # noqa: E402 - they use the definitions above
    dequantize, e4m3_to_float32, reference_decode, token_parts, ue8m0_to_float32, valid_entries)
from mlafuzz._replay import Replay, ReplayFailure, load_call, replay  # noqa: E402


def __getattr__(name: str) -> Any:
    # mlafuzz.testing on first use, so that importing mlafuzz stays cheap.
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'mlafuzz' has no attribute {name!r}")
