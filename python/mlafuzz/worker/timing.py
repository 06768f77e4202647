"""Where a worker's calls spend their time, phase by phase (MLAFUZZ_WORKER_TIMING)."""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any, Dict, Tuple

import numpy as np


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


_NO_TIMER = _NoTimer()
