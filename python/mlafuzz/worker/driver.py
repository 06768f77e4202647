"""The CUDA driver API (ctypes) for the copies, fills and checksums of a warm device="cuda" call."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from mlafuzz import _settings
from mlafuzz._sum64_ptx import SUM64_BUFFERS, SUM64_ENTRY, SUM64_PTX, SUM64_THREADS


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
