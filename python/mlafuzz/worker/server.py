"""The worker's server: one loaded kernel, its calls, and the request loop (main)."""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Dict, Hashable, Optional, Tuple

import numpy as np

import mlafuzz
import mlafuzz.worker
from mlafuzz import _settings
from mlafuzz._call import host_out
from mlafuzz.worker.device_cache import (device_cache_budget, device_cache_share, DeviceCache,
                                         is_out_of_memory)
from mlafuzz.worker.driver import CudaDriver
from mlafuzz.worker.loader import declared_mutants, load_kernel, LoadError
from mlafuzz.worker.protocol import (CallLayout, MSG_ERROR, MSG_INFO, MSG_QUIT, MSG_RUN,
                                     MSG_SUPPORTS, parse_run, read_frame, scalars_call, _send_json,
                                     _send_run_reply, write_frame)
from mlafuzz.worker.shm import SharedMemory
from mlafuzz.worker.timing import _NO_TIMER, PhaseTimer


class _TorchDtypes:
    """numpy dtype codes -> torch dtypes, resolved on first use (torch is imported lazily)."""

    def __getitem__(self, code: str) -> Any:
        import torch  # noqa: PLC0415 - only kernels on cuda need torch

        return {"u1": torch.uint8, "i2": torch.int16, "i4": torch.int32,
                "f4": torch.float32}[code]


_TORCH_DTYPES = _TorchDtypes()


# Host views a device="cuda" call never reads (it builds its tensors from the raw buffers).
_HOST_VIEWS = frozenset(("q", "indices", "out", "lse"))


