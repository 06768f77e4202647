"""The device="cuda" worker's input cache (python/mlafuzz/worker/: DeviceCache, Server._to_device).

CI has no torch and no GPU: these tests drive the worker's copy logic with a fake torch module
whose "device" tensors are numpy arrays and which counts every host-to-device copy. What they
check is the cache's promise: an input whose identity (SharedArena::publish) the worker has seen
is not copied again; one with a new identity is, even at the same offset and length (a freed and
reused arena block), so the kernel never sees stale bytes; the budget bounds what is kept; a
kernel that writes a cached input is caught; MLAFUZZ_DEVICE_CACHE=0 copies everything. The real
torch path runs only on a GPU machine (scripts/gpu_python.sh).
"""

from __future__ import annotations

import ctypes
import types
from typing import Any, Dict, Optional, Tuple

import numpy as np
import pytest

from mlafuzz.worker import device_cache, driver, server, timing


class FakeTensor:
    def __init__(self, a: np.ndarray, fake: "FakeTorch", device: str) -> None:
        self.a, self.fake, self.device = a, fake, device

    def numel(self) -> int:
        return int(self.a.size)

    def __getitem__(self, k: Any) -> "FakeTensor":
        return FakeTensor(self.a[k], self.fake, self.device)

    def view(self, dtype: Any) -> "FakeTensor":
        return FakeTensor(self.a.view(dtype), self.fake, self.device)

    def numpy(self) -> np.ndarray:
        assert self.device == "cpu", "numpy() of a device tensor"
        return self.a

    def copy_(self, src: "FakeTensor", non_blocking: bool = False) -> "FakeTensor":
        if self.device != src.device:
            self.fake.copies.append((self.device, src.device, src.a.nbytes, non_blocking))
        np.copyto(self.a, src.a.view(self.a.dtype).reshape(self.a.shape))
        return self

    def fill_(self, v: int) -> "FakeTensor":
        self.a[...] = v
        return self

    def zero_(self) -> "FakeTensor":
        return self.fill_(0)

    def __ne__(self, o: object) -> "FakeTensor":  # type: ignore[override]
        assert isinstance(o, FakeTensor)
        return FakeTensor(self.a != o.a, self.fake, self.device)

    def tolist(self) -> Any:
        return self.a.tolist()

    def reshape(self, *shape: int) -> "FakeTensor":
        return FakeTensor(self.a.reshape(shape), self.fake, self.device)

    def data_ptr(self) -> int:  # host memory stands for the device's: the fake driver copies it
        return int(self.a.ctypes.data)


class FakeTorch(types.SimpleNamespace):
    """The few torch calls _to_device, _outputs, _queue_sums and _download make."""

    uint8, int16, int32, int64 = np.uint8, np.int16, np.int32, np.int64

    def __init__(self, pin_fails: bool = False) -> None:
        super().__init__()
        self.copies: list = []
        self.pin_fails = pin_fails
        self.pinned_allocations = 0
        self.syncs = 0
        self.sum_calls = 0
        self.cuda = types.SimpleNamespace(synchronize=self._synchronize)

    def _synchronize(self, dev: Any) -> None:
        self.syncs += 1

    def empty(self, n: int, dtype: Any, device: Optional[str] = None,
              pin_memory: bool = False) -> FakeTensor:
        if pin_memory:
            if self.pin_fails:
                raise RuntimeError("cudaHostAlloc failed (fake)")
            self.pinned_allocations += 1
        # Garbage, as torch.empty: a copy that did not happen shows.
        nbytes = n * np.dtype(dtype).itemsize  # n elements of dtype, as torch.empty
        return FakeTensor(np.full(nbytes, 0xEE, dtype=np.uint8).view(dtype), self,
                          "cuda" if device is not None else "cpu")

    def from_numpy(self, a: np.ndarray) -> FakeTensor:
        return FakeTensor(a, self, "cpu")

    def frombuffer(self, buf: Any, dtype: Any) -> FakeTensor:  # the host tensor over fd 3
        self.frombuffers = getattr(self, "frombuffers", 0) + 1
        return FakeTensor(np.frombuffer(buf, dtype=dtype), self, "cpu")

    def sum(self, t: FakeTensor, dtype: Any = None, dim: Any = None, keepdim: bool = False,
            out: Optional[FakeTensor] = None) -> FakeTensor:
        # torch sums integers into int64, wrapping around like the device does; out= writes in
        # place (the worker's kept checksum tensor).
        self.sum_calls += 1
        with np.errstate(over="ignore"):
            total = np.array(t.a.astype(np.int64).sum(dtype=np.int64))
        if out is None:
            return FakeTensor(total.reshape((1,) if keepdim else ()), self, t.device)
        out.a[...] = total
        return out

    def stack(self, ts: list) -> FakeTensor:
        return FakeTensor(np.array([t.a for t in ts]), self, ts[0].device)


