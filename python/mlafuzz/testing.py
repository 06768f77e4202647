"""pytest helpers: fuzz a Python kernel, replay a corpus (docs/python.md, "Testing in pytest").

    import mlafuzz
    from my_kernel import decode

    def test_decode():
        mlafuzz.testing.fuzz(decode, cases=300)

Both run the ``mlafuzz`` executable (:func:`find_mlafuzz`: ``MLAFUZZ_BIN``, else ``mlafuzz`` on
PATH, else the one installed inside this package, else the source tree's ``build/mlafuzz``). Its
python: workers run the interpreter running the test (``sys.executable``) unless
``MLAFUZZ_PYTHON`` says otherwise, and import this very package.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from mlafuzz._executable import PACKAGE_DIR, find_mlafuzz, run_env

__all__ = ["RECOMMENDED_CI_CASES", "CorpusEntry", "FuzzResult", "backend_name", "corpus",
           "find_mlafuzz", "fuzz"]

#: The case budget recommended for a CI job: 300 generated cases of the default profile with
#: the default seed. A case budget (not a time budget) makes the run the same on every machine:
#: the same cases, the same verdict (23-28 s, shrinking included, for a numpy kernel with one
#: planted bug on a shared two-core machine).
RECOMMENDED_CI_CASES = 300

#: A kernel as the helpers take it: the decorated function, or a backend name
#: (``"python:path/to/file.py:func"``, ``"python:package.module:func"``, any built-in name).
Kernel = Union[str, Callable[..., Any]]


def _caller_dir() -> str:
    """The folder of the first calling file outside this package (the test file), else cwd."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if os.path.dirname(filename) != PACKAGE_DIR and os.path.isfile(filename):
            return os.path.dirname(filename)
        frame = frame.f_back  # type: ignore[assignment]
    return os.getcwd()


def backend_name(kernel: Kernel, base_dir: Optional[str] = None) -> str:
    """The backend name mlafuzz runs ``kernel`` as, with its file made absolute.

    Args:
        kernel: a function decorated with ``@mlafuzz.kernel`` and defined at the top level of its
            module (mlafuzz loads it by name from its file), or a backend name; ``file.py:func``
            without the ``python:`` prefix is taken as a python: backend.
        base_dir: folder a relative kernel file is resolved against first (default: the folder
            of the calling test file); when the file is not there, the current directory.
    Raises:
        TypeError: a function that is not a decorated kernel, or not reachable by name.
    """
    if callable(kernel) and not isinstance(kernel, str):
        func = kernel
        if not hasattr(func, "__mlafuzz_kernel__"):
            raise TypeError(f"{getattr(func, '__qualname__', func)!r} is not an mlafuzz kernel; "
                            'decorate it with @mlafuzz.kernel(name="...")')
        module = sys.modules.get(getattr(func, "__module__", "") or "")
        path = getattr(module, "__file__", None)
        name = getattr(func, "__name__", "")
        if module is None or not path or getattr(module, name, None) is not func:
            raise TypeError(
                f"{getattr(func, '__qualname__', name)!r}: mlafuzz runs a kernel in its own worker "
                "process and loads it by name from its file, so define it at the top level of a "
                ".py file (not inside a function or a class) and import it from there")
        return f"python:{os.path.abspath(path)}:{name}"
    name = str(kernel)
    if not name.startswith("python:") and ".py:" in name:
        name = "python:" + name
    if not name.startswith("python:"):
        return name
    target, sep, func_name = name[len("python:"):].rpartition(":")
    if not sep or not (target.endswith(".py") or os.sep in target) or os.path.isabs(target):
        return name
    base = base_dir if base_dir is not None else _caller_dir()
    beside_test = os.path.join(base, target)
    path = beside_test if os.path.exists(beside_test) or not os.path.exists(target) else target
    return f"python:{os.path.abspath(path)}:{func_name}"


def _kernel_id(backend: str) -> str:
    """A folder name for a backend: ``file.func`` for a python: kernel, else the name."""
    if backend.startswith("python:"):
        target, _, func = backend[len("python:"):].rpartition(":")
        stem = os.path.splitext(os.path.basename(target))[0] if target.endswith(".py") else target
        backend = f"{stem}.{func}"
    return re.sub(r"[^A-Za-z0-9._~-]", "_", backend)


