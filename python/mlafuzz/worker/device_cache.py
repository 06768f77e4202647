"""The device="cuda" worker's input cache: device copies kept across calls within a byte budget."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Mapping, Optional, Tuple

from mlafuzz import _settings


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
    keep at most a quarter of the GPU's memory (16 threads and two Triton backends make 32
    workers: at 4G each they would exhaust an H200's memory). A budget set
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
    block's bytes (``SharedArena::publish``, core/shared_arena.h), new whenever they can
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