def make_server(fake: FakeTorch, budget: Optional[int] = 1 << 30) -> server.Server:
    s = object.__new__(server.Server)  # no kernel to load: only the copy logic is exercised
    s.torch = fake
    s.device_buffers = {}
    s.views = {}
    s.device_cache = device_cache.DeviceCache(budget) if budget else None
    s.staging = None
    s.sums_host = None
    s.pinned = True
    s.registered = False  # fd 3 not page-locked (test_..._registered_shared_memory: it is)
    s.shm_tensor = None
    s.device = None
    s.cu = None  # torch does every copy (test_the_driver_path_...: the driver does some)
    s.stream = 0
    return s


def inputs(seed: int, kv_bytes: int = 4096) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "q_raw": rng.integers(0, 1 << 16, 256, dtype=np.uint16),
        "kv_cache": rng.integers(0, 256, kv_bytes, dtype=np.uint8).reshape(4, -1),
        "indices_raw": rng.integers(0, 64, 32, dtype=np.int32),
    }


def device_bytes(t: FakeTensor) -> bytes:
    return t.a.tobytes()


def host_bytes(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


def uploads(fake: FakeTorch) -> int:
    return sum(1 for dst, src, _, _ in fake.copies if dst == "cuda" and src == "cpu")


def test_seen_identities_are_not_copied_again() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    a = inputs(1)
    req = {"ids": {"q_raw": 11, "kv_cache": 12}}
    first, keys = s._to_device(a, req, "cuda")
    assert uploads(fake) == 3  # q, cache and the indices (no identity: copied every call)
    assert {name for name, _, _, _ in keys} == {"q_raw", "kv_cache"}
    fake.copies.clear()
    again, keys = s._to_device(a, req, "cuda")
    assert uploads(fake) == 1, fake.copies  # only the indices
    assert again["kv_cache"] is first["kv_cache"]
    for name in a:
        assert device_bytes(again[name]) == host_bytes(a[name]), name
    assert s.device_cache.hits == 2


def test_a_new_identity_at_the_same_place_is_copied_no_stale_bytes() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    a, b = inputs(1), inputs(2)  # same shapes and lengths: a reused arena block, new bytes
    s._to_device(a, {"ids": {"q_raw": 11, "kv_cache": 12}}, "cuda")
    fake.copies.clear()
    dev, _ = s._to_device(b, {"ids": {"q_raw": 13, "kv_cache": 14}}, "cuda")
    assert uploads(fake) == 3
    for name in b:
        assert device_bytes(dev[name]) == host_bytes(b[name]), f"{name}: stale device bytes"
    # An identity seen with another length is another entry too.
    c = inputs(3, kv_bytes=8192)
    fake.copies.clear()
    dev, _ = s._to_device(c, {"ids": {"q_raw": 13, "kv_cache": 14}}, "cuda")
    assert device_bytes(dev["kv_cache"]) == host_bytes(c["kv_cache"])
    assert uploads(fake) == 2  # q (same identity and length) is a hit


def test_without_identities_every_call_copies_everything() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    a = inputs(1)
    for k in range(3):
        dev, keys = s._to_device(a, {}, "cuda")
        assert not keys
        assert uploads(fake) == 3 * (k + 1)
        for name in a:
            assert device_bytes(dev[name]) == host_bytes(a[name])
    off = make_server(fake, budget=None)  # MLAFUZZ_DEVICE_CACHE=0
    fake.copies.clear()
    off._to_device(a, {"ids": {"q_raw": 1, "kv_cache": 2}}, "cuda")
    off._to_device(a, {"ids": {"q_raw": 1, "kv_cache": 2}}, "cuda")
    assert uploads(fake) == 6


def test_the_budget_keeps_the_most_recently_used() -> None:
    cache = device_cache.DeviceCache(budget=100)
    assert cache.put("a", "A", 40) and cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recent
    assert cache.put("c", "C", 40)  # 120 > 100: b leaves
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"
    assert cache.bytes == 80
    assert not cache.put("huge", "H", 101)
    assert cache.get("huge") is None and cache.bytes == 80
    cache.put("a", "A2", 10)  # replacing an entry counts its bytes once
    assert cache.bytes == 50 and cache.get("a") == "A2"


def written(s: server.Server, keys: list) -> str:
    """What _run_cuda does after the kernel: the sums queued, read back, compared."""
    return s._check_sums(keys, s._queue_sums(keys).a)


@pytest.mark.parametrize("kv_bytes", [4096, 4100])  # whole int64 words, and a tail
def test_a_kernel_that_writes_a_cached_input_is_caught(kv_bytes: int) -> None:
    fake = FakeTorch()
    s = make_server(fake)
    a = inputs(1, kv_bytes)
    req = {"ids": {"q_raw": 11, "kv_cache": 12}}
    dev, keys = s._to_device(a, req, "cuda")
    assert written(s, keys) == ""
    # The checksums are now known as ints: the next call sums only the inputs as they are now.
    dev, keys = s._to_device(a, req, "cuda")
    assert all(isinstance(c, int) for _, _, c, _ in keys) and len(s._queue_sums(keys).a) == 2
    assert written(s, keys) == ""
    dev["kv_cache"].a[kv_bytes - 1] ^= 0xFF  # the kernel stores into its cache input (last byte)
    assert written(s, keys) == "kv_cache"
    fake.copies.clear()
    dev, _ = s._to_device(a, req, "cuda")  # the spoiled copy was dropped: copied again
    assert uploads(fake) == 2
    assert device_bytes(dev["kv_cache"]) == host_bytes(a["kv_cache"])


def test_copies_go_through_pinned_staging_and_fall_back_without_it() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    s._to_device(inputs(1), {}, "cuda")
    assert fake.pinned_allocations == 1
    assert all(nb for dst, src, _, nb in fake.copies), "pinned copies are asynchronous"
    fake = FakeTorch(pin_fails=True)
    s = make_server(fake)
    a = inputs(1)
    dev, _ = s._to_device(a, {}, "cuda")
    assert s.staging is False
    for name in a:
        assert device_bytes(dev[name]) == host_bytes(a[name])
    assert not any(nb for _, _, _, nb in fake.copies)


def test_outputs_are_filled_with_the_canaries_on_the_device() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    host = {"out_raw": np.zeros(40, np.uint16), "lse_raw": np.zeros(8, np.float32)}
    out, lse = s._outputs(host, {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}, "cuda")
    assert (out.a.view(np.uint16) == 0x7FA5).all() and (lse.a.view(np.uint32) == 0x7FA5A5A5).all()
    assert uploads(fake) == 0
    out2, _ = s._outputs(host, {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}, "cuda")
    assert out2.a.ctypes.data == out.a.ctypes.data, "the device outputs are reused"
    # A request without the canaries' bits (older mlafuzz): uploaded from the host.
    host["out_raw"][:] = 0x1234
    out3, _ = s._outputs(host, {}, "cuda")
    assert uploads(fake) == 2 and (out3.a.view(np.uint16) == 0x1234).all()


def test_outputs_come_back_through_pinned_staging_with_one_synchronization() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    host = {"out_raw": np.zeros(40, np.uint16), "lse_raw": np.zeros(7, np.float32)}
    out, lse = s._outputs(host, {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}, "cuda")
    out.a[3] = 0x1234  # what the kernel wrote
    lse.a.view(np.float32)[6] = 2.5
    pairs = [(host["out_raw"], s.device_buffers["out_raw"]),
             (host["lse_raw"], s.device_buffers["lse_raw"])]
    s._download(pairs, "cuda")
    assert fake.syncs == 1 and fake.pinned_allocations == 1
    downloads = [c for c in fake.copies if c[0] == "cpu" and c[1] == "cuda"]
    assert len(downloads) == 2 and all(nb for _, _, _, nb in downloads), "queued asynchronously"
    assert host["out_raw"][3] == 0x1234 and (np.delete(host["out_raw"], 3) == 0x7FA5).all()
    assert host["lse_raw"][6] == 2.5 and (host["lse_raw"][:6].view(np.uint32) == 0x7FA5A5A5).all()
    # Without pinned memory: a copy each, straight into the shared buffers.
    fake = FakeTorch(pin_fails=True)
    s = make_server(fake)
    host = {"out_raw": np.zeros(40, np.uint16), "lse_raw": np.zeros(7, np.float32)}
    out, _ = s._outputs(host, {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}, "cuda")
    out.a[0] = 0x4321
    s._download([(host["out_raw"], s.device_buffers["out_raw"]),
                 (host["lse_raw"], s.device_buffers["lse_raw"])], "cuda")
    assert host["out_raw"][0] == 0x4321 and (host["lse_raw"].view(np.uint32) == 0x7FA5A5A5).all()
    with pytest.raises(ValueError, match="not contiguous"):
        s._download([(np.zeros((4, 4), np.uint16)[:, ::2], s.device_buffers["out_raw"])], "cuda")


@pytest.mark.parametrize("env, budget", [
    ({}, 4 << 30),
    ({"MLAFUZZ_DEVICE_CACHE": "0"}, None),
    ({"MLAFUZZ_DEVICE_CACHE_BYTES": "512M"}, 512 << 20),
    ({"MLAFUZZ_DEVICE_CACHE_BYTES": "1000"}, 1000),
    ({"MLAFUZZ_DEVICE_CACHE_BYTES": "2g"}, 2 << 30),
])
def test_the_budget_comes_from_the_environment(env: Dict[str, str], budget: Optional[int]) -> None:
    assert device_cache.device_cache_budget(env) == budget


def test_a_bad_budget_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="MLAFUZZ_DEVICE_CACHE_BYTES"):
        device_cache.device_cache_budget({"MLAFUZZ_DEVICE_CACHE_BYTES": "lots"})