def _run(cmd: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)


# ---- One group per bug -------------------------------------------------------------------

#: Outcome lines of `mlafuzz repro` (format_outcome): "  PROPERTY on BACKEND: VERDICT".
_OUTCOME = re.compile(r"^  (\S+) on (.+?): (not applicable \((.*)\)|pass|FAIL(?:: (.*))?)$")


def _entry(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _case_of(path: str) -> Dict[str, Any]:
    data = _entry(path)
    return data.get("case", data) if data else {}


def _size(case: Dict[str, Any]) -> Tuple[int, ...]:
    return (int(case.get("batch", 1)) * int(case.get("s_q", 1)) * int(case.get("heads", 64))
            * int(case.get("topk", 128)), int(case.get("topk", 128)))


def _short(values: Any, limit: int = 16) -> str:
    text = json.dumps(values, separators=(",", ":"))
    return text if len(text) <= 24 * limit else text[: 24 * limit] + "...]"


def counterexample(case: Dict[str, Any]) -> str:
    """One line: the minimal case's shape, geometry, index lists, lengths, sink, conventions and
    values, as the recipe (a corpus entry's ``case``) gives them."""
    if not case:
        return "(case unreadable)"
    g = case.get("geometry", {})
    layout = g.get("layout", "model1")
    parts = [f"B={case.get('batch', 1)} H={case.get('heads', 64)} topk={case.get('topk', 128)}"]
    if int(case.get("s_q", 1)) > 1:
        parts[0] += f" s_q={case['s_q']}"
    nope = g.get("nope_dim", 512 if layout == "v32" else 448)
    geo = (f"{layout} nope={nope} rope={g.get('rope_dim', 64)} "
           f"scale_tile={g.get('scale_tile', 128 if layout == 'v32' else 64)} "
           f"page_size={g.get('page_size', 256)} pages={g.get('num_pages', 1)}")
    if g.get("page_stride"):
        geo += f" page_stride={g['page_stride']}"
    if g.get("page_order"):
        geo += f" page_order={_short(g['page_order'])}"
    parts.append(geo)
    if "indices" in case:
        parts.append(f"indices={_short(case['indices'])}")
    parts.append(f"topk_length={_short(case['topk_length'])}" if "topk_length" in case
                 else "no topk_length")
    parts.append(f"sink={_short(case['sink'])}" if "sink" in case else "no sink")
    extra = case.get("extra")
    if extra:
        eg = extra.get("geometry", {})
        text = f"extra cache: topk={extra.get('topk')} page_size={eg.get('page_size')}"
        if "indices" in extra:
            text += f" indices={_short(extra['indices'])}"
        if "topk_length" in extra:
            text += f" topk_length={_short(extra['topk_length'])}"
        parts.append(text)
    conv = case.get("conventions", {})
    if conv:
        parts.append(" ".join(f"{k}={json.dumps(conv[k]).strip(chr(34))}" for k in
                              ("invalid_index", "empty_lse", "sink_in_lse") if k in conv))
    for key in ("q_head_pad", "out_head_pad", "q_batch_pad", "out_batch_pad", "indices_row_pad",
                "lse_row_pad"):
        if case.get(key):
            parts.append(f"{key}={case[key]}")
    values = []
    for key in ("q_values", "kv_values", "rope_values"):
        v = case.get(key)
        if isinstance(v, dict):
            values.append(f"{key[:-7]} {v.get('dist')} x{v.get('magnitude')}")
    scales = case.get("scales")
    if isinstance(scales, dict):
        values.append(f"scales {scales.get('mode')} [{scales.get('exp_lo')}, "
                      f"{scales.get('exp_hi')}]")
    if values:
        parts.append(", ".join(values) + f", data_seed {case.get('data_seed', 0)}")
    return "; ".join(parts)


def _failure_kind(f: Dict[str, Any]) -> str:
    """What kind of failure a finding is: fault, exception, guard, non-finite, bitwise, bound."""
    detail = str(f.get("detail") or "")
    if f.get("property") == "fault":
        return "fault (crash, exit or hang)"
    if "raised an exception" in detail or "run of the transformed case failed" in detail:
        return "the kernel raised an exception"
    if "guard elements overwritten" in detail:
        return "wrote outside its outputs"
    if f.get("nonfinite_mismatch"):
        return "non-finite where the reference is not (or the other way round)"
    if "differ" in detail:
        return "bitwise difference"
    return "error beyond the bound"


def _detail_lines(detail: str) -> List[str]:
    """The lines of a finding's detail worth inlining: the first, and for an exception the
    kernel's innermost frame and the exception itself (not the worker's frames)."""
    lines = [x for x in detail.splitlines() if x.strip()]
    if not lines:
        return []
    if "Traceback" in detail:  # the group's head says that the kernel raised
        shown = []
    else:  # "PROPERTY on BACKEND: FAIL: what" -> "what", without the statistics in brackets
        first = re.sub(r"^\S+ on .+?: FAIL: ", "", lines[0])
        shown = [re.sub(r" \[max\|d\| .*\]$", "", first)]
    if "Traceback" in detail:
        frames = [x.strip() for x in lines if x.strip().startswith("File ")
                  and os.sep + "mlafuzz" + os.sep + "_worker.py" not in x]
        if frames:
            shown.append(frames[-1])
        exception = [x.strip() for x in lines if not x.startswith((" ", "this case has"))]
        if exception:
            shown.append(exception[-1])
    return shown


#: A kernel that declares nothing about s_q or the extra cache but fails only on cases that have
#: them is told so once (a group of its own) instead of once per property and shape.
_FEATURE_HINTS = {
    "s_q": "this case has {s_q} query tokens per batch row (s_q > 1); declare "
           "mlafuzz.Envelope(s_q=1) if your kernel takes one query token",
    "extra_cache": "this case has an extra cache; declare mlafuzz.Envelope(extra_cache=False) "
                   "if your kernel does not take one",
}


def _feature(f: Dict[str, Any], case: Dict[str, Any], undeclared: Sequence[str]) -> str:
    """The undeclared feature a finding needs (its minimal case has it), or ""."""
    if "extra_cache" in undeclared and (case.get("extra") or f.get("property") == "move-to-extra"):
        return "extra_cache"
    if "s_q" in undeclared and (int(case.get("s_q", 1)) > 1 or f.get("property") == "query-alone"):
        return "s_q"
    return ""


def group_findings(findings: Sequence[Dict[str, Any]], undeclared: Sequence[str] = ()
                   ) -> List[Dict[str, Any]]:
    """report.json's findings (or corpus entries' findings) as the groups :func:`fuzz` lists.

    mlafuzz reports one finding per bug (its group: backend, failure kind and cause set of its
    canonical minimal case), so each finding is one group here. A group: ``key`` (backend,
    failure kind, causes), ``signature``, ``findings`` (the one finding), ``failures`` (the raw
    failures it folds), ``properties`` (every property failing on its minimal case), ``hint``
    (the envelope advice when its case needs a feature the kernel does not declare,
    ``undeclared``: "s_q", "extra_cache"; else ""), ``case`` (its minimal case). Findings written
    before groups existed (no ``kind``) name their kind from their detail.
    """
    out = []
    for f in findings:
        case = _case_of(str(f.get("corpus") or ""))
        feature = _feature(f, case, undeclared)
        kind = str(f.get("kind") or _failure_kind(f))
        causes = "; ".join(f.get("causes") or [])
        key = (str(f.get("backend")), kind, causes)
        hint = _FEATURE_HINTS.get(feature, "")
        out.append({"key": key,
                    "signature": str(f.get("signature") or " | ".join(key)),
                    "findings": [f],
                    "failures": int(f.get("count") or 1),
                    "properties": list(f.get("properties") or [f.get("property")]),
                    "hint": hint.format(s_q=case.get("s_q", "several")) if hint else "",
                    "case": case})
    out.sort(key=lambda g: str(g["key"]))
    return out


def format_group(g: Dict[str, Any], number: int, kernel_expr: str) -> str:
    """A group as a few lines: its signature, what fails and where, the counterexample inline,
    the repro command and the in-process replay."""
    first = g["findings"][0]
    raw = first.get("raw") or []
    # An undeclared feature's advice leads: what the kernel's author does about it.
    head = f"{g['hint']}: {g['signature']}" if g["hint"] else g["signature"]
    lines = [f"[{number}] {head}",
             f"    fails {', '.join(map(str, g['properties']))}; {g['failures']} raw failure(s) "
             f"folded" + (f" in {len(raw)} class(es)" if len(raw) > 1 else "")]
    if first.get("locus"):
        lines.append(f"    where: {first['locus']}")
    lines.append("    counterexample: " + counterexample(g["case"])
                 + ("" if first.get("shrunk", True) else " (not shrunk)"))
    for line in _detail_lines(str(first.get("detail") or "")):
        lines.append("    " + line)
    lines.append(f"    reproduce: {first.get('repro')}")
    if first.get("corpus"):
        lines.append(f"    debug in this process: mlafuzz.replay({str(first['corpus'])!r}, "
                     f"{kernel_expr})")
    return "\n".join(lines)


# ---- fuzz ----------------------------------------------------------------------------------


@dataclasses.dataclass
class FuzzResult:
    """A campaign that found nothing.

    Attributes:
        report: report.json as a dict.
        output: what mlafuzz printed.
        report_dir: the report folder (deleted when it was a temporary one).
        corpus_dir: the kernel's corpus folder (its findings, replayed before each campaign).
        replayed: the earlier findings replayed first, each now passing ("fixed").
        known: the findings (new or replayed) that the ``known`` ledger holds.
    """

    report: Dict[str, Any]
    output: str
    report_dir: str
    corpus_dir: str = ""
    replayed: List[str] = dataclasses.field(default_factory=list)
    known: List[Dict[str, Any]] = dataclasses.field(default_factory=list)


def _kernel_info(backend: str, kernel: Kernel) -> Any:
    """The KernelInfo of a python: backend (None when it cannot be loaded here)."""
    info = getattr(kernel, "__mlafuzz_kernel__", None)
    if info is not None or not backend.startswith("python:"):
        return info
    try:
        from mlafuzz._worker import load_kernel  # noqa: PLC0415 - only for python: names

        return load_kernel(backend[len("python:"):])[1]
    except Exception:  # noqa: BLE001 - mlafuzz itself reports a kernel that does not load
        return None


def _undeclared(info: Any) -> List[str]:
    """The production-decode features a kernel's envelope says nothing about."""
    if info is None:
        return []
    env = info.envelope or {}
    out = []
    if "s_q" not in env:
        out.append("s_q")
    if "extra_cache" not in (env.get("refuses") or []) and info.extra_cache is None:
        out.append("extra_cache")
    return out


def _load_known(path: str) -> List[Dict[str, Any]]:
    """The entries of a known-failure ledger (docs/nightly.md); mlafuzz itself checks the file."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    entries = data.get("known") if isinstance(data, dict) else None
    if data.get("format") != "mlafuzz-known" or not isinstance(entries, list):
        raise RuntimeError(f"{path}: not a known-failure ledger (format mlafuzz-known)")
    return [e for e in entries if isinstance(e, dict)]


def _known_id(finding: Dict[str, Any], entries: List[Dict[str, Any]]) -> str:
    """The id of the first ledger entry matching the finding ("" when none), with the rules of
    mlafuzz's own matching: globs over backend, signature, any failing property, and each cause
    pattern against one cause."""
    props = [finding.get("property", "")] + list(finding.get("properties") or [])
    causes = list(finding.get("causes") or [])
    for e in entries:
        if not fnmatch.fnmatchcase(finding.get("backend", ""), e.get("backend", "*")):
            continue
        if e.get("signature") and not fnmatch.fnmatchcase(finding.get("signature", ""),
                                                          e["signature"]):
            continue
        if e.get("property") and not any(fnmatch.fnmatchcase(p, e["property"]) for p in props):
            continue
        if not all(any(fnmatch.fnmatchcase(c, pat) for c in causes)
                   for pat in e.get("causes") or []):
            continue
        return str(e.get("id", "?"))
    return ""


def _replay_corpus(corpus_dir: str, backend: str, env: Dict[str, str]
                   ) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Replays every finding of the corpus folder on the backend.

    Returns:
        (the findings that still fail, as report.json findings with the current detail, the
        entries now fixed).
    """
    failing: List[Dict[str, Any]] = []
    fixed: List[str] = []
    if not os.path.isdir(corpus_dir):
        return failing, fixed
    exe = find_mlafuzz()
    for name in sorted(os.listdir(corpus_dir)):
        path = os.path.join(corpus_dir, name)
        data = _entry(path) if name.endswith(".json") else {}
        finding = data.get("finding") if isinstance(data.get("finding"), dict) else None
        if finding is None or finding.get("expect") != "fail":
            continue
        proc = _run([exe, "repro", path, "--backends", backend], env)
        if proc.returncode == 0:
            fixed.append(path)
            continue
        if proc.returncode != 1:
            raise RuntimeError(f"mlafuzz repro {path} exited with {proc.returncode}:\n"
                               f"{proc.stdout}")
        f = dict(finding)
        f["backend"], f["corpus"], f["shrunk"] = backend, path, True
        for line in proc.stdout.splitlines():
            m = _OUTCOME.match(line)
            if m and m.group(3).startswith("FAIL"):
                f["detail"] = m.group(5) or ""
                break
        lines = [x for x in proc.stdout.splitlines() if x.startswith("reproduce: ")]
        f["repro"] = lines[-1][len("reproduce: "):] if lines else f.get("repro")
        failing.append(f)
    return failing, fixed


def _kernel_expr(kernel: Any) -> str:
    """How the test names the kernel function: its name (a backend name's function part)."""
    if callable(kernel):
        return str(getattr(kernel, "__name__", "decode"))
    name = str(kernel).rpartition(":")[2]
    func, _, mutant = name.partition("~")
    return "mutant_" + mutant.replace("-", "_") if mutant else func or "decode"


def _groups_error(groups: List[Dict[str, Any]], title: str, footer: str, kernel: Any
                  ) -> AssertionError:
    text = [title] + [format_group(g, i + 1, _kernel_expr(kernel)) for i, g in enumerate(groups)]
    return AssertionError("\n".join(text + ([footer] if footer else [])))


def fuzz(
    kernel: Union[Kernel, Sequence[Kernel]],
    cases: Optional[int] = None,
    *,
    time: Optional[str] = None,
    seed: int = 1,
    properties: Optional[Sequence[str]] = None,
    jobs: Optional[int] = None,
    shrink_time: str = "60s",
    case_timeout: str = "60s",
    corpus: Optional[str] = None,
    report: Optional[str] = None,
    replay_corpus: bool = True,
    known: Optional[str] = None,
    extra_args: Sequence[str] = (),
) -> FuzzResult:
    """Replays the kernel's earlier findings, then runs ``mlafuzz fuzz`` on it; fails the test
    on any failure, with one short paragraph per bug.

    Args:
        kernel: the decorated function (``from my_kernel import decode``), a backend name
            (``"python:my_kernel.py:decode"``, a relative file resolved against the calling
            test file's folder first), or several.
        cases: case budget; default :data:`RECOMMENDED_CI_CASES` when ``time`` is not given
            either. Cases, not seconds, keep CI deterministic.
        time: time budget, e.g. "30s" (stops at whichever budget ends first).
        seed: campaign seed (the same seed generates the same cases).
        properties: property names (default: every property).
        jobs: evaluation threads (default: mlafuzz's, every core).
        shrink_time: wall-clock cap on shrinking per new finding, a safety net (the count of
            evaluations, ``--shrink-evals`` in extra_args, decides where a shrink stops).
        case_timeout: per-call timeout before a kernel counts as hung.
        corpus: the folder of the kernel's findings (default: ``<root>/<file>.<function>``,
            root ``MLAFUZZ_CORPUS_ROOT`` or else ``.mlafuzz`` beside the calling test file);
            its findings are replayed first and new ones are saved there, so that the next
            run replays them.
        report: report folder (default: a temporary folder, kept when something fails).
        replay_corpus: replay the corpus folder's findings before the campaign.
        known: a known-failure ledger (``mlafuzz fuzz --known``, docs/nightly.md): findings an
            entry holds do not fail the test; they are listed in ``FuzzResult.known``. An
            expired entry fails it.
        extra_args: more ``mlafuzz fuzz`` options.
    Returns:
        FuzzResult when nothing failed.
    Raises:
        AssertionError: earlier findings that still fail (the campaign is then skipped), or
            the campaign's findings: one entry per bug (finding group) with its signature
            (backend, failure kind, cause set), the properties it fails, the raw failures it
            folds, where it fails, its minimal counterexample, the failing element, the command
            that reproduces it and the ``mlafuzz.replay`` call that debugs it in this process;
            also when the kernel refused every case (nothing was tested).
        RuntimeError: mlafuzz refused the request (bad backend, kernel not loadable, ...).
    """
    __tracebackhide__ = True  # noqa: F841 - pytest: show the test's line, not this helper's
    kernels = [kernel] if isinstance(kernel, str) or callable(kernel) else list(kernel)
    base = _caller_dir()
    names = [backend_name(k, base) for k in kernels]
    exe = find_mlafuzz()
    env = run_env(exe)
    root = os.environ.get("MLAFUZZ_CORPUS_ROOT") or os.path.join(base, ".mlafuzz")
    corpus_dir = os.path.abspath(corpus) if corpus else os.path.join(
        root, "+".join(_kernel_id(n) for n in names))
    infos = [_kernel_info(n, k) for n, k in zip(names, kernels)]
    undeclared = sorted({x for i in infos for x in _undeclared(i)})

    replayed: List[str] = []
    known_path = os.path.abspath(os.path.join(base, known)) if known else ""
    entries = _load_known(known_path) if known else []
    known_found: List[Dict[str, Any]] = []
    if replay_corpus:
        failing, replayed = _replay_corpus(corpus_dir, ",".join(names), env)
        for entry in failing:
            entry["known"] = _known_id(entry, entries)
        known_found += [x for x in failing if x["known"]]
        failing = [x for x in failing if not x["known"]]
        if failing:
            groups = group_findings(failing, undeclared)
            raise _groups_error(
                groups,
                f"mlafuzz: {len(groups)} bug(s) in {', '.join(names)}: its earlier findings "
                f"still fail ({len(failing)} of {len(failing) + len(replayed)} replayed from "
                f"{corpus_dir}; no new cases until they pass):",
                f"(fixed since: {len(replayed)})" if replayed else "", kernel)

    if cases is None and time is None:
        cases = RECOMMENDED_CI_CASES
    work = tempfile.mkdtemp(prefix="mlafuzz-pytest-")
    report_dir = os.path.abspath(report) if report else os.path.join(work, "report")
    cmd = [exe, "fuzz", "--backends", ",".join(names), "--seed", str(seed), "--shrink-time",
           shrink_time, "--case-timeout", case_timeout, "--corpus", corpus_dir, "--report",
           report_dir, "--progress", "plain"]
    if time is not None:
        cmd += ["--time", time]
    if properties:
        cmd += ["--properties", ",".join(properties)]
    if cases is not None:
        cmd += ["--cases", str(cases)]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    if known:
        cmd += ["--known", known_path]
    cmd += list(extra_args)
    proc = _run(cmd, env)
    if proc.returncode not in (0, 1):
        raise RuntimeError(
            f"mlafuzz fuzz exited with {proc.returncode}:\n{proc.stdout}\ncommand: "
            + " ".join(cmd)
        )
    try:
        with open(os.path.join(report_dir, "report.json"), encoding="utf-8") as f:
            rep = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"mlafuzz fuzz wrote no readable report ({e}):\n{proc.stdout}") from e
    findings = rep.get("findings", [])
    rows = rep.get("results", [])
    if known:
        known_found += [x for x in findings if x.get("known")]
        findings = [x for x in findings if not x.get("known")]
    if proc.returncode == 0 and not findings:
        untested = rows and all(r.get("not_applicable", 0) >= r.get("cases", 0) for r in rows)
        if untested:
            raise AssertionError(
                f"mlafuzz: nothing was tested: {', '.join(names)} refused all "
                f"{rows[0].get('cases')} cases (its supports() or envelope); report {report_dir}")
        if not report:
            shutil.rmtree(work, ignore_errors=True)
        return FuzzResult(rep, proc.stdout, report_dir, corpus_dir, replayed, known_found)
    if not findings and known:
        ledger = [x for x in proc.stdout.splitlines() if "known-failure ledger" in x
                  or x.startswith("  expired:") or x.startswith("--strict-known")]
        raise AssertionError("mlafuzz: the known-failure ledger fails the run:\n"
                             + "\n".join(ledger))
    if not findings:
        raise AssertionError(f"mlafuzz fuzz failed without a finding:\n{proc.stdout[-3000:]}")
    groups = group_findings(findings, undeclared)
    campaign = rep.get("campaign", {})
    raise _groups_error(
        groups,
        f"mlafuzz: {len(groups)} bug(s) in {', '.join(names)} "
        f"({campaign.get('cases', cases)} cases, seed {seed}; {len(findings)} finding(s)):",
        f"corpus: {corpus_dir} (replayed first next time); report: {report_dir}", kernel)


