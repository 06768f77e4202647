"""mlafuzz.testing as a pytest user meets it: a function or a name, paths beside the test file,
one paragraph per bug, the corpus replayed first, unsupported entries skipped."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import mlafuzz
import mlafuzz.testing
from conftest import FAULTY, ROOT, SMALL_CASE, full_or_quick

sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import numpy_decode  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PRODUCTION_CASE = os.path.join(ROOT, "corpus", "cases", "production_v4flash_s3_extra512.json")
# The campaigns' length; 20 under MLAFUZZ_TEST_QUICK: seed 3's first 20 cases find the planted
# bug (the tests below rely on it), seed 2's give both undeclared envelope fields.
CASES = full_or_quick(60, 20)


def _failure(*args, **kw) -> str:
    with pytest.raises(AssertionError) as failure:
        mlafuzz.testing.fuzz(*args, **kw)
    return str(failure.value)


def test_names_resolve_against_the_calling_test_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # not where the kernel file is
    assert mlafuzz.testing.backend_name("faulty_kernels.py:decode_raises") == \
        f"python:{HERE}/faulty_kernels.py:decode_raises"
    assert mlafuzz.testing.backend_name(numpy_decode.decode) == \
        f"python:{ROOT}/examples/python/numpy_decode.py:decode"
    assert mlafuzz.testing.backend_name("cpu-mma") == "cpu-mma"
    with pytest.raises(TypeError, match="decorate it with @mlafuzz.kernel"):
        mlafuzz.testing.backend_name(numpy_decode.attend)

    @mlafuzz.kernel(name="nested")
    def nested(call: mlafuzz.DecodeCall) -> None:
        pass

    with pytest.raises(TypeError, match="at the top level of a .py file"):
        mlafuzz.testing.backend_name(nested)


def test_one_paragraph_per_bug_then_the_corpus_is_replayed_first(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir("/")
    corpus = str(tmp_path / "corpus")
    message = _failure(numpy_decode.decode_planted_bug, cases=CASES, seed=3, jobs=2, corpus=corpus)
    assert message.startswith("mlafuzz: 1 bug(s) in python:"), message
    assert ":decode_planted_bug | bound excess |" in message and "[2]" not in message, message
    assert "\n    fails tolerance" in message, message
    # The minimal counterexample inline, the failing element, a command that runs as pasted,
    # and the call that replays it in this process.
    assert re.search(r"counterexample: B=1 H=1 topk=\d+; (model1|v32) nope=", message), message
    assert re.search(r"\n    out\[b=0,h=0,d=\d+\] value .* error/bound", message), message
    found = re.search(r"\n    reproduce: (.*)\n", message)
    assert found, message
    repro = found.group(1)
    assert "mlafuzz.replay('" in message and "decode_planted_bug)" in message, message
    proc = subprocess.run(repro, shell=True, cwd="/", text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 1 and "the finding persists" in proc.stdout, \
        f"{repro}\nexit {proc.returncode}:\n{proc.stdout}"

    # Next run: the findings replay first and still fail; no new case is generated.
    again = _failure(numpy_decode.decode_planted_bug, cases=CASES, seed=3, jobs=2, corpus=corpus)
    assert "its earlier findings still fail" in again and "no new cases" in again, again
    assert ":decode_planted_bug | bound excess |" in again and "[2]" not in again, again

    # The fixed kernel replays the same corpus as fixed, then fuzzes.
    result = mlafuzz.testing.fuzz(numpy_decode.decode, cases=20, seed=3, jobs=2, corpus=corpus)
    assert result.replayed and len(result.replayed) == len(
        [n for n in os.listdir(corpus) if n.endswith(".json")]), result.replayed


def test_known_bugs_in_the_ledger_do_not_fail_the_test(tmp_path) -> None:
    corpus = str(tmp_path / "corpus")
    ledger = tmp_path / "known.json"
    entry = {"id": "T-1", "note": "the last nope tile takes its neighbour's scale",
             "backend": "*:decode_planted_bug", "property": "*"}
    ledger.write_text(json.dumps({"format": "mlafuzz-known", "version": 1, "known": [entry]}))
    result = mlafuzz.testing.fuzz(numpy_decode.decode_planted_bug, cases=CASES, seed=3, jobs=2,
                                  corpus=corpus, known=str(ledger))
    assert result.known and all(f["known"] == "T-1" for f in result.known), result.known
    # Its corpus entries replay first next time, known too; the test still passes.
    again = mlafuzz.testing.fuzz(numpy_decode.decode_planted_bug, cases=20, seed=3, jobs=2,
                                 corpus=corpus, known=str(ledger))
    assert again.known and not again.replayed, again
    # An expired entry fails the test and says why.
    entry["expires"] = "2000-01-01"
    ledger.write_text(json.dumps({"format": "mlafuzz-known", "version": 1, "known": [entry]}))
    message = _failure(numpy_decode.decode_planted_bug, cases=20, seed=3, jobs=2,
                       corpus=str(tmp_path / "corpus2"), known=str(ledger))
    assert "expired on 2000-01-01" in message, message
    # Without the ledger the bug fails the test.
    assert "bug(s) in python:" in _failure(numpy_decode.decode_planted_bug, cases=20, seed=3,
                                           jobs=2, corpus=str(tmp_path / "corpus3"))


def test_default_corpus_lives_under_the_root_per_kernel(tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("MLAFUZZ_CORPUS_ROOT", str(root))
    _failure(f"{FAULTY}:decode_raises", cases=4, seed=4, jobs=1, properties=["run"])
    entries = os.listdir(root / "faulty_kernels.decode_raises")
    # One entry per group, named by the backend and a hash of the group's signature.
    assert entries and all(e.startswith("faulty_kernels.py_decode_raises-") for e in entries), \
        entries


def test_undeclared_production_decode_is_told_once(tmp_path) -> None:
    message = _failure(f"{FAULTY}:decode_without_production_decode", cases=CASES, seed=2, jobs=2)
    hints = [line for line in message.splitlines() if re.match(r"\[\d\] ", line)]
    assert hints, message
    for line in hints:  # nothing but the two declarations: each said once
        assert ("this case has an extra cache; declare mlafuzz.Envelope(extra_cache=False) if "
                "your kernel does not take one" in line
                or "declare mlafuzz.Envelope(s_q=1) if your kernel takes one query token"
                in line), message
    assert len(hints) == len(set(h.split("(")[0] for h in hints)) <= 2, message
    assert "counterexample: " in message and "extra cache: topk=" in message, message


def test_nothing_tested_is_a_failure() -> None:
    message = _failure("refusing_kernel.py:decode", cases=5, seed=1, jobs=1)
    assert "nothing was tested" in message and "refused all 5 cases" in message, message


def test_corpus_entries_skip_fail_or_pass_by_what_they_recorded(tmp_path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    shutil.copy(SMALL_CASE, folder / "a_plain_case.json")
    shutil.copy(PRODUCTION_CASE, folder / "b_production.json")
    entries = {p.values[0].name: p.values[0] for p in mlafuzz.testing.corpus(str(folder))}
    plain, production = entries["a_plain_case"], entries["b_production"]
    # A plain case that fails never failed before: it "fails", it is not "still failing".
    with pytest.raises(AssertionError) as failure:
        plain.replay(numpy_decode.decode_planted_bug)
    assert "a_plain_case: fails: " in str(failure.value), failure.value
    assert "still failing" not in str(failure.value)
    assert "all properties pass" in plain.replay(numpy_decode.decode)
    # The example kernel does not take the production decode: skipped with its reason.
    with pytest.raises(pytest.skip.Exception, match="not supported by the kernel: .*production"):
        production.replay(numpy_decode.decode)


def test_corpus_folder_resolves_against_the_test_file(monkeypatch) -> None:
    monkeypatch.chdir("/")
    names = [p.values[0].name for p in mlafuzz.testing.corpus("../../corpus/cases")]
    assert "edge_v32" in names, names


def test_floats_written_into_out_are_an_error() -> None:
    from conftest import describe, mlafuzz_cmd

    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{FAULTY}:decode_writes_floats")
    assert proc.returncode == 1, describe(proc)
    assert "call.out holds bf16 bit patterns (uint16); writing float32 values" in proc.stdout, \
        describe(proc)
    assert "mlafuzz.float32_to_bf16(x)" in proc.stdout, describe(proc)
