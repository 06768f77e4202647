"""The worker process the ``mlafuzz`` executable starts for a ``python:`` backend.

    python -m mlafuzz._worker --backend SPEC --shm-fd FD [--arena-fd FD] [--protocol 3]

It loads the kernel named by SPEC (``path/to/file.py:func`` or ``package.module:func``), then
serves requests framed on stdin and answers on stdout (docs/WORKER_PROTOCOL.md); the arrays of
each call live in the shared memory passed as --shm-fd, or (inputs) in mlafuzz's shared arena
passed read-only as --arena-fd. Anything the kernel prints goes to stderr.
People do not start it; ``mlafuzz`` does.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import mmap
import os
import struct
import sys
import threading
import time
import traceback
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, Mapping, Optional, Tuple

import numpy as np

import mlafuzz
from mlafuzz import _settings
from mlafuzz._call import host_out
from mlafuzz._sum64_ptx import SUM64_BUFFERS, SUM64_ENTRY, SUM64_PTX, SUM64_THREADS

FRAME_MAGIC = 0x57414C4D  # "MLAW", as the C++ worker protocol
HEADER = struct.Struct("<IIQ")
MSG_INFO, MSG_SUPPORTS, MSG_RUN, MSG_QUIT, MSG_ERROR = 1, 2, 3, 4, 5

_DTYPES = {"u1": np.uint8, "u2": np.uint16, "i4": np.int32, "f4": np.float32}


class _TorchDtypes:
    """numpy dtype codes -> torch dtypes, resolved on first use (torch is imported lazily)."""

    def __getitem__(self, code: str) -> Any:
        import torch  # noqa: PLC0415 - only kernels on cuda need torch

        return {"u1": torch.uint8, "i2": torch.int16, "i4": torch.int32,
                "f4": torch.float32}[code]


_TORCH_DTYPES = _TorchDtypes()


class LoadError(Exception):
    """The backend cannot be served; the message says what to fix."""


def load_kernel(spec: str) -> Tuple[Callable[..., None], "mlafuzz.KernelInfo", Optional[Callable]]:
    """Resolves ``path/to/file.py:func`` or ``package.module:func``.

    Returns:
        (function, its KernelInfo, the module's ``supports`` or None).
    Raises:
        LoadError: no such file or module, no such function, or not decorated.
    """
    target, sep, func_name = spec.rpartition(":")
    if not sep or not target or not func_name:
        raise LoadError(
            f"python:{spec}: name the function after a colon: python:path/to/file.py:decode "
            "or python:package.module:decode"
        )
    try:
        if target.endswith(".py") or os.sep in target:
            path = os.path.abspath(target)
            if not os.path.isfile(path):
                raise LoadError(f"python:{spec}: no such file {path}")
            folder = os.path.dirname(path)
            if folder not in sys.path:
                sys.path.insert(0, folder)  # so that the kernel's own helpers import
            mod_name = "_mlafuzz_kernel_" + os.path.splitext(os.path.basename(path))[0]
            mod_spec = importlib.util.spec_from_file_location(mod_name, path)
            if mod_spec is None or mod_spec.loader is None:
                raise LoadError(f"python:{spec}: cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_name] = module
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(target)
    except LoadError:
        raise
    except ModuleNotFoundError as e:
        raise LoadError(
            f"python:{spec}: cannot import {target}: {e} (interpreter {sys.executable}; install "
            "the module, set PYTHONPATH, or name a file: python:path/to/file.py:func)"
        ) from e
    except BaseException as e:  # noqa: BLE001 - the module's import failed: tell why
        raise LoadError(
            f"python:{spec}: importing {target} failed:\n{traceback.format_exc()}"
        ) from e
    func_name, tilde, mutant = func_name.partition("~")
    if tilde:
        func_name = _mutant_function(spec, target, module, func_name, mutant)
    func = getattr(module, func_name, None)
    if func is None:
        names = sorted(
            n for n, v in vars(module).items() if hasattr(v, "__mlafuzz_kernel__")
        )
        raise LoadError(
            f"python:{spec}: {target} has no function {func_name!r}"
            + (f"; its kernels: {', '.join(names)}" if names else "")
        )
    info = getattr(func, "__mlafuzz_kernel__", None)
    if not isinstance(info, mlafuzz.KernelInfo):
        raise LoadError(
            f"python:{spec}: {func_name} is not an mlafuzz kernel; decorate it with "
            '@mlafuzz.kernel(name="...", precision="fp32_simt", device="cpu")'
        )
    supports = getattr(module, "supports", None)
    if supports is not None and not callable(supports):
        supports = None
    return func, info, supports


def declared_mutants(module: Any) -> Dict[str, str]:
    """The module's planted bugs: its ``MUTANTS`` dict (name -> description), or {}."""
    mutants = getattr(module, "MUTANTS", None)
    if not isinstance(mutants, dict):
        return {}
    return {str(k): str(v) for k, v in mutants.items()}


def mutant_function_name(mutant: str) -> str:
    """The function that implements a planted bug: ``mutant_<name, '-' written '_'>``."""
    return "mutant_" + mutant.replace("-", "_")


def _mutant_function(spec: str, target: str, module: Any, func: str, mutant: str) -> str:
    """``func~mutant`` -> the name of the function to load; LoadError for an unknown mutant.

    The convention (README, "Mutation score"): the module declares ``MUTANTS = {name:
    description}`` and one function ``mutant_<name>`` per planted bug, decorated as a kernel.
    """
    declared = declared_mutants(module)
    if not mutant:
        raise LoadError(f"python:{spec}: name the planted bug after '~' ({func}~<mutant>)")
    if mutant not in declared:
        known = ", ".join(declared) if declared else "none (the module has no MUTANTS dict)"
        raise LoadError(f"python:{spec}: {target} declares no mutant {mutant!r}; declared: {known}")
    name = mutant_function_name(mutant)
    if getattr(module, name, None) is None:
        raise LoadError(
            f"python:{spec}: {target} declares mutant {mutant!r} in MUTANTS but defines no "
            f"function {name}"
        )
    return name


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
# ABI version 2 (SPEC.md section 8): query tokens and the extra cache; absent from requests of
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
              ) -> Tuple[Dict[str, Any], CallLayout, Tuple[bytes, CallLayout]]:
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


class SharedMemory:
    """The mapping of the shared-memory file mlafuzz passes; remapped when it grows."""

    def __init__(self, fd: int, read_only: bool = False) -> None:
        self.fd = fd
        self.read_only = read_only
        self.map: Optional[mmap.mmap] = None
        self.size = 0

    def ensure(self, size: int) -> mmap.mmap:
        if self.map is None or size > self.size:
            old = self.map
            self.size = os.fstat(self.fd).st_size
            if size > self.size:
                raise RuntimeError(f"shared memory is {self.size} bytes, request needs {size}")
            access = mmap.ACCESS_READ if self.read_only else mmap.ACCESS_WRITE
            self.map = mmap.mmap(self.fd, self.size, access=access)
            if old is not None:
                try:
                    old.close()
                except BufferError:
                    pass  # a kernel kept a view: leave the old mapping to the garbage collector
        return self.map