class FakeCudart:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.registered: list = []
        self.unregistered: list = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
        if self.refuse:
            return 1  # cudaErrorInvalidValue
        self.registered.append((ptr, size, flags))
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.unregistered.append(ptr)
        return 0


def registered_server() -> Tuple[FakeTorch, FakeCudart, server.Server, Any]:
    """A server whose (fake) fd 3, a 64 KiB mapping returned last, is page-locked."""
    import mmap  # noqa: PLC0415

    fake = FakeTorch()
    cudart = FakeCudart()
    fake.cuda.cudart = lambda: cudart
    s = make_server(fake)
    s.registered = None
    region = mmap.mmap(-1, 1 << 16)
    s._register_shm(region)
    return fake, cudart, s, region


def test_outputs_come_back_straight_into_registered_shared_memory() -> None:
    fake, cudart, s, region = registered_server()
    s._register_shm(region)  # the same mapping: registered once
    assert len(cudart.registered) == 1 and cudart.registered[0][1] == 1 << 16
    assert fake.frombuffers == 1  # one host tensor over the mapping, sliced by every copy
    shm = np.frombuffer(region, dtype=np.uint8)
    host = {"out_raw": shm[:80].view(np.uint16), "lse_raw": shm[128:156].view(np.float32)}
    out, lse = s._outputs(host, {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}, "cuda")
    out.a[3] = 0x1234
    sums = np.zeros(2, np.int64)  # not in fd 3: through the staging buffer
    s._download([(host["out_raw"], s.device_buffers["out_raw"]),
                 (host["lse_raw"], s.device_buffers["lse_raw"]),
                 (sums, FakeTensor(np.array([5, 7], np.int64).view(np.uint8), fake, "cuda"))],
                "cuda")
    downloads = [c for c in fake.copies if c[0] == "cpu" and c[1] == "cuda"]
    assert len(downloads) == 3 and all(nb for _, _, _, nb in downloads)
    assert fake.pinned_allocations == 1 and fake.syncs == 1
    assert host["out_raw"][3] == 0x1234 and (host["lse_raw"].view(np.uint32) == 0x7FA5A5A5).all()
    assert sums.tolist() == [5, 7]
    # Only fd 3 in the call: no staging buffer at all.
    fake2 = FakeTorch()
    fake2.cuda.cudart = lambda: cudart
    s2 = make_server(fake2)
    s2.registered = s.registered
    o2, _ = s2._outputs(host, {"out_canary": 1, "lse_canary": 2}, "cuda")
    s2._download([(host["out_raw"], s2.device_buffers["out_raw"])], "cuda")
    assert fake2.pinned_allocations == 0 and fake2.syncs == 1 and host["out_raw"][0] == 1
    # A refusal leaves the staging path for good.
    s3 = make_server(FakeTorch())
    s3.torch.cuda.cudart = lambda: FakeCudart(refuse=True)
    s3.registered = None
    s3._register_shm(region)
    assert s3.registered is False and s3._registered_at(host["out_raw"]) is None
    del shm, host, out, lse, o2


