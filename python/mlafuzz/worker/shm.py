"""The shared memory mlafuzz passes to a worker (fd 3) and its shared arena, mapped."""

from __future__ import annotations

import mmap
import os
from typing import Optional


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