# The arrays a kernel writes; every other array is an input and read-only.
_OUTPUTS = frozenset(("out", "out_raw", "lse", "lse_raw"))
# Host views a device="cuda" call never reads (it builds its tensors from the raw buffers).
_HOST_VIEWS = frozenset(("q", "indices", "out", "lse"))


DEFAULT_DEVICE_CACHE_BYTES = 4 << 30


def device_cache_budget(env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The device cache's byte budget from the environment, or None when it is off.

    ``MLAFUZZ_DEVICE_CACHE=0`` turns it off; ``MLAFUZZ_DEVICE_CACHE_BYTES`` sets the budget
    (bytes, or with a K, M or G suffix; default 4G).
    Raises:
        ValueError: the budget is not a size.
    """
    if not _settings.flag("MLAFUZZ_DEVICE_CACHE", True, env):
        return None
    text = (_settings.text("MLAFUZZ_DEVICE_CACHE_BYTES", env) or "").strip()
    if not text:
        return DEFAULT_DEVICE_CACHE_BYTES
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    if not digits.isdigit():
        raise ValueError(f"MLAFUZZ_DEVICE_CACHE_BYTES={text!r}: give bytes, e.g. 4G or 536870912")
    return int(digits) * scale


def device_cache_share(budget: int, total_bytes: int,
                       env: Optional[Mapping[str, str]] = None) -> int:
    """The default budget cut to this worker's share of its GPU.

    mlafuzz runs one device="cuda" worker per evaluation thread and Python backend, all on one
    GPU, and tells each how many they are (``MLAFUZZ_DEVICE_WORKERS``): their caches together
    keep at most a quarter of the GPU's memory. An H200 campaign of 16 threads and two Triton
    backends had 32 workers of 4G each and ran out of device memory (2026-12-04). A budget set
    with ``MLAFUZZ_DEVICE_CACHE_BYTES`` is kept as it is.
    Raises:
        ValueError: MLAFUZZ_DEVICE_WORKERS is not a positive integer.
    """
    if (_settings.text("MLAFUZZ_DEVICE_CACHE_BYTES", env) or "").strip():
        return budget
    text = (_settings.text("MLAFUZZ_DEVICE_WORKERS", env) or "").strip() or "1"
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"MLAFUZZ_DEVICE_WORKERS={text!r}: give the number of workers, e.g. 32")
    return min(budget, total_bytes // (4 * int(text)))


def is_out_of_memory(e: BaseException) -> bool:
    """torch.OutOfMemoryError (a RuntimeError subclass), or a CUDA out-of-memory RuntimeError."""
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e)


class DeviceCache:
    """Device copies of input buffers kept across calls, by identity, within a byte budget.

    A key is (identity, byte length): the identity is what mlafuzz's shared arena gives a
    block's bytes (``SharedArena::publish``, harness/core/shared_arena.h), new whenever they can
    have changed, so a hit is a copy of the very bytes the request names. Least recently used
    entries leave first; an entry larger than the whole budget is not kept.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: "OrderedDict[Hashable, Tuple[Any, int, Any]]" = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Optional[Any]:
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def checksum(self, key: Hashable) -> Any:
        entry = self.entries.get(key)
        return None if entry is None else entry[2]

    def set_checksum(self, key: Hashable, checksum: Any) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries[key] = (entry[0], entry[1], checksum)

    def put(self, key: Hashable, value: Any, nbytes: int, checksum: Any = None) -> bool:
        """Keeps value under key; returns False when it is larger than the budget."""
        self.drop(key)
        if nbytes > self.budget:
            return False
        self.entries[key] = (value, nbytes, checksum)
        self.bytes += nbytes
        while self.bytes > self.budget:
            _, (_, n, _) = self.entries.popitem(last=False)
            self.bytes -= n
        return True

    def drop(self, key: Hashable) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


class CudaDriver:
    """The copies, fills and synchronizations of a warm device="cuda" call, through the CUDA
    driver API (libcuda.so.1, with ctypes) instead of torch.

    Each torch call costs the worker tens of microseconds in a bridge call (its dispatcher's
    code and data are cold by the time the next request comes); a ctypes call into the driver
    touches far less. Used only for buffers whose addresses the worker knows: the kept device
    buffers and page-locked fd 3 (cudaHostRegister), on torch's current stream, in torch's
    context (the primary context, current on the worker's thread). ``MLAFUZZ_CUDA_DRIVER=0``
    keeps every copy in torch. Every call checks its CUresult: an error raises, and the worker
    reports a fault, as for a torch error.
    """

    def __init__(self, lib: Any) -> None:
        import ctypes  # noqa: PLC0415 - only device="cuda" workers

        u64, size, ptr = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
        self._lib = lib

        def fn(name: str, *args: Any) -> Any:
            f = getattr(lib, name)
            f.argtypes, f.restype = list(args), ctypes.c_int
            return f

        self._htod = fn("cuMemcpyHtoDAsync_v2", u64, ptr, size, ptr)
        self._dtoh = fn("cuMemcpyDtoHAsync_v2", ptr, u64, size, ptr)
        self._d16 = fn("cuMemsetD16Async", u64, ctypes.c_ushort, size, ptr)
        self._d32 = fn("cuMemsetD32Async", u64, ctypes.c_uint, size, ptr)
        self._sync = fn("cuCtxSynchronize")
        self._name = fn("cuGetErrorName", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        self._ctypes = ctypes
        # The checksum kernel (_sum64_ptx), loaded at its first use (sum64).
        self._sum_fn: Any = None  # its CUfunction; False: the driver refused it (torch sums)
        self.sum_error = ""  # why, when it was refused
        self._sum_grid_cap = 0  # blocks per buffer: twice the multiprocessors
        self._sum_args: Any = None  # the launch's parameter values, kept (9 x u64)
        self._sum_argv: Any = None  # and the pointers to them that cuLaunchKernel reads
        self._launch: Any = None  # cuLaunchKernel, its argument types set

    @classmethod
    def load(cls, env: Optional[Mapping[str, str]] = None) -> Optional["CudaDriver"]:
        """The driver, or None (MLAFUZZ_CUDA_DRIVER=0, or no libcuda.so.1: torch does it all)."""
        if not _settings.flag("MLAFUZZ_CUDA_DRIVER", True, env):
            return None
        try:
            import ctypes  # noqa: PLC0415

            return cls(ctypes.CDLL("libcuda.so.1"))
        except (OSError, AttributeError):
            return None

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self._ctypes.c_char_p()
            self._name(rc, self._ctypes.byref(name))
            label = name.value.decode() if name.value else "unknown"
            raise RuntimeError(f"{what}: CUDA driver error {rc} ({label})")

    def htod(self, dst: int, src: int, n: int, stream: int) -> None:
        self._check(self._htod(dst, src, n, stream), "cuMemcpyHtoDAsync")

    def dtoh(self, dst: int, src: int, n: int, stream: int) -> None:
        self._check(self._dtoh(dst, src, n, stream), "cuMemcpyDtoHAsync")

    def fill16(self, dst: int, value: int, count: int, stream: int) -> None:
        self._check(self._d16(dst, value & 0xFFFF, count, stream), "cuMemsetD16Async")

    def fill32(self, dst: int, value: int, count: int, stream: int) -> None:
        self._check(self._d32(dst, value & 0xFFFFFFFF, count, stream), "cuMemsetD32Async")

    def synchronize(self) -> None:
        self._check(self._sync(), "cuCtxSynchronize")

    def sum64_ready(self) -> bool:
        """Loads the checksum kernel into the current context (torch's) once; False when the
        driver refuses it (sum_error says why): the worker then sums with torch."""
        if self._sum_fn is None:
            c = self._ctypes
            lib = self._lib
            module, func, dev, sms = c.c_void_p(), c.c_void_p(), c.c_int(), c.c_int()
            try:
                self._check(lib.cuModuleLoadData(c.byref(module), c.c_char_p(SUM64_PTX.encode())),
                            "cuModuleLoadData(mlafuzz_sum64)")
                self._check(lib.cuModuleGetFunction(c.byref(func), module,
                                                    c.c_char_p(SUM64_ENTRY.encode())),
                            "cuModuleGetFunction(mlafuzz_sum64)")
                self._check(lib.cuCtxGetDevice(c.byref(dev)), "cuCtxGetDevice")
                # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
                self._check(lib.cuDeviceGetAttribute(c.byref(sms), 16, dev),
                            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
            except RuntimeError as e:
                self._sum_fn, self.sum_error = False, str(e)
                return False
            launch = lib.cuLaunchKernel
            launch.argtypes = [c.c_void_p] + [c.c_uint] * 7 + [c.c_void_p] * 3
            launch.restype = c.c_int
            self._launch = launch
            self._sum_args = (c.c_uint64 * 9)()
            self._sum_argv = (c.c_void_p * 9)(
                *[c.addressof(self._sum_args) + 8 * i for i in range(9)])
            self._sum_grid_cap = max(1, 2 * sms.value)
            self._sum_fn = func
        return self._sum_fn is not False

    def sum64(self, buffers: list, dst: int, stream: int) -> bool:
        """Queues on stream: int64 dst[i] = the sum modulo 2^64 of the n_i 64-bit words at
        device address p_i, for each (p_i, n_i) in buffers. One memset and one launch per four
        buffers. False (nothing queued) when the kernel is not available."""
        if not self.sum64_ready():
            return False
        self.fill32(dst, 0, 2 * len(buffers), stream)
        args = self._sum_args
        for first in range(0, len(buffers), SUM64_BUFFERS):
            chunk = buffers[first:first + SUM64_BUFFERS]
            most = 0
            for i in range(SUM64_BUFFERS):
                p, n = chunk[i] if i < len(chunk) else (0, 0)
                args[2 * i], args[2 * i + 1] = p, n
                most = max(most, n)
            args[8] = dst + 8 * first
            # About four words per thread, at most two blocks per multiprocessor and buffer.
            blocks = min(self._sum_grid_cap, max(1, -(-most // (4 * SUM64_THREADS))))
            self._check(self._launch(self._sum_fn, blocks, len(chunk), 1, SUM64_THREADS, 1, 1,
                                     0, stream, self._sum_argv, None),
                        "cuLaunchKernel(mlafuzz_sum64)")
        return True


class PhaseTimer:
    """Where a worker's calls spend their time, phase by phase (``MLAFUZZ_WORKER_TIMING=DIR``).

    Each RUN request is timed from the end of its frame's read to the end of its reply's write,
    in the phases the code marks (parse, arrays, to_device, ...). Calls are grouped by
    (device, batch, topk, cold or warm: whether any input missed the device cache) and the table
    of median microseconds per phase is written atomically to DIR/timing-PID.txt when the
    worker leaves normally. It says where a bridge call goes, shape by shape, without a
    profiler's overhead (cProfile, ``MLAFUZZ_WORKER_PROFILE``, slows each Python call).
    """

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, f"timing-{os.getpid()}.txt")
        self.groups: "OrderedDict[Tuple[Any, ...], Dict[str, list]]" = OrderedDict()
        self.marks: list = []
        self.group: Tuple[Any, ...] = ()
        self.cold = False

    def start(self) -> None:
        self.marks = [("", time.perf_counter())]
        self.group, self.cold = (), False

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.perf_counter()))

    def finish(self) -> None:
        if not self.group or len(self.marks) < 2:
            return
        key = self.group + ("cold" if self.cold else "warm",)
        phases = self.groups.setdefault(key, OrderedDict())
        for (_, t0), (name, t1) in zip(self.marks, self.marks[1:]):
            phases.setdefault(name, []).append(t1 - t0)
        phases.setdefault("total", []).append(self.marks[-1][1] - self.marks[0][1])

    def table(self) -> str:
        lines = ["median us per call and phase, by (device, batch, topk, cold|warm)"]
        for key, phases in self.groups.items():
            calls = len(phases.get("total", []))
            cells = " ".join(f"{name}={1e6 * float(np.median(v)):.1f}"
                             for name, v in phases.items())
            lines.append(f"{' '.join(str(k) for k in key)}: {calls} calls: {cells}")
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.table())
        os.replace(tmp, self.path)


class _NoTimer:
    """PhaseTimer's interface doing nothing (timing off, the default)."""

    cold = False
    group: Tuple[Any, ...] = ()

    def start(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass

    def finish(self) -> None:
        pass


# Inputs a device="cuda" call copies to the device (whole raw buffers: pads and gaps included).
_DEVICE_INPUTS = ("q_raw", "kv_cache", "indices_raw", "topk_length", "sink", "extra_kv_cache",
                  "extra_indices", "extra_topk_length")


_NO_TIMER = _NoTimer()

# The checksums' device tensor (Server._sums_buffer): slots 0.. the cached inputs' sums after the
# kernel, slots _SUM_BEFORE.. the sums of the entries a call put, before the kernel.
_SUM_BEFORE, _SUM_SLOTS = 8, 16
_SUM_PENDING = "pending"  # a new entry's checksum until the call reads it back (_check_sums)


class Server:
    timer: Any = _NO_TIMER  # MLAFUZZ_WORKER_TIMING=DIR: a PhaseTimer (main())

    def __init__(self, spec: str, shm_fd: int, reply_fd: int, arena_fd: int = -1) -> None:
        self.spec = spec
        self.reply_fd = reply_fd
        self.shm = SharedMemory(shm_fd) if shm_fd >= 0 else None
        self.arena = SharedMemory(arena_fd, read_only=True) if arena_fd >= 0 else None
        self.device_buffers: Dict[str, Any] = {}  # device="cuda": kept across calls
        self.views: Dict[str, Tuple[Any, Any, Any]] = {}  # _kept_view's entries
        self.host_arrays: Dict[str, Any] = {}  # device="cuda": run_reply's kept numpy views
        budget = device_cache_budget()
        self.device_cache: Optional[DeviceCache] = DeviceCache(budget) if budget else None
        self.staging: Any = None  # pinned host memory for copies to the device; False: none
        self.sums_host: Any = None  # pinned int64 host tensor for the checksums; False: none
        # fd 3's mapping as registered with cudaHostRegister (base, size); False: refused.
        self.registered: Any = None
        self.shm_tensor: Any = None  # a host uint8 tensor over the registered mapping
        self.device: Any = None  # device="cuda": the torch device the worker uses (kept)
        self.cu: Optional[CudaDriver] = None  # device="cuda": copies through the driver API
        self.stream = 0  # the driver's handle of torch's current stream (cuda calls)
        self.pinned = _settings.flag("MLAFUZZ_TORCH_PINNED", True)
        self.func, self.info, self.supports = load_kernel(spec)
        self.torch: Any = None
        self.reason = ""
        if self.info.device == "cuda":
            self.reason = self._init_cuda()
        # The module may say what else it needs (e.g. triton): unavailable() -> reason or None.
        extra = self._module_unavailable()
        if extra:
            self.reason = f"{self.reason}; {extra}" if self.reason else extra

    def _module_unavailable(self) -> str:
        module = sys.modules.get(getattr(self.func, "__module__", ""), None)
        hook = getattr(module, "unavailable", None)
        if not callable(hook):
            return ""
        try:
            why = hook()
        except Exception:  # noqa: BLE001 - a broken hook is the kernel's error: say so
            return "the module's unavailable() raised:\n" + traceback.format_exc()
        return "" if why is None else str(why)

    def _init_cuda(self) -> str:
        try:
            import torch  # noqa: PLC0415 - only kernels on cuda need torch
        except ImportError as e:
            return f"device='cuda' needs torch in {sys.executable} ({e}); pip install torch"
        if not torch.cuda.is_available():
            return "device='cuda' but torch sees no CUDA device"
        self.torch = torch
        torch.cuda.init()
        self.cu = CudaDriver.load()
        return ""

    def info_reply(self) -> Dict[str, Any]:
        i = self.info
        return {
            "protocol": mlafuzz.PROTOCOL_VERSION,
            "name": i.name,
            "description": i.description,
            "precision": i.precision,
            "abs_tol": i.abs_tol,
            "rel_tol": i.rel_tol,
            "device": i.device,
            "has_supports": self.supports is not None,
            "available": not self.reason,
            "reason": self.reason,
            "pid": os.getpid(),
            "python": sys.executable,
            "python_version": sys.version.split()[0],
            "numpy": np.__version__,
            # Protocol 1 additions (readers ignore unknown fields): what the kernel accepts and
            # the invariants it does not promise bit for bit.
            "envelope": i.envelope,
            "inexact": list(i.inexact),
            "extra_pipeline": i.extra_pipeline,
            "token_tile": i.token_tile,
            "extra_cache": i.extra_cache,  # Envelope(extra_cache=...): True, False or None
            # The module's planted bugs (MUTANTS): backend <spec>~<name> runs mutant_<name>.
            "mutants": declared_mutants(sys.modules.get(getattr(self.func, "__module__", ""))),
        }

    def supports_reply(self, req: Dict[str, Any]) -> Dict[str, Any]:
        if self.supports is None:
            return {"reason": None}
        try:
            why = self.supports(scalars_call(req, "host"))
        except Exception:  # noqa: BLE001 - a broken supports() is the kernel's error
            return {"reason": None, "error": traceback.format_exc()}
        return {"reason": None if why is None else str(why) or "unsupported (no reason given)"}

    def run_reply(self, req: Dict[str, Any], layout: Optional[CallLayout] = None
                  ) -> Dict[str, Any]:
        assert self.shm is not None
        if layout is None:
            layout = CallLayout(req)
        shm = self.shm.ensure(int(req["shm_size"]))
        arena = self.arena.ensure(0) if self.arena is not None else None
        on_host = self.info.device == "cpu"
        call = mlafuzz.DecodeCall(memory="host" if on_host else "device", **layout.fields)
        bases = req.get("bases") or {}
        arrays = {}
        # device="cuda": the numpy views are the worker's own (the kernel gets tensors), kept per
        # name while the mapping, the offset and the layout entry stay (no new view per call).
        kept = None if on_host else self.host_arrays
        if kept is not None and kept.get("") is not shm:
            kept.clear()  # fd 3 was mapped again: no view of the old mapping is kept
            kept[""] = shm
        for entry in layout.arrays:
            name, offset, shape, strides, dtype, in_arena, base, writeable = entry
            if not on_host and name in _HOST_VIEWS:
                continue
            region = shm
            if in_arena:
                if arena is None:
                    raise RuntimeError(f"{name} is in the shared arena but no --arena-fd was given")
                region = arena
            if base is not None:
                offset += int(bases[base])
            if kept is not None:
                hit = kept.get(name)
                if hit is not None and hit[0] is entry and hit[1] == offset and hit[2] is region:
                    arrays[name] = hit[3]
                    continue
            a = np.ndarray(shape, dtype=dtype, buffer=region, offset=offset, strides=strides)
            if not writeable:
                a.flags.writeable = False
            arrays[name] = a
            if kept is not None:
                kept[name] = (entry, offset, region, a)
        self.timer.group = (self.info.device, call.batch, call.topk)
        self.timer.mark("arrays")
        if on_host:
            return self._run_cpu(call, arrays)
        self._register_shm(shm)
        return self._run_cuda(call, arrays, req)

    def _register_shm(self, region: mmap.mmap) -> None:
        """Page-locks the call's shared memory (fd 3) with cudaHostRegister, once per mapping.

        The outputs then come back from the device straight into fd 3 by DMA, without the
        pinned staging buffer and its memcpy. Safe where the arena is not (see
        docs/WORKER_PROTOCOL.md): mlafuzz only ever grows fd 3, never truncates or punches it,
        so the registered pages stay the file's. A refusal (or MLAFUZZ_TORCH_PINNED=0) leaves
        the staging path.
        """
        if not self.pinned or self.registered is False:
            return
        view = np.frombuffer(region, dtype=np.uint8)
        base, size = int(view.ctypes.data), int(view.nbytes)
        del view  # no export of the mapping left behind (ensure() may close it)
        if self.registered is not None and self.registered[0] == base \
                and self.registered[1] == size:
            return
        cudart = self.torch.cuda.cudart()
        if self.registered is not None:
            cudart.cudaHostUnregister(self.registered[0])
            self.registered = None
        self.shm_tensor = None
        try:
            err = cudart.cudaHostRegister(base, size, 0)
        except Exception:  # noqa: BLE001 - no cudart binding: the staging path
            err = -1
        self.registered = (base, size) if int(err) == 0 else False
        if self.registered:
            # One host tensor over the whole mapping: the copies to and from fd 3 slice it
            # (no torch.from_numpy, no warnings filter per copy).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.shm_tensor = self.torch.frombuffer(region, dtype=self.torch.uint8)

    def _registered_at(self, host: np.ndarray) -> Optional[int]:
        """host's address when its bytes lie in page-locked fd 3 (cudaHostRegister), else None."""
        r = self.registered
        if not r:
            return None
        at = int(host.ctypes.data)
        return at if r[0] <= at and at + host.nbytes <= r[0] + r[1] else None

    def _registered_ptr(self, host: np.ndarray) -> Optional[int]:
        """_registered_at when the driver path is on (CudaDriver), else None."""
        return None if self.cu is None else self._registered_at(host)

    def _registered_bytes(self, host: np.ndarray) -> Any:
        """The host tensor of host's bytes when they lie in page-locked fd 3, else None."""
        at = self._registered_at(host)
        if at is None:
            return None
        at -= self.registered[0]
        t = self.shm_tensor
        if t is not None:
            return t[at:at + host.nbytes]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only numpy source
            return self.torch.from_numpy(host.reshape(-1).view(np.uint8))

    def _call_kernel(self, call: mlafuzz.DecodeCall) -> Tuple[Optional[str], float]:
        t0 = time.perf_counter()
        try:
            self.func(call)
        except Exception:  # noqa: BLE001 - the kernel's exception is the finding's detail
            return traceback.format_exc(), time.perf_counter() - t0
        return None, time.perf_counter() - t0

    def _run_cpu(self, call: mlafuzz.DecodeCall, a: Dict[str, np.ndarray]) -> Dict[str, Any]:
        call.q, call.kv_cache, call.indices = a["q"], a["kv_cache"], a["indices"]
        call.topk_length, call.sink = a.get("topk_length"), a.get("sink")
        call.out, call.lse = host_out(a["out"]), a["lse"]  # floats written into out raise
        call.extra_kv_cache, call.extra_indices = a.get("extra_kv_cache"), a.get("extra_indices")
        call.extra_topk_length = a.get("extra_topk_length")
        err, seconds = self._call_kernel(call)
        self.timer.mark("kernel")
        del call, a
        if err is not None:
            return {"status": "error", "message": err, "seconds": seconds}
        return {"status": "ok", "message": "", "seconds": seconds}

    def _pinned_host(self, attr: str, n: int, dtype: Any, minimum: int) -> Any:
        """The page-locked host tensor kept in self.<attr>: at least n elements of dtype (grown,
        at least minimum), or None when pinning is off or refused (False is then kept)."""
        kept = getattr(self, attr)
        if not self.pinned or kept is False:
            return None
        if kept is None or kept.numel() < n:
            setattr(self, attr, None)  # the old buffer goes before the larger one is pinned
            try:
                kept = self.torch.empty(max(n, minimum), dtype=dtype, pin_memory=True)
            except Exception:  # noqa: BLE001 - no pinned memory here: pageable copies
                kept = False
            setattr(self, attr, kept)
        return None if kept is False else kept

    def _stage(self, nbytes: int) -> Any:
        """Pinned staging of at least nbytes (grown), or None when pinning is refused."""
        return self._pinned_host("staging", nbytes, self.torch.uint8, 1 << 20)

    def _to_device(self, call_inputs: Dict[str, np.ndarray], req: Dict[str, Any],
                   dev: Any) -> Tuple[Dict[str, Any], list]:
        """The call's inputs on the device, as uint8 tensors of their raw bytes.

        Inputs whose identity the request gives (``ids``) come from the device cache when it has
        them; the others are copied (through pinned staging when it is available) into buffers
        kept per name (not cached) or into new tensors that the cache keeps. Returns the tensors
        and, for each cached input the call uses, (name, key, checksum, words): its checksum
        (an int, or a device tensor queued after its copy) and the int64 words it is summed over
        (_check_sums, after the kernel: a kernel that wrote an input would spoil later calls).
        """
        torch = self.torch
        kept = self.device_buffers
        cache = self.device_cache
        ids = req.get("ids") or {}
        out: Dict[str, Any] = {}
        keys = []
        misses = []  # (name, host bytes, device tensor, key or None)
        puts = []  # (name, words) of the entries put by this call, summed by the driver
        for name in _DEVICE_INPUTS:
            x = call_inputs.get(name)
            if x is None:
                continue
            n = x.nbytes
            key = (int(ids[name]), n) if cache is not None and name in ids else None
            words = None
            if key is not None:
                hit = cache.get(key)
                if hit is not None:
                    out[name] = hit[0]
                    keys.append((name, key, cache.checksum(key), hit[1]))
                    continue
                self.timer.cold = True
            host = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            if key is not None:
                # Whole int64 words, the tail past n zeroed: the checksum sums 8 bytes at a time
                # (a uint8 sum widened to int64 cost ~8x the device work and host time).
                n_words = (n + 7) // 8
                full = torch.empty(max(n_words, 1) * 8, dtype=torch.uint8, device=dev)
                if n_words * 8 > n:
                    full[n:].zero_()
                t, words = full[:n], full.view(torch.int64)
            else:
                buf = kept.get(name)
                if buf is None or buf.numel() < n:
                    buf = torch.empty(max(n, 1), dtype=torch.uint8, device=dev)
                    kept[name] = buf
                t = self._kept_view(name, n, buf, lambda u: u[:n])
            out[name] = t
            misses.append((name, host, t, key, words))
        if not misses:
            return out, keys
        direct = [self._registered_ptr(m[1]) or self._registered_bytes(m[1]) for m in misses]
        total = sum((m[1].nbytes + 63) // 64 * 64 for m, d in zip(misses, direct) if d is None)
        staging = self._stage(total) if total else None
        offset = 0
        for (name, host, t, key, words), src in zip(misses, direct):
            n = host.nbytes
            if isinstance(src, int):  # fd 3 through the driver (CudaDriver)
                self.cu.htod(self._data_ptr(name, t), src, n, self.stream)
            elif src is not None:
                # In page-locked fd 3 (the inputs mlafuzz copies into the call's shared memory):
                # straight to the device by DMA, no memcpy into the staging. fd 3 is not written
                # again before this call's reply, and the call synchronizes before it.
                t.copy_(src, non_blocking=True)
            elif staging is not None:
                dst = staging[offset:offset + n]
                np.copyto(dst.numpy(), host)  # the arena is pageable: one memcpy into pinned
                t.copy_(dst, non_blocking=True)
                offset += (n + 63) // 64 * 64
            else:
                with warnings.catch_warnings():
                    # The inputs are read-only numpy arrays; torch only reads them here.
                    warnings.simplefilter("ignore", UserWarning)
                    t.copy_(torch.from_numpy(host))
            if key is not None:
                # The checksum before the kernel: on the device, queued after the copy (wraps
                # modulo 2^64); read back with the outputs (_queue_sums, _check_sums).
                on_device = self._sum_kernel()
                checksum = _SUM_PENDING if on_device else torch.sum(words)
                if cache.put(key, (t, words), n, checksum):
                    keys.append((name, key, checksum, words))
                    if on_device:
                        puts.append((name, words))
        if puts:  # one launch for the new entries, into the "before" slots
            dst = self._sums_buffer(dev)
            self.cu.sum64(self._word_spans(puts), self._data_ptr("sums", dst) + 8 * _SUM_BEFORE,
                          self.stream)
        return out, keys

    def _sum_kernel(self) -> bool:
        """Whether the checksums run as the driver's kernel (CudaDriver.sum64), else torch.sum."""
        return self.cu is not None and self.cu.sum64_ready()

    def _word_spans(self, named_words: list) -> list:
        """(device address, word count) of each (name, int64 words tensor), the addresses kept."""
        return [(self._data_ptr(("words", name), w), w.numel()) for name, w in named_words]

    def _sums_buffer(self, dev: Any) -> Any:
        """The kept int64 device tensor the checksums are summed into (_SUM_SLOTS of them)."""
        dst = self.device_buffers.get("sums")
        if dst is None:
            dst = self.torch.empty(_SUM_SLOTS, dtype=self.torch.int64, device=dev)
            self.device_buffers["sums"] = dst
        return dst

    def _kept_view(self, name: str, geometry: Hashable, base: Any,
                   make: Callable[[Any], Any]) -> Any:
        """make(base), kept under name while base is the same tensor object and geometry the same.

        One entry per name, replaced by the next call that differs: the memo keeps alive no
        tensor but those of the last call (an evicted cache entry is not held beyond it). The
        entry holds base itself, so the test is identity (an id() can be reused once a tensor
        is freed).
        """
        hit = self.views.get(name)
        if hit is not None and hit[0] is base and hit[1] == geometry:
            return hit[2]
        v = make(base)
        self.views[name] = (base, geometry, v)
        return v

    def _data_ptr(self, name: Hashable, t: Any) -> int:
        """t.data_ptr(), kept under name while t is the same tensor (a kept device buffer)."""
        return self._kept_view(("ptr", name), None, t, lambda u: int(u.data_ptr()))

    def _synchronize(self, dev: Any) -> None:
        """The whole device: the driver's cuCtxSynchronize, else torch's."""
        if self.cu is not None:
            self.cu.synchronize()
        else:
            self.torch.cuda.synchronize(dev)

    def _outputs(self, a: Dict[str, np.ndarray], req: Dict[str, Any], dev: Any) -> Tuple[Any, Any]:
        """Device out_raw and lse_raw (kept per name, grown), filled with the canaries."""
        torch = self.torch
        kept = self.device_buffers
        res = []
        for name, code, canary in (("out_raw", torch.int16, req.get("out_canary")),
                                   ("lse_raw", torch.int32, req.get("lse_canary"))):
            x = a[name]
            buf = kept.get(name)
            if buf is None or buf.numel() < x.nbytes:
                buf = torch.empty(max(x.nbytes, 4), dtype=torch.uint8, device=dev)
                kept[name] = buf
            # The typed view of the first x.nbytes bytes, kept while the buffer and size stay.
            nbytes = x.nbytes
            t = self._kept_view(name, nbytes, buf, lambda u: u[:nbytes].view(code))
            if canary is None:  # an older request: the canaries come from the host
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    t.copy_(torch.from_numpy(x.view(np.int16 if name == "out_raw" else np.int32)))
            elif self.cu is not None:
                fill = self.cu.fill16 if name == "out_raw" else self.cu.fill32
                fill(self._data_ptr(name, buf), int(canary), x.size, self.stream)
            else:
                t.fill_(int(canary))
            res.append(t)
        return res[0], res[1]

    def _download(self, pairs: list, dev: Any) -> None:
        """Copies each device buffer's first host.nbytes bytes into the host array.

        Through pinned staging when it is available: both copies queued asynchronously, one
        synchronization, then one memcpy each into the shared memory (a copy from the device into
        pageable memory, such as the shared output buffers, goes through the driver's own bounce
        buffers at a fraction of the bus's speed). Without pinned memory: one copy each.
        """
        torch = self.torch
        for host, _ in pairs:
            if not host.flags.c_contiguous:  # reshape(-1) would copy: the bytes would be lost
                raise ValueError("a raw output buffer is not contiguous")
        staged = []
        for i, (host, buf) in enumerate(pairs):
            at = self._registered_ptr(host)
            if at is not None:  # through the driver (CudaDriver), from the kept device buffer
                self.cu.dtoh(at, self._data_ptr(("download", i), buf), host.nbytes, self.stream)
                continue
            dst = self._registered_bytes(host)
            if dst is not None:
                # Page-locked fd 3: straight in by DMA, queued beside the staged ones.
                dst.copy_(buf[: host.nbytes], non_blocking=True)
            else:
                staged.append((host, buf))
        if not staged:
            self._synchronize(dev)
            return
        pairs = staged
        total = sum((host.nbytes + 63) // 64 * 64 for host, _ in pairs)
        staging = self._stage(total)
        if staging is None:
            for host, buf in pairs:
                flat = host.reshape(-1).view(np.uint8)
                torch.from_numpy(flat).copy_(buf[: flat.nbytes])
            return
        spans = []
        offset = 0
        for host, buf in pairs:
            n = host.nbytes
            staging[offset:offset + n].copy_(buf[:n], non_blocking=True)
            spans.append((host, offset, n))
            offset += (n + 63) // 64 * 64
        self._synchronize(dev)
        pinned = staging.numpy()
        for host, offset, n in spans:
            np.copyto(host.reshape(-1).view(np.uint8), pinned[offset:offset + n])

    def _pinned_sums(self, n: int) -> Any:
        """n page-locked int64 elements for the checksums (kept, grown), or None when pinning is
        refused: a copy into pageable memory then goes through the staging."""
        kept = self._pinned_host("sums_host", n, self.torch.int64, 16)
        return None if kept is None else kept[:n]

    def _queue_sums(self, keys: list) -> Any:
        """The kept int64 device tensor, its first len(keys) slots each lent input's checksum
        now, slots _SUM_BEFORE... the "before" sums not yet read back (entries put by this call,
        in keys' order). Queued after the kernel, read back with the outputs (_check_sums)."""
        if len(keys) > _SUM_BEFORE:
            raise ValueError(f"{len(keys)} cached inputs: the checksums hold {_SUM_BEFORE}")
        torch = self.torch
        dst = self._sums_buffer(keys[0][3].device)
        before = [c for _, _, c, _ in keys if not isinstance(c, int)]
        n = _SUM_BEFORE + len(before) if before else len(keys)
        if self._sum_kernel():  # one memset and one launch for all of them
            self.cu.sum64(self._word_spans([(name, w) for name, _, _, w in keys]),
                          self._data_ptr("sums", dst), self.stream)
        else:
            # Each sum written in place (no stack: one launch fewer per call), into one-element
            # views of dst kept while dst is the same tensor.
            slots = self._kept_view("sums:slots", dst.numel(), dst,
                                    lambda d: [d[i:i + 1] for i in range(d.numel())])
            for slot, (_, _, _, words) in zip(slots, keys):
                torch.sum(words, dim=0, keepdim=True, out=slot)
            for j, c in enumerate(before, start=_SUM_BEFORE):
                slots[j].copy_(c.reshape(1))
        return self._kept_view("sums:head", n, dst, lambda d: d[:n])

    def _check_sums(self, keys: list, sums: np.ndarray) -> str:
        """Names of cached inputs whose device bytes the kernel changed (their entries dropped);
        the others keep their checksum as an int (no device sum of "before" again)."""
        cache = self.device_cache
        assert cache is not None
        values = [int(v) for v in sums]
        now, before = values[: len(keys)], iter(values[_SUM_BEFORE:])
        bad = []
        for (name, key, was, _), is_now in zip(keys, now):
            was = was if isinstance(was, int) else next(before)
            if is_now != was:
                bad.append(name)
                cache.drop(key)
            else:
                cache.set_checksum(key, was)
        return ", ".join(bad)

    def _run_cuda(
        self, call: mlafuzz.DecodeCall, a: Dict[str, np.ndarray], req: Dict[str, Any]
    ) -> Dict[str, Any]:
        torch = self.torch
        if torch is None:
            return {"status": "error", "message": self.reason, "seconds": 0.0}
        dev = self.device
        if dev is None:
            dev = self.device = torch.device("cuda", torch.cuda.current_device())
            if self.device_cache is not None:
                total = torch.cuda.get_device_properties(dev).total_memory
                self.device_cache.budget = device_cache_share(self.device_cache.budget, total)
        for attempt in (1, 2):
            try:
                keys = self._stage_call(call, a, req, dev)
                break
            except Exception as e:  # noqa: BLE001 - the staging itself failed: a device problem
                if self.device_cache is not None:
                    self.device_cache.clear()
                if attempt == 1 and is_out_of_memory(e):
                    # Out of device memory (other workers' caches, other processes): what this
                    # worker keeps is dropped and the staging tried once more.
                    self._release_device_memory()
                    continue
                why = ("CUDA staging failed (out of device memory even with this worker's "
                       "buffers released: other processes on the GPU hold it)" if
                       is_out_of_memory(e) else "CUDA staging failed")
                return {"status": "fault", "message": why + ":\n" + traceback.format_exc(),
                        "seconds": 0.0}
        err, seconds = self._call_kernel(call)
        if err is not None and "OutOfMemoryError" in err:
            self._release_device_memory()  # so that the next call finds room
        self.timer.mark("kernel")
        return self._finish_cuda(a, dev, keys, err, seconds)

    def _release_device_memory(self) -> None:
        """Drops every device buffer this worker keeps (cache, outputs, views) and returns the
        memory torch holds unused to the driver."""
        if self.device_cache is not None:
            self.device_cache.clear()
        self.device_buffers.clear()
        self.views.clear()
        self.torch.cuda.empty_cache()

    def _stage_call(self, call: mlafuzz.DecodeCall, a: Dict[str, np.ndarray],
                    req: Dict[str, Any], dev: Any) -> list:
        """Inputs and outputs on the device and call's tensors set; returns the cached inputs'
        keys (_to_device)."""
        torch = self.torch
        stream = torch.cuda.current_stream(dev)
        self.stream = int(stream.cuda_stream)  # where the driver's copies queue
        inputs, keys = self._to_device(a, req, dev)
        self.timer.mark("to_device")
        # Whole raw buffers (pads and guard bands included), then strided views of them,
        # so that the device sees the same layout and the canaries come back.
        out_raw, lse_raw = self._outputs(a, req, dev)
        self.timer.mark("outputs")
        view = self._kept_view
        b, h = call.batch, call.heads
        # [B, (s_q,) ...]: the s_q axis when s_q > 1, as on the host.
        lead, q_st, o_st, l_st = (b,), (call.q_batch_stride,), (call.out_batch_stride,), (
            call.lse_batch_stride,)
        if call.s_q > 1:
            lead = (b, call.s_q)
            q_st += (call.q_token_stride,)
            o_st += (call.out_token_stride,)
            l_st += (call.lse_token_stride,)
        # Views of the same tensors with the same geometry are kept (_kept_view): a warm
        # call builds none of them again.
        q_shape, q_strides = lead + (h, call.d_qk), q_st + (call.q_head_stride, 1)
        call.q = view("q", (q_shape, q_strides), inputs["q_raw"], lambda t: t.view(
            torch.bfloat16).as_strided(q_shape, q_strides))
        o_shape, o_strides = lead + (h, call.d_v), o_st + (call.out_head_stride, 1)
        o_off, l_off = int(req["out_guard"]), int(req["lse_guard"])
        call.out = view("out", (o_shape, o_strides, o_off), out_raw, lambda t: t.view(
            torch.bfloat16).as_strided(o_shape, o_strides, o_off))
        l_shape, l_strides = lead + (h,), l_st + (1,)
        call.lse = view("lse", (l_shape, l_strides, l_off), lse_raw, lambda t: t.view(
            torch.float32).as_strided(l_shape, l_strides, l_off))

        def shaped(name: str, dtype: Any, shape: Tuple[int, ...]) -> Any:
            t = inputs.get(name)
            if t is None:
                return None
            return view(name + ":view", (dtype, shape), t, lambda u: u.view(dtype).view(shape))

        call.kv_cache = shaped("kv_cache", torch.uint8, tuple(a["kv_cache"].shape))
        # The index rows keep their gaps on the device too (indices_batch_stride).
        i_st = (call.indices_batch_stride,)
        if call.s_q > 1:
            i_st += (call.indices_token_stride,)
        i_shape, i_strides = lead + (call.topk,), i_st + (1,)
        call.indices = view("indices", (i_shape, i_strides), inputs["indices_raw"],
                            lambda t: t.view(torch.int32).as_strided(i_shape, i_strides))
        call.topk_length = shaped("topk_length", torch.int32, (b,))
        if "extra_kv_cache" in inputs:
            call.extra_kv_cache = shaped("extra_kv_cache", torch.uint8,
                                         tuple(a["extra_kv_cache"].shape))
            # Compacted (contiguous) on the device, as before the cache.
            call.extra_indices = shaped("extra_indices", torch.int32,
                                        tuple(a["extra_indices"].shape))
            call.extra_topk_length = shaped("extra_topk_length", torch.int32, (b,))
        call.sink = shaped("sink", torch.float32, (h,))
        call.stream = stream
        self.timer.mark("views")
        self._synchronize(dev)
        self.timer.mark("sync_before")
        return keys

    def _finish_cuda(self, a: Dict[str, np.ndarray], dev: Any, keys: list,
                     err: Optional[str], seconds: float) -> Dict[str, Any]:
        """After the kernel: synchronize, download the outputs, check the kept inputs."""
        torch = self.torch
        try:
            # The whole device first: a kernel may have used streams of its own.
            self._synchronize(dev)
            self.timer.mark("sync_after")
            # Whole raw buffers, canaries included, into the shared output buffers, and the lent
            # inputs' checksums with them (one more synchronization for all).
            pairs = [(a["out_raw"], self.device_buffers["out_raw"]),
                     (a["lse_raw"], self.device_buffers["lse_raw"])]
            sums = None
            if keys:
                queued = self._queue_sums(keys)
                pinned = self._pinned_sums(queued.numel())
                if pinned is not None:  # straight into page-locked memory, queued with the rest
                    # (torch's copy: the driver's measured 25 us slower here on the H200)
                    pinned.copy_(queued, non_blocking=True)
                    sums = pinned.numpy()
                else:
                    sums = np.empty(queued.numel(), dtype=np.int64)
                    pairs.append((sums, queued.view(torch.uint8)))
            self.timer.mark("sums")
            self._download(pairs, dev)
            self.timer.mark("download")
            written = self._check_sums(keys, sums) if keys else ""
            self.timer.mark("check")
        except Exception:  # noqa: BLE001 - a sticky CUDA error: the context is gone
            return {"status": "fault",
                    "message": "CUDA error after the kernel:\n" + traceback.format_exc()
                    + (f"\nthe kernel raised first:\n{err}" if err else ""),
                    "seconds": seconds}
        if err is not None:
            return {"status": "error", "message": err, "seconds": seconds}
        if written:
            return {"status": "error", "seconds": seconds, "message": (
                f"the kernel wrote its input(s) {written} on the device (inputs are read-only; "
                "their device copies are kept across calls)")}
        return {"status": "ok", "message": "", "seconds": seconds}


def _watch_parent(parent: int) -> None:
    """Leaves when mlafuzz is gone, even while a kernel hangs (the pipe tells only a reader)."""

    def loop() -> None:
        while True:
            time.sleep(0.25)
            if os.getppid() != parent:
                os._exit(5)

    threading.Thread(target=loop, name="mlafuzz-parent-watch", daemon=True).start()


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlafuzz._worker", description=__doc__)
    parser.add_argument("--backend", required=True, help="path/to/file.py:func or module:func")
    parser.add_argument("--shm-fd", type=int, default=-1, help="shared-memory file descriptor")
    parser.add_argument("--arena-fd", type=int, default=-1, help="the shared arena (read-only)")
    parser.add_argument("--protocol", type=int, default=mlafuzz.PROTOCOL_VERSION)
    args = parser.parse_args(argv)

    # Keep the protocol channel private: whatever the kernel prints goes to stderr.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    in_fd = 0
    parent = _settings.integer("MLAFUZZ_WORKER_PARENT", 0)
    if parent:
        if os.getppid() != parent:
            return 5
        _watch_parent(parent)

    if args.protocol != mlafuzz.PROTOCOL_VERSION:
        write_frame(reply_fd, MSG_ERROR, (
            f"mlafuzz speaks worker protocol {args.protocol}, this mlafuzz Python package "
            f"({os.path.dirname(mlafuzz.__file__)}) speaks {mlafuzz.PROTOCOL_VERSION}: install "
            "the package of the same mlafuzz version (pip install ./python)").encode())
        return 3
    try:
        server: Optional[Server] = Server(args.backend, args.shm_fd, reply_fd, args.arena_fd)
        load_error = ""
    except LoadError as e:
        server, load_error = None, str(e)

    timing = _settings.text("MLAFUZZ_WORKER_TIMING")
    if timing and server is not None:
        server.timer = PhaseTimer(timing)
    profile_dir = _settings.text("MLAFUZZ_WORKER_PROFILE")
    if profile_dir:
        rc = _serve_profiled(server, load_error, in_fd, reply_fd, profile_dir)
    else:
        rc = _serve(server, load_error, in_fd, reply_fd)
    if isinstance(server, Server) and isinstance(server.timer, PhaseTimer):
        server.timer.write()
    return rc


def _serve_profiled(server: Optional["Server"], load_error: str, in_fd: int, reply_fd: int,
                    profile_dir: str) -> int:
    """_serve under cProfile; the statistics go to PROFILE_DIR/worker-PID.prof at the end.

    ``MLAFUZZ_WORKER_PROFILE=DIR`` in mlafuzz's environment: where a bridge call's time goes in
    the worker (read it with ``python3 -m pstats DIR/worker-PID.prof``). Written atomically
    when the worker leaves normally (the end of the run or campaign); a killed worker leaves none.
    """
    import cProfile  # noqa: PLC0415 - only when asked

    prof = cProfile.Profile()
    prof.enable()
    try:
        return _serve(server, load_error, in_fd, reply_fd)
    finally:
        prof.disable()
        os.makedirs(profile_dir, exist_ok=True)
        path = os.path.join(profile_dir, f"worker-{os.getpid()}.prof")
        prof.dump_stats(path + ".tmp")
        os.replace(path + ".tmp", path)


def _serve(server: Optional["Server"], load_error: str, in_fd: int, reply_fd: int) -> int:
    last = None  # the last RUN's layout line and its parse (parse_run)
    while True:
        frame = read_frame(in_fd)
        if frame is None:
            return 0
        kind, payload = frame
        if kind == MSG_QUIT:
            return 0
        timer = server.timer if server is not None else _NO_TIMER
        timer.start()
        if server is None:
            write_frame(reply_fd, MSG_ERROR, load_error.encode())
            return 3
        if kind == MSG_RUN:
            req, layout, last = parse_run(payload, last)
            timer.mark("parse")
            reply = server.run_reply(req, layout)
            _send_run_reply(reply_fd, reply)
            timer.mark("reply")
            timer.finish()
            if reply["status"] == "fault":
                return 4  # the CUDA context is poisoned: a fresh worker follows
            continue
        req = json.loads(payload) if payload else {}
        if kind == MSG_INFO:
            _send_json(reply_fd, MSG_INFO, server.info_reply())
        elif kind == MSG_SUPPORTS:
            _send_json(reply_fd, MSG_SUPPORTS, server.supports_reply(req))
        else:
            write_frame(reply_fd, MSG_ERROR, f"unknown request type {kind}".encode())
            return 3


if __name__ == "__main__":
    sys.exit(main())