def lend_indices_in_fd3(s: server.Server, region: Any, seed: int) -> Tuple[Any, ...]:
    """_to_device of inputs(seed) with the indices as mlafuzz lends them: copied into fd 3 (no
    identity); q and the cache in the arena (pageable here: through the staging). Checks that
    every input reached the device intact; returns (fd 3 bytes, the indices there, the inputs,
    the device tensors)."""
    shm = np.frombuffer(region, dtype=np.uint8)
    a = inputs(seed)
    in_shm = shm[256:256 + a["indices_raw"].nbytes].view(np.int32)
    in_shm[:] = a["indices_raw"]
    a["indices_raw"] = in_shm
    dev, _ = s._to_device(a, {"ids": {"q_raw": 1, "kv_cache": 2}}, "cuda")
    for name in a:
        assert device_bytes(dev[name]) == host_bytes(a[name]), name
    return shm, in_shm, a, dev


def test_inputs_in_registered_shared_memory_go_straight_to_the_device() -> None:
    fake, _, s, region = registered_server()
    shm, in_shm, a, dev = lend_indices_in_fd3(s, region, 3)
    uploads_ = [c for c in fake.copies if c[0] == "cuda" and c[1] == "cpu"]
    assert len(uploads_) == 3 and all(nb for _, _, _, nb in uploads_), "all asynchronous"
    # The staging holds q and then the cache; where the indices would follow it is untouched
    # (torch.empty's garbage, 0xEE here): they came by DMA from fd 3.

    def up64(n: int) -> int:
        return (n + 63) // 64 * 64

    after = up64(a["q_raw"].nbytes) + up64(a["kv_cache"].nbytes)
    assert (s.staging.a[: a["q_raw"].nbytes].view(np.uint16) == a["q_raw"]).all()
    assert (s.staging.a[after:after + a["indices_raw"].nbytes] == 0xEE).all()
    del shm, in_shm, a, dev


