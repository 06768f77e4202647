"""The framing of the worker protocol (docs/WORKER_PROTOCOL.md) and the parse of RUN requests."""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, Optional, Tuple

import numpy as np

import mlafuzz


FRAME_MAGIC = 0x57414C4D  # "MLAW", as the C++ worker protocol
HEADER = struct.Struct("<IIQ")
MSG_INFO, MSG_SUPPORTS, MSG_RUN, MSG_QUIT, MSG_ERROR = 1, 2, 3, 4, 5

_DTYPES = {"u1": np.uint8, "u2": np.uint16, "i4": np.int32, "f4": np.float32}


# ---- Frames ----


def _read_exact(fd: int, n: int) -> Optional[bytes]:
    chunks = []
    while n > 0:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_frame(fd: int) -> Optional[Tuple[int, bytes]]:
    """Returns (type, payload), or None at EOF."""
    h = _read_exact(fd, HEADER.size)
    if h is None:
        return None
    magic, kind, length = HEADER.unpack(h)
    if magic != FRAME_MAGIC:
        raise RuntimeError("bad frame magic from mlafuzz")
    payload = _read_exact(fd, length) if length else b""
    if payload is None:
        return None
    return kind, payload


def write_frame(fd: int, kind: int, payload: bytes) -> None:
    data = HEADER.pack(FRAME_MAGIC, kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _send_json(fd: int, kind: int, obj: Dict[str, Any]) -> None:
    write_frame(fd, kind, json.dumps(obj).encode())


def _send_run_reply(fd: int, reply: Dict[str, Any]) -> None:
    """A RUN reply; the common one (ok, no message) without json.dumps (the same bytes)."""
    if reply["status"] != "ok" or reply["message"] or len(reply) != 3:
        _send_json(fd, MSG_RUN, reply)
        return
    seconds = repr(float(reply["seconds"])).encode()
    write_frame(fd, MSG_RUN, b'{"status": "ok", "message": "", "seconds": %s}' % seconds)


# ---- Calls ----

_SCALARS = (
    "layout", "nope_dim", "rope_dim", "scale_tile", "page_size", "num_pages", "page_stride",
    "kv_cache_bytes", "token_bytes", "d_qk", "d_v", "invalid_index_rule", "empty_row_lse",
    "sink_in_lse", "batch", "heads", "topk", "sm_scale", "q_head_stride", "q_batch_stride",
    "indices_batch_stride", "out_head_stride", "out_batch_stride", "lse_batch_stride",
    "has_topk_length", "has_sink",
)
# ABI version 2 (docs/SPEC.md section 8): query tokens and the extra cache; absent from requests of
# an older mlafuzz (the defaults then mean s_q = 1, no extra cache).
_SCALARS_V2 = (
    "s_q", "q_token_stride", "indices_token_stride", "out_token_stride", "lse_token_stride",
    "has_extra", "extra_page_size", "extra_num_pages", "extra_page_stride",
    "extra_kv_cache_bytes", "extra_topk", "extra_indices_batch_stride",
    "extra_indices_token_stride", "has_extra_topk_length",
)


def scalar_fields(req: Dict[str, Any]) -> Dict[str, Any]:
    """The DecodeCall keyword arguments the request's scalars give."""
    fields = {k: req[k] for k in _SCALARS}
    fields.update({k: req[k] for k in _SCALARS_V2 if k in req})
    fields["sm_scale"] = float(np.float32(fields["sm_scale"]))
    fields["sink_in_lse"] = bool(fields["sink_in_lse"])
    return fields


def scalars_call(req: Dict[str, Any], memory: str) -> mlafuzz.DecodeCall:
    """The call with its scalar fields from the request and every array None."""
    return mlafuzz.DecodeCall(memory=memory, **scalar_fields(req))


class CallLayout:
    """The geometry part of a RUN request, parsed once and kept while it repeats.

    A protocol 3 RUN payload is two JSON documents on two lines (docs/WORKER_PROTOCOL.md): the
    first holds what depends only on the case's geometry (the scalars, the array descriptors with
    offsets relative to their buffer, the guards and canaries), the second what changes from call
    to call (where the arena-resident buffers start, their identities, the shared memory's size).
    Property variants and the calls of one campaign repeat the first line byte for byte, so the
    worker compares bytes instead of parsing it again.
    """

    def __init__(self, req: Dict[str, Any]) -> None:
        self.req = req
        self.fields = scalar_fields(req)
        # (name, offset, shape, strides, dtype, arena?, base name or None, writeable)
        self.arrays = []
        for name, desc in req["arrays"].items():
            arena = len(desc) > 4 and desc[4] == "arena"
            base = desc[5] if len(desc) > 5 else None
            self.arrays.append((name, int(desc[0]), tuple(desc[1]), tuple(desc[2]),
                                np.dtype(_DTYPES[desc[3]]), arena, base, name in _OUTPUTS))


def parse_run(payload: bytes, last: Optional[Tuple[bytes, CallLayout]]
              ) -> Tuple[Dict[str, Any], CallLayout, Optional[Tuple[bytes, CallLayout]]]:
    """(the whole request, its layout, the memo for the next call) of a RUN payload.

    Two lines: the layout line is parsed only when it differs from the last call's. One line
    (a single JSON object, as protocol 2 sent): parsed whole, nothing kept.
    """
    head, sep, tail = payload.partition(b"\n")
    if not sep:
        req = json.loads(payload)
        layout = CallLayout(req)
        return req, layout, last
    if last is not None and last[0] == head:
        layout = last[1]
    else:
        layout = CallLayout(json.loads(head))
        last = (head, layout)
    req = dict(layout.req)
    req.update(json.loads(tail))
    return req, layout, last


# The arrays a kernel writes; every other array is an input and read-only.
_OUTPUTS = frozenset(("out", "out_raw", "lse", "lse_raw"))
