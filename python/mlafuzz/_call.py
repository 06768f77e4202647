"""Host calls: the bf16 output array kernels write, and a call built from a ``run --dump``."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

#: Elements of canaries before and after each output buffer (OutputBuffers::kGuard of
#: core/backend.h, which the worker's calls have too).
GUARD = 64
OUT_CANARY = 0x7FA5  # a bf16 NaN with a recognisable payload
LSE_CANARY = 0x7FA5A5A5


def _floating(value: Any) -> str:
    """The name of value's dtype when it holds non-integer numbers (floats, complex), else ""."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        dtype = np.asarray(value).dtype
    try:
        kind = np.dtype(dtype).kind
    except TypeError:  # a torch dtype, e.g. torch.bfloat16
        name = str(dtype)
        return name if "float" in name or "complex" in name else ""
    return str(np.dtype(dtype)) if kind in "fc" else ""


class Bf16Bits(np.ndarray):
    """``call.out`` on the host: bf16 bit patterns (uint16).

    Assigning floating-point values is an error (numpy would cast them to integers and store
    those as bits, silently): convert with :func:`mlafuzz.float32_to_bf16` first.
    """

    def __setitem__(self, key: Any, value: Any) -> None:
        name = _floating(value)
        if name:
            raise TypeError(
                f"call.out holds bf16 bit patterns (uint16); writing {name} values would store "
                "them converted to integers: write call.out[...] = mlafuzz.float32_to_bf16(x)")
        super().__setitem__(key, value)

    def fill(self, value: Any) -> None:
        self[...] = value


def host_out(a: np.ndarray) -> np.ndarray:
    """``a`` (a uint16 view) as the out array a host kernel gets: floats written into it raise."""
    return a.view(Bf16Bits)


def _view(raw: np.ndarray, shape: Tuple[int, ...], strides: Tuple[int, ...],
          offset: int = 0) -> np.ndarray:
    """A strided view of ``raw`` (element strides and offset)."""
    item = raw.itemsize
    return np.ndarray(shape, dtype=raw.dtype, buffer=raw, offset=offset * item,
                      strides=tuple(s * item for s in strides))


def _token_shape(fields: Dict[str, Any], rest: Tuple[int, ...], batch_stride: int,
                 token_stride: int, rest_strides: Tuple[int, ...]
                 ) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """[B, (s_q,) ...] and its element strides: the token axis when s_q > 1, as the worker."""
    if int(fields["s_q"]) > 1:
        return ((fields["batch"], fields["s_q"]) + rest,
                (batch_stride, token_stride) + rest_strides)
    return (fields["batch"],) + rest, (batch_stride,) + rest_strides


def arrays_from_dump(fields: Dict[str, Any], arrays: Dict[str, np.ndarray]
                     ) -> Dict[str, np.ndarray]:
    """The call's arrays from a dump's .npy files, laid out with the call's strides as the
    worker lays them out (docs/WORKER_PROTOCOL.md): q, kv_cache, indices, the optional ones,
    out and lse, views into q_raw, indices_raw, extra_indices_raw, out_raw and lse_raw (the
    whole buffers, gaps included); inputs read-only, outputs filled with canaries."""
    f = fields
    H = int(f["heads"])
    a: Dict[str, np.ndarray] = {}
    q_raw = np.array(arrays["q_raw"], dtype=np.uint16)
    shape, strides = _token_shape(f, (H, int(f["d_qk"])), int(f["q_batch_stride"]),
                                  int(f["q_token_stride"]), (int(f["q_head_stride"]), 1))
    a["q_raw"], a["q"] = q_raw, _view(q_raw, shape, strides)
    a["kv_cache"] = np.array(arrays["kv_cache"], dtype=np.uint8)
    idx_raw = np.array(arrays["indices_raw"], dtype=np.int32)
    shape, strides = _token_shape(f, (int(f["topk"]),), int(f["indices_batch_stride"]),
                                  int(f["indices_token_stride"]), (1,))
    a["indices_raw"], a["indices"] = idx_raw, _view(idx_raw, shape, strides)
    for name in ("topk_length", "sink", "extra_kv_cache", "extra_topk_length"):
        if name in arrays:
            a[name] = np.array(arrays[name])
    if f.get("has_extra"):
        x_raw = np.array(arrays["extra_indices_raw"], dtype=np.int32)
        shape, strides = _token_shape(f, (int(f["extra_topk"]),),
                                      int(f["extra_indices_batch_stride"]),
                                      int(f["extra_indices_token_stride"]), (1,))
        a["extra_indices_raw"], a["extra_indices"] = x_raw, _view(x_raw, shape, strides)
    for x in a.values():
        x.flags.writeable = False
    B = int(f["batch"])
    out_raw = np.full(2 * GUARD + B * int(f["out_batch_stride"]), OUT_CANARY, dtype=np.uint16)
    shape, strides = _token_shape(f, (H, int(f["d_v"])), int(f["out_batch_stride"]),
                                  int(f["out_token_stride"]), (int(f["out_head_stride"]), 1))
    a["out_raw"], a["out"] = out_raw, _view(out_raw, shape, strides, GUARD)
    lse_raw = np.full(2 * GUARD + B * int(f["lse_batch_stride"]), LSE_CANARY,
                      dtype=np.uint32).view(np.float32)
    shape, strides = _token_shape(f, (H,), int(f["lse_batch_stride"]),
                                  int(f["lse_token_stride"]), (1,))
    a["lse_raw"], a["lse"] = lse_raw, _view(lse_raw, shape, strides, GUARD)
    return a