def test_the_typed_output_views_are_kept_until_the_buffer_or_size_changes() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    req = {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}
    host = {"out_raw": np.zeros(40, np.uint16), "lse_raw": np.zeros(8, np.float32)}
    out, lse = s._outputs(host, req, "cuda")
    out2, lse2 = s._outputs(host, req, "cuda")
    assert out2 is out and lse2 is lse
    out.a[:] = 0  # a kernel wrote everything: the next call's fill restores the canaries
    s._outputs(host, req, "cuda")
    assert (out.a.view(np.uint16) == 0x7FA5).all()
    smaller = {"out_raw": np.zeros(20, np.uint16), "lse_raw": np.zeros(8, np.float32)}
    out3, _ = s._outputs(smaller, req, "cuda")
    assert out3 is not out and out3.a.nbytes == 40
    bigger = {"out_raw": np.zeros(400, np.uint16), "lse_raw": np.zeros(8, np.float32)}
    out4, _ = s._outputs(bigger, req, "cuda")
    assert out4.a.nbytes == 800 and s.device_buffers["out_raw"].numel() == 800


def test_kept_views_are_reused_only_for_the_same_tensor_and_geometry() -> None:
    s = make_server(FakeTorch())
    base = FakeTensor(np.arange(8, dtype=np.uint8), s.torch, "cuda")
    made = []

    def make(t: FakeTensor) -> FakeTensor:
        made.append(t)
        return t[:4]

    v1 = s._kept_view("x", 4, base, make)
    assert s._kept_view("x", 4, base, make) is v1 and len(made) == 1
    # Another tensor with the same bytes and geometry (a freed buffer's successor): rebuilt.
    other = FakeTensor(base.a.copy(), s.torch, "cuda")
    v2 = s._kept_view("x", 4, other, make)
    assert v2 is not v1 and v2.a.base is other.a and len(made) == 2
    assert s._kept_view("x", 5, other, make) is not v2 and len(made) == 3  # another geometry
    # One entry per name: nothing but the last call's tensors is kept alive.
    assert len(s.views) == 1 and s.views["x"][0] is other


def test_the_checksums_come_back_into_kept_pinned_memory_or_none() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    a = s._pinned_sums(3)
    assert a is not None and a.numel() == 3 and fake.pinned_allocations == 1
    assert s._pinned_sums(5).a.base is a.a.base and fake.pinned_allocations == 1  # kept (16)
    assert s._pinned_sums(40).numel() == 40 and fake.pinned_allocations == 2  # grown
    s._stage(100)  # the staging is its own buffer
    assert fake.pinned_allocations == 3
    refused = make_server(FakeTorch(pin_fails=True))
    assert refused._pinned_sums(3) is None and refused.sums_host is False
    assert refused._stage(10) is None and refused.staging is False


