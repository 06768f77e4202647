"""mlafuzz.replay: run a kernel in this process on a corpus entry or a ``run --dump`` folder.

The case's bytes, the float64 reference and the tolerance bound all come from the ``mlafuzz``
executable (``mlafuzz run --dump``: the materializer, the oracle and the tolerance model are
its); this module only lays the dumped buffers out as the worker does, calls the kernel and
compares.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

import mlafuzz
from mlafuzz._call import GUARD, LSE_CANARY, OUT_CANARY, arrays_from_dump, host_out


class ReplayFailure(AssertionError):
    """The kernel's result on the replayed case fails the tolerance property (or writes outside
    its outputs). ``first`` and ``worst`` describe elements (dicts: array, b, s, h, d, value,
    reference, error, excess, bound, ratio); ``result`` is the :class:`Replay`."""

    def __init__(self, message: str, first: Optional[Dict[str, Any]],
                 worst: Optional[Dict[str, Any]], result: "Replay") -> None:
        super().__init__(message)
        self.first, self.worst, self.result = first, worst, result


@dataclasses.dataclass
class Replay:
    """A kernel run in this process on a replayed case.

    Attributes:
        call: the call the kernel got (its out and lse as it left them).
        dump: the dump the call was built from (inputs, the oracle's out64/lse64, the bounds).
        backend: the backend name mlafuzz ran the kernel as.
        out: float64 ``[B, (s_q,) H, d_v]``, the kernel's out (bf16 values).
        lse: float64 ``[B, (s_q,) H]``.
        failing: how many elements fail (beyond the bound or non-finite where the reference is
            not, or the other way round).
        first, worst: the first failing element (row-major: a row's out, then its lse) and the
            one with the largest error/bound (what ``mlafuzz repro`` reports), as dicts; None
            when none.
        tightness: the largest error/bound over the finite elements.
        worker_same_bits: whether mlafuzz's worker run of the same case (in the dump) gave the
            same bits; None when the dump has none.
    """

    call: Any
    dump: Any
    backend: str
    out: np.ndarray
    lse: np.ndarray
    failing: int
    first: Optional[Dict[str, Any]]
    worst: Optional[Dict[str, Any]]
    tightness: float
    worker_same_bits: Optional[bool]


def _dump_case(exe: str, case_path: str, backend: str, folder: str, timeout: str) -> None:
    from mlafuzz._executable import run_env  # noqa: PLC0415 - the package's own module

    cmd = [exe, "run", "--case", case_path, "--backends", backend, "--dump", folder,
           "--case-timeout", timeout]
    proc = subprocess.run(cmd, env=run_env(exe), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode not in (0, 1) or not os.path.isfile(os.path.join(folder, "params.json")):
        raise RuntimeError(f"mlafuzz run --dump exited with {proc.returncode}:\n{proc.stdout}"
                           f"\ncommand: {' '.join(cmd)}")


def _suffix(backend: str) -> str:
    return "_" + backend.replace("/", "_")  # as `mlafuzz run --dump` names a backend's files


def _bf16_interval(v: np.ndarray) -> Any:
    """Every real that rounds (to nearest even) to the bf16 value v: [lo, hi] (tolerance.h)."""
    a = np.abs(v)
    mant, exp = np.frexp(a)  # a = mant * 2^exp, mant in [0.5, 1)
    ex = exp - 1
    ulp = np.ldexp(1.0, ex - 7)
    pow2 = (mant == 0.5) & (ex > -126)
    away = np.where(a < 2.0**-126, 2.0**-134, ulp / 2)
    toward = np.where(a < 2.0**-126, 2.0**-134, np.where(pow2, ulp / 4, ulp / 2))
    lo = np.where(v > 0, v - toward, v - away)
    hi = np.where(v > 0, v + away, v + toward)
    lo = np.where(a == 0, -(2.0**-134), lo)
    hi = np.where(a == 0, 2.0**-134, hi)
    return lo, hi


def _klass(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x), 1, np.where(x == np.inf, 2, np.where(x == -np.inf, 3, 0)))


def _element(kind: str, index: int, heads: int, s_q: int, dims: int, value: float,
             bits: int, reference: float, error: float, excess: float, bound: float,
             ratio: Optional[float]) -> Dict[str, Any]:
    rh, d = divmod(index, dims + 1)
    row, h = divmod(rh, heads)
    e = {"array": kind, "row": row, "b": row // s_q, "s": row % s_q, "h": h,
         "d": d if kind == "out" else None, "value": value, "bits": bits,
         "reference": reference, "error": error, "excess": excess, "bound": bound,
         "ratio": ratio}
    return e


def describe(e: Dict[str, Any], s_q: int = 1) -> str:
    """``out[b=0,h=3,d=17] value ... (bf16 0x....) reference ... |error| ... bound ...``."""
    where = f"b={e['b']}" + (f",s={e['s']}" if s_q > 1 else "") + f",h={e['h']}"
    if e["array"] == "out":
        where += f",d={e['d']}"
        fmt = f"bf16 0x{e['bits']:04x}"
    else:
        fmt = f"fp32 0x{e['bits']:08x}"
    text = (f"{e['array']}[{where}] value {e['value']:.9g} ({fmt}) reference "
            f"{e['reference']:.17g}")
    if e["ratio"] is None:
        return text + " (non-finite where the reference is not, or the other way round)"
    text += f" |error| {e['error']:.17g}"
    if e["excess"] != e["error"]:
        text += f" (beyond rounding {e['excess']:.17g})"
    return text + f" bound {e['bound']:.17g} error/bound {e['ratio']:.9g}"


def _compare(out_bits: np.ndarray, lse: np.ndarray, ref_out: np.ndarray, ref_lse: np.ndarray,
             b_out: np.ndarray, b_lse: np.ndarray, heads: int, s_q: int) -> Dict[str, Any]:
    """The tolerance property's check, element by element (properties/tolerance.h)."""
    dims = ref_out.shape[-1]
    ov = mlafuzz.bf16_to_float32(out_bits).astype(np.float64).reshape(-1, dims)
    rv, bo = ref_out.reshape(-1, dims), b_out.reshape(-1, dims)
    lv = lse.astype(np.float64).reshape(-1)
    lr, bl = ref_lse.reshape(-1), b_lse.reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = _bf16_interval(ov)
        excess = np.maximum(np.maximum(rv - hi, lo - rv), 0.0)
        err = np.abs(ov - rv)
        lerr = np.abs(lv - lr)
    finite = np.isfinite(ov) & np.isfinite(rv)
    lfinite = np.isfinite(lv) & np.isfinite(lr)
    table = {
        "excess": np.concatenate([np.where(finite, excess, 0), np.where(lfinite, lerr, 0)[:, None]],
                                 axis=1),
        "error": np.concatenate([np.where(finite, err, 0), np.where(lfinite, lerr, 0)[:, None]],
                                axis=1),
        "bound": np.concatenate([bo, bl[:, None]], axis=1),
        "value": np.concatenate([ov, lv[:, None]], axis=1),
        "reference": np.concatenate([rv, lr[:, None]], axis=1),
    }
    ex, bd = table["excess"], table["bound"]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ex <= 0, 0.0, np.where(bd > 0, ex / bd, np.inf))
    both_finite = np.concatenate([finite, lfinite[:, None]], axis=1)
    mismatch = np.concatenate([_klass(ov) != _klass(rv), (_klass(lv) != _klass(lr))[:, None]],
                              axis=1)
    failing = (both_finite & (ratio > 1)) | mismatch
    bits = np.concatenate([out_bits.reshape(-1, dims).astype(np.int64),
                           lse.astype(np.float32).reshape(-1).view(np.uint32)
                           .astype(np.int64)[:, None]], axis=1)

    def element(i: int, nonfinite: bool) -> Dict[str, Any]:
        flat = {k: float(v.reshape(-1)[i]) for k, v in table.items()}
        kind = "lse" if i % (dims + 1) == dims else "out"
        return _element(kind, i, heads, s_q, dims, flat["value"], int(bits.reshape(-1)[i]),
                        flat["reference"], flat["error"], flat["excess"], flat["bound"],
                        None if nonfinite else float(ratio.reshape(-1)[i]))

    flat_fail = np.flatnonzero(failing)
    first = element(int(flat_fail[0]), bool(mismatch.reshape(-1)[flat_fail[0]])) \
        if flat_fail.size else None
    ranked = np.where(both_finite, ratio, -1.0).reshape(-1)
    worst_i = int(np.argmax(ranked)) if ranked.size else -1
    worst = element(worst_i, False) if worst_i >= 0 and ranked[worst_i] >= 0 else None
    tight = float(ranked.max()) if ranked.size and ranked.max() >= 0 else 0.0
    return {"failing": int(flat_fail.size), "first": first, "worst": worst, "tightness": tight}


def _to_device(call: Any, a: Dict[str, np.ndarray]) -> Callable[[], None]:
    """device="cuda": the call's arrays as torch tensors on the current device, with the call's
    strides (q and out as bfloat16); returns the function that copies the device outputs back
    into a["out_raw"] and a["lse_raw"]."""
    import torch  # noqa: PLC0415 - only device kernels need torch

    dev = torch.device("cuda", torch.cuda.current_device())

    def upload(raw: np.ndarray) -> Any:
        host = np.array(raw)  # writable: torch.from_numpy warns on read-only arrays
        return torch.from_numpy(host.view(np.int16) if host.dtype == np.uint16 else host).to(dev)

    def strided(base: Any, view: np.ndarray, raw: np.ndarray, offset: int = 0) -> Any:
        return base.as_strided(view.shape, tuple(s // raw.itemsize for s in view.strides),
                               offset)

    call.q = strided(upload(a["q_raw"]).view(torch.bfloat16), a["q"], a["q_raw"])
    call.indices = strided(upload(a["indices_raw"]), a["indices"], a["indices_raw"])
    for name in ("kv_cache", "topk_length", "sink", "extra_kv_cache", "extra_topk_length"):
        x = a.get(name)
        setattr(call, name, None if x is None else upload(x))
    if "extra_indices" in a:
        call.extra_indices = strided(upload(a["extra_indices_raw"]), a["extra_indices"],
                                     a["extra_indices_raw"])
    out_dev, lse_dev = upload(a["out_raw"]), upload(a["lse_raw"])
    call.out = strided(out_dev.view(torch.bfloat16), a["out"], a["out_raw"], GUARD)
    call.lse = strided(lse_dev, a["lse"], a["lse_raw"], GUARD)
    call.stream = torch.cuda.current_stream()

    def back() -> None:
        torch.cuda.synchronize()
        a["out_raw"][...] = out_dev.cpu().numpy().view(np.uint16)
        a["lse_raw"][...] = lse_dev.cpu().numpy()

    return back


def _canaries_changed(a: Dict[str, np.ndarray]) -> List[str]:
    """Which guard elements (outside the out and lse views) the kernel wrote."""
    changed = []
    for name, canary in (("out", OUT_CANARY), ("lse", LSE_CANARY)):
        raw = a[name + "_raw"]
        bits = raw.view(np.uint16 if name == "out" else np.uint32)
        inside = np.zeros(raw.shape, dtype=bool)
        view = a[name]
        mask: np.ndarray = np.ndarray(view.shape, dtype=bool, buffer=inside,
                                      offset=GUARD * inside.itemsize,
                                      strides=tuple(s // raw.itemsize for s in view.strides))
        mask[...] = True
        bad = np.flatnonzero(~inside & (bits != canary))
        if bad.size:
            changed.append(f"{name}: {bad.size} element(s) outside the {name} view, the first "
                           f"at raw offset {int(bad[0]) - GUARD} (0 = {name}[0, 0...]; a "
                           f"kernel writes only d_v elements per head)")
    return changed


def _host_call(dump: Any, where: str) -> Any:
    """(the host call of a dump, its arrays by name, raw buffers included)."""
    from mlafuzz.worker.protocol import scalar_fields  # noqa: PLC0415 - the worker's field reader

    if "call" not in dump.params:
        raise ValueError(f"{where}: a dump of an older mlafuzz (no \"call\" in params.json); "
                         f"write it again: mlafuzz run --case {where}/case.json --dump DIR")
    fields = scalar_fields(dump.params["call"])
    call = mlafuzz.DecodeCall(memory="host", **fields)
    a = arrays_from_dump(fields, dump.arrays)
    call.q, call.kv_cache, call.indices = a["q"], a["kv_cache"], a["indices"]
    call.topk_length, call.sink = a.get("topk_length"), a.get("sink")
    call.extra_kv_cache, call.extra_indices = a.get("extra_kv_cache"), a.get("extra_indices")
    call.extra_topk_length = a.get("extra_topk_length")
    call.out, call.lse = host_out(a["out"]), a["lse"]
    return call, a


def load_call(dump: Union[str, "os.PathLike[str]", Any]) -> Any:
    """The host call (numpy arrays) of a ``mlafuzz run --dump`` folder (or a loaded
    :class:`mlafuzz.Dump`): the inputs as a kernel gets them, with the call's strides,
    read-only; ``out`` and ``lse`` fresh, filled with canaries (NaNs).
    """
    if not isinstance(dump, mlafuzz.Dump):
        where = os.fspath(dump)
        dump = mlafuzz.load_dump(where)
    else:
        where = "dump"
    return _host_call(dump, where)[0]


def _load_or_write_dump(source: str, backend: str, timeout: str) -> Tuple[Any, str]:
    """(the dump to replay, its folder): ``source`` itself when it is a dump folder with the
    bound for ``backend``, else a dump that ``mlafuzz run --dump`` writes of its case."""
    from mlafuzz import testing  # noqa: PLC0415 - testing imports this package
    work = tempfile.mkdtemp(prefix="mlafuzz-replay-")
    try:
        folder = source
        have_bound = os.path.isfile(os.path.join(source, f"bound_out{_suffix(backend)}.npy"))
        if not os.path.isdir(source) or not have_bound:
            case = os.path.join(source, "case.json") if os.path.isdir(source) else source
            if not os.path.isfile(case):
                raise FileNotFoundError(f"mlafuzz.replay: {source} is neither a case file nor a "
                                        "`mlafuzz run --dump` folder (no case.json)")
            folder = os.path.join(work, "dump")
            _dump_case(testing.find_mlafuzz(), case, backend, folder, timeout)
        dump = mlafuzz.load_dump(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # load_dump read every array
    return dump, folder


def _run_kernel(decode: Callable[..., Any], info: Any, dump: Any, folder: str) -> Any:
    """(the call, its arrays by name) after ``decode`` ran on the dump's call, on the device
    when the kernel declares one (its outputs copied back into the host arrays)."""
    __tracebackhide__ = True  # noqa: F841 - pytest: show the test's line, not this helper's
    call, a = _host_call(dump, folder)
    back = None
    if info.device != "cpu":
        call.memory = "device"
        back = _to_device(call, a)
    decode(call)
    if back is not None:
        back()
    return call, a


def _same_bits_as_worker(dump: Any, a: Any, sfx: str) -> Optional[bool]:
    """Whether the kernel's out has the bits of the worker's run in the dump (None: no such
    run)."""
    worker = dump.arrays.get("out" + sfx)
    if worker is None:
        return None
    return bool(np.array_equal(
        worker.astype(np.float32).view(np.uint32),
        mlafuzz.bf16_to_float32(np.asarray(a["out"])).view(np.uint32)))


def _failure_message(name: str, source: str, check: Dict[str, Any], total: int,
                     guards: List[str], same: Optional[bool], s_q: int) -> str:
    """The text of the ReplayFailure of kernel ``name`` on ``source``."""
    lines = [f"mlafuzz.replay: {name} fails the tolerance property on {source}:"]
    if check["first"] is not None:
        lines.append("  first failing element: " + describe(check["first"], s_q))
    if check["worst"] is not None and check["worst"]["ratio"] > 1:
        lines.append("  worst (as mlafuzz repro reports it): " + describe(check["worst"], s_q))
    if check["failing"]:
        lines.append(f"  {check['failing']} of {total} elements fail")
    lines += [f"  wrote outside its outputs: {g}" for g in guards]
    if same is False:
        lines.append("  (mlafuzz's worker run of this case gave other bits: the kernel is not "
                     "deterministic, or depends on the process)")
    lines.append("  the call, the outputs and the reference: this exception's .result "
                 "(.call, .out, .dump['out64'])")
    return "\n".join(lines)


def replay(entry_or_dump: Union[str, "os.PathLike[str]"], decode: Callable[..., Any], *,
           timeout: str = "60s") -> Replay:
    """Runs ``decode`` in this process on a corpus entry (or case file) or a ``run --dump``
    folder, and compares its outputs with the float64 reference under the tolerance bound.

    The ``mlafuzz`` executable materializes the case (``mlafuzz run --case ENTRY --backends
    <decode> --dump TMP``: the same bytes as in the campaign, the oracle's out64/lse64 and the
    kernel's bound); the call is laid out from the dump with the worker's strides, the kernel
    runs here (an exception in it propagates, so ``pytest --pdb`` stops in the kernel), and the
    result is checked element by element as the tolerance property checks it.

    Args:
        entry_or_dump: a corpus entry or case file (.json), or a folder written by
            ``mlafuzz run --dump`` (its bound for ``decode`` is computed again when missing).
        decode: the kernel, a function decorated with ``@mlafuzz.kernel`` at the top level of
            its file.
        timeout: the worker's time limit when mlafuzz runs the kernel for the dump.
    Returns:
        Replay when every element is within the bound.
    Raises:
        ReplayFailure (an AssertionError): the first failing element, the worst one (what
            ``mlafuzz repro`` reports), the count; or the kernel wrote outside its outputs.
        Whatever the kernel raises.
    """
    __tracebackhide__ = True  # noqa: F841 - pytest: show the test's line, not this helper's
    from mlafuzz import testing  # noqa: PLC0415 - testing imports this package
    info = getattr(decode, "__mlafuzz_kernel__", None)
    if info is None:
        raise TypeError("mlafuzz.replay(..., decode): decorate decode with @mlafuzz.kernel")
    backend = testing.backend_name(decode)
    source = os.path.abspath(os.fspath(entry_or_dump))
    dump, folder = _load_or_write_dump(source, backend, timeout)
    call, a = _run_kernel(decode, info, dump, folder)
    fields = dump.params["call"]
    sfx = _suffix(backend)
    s_q = int(fields["s_q"])
    check = _compare(np.asarray(a["out"]), a["lse"], dump["out64"], dump["lse64"],
                     dump["bound_out" + sfx], dump["bound_lse" + sfx], int(fields["heads"]), s_q)
    same = _same_bits_as_worker(dump, a, sfx)
    result = Replay(call, dump, backend, mlafuzz.bf16_to_float32(np.asarray(a["out"]))
                    .astype(np.float64), np.asarray(a["lse"], dtype=np.float64),
                    check["failing"], check["first"], check["worst"], check["tightness"], same)
    guards = _canaries_changed(a)
    if check["failing"] or guards:
        message = _failure_message(getattr(decode, '__name__', 'decode'), source, check,
                                   a["out"].size + a["lse"].size, guards, same, s_q)
        raise ReplayFailure(message, check["first"], check["worst"], result)
    return result