# Inputs a device="cuda" call copies to the device (whole raw buffers: pads and gaps included).
_DEVICE_INPUTS = ("q_raw", "kv_cache", "indices_raw", "topk_length", "sink", "extra_kv_cache",
                  "extra_indices", "extra_topk_length")


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
        self.views: Dict[Hashable, Tuple[Any, Any, Any]] = {}  # _kept_view's entries
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
            a: np.ndarray = np.ndarray(shape, dtype=dtype, buffer=region, offset=offset,
                                       strides=strides)
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
        start = at - self.registered[0]
        t = self.shm_tensor
        if t is not None:
            return t[start:start + host.nbytes]
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
        out, keys, misses = self._cached_inputs(call_inputs, req, dev)
        if not misses:
            return out, keys
        puts = self._copy_misses(misses, keys)
        if puts:  # one launch for the new entries, into the "before" slots
            dst = self._sums_buffer(dev)
            assert self.cu is not None  # puts only when _sum_kernel() (the driver's kernel)
            self.cu.sum64(self._word_spans(puts), self._data_ptr("sums", dst) + 8 * _SUM_BEFORE,
                          self.stream)
        return out, keys

    def _cached_inputs(self, call_inputs: Dict[str, np.ndarray], req: Dict[str, Any],
                       dev: Any) -> Tuple[Dict[str, Any], list, list]:
        """(tensors by name, keys, misses) of the call's inputs: the device cache's tensor of
        each input it holds (its (name, key, checksum, words) in keys), else the device tensor
        the input is to be copied into, listed in misses as (name, host bytes, tensor, key or
        None, words or None)."""
        cache = self.device_cache
        ids = req.get("ids") or {}
        out: Dict[str, Any] = {}
        keys = []
        misses = []
        for name in _DEVICE_INPUTS:
            x = call_inputs.get(name)
            if x is None:
                continue
            n = x.nbytes
            key = (int(ids[name]), n) if cache is not None and name in ids else None
            if key is not None:
                assert cache is not None  # a key only when there is a cache
                hit = cache.get(key)
                if hit is not None:
                    out[name] = hit[0]
                    keys.append((name, key, cache.checksum(key), hit[1]))
                    continue
                self.timer.cold = True
            host = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            t, words = self._device_buffer(name, n, key is not None, dev)
            out[name] = t
            misses.append((name, host, t, key, words))
        return out, keys, misses

    def _device_buffer(self, name: str, n: int, cached: bool, dev: Any) -> Tuple[Any, Any]:
        """(the n-byte device tensor an input is copied into, its int64 words or None): a new
        tensor for an input the cache is to keep, else the buffer kept for the name."""
        torch = self.torch
        if cached:
            # Whole int64 words, the tail past n zeroed: the checksum sums 8 bytes at a time
            # (a uint8 sum widened to int64 cost ~8x the device work and host time).
            n_words = (n + 7) // 8
            full = torch.empty(max(n_words, 1) * 8, dtype=torch.uint8, device=dev)
            if n_words * 8 > n:
                full[n:].zero_()
            return full[:n], full.view(torch.int64)
        kept = self.device_buffers
        buf = kept.get(name)
        if buf is None or buf.numel() < n:
            buf = torch.empty(max(n, 1), dtype=torch.uint8, device=dev)
            kept[name] = buf
        return self._kept_view(name, n, buf, lambda u: u[:n]), None

    def _copy_misses(self, misses: list, keys: list) -> list:
        """Copies each missed input to its device tensor and puts those with a key in the
        device cache (appending them to keys); returns the (name, words) of the entries whose
        checksum the driver's kernel is to compute."""
        torch = self.torch
        cache = self.device_cache
        puts = []
        direct = [self._registered_ptr(m[1]) or self._registered_bytes(m[1]) for m in misses]
        total = sum((m[1].nbytes + 63) // 64 * 64 for m, d in zip(misses, direct) if d is None)
        staging = self._stage(total) if total else None
        offset = 0
        for (name, host, t, key, words), src in zip(misses, direct):
            offset = self._copy_input(name, host, t, src, staging, offset)
            if key is not None:
                # The checksum before the kernel: on the device, queued after the copy (wraps
                # modulo 2^64); read back with the outputs (_queue_sums, _check_sums).
                on_device = self._sum_kernel()
                checksum = _SUM_PENDING if on_device else torch.sum(words)
                assert cache is not None  # a key only when there is a cache
                if cache.put(key, (t, words), host.nbytes, checksum):
                    keys.append((name, key, checksum, words))
                    if on_device:
                        puts.append((name, words))
        return puts

    def _copy_input(self, name: str, host: np.ndarray, t: Any, src: Any, staging: Any,
                    offset: int) -> int:
        """Copies one input's bytes to its device tensor t, from fd 3 (src) when registered,
        else through the pinned staging at offset; returns the staging offset after it."""
        n = host.nbytes
        if isinstance(src, int):  # fd 3 through the driver (CudaDriver)
            assert self.cu is not None  # an int source only with the driver
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
                t.copy_(self.torch.from_numpy(host))
        return offset

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

    def _kept_view(self, name: Hashable, geometry: Hashable, base: Any,
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
                assert self.cu is not None  # a registered pointer only with the driver
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
            assert self.cu is not None
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
        lead: Tuple[int, ...] = (b,)
        q_st: Tuple[int, ...] = (call.q_batch_stride,)
        o_st: Tuple[int, ...] = (call.out_batch_stride,)
        l_st: Tuple[int, ...] = (call.lse_batch_stride,)
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
        i_st: Tuple[int, ...] = (call.indices_batch_stride,)
        if call.s_q > 1:
            i_st += (call.indices_token_stride,)
        i_shape, i_strides = lead + (call.topk,), i_st + (1,)
        call.indices = view("indices", (i_shape, i_strides), inputs["indices_raw"],
                            lambda t: t.view(torch.int32).as_strided(i_shape, i_strides))
        call.topk_length = shaped("topk_length", torch.int32, (b,))
        if "extra_kv_cache" in inputs:
            call.extra_kv_cache = shaped("extra_kv_cache", torch.uint8,
                                         tuple(a["extra_kv_cache"].shape))
            # The extra index rows are compact (contiguous, no row gaps) on the device.
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
            sums: Optional[np.ndarray] = None
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
            written = self._check_sums(keys, sums) if keys and sums is not None else ""
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
    parser = argparse.ArgumentParser(prog="python -m mlafuzz._worker",
                                     description=mlafuzz.worker.__doc__)
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