class FakeDriver:
    """CudaDriver's calls on host memory (the fake device tensors are numpy arrays): the copies
    and fills really move bytes, so a wrong address or size shows in the buffers."""

    def __init__(self, sums: bool = True) -> None:
        self.calls: list = []
        self.sums = sums  # False: the driver refused the checksum kernel (torch sums)

    def sum64_ready(self) -> bool:
        return self.sums

    def sum64(self, buffers: list, dst: int, stream: int) -> bool:
        """What mlafuzz_sum64 computes: int64 dst[i] = the words at p_i summed modulo 2^64."""
        assert self.sums
        self.calls.append(("sum64", [n for _, n in buffers], stream))
        out = (ctypes.c_int64 * len(buffers)).from_address(dst)
        for i, (p, n) in enumerate(buffers):
            words = np.ctypeslib.as_array((ctypes.c_uint64 * n).from_address(p))
            with np.errstate(over="ignore"):
                out[i] = int(np.array(words.sum(dtype=np.uint64)).view(np.int64))
        return True

    def htod(self, dst: int, src: int, n: int, stream: int) -> None:
        self.calls.append(("htod", n, stream))
        ctypes.memmove(dst, src, n)

    def dtoh(self, dst: int, src: int, n: int, stream: int) -> None:
        self.calls.append(("dtoh", n, stream))
        ctypes.memmove(dst, src, n)

    def _fill(self, dst: int, value: int, count: int, ctype: Any) -> None:
        (ctype * count).from_address(dst)[:] = [value] * count

    def fill16(self, dst: int, value: int, count: int, stream: int) -> None:
        self.calls.append(("fill16", count, stream))
        self._fill(dst, value, count, ctypes.c_uint16)

    def fill32(self, dst: int, value: int, count: int, stream: int) -> None:
        self.calls.append(("fill32", count, stream))
        self._fill(dst, value, count, ctypes.c_uint32)

    def synchronize(self) -> None:
        self.calls.append(("sync",))