# ---- corpus --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CorpusEntry:
    """One corpus entry (or case file); ``replay()`` runs ``mlafuzz repro`` on it."""

    path: str

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.path))[0]

    @property
    def is_finding(self) -> bool:
        """True for an entry that recorded a failure (``"expect": "fail"``)."""
        finding = _entry(self.path).get("finding")
        return isinstance(finding, dict) and finding.get("expect") == "fail"

    def __str__(self) -> str:
        return self.name

    def replay(self, backends: Union[Kernel, Sequence[Kernel], None] = None,
               properties: Optional[Sequence[str]] = None) -> str:
        """Replays the entry; returns mlafuzz's output.

        Args:
            backends: the kernel (decorated function or backend name) or several (default:
                the finding's own, else every available built-in one).
            properties: property names (default: the finding's own, else all).
        Raises:
            AssertionError: a property fails: "still failing" for an entry that recorded a
                failure, "fails" for a regression entry or plain case; the message ends with
                the repro command.
            pytest.skip.Exception (when pytest is installed): the kernel supports none of it
                (every outcome not applicable), with the kernel's reason.
            RuntimeError: mlafuzz refused the entry (exit 2).
        """
        __tracebackhide__ = True  # noqa: F841 - pytest: show the test's line, not this helper's
        cmd = [find_mlafuzz(), "repro", self.path]
        if backends is not None:
            many = [backends] if isinstance(backends, str) or callable(backends) else backends
            base = _caller_dir()
            cmd += ["--backends", ",".join(backend_name(b, base) for b in many)]
        if properties:
            cmd += ["--properties", ",".join(properties)]
        proc = _run(cmd, run_env(cmd[0]))
        lines = proc.stdout.splitlines()
        shown = next((x[len("reproduce: "):] for x in reversed(lines)
                      if x.startswith("reproduce: ")), " ".join(cmd))
        if proc.returncode == 1:
            failed = [m.group(0).strip() for m in map(_OUTCOME.match, lines)
                      if m and m.group(3).startswith("FAIL")]
            verdict = "still failing" if self.is_finding else "fails"
            raise AssertionError(f"{self.name}: {verdict}: " + "\n".join(failed[:3])
                                 + f"\nreproduce: {shown}")
        if proc.returncode != 0:
            raise RuntimeError(f"{shown} exited with {proc.returncode}:\n{proc.stdout}")
        untested = [x for x in lines if x.startswith("not tested: ")]
        if untested:  # every outcome not applicable: `mlafuzz repro` says so on its last line
            reason = re.sub(r"^not tested: [^(]*\(", "", untested[-1]).rstrip(")")
            try:
                import pytest  # noqa: PLC0415 - optional
            except ImportError:
                return proc.stdout
            pytest.skip(f"{self.name}: not supported by the kernel: {reason}")
        return proc.stdout


def corpus(folder: str) -> List[Any]:
    """Corpus entries of a folder, for ``pytest.mark.parametrize`` (one test id per entry).

        @pytest.mark.parametrize("entry", mlafuzz.testing.corpus("corpus"))
        def test_corpus(entry):
            entry.replay(decode)

    Args:
        folder: the folder; a relative one is resolved against the calling test file's folder
            first, then the current directory.
    Returns:
        ``pytest.param(CorpusEntry, id=name)`` per ``*.json`` file (sorted), or plain
        CorpusEntry objects when pytest is not installed.
    Raises:
        FileNotFoundError: the folder does not exist.
    """
    beside = os.path.join(_caller_dir(), folder)
    where = beside if os.path.isdir(beside) else folder
    if not os.path.isdir(where):
        raise FileNotFoundError(f"corpus folder {folder} does not exist (looked at {beside} and "
                                f"{os.path.abspath(folder)})")
    entries = [CorpusEntry(os.path.abspath(os.path.join(where, n)))
               for n in sorted(os.listdir(where)) if n.endswith(".json")]
    try:
        import pytest  # noqa: PLC0415 - optional
    except ImportError:
        return list(entries)
    return [pytest.param(e, id=e.name) for e in entries]
