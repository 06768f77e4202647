"""A failure that was seen is never dropped, whatever ends the campaign.

Kernels that hang (on the first call, on the fifth, by stopping their own process) or crawl
with a bug, as python: kernels and as C plugins in a worker, fuzzed under a time budget shorter
than their shrink: every failure seen is a finding in report.json and JUnit, saved to the
corpus (nothing else is left there), the exit status is 1, and `mlafuzz repro` of each entry
reproduces it. The budgets are short and the assertions do not depend on where the budget
ends (before a shrink, during it, or after the hang cap stops it).
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import time
from typing import Any, Dict, List, Tuple
from xml.etree import ElementTree

import pytest

import mlafuzz.testing
from conftest import ROOT, describe, mlafuzz_cmd

STALLING = "python:tests/python/stalling_kernels.py"
PLUGINS = os.environ.get("MLAFUZZ_TEST_PLUGINS", "")
HANG = "no reply within the case timeout (hang)"


def plugin(path: str) -> str:
    if not PLUGINS:
        pytest.skip("MLAFUZZ_TEST_PLUGINS (the built tests/plugins folder) is not set")
    return f"plugin:{os.path.join(PLUGINS, path)}"


def fuzz(backend: str, work: str, *args: str) -> subprocess.CompletedProcess:
    return mlafuzz_cmd("fuzz", "--backends", backend, "--seed", "1", "--jobs", "1",
                       "--corpus", os.path.join(work, "corpus"),
                       "--report", os.path.join(work, "report"), "--progress", "plain", *args)


def nothing_seen(work: str) -> bool:
    """Whether a campaign ended before any failure showed (no failing outcome, no finding)."""
    with open(os.path.join(work, "report", "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    return not report["findings"] and not any(row["failures"] for row in report["results"])


def fuzz_until_a_failure_is_seen(backend: str, tmp: str) -> Tuple[subprocess.CompletedProcess, str]:
    """`fuzz --time T --case-timeout 1s` with T = 2 s, then longer budgets while a run ended
    before the kernel's first failure showed (a loaded machine starts a worker slowly, or the
    first cases are ones the kernel refuses): such a run tests nothing this file is about."""
    for budget in ("2s", "6s", "15s"):
        work = os.path.join(tmp, budget)
        proc = fuzz(backend, work, "--time", budget, "--case-timeout", "1s")
        if proc.returncode != 0 or not nothing_seen(work):
            break
    return proc, work


def kept_findings(proc: subprocess.CompletedProcess, work: str) -> List[Dict[str, Any]]:
    """Exit 1, and every failure seen is a finding of the report, of JUnit and of the corpus."""
    assert proc.returncode == 1, describe(proc)
    with open(os.path.join(work, "report", "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    assert report["complete"], describe(proc)
    findings = report["findings"]
    assert findings, describe(proc)
    for row in report["results"]:
        if row["failures"]:
            # A worker fault is a fault finding, whichever run of the case met it.
            kept = [f for f in findings if f["backend"] == row["backend"]
                    and f["property"] in (row["property"], "fault")]
            assert kept, f"{row['property']} failed, no finding\n{describe(proc)}"
    corpus = sorted(glob.glob(os.path.join(work, "corpus", "*.json")))
    assert corpus == sorted(os.path.abspath(f["corpus"]) for f in findings), describe(proc)
    # JUnit as its reader sees it: the texts unescaped (a cause set may hold "<").
    root = ElementTree.parse(os.path.join(work, "report", "junit.xml")).getroot()
    junit = "\n".join(t for e in root.iter() for t in (e.text or "", *e.attrib.values()))
    for finding in findings:
        with open(finding["corpus"], encoding="utf-8") as f:
            entry = json.load(f)["finding"]
        assert entry["expect"] == "fail" and entry["signature"] == finding["signature"], entry
        assert entry.get("shrink_note", "") == finding.get("shrink_note", ""), entry
        assert f"finding {finding['signature']} seen" in junit, describe(proc)
    return findings


def check_repro(finding: Dict[str, Any], hang: bool) -> None:
    """The printed repro command, as pasted (it names the binary under test), reproduces."""
    assert shlex.split(finding["repro"])[0].startswith(("/", "MLAFUZZ_")), finding["repro"]
    proc = subprocess.run(finding["repro"], shell=True, cwd="/", text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    assert proc.returncode == 1, describe(proc)
    assert "(the finding persists)" in proc.stdout, describe(proc)
    if finding["property"] == "fault":
        assert "fault(s) (the finding persists)" in proc.stdout, describe(proc)
    if hang:
        assert HANG in proc.stdout, describe(proc)


# (backend, whether its failures are hangs); `plugin:` paths are under MLAFUZZ_TEST_PLUGINS.
SCENARIOS = {
    "hangs-first-call": (f"{STALLING}:decode_sleeps", "faulty/libfaulty_hang.so", True),
    "hangs-fifth-call": (f"{STALLING}:decode_hangs_fifth",
                         "stalling/libstalling_hang_fifth.so", True),
    "sigstop": (f"{STALLING}:decode_stops_itself", "stalling/libstalling_stop.so", True),
    "slow-buggy": (f"{STALLING}:decode_slow_wrong", "stalling/libstalling_slow_wrong.so", False),
}


@pytest.mark.parametrize("kind", ["python", "plugin"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_end_of_the_time_budget_keeps_every_failure(tmp_path: Any, scenario: str,
                                                        kind: str) -> None:
    python_name, plugin_path, hangs = SCENARIOS[scenario]
    backend = python_name if kind == "python" else plugin(plugin_path)
    proc, work = fuzz_until_a_failure_is_seen(backend, str(tmp_path))
    findings = kept_findings(proc, work)
    for finding in findings:
        if hangs:
            # A hang cannot be shrunk to its end within 2 s of 1 s timeouts.
            assert finding["property"] == "fault", describe(proc)
            assert finding.get("shrink_note"), describe(proc)
        check_repro(finding, hangs and finding["property"] == "fault")


def test_a_campaign_that_completed_almost_nothing_says_so(tmp_path: Any) -> None:
    # The plugin hangs on case 0: its timeout, then the shrink, spend the budget.
    work = str(tmp_path)
    proc = fuzz(plugin("faulty/libfaulty_hang.so"), work, "--time", "2s", "--case-timeout", "1s")
    kept_findings(proc, work)
    want = "1 case(s) completed in "
    assert want in proc.stdout and "the backends were too slow or hung; see the failures above" \
        in proc.stdout, describe(proc)
    with open(os.path.join(work, "report", "report.json"), encoding="utf-8") as f:
        warnings = json.load(f)["campaign"]["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith(want), warnings


def test_a_shrink_whose_steps_keep_hanging_stops_after_a_few(tmp_path: Any) -> None:
    # Case 0 of seed 1 is refused (s_q > 1), case 1 hangs: a fault whose every shrink step would
    # cost the case timeout. The case budget, not the time, ends this campaign.
    work = str(tmp_path)
    proc = fuzz(f"{STALLING}:decode_sleeps", work, "--cases", "2", "--case-timeout", "1s")
    findings = kept_findings(proc, work)
    assert len(findings) == 1, describe(proc)
    assert findings[0]["shrink_note"] == \
        "shrinking stopped after 3 evaluations that hung (each costs --case-timeout)", \
        describe(proc)
    check_repro(findings[0], True)


def test_a_second_signal_keeps_the_failure_being_shrunk(tmp_path: Any) -> None:
    # Case 1's clean run is wrong (a tolerance failure, saved at once), then every call hangs for
    # a minute: two signals stop the campaign during the shrink's first step.
    work = str(tmp_path)
    corpus = os.path.join(work, "corpus")
    cmd = [mlafuzz.testing.find_mlafuzz(), "fuzz", "--backends",
           f"{STALLING}:decode_wrong_then_hangs", "--properties", "tolerance", "--seed", "1",
           "--jobs", "1", "--time", "5m", "--case-timeout", "60s", "--corpus", corpus,
           "--report", os.path.join(work, "report"), "--progress", "plain"]
    with subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as child:
        deadline = time.monotonic() + 60
        while not glob.glob(os.path.join(corpus, "*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    proc = subprocess.CompletedProcess(cmd, child.returncode, out)
    findings = kept_findings(proc, work)
    assert len(findings) == 1, describe(proc)
    assert findings[0]["property"] == "tolerance", describe(proc)
    # The entry is saved when the failure is claimed, just before its shrink starts: on a loaded
    # machine the signals can fall between the two.
    assert findings[0]["shrink_note"] in ("a signal stopped the campaign while shrinking",
                                          "a signal stopped the campaign before shrinking"), \
        describe(proc)
    check_repro(findings[0], False)