def test_the_driver_path_moves_the_same_bytes_as_torch_would() -> None:
    fake, _, s, region = registered_server()
    s.cu, s.stream = FakeDriver(), 7
    shm, in_shm, a, dev = lend_indices_in_fd3(s, region, 5)
    # Only the fd 3 input went through the driver, on torch's current stream; the arena inputs
    # (pageable) through the staging and torch.
    # The two new cache entries' checksums: one launch after the copies (64-bit words).
    words = [a["q_raw"].nbytes // 8, (a["kv_cache"].nbytes + 7) // 8]
    assert s.cu.calls == [("htod", a["indices_raw"].nbytes, 7), ("sum64", words, 7)]
    s.cu.calls.clear()
    host = {"out_raw": shm[1024:1104].view(np.uint16), "lse_raw": shm[1152:1180].view(np.float32)}
    out, lse = s._outputs(host, {"out_canary": 0x7FA5, "lse_canary": 0x7FA5A5A5}, "cuda")
    assert (out.a == 0x7FA5).all() and (lse.a.view(np.uint32) == 0x7FA5A5A5).all()
    assert s.cu.calls == [("fill16", 40, 7), ("fill32", 7, 7)]
    out.a[5] = 0x1234
    # The kept buffer beyond the call's size is not the call's: never filled, never copied.
    s.device_buffers["out_raw"].a[80:] = 0x33
    s._download([(host["out_raw"], s.device_buffers["out_raw"]),
                 (host["lse_raw"], s.device_buffers["lse_raw"])], "cuda")
    assert s.cu.calls[2:] == [("dtoh", 80, 7), ("dtoh", 28, 7), ("sync",)]
    assert host["out_raw"][5] == 0x1234 and (np.delete(host["out_raw"], 5) == 0x7FA5).all()
    assert (host["lse_raw"].view(np.uint32) == 0x7FA5A5A5).all()
    assert (shm[1104:1152] == 0).all() and (shm[1180:1200] == 0).all(), "nothing outside them"
    assert fake.syncs == 0, "the driver synchronized, not torch"
    del shm, in_shm, a, dev, host, out, lse


def test_the_driver_is_off_when_asked_and_errors_name_the_call() -> None:
    assert driver.CudaDriver.load({"MLAFUZZ_CUDA_DRIVER": "0"}) is None

    class Lib:  # a libcuda whose every call fails with CUDA_ERROR_ILLEGAL_ADDRESS (700)
        def __getattr__(self, name: str) -> Any:
            def f(*args: Any) -> int:
                if name == "cuGetErrorName":
                    args[1]._obj.value = b"CUDA_ERROR_ILLEGAL_ADDRESS"
                    return 0
                return 700

            return f

    cu = driver.CudaDriver(Lib())
    with pytest.raises(RuntimeError, match=r"cuCtxSynchronize: CUDA driver error 700 "
                                           r"\(CUDA_ERROR_ILLEGAL_ADDRESS\)"):
        cu.synchronize()
    with pytest.raises(RuntimeError, match="cuMemcpyDtoHAsync"):
        cu.dtoh(0, 0, 1, 0)


@pytest.mark.parametrize("kv_bytes", [4096, 4100])  # whole int64 words, and a tail
def test_the_driver_sums_the_cached_inputs_in_one_launch_and_catches_a_write(
        kv_bytes: int) -> None:
    fake = FakeTorch()
    s = make_server(fake)
    s.cu, s.stream = FakeDriver(), 9
    a = inputs(4, kv_bytes)
    req = {"ids": {"q_raw": 21, "kv_cache": 22}}
    dev, keys = s._to_device(a, req, "cuda")
    words = [a["q_raw"].nbytes // 8, (kv_bytes + 7) // 8]
    # The new entries: one launch into the "before" slots, their checksums pending until read.
    assert s.cu.calls == [("sum64", words, 9)]
    assert [c for _, _, c, _ in keys] == [server._SUM_PENDING] * 2
    queued = s._queue_sums(keys)
    assert s.cu.calls[1:] == [("sum64", words, 9)] and len(queued.a) == server._SUM_BEFORE + 2
    assert written(s, keys) == ""
    # Warm: the checksums are ints now; one launch for both, read back as two sums.
    s.cu.calls.clear()
    dev, keys = s._to_device(a, req, "cuda")
    assert s.cu.calls == [] and all(isinstance(c, int) for _, _, c, _ in keys)
    with np.errstate(over="ignore"):
        expect = int(np.array(a["q_raw"].view(np.uint64).sum(dtype=np.uint64)).view(np.int64))
    assert keys[0][2] == expect, "the driver's sum is torch.sum's of the int64 words"
    assert len(s._queue_sums(keys).a) == 2 and s.cu.calls == [("sum64", words, 9)]
    assert written(s, keys) == ""
    dev["kv_cache"].a[kv_bytes - 1] ^= 0x01  # the kernel stores into its cache input
    assert written(s, keys) == "kv_cache"
    assert fake.sum_calls == 0, "torch summed nothing"


def test_without_the_checksum_kernel_torch_sums_as_before() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    s.cu = FakeDriver(sums=False)
    a = inputs(6)
    req = {"ids": {"q_raw": 31, "kv_cache": 32}}
    dev, keys = s._to_device(a, req, "cuda")
    assert not any(c[0] == "sum64" for c in s.cu.calls)
    assert written(s, keys) == ""
    dev, keys = s._to_device(a, req, "cuda")
    dev["q_raw"].a[0] ^= 1
    assert written(s, keys) == "q_raw"
    assert fake.sum_calls == 2 + 2 + 2  # two entries put, then "now" twice


class SumLib:
    """A libcuda for CudaDriver.sum64: records the module, the memsets and each launch's grid,
    block and the nine parameters cuLaunchKernel reads through its pointer array."""

    def __init__(self, load_rc: int = 0) -> None:
        self.load_rc = load_rc
        self.ptx = b""
        self.memsets: list = []
        self.launches: list = []

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    def cuModuleLoadData(self, module: Any, image: Any) -> int:  # noqa: N802
        self.ptx = image.value
        return self.load_rc

    def cuModuleGetFunction(self, func: Any, module: Any, name: Any) -> int:  # noqa: N802
        assert name.value == b"mlafuzz_sum64"
        func._obj.value = 0xF00
        return 0

    def cuCtxGetDevice(self, dev: Any) -> int:  # noqa: N802
        return 0

    def cuDeviceGetAttribute(self, value: Any, attr: int, dev: Any) -> int:  # noqa: N802
        assert attr == 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        value._obj.value = 132
        return 0

    def cuMemsetD32Async(self, dst: int, value: int, count: int, stream: int) -> int:  # noqa: N802
        self.memsets.append((dst, value, count, stream))
        return 0

    def cuGetErrorName(self, rc: int, name: Any) -> int:  # noqa: N802
        name._obj.value = b"CUDA_ERROR_INVALID_PTX"
        return 0

    @property
    def cuLaunchKernel(self) -> Any:  # noqa: N802 - CudaDriver sets argtypes on it
        lib = self

        def launch(f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int,
                   stream: int, argv: Any, extra: Any) -> int:
            params = [ctypes.c_uint64.from_address(argv[i]).value for i in range(9)]
            lib.launches.append(((gx, gy, gz), (bx, by, bz), smem, stream, params))
            return 0

        launch.argtypes = None
        return _Settable(launch)


class _Settable:
    """A callable that accepts argtypes and restype as ctypes functions do."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def __call__(self, *args: Any) -> Any:
        return self.f(*args)


def sum_driver(lib: SumLib) -> driver.CudaDriver:
    """A CudaDriver over lib with only what sum64 reaches: the memset, the error names."""
    cu = object.__new__(driver.CudaDriver)
    cu._lib, cu._ctypes = lib, ctypes
    cu._sum_fn, cu.sum_error = None, ""
    cu._d32, cu._name = lib.cuMemsetD32Async, lib.cuGetErrorName
    return cu


def test_the_driver_launch_packs_the_buffers_grid_and_parameters() -> None:
    lib = SumLib()
    cu = sum_driver(lib)
    bufs = [(0x1000, 2_600_000), (0x9000, 300), (0xA000, 1), (0xB000, 8), (0xC000, 5000)]
    assert cu.sum64(bufs, 0x5000, 3)
    assert lib.ptx.startswith(b".version") and b"mlafuzz_sum64" in lib.ptx
    assert lib.memsets == [(0x5000, 0, 10, 3)], "the five sums zeroed first"
    (g1, b1, m1, s1, p1), (g2, b2, m2, s2, p2) = lib.launches
    # Four buffers a launch; blocks: ~4 words a thread, at most two per multiprocessor.
    assert g1 == (264, 4, 1) and b1 == (256, 1, 1) and m1 == 0 and s1 == 3
    assert p1 == [0x1000, 2_600_000, 0x9000, 300, 0xA000, 1, 0xB000, 8, 0x5000]
    assert g2 == (5, 1, 1) and p2 == [0xC000, 5000, 0, 0, 0, 0, 0, 0, 0x5000 + 32]


def test_a_refused_checksum_kernel_leaves_torch_the_sums_and_says_why() -> None:
    lib = SumLib(load_rc=218)
    cu = sum_driver(lib)
    assert cu.sum64([(0x1000, 8)], 0x5000, 0) is False and not lib.launches
    assert cu.sum_error == ("cuModuleLoadData(mlafuzz_sum64): CUDA driver error 218 "
                            "(CUDA_ERROR_INVALID_PTX)")
    assert cu.sum64_ready() is False and lib.ptx, "tried once, not again"


@pytest.mark.parametrize("env, share", [
    ({}, 4 << 30),  # one worker: the default budget
    ({"MLAFUZZ_DEVICE_WORKERS": "32"}, (140 << 30) // 128),  # a quarter of the GPU, split
    ({"MLAFUZZ_DEVICE_WORKERS": "2"}, 4 << 30),  # the share is above the default
    ({"MLAFUZZ_DEVICE_WORKERS": "32", "MLAFUZZ_DEVICE_CACHE_BYTES": "4G"}, 4 << 30),  # as set
])
def test_the_workers_on_one_gpu_share_a_quarter_of_its_memory(env: Dict[str, str],
                                                              share: int) -> None:
    assert device_cache.device_cache_share(4 << 30, 140 << 30, env) == share


def test_a_bad_worker_count_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="MLAFUZZ_DEVICE_WORKERS"):
        device_cache.device_cache_share(4 << 30, 140 << 30, {"MLAFUZZ_DEVICE_WORKERS": "0"})


class OutOfMemoryError(RuntimeError):  # the name torch gives its error
    pass


@pytest.mark.parametrize("failures, status", [(1, "ok"), (2, "fault")])
def test_out_of_memory_in_the_staging_releases_what_the_worker_keeps_and_retries_once(
        failures: int, status: str) -> None:
    # Many workers on one GPU (64 in an H200 campaign) can run out of device memory while
    # staging cases, which must not become fault findings of the kernel: the worker drops its
    # cache, its kept buffers and torch's unused memory, and stages again; only a second failure
    # is a fault, and its message says that other processes hold the memory.
    fake = FakeTorch()
    emptied: list = []
    fake.cuda.empty_cache = lambda: emptied.append(1)
    s = make_server(fake)
    s.device = "cuda"
    s.timer = timing._NO_TIMER
    s.device_buffers["out_raw"] = "kept"
    s.device_cache.put(("id", 8), "tensor", 8)
    calls: list = []

    def stage(call: Any, a: Any, req: Any, dev: Any) -> list:
        calls.append(dict(s.device_buffers))
        if len(calls) <= failures:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        return []

    s._stage_call = stage
    s._call_kernel = lambda call: (None, 0.001)
    s._finish_cuda = lambda a, dev, keys, err, seconds: {"status": "ok", "message": ""}
    r = s._run_cuda(types.SimpleNamespace(), {}, {})
    assert r["status"] == status
    assert len(calls) == 2 and calls[1] == {} and emptied == [1]
    assert s.device_cache.bytes == 0
    if status == "fault":
        assert "out of device memory even with this worker's buffers released" in r["message"]
        assert "OutOfMemoryError" in r["message"]


def test_another_staging_error_is_a_fault_at_once() -> None:
    fake = FakeTorch()
    s = make_server(fake)
    s.device = "cuda"
    s.timer = timing._NO_TIMER
    calls: list = []

    def stage(call: Any, a: Any, req: Any, dev: Any) -> list:
        calls.append(1)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    s._stage_call = stage
    r = s._run_cuda(types.SimpleNamespace(), {}, {})
    assert r["status"] == "fault" and calls == [1]
    assert r["message"].startswith("CUDA staging failed:\n")
