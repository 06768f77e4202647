"""pytest helpers: fuzz a Python kernel, replay a corpus.

    import mlafuzz.testing

    def test_my_kernel():
        mlafuzz.testing.fuzz("python:my_kernel.py:decode", time="30s")

Both run the ``mlafuzz`` executable: ``MLAFUZZ_BIN``, else ``mlafuzz`` on PATH, else the build
folder of the source tree this package sits in (``build/mlafuzz``). Its python: workers run the
interpreter running the test (``sys.executable``) unless ``MLAFUZZ_PYTHON`` says otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Union

__all__ = ["CorpusEntry", "FuzzResult", "corpus", "find_mlafuzz", "fuzz"]


def find_mlafuzz() -> str:
    """Path of the mlafuzz executable.

    Raises:
        FileNotFoundError: none found; the message says where it looked and how to point at one.
    """
    env = os.environ.get("MLAFUZZ_BIN")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise FileNotFoundError(f"MLAFUZZ_BIN={env} is not an executable file")
    on_path = shutil.which("mlafuzz")
    if on_path:
        return on_path
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    built = os.path.join(root, "build", "mlafuzz")
    if os.path.isfile(built) and os.access(built, os.X_OK):
        return built
    raise FileNotFoundError(
        "cannot find the mlafuzz executable (looked at MLAFUZZ_BIN, PATH and "
        f"{built}); build it (scripts/build.sh) or set MLAFUZZ_BIN=/path/to/mlafuzz"
    )


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MLAFUZZ_PYTHON", sys.executable)
    # The workers must import this very package, installed or not.
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.setdefault("MLAFUZZ_PYTHON_PACKAGE_DIR", package_parent)
    return env


@dataclasses.dataclass
class FuzzResult:
    """A campaign that found nothing: its report (report.json as a dict) and output."""

    report: Dict[str, Any]
    output: str
    report_dir: str


def _shrunk_size(corpus_path: str) -> str:
    try:
        with open(corpus_path, encoding="utf-8") as f:
            case = json.load(f)["case"]
        return f"B={case['batch']} H={case['heads']} topk={case['topk']}"
    except (OSError, KeyError, ValueError):
        return "size unknown"


def _finding_line(f: Dict[str, Any]) -> str:
    """One bug: its signature, where it fails, what fails, its first case and the repro."""
    props = ", ".join(f.get("properties") or [f.get("property", "?")])
    first = f"seed {f.get('seed')} case {f.get('case_index')}"
    if f.get("corpus"):
        first += f", shrunk to {_shrunk_size(f['corpus'])}"
    if not f.get("shrunk"):
        first += " (not shrunk)"
    text = (f"- {f.get('signature')}\n  fails {props}; {f.get('count', 1)} raw failure(s) "
            f"folded; first {first}")
    detail = (f.get("detail") or "").splitlines()
    if detail:
        text += f"\n  {detail[0]}"
    if f.get("locus"):
        text += f"\n  where: {f['locus']}"
    if f.get("inputs"):
        text += f"\n  {f['inputs']}"
    return text + f"\n  reproduce: {f.get('repro')}"


def fuzz(
    backend: Union[str, Sequence[str]],
    time: str = "30s",
    seed: int = 1,
    properties: Optional[Sequence[str]] = None,
    *,
    cases: Optional[int] = None,
    jobs: Optional[int] = None,
    shrink_time: str = "20s",
    case_timeout: str = "60s",
    corpus: Optional[str] = None,
    report: Optional[str] = None,
    extra_args: Sequence[str] = (),
) -> FuzzResult:
    """Runs ``mlafuzz fuzz`` on a backend and fails the test on any finding.

    Args:
        backend: ``"python:file.py:func"`` (or any backend name), or several.
        time: time budget, e.g. "30s", "5m".
        seed: campaign seed (the same seed replays the same cases).
        properties: property names (default: every property).
        cases: case budget (stops at whichever budget ends first).
        jobs: evaluation threads (default: mlafuzz's, every core).
        shrink_time: wall-clock cap on shrinking per new finding, a safety net (the count of
            evaluations, `--shrink-evals` in extra_args, decides where a shrink stops).
        case_timeout: per-call timeout before a kernel counts as hung.
        corpus: folder for findings (default: a temporary folder, kept when something fails).
        report: report folder (default: inside the corpus folder's parent temporary folder).
        extra_args: more ``mlafuzz fuzz`` options.
    Returns:
        FuzzResult when the campaign found nothing.
    Raises:
        AssertionError: one entry per bug (finding group): its signature (backend, failure
            kind, cause set), the properties it fails, how many raw failures it folds, its
            first case, where it fails, its minimal inputs, and the ``mlafuzz repro`` command
            that replays it.
        RuntimeError: mlafuzz refused the request (bad backend, kernel not loadable, ...).
    """
    names = [backend] if isinstance(backend, str) else list(backend)
    work = tempfile.mkdtemp(prefix="mlafuzz-pytest-")
    corpus_dir = corpus or os.path.join(work, "corpus")
    report_dir = report or os.path.join(work, "report")
    cmd = [find_mlafuzz(), "fuzz", "--backends", ",".join(names), "--time", time,
           "--seed", str(seed), "--shrink-time", shrink_time, "--case-timeout", case_timeout,
           "--corpus", corpus_dir, "--report", report_dir, "--progress", "plain"]
    if properties:
        cmd += ["--properties", ",".join(properties)]
    if cases is not None:
        cmd += ["--cases", str(cases)]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    cmd += list(extra_args)
    proc = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
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
    if proc.returncode == 0 and not findings:
        shutil.rmtree(work, ignore_errors=True)
        return FuzzResult(rep, proc.stdout, report_dir)
    raw = sum(int(f.get("count", 1)) for f in findings)
    lines = [f"mlafuzz found {len(findings)} bug(s) on {', '.join(names)} "
             f"({raw} raw failure(s) folded; seed {seed}; report {report_dir}):"]
    lines += [_finding_line(f) for f in findings]
    if not findings:
        lines.append(proc.stdout[-3000:])
    raise AssertionError("\n".join(lines))


@dataclasses.dataclass(frozen=True)
class CorpusEntry:
    """One corpus entry (or case file); ``replay()`` runs ``mlafuzz repro`` on it."""

    path: str

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.path))[0]

    def __str__(self) -> str:
        return self.name

    def replay(self, backends: Optional[str] = None,
               properties: Optional[Sequence[str]] = None) -> str:
        """Replays the entry; returns mlafuzz's output.

        Args:
            backends: comma-separated backends (default: the finding's own, else every
                available built-in one).
            properties: property names (default: the finding's own, else all).
        Raises:
            AssertionError: the failure persists (or, for a plain case, a property fails);
                the message ends with the repro command.
            RuntimeError: mlafuzz refused the entry (exit 2).
        """
        cmd = [find_mlafuzz(), "repro", self.path]
        if backends:
            cmd += ["--backends", backends]
        if properties:
            cmd += ["--properties", ",".join(properties)]
        proc = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False)
        shown = "mlafuzz repro " + " ".join(cmd[2:])
        if proc.returncode == 1:
            raise AssertionError(f"{self.name}: still failing\n{proc.stdout}\nreproduce: {shown}")
        if proc.returncode != 0:
            raise RuntimeError(f"{shown} exited with {proc.returncode}:\n{proc.stdout}")
        return proc.stdout


def corpus(folder: str) -> List[Any]:
    """Corpus entries of a folder, for ``pytest.mark.parametrize`` (one test id per entry).

        @pytest.mark.parametrize("entry", mlafuzz.testing.corpus("corpus"))
        def test_corpus(entry):
            entry.replay(backends="python:my_kernel.py:decode")

    Returns:
        ``pytest.param(CorpusEntry, id=name)`` per ``*.json`` file (sorted), or plain
        CorpusEntry objects when pytest is not installed.
    Raises:
        FileNotFoundError: the folder does not exist.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"corpus folder {folder} does not exist")
    entries = [CorpusEntry(os.path.join(folder, n)) for n in sorted(os.listdir(folder))
               if n.endswith(".json")]
    try:
        import pytest  # noqa: PLC0415 - optional
    except ImportError:
        return list(entries)
    return [pytest.param(e, id=e.name) for e in entries]
